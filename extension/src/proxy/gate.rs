//! Gating one event: key, acquisition within the deadline, the busy policy, and releasing.

use super::*;
use flightlock::config::redact_aws_ids;

/// Connect timeout of the DynamoDB client (a regional endpoint answers in milliseconds).
pub const SDK_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Per-attempt timeout of the DynamoDB client: a hung attempt gives way to a retry well inside
/// a decision budget (the lock library's default is 5 s, longer than a 3 s function's budget).
pub const SDK_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Releasing never takes less than this, even at the deadline (the row lapses anyway).
const RELEASE_MIN: Duration = Duration::from_millis(500);
/// Releasing never takes longer than this after the response went upstream.
const RELEASE_MAX: Duration = Duration::from_secs(3);

/// How long the decision for an invocation may take (acquire, and the holder read of a busy
/// key), when `left` is the time until its deadline: up to half of the deadline margin before
/// the deadline, so the answer (skip body or error) still goes upstream in time. The lock's own
/// wait ends a full margin before the deadline (see [`Config::lock_options`]), so a key that
/// stays held is reported as busy, not as a timeout. With less than a margin left, half of what
/// is left. Pure.
pub fn decision_budget(left: Duration, margin: Duration) -> Duration {
    left.saturating_sub(margin / 2).max(left / 2)
}

/// How long a release may take, when `left` is the time until the deadline (`None`: unknown).
fn release_budget(left: Option<Duration>) -> Duration {
    left.unwrap_or(RELEASE_MAX).clamp(RELEASE_MIN, RELEASE_MAX)
}

/// Time until `deadline`, zero if past.
fn until(deadline: SystemTime) -> Duration {
    deadline
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
}

impl Proxy {
    /// Takes the lock for one event. True: the runtime gets the event. False: the invocation
    /// was answered here (skipped or failed) and is done.
    pub(super) async fn gate(
        &self,
        id: &str,
        slot: &Arc<Slot>,
        deadline: Option<SystemTime>,
        event: &[u8],
    ) -> bool {
        let span = tracing::Span::current();
        let key = match self.config.key.render_bytes(event) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(error = %e, "cannot derive the lock key; failing the invocation");
                self.metrics.count(Metric::KeyErrors);
                self.answer(
                    id,
                    Some(KEY_ERROR_TYPE),
                    &error_body(KEY_ERROR_TYPE, &e.to_string()),
                )
                .await;
                slot.mark_done();
                return false;
            }
        };
        span.record("key", key.as_str());
        let holder = HolderInfo {
            function: self.config.function_name.clone(),
            request_id: Some(id.to_owned()),
            host: Some(self.host.clone()),
        };
        let opts = self
            .config
            .lock_options(deadline, SystemTime::now(), holder);
        let started = Instant::now();
        // Every decision before the deadline: whatever DynamoDB does (blackholed, refusing,
        // slow), the acquisition ends within the budget. Dropping an acquisition in flight is
        // safe: the lock library removes whatever row it may have written.
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
                self.answer(
                    id,
                    Some(LOCK_ERROR_TYPE),
                    &error_body(LOCK_ERROR_TYPE, &message),
                )
                .await;
                slot.mark_done();
                return false;
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
                slot.hold(Held {
                    guard,
                    watcher,
                    deadline,
                });
                true
            }
            Err(e @ LockError::Busy { .. }) => {
                let held_by = match &e {
                    LockError::Busy {
                        holder: Some(h), ..
                    } => Some((**h).clone()),
                    // Lost the race to enqueue: one more read names the holder for the body,
                    // if the budget allows.
                    _ => {
                        let left =
                            budget.map_or(RELEASE_MAX, |b| b.saturating_sub(started.elapsed()));
                        match tokio::time::timeout(left, self.locker.holder(&key, opts.clock_skew))
                            .await
                        {
                            Ok(Ok(h)) => h,
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "could not read the holder");
                                None
                            }
                            Err(_) => None,
                        }
                    }
                };
                let held_by = held_by.as_ref();
                match self.config.on_busy {
                    OnBusy::Skip => {
                        tracing::info!(reason = %e, "key busy: invocation skipped");
                        self.metrics.count(Metric::Skipped);
                        self.answer(id, None, &skipped_body(&key, held_by)).await;
                    }
                    OnBusy::Error => {
                        tracing::info!(reason = %e, "key busy: invocation failed with {BUSY_ERROR_TYPE}");
                        self.metrics.count(Metric::BusyErrors);
                        self.answer(
                            id,
                            Some(BUSY_ERROR_TYPE),
                            &error_body(BUSY_ERROR_TYPE, &e.to_string()),
                        )
                        .await;
                    }
                }
                slot.mark_done();
                false
            }
            Err(e) => {
                tracing::error!(error = %e, "could not take the lock; failing the invocation");
                self.metrics.count(Metric::LockErrors);
                // The full error is in the log; the caller gets no ARNs or account ids.
                self.answer(
                    id,
                    Some(LOCK_ERROR_TYPE),
                    &error_body(LOCK_ERROR_TYPE, &redact_aws_ids(&e.to_string())),
                )
                .await;
                slot.mark_done();
                false
            }
        }
    }

    /// Releases the lock held by `slot`, if any.
    pub async fn release(&self, slot: &Slot) {
        if let Some(held) = slot.take_held() {
            self.release_held(held).await;
        }
    }

    async fn release_held(&self, held: Held) {
        let Held {
            guard,
            watcher,
            deadline,
        } = held;
        watcher.abort();
        let failures = guard.heartbeat_failures();
        if failures > 0 {
            self.metrics.put(Metric::HeartbeatErrors, failures as f64);
        }
        // Bounded like the acquisition: an unreachable DynamoDB must not hold the invocation
        // open past its deadline. An unfinished release leaves the row to lapse (its lease is
        // capped at the deadline + grace).
        let budget = release_budget(deadline.map(until));
        match tokio::time::timeout(budget, guard.release()).await {
            Ok(Ok(ReleaseOutcome::Released)) => tracing::info!("lock released"),
            Ok(Ok(ReleaseOutcome::Lost)) => {
                tracing::warn!("the lock had already been lost when the invocation ended")
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

    /// Releases every held lock, within `budget` (shutdown).
    pub async fn release_all(&self, budget: Duration) {
        let held = self.invocations.take_all_held();
        let n = held.len();
        let releases = futures::future::join_all(held.into_iter().map(|h| self.release_held(h)));
        let all = async {
            releases.await;
            self.locker.flush().await;
        };
        if tokio::time::timeout(budget, all).await.is_err() {
            tracing::error!(
                held = n,
                budget_ms = budget.as_millis() as u64,
                "shutdown budget spent before every lock was released; they lapse within a lease"
            );
            self.metrics.count(Metric::ReleaseErrors);
        } else if n > 0 {
            tracing::info!(released = n, "released held locks at shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
