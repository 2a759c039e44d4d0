//! No hot loop: no participant sends requests on its key faster than its pacing allows, whatever
//! the weather and whether or not its wait ends in time. The rules, from the code (PROTOCOL.md,
//! "Pacing"):
//!
//! - **Looks** (`locker/attempt.rs`, `liveness.rs`): a waiter's next look below its row (the first
//!   page of a `Query` below its ticket) is sent at least `0.9 · MIN_POLL` after the answer to
//!   its previous look: the pause between looks is never below `MIN_POLL` less its jitter. Two
//!   exceptions, each once per row: the pause cut at the wait's deadline (the last look), and a
//!   wake by a release of this same process. A look that failed is retried after the retry
//!   floor below.
//! - **Heartbeats** (`membership.rs`): after a renewal, the next one of the same entry is sent a
//!   heartbeat interval after the renewal was sent; after a failed one, at least 5 % of
//!   `min(100 ms, interval / 2)` after its failure came back (the first backoff, full jitter
//!   clamped at 5 %).
//! - **Retries** (`retry.rs`, the enqueue's conflict): a request that failed is sent again no
//!   sooner than [`RETRY_FLOOR`] after the failure came back: the shortest first backoff is the
//!   enqueue conflict's, 5 % of 2 × 10 ms.
//!
//! Each pause is timed on the participant's own clock, which may run at a rate of its own
//! (`rates.rs`): a floor is checked as that many units of its clock, in true time.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::monitor::Ctx;
use super::net::describe;
use super::rates;
use super::scenario::KeyPlan;
use crate::liveness::MIN_POLL;
use crate::storage::Request;

/// The shortest pause before a failed request is sent again (5 % of 20 ms), less rounding.
const RETRY_FLOOR: Duration = Duration::from_micros(900);

/// Timer rounding of the simulated clock (tokio's timer counts whole milliseconds).
const ROUNDING: Duration = Duration::from_millis(1);

/// Checks every participant's requests against the pacing rules, after the run.
pub(super) fn check(ctx: &Ctx, keys: &[KeyPlan]) {
    let log = ctx.net.log.lock().map(|l| l.clone()).unwrap_or_default();
    let intervals: HashMap<&str, Duration> = keys
        .iter()
        .map(|k| (k.name.as_str(), k.opts.heartbeat_interval()))
        .collect();
    let mut found = Vec::new();
    let mut counts = [0u64; 3];
    for (who, sent) in &log {
        if who == "sweeper" {
            continue;
        }
        looks(who, sent, &mut counts[0], &mut found);
        beats(who, sent, &intervals, &mut counts[1], &mut found);
        retries(who, sent, &mut counts[2], &mut found);
    }
    ctx.with(|m| {
        for (check, n) in [LOOKS, BEATS, RETRIES].into_iter().zip(counts) {
            *m.checked.entry(check).or_default() += n;
        }
    });
    for v in found {
        ctx.violation(v);
    }
}

pub(super) const LOOKS: &str = "no hot loop: looks";
pub(super) const BEATS: &str = "no hot loop: heartbeats";
pub(super) const RETRIES: &str = "no hot loop: retries";

fn looks(who: &str, sent: &[Sent], count: &mut u64, found: &mut Vec<String>) {
    let floor = rates::true_duration(who, MIN_POLL.mul_f64(0.9));
    let mut last: HashMap<(&str, u64), &Sent> = HashMap::new();
    let mut fast: HashMap<(&str, u64), Vec<Duration>> = HashMap::new();
    for s in sent {
        let Sending::Look { key, ticket } = &s.what else {
            continue;
        };
        let id = (key.as_str(), *ticket);
        if let Some(Some((at, how))) = last.get(&id).map(|p| p.answered) {
            *count += 1;
            let gap = s.sent.saturating_duration_since(at);
            let min = if how == Answered::Failed {
                rates::true_duration(who, RETRY_FLOOR)
            } else {
                floor
            };
            if gap < min {
                fast.entry(id).or_default().push(gap);
            }
        }
        last.insert(id, s);
    }
    for ((key, ticket), gaps) in fast {
        // One look may come early: the one at the deadline, or after a wake by our own release.
        if gaps.len() > 1 {
            found.push(format!(
                "hot loop: {who} looked below {key} t{ticket} {} times within {floor:?} of its \
                 previous look's answer (gaps {:?}); its pace allows one",
                gaps.len(),
                &gaps[..gaps.len().min(5)]
            ));
        }
    }
}

