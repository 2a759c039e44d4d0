//! CloudWatch Embedded Metric Format (EMF) lines, printed to stdout, namespace `flightlock`:
//! the same metrics as the in-process layer, defined once in [`flightlock_lambda::gate`].
//!
//! One line per event, dimension `FunctionName`. Lambda ships stdout to CloudWatch Logs, which
//! turns EMF lines into metrics without any API call.

pub use flightlock_lambda::metrics::{emf_line, Metric, Metrics, NAMESPACE};
