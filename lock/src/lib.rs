//! # flightlock
//!
//! A FIFO, fenced, self-cleaning lock on DynamoDB: a ticket queue per key, heartbeats, fencing
//! tokens, and dead participants passed over without waiting for TTL.
//!
//! This crate is the lock and nothing else. The Lambda integration (the `FLIGHTLOCK_*`
//! configuration, key templates, the per-invocation gate, and a tower layer for `lambda_runtime`)
//! is the crate `flightlock-lambda` (`lambda/`); the `flightlock` command-line tool is the crate
//! `flightlock-cli` (`cli/`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), flightlock::Error> {
//! use flightlock::{Locker, LockOptions, Wait};
//! use std::time::Duration;
//!
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let locker = Locker::new(aws_sdk_dynamodb::Client::new(&config), "flightlock");
//! let opts = LockOptions { wait: Wait::For(Duration::from_secs(30)), ..Default::default() };
//! let guard = locker.acquire("nightly-report", &opts).await?;
//! println!("fencing token {}", guard.token());
//! // ... critical section; `guard.lost()` resolves if the lock is lost ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Layout
//!
//! | module | what |
//! |---|---|
//! | `storage` | the protocol's and the sweep's requests as values, the seam they cross, the answer readers (`answers`), and the DynamoDB shell (`dynamo`: one API call each, I/O) |
//! | `sim` | (tests) deterministic simulation of the protocol against a model of the table |
//! | `schema` | table schema: attribute names, sort keys, item encoding (pure) |
//! | `options` | [`LockOptions`], [`Wait`], [`ClockSkew`], duration syntax (pure) |
//! | `liveness` | when a row is stale; poll and backoff schedules (pure) |
//! | `clock` | wall and monotonic time, injectable ([`SkewedClock`] for tests); ids |
//! | `retry` | the one retry policy: backoff within attempts and a deadline |
//! | `error` | the crate's one error type |
//! | `locker` | the acquisition protocol: [`Locker`] |
//! | `memory` | what a process remembers between calls: hints, hold times, local waiters |
//! | `membership` | our row in the queue: its heartbeat, the lost signal, leaving (and a tick's done mark) |
//! | `guard` | [`LockGuard`]: token, lost signal, release |
//! | `status` | inspecting a key's queue ([`QueueEntry`]) |
//! | `holder` | [`HolderInfo`]: who holds or waits, for people |
//! | `protocol` | the protocol's version on the table: [`PROTOCOL`], the condition and the check every participant makes |
//! | `table` | creating and checking the table |
//! | `tick` | once per tick: [`Tick`], the watermark and the per-id record, the crash window |
//! | `permits` | changing a key's permits ([`LockOptions::permits`]) behind `flightlock permits`, and the read behind `flightlock status` |
//! | `sweep` | the sweeper behind the cleanup function and `flightlock sweep`: pagination, concurrency, the summary |
//!
//! ## Guarantees
//!
//! The protocol as a state machine, each guarantee's mechanism and proof, and the limits that
//! remain: `lock/PROTOCOL.md`.
//!
//! 1. **Mutual exclusion**: at most one live holder per key. A holder that can no longer be sure
//!    of its lease learns it (the lost signal) before anyone else can be granted the key, as long
//!    as wall clocks agree within [`ClockSkew::Bounded`] (or always, in clock-free mode).
//! 2. **FIFO**: the key is granted in ticket order; a holder that asks again queues at the back.
//! 3. **Bounded wait**: see [`Wait`]; giving up removes our row.
//! 4. **Dead holders are passed over** within one lease plus the allowance and one poll, never
//!    relying on TTL.
//! 5. **Self-cleaning**: waiters delete dead rows ahead of them (conditionally on their `rvn`);
//!    the sweeper and TTL remove the rest.
//! 6. **Safe release**: the heartbeat stops first; a late heartbeat cannot bring a row back.
//! 7. **Once per tick** (with [`LockOptions::tick`]): a tick whose run released with
//!    [`LockGuard::release_done`] is never granted again ([`Error::TickDone`]); a run that
//!    released with [`LockGuard::release`], crashed or lost its lock marks nothing. See [`tick`]
//!    for the costs and the crash window.

pub mod clock;
pub mod error;
mod guard;
mod holder;
pub(crate) mod liveness;
mod locker;
mod membership;
mod memory;
#[cfg(test)]
mod mutant;
pub mod options;
pub mod permits;
pub mod protocol;
mod retry;
pub mod schema;
#[cfg(test)]
mod sim;
mod status;
mod storage;
pub mod sweep;
pub mod table;
pub mod tick;

pub use clock::{Clock, SkewedClock, SystemClock};
pub use error::{Error, HeldBy};
pub use guard::{LockGuard, LostSignal, ReleaseOutcome};
pub use holder::HolderInfo;
pub use locker::Locker;
pub use membership::LostReason;
pub use options::{parse_duration, parse_switch, ClockSkew, LockOptions, Wait};
pub use protocol::{MAX_PERMITS, PROTOCOL};
pub use status::{EntryState, KeyState, QueueEntry};
pub use sweep::{SweepOptions, SweepSummary, Sweeper};
pub use tick::Tick;
