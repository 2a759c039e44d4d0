//! The semantics of each request of the storage seam: its condition evaluated and its writes
//! applied at one instant, a transaction all-or-nothing, an idempotency token remembered.

use aws_sdk_dynamodb::types::AttributeValue;
use tokio::time::Instant;

use super::{conditional_failed, entry_sk, num, string, Mutation, Remover, Table, TOKEN_WINDOW};
use crate::error::Error;
use crate::schema::{self, Snapshot, COUNTER_SK};
use crate::storage::answers::{
    enqueue_outcome, permits_refused, protocol_refused, renewal_refused, row_judged, seat_judged,
    seat_refused,
};
use crate::storage::{
    EnqueueRequest, Failure, Item, Owned, PermitsSet, Renewal, Request, Response, Speaks,
    StaleDelete,
};

impl Table {
    /// Applies one request at server instant `now`.
    pub(crate) fn apply(&mut self, request: &Request, now: Instant) -> Result<Response, Failure> {
        self.count_request();
        // A single-item write to the counter is conditioned on a protocol we speak, and its
        // refusal read as `storage/answers.rs` reads it (the enqueue transaction's counter half
        // is in `counter_check`).
        if let Some((key, speaks)) = counter_write(request) {
            protocol_refused(key, self.get(key, COUNTER_SK), speaks)?;
        }
        match request {
            Request::Query { key, start, range } => Ok(match range {
                crate::storage::Range::All => self.query(key, start.as_ref()),
                crate::storage::Range::Below { ticket, limit } => {
                    self.as_shown(self.query_below(key, start.as_ref(), *ticket, *limit))
                }
                crate::storage::Range::Lowest => self.as_shown(self.query_lowest(key)),
            }),
            Request::Enqueue(r) => self.enqueue(r, now),
            Request::DeleteStale {
                key,
                ticket,
                seat,
                rvn,
                ..
            } => {
                let outcome = self.remove_dead(key, *ticket, *seat, rvn, None, now);
                self.count_stale(outcome);
                Ok(Response::StaleDelete(outcome))
            }
            Request::SweepDead(d) => {
                // The sweep's row removal is conditioned on the row's own protocol (a seat's is
                // the counter's, checked above).
                if !d.seat {
                    let sk = entry_sk(d.ticket, d.seat);
                    protocol_refused(&d.key, self.get(&d.key, &sk), Speaks::Any)?;
                }
                let sweep = Some((d.owner.as_str(), d.cutoff_ms));
                let outcome = self.remove_dead(&d.key, d.ticket, d.seat, &d.rvn, sweep, now);
                if outcome == StaleDelete::Deleted {
                    self.outcomes.swept += 1;
                }
                Ok(Response::StaleDelete(outcome))
            }
            Request::Scan(r) => Ok(self.scan(r, now)),
            Request::Heartbeat(beat) => {
                let sk = entry_sk(beat.ticket, beat.seat);
                let current = self.get(&beat.key, &sk);
                let owner_ok = current
                    .and_then(|i| string(i, schema::OWNER))
                    .is_some_and(|o| o == beat.owner);
                let lease_ok = self.mutation == Some(Mutation::HeartbeatRollback)
                    || current
                        .and_then(|i| num(i, schema::LEASE_UNTIL_MS))
                        .is_some_and(|u| u <= beat.lease_until_ms);
                let upsert = || {
                    let mut item = crate::storage::entry_key(&beat.key, beat.ticket, beat.seat);
                    item.insert(schema::OWNER.into(), AttributeValue::S(beat.owner.clone()));
                    item.insert(schema::TICKET.into(), schema::n(beat.ticket));
                    item.insert(schema::LEASE_MS.into(), schema::n(1000));
                    item
                };
                let item = match current.cloned() {
                    Some(item) => Some(item),
                    None if self.mutation == Some(Mutation::HeartbeatUpsert) && !beat.seat => {
                        Some(upsert())
                    }
                    None => None,
                };
                let upserted = current.is_none();
                let Some(mut item) = item else {
                    return Ok(Response::Renewal(Renewal::Gone));
                };
                let (owner_ok, lease_ok) = if upserted {
                    (true, true)
                } else {
                    (owner_ok, lease_ok)
                };
                if !(owner_ok && lease_ok) {
                    let r = renewal_refused(Some(&item), &beat.owner);
                    if r == Renewal::Superseded {
                        self.outcomes.heartbeat_superseded += 1;
                    }
                    return Ok(Response::Renewal(r));
                }
                let n = |v: i64| AttributeValue::N(v.to_string());
                item.insert(schema::LEASE_UNTIL_MS.into(), n(beat.lease_until_ms));
                if !beat.seat {
                    item.insert(schema::EXPIRES_AT.into(), n(beat.expires_at));
                }
                item.insert(schema::RVN.into(), AttributeValue::S(beat.rvn.clone()));
                if let Some(at) = beat.acquired_at_ms {
                    item.entry(schema::ACQUIRED_AT_MS.into()).or_insert(n(at));
                }
                self.put(item, now);
                Ok(Response::Renewal(Renewal::Renewed))
            }
            Request::CreateCounter {
                key,
                last,
                owner,
                protocol,
                permits,
            } => {
                if self.get(key, COUNTER_SK).is_some() {
                    return Ok(Response::Created(false));
                }
                let by = schema::last_owner(owner, *last);
                self.set_counter(key, *last, Some(&by), now);
                if let Some(mut counter) = self.get(key, COUNTER_SK).cloned() {
                    counter.insert(schema::PROTOCOL_ATTR.into(), schema::n(*protocol));
                    if *permits > 1 {
                        counter.insert(schema::PERMITS_ATTR.into(), schema::n(*permits));
                    }
                    self.put(counter, now);
                }
                Ok(Response::Created(true))
            }
            Request::SetPermits { key, permits } => {
                // `attribute_exists(pk) AND attribute_not_exists(owner)`, the protocol checked
                // above; a refusal is read as `storage/answers.rs` reads it.
                let counter = self.get(key, COUNTER_SK);
                let Some(mut counter) = counter.filter(|c| !c.contains_key(schema::OWNER)).cloned()
                else {
                    return permits_refused(key, counter).map(Response::PermitsSet);
                };
                let protocol = Speaks::Permits(*permits).protocol();
                counter.insert(schema::PROTOCOL_ATTR.into(), schema::n(protocol));
                if *permits > 1 {
                    counter.insert(schema::PERMITS_ATTR.into(), schema::n(*permits));
                } else {
                    counter.remove(schema::PERMITS_ATTR);
                }
                self.put(counter, now);
                Ok(Response::PermitsSet(PermitsSet::Set))
            }
            Request::DeleteOwned {
                key,
                ticket,
                seat: true,
                owner,
                done: Some(tick),
                ..
            } => Ok(Response::Owned(
                self.release_seat_done(key, *ticket, owner, *tick, now),
            )),
            Request::MarkDone { .. }
            | Request::TickRecorded { .. }
            | Request::RecordTick { .. } => Ok(self.apply_tick(request, now)),
            Request::DeleteOwned {
                key,
                ticket,
                seat,
                owner,
                ..
            } => {
                let sk = entry_sk(*ticket, *seat);
                // The seat's release is conditioned on its ticket too (`storage/dynamo.rs`): the seat may
                // hold a later entry of the same owner. A row's ticket is its sort key.
                let ours = self.get(key, &sk).is_some_and(|i| {
                    string(i, schema::OWNER) == Some(owner.as_str())
                        && num(i, schema::TICKET) == i64::try_from(*ticket).ok()
                });
                if ours && *seat {
                    self.vacate(key, now, None);
                    Ok(Response::Owned(Owned::Yes))
                } else if ours {
                    self.remove(key, &sk, now, None);
                    if self.mutation == Some(Mutation::ReleaseFreesOther) {
                        self.free_another(key, now);
                    }
                    Ok(Response::Owned(Owned::Yes))
                } else {
                    Ok(Response::Owned(Owned::No))
                }
            }
        }
    }

