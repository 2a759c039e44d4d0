//! The invocations in flight in this environment, by request id.
//!
//! Two parties meet here: the proxy (which sees an event when the runtime fetches it, holds its
//! lock and finishes it) and the extension's INVOKE handler (which must not report itself done
//! before the invocation is finished and its lock released, and which detects invocations that
//! never went through the proxy). Whichever arrives first creates the slot; the INVOKE handler
//! removes it.
//!
//! **A slot is one delivery, not one request id.** Lambda retries an asynchronous invocation
//! with the same request id (after about 1 and 2 minutes), so a request id can come again after
//! its first delivery ended. The proxy sees every delivery (one event per `GET next`) and starts
//! each in a fresh slot ([`Invocations::delivery`]): its own crash watch, its own record locks,
//! nothing of the ended one. The INVOKE handler and the Telemetry API's `platform.start` only
//! learn a request id ([`Invocations::slot`]): they join the delivery the proxy started, and
//! take a slot that ended more than [`EARLIER_DELIVERY`] ago for an earlier delivery's.
//!
//! The crash watch of an invocation is its slot's too ([`Slot::watch`]): it waits until the
//! invocation is finished or the runtime process that got its event has died with every process
//! it started (a crash: Lambda then resets the sandbox and kills the extension without a
//! SHUTDOWN), so the caller can release the lock at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::otel::HoldTrace;
use crate::processes::runtime::{Proc, RuntimeTree};
use flightlock_lambda::records::Records;

/// Finished slots that nobody collected are dropped after this long (bounds memory if an INVOKE
/// event is ever missed). On Managed Instances nobody collects them (no INVOKE events): see
/// [`Invocations::forgetting_after`].
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// A slot that ended this long before the INVOKE event or `platform.start` of its request id
/// came is an earlier delivery's: the platform's events of one delivery come within a few
/// seconds of its event (at most [`crate::lifecycle::UNENFORCED_GRACE`] apart), and Lambda
/// retries an invocation a minute or more after it ended.
pub const EARLIER_DELIVERY: Duration = Duration::from_secs(20);

/// A held lock of one invocation (heartbeating until the gate releases it).
pub use flightlock_lambda::gate::Held;

