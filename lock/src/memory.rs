//! What one process (one [`crate::Locker`] and its clones) remembers about keys between calls:
//! the hint from its last release, how long it held each key, and which of its own acquisitions
//! are waiting, so a release wakes them at once instead of at their next poll.
//!
//! Every map is bounded; forgetting costs a request or a little speed, never correctness.

use std::collections::HashMap;
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
}

/// Per-process memory of keys.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    hints: Mutex<HashMap<String, Hint>>,
    holds: Mutex<HashMap<String, Duration>>,
    waiting: Mutex<HashMap<String, Arc<Notify>>>,
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

    /// The notifier our waiters on `key` listen to.
    pub(crate) fn waiting(&self, key: &str) -> Arc<Notify> {
        let Ok(mut waiting) = self.waiting.lock() else {
            return Arc::new(Notify::new());
        };
        if let Some(n) = waiting.get(key) {
            return n.clone();
        }
        let n = Arc::new(Notify::new());
        bounded_insert(&mut waiting, key, n.clone());
        n
    }

    /// A waiter stops listening; the entry goes when nobody listens.
    pub(crate) fn done_waiting(&self, key: &str, notify: Arc<Notify>) {
        let Ok(mut waiting) = self.waiting.lock() else {
            return;
        };
        // Ours and the map's: nobody else listens.
        if Arc::strong_count(&notify) <= 2 {
            waiting.remove(key);
        }
    }

    /// We released `key`: our own waiters look at once.
    pub(crate) fn released(&self, key: &str) {
        let notify = self.waiting.lock().ok().and_then(|w| w.get(key).cloned());
        if let Some(n) = notify {
            n.notify_waiters();
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
                }),
            );
            m.held(&format!("k{i}"), Duration::from_millis(5));
        }
        assert!(m.hints.lock().unwrap().len() <= MAX_KEYS);
        assert!(m.holds.lock().unwrap().len() <= MAX_KEYS);
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
    async fn a_release_wakes_local_waiters() {
        let m = Arc::new(Memory::default());
        let n = m.waiting("k");
        {
            let woken = n.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            m.released("k");
            tokio::time::timeout(Duration::from_secs(1), woken)
                .await
                .unwrap();
        }
        m.done_waiting("k", n);
        assert!(m.waiting.lock().unwrap().is_empty());
    }
}
