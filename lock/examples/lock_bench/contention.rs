//! Contention: N contenders loop acquire → hold 20 ms → release for a fixed time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightlock::Locker;
use tokio::time::Instant;

use crate::common::{ms, opts, pct, Report};
use crate::plain::PlainLock;

/// One grant in the contended run: token, contender, granted at, released at.
type Grant = (u64, usize, Instant, Instant);

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Processes,
    OneProcess,
    PlainLock,
}

impl Mode {
    pub fn key(self) -> &'static str {
        match self {
            Mode::Processes => "contended",
            Mode::OneProcess => "contended-local",
            Mode::PlainLock => "contended-plain",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Mode::Processes => "flightlock, separate processes",
            Mode::OneProcess => "flightlock, one process",
            Mode::PlainLock => "plain conditional-put lock",
        }
    }
}

pub enum Contender {
    Fifo(Locker),
    Plain(PlainLock),
}

/// Runs the contenders for `secs`; returns every grant.
pub async fn contend(contenders: Vec<Contender>, secs: u64, key: &'static str) -> Vec<Grant> {
    let n = contenders.len();
    let grants: Arc<Mutex<Vec<Grant>>> = Arc::default();
    // All contenders start together, so none cycles alone before the others have queued.
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for (who, c) in contenders.into_iter().enumerate() {
        let grants = grants.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut round = 0u64;
            while Instant::now() < stop {
                round += 1;
                let (token, granted, released) = match &c {
                    Contender::Fifo(locker) => {
                        let g = locker.acquire(key, &opts()).await.unwrap();
                        let granted = Instant::now();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let token = g.token();
                        let released = Instant::now();
                        g.release().await.unwrap();
                        (token, granted, released)
                    }
                    Contender::Plain(lock) => {
                        let owner = format!("{who}-{round}");
                        lock.acquire(key, &owner).await;
                        let granted = Instant::now();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let released = Instant::now();
                        lock.release(key, &owner).await;
                        (0, granted, released)
                    }
                };
                grants.lock().unwrap().push((token, who, granted, released));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut g = grants.lock().unwrap().clone();
    // In grant order (the plain lock has no tokens).
    g.sort_by_key(|x| x.2);
    g
}

pub fn contention_rows(
    report: &mut Report,
    g: &[Grant],
    n: usize,
    secs: u64,
    mode: Mode,
    requests: u64,
) {
    let label = mode.label();
    let mut handoffs: Vec<Duration> = g
        .windows(2)
        .map(|w| w[1].2.saturating_duration_since(w[0].3))
        .collect();
    handoffs.sort();
    // A self-handoff: the same contender holds twice in a row while others were waiting. All
    // contenders are always queued in this loop, except at the very start and end: the end is
    // left out, and the start is told by the tickets (below).
    let last_start = g.last().map_or(Instant::now(), |x| x.2) - Duration::from_millis(500);
    let considered: Vec<_> = g.windows(2).filter(|w| w[1].2 < last_start).collect();
    // With tickets, a releaser granted the very next ticket took one nobody else had asked for
    // (at the start, before the others' first requests land): no one was waiting, no barging.
    let barged = |w: &&&[Grant]| w[0].1 == w[1].1 && !(w[0].0 > 0 && w[1].0 == w[0].0 + 1);
    let selfs = considered.iter().filter(barged).count();
    let mut per: HashMap<usize, f64> = HashMap::new();
    for x in g {
        *per.entry(x.1).or_default() += 1.0;
    }
    let sum: f64 = per.values().sum();
    let sumsq: f64 = per.values().map(|v| v * v).sum();
    let jain = sum * sum / (n as f64 * sumsq.max(1.0));
    println!("  -- {label}, {n} contenders, 20 ms critical section, {secs} s");
    report.row(
        "cycles per second",
        format!("{:.1}", g.len() as f64 / secs as f64),
        "floor 50/s",
    );
    report.row(
        "handoff p50 / p90 (release → next grant)",
        format!("{} / {}", ms(pct(&handoffs, 0.5)), ms(pct(&handoffs, 0.9))),
        "",
    );
    report.row(
        "self-handoffs (releaser granted again next)",
        format!("{selfs} of {}", considered.len()),
        "FIFO: 0",
    );
    report.row("Jain fairness across contenders", format!("{jain:.4}"), "");
    report.row(
        "DynamoDB requests per cycle",
        format!("{:.1}", requests as f64 / g.len().max(1) as f64),
        "",
    );
}
