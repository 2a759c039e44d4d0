//! Our row in a key's queue: keeping it alive, knowing the moment we can no longer be sure it
//! is, and leaving (with a tick marked done when the run succeeded: see [`crate::tick`]).
//!
//! A [`Membership`] is our row plus the background task that heartbeats it. It exists from the
//! moment the row is written (a waiter's row must stay live too, or those behind it would pass
//! it over) until the row is deleted. It owns its task: dropping it stops the heartbeat and
//! removes the row in the background, so a cancelled acquisition or a forgotten guard never
//! leaves a heartbeating row behind.
//!
//! **The lost signal.** The task keeps `valid_until`: `sent + lease`, where `sent` is the
//! monotonic instant taken just before the last write that was *confirmed*. Others may call the
//! row stale only after that point (see `liveness.rs`), so when `valid_until` passes without a
//! confirmed renewal — or a renewal finds the row gone or not ours, or is refused with an answer
//! that retrying cannot change ([`LostReason::refused`]) — the signal fires. It fires before
//! anyone else can be granted the key. After it fires the task stops: no late heartbeat
//! is ever sent past the deadline.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::error::Error;
use crate::liveness::backoff;
use crate::options::LockOptions;
use crate::retry::Policy;
use crate::schema::ttl_seconds;
use crate::storage::{Beat, Failure, Owned, Renewal, Speaks, Store};
use crate::tick::Tick;

/// Why a lock (or a place in the queue) was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LostReason {
    /// No heartbeat could be confirmed before the lease ran out (DynamoDB unreachable, throttled,
    /// or this process was paused).
    LeaseExpired,
    /// The row was deleted or taken over by someone else (passed over as dead, swept, deleted by
    /// hand).
    RowGone,
    /// The key was switched to a newer protocol than this build speaks (see
    /// [`crate::PROTOCOL`]): its seat can no longer be renewed by this build.
    ProtocolTooNew,
    /// The key's permits were changed to another number than this participant's (by hand, or by
    /// `flightlock permits --set` while nobody sat on the counter's seat): its seat can no longer
    /// be renewed by this participant ([`crate::Error::PermitsMismatch`]).
    PermitsMismatch,
    /// A heartbeat was refused with access denied: the credentials' permissions on the lock
    /// table changed, or they expired without being renewed ([`crate::Error::AccessDenied`]).
    AccessDenied,
    /// A heartbeat found no lock table: it was deleted ([`crate::Error::TableNotFound`]).
    TableNotFound,
    /// A heartbeat was refused with another error that retrying cannot change (a malformed
    /// item, a request DynamoDB rejects); the log names it.
    Refused,
}

impl LostReason {
    /// The reason a fatal answer to a heartbeat gives for the loss.
    pub(crate) fn refused(error: &Error) -> LostReason {
        match error {
            Error::ProtocolTooNew { .. } => LostReason::ProtocolTooNew,
            Error::PermitsMismatch { .. } => LostReason::PermitsMismatch,
            Error::AccessDenied { .. } => LostReason::AccessDenied,
            Error::TableNotFound { .. } => LostReason::TableNotFound,
            _ => LostReason::Refused,
        }
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::LeaseExpired => "no heartbeat could be confirmed before the lease ran out",
            LostReason::RowGone => "the lock row was removed or taken over by someone else",
            LostReason::ProtocolTooNew => {
                "the key was switched to a newer flightlock protocol than this build speaks"
            }
            LostReason::PermitsMismatch => {
                "the key's permits were changed to another number than this participant's"
            }
            LostReason::AccessDenied => "a heartbeat was refused: access to the lock table denied",
            LostReason::TableNotFound => "a heartbeat found no lock table: it was deleted",
            LostReason::Refused => {
                "a heartbeat was refused with an error that retrying cannot change (logged)"
            }
        })
    }
}

/// The state published by the heartbeat task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowState {
    /// Our row is ours until at least this instant.
    Live(Instant),
    /// We can no longer be sure.
    Lost(LostReason),
}

/// A published state, with a passed deadline read as lost (`now` on the holder's clock).
pub(crate) fn current(state: &RowState, now: Instant) -> RowState {
    match *state {
        RowState::Live(until) if now >= until => RowState::Lost(LostReason::LeaseExpired),
        s => s,
    }
}

