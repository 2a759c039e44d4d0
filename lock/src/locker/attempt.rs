//! One acquisition ([`Attempt`]): the enqueue — its survey of the queue and the atomic write that
//! takes a ticket (or the seat), with the removal of what a dropped attempt may have written
//! ([`InFlight`]) — then the wait, which looks below our row, paced by place and hold time, until
//! no live entry is ahead, the deadline passes, or our row is gone; and what once per tick and
//! coalesce answer on the way (see [`crate::tick`]): what a counter as read answers before
//! anything is written, and what a waiter's look answers.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use tokio::time::Instant;

use super::{retry_pause, Locker, ATTEMPT_TIMEOUT, MIN_RETRY_BUDGET};
use crate::clock::{millis, new_id, Clock};
use crate::error::{Error, HeldBy};
use crate::liveness::{backoff, jittered, Pace, Verdict};
use crate::membership::{delete_with_retry, Membership, RowState, Timing, Written};
use crate::options::{LockOptions, Wait};
use crate::schema::{Counter, NewRow, QueueRow, Snapshot, COUNTER_SK, SK};
use crate::storage::{Enqueue, EnqueueRequest, Speaks, StaleDelete, Store};
use crate::tick::{format_ms, Tick};

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
                        crate::membership::believed(Duration::from_millis(
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

impl Attempt<'_> {
    /// Looks below our row: one `Query` of the rows at or below our ticket, nearest first (one
    /// read unit whatever the queue's length), going further only past stale rows, which it
    /// removes. Says whether our row is still there, and who is ahead.
    ///
    /// A waiter that was more than a page back (`deep`) first reads only the lowest row, the
    /// holder (one read unit): while it is still more than a page back it learns how far from
    /// the tickets (an upper bound: gaps count as rows) and goes no further. A page of the rows
    /// just below it could not tell it: they do not change until they are granted. A stale
    /// lowest row is passed over as in any look, so a queue whose head died moves even when
    /// every live waiter is far back.
    pub(super) async fn look(&mut self, m: &Membership, deep: bool) -> Result<Look, Error> {
        if deep {
            if let Some(far) = self.far_back(m).await? {
                return Ok(far);
            }
        }
        let give_up = self.retry_budget();
        let mut start = None;
        let mut first = true;
        let mut counter_read = false;
        // Live entries ahead so far, nearest first, across pages.
        let mut live: Vec<QueueRow> = Vec::new();
        loop {
            let mut failures = 0;
            let asked = self.now();
            let (items, next) = loop {
                match self
                    .locker
                    .store
                    .read_below(self.key, m.ticket, LOOK_LIMIT, start.clone())
                    .await
                {
                    Ok(page) => break page,
                    Err(f) => {
                        failures += 1;
                        retry_pause(f, failures, give_up, &*self.locker.clock).await?;
                    }
                }
            };
            // The counter ends the queue (it sorts below every row); its seat, if taken, is the
            // queue's first entry, and an empty counter is no entry at all. Read in the same page
            // as the grant, it also answers whether our tick is done (the run ahead succeeded)
            // or superseded.
            for item in &items {
                if matches!(item.get(SK), Some(AttributeValue::S(sk)) if sk == COUNTER_SK) {
                    counter_read = true;
                    let counter = match Counter::from_item(self.key, item) {
                        #[cfg(test)]
                        Err(Error::ProtocolTooNew { .. })
                            if crate::mutant::on(crate::mutant::Mutant::LookIgnoresProtocol) =>
                        {
                            continue
                        }
                        other => other?,
                    };
                    if let Some(answer) = self.waiter_answer(&counter, m.ticket) {
                        return Err(answer);
                    }
                }
            }
            let entries = items
                .iter()
                .map(|item| QueueRow::entry(self.key, item))
                .collect::<Result<Vec<_>, _>>()?;
            for (i, entry) in entries.iter().enumerate() {
                if first {
                    first = false;
                    if entry
                        .as_ref()
                        .is_some_and(|r| r.ticket == m.ticket && *r.owner == *m.owner)
                    {
                        continue;
                    }
                    return Ok(Look::Removed);
                }
                let Some(row) = entry else { continue };
                let alive = match self.verdict(row, asked) {
                    Some(alive) => alive,
                    None => {
                        // A stale row to remove, on a page above the counter's: the key's
                        // counter is read (and answers: other permits, a newer protocol, a done
                        // or superseded tick) before anything is removed, once per look. Stale
                        // rows are rare, so a look pays this read only when it removes one.
                        #[cfg(test)]
                        let checked = counter_read
                            || crate::mutant::on(crate::mutant::Mutant::LookRemovesUnchecked);
                        #[cfg(not(test))]
                        let checked = counter_read;
                        if !checked {
                            #[cfg(test)]
                            crate::mutant::fired(crate::mutant::GUARD_LOOK_COUNTER);
                            self.head(m.ticket, give_up).await?;
                            counter_read = true;
                        }
                        self.pass_over(row).await?
                    }
                };
                if alive && self.counts(row) {
                    live.push(row.clone());
                    if !self.blocked_by(live.len()) {
                        continue; // a permit may still be ours: look further down
                    }
                    // The rows read past the last of them are its business, not passed over;
                    // clock-free mode starts watching them all the same (see `watch_rest`).
                    self.watch_rest(entries[i + 1..].iter().flatten(), asked);
                    if self.opts.coalesce && !counter_read {
                        // The page stopped short of the counter: a coalescing waiter reads it
                        // (with the queue's head, one read unit) to see whether a newer tick or
                        // waiter has queued behind it.
                        self.head(m.ticket, give_up).await?;
                    }
                    // Entries read below it are counted as ahead too (not judged: they are its
                    // business); a full page means there may be more. The counter is not one:
                    // counted, it put every waiter a place further back than it is, and the
                    // pacing then slept a whole hold too long (handoff p50 7 → 15 ms).
                    let ahead = live.len() - 1
                        + entries[i..].iter().flatten().count()
                        + usize::from(next.is_some());
                    live.reverse(); // ticket order: the oldest first
                    return Ok(Look::Behind {
                        holders: live,
                        ahead,
                        adjacent: true,
                    });
                }
            }
            if first {
                return Ok(Look::Removed);
            }
            match next {
                Some(k) => start = Some(k),
                None => return Ok(Look::Clear),
            }
        }
    }

    /// The look of a waiter that was more than a page back: the lowest row only. `None`: it is
    /// within a page of the head now (or the head is ours), and the full look follows.
    pub(super) async fn far_back(&mut self, m: &Membership) -> Result<Option<Look>, Error> {
        let give_up = self.retry_budget();
        loop {
            let mut failures = 0;
            let asked = self.now();
            let (counter, lowest) = loop {
                match self.locker.store.read_lowest(self.key).await {
                    Ok(head) => break head,
                    Err(f) => {
                        failures += 1;
                        retry_pause(f, failures, give_up, &*self.locker.clock).await?;
                    }
                }
            };
            if let Some(answer) = counter.and_then(|c| self.waiter_answer(&c, m.ticket)) {
                return Err(answer);
            }
            let Some(row) = lowest else { return Ok(None) };
            if row.ticket >= m.ticket {
                return Ok(None);
            }
            if !self.alive(&row, asked).await? {
                continue; // passed over: read where the queue starts now
            }
            let ahead = usize::try_from(m.ticket - row.ticket).unwrap_or(usize::MAX);
            // Within a page of the last permit (or closer): the full look decides.
            if ahead <= self.near() {
                return Ok(None);
            }
            return Ok(Some(Look::Behind {
                holders: vec![row],
                ahead,
                adjacent: false,
            }));
        }
    }

    /// Reads the counter (with the queue's head: `Range::Lowest`, one read unit) and answers a
    /// waiter whose tick is done or superseded.
    async fn head(&self, ticket: u64, give_up: tokio::time::Instant) -> Result<(), Error> {
        let mut failures = 0;
        loop {
            match self.locker.store.read_lowest(self.key).await {
                Ok((Some(counter), _)) => {
                    return match self.waiter_answer(&counter, ticket) {
                        Some(answer) => Err(answer),
                        None => Ok(()),
                    }
                }
                Ok((None, _)) => return Ok(()),
                Err(f) => {
                    failures += 1;
                    retry_pause(f, failures, give_up, &*self.locker.clock).await?;
                }
            }
        }
    }

    /// Waits until no live row is ahead of ours. `None`: our row was removed meanwhile (we were
    /// judged dead) and we must queue again.
    ///
    /// Each look costs one read unit (see [`Attempt::look`]); when it looks next follows its
    /// place and how fast the queue moves ([`Pace`]); a release by this same process wakes it at
    /// once. The enqueue's read counts as the first look.
    pub(super) async fn wait_turn(&mut self, m: Membership) -> Result<Option<Membership>, Error> {
        let mut lost = m.subscribe();
        let ticket = m.ticket;
        let wake = self.locker.memory.waiting(self.key, ticket);
        let mut pace = Pace::new(
            self.locker.memory.turn(self.key),
            self.locker.memory.hold(self.key),
            self.opts.poll,
            self.opts.max_poll,
        );
        let result = self.wait_turn_inner(m, &mut lost, &wake, &mut pace).await;
        let granted = matches!(result, Ok(Some(_)));
        self.locker.memory.done_waiting(self.key, ticket, granted);
        self.locker.memory.learnt_turn(self.key, pace.turn());
        result
    }

    pub(super) async fn wait_turn_inner(
        &mut self,
        m: Membership,
        lost: &mut tokio::sync::watch::Receiver<RowState>,
        wake: &tokio::sync::Notify,
        pace: &mut Pace,
    ) -> Result<Option<Membership>, Error> {
        // (rows ahead, the nearest one's ticket, whether that row is right ahead of ours)
        let mut seen = self
            .surveyed
            .take()
            .filter(|&(_, highest)| highest < m.ticket)
            .map(|(lowest, highest)| {
                let ahead = usize::try_from(m.ticket - lowest).unwrap_or(usize::MAX);
                (ahead, highest, highest + 1 == m.ticket)
            });
        let mut deep = false;
        loop {
            if let RowState::Lost(reason) = m.state() {
                tracing::warn!(key = self.key, ticket = m.ticket, %reason, "lost our place in the queue; queueing again");
                drop(m.leave().await);
                return Ok(None);
            }
            // Listen before looking, so a release between the look and the sleep is not missed.
            let woken = wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let (ahead, nearest, adjacent) = match seen.take() {
                Some(s) => s,
                None => match self.look(&m, deep).await {
                    Err(e) => {
                        drop(m.leave().await);
                        return Err(e);
                    }
                    Ok(Look::Removed) => {
                        tracing::warn!(
                            key = self.key,
                            ticket = m.ticket,
                            "our queue row was removed while waiting; queueing again"
                        );
                        drop(m.leave().await);
                        return Ok(None);
                    }
                    Ok(Look::Clear) => {
                        #[cfg(test)]
                        let guarded = !crate::mutant::on(crate::mutant::Mutant::GrantPastOwnLease);
                        #[cfg(not(test))]
                        let guarded = true;
                        if let (RowState::Lost(reason), true) = (m.state(), guarded) {
                            // Our own lease ran out while we looked: we may already have been
                            // passed over.
                            #[cfg(test)]
                            crate::mutant::fired(crate::mutant::GUARD_LOOK);
                            tracing::warn!(key = self.key, ticket = m.ticket, %reason, "lease ran out just before the grant; queueing again");
                            drop(m.leave().await);
                            return Ok(None);
                        }
                        m.mark_granted(self.locker.clock.wall_ms());
                        return Ok(Some(m));
                    }
                    Ok(Look::Behind {
                        holders,
                        ahead,
                        adjacent,
                    }) => {
                        if self.timed_out() {
                            if let Err(e) = m.leave().await {
                                tracing::warn!(key = self.key, error = %e, "could not remove our row after giving up; it goes stale after one lease");
                            }
                            return Err(self.busy(&holders));
                        }
                        // The entry whose departure is awaited: the nearest (one permit), or
                        // the oldest of those holding the permits.
                        let awaited = holders.first().map_or(0, |r| r.ticket);
                        (ahead, awaited, adjacent)
                    }
                },
            };
            // The far-back look reads only the queue's first entry: it can tell a waiter with one
            // permit that someone is ahead, but not one with N that N live entries are (the
            // tickets between may be gaps), so only one permit uses it. A full look stops at the
            // N-th live entry ahead: one read unit for N up to a page.
            deep = self.opts.permits == 1 && ahead >= self.near();
            let jitter = self.locker.clock.jitter();
            let mut pause = pace.after_look(self.now(), self.rounds(ahead), nearest, jitter);
            if adjacent && self.opts.permits == 1 && self.locker.memory.ours(self.key, nearest) {
                // Right behind a row of this process: its release (or its waiter giving up)
                // wakes us; `max_poll` is only a backstop.
                pause = jittered(self.opts.max_poll, jitter);
            }
            #[cfg(test)]
            if crate::mutant::on(crate::mutant::Mutant::LazyLooks) {
                pause *= 20;
            }
            #[cfg(test)]
            let overshoots = crate::mutant::on(crate::mutant::Mutant::WaitOvershoots);
            #[cfg(not(test))]
            let overshoots = false;
            if overshoots && self.deadline.is_some() {
                pause = pause.max(self.opts.max_poll);
            }
            if let Some(d) = self.deadline.filter(|_| !overshoots) {
                pause = pause.min(d.saturating_duration_since(self.now()));
            }
            tokio::select! {
                biased;
                _ = lost.wait_for(|s| matches!(s, RowState::Lost(_))) => {}
                _ = &mut woken => {}
                _ = self.locker.clock.sleep(pause) => {}
            }
        }
    }
}

impl Attempt<'_> {
    /// How many entries ahead a waiter may be and still read them in full looks: a page past the
    /// last permit.
    fn near(&self) -> usize {
        LOOK_LIMIT as usize + self.opts.permits as usize - 1
    }

    /// The waiter's place counted in holds: with `ahead` entries ahead and N permits, the queue
    /// passes N entries a hold, so a waiter is `(ahead - N) / N + 1` holds from its turn (one
    /// permit: its place).
    fn rounds(&self, ahead: usize) -> usize {
        let n = self.opts.permits as usize;
        ahead.saturating_sub(n) / n + 1
    }
}

