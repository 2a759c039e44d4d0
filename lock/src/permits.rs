//! Changing a key's permits ([`crate::LockOptions::permits`]): operator tooling behind
//! `flightlock permits --key K --set N`, and the read behind `flightlock status`.
//!
//! A key has one number of permits, kept on its counter item (protocol 2 carries `permits = N`;
//! a key of one permit is protocol 1 and carries none). [`set_permits`] changes it:
//!
//! 1. one strongly consistent `Query` of the key's partition finds the counter, the seat and
//!    the highest ticket;
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
//! Setting the permits a key already has writes nothing ([`Change::Unchanged`]). Participants
//! configured with the old number fail closed with [`crate::Error::PermitsMismatch`] until they
//! are reconfigured; none grants beyond the key's number (see `docs/src/guide/n-at-a-time.md`).

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;

use crate::clock::SystemClock;
use crate::error::Error;
use crate::options::MAX_PERMITS;
use crate::retry::Policy;
use crate::schema::{
    self, queue_sk, validate_key, Snapshot, COUNTER_SK, OWNER, PERMITS_ATTR, PK, PROTOCOL_ATTR, SK,
};
use crate::status::QueueEntry;
use crate::storage::{Dynamo, Failure};
use crate::ClockSkew;

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

/// What a key's partition says: its queue classified against its permits, its protocol and
/// permits (1 without a counter or on protocol 1), and its highest ticket. One strongly
/// consistent read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// The queue, in ticket order (the first `permits` live entries hold).
    pub queue: Vec<QueueEntry>,
    /// The protocol the key runs.
    pub protocol: u32,
    /// The key's permits.
    pub permits: u32,
    /// Whether the key has a counter item.
    pub has_counter: bool,
    /// The highest ticket the counter or a row carries (0 for a key never used).
    pub highest_ticket: u64,
    /// The seated holder's ticket, if the counter's seat is taken.
    pub seat: Option<u64>,
}

/// Reads `key` on `table`: see [`KeyState`]. `skew` judges stale entries as
/// [`crate::Locker::queue`] does.
pub async fn read(
    client: &Client,
    table: &str,
    key: &str,
    skew: ClockSkew,
) -> Result<KeyState, Error> {
    validate_key(key)?;
    let dynamo = Dynamo::new(client.clone(), table);
    read_on(&dynamo, key, skew).await
}

async fn read_on(dynamo: &Dynamo, key: &str, skew: ClockSkew) -> Result<KeyState, Error> {
    let snap = retrying(|| query(dynamo, key)).await?;
    let highest_ticket = snap
        .rows
        .iter()
        .map(|r| r.ticket)
        .chain(snap.counter.as_ref().map(|c| c.last))
        .max()
        .unwrap_or(0);
    let skew = match skew {
        ClockSkew::Bounded(d) => d,
        ClockSkew::Unbounded => Duration::ZERO,
    };
    let wall_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(i64::MAX);
    Ok(KeyState {
        protocol: snap.protocol,
        permits: snap.counter.as_ref().map_or(1, |c| c.permits),
        has_counter: snap.counter.is_some(),
        highest_ticket,
        seat: snap.rows.iter().find(|r| r.seat).map(|r| r.ticket),
        queue: QueueEntry::classify(snap, wall_ms, skew),
    })
}

/// Sets `key`'s permits to `permits`: see the module docs. Retries every `poll` while the
/// counter's seat is taken, for at most `wait`.
pub async fn set_permits(
    client: &Client,
    table: &str,
    key: &str,
    permits: u32,
    wait: Duration,
    poll: Duration,
) -> Result<PermitsChange, PermitsError> {
    if !(1..=MAX_PERMITS).contains(&permits) {
        return Err(PermitsError::OutOfRange(permits));
    }
    validate_key(key)?;
    let dynamo = Dynamo::new(client.clone(), table);
    let started = tokio::time::Instant::now();
    let done = |change| PermitsChange {
        key: key.to_owned(),
        permits,
        change,
    };
    loop {
        let state = read_on(&dynamo, key, ClockSkew::Unbounded).await?;
        if state.has_counter && state.permits == permits {
            return Ok(done(Change::Unchanged));
        }
        if !state.has_counter {
            let last = state.highest_ticket;
            if retrying(|| create_counter(&dynamo, key, last, permits)).await? {
                return Ok(done(Change::Created { last }));
            }
            // Someone created it meanwhile: read again.
            continue;
        }
        match retrying(|| update_counter(&dynamo, key, permits)).await? {
            Updated::Yes => {
                return Ok(done(Change::Changed {
                    from: state.permits,
                }))
            }
            // The counter changed meanwhile (its permits, or it was deleted): read again.
            Updated::Retry => continue,
            Updated::SeatTaken(ticket) => {
                let waited = started.elapsed();
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
                tokio::time::sleep(poll.min(wait - waited)).await;
            }
        }
    }
}

/// How the requests here are retried: throttling, 5xx answers and lost connections, for at most
/// [`RETRY_FOR`]; what a user must fix (no credentials, a refused endpoint, a missing table,
/// access denied) is answered at once, named as the lock names it ([`Dynamo::classify`]).
const RETRY: Policy = Policy {
    base: Duration::from_millis(50),
    max: Duration::from_secs(1),
    attempts: u32::MAX,
};
const RETRY_FOR: Duration = Duration::from_secs(10);

