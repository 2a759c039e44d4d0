use super::*;
use crate::schema::HolderInfo;

fn row(owner: &str, rvn: &str, lease_until_ms: i64) -> QueueRow {
    QueueRow {
        ticket: 1,
        owner: owner.into(),
        lease_until_ms,
        lease_ms: 10_000,
        expires_at: 0,
        seat: false,
        rvn: rvn.into(),
        enqueued_at_ms: None,
        acquired_at_ms: None,
        clock_free: false,
        holder: HolderInfo::default(),
    }
}

const SKEW: ClockSkew = ClockSkew::Bounded(Duration::from_secs(1));

#[test]
fn bounded_mode_waits_for_lease_plus_allowance() {
    let mut o = Observer::default();
    let now = Instant::now();
    let r = row("a", "1", 50_000);
    assert_eq!(o.judge(&r, 50_000, now, SKEW), Verdict::Live);
    assert_eq!(o.judge(&r, 51_000, now, SKEW), Verdict::Live);
    assert_eq!(o.judge(&r, 51_001, now, SKEW), Verdict::Stale);
}

#[tokio::test(start_paused = true)]
async fn clock_free_mode_needs_an_unchanged_rvn_for_a_full_lease() {
    let mut o = Observer::default();
    // Wall time says "long dead": clock-free mode must not care.
    let wall = i64::MAX / 2;
    let t0 = Instant::now();
    assert_eq!(
        o.judge(&row("a", "1", 0), wall, t0, ClockSkew::Unbounded),
        Verdict::Live
    );
    tokio::time::advance(Duration::from_millis(9_000)).await;
    assert_eq!(
        o.judge(
            &row("a", "1", 0),
            wall,
            Instant::now(),
            ClockSkew::Unbounded
        ),
        Verdict::Live
    );
    // A heartbeat changes the rvn: the clock starts again.
    assert_eq!(
        o.judge(
            &row("a", "2", 0),
            wall,
            Instant::now(),
            ClockSkew::Unbounded
        ),
        Verdict::Live
    );
    tokio::time::advance(Duration::from_millis(10_000)).await;
    assert_eq!(
        o.judge(
            &row("a", "2", 0),
            wall,
            Instant::now(),
            ClockSkew::Unbounded
        ),
        Verdict::Live
    );
    tokio::time::advance(Duration::from_millis(200)).await;
    assert_eq!(
        o.judge(
            &row("a", "2", 0),
            wall,
            Instant::now(),
            ClockSkew::Unbounded
        ),
        Verdict::Stale
    );
}

#[tokio::test(start_paused = true)]
async fn observer_forgets_rows_not_seen_for_an_hour() {
    let mut o = Observer::default();
    o.judge(&row("a", "1", 0), 0, Instant::now(), SKEW);
    tokio::time::advance(Duration::from_secs(1800)).await;
    o.judge(&row("b", "1", 0), 0, Instant::now(), SKEW);
    tokio::time::advance(Duration::from_secs(1801)).await;
    o.forget_old(Instant::now());
    assert_eq!(o.seen.len(), 1);
    assert!(o.seen.contains_key("b"));
}

#[test]
fn a_changed_rvn_proves_the_owner_alive() {
    let mut o = Observer::default();
    let now = Instant::now();
    o.judge(&row("a", "1", 0), 0, now, ClockSkew::Unbounded);
    assert!(!o.seen_alive("a", now));
    o.judge(&row("a", "1", 0), 0, now, ClockSkew::Unbounded);
    assert!(!o.seen_alive("a", now));
    o.judge(&row("a", "2", 0), 0, now, ClockSkew::Unbounded);
    assert!(o.seen_alive("a", now));
    assert!(!o.seen_alive("b", now));
    // A lease (10 s here) after the sighting before the change, the owner may be dead.
    assert!(o.seen_alive("a", now + Duration::from_millis(9_999)));
    assert!(!o.seen_alive("a", now + Duration::from_secs(10)));
}

