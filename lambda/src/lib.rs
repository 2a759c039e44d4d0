//! # flightlock-lambda
//!
//! The Lambda integration of the [`flightlock`] lock: what the Lambda extension's proxy
//! (`extension/`) and the in-process tower layer for `lambda_runtime` handlers share, and the
//! layer itself. Pure parts (configuration, key templates, ticks, bodies, the client context)
//! have no I/O; the gate is the one place that takes the lock for an invocation.
//!
//! ```no_run
//! # #[cfg(feature = "layer")]
//! # async fn demo() -> Result<(), lambda_runtime::Error> {
//! use flightlock_lambda::FlightlockLayer;
//! use lambda_runtime::tower::ServiceBuilder;
//! use lambda_runtime::{service_fn, LambdaEvent};
//!
//! async fn job(_: LambdaEvent<serde_json::Value>) -> Result<serde_json::Value, lambda_runtime::Error> {
//!     Ok(serde_json::json!({"done": true}))
//! }
//!
//! let layer = FlightlockLayer::from_env(&std::env::vars().collect()).await?;
//! lambda_runtime::run(ServiceBuilder::new().layer(layer).service(service_fn(job))).await
//! # }
//! ```
//!
//! ## Layout
//!
//! | module | what |
//! |---|---|
//! | [`config`] | the `FLIGHTLOCK_*` variables, parsed from an injected map (pure) |
//! | [`key`] | the key templates ([`key::KeyTemplate`]): a lock key rendered from the event and the tenant id (pure) |
//! | [`tick`] | the invocation's tick (`FLIGHTLOCK_TICK`: an EventBridge scheduled event's `time` by default, or a template) (pure) |
//! | [`client_context`] | what the handler learns about its lock (ticket, key, wait, tick), merged into the invocation's client context (pure) |
//! | [`responses`] | the error types and the error / skip bodies an invocation is answered with (pure) |
//! | [`gate`] | one decision per invocation (key, tick, lock, skip or error, release marking the tick done or not) within the invocation's deadline |
//! | [`metrics`] | the EMF lines the gate and the extension print |
//! | [`records`] | locks a handler takes for itself while its invocation runs (a lock per record), all released when it ends: behind the extension's lock API and the layer's `records()` |
//! | `layer` | `FlightlockLayer` (cargo feature `layer`): the tower layer around a `lambda_runtime` handler. Everything else builds without the feature: the extension uses the crate without `lambda_runtime` |

pub mod client_context;
pub mod config;
pub mod gate;
pub mod key;
#[cfg(feature = "layer")]
mod layer;
pub mod metrics;
pub mod records;
pub mod responses;
pub mod tick;

#[cfg(feature = "layer")]
pub use layer::*;
