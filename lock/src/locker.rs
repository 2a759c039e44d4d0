//! The acquisition protocol.
//!
//! ```text
//!            ┌──────────── hint: "rows ≤ L are gone" (from our own last release) ───────────┐
//!            │                                                                               ▼
//! acquire ──►│ read: Query(pk) ──► counter L, queue ──► stale rows ahead? delete if rvn same │
//!            │        │ live row ahead and wait = 0 ──► Busy (1 request, nothing written)     │
//!            ▼        ▼                                                                       │
//!   queue empty: UpdateItem counter [ last L→L+1, seat = us ] if last = L and seat empty ◄────┘
//!                  ─► granted (the counter's seat: see `schema`)
//!   someone ahead: TransactWriteItems [ counter: last L→L+1 if last = L ; put q#L+1 if absent ]
//!            │ counter moved ─► (from hint: read again) (from read: wait = 0 ⇒ Busy, else queue as L')
//!            ▼
//!  look below our row (one read unit), paced by place and hold time; delete stale entries ahead
//!  conditionally; granted when no live entry is ahead; give up at the wait deadline (delete our
//!  row).
//! ```
//!
//! **Requests.** Uncontended, a cold client needs 3 per cycle (Query, UpdateItem to take the
//! seat, UpdateItem to vacate it). A client that released the key last time remembers the ticket
//! it released as a *hint*: every row with a lower ticket was gone when it was granted, and rows
//! with lower tickets can never appear later (issuance and insertion are one write), so if the
//! counter still stands at that ticket the queue is empty. It then skips the read and conditions
//! the seat on it: 2 single-item writes per cycle, what a plain conditional-put lock pays, without
//! giving up FIFO (a waiter that enqueued meanwhile has moved the counter, so the hint fails and we
//! queue behind). A skip decision (`wait = 0`, key held) costs 1 request (2 with a stale hint).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::Client;
use tokio::time::Instant;

use crate::clock::{millis, new_id};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, HeldBy};
use crate::guard::LockGuard;
use crate::heartbeat::{delete_with_retry, Membership, RowState, Timing, Written};
use crate::liveness::{backoff, jittered, Observer, Pace, Verdict};
use crate::memory::Memory;
use crate::options::{ClockSkew, LockOptions, Wait};
use crate::retry::Policy;
use crate::schema::{validate_key, Counter, NewRow, QueueRow, Snapshot};
use crate::status::QueueEntry;
use crate::storage::Dynamo;
use crate::storage::{Enqueue, EnqueueRequest, Failure, StaleDelete, Storage, Store};

/// Retries of transient failures last at least this long, even with `wait = 0`.
const MIN_RETRY_BUDGET: Duration = Duration::from_secs(5);

/// The per-attempt timeout set on clients that have none: a request that has not answered by
/// then is abandoned (and retried). A cancelled acquisition removes a row its last enqueue may
/// still write once more after this long.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The entry point: a lock table and a DynamoDB client. Cheap to clone; share one per process
/// (it remembers per-key hints that save a request per cycle, and what it saw of other rows,
/// which lets clock-free mode pass a dead row over without watching it again).
#[derive(Clone, Debug)]
pub struct Locker {
    store: Store,
    clock: Arc<dyn Clock>,
    memory: Arc<Memory>,
    observer: Arc<Mutex<Observer>>,
    /// The DynamoDB client, for checking the table when a request fails oddly (none on the
    /// simulation's storage).
    admin: Option<Client>,
}

