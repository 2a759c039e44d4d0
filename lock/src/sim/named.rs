//! The named schedules: seeds that reach a rare interleaving, each checked for its marker event
//! and for violations.

use super::run;
use super::scenario::Knobs;
use super::tests::explain;

/// Named schedules, each described by the rare interleaving it exercises. Each must still contain
/// its marker event: a change that loses the schedule (the scenario generator in
/// `sim/scenario.rs`, or the order of the protocol's requests)
/// is reported apart from violations, with the seed to re-pick through `replay`, so a real catch
/// is never lost among such false alarms.
#[test]
fn named_schedules_hold() {
    let clock_free = Knobs {
        all_clock_free: true,
        ..Knobs::default()
    };
    let named: [(u64, Knobs, &str, &str); 13] = [
        (1411, Knobs::default(), "OPERATOR deletes the counter",
         "an enqueue reads 'no counter, queue clear' and its answer is lost; others queue and \
          the counter is deleted again; its retry lands and must not be granted beside them"),
        (2022, Knobs::default(), "OPERATOR deletes the counter",
         "an enqueue on 'no counter' takes a ticket below a row granted meanwhile: it must look \
          at every row below it, not only its own"),
        (121, Knobs::default(), "OPERATOR deletes row",
         "an operator deletes a waiting row; its owner may be granted on a read from just before"),
        (141, Knobs::default(), "cancels its acquisition",
         "an acquisition is cancelled; its row is removed in the background"),
        (33, Knobs::default(), "OPERATOR deletes the counter",
         "the counter is deleted while rows are queued; tickets stay above them"),
        (54, Knobs::default(), "OPERATOR sets the counter",
         "the counter is set back below the queue; tickets stay above every queued row"),
        (835, Knobs::default(), "OPERATOR deletes the counter of k1",
         "a seat enqueue times out, the counter is deleted and recreated by the same process \
          exactly as read, and the timed-out attempt lands; a new request for the same ticket \
          meets it and must not believe its own, longer lease"),
        (2210, Knobs::default(), "-> Revived",
         "a heartbeat lands between a waiter's judgement and its stale delete: the row lives"),
        (152, clock_free, "OPERATOR deletes row",
         "clock-free: a token replay answers Done for a row an operator deleted"),
        (200311, clock_free, "conflict on Enqueue(",
         "an enqueue's answer is lost, its retry meets a conflict and the caller gives up; the \
          lost attempt lands later and its row must still be removed"),
        (270, Knobs::default(), "duplicate of Enqueue(k0 t5",
         "a request for ticket 5 is answered 'no counter', the counter is recreated and a new \
          request for ticket 5 sent; the first one's late copy lands under a token of its own \
          (one per request) and meets OursOlder, not a mismatch"),
        (705, Knobs::default(), "p3 crashes holding k0 token 2",
         "a clock-free wait = 0 reads a seat slowly (its answer a second late), its holder \
          heartbeats once more and crashes; the next reads see a new version, and the waiter \
          must still take the key once the holder has been quiet for a lease, not say busy"),
        (7674, clock_free, "p3 crashes holding k0 token 1",
         "clock-free: the holder (t1) crashes behind rows that two crashed acquisitions left; a \
          waiter's read sees them all and must watch every one from that read (not each only once \
          the one before it is passed over, a lease apiece), so the key moves within the \
          progress bound"),
    ];
    let mut moved = Vec::new();
    let mut broken = Vec::new();
    for (seed, knobs, marker, what) in named {
        let r = run(seed, knobs);
        if !r.trace.iter().any(|l| l.contains(marker)) {
            moved.push(format!(
                "seed {seed} no longer contains {marker:?} ({what}): the scenario generator \
                 (sim/scenario.rs) or the protocol's request order changed; pick a new seed that \
                 reaches it with `replay`"
            ));
        }
        if !r.violations.is_empty() {
            broken.push(format!("{what}:\n{}", explain(&r)));
        }
    }
    // Violations first: a real catch must not hide behind a schedule that moved.
    assert!(
        broken.is_empty(),
        "named schedules that VIOLATE a guarantee:\n{}\n\n(and {} that lost their marker)",
        broken.join("\n\n"),
        moved.len()
    );
    assert!(
        moved.is_empty(),
        "named schedules that lost their marker (no violation; re-pick them):\n{}",
        moved.join("\n")
    );
}
