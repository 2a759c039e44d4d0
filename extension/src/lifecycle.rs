//! The Extensions API side: INVOKE and SHUTDOWN events.
//!
//! Each INVOKE is watched by its own task, and the extension asks for its next event at once:
//! several invocations in flight (Lambda Managed Instances), their unenforced checks and a
//! SHUTDOWN never queue behind one another. The sandbox still never freezes while a lock is
//! held: the proxy returns the runtime's response POST only after the lock is released, so the
//! runtime cannot ask for its next event before that. The watch releases a crashed runtime's
//! lock at once, and an INVOKE whose event never went through the proxy means the wrapper is not
//! configured: the lock is not enforced, which is logged as an error and counted.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lambda_extension::{LambdaEvent, NextEvent};
use tokio::sync::mpsc;

use crate::invocations::Slot;
use crate::metrics::Metric;
use crate::proxy::Proxy;
use crate::runtime_process::RuntimeTree;

/// How long after an INVOKE event the proxy must have fetched the event for the invocation to
/// count as enforced, once a runtime has connected to the proxy. Both are released by Lambda at
/// the same moment; this only absorbs scheduling delays. Before any runtime has connected there
/// is no grace: the invocation is reported unenforced at once.
pub const UNENFORCED_GRACE: Duration = Duration::from_secs(2);

/// Time kept back from the shutdown deadline for the process to exit.
const SHUTDOWN_RESERVE: Duration = Duration::from_millis(200);

/// Handles one Extensions API event. After SHUTDOWN it sends on `shutdown` so `main` can exit.
pub async fn on_event(
    proxy: Arc<Proxy>,
    event: LambdaEvent,
    shutdown: mpsc::Sender<()>,
) -> Result<(), lambda_extension::Error> {
    match event.next {
        NextEvent::Invoke(invoke) => {
            tokio::spawn(watch(proxy, invoke.request_id, invoke.deadline_ms));
            Ok(())
        }
        NextEvent::Shutdown(s) => {
            let budget = until(s.deadline_ms).saturating_sub(SHUTDOWN_RESERVE);
            tracing::info!(reason = %s.shutdown_reason, budget_ms = budget.as_millis() as u64, "shutdown");
            proxy.release_all(budget).await;
            let _ = shutdown.send(()).await;
            Ok(())
        }
    }
}

/// Watches one invocation until it is finished: reports it if it is unenforced, releases its
/// lock if its runtime dies, and forgets it.
async fn watch(proxy: Arc<Proxy>, id: String, deadline_ms: u64) {
    let left = until(deadline_ms);
    let slot = proxy.invocations().slot(&id);
    // No runtime has ever asked the proxy for an event: this one cannot have gone
    // through it either, so say so at once instead of holding the finished invocation
    // open (and billed) for the grace.
    let (grace, reason) = if proxy.runtime_connected() {
        (
            UNENFORCED_GRACE.min(left),
            "the proxy did not see this event in time",
        )
    } else {
        (
            Duration::ZERO,
            "no runtime has ever connected to the flightlock proxy",
        )
    };
    if !slot.wait_seen(grace).await {
        tracing::error!(
            request_id = %id,
            reason,
            "UNENFORCED: this invocation did not go through the flightlock proxy, so it \
             runs WITHOUT the lock; set AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper \
             on the function (OS-only runtimes: see the flightlock docs)"
        );
        proxy.metrics().count(Metric::UnenforcedInvocations);
        proxy.invocations().remove(&id);
        return;
    }
    // At the deadline Lambda ends the invocation itself and resets the sandbox: stop
    // watching then; SHUTDOWN releases the lock. (A response sent at the last moment is
    // still released by the proxy.)
    if wait_done_or_runtime_exit(&proxy, &slot, &id, left).await {
        proxy.invocations().remove(&id);
    } else {
        tracing::warn!(
            request_id = %id,
            "invocation still unfinished past its deadline; its lock is released at \
             shutdown or lapses at the deadline plus grace"
        );
    }
}

/// How often a waiting INVOKE checks that the runtime process is still there.
const RUNTIME_CHECK: Duration = Duration::from_millis(100);

/// Waits until the invocation is finished, at most `limit`. If the runtime that got the event
/// dies first, with every process it started (a crash: Lambda then resets the sandbox and kills
/// us without a SHUTDOWN), releases the lock at once and counts the invocation as finished. A
/// runtime that is not known is never taken for dead.
async fn wait_done_or_runtime_exit(proxy: &Proxy, slot: &Slot, id: &str, limit: Duration) -> bool {
    let end = tokio::time::Instant::now() + limit;
    let mut tree = None;
    loop {
        let now = tokio::time::Instant::now();
        if now >= end {
            return false;
        }
        if slot.wait_done(RUNTIME_CHECK.min(end - now)).await {
            return true;
        }
        // The proxy records the runtime when it hands the event over.
        let Some(root) = slot.runtime() else {
            continue;
        };
        let mut t = tree.take().unwrap_or_else(|| RuntimeTree::new(root));
        let proc_root = proxy.proc_root().to_owned();
        let Ok((t, alive)) = tokio::task::spawn_blocking(move || {
            let alive = t.alive(&proc_root);
            (t, alive)
        })
        .await
        else {
            continue;
        };
        tree = Some(t);
        if !alive && !slot.is_done() {
            tracing::warn!(
                request_id = %id,
                runtime_pid = root.pid,
                "the runtime exited in the middle of the invocation (its whole process tree is \
                 gone); releasing its lock now"
            );
            proxy.release(slot).await;
            slot.mark_done();
            return true;
        }
    }
}

/// Time left until `deadline_ms` (epoch ms), zero if past.
fn until(deadline_ms: u64) -> Duration {
    (UNIX_EPOCH + Duration::from_millis(deadline_ms))
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
}
