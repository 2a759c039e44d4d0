//! The gate: one decision per invocation, shared by the Lambda extension's proxy and the
//! in-process tower layer (`FlightlockLayer`, feature `layer`), with the same logs and the same EMF metrics
//! ([`super::metrics`]).
//!
//! ```text
//! event bytes, tenant ─► key from the template ─┬─ error ──────► Failed(FlightlockKeyError)
//!                        tick (FLIGHTLOCK_TICK) ┼─ error ──────► Failed(FlightlockTickError)
//!                        older than STALE_AFTER ┼─ yes ────────► Skipped(stale), no request
//!                                               └─ acquire, bounded by the invocation deadline
//!                                                  ├─ held ──────────► Acquired (heartbeating)
//!                                                  ├─ tick done ─────► Skipped(duplicate)
//!                                                  ├─ superseded ────► Skipped(superseded)
//!                                                  ├─ busy ──────────► Skipped(busy) | Failed(FlightlockBusy)
//!                                                  ├─ newer protocol ► Failed(FlightlockProtocolTooNew), never skipped
//!                                                  ├─ other permits ─► Failed(FlightlockPermitsMismatch), never skipped
//!                                                  └─ error / late ──► Failed(FlightlockLockError)
//! ```
//!
//! The adapter runs the handler and then calls [`Gate::release`] with how the run ended: a
//! [`Run::Succeeded`] run marks its tick done (a later delivery of it is a duplicate), a
//! [`Run::Failed`] one does not (retries run it again). Duplicates, stale and superseded ticks
//! are answered with a success body whatever `FLIGHTLOCK_ON_BUSY` says: they are meant not to
//! run, and an error would only bring retries that are answered the same way.
//!
//! Every decision ends before the deadline: the acquisition (each DynamoDB attempt and retry
//! included) is bounded by [`decision_budget`]; releases by [`release_budget`]. Error bodies
//! carry no ARNs or account ids ([`redact_aws_ids`]); the logs have the full errors.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tracing::Instrument;

use super::client_context::LockContext;
use super::config::{Config, OnBusy, DEADLINE_MARGIN, STALE_AFTER, TICK};
use super::metrics::{Metric, Metrics};
use super::responses::{
    redact_aws_ids, skipped_body, SkipReason, BUSY_ERROR_TYPE, KEY_ERROR_TYPE, LOCK_ERROR_TYPE,
    PERMITS_ERROR_TYPE, PROTOCOL_ERROR_TYPE, TICK_ERROR_TYPE,
};
use flightlock::tick::age;
use flightlock::{Error, HolderInfo, LockGuard, LockOptions, Locker, ReleaseOutcome, Tick};

// The time bounds of a gate: how long a decision and a release may take before the
// invocation's deadline, and the DynamoDB client's timeouts that keep attempts inside them.

/// Connect timeout for the DynamoDB client of a gate (a regional endpoint answers in ms).
pub const SDK_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Per-attempt timeout for the DynamoDB client of a gate: a hung attempt gives way to a retry
/// well inside a decision budget (the locker's default is 5 s, longer than a 3 s function's).
pub const SDK_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Releasing never takes less than this, even at the deadline (the row lapses anyway).
const RELEASE_MIN: Duration = Duration::from_millis(500);
/// Releasing never takes longer than this after the invocation ended.
const RELEASE_MAX: Duration = Duration::from_secs(3);

/// How long the decision for an invocation may take (acquire, and the holder read of a busy
/// key), when `left` is the time until its deadline: up to half of the deadline margin before
/// the deadline, so the answer (skip body or error) still goes out in time. The lock's own wait
/// ends a full margin before the deadline (see [`crate::config::Config::lock_options`]), so a key that stays
/// held is reported as busy, not as a timeout. With less than a margin left, half of what is
/// left. Pure.
pub fn decision_budget(left: Duration, margin: Duration) -> Duration {
    left.saturating_sub(margin / 2).max(left / 2)
}

/// How long a failed acquisition may spend asking the table check for a better error.
const EXPLAIN_MAX: Duration = Duration::from_millis(500);

/// How long a release may take, when `left` is the time until the deadline (`None`: unknown).
pub fn release_budget(left: Option<Duration>) -> Duration {
    left.unwrap_or(RELEASE_MAX).clamp(RELEASE_MIN, RELEASE_MAX)
}

