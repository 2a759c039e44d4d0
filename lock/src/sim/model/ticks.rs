//! The model's once-per-tick semantics (see [`crate::tick`]), as `storage/dynamo.rs` and
//! `storage/dynamo.rs` send them: the enqueue's tick conditions, the counter's
//! `tickNewest`, the seat's release that marks, the mark of a row's release, and the records of
//! done tick ids.

use tokio::time::Instant;

use super::{num, string, Mutation, Table};
use crate::schema::{self, COUNTER_SK};
use crate::storage::answers::seat_release_refused;
use crate::storage::{EnqueueRequest, Item, Owned, Request, Response};
use crate::tick::Tick;

/// How the checker names a tick: an ordered tick by its epoch ms, an id as `id:` and the id.
pub(crate) fn label(tick: &Tick) -> String {
    match tick {
        Tick::At(ms) => ms.to_string(),
        Tick::Id(id) => format!("id:{id}"),
    }
}

impl Table {
    /// The enqueue's tick conditions on the counter as stored: `ENQUEUE_TICK_CONDITION` (the
    /// watermark below our tick; dropped under [`Mutation::EnqueueIgnoresWatermark`]) and the
    /// stored `tickNewest` not above the one we set.
    pub(super) fn tick_conditions(&self, r: &EnqueueRequest, counter: Option<&Item>) -> bool {
        let stored = |name| counter.and_then(|c| num(c, name));
        let tick_ok = r.tick.is_none_or(|t| {
            self.mutation == Some(Mutation::EnqueueIgnoresWatermark)
                || stored(schema::TICK_DONE).is_none_or(|d| d < t)
        });
        let newest_ok = r
            .newest
            .is_none_or(|n| stored(schema::TICK_NEWEST).is_none_or(|s| s <= n));
        tick_ok && newest_ok
    }

    /// An enqueue's counter move: `last`, `lastOwner`, and `tickNewest` if it sets one.
    pub(super) fn move_counter(&mut self, r: &EnqueueRequest, now: Instant) {
        let by = schema::last_owner(&r.owner, r.ticket);
        self.set_counter(&r.key, r.ticket, Some(&by), now);
        if let Some(newest) = r.newest {
            self.set_counter_attribute(&r.key, schema::TICK_NEWEST, newest, now);
            self.newest.push((r.key.clone(), newest, now));
        }
    }

    /// Sets one number attribute of an existing counter.
    fn set_counter_attribute(&mut self, key: &str, name: &str, value: i64, now: Instant) {
        if let Some(mut counter) = self.get(key, COUNTER_SK).cloned() {
            counter.insert(name.to_owned(), schema::n(value));
            self.put(counter, now);
        }
    }

    /// `MARK_CONDITION` of `storage/dynamo.rs`: the watermark is absent or not newer than
    /// `tick`.
    fn watermark_allows(&self, key: &str, tick: i64) -> bool {
        self.get(key, COUNTER_SK)
            .and_then(|c| num(c, schema::TICK_DONE))
            .is_none_or(|d| d <= tick)
    }

    /// Marks the ordered tick `tick` done on `key`'s counter, and logs it for the checker.
    fn mark(&mut self, key: &str, tick: i64, now: Instant) {
        self.set_counter_attribute(key, schema::TICK_DONE, tick, now);
        self.marks
            .push((key.to_owned(), label(&Tick::At(tick)), now));
    }

    /// The seat's release that marks its tick: ours (owner and ticket) and the watermark not
    /// newer → vacated and marked; ours under a newer watermark → [`Owned::NotMarked`], nothing
    /// written; else [`Owned::No`].
    pub(super) fn release_seat_done(
        &mut self,
        key: &str,
        ticket: u64,
        owner: &str,
        tick: i64,
        now: Instant,
    ) -> Owned {
        let counter = self.get(key, COUNTER_SK).cloned();
        let ours = counter.as_ref().is_some_and(|i| {
            string(i, schema::OWNER) == Some(owner)
                && num(i, schema::TICKET) == i64::try_from(ticket).ok()
        });
        if ours && self.watermark_allows(key, tick) {
            self.vacate(key, now, None);
            self.mark(key, tick, now);
            return Owned::Yes;
        }
        seat_release_refused(counter.as_ref(), owner, ticket)
    }

    /// [`Request::MarkDone`], [`Request::TickRecorded`] and [`Request::RecordTick`].
    pub(super) fn apply_tick(&mut self, request: &Request, now: Instant) -> Response {
        match request {
            Request::MarkDone { key, tick } => {
                let exists = self
                    .get(key, COUNTER_SK)
                    .is_some_and(|c| c.contains_key(schema::LAST));
                let marked = exists && self.watermark_allows(key, *tick);
                if marked {
                    self.mark(key, *tick, now);
                }
                Response::Marked(marked)
            }
            Request::TickRecorded { key, id } => {
                Response::Recorded(self.get(key, &schema::tick_sk(id)).is_some())
            }
            Request::RecordTick {
                key,
                id,
                expires_at,
            } => {
                if self.get(key, &schema::tick_sk(id)).is_some() {
                    return Response::Recorded(false);
                }
                self.put(schema::tick_record(key, id, *expires_at), now);
                self.marks
                    .push((key.clone(), label(&Tick::Id(id.clone())), now));
                Response::Recorded(true)
            }
            other => unreachable!("not a tick request: {other:?}"),
        }
    }
}
