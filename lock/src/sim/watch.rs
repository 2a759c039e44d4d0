//! The checks that run on a timer while a schedule runs: the lease each holder believes in, and
//! progress once faults stop.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::availability;
use super::monitor::Ctx;
use super::scenario::KeyPlan;
use crate::schema::QueueRow;

/// Guarantee 4 and progress once faults stop: a key where someone waits forever and nobody
/// live holds it must be granted within [`availability::gap_bound`] of the gap's start (or of
/// the key's last crash or cancellation): every dead entry is stale by then and two looks have
/// passed it over. A queue that only the sweeper or TTL could free breaks it, and so does a
/// waiter that looks too rarely.
pub(super) async fn stuck_watch(
    ctx: Ctx,
    keys: Vec<KeyPlan>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut since: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        let now = Instant::now();
        for key in &keys {
            let (waiting, held, upset) = ctx
                .with(|m| {
                    (
                        m.waiting.iter().any(|(k, _)| *k == key.name),
                        // Anyone who believes it holds, exempt from the exclusion checks or
                        // not: an owner whose earlier entry an operator deleted may hold a
                        // later one of its own by right.
                        // With N permits, a gap is fewer than N holders while someone waits
                        // (a free permit with a waiter).
                        m.holders
                            .iter()
                            .filter(|h| h.key == key.name && h.lost.reason().is_none())
                            .count()
                            >= key.opts.permits as usize,
                        m.upset_at.get(&key.name).copied(),
                    )
                })
                .unwrap_or((false, true, None));
            if !waiting || held {
                if since.remove(&key.name).is_some() {
                    ctx.with(|m| m.applied("progress (handoff gap)"));
                }
                continue;
            }
            let start = *since.entry(key.name.clone()).or_insert(now);
            // A crash or a cancellation during the gap leaves a dead entry of its own: the gap
            // counts from the last one.
            let start = upset.map_or(start, |u| u.max(start));
            let bound = availability::gap_bound(key, ctx.attempt_timeout);
            if now - start > bound {
                ctx.violation(format!(
                    "progress: {} has a forever waiter and fewer than {} live holder(s) for {:?} \
                     after faults stopped (bound {bound:?})",
                    key.name,
                    key.opts.permits,
                    now - start
                ));
                since.insert(key.name.clone(), now);
            }
        }
    }
}

/// Every 20 ms: the version of each holder's row in the table must promise at least the lease
/// its holder believes in (its version was sent no earlier than one lease before the holder's
/// deadline). A lease rolled back by a late write breaks this at once, whether or not a waiter
/// happens to exploit it. The availability checks of holders run at the same pace.
pub(super) async fn lease_watch(ctx: Ctx, stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        availability::check_holders(&ctx);
        let holders: Vec<(String, String, u64, Instant)> = ctx
            .with(|m| {
                m.holders
                    .iter()
                    .filter(|h| !h.exempt)
                    .filter_map(|h| {
                        Some((h.who.clone(), h.key.clone(), h.token, h.lost.valid_until()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (who, key, token, until) in holders {
            let row = ctx.net.table.lock().ok().and_then(|t| {
                t.partition(&key)
                    .iter()
                    .filter_map(|i| QueueRow::from_item(&key, i).ok())
                    .find(|r| r.ticket == token)
            });
            let Some(row) = row else { continue };
            let lease = Duration::from_millis(u64::try_from(row.lease_ms).unwrap_or(0));
            let sent = ctx
                .net
                .sent
                .lock()
                .ok()
                .and_then(|s| s.get(&row.rvn).copied());
            if let Some(sent) = sent {
                // What the version keeps others from (`rates::promised`): clock-free, a lease of
                // its holder's clock; bounded, the lease, whatever the holder's monotonic rate.
                let promised = sent + super::rates::promised(&who, lease);
                if !row.clock_free && sent + super::rates::true_duration(&who, lease) > promised {
                    // A slow clock: a whole lease of it would outlast the promise, and only the
                    // 64th it believes less keeps it inside (`membership::believed`).
                    ctx.with(|m| {
                        if m.believed_slow.insert(row.rvn.clone()) {
                            m.applied(crate::mutant::GUARD_BELIEVED);
                        }
                    });
                }
                if promised < until {
                    ctx.violation(format!(
                        "lease: {who} believes in {key} t{token} until {:?} from now, but the \
                         stored version promises only {:?} ({}, its monotonic rate {:+}ppm)",
                        until.saturating_duration_since(Instant::now()),
                        promised.saturating_duration_since(Instant::now()),
                        if row.clock_free {
                            "a lease of its clock"
                        } else {
                            "its lease on wall clocks within the allowance"
                        },
                        super::rates::ppm(&who)
                    ));
                    return;
                }
            }
        }
    }
}
