//! Once per tick on the uncontended path, side by side in the same run: a cycle without a tick,
//! with an ordered tick (`Tick::At`, a watermark on the key's counter item) and with an id tick
//! (`Tick::Id`, a small record per id). Each cycle is one scheduled run of one warm process: a
//! new tick, acquire, then `release_done` (the run succeeded: the tick is marked) or, without a
//! tick, `release`. Then a duplicate delivery of the last tick, answered without running.

use std::time::{SystemTime, UNIX_EPOCH};

use flightlock::{Error, LockOptions, Locker, Tick};
use flightlock_testkit::FaultProxy;

use crate::common::{opts, write_units, Report};

/// What identifies a run in one column of the comparison.
#[derive(Clone, Copy)]
enum Kind {
    Off,
    Ordered,
    Id,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Off => "off",
            Kind::Ordered => "ordered tick",
            Kind::Id => "id tick",
        }
    }

    /// The tick of run `i` (one a minute, as a schedule would).
    fn tick(self, base_ms: i64, i: usize) -> Option<Tick> {
        match self {
            Kind::Off => None,
            Kind::Ordered => Some(Tick::At(base_ms + 60_000 * i as i64)),
            Kind::Id => Some(Tick::Id(format!("run-{i}"))),
        }
    }

    /// The tick of the priming run: one before every measured run, never one of theirs.
    fn prime(self, base_ms: i64) -> Option<Tick> {
        match self {
            Kind::Off => None,
            Kind::Ordered => Some(Tick::At(base_ms - 60_000)),
            Kind::Id => Some(Tick::Id("prime".into())),
        }
    }
}

/// One scheduled run: acquire with `tick`, release marking it done.
async fn cycle(locker: &Locker, key: &str, tick: Option<Tick>) {
    let marked = tick.is_some();
    let o = LockOptions { tick, ..opts() };
    let g = locker.acquire(key, &o).await.unwrap();
    if marked {
        g.release_done().await.unwrap();
    } else {
        g.release().await.unwrap();
    }
}

/// Runs `cycles` uncontended runs per kind through `proxy` (which counts the requests) and
/// adds the rows: requests and write units per cycle, and requests per duplicate answered.
pub async fn section(report: &mut Report, proxy: &FaultProxy, table: &str, cycles: usize) {
    let locker = Locker::new(flightlock_testkit::client(&proxy.endpoint()).await, table);
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let base_ms = now_ms / 60_000 * 60_000;
    println!("  -- once per tick, uncontended cycle (warm): off / ordered tick / id tick");
    for kind in [Kind::Off, Kind::Ordered, Kind::Id] {
        let key = format!("tick-{}", kind.label().replace(' ', "-"));
        // Prime the key (its counter item exists), as the warm section does.
        cycle(&locker, &key, kind.prime(base_ms)).await;
        proxy.reset_counts();
        for i in 0..cycles {
            cycle(&locker, &key, kind.tick(base_ms, i)).await;
        }
        let counts = proxy.counts();
        let per = proxy.total() as f64 / cycles as f64;
        let units = write_units(&counts) / cycles as f64;
        let target = match kind {
            Kind::Off => "2",
            Kind::Ordered => "= off (free)",
            Kind::Id => "≤ off + 1 write",
        };
        report.row(
            &format!(
                "once per tick {}: requests / write units per cycle",
                kind.label()
            ),
            format!("{per:.2} / {units:.2}"),
            target,
        );
        let detail: Vec<String> = counts
            .iter()
            .map(|(k, v)| format!("{k} {:.2}", *v as f64 / cycles as f64))
            .collect();
        println!("      ({})", detail.join(", "));

        // A duplicate delivery of the last run's tick: answered "done" without holding the key.
        if let Some(last) = kind.tick(base_ms, cycles - 1) {
            proxy.reset_counts();
            let o = LockOptions {
                tick: Some(last),
                ..opts()
            };
            match locker.acquire(&key, &o).await {
                Err(Error::TickDone { .. }) => {}
                Err(e) => panic!("a duplicate of a done tick failed otherwise: {e}"),
                Ok(_) => panic!("a duplicate of a done tick was granted the key"),
            }
            report.row(
                &format!("once per tick {}: requests per duplicate", kind.label()),
                format!("{}", proxy.total()),
                "",
            );
            let detail: Vec<String> = proxy
                .counts()
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            println!("      ({})", detail.join(", "));
        }
    }
}
