//! Sweeper benchmark against a local DynamoDB: dead rows among many idle keys.
//!
//! ```text
//! cargo build --release -p flightlock --example sweep_bench
//! scripts/dynamodb-local run -- target/release/examples/sweep_bench [--idle 100000] [--dead 10000]
//! ```
//!
//! It writes `--idle` idle keys (a counter item each) and `--dead` dead queue rows (each with its
//! key's counter) with BatchWriteItem (25 items per request, 16 requests in flight), then sweeps
//! with a few concurrency/segment settings, refilling the dead rows before each run. Every
//! request the sweeper makes goes through a counting proxy, so "requests per swept row" counts
//! Scan pages and DeleteItems, SDK retries included. Last, one plain Scan with the sweeper's
//! filter and projection and `ReturnConsumedCapacity: TOTAL` shows the read units a sweep of
//! the table is billed (DynamoDB Local reports them like DynamoDB does).
//!
//! Figures on a local server measure the sweeper's own costs (requests, pages, concurrency);
//! against DynamoDB itself each DeleteItem takes ~5–10 ms, so rows/s there is roughly
//! concurrency / latency (16 / 7 ms ≈ 2,300 rows/s), unless the table's write rate limits it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use aws_sdk_dynamodb::Client;
use flightlock::schema::{self, n, s, seed};
use flightlock::sweep::{SweepOptions, Sweeper, FILTER, PROJECTION};
use flightlock::{Clock, HolderInfo, SystemClock};
use flightlock_testkit::FaultProxy;
use tokio::time::Instant;

struct Args {
    idle: usize,
    dead: usize,
}

fn parse_args() -> Args {
    let mut a = Args {
        idle: 100_000,
        dead: 10_000,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let val: usize = it
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{flag} needs a number"));
        match flag.as_str() {
            "--idle" => a.idle = val,
            "--dead" => a.dead = val,
            other => panic!("unknown flag {other}; use --idle N --dead N"),
        }
    }
    a
}

/// A realistic lock key (48 bytes), so a counter item is ~65 bytes like a real idle key.
fn idle_key(i: usize) -> String {
    format!("prod/billing-sync/customer-{i:06}/nightly-report")
}

fn dead_row(key: &str, now_ms: i64) -> HashMap<String, AttributeValue> {
    let holder = HolderInfo {
        function: Some("nightly-report".into()),
        request_id: Some("8f5e2b8c-1b7a-4c1e-9d43-3b1f0e0c2a11".into()),
        host: Some("169.254.10.1:7".into()),
    };
    seed::row_of(
        key,
        7,
        "0b9c8f1e-6f7a-4f57-9a58-5a1d1f7e2c33",
        "4d3c2b1a",
        now_ms - 3_600_000,
        &holder,
    )
}

async fn write_dead(client: &Client, table: &str, count: usize) {
    let now = SystemClock.wall_ms();
    let items = (0..count)
        .flat_map(|i| {
            let key = format!("job-{i:06}");
            [seed::counter(&key, 7), dead_row(&key, now)]
        })
        .collect();
    flightlock_testkit::batch_put(client, table, items, 16)
        .await
        .unwrap();
}

/// Read units a full Scan with the sweeper's filter and projection consumes.
async fn scan_read_units(client: &Client, table: &str) -> (f64, u64, u64) {
    let cutoff = SystemClock.wall_ms() - 600_000;
    let (mut units, mut pages, mut items) = (0.0, 0, 0);
    let mut start = None;
    loop {
        let out = client
            .scan()
            .table_name(table)
            .filter_expression(FILTER)
            .projection_expression(PROJECTION)
            .expression_attribute_names("#pk", schema::PK)
            .expression_attribute_names("#sk", schema::SK)
            .expression_attribute_names("#ticket", schema::TICKET)
            .expression_attribute_names("#owner", schema::OWNER)
            .expression_attribute_names("#until", schema::LEASE_UNTIL_MS)
            .expression_attribute_names("#leaseMs", schema::LEASE_MS)
            .expression_attribute_names("#exp", schema::EXPIRES_AT)
            .expression_attribute_names("#rvn", schema::RVN)
            .expression_attribute_values(":q", s(schema::QUEUE_PREFIX))
            .expression_attribute_values(":cutoff", n(cutoff))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        units += out
            .consumed_capacity
            .and_then(|c| c.capacity_units)
            .unwrap_or(0.0);
        pages += 1;
        items += u64::try_from(out.scanned_count).unwrap_or(0);
        match out.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => return (units, pages, items),
        }
    }
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let flightlock_testkit::FreshTable {
        endpoint,
        client,
        table,
    } = flightlock_testkit::fresh_table("sweep_bench").await;

    let t = Instant::now();
    let idle = (0..args.idle)
        .map(|i| seed::counter(&idle_key(i), 3))
        .collect();
    flightlock_testkit::batch_put(&client, &table, idle, 16)
        .await
        .unwrap();
    println!(
        "wrote {} idle keys in {:.1} s ({:.0} items/s with BatchWriteItem)",
        args.idle,
        t.elapsed().as_secs_f64(),
        args.idle as f64 / t.elapsed().as_secs_f64()
    );

    let proxy = FaultProxy::start(&endpoint).await.unwrap();
    let sweeper = Sweeper::new(flightlock_testkit::client(&proxy.endpoint()).await, &table);
    println!(
        "\n{:>8} {:>11} {:>9} {:>7} {:>7} {:>9} {:>10} {:>13}",
        "segments", "concurrency", "deleted", "pages", "scans", "deletes", "rows/s", "requests/row"
    );
    for (segments, concurrency) in [(1, 16), (1, 64), (4, 64)] {
        write_dead(&client, &table, args.dead).await;
        proxy.reset_counts();
        let opts = SweepOptions {
            segments,
            concurrency,
            ..SweepOptions::default()
        };
        let summary = sweeper.sweep(&opts).await.unwrap();
        assert!(summary.complete && summary.errors == 0, "{summary:#?}");
        assert_eq!(summary.deleted as usize, args.dead);
        let secs = summary.duration_ms as f64 / 1000.0;
        println!(
            "{:>8} {:>11} {:>9} {:>7} {:>7} {:>9} {:>10.0} {:>13.3}",
            segments,
            concurrency,
            summary.deleted,
            summary.pages,
            proxy.count("Scan"),
            proxy.count("DeleteItem"),
            summary.deleted as f64 / secs,
            proxy.total() as f64 / summary.deleted as f64,
        );
    }

    proxy.reset_counts();
    let idle_sweep = sweeper.sweep(&SweepOptions::default()).await.unwrap();
    println!(
        "\nsweep with nothing to delete: {} items examined in {} pages, {} ms, {} requests",
        idle_sweep.items_examined,
        idle_sweep.pages,
        idle_sweep.duration_ms,
        proxy.total()
    );

    let (units, pages, items) = scan_read_units(&client, &table).await;
    let price_per_million = 0.125;
    println!(
        "read units of one sweep (Scan, eventually consistent): {units:.1} for {items} items in \
         {pages} pages = {:.0} bytes/item billed; ${:.6} per sweep at ${price_per_million}/M read \
         units, ${:.2}/month every 5 minutes",
        units * 2.0 * 4096.0 / items as f64,
        units * price_per_million / 1e6,
        units * price_per_million / 1e6 * 8640.0
    );
}
