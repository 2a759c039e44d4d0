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
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightlock::{ClockSkew, LockOptions, Locker, Wait};
use flightlock_testkit::{Fault, FaultProxy, Rule};
use tokio::time::Instant;

/// One grant in the contended run: token, contender, granted at, released at.
type Grant = (u64, usize, Instant, Instant);

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

fn opts() -> LockOptions {
    LockOptions {
        wait: Wait::Forever,
        lease: Duration::from_secs(3),
        poll: Duration::from_millis(50),
        max_poll: Duration::from_millis(800),
        clock_skew: ClockSkew::Bounded(Duration::from_millis(500)),
        ..LockOptions::default()
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

struct Report(Vec<(String, String, String)>);

impl Report {
    fn row(&mut self, what: &str, value: String, target: &str) {
        println!("  {what:<52} {value:>14}   {target}");
        self.0.push((what.into(), value, target.into()));
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let args = parse_args();
    let endpoint = flightlock_testkit::require_endpoint();
    let admin = flightlock_testkit::client(&endpoint).await;
    let table = flightlock_testkit::unique_table("bench");
    flightlock::table::create_table(&admin, &table)
        .await
        .unwrap();
    let proxy = FaultProxy::start(&endpoint).await.unwrap();
    let mut report = Report(Vec::new());
    println!("flightlock lock benchmark — table {table}, DynamoDB at {endpoint}");
    println!("  {:<52} {:>14}   target", "measure", "value");

    // 1. Uncontended cycles: requests and latencies, cold (a new client state per cycle, as a
    //    fresh process) and warm (one long-lived locker, as a warm Lambda environment).
    for (label, warm) in [("cold", false), ("warm", true)] {
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

    // 3. Contention: N contenders loop acquire → hold 20 ms → release for a fixed time.
    {
        let n = args.contenders;
        let grants: Arc<Mutex<Vec<Grant>>> = Arc::default();
        proxy.reset_counts();
        let mut lockers = Vec::new();
        for _ in 0..n {
            lockers.push(Locker::new(
                flightlock_testkit::client(&proxy.endpoint()).await,
                &table,
            ));
        }
        // All contenders start together, so none cycles alone before the others have queued.
        let barrier = Arc::new(tokio::sync::Barrier::new(n));
        let stop = Instant::now() + Duration::from_secs(args.contended_secs);
        let mut tasks = Vec::new();
        for (who, locker) in lockers.into_iter().enumerate() {
            let grants = grants.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                while Instant::now() < stop {
                    let g = locker.acquire("contended", &opts()).await.unwrap();
                    let granted = Instant::now();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let token = g.token();
                    let released = Instant::now();
                    g.release().await.unwrap();
                    grants.lock().unwrap().push((token, who, granted, released));
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mut g = grants.lock().unwrap().clone();
        g.sort_by_key(|x| x.0);
        let mut handoffs: Vec<Duration> = g
            .windows(2)
            .map(|w| w[1].2.saturating_duration_since(w[0].3))
            .collect();
        handoffs.sort();
        // A self-handoff: the same contender holds twice in a row while others were waiting.
        // All contenders are always queued in this loop, except at the very end, when some
        // have stopped: those last handoffs are left out.
        let last_start = stop - Duration::from_millis(500);
        let considered: Vec<_> = g.windows(2).filter(|w| w[1].2 < last_start).collect();
        let selfs = considered.iter().filter(|w| w[0].1 == w[1].1).count();
        let mut per: HashMap<usize, f64> = HashMap::new();
        for x in &g {
            *per.entry(x.1).or_default() += 1.0;
        }
        let sum: f64 = per.values().sum();
        let sumsq: f64 = per.values().map(|v| v * v).sum();
        let jain = sum * sum / (n as f64 * sumsq);
        report.row(
            &format!("grants in {} s with {n} contenders", args.contended_secs),
            format!("{}", g.len()),
            "",
        );
        report.row(
            "handoff latency p50 / p99 (release → next grant)",
            format!("{} / {}", ms(pct(&handoffs, 0.5)), ms(pct(&handoffs, 0.99))),
            "≤ one poll (50 ms)",
        );
        report.row(
            "self-handoffs (releaser granted again next)",
            format!("{selfs} of {}", considered.len()),
            "0",
        );
        report.row(
            "Jain fairness across contenders",
            format!("{jain:.4}"),
            "1.0 = perfectly fair",
        );
        report.row(
            "requests per grant under contention",
            format!("{:.1}", proxy.total() as f64 / g.len().max(1) as f64),
            "",
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
