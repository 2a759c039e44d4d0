//! Clocks. Two kinds of time are used, and they are kept apart on purpose:
//!
//! - **wall time** (epoch ms) is written into rows (`leaseUntilMs`, `expiresAt`) and compared
//!   with other machines' wall time, so it is only as good as clock agreement between them;
//! - **monotonic time** ([`tokio::time::Instant`]) measures our own lease deadline and, in
//!   clock-free mode, how long a row has stayed unchanged. It never jumps, and in tests it can be
//!   paused and advanced.
//!
//! The clock is a seam: tests inject a [`SkewedClock`] to play a machine whose wall clock is off.
//! Every timer the protocol sets (pauses, deadlines, the lease's end) goes through
//! [`Clock::sleep_until`] and [`Clock::sleep`], so a clock whose monotonic time runs at a rate of
//! its own (the simulation's) times its sleeps by that same time.
//!
//! **Chance comes from the OS on every draw.** One Lambda SnapStart snapshot is restored into
//! many environments, and a `fork()` copies a process: anything a userspace generator holds is
//! copied with it, so two copies would draw the same "random" owner ids and record versions and
//! take each other's rows for their own. `rand` 0.9's `ThreadRng` has no fork protection (see
//! its changelog), so [`Clock::random`] reads `getrandom` (through `rand`'s [`OsRng`]) each
//! time: there is no generator state to copy. A draw costs one system call, a few per lock
//! cycle.

use std::fmt::Debug;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::OsRng;
use rand::{RngCore, TryRngCore};
use tokio::time::Instant;

/// Source of wall and monotonic time, and of chance.
///
/// The clock is the seam for every source of nondeterminism the protocol reads: time, and the
/// random numbers behind jitter and ids. A simulation that supplies all three from one seed can
/// replay a run exactly.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Wall-clock time, epoch milliseconds.
    fn wall_ms(&self) -> i64;
    /// Monotonic time.
    fn now(&self) -> Instant {
        Instant::now()
    }
    /// The runtime's instant at which this clock's monotonic time reads `at`: timers are set on
    /// the runtime's clock. The identity for a clock whose monotonic time is the runtime's.
    fn timer(&self, at: Instant) -> Instant {
        at
    }
    /// Sleeps until this clock's monotonic time reads `deadline`.
    fn sleep_until(&self, deadline: Instant) -> tokio::time::Sleep {
        tokio::time::sleep_until(self.timer(deadline))
    }
    /// Sleeps for `d` of this clock's monotonic time.
    fn sleep(&self, d: Duration) -> tokio::time::Sleep {
        self.sleep_until(self.now() + d)
    }
    /// A random number (jitter, owner ids, record versions), fresh from the OS: see the module
    /// docs for why no userspace generator is kept.
    fn random(&self) -> u64 {
        os_random()
    }
    /// A random fraction in `[0, 1)`, for jitter.
    fn jitter(&self) -> f64 {
        // 53 random bits: every value is exact in an f64.
        (self.random() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// 64 bits from the OS (`getrandom`). Should the OS refuse (it does not on Linux once booted),
/// the draw mixes a thread-local generator with what tells copies of a process apart (process id,
/// wall-clock nanoseconds) rather than panic.
pub fn os_random() -> u64 {
    match OsRng.try_next_u64() {
        Ok(n) => n,
        Err(_) => {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            rand::rng().next_u64()
                ^ nanos.rotate_left(17)
                ^ u64::from(std::process::id()).rotate_left(43)
        }
    }
}

/// The system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn wall_ms(&self) -> i64 {
        // A system clock before 1970 is a broken machine; treat it as the epoch rather than panic.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// The system clock shifted by a fixed offset: a machine whose wall clock is wrong. Monotonic
/// time is unaffected, as on a real machine.
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock {
    /// Milliseconds added to the system's wall clock (negative: behind).
    pub offset_ms: i64,
}

impl Clock for SkewedClock {
    fn wall_ms(&self) -> i64 {
        SystemClock.wall_ms().saturating_add(self.offset_ms)
    }
}

/// Whole milliseconds of a duration, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A fresh random id: 20 hex digits (80 bits). Used for owners and record versions. Drawn from
/// the clock's chance, which for the system clocks is the OS on every draw: two copies of one
/// process (a `fork()`, a SnapStart restore) never share an id (see [`crate::clock`]).
pub(crate) fn new_id(clock: &dyn Clock) -> String {
    let hi = u128::from(clock.random());
    let lo = u128::from(clock.random());
    format!("{:020x}", ((hi << 64) | lo) & ((1u128 << 80) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skewed_clock_is_offset() {
        let ahead = SkewedClock { offset_ms: 60_000 };
        let diff = ahead.wall_ms() - SystemClock.wall_ms();
        assert!((59_000..=60_000).contains(&diff), "{diff}");
    }

    #[test]
    fn ids_are_20_hex_digits_and_differ() {
        let a = new_id(&SystemClock);
        assert_eq!(a.len(), 20);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, new_id(&SystemClock));
    }
}