impl Locker {
    /// A locker on `table`, using `client` (its endpoint, region and credentials).
    ///
    /// The client's retry schedule is replaced by one fit for leases of seconds: 3 attempts with
    /// 20–500 ms jittered backoff (the SDK's default starts near 1 s and grows to 20 s, long
    /// enough to outlive a lease inside one heartbeat). The lock's own loops retry further within
    /// the wait budget and the lease. A per-attempt timeout of 5 s is set unless the client has one,
    /// so a hung connection cannot stall an acquisition forever.
    pub fn new(client: Client, table: impl AsRef<str>) -> Locker {
        let mut config = client.config().to_builder().retry_config(
            RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(Duration::from_millis(20))
                .with_max_backoff(Duration::from_millis(500)),
        );
        let has_attempt_timeout = client
            .config()
            .timeout_config()
            .is_some_and(|t| t.operation_attempt_timeout().is_some());
        if !has_attempt_timeout {
            let mut timeouts = client
                .config()
                .timeout_config()
                .map(|t| t.to_builder())
                .unwrap_or_else(aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder);
            timeouts.set_operation_attempt_timeout(Some(ATTEMPT_TIMEOUT));
            config = config.timeout_config(timeouts.build());
        }
        let client = Client::from_conf(config.build());
        let table = table.as_ref();
        let mut locker = Locker::on(Arc::new(Dynamo::new(client.clone(), table)), table);
        locker.admin = Some(client);
        locker
    }

    /// A locker on any storage (the simulation's model of DynamoDB).
    pub(crate) fn on(storage: Arc<dyn Storage>, table: &str) -> Locker {
        Locker {
            store: Store::new(storage, table),
            clock: Arc::new(SystemClock),
            memory: Arc::default(),
            observer: Arc::default(),
            admin: None,
        }
    }

    /// A locker on the same table, with the same settings and clock, but a new DynamoDB client
    /// (so new connections) and nothing remembered from this one: for a process that has been
    /// copied (a SnapStart restore), whose pooled connections point at sockets of the snapshot's
    /// environment and whose per-key hints were also handed to every other copy.
    ///
    /// The new client is built from this one's configuration, so the SDK gives it a new default
    /// HTTP client and connection pool. A client configured with an explicit HTTP client keeps
    /// that one (the SDK shares it): it is the caller's to renew.
    pub fn renewed(&self) -> Locker {
        let Some(admin) = &self.admin else {
            // The simulation's storage has no connections: forget the hints only.
            let mut fresh = Locker::on(self.store.storage(), self.table());
            fresh.clock = self.clock.clone();
            return fresh;
        };
        if admin.config().http_client().is_some() {
            tracing::warn!(
                "the DynamoDB client has an explicit HTTP client: its connection pool is kept"
            );
        }
        let client = Client::from_conf(admin.config().to_builder().build());
        let table = self.table();
        let mut fresh = Locker::on(Arc::new(Dynamo::new(client.clone(), table)), table);
        fresh.admin = Some(client);
        fresh.clock = self.clock.clone();
        fresh
    }

