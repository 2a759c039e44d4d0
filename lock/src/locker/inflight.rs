//! What a dropped acquisition may have left: the entries its enqueue requests may have written,
//! removed in the background.

use std::sync::Arc;
use std::time::Duration;

use super::ATTEMPT_TIMEOUT;
use crate::clock::Clock;
use crate::heartbeat::delete_with_retry;
use crate::storage::{Speaks, Store};

/// An enqueue whose request may be on the wire: if the acquisition is dropped before it turns
/// into a [`Membership`], the row it may have written is deleted in the background — at once,
/// and again once the request can no longer land (after the attempt timeout), so a transaction
/// that was still in flight cannot leave an orphan behind.
pub(super) struct InFlight {
    pub(super) store: Store,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) key: String,
    pub(super) owner: String,
    /// Entries (ticket, seat) that an unanswered or ambiguous request may have written.
    pub(super) tickets: Vec<(u64, bool)>,
    /// Our version condition on a seat.
    pub(super) speaks: Speaks,
}

impl InFlight {
    /// The rows that may exist, now that nobody will heartbeat them: removed in the background.
    pub(super) fn abandon(&mut self) {
        let tickets = std::mem::take(&mut self.tickets);
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::AbandonLeavesRows) {
            return;
        }
        if tickets.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, clock, key, owner, speaks) = (
            self.store.clone(),
            self.clock.clone(),
            self.key.clone(),
            self.owner.clone(),
            self.speaks,
        );
        let tracker = store.background().clone();
        tracker.spawn_on(
            async move {
                for pass in 0..2 {
                    if pass == 1 {
                        clock.sleep(ATTEMPT_TIMEOUT + Duration::from_millis(500)).await;
                    }
                    for &(t, seat) in &tickets {
                        if let Err(e) = delete_with_retry(&store, &*clock, &key, (t, seat), &owner, None, speaks).await {
                            tracing::warn!(key = %key, ticket = t, error = %e, "could not remove a possibly written row; it goes stale after one lease");
                        }
                    }
                }
            },
            &rt,
        );
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.abandon();
    }
}
