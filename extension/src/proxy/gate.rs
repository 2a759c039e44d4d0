//! Gating one event through the shared [`flightlock::lambda::gate::Gate`] and answering upstream what
//! it decided; releasing.

use super::*;
use crate::crash_watch::{self, WatchEnd};
use flightlock::lambda::client_context::Handover;
use flightlock::lambda::gate::{Outcome, Run};

impl Proxy {
    /// Takes the lock for one event. `Some`: the runtime gets the event, and its handler this
    /// (see [`super::context`]). `None`: the invocation was answered here (skipped or failed)
    /// and is done.
    pub(super) async fn gate(
        &self,
        id: &str,
        slot: &Arc<Slot>,
        deadline: Option<SystemTime>,
        event: &[u8],
        tenant: Option<&str>,
    ) -> Option<Handover> {
        match self
            .current_gate()
            .decide(id, deadline, event, tenant)
            .await
        {
            Outcome::Acquired(held) => {
                let handover = held.handover();
                slot.hold(held);
                Some(handover)
            }
            Outcome::Skipped(body) => {
                self.answer(id, None, &body).await;
                slot.mark_done();
                None
            }
            Outcome::Failed {
                error_type,
                message,
            } => {
                let body = flightlock::lambda::body::error_body(error_type, &message);
                self.answer(id, Some(error_type), &body).await;
                slot.mark_done();
                None
            }
        }
    }

    /// Releases the lock held by `slot`, if any, after a run that ended as `run` (a succeeded
    /// run marks its tick done).
    pub async fn release(&self, slot: &Slot, run: Run) {
        if let Some(held) = slot.take_held() {
            let _in_flight = Releasing::start(&self.releasing);
            self.current_gate().release(held, run).await;
        }
    }

    /// Waits until the invocation of `slot` is finished, at most `limit` (see
    /// [`crate::crash_watch`]). If the runtime that got the event dies first, with every
    /// process it started, releases the lock at once (the run failed: its tick stays for the
    /// retries) and counts the invocation as finished. False: `limit` passed first.
    pub async fn watch_until_done(&self, slot: &Slot, id: &str, limit: Duration) -> bool {
        match crash_watch::watch(&self.proc_root, slot, limit).await {
            WatchEnd::Done => true,
            WatchEnd::TimedOut => false,
            WatchEnd::RuntimeGone { pid } => {
                tracing::warn!(
                    request_id = %id,
                    runtime_pid = pid,
                    "the runtime exited in the middle of the invocation (its whole process tree \
                     is gone); releasing its lock now"
                );
                self.release(slot, Run::Failed).await;
                slot.mark_done();
                true
            }
        }
    }

    /// Releases every held lock, within `budget` (shutdown). Their runs never answered: failed,
    /// so their ticks stay for the retries.
    pub async fn release_all(&self, budget: Duration) {
        let held = self.invocations.take_all_held();
        let n = held.len();
        let gate = self.current_gate();
        let releases =
            futures::future::join_all(held.into_iter().map(|h| gate.release(h, Run::Failed)));
        let all = async {
            releases.await;
            // Releases already under way elsewhere (the watch of a runtime that died just
            // before SHUTDOWN) finish too: exiting now would drop their delete.
            let _ = self.releasing.subscribe().wait_for(|n| *n == 0).await;
            gate.locker().flush().await;
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

/// One release in flight, counted until it ends (or its future is dropped).
struct Releasing<'a>(&'a tokio::sync::watch::Sender<usize>);

impl<'a> Releasing<'a> {
    fn start(count: &'a tokio::sync::watch::Sender<usize>) -> Releasing<'a> {
        count.send_modify(|n| *n += 1);
        Releasing(count)
    }
}

impl Drop for Releasing<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}
