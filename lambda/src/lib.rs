//! The Lambda integration, one module tree: what both adapters (the extension's proxy and the
//! in-process tower layer) share, and the layer itself.
//!
//! - [`config`]: the `FLIGHTLOCK_*` variables, parsed from an injected map.
//! - [`key`]: the key templates ([`key::KeyTemplate`]): a lock key rendered from the event and
//!   the tenant id.
//! - [`client_context`]: what the handler learns about its lock (ticket, key, wait, tick),
//!   merged into the invocation's client context.
//! - [`body`]: the error types and the error / skip bodies an invocation is answered with.
//! - [`tick`]: the invocation's tick (`FLIGHTLOCK_TICK`: an EventBridge scheduled event's
//!   `time` by default, or a template), and the stale bound (`FLIGHTLOCK_STALE_AFTER`).
//! - [`gate`]: one decision per invocation (key, tick, lock, skip or error, release marking the
//!   tick done or not) within the invocation's deadline.
//! - [`metrics`]: the EMF lines the gate and the extension print.
//! - `FlightlockLayer` (cargo feature `lambda`): the tower layer around a `lambda_runtime`
//!   handler. Everything else builds without the feature: the extension uses it without
//!   `lambda_runtime`.

pub mod body;
pub mod client_context;
pub mod config;
pub mod gate;
pub mod key;
#[cfg(feature = "lambda")]
mod layer;
pub mod metrics;
pub mod tick;

#[cfg(feature = "lambda")]
pub use layer::*;
