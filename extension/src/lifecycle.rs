//! The Extensions API side: INVOKE and SHUTDOWN events, and the watches of invocations.
//!
//! Standard mode: each INVOKE is watched by its own task, and the extension asks for its next
//! event at once: a later INVOKE, its unenforced check and a SHUTDOWN never queue behind an
//! unfinished invocation. The sandbox still never freezes while a lock is held: the proxy
//! returns the runtime's response POST only after the lock is released, so the runtime cannot
//! ask for its next event before that. The watch releases a crashed runtime's lock at once, and
//! an INVOKE whose event never went through the proxy means the wrapper is not configured: the
//! lock is not enforced, which is logged as an error and counted.
//!
//! Lambda Managed Instances (no INVOKE events): the proxy starts the same crash watch
//! ([`crate::invocations::Slot::watch`]) itself when it hands an event to a runtime process, and the
//! Telemetry API's `platform.start` drives the unenforced check ([`check_enforced`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lambda_extension::NextEvent;

use crate::invocations::Slot;
use crate::proxy::Proxy;
use flightlock_lambda::metrics::Metric;

/// How long after an INVOKE event (or a `platform.start`) the proxy must have fetched the event
/// for the invocation to count as enforced, once a runtime has connected to the proxy. Both are
/// released by Lambda at the same moment; this only absorbs scheduling delays. Before any
/// runtime has connected there is no grace: the invocation is reported unenforced at once.
pub const UNENFORCED_GRACE: Duration = Duration::from_secs(2);

/// Time kept back from the shutdown deadline for the process to exit.
const SHUTDOWN_RESERVE: Duration = Duration::from_millis(200);

/// Handles one Extensions API event. True after SHUTDOWN was handled: the extension exits.
pub async fn on_event(proxy: Arc<Proxy>, event: NextEvent) -> bool {
    match event {
        NextEvent::Invoke(invoke) => {
            tokio::spawn(watch(proxy, invoke.request_id, invoke.deadline_ms));
            false
        }
        NextEvent::Shutdown(s) => {
            let budget = until(s.deadline_ms).saturating_sub(SHUTDOWN_RESERVE);
            tracing::info!(reason = %s.shutdown_reason, budget_ms = budget.as_millis() as u64, "shutdown");
            proxy.release_all(budget).await;
            true
        }
    }
}

/// Waits up to the grace for the proxy to see invocation `id`; if it does not, reports the
/// invocation as unenforced, forgets it and returns false.
async fn enforced(proxy: &Proxy, slot: &Arc<Slot>, id: &str, left: Duration) -> bool {
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
    if slot.wait_seen(grace).await {
        return true;
    }
    tracing::error!(
        request_id = %id,
        reason,
        "UNENFORCED: this invocation did not go through the flightlock proxy, so it \
         runs WITHOUT the lock; set AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper \
         on the function (OS-only runtimes: see the flightlock docs)"
    );
    proxy.metrics().count(Metric::UnenforcedInvocations);
    proxy.invocations().remove(id, slot);
    false
}

/// The unenforced check of one `platform.start` (Managed Instances). A slot the proxy saw is
/// left alone: the proxy's own watch owns it.
pub async fn check_enforced(proxy: Arc<Proxy>, id: String) {
    let slot = proxy.invocations().slot(&id);
    enforced(&proxy, &slot, &id, UNENFORCED_GRACE).await;
}

/// Watches one invocation until it is finished: reports it if it is unenforced, releases its
/// lock if its runtime dies, and forgets it.
async fn watch(proxy: Arc<Proxy>, id: String, deadline_ms: u64) {
    let left = until(deadline_ms);
    let slot = proxy.invocations().slot(&id);
    if !enforced(&proxy, &slot, &id, left).await {
        return;
    }
    // At the deadline Lambda ends the invocation itself and resets the sandbox: stop
    // watching then; SHUTDOWN releases the lock. (A response sent at the last moment is
    // still released by the proxy.)
    if proxy.watch_until_done(&slot, &id, left).await {
        proxy.invocations().remove(&id, &slot);
    } else {
        tracing::warn!(
            request_id = %id,
            "invocation still unfinished past its deadline; its lock is released at \
             shutdown or lapses at the deadline plus grace"
        );
    }
}

/// Time left until `deadline_ms` (epoch ms), zero if past.
fn until(deadline_ms: u64) -> Duration {
    (UNIX_EPOCH + Duration::from_millis(deadline_ms))
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
}
