//! The crash watch of one invocation: wait until it is finished, or until the runtime process
//! that got its event has died with every process it started (a crash: Lambda then resets the
//! sandbox and kills the extension without a SHUTDOWN).
//!
//! Shared by the INVOKE handler ([`crate::lifecycle`]) and, on Lambda Managed Instances, by the
//! proxy when it hands an event over ([`crate::proxy`]); it knows neither of them: what to do
//! when the runtime is gone (release the lock) is the caller's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::invocations::Slot;
use crate::runtime_process::RuntimeTree;

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

/// Waits until the invocation of `slot` is finished, at most `limit`, checking every 100 ms that
/// its runtime (recorded in the slot when the event is handed over) is alive; processes are
/// read under `proc_root`. A runtime that is not known is never taken for dead.
pub async fn watch(proc_root: &Path, slot: &Slot, limit: Duration) -> WatchEnd {
    let end = tokio::time::Instant::now() + limit;
    let mut tree = None;
    loop {
        let now = tokio::time::Instant::now();
        if now >= end {
            return WatchEnd::TimedOut;
        }
        if slot.wait_done(RUNTIME_CHECK.min(end - now)).await {
            return WatchEnd::Done;
        }
        // The proxy records the runtime when it hands the event over.
        let Some(root) = slot.runtime() else {
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
        if !alive && !slot.is_done() {
            return WatchEnd::RuntimeGone { pid: root.pid };
        }
    }
}