/// Timing of one membership.
#[derive(Debug, Clone)]
pub(crate) struct Timing {
    pub interval: Duration,
    /// The options, for [`LockOptions::lease_until_ms`] (lease length and cap) and
    /// [`LockOptions::expires_at`].
    pub opts: Arc<LockOptions>,
}

/// A queue entry just written by the enqueue (a row, or the counter's seat).
pub(crate) struct Written<'a> {
    pub key: &'a str,
    pub ticket: u64,
    /// The entry is the counter's seat.
    pub seat: bool,
    pub owner: &'a str,
    /// The queue was clear: the row holds the key from the start.
    pub granted: bool,
    /// Monotonic instant taken before the write was first sent (retries of an ambiguous write
    /// resend the same request, so its lease counts from the first attempt).
    pub sent: Instant,
    /// How long after `sent` the written lease lasts (the lease, or less under a cap).
    pub valid_for: Duration,
    /// The `leaseUntilMs` the row was written with: heartbeats never write a lower one.
    pub lease_until_ms: i64,
    /// Our wall clock when the row was prepared (its `acquiredAtMs` if `granted`).
    pub wall_ms: i64,
}

/// Our row and its heartbeat task.
#[derive(Debug)]
pub(crate) struct Membership {
    pub(crate) store: Store,
    pub(crate) key: Arc<str>,
    pub(crate) ticket: u64,
    /// Our entry is the counter's seat, not a row.
    pub(crate) seat: bool,
    pub(crate) owner: Arc<str>,
    state: watch::Receiver<RowState>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
    /// Wall-clock ms of the grant (0: not granted yet), for `acquiredAtMs`.
    granted_at_ms: Arc<AtomicI64>,
    failures: Arc<AtomicU64>,
    pub(crate) clock: Arc<dyn Clock>,
    left: bool,
    /// Our version condition on the seat ([`Speaks::maintain`] of our permits).
    speaks: Speaks,
    /// Our permits.
    permits: u32,
}

impl Membership {
    /// Starts heartbeating a row just written.
    pub(crate) fn start(
        store: Store,
        clock: Arc<dyn Clock>,
        row: Written<'_>,
        timing: Timing,
    ) -> Membership {
        let Written {
            key,
            ticket,
            seat,
            owner,
            granted,
            sent,
            valid_for,
            lease_until_ms,
            wall_ms,
        } = row;
        let (tx, rx) = watch::channel(RowState::Live(sent + valid_for));
        let failures = Arc::new(AtomicU64::new(0));
        let cancel = CancellationToken::new();
        let granted_at_ms = Arc::new(AtomicI64::new(if granted { wall_ms } else { 0 }));
        let key: Arc<str> = key.into();
        let owner: Arc<str> = owner.into();
        let permits = timing.opts.permits;
        let speaks = Speaks::maintain(permits);
        let task = tokio::spawn(
            Heartbeat {
                store: store.clone(),
                key: key.clone(),
                ticket,
                seat,
                owner: owner.clone(),
                timing,
                clock: clock.clone(),
                state: tx,
                cancel: cancel.clone(),
                granted_at_ms: granted_at_ms.clone(),
                failures: failures.clone(),
            }
            .run(sent + valid_for, lease_until_ms),
        );
        Membership {
            store,
            key,
            ticket,
            seat,
            owner,
            state: rx,
            cancel,
            task: Some(task),
            granted_at_ms,
            failures,
            clock,
            left: false,
            speaks,
            permits,
        }
    }

    /// The permits the entry was granted under.
    pub(crate) fn permits(&self) -> u32 {
        self.permits
    }

    /// Heartbeats that failed (and were retried) so far.
    pub(crate) fn heartbeat_failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Marks the row granted at `wall_ms`. The next regular heartbeat records it as
    /// `acquiredAtMs`; none is sent for it now. The lease in hand is good (the grant checked it),
    /// and an extra write at every handoff would cost a request and a write unit per contended
    /// cycle for a field only `status` shows (so a hold shorter than a heartbeat interval is never
    /// shown with its grant time, and nobody can see such a hold in `status` anyway).
    pub(crate) fn mark_granted(&self, wall_ms: i64) {
        self.granted_at_ms.store(wall_ms.max(1), Ordering::Release);
    }