/// One invocation.
#[derive(Debug)]
pub struct Slot {
    created: Instant,
    seen: watch::Sender<bool>,
    /// Set when the event went to the runtime: from then until done, the handler may call the
    /// lock API for this invocation.
    handed_over: std::sync::atomic::AtomicBool,
    done: watch::Sender<bool>,
    /// When it was marked done (tokio's clock, which tests can pause and advance).
    ended: std::sync::OnceLock<tokio::time::Instant>,
    /// The locks its handler takes through the lock API, from when its event went to the
    /// runtime.
    records: Mutex<Option<Arc<Records>>>,
    held: Mutex<Option<Held>>,
    runtime: Mutex<Option<Proc>>,
    /// The hold's OTLP span in the making (OTLP export on, sampled trace, lock held).
    hold_trace: Mutex<Option<HoldTrace>>,
    /// The invocation's tracing span (request id, key, ticket, wait time).
    pub span: Mutex<tracing::Span>,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            created: Instant::now(),
            seen: watch::channel(false).0,
            handed_over: std::sync::atomic::AtomicBool::new(false),
            done: watch::channel(false).0,
            ended: std::sync::OnceLock::new(),
            records: Mutex::new(None),
            held: Mutex::new(None),
            runtime: Mutex::new(None),
            hold_trace: Mutex::new(None),
            span: Mutex::new(tracing::Span::none()),
        }
    }

    fn lock_held(&self) -> MutexGuard<'_, Option<Held>> {
        // A poisoned lock only means another task panicked while holding it; the data (an
        // Option) is still consistent.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the event as fetched through the proxy.
    pub fn mark_seen(&self) {
        self.seen.send_replace(true);
    }

    /// Marks the event as handed to the runtime; its handler takes locks through `records`.
    pub fn mark_handed_over(&self, records: Records) {
        *self.records.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(records));
        self.handed_over
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// True once the event went to the runtime.
    pub fn handed_over(&self) -> bool {
        self.handed_over.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The locks its handler takes through the lock API (`None` before its event went to the
    /// runtime).
    pub fn records(&self) -> Option<Arc<Records>> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Marks the invocation finished (answered and released).
    pub fn mark_done(&self) {
        let _ = self.ended.set(tokio::time::Instant::now());
        self.done.send_replace(true);
    }

    /// True once the proxy has seen its event.
    pub fn is_seen(&self) -> bool {
        *self.seen.borrow()
    }

    /// True if it ended more than `ago` ago.
    fn ended_before(&self, ago: Duration) -> bool {
        self.ended.get().is_some_and(|at| at.elapsed() > ago)
    }

    /// True once finished.
    pub fn is_done(&self) -> bool {
        *self.done.borrow()
    }

    /// Stores the held lock.
    pub fn hold(&self, held: Held) {
        *self.lock_held() = Some(held);
    }

    /// Takes the held lock, if any.
    pub fn take_held(&self) -> Option<Held> {
        self.lock_held().take()
    }

    /// The key of the lock the gate took for it, while held.
    pub fn held_key(&self) -> Option<String> {
        self.lock_held().as_ref().map(|h| h.key().to_owned())
    }

    /// True if the held lock is known lost (a heartbeat found it gone or taken over).
    pub fn lock_lost(&self) -> bool {
        self.lock_held().as_ref().is_some_and(Held::is_lost)
    }

    /// Starts tracing the hold (see [`crate::otel`]).
    pub fn set_hold_trace(&self, trace: HoldTrace) {
        *self.hold_trace.lock().unwrap_or_else(|e| e.into_inner()) = Some(trace);
    }

    /// Takes the hold's trace, if it is traced.
    pub fn take_hold_trace(&self) -> Option<HoldTrace> {
        self.hold_trace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Records the runtime process that received the event (the root of its process tree).
    pub fn set_runtime(&self, runtime: Option<Proc>) {
        *self.runtime.lock().unwrap_or_else(|e| e.into_inner()) = runtime;
    }

    /// The runtime process that received the event (`None`: unknown).
    pub fn runtime(&self) -> Option<Proc> {
        *self.runtime.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The span (a clone).
    pub fn span(&self) -> tracing::Span {
        self.span.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets the span.
    pub fn set_span(&self, span: tracing::Span) {
        *self.span.lock().unwrap_or_else(|e| e.into_inner()) = span;
    }

    /// Waits until the proxy has seen the event, at most `limit`. True if seen.
    pub async fn wait_seen(&self, limit: Duration) -> bool {
        let mut rx = self.seen.subscribe();
        let seen = tokio::time::timeout(limit, rx.wait_for(|s| *s))
            .await
            .is_ok_and(|r| r.is_ok());
        seen
    }

    /// Waits until the invocation is finished, at most `limit`. True if finished.
    pub async fn wait_done(&self, limit: Duration) -> bool {
        let mut rx = self.done.subscribe();
        let done = tokio::time::timeout(limit, rx.wait_for(|d| *d))
            .await
            .is_ok_and(|r| r.is_ok());
        done
    }
}

/// All slots.
#[derive(Debug)]
pub struct Invocations {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    forget_after: Duration,
}

impl Default for Invocations {
    fn default() -> Invocations {
        Invocations::forgetting_after(FORGET_AFTER)
    }
}

impl Invocations {
    /// Slots whose invocation is finished are dropped `after` this long (when a new slot is
    /// made).
    pub fn forgetting_after(after: Duration) -> Invocations {
        Invocations {
            slots: Mutex::new(HashMap::new()),
            forget_after: after,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot of the current delivery of `id` (the INVOKE handler, `platform.start`): the one
    /// the proxy started, or a new one the proxy will join; a slot that ended more than
    /// [`EARLIER_DELIVERY`] ago is an earlier delivery's and is replaced.
    pub fn slot(&self, id: &str) -> Arc<Slot> {
        let mut slots = self.lock();
        match slots.get(id) {
            Some(s) if !s.ended_before(EARLIER_DELIVERY) => s.clone(),
            _ => self.insert_new(&mut slots, id),
        }
    }

    /// The slot of a delivery of `id` the proxy has just fetched: the one the INVOKE handler
    /// made for it (not seen by the proxy yet), else a new one. A slot the proxy saw before is
    /// an earlier delivery's (a retry with the same request id) and is replaced: the new
    /// delivery gets its own crash watch and record locks.
    pub fn delivery(&self, id: &str) -> Arc<Slot> {
        let mut slots = self.lock();
        match slots.get(id) {
            Some(s) if !s.is_seen() => s.clone(),
            _ => self.insert_new(&mut slots, id),
        }
    }

    fn insert_new(&self, slots: &mut HashMap<String, Arc<Slot>>, id: &str) -> Arc<Slot> {
        let forget = self.forget_after;
        slots.retain(|_, s| !(s.is_done() && s.created.elapsed() > forget));
        let s = Arc::new(Slot::new());
        slots.insert(id.to_owned(), s.clone());
        s
    }

    /// The slot of the latest delivery of `id`, if there is one.
    pub fn get(&self, id: &str) -> Option<Arc<Slot>> {
        self.lock().get(id).cloned()
    }

    /// Forgets `slot`, the slot of `id`, unless a later delivery of `id` has replaced it.
    pub fn remove(&self, id: &str, slot: &Arc<Slot>) {
        let mut slots = self.lock();
        if slots.get(id).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.remove(id);
        }
    }

    /// Every slot (for shutdown).
    pub fn all(&self) -> Vec<Arc<Slot>> {
        self.lock().values().cloned().collect()
    }

    /// Takes every held lock with its hold's trace, if traced (for shutdown).
    pub fn take_all_held_traced(&self) -> Vec<(Held, Option<HoldTrace>)> {
        self.lock()
            .values()
            .filter_map(|s| s.take_held().map(|h| (h, s.take_hold_trace())))
            .collect()
    }

    /// Number of slots (for tests).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True if there are no slots.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The longest a Lambda invocation can run (15 min): the bound of a watch whose event carried
/// no deadline.
pub const MAX_INVOCATION: Duration = Duration::from_secs(900);

/// How often a watch checks that the runtime process is still there.
const RUNTIME_CHECK: Duration = Duration::from_millis(100);

/// How a watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// The invocation was finished (answered and released).
    Done,
    /// The runtime that got the event is gone, with its whole process tree, and the invocation
    /// is not finished: its lock is to be released now.
    RuntimeGone {
        /// The pid of the runtime process (the root of the tree).
        pid: u32,
    },
    /// The limit passed with the invocation unfinished.
    TimedOut,
}

impl Slot {
    /// The crash watch: waits until this invocation is finished, at most `limit`, checking every
    /// 100 ms that its runtime (recorded when the event is handed over) is alive; processes are
    /// read under `proc_root`. A runtime that is not known is never taken for dead.
    ///
    /// Used by the INVOKE handler ([`crate::lifecycle`]) and, on Lambda Managed Instances, by the
    /// proxy when it hands an event over; what to do when the runtime is gone (release the lock)
    /// is the caller's.
    pub async fn watch(&self, proc_root: &Path, limit: Duration) -> WatchEnd {
        let end = tokio::time::Instant::now() + limit;
        let mut tree = None;
        loop {
            let now = tokio::time::Instant::now();
            if now >= end {
                return WatchEnd::TimedOut;
            }
            if self.wait_done(RUNTIME_CHECK.min(end - now)).await {
                return WatchEnd::Done;
            }
            // The proxy records the runtime when it hands the event over.
            let Some(root) = self.runtime() else {
                continue;
            };
            let mut t = tree.take().unwrap_or_else(|| RuntimeTree::new(root));
            let proc_root: PathBuf = proc_root.to_owned();
            let Ok((t, alive)) = tokio::task::spawn_blocking(move || {
                let alive = t.alive(&proc_root);
                (t, alive)
            })
            .await
            else {
                continue;
            };
            tree = Some(t);
            if !alive && !self.is_done() {
                return WatchEnd::RuntimeGone { pid: root.pid };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn seen_and_done_are_awaitable_from_either_side() {
        let inv = Invocations::default();
        let s = inv.slot("r1");
        assert!(Arc::ptr_eq(&s, &inv.slot("r1")));
        assert!(!s.wait_seen(Duration::from_secs(2)).await);
        let s2 = s.clone();
        let t = tokio::spawn(async move { s2.wait_done(Duration::from_secs(60)).await });
        s.mark_seen();
        assert!(s.wait_seen(Duration::from_secs(2)).await);
        s.mark_done();
        assert!(t.await.unwrap());
        inv.remove("r1", &s);
        assert!(inv.is_empty());
        assert!(inv.get("r1").is_none());
    }

    #[tokio::test]
    async fn a_retried_request_id_is_a_new_delivery_with_a_slot_of_its_own() {
        let inv = Invocations::default();
        // The first delivery: the INVOKE handler's slot, joined by the proxy.
        let first = inv.slot("r1");
        assert!(Arc::ptr_eq(&first, &inv.delivery("r1")));
        first.mark_seen();
        first.mark_done();
        // An INVOKE event handled late for that same delivery still joins it.
        assert!(Arc::ptr_eq(&first, &inv.slot("r1")));
        // Lambda retries it with the same request id: the proxy starts a fresh slot.
        let retry = inv.delivery("r1");
        assert!(!Arc::ptr_eq(&first, &retry));
        assert!(!retry.is_done() && !retry.is_seen() && retry.records().is_none());
        assert!(Arc::ptr_eq(&retry, &inv.get("r1").unwrap()));
        // The first delivery's watch ends: it forgets its own slot, not the retry's.
        inv.remove("r1", &first);
        assert!(Arc::ptr_eq(&retry, &inv.get("r1").unwrap()));
        inv.remove("r1", &retry);
        assert!(inv.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_platform_event_long_after_an_end_starts_a_new_delivery() {
        let inv = Invocations::default();
        let first = inv.delivery("r1");
        first.mark_seen();
        first.mark_done();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(Arc::ptr_eq(&first, &inv.slot("r1")), "the same delivery");
        tokio::time::advance(EARLIER_DELIVERY).await;
        let retry = inv.slot("r1");
        assert!(!Arc::ptr_eq(&first, &retry), "an earlier delivery's slot");
        assert!(!retry.is_seen() && !retry.is_done());
        // The proxy then joins the slot the INVOKE handler made for the retry.
        assert!(Arc::ptr_eq(&retry, &inv.delivery("r1")));
    }
}