    /// Replaces the clock (tests use a skewed one).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Locker {
        self.clock = clock;
        self
    }

    /// Waits until the background releases of dropped guards (and cancelled acquisitions) are
    /// done. Call it before a process exits.
    pub async fn flush(&self) {
        let tracker = self.store.background();
        tracker.close();
        tracker.wait().await;
        tracker.reopen();
    }

    /// The table name.
    pub fn table(&self) -> &str {
        self.store.table()
    }

    /// Checks the table as `flightlock create-table` does: it exists, its keys are `pk`/`sk`
    /// (strings) and TTL is on `expiresAt`. Needs `dynamodb:DescribeTable` and
    /// `dynamodb:DescribeTimeToLive`. Lambda users call it at init ([`crate::gate::Gate`] does).
    pub async fn check_table(&self) -> Result<(), Error> {
        match &self.admin {
            Some(client) => crate::table::verify_table(client, self.table()).await,
            None => Ok(()),
        }
    }

    /// The actionable error behind a failure that may come from a table that is not a
    /// flightlock table (a `ValidationException` from a wrong key schema, say): the table check's
    /// `WrongKeySchema`, `WrongTtl` or `TableNotFound`, or `None` if the check finds nothing
    /// wrong (or cannot run).
    pub async fn explain(&self, error: &Error) -> Option<Error> {
        let suspicious = match error {
            Error::Dynamo { source, .. } => source.to_string().contains("ValidationException"),
            _ => false,
        };
        if !suspicious {
            return None;
        }
        match self.check_table().await {
            Err(e @ (Error::WrongKeySchema { .. } | Error::WrongTtl { .. })) => Some(e),
            Err(e @ Error::TableNotFound { .. }) => Some(e),
            _ => None,
        }
    }

    /// Acquires `key`, waiting as `opts.wait` says. On success the returned guard heartbeats in
    /// the background until it is released or dropped. [`Error::Busy`] means the key stayed held
    /// for the whole wait; no row of ours is left behind.
    ///
    /// Cancel-safe: dropping the returned future at any point (a timeout, a signal) leaves no
    /// row behind that anyone must wait a lease for. A row already written is deleted in the
    /// background (see [`Locker::flush`]); an enqueue still in flight is deleted again once it can
    /// no longer land.
    pub async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<LockGuard, Error> {
        validate_key(key)?;
        opts.validate()?;
        let started = self.clock.now();
        let mut attempt = Attempt {
            locker: self,
            key,
            opts,
            started,
            deadline: opts.wait.as_duration().map(|d| started + d),
            max_seen: 0,
            surveyed: None,
        };
        let mut requeued = false;
        loop {
            if requeued && attempt.timed_out() {
                return Err(attempt.busy(None));
            }
            requeued = true;
            let (membership, clear) = attempt.enqueue().await?;
            if let RowState::Lost(reason) = membership.state() {
                // The enqueue itself outlasted the lease (long retries): start over.
                tracing::warn!(key, ticket = membership.ticket, %reason, "lease ran out during the enqueue; queueing again");
                drop(membership.leave().await);
                continue;
            }
            let membership = if clear {
                membership
            } else {
                match attempt.wait_turn(membership).await? {
                    Some(m) => m,
                    None => continue, // our row was removed while we waited: queue again
                }
            };
            let waited = self.clock.now().duration_since(started);
            tracing::debug!(
                key,
                ticket = membership.ticket,
                waited_ms = millis(waited),
                "lock acquired"
            );
            return Ok(LockGuard::new(
                membership,
                waited,
                self.clock.now(),
                !clear,
                self.memory.clone(),
            ));
        }
    }

    /// The queue of `key` as it stands, judged by our wall clock with `skew` (clock-free mode
    /// cannot judge from one read; it is shown as bounded by zero skew).
    pub async fn queue(&self, key: &str, skew: ClockSkew) -> Result<Vec<QueueEntry>, Error> {
        validate_key(key)?;
        let snap = self
            .read_with_retry(key, self.clock.now() + MIN_RETRY_BUDGET)
            .await?;
        let skew = match skew {
            ClockSkew::Bounded(d) => d,
            ClockSkew::Unbounded => Duration::ZERO,
        };
        Ok(QueueEntry::classify(snap, self.clock.wall_ms(), skew))
    }

    /// The current holder of `key` (the first live row), if any: one strongly consistent read.
    /// Used to name the holder when an acquisition gave up without knowing it (it lost the race
    /// to enqueue).
    pub async fn holder(&self, key: &str, skew: ClockSkew) -> Result<Option<HeldBy>, Error> {
        Ok(self
            .queue(key, skew)
            .await?
            .into_iter()
            .find(|e| e.state == crate::EntryState::Holding)
            .map(|e| HeldBy {
                ticket: e.ticket,
                owner: e.owner,
                info: e.holder,
            }))
    }

    async fn read_with_retry(&self, key: &str, give_up: Instant) -> Result<Snapshot, Error> {
        let mut failures = 0;
        loop {
            match self.store.read(key).await {
                Ok(snap) => return Ok(snap),
                Err(f) => {
                    failures += 1;
                    retry_pause(f, failures, give_up, &*self.clock).await?;
                }
            }
        }
    }
}