    /// The row's state. A lease whose deadline has passed counts as lost even before the
    /// heartbeat task has run to publish it (it may be delayed on a loaded machine).
    pub(crate) fn state(&self) -> RowState {
        current(&self.state.borrow(), self.clock.now())
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<RowState> {
        self.state.clone()
    }

    /// Stops the heartbeat and deletes the row. `Owned::No` means it was not ours any more.
    pub(crate) async fn leave(self) -> Result<Owned, Error> {
        self.leave_done(None).await
    }

    /// [`Membership::leave`]; for the seat, with `done`, marking that ordered tick done in the
    /// same write (a newer tick marked: released without the mark).
    pub(crate) async fn leave_done(mut self, done: Option<i64>) -> Result<Owned, Error> {
        self.left = true;
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            // The task exits at its next await point; an in-flight heartbeat is dropped and, if
            // it still lands, fails its condition once the row is gone.
            let _ = task.await;
        }
        let lost = matches!(self.state(), RowState::Lost(_));
        // Lost: still try to delete: if the row is ours (e.g. the lease ran out while DynamoDB
        // was unreachable) removing it hands the key on sooner.
        let owned = delete_with_retry(
            &self.store,
            &*self.clock,
            &self.key,
            (self.ticket, self.seat),
            &self.owner,
            done,
            self.speaks,
        )
        .await?;
        Ok(if lost { Owned::No } else { owned })
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        self.cancel.cancel();
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::AbandonLeavesRows) {
            return;
        }
        // Dropped without `leave` (a cancelled acquire, a guard not released): remove the row in
        // the background if a runtime is still there; otherwise it goes stale after one lease.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (store, clock, key, owner, ticket, seat, speaks) = (
                self.store.clone(),
                self.clock.clone(),
                self.key.clone(),
                self.owner.clone(),
                self.ticket,
                self.seat,
                self.speaks,
            );
            let tracker = self.store.background().clone();
            tracker.spawn_on(async move {
                if let Err(e) = delete_with_retry(&store, &*clock, &key, (ticket, seat), &owner, None, speaks).await {
                    tracing::warn!(key = %key, ticket, error = %e, "background release failed; the row will be passed over after its lease");
                }
            }, &rt);
        }
    }
}

/// Bounded mode: how long a holder believes a lease that others see end `written` after its
/// write's wall time. Others judge it by `leaseUntilMs` on their wall clocks (within the
/// allowance); the holder counts on its monotonic clock, which may run slow by up to 1/64 (the
/// protocol's assumption on monotonic rates). Believing a 64th less keeps its belief inside the
/// `leaseUntilMs` it wrote, so the allowance covers the wall clocks' disagreement alone.
/// (Clock-free mode puts the 1/64 on the watcher's side instead: `liveness.rs`.)
pub(crate) fn believed(written: Duration) -> Duration {
    #[cfg(test)]
    if crate::mutant::on(crate::mutant::Mutant::BelievedWithoutMargin) {
        return written;
    }
    written - written / 64
}

/// Deletes our row, retrying transient failures for a few seconds.
///
/// If an attempt fails ambiguously (its response lost) and a later one finds the row gone, the
/// earlier attempt deleted it: that is `Owned::Yes`. (The alternative — someone else deleted
/// our row in the few milliseconds between — needs our lease to have run out in between, which
/// the caller's lost signal reports on its own.)
///
/// `done` (the seat only) marks that ordered tick done in the same write; if a newer tick is
/// marked already ([`Owned::NotMarked`]) the seat is released without the mark.
pub(crate) async fn delete_with_retry(
    store: &Store,
    clock: &dyn Clock,
    key: &str,
    (ticket, seat): (u64, bool),
    owner: &str,
    mut done: Option<i64>,
    speaks: Speaks,
) -> Result<Owned, Error> {
    let give_up = clock.now() + RELEASE_BUDGET;
    let mut attempt = 0;
    let mut ambiguous = false;
    loop {
        let failure = match store
            .delete_owned(key, ticket, seat, owner, done, speaks)
            .await
        {
            Ok(Owned::No) if ambiguous => return Ok(Owned::Yes),
            Ok(Owned::NotMarked) => {
                tracing::warn!(key, ticket, tick = ?done, "a newer tick is marked done already; releasing without marking ours");
                done = None;
                continue;
            }
            Ok(o) => return Ok(o),
            Err(f) => f,
        };
        attempt += 1;
        if !RELEASE_RETRY
            .pause(&failure, attempt, Some(give_up), clock)
            .await
        {
            return Err(failure.into_error());
        }
        ambiguous = true;
    }
}

