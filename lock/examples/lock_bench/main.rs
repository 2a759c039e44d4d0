//! Lock benchmark against a local DynamoDB: prints a table of figures.
//!
//! ```text
//! scripts/bench                      # starts DynamoDB Local, runs this in release mode, stops it
//! scripts/dynamodb-local run -- cargo run --release -p flightlock --example lock_bench -- --cycles 300
//! ```
//!
//! Requests are counted by a proxy in front of DynamoDB (every HTTP request, retries included).
//! Figures on a local server measure the protocol's own costs (requests, poll schedule, code
//! paths); absolute latencies against DynamoDB itself are dominated by its ~5–10 ms per request.
//!
//! Layout: `main.rs` the sections in order, `common.rs` options and the report's rows,
//! `contention.rs` the contended loop, `plain.rs` the plain conditional-put lock compared against,
//! `tick.rs` once per tick (scheduled runs) on the uncontended path, `permits.rs` N at a time
//! (`LockOptions::permits`): uncontended, fewer holders than permits, 16 workers on N = 4 and 1.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;
mod contention;
mod permits;
mod plain;
mod tick;

use std::time::Duration;

use flightlock::{LockOptions, Locker, Wait};
use flightlock_testkit::{Fault, FaultProxy, Rule};
use tokio::time::Instant;

use common::{ms, opts, pct, write_units, Report};
use contention::{contend, contention_rows, Contender, Mode};
use plain::PlainLock;

