//! The fetch tasks of `GET next`: fetching and gating an event runs in a task of its own, which
//! a runtime that disconnects meanwhile cannot cancel halfway (fail closed: an event fetched
//! from Lambda but neither answered nor handed over would be lost). What the task of a
//! disconnected runtime produces waits here for the next `GET next`.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use http::Response;
use tokio::sync::oneshot;

use crate::body::{BoxError, ProxyBody};

/// The result of fetching and gating for one `GET next`.
pub(super) type Fetched = Result<Response<ProxyBody>, BoxError>;

/// Results of fetches whose runtime disconnected, for the next `GET next` (see [`Waiting`]).
#[derive(Debug, Default)]
pub(super) struct Fetches {
    orphans: Mutex<VecDeque<oneshot::Receiver<Fetched>>>,
}

impl Fetches {
    /// The result for one `GET next`: what an earlier, disconnected `GET next` fetched, if
    /// anything waits; otherwise what `fetch` makes, run in a task of its own. If the caller
    /// stops waiting, the result is kept for the next call.
    pub(super) async fn next<F, Fut>(self: &Arc<Self>, fetch: F) -> Fetched
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Fetched> + Send + 'static,
    {
        let orphan = self
            .orphans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        let rx = match orphan {
            Some(rx) => {
                tracing::info!("handing over what an earlier, disconnected GET next fetched");
                rx
            }
            None => {
                let (tx, rx) = oneshot::channel();
                let fetching = fetch();
                tokio::spawn(async move {
                    let _ = tx.send(fetching.await);
                });
                rx
            }
        };
        Waiting {
            rx: Some(rx),
            fetches: self.clone(),
        }
        .wait()
        .await
    }
}

/// A runtime's `GET next` waiting for its fetch-and-gate task. If the runtime disconnects
/// first, this is dropped and the task's result goes to the orphans, for the next `GET next`:
/// an event handed over with its lock held, never lost and never ungated.
struct Waiting {
    rx: Option<oneshot::Receiver<Fetched>>,
    fetches: Arc<Fetches>,
}

impl Waiting {
    async fn wait(mut self) -> Fetched {
        let Some(rx) = self.rx.as_mut() else {
            return Err("no fetch in flight".into());
        };
        let result = rx.await;
        self.rx = None;
        result.unwrap_or_else(|_| Err("the task fetching the event ended without a result".into()))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(rx) = self.rx.take() {
            tracing::warn!("the runtime disconnected while its event was fetched or gated; the next GET next gets it");
            self.fetches
                .orphans
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back(rx);
        }
    }
}
