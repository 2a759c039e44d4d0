//! Locks a handler takes for itself while its invocation runs (a lock per record of a batch),
//! all given back when the invocation ends: the one mechanism behind the extension's lock API
//! (`flightlock_extension::lock_api`, for handlers in any language) and the in-process layer's
//! `flightlock_lambda::records()` (feature `layer`, for Rust handlers).
//!
//! One [`Records`] per invocation. Each acquisition is bounded by the invocation's deadline as
//! the gate's is ([`decision_budget`]; the wait ends at the deadline minus
//! `FLIGHTLOCK_DEADLINE_MARGIN`), each lease is capped at the deadline plus
//! [`LEASE_CAP_GRACE`](crate::config::LEASE_CAP_GRACE), and [`Records::close`] at the
//! invocation's end releases whatever is still held; an acquisition granted after that is
//! released at once and answered [`RecordError::Ended`]. A key is held at most once per
//! invocation (a lock is not reentrant: a second acquisition would wait for the first), and at
//! most [`MAX_HELD`] are held or being acquired at once.
//!
//! Each outcome that tells an operator something is counted as an EMF metric named
//! `RecordLock*` ([`RecordError::metric`]; on with `FLIGHTLOCK_METRICS`, as the gate's): an
//! acquisition, a busy key, a lock found lost when given back, and an error of DynamoDB or of the
//! key's configuration. A caller's own mistakes (a key held twice, too many, a release of a key
//! not held, a call after the end) are answered to the caller and counted nowhere.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use flightlock::error::HeldBy;
use flightlock::{Error, HolderInfo, LockGuard, Locker, ReleaseOutcome, Wait};

use crate::config::Config;
use crate::gate::{decision_budget, release_budget};
use crate::metrics::{Metric, Metrics};

/// How often [`Records::close`] looks whether the acquisitions under way have ended.
const PENDING_CHECK: Duration = Duration::from_millis(10);

/// Locks one invocation may hold (or be acquiring) at once. A batch of 10 SQS records needs
/// 10; a handler that locks the records of a larger batch one after another needs one.
pub const MAX_HELD: usize = 100;

/// Why a record's lock was not taken or given back.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The invocation has ended: nothing more is taken (an acquisition granted after the end
    /// was released at once).
    #[error("the invocation has ended: its locks were released, and no more are taken")]
    Ended,
    /// This invocation holds the key already, or is acquiring it.
    #[error("this invocation already holds or is acquiring {key:?}; a lock is not reentrant")]
    AlreadyHeld {
        /// The key.
        key: String,
    },
    /// [`MAX_HELD`] are held or being acquired.
    #[error("this invocation holds or is acquiring {MAX_HELD} locks, the most one may; release one first")]
    TooMany,
    /// The key stayed held for the whole wait.
    #[error("{error}{cut}")]
    Busy {
        /// The lock's error ([`Error::Busy`]), naming the holders.
        error: Box<Error>,
        /// Who holds it.
        holders: Vec<HeldBy>,
        /// Set when the wait asked for was cut at the deadline: a note saying so.
        cut: String,
    },
    /// No decision before the invocation's deadline (DynamoDB did not answer in time).
    #[error("no decision on {key:?} within {budget:.1?}: DynamoDB did not answer before the invocation's deadline")]
    NoDecision {
        /// The key.
        key: String,
        /// The time allowed.
        budget: Duration,
    },
    /// The key is invalid, allows another number of holders, runs a newer protocol, or
    /// DynamoDB refused: the lock's error.
    #[error(transparent)]
    Lock(Box<Error>),
    /// A release of a key this invocation does not hold.
    #[error("this invocation does not hold {key:?}")]
    NotHeld {
        /// The key.
        key: String,
    },
    /// A release found the lock already lost.
    #[error("the lock of {key:?} (token {token}) had been lost before this release (its lease ran out or another holder took over): the work done under it was not protected")]
    Lost {
        /// The key.
        key: String,
        /// Its fencing token.
        token: u64,
    },
}

