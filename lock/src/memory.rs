//! What one process (one [`crate::Locker`] and its clones) remembers about keys between calls:
//! the hint from its last release, how long it held each key, and which of its own acquisitions
//! are waiting, so a release wakes the next of them (the lowest ticket) at once instead of at
//! its next poll.
//!
//! Every map is bounded; forgetting costs a request or a little speed, never correctness.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// At most this many keys are remembered per map.
pub(crate) const MAX_KEYS: usize = 4096;

/// What a client remembers of its own last release of a key: every row with a lower ticket was
/// gone when it was granted, and rows with lower tickets can never appear later (issuance and
/// insertion are one transaction), so if the counter still stands at `ticket` *and was last
/// moved by us* the queue is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hint {
    pub ticket: u64,
    pub owner: String,
    /// The permits the released entry was granted under: the hint is only good for an
    /// acquisition with the same (fewer than that many were ahead of `ticket` at its grant).
    pub permits: u32,
}

/// Per-process memory of keys.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    hints: Mutex<HashMap<String, Hint>>,
    holds: Mutex<HashMap<String, Duration>>,
    /// Per key, the last turn our waiters learnt ([`crate::liveness::Pace`]).
    turns: Mutex<HashMap<String, Duration>>,
    /// Per key, our waiters by ticket.
    waiting: Mutex<HashMap<String, BTreeMap<u64, Arc<Notify>>>>,
    /// Per key, the tickets we hold.
    holding: Mutex<HashMap<String, BTreeSet<u64>>>,
}

fn bounded_insert<V>(map: &mut HashMap<String, V>, key: &str, value: V) {
    if map.len() >= MAX_KEYS && !map.contains_key(key) {
        map.clear();
    }
    map.insert(key.to_owned(), value);
}

impl Memory {
    pub(crate) fn hint(&self, key: &str) -> Option<Hint> {
        self.hints.lock().ok()?.get(key).cloned()
    }

    /// Sets (or with `None`, forgets) the key's hint.
    pub(crate) fn remember(&self, key: &str, hint: Option<Hint>) {
        let Ok(mut hints) = self.hints.lock() else {
            return;
        };
        match hint {
            Some(h) => bounded_insert(&mut hints, key, h),
            None => {
                hints.remove(key);
            }
        }
    }

    /// How long this process usually holds the key: a moving average of its holds.
    pub(crate) fn hold(&self, key: &str) -> Option<Duration> {
        self.holds.lock().ok()?.get(key).copied()
    }

    /// Records one hold of the key.
    pub(crate) fn held(&self, key: &str, held: Duration) {
        let Ok(mut holds) = self.holds.lock() else {
            return;
        };
        let average = match holds.get(key) {
            Some(old) => (*old * 3 + held) / 4,
            None => held,
        };
        bounded_insert(&mut holds, key, average);
    }

    /// How long one place in the key's queue took when our waiters last watched it, or failing
    /// that our usual hold: where the next wait's pace starts.
    pub(crate) fn turn(&self, key: &str) -> Option<Duration> {
        let learnt = self.turns.lock().ok()?.get(key).copied();
        learnt.or_else(|| self.hold(key))
    }

    /// Records the turn a wait ended with.
    pub(crate) fn learnt_turn(&self, key: &str, turn: Duration) {
        if let Ok(mut turns) = self.turns.lock() {
            bounded_insert(&mut turns, key, turn);
        }
    }

