//! The run's trace: one line per event, with the simulated time.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// The run's trace: one line per event, with the simulated time.
#[derive(Clone, Default)]
pub(crate) struct Trace {
    lines: Arc<Mutex<Vec<String>>>,
    origin: Arc<Mutex<Option<Instant>>>,
}

impl Trace {
    pub(crate) fn line(&self, text: String) {
        let now = Instant::now();
        let origin = self
            .origin
            .lock()
            .map(|mut o| *o.get_or_insert(now))
            .unwrap_or(now);
        let ms = now.saturating_duration_since(origin).as_millis();
        if let Ok(mut l) = self.lines.lock() {
            l.push(format!("{ms:>9}ms {text}"));
        }
    }

    pub(super) fn take(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }
}
