//! Which runtime process gets an event, so that an invocation whose runtime dies mid-way is
//! released at once: the one runtime process the wrapper exec'd (standard), or the process on
//! the other end of each runtime connection (Lambda Managed Instances, where several runtime
//! processes share one proxy). Finding them is [`runtime`] and [`peer`];
//! this module remembers what was found.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::mode::Mode;
use runtime::Proc;

pub mod peer;
pub mod runtime;

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

/// After a search of `/proc` that found no runtime (standard mode), how long before the next:
/// a search reads every process's `stat` and `environ`, about 3 ms per invocation on a host
/// with 70 processes (measured by `extension_bench`, whose runtime is not wrapped). The runtime
/// asks for its event before it is searched for, so a runtime not found then was not started
/// through the wrapper, and a search at every invocation would not find it either.
pub(super) const SEARCH_AGAIN_AFTER_MISS: Duration = Duration::from_secs(10);

/// What is known of the runtime process (standard mode).
#[derive(Debug, Clone, Copy)]
enum Known {
    /// Not searched for yet.
    Unsearched,
    /// Found (checked alive again before each use).
    Found(Proc),
    /// Searched for at this instant and not found.
    Missed(Instant),
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
    /// The runtime process last found, or when a search last found none (standard mode).
    runtime: Mutex<Known>,
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
            runtime: Mutex::new(Known::Unsearched),
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
    /// can be known; see [`runtime`]. `None` on Managed Instances: there each
    /// connection's is found by [`Processes::of_connection`].
    pub(super) async fn runtime(&self) -> Option<Proc> {
        if self.mode == Mode::ManagedInstances {
            return None;
        }
        let known = *self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        let cached = match known {
            Known::Found(p) => Some(p),
            Known::Missed(at) if at.elapsed() < SEARCH_AGAIN_AFTER_MISS => return None,
            Known::Missed(_) | Known::Unsearched => None,
        };
        let root = self.proc_root.clone();
        let api = format!("127.0.0.1:{}", self.port);
        let found = tokio::task::spawn_blocking(move || match cached {
            Some(p) if runtime::is_alive(&root, p) => Some(p),
            _ => runtime::find_runtime(&root, &api),
        })
        .await
        .ok()
        .flatten();
        *self.runtime.lock().unwrap_or_else(|e| e.into_inner()) = match found {
            Some(p) => Known::Found(p),
            None => Known::Missed(Instant::now()),
        };
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
    /// get invocation `id`, if it can be known; see [`peer`].
    pub(super) async fn of_connection(&self, conn: &Conn, id: &str) -> Option<Proc> {
        let cached = conn.runtime.get().copied();
        let runtime = match cached {
            Some(p) => Some(p),
            None => {
                let root = self.proc_root.clone();
                let api = format!("127.0.0.1:{}", self.port);
                let (peer, local) = (conn.peer, conn.local);
                let found = tokio::task::spawn_blocking(move || {
                    peer::runtime_of_connection(&root, peer, local, &api)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes process `pid` (started at `start`) into the fake `/proc` at `root`, with the
    /// wrapper's marker and pointed at `127.0.0.1:port`.
    fn wrapped_runtime(root: &Path, pid: u32, start: u64, port: u16) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let fields: Vec<String> = (4..=21)
            .map(|n| {
                if n == 4 {
                    "1".to_owned()
                } else {
                    "0".to_owned()
                }
            })
            .collect();
        let stat = format!("{pid} (runtime) S {} {start} 0\n", fields.join(" "));
        std::fs::write(dir.join("stat"), stat).unwrap();
        let environ = format!(
            "{}={pid}\0AWS_LAMBDA_RUNTIME_API=127.0.0.1:{port}\0",
            runtime::PID_MARKER
        );
        std::fs::write(dir.join("environ"), environ).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_runtime_not_found_is_searched_for_again_only_after_a_while() {
        let root = std::env::temp_dir().join(format!("flightlock-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let processes = Processes::new(root.clone(), 9009, Mode::Standard);
        assert_eq!(processes.runtime().await, None, "an empty /proc");
        wrapped_runtime(&root, 4242, 777, 9009);
        let runtime = Some(Proc {
            pid: 4242,
            start: 777,
        });
        assert_eq!(
            runtime::find_runtime(&root, "127.0.0.1:9009"),
            runtime,
            "the fake process is one the search finds"
        );
        // The miss is remembered: no search at every invocation.
        tokio::time::advance(SEARCH_AGAIN_AFTER_MISS - Duration::from_secs(1)).await;
        assert_eq!(processes.runtime().await, None);
        // Then searched for again, found, and kept.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(processes.runtime().await, runtime);
        assert_eq!(processes.runtime().await, runtime);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