    /// The notifier our waiter with `ticket` on `key` listens to.
    pub(crate) fn waiting(&self, key: &str, ticket: u64) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        let Ok(mut waiting) = self.waiting.lock() else {
            return n;
        };
        if waiting.len() >= MAX_KEYS && !waiting.contains_key(key) {
            waiting.clear();
        }
        waiting
            .entry(key.to_owned())
            .or_default()
            .insert(ticket, n.clone());
        n
    }

    /// Our waiter with `ticket` stops listening. Not granted (it gave up, was cancelled or
    /// queues again), it wakes our waiter right behind it, which may have been sleeping on it.
    pub(crate) fn done_waiting(&self, key: &str, ticket: u64, granted: bool) {
        let Ok(mut waiting) = self.waiting.lock() else {
            return;
        };
        let Some(tickets) = waiting.get_mut(key) else {
            return;
        };
        tickets.remove(&ticket);
        if !granted {
            if let Some((_, behind)) = tickets.range(ticket..).next() {
                behind.notify_one();
            }
        }
        if tickets.is_empty() {
            waiting.remove(key);
        }
    }

    /// We hold `key` with `ticket`.
    pub(crate) fn holding(&self, key: &str, ticket: u64) {
        if let Ok(mut holding) = self.holding.lock() {
            if holding.len() >= MAX_KEYS && !holding.contains_key(key) {
                holding.clear();
            }
            holding.entry(key.to_owned()).or_default().insert(ticket);
        }
    }

    /// We no longer hold `key` with `ticket` (released, or the guard dropped): our next waiter
    /// looks at once.
    pub(crate) fn let_go(&self, key: &str, ticket: u64) {
        if let Ok(mut holding) = self.holding.lock() {
            if let Some(tickets) = holding.get_mut(key) {
                tickets.remove(&ticket);
                if tickets.is_empty() {
                    holding.remove(key);
                }
            }
        }
        self.released(key);
    }

    /// Whether the row with `ticket` on `key` is one of ours, waiting or holding: a waiter
    /// right behind it need not look until it is woken (a release, or a waiter giving up,
    /// wakes it).
    pub(crate) fn ours(&self, key: &str, ticket: u64) -> bool {
        let waiting = self
            .waiting
            .lock()
            .is_ok_and(|w| w.get(key).is_some_and(|t| t.contains_key(&ticket)));
        waiting
            || self
                .holding
                .lock()
                .is_ok_and(|h| h.get(key).is_some_and(|t| t.contains(&ticket)))
    }

    /// Our waiter with the lowest ticket on `key` looks at once (it is the one that may be
    /// next; the others would only find it ahead of them).
    fn released(&self, key: &str) {
        let next = self
            .waiting
            .lock()
            .ok()
            .and_then(|w| w.get(key)?.values().next().cloned());
        if let Some(n) = next {
            n.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn maps_are_bounded() {
        let m = Memory::default();
        for i in 0..(MAX_KEYS + 10) {
            m.remember(
                &format!("k{i}"),
                Some(Hint {
                    ticket: 1,
                    owner: "o".into(),
                    permits: 1,
                }),
            );
            m.held(&format!("k{i}"), Duration::from_millis(5));
            m.learnt_turn(&format!("k{i}"), Duration::from_millis(7));
        }
        assert!(m.hints.lock().unwrap().len() <= MAX_KEYS);
        assert!(m.holds.lock().unwrap().len() <= MAX_KEYS);
        assert!(m.turns.lock().unwrap().len() <= MAX_KEYS);
        m.remember("k1", None);
        assert!(m.hint("k1").is_none());
    }

    #[test]
    fn hold_is_a_moving_average() {
        let m = Memory::default();
        m.held("k", Duration::from_millis(100));
        assert_eq!(m.hold("k"), Some(Duration::from_millis(100)));
        m.held("k", Duration::from_millis(20));
        assert_eq!(m.hold("k"), Some(Duration::from_millis(80)));
    }

    #[tokio::test]
    async fn a_release_wakes_the_lowest_local_waiter() {
        let m = Arc::new(Memory::default());
        let later = m.waiting("k", 9);
        let next = m.waiting("k", 4);
        m.let_go("k", 2);
        // notify_one stores a permit for the next waiter: it is woken, the later one is not.
        tokio::time::timeout(Duration::from_secs(1), next.notified())
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), later.notified())
                .await
                .is_err()
        );
        m.done_waiting("k", 4, true);
        m.done_waiting("k", 9, true);
        assert!(m.waiting.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn our_rows_are_known_and_a_waiter_giving_up_wakes_the_next() {
        let m = Arc::new(Memory::default());
        m.holding("k", 3);
        let behind = m.waiting("k", 5);
        let last = m.waiting("k", 6);
        assert!(m.ours("k", 3) && m.ours("k", 5) && m.ours("k", 6));
        assert!(!m.ours("k", 4) && !m.ours("other", 3));
        // The waiter at 5 gives up: the one right behind it looks at once.
        m.done_waiting("k", 5, false);
        tokio::time::timeout(Duration::from_secs(1), last.notified())
            .await
            .unwrap();
        assert!(!m.ours("k", 5));
        m.let_go("k", 3);
        assert!(!m.ours("k", 3));
        drop(behind);
    }
}
