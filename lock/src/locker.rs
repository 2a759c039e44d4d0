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

use crate::clock::millis;
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, HeldBy};
use crate::guard::LockGuard;
use crate::liveness::Observer;
use crate::membership::{RowState, RELEASE_BUDGET, RELEASE_RETRY};
use crate::memory::Memory;
use crate::options::{ClockSkew, LockOptions};
use crate::retry::Policy;
use crate::schema::{validate_key, Snapshot};
use crate::status::{KeyState, QueueEntry};
use crate::storage::Dynamo;
use crate::storage::{Backend, Failure, Store};

mod attempt;

use attempt::Attempt;

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
    /// simulation's backend).
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

    /// A locker on any backend (the simulation's model of DynamoDB).
    pub(crate) fn on(backend: Arc<dyn Backend>, table: &str) -> Locker {
        Locker {
            store: Store::new(backend, table),
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
            // The simulation's backend has no connections: forget the hints only.
            let mut fresh = Locker::on(self.store.backend(), self.table());
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

    /// Whether DynamoDB (or anything at its endpoint) has answered any request of this locker
    /// yet. Until it has, nothing can have been written in its name that needs cleaning up, and
    /// a connection or signing failure is a setting to fix rather than a fault to retry.
    pub fn has_answered(&self) -> bool {
        self.store.answered()
    }

    /// Checks the table as `flightlock create-table` does: it exists, its keys are `pk`/`sk`
    /// (strings) and TTL is on `expiresAt`. Needs `dynamodb:DescribeTable` and
    /// `dynamodb:DescribeTimeToLive`. Lambda users call it at init (the gate of `flightlock-lambda` does).
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
                return Err(attempt.busy(&[]));
            }
            requeued = true;
            let (membership, clear) = attempt.enqueue().await?;
            #[cfg(test)]
            let guarded = !crate::mutant::on(crate::mutant::Mutant::EnqueuePastOwnLease);
            #[cfg(not(test))]
            let guarded = true;
            if let (RowState::Lost(reason), true) = (membership.state(), guarded) {
                // The enqueue itself outlasted the lease (long retries): start over.
                #[cfg(test)]
                crate::mutant::fired(crate::mutant::GUARD_ENQUEUE);
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
            if let Some(crate::tick::Tick::Id(id)) = &opts.tick {
                // A tick id is checked once the key is held: nobody else can record it now.
                let (store, clock) = (&self.store, &*self.clock);
                let recorded = RELEASE_RETRY
                    .send(clock.now() + RELEASE_BUDGET, clock, || {
                        store.tick_recorded(key, id)
                    })
                    .await;
                if !matches!(recorded, Ok(false)) {
                    drop(membership.leave().await);
                    recorded?;
                    return Err(Error::TickDone {
                        key: key.to_owned(),
                        tick: id.clone(),
                        done: id.clone(),
                    });
                }
                // The check ran before any heartbeat (they start with the guard) and may have
                // retried for seconds: if our lease ran out meanwhile, others may have judged
                // the entry dead and run the key, so neither the entry nor the answer counts.
                #[cfg(test)]
                let guarded = !crate::mutant::on(crate::mutant::Mutant::TickCheckPastOwnLease);
                #[cfg(not(test))]
                let guarded = true;
                if let (RowState::Lost(reason), true) = (membership.state(), guarded) {
                    #[cfg(test)]
                    crate::mutant::fired(crate::mutant::GUARD_TICK_ID);
                    tracing::warn!(key, ticket = membership.ticket, %reason, "lease ran out while the tick id was checked; queueing again");
                    drop(membership.leave().await);
                    continue;
                }
            }
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
                opts.tick.clone().map(|t| Box::new((t, opts.tick_keep))),
            ));
        }
    }

    /// The queue of `key` as it stands ([`Locker::state`]).
    pub async fn queue(&self, key: &str, skew: ClockSkew) -> Result<Vec<QueueEntry>, Error> {
        Ok(self.state(key, skew).await?.queue)
    }

    /// What `key`'s partition says ([`KeyState`]): its queue judged by our wall clock with
    /// `skew` (clock-free mode cannot judge from one read; it is shown as bounded by zero skew),
    /// its protocol, permits and highest ticket. One strongly consistent read, retried as an
    /// acquisition retries. A key on a newer protocol than this build speaks is
    /// [`Error::ProtocolTooNew`].
    pub async fn state(&self, key: &str, skew: ClockSkew) -> Result<KeyState, Error> {
        validate_key(key)?;
        let snap = self.read_with_retry(key, self.retry_deadline()).await?;
        Ok(KeyState::new(snap, self.clock.wall_ms(), skew))
    }

    /// The current holder of `key` with the lowest ticket (the only one, with one permit), if
    /// any: one strongly consistent read.
    pub async fn holder(&self, key: &str, skew: ClockSkew) -> Result<Option<HeldBy>, Error> {
        Ok(self.holders(key, skew).await?.into_iter().next())
    }

    /// The current holders of `key` (its first live entries, as many as the key has permits),
    /// in ticket order: one strongly consistent read. Used to name them when an acquisition gave
    /// up without knowing them (it lost the race to enqueue).
    pub async fn holders(&self, key: &str, skew: ClockSkew) -> Result<Vec<HeldBy>, Error> {
        Ok(self
            .queue(key, skew)
            .await?
            .into_iter()
            .filter(|e| e.state == crate::EntryState::Holding)
            .map(|e| HeldBy {
                ticket: e.ticket,
                owner: e.owner,
                info: e.holder,
            })
            .collect())
    }

    async fn read_with_retry(&self, key: &str, give_up: Instant) -> Result<Snapshot, Error> {
        self.retrying(give_up, || self.store.read(key)).await
    }

    /// Sends the request `send` makes until it is answered, retrying transient failures as an
    /// acquisition does until `give_up`.
    pub(crate) async fn retrying<T, F, Fut>(&self, give_up: Instant, send: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        ACQUIRE_RETRY.send(give_up, &*self.clock, send).await
    }

    /// The protocol's handle on the table.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The clock this locker judges and waits by.
    pub(crate) fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// How long a request is retried at least ([`MIN_RETRY_BUDGET`]), from now.
    pub(crate) fn retry_deadline(&self) -> Instant {
        self.clock.now() + MIN_RETRY_BUDGET
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
