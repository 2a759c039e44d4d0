//! The acquisition protocol.
//!
//! ```text
//!            ┌──────────── hint: "rows ≤ L are gone" (from our own last release) ───────────┐
//!            │                                                                               ▼
//! acquire ──►│ read: Query(pk) ──► counter L, queue ──► stale rows ahead? delete if rvn same │
//!            │        │ live row ahead and wait = 0 ──► Busy (1 request, nothing written)     │
//!            ▼        ▼                                                                       │
//!  TransactWriteItems [ counter: last L→L+1 if last = L ;  put q#L+1 if absent ]  ◄──────────┘
//!            │ counter moved ─► (from hint: read again) (from read: wait = 0 ⇒ Busy, else retry L')
//!            │ ok, queue was clear ─► granted
//!            ▼ ok, someone ahead
//!  poll: Query(pk) every `poll` (backing off while the queue stands still); delete stale rows ahead
//!  conditionally; granted when no live row is ahead; give up at the wait deadline
//!  (delete our row).
//! ```
//!
//! **Requests.** Uncontended, a cold client needs 3 per cycle (Query, TransactWriteItems,
//! DeleteItem). A client that released the key last time remembers the ticket it released as a
//! *hint*: every row with a lower ticket was gone when it was granted, and rows with lower tickets
//! can never appear later (issuance and insertion are one transaction), so if the counter still
//! stands at that ticket the queue is empty. It then skips the read and conditions the transaction
//! on it: 2 requests per cycle, the floor that non-FIFO locks reach, without giving up FIFO (a
//! waiter that enqueued meanwhile has moved the counter, so the hint fails and we queue behind).
//! A skip decision (`wait = 0`, key held) costs 1 request (2 with a stale hint).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::Client;
use tokio::time::Instant;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, HeldBy};
use crate::guard::LockGuard;
use crate::heartbeat::{millis, Membership, RowState, Timing, Written};
use crate::liveness::{backoff, poll_interval, Observer, Verdict};
use crate::options::{ClockSkew, LockOptions, Wait};
use crate::queue::QueueEntry;
use crate::schema::{validate_key, NewRow, QueueRow, Snapshot};
use crate::store::{Enqueue, Failure, StaleDelete, Store};

/// At most this many keys' hints are remembered (one `u64` each).
const MAX_HINTS: usize = 4096;

/// Retries of transient failures last at least this long, even with `wait = 0`.
const MIN_RETRY_BUDGET: Duration = Duration::from_secs(5);

/// A fresh random id: 20 hex digits (80 bits). Used for owners and record versions.
pub(crate) fn new_id() -> String {
    let v: u128 = rand::random();
    format!("{:020x}", v & ((1u128 << 80) - 1))
}

/// The entry point: a lock table and a DynamoDB client. Cheap to clone; share one per process
/// (it remembers per-key hints that save a request per cycle).
#[derive(Clone, Debug)]
pub struct Locker {
    store: Store,
    clock: Arc<dyn Clock>,
    hints: Arc<Mutex<HashMap<String, u64>>>,
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
            timeouts.set_operation_attempt_timeout(Some(Duration::from_secs(5)));
            config = config.timeout_config(timeouts.build());
        }
        let client = Client::from_conf(config.build());
        Locker {
            store: Store::new(client, table.as_ref()),
            clock: Arc::new(SystemClock),
            hints: Arc::default(),
        }
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

    /// The DynamoDB client.
    pub fn client(&self) -> &Client {
        self.store.client()
    }

    /// Acquires `key`, waiting as `opts.wait` says. On success the returned guard heartbeats in
    /// the background until it is released or dropped. [`Error::Busy`] means the key stayed held
    /// for the whole wait; no row of ours is left behind.
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
            observer: Observer::default(),
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
            return Ok(LockGuard::new(membership, waited, self.hints.clone()));
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

    pub(crate) fn remember(hints: &Mutex<HashMap<String, u64>>, key: &str, ticket: Option<u64>) {
        let Ok(mut hints) = hints.lock() else { return };
        match ticket {
            Some(t) => {
                if hints.len() >= MAX_HINTS && !hints.contains_key(key) {
                    hints.clear();
                }
                hints.insert(key.to_owned(), t);
            }
            None => {
                hints.remove(key);
            }
        }
    }

    fn hint(&self, key: &str) -> Option<u64> {
        self.hints.lock().ok()?.get(key).copied()
    }

    async fn read_with_retry(&self, key: &str, give_up: Instant) -> Result<Snapshot, Error> {
        let mut failures = 0;
        loop {
            match self.store.read(key).await {
                Ok(snap) => return Ok(snap),
                Err(f) => {
                    failures += 1;
                    retry_pause(f, failures, give_up).await?;
                }
            }
        }
    }
}

