//! The in-process path for Rust Lambda functions (cargo feature `lambda`): a tower layer around
//! a `lambda_runtime` handler with the extension's semantics — acquire before the handler runs
//! (within `min(wait, deadline - margin)`), heartbeat while it runs (never past the deadline plus
//! [`LEASE_CAP_GRACE`](crate::config::LEASE_CAP_GRACE)), release when it returns, and on a busy
//! key skip (`{"flightlock":{"skipped":true,...}}`) or fail with `FlightlockBusy`. It reads the
//! same `FLIGHTLOCK_*` variables as the extension ([`crate::config`]).
//!
//! OS-only runtimes (`provided.al2023`) do not run `AWS_LAMBDA_EXEC_WRAPPER` scripts, so the
//! layer's proxy cannot be put in front of a Rust or Go function that way. Two routes:
//!
//! - **Rust:** this layer, no extension needed:
//!
//! ```no_run
//! # #[cfg(feature = "lambda")]
//! # async fn demo() -> Result<(), lambda_runtime::Error> {
//! use lambda_runtime::{service_fn, LambdaEvent};
//! use flightlock::lambda::FlightlockLayer;
//! use lambda_runtime::tower::ServiceBuilder;
//!
//! async fn job(event: LambdaEvent<serde_json::Value>) -> Result<serde_json::Value, lambda_runtime::Error> {
//!     Ok(serde_json::json!({"done": true}))
//! }
//!
//! let env = std::env::vars().collect();
//! let layer = FlightlockLayer::from_env(&env).await?;
//! lambda_runtime::run(ServiceBuilder::new().layer(layer).service(service_fn(job))).await
//! # }
//! ```
//!
//! - **Any language on `provided.al2023`:** keep the flightlock layer attached (its extension
//!   starts the proxy) and make the function's own `bootstrap` script point the runtime at it,
//!   exactly like the wrapper does: `export AWS_LAMBDA_RUNTIME_API=127.0.0.1:${FLIGHTLOCK_PROXY_PORT:-9009}`
//!   before exec'ing the function binary (or `exec /opt/flightlock-wrapper ./my-binary`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use lambda_runtime::tower::{Layer, Service};
use lambda_runtime::{Diagnostic, LambdaEvent};
use serde::Serialize;
use tracing::Instrument;

use crate::config::{
    redact_aws_ids, skipped_body, Config, ConfigError, OnBusy, BUSY_ERROR_TYPE, KEY_ERROR_TYPE,
    LOCK_ERROR_TYPE,
};
use crate::{Error, HolderInfo, Locker, ReleaseOutcome};

/// What the wrapped handler answers: its own response, or the skip body.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Gated<R> {
    /// The handler ran and answered this.
    Ran(R),
    /// The key was busy and `FLIGHTLOCK_ON_BUSY=skip`: `{"flightlock":{"skipped":true,...}}`.
    Skipped(serde_json::Value),
}

/// Builds [`Flightlock`] services. Cheap to clone.
#[derive(Debug, Clone)]
pub struct FlightlockLayer {
    locker: Locker,
    config: Arc<Config>,
    host: String,
}

impl FlightlockLayer {
    /// A layer from an explicit locker and configuration.
    pub fn new(locker: Locker, config: Config) -> FlightlockLayer {
        for warning in config.warnings() {
            tracing::warn!("{warning}");
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "lambda".to_owned());
        FlightlockLayer {
            locker,
            config: Arc::new(config),
            host: format!("{host}:{}", std::process::id()),
        }
    }