/// A read answered late (slow network) carries a version long replaced: the liveness proof
/// counts from when that read was sent.
#[test]
fn a_slow_answer_proves_nothing_past_its_request() {
    let mut o = Observer::default();
    let asked = Instant::now();
    let answered = asked + Duration::from_secs(9);
    o.judge_read(&row("a", "1", 0), 0, asked, answered, ClockSkew::Unbounded);
    let later = answered + Duration::from_secs(2);
    o.judge_read(&row("a", "2", 0), 0, later, later, ClockSkew::Unbounded);
    // Written after `asked`, more than a lease (10 s) before `later`.
    assert!(!o.seen_alive("a", later));
}

/// A clock-free `wait = 0` sees a row, its owner writes once more and dies, and two seconds
/// later (more than its lease) the caller sees the new version for the first time: a change
/// first seen that late proves nothing, so the holder is not taken for alive.
#[test]
fn a_change_seen_a_lease_after_the_sighting_before_proves_nothing() {
    let mut o = Observer::default();
    let then = Instant::now();
    o.judge(&row("a", "1", 0), 0, then, ClockSkew::Unbounded);
    let later = then + Duration::from_secs(11);
    o.judge(&row("a", "2", 0), 0, later, ClockSkew::Unbounded);
    assert!(!o.seen_alive("a", later));
}

const MS: fn(u64) -> Duration = Duration::from_millis;

#[test]
fn a_waiter_further_back_looks_when_the_queue_can_have_moved() {
    let t0 = Instant::now();
    let mut p = Pace::new(Some(MS(20)), Some(MS(16)), MS(100), Duration::from_secs(2));
    // 7 ahead: 6 places cannot go by in less than 6 holds; 90 % of that.
    assert_eq!(p.after_look(t0, 7, 70, 0.5), Duration::from_micros(86_400));
    // 5 places gained by half way between the looks (55 ms): the turn is learnt, the prior
    // counting as two places: (40 + 55) / 7 ms. Below the hold, it bounds the hold.
    assert_eq!(
        p.after_look(t0 + MS(110), 2, 75, 0.5),
        p.turn().mul_f64(0.9)
    );
    assert_eq!(p.turn(), Duration::from_nanos(95_000_000 / 7));
}

#[test]
fn the_next_waiter_looks_when_the_holder_may_be_done() {
    let t0 = Instant::now();
    // Usual hold 16 ms. First sight: granted within the last 16 ms, so it may be done now
    // and is due in 8 ms: a quarter of that (at least MIN_POLL).
    let mut p = Pace::new(Some(MS(20)), Some(MS(16)), MS(100), Duration::from_secs(2));
    assert_eq!(p.after_look(t0, 1, 9, 0.5), MIN_POLL);
    // Past due by 2 ms: a quarter of that, at least MIN_POLL.
    assert_eq!(p.after_look(t0 + MS(10), 1, 9, 0.5), MIN_POLL);
    // A long overrun: a quarter of it, at most the base poll.
    assert_eq!(p.after_look(t0 + MS(208), 1, 9, 0.5), MS(50));
    assert_eq!(p.after_look(t0 + MS(1008), 1, 9, 0.5), MS(100));
    // A holder seen arriving between two looks 8 ms apart: granted in that span, so done
    // a hold after the span's start at the earliest.
    let mut p = Pace::new(Some(MS(40)), Some(MS(16)), MS(100), Duration::from_secs(2));
    p.after_look(t0, 2, 40, 0.5);
    assert_eq!(p.after_look(t0 + MS(8), 1, 41, 0.5), MS(8));
    // Then a quarter of the way to the middle of the span plus a hold (t0 + 20 ms).
    assert_eq!(p.after_look(t0 + MS(16), 1, 41, 0.5), MIN_POLL);
    assert_eq!(p.after_look(t0 + MS(60), 1, 41, 0.5), MS(10));
}

