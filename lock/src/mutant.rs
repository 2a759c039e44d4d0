//! Deliberate defects in the protocol code itself (not in the model), each behind a test-only
//! switch, so the mutation suite can show that a check sees what it claims to.
//!
//! A switch is set for one thread: a simulated run drives every task of the protocol on one
//! current-thread runtime (the thread that calls `sim::run`), and the differential test runs
//! on its own `#[tokio::test]` thread, so schedules of the real protocol that other tests run in
//! parallel never see another test's defect. Outside `cfg(test)` none of this is compiled.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// A defect planted in the protocol's code (`membership.rs`, `locker.rs`, `liveness.rs`,
/// `storage/dynamo.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// The heartbeat's schedule: each renewal is sent a whole lease after the last one instead
    /// of one interval, so a healthy holder loses its lock after a lease.
    HeartbeatEveryLease,
    /// The wait deadline: a waiter with a deadline looks every `max_poll` and its last pause is
    /// not cut at the deadline, so a `wait = d` answers up to a `max_poll` late.
    WaitOvershoots,
    /// The clock-free observer: a row is "seen alive" as soon as it has been seen at all, so a
    /// clock-free `wait = 0` says busy at first sight of a dead holder.
    BusyAtFirstSight,
    /// The skip decision: `wait = 0` treats every row ahead as live, without passing a stale one
    /// over, in either mode.
    SkipTrustsEveryRow,
    /// The lost-signal path: a heartbeat that finds the row gone keeps retrying until the lease
    /// runs out, instead of reporting the loss.
    GoneRetriedUntilLease,
    /// A waiter's pace: every pause between looks is twenty times as long (the deadline still
    /// cuts it), so handoffs to waiters of other processes are slow.
    LazyLooks,
    /// FIFO: rows ahead that have not been granted yet (no `acquiredAtMs`, not the seat) are
    /// not waited for, so a waiter passes the waiters ahead of it.
    WaitersAheadIgnored,
    /// Self-cleaning: a cancelled acquisition forgets the entries its requests may have written,
    /// and a dropped guard its row, instead of removing them.
    AbandonLeavesRows,
    /// `sweep/sweeper.rs`: the sweeper's cutoff is its own wall clock, without the grace, so it
    /// removes an entry as soon as the lease it shows has ended by the sweeper's clock.
    SweepWithoutGrace,
    /// `storage/dynamo.rs`: a heartbeat's `UpdateItem` is conditioned on the owner alone, not on the
    /// stored lease (the differential test sees it; the simulation runs the model's conditions).
    StoreHeartbeatOwnerOnly,
    /// `storage/dynamo.rs`: the release of a seat is conditioned on nothing but the seat being taken.
    StoreVacateAnyOwner,
    /// `storage/dynamo.rs`: a stale row's `DeleteItem` loses its `rvn` condition.
    StoreStaleDeleteUnconditional,
    /// `locker/attempt.rs`: a waiter's look ignores the counter it reads (the watermark, and for
    /// coalescing waiters, newer ticks queued behind): a duplicate that waited runs after the
    /// first run succeeded.
    WaiterIgnoresWatermark,
    /// `locker/attempt.rs`: a coalescing waiter never withdraws for a newer tick queued behind it
    /// (it still answers a done tick): an overrun runs every waiting tick.
    CoalesceNeverWithdraws,
    /// `guard.rs`: `release` (the failed run's) marks the tick done too.
    ReleaseAlwaysMarks,
    /// `storage/dynamo.rs`: the enqueue's tick condition passes whatever the watermark.
    StoreEnqueueIgnoresWatermark,
    /// `storage/dynamo.rs`: a release that marks a tick moves the watermark backwards too.
    StoreMarkBackwards,
    /// `storage/dynamo/removal.rs`: the sweep's row `DeleteItem` loses the `rvn` term of its
    /// condition (the owner and the cutoff remain).
    StoreSweepWithoutRvn,
    /// `storage/dynamo.rs`: the seat's take loses its protocol term (the version
    /// ignored by one request), so a build that does not speak the key's protocol takes a seat
    /// it cannot read.
    StoreSeatIgnoresProtocol,
    /// `locker/attempt.rs`, `locker/attempt.rs`: a waiter's look ignores the version and the permits of
    /// the counter it reads, so a waiter queued before its key's permits were lowered is granted
    /// by its own, higher number.
    LookIgnoresProtocol,
    /// `locker/attempt.rs`: a look that finds the way clear grants without checking that our own
    /// lease outlasted the look: an entry others may have judged dead and passed over meanwhile
    /// is granted the key (two holders).
    GrantPastOwnLease,
    /// `locker/attempt.rs`: "has the wait run out" compares the call's start with the deadline
    /// instead of the present, so a `wait = d` never gives up; its pause, cut at the deadline,
    /// becomes a loop of looks without a pause until it is granted.
    WaitNeverGivesUp,
    /// `locker.rs`: an enqueue that outlasted its own lease (long retries) is kept instead of
    /// left and made again: a queue that was clear grants an entry others may have passed over.
    EnqueuePastOwnLease,
    /// `locker.rs`: the tick id's record check that outlasted the lease (before heartbeats
    /// start) still grants.
    TickCheckPastOwnLease,
    /// `liveness.rs`: bounded mode judges a row stale once our wall clock passes its
    /// `leaseUntilMs`, without the skew allowance.
    StaleWithoutAllowance,
    /// `liveness.rs`: clock-free mode judges a row stale after a lease on our clock, without the
    /// 1/64 margin for clocks that run at different rates.
    StaleWithoutMargin,
    /// `membership.rs`: a confirmed renewal's lease counts from when its answer came back instead
    /// of from just before it was sent.
    LeaseFromAnswer,
    /// `liveness.rs`: the pace's floor is gone: a waiter next in line whose holder is due looks
    /// again without a pause.
    NoPollFloor,
    /// `locker/attempt.rs`: "would the pause after a transaction conflict end past the retry
    /// budget" inverted: any conflict answers busy, even to a forever wait.
    ConflictGivesUp,
    /// `locker/attempt.rs`: "every permit is taken" compares with `>` instead of `>=`: one live
    /// entry too many is ahead when a waiter is granted (N + 1 holders).
    PermitsOffByOne,
    /// `locker/attempt.rs`: only granted entries (the seat, rows with a grant time) count against
    /// the permits: a waiter ahead that has not been granted yet is overtaken.
    PermitsCountOnlyHolders,
    /// `locker/attempt.rs`: the counter's seat is not counted against the permits (it is still
    /// judged, passed over and removed like any entry).
    SeatNotCounted,
    /// `storage/dynamo.rs`: the enqueue's permits condition accepts any permits (the
    /// version still checked): a participant of other permits is granted on the key.
    StorePermitsIgnored,
    /// `locker/attempt.rs`: a refused hint of more than one permit takes the counter it was
    /// answered with at face value instead of reading: standing at the hint's own ticket, moved
    /// by another, it is taken to mean that nobody queued since, and the next ticket is granted
    /// at once. After a counter set back or recreated by hand that ticket may be another
    /// holder's (N + 1 holders).
    HintPastOthers,
    /// `locker/attempt.rs`: the enqueue's read does not compare the key's permits with ours (the
    /// writes still do), so a `wait = 0` of another number on a key whose permits are all held
    /// is answered busy instead of refused.
    SurveyIgnoresPermits,
    /// `locker/attempt.rs`: a look removes the stale rows of the pages above the counter's without
    /// reading the counter first, so a waiter of a key switched to other permits (or a newer
    /// protocol) removes rows before it is refused.
    LookRemovesUnchecked,
    /// `membership.rs`: a heartbeat refused with a fatal answer other than a newer protocol (the
    /// key's permits changed under a seat, access denied) is retried until the lease runs out
    /// and reported as an expired lease.
    FatalHeartbeatRetried,
    /// `membership.rs`: bounded mode believes the whole lease written on the holder's monotonic
    /// clock, without the 64th it takes off for a clock that runs slow.
    BelievedWithoutMargin,
}