/// How an acquisition retries a failed request: within its wait budget.
const ACQUIRE_RETRY: Policy = Policy {
    base: Duration::from_millis(25),
    max: Duration::from_secs(1),
    attempts: u32::MAX,
};

/// Sleeps before a retry, or returns the failure as an error when the budget is spent.
async fn retry_pause(
    failure: Failure,
    failures: u32,
    give_up: Instant,
    clock: &dyn Clock,
) -> Result<(), Error> {
    if ACQUIRE_RETRY
        .pause(&failure, failures, Some(give_up), clock)
        .await
    {
        return Ok(());
    }
    Err(failure.into_error())
}

/// The state of one `acquire` call.
struct Attempt<'a> {
    locker: &'a Locker,
    key: &'a str,
    opts: &'a LockOptions,
    started: Instant,
    deadline: Option<Instant>,
    /// The highest ticket seen on the key (counter or row) during this call. Every ticket we
    /// take is above it.
    max_seen: u64,
    /// The lowest and highest tickets the enqueue's read found: the wait starts from them (our
    /// ticket minus the lowest rows ahead at most; the highest right ahead of ours if it is the
    /// ticket below) instead of looking again at once.
    surveyed: Option<(u64, u64)>,
}

/// Where the expected counter value came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Hint,
    Read,
}

/// An enqueue whose request may be on the wire: if the acquisition is dropped before it turns
/// into a [`Membership`], the row it may have written is deleted in the background — at once,
/// and again once the request can no longer land (after the attempt timeout), so a transaction
/// that was still in flight cannot leave an orphan behind.
struct InFlight {
    store: Store,
    clock: Arc<dyn Clock>,
    key: String,
    owner: String,
    /// Entries (ticket, seat) that an unanswered or ambiguous request may have written.
    tickets: Vec<(u64, bool)>,
}

