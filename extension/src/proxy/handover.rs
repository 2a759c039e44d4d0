//! Lambda Managed Instances: which runtime process got an event (several runtime processes
//! share one proxy there), and the crash watch of the invocation it got.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Response;

use super::Proxy;
use crate::body::ProxyBody;
use crate::crash_watch::MAX_INVOCATION;
use crate::invocations::Slot;
use crate::runtime_api::{DEADLINE_HEADER, REQUEST_ID_HEADER};
use crate::runtime_process::Proc;

/// The two ends of a runtime connection.
#[derive(Debug, Clone)]
pub(super) struct Conn {
    /// The runtime side.
    pub(super) peer: SocketAddr,
    /// The proxy side.
    pub(super) local: SocketAddr,
    /// The runtime process on the other end, once found: a keep-alive connection (awslambdaric,
    /// aws-lambda-ric, `lambda_runtime`) is traced once, not at every event.
    pub(super) runtime: Arc<std::sync::OnceLock<Proc>>,
}

impl Proxy {
    /// An event is about to go to the runtime process on `conn` (Managed Instances): note which
    /// process that is, and start the invocation's crash watch, bounded by its deadline.
    pub(super) async fn handed_over(self: &Arc<Self>, resp: &Response<ProxyBody>, conn: Conn) {
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok());
        let Some(id) = header(REQUEST_ID_HEADER).map(str::to_owned) else {
            return;
        };
        let Some(slot) = self.invocations.get(&id) else {
            return;
        };
        let deadline = header(DEADLINE_HEADER)
            .and_then(|v| v.parse::<u64>().ok())
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
        let cached = conn.runtime.get().copied();
        let runtime = match cached {
            Some(p) => Some(p),
            None => {
                let root = self.proc_root.clone();
                let api = format!("127.0.0.1:{}", self.port);
                let (peer, local) = (conn.peer, conn.local);
                let found = tokio::task::spawn_blocking(move || {
                    crate::peer::runtime_of_connection(&root, peer, local, &api)
                })
                .await
                .ok()
                .flatten();
                if let Some(p) = found {
                    let _ = conn.runtime.set(p);
                }
                found
            }
        };
        if runtime.is_none() && !self.runtime_unknown_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                request_id = %id,
                "the runtime process of this connection is not known (not started through \
                 /opt/flightlock-wrapper, or /proc is not readable): if it crashes \
                 mid-invocation its lock is released at SHUTDOWN or when the lease (capped at \
                 the deadline) lapses, not at once"
            );
        }
        tracing::debug!(
            request_id = %id,
            runtime_pid = runtime.map(|p| p.pid),
            cached = cached.is_some(),
            "runtime process of the connection"
        );
        slot.set_runtime(runtime);
        tokio::spawn(watch_handed_over(self.clone(), id, slot, deadline));
    }
}

/// The crash watch of an event the proxy has just handed to a runtime process (Managed
/// Instances): until the invocation is finished or its deadline, release its lock at once if
/// that runtime process dies. The slot is left for the forget sweep, so a late `platform.start`
/// still finds it seen.
async fn watch_handed_over(
    proxy: Arc<Proxy>,
    id: String,
    slot: Arc<Slot>,
    deadline: Option<SystemTime>,
) {
    let left = deadline.map_or(MAX_INVOCATION, |d| {
        d.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    });
    if !proxy.watch_until_done(&slot, &id, left).await {
        tracing::warn!(
            request_id = %id,
            "invocation still unfinished past its deadline; its lock is released at \
             shutdown or lapses at the deadline plus grace"
        );
    }
}