async fn retrying<T, F, Fut>(mut request: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Failure>>,
{
    let deadline = tokio::time::Instant::now() + RETRY_FOR;
    let mut attempt = 0;
    loop {
        match request().await {
            Ok(v) => return Ok(v),
            Err(failure) => {
                if !RETRY
                    .pause(&failure, attempt, Some(deadline), &SystemClock)
                    .await
                {
                    return Err(failure.into_error());
                }
                attempt += 1;
            }
        }
    }
}

/// One strongly consistent `Query` of the key's counter and queue rows (every page).
async fn query(dynamo: &Dynamo, key: &str) -> Result<Snapshot, Failure> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let out = dynamo
            .client()
            .query()
            .table_name(dynamo.table())
            .key_condition_expression("#pk = :pk AND #sk BETWEEN :lo AND :hi")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#sk", SK)
            .expression_attribute_values(":pk", AttributeValue::S(key.to_owned()))
            .expression_attribute_values(":lo", AttributeValue::S(COUNTER_SK.to_owned()))
            .expression_attribute_values(":hi", AttributeValue::S(queue_sk(u64::MAX)))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| dynamo.classify("Query", e))?;
        items.extend(out.items.unwrap_or_default());
        start = out.last_evaluated_key.filter(|k| !k.is_empty());
        if start.is_none() {
            return Snapshot::from_items(key, &items).map_err(Failure::Fatal);
        }
    }
}

fn counter_key(key: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PK.to_owned(), AttributeValue::S(key.to_owned())),
        (SK.to_owned(), AttributeValue::S(COUNTER_SK.to_owned())),
    ])
}

/// The protocol a key of `permits` runs.
fn protocol_of(permits: u32) -> u32 {
    if permits > 1 {
        2
    } else {
        1
    }
}

/// Puts the counter if there is none: whether it was put. The protocol's own `CreateCounter`
/// (the same item an acquisition creates: `last`, `lastOwner` naming a creation, the version).
async fn create_counter(
    dynamo: &Dynamo,
    key: &str,
    last: u64,
    permits: u32,
) -> Result<bool, Failure> {
    use crate::storage::{Request, Response, Storage};
    let id = crate::schema::created_by(&crate::clock::new_id(&crate::clock::SystemClock), permits);
    let request = Request::CreateCounter {
        key: key.to_owned(),
        last,
        owner: id,
        protocol: protocol_of(permits),
        permits,
    };
    match dynamo.call(request).await? {
        Response::Created(created) => Ok(created),
        other => Err(Failure::Fatal(crate::Error::Dynamo {
            operation: "PutItem",
            source: format!("unexpected answer to a counter's creation: {other:?}").into(),
        })),
    }
}

enum Updated {
    Yes,
    Retry,
    SeatTaken(u64),
}

/// The conditioned `UpdateItem` of the counter.
async fn update_counter(dynamo: &Dynamo, key: &str, permits: u32) -> Result<Updated, Failure> {
    let names = HashMap::from([
        ("#pk".to_owned(), PK.to_owned()),
        ("#owner".to_owned(), OWNER.to_owned()),
        ("#permits".to_owned(), PERMITS_ATTR.to_owned()),
        (crate::protocol::NAME.to_owned(), PROTOCOL_ATTR.to_owned()),
    ]);
    let mut values = HashMap::from([
        (
            crate::protocol::VALUE.to_owned(),
            AttributeValue::N(crate::PROTOCOL.to_string()),
        ),
        (
            ":to".to_owned(),
            AttributeValue::N(protocol_of(permits).to_string()),
        ),
    ]);
    let update = if permits > 1 {
        values.insert(
            ":permits".to_owned(),
            AttributeValue::N(permits.to_string()),
        );
        "SET #proto = :to, #permits = :permits"
    } else {
        "SET #proto = :to REMOVE #permits"
    };
    let result = dynamo
        .client()
        .update_item()
        .table_name(dynamo.table())
        .set_key(Some(counter_key(key)))
        .update_expression(update)
        .condition_expression(format!(
            "attribute_exists(#pk) AND attribute_not_exists(#owner) AND {}",
            crate::protocol::CONDITION
        ))
        .set_expression_attribute_names(Some(names))
        .set_expression_attribute_values(Some(values))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await;
    match result {
        Ok(_) => Ok(Updated::Yes),
        Err(e) => {
            let refused = match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(refused)) => refused,
                _ => return Err(dynamo.classify("UpdateItem", e)),
            };
            let Some(old) = &refused.item else {
                return Ok(Updated::Retry); // no counter any more
            };
            // A newer protocol, or a counter this build cannot decode: its error.
            schema::Counter::from_item(key, old).map_err(Failure::Fatal)?;
            match schema::QueueRow::entry(key, old).map_err(Failure::Fatal)? {
                Some(seat) => Ok(Updated::SeatTaken(seat.ticket)),
                None => Ok(Updated::Retry),
            }
        }
    }
}
