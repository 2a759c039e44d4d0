//! Protocol tests against a real local DynamoDB (DynamoDB Local or moto), one module per
//! guarantee of `lock/PROTOCOL.md` ("Guarantees: mechanism and proof"). Each test creates its own table. Run them through the README's
//! test command (`scripts/test`), which starts the server on 127.0.0.1 and sets `AWS_ENDPOINT_URL_DYNAMODB`.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;
mod defects;
mod errors;
mod exclusion;
mod faults;
mod fifo;
mod lost;
mod pacing;
mod skew;
mod ticks;
mod wait;
// Issue 25: the protocol's version on the table, and the snapshot of its requests.
mod snapshot;
mod versions;
// Issue 26: N at a time.
mod permits;
