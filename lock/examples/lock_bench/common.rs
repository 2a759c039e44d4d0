//! What every section shares: the lock options, percentiles, the report's rows, write units.

use std::collections::BTreeMap;
use std::time::Duration;

use flightlock::{ClockSkew, LockOptions, Wait};

pub fn opts() -> LockOptions {
    LockOptions {
        wait: Wait::Forever,
        lease: Duration::from_secs(3),
        poll: Duration::from_millis(50),
        max_poll: Duration::from_millis(800),
        clock_skew: ClockSkew::Bounded(Duration::from_millis(500)),
        ..LockOptions::default()
    }
}

pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

pub struct Report(pub Vec<(String, String, String)>);

impl Report {
    pub fn row(&mut self, what: &str, value: String, target: &str) {
        println!("  {what:<52} {value:>14}   {target}");
        self.0.push((what.into(), value, target.into()));
    }
}

/// write costs 1 unit and a transaction 2 per item (the enqueue writes two).
pub fn write_units(counts: &BTreeMap<String, u64>) -> f64 {
    let n = |op: &str| counts.get(op).copied().unwrap_or(0) as f64;
    n("PutItem") + n("UpdateItem") + n("DeleteItem") + 4.0 * n("TransactWriteItems")
}
