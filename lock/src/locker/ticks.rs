//! Once per tick and coalesce in the acquisition (see [`crate::tick`]): what a counter as read
//! answers before anything is written, and what a waiter's look answers.

use super::enqueue::Attempt;
use crate::error::Error;
use crate::schema::Counter;
use crate::tick::{format_ms, Tick};

impl Attempt<'_> {
    /// Our ordered tick ([`Tick::At`]), epoch ms.
    pub(super) fn ordered_tick(&self) -> Option<i64> {
        self.opts.tick.as_ref().and_then(Tick::at)
    }

    fn tick_label(&self) -> String {
        self.opts
            .tick
            .as_ref()
            .map_or_else(String::new, Tick::to_string)
    }

    /// [`Error::TickDone`], covered by `done`.
    pub(super) fn tick_done(&self, done: String) -> Error {
        Error::TickDone {
            key: self.key.to_owned(),
            tick: self.tick_label(),
            done,
        }
    }

    /// What the counter as read answers an acquisition before it writes: our ordered tick is
    /// done (at or below the watermark), or (coalescing) a newer tick is queued already.
    pub(super) fn counter_answer(&self, counter: Option<&Counter>) -> Option<Error> {
        let c = counter?;
        // A key has one number of permits: a participant configured with another is refused
        // (before anything is judged, removed or written on what it read).
        if let Err(e) = crate::protocol::agree_permits(self.key, c.permits, self.opts.permits) {
            return Some(e);
        }
        let tick = self.ordered_tick()?;
        if c.done(tick) {
            return Some(self.tick_done(format_ms(c.tick_done.unwrap_or(tick))));
        }
        match c.tick_newest {
            Some(newest) if self.opts.coalesce && newest > tick => Some(Error::Superseded {
                key: self.key.to_owned(),
                tick: self.tick_label(),
                by: format_ms(newest),
            }),
            _ => None,
        }
    }

    /// What the counter, read by a look of the waiter with `ticket`, answers it: our ordered tick
    /// is done (the run ahead of us succeeded), or (coalescing) a newer tick is queued behind us
    /// — without an ordered tick, any later ticket (arrival order).
    pub(super) fn waiter_answer(&self, counter: &Counter, ticket: u64) -> Option<Error> {
        if let Err(e) = crate::protocol::agree_permits(self.key, counter.permits, self.opts.permits)
        {
            return Some(e);
        }
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::WaiterIgnoresWatermark) {
            return None;
        }
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::CoalesceNeverWithdraws) {
            return self
                .ordered_tick()
                .filter(|t| counter.done(*t))
                .map(|_| self.tick_done(format_ms(counter.tick_done.unwrap_or_default())));
        }
        if let Some(e) = self.counter_answer(Some(counter)) {
            return Some(e);
        }
        if !self.opts.coalesce || self.ordered_tick().is_some() {
            return None;
        }
        (counter.last > ticket).then(|| Error::Superseded {
            key: self.key.to_owned(),
            tick: match &self.opts.tick {
                Some(t) => t.to_string(),
                None => format!("ticket {ticket}"),
            },
            by: format!("ticket {}", counter.last),
        })
    }
}