/// Sleeps before a retry, or returns the failure as an error when the budget is spent.
async fn retry_pause(failure: Failure, failures: u32, give_up: Instant) -> Result<(), Error> {
    if let Failure::Retry {
        throttled,
        operation,
        source,
    } = &failure
    {
        let pause = backoff(
            failures,
            Duration::from_millis(25),
            Duration::from_secs(1),
            rand::random(),
        );
        if Instant::now() + pause < give_up {
            tracing::debug!(operation, throttled, failures, error = %source, "retrying");
            tokio::time::sleep(pause).await;
            return Ok(());
        }
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
    observer: Observer,
}

/// Where the expected counter value came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Hint,
    Read,
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
        let snap = self
            .locker
            .read_with_retry(self.key, self.retry_budget())
            .await?;
        self.observer
            .retain_present(snap.rows.iter().map(|r| r.owner.as_str()));
        let mut first_live = None;
        for row in snap
            .rows
            .iter()
            .filter(|r| below.is_none_or(|b| r.ticket < b))
        {
            let verdict = self.observer.judge(
                row,
                self.locker.clock.wall_ms(),
                self.now(),
                self.opts.clock_skew,
            );
            let live = match verdict {
                Verdict::Live => true,
                Verdict::Stale => {
                    let outcome = self.delete_stale(row).await?;
                    tracing::info!(key = self.key, ticket = row.ticket, owner = %row.owner, ?outcome, "passing over a dead row");
                    outcome == StaleDelete::Revived
                }
            };
            if live {
                first_live = Some(row.clone());
                break; // one live row ahead is enough to wait; rows behind it are its business
            }
        }
        Ok((snap, first_live))
    }

    async fn delete_stale(&self, row: &QueueRow) -> Result<StaleDelete, Error> {
        let give_up = self.retry_budget();
        let mut failures = 0;
        loop {
            match self
                .locker
                .store
                .delete_stale(self.key, row.ticket, &row.rvn)
                .await
            {
                Ok(o) => return Ok(o),
                Err(f) => {
                    failures += 1;
                    retry_pause(f, failures, give_up).await?;
                }
            }
        }
    }

    /// Puts our row in the queue. Returns it, and whether the queue was clear (we hold the key).
    async fn enqueue(&mut self) -> Result<(Membership, bool), Error> {
        let opts = self.opts;
        let owner = new_id();
        let mut expected = self.locker.hint(self.key).map(|l| (l, Source::Hint));
        let mut clear = expected.is_some();
        let mut ambiguous: Vec<u64> = Vec::new();
        let mut failures = 0;
        let give_up = self.retry_budget();
        loop {
            let (last, source) = match expected {
                Some(e) => e,
                None => {
                    let (snap, live) = self.survey(None).await?;
                    if live.is_some() && opts.wait == Wait::NoWait {
                        return Err(self.busy(live.as_ref()));
                    }
                    clear = live.is_none();
                    expected = Some((snap.last, Source::Read));
                    (snap.last, Source::Read)
                }
            };
            let ticket = last + 1;
            let sent = self.now();
            let wall = self.locker.clock.wall_ms();
            let row = NewRow {
                key: self.key,
                ticket,
                owner: &owner,
                lease_until_ms: opts.lease_until_ms(wall),
                lease_ms: millis(opts.lease),
                grace_ms: millis(opts.ttl_grace),
                rvn: &new_id(),
                now_ms: wall,
                granted: clear,
                holder: &opts.holder,
            };
            let token = format!("{owner}{ticket:016x}");
            match self.locker.store.enqueue(&row, last, &token).await {
                Ok(Enqueue::Done | Enqueue::AlreadyOurs) => {
                    let timing = Timing {
                        interval: opts.heartbeat_interval(),
                        grace: opts.ttl_grace,
                        opts: Arc::new(opts.clone()),
                    };
                    let written = Written {
                        key: self.key,
                        ticket,
                        owner: &owner,
                        granted: clear,
                        sent,
                        valid_for: Duration::from_millis(
                            u64::try_from(row.lease_until_ms - wall).unwrap_or(0),
                        ),
                    };
                    let m = Membership::start(
                        self.locker.store.clone(),
                        self.locker.clock.clone(),
                        written,
                        timing,
                    );
                    // Earlier ambiguous attempts at other tickets did not commit (the counter
                    // moved past them without our row), so there is nothing else to clean up.
                    return Ok((m, clear));
                }
                Ok(Enqueue::CounterAt(current)) => {
                    if source == Source::Hint {
                        // Our hint is old: others used the key since. Look before queueing.
                        expected = None;
                        continue;
                    }
                    if opts.wait == Wait::NoWait {
                        // Someone enqueued between our read and our write: they are ahead.
                        return Err(self.busy(None));
                    }
                    clear = false;
                    expected = Some((current, Source::Read));
                    failures = 0;
                }
                Ok(Enqueue::Conflict) => {
                    failures += 1;
                    let pause = backoff(
                        failures,
                        Duration::from_millis(10),
                        opts.max_poll,
                        rand::random(),
                    );
                    tokio::time::sleep(pause).await;
                }
                Err(f) => {
                    if matches!(f, Failure::Retry { .. }) {
                        ambiguous.push(ticket);
                    }
                    failures += 1;
                    if let Err(e) = retry_pause(f, failures, give_up).await {
                        self.abandon(&owner, &ambiguous).await;
                        return Err(e);
                    }
                }
            }
            if self.timed_out() && opts.wait != Wait::NoWait {
                self.abandon(&owner, &ambiguous).await;
                return Err(self.busy(None));
            }
        }
    }

    /// Removes rows an ambiguous enqueue may have written before we gave up.
    async fn abandon(&self, owner: &str, tickets: &[u64]) {
        for &t in tickets {
            if let Err(e) =
                crate::heartbeat::delete_with_retry(&self.locker.store, self.key, t, owner).await
            {
                tracing::warn!(key = self.key, ticket = t, error = ?e, "could not remove a possibly written row; it goes stale after one lease");
            }
        }
    }

    /// Polls until no live row is ahead of ours. `None`: our row was removed meanwhile (we were
    /// judged dead) and we must queue again.
    async fn wait_turn(&mut self, m: Membership) -> Result<Option<Membership>, Error> {
        let mut lost = m.subscribe();
        let mut last_place = usize::MAX;
        let mut still_polls = 0;
        loop {
            if let RowState::Lost(reason) = m.state() {
                tracing::warn!(key = self.key, ticket = m.ticket, %reason, "lost our place in the queue; queueing again");
                drop(m.leave().await);
                return Ok(None);
            }
            let (snap, first_live) = match self.survey(Some(m.ticket)).await {
                Ok(s) => s,
                Err(e) => {
                    drop(m.leave().await);
                    return Err(e);
                }
            };
            let ours = snap
                .rows
                .iter()
                .any(|r| r.ticket == m.ticket && *r.owner == *m.owner);
            if !ours {
                tracing::warn!(
                    key = self.key,
                    ticket = m.ticket,
                    "our queue row was removed while waiting; queueing again"
                );
                drop(m.leave().await);
                return Ok(None);
            }
            let Some(head) = first_live else {
                if let RowState::Lost(reason) = m.state() {
                    // Our own lease ran out while we looked: we may already have been passed over.
                    tracing::warn!(key = self.key, ticket = m.ticket, %reason, "lease ran out just before the grant; queueing again");
                    drop(m.leave().await);
                    return Ok(None);
                }
                m.mark_granted();
                return Ok(Some(m));
            };
            if self.timed_out() {
                if let Err(e) = m.leave().await {
                    tracing::warn!(key = self.key, error = %e, "could not remove our row after giving up; it goes stale after one lease");
                }
                return Err(self.busy(Some(&head)));
            }
            let ahead = snap
                .rows
                .iter()
                .filter(|r| r.ticket >= head.ticket && r.ticket < m.ticket)
                .count();
            still_polls = if ahead < last_place {
                0
            } else {
                still_polls + 1
            };
            last_place = ahead;
            let mut pause = poll_interval(
                ahead,
                still_polls,
                self.opts.poll,
                self.opts.max_poll,
                rand::random(),
            );
            if let Some(d) = self.deadline {
                pause = pause.min(d.saturating_duration_since(self.now()));
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = lost.wait_for(|s| matches!(s, RowState::Lost(_))) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_20_hex_digits_and_differ() {
        let a = new_id();
        assert_eq!(a.len(), 20);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, new_id());
    }

    #[test]
    fn hints_are_bounded() {
        let hints = Mutex::new(HashMap::new());
        for i in 0..(MAX_HINTS + 10) {
            Locker::remember(&hints, &format!("k{i}"), Some(1));
        }
        assert!(hints.lock().unwrap().len() <= MAX_HINTS);
        Locker::remember(&hints, "k1", None);
        assert!(!hints.lock().unwrap().contains_key("k1"));
    }
}