impl RecordError {
    /// The metric this outcome counts, if any (see the module docs). Pure.
    pub fn metric(&self) -> Option<Metric> {
        match self {
            RecordError::Busy { .. } => Some(Metric::RecordLockBusy),
            RecordError::Lost { .. } => Some(Metric::RecordLockLost),
            RecordError::NoDecision { .. } => Some(Metric::RecordLockErrors),
            RecordError::Lock(e) if matches!(**e, Error::InvalidKey { .. }) => None,
            RecordError::Lock(_) => Some(Metric::RecordLockErrors),
            RecordError::Ended
            | RecordError::AlreadyHeld { .. }
            | RecordError::TooMany
            | RecordError::NotHeld { .. } => None,
        }
    }
}

/// A lock taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// The key.
    pub key: String,
    /// The fencing token.
    pub token: u64,
    /// Time spent acquiring.
    pub waited: Duration,
    /// How many may hold the key at once.
    pub permits: u32,
}

/// A lock held, as [`Records::held`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The key.
    pub key: String,
    /// The fencing token.
    pub token: u64,
    /// How many may hold the key at once.
    pub permits: u32,
    /// True once the lock is known lost.
    pub lost: bool,
}

/// The locks of one invocation: see the module docs. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Records {
    locker: Locker,
    config: Arc<Config>,
    holder: HolderInfo,
    deadline: Option<SystemTime>,
    metrics: Metrics,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Set when the invocation ends: nothing more is taken.
    closed: bool,
    /// The locks held, with the permits each was taken with.
    held: BTreeMap<String, (LockGuard, u32)>,
    /// Keys being acquired now.
    pending: BTreeSet<String>,
}

impl Records {
    /// The locks of an invocation due at `deadline`, taken through `locker` with `config`'s
    /// lease, heartbeat, clock skew, margin and defaults (`FLIGHTLOCK_WAIT`,
    /// `FLIGHTLOCK_PERMITS`), written into rows as held by `holder`. Metrics follow
    /// `config.metrics`, as the gate's.
    pub fn new(
        locker: Locker,
        config: Arc<Config>,
        holder: HolderInfo,
        deadline: Option<SystemTime>,
    ) -> Records {
        let metrics = Metrics::new(
            config.metrics,
            config.function_name.clone().unwrap_or_default(),
        );
        Records {
            locker,
            config,
            holder,
            deadline,
            metrics,
            state: Mutex::default(),
        }
    }

    /// The same, counting its outcomes in `metrics` (a test's [`Metrics::captured`], say).
    pub fn with_metrics(self, metrics: Metrics) -> Records {
        Records { metrics, ..self }
    }

    /// Counts `outcome`'s metric, if it has one.
    fn count<T>(
        &self,
        outcome: Result<T, RecordError>,
        ok: Option<Metric>,
    ) -> Result<T, RecordError> {
        let metric = match &outcome {
            Ok(_) => ok,
            Err(e) => e.metric(),
        };
        if let Some(metric) = metric {
            self.metrics.count(metric);
        }
        outcome
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another task panicked while holding it; the maps are
        // still consistent (every change is one insert or remove).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Time until the deadline, if there is one.
    fn left(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.duration_since(SystemTime::now()).unwrap_or_default())
    }

    /// Takes the lock of `key`, waiting `wait` (default `FLIGHTLOCK_WAIT`; cut at the deadline
    /// minus the margin) with `permits` (default `FLIGHTLOCK_PERMITS`).
    pub async fn acquire(
        &self,
        key: &str,
        wait: Option<Wait>,
        permits: Option<u32>,
    ) -> Result<Acquired, RecordError> {
        let outcome = self.take(key, wait, permits).await;
        self.count(outcome, Some(Metric::RecordLockAcquired))
    }