struct Args {
    cycles: usize,
    contenders: usize,
    contended_secs: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        cycles: 200,
        contenders: 8,
        contended_secs: 10,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{flag} needs a number"))
        };
        match flag.as_str() {
            "--cycles" => a.cycles = val() as usize,
            "--contenders" => a.contenders = val() as usize,
            "--contended-secs" => a.contended_secs = val(),
            other => {
                panic!("unknown flag {other}; use --cycles N --contenders N --contended-secs N")
            }
        }
    }
    a
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let args = parse_args();
    let flightlock_testkit::FreshTable {
        endpoint, table, ..
    } = flightlock_testkit::fresh_table("bench").await;
    let proxy = FaultProxy::start(&endpoint).await.unwrap();
    let mut report = Report(Vec::new());
    println!("flightlock lock benchmark — table {table}, DynamoDB at {endpoint}");
    println!("  {:<52} {:>14}   target", "measure", "value");

    // 1. Uncontended cycles: requests and latencies, cold (a new client state per cycle, as a
    //    fresh process) and warm (one long-lived locker, as a warm Lambda environment).
    let mut warm_units = 0.0;
    let mut warm_cycles = Vec::new();
    for (label, warm) in [("cold", false), ("warm", true)] {
        let mut cycles = Vec::new();
        let mut acq = Vec::new();
        let mut rel = Vec::new();
        let client = flightlock_testkit::client(&proxy.endpoint()).await;
        let shared = Locker::new(client.clone(), &table);
        let key = format!("uncontended-{label}");
        // Prime the key so "cold" is not the very first use of the key.
        shared
            .acquire(&key, &opts())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        proxy.reset_counts();
        for _ in 0..args.cycles {
            let locker = if warm {
                shared.clone()
            } else {
                Locker::new(client.clone(), &table)
            };
            let t0 = Instant::now();
            let g = locker.acquire(&key, &opts()).await.unwrap();
            let t1 = Instant::now();
            g.release().await.unwrap();
            acq.push(t1 - t0);
            rel.push(t1.elapsed());
            cycles.push(t0.elapsed());
        }
        if warm {
            warm_units = write_units(&proxy.counts()) / args.cycles as f64;
            cycles.sort();
            warm_cycles = cycles;
        }
        let per_cycle = proxy.total() as f64 / args.cycles as f64;
        acq.sort();
        rel.sort();
        let target = if warm { "≤ 3 (stretch 2)" } else { "≤ 3" };
        report.row(
            &format!("requests per acquire+release, {label}"),
            format!("{per_cycle:.2}"),
            target,
        );
        let detail: Vec<String> = proxy
            .counts()
            .iter()
            .map(|(k, v)| format!("{k} {:.2}", *v as f64 / args.cycles as f64))
            .collect();
        println!("      ({})", detail.join(", "));
        report.row(
            &format!("acquire latency p50 / p99, {label}"),
            format!("{} / {}", ms(pct(&acq, 0.5)), ms(pct(&acq, 0.99))),
            "",
        );
        report.row(
            &format!("release latency p50 / p99, {label}"),
            format!("{} / {}", ms(pct(&rel, 0.5)), ms(pct(&rel, 0.99))),
            "",
        );
    }

    // 1b. The plain conditional-put lock, uncontended, in the same run.
    {
        let plain = PlainLock {
            client: flightlock_testkit::client(&proxy.endpoint()).await,
            table: table.clone(),
        };
        proxy.reset_counts();
        let mut cycle = Vec::new();
        for i in 0..args.cycles {
            let owner = format!("o{i}");
            let t0 = Instant::now();
            plain.acquire("uncontended-plain", &owner).await;
            plain.release("uncontended-plain", &owner).await;
            cycle.push(t0.elapsed());
        }
        cycle.sort();
        report.row(
            "plain conditional-put lock: requests per cycle",
            format!("{:.2}", proxy.total() as f64 / args.cycles as f64),
            "",
        );
        report.row(
            "plain lock: cycle p50 / p99 (put + delete)",
            format!("{} / {}", ms(pct(&cycle, 0.5)), ms(pct(&cycle, 0.99))),
            "",
        );
        report.row(
            "uncontended cycle p50: flightlock warm / plain",
            format!(
                "{} / {} = {:.2}x",
                ms(pct(&warm_cycles, 0.5)),
                ms(pct(&cycle, 0.5)),
                pct(&warm_cycles, 0.5).as_secs_f64() / pct(&cycle, 0.5).as_secs_f64()
            ),
            "≤ 1.5x",
        );
        report.row(
            "write units per uncontended cycle: flightlock warm / plain",
            format!(
                "{warm_units:.2} / {:.2}",
                write_units(&proxy.counts()) / args.cycles as f64
            ),
            "items < 1 KB: 1 a write, 2 a transaction item",
        );
    }

    // 1c. Once per tick on the uncontended path: off / ordered tick / id tick, side by side.
    tick::section(&mut report, &proxy, &table, args.cycles).await;

    // 2. Skip decision: wait = 0 on a held key.
    {
        let holder = Locker::new(flightlock_testkit::client(&endpoint).await, &table);
        let g = holder.acquire("skip", &opts()).await.unwrap();
        let skipper = Locker::new(flightlock_testkit::client(&proxy.endpoint()).await, &table);
        let no_wait = LockOptions {
            wait: Wait::NoWait,
            ..opts()
        };
        proxy.reset_counts();
        let mut lat = Vec::new();
        for _ in 0..args.cycles {
            let t0 = Instant::now();
            assert!(skipper
                .acquire("skip", &no_wait)
                .await
                .unwrap_err()
                .is_busy());
            lat.push(t0.elapsed());
        }
        lat.sort();
        report.row(
            "requests per skip decision (wait=0, key held)",
            format!("{:.2}", proxy.total() as f64 / args.cycles as f64),
            "≤ 2",
        );
        report.row(
            "skip decision latency p50 / p99",
            format!("{} / {}", ms(pct(&lat, 0.5)), ms(pct(&lat, 0.99))),
            "",
        );
        g.release().await.unwrap();
    }

    // 3. Contention: N contenders loop acquire → hold 20 ms → release for a fixed time, first
    //    each with its own locker (as separate processes), then all sharing one (one process:
    //    a release wakes the next waiter at once), then the plain conditional-put lock.
    for mode in [Mode::Processes, Mode::OneProcess, Mode::PlainLock] {
        let n = args.contenders;
        proxy.reset_counts();
        let client = flightlock_testkit::client(&proxy.endpoint()).await;
        let shared = Locker::new(client.clone(), &table);
        let mut contenders = Vec::new();
        for _ in 0..n {
            contenders.push(match mode {
                Mode::Processes => Contender::Fifo(Locker::new(
                    flightlock_testkit::client(&proxy.endpoint()).await,
                    &table,
                )),
                Mode::OneProcess => Contender::Fifo(shared.clone()),
                Mode::PlainLock => Contender::Plain(PlainLock {
                    client: flightlock_testkit::client(&proxy.endpoint()).await,
                    table: table.clone(),
                }),
            });
        }
        let g = contend(contenders, args.contended_secs, mode.key()).await;
        contention_rows(&mut report, &g, n, args.contended_secs, mode, proxy.total());
        let detail: Vec<String> = proxy
            .counts()
            .iter()
            .map(|(k, v)| format!("{k} {:.2}", *v as f64 / g.len().max(1) as f64))
            .collect();
        println!("      ({})", detail.join(", "));
    }

    // 3b. N at a time: a key of 4 permits alone, with 2 workers, and 16 workers on N = 4 vs 1.
    permits::section(
        &mut report,
        &proxy,
        &table,
        args.cycles,
        args.contended_secs,
    )
    .await;

    // 4. Scale: 100 waiters on one key (10 processes of 10 tasks), each once through a 20 ms
    //    critical section. The requests on the key per second and per handoff must stay bounded.
    {
        proxy.reset_counts();
        let mut contenders = Vec::new();
        for _ in 0..10 {
            let locker = Locker::new(flightlock_testkit::client(&proxy.endpoint()).await, &table);
            for _ in 0..10 {
                contenders.push(locker.clone());
            }
        }
        let started = Instant::now();
        let mut tasks = Vec::new();
        for locker in contenders {
            tasks.push(tokio::spawn(async move {
                let g = locker.acquire("scale", &opts()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
                g.release().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let secs = started.elapsed().as_secs_f64();
        let queries = proxy.count("Query") as f64;
        report.row(
            "100 waiters, 1 key: requests per second on the key",
            format!("{:.0}", proxy.total() as f64 / secs),
            "bounded",
        );
        report.row(
            "100 waiters: reads (Query) per handoff",
            format!("{:.1}", queries / 100.0),
            "each ≤ 1 read unit (≤ 8 rows)",
        );
        let detail: Vec<String> = proxy
            .counts()
            .iter()
            .map(|(k, v)| format!("{k} {:.2}", *v as f64 / 100.0))
            .collect();
        println!("      (per waiter: {})", detail.join(", "));
        report.row(
            "100 waiters: all through in",
            format!("{secs:.2} s"),
            "floor 100 × 20 ms = 2 s",
        );
    }

    // 4. Crash takeover: the holder stops heartbeating (its DynamoDB becomes unreachable, as for
    //    a killed process); a waiter measures the time until it is granted.
    {
        let mut takeovers = Vec::new();
        for round in 0..3 {
            let p = FaultProxy::start(&endpoint).await.unwrap();
            let holder = Locker::new(flightlock_testkit::client(&p.endpoint()).await, &table);
            let key = format!("crash-{round}");
            let g = holder.acquire(&key, &opts()).await.unwrap();
            let waiter = Locker::new(flightlock_testkit::client(&endpoint).await, &table);
            let k2 = key.clone();
            let w = tokio::spawn(async move {
                let g = waiter.acquire(&k2, &opts()).await.unwrap();
                let at = Instant::now();
                g.release().await.unwrap();
                at
            });
            tokio::time::sleep(Duration::from_millis(1500)).await;
            p.add_rule(Rule::new(Fault::ServerError));
            let crashed = Instant::now();
            let granted = w.await.unwrap();
            takeovers.push(granted - crashed);
            drop(g);
        }
        takeovers.sort();
        let o = opts();
        let bound = o.lease + Duration::from_millis(500) + o.poll;
        report.row(
            "crash takeover (3 runs, min / max)",
            format!(
                "{:.2} / {:.2} s",
                takeovers[0].as_secs_f64(),
                takeovers[2].as_secs_f64()
            ),
            &format!("≤ lease+skew+poll = {:.2} s", bound.as_secs_f64()),
        );
    }
    println!("(lease 3 s, heartbeat 1 s, poll 50 ms, skew allowance 500 ms)");
}