    /// A layer configured by the `FLIGHTLOCK_*` variables in `env` (pass
    /// `std::env::vars().collect()`), with a DynamoDB client from the function's AWS settings.
    pub async fn from_env(env: &HashMap<String, String>) -> Result<FlightlockLayer, ConfigError> {
        let config = Config::from_map(env)?;
        let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .load()
            .await;
        let locker = Locker::new(aws_sdk_dynamodb::Client::new(&aws), &config.table);
        Ok(FlightlockLayer::new(locker, config))
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

impl<S> Layer<S> for FlightlockLayer {
    type Service = Flightlock<S>;

    fn layer(&self, inner: S) -> Flightlock<S> {
        Flightlock {
            inner,
            layer: self.clone(),
        }
    }
}

/// A handler gated by the lock. See the module docs.
#[derive(Debug, Clone)]
pub struct Flightlock<S> {
    inner: S,
    layer: FlightlockLayer,
}

fn diagnostic(error_type: &str, message: impl Into<String>) -> Diagnostic {
    Diagnostic {
        error_type: error_type.to_owned(),
        error_message: message.into(),
    }
}

impl<S, A, R> Service<LambdaEvent<A>> for Flightlock<S>
where
    S: Service<LambdaEvent<A>, Response = R> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<Diagnostic>,
    A: Serialize + Send + 'static,
    R: Send + 'static,
{
    type Response = Gated<R>;
    type Error = Diagnostic;
    type Future = Pin<Box<dyn Future<Output = Result<Gated<R>, Diagnostic>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Diagnostic>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, event: LambdaEvent<A>) -> Self::Future {
        // The ready service is the one we were polled on; leave a fresh clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        let span = tracing::info_span!(
            "invocation",
            request_id = %event.context.request_id,
            key = tracing::field::Empty,
            ticket = tracing::field::Empty,
            waited_ms = tracing::field::Empty
        );
        Box::pin(
            async move {
                let config = &layer.config;
                let key = if config.key.reads_event() {
                    serde_json::to_value(&event.payload)
                        .map_err(|e| diagnostic(KEY_ERROR_TYPE, e.to_string()))
                        .and_then(|v| {
                            config
                                .key
                                .render(&v)
                                .map_err(|e| diagnostic(KEY_ERROR_TYPE, e.to_string()))
                        })?
                } else {
                    config
                        .key
                        .render(&serde_json::Value::Null)
                        .map_err(|e| diagnostic(KEY_ERROR_TYPE, e.to_string()))?
                };
                let span = tracing::Span::current();
                span.record("key", key.as_str());
                let holder = HolderInfo {
                    function: config.function_name.clone(),
                    request_id: Some(event.context.request_id.clone()),
                    host: Some(layer.host.clone()),
                };
                let opts =
                    config.lock_options(Some(event.context.deadline()), SystemTime::now(), holder);
                let guard = match layer.locker.acquire(&key, &opts).await {
                    Ok(g) => g,
                    Err(e @ Error::Busy { .. }) => {
                        let held_by = match &e {
                            Error::Busy {
                                holder: Some(h), ..
                            } => Some((**h).clone()),
                            // Lost the race to enqueue: one more read names the holder.
                            _ => layer.locker.holder(&key, opts.clock_skew).await.unwrap_or_else(|e| {
                                tracing::debug!(error = %e, "could not read the holder");
                                None
                            }),
                        };
                        let held_by = held_by.as_ref();
                        return match config.on_busy {
                            OnBusy::Skip => {
                                tracing::info!(reason = %e, "key busy: invocation skipped");
                                Ok(Gated::Skipped(skipped_body(&key, held_by)))
                            }
                            OnBusy::Error => {
                                tracing::info!(reason = %e, "key busy: invocation failed");
                                Err(diagnostic(BUSY_ERROR_TYPE, e.to_string()))
                            }
                        };
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "could not take the lock");
                        // The full error is in the log; the caller gets no ARNs or account ids.
                        return Err(diagnostic(LOCK_ERROR_TYPE, redact_aws_ids(&e.to_string())));
                    }
                };
                span.record("ticket", guard.token());
                span.record("waited_ms", guard.waited().as_millis() as u64);
                tracing::info!("lock acquired");
                let result: Result<R, Diagnostic> = inner.call(event).await.map_err(Into::into);
                if let Some(reason) = guard.lost_reason() {
                    tracing::error!(%reason, "the lock was lost while the handler ran");
                }
                match guard.release().await {
                    Ok(ReleaseOutcome::Released) => tracing::info!("lock released"),
                    Ok(ReleaseOutcome::Lost) => tracing::warn!("the lock was already lost"),
                    Err(e) => {
                        tracing::error!(error = %e, "release failed; the row lapses after one lease")
                    }
                }
                result.map(Gated::Ran)
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gated_serializes_transparently() {
        let ran: Gated<serde_json::Value> = Gated::Ran(serde_json::json!({"a": 1}));
        assert_eq!(serde_json::to_string(&ran).unwrap(), r#"{"a":1}"#);
        let skipped: Gated<()> = Gated::Skipped(skipped_body("k", None));
        assert_eq!(
            serde_json::to_value(&skipped).unwrap()["flightlock"]["skipped"],
            true
        );
    }
}
