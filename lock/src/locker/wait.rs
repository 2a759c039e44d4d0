//! The wait: looks below our row, paced by place and hold time, until no live entry is ahead,
//! the deadline passes, or our row is gone.

use aws_sdk_dynamodb::types::AttributeValue;

use super::enqueue::Attempt;
use super::retry_pause;
use crate::error::Error;
use crate::heartbeat::{Membership, RowState};
use crate::liveness::{jittered, Pace};
use crate::schema::{Counter, QueueRow, COUNTER_SK, SK};

impl Attempt<'_> {
    /// Looks below our row: one `Query` of the rows at or below our ticket, nearest first (one
    /// read unit whatever the queue's length), going further only past stale rows, which it
    /// removes. Says whether our row is still there, and who is ahead.
    ///
    /// A waiter that was more than a page back (`deep`) first reads only the lowest row, the
    /// holder (one read unit): while it is still more than a page back it learns how far from
    /// the tickets (an upper bound: gaps count as rows) and goes no further. A page of the rows
    /// just below it could not tell it: they do not change until they are granted. A stale
    /// lowest row is passed over as in any look, so a queue whose head died moves even when
    /// every live waiter is far back.
    pub(super) async fn look(&mut self, m: &Membership, deep: bool) -> Result<Look, Error> {
        if deep {
            if let Some(far) = self.far_back(m).await? {
                return Ok(far);
            }
        }
        let give_up = self.retry_budget();
        let mut start = None;
        let mut first = true;
        let mut counter_read = false;
        // Live entries ahead so far, nearest first, across pages.
        let mut live: Vec<QueueRow> = Vec::new();
        loop {
            let mut failures = 0;
            let asked = self.now();
            let (items, next) = loop {
                match self
                    .locker
                    .store
                    .read_below(self.key, m.ticket, LOOK_LIMIT, start.clone())
                    .await
                {
                    Ok(page) => break page,
                    Err(f) => {
                        failures += 1;
                        retry_pause(f, failures, give_up, &*self.locker.clock).await?;
                    }
                }
            };
            // The counter ends the queue (it sorts below every row); its seat, if taken, is the
            // queue's first entry, and an empty counter is no entry at all. Read in the same page
            // as the grant, it also answers whether our tick is done (the run ahead succeeded)
            // or superseded.
            for item in &items {
                if matches!(item.get(SK), Some(AttributeValue::S(sk)) if sk == COUNTER_SK) {
                    counter_read = true;
                    let counter = match Counter::from_item(self.key, item) {
                        #[cfg(test)]
                        Err(Error::ProtocolTooNew { .. })
                            if crate::mutant::on(crate::mutant::Mutant::LookIgnoresProtocol) =>
                        {
                            continue
                        }
                        other => other?,
                    };
                    if let Some(answer) = self.waiter_answer(&counter, m.ticket) {
                        return Err(answer);
                    }
                }
            }
            let entries = items
                .iter()
                .map(|item| QueueRow::entry(self.key, item))
                .collect::<Result<Vec<_>, _>>()?;
            for (i, entry) in entries.iter().enumerate() {
                if first {
                    first = false;
                    if entry
                        .as_ref()
                        .is_some_and(|r| r.ticket == m.ticket && *r.owner == *m.owner)
                    {
                        continue;
                    }
                    return Ok(Look::Removed);
                }
                let Some(row) = entry else { continue };
                let alive = match self.verdict(row, asked) {
                    Some(alive) => alive,
                    None => {
                        // A stale row to remove, on a page above the counter's: the key's
                        // counter is read (and answers: other permits, a newer protocol, a done
                        // or superseded tick) before anything is removed, once per look. Stale
                        // rows are rare, so a look pays this read only when it removes one.
                        #[cfg(test)]
                        let checked = counter_read
                            || crate::mutant::on(crate::mutant::Mutant::LookRemovesUnchecked);
                        #[cfg(not(test))]
                        let checked = counter_read;
                        if !checked {
                            #[cfg(test)]
                            crate::mutant::fired(crate::mutant::GUARD_LOOK_COUNTER);
                            self.head(m.ticket, give_up).await?;
                            counter_read = true;
                        }
                        self.pass_over(row).await?
                    }
                };
                if alive && self.counts(row) {
                    live.push(row.clone());
                    if !self.blocked_by(live.len()) {
                        continue; // a permit may still be ours: look further down
                    }
                    // The rows read past the last of them are its business, not passed over;
                    // clock-free mode starts watching them all the same (see `watch_rest`).
                    self.watch_rest(entries[i + 1..].iter().flatten(), asked);
                    if self.opts.coalesce && !counter_read {
                        // The page stopped short of the counter: a coalescing waiter reads it
                        // (with the queue's head, one read unit) to see whether a newer tick or
                        // waiter has queued behind it.
                        self.head(m.ticket, give_up).await?;
                    }
                    // Entries read below it are counted as ahead too (not judged: they are its
                    // business); a full page means there may be more. The counter is not one:
                    // counted, it put every waiter a place further back than it is, and the
                    // pacing then slept a whole hold too long (handoff p50 7 → 15 ms).
                    let ahead = live.len() - 1
                        + entries[i..].iter().flatten().count()
                        + usize::from(next.is_some());
                    live.reverse(); // ticket order: the oldest first
                    return Ok(Look::Behind {
                        holders: live,
                        ahead,
                        adjacent: true,
                    });
                }
            }
            if first {
                return Ok(Look::Removed);
            }
            match next {
                Some(k) => start = Some(k),
                None => return Ok(Look::Clear),
            }
        }
    }

    /// The look of a waiter that was more than a page back: the lowest row only. `None`: it is
    /// within a page of the head now (or the head is ours), and the full look follows.
    pub(super) async fn far_back(&mut self, m: &Membership) -> Result<Option<Look>, Error> {
        let give_up = self.retry_budget();
        loop {
            let mut failures = 0;
            let asked = self.now();
            let (counter, lowest) = loop {
                match self.locker.store.read_lowest(self.key).await {
                    Ok(head) => break head,
                    Err(f) => {
                        failures += 1;
                        retry_pause(f, failures, give_up, &*self.locker.clock).await?;
                    }
                }
            };
            if let Some(answer) = counter.and_then(|c| self.waiter_answer(&c, m.ticket)) {
                return Err(answer);
            }
            let Some(row) = lowest else { return Ok(None) };
            if row.ticket >= m.ticket {
                return Ok(None);
            }
            if !self.alive(&row, asked).await? {
                continue; // passed over: read where the queue starts now
            }
            let ahead = usize::try_from(m.ticket - row.ticket).unwrap_or(usize::MAX);
            // Within a page of the last permit (or closer): the full look decides.
            if ahead <= self.near() {
                return Ok(None);
            }
            return Ok(Some(Look::Behind {
                holders: vec![row],
                ahead,
                adjacent: false,
            }));
        }
    }

    /// Reads the counter (with the queue's head: `Range::Lowest`, one read unit) and answers a
    /// waiter whose tick is done or superseded.
    async fn head(&self, ticket: u64, give_up: tokio::time::Instant) -> Result<(), Error> {
        let mut failures = 0;
        loop {
            match self.locker.store.read_lowest(self.key).await {
                Ok((Some(counter), _)) => {
                    return match self.waiter_answer(&counter, ticket) {
                        Some(answer) => Err(answer),
                        None => Ok(()),
                    }
                }
                Ok((None, _)) => return Ok(()),
                Err(f) => {
                    failures += 1;
                    retry_pause(f, failures, give_up, &*self.locker.clock).await?;
                }
            }
        }
    }

    /// Waits until no live row is ahead of ours. `None`: our row was removed meanwhile (we were
    /// judged dead) and we must queue again.
    ///
    /// Each look costs one read unit (see [`Attempt::look`]); when it looks next follows its
    /// place and how fast the queue moves ([`Pace`]); a release by this same process wakes it at
    /// once. The enqueue's read counts as the first look.
    pub(super) async fn wait_turn(&mut self, m: Membership) -> Result<Option<Membership>, Error> {
        let mut lost = m.subscribe();
        let ticket = m.ticket;
        let wake = self.locker.memory.waiting(self.key, ticket);
        let mut pace = Pace::new(
            self.locker.memory.turn(self.key),
            self.locker.memory.hold(self.key),
            self.opts.poll,
            self.opts.max_poll,
        );
        let result = self.wait_turn_inner(m, &mut lost, &wake, &mut pace).await;
        let granted = matches!(result, Ok(Some(_)));
        self.locker.memory.done_waiting(self.key, ticket, granted);
        self.locker.memory.learnt_turn(self.key, pace.turn());
        result
    }

    pub(super) async fn wait_turn_inner(
        &mut self,
        m: Membership,
        lost: &mut tokio::sync::watch::Receiver<RowState>,
        wake: &tokio::sync::Notify,
        pace: &mut Pace,
    ) -> Result<Option<Membership>, Error> {
        // (rows ahead, the nearest one's ticket, whether that row is right ahead of ours)
        let mut seen = self
            .surveyed
            .take()
            .filter(|&(_, highest)| highest < m.ticket)
            .map(|(lowest, highest)| {
                let ahead = usize::try_from(m.ticket - lowest).unwrap_or(usize::MAX);
                (ahead, highest, highest + 1 == m.ticket)
            });
        let mut deep = false;
        loop {
            if let RowState::Lost(reason) = m.state() {
                tracing::warn!(key = self.key, ticket = m.ticket, %reason, "lost our place in the queue; queueing again");
                drop(m.leave().await);
                return Ok(None);
            }
            // Listen before looking, so a release between the look and the sleep is not missed.
            let woken = wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let (ahead, nearest, adjacent) = match seen.take() {
                Some(s) => s,
                None => match self.look(&m, deep).await {
                    Err(e) => {
                        drop(m.leave().await);
                        return Err(e);
                    }
                    Ok(Look::Removed) => {
                        tracing::warn!(
                            key = self.key,
                            ticket = m.ticket,
                            "our queue row was removed while waiting; queueing again"
                        );
                        drop(m.leave().await);
                        return Ok(None);
                    }
                    Ok(Look::Clear) => {
                        #[cfg(test)]
                        let guarded = !crate::mutant::on(crate::mutant::Mutant::GrantPastOwnLease);
                        #[cfg(not(test))]
                        let guarded = true;
                        if let (RowState::Lost(reason), true) = (m.state(), guarded) {
                            // Our own lease ran out while we looked: we may already have been
                            // passed over.
                            #[cfg(test)]
                            crate::mutant::fired(crate::mutant::GUARD_LOOK);
                            tracing::warn!(key = self.key, ticket = m.ticket, %reason, "lease ran out just before the grant; queueing again");
                            drop(m.leave().await);
                            return Ok(None);
                        }
                        m.mark_granted(self.locker.clock.wall_ms());
                        return Ok(Some(m));
                    }
                    Ok(Look::Behind {
                        holders,
                        ahead,
                        adjacent,
                    }) => {
                        if self.timed_out() {
                            if let Err(e) = m.leave().await {
                                tracing::warn!(key = self.key, error = %e, "could not remove our row after giving up; it goes stale after one lease");
                            }
                            return Err(self.busy(&holders));
                        }
                        // The entry whose departure is awaited: the nearest (one permit), or
                        // the oldest of those holding the permits.
                        let awaited = holders.first().map_or(0, |r| r.ticket);
                        (ahead, awaited, adjacent)
                    }
                },
            };
            // The far-back look reads only the queue's first entry: it can tell a waiter with one
            // permit that someone is ahead, but not one with N that N live entries are (the
            // tickets between may be gaps), so only one permit uses it. A full look stops at the
            // N-th live entry ahead: one read unit for N up to a page.
            deep = self.opts.permits == 1 && ahead >= self.near();
            let jitter = self.locker.clock.jitter();
            let mut pause = pace.after_look(self.now(), self.rounds(ahead), nearest, jitter);
            if adjacent && self.opts.permits == 1 && self.locker.memory.ours(self.key, nearest) {
                // Right behind a row of this process: its release (or its waiter giving up)
                // wakes us; `max_poll` is only a backstop.
                pause = jittered(self.opts.max_poll, jitter);
            }
            #[cfg(test)]
            if crate::mutant::on(crate::mutant::Mutant::LazyLooks) {
                pause *= 20;
            }
            #[cfg(test)]
            let overshoots = crate::mutant::on(crate::mutant::Mutant::WaitOvershoots);
            #[cfg(not(test))]
            let overshoots = false;
            if overshoots && self.deadline.is_some() {
                pause = pause.max(self.opts.max_poll);
            }
            if let Some(d) = self.deadline.filter(|_| !overshoots) {
                pause = pause.min(d.saturating_duration_since(self.now()));
            }
            tokio::select! {
                biased;
                _ = lost.wait_for(|s| matches!(s, RowState::Lost(_))) => {}
                _ = &mut woken => {}
                _ = self.locker.clock.sleep(pause) => {}
            }
        }
    }
}