/// Time until `deadline`, zero if past.
fn until(deadline: SystemTime) -> Duration {
    deadline
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
}

/// A lock held for an invocation: give it back with [`Gate::release`].
#[derive(Debug)]
pub struct Held {
    // Boxed: a guard is large, and `Outcome`'s other variants are small.
    guard: Box<LockGuard>,
    watcher: tokio::task::JoinHandle<()>,
    deadline: Option<SystemTime>,
    tick: Option<Tick>,
    waited_ms: u64,
    permits: u32,
}

impl Held {
    /// The fencing token.
    pub fn token(&self) -> u64 {
        self.guard.token()
    }

    /// True once the lock is known lost (a heartbeat found it taken over or expired).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// The invocation's tick, if it has one.
    pub fn tick(&self) -> Option<&Tick> {
        self.tick.as_ref()
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        self.guard.key()
    }

    /// What the handler is told about its lock (see [`crate::client_context`]).
    pub fn lock_context(&self) -> LockContext {
        LockContext {
            ticket: self.guard.token(),
            key: self.guard.key().to_owned(),
            waited_ms: self.waited_ms,
            tick: self.tick.as_ref().map(Tick::to_string),
            permits: self.permits,
        }
    }
}

/// How the handler's run ended, for [`Gate::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// The handler answered successfully: the tick (if any) is marked done.
    Succeeded,
    /// The handler failed, timed out or crashed, or the answer did not reach Lambda: the tick
    /// is not marked, so a retry runs it again.
    Failed,
}

/// The decision for one invocation.
#[derive(Debug)]
pub enum Outcome {
    /// The lock is held (and heartbeating): run the handler, then [`Gate::release`].
    Acquired(Held),
    /// Key busy, policy `skip`: answer the invocation with this success body.
    Skipped(serde_json::Value),
    /// Answer the invocation with an error: the Runtime API's error body
    /// ([`super::responses::error_body`]) in the extension, a `Diagnostic` of the same two fields
    /// in the in-process layer.
    Failed {
        /// `FlightlockBusy`, `FlightlockKeyError` or `FlightlockLockError`.
        error_type: &'static str,
        /// What happened and what to do, AWS ids redacted.
        message: String,
    },
}

/// Decides invocations: see the module docs. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Gate {
    config: Arc<Config>,
    locker: Locker,
    metrics: Metrics,
    host: String,
}

impl Gate {
    /// A gate with `config`, taking locks through `locker`; `host` is written into rows for
    /// people (e.g. `hostname:pid`). Metrics follow `config.metrics`.
    pub fn new(config: Arc<Config>, locker: Locker, host: String) -> Gate {
        let metrics = Metrics::new(
            config.metrics,
            config.function_name.clone().unwrap_or_default(),
        );
        Gate {
            config,
            locker,
            metrics,
            host,
        }
    }

