//! The enqueue: one acquisition's state ([`Attempt`]), its survey of the queue, and the atomic
//! write that takes a ticket (or the seat), with the removal of what a dropped attempt may have
//! written.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::inflight::InFlight;
use super::{retry_pause, Locker, MIN_RETRY_BUDGET};
use crate::clock::{millis, new_id};
use crate::error::{Error, HeldBy};
use crate::heartbeat::{delete_with_retry, Membership, Timing, Written};
use crate::liveness::{backoff, jittered, Verdict};
use crate::options::{LockOptions, Wait};
use crate::schema::{Counter, NewRow, QueueRow, Snapshot};
use crate::storage::{Enqueue, EnqueueRequest, StaleDelete};

/// The state of one `acquire` call.
pub(super) struct Attempt<'a> {
    pub(super) locker: &'a Locker,
    pub(super) key: &'a str,
    pub(super) opts: &'a LockOptions,
    pub(super) started: Instant,
    pub(super) deadline: Option<Instant>,
    /// The highest ticket seen on the key (counter or row) during this call. Every ticket we
    /// take is above it.
    pub(super) max_seen: u64,
    /// The lowest and highest tickets the enqueue's read found: the wait starts from them (our
    /// ticket minus the lowest rows ahead at most; the highest right ahead of ours if it is the
    /// ticket below) instead of looking again at once.
    pub(super) surveyed: Option<(u64, u64)>,
}

/// How many times a `wait = 0` acquisition with more than one permit reads the queue again after
/// losing the race to enqueue, before it answers busy.
const MAX_REREADS: u32 = 2;

/// Where the expected counter value came from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Hint,
    Read,
}

/// A prepared enqueue: one ticket, one token, one byte-identical request, and the lease it
/// writes. Retries of an ambiguous attempt resend exactly this (a changed request under the
/// same `ClientRequestToken` is an `IdempotentParameterMismatch` on DynamoDB, and on a server
/// that ignores tokens the lease we would believe in would not be the one stored).
pub(super) struct Prepared {
    pub(super) request: EnqueueRequest,
    /// Monotonic instant before the first send.
    pub(super) first_sent: Instant,
    /// Wall time the row's lease was computed from.
    pub(super) wall: i64,
    pub(super) lease_until_ms: i64,
    pub(super) granted: bool,
}