    /// [`Records::acquire`], uncounted.
    async fn take(
        &self,
        key: &str,
        wait: Option<Wait>,
        permits: Option<u32>,
    ) -> Result<Acquired, RecordError> {
        flightlock::schema::validate_key(key).map_err(|e| RecordError::Lock(Box::new(e)))?;
        let reservation = self.reserve(key)?;
        let asked = wait.unwrap_or(self.config.wait);
        let mut options = self.config.lock_options_waiting(
            asked,
            self.deadline,
            SystemTime::now(),
            self.holder.clone(),
        );
        options.permits = permits.unwrap_or(self.config.permits);
        let started = Instant::now();
        let budget = self
            .left()
            .map(|l| decision_budget(l, self.config.deadline_margin));
        let acquisition = self.locker.acquire(key, &options);
        let result = match budget {
            None => Ok(acquisition.await),
            Some(b) => tokio::time::timeout(b, acquisition).await.map_err(|_| b),
        };
        match result {
            Err(budget) => Err(RecordError::NoDecision {
                key: key.to_owned(),
                budget,
            }),
            Ok(Ok(guard)) => {
                let acquired = Acquired {
                    key: key.to_owned(),
                    token: guard.token(),
                    waited: started.elapsed(),
                    permits: options.permits,
                };
                if let Some(guard) = reservation.settle(guard, options.permits) {
                    // Released while the reservation stands, so a close() under way waits for
                    // this release too (it waits until nothing is pending).
                    self.release_quietly(guard).await;
                    drop(reservation);
                    return Err(RecordError::Ended);
                }
                drop(reservation);
                tracing::info!(key, token = acquired.token, "record lock acquired");
                Ok(acquired)
            }
            Ok(Err(error @ Error::Busy { .. })) => {
                let holders = match &error {
                    Error::Busy { holders, .. } => holders.clone(),
                    _ => Vec::new(),
                };
                let cut = if options.wait == asked {
                    String::new()
                } else {
                    format!(
                        " (the wait was cut to {:?}: the invocation's deadline minus \
                         FLIGHTLOCK_DEADLINE_MARGIN came first)",
                        options.wait.as_duration().unwrap_or_default()
                    )
                };
                Err(RecordError::Busy {
                    error: Box::new(error),
                    holders,
                    cut,
                })
            }
            Ok(Err(e)) => Err(RecordError::Lock(Box::new(e))),
        }
    }

    /// Gives back the lock of `key`: the next waiter gets it at once.
    pub async fn release(&self, key: &str) -> Result<(), RecordError> {
        let outcome = self.give_back(key).await;
        self.count(outcome, None)
    }

    /// [`Records::release`], uncounted.
    async fn give_back(&self, key: &str) -> Result<(), RecordError> {
        let guard = self
            .state()
            .held
            .remove(key)
            .map(|(g, _)| g)
            .ok_or_else(|| RecordError::NotHeld {
                key: key.to_owned(),
            })?;
        let token = guard.token();
        let budget = release_budget(self.left());
        match tokio::time::timeout(budget, guard.release()).await {
            Ok(Ok(ReleaseOutcome::Released)) => {
                tracing::info!(key, token, "record lock released");
                Ok(())
            }
            Ok(Ok(ReleaseOutcome::Lost)) => Err(RecordError::Lost {
                key: key.to_owned(),
                token,
            }),
            Ok(Err(e)) => Err(RecordError::Lock(Box::new(e))),
            Err(_) => Err(RecordError::NoDecision {
                key: key.to_owned(),
                budget,
            }),
        }
    }

    /// What is held now, by key.
    pub fn held(&self) -> Vec<Held> {
        self.state()
            .held
            .iter()
            .map(|(key, (g, permits))| Held {
                key: key.clone(),
                token: g.token(),
                permits: *permits,
                lost: g.is_lost(),
            })
            .collect()
    }

