//! How requests, answers and failures are written in traces, and the kind of an answer in the
//! coverage table.

use crate::storage::{Enqueue, Failure, Request, Response};

/// A short description of a request, for traces.
pub(crate) fn describe(r: &Request) -> String {
    match r {
        Request::Query { key, start, range } => format!(
            "Query({key}{}{})",
            match range {
                crate::storage::Range::All => String::new(),
                crate::storage::Range::Below { ticket, limit } => {
                    format!(" <= t{ticket} desc limit {limit}")
                }
                crate::storage::Range::Lowest => " lowest".to_owned(),
            },
            if start.is_some() { ", next page" } else { "" }
        ),
        Request::Enqueue(e) => format!(
            "{}({} t{} counter {} by {} owner {})",
            if e.seat { "TakeSeat" } else { "Enqueue" },
            e.key,
            e.ticket,
            e.counter.last,
            e.counter
                .owner
                .as_deref()
                .map_or("-", |o| &o[..6.min(o.len())]),
            &e.owner[..6.min(e.owner.len())]
        ),
        Request::DeleteStale {
            key,
            ticket,
            seat,
            rvn,
            ..
        } => {
            format!(
                "DeleteStale({key} t{ticket}{} rvn {})",
                if *seat { " seat" } else { "" },
                &rvn[..6.min(rvn.len())]
            )
        }
        Request::SweepDead(d) => format!(
            "SweepDead({} t{}{} rvn {} before {})",
            d.key,
            d.ticket,
            if d.seat { " seat" } else { "" },
            &d.rvn[..6.min(d.rvn.len())],
            d.cutoff_ms
        ),
        Request::Scan(r) => format!(
            "Scan(segment {}/{} before {}{})",
            r.segment,
            r.total_segments,
            r.cutoff_ms,
            if r.start.is_some() { ", next page" } else { "" }
        ),
        Request::Heartbeat(b) => format!(
            "Heartbeat({} t{}{} until {} rvn {})",
            b.key,
            b.ticket,
            if b.seat { " seat" } else { "" },
            b.lease_until_ms,
            &b.rvn[..6.min(b.rvn.len())]
        ),
        Request::DeleteOwned {
            key,
            ticket,
            seat,
            done,
            ..
        } => format!(
            "DeleteOwned({key} t{ticket}{}{})",
            if *seat { " seat" } else { "" },
            done.map_or(String::new(), |d| format!(" done {d}"))
        ),
        Request::CreateCounter { key, last, .. } => format!("CreateCounter({key} at {last})"),
        Request::MarkDone { key, tick } => format!("MarkDone({key} tick {tick})"),
        Request::TickRecorded { key, id } => format!("TickRecorded({key} {id})"),
        Request::RecordTick { key, id, .. } => format!("RecordTick({key} {id})"),
        Request::SetPermits { key, permits } => format!("SetPermits({key} to {permits})"),
    }
}

/// The kind of outcome a request met, for the coverage table: the request (`seat` for the
/// counter's seat) and its answer, without values.
pub(super) fn kind(request: &Request, response: &Response) -> String {
    let (seat, what) = match request {
        Request::Query { .. } => (false, "Query"),
        Request::Enqueue(e) if e.seat => (false, "TakeSeat"),
        Request::Enqueue(_) => (false, "Enqueue"),
        Request::DeleteStale { seat, .. } => (*seat, "DeleteStale"),
        Request::SweepDead(d) => (d.seat, "SweepDead"),
        Request::Scan(_) => (false, "Scan"),
        Request::Heartbeat(b) => (b.seat, "Heartbeat"),
        Request::CreateCounter { .. } => (false, "CreateCounter"),
        Request::DeleteOwned {
            seat, done: None, ..
        } => (*seat, "DeleteOwned"),
        Request::DeleteOwned { seat, .. } => (*seat, "DeleteOwnedDone"),
        Request::MarkDone { .. } => (false, "MarkDone"),
        Request::TickRecorded { .. } => (false, "TickRecorded"),
        Request::RecordTick { .. } => (false, "RecordTick"),
        Request::SetPermits { .. } => (false, "SetPermits"),
    };
    let answer = match response {
        Response::Page { .. } | Response::Scanned { .. } => "page".to_owned(),
        Response::Enqueue(Enqueue::CounterAt(_)) => "CounterAt".to_owned(),
        Response::Enqueue(e) => format!("{e:?}"),
        Response::StaleDelete(o) => format!("{o:?}"),
        Response::Renewal(o) => format!("{o:?}"),
        Response::Owned(o) => format!("{o:?}"),
        Response::Created(c) => format!("{c}"),
        Response::Marked(m) => format!("marked {m}"),
        Response::Recorded(r) => format!("recorded {r}"),
        Response::PermitsSet(p) => format!("{p:?}"),
    };
    format!("{}{what} {answer}", if seat { "seat " } else { "" })
}

pub(super) fn describe_response(r: &Response) -> String {
    match r {
        Response::Page { items, next } => format!(
            "{} items{}",
            items.len(),
            if next.is_some() { ", more" } else { "" }
        ),
        Response::Scanned {
            items,
            scanned,
            next,
        } => format!(
            "{} of {scanned} items{}",
            items.len(),
            if next.is_some() { ", more" } else { "" }
        ),
        Response::Enqueue(e) => format!("{e:?}"),
        Response::StaleDelete(o) => format!("{o:?}"),
        Response::Renewal(o) => format!("{o:?}"),
        Response::Owned(o) => format!("{o:?}"),
        Response::Created(c) => format!("created: {c}"),
        Response::Marked(m) => format!("marked: {m}"),
        Response::Recorded(r) => format!("recorded: {r}"),
        Response::PermitsSet(p) => format!("permits: {p:?}"),
    }
}

impl Failure {
    /// A one-line description (traces and the differential test).
    pub(crate) fn describe(&self) -> String {
        match self {
            Failure::Retry {
                throttled, source, ..
            } => format!("retry(throttled={throttled}): {source}"),
            Failure::Fatal(e) => format!("fatal: {e}"),
        }
    }
}