impl Membership {
    /// Marks `tick` done for the run that holds this row. Returns the ordered tick the seat's
    /// release must mark in its own write (the seat: free); a queue row's release marks the
    /// counter here first (one more request), and a tick id's record is written here (one more
    /// write). Each request is retried like a release.
    pub(crate) async fn mark_done(
        &self,
        tick: &Tick,
        keep: Duration,
    ) -> Result<Option<i64>, Error> {
        let (store, clock, key) = (&self.store, &*self.clock, &*self.key);
        match tick {
            Tick::At(t) if self.seat => Ok(Some(*t)),
            Tick::At(t) => {
                let marked = RELEASE_RETRY
                    .send(clock.now() + RELEASE_BUDGET, clock, || {
                        store.mark_done(key, *t)
                    })
                    .await?;
                if !marked {
                    tracing::warn!(key, tick = %tick, "a newer tick is marked done already; not marking ours");
                }
                Ok(None)
            }
            Tick::Id(id) => {
                let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
                let expires_at = ttl_seconds(clock.wall_ms().saturating_add(keep_ms));
                RELEASE_RETRY
                    .send(clock.now() + RELEASE_BUDGET, clock, || {
                        store.record_tick(key, id, expires_at)
                    })
                    .await?;
                Ok(None)
            }
        }
    }
}

/// How long a release's request (and a tick's mark or check) is retried.
pub(crate) const RELEASE_BUDGET: Duration = Duration::from_secs(5);

/// How a release retries: for up to 5 s, short pauses (a release in a `Drop` runs in the
/// background; a process that exits waits for it).
pub(crate) const RELEASE_RETRY: Policy = Policy {
    base: Duration::from_millis(25),
    max: Duration::from_millis(500),
    attempts: u32::MAX,
};

struct Heartbeat {
    store: Store,
    key: Arc<str>,
    ticket: u64,
    seat: bool,
    owner: Arc<str>,
    timing: Timing,
    clock: Arc<dyn Clock>,
    state: watch::Sender<RowState>,
    cancel: CancellationToken,
    granted_at_ms: Arc<AtomicI64>,
    failures: Arc<AtomicU64>,
}

