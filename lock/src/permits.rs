//! Changing a key's permits ([`crate::LockOptions::permits`]): operator tooling behind
//! `flightlock permits --key K --set N`, and the read behind `flightlock status`.
//!
//! A key has one number of permits, kept on its counter item (protocol 2 carries `permits = N`;
//! a key of one permit is protocol 1 and carries none). [`set_permits`] changes it:
//!
//! 1. one strongly consistent read of the key's partition ([`Locker::state`]) finds the counter,
//!    the seat and the highest ticket;
//! 2. no counter: a `PutItem` (only if there is still none) creates it at the new permits with
//!    `last` = the highest ticket seen and `lastOwner` = `<fresh id>:<last>`, so tickets keep
//!    rising;
//! 3. else one `UpdateItem` of the counter (`SET protocol = 2, permits = N`, or for one permit
//!    `SET protocol = 1 REMOVE permits`), conditioned on the counter existing, on its seat being
//!    empty (a holder on the seat would lose its lock when its next heartbeat met the new
//!    version) and on its protocol being one this build speaks ([`crate::PROTOCOL`]). While the
//!    seat is taken it retries every `poll` until `wait` is over, then fails with
//!    [`PermitsError::SeatTaken`].
//!
//! Each is a request of the storage seam, retried as the locker retries its own.
//!
//! Setting the permits a key already has writes nothing ([`Change::Unchanged`]). Participants
//! configured with the old number fail closed with [`crate::Error::PermitsMismatch`] until they
//! are reconfigured; none grants beyond the key's number (see `docs/src/guide/n-at-a-time.md`).

use std::time::Duration;

use crate::error::Error;
use crate::protocol::MAX_PERMITS;
use crate::schema::validate_key;
use crate::storage::PermitsSet;
use crate::{ClockSkew, Locker};

/// How a [`set_permits`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "change")]
pub enum Change {
    /// The key already had these permits: nothing was written.
    Unchanged,
    /// The key had no counter: one was created at the new permits, `last` at the highest
    /// ticket seen (0 for a key never used).
    Created {
        /// The counter's `last`.
        last: u64,
    },
    /// The counter's permits were changed from `from`.
    Changed {
        /// The permits before.
        from: u32,
    },
}

/// What [`set_permits`] did: the key, its permits now, and the change.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PermitsChange {
    /// Lock key.
    pub key: String,
    /// The key's permits now.
    pub permits: u32,
    /// What changed.
    #[serde(flatten)]
    pub change: Change,
}

/// Why [`set_permits`] failed.
#[derive(Debug, thiserror::Error)]
pub enum PermitsError {
    /// `permits` is not 1 up to [`MAX_PERMITS`].
    #[error("permits {0} is out of range; use 1 (one at a time) up to {MAX_PERMITS}")]
    OutOfRange(u32),
    /// The counter's seat stayed taken for the whole wait.
    #[error(
        "lock `{key}`: the counter's seat stayed taken for {waited:.1?} (ticket {ticket} holds \
         it without a queue row), so its permits were not changed; changing them now would cost \
         that holder its lock at its next heartbeat. Retry when it is released, or with a longer \
         --wait"
    )]
    SeatTaken {
        /// Lock key.
        key: String,
        /// The seated holder's ticket.
        ticket: u64,
        /// How long we waited.
        waited: Duration,
    },
    /// The lock's own error: an invalid key, a newer protocol, a malformed counter, DynamoDB.
    #[error(transparent)]
    Lock(#[from] Error),
}

/// Sets `key`'s permits to `permits` on `locker`'s table: see the module docs. Retries every
/// `poll` while the counter's seat is taken, for at most `wait`.
pub async fn set_permits(
    locker: &Locker,
    key: &str,
    permits: u32,
    wait: Duration,
    poll: Duration,
) -> Result<PermitsChange, PermitsError> {
    if !(1..=MAX_PERMITS).contains(&permits) {
        return Err(PermitsError::OutOfRange(permits));
    }
    validate_key(key)?;
    let (store, clock) = (locker.store(), locker.clock());
    let started = clock.now();
    let done = |change| PermitsChange {
        key: key.to_owned(),
        permits,
        change,
    };
    loop {
        let state = locker.state(key, ClockSkew::Unbounded).await?;
        if state.has_counter && state.permits == permits {
            return Ok(done(Change::Unchanged));
        }
        if !state.has_counter {
            // The protocol's own counter creation (the item an acquisition creates), `last` at
            // the highest ticket seen so tickets keep rising.
            let last = state.highest_ticket;
            let owner = crate::schema::created_by(&crate::clock::new_id(clock), permits);
            let create = || store.create_counter(key, last, &owner, permits);
            if locker.retrying(locker.retry_deadline(), create).await? {
                return Ok(done(Change::Created { last }));
            }
            // Someone created it meanwhile: read again.
            continue;
        }
        let set = || store.set_permits(key, permits);
        match locker.retrying(locker.retry_deadline(), set).await? {
            PermitsSet::Set => {
                return Ok(done(Change::Changed {
                    from: state.permits,
                }))
            }
            // The counter changed meanwhile (its permits, or it was deleted): read again.
            PermitsSet::NoCounter | PermitsSet::Changed => continue,
            PermitsSet::SeatTaken(ticket) => {
                let waited = clock.now().duration_since(started);
                if waited >= wait {
                    return Err(PermitsError::SeatTaken {
                        key: key.to_owned(),
                        ticket,
                        waited,
                    });
                }
                tracing::info!(
                    key,
                    ticket,
                    "the counter's seat is taken; waiting for it to be released"
                );
                clock.sleep(poll.min(wait - waited)).await;
            }
        }
    }
}
