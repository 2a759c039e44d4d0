//! Which runtime process gets an event, so that an invocation whose runtime dies mid-way is
//! released at once: the one runtime process the wrapper exec'd (standard), or the process on
//! the other end of each runtime connection (Lambda Managed Instances, where several runtime
//! processes share one proxy). Finding them is [`crate::runtime_process`] and [`crate::peer`];
//! this module remembers what was found.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::mode::Mode;
use crate::runtime_process::{self, Proc};

/// The two ends of a runtime connection.
#[derive(Debug, Clone)]
pub(super) struct Conn {
    /// The runtime side.
    peer: SocketAddr,
    /// The proxy side.
    local: SocketAddr,
    /// The runtime process on the other end, once found: a keep-alive connection (awslambdaric,
    /// aws-lambda-ric, `lambda_runtime`) is traced once, not at every event.
    runtime: Arc<OnceLock<Proc>>,
}

impl Conn {
    /// A connection from `peer` (the runtime) to `local` (the proxy), its process not found yet.
    pub(super) fn new(peer: SocketAddr, local: SocketAddr) -> Conn {
        Conn {
            peer,
            local,
            runtime: Arc::new(OnceLock::new()),
        }
    }
}

/// The runtime processes found so far, and how to find them.
#[derive(Debug)]
pub(super) struct Processes {
    /// The execution mode: on Managed Instances each connection's runtime process is found
    /// (there are no INVOKE events); otherwise the one runtime process.
    mode: Mode,
    /// The port the wrapper points the runtime at (`FLIGHTLOCK_PROXY_PORT`): how the runtime's
    /// process is told from others (its `AWS_LAMBDA_RUNTIME_API`).
    port: u16,
    /// Where `/proc` is (a seam for tests).
    proc_root: PathBuf,
    /// The runtime process last found (standard mode).
    runtime: Mutex<Option<Proc>>,
    /// Set once "the runtime is not known" has been logged.
    unknown_logged: AtomicBool,
}

impl Processes {
    /// Finds runtime processes in `proc_root` pointed at `port`, as `mode` runs them.
    pub(super) fn new(proc_root: PathBuf, port: u16, mode: Mode) -> Processes {
        Processes {
            mode,
            port,
            proc_root,
            runtime: Mutex::new(None),
            unknown_logged: AtomicBool::new(false),
        }
    }

    /// Sets the port the wrapper points the runtime at.
    pub(super) fn set_port(&mut self, port: u16) {
        self.port = port;
    }

    /// Sets the execution mode.
    pub(super) fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    /// The execution mode.
    pub(super) fn mode(&self) -> Mode {
        self.mode
    }

    /// Where `/proc` is.
    pub(super) fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// The runtime process (the one the wrapper exec'd, pointed at this proxy's port), if it
    /// can be known; see [`runtime_process`]. `None` on Managed Instances: there each
    /// connection's is found by [`Processes::of_connection`].
    pub(super) async fn runtime(&self) -> Option<Proc> {
        if self.mode == Mode::ManagedInstances {
            return None;
        }
        let cached = *self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        let root = self.proc_root.clone();
        let api = format!("127.0.0.1:{}", self.port);
        let found = tokio::task::spawn_blocking(move || match cached {
            Some(p) if runtime_process::is_alive(&root, p) => Some(p),
            _ => runtime_process::find_runtime(&root, &api),
        })
        .await
        .ok()
        .flatten();
        *self.runtime.lock().unwrap_or_else(|e| e.into_inner()) = found;
        if found.is_none() && !self.unknown_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the runtime process is not known (not started through /opt/flightlock-wrapper): \
                 if it crashes mid-invocation its lock is released at SHUTDOWN or when the lease \
                 (capped at the deadline) lapses, not at once"
            );
        }
        found
    }

    /// The runtime process on the other end of `conn` (Managed Instances), which is about to
    /// get invocation `id`, if it can be known; see [`crate::peer`].
    pub(super) async fn of_connection(&self, conn: &Conn, id: &str) -> Option<Proc> {
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
        if runtime.is_none() && !self.unknown_logged.swap(true, Ordering::Relaxed) {
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
        runtime
    }
}
