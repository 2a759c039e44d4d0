//! A participant's clocks: wall time with an offset, drift and jumps; monotonic time at a rate
//! of its own ([`super::super::rates`]); and a generator of its own.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::clock::Clock;

/// A participant's clock: true time shifted by an offset that may drift and jump, a monotonic
/// clock that may run at a rate of its own ([`super::rates`]), and a generator of its own (so one
/// participant's randomness does not shift another's).
pub(crate) struct SimClock {
    /// True wall time at the simulation's origin, epoch ms.
    pub epoch_ms: i64,
    pub origin: Instant,
    /// Current offset from the true time, ms.
    pub offset_ms: Mutex<i64>,
    /// Drift in parts per million (positive: runs fast).
    pub drift_ppm: i64,
    /// The monotonic clock's rate in parts per million off the true rate (0: the runtime's
    /// clock itself). Its timers run on it too ([`Clock::timer`]).
    pub rate_ppm: i64,
    pub rng: Mutex<StdRng>,
}

impl fmt::Debug for SimClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimClock(offset {:?})", self.offset_ms.lock().ok())
    }
}

impl SimClock {
    pub(crate) fn new(
        epoch_ms: i64,
        origin: Instant,
        offset_ms: i64,
        drift_ppm: i64,
        seed: u64,
    ) -> SimClock {
        SimClock {
            epoch_ms,
            origin,
            offset_ms: Mutex::new(offset_ms),
            drift_ppm,
            rate_ppm: 0,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    /// The same clock with its monotonic time running at `rate_ppm` parts per million off the
    /// true rate.
    pub(crate) fn with_rate(mut self, rate_ppm: i64) -> SimClock {
        self.rate_ppm = rate_ppm;
        self
    }

    /// Steps the wall clock by `ms` (an NTP step, a VM resumed, an operator).
    pub(crate) fn jump(&self, ms: i64) {
        if let Ok(mut o) = self.offset_ms.lock() {
            *o += ms;
        }
    }
}

impl Clock for SimClock {
    fn wall_ms(&self) -> i64 {
        let elapsed = crate::clock::millis(Instant::now().saturating_duration_since(self.origin));
        let drift = elapsed.saturating_mul(self.drift_ppm) / 1_000_000;
        let offset = self.offset_ms.lock().map_or(0, |o| *o);
        self.epoch_ms + elapsed + drift + offset
    }

    fn now(&self) -> Instant {
        let now = Instant::now();
        if self.rate_ppm == 0 {
            return now;
        }
        let elapsed = now.saturating_duration_since(self.origin).as_nanos();
        self.origin + nanos(super::super::rates::local_nanos(elapsed, self.rate_ppm))
    }

    fn timer(&self, at: Instant) -> Instant {
        if self.rate_ppm == 0 || at <= self.origin {
            return at;
        }
        let local = at.saturating_duration_since(self.origin).as_nanos();
        self.origin + nanos(super::super::rates::true_nanos(local, self.rate_ppm))
    }

    fn random(&self) -> u64 {
        self.rng.lock().map_or(0, |mut r| r.random())
    }
}

/// A duration of `n` nanoseconds (saturating: far beyond any run).
fn nanos(n: u128) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}