impl Attempt<'_> {
    /// How many entries ahead a waiter may be and still read them in full looks: a page past the
    /// last permit.
    fn near(&self) -> usize {
        LOOK_LIMIT as usize + self.opts.permits as usize - 1
    }

    /// The waiter's place counted in holds: with `ahead` entries ahead and N permits, the queue
    /// passes N entries a hold, so a waiter is `(ahead - N) / N + 1` holds from its turn (one
    /// permit: its place).
    fn rounds(&self, ahead: usize) -> usize {
        let n = self.opts.permits as usize;
        ahead.saturating_sub(n) / n + 1
    }
}

/// Rows read per look: ours and up to seven ahead, one read unit (rows are a few hundred bytes).
/// The place is exact up to seven ahead and a lower bound beyond. The simulation's queues are
/// short (up to six participants), so there a page is three rows: its schedules then go through
/// full pages and the far-back look too.
const LOOK_LIMIT: u32 = if cfg!(test) { 3 } else { 8 };

/// What one look below our row found.
pub(super) enum Look {
    /// Our row is gone (passed over as dead, swept, deleted by hand).
    Removed,
    /// Fewer live entries ahead than our permits (none with one permit): the key is ours.
    Clear,
    /// `holders` are the live entries ahead that take every permit before us, in ticket order
    /// (`adjacent`: the nearest is right ahead of us), or the first row of the queue (a far-back
    /// look); about `ahead` rows are ahead in all.
    Behind {
        holders: Vec<QueueRow>,
        ahead: usize,
        adjacent: bool,
    },
}
