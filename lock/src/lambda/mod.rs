//! The Lambda integration, one module tree: what both adapters (the extension's proxy and the
//! in-process tower layer) share, and the layer itself.
//!
//! - [`config`]: the `FLIGHTLOCK_*` variables, parsed from an injected map.
//! - [`key`]: the key templates ([`key::KeyTemplate`]): a lock key rendered from the event and
//!   the tenant id.
//! - [`body`]: the error types and the error / skip bodies an invocation is answered with.
//! - [`gate`]: one decision per invocation (key, lock, skip or error, release) within the
//!   invocation's deadline.
//! - [`metrics`]: the EMF lines the gate and the extension print.
//! - `FlightlockLayer` (cargo feature `lambda`): the tower layer around a `lambda_runtime`
//!   handler. Everything else builds without the feature: the extension uses it without
//!   `lambda_runtime`.

pub mod body;
pub mod config;
pub mod gate;
pub mod key;
#[cfg(feature = "lambda")]
mod layer;
pub mod metrics;

#[cfg(feature = "lambda")]
pub use layer::*;
