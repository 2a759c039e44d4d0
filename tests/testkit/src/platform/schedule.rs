//! The double's background rules: the freeze (standard, SnapStart), timeouts and SHUTDOWN.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::{now_ms, signal_groups, Mode, Outcome, Shared};

/// Sends SHUTDOWN (reason, 2 s deadline) to every extension registered for it, thawing the
/// sandbox first.
pub(super) fn shutdown(shared: &Shared, reason: &str) {
    let mut s = shared.lock();
    s.shut_down = true;
    s.frozen = false;
    signal_groups(&s.freeze_groups, Signal::SIGCONT);
    let event = serde_json::json!({
        "eventType": "SHUTDOWN",
        "shutdownReason": reason,
        "deadlineMs": now_ms() + 2000,
    });
    for e in s
        .exts
        .iter_mut()
        .filter(|e| e.events.iter().any(|v| v == "SHUTDOWN"))
    {
        e.queue.push_back(event.clone());
    }
    drop(s);
    shared.touch();
}

/// Runs the freeze and timeout rules until the double is dropped.
pub(super) async fn schedule(shared: Arc<Shared>) {
    loop {
        let changed = shared.changed.notified();
        // The decision and the SIGSTOP happen under one lock: nothing can be dispatched between
        // "everyone waits in /next" and the freeze.
        let (froze, expired, next_deadline) = {
            let mut s = shared.lock();
            let standard = !matches!(shared.options.mode, Mode::ManagedInstances { .. });
            let freeze = standard
                && !s.frozen
                && !s.shut_down
                && s.running.is_empty()
                && s.queue.is_empty()
                && s.runtime_waiting > 0
                && !s.exts.is_empty()
                && s.exts.iter().all(|e| e.waiting && e.queue.is_empty())
                && !s.freeze_groups.is_empty();
            if freeze {
                s.frozen = true;
                s.freezes += 1;
                signal_groups(&s.freeze_groups, Signal::SIGSTOP);
            }
            let now = now_ms();
            let expired: Vec<String> = s
                .running
                .values()
                .filter(|i| i.deadline_ms <= now)
                .map(|i| i.id.clone())
                .collect();
            let next = s.running.values().map(|i| i.deadline_ms).min();
            (freeze, expired, next)
        };
        if froze {
            shared.touch();
            continue;
        }
        for id in expired {
            let standard = !matches!(shared.options.mode, Mode::ManagedInstances { .. });
            let group = {
                let mut s = shared.lock();
                s.running.remove(&id);
                s.outcomes.insert(id.clone(), Outcome::TimedOut);
                s.runtime_group
            };
            if standard {
                // The runtime is stopped first, then the extensions hear SHUTDOWN.
                if let Some(g) = group {
                    signal_groups(&[g], Signal::SIGKILL);
                }
                shutdown(&shared, "timeout");
            }
            shared.touch();
        }
        let sleep = next_deadline.map_or(Duration::from_secs(3600), |d| {
            Duration::from_millis(d.saturating_sub(now_ms()).max(1))
        });
        let _ = tokio::time::timeout(sleep, changed).await;
    }
}
