//! The invariant checks: the monitor's view of who holds what, and the checks at a grant, at
//! work, at the end of an acquisition and at the end of a run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::model::ticks::label;
use super::model::Removal;
use super::net::Net;
use super::scenario::KeyPlan;
use crate::options::{LockOptions, Wait};
use crate::schema::{QueueRow, Snapshot};
use crate::{LostSignal, Tick};

pub(super) struct Holder {
    pub(super) who: String,
    pub(super) key: String,
    pub(super) token: u64,
    pub(super) owner: String,
    pub(super) lost: LostSignal,
    pub(super) exempt: bool,
    /// The key's heartbeat interval and lease.
    pub(super) interval: Duration,
    pub(super) lease: Duration,
    /// When the monitor saw the lost signal (or reported a late one).
    pub(super) lost_at: Option<Instant>,
}

/// The checker's view of who holds what.
#[derive(Default)]
pub(super) struct Monitor {
    pub(super) holders: Vec<Holder>,
    pub(super) max_token: BTreeMap<String, u64>,
    /// Keys whose counter an operator set back.
    pub(super) tampered: BTreeSet<String>,
    /// Owners whose row an operator deleted: until their next heartbeat they cannot know, so
    /// exclusion is not promised for them (documented).
    pub(super) deleted_by_hand: BTreeSet<String>,
    pub(super) violations: Vec<String>,
    pub(super) crashed: BTreeSet<String>,
    pub(super) finished: BTreeSet<String>,
    /// (key, who) of participants inside an acquisition that waits forever.
    pub(super) waiting: BTreeSet<(String, String)>,
    /// When an operator acted on each key.
    pub(super) operator_at: BTreeMap<String, Vec<Instant>>,
    /// The last crash or cancellation of a participant on each key.
    pub(super) upset_at: BTreeMap<String, Instant>,
    /// How often each availability check applied.
    pub(super) checked: BTreeMap<&'static str, u64>,
    /// Versions of bounded rows whose holder's clock runs slow, checked against their promise.
    pub(super) believed_slow: BTreeSet<String>,
    /// Once per tick: the first success of each (key, tick label).
    pub(super) successes: BTreeMap<(String, String), Instant>,
    /// The newest ordered tick whose `release_done` returned `Released`, per key.
    pub(super) done_at: BTreeMap<String, i64>,
    /// The tick ids whose `release_done` returned `Released`, per key.
    pub(super) done_ids: BTreeSet<(String, String)>,
    pub(super) grants: u64,
    pub(super) busy: u64,
    pub(super) crashes: u64,
    pub(super) cancels: u64,
}

impl Monitor {
    pub(super) fn applied(&mut self, check: &'static str) {
        *self.checked.entry(check).or_default() += 1;
    }

    /// A participant on `key` crashed or cancelled an acquisition.
    pub(super) fn upset(&mut self, key: &str) {
        self.upset_at.insert(key.to_owned(), Instant::now());
    }