    /// The counter half of the enqueue transaction: its condition, and the cancellation reason.
    fn counter_check(&self, r: &EnqueueRequest) -> (bool, Option<Item>) {
        let counter = self.get(&r.key, COUNTER_SK).cloned();
        let last = counter.as_ref().and_then(|c| num(c, schema::LAST));
        let by = counter
            .as_ref()
            .and_then(|c| string(c, schema::LAST_OWNER))
            .map(str::to_owned);
        let ok = last == i64::try_from(r.counter.last).ok() && by == r.counter.owner;
        let ok = ok && Speaks::Permits(r.permits).passes(counter.as_ref());
        let ok = ok && self.tick_conditions(r, counter.as_ref());
        (ok, counter)
    }

    /// The seat's enqueue: one conditional update of the counter.
    fn take_seat(&mut self, r: &EnqueueRequest, now: Instant) -> Result<Response, Failure> {
        let (counter_ok, counter) = self.counter_check(r);
        let counter_ok = counter_ok || self.mutation == Some(Mutation::SeatWithoutCounter);
        let empty = counter
            .as_ref()
            .is_some_and(|c| !c.contains_key(schema::OWNER));
        if !(counter_ok && empty) {
            return seat_refused(r, counter.as_ref()).map(Response::Enqueue);
        }
        self.move_counter(r, now);
        let mut item = self.get(&r.key, COUNTER_SK).cloned().unwrap_or_default();
        for (name, value) in schema::seat_attributes(&r.row) {
            item.insert(name.to_owned(), value.clone());
        }
        self.put(item, now);
        Ok(Response::Enqueue(crate::storage::Enqueue::Done))
    }

