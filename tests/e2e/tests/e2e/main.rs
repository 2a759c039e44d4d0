//! The end-to-end tests, one test binary: each binary links the AWS SDK and the whole harness,
//! so one binary instead of one per file saves a link and ~35 MB of disk per file on every
//! build. Run one group with a filter, e.g. `cargo test -p flightlock-e2e --test e2e memory::`.
//! See the crate docs for what each needs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod client_context;
mod context_readers;
mod curl_runtime;
mod deadline;
mod extension;
mod managed_instances;
mod managed_instances_processes;
mod memory;
mod node_powertools;
mod node_runtime;
mod platform_modes;
mod powertools;
mod records;
mod scheduled;
mod simulator;
mod wrapper;
