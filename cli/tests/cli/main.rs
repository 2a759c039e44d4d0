//! The `flightlock` CLI against a real local DynamoDB, run as the binary cargo builds for these
//! tests (`CARGO_BIN_EXE_flightlock`): its exit statuses, environment, stderr lines and JSON
//! (`run`, `status`, `permits`, `sweep`, `create-table`), and CLI processes as real holders and
//! waiters (SIGKILLed, signalled). Each test creates its own table. Run through
//! `scripts/dynamodb-local run -- cargo test -p flightlock-cli --test cli`.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;
mod crash;
mod failfast;
mod once;
mod permits;
mod run;
mod sweep;
mod usage;
mod versions;
