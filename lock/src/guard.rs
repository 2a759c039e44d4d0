//! The grant: a guard that carries the fencing token and the lost signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Clock;
use crate::error::Error;
use crate::membership::{current, LostReason, Membership, RowState};
use crate::memory::{Hint, Memory};
use crate::storage::Owned;
use crate::tick::Tick;

/// A held lock. It heartbeats in the background until [`LockGuard::release`] (or drop, which
/// releases in the background).
///
/// Pass [`LockGuard::token`] along with every write the critical section makes to another system,
/// and have that system reject tokens lower than the highest it has seen: a holder that was
/// paused past its lease then cannot overwrite the work of the next holder.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    membership: Option<Membership>,
    waited: Duration,
    granted_at: tokio::time::Instant,
    /// The key was not free at our enqueue: we queued behind others (and others likely queued
    /// behind us), so our release leaves no hint.
    contended: bool,
    memory: Arc<Memory>,
    /// The run's tick ([`crate::LockOptions::tick`]) and how long a done id is kept (boxed: a
    /// guard is moved around in outcome enums, and most have no tick).
    tick: Option<Box<(Tick, Duration)>>,
}

/// What [`LockGuard::release`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ReleaseOutcome {
    /// Our row was still ours and is now deleted.
    Released,
    /// The lock had already been lost (the lost signal fired, or the row was no longer ours).
    Lost,
}

impl LockGuard {
    pub(crate) fn new(
        membership: Membership,
        waited: Duration,
        granted_at: tokio::time::Instant,
        contended: bool,
        memory: Arc<Memory>,
        tick: Option<Box<(Tick, Duration)>>,
    ) -> Self {
        memory.holding(&membership.key, membership.ticket);
        LockGuard {
            membership: Some(membership),
            waited,
            granted_at,
            contended,
            memory,
            tick,
        }
    }

    fn m(&self) -> &Membership {
        // `membership` is only taken by `release`, which consumes the guard.
        self.membership
            .as_ref()
            .unwrap_or_else(|| unreachable!("guard used after release"))
    }

    /// The fencing token: the ticket, strictly increasing per key for the life of the table.
    pub fn token(&self) -> u64 {
        self.m().ticket
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.m().key
    }

    /// This acquisition's unique id (the row's `owner`).
    pub fn owner(&self) -> &str {
        &self.m().owner
    }

    /// How long the acquisition waited.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Heartbeats that failed and were retried so far (for metrics).
    pub fn heartbeat_failures(&self) -> u64 {
        self.m().heartbeat_failures()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        match self.m().state() {
            RowState::Lost(r) => Some(r),
            RowState::Live(_) => None,
        }
    }

    /// True once we can no longer be sure we hold the lock.
    pub fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// A signal that can be awaited from another task.
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal(self.m().subscribe(), self.m().clock.clone())
    }

    /// Resolves when the lock is lost (never, if it is released first).
    pub async fn lost(&self) -> LostReason {
        self.lost_signal().wait().await
    }

    /// Stops the heartbeat, then deletes our row. Reports whether it was still ours. With a
    /// [`crate::LockOptions::tick`], the tick is *not* marked done: the run failed, and retries
    /// must run it (see [`LockGuard::release_done`]).
    pub async fn release(self) -> Result<ReleaseOutcome, Error> {
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::ReleaseAlwaysMarks) {
            return self.finish(true).await;
        }
        self.finish(false).await
    }

    /// The run succeeded: marks its tick ([`crate::LockOptions::tick`]) done, then releases as
    /// [`LockGuard::release`] does. Without a tick it is `release`.
    ///
    /// An ordered tick held on the seat (the uncontended path) is marked by the release's own
    /// write; held on a queue row, the counter is marked first (one more request); a tick id's
    /// record is written first (one more write). A lock already lost marks nothing (errs on
    /// running again). If the process dies before the mark lands, the tick is not marked and a
    /// retry runs it again: the window is one write's round trip.
    pub async fn release_done(self) -> Result<ReleaseOutcome, Error> {
        self.finish(true).await
    }

    async fn finish(mut self, succeeded: bool) -> Result<ReleaseOutcome, Error> {
        let Some(m) = self.membership.take() else {
            return Ok(ReleaseOutcome::Lost);
        };
        let mut done = None;
        let mut mark_error = None;
        if let (Some(tick), true) = (&self.tick, succeeded) {
            if let RowState::Live(_) = m.state() {
                match m.mark_done(&tick.0, tick.1).await {
                    Ok(d) => done = d,
                    Err(e) => mark_error = Some(e),
                }
            }
        }
        let key = m.key.clone();
        let hint = Hint {
            ticket: m.ticket,
            owner: m.owner.to_string(),
            permits: m.permits(),
        };
        let held = m.clock.now().saturating_duration_since(self.granted_at);
        let hint_ticket = m.ticket;
        let result = m.leave_done(done).await;
        // A confirmed release of a granted row is the hint: rows below `ticket` were gone when we
        // were granted and cannot reappear, so if the counter still stands at `ticket` the queue
        // is empty and the next acquire can skip its read. Not after a contended hold: others
        // have most likely queued behind us, the counter has moved on, and an enqueue on the
        // hint would only fail its condition (a request and its write units) before reading.
        let hint = (matches!(result, Ok(Owned::Yes)) && !self.contended).then_some(hint);
        self.memory.remember(&key, hint);
        self.memory.held(&key, held);
        // Waiters of this process look at once instead of at their next poll.
        self.memory.let_go(&key, hint_ticket);
        let outcome = match result? {
            Owned::Yes => ReleaseOutcome::Released,
            Owned::No | Owned::NotMarked => ReleaseOutcome::Lost,
        };
        match mark_error {
            // Released, but the tick could not be marked: say so (a retry will run it again).
            Some(e) => Err(e),
            None => Ok(outcome),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(m) = &self.membership {
            self.memory.remember(&m.key, None);
            // Our waiters look at once: they find the row until its delete lands, and then
            // wait on it as on anyone else's.
            self.memory.let_go(&m.key, m.ticket);
        }
        // Dropping the membership stops the heartbeat and deletes the row in the background.
    }
}

/// Awaitable lost signal of a [`LockGuard`]; clone it into other tasks.
#[derive(Debug, Clone)]
pub struct LostSignal(watch::Receiver<RowState>, Arc<dyn Clock>);

impl LostSignal {
    /// The reason, if the lock is lost already.
    pub fn reason(&self) -> Option<LostReason> {
        match current(&self.0.borrow(), self.1.now()) {
            RowState::Lost(r) => Some(r),
            RowState::Live(_) => None,
        }
    }

    /// Until when the holder believes in its lease, as the runtime's instant (its own clock
    /// may run at a rate of its own), `None` once lost.
    #[cfg(test)]
    pub(crate) fn valid_until(&self) -> Option<tokio::time::Instant> {
        match current(&self.0.borrow(), self.1.now()) {
            RowState::Live(until) => Some(self.1.timer(until)),
            RowState::Lost(_) => None,
        }
    }

    /// Resolves when the lock is lost. If the guard is released first, never resolves.
    pub async fn wait(&mut self) -> LostReason {
        loop {
            if let Some(r) = self.reason() {
                return r;
            }
            if self.0.changed().await.is_err() {
                // The heartbeat task ended without losing the lock: it was released.
                return std::future::pending().await;
            }
        }
    }
}
