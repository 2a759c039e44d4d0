//! Inspecting a key's queue: who holds, who waits, which rows are stale. Pure classification of
//! one strongly consistent read; used by [`crate::Locker::queue`] and `flightlock status`.

use std::time::Duration;

use crate::clock::millis;
use crate::holder::HolderInfo;
use crate::schema::Snapshot;

/// One row of [`crate::Locker::queue`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    /// Ticket (fencing token).
    pub ticket: u64,
    /// Acquisition id.
    pub owner: String,
    /// What the row is doing.
    pub state: EntryState,
    /// Lease left by our clock, ms (negative: expired).
    pub lease_left_ms: i64,
    /// Enqueue time, epoch ms.
    pub enqueued_at_ms: Option<i64>,
    /// Grant time, epoch ms: written with the row when it was granted at once, else by the
    /// holder's first heartbeat after its grant (a hold shorter than a heartbeat interval that
    /// waited first never shows one).
    pub acquired_at_ms: Option<i64>,
    /// The entry is the counter's seat (an uncontended grant), not a row of its own: deleting
    /// it by hand means deleting the counter item.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub seat: bool,
    /// Details for people.
    #[serde(flatten)]
    pub holder: HolderInfo,
}

/// The role of a queue row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum EntryState {
    /// The first live row: it holds the key (or is about to notice that it does).
    Holding,
    /// A live row behind the holder.
    Waiting,
    /// Lease ended past the allowance: the next waiter will remove it.
    Stale,
}

impl QueueEntry {
    pub(crate) fn classify(snap: Snapshot, wall_ms: i64, skew: Duration) -> Vec<QueueEntry> {
        // The first live entries hold the key's permits (one on protocol 1).
        let permits = snap.counter.as_ref().map_or(1, |c| c.permits) as usize;
        let mut holders = 0;
        snap.rows
            .into_iter()
            .map(|r| {
                let lease_left_ms = r.lease_until_ms - wall_ms;
                let state = if lease_left_ms + millis(skew) < 0 {
                    EntryState::Stale
                } else if holders >= permits {
                    EntryState::Waiting
                } else {
                    holders += 1;
                    EntryState::Holding
                };
                QueueEntry {
                    ticket: r.ticket,
                    owner: r.owner,
                    state,
                    lease_left_ms,
                    enqueued_at_ms: r.enqueued_at_ms,
                    acquired_at_ms: r.acquired_at_ms,
                    seat: r.seat,
                    holder: r.holder,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::QueueRow;

    fn row(ticket: u64, lease_until_ms: i64) -> QueueRow {
        QueueRow {
            ticket,
            owner: format!("o{ticket}"),
            lease_until_ms,
            lease_ms: 1000,
            expires_at: 0,
            seat: false,
            rvn: "r".into(),
            enqueued_at_ms: None,
            acquired_at_ms: None,
            clock_free: false,
            holder: HolderInfo::default(),
        }
    }

    #[test]
    fn queue_entries_name_holder_waiters_and_stale_rows() {
        let snap = Snapshot {
            counter: Some(crate::schema::Counter {
                last: 4,
                owner: None,
                tick_done: None,
                tick_newest: None,
                protocol: 1,
                permits: 1,
            }),
            rows: vec![row(1, 500), row(2, 5_000), row(3, 5_000), row(4, 1_900)],
            protocol: 1,
        };
        let entries = QueueEntry::classify(snap, 2_000, Duration::from_millis(200));
        let states: Vec<_> = entries.iter().map(|e| e.state).collect();
        assert_eq!(
            states,
            [
                EntryState::Stale,
                EntryState::Holding,
                EntryState::Waiting,
                EntryState::Waiting
            ]
        );
        assert_eq!(entries[0].lease_left_ms, -1_500);
    }
}
