//! The answer readers: what a refused conditional write means, read from the item the condition
//! failed on (`ReturnValuesOnConditionCheckFailure = ALL_OLD`, or a transaction's cancellation
//! reasons). Pure functions of the seam's types, shared by the DynamoDB shell
//! ([`super::dynamo`]) and the simulation's model, so the two can only differ in what they
//! store, never in how an answer is read.

use super::{
    Enqueue, EnqueueRequest, Failure, Item, Owned, PermitsSet, Renewal, Speaks, StaleDelete,
};
use crate::schema;

/// A refused write that touched `key`'s counter: [`crate::Error::ProtocolTooNew`] if the counter
/// as it stood (`ALL_OLD`) says the key runs a newer protocol than this build speaks, whatever
/// else the refusal means. Every reader of a refused counter write asks this first.
///
/// `speaks` is what the write was conditioned on: a participant's permits, refused on a key of
/// other permits, is [`crate::Error::PermitsMismatch`]. No counter: nothing to check (see
/// `lock/PROTOCOL.md`, "What remains assumed").
pub(crate) fn protocol_refused(
    key: &str,
    counter: Option<&Item>,
    speaks: Speaks,
) -> Result<(), Failure> {
    let agreed = match (speaks, counter) {
        // A counter this build cannot decode is not ours to judge either: `from_item` checks the
        // protocol first.
        (Speaks::Permits(configured), Some(item)) => schema::Counter::from_item(key, item)
            .and_then(|c| crate::protocol::agree_permits(key, c.permits, configured)),
        _ => crate::protocol::check(key, counter),
    };
    agreed.map_err(Failure::Fatal)
}

/// What a refused [`super::Request::SetPermits`] means, from the counter as it stood
/// (`ALL_OLD`): no counter, a newer protocol or a counter this build cannot decode (its error),
/// a taken seat, or a counter that changed since it was read.
pub(crate) fn permits_refused(key: &str, counter: Option<&Item>) -> Result<PermitsSet, Failure> {
    let Some(old) = counter else {
        return Ok(PermitsSet::NoCounter);
    };
    schema::Counter::from_item(key, old).map_err(Failure::Fatal)?;
    Ok(
        match schema::QueueRow::entry(key, old).map_err(Failure::Fatal)? {
            Some(seat) => PermitsSet::SeatTaken(seat.ticket),
            None => PermitsSet::Changed,
        },
    )
}

/// What a refused heartbeat means, from the item the condition failed on.
pub(crate) fn renewal_refused(item: Option<&Item>, owner: &str) -> Renewal {
    let ours = item
        .and_then(|it| it.get(schema::OWNER))
        .is_some_and(|o| o.as_s().is_ok_and(|o| o == owner));
    if ours {
        Renewal::Superseded
    } else {
        Renewal::Gone
    }
}

/// What a refused seat enqueue means, from the counter as it stood (`ALL_OLD`): the seat ours
/// (an earlier attempt of this request landed), or the counter as it is.
pub(crate) fn seat_refused(r: &EnqueueRequest, counter: Option<&Item>) -> Result<Enqueue, Failure> {
    let Some(item) = counter else {
        return Ok(Enqueue::CounterAt(None));
    };
    protocol_refused(&r.key, Some(item), Speaks::Permits(r.permits))?;
    if let Some(ours) = ours(r, item) {
        return Ok(ours);
    }
    let snap = crate::schema::Snapshot::from_items(&r.key, [item]).map_err(Failure::Fatal)?;
    Ok(Enqueue::CounterAt(snap.counter))
}

/// Whether the entry `item` (as it stood when our write was refused) is ours: this very
/// request's version ([`Enqueue::AlreadyOurs`]), or one an earlier request of ours wrote
/// ([`Enqueue::OursOlder`]).
fn ours(r: &EnqueueRequest, item: &Item) -> Option<Enqueue> {
    let text = |it: &Item, name: &str| it.get(name).and_then(|v| v.as_s().ok()).cloned();
    if text(item, schema::OWNER).as_deref() != Some(r.owner.as_str()) {
        return None;
    }
    Some(if text(item, schema::RVN) == text(&r.row, schema::RVN) {
        Enqueue::AlreadyOurs
    } else {
        Enqueue::OursOlder
    })
}

/// What a refused stale-seat removal means, from the counter as it stood: the seat still holds
/// the entry judged (`ticket`) with a new version (`Revived`), or it holds another entry or none.
pub(crate) fn seat_judged(counter: Option<&Item>, ticket: u64) -> StaleDelete {
    let same = counter
        .and_then(|c| c.get(schema::TICKET))
        .is_some_and(|t| t.as_n().is_ok_and(|t| t.parse() == Ok(ticket)));
    if same {
        StaleDelete::Revived
    } else {
        StaleDelete::Gone
    }
}

/// What a refused removal of a dead row means, from the row as it stood: still there (its owner
/// heartbeated, or it is another entry now) is `Revived`, absent is `Gone`.
pub(crate) fn row_judged(row: Option<&Item>) -> StaleDelete {
    match row {
        Some(_) => StaleDelete::Revived,
        None => StaleDelete::Gone,
    }
}

/// What a cancelled enqueue transaction means, from its two cancellation reasons (code and the
/// item the condition failed on: the counter's, then the row's). `None`: none of the protocol's
/// outcomes; the caller classifies the error.
pub(crate) fn enqueue_outcome(
    r: &EnqueueRequest,
    reasons: &[(&str, Option<&Item>)],
) -> Result<Option<Enqueue>, Failure> {
    let code = |i: usize| reasons.get(i).map_or("None", |r| r.0);
    let item = |i: usize| reasons.get(i).and_then(|r| r.1);
    if code(0) == "ConditionalCheckFailed" {
        protocol_refused(&r.key, item(0), Speaks::Permits(r.permits))?;
    }
    if code(1) == "ConditionalCheckFailed" {
        if let Some(ours) = item(1).and_then(|it| ours(r, it)) {
            return Ok(Some(ours));
        }
    }
    if code(0) == "ConditionalCheckFailed" {
        let last = match item(0) {
            None => None,
            Some(it) => {
                crate::schema::Snapshot::from_items(&r.key, [it])
                    .map_err(Failure::Fatal)?
                    .counter
            }
        };
        return Ok(Some(Enqueue::CounterAt(last)));
    }
    if code(1) == "ConditionalCheckFailed" {
        return Ok(Some(Enqueue::TicketTaken));
    }
    if reasons.iter().any(|r| r.0 == "TransactionConflict") {
        return Ok(Some(Enqueue::Conflict));
    }
    Ok(None)
}

/// What a refused seat release that marks a tick means, from the counter as it stood: the seat
/// still ours (owner and ticket) is [`Owned::NotMarked`] (a newer tick is marked), anything else
/// is [`Owned::No`].
pub(crate) fn seat_release_refused(counter: Option<&Item>, owner: &str, ticket: u64) -> Owned {
    let ours = counter.is_some_and(|c| {
        c.get(schema::OWNER)
            .is_some_and(|o| o.as_s().is_ok_and(|o| o == owner))
            && c.get(schema::TICKET)
                .is_some_and(|t| t.as_n().is_ok_and(|t| t.parse() == Ok(ticket)))
    });
    if ours {
        Owned::NotMarked
    } else {
        Owned::No
    }
}