impl Attempt<'_> {
    pub(super) fn now(&self) -> Instant {
        self.locker.clock.now()
    }

    pub(super) fn timed_out(&self) -> bool {
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::WaitNeverGivesUp) {
            return self.deadline.is_some_and(|d| self.started >= d);
        }
        self.deadline.is_some_and(|d| self.now() >= d)
    }

    /// Until when transient failures are retried.
    pub(super) fn retry_budget(&self) -> Instant {
        let floor = self.now() + MIN_RETRY_BUDGET;
        match self.deadline {
            Some(d) => d.max(floor),
            None => self.now() + Duration::from_secs(3600),
        }
    }

    /// [`Error::Busy`], naming `holders` (the live entries ahead that hold or will hold the
    /// key's permits: at most `permits` of them).
    pub(super) fn busy(&self, holders: &[QueueRow]) -> Error {
        Error::Busy {
            key: self.key.to_owned(),
            waited: self.now().duration_since(self.started),
            holders: holders
                .iter()
                .take(self.opts.permits as usize)
                .map(|r| HeldBy {
                    ticket: r.ticket,
                    owner: r.owner.clone(),
                    info: r.holder.clone(),
                })
                .collect(),
            permits: self.opts.permits,
        }
    }

    /// Reads the queue and removes stale rows ahead of `below` (all rows if `None`). Returns the
    /// snapshot and the first live entries ahead, in ticket order: up to our permits of them
    /// (with that many live entries ahead we wait; fewer, and a permit is ours).
    pub(super) async fn survey(
        &mut self,
        below: Option<u64>,
    ) -> Result<(Snapshot, Vec<QueueRow>), Error> {
        let asked = self.now();
        let snap = self
            .locker
            .read_with_retry(self.key, self.retry_budget())
            .await?;
        // Before anything is judged or removed: a done tick answers without writing, and so
        // does a key of other permits. The read's check is the only one a `wait = 0` meets on
        // a key whose permits are all held (it answers busy before it writes).
        let answer = self.counter_answer(snap.counter.as_ref());
        #[cfg(test)]
        let answer = answer.filter(|e| {
            !(e.is_permits_mismatch()
                && crate::mutant::on(crate::mutant::Mutant::SurveyIgnoresPermits))
        });
        if let Some(e) = answer {
            return Err(e);
        }
        self.max_seen = self
            .max_seen
            .max(snap.counter.as_ref().map_or(0, |c| c.last))
            .max(snap.rows.last().map_or(0, |r| r.ticket));
        let mut live = Vec::new();
        let mut ahead = snap
            .rows
            .iter()
            .filter(|r| below.is_none_or(|b| r.ticket < b));
        for row in ahead.by_ref() {
            if self.alive(row, asked).await? && self.counts(row) {
                live.push(row.clone());
                if self.blocked_by(live.len()) {
                    break; // enough live entries ahead to wait; rows behind them are theirs
                }
            }
        }
        self.watch_rest(ahead, asked);
        Ok((snap, live))
    }

    /// Whether a live entry ahead counts against the permits: every one does, granted or not
    /// (a waiter ahead takes a permit before us: FIFO across permits), the seat included.
    pub(super) fn counts(&self, _row: &QueueRow) -> bool {
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::PermitsCountOnlyHolders) {
            return _row.seat || _row.acquired_at_ms.is_some();
        }
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::SeatNotCounted) {
            return !_row.seat;
        }
        true
    }

    /// `Mutant::HintPastOthers`: a refused hint of more than one permit that takes the counter
    /// `c` it was answered with at face value instead of reading the queue. Standing at the hint's
    /// own ticket and moved by another, it "proves" that nobody queued since our release, so a
    /// row at the next ticket, conditioned on `c`, is granted at once. It proves nothing: a
    /// counter set back or recreated by hand issues tickets again, and that very ticket may be
    /// another holder's now (`sim/scripted_permits.rs`). This is the fast path of before issue
    /// 36 where it granted whatever was below the released entry; no arithmetic on the counter
    /// can tell such a counter from one that never went back, so a refused hint reads.
    #[cfg(test)]
    fn past_hint(&self, c: &Counter, h: &crate::memory::Hint) -> bool {
        crate::mutant::on(crate::mutant::Mutant::HintPastOthers)
            && self.opts.permits > 1
            && c.consistent()
            && !c.created()
            && c.last == h.ticket
    }

    /// Whether `live` live entries ahead of us (holders, or waiters ahead of us) leave no permit
    /// for us: every permit is theirs first.
    pub(super) fn blocked_by(&self, live: usize) -> bool {
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::PermitsOffByOne) {
            return live > self.opts.permits as usize;
        }
        live >= self.opts.permits as usize
    }

    /// Whether a row ahead of us is live, from a read first sent at `asked`. A stale one is
    /// passed over ([`Attempt::pass_over`]).
    pub(super) async fn alive(&self, row: &QueueRow, asked: Instant) -> Result<bool, Error> {
        match self.verdict(row, asked) {
            Some(live) => Ok(live),
            None => self.pass_over(row).await,
        }
    }

    /// The judgement of a row ahead of us from a read first sent at `asked`, without a request:
    /// `Some(live)`, or `None` for a stale row, which the caller passes over.
    pub(super) fn verdict(&self, row: &QueueRow, asked: Instant) -> Option<bool> {
        match self.judge(row, asked) {
            #[cfg(test)]
            Verdict::Live
                if row.acquired_at_ms.is_none()
                    && !row.seat
                    && crate::mutant::on(crate::mutant::Mutant::WaitersAheadIgnored) =>
            {
                Some(false)
            }
            Verdict::Live => Some(true),
            #[cfg(test)]
            Verdict::Stale
                if self.opts.wait == Wait::NoWait
                    && crate::mutant::on(crate::mutant::Mutant::SkipTrustsEveryRow) =>
            {
                Some(true)
            }
            Verdict::Stale => None,
        }
    }

    /// Passes a stale row over: deletes it conditionally on the `rvn` judged. Whether it is
    /// live after all: only a heartbeat that landed first (`Revived`) keeps it.
    pub(super) async fn pass_over(&self, row: &QueueRow) -> Result<bool, Error> {
        let outcome = self.delete_stale(row).await?;
        tracing::info!(key = self.key, ticket = row.ticket, owner = %row.owner, ?outcome, "passing over a dead row");
        Ok(outcome == StaleDelete::Revived)
    }

    /// Clock-free: starts (or goes on with) the watch of the rows a read found past the first
    /// live one, without judging them live or passing them over (no request). Rows whose
    /// owners died together then go stale together, a lease after they were first read, not
    /// each a lease after the one before it was passed over: `n` dead rows would take `n`
    /// leases, and a `wait = 0` call (whose watch ends after two) would answer busy.
    pub(super) fn watch_rest<'r>(&self, rows: impl Iterator<Item = &'r QueueRow>, asked: Instant) {
        if !self.opts.clock_free() {
            return;
        }
        let (wall, now) = (self.locker.clock.wall_ms(), self.now());
        if let Ok(mut o) = self.locker.observer.lock() {
            for row in rows {
                o.judge_read(row, wall, asked, now, self.opts.clock_skew);
            }
        }
    }

    pub(super) fn judge(&self, row: &QueueRow, asked: Instant) -> Verdict {
        let (wall, now) = (self.locker.clock.wall_ms(), self.now());
        match self.locker.observer.lock() {
            Ok(mut o) => {
                o.forget_old(now);
                o.judge_read(row, wall, asked, now, self.opts.clock_skew)
            }
            // A poisoned observer (a panic elsewhere) knows nothing: the row is live.
            Err(_) => Verdict::Live,
        }
    }

    /// Whether a live row ahead makes a `wait = 0` caller busy now. Bounded mode decides from one
    /// read. Clock-free mode cannot: a row seen once may belong to a dead owner, and only an
    /// unchanged `rvn` for a whole lease says so. It says busy once the row has been seen to
    /// change since a sighting less than a lease ago (its owner lived within the lease: at most
    /// one heartbeat interval of watching), and otherwise keeps watching until the row goes
    /// stale and is passed over.
    pub(super) fn busy_now(&self, head: &QueueRow) -> bool {
        if !self.opts.clock_free() {
            return true;
        }
        self.locker
            .observer
            .lock()
            .map_or(true, |o| o.seen_alive(&head.owner, self.now()))
    }

    pub(super) async fn delete_stale(&self, row: &QueueRow) -> Result<StaleDelete, Error> {
        let give_up = self.retry_budget();
        let mut failures = 0;
        loop {
            match self
                .locker
                .store
                .delete_stale(
                    self.key,
                    row.ticket,
                    row.seat,
                    &row.rvn,
                    crate::protocol::Speaks::maintain(self.opts.permits),
                )
                .await
            {
                Ok(o) => return Ok(o),
                Err(f) => {
                    failures += 1;
                    retry_pause(f, failures, give_up, &*self.locker.clock).await?;
                }
            }
        }
    }

    /// Creates the key's missing counter at the highest ticket seen (someone else may create it
    /// first: fine, the next read sees theirs). Its `lastOwner` carries a fresh id, never our
    /// owner id: a counter we recreate must not take a value that an earlier request of ours,
    /// still in flight, is conditioned on (a request that timed out may land after we have
    /// recreated the counter exactly as it read it).
    pub(super) async fn create_counter(&self, give_up: Instant) -> Result<(), Error> {
        let mut failures = 0;
        loop {
            match self
                .locker
                .store
                .create_counter(
                    self.key,
                    self.max_seen,
                    &crate::schema::created_by(&new_id(&*self.locker.clock), self.opts.permits),
                    self.opts.permits,
                )
                .await
            {
                Ok(created) => {
                    tracing::debug!(
                        key = self.key,
                        last = self.max_seen,
                        created,
                        "counter created"
                    );
                    return Ok(());
                }
                Err(f) => {
                    failures += 1;
                    retry_pause(f, failures, give_up, &*self.locker.clock).await?;
                }
            }
        }
    }

    /// Builds the request for `ticket` (conditioned on the counter being `counter`).
    pub(super) fn prepare(
        &self,
        owner: &str,
        ticket: u64,
        counter: Counter,
        (seat, clear): (bool, bool),
    ) -> Prepared {
        let opts = self.opts;
        let clock = &*self.locker.clock;
        let first_sent = clock.now();
        let wall = clock.wall_ms();
        let lease_until_ms = opts.lease_until_ms(wall);
        let rvn = new_id(clock);
        let tick = self.ordered_tick();
        let counter_newest = counter.tick_newest;
        let row = NewRow {
            key: self.key,
            ticket,
            owner,
            lease_until_ms,
            lease_ms: millis(opts.lease),
            expires_at: opts.expires_at(lease_until_ms),
            clock_free: opts.clock_free(),
            rvn: &rvn,
            now_ms: wall,
            granted: clear,
            holder: &opts.holder,
            protocol: crate::protocol::Speaks::Permits(opts.permits).protocol(),
        };
        Prepared {
            request: EnqueueRequest {
                key: self.key.to_owned(),
                ticket,
                counter,
                row: row.to_item(),
                owner: owner.to_owned(),
                // One token per distinct request (its version is new at every prepare): a
                // retry resends the same request under the same token, while another request
                // for the same ticket (after a changed counter) is judged on its own: it meets
                // `OursOlder`, where a shared token would be refused as an
                // `IdempotentParameterMismatch`, a fatal error.
                token: format!("{rvn}{ticket:016x}"),
                seat,
                tick,
                newest: tick.map(|t| counter_newest.map_or(t, |n| n.max(t))),
                permits: opts.permits,
            },
            first_sent,
            wall,
            lease_until_ms,
            granted: clear,
        }
    }

    /// Puts our row in the queue. Returns it, and whether the queue was clear (we hold the key).
    pub(super) async fn enqueue(&mut self) -> Result<(Membership, bool), Error> {
        let opts = self.opts;
        let clock = self.locker.clock.clone();
        let owner = new_id(&*clock);
        let mut in_flight = InFlight {
            store: self.locker.store.clone(),
            clock: clock.clone(),
            key: self.key.to_owned(),
            owner: owner.clone(),
            tickets: Vec::new(),
            speaks: crate::protocol::Speaks::maintain(opts.permits),
        };
        // (counter as read, where it came from, (take the seat, granted at once))
        self.surveyed = None;
        let hint = self
            .locker
            .memory
            .hint(self.key)
            .filter(|h| h.permits == opts.permits);
        let mut expected = hint.as_ref().map(|h| {
            let counter = Counter::moved(&h.owner, h.ticket);
            // One permit: the queue is empty (we were alone when granted, and nobody queued
            // since), so the seat. More: fewer than our permits were ahead of `h.ticket` when it
            // was granted, none can have appeared below it since, and nobody queued after it:
            // a row at the next ticket is granted at once. It is not the seat, which only an
            // empty queue may take (readers take the seat for the queue's first entry).
            let seat = opts.permits == 1;
            (counter, Source::Hint, (seat, true))
        });
        let mut rereads = 0;
        // Our own last ticket counts as seen: even a counter deleted by hand after we released
        // cannot make this process take a lower one.
        self.max_seen = self.max_seen.max(hint.as_ref().map_or(0, |h| h.ticket));
        let mut prepared: Option<Prepared> = None;
        let mut failures = 0;
        let give_up = self.retry_budget();
        loop {
            let (counter, source, clear) = match expected.clone() {
                Some(e) => e,
                None => {
                    let (snap, live) = self.survey(None).await?;
                    let blocked = self.blocked_by(live.len());
                    if blocked
                        && opts.wait == Wait::NoWait
                        && live.iter().all(|head| self.busy_now(head))
                    {
                        return Err(self.busy(&live));
                    }
                    if blocked && opts.wait == Wait::NoWait {
                        // Clock-free, and a row ahead has not been seen alive yet: watch it.
                        // It changes within a heartbeat if its owner lives, or goes stale (and
                        // is passed over) after its lease; the bound is only a backstop.
                        let longest = live.iter().map(|r| r.lease_ms).max().unwrap_or(0);
                        let row_lease = Duration::from_millis(u64::try_from(longest).unwrap_or(0));
                        if self.now() >= self.started + row_lease * 2 + opts.max_poll {
                            return Err(self.busy(&live));
                        }
                        let pause = jittered(opts.poll, clock.jitter());
                        clock.sleep(pause).await;
                        continue;
                    }
                    let Some(counter) = snap.counter.clone() else {
                        // No counter (a new key, or one deleted by hand): create it at the
                        // highest ticket seen and read again. Never enqueue on "no counter".
                        self.create_counter(give_up).await?;
                        continue;
                    };
                    // The counter condition proves nobody queued since this read: with no live
                    // row in it, the key is ours as soon as our row is in.
                    self.surveyed = snap
                        .rows
                        .first()
                        .zip(snap.rows.last())
                        .map(|(first, last)| (first.ticket, last.ticket));
                    // The seat only for an empty queue; a row granted at once while fewer than
                    // our permits are ahead.
                    let e = (counter, Source::Read, (live.is_empty(), !blocked));
                    expected = Some(e.clone());
                    e
                }
            };
            let ticket = counter.last.max(self.max_seen) + 1;
            let p = match prepared.take() {
                Some(p) if p.request.ticket == ticket && p.request.counter == counter => p,
                _ => self.prepare(&owner, ticket, counter, clear),
            };
            let entry = (ticket, p.request.seat);
            if !in_flight.tickets.contains(&entry) {
                in_flight.tickets.push(entry);
            }
            let outcome = self.locker.store.enqueue(&p.request).await;
            match outcome {
                Ok(Enqueue::Done | Enqueue::AlreadyOurs) => {
                    in_flight.tickets.retain(|&(t, _)| t != ticket);
                    let timing = Timing {
                        interval: opts.heartbeat_interval(),
                        opts: Arc::new(opts.clone()),
                    };
                    let valid_for = if opts.clock_free() {
                        opts.lease
                    } else {
                        crate::heartbeat::believed(Duration::from_millis(
                            u64::try_from(p.lease_until_ms - p.wall).unwrap_or(0),
                        ))
                    };
                    let written = Written {
                        key: self.key,
                        ticket,
                        seat: p.request.seat,
                        owner: &owner,
                        granted: p.granted,
                        sent: p.first_sent,
                        valid_for,
                        lease_until_ms: p.lease_until_ms,
                        wall_ms: p.wall,
                    };
                    // No await from here on: the row passes from `in_flight` to the membership,
                    // which removes it if dropped.
                    let m = Membership::start(self.locker.store.clone(), clock, written, timing);
                    in_flight.abandon(); // tickets of earlier ambiguous attempts, if any
                    return Ok((m, p.granted));
                }
                Ok(Enqueue::CounterAt(current)) => {
                    // Definite: nothing was written at this ticket.
                    in_flight.tickets.retain(|&(t, _)| t != ticket);
                    // The counter as it stands tells "done" (or "superseded") from "moved".
                    if let Some(e) = self.counter_answer(current.as_ref()) {
                        return Err(e);
                    }
                    self.max_seen = self.max_seen.max(current.as_ref().map_or(0, |c| c.last));
                    #[cfg(test)]
                    if let Some((c, h)) = current.as_ref().zip(hint.as_ref()) {
                        if source == Source::Hint && self.past_hint(c, h) {
                            expected = Some((c.clone(), Source::Hint, (false, true)));
                            continue;
                        }
                    }
                    #[cfg(test)]
                    if source == Source::Hint && opts.permits > 1 {
                        crate::mutant::fired(crate::mutant::GUARD_HINT_READS);
                    }
                    let adopt = |c: &Counter| source == Source::Read && c.consistent();
                    let Some(current) = current.filter(adopt) else {
                        // Our hint is old (others used the key since), the counter is gone, or
                        // it was set by hand (its `last` may be below queued rows): look
                        // before queueing. A refused hint reads with any number of permits: how
                        // many tickets others took since ours is no bound on how many entries
                        // live below the next one, since a counter set back or recreated by hand
                        // issues tickets again (lock/PROTOCOL.md, "N at a time").
                        expected = None;
                        continue;
                    };
                    if opts.wait == Wait::NoWait && opts.permits == 1 {
                        // Someone enqueued between our read and our write: they are ahead.
                        return Err(self.busy(&[]));
                    }
                    if opts.wait == Wait::NoWait {
                        // Someone enqueued between our read and our write, but a permit may
                        // still be free for us: read again (a few times at most; under more
                        // churn than that, busy).
                        rereads += 1;
                        if rereads > MAX_REREADS {
                            return Err(self.busy(&[]));
                        }
                        expected = None;
                        continue;
                    }
                    expected = Some((current, Source::Read, (false, false)));
                    failures = 0;
                }
                Ok(Enqueue::OursOlder) => {
                    // An earlier request of ours for this ticket landed late (its expected
                    // counter came back). Its lease is not the one we would believe in: remove
                    // it, and read the queue again.
                    tracing::info!(
                        key = self.key,
                        ticket,
                        "an earlier enqueue of ours landed late; removing it and queueing again"
                    );
                    let seat = p.request.seat;
                    delete_with_retry(
                        &self.locker.store,
                        &*clock,
                        self.key,
                        (ticket, seat),
                        &owner,
                        None,
                        crate::protocol::Speaks::maintain(opts.permits),
                    )
                    .await?;
                    self.max_seen = self.max_seen.max(ticket);
                    expected = None;
                }
                Ok(Enqueue::TicketTaken) => {
                    // The counter was lowered or deleted by hand and a row already has this
                    // ticket: read the queue again, and take a ticket above everything on it.
                    in_flight.tickets.retain(|&(t, _)| t != ticket);
                    self.max_seen = self.max_seen.max(ticket);
                    tracing::warn!(key = self.key, ticket, "the key's counter is behind its queue (was it deleted or changed by hand?); taking a higher ticket");
                    expected = None;
                }
                Ok(Enqueue::Conflict) => {
                    // This attempt wrote nothing, but an earlier one of the same request whose
                    // answer was lost may still land (the counter has not moved, so it can
                    // succeed): the ticket stays in `in_flight`, to be removed if we give up, so
                    // a late copy never leaves a row nobody heartbeats.
                    failures += 1;
                    let pause = backoff(
                        failures,
                        Duration::from_millis(10),
                        opts.max_poll,
                        clock.jitter(),
                    );
                    #[cfg(test)]
                    let gives_up = (self.now() + pause >= give_up)
                        != crate::mutant::on(crate::mutant::Mutant::ConflictGivesUp);
                    #[cfg(not(test))]
                    let gives_up = self.now() + pause >= give_up;
                    if gives_up {
                        return Err(self.busy(&[]));
                    }
                    clock.sleep(pause).await;
                    prepared = Some(p);
                }
                Err(f) => {
                    // Ambiguous (or fatal): the ticket stays in `in_flight` until a definite
                    // answer; the retry resends the very same request.
                    failures += 1;
                    prepared = Some(p);
                    retry_pause(f, failures, give_up, &*clock).await?;
                }
            }
            if self.timed_out() && opts.wait != Wait::NoWait {
                return Err(self.busy(&[]));
            }
        }
    }
}