    /// The same gate with a renewed locker (new DynamoDB client and connection pool, nothing
    /// remembered; see [`Locker::renewed`]) and a new `host`: for a process that was restored
    /// from a snapshot (SnapStart), whose connections and identity were made before the copy.
    pub fn renewed(&self, host: String) -> Gate {
        Gate {
            config: self.config.clone(),
            locker: self.locker.renewed(),
            metrics: self.metrics.clone(),
            host,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The configuration, shared (for an adapter that keeps it beside the gate).
    pub fn shared_config(&self) -> Arc<Config> {
        self.config.clone()
    }

    /// The locker.
    pub fn locker(&self) -> &Locker {
        &self.locker
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Who holds a lock taken for invocation `request_id`, as its row tells people.
    pub fn holder(&self, request_id: &str) -> HolderInfo {
        HolderInfo {
            function: self.config.function_name.clone(),
            request_id: Some(request_id.to_owned()),
            host: Some(self.host.clone()),
        }
    }

    /// Decides invocation `request_id` with raw `event` bytes, its `deadline` and its `tenant`
    /// id (tenant isolation mode; `None` otherwise). Records `key`, `tick`, `ticket` and
    /// `waited_ms` on the current span (the adapter's `invocation` span).
    pub async fn decide(
        &self,
        request_id: &str,
        deadline: Option<SystemTime>,
        event: &[u8],
        tenant: Option<&str>,
    ) -> Outcome {
        let span = tracing::Span::current();
        let key = match self.config.key.render_invocation(event, tenant) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(error = %e, "cannot derive the lock key; failing the invocation");
                self.metrics.count(Metric::KeyErrors);
                return failed(KEY_ERROR_TYPE, &e.to_string());
            }
        };
        span.record("key", key.as_str());
        let tick = match self.tick(event, tenant, &key) {
            Ok(t) => t,
            Err(outcome) => return outcome,
        };
        let tick_text = tick.as_ref().map(Tick::to_string);
        if let Some(t) = &tick_text {
            span.record("tick", t.as_str());
        }
        let holder = self.holder(request_id);
        let opts = LockOptions {
            tick: tick.clone(),
            ..self
                .config
                .lock_options(deadline, SystemTime::now(), holder)
        };
        let started = Instant::now();
        // Every decision before the deadline: whatever DynamoDB does (blackholed, refusing,
        // slow), the acquisition ends within the budget. Dropping an acquisition in flight is
        // safe: the locker removes whatever row it may have written.
        let budget = deadline.map(|d| decision_budget(until(d), self.config.deadline_margin));
        let acquire = self.locker.acquire(&key, &opts);
        let result = match budget {
            None => Ok(acquire.await),
            Some(b) => tokio::time::timeout(b, acquire).await.map_err(|_| b),
        };
        let waited_ms = started.elapsed().as_secs_f64() * 1000.0;
        span.record("waited_ms", waited_ms as u64);
        self.metrics.put(Metric::WaitTime, waited_ms);
        let result = match result {
            Ok(r) => r,
            Err(budget) => {
                let message = format!(
                    "no lock decision within {budget:.1?}: DynamoDB did not answer before the \
                     invocation deadline minus half of {DEADLINE_MARGIN} ({:.1?})",
                    self.config.deadline_margin
                );
                tracing::error!(%message, "could not take the lock in time; failing the invocation");
                self.metrics.count(Metric::LockErrors);
                return failed(LOCK_ERROR_TYPE, &message);
            }
        };
        match result {
            Ok(guard) => {
                span.record("ticket", guard.token());
                tracing::info!("lock acquired");
                self.metrics.count(Metric::Acquired);
                let mut lost = guard.lost_signal();
                let metrics = self.metrics.clone();
                let watcher = tokio::spawn(
                    async move {
                        let reason = lost.wait().await;
                        tracing::error!(%reason, "lock lost while the handler runs: another invocation may now hold the key");
                        metrics.count(Metric::LockLost);
                    }
                    .instrument(span.clone()),
                );
                Outcome::Acquired(Held {
                    guard: Box::new(guard),
                    watcher,
                    deadline,
                    tick,
                    waited_ms: waited_ms as u64,
                    permits: opts.permits,
                })
            }
            Err(e @ Error::TickDone { .. }) => {
                tracing::info!(reason = %e, "tick already done: duplicate invocation skipped");
                self.metrics.count(Metric::Duplicates);
                Outcome::Skipped(skipped_body(
                    SkipReason::Duplicate,
                    &key,
                    tick_text.as_deref(),
                    &[],
                ))
            }
            Err(e @ Error::Superseded { .. }) => {
                tracing::info!(reason = %e, "a newer tick replaced this one: invocation skipped");
                self.metrics.count(Metric::Superseded);
                Outcome::Skipped(skipped_body(
                    SkipReason::Superseded,
                    &key,
                    tick_text.as_deref(),
                    &[],
                ))
            }
            Err(e @ Error::Busy { .. }) => {
                let held_by = match &e {
                    Error::Busy { holders, .. } if !holders.is_empty() => holders.clone(),
                    // Lost the race to enqueue: one more read names the holders for the body,
                    // if the budget allows.
                    _ => {
                        let left =
                            budget.map_or(RELEASE_MAX, |b| b.saturating_sub(started.elapsed()));
                        match tokio::time::timeout(left, self.locker.holders(&key, opts.clock_skew))
                            .await
                        {
                            Ok(Ok(h)) => h,
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "could not read the holders");
                                Vec::new()
                            }
                            Err(_) => Vec::new(),
                        }
                    }
                };
                match self.config.on_busy {
                    OnBusy::Skip => {
                        tracing::info!(reason = %e, "key busy: invocation skipped");
                        self.metrics.count(Metric::Skipped);
                        Outcome::Skipped(skipped_body(
                            SkipReason::Busy,
                            &key,
                            tick_text.as_deref(),
                            &held_by,
                        ))
                    }
                    OnBusy::Error => {
                        tracing::info!(reason = %e, "key busy: invocation failed with {BUSY_ERROR_TYPE}");
                        self.metrics.count(Metric::BusyErrors);
                        failed(BUSY_ERROR_TYPE, &e.to_string())
                    }
                }
            }
            Err(e @ Error::ProtocolTooNew { .. }) => {
                // Whatever FLIGHTLOCK_ON_BUSY says: a skip would answer success for a run that
                // never happened; failing lets Lambda's retries run it once upgraded.
                tracing::error!(error = %e, "the key runs a newer protocol than this layer speaks; failing the invocation");
                self.metrics.count(Metric::LockErrors);
                failed(PROTOCOL_ERROR_TYPE, &redact_aws_ids(&e.to_string()))
            }
            Err(e @ Error::PermitsMismatch { .. }) => {
                // Never a skip either: nothing ran, and Lambda's retries run it once the function
                // or the key is reconfigured.
                tracing::error!(error = %e, "the key allows a different number of holders than FLIGHTLOCK_PERMITS; failing the invocation");
                self.metrics.count(Metric::LockErrors);
                failed(PERMITS_ERROR_TYPE, &redact_aws_ids(&e.to_string()))
            }
            Err(e) => {
                // A table that is not a flightlock table fails with a bare ValidationException:
                // give the table check's actionable error instead, if it can tell in time.
                let e = match tokio::time::timeout(EXPLAIN_MAX, self.locker.explain(&e)).await {
                    Ok(Some(better)) => better,
                    _ => e,
                };
                tracing::error!(error = %e, "could not take the lock; failing the invocation");
                self.metrics.count(Metric::LockErrors);
                // The full error is in the log; the caller gets no ARNs or account ids.
                failed(LOCK_ERROR_TYPE, &redact_aws_ids(&e.to_string()))
            }
        }
    }

    /// Checks the lock table in the background (key schema, TTL), so a wrong table is reported
    /// at init with the fix, not at the first invocation as a bare DynamoDB error. Without the
    /// describe permissions it only says so.
    pub fn check_table_in_background(&self) {
        let locker = self.locker.clone();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            match tokio::time::timeout(Duration::from_secs(5), locker.check_table()).await {
                Ok(Ok(())) => tracing::debug!(table = locker.table(), "lock table checked"),
                Ok(Err(e @ Error::AccessDenied { .. })) => tracing::warn!(
                    error = %e,
                    "could not check the lock table (grant dynamodb:DescribeTable and \
                     dynamodb:DescribeTimeToLive to have it checked at init)"
                ),
                Ok(Err(e)) => tracing::error!(error = %e, "the lock table is not usable"),
                Err(_) => tracing::warn!("the lock table check did not finish in 5 s"),
            }
        });
    }

    /// Releases a held lock after a run that ended as `run`: [`Run::Succeeded`] marks the tick
    /// done ([`LockGuard::release_done`]), [`Run::Failed`] does not ([`LockGuard::release`]).
    /// Bounded by the time left until its invocation's deadline (see [`release_budget`]): an
    /// unreachable DynamoDB must not hold the invocation open. An unfinished release leaves the
    /// row to lapse (its lease is capped at the deadline + grace) and the tick unmarked.
    pub async fn release(&self, held: Held, run: Run) {
        let Held {
            guard,
            watcher,
            deadline,
            tick,
            waited_ms: _,
            permits: _,
        } = held;
        watcher.abort();
        let failures = guard.heartbeat_failures();
        if failures > 0 {
            self.metrics.put(Metric::HeartbeatErrors, failures as f64);
        }
        let budget = release_budget(deadline.map(until));
        let marks = tick.is_some() && run == Run::Succeeded;
        let release = async {
            match run {
                Run::Succeeded => guard.release_done().await,
                Run::Failed => guard.release().await,
            }
        };
        match tokio::time::timeout(budget, release).await {
            Ok(Ok(ReleaseOutcome::Released)) if marks => {
                tracing::info!("lock released, tick marked done")
            }
            Ok(Ok(ReleaseOutcome::Released)) => tracing::info!(?run, "lock released"),
            Ok(Ok(ReleaseOutcome::Lost)) => {
                tracing::warn!("the lock had already been lost when the invocation ended")
            }
            Ok(Err(e)) if marks => {
                tracing::error!(error = %e, "the tick could not be marked done (a retry of it will run again), or the release failed (the row goes stale after one lease)");
                self.metrics.count(Metric::TickMarkErrors);
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "release failed; the row goes stale after one lease");
                self.metrics.count(Metric::ReleaseErrors);
            }
            Err(_) => {
                tracing::error!(
                    budget_ms = budget.as_millis() as u64,
                    "release did not finish in time; the row goes stale after its (capped) lease"
                );
                self.metrics.count(Metric::ReleaseErrors);
            }
        }
    }
}