    pub(super) fn believers<'a>(
        &'a self,
        key: &'a str,
        except: &'a str,
    ) -> impl Iterator<Item = &'a Holder> {
        self.holders.iter().filter(move |h| {
            h.key == key && h.who != except && !h.exempt && h.lost.reason().is_none()
        })
    }

    pub(super) fn grant(
        &mut self,
        who: &str,
        plan: &KeyPlan,
        token: u64,
        owner: &str,
        lost: LostSignal,
        wiped: bool,
    ) {
        let key = plan.name.as_str();
        self.grants += 1;
        let exempt = self.deleted_by_hand.contains(owner);
        let others: Vec<String> = self
            .believers(key, who)
            .map(|h| format!("{} (token {})", h.who, h.token))
            .collect();
        let permits = plan.opts.permits as usize;
        if permits > 1 {
            self.applied("at most N holders (N > 1)");
        }
        if others.len() >= permits && !exempt {
            self.violations.push(format!(
                "mutual exclusion: {who} granted {key} with token {token} while {} still \
                 believe(s) it holds it ({permits} permit(s))",
                others.join(", ")
            ));
        }
        let max = self.max_token.entry(key.to_owned()).or_insert(0);
        if wiped {
            // The partition was empty at some point since the last grant: nothing remembers the
            // tokens (the counter was deleted by hand). Documented, not a violation.
            *max = 0;
        }
        // With more than one permit, entries that may hold at once are granted in whatever
        // order they look (each within the first N): tokens are unique, not granted in order.
        let reused = self
            .holders
            .iter()
            .any(|h| h.key == key && h.token == token);
        if permits > 1 && reused && !self.tampered.contains(key) && !exempt {
            self.violations.push(format!(
                "fencing: {who} granted {key} with token {token}, which a holder has"
            ));
        }
        if permits == 1 && token <= *max && !self.tampered.contains(key) && !exempt {
            self.violations.push(format!(
                "fencing: {who} granted {key} with token {token}, not above {max}"
            ));
        }
        if !exempt {
            *max = (*max).max(token);
        }
        self.holders.push(Holder {
            who: who.to_owned(),
            key: key.to_owned(),
            token,
            owner: owner.to_owned(),
            lost,
            exempt,
            interval: plan.opts.heartbeat_interval(),
            lease: plan.opts.lease,
            lost_at: None,
        });
    }

    pub(super) fn work(&mut self, who: &str, key: &str, permits: u32) {
        let believes = self
            .holders
            .iter()
            .any(|h| h.who == who && h.key == key && h.lost.reason().is_none() && !h.exempt);
        if !believes {
            return;
        }
        let others: Vec<String> = self.believers(key, who).map(|h| h.who.clone()).collect();
        if others.len() >= permits as usize {
            self.violations.push(format!(
                "mutual exclusion: {who} works on {key} while {} also believes it holds it",
                others.join(", ")
            ));
        }
    }

    /// Once per tick: `who` runs `tick` on `key`. It must not be at or below an ordered tick
    /// marked done (a duplicate, or an older tick after a newer success), nor an id marked done.
    /// An operator who touched the key may have deleted its counter, and the watermark with it
    /// (documented): not checked there.
    pub(super) fn run_tick(&mut self, who: &str, key: &str, tick: &Tick) {
        if self.operator_at.contains_key(key) {
            return;
        }
        self.applied("tick run, once-per-tick checked");
        let done = match tick {
            Tick::At(t) => self
                .done_at
                .get(key)
                .filter(|d| *d >= t)
                .map(|d| d.to_string()),
            Tick::Id(id) => self
                .done_ids
                .contains(&(key.to_owned(), id.clone()))
                .then(|| id.clone()),
        };
        if let Some(done) = done {
            self.violations.push(format!(
                "once per tick: {who} runs {key} for tick {} after tick {done} was marked done",
                label(tick)
            ));
        }
    }

    /// `tick`'s run on `key` succeeded (before its mark is sent).
    pub(super) fn succeeded(&mut self, key: &str, tick: &Tick) {
        self.successes
            .entry((key.to_owned(), label(tick)))
            .or_insert_with(Instant::now);
    }

    /// `release_done` of `tick` on `key` returned `Released`: its mark has landed.
    pub(super) fn marked(&mut self, key: &str, tick: &Tick) {
        match tick {
            Tick::At(t) => {
                let d = self.done_at.entry(key.to_owned()).or_insert(*t);
                *d = (*d).max(*t);
            }
            Tick::Id(id) => {
                self.done_ids.insert((key.to_owned(), id.clone()));
            }
        }
    }

    pub(super) fn leave(&mut self, who: &str) {
        self.holders.retain(|h| h.who != who);
    }

    /// An operator deleted `owner`'s entry by hand.
    pub(super) fn deleted_by_hand(&mut self, owner: &str) {
        for h in self.holders.iter_mut().filter(|h| h.owner == owner) {
            h.exempt = true;
        }
        self.deleted_by_hand.insert(owner.to_owned());
    }
}