impl Heartbeat {
    async fn run(self, first_valid_until: Instant, first_lease_until_ms: i64) {
        let mut valid_until = first_valid_until;
        // The highest `leaseUntilMs` sent so far (confirmed or not: an unconfirmed write may
        // have landed). Each heartbeat writes at least this, so its condition
        // (`leaseUntilMs <= :until`) passes even if our wall clock stepped back, while an older
        // heartbeat that lands late fails it instead of rolling the lease back.
        let mut last_until = first_lease_until_ms;
        let mut next = self.clock.now() + self.interval();
        let mut failures: u32 = 0;
        loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return,
                _ = self.clock.sleep_until(valid_until) => return self.lost(LostReason::LeaseExpired),
                _ = self.clock.sleep_until(next) => {}
            }
            let sent = self.clock.now();
            let wall = self.clock.wall_ms();
            let opts = &self.timing.opts;
            let wanted = opts.lease_until_ms(wall);
            if wanted <= wall {
                // The cap is reached: no more renewals. The lease runs out at `valid_until`.
                next = valid_until + Duration::from_secs(3600);
                continue;
            }
            let lease_until_ms = wanted.max(last_until);
            last_until = lease_until_ms;
            // How long others must treat the row as live after this write lands. Clock-free
            // waiters count the row's lease on their own clocks from when they see the new rvn;
            // others compare `leaseUntilMs` with their wall clocks, which (within the allowance)
            // agree with ours: never more than one lease, whatever `last_until` added.
            let valid_for = if opts.clock_free() {
                opts.lease
            } else {
                believed(
                    Duration::from_millis(u64::try_from(wanted - wall).unwrap_or(0))
                        .min(opts.lease),
                )
            };
            let rvn = crate::clock::new_id(&*self.clock);
            let granted_at_ms = self.granted_at_ms.load(Ordering::Acquire);
            let beat = Beat {
                key: self.key.to_string(),
                ticket: self.ticket,
                seat: self.seat,
                owner: self.owner.to_string(),
                lease_until_ms,
                expires_at: opts.expires_at(lease_until_ms),
                rvn,
                acquired_at_ms: (granted_at_ms > 0).then_some(granted_at_ms),
                speaks: Speaks::maintain(opts.permits),
            };
            let result = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return,
                _ = self.clock.sleep_until(valid_until) => return self.lost(LostReason::LeaseExpired),
                r = self.store.heartbeat(&beat) => r,
            };
            let failure = match result {
                Ok(Renewal::Renewed) => {
                    failures = 0;
                    valid_until = sent + valid_for;
                    #[cfg(test)]
                    if crate::mutant::on(crate::mutant::Mutant::LeaseFromAnswer) {
                        valid_until = self.clock.now() + valid_for;
                    }
                    next = sent + self.interval();
                    self.state.send_replace(RowState::Live(valid_until));
                    continue;
                }
                Ok(Renewal::Gone) if !gone_retried() => return self.lost(LostReason::RowGone),
                Ok(Renewal::Gone) => Failure::Retry {
                    throttled: false,
                    operation: "UpdateItem",
                    source: "mutant: a missing row retried".into(),
                },
                // Only an older heartbeat can meet a later lease; ours are sent in order with
                // non-decreasing leases. Not extended: treat it as a failed attempt.
                Ok(Renewal::Superseded) => Failure::Retry {
                    throttled: false,
                    operation: "UpdateItem",
                    source: "the row already carries a later lease than this heartbeat".into(),
                },
                // An answer that retrying cannot change (the key now runs a protocol we do not
                // speak, or other permits; access denied; no table): the lock is lost now, and
                // says why. Retried until the lease ran out, it would only be reported late, as
                // an expired lease. Nothing more is written.
                Err(Failure::Fatal(e)) if !fatal_retried(&e) => {
                    tracing::error!(key = %self.key, ticket = self.ticket, error = %e, "heartbeat refused");
                    return self.lost(LostReason::refused(&e));
                }
                Err(f) => f,
            };
            failures += 1;
            self.failures.fetch_add(1, Ordering::Relaxed);
            let (throttled, error) = match &failure {
                Failure::Retry {
                    throttled, source, ..
                } => (*throttled, source.to_string()),
                Failure::Fatal(e) => (false, e.to_string()),
            };
            tracing::warn!(key = %self.key, ticket = self.ticket, throttled, failures, %error,
                "heartbeat failed; retrying before the lease runs out");
            let pause = backoff(
                failures,
                Duration::from_millis(50),
                self.timing.interval / 2,
                self.clock.jitter(),
            );
            next = self.clock.now() + pause;
        }
    }

    /// The pause between renewals (under a test-only mutant, a whole lease).
    fn interval(&self) -> Duration {
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::HeartbeatEveryLease) {
            return self.timing.opts.lease;
        }
        self.timing.interval
    }

    fn lost(&self, reason: LostReason) {
        tracing::error!(key = %self.key, ticket = self.ticket, %reason, "lock lost");
        self.state.send_replace(RowState::Lost(reason));
    }
}

/// Whether a heartbeat's fatal answer is retried (only under a test-only mutant, and never a
/// newer protocol's: the lost signal must fire at once, with the answer's reason).
fn fatal_retried(_error: &Error) -> bool {
    #[cfg(test)]
    if crate::mutant::on(crate::mutant::Mutant::FatalHeartbeatRetried) {
        return !matches!(_error, Error::ProtocolTooNew { .. });
    }
    false
}

/// Whether a renewal that found the row gone is retried (only under a test-only mutant: the
/// lost signal must fire at once).
fn gone_retried() -> bool {
    #[cfg(test)]
    if crate::mutant::on(crate::mutant::Mutant::GoneRetriedUntilLease) {
        return true;
    }
    false
}
