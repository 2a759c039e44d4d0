//! Admitting one event: deciding it through the shared [`flightlock_lambda::gate::Gate`],
//! answering upstream what it decided (skipped or failed), and releasing what it acquired.

use super::*;
use crate::crash_watch::{self, WatchEnd};
use crate::otel::spans::{self, HoldEnd, WaitEnd};
use crate::otel::xray::TraceParent;
use crate::otel::HoldTrace;
use flightlock_lambda::client_context::Handover;
use flightlock_lambda::gate::{Held, Outcome, Run};
use std::time::Instant;

impl Proxy {
    /// Takes the lock for one event. `Some`: the runtime gets the event, and its handler this
    /// (see [`super::context`]). `None`: the invocation was answered here (skipped or failed)
    /// and is done. With `trace` (a sampled trace, OTLP export on), the wait's span is queued
    /// once the decision is answered, and an acquired lock's hold is traced until its release.
    pub(super) async fn admit(
        &self,
        id: &str,
        slot: &Arc<Slot>,
        deadline: Option<SystemTime>,
        event: &[u8],
        tenant: Option<&str>,
        trace: Option<TraceParent>,
    ) -> Option<Handover> {
        // Untraced, nothing more than this check.
        let started = trace.map(|parent| (parent, SystemTime::now()));
        let outcome = self
            .current_gate()
            .decide(id, deadline, event, tenant)
            .await;
        let traced = started.map(|(parent, start)| (parent, start, SystemTime::now()));
        match outcome {
            Outcome::Acquired(held) => {
                let handover = held.handover();
                if let Some(traced) = traced {
                    self.trace_acquired(slot, &held, &handover, id, traced);
                }
                slot.hold(held);
                Some(handover)
            }
            Outcome::Skipped(body) => {
                self.answer(id, None, &body).await;
                // The span is queued after the answer, before the invocation counts as done.
                if let Some((parent, start, decided)) = traced {
                    let reason = body["flightlock"]["reason"]
                        .as_str()
                        .unwrap_or("unknown")
                        .to_owned();
                    let key = body["flightlock"]["key"].as_str().map(spans::key_hash);
                    let inv = self.traced(id, parent, key, event, tenant);
                    self.trace_wait(&inv, start, decided, &WaitEnd::Skipped { reason });
                }
                slot.mark_done();
                None
            }
            Outcome::Failed {
                error_type,
                message,
            } => {
                let body = flightlock_lambda::body::error_body(error_type, &message);
                self.answer(id, Some(error_type), &body).await;
                if let Some((parent, start, decided)) = traced {
                    let key = self
                        .config
                        .key
                        .render_invocation(event, tenant)
                        .ok()
                        .map(|k| spans::key_hash(&k));
                    let inv = self.traced(id, parent, key, event, tenant);
                    let error_type = error_type.to_owned();
                    self.trace_wait(&inv, start, decided, &WaitEnd::Failed { error_type });
                }
                slot.mark_done();
                None
            }
        }
    }

    /// What the spans of an invocation that was not run share (its tick rendered again from
    /// the event; it was only just rendered by the gate).
    fn traced(
        &self,
        id: &str,
        parent: TraceParent,
        key_hash: Option<String>,
        event: &[u8],
        tenant: Option<&str>,
    ) -> spans::Invocation {
        spans::Invocation {
            parent,
            request_id: id.to_owned(),
            key_hash,
            tick: self.config.tick.tick(event, tenant).ok().flatten(),
        }
    }

    /// Queues the span of a wait (OTLP export on).
    fn trace_wait(
        &self,
        inv: &spans::Invocation,
        start: SystemTime,
        end: SystemTime,
        how: &WaitEnd,
    ) {
        if let Some(traces) = &self.traces {
            traces.record(spans::wait_span(inv, traces.scope(), start, end, how));
        }
    }

    /// Queues the span of a wait that took the lock (`traced`: the trace, when the decision
    /// started and when it ended), and starts tracing its hold.
    fn trace_acquired(
        &self,
        slot: &Slot,
        held: &Held,
        handover: &Handover,
        id: &str,
        (parent, start, decided): (TraceParent, SystemTime, SystemTime),
    ) {
        let inv = spans::Invocation {
            parent,
            request_id: id.to_owned(),
            key_hash: Some(spans::key_hash(&handover.key)),
            tick: held.tick().cloned(),
        };
        let ticket = handover.ticket;
        self.trace_wait(&inv, start, decided, &WaitEnd::Acquired { ticket });
        slot.set_hold_trace(HoldTrace {
            inv,
            ticket,
            start: decided,
        });
    }

    /// Queues the span of a hold that ended as `how` (OTLP export on).
    fn trace_hold(&self, trace: Option<HoldTrace>, how: HoldEnd) {
        if let (Some(traces), Some(t)) = (&self.traces, trace) {
            let end = SystemTime::now();
            traces.record(spans::hold_span(
                &t.inv,
                traces.scope(),
                t.ticket,
                t.start,
                end,
                how,
            ));
        }
    }

    /// Releases the locks of `slot` after a run that ended as `run`: the gate's lock, if any (a
    /// succeeded run marks its tick done), and every lock its handler took through the lock API
    /// (the invocation ended: none outlives it).
    pub async fn release(&self, slot: &Slot, run: Run) {
        let _in_flight = Releasing::start(&self.releasing);
        let records = async {
            match slot.records() {
                Some(records) => records.close().await,
                None => 0,
            }
        };
        let gated = self.release_gated(slot, run);
        futures::future::join(records, gated).await;
    }

    /// Releases the gate's lock held by `slot`, if any.
    async fn release_gated(&self, slot: &Slot, run: Run) {
        if let Some(held) = slot.take_held() {
            let trace = slot.take_hold_trace();
            let how = match run {
                _ if trace.is_some() && held.is_lost() => HoldEnd::Lost,
                Run::Succeeded => HoldEnd::Ran,
                Run::Failed => HoldEnd::Failed,
            };
            self.current_gate().release(held, run).await;
            self.trace_hold(trace, how);
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
    /// so their ticks stay for the retries. Then sends the queued spans (OTLP export on) with
    /// what is left of `budget`.
    pub async fn release_all(&self, budget: Duration) {
        let started = Instant::now();
        let held = self.invocations.take_all_held_traced();
        let n = held.len();
        let gate = self.current_gate();
        let releases = futures::future::join_all(held.into_iter().map(|(h, trace)| {
            let how = if trace.is_some() && h.is_lost() {
                HoldEnd::Lost
            } else {
                HoldEnd::Shutdown
            };
            let gate = &gate;
            async move {
                gate.release(h, Run::Failed).await;
                self.trace_hold(trace, how);
            }
        }));
        // And every lock a handler took through the lock API: its invocation never answered.
        let slots = self.invocations.all();
        let records = futures::future::join_all(
            slots
                .iter()
                .filter_map(|s| s.records())
                .map(|records| async move { records.close().await }),
        );
        let all = async {
            let (_, records) = futures::future::join(releases, records).await;
            let records: usize = records.into_iter().sum();
            if records > 0 {
                tracing::info!(
                    released = records,
                    "released the lock API's locks at shutdown"
                );
            }
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
        if let Some(traces) = &self.traces {
            traces.flush(budget.saturating_sub(started.elapsed())).await;
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