/// Everything a participant task needs.
#[derive(Clone)]
pub(super) struct Ctx {
    pub(super) net: Arc<Net>,
    pub(super) monitor: Arc<Mutex<Monitor>>,
    pub(super) faults_on: Arc<AtomicBool>,
    pub(super) attempt_timeout: Duration,
}

impl Ctx {
    pub(super) fn note(&self, text: String) {
        self.net.trace.line(text);
    }

    pub(super) fn with<R>(&self, f: impl FnOnce(&mut Monitor) -> R) -> Option<R> {
        self.monitor.lock().ok().map(|mut m| f(&mut m))
    }

    /// How long before `at` a record version was first sent.
    pub(super) fn age(&self, rvn: &str, at: Instant) -> Option<Duration> {
        let sent = self.net.sent.lock().ok()?.get(rvn).copied()?;
        Some(at.saturating_duration_since(sent))
    }

    /// Whether the key's partition was empty at some point since the last look.
    pub(super) fn wiped(&self, key: &str) -> bool {
        self.net.table.lock().is_ok_and(|mut t| t.wiped.remove(key))
    }

    pub(super) fn violation(&self, text: String) {
        self.note(format!("VIOLATION {text}"));
        self.with(|m| m.violations.push(text));
    }
}

/// Every queue row in the table, decoded.
pub(super) fn rows(net: &Net) -> Vec<(String, QueueRow)> {
    let Ok(table) = net.table.lock() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for key in table.keys() {
        let items = table.partition(&key);
        for item in &items {
            if let Ok(row) = QueueRow::from_item(&key, item) {
                out.push((key.clone(), row));
            }
        }
    }
    out
}

/// How an acquisition with `wait` may take at most: the wait, the floor of the retry budget for
/// transient failures, a clock-free watch of the row ahead, and removing our row on the way out.
pub(super) fn wait_bound(
    wait: Wait,
    opts: &LockOptions,
    attempt_timeout: Duration,
) -> Option<Duration> {
    let wait = wait.as_duration()?;
    Some(
        wait + Duration::from_secs(5)
            + attempt_timeout * 4
            + opts.lease * 2
            + opts.max_poll * 2
            + Duration::from_secs(6),
    )
}

/// Counts a hold that outlasted three leases with its lock (the no-spurious-loss check needs
/// them: a defect that loses healthy locks after a lease shows only there).
pub(super) fn note_hold(
    ctx: &Ctx,
    who: &str,
    guard: &crate::LockGuard,
    from: Instant,
    lease: Duration,
) {
    let long = Instant::now().saturating_duration_since(from) >= lease * 3;
    if long && guard.lost_reason().is_none() && !ctx.net.faulted(who, from, Instant::now()) {
        ctx.with(|m| m.applied("hold kept over 3+ leases, fault-free"));
    }
}

/// FIFO: at a grant, fewer than the key's permits of the rows below ours may still be live (their
/// version sent less than their lease ago): with one permit, none.
pub(super) fn check_nothing_live_below(ctx: &Ctx, who: &str, key: &str, token: u64, permits: u32) {
    let now = Instant::now();
    let Ok(table) = ctx.net.table.lock() else {
        return;
    };
    let Ok(snap) = Snapshot::from_items(key, &table.partition(key)) else {
        return;
    };
    drop(table);
    let mut live = Vec::new();
    for row in snap.rows.iter().filter(|r| r.ticket < token) {
        if let Some(age) = ctx.age(&row.rvn, now) {
            let lease = Duration::from_millis(u64::try_from(row.lease_ms).unwrap_or(0));
            // Its writer believes in it for a lease of its own clock (`rates.rs`).
            let lease = super::rates::writers_lease(&row.rvn, lease);
            if age < lease {
                live.push(format!(
                    "t{} sent {age:?} ago (lease {lease:?})",
                    row.ticket
                ));
            }
        }
    }
    if permits > 1 {
        ctx.with(|m| m.applied("FIFO across permits (N > 1)"));
    }
    if live.len() >= permits as usize {
        ctx.violation(format!(
            "FIFO: {who} granted {key} token {token} past {} live row(s) below it with {permits} \
             permit(s): {}",
            live.len(),
            live.join(", ")
        ));
    }
}

