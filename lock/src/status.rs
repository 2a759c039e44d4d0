//! Inspecting a key's queue: who holds, who waits, which rows are stale. Pure classification of
//! one strongly consistent read; used by [`crate::Locker::state`] (`flightlock status`, `run`'s
//! progress lines) and [`crate::permits::set_permits`].

use std::time::Duration;

use crate::clock::millis;
use crate::holder::HolderInfo;
use crate::liveness::past_lease;
use crate::options::ClockSkew;
use crate::schema::Snapshot;

/// What a key's partition says ([`crate::Locker::state`]): its queue classified against its
/// permits, its protocol and permits (1 without a counter or on protocol 1), and its highest
/// ticket. One strongly consistent read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// The queue, in ticket order (the first `permits` live entries hold).
    pub queue: Vec<QueueEntry>,
    /// The protocol the key runs.
    pub protocol: u32,
    /// The key's permits.
    pub permits: u32,
    /// Whether the key has a counter item.
    pub has_counter: bool,
    /// The highest ticket the counter or a row carries (0 for a key never used).
    pub highest_ticket: u64,
    /// The seated holder's ticket, if the counter's seat is taken.
    pub seat: Option<u64>,
    /// Set when a row carries a higher ticket than the counter's `last`: the counter was set
    /// back (a table restore, an operator's put of an old counter item). No participant moves
    /// it back, and while it is behind a warm participant's fast path can be granted a ticket
    /// below a live holder's (`lock/PROTOCOL.md`, "What remains assumed"). The value is the
    /// highest row ticket: raise `last` to it (or delete every row of the key first).
    pub counter_behind: Option<u64>,
}

impl KeyState {
    /// Classifies `snap` at wall time `wall_ms`, judging stale entries with `skew` (clock-free
    /// mode cannot judge from one read: it is shown as bounded by zero skew).
    pub(crate) fn new(snap: Snapshot, wall_ms: i64, skew: ClockSkew) -> KeyState {
        let highest_ticket = snap
            .rows
            .iter()
            .map(|r| r.ticket)
            .chain(snap.counter.as_ref().map(|c| c.last))
            .max()
            .unwrap_or(0);
        let skew = match skew {
            ClockSkew::Bounded(d) => d,
            ClockSkew::Unbounded => Duration::ZERO,
        };
        let highest_row = snap.rows.iter().map(|r| r.ticket).max();
        let counter_behind = snap
            .counter
            .as_ref()
            .zip(highest_row)
            .and_then(|(c, row)| (row > c.last).then_some(row));
        KeyState {
            counter_behind,
            protocol: snap.protocol,
            permits: snap.counter.as_ref().map_or(1, |c| c.permits),
            has_counter: snap.counter.is_some(),
            highest_ticket,
            seat: snap.rows.iter().find(|r| r.seat).map(|r| r.ticket),
            queue: QueueEntry::classify(snap, wall_ms, skew),
        }
    }
}

/// One entry of a key's queue ([`KeyState::queue`], [`crate::Locker::queue`]).
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
    fn classify(snap: Snapshot, wall_ms: i64, skew: Duration) -> Vec<QueueEntry> {
        // The first live entries hold the key's permits (one on protocol 1).
        let permits = snap.counter.as_ref().map_or(1, |c| c.permits) as usize;
        let mut holders = 0;
        snap.rows
            .into_iter()
            .map(|r| {
                let lease_left_ms = r.lease_until_ms - wall_ms;
                let state = if past_lease(r.lease_until_ms, wall_ms, millis(skew)) {
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

    #[test]
    fn a_counter_behind_its_queue_is_reported() {
        let counter = |last| crate::schema::Counter {
            last,
            owner: None,
            tick_done: None,
            tick_newest: None,
            protocol: 1,
            permits: 1,
        };
        let state = |last, rows: Vec<QueueRow>| {
            KeyState::new(
                Snapshot {
                    counter: Some(counter(last)),
                    rows,
                    protocol: 1,
                },
                2_000,
                ClockSkew::Bounded(Duration::ZERO),
            )
        };
        // Restored to last = 1 while ticket 3 holds.
        assert_eq!(state(1, vec![row(3, 5_000)]).counter_behind, Some(3));
        assert_eq!(state(3, vec![row(3, 5_000)]).counter_behind, None);
        assert_eq!(state(5, vec![row(3, 5_000)]).counter_behind, None);
        assert_eq!(state(1, vec![]).counter_behind, None);
    }
}
