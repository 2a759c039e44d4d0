//! The in-process path for Rust Lambda functions (cargo feature `layer`): a tower layer around
//! a `lambda_runtime` handler with the extension's semantics — acquire before the handler runs
//! (within `min(wait, deadline - margin)`), heartbeat while it runs (never past the deadline plus
//! [`LEASE_CAP_GRACE`](crate::config::LEASE_CAP_GRACE)), release when it returns, and on a busy
//! key skip (`{"flightlock":{"skipped":true,...}}`) or fail with `FlightlockBusy`. Once per tick:
//! a handler that returns `Ok` marks the invocation's tick done, one that returns `Err` (or
//! panics, or is stopped at the deadline) does not, so retries run it again; a duplicate of a
//! done tick is answered with the skip body, reason `duplicate`. It reads the
//! same `FLIGHTLOCK_*` variables as the extension ([`crate::config`]) and decides through the
//! same [`Gate`] (same deadline bounds, logs and EMF metrics); `FLIGHTLOCK_PROXY_PORT`,
//! `FLIGHTLOCK_UPSTREAM` and `FLIGHTLOCK_WRAPPER_CHECK` concern the extension only.
//!
//! OS-only runtimes (`provided.al2023`) do not run `AWS_LAMBDA_EXEC_WRAPPER` scripts, so the
//! layer's proxy cannot be put in front of a Rust or Go function that way. Two routes:
//!
//! - **Rust:** this layer, no extension needed:
//!
//! ```no_run
//! # #[cfg(feature = "layer")]
//! # async fn demo() -> Result<(), lambda_runtime::Error> {
//! use lambda_runtime::{service_fn, LambdaEvent};
//! use flightlock_lambda::FlightlockLayer;
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
//!
//! **SnapStart.** The layer is a [`SnapStartResource`]: register a clone of it with
//! `lambda_runtime::Runtime::register_snapstart_resource` and, after each restore, it swaps in
//! a new DynamoDB client (the snapshot's pooled connections are not this environment's) and a
//! new host id; clones share the renewed gate. Owner ids and record versions need nothing: they
//! are drawn from the OS at each use ([`flightlock::clock`]).
//!
//! **The handler's ticket.** Before the handler runs, the layer puts the fencing token, the key,
//! the time waited and the tick into the event's client context (`custom`, names starting with
//! `flightlock`; [`crate::client_context`]), as the extension does for other runtimes;
//! [`ticket`] reads the token back.
//!
//! **Tenant isolation.** `{tenant}` in the key template is filled from the context's
//! `tenant_id` (`lambda_runtime` reads it from the `Lambda-Runtime-Aws-Tenant-Id` header).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use lambda_runtime::tower::{Layer, Service};
use lambda_runtime::{
    BoxFuture, Context as LambdaContext, Diagnostic, LambdaEvent, SnapStartResource,
};
use serde::Serialize;
use tracing::Instrument;

use crate::client_context::{is_reserved, TICKET};
use crate::config::{Config, ConfigError};
use crate::gate::{host_id, Gate, Outcome, Run, SDK_ATTEMPT_TIMEOUT, SDK_CONNECT_TIMEOUT};
use crate::records::Records;
use crate::responses::KEY_ERROR_TYPE;
use flightlock::Locker;

tokio::task_local! {
    /// The locks of the invocation whose handler runs in this task.
    static RECORDS: Arc<Records>;
}

/// The locks of the invocation the calling handler runs for, behind [`FlightlockLayer`]: a
/// lock per record of a batch, say. Every lock taken through it is released when the handler
/// returns (or fails, or panics), as the extension's lock API does for handlers in other
/// languages. `None` outside a handler behind the layer, or in a task the handler spawned
/// (call it in the handler's own task and pass the result along).
///
/// ```no_run
/// # async fn job(event: lambda_runtime::LambdaEvent<serde_json::Value>) -> Result<(), Box<dyn std::error::Error>> {
/// use flightlock::Wait;
/// use flightlock_lambda::records::RecordError;
///
/// let records = flightlock_lambda::records().expect("behind FlightlockLayer");
/// match records.acquire("order-7", Some(Wait::NoWait), None).await {
///     Ok(lock) => { /* process the record, fencing writes with lock.token */ }
///     Err(RecordError::Busy { .. }) => { /* report the record as a batch item failure */ }
///     Err(e) => return Err(e.into()),
/// }
/// # Ok(())
/// # }
/// ```
pub fn records() -> Option<Arc<Records>> {
    RECORDS.try_with(Arc::clone).ok()
}

/// The fencing token the layer handed to this invocation's handler: `flightlockTicket` in the
/// client context's `custom` (see [`crate::client_context`] for the other entries).
/// `None` for a handler not behind the layer.
///
/// ```no_run
/// # async fn job(event: lambda_runtime::LambdaEvent<serde_json::Value>) {
/// let token = flightlock_lambda::ticket(&event.context);
/// # }
/// ```
pub fn ticket(context: &LambdaContext) -> Option<u64> {
    context
        .client_context
        .as_ref()?
        .custom
        .get(TICKET)?
        .parse()
        .ok()
}

/// What the wrapped handler answers: its own response, or the skip body.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Gated<R> {
    /// The handler ran and answered this.
    Ran(R),
    /// The key was busy and `FLIGHTLOCK_ON_BUSY=skip`: `{"flightlock":{"skipped":true,...}}`.
    Skipped(serde_json::Value),
}

/// Builds [`Flightlock`] services. Cheap to clone; clones share one gate, which a SnapStart
/// restore renews (see the module docs).
#[derive(Debug, Clone)]
pub struct FlightlockLayer {
    gate: Arc<std::sync::RwLock<Gate>>,
}

