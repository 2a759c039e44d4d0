//! N at a time (`LockOptions::permits`): one worker cycling on a key of 4 permits (the
//! uncontended path, which must cost what a lock's does), two workers on it (fewer holders than
//! permits), and 16 workers on one key of 4 permits against 16 on a key of 1 (throughput,
//! handoff, requests per cycle, fairness). Every worker has its own locker (separate processes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightlock::{LockOptions, Locker};
use flightlock_testkit::FaultProxy;
use tokio::time::Instant;

use crate::common::{ms, opts, pct, Report};

/// One grant: contender, granted at, released at.
type Grant = (usize, Instant, Instant);

fn with_permits(permits: u32) -> LockOptions {
    LockOptions { permits, ..opts() }
}

pub async fn section(
    report: &mut Report,
    proxy: &FaultProxy,
    table: &str,
    cycles: usize,
    secs: u64,
) {
    // One warm worker on a key of 4 permits: nobody else, so every acquisition is uncontended.
    {
        let locker = Locker::new(flightlock_testkit::client(&proxy.endpoint()).await, table);
        let o = with_permits(4);
        // The first use creates the key's counter at 4 permits.
        locker
            .acquire("permits-alone", &o)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        proxy.reset_counts();
        for _ in 0..cycles {
            locker
                .acquire("permits-alone", &o)
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
        report.row(
            "N = 4, 1 worker: requests per acquire+release, warm",
            format!("{:.2}", proxy.total() as f64 / cycles as f64),
            "= N = 1 (2.00)",
        );
        detail(proxy, cycles);
    }
    // Two workers on a key of 4 permits: never more holders than permits, nobody waits.
    {
        proxy.reset_counts();
        let g = contend(proxy, table, 2, 4, "permits-two", secs).await;
        report.row(
            "N = 4, 2 workers: requests per cycle",
            format!("{:.2}", proxy.total() as f64 / g.len().max(1) as f64),
            "fewer holders than N: the uncontended path",
        );
        detail(proxy, g.len());
    }
    // 16 workers on one key: N = 1 then N = 4.
    for permits in [1, 4] {
        proxy.reset_counts();
        let key = if permits == 1 {
            "permits-16-of-1"
        } else {
            "permits-16-of-4"
        };
        let g = contend(proxy, table, 16, permits, key, secs).await;
        rows(report, &g, 16, permits, secs, proxy.total());
        detail(proxy, g.len());
    }
}

fn detail(proxy: &FaultProxy, cycles: usize) {
    let d: Vec<String> = proxy
        .counts()
        .iter()
        .map(|(k, v)| format!("{k} {:.2}", *v as f64 / cycles.max(1) as f64))
        .collect();
    println!("      ({})", d.join(", "));
}

/// `n` workers, each with its own locker, loop acquire → hold 20 ms → release on `key` of
/// `permits` for `secs`; every grant.
async fn contend(
    proxy: &FaultProxy,
    table: &str,
    n: usize,
    permits: u32,
    key: &'static str,
    secs: u64,
) -> Vec<Grant> {
    let grants: Arc<Mutex<Vec<Grant>>> = Arc::default();
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut lockers = Vec::new();
    for _ in 0..n {
        lockers.push(Locker::new(
            flightlock_testkit::client(&proxy.endpoint()).await,
            table,
        ));
    }
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for (who, locker) in lockers.into_iter().enumerate() {
        let (grants, barrier) = (grants.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let o = with_permits(permits);
            barrier.wait().await;
            while Instant::now() < stop {
                let g = locker.acquire(key, &o).await.unwrap();
                let granted = Instant::now();
                tokio::time::sleep(Duration::from_millis(20)).await;
                let released = Instant::now();
                g.release().await.unwrap();
                grants.lock().unwrap().push((who, granted, released));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let g = grants.lock().unwrap().clone();
    g
}

fn rows(report: &mut Report, g: &[Grant], n: usize, permits: u32, secs: u64, requests: u64) {
    // Handoff: the k-th release (in time) frees the permit the (k + N)-th grant takes, every
    // worker being queued all along (for N = 1: release → next grant).
    let mut grants: Vec<Instant> = g.iter().map(|x| x.1).collect();
    let mut releases: Vec<Instant> = g.iter().map(|x| x.2).collect();
    grants.sort();
    releases.sort();
    let p = permits as usize;
    let mut handoffs: Vec<Duration> = releases
        .iter()
        .zip(grants.iter().skip(p))
        .map(|(r, g)| g.saturating_duration_since(*r))
        .collect();
    handoffs.sort();
    let mut per: HashMap<usize, f64> = HashMap::new();
    for x in g {
        *per.entry(x.0).or_default() += 1.0;
    }
    let sum: f64 = per.values().sum();
    let sumsq: f64 = per.values().map(|v| v * v).sum();
    let jain = sum * sum / (n as f64 * sumsq.max(1.0));
    println!("  -- N = {permits}, {n} workers on one key, 20 ms critical section, {secs} s");
    let floor = 50.0 * f64::from(permits);
    report.row(
        &format!("N = {permits}, {n} workers: cycles per second"),
        format!("{:.1}", g.len() as f64 / secs as f64),
        &format!("floor {floor:.0}/s"),
    );
    report.row(
        &format!("N = {permits}, {n} workers: handoff p50 / p90"),
        format!("{} / {}", ms(pct(&handoffs, 0.5)), ms(pct(&handoffs, 0.9))),
        "release → the grant it frees",
    );
    report.row(
        &format!("N = {permits}, {n} workers: requests per cycle"),
        format!("{:.1}", requests as f64 / g.len().max(1) as f64),
        "",
    );
    report.row(
        &format!("N = {permits}, {n} workers: Jain fairness"),
        format!("{jain:.4}"),
        "",
    );
}
