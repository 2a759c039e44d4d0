//! `GET next`: fetch events upstream and gate them, in a task a disconnecting runtime cannot
//! cancel halfway (fail closed).

use super::*;

/// The result of fetching and gating for one `GET next`.
pub(super) type Fetched = Result<Response<ProxyBody>, BoxError>;

/// A runtime's `GET next` waiting for its fetch-and-gate task. If the runtime disconnects
/// first, this is dropped and the task's result goes to the orphans, for the next `GET next`:
/// an event handed over with its lock held, never lost and never ungated.
struct Waiting {
    rx: Option<oneshot::Receiver<Fetched>>,
    proxy: Arc<Proxy>,
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
            self.proxy
                .orphans
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back(rx);
        }
    }
}

/// True if `id` can be used as a path segment of the Runtime API (non-empty, visible ASCII, no
/// `/`, `?`, `#`, `%` or a backslash). Pure.
pub fn usable_request_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'%' | b'\\'))
}

impl Proxy {
    /// `GET next`: fetch events upstream until one acquires its lock (or is not ours to gate).
    pub(super) async fn next(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, BoxError> {
        self.runtime_connected.store(true, Ordering::Relaxed);
        let (mut parts, _) = req.into_parts();
        // The runtime's request body (a GET has none) is not forwarded: drop its framing so
        // upstream does not wait for bytes that never come.
        parts.headers.remove(http::header::CONTENT_LENGTH);
        parts.headers.remove(http::header::TRANSFER_ENCODING);
        // Fetching and gating run in their own task: a runtime that disconnects meanwhile must
        // not cancel them halfway (an event fetched from Lambda but neither answered nor handed
        // over would be lost). What such a task produces waits for the next `GET next`.
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
                let this = self.clone();
                tokio::spawn(async move {
                    let _ = tx.send(this.fetch_and_gate(parts).await);
                });
                rx
            }
        };
        Waiting {
            rx: Some(rx),
            proxy: self,
        }
        .wait()
        .await
    }

    /// Fetches events upstream until one acquires its lock (or is not an event).
    async fn fetch_and_gate(
        &self,
        parts: http::request::Parts,
    ) -> Result<Response<ProxyBody>, BoxError> {
        loop {
            let resp = self
                .send(
                    Method::GET,
                    &parts.uri,
                    parts.headers.clone(),
                    parts.extensions.clone(),
                    full(Bytes::new()),
                )
                .await?;
            if !resp.status().is_success() {
                // Not an event (an error from upstream): the runtime deals with it.
                return Ok(resp);
            }
            let request_id = resp
                .headers()
                .get(REQUEST_ID_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|id| usable_request_id(id))
                .map(str::to_owned);
            let Some(id) = request_id else {
                // Fail closed: an event that can be neither gated nor answered is never passed
                // to the runtime ungated. Lambda ends it at its deadline.
                self.metrics.count(Metric::EventErrors);
                return Err(format!(
                    "upstream answered GET next with an event without a usable {REQUEST_ID_HEADER} \
                     header; it is not handed to the runtime ungated"
                )
                .into());
            };
            let (rparts, body) = resp.into_parts();
            let slot = self.invocations.slot(&id);
            slot.mark_seen();
            let span = tracing::info_span!(
                "invocation",
                request_id = %id,
                key = field::Empty,
                tick = field::Empty,
                ticket = field::Empty,
                waited_ms = field::Empty
            );
            slot.set_span(span.clone());
            let event = match body.collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    // Fail closed: answer it upstream as failed, never hand over a partial event.
                    let message =
                        format!("flightlock could not read the event from the Runtime API: {e}");
                    async {
                        tracing::error!(error = %e, "could not read the event; failing the invocation");
                        self.metrics.count(Metric::EventErrors);
                        self.answer(&id, Some(EVENT_ERROR_TYPE), &error_body(EVENT_ERROR_TYPE, &message))
                            .await;
                    }
                    .instrument(span)
                    .await;
                    slot.mark_done();
                    continue;
                }
            };
            // Before the lock is taken: a caller's client context that cannot be read with
            // certainty fails the invocation, so no entry it forged can reach the handler.
            let caller = match super::context::caller(&rparts.headers) {
                Ok(caller) => caller,
                Err(why) => {
                    let message = format!(
                        "flightlock refused the invocation's client context: {why}; it cannot \
                         remove the caller's flightlock* entries from it with certainty"
                    );
                    async {
                        tracing::warn!(reason = %why, "refused the invocation's client context; failing the invocation");
                        self.answer(&id, Some(CONTEXT_ERROR_TYPE), &error_body(CONTEXT_ERROR_TYPE, &message))
                            .await;
                    }
                    .instrument(span)
                    .await;
                    slot.mark_done();
                    continue;
                }
            };
            let deadline = rparts
                .headers
                .get(DEADLINE_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
            // Tenant isolation mode: the tenant id of this invocation, for `{tenant}` keys.
            let tenant = rparts
                .headers
                .get(TENANT_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            // With OTLP export on: the invocation's trace, for its spans (sampled ones only).
            let trace = self.traces.as_ref().and_then(|_| {
                rparts
                    .headers
                    .get(TRACE_ID_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(crate::otel::xray::parse)
                    .filter(|t| t.sampled)
            });
            // The gate decides (skipped or failed invocations were answered here and are done)
            // unless FLIGHTLOCK_GATE is off; either way the caller's flightlock* entries go.
            let handover = if self.config.gate {
                match self
                    .admit(&id, &slot, deadline, &event, tenant.as_deref(), trace)
                    .instrument(span.clone())
                    .await
                {
                    Some(handover) => Some(handover),
                    None => continue,
                }
            } else {
                None
            };
            // Note which runtime receives the event, to notice if it dies mid-invocation.
            slot.set_runtime(self.runtime_process().await);
            // The one change to the event: the handler's client context gets its lock.
            let mut rparts = rparts;
            span.in_scope(|| {
                super::context::hand_over(&mut rparts.headers, &caller, handover.as_ref())
            });
            slot.mark_handed_over(flightlock_lambda::records::Records::new(
                self.locker(),
                self.config.clone(),
                self.holder(&id),
                deadline,
            ));
            return Ok(Response::from_parts(rparts, full(event)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_must_be_path_segments() {
        assert!(usable_request_id("8476a536-e9f4-11e8-9739-2dfe598c3fcd"));
        assert!(usable_request_id("req-1"));
        for bad in ["", "a/b", "a b", "a?b", "a#b", "a%2Fb", "..\\x", "é"] {
            assert!(!usable_request_id(bad), "{bad:?}");
        }
        assert!(!usable_request_id(&"x".repeat(257)));
    }
}