impl FlightlockLayer {
    /// A layer from an explicit locker and configuration.
    pub fn new(locker: Locker, config: Config) -> FlightlockLayer {
        for warning in config.warnings() {
            tracing::warn!("{warning}");
        }
        let gate = Gate::new(Arc::new(config), locker, host_id());
        // A wrong table (keys, TTL) is reported at init with its fix (needs a runtime).
        gate.check_table_in_background();
        FlightlockLayer {
            gate: Arc::new(std::sync::RwLock::new(gate)),
        }
    }

    /// A layer configured by the `FLIGHTLOCK_*` variables in `env` (pass
    /// `std::env::vars().collect()`), with a DynamoDB client from the function's AWS settings.
    pub async fn from_env(env: &HashMap<String, String>) -> Result<FlightlockLayer, ConfigError> {
        let config = Config::from_map(env)?;
        // As in the extension: a hung attempt gives way to a retry inside the decision budget.
        let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(SDK_CONNECT_TIMEOUT)
                    .operation_attempt_timeout(SDK_ATTEMPT_TIMEOUT)
                    .build(),
            )
            .load()
            .await;
        let locker = Locker::new(aws_sdk_dynamodb::Client::new(&aws), &config.table);
        Ok(FlightlockLayer::new(locker, config))
    }

    /// The gate in force (cheap to clone).
    fn current_gate(&self) -> Gate {
        self.gate.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The configuration in force.
    pub fn config(&self) -> Config {
        self.current_gate().config().clone()
    }

    /// After a SnapStart restore: a new DynamoDB client (new connections) and a new host id
    /// for every clone of this layer. [`SnapStartResource::after_restore`] calls it.
    pub fn renew_after_restore(&self) {
        let host = host_id();
        let mut gate = self.gate.write().unwrap_or_else(|e| e.into_inner());
        *gate = gate.renewed(host.clone());
        tracing::info!(%host, "restored from a snapshot: new DynamoDB client and host id");
    }
}

impl SnapStartResource for FlightlockLayer {
    fn after_restore(&self) -> BoxFuture<'_, Result<(), lambda_runtime::Error>> {
        Box::pin(async move {
            self.renew_after_restore();
            Ok(())
        })
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
            tick = tracing::field::Empty,
            ticket = tracing::field::Empty,
            waited_ms = tracing::field::Empty
        );
        Box::pin(
            async move {
                let gate = &layer.current_gate();
                // Only a key template or a tick source that reads the event needs its bytes.
                let bytes = if gate.config().key.reads_event() || gate.config().tick.reads_event() {
                    serde_json::to_vec(&event.payload)
                        .map_err(|e| diagnostic(KEY_ERROR_TYPE, e.to_string()))?
                } else {
                    Vec::new()
                };
                let deadline = Some(event.context.deadline());
                let request_id = event.context.request_id.clone();
                // Tenant isolation mode: `lambda_runtime` reads the tenant id from the event's
                // `Lambda-Runtime-Aws-Tenant-Id` header into the context.
                let tenant = event.context.tenant_id.clone();
                // The handler's own locks (`records()`), given back when it returns.
                let records = Arc::new(Records::new(
                    gate.locker().clone(),
                    gate.shared_config(),
                    gate.holder(&request_id),
                    deadline,
                ));
                if !gate.config().gate {
                    // FLIGHTLOCK_GATE=off: no lock of the invocation's; the caller's reserved
                    // entries still go.
                    let mut event = event;
                    if let Some(context) = event.context.client_context.as_mut() {
                        context.custom.retain(|k, _| !is_reserved(k));
                    }
                    let result = RECORDS
                        .scope(records.clone(), inner.call(event))
                        .await
                        .map_err(Into::into);
                    records.close().await;
                    return result.map(Gated::Ran);
                }
                match gate
                    .decide(&request_id, deadline, &bytes, tenant.as_deref())
                    .await
                {
                    Outcome::Acquired(held) => {
                        // The handler learns its ticket, key, wait and tick as a handler
                        // behind the extension does: in the client context's `custom`.
                        // (`lambda_runtime` does not export the client context's type: an
                        // empty one is made by parsing, typed by the field.)
                        let mut event = event;
                        if event.context.client_context.is_none() {
                            event.context.client_context = serde_json::from_str("{}").ok();
                        }
                        if let Some(context) = event.context.client_context.as_mut() {
                            held.lock_context().apply(&mut context.custom);
                        }
                        let result: Result<R, Diagnostic> = RECORDS
                            .scope(records.clone(), inner.call(event))
                            .await
                            .map_err(Into::into);
                        // Only a handler that answered `Ok` marks the invocation's tick done.
                        let run = match result {
                            Ok(_) => Run::Succeeded,
                            Err(_) => Run::Failed,
                        };
                        futures::future::join(records.close(), gate.release(held, run)).await;
                        result.map(Gated::Ran)
                    }
                    Outcome::Skipped(body) => Ok(Gated::Skipped(body)),
                    Outcome::Failed {
                        error_type,
                        message,
                    } => Err(diagnostic(error_type, &message)),
                }
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responses::{skipped_body, SkipReason};

    #[test]
    fn gated_serializes_transparently() {
        let ran: Gated<serde_json::Value> = Gated::Ran(serde_json::json!({"a": 1}));
        assert_eq!(serde_json::to_string(&ran).unwrap(), r#"{"a":1}"#);
        let skipped: Gated<()> = Gated::Skipped(skipped_body(SkipReason::Busy, "k", None, &[]));
        assert_eq!(
            serde_json::to_value(&skipped).unwrap()["flightlock"]["skipped"],
            true
        );
    }
}