/// Who this process is, for people reading a holder row: `hostname:pid#random`. The random
/// part (from the OS, see [`flightlock::clock`]) tells apart copies of one process, which share
/// hostname and pid: environments restored from one SnapStart snapshot. Read it after a restore,
/// not before.
pub fn host_id() -> String {
    format!(
        "{}#{:06x}",
        HolderInfo::this_host(),
        flightlock::clock::os_random() & 0xff_ffff
    )
}

impl Gate {
    /// The invocation's tick, or the outcome that answers it without running: a tick that
    /// cannot be found or checked fails it (`FlightlockTickError`), a stale one skips it
    /// before any request.
    fn tick(&self, event: &[u8], tenant: Option<&str>, key: &str) -> Result<Option<Tick>, Outcome> {
        let tick = self.config.tick.tick(event, tenant).map_err(|e| {
            tracing::error!(error = %e, "cannot find the tick; failing the invocation");
            self.metrics.count(Metric::TickErrors);
            failed(TICK_ERROR_TYPE, &format!("{TICK}: {e}"))
        })?;
        let (Some(tick), Some(bound)) = (&tick, self.config.stale_after) else {
            return Ok(tick);
        };
        match tick {
            Tick::At(at) => {
                let age = age(*at, SystemTime::now());
                if age > bound {
                    tracing::info!(%tick, age_ms = age.as_millis() as u64, "tick older than {STALE_AFTER}: invocation skipped");
                    self.metrics.count(Metric::StaleTicks);
                    let text = tick.to_string();
                    return Err(Outcome::Skipped(skipped_body(
                        SkipReason::Stale,
                        key,
                        Some(&text),
                        &[],
                    )));
                }
                Ok(Some(tick.clone()))
            }
            Tick::Id(id) => {
                let message = format!(
                    "{STALE_AFTER} is set, but the tick {id:?} (from {TICK}={}) is an id, not a \
                     time: an id has no age. Make {TICK} render an RFC 3339 time, or set \
                     {STALE_AFTER}=off",
                    self.config.tick
                );
                tracing::error!(%message, "cannot check the tick's age; failing the invocation");
                self.metrics.count(Metric::TickErrors);
                Err(failed(TICK_ERROR_TYPE, &message))
            }
        }
    }
}