thread_local! {
    static ACTIVE: Cell<Option<Mutant>> = const { Cell::new(None) };
    static FIRED: RefCell<BTreeMap<&'static str, u64>> = const { RefCell::new(BTreeMap::new()) };
}

/// Whether `mutant` is planted on this thread.
pub(crate) fn on(mutant: Mutant) -> bool {
    ACTIVE.with(|a| a.get() == Some(mutant))
}

/// Plants `mutant` on this thread until the returned guard is dropped.
pub(crate) fn plant(mutant: Option<Mutant>) -> Planted {
    let before = ACTIVE.with(|a| a.replace(mutant));
    Planted(before)
}

/// Restores the previous switch when dropped.
pub(crate) struct Planted(Option<Mutant>);

impl Drop for Planted {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(self.0));
    }
}

/// Counts one firing of the safety guard `guard` on this thread (the simulation's coverage table
/// shows how often each guard decided something: a guard that never fires is untested).
pub(crate) fn fired(guard: &'static str) {
    FIRED.with(|f| *f.borrow_mut().entry(guard).or_default() += 1);
}

/// The guards fired on this thread since the last call, and forgets them.
pub(crate) fn take_fired() -> BTreeMap<&'static str, u64> {
    FIRED.with(|f| std::mem::take(&mut *f.borrow_mut()))
}

/// The guard in `locker/attempt.rs`: a clear look after our own lease ran out does not grant.
pub(crate) const GUARD_LOOK: &str = "guard: own lease ran out across the last look";
/// The guard in `locker.rs`: an enqueue that outlasted its lease is made again.
pub(crate) const GUARD_ENQUEUE: &str = "guard: own lease ran out during the enqueue";
/// The guard in `locker.rs`: a tick id check that outlasted the lease does not grant.
pub(crate) const GUARD_TICK_ID: &str = "guard: own lease ran out during the tick id check";
/// `locker/attempt.rs`: a hint of more than one permit refused because others took tickets since
/// reads the queue before it queues (no ticket arithmetic survives a counter set back by hand).
pub(crate) const GUARD_HINT_READS: &str = "guard: a refused hint of N > 1 reads the queue";
/// `locker/attempt.rs`: a look that met a stale row on a page above the counter's read the counter
/// (and was answered by it) before removing anything.
pub(crate) const GUARD_LOOK_COUNTER: &str =
    "guard: a look read the counter before removing a stale row";
/// The margin in `liveness.rs`: a clock-free row watched for its lease but not yet for its lease
/// and 1/64 is still live.
pub(crate) const GUARD_MARGIN: &str = "guard: clock-free margin kept a row a lease old live";
/// The margin in `membership.rs` (bounded mode): a holder whose monotonic clock runs slow would
/// have believed past what its stored version promises (checked by `sim/watch.rs`).
pub(crate) const GUARD_BELIEVED: &str =
    "guard: bounded margin kept a slow clock's belief inside its lease";