#[test]
fn without_a_hold_of_its_own_it_takes_three_quarters_of_a_turn() {
    let t0 = Instant::now();
    let mut p = Pace::new(Some(MS(80)), None, MS(100), Duration::from_secs(2));
    p.after_look(t0, 2, 40, 0.5);
    let pause = p.after_look(t0 + MS(30), 1, 41, 0.5);
    // The turn learnt: (160 + 15) / 3 ms; the next holder is done three quarters of it
    // after the earlier look at the earliest.
    assert_eq!(p.turn(), Duration::from_nanos(175_000_000 / 3));
    assert_eq!(pause, p.turn() * 3 / 4 - MS(30));
}

#[test]
fn a_queue_that_stands_still_is_looked_at_less_and_less() {
    let t0 = Instant::now();
    let max = Duration::from_secs(2);
    let mut p = Pace::new(Some(MS(20)), Some(MS(20)), MS(100), max);
    p.after_look(t0, 3, 5, 0.5);
    assert_eq!(p.after_look(t0 + MS(400), 3, 5, 0.5), MS(100));
    assert_eq!(p.after_look(t0 + Duration::from_secs(60), 3, 5, 0.5), max);
    // It moves: back to pacing by the hold.
    assert_eq!(
        p.after_look(t0 + Duration::from_secs(61), 2, 6, 0.5),
        MS(18)
    );
}

#[test]
fn a_count_found_low_restarts_the_baseline() {
    let t0 = Instant::now();
    let mut p = Pace::new(Some(MS(20)), Some(MS(20)), MS(100), Duration::from_secs(2));
    p.after_look(t0, 3, 5, 0.5);
    // More ahead than first counted (others were still queueing in front): no turn is
    // learnt from it, and the places gained later count from here.
    p.after_look(t0 + MS(100), 40, 1, 0.5);
    assert_eq!(p.turn(), MS(20));
    p.after_look(t0 + MS(900), 30, 11, 0.5);
    // 10 places by t0 + 500 ms, 400 ms after the new baseline: (40 + 400) / 12 ms.
    assert_eq!(p.turn(), Duration::from_nanos(440_000_000 / 12));
}

#[test]
fn jitter_spreads_by_ten_percent() {
    let p = Pace::new(
        Some(MS(100)),
        Some(MS(100)),
        MS(100),
        Duration::from_secs(2),
    );
    let t0 = Instant::now();
    assert_eq!(p.clone().after_look(t0, 3, 1, 0.0), MS(162));
    assert_eq!(p.clone().after_look(t0, 3, 1, 1.0), MS(198));
}

#[test]
fn requests_on_a_key_grow_slowly_with_the_queue() {
    // Looks per second of n waiters with 100 ms holds: about (c + 1.1 ln n) per hold
    // (until `max`, here an hour, caps the far ones); never n/base.
    let rate = |n: usize| -> f64 {
        (1..=n)
            .map(|k| {
                let mut p = Pace::new(
                    Some(MS(100)),
                    Some(MS(100)),
                    MS(100),
                    Duration::from_secs(3600),
                );
                1.0 / p.after_look(Instant::now(), k, 1, 0.5).as_secs_f64()
            })
            .sum()
    };
    // Looks per hold: under 15 for 100 waiters (8 of them by the next waiter, which looks
    // densely around its holder's due time), and ten times the waiters adds 1.1 ln 10.
    let (r100, r1000) = (rate(100) * 0.1, rate(1000) * 0.1);
    assert!(r100 < 15.0, "{r100}");
    assert!(r1000 < r100 + 3.0, "{r1000} vs {r100}");
}

#[test]
fn backoff_is_capped_and_jittered() {
    let b = Duration::from_millis(10);
    let m = Duration::from_secs(1);
    assert_eq!(backoff(0, b, m, 1.0), b);
    assert_eq!(backoff(3, b, m, 1.0), b * 8);
    assert_eq!(backoff(30, b, m, 1.0), m);
    assert!(backoff(3, b, m, 0.5) < b * 8);
}
