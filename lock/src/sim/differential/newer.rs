//! The differential test's key of a newer protocol (issue 25): created at `PROTOCOL + 1`, as a
//! newer build would create it, it receives a share of the requests too, and both sides must
//! refuse every write to its counter alike and write nothing to it.

use aws_sdk_dynamodb::types::AttributeValue;

use crate::sim::model::Table;
use crate::storage::Request;

/// A key that a newer protocol runs: its counter is created at `PROTOCOL + 1`, as a newer build
/// would create it, and a share of the requests is sent to it as well ([`retarget`]).
pub(super) const NEWER_KEY: &str = "k-newer";

/// `req` aimed at [`NEWER_KEY`] (a scan has no key: `None`). An enqueue expects the newer key's
/// counter as it stands, so that only its protocol can refuse it.
pub(super) fn retarget(req: &Request, model: &Table) -> Option<Request> {
    let key = NEWER_KEY.to_owned();
    let mut r = req.clone();
    match &mut r {
        Request::Scan(_) => return None,
        Request::Query { key: k, start, .. } => {
            *k = key;
            *start = None;
        }
        Request::Enqueue(e) => {
            e.key = key.clone();
            e.row
                .insert(crate::schema::PK.to_owned(), AttributeValue::S(key));
            e.token = format!("{}-newer", e.token);
            let counter = model.partition(NEWER_KEY).into_iter().find(|i| {
                matches!(i.get(crate::schema::SK), Some(AttributeValue::S(sk)) if sk == crate::schema::COUNTER_SK)
            });
            if let Some(c) = counter {
                let text = |name: &str| c.get(name).and_then(|v| v.as_s().ok()).cloned();
                let last = c.get(crate::schema::LAST).and_then(|v| v.as_n().ok());
                e.counter = crate::schema::Counter {
                    last: last.and_then(|l| l.parse().ok()).unwrap_or(0),
                    owner: text(crate::schema::LAST_OWNER),
                    tick_done: None,
                    tick_newest: None,
                    protocol: 1,
                    permits: 1,
                };
            }
        }
        Request::Heartbeat(b) => b.key = key,
        Request::SweepDead(d) => d.key = key,
        Request::DeleteStale { key: k, .. }
        | Request::DeleteOwned { key: k, .. }
        | Request::MarkDone { key: k, .. }
        | Request::TickRecorded { key: k, .. }
        | Request::RecordTick { key: k, .. }
        | Request::SetPermits { key: k, .. }
        | Request::CreateCounter { key: k, .. } => *k = key,
    }
    Some(r)
}

/// Whether a request is aimed at the counter's seat.
pub(super) fn seat_of(req: &Request) -> bool {
    match req {
        Request::Enqueue(r) => r.seat,
        Request::Heartbeat(beat) => beat.seat,
        Request::DeleteStale { seat, .. } | Request::DeleteOwned { seat, .. } => *seat,
        Request::SweepDead(d) => d.seat,
        _ => false,
    }
}

/// The differential test's key of 3 permits (issue 26): created at protocol 2 with `permits = 3`,
/// it receives a share of the requests sent with 3 permits (and some with 2 or 1: refused alike).
pub(super) const PERMITS_KEY: &str = "k-permits";

/// `req` aimed at [`PERMITS_KEY`], sent by a participant of `n` permits: its rows carry protocol 2
/// when `n` is above 1, its seat writes carry its version condition, and an enqueue expects the
/// key's counter as it stands (half the time: else the counter the request had).
pub(super) fn with_permits(req: &Request, model: &Table, n: u32) -> Option<Request> {
    use crate::protocol::Speaks;
    let key = PERMITS_KEY.to_owned();
    let mut r = req.clone();
    match &mut r {
        Request::Scan(_) | Request::MarkDone { .. } => return None,
        Request::Query { key: k, start, .. } => {
            *k = key;
            *start = None;
        }
        Request::Enqueue(e) => {
            if e.tick.is_some() {
                return None;
            }
            e.key = key.clone();
            e.permits = n;
            e.row
                .insert(crate::schema::PK.to_owned(), AttributeValue::S(key));
            if n > 1 {
                e.row.insert(
                    crate::schema::PROTOCOL_ATTR.to_owned(),
                    AttributeValue::N("2".into()),
                );
            }
            e.token = format!("{}-permits{n}", e.token);
            let counter = model.partition(PERMITS_KEY).into_iter().find(|i| {
                matches!(i.get(crate::schema::SK), Some(AttributeValue::S(sk)) if sk == crate::schema::COUNTER_SK)
            });
            if let Some(c) = counter.filter(|_| e.ticket % 2 == 0) {
                let text = |name: &str| c.get(name).and_then(|v| v.as_s().ok()).cloned();
                let last = c.get(crate::schema::LAST).and_then(|v| v.as_n().ok());
                e.counter.last = last.and_then(|l| l.parse().ok()).unwrap_or(0);
                e.counter.owner = text(crate::schema::LAST_OWNER);
                e.ticket = e.counter.last + 1;
                let sk = crate::schema::queue_sk(e.ticket);
                e.row
                    .insert(crate::schema::SK.to_owned(), AttributeValue::S(sk));
                e.row.insert(
                    crate::schema::TICKET.to_owned(),
                    AttributeValue::N(e.ticket.to_string()),
                );
            }
        }
        Request::Heartbeat(b) => {
            b.key = key;
            b.speaks = Speaks::maintain(n);
        }
        Request::SweepDead(d) => d.key = key,
        Request::DeleteStale { key: k, speaks, .. } => {
            *k = key;
            *speaks = Speaks::maintain(n);
        }
        Request::DeleteOwned {
            key: k,
            speaks,
            done,
            ..
        } => {
            if done.is_some() {
                return None;
            }
            *k = key;
            *speaks = Speaks::maintain(n);
        }
        Request::TickRecorded { key: k, .. }
        | Request::RecordTick { key: k, .. }
        | Request::SetPermits { key: k, .. } => *k = key,
        Request::CreateCounter {
            key: k,
            protocol,
            permits,
            ..
        } => {
            *k = key;
            *permits = n;
            *protocol = Speaks::Permits(n).protocol();
        }
    }
    Some(r)
}