fn failed(error_type: &'static str, message: &str) -> Outcome {
    Outcome::Failed {
        error_type,
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{decision_budget, release_budget, RELEASE_MAX, RELEASE_MIN};

    #[test]
    fn decisions_end_before_the_deadline() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // A 3 s function with the default 1 s margin: 2.5 s, leaving 0.5 s to answer.
        assert_eq!(decision_budget(s(3), s(1)), ms(2500));
        // The lock's own wait (deadline - margin) ends before the budget: busy stays busy.
        assert!(decision_budget(s(900), s(1)) > s(899));
        // Less than a margin left: half of it, never zero while time is left.
        assert_eq!(decision_budget(ms(600), s(1)), ms(300));
        assert_eq!(decision_budget(ms(0), s(1)), ms(0));
        for left in [ms(1), ms(700), s(2), s(60)] {
            assert!(decision_budget(left, s(1)) < left);
        }
    }

    #[test]
    fn releases_are_bounded() {
        assert_eq!(release_budget(None), RELEASE_MAX);
        assert_eq!(release_budget(Some(Duration::ZERO)), RELEASE_MIN);
        assert_eq!(
            release_budget(Some(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
        assert_eq!(release_budget(Some(Duration::from_secs(600))), RELEASE_MAX);
    }
}