    fn count_stale(&mut self, outcome: StaleDelete) {
        match outcome {
            StaleDelete::Deleted => self.outcomes.stale_deleted += 1,
            StaleDelete::Gone => self.outcomes.stale_gone += 1,
            StaleDelete::Revived => self.outcomes.stale_revived += 1,
        }
    }

    fn enqueue(&mut self, r: &EnqueueRequest, now: Instant) -> Result<Response, Failure> {
        if r.seat {
            return self.take_seat(r, now);
        }
        self.tokens
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < TOKEN_WINDOW);
        if let Some((seen, _)) = self.tokens.get(&r.token) {
            if seen == r {
                self.outcomes.token_replays += 1;
                return Ok(Response::Enqueue(crate::storage::Enqueue::Done));
            }
            return Err(Failure::Fatal(Error::Dynamo {
                operation: "TransactWriteItems",
                source: "IdempotentParameterMismatchException: the request differs from the \
                         earlier one with the same client token"
                    .into(),
            }));
        }
        let (counter_ok, counter) = self.counter_check(r);
        let sk = schema::queue_sk(r.ticket);
        let existing = self.get(&r.key, &sk).cloned();
        if counter_ok && existing.is_none() {
            self.move_counter(r, now);
            self.put(r.row.clone(), now);
            self.tokens.insert(r.token.clone(), (r.clone(), now));
            return Ok(Response::Enqueue(crate::storage::Enqueue::Done));
        }
        let reason = |ok: bool, item: Option<Item>| {
            if ok {
                ("None", None)
            } else {
                ("ConditionalCheckFailed", item)
            }
        };
        let reasons = [
            reason(counter_ok, counter),
            reason(existing.is_none(), existing),
        ];
        let borrowed: Vec<(&str, Option<&Item>)> =
            reasons.iter().map(|(c, i)| (*c, i.as_ref())).collect();
        match enqueue_outcome(r, &borrowed)? {
            Some(o) => {
                if o == crate::storage::Enqueue::TicketTaken {
                    self.outcomes.ticket_taken += 1;
                }
                Ok(Response::Enqueue(o))
            }
            None => Err(conditional_failed("TransactWriteItems")),
        }
    }

    /// First half of [`Mutation::TwoWriteEnqueue`]: only the counter update. `true` if it passed.
    pub(crate) fn take_ticket(
        &mut self,
        r: &EnqueueRequest,
        now: Instant,
    ) -> Result<Response, bool> {
        let (ok, counter) = self.counter_check(r);
        if !ok {
            let current = counter
                .as_ref()
                .and_then(|c| Snapshot::from_items(&r.key, [c]).ok())
                .and_then(|s| s.counter);
            return Ok(Response::Enqueue(crate::storage::Enqueue::CounterAt(
                current,
            )));
        }
        self.move_counter(r, now);
        Err(true)
    }

    /// Second half of [`Mutation::TwoWriteEnqueue`]: the row put, if its ticket is free.
    pub(crate) fn put_row(&mut self, r: &EnqueueRequest, now: Instant) {
        let sk = schema::queue_sk(r.ticket);
        if self.get(&r.key, &sk).is_none() {
            self.put(r.row.clone(), now);
        }
    }

    /// [`Mutation::ReleaseFreesOther`]: removes the key's lowest entry (the seat first), whoever
    /// holds it.
    fn free_another(&mut self, key: &str, now: Instant) {
        let Ok(snap) = Snapshot::from_items(key, &self.partition(key)) else {
            return;
        };
        match snap.rows.first() {
            Some(r) if r.seat => self.vacate(key, now, None),
            Some(r) => {
                self.remove(key, &schema::queue_sk(r.ticket), now, None);
            }
            None => {}
        }
    }

    /// The conditional removal of an entry judged dead, as `storage/dynamo.rs` sends it: still the
    /// version judged (`rvn`), and for the sweep (`sweep`: the owner read and the cutoff) also
    /// the same owner and a lease that ended before the cutoff (`DELETE_CONDITION` of
    /// `sweep.rs`). A refused removal is judged by the answer readers `storage/dynamo.rs` uses.
    fn remove_dead(
        &mut self,
        key: &str,
        ticket: u64,
        seat: bool,
        rvn: &str,
        sweep: Option<(&str, i64)>,
        now: Instant,
    ) -> StaleDelete {
        let sk = entry_sk(ticket, seat);
        let stored = self.get(key, &sk).cloned();
        let same_rvn = |i: &Item| string(i, schema::RVN) == Some(rvn);
        let removable = match &stored {
            None => false,
            // An empty seat: the counter alone, nothing to remove.
            Some(i) if seat && string(i, schema::RVN).is_none() => false,
            Some(i) => match sweep {
                None => same_rvn(i) || self.mutation == Some(Mutation::UnconditionalStaleDelete),
                Some(_) if self.mutation == Some(Mutation::SweepUnconditional) => true,
                Some((owner, cutoff)) => {
                    string(i, schema::OWNER) == Some(owner)
                        && same_rvn(i)
                        && num(i, schema::LEASE_UNTIL_MS).is_some_and(|u| u < cutoff)
                }
            },
        };
        if removable {
            let by = if sweep.is_some() {
                Remover::Sweeper
            } else {
                Remover::Waiter
            };
            if seat {
                self.vacate(key, now, Some(by));
            } else {
                self.remove(key, &sk, now, Some(by));
            }
            return StaleDelete::Deleted;
        }
        if seat {
            seat_judged(stored.as_ref(), ticket)
        } else {
            row_judged(stored.as_ref())
        }
    }
}

/// The key of a single-item write of the counter (the seat's take, heartbeat, release and
/// removals; a tick's mark): each is conditioned on a protocol we speak.
fn counter_write(request: &Request) -> Option<(&str, Speaks)> {
    match request {
        Request::Enqueue(r) if r.seat => Some((&r.key, Speaks::Permits(r.permits))),
        Request::Heartbeat(b) if b.seat => Some((&b.key, b.speaks)),
        Request::SweepDead(d) if d.seat => Some((&d.key, Speaks::Any)),
        Request::DeleteStale {
            key,
            seat: true,
            speaks,
            ..
        }
        | Request::DeleteOwned {
            key,
            seat: true,
            speaks,
            ..
        } => Some((key, *speaks)),
        Request::MarkDone { key, .. } => Some((key, Speaks::Permits(1))),
        Request::SetPermits { key, .. } => Some((key, Speaks::Any)),
        _ => None,
    }
}