/// Rows read per look: ours and up to seven ahead, one read unit (rows are a few hundred bytes).
/// The place is exact up to seven ahead and a lower bound beyond. The simulation's queues are
/// short (up to six participants), so there a page is three rows: its schedules then go through
/// full pages and the far-back look too.
const LOOK_LIMIT: u32 = if cfg!(test) { 3 } else { 8 };

/// What one look below our row found.
pub(super) enum Look {
    /// Our row is gone (passed over as dead, swept, deleted by hand).
    Removed,
    /// Fewer live entries ahead than our permits (none with one permit): the key is ours.
    Clear,
    /// `holders` are the live entries ahead that take every permit before us, in ticket order
    /// (`adjacent`: the nearest is right ahead of us), or the first row of the queue (a far-back
    /// look); about `ahead` rows are ahead in all.
    Behind {
        holders: Vec<QueueRow>,
        ahead: usize,
        adjacent: bool,
    },
}

impl Attempt<'_> {
    /// Our ordered tick ([`Tick::At`]), epoch ms.
    pub(super) fn ordered_tick(&self) -> Option<i64> {
        self.opts.tick.as_ref().and_then(Tick::at)
    }

    fn tick_label(&self) -> String {
        self.opts
            .tick
            .as_ref()
            .map_or_else(String::new, Tick::to_string)
    }

    /// [`Error::TickDone`], covered by `done`.
    pub(super) fn tick_done(&self, done: String) -> Error {
        Error::TickDone {
            key: self.key.to_owned(),
            tick: self.tick_label(),
            done,
        }
    }

    /// A key has one number of permits: a participant configured with another is refused
    /// (before anything is judged, removed or written on what it read).
    fn permits_agree(&self, counter: &Counter) -> Result<(), Error> {
        crate::protocol::agree_permits(self.key, counter.permits, self.opts.permits)
    }

    /// What the counter as read answers an acquisition before it writes: its permits are not
    /// ours, our ordered tick is done (at or below the watermark), or (coalescing) a newer tick
    /// is queued already.
    pub(super) fn counter_answer(&self, counter: Option<&Counter>) -> Option<Error> {
        let c = counter?;
        if let Err(e) = self.permits_agree(c) {
            return Some(e);
        }
        let tick = self.ordered_tick()?;
        if c.done(tick) {
            return Some(self.tick_done(format_ms(c.tick_done.unwrap_or(tick))));
        }
        match c.tick_newest {
            Some(newest) if self.opts.coalesce && newest > tick => Some(Error::Superseded {
                key: self.key.to_owned(),
                tick: self.tick_label(),
                by: format_ms(newest),
            }),
            _ => None,
        }
    }

    /// What the counter, read by a look of the waiter with `ticket`, answers it: our ordered tick
    /// is done (the run ahead of us succeeded), or (coalescing) a newer tick is queued behind us
    /// — without an ordered tick, any later ticket (arrival order).
    pub(super) fn waiter_answer(&self, counter: &Counter, ticket: u64) -> Option<Error> {
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::LookIgnoresProtocol) {
            return None;
        }
        if let Err(e) = self.permits_agree(counter) {
            return Some(e);
        }
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::WaiterIgnoresWatermark) {
            return None;
        }
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::CoalesceNeverWithdraws) {
            return self
                .ordered_tick()
                .filter(|t| counter.done(*t))
                .map(|_| self.tick_done(format_ms(counter.tick_done.unwrap_or_default())));
        }
        if let Some(e) = self.counter_answer(Some(counter)) {
            return Some(e);
        }
        if !self.opts.coalesce || self.ordered_tick().is_some() {
            return None;
        }
        (counter.last > ticket).then(|| Error::Superseded {
            key: self.key.to_owned(),
            tick: match &self.opts.tick {
                Some(t) => t.to_string(),
                None => format!("ticket {ticket}"),
            },
            by: format!("ticket {}", counter.last),
        })
    }
}

