//! The time bounds of a gate: how long a decision and a release may take before the
//! invocation's deadline, and the DynamoDB client's timeouts that keep attempts inside them.
//! Pure.

use std::time::{Duration, SystemTime};

/// Connect timeout for the DynamoDB client of a gate (a regional endpoint answers in ms).
pub const SDK_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Per-attempt timeout for the DynamoDB client of a gate: a hung attempt gives way to a retry
/// well inside a decision budget (the locker's default is 5 s, longer than a 3 s function's).
pub const SDK_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Releasing never takes less than this, even at the deadline (the row lapses anyway).
pub(super) const RELEASE_MIN: Duration = Duration::from_millis(500);
/// Releasing never takes longer than this after the invocation ended.
pub(super) const RELEASE_MAX: Duration = Duration::from_secs(3);

/// How long the decision for an invocation may take (acquire, and the holder read of a busy
/// key), when `left` is the time until its deadline: up to half of the deadline margin before
/// the deadline, so the answer (skip body or error) still goes out in time. The lock's own wait
/// ends a full margin before the deadline (see [`crate::config::Config::lock_options`]), so a key that stays
/// held is reported as busy, not as a timeout. With less than a margin left, half of what is
/// left. Pure.
pub fn decision_budget(left: Duration, margin: Duration) -> Duration {
    left.saturating_sub(margin / 2).max(left / 2)
}

/// How long a failed acquisition may spend asking the table check for a better error.
pub(super) const EXPLAIN_MAX: Duration = Duration::from_millis(500);

/// How long a release may take, when `left` is the time until the deadline (`None`: unknown).
pub fn release_budget(left: Option<Duration>) -> Duration {
    left.unwrap_or(RELEASE_MAX).clamp(RELEASE_MIN, RELEASE_MAX)
}

/// Time until `deadline`, zero if past.
pub(super) fn until(deadline: SystemTime) -> Duration {
    deadline
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{decision_budget, release_budget, RELEASE_MAX, RELEASE_MIN};

    #[test]
    fn decisions_end_before_the_deadline() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // A 3 s function with the default 1 s margin: 2.5 s, leaving 0.5 s to answer.
        assert_eq!(decision_budget(s(3), s(1)), ms(2500));
        // The lock's own wait (deadline - margin) ends before the budget: busy stays busy.
        assert!(decision_budget(s(900), s(1)) > s(899));
        // Less than a margin left: half of it, never zero while time is left.
        assert_eq!(decision_budget(ms(600), s(1)), ms(300));
        assert_eq!(decision_budget(ms(0), s(1)), ms(0));
        for left in [ms(1), ms(700), s(2), s(60)] {
            assert!(decision_budget(left, s(1)) < left);
        }
    }

    #[test]
    fn releases_are_bounded() {
        assert_eq!(release_budget(None), RELEASE_MAX);
        assert_eq!(release_budget(Some(Duration::ZERO)), RELEASE_MIN);
        assert_eq!(
            release_budget(Some(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
        assert_eq!(release_budget(Some(Duration::from_secs(600))), RELEASE_MAX);
    }
}