impl InFlight {
    /// The rows that may exist, now that nobody will heartbeat them: removed in the background.
    fn abandon(&mut self) {
        let tickets = std::mem::take(&mut self.tickets);
        #[cfg(test)]
        if crate::sim::mutant::on(crate::sim::mutant::Mutant::AbandonLeavesRows) {
            return;
        }
        if tickets.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, clock, key, owner) = (
            self.store.clone(),
            self.clock.clone(),
            self.key.clone(),
            self.owner.clone(),
        );
        let tracker = store.background().clone();
        tracker.spawn_on(
            async move {
                for pass in 0..2 {
                    if pass == 1 {
                        tokio::time::sleep(ATTEMPT_TIMEOUT + Duration::from_millis(500)).await;
                    }
                    for &(t, seat) in &tickets {
                        if let Err(e) = delete_with_retry(&store, &*clock, &key, t, seat, &owner).await {
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

/// A prepared enqueue: one ticket, one token, one byte-identical request, and the lease it
/// writes. Retries of an ambiguous attempt resend exactly this (a changed request under the
/// same `ClientRequestToken` is an `IdempotentParameterMismatch` on DynamoDB, and on a server
/// that ignores tokens the lease we would believe in would not be the one stored).
struct Prepared {
    request: EnqueueRequest,
    /// Monotonic instant before the first send.
    first_sent: Instant,
    /// Wall time the row's lease was computed from.
    wall: i64,
    lease_until_ms: i64,
    granted: bool,
}

impl Attempt<'_> {
    fn now(&self) -> Instant {
        self.locker.clock.now()
    }

    fn timed_out(&self) -> bool {
        self.deadline.is_some_and(|d| self.now() >= d)
    }

    /// Until when transient failures are retried.
    fn retry_budget(&self) -> Instant {
        let floor = self.now() + MIN_RETRY_BUDGET;
        match self.deadline {
            Some(d) => d.max(floor),
            None => self.now() + Duration::from_secs(3600),
        }
    }

    fn busy(&self, holder: Option<&QueueRow>) -> Error {
        Error::Busy {
            key: self.key.to_owned(),
            waited: self.now().duration_since(self.started),
            holder: holder.map(|r| {
                Box::new(HeldBy {
                    ticket: r.ticket,
                    owner: r.owner.clone(),
                    info: r.holder.clone(),
                })
            }),
        }
    }

    /// Reads the queue and removes stale rows ahead of `below` (all rows if `None`). Returns the
    /// snapshot and the first live row ahead, if any.
    async fn survey(&mut self, below: Option<u64>) -> Result<(Snapshot, Option<QueueRow>), Error> {
        let asked = self.now();
        let snap = self
            .locker
            .read_with_retry(self.key, self.retry_budget())
            .await?;
        self.max_seen = self
            .max_seen
            .max(snap.counter.as_ref().map_or(0, |c| c.last))
            .max(snap.rows.last().map_or(0, |r| r.ticket));
        let mut first_live = None;
        for row in snap
            .rows
            .iter()
            .filter(|r| below.is_none_or(|b| r.ticket < b))
        {
            if self.alive(row, asked).await? {
                first_live = Some(row.clone());
                break; // one live row ahead is enough to wait; rows behind it are its business
            }
        }
        Ok((snap, first_live))
    }

    /// Whether a row ahead of us is live, from a read first sent at `asked`. A stale one is
    /// passed over: deleted conditionally on the `rvn` judged; only a heartbeat that landed
    /// first (`Revived`) keeps it live.
    async fn alive(&self, row: &QueueRow, asked: Instant) -> Result<bool, Error> {
        match self.judge(row, asked) {
            #[cfg(test)]
            Verdict::Live
                if row.acquired_at_ms.is_none()
                    && !row.seat
                    && crate::sim::mutant::on(crate::sim::mutant::Mutant::WaitersAheadIgnored) =>
            {
                Ok(false)
            }
            Verdict::Live => Ok(true),
            #[cfg(test)]
            Verdict::Stale
                if self.opts.wait == Wait::NoWait
                    && crate::sim::mutant::on(crate::sim::mutant::Mutant::SkipTrustsEveryRow) =>
            {
                Ok(true)
            }
            Verdict::Stale => {
                let outcome = self.delete_stale(row).await?;
                tracing::info!(key = self.key, ticket = row.ticket, owner = %row.owner, ?outcome, "passing over a dead row");
                Ok(outcome == StaleDelete::Revived)
            }
        }
    }

    fn judge(&self, row: &QueueRow, asked: Instant) -> Verdict {
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
    fn busy_now(&self, head: &QueueRow) -> bool {
        if !self.opts.clock_free() {
            return true;
        }
        self.locker
            .observer
            .lock()
            .map_or(true, |o| o.seen_alive(&head.owner, self.now()))
    }

    async fn delete_stale(&self, row: &QueueRow) -> Result<StaleDelete, Error> {
        let give_up = self.retry_budget();
        let mut failures = 0;
        loop {
            match self
                .locker
                .store
                .delete_stale(self.key, row.ticket, row.seat, &row.rvn)
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
    async fn create_counter(&self, give_up: Instant) -> Result<(), Error> {
        let mut failures = 0;
        loop {
            match self
                .locker
                .store
                .create_counter(self.key, self.max_seen, &new_id(&*self.locker.clock))
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
    fn prepare(&self, owner: &str, ticket: u64, counter: Counter, clear: bool) -> Prepared {
        let opts = self.opts;
        let clock = &*self.locker.clock;
        let first_sent = clock.now();
        let wall = clock.wall_ms();
        let lease_until_ms = opts.lease_until_ms(wall);
        let rvn = new_id(clock);
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
                seat: clear,
            },
            first_sent,
            wall,
            lease_until_ms,
            granted: clear,
        }
    }

    /// Puts our row in the queue. Returns it, and whether the queue was clear (we hold the key).
    async fn enqueue(&mut self) -> Result<(Membership, bool), Error> {
        let opts = self.opts;
        let clock = self.locker.clock.clone();
        let owner = new_id(&*clock);
        let mut in_flight = InFlight {
            store: self.locker.store.clone(),
            clock: clock.clone(),
            key: self.key.to_owned(),
            owner: owner.clone(),
            tickets: Vec::new(),
        };
        // (counter as read, where it came from, the queue was clear)
        self.surveyed = None;
        let hint = self.locker.memory.hint(self.key);
        let mut expected = hint.as_ref().map(|h| {
            let counter = Counter {
                last: h.ticket,
                owner: Some(crate::schema::last_owner(&h.owner, h.ticket)),
            };
            (counter, Source::Hint, true)
        });
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
                    if let Some(head) = &live {
                        if opts.wait == Wait::NoWait && self.busy_now(head) {
                            return Err(self.busy(live.as_ref()));
                        }
                    }
                    if let (Some(head), Wait::NoWait) = (&live, opts.wait) {
                        // Clock-free, and the row ahead has not been seen alive yet: watch it.
                        // It changes within a heartbeat if its owner lives, or goes stale (and
                        // is passed over) after its lease; the bound is only a backstop.
                        let row_lease =
                            Duration::from_millis(u64::try_from(head.lease_ms).unwrap_or(0));
                        if self.now() >= self.started + row_lease * 2 + opts.max_poll {
                            return Err(self.busy(live.as_ref()));
                        }
                        let pause = jittered(opts.poll, clock.jitter());
                        tokio::time::sleep(pause).await;
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
                    let e = (counter, Source::Read, live.is_none());
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
                        Duration::from_millis(u64::try_from(p.lease_until_ms - p.wall).unwrap_or(0))
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
                    self.max_seen = self.max_seen.max(current.as_ref().map_or(0, |c| c.last));
                    let adopt = |c: &Counter| source == Source::Read && c.consistent();
                    let Some(current) = current.filter(adopt) else {
                        // Our hint is old (others used the key since), the counter is gone, or
                        // it was set by hand (its `last` may be below queued rows): look
                        // before queueing.
                        expected = None;
                        continue;
                    };
                    if opts.wait == Wait::NoWait {
                        // Someone enqueued between our read and our write: they are ahead.
                        return Err(self.busy(None));
                    }
                    expected = Some((current, Source::Read, false));
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
                    delete_with_retry(&self.locker.store, &*clock, self.key, ticket, seat, &owner)
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
                    if self.now() + pause >= give_up {
                        return Err(self.busy(None));
                    }
                    tokio::time::sleep(pause).await;
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
                return Err(self.busy(None));
            }
        }
    }

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
    async fn look(&mut self, m: &Membership, deep: bool) -> Result<Look, Error> {
        if deep {
            if let Some(far) = self.far_back(m).await? {
                return Ok(far);
            }
        }
        let give_up = self.retry_budget();
        let mut start = None;
        let mut first = true;
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
            // queue's first entry, and an empty counter is no entry at all.
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
                if self.alive(row, asked).await? {
                    // Entries read below it are counted as ahead too (not judged: they are its
                    // business); a full page means there may be more. The counter is not one:
                    // counted, it put every waiter a place further back than it is, and the
                    // pacing then slept a whole hold too long (handoff p50 7 → 15 ms).
                    let ahead = entries[i..].iter().flatten().count() + usize::from(next.is_some());
                    return Ok(Look::Behind {
                        row: Box::new(row.clone()),
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
    async fn far_back(&mut self, m: &Membership) -> Result<Option<Look>, Error> {
        let give_up = self.retry_budget();
        loop {
            let mut failures = 0;
            let asked = self.now();
            let lowest = loop {
                match self.locker.store.read_lowest(self.key).await {
                    Ok(item) => break item,
                    Err(f) => {
                        failures += 1;
                        retry_pause(f, failures, give_up, &*self.locker.clock).await?;
                    }
                }
            };
            let Some(row) = lowest else { return Ok(None) };
            if row.ticket >= m.ticket {
                return Ok(None);
            }
            if !self.alive(&row, asked).await? {
                continue; // passed over: read where the queue starts now
            }
            let ahead = usize::try_from(m.ticket - row.ticket).unwrap_or(usize::MAX);
            if ahead <= LOOK_LIMIT as usize {
                return Ok(None);
            }
            return Ok(Some(Look::Behind {
                row: Box::new(row),
                ahead,
                adjacent: false,
            }));
        }
    }

    /// Waits until no live row is ahead of ours. `None`: our row was removed meanwhile (we were
    /// judged dead) and we must queue again.
    ///
    /// Each look costs one read unit (see [`Attempt::look`]); when it looks next follows its
    /// place and how fast the queue moves ([`Pace`]); a release by this same process wakes it at
    /// once. The enqueue's read counts as the first look.
    async fn wait_turn(&mut self, m: Membership) -> Result<Option<Membership>, Error> {
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

    async fn wait_turn_inner(
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
                        if let RowState::Lost(reason) = m.state() {
                            // Our own lease ran out while we looked: we may already have been
                            // passed over.
                            tracing::warn!(key = self.key, ticket = m.ticket, %reason, "lease ran out just before the grant; queueing again");
                            drop(m.leave().await);
                            return Ok(None);
                        }
                        m.mark_granted(self.locker.clock.wall_ms());
                        return Ok(Some(m));
                    }
                    Ok(Look::Behind {
                        row,
                        ahead,
                        adjacent,
                    }) => {
                        if self.timed_out() {
                            if let Err(e) = m.leave().await {
                                tracing::warn!(key = self.key, error = %e, "could not remove our row after giving up; it goes stale after one lease");
                            }
                            return Err(self.busy(Some(&row)));
                        }
                        (ahead, row.ticket, adjacent)
                    }
                },
            };
            deep = ahead >= LOOK_LIMIT as usize;
            let jitter = self.locker.clock.jitter();
            let mut pause = pace.after_look(self.now(), ahead, nearest, jitter);
            if adjacent && self.locker.memory.ours(self.key, nearest) {
                // Right behind a row of this process: its release (or its waiter giving up)
                // wakes us; `max_poll` is only a backstop.
                pause = jittered(self.opts.max_poll, jitter);
            }
            #[cfg(test)]
            if crate::sim::mutant::on(crate::sim::mutant::Mutant::LazyLooks) {
                pause *= 20;
            }
            #[cfg(test)]
            let overshoots = crate::sim::mutant::on(crate::sim::mutant::Mutant::WaitOvershoots);
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
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// Rows read per look: ours and up to seven ahead, one read unit (rows are a few hundred bytes).
/// The place is exact up to seven ahead and a lower bound beyond. The simulation's queues are
/// short (up to six participants), so there a page is three rows: its schedules then go through
/// full pages and the far-back look too.
const LOOK_LIMIT: u32 = if cfg!(test) { 3 } else { 8 };

/// What one look below our row found.
enum Look {
    /// Our row is gone (passed over as dead, swept, deleted by hand).
    Removed,
    /// No live row ahead: the key is ours.
    Clear,
    /// `row` is the nearest live row ahead (`adjacent`), or the first row of the queue (a
    /// far-back look); about `ahead` rows are ahead in all.
    Behind {
        row: Box<QueueRow>,
        ahead: usize,
        adjacent: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_20_hex_digits_and_differ() {
        let a = new_id(&SystemClock);
        assert_eq!(a.len(), 20);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, new_id(&SystemClock));
    }
}