    /// The invocation ended: takes no more, and releases everything still held, concurrently,
    /// each within the release budget. Returns how many were released (or found lost).
    pub async fn close(&self) -> usize {
        let held: Vec<LockGuard> = {
            let mut state = self.state();
            state.closed = true;
            std::mem::take(&mut state.held)
                .into_values()
                .map(|(g, _)| g)
                .collect()
        };
        let n = held.len();
        if n > 0 {
            futures::future::join_all(held.into_iter().map(|g| self.release_quietly(g))).await;
            tracing::info!(
                released = n,
                "the invocation ended; released its record locks"
            );
        }
        n
    }

    /// Waits until no acquisition of this set is under way, at most `limit`. After
    /// [`Records::close`], an acquisition still under way releases whatever it is granted
    /// before it ends, so at SHUTDOWN this is what keeps the extension from exiting before those
    /// releases are sent. True if none is left.
    pub async fn drain(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            if self.state().pending.is_empty() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(PENDING_CHECK).await;
        }
    }

    /// Releases `guard` within the release budget, logging what happened.
    async fn release_quietly(&self, guard: LockGuard) {
        let key = guard.key().to_owned();
        match tokio::time::timeout(release_budget(self.left()), guard.release()).await {
            Ok(Ok(ReleaseOutcome::Released)) => tracing::info!(%key, "record lock released"),
            Ok(Ok(ReleaseOutcome::Lost)) => {
                self.metrics.count(Metric::RecordLockLost);
                tracing::warn!(%key, "the record lock had been lost before the invocation ended")
            }
            Ok(Err(e)) => {
                self.metrics.count(Metric::RecordLockErrors);
                tracing::error!(error = %e, %key, "record lock release failed; the row lapses within its lease")
            }
            Err(_) => {
                self.metrics.count(Metric::RecordLockErrors);
                tracing::error!(%key, "record lock release did not finish in time; the row lapses within its lease")
            }
        }
    }

    /// Reserves `key` for an acquisition (see the module docs for the refusals). The
    /// reservation ends when it is dropped: a caller that gives up mid-acquisition drops it.
    fn reserve(&self, key: &str) -> Result<Reservation<'_>, RecordError> {
        let mut state = self.state();
        if state.closed {
            return Err(RecordError::Ended);
        }
        if state.held.contains_key(key) || state.pending.contains(key) {
            return Err(RecordError::AlreadyHeld {
                key: key.to_owned(),
            });
        }
        if state.held.len() + state.pending.len() >= MAX_HELD {
            return Err(RecordError::TooMany);
        }
        state.pending.insert(key.to_owned());
        Ok(Reservation {
            records: self,
            key: key.to_owned(),
        })
    }
}

/// A key being acquired.
#[derive(Debug)]
struct Reservation<'a> {
    records: &'a Records,
    key: String,
}