/// Self-cleaning, a few seconds after every participant finished: only rows of crashed
/// participants may be left.
pub(super) fn check_only_crashed_left(ctx: &Ctx) {
    let crashed = ctx.with(|m| m.crashed.clone()).unwrap_or_default();
    for (key, row) in rows(&ctx.net) {
        let who = row.holder.host.clone().unwrap_or_default();
        if !crashed.contains(&who) {
            ctx.violation(format!(
                "self-cleaning: row {key} t{} of {who}, which did not crash, is left after it \
                 finished",
                row.ticket
            ));
        }
    }
}

/// Self-cleaning, after TTL and the sweeper have had their time: nothing is left at all.
pub(super) fn check_nothing_left(ctx: &Ctx) {
    for (key, row) in rows(&ctx.net) {
        ctx.violation(format!(
            "self-cleaning: row {key} t{} of {:?} outlived TTL",
            row.ticket, row.holder.host
        ));
    }
}

/// Nobody removed a queue row less than its lease after its version was sent.
pub(super) fn check_removals(ctx: &Ctx, removals: Vec<Removal>) {
    for r in removals {
        let Some(age) = ctx.age(&r.rvn, r.at) else {
            continue;
        };
        // Its owner believes in it for a lease of its own clock (`rates.rs`).
        let lease = super::rates::writers_lease(&r.rvn, r.lease);
        if age < lease {
            ctx.violation(format!(
                "early removal: {} t{} removed by {:?} {age:?} after its version was sent \
                 (lease {lease:?} of its owner's clock): its owner may still believe in it",
                r.key, r.ticket, r.by
            ));
        }
    }
}

/// Once per tick: every tick the table marked done (the model logs each mark) had a success
/// recorded before the mark.
pub(super) fn check_marks(ctx: &Ctx, marks: Vec<(String, String, Instant)>) {
    let successes = ctx.with(|m| m.successes.clone()).unwrap_or_default();
    for (key, tick, at) in marks {
        ctx.with(|m| m.applied("tick mark, success checked"));
        let before = successes
            .get(&(key.clone(), tick.clone()))
            .is_some_and(|s| *s <= at);
        if !before {
            ctx.violation(format!(
                "once per tick: tick {tick} of {key} was marked done without a success"
            ));
        }
    }
}

/// Coalesce: a coalescing acquisition granted for the ordered tick `tick` must not have read the
/// key after a newer tick had queued (`tickNewest` only grows, and every read an acquisition
/// makes before its grant — its survey, its looks, the counter read of a coalescing waiter —
/// sees it and answers `Superseded`; its last look reads the counter in the granting page).
/// Not checked on a key an operator touched (a counter deleted by hand forgets `tickNewest`).
pub(super) fn check_coalesced(ctx: &Ctx, who: &str, key: &KeyPlan, tick: i64) {
    if ctx
        .with(|m| m.operator_at.contains_key(&key.name))
        .unwrap_or(true)
    {
        return;
    }
    let newer = ctx.net.table.lock().ok().and_then(|t| {
        t.newest
            .iter()
            .filter(|(k, n, _)| *k == key.name && *n > tick)
            .map(|(_, n, at)| (*n, *at))
            .min_by_key(|(_, at)| *at)
    });
    ctx.with(|m| m.applied("coalescing grant, superseded checked"));
    let Some((newer, at)) = newer else { return };
    let read_after = ctx.net.reads.lock().ok().and_then(|r| {
        r.get(who)
            .and_then(|reads| reads.iter().copied().filter(|r| *r > at).max())
    });
    if let Some(read) = read_after {
        ctx.violation(format!(
            "coalesce: {who} runs {} for tick {tick}, though tick {newer} had queued {:?} \
             before one of its reads",
            key.name,
            read.saturating_duration_since(at)
        ));
    }
}