fn beats(
    who: &str,
    sent: &[Sent],
    intervals: &HashMap<&str, Duration>,
    count: &mut u64,
    found: &mut Vec<String>,
) {
    let mut last: HashMap<(&str, &str), &Sent> = HashMap::new();
    for s in sent {
        let Sending::Beat { key, entry } = &s.what else {
            continue;
        };
        let id = (key.as_str(), entry.as_str());
        let interval = intervals.get(key.as_str()).copied().unwrap_or_default();
        if let Some(prev) = last.get(&id) {
            if let Some((at, how)) = prev.answered {
                *count += 1;
                let (from, min) = match how {
                    Answered::Ok => (prev.sent, interval),
                    Answered::Failed => (
                        at,
                        Duration::from_millis(100).min(interval / 2).mul_f64(0.05),
                    ),
                };
                let min = rates::true_duration(who, min);
                let gap = s.sent.saturating_duration_since(from);
                if gap + ROUNDING < min {
                    found.push(format!(
                        "hot loop: {who} heartbeat {key} {entry} {gap:?} after the previous one \
                         ({how:?}); its pace allows no less than {min:?}"
                    ));
                }
            }
        }
        last.insert(id, s);
    }
}

fn retries(who: &str, sent: &[Sent], count: &mut u64, found: &mut Vec<String>) {
    for (i, s) in sent.iter().enumerate() {
        let Some((at, Answered::Failed)) = s.answered else {
            continue;
        };
        if matches!(s.what, Sending::Beat { .. }) {
            continue; // a heartbeat's retry is a new version: the heartbeat rule
        }
        // The same request sent again once its failure was known: its retry.
        let Some(again) = sent[i + 1..]
            .iter()
            .find(|n| n.text == s.text && n.sent >= at)
        else {
            continue;
        };
        *count += 1;
        let gap = again.sent.saturating_duration_since(at);
        if gap < rates::true_duration(who, RETRY_FLOOR) {
            found.push(format!(
                "hot loop: {who} sent {} again {gap:?} after it failed; a retry waits at least \
                 {RETRY_FLOOR:?}",
                s.text
            ));
        }
    }
}

/// One request of a participant, as the pacing check sees it.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub what: Sending,
    /// The request as the trace shows it: a resend of a failed request is the same text.
    pub text: String,
    pub sent: Instant,
    /// When the answer (or the failure) reached the caller, and how it went; `None` if the caller
    /// stopped waiting first.
    pub answered: Option<(Instant, Answered)>,
}

/// What kind of request, for the pacing rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sending {
    /// The first page of a waiter's look below its row (`Range::Below`, no start key).
    Look {
        key: String,
        ticket: u64,
    },
    /// A renewal of one entry.
    Beat {
        key: String,
        entry: String,
    },
    Other,
}

/// How a request's answer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answered {
    /// A heartbeat that renewed the lease, or any other answer.
    Ok,
    /// A failure the caller retries (refused, timed out, answer lost), a transaction conflict,
    /// or a heartbeat that did not renew.
    Failed,
}

impl Sent {
    pub(super) fn of(request: &Request, sent: Instant) -> Sent {
        let what = match request {
            Request::Query {
                key,
                start: None,
                range: crate::storage::Range::Below { ticket, .. },
            } => Sending::Look {
                key: key.clone(),
                ticket: *ticket,
            },
            Request::Heartbeat(b) => Sending::Beat {
                key: b.key.clone(),
                entry: format!("{}/{}/{}", b.ticket, b.seat, b.owner),
            },
            _ => Sending::Other,
        };
        Sent {
            what,
            text: describe(request),
            sent,
            answered: None,
        }
    }
}