impl Reservation<'_> {
    /// Keeps `guard` (taken with `permits`), or gives it back (`Some`) if the invocation ended
    /// meanwhile.
    fn settle(&self, guard: LockGuard, permits: u32) -> Option<LockGuard> {
        let mut state = self.records.state();
        if state.closed {
            return Some(guard);
        }
        state.held.insert(self.key.clone(), (guard, permits));
        None
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.records.state().pending.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records() -> Records {
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .build();
        let locker = Locker::new(aws_sdk_dynamodb::Client::from_conf(config), "locks");
        let env = [("FLIGHTLOCK_TABLE", "locks"), ("FLIGHTLOCK_KEY", "job")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Records::new(
            locker,
            Arc::new(Config::from_map(&env).unwrap()),
            HolderInfo::default(),
            None,
        )
    }

    #[test]
    fn a_closed_set_takes_nothing_and_a_reservation_frees_its_key_when_dropped() {
        let records = records();
        let r = records.reserve("a").unwrap();
        // The same key twice in one invocation would wait for itself: refused at once.
        assert!(matches!(
            records.reserve("a"),
            Err(RecordError::AlreadyHeld { .. })
        ));
        drop(r);
        let r = records.reserve("a").unwrap();
        records.state().closed = true;
        drop(r);
        assert!(matches!(records.reserve("b"), Err(RecordError::Ended)));
    }

    #[tokio::test]
    async fn drain_waits_for_the_acquisitions_under_way() {
        let records = Arc::new(records());
        assert!(records.drain(Duration::ZERO).await, "nothing under way");
        let r = records.reserve("a").unwrap();
        assert!(!records.drain(Duration::from_millis(30)).await);
        let waiting = {
            let records = records.clone();
            tokio::spawn(async move { records.drain(Duration::from_secs(60)).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished());
        drop(r);
        assert!(waiting.await.unwrap(), "drained once the acquisition ended");
    }

    #[test]
    fn each_outcome_counts_its_own_metric_and_a_callers_mistake_none() {
        let lock = |e: Error| RecordError::Lock(Box::new(e));
        let invalid = flightlock::schema::validate_key("").unwrap_err();
        assert!(matches!(invalid, Error::InvalidKey { .. }), "{invalid:?}");
        let busy = RecordError::Busy {
            error: Box::new(Error::Busy {
                key: "k".into(),
                waited: Duration::ZERO,
                holders: Vec::new(),
                permits: 1,
            }),
            holders: Vec::new(),
            cut: String::new(),
        };
        let cases = [
            (busy, Some(Metric::RecordLockBusy)),
            (
                RecordError::Lost {
                    key: "k".into(),
                    token: 3,
                },
                Some(Metric::RecordLockLost),
            ),
            (
                RecordError::NoDecision {
                    key: "k".into(),
                    budget: Duration::from_secs(1),
                },
                Some(Metric::RecordLockErrors),
            ),
            (
                lock(Error::PermitsMismatch {
                    key: "k".into(),
                    table: 2,
                    configured: 1,
                }),
                Some(Metric::RecordLockErrors),
            ),
            (lock(invalid), None),
            (RecordError::Ended, None),
            (RecordError::AlreadyHeld { key: "k".into() }, None),
            (RecordError::TooMany, None),
            (RecordError::NotHeld { key: "k".into() }, None),
        ];
        for (error, metric) in cases {
            assert_eq!(error.metric(), metric, "{error:?}");
        }
    }

    /// The metric names of the lines kept by a captured `Metrics`.
    fn names(kept: &Mutex<Vec<String>>) -> Vec<String> {
        kept.lock()
            .unwrap()
            .iter()
            .map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                v["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    #[tokio::test]
    async fn acquisitions_and_releases_emit_their_lines() {
        let (metrics, kept) = Metrics::captured("f");
        let records = records().with_metrics(metrics);
        // A caller's mistakes: answered, not counted.
        assert!(matches!(
            records.acquire("", None, None).await,
            Err(RecordError::Lock(_))
        ));
        let pending = records.reserve("a").unwrap();
        assert!(matches!(
            records.acquire("a", None, None).await,
            Err(RecordError::AlreadyHeld { .. })
        ));
        drop(pending);
        assert!(matches!(
            records.release("a").await,
            Err(RecordError::NotHeld { .. })
        ));
        assert_eq!(names(&kept), Vec::<String>::new());
        // This client has no region and no endpoint: DynamoDB cannot be asked, an error of the
        // lock, counted once.
        let outcome = tokio::time::timeout(
            Duration::from_secs(20),
            records.acquire("b", Some(Wait::NoWait), None),
        )
        .await
        .expect("an answer within 20 s");
        assert!(matches!(outcome, Err(RecordError::Lock(_))), "{outcome:?}");
        assert_eq!(names(&kept), ["RecordLockErrors"]);
    }

    #[test]
    fn at_most_max_held_are_held_or_pending_at_once() {
        let records = records();
        let keys: Vec<String> = (0..MAX_HELD).map(|i| format!("k{i}")).collect();
        let reservations: Vec<_> = keys.iter().map(|k| records.reserve(k).unwrap()).collect();
        assert!(matches!(
            records.reserve("one-more"),
            Err(RecordError::TooMany)
        ));
        drop(reservations);
        assert!(records.reserve("one-more").is_ok());
    }
}