/// An enqueue whose request may be on the wire: if the acquisition is dropped before it turns
/// into a [`Membership`], the row it may have written is deleted in the background — at once,
/// and again once the request can no longer land (after the attempt timeout), so a transaction
/// that was still in flight cannot leave an orphan behind.
pub(super) struct InFlight {
    pub(super) store: Store,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) key: String,
    pub(super) owner: String,
    /// Entries (ticket, seat) that an unanswered or ambiguous request may have written.
    pub(super) tickets: Vec<(u64, bool)>,
    /// Our version condition on a seat.
    pub(super) speaks: Speaks,
}

impl InFlight {
    /// The rows that may exist, now that nobody will heartbeat them: removed in the background.
    pub(super) fn abandon(&mut self) {
        let tickets = std::mem::take(&mut self.tickets);
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::AbandonLeavesRows) {
            return;
        }
        if tickets.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, clock, key, owner, speaks) = (
            self.store.clone(),
            self.clock.clone(),
            self.key.clone(),
            self.owner.clone(),
            self.speaks,
        );
        let tracker = store.background().clone();
        tracker.spawn_on(
            async move {
                for pass in 0..2 {
                    if pass == 1 {
                        clock.sleep(ATTEMPT_TIMEOUT + Duration::from_millis(500)).await;
                    }
                    for &(t, seat) in &tickets {
                        if let Err(e) = delete_with_retry(&store, &*clock, &key, (t, seat), &owner, None, speaks).await {
                            tracing::warn!(key = %key, ticket = t, error = %e, "could not remove a possibly written row; it goes stale after one lease");
                        }
                    }
                }
            },
            &rt,
        );
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.abandon();
    }
}
