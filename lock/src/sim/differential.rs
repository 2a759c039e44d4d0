//! The model answers as DynamoDB does: the same requests, sent to DynamoDB Local through the real
//! storage ([`crate::storage::Dynamo`]) and to the model ([`super::model::Table`]), must give the same
//! outcomes and leave the same items.
//!
//! The requests are drawn from a seeded generator over a small space (two keys, five tickets,
//! three owners, three record versions, counters present, absent and off by one, tokens reused
//! with the same and with a changed request, the counter's seat taken, renewed and vacated, the
//! sweep's removals and scans with cutoffs on both sides of the stored leases) so that every
//! condition is met both ways many times. A scan is compared as the sweep uses it: every page to
//! the end, as the set of items that passed the filter and the count read (the order of a `Scan`
//! is DynamoDB's to choose, so pages of a `Limit` differ).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::model::Table;
use newer::{retarget, seat_of, with_permits, NEWER_KEY, PERMITS_KEY};

mod newer;
use crate::schema::{HolderInfo, NewRow};
use crate::storage::Dynamo;
use crate::storage::{
    Backend, Beat, EnqueueRequest, Failure, Item, Request, Response, ScanRequest, SweepDead,
};

const OWNERS: [&str; 3] = ["owner-a", "owner-b", "owner-c"];
const RVNS: [&str; 3] = ["rvn-1", "rvn-2", "rvn-3"];
const TICK_IDS: [&str; 2] = ["batch-1", "batch-2"];

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from[rng.random_range(0..from.len())]
}

fn row(key: &str, ticket: u64, owner: &str, rvn: &str, until: i64) -> Item {
    row_under(key, ticket, owner, rvn, until, 1)
}

/// [`row`], written under `protocol` (from 2 on, rows carry it).
fn row_under(key: &str, ticket: u64, owner: &str, rvn: &str, until: i64, protocol: u32) -> Item {
    NewRow {
        key,
        ticket,
        owner,
        lease_until_ms: until,
        lease_ms: 20_000,
        // Far ahead: DynamoDB Local's TTL must not delete anything during the test.
        expires_at: 4_000_000_000,
        clock_free: false,
        rvn,
        now_ms: until - 20_000,
        granted: false,
        holder: &HolderInfo::default(),
        protocol,
    }
    .to_item()
}

/// A random request; `sent` remembers enqueues so some tokens are reused. Tokens carry `run`:
/// DynamoDB remembers them per account for 10 minutes, across tables and test runs.
/// Half the enqueues and owned deletes aim at what `model` holds, so they succeed often enough.
fn request(rng: &mut StdRng, sent: &mut Vec<EnqueueRequest>, run: u32, model: &Table) -> Request {
    let key = format!("k{}", rng.random_range(0..2));
    let ticket = rng.random_range(1..=5);
    let owner = pick(rng, &OWNERS);
    // One permit here; `newer::with_permits` sends a share with more to a key of 3 permits.
    let n = 1;
    let speaks = crate::protocol::Speaks::maintain(n);
    match rng.random_range(0..13) {
        12 => match rng.random_range(0..3) {
            0 => Request::MarkDone {
                key,
                tick: rng.random_range(1..=4),
            },
            1 => Request::TickRecorded {
                key,
                id: pick(rng, &TICK_IDS).to_owned(),
            },
            _ => Request::RecordTick {
                key,
                id: pick(rng, &TICK_IDS).to_owned(),
                expires_at: 4_000_000_000,
            },
        },
        0..=3 => {
            if !sent.is_empty() && rng.random_bool(0.3) {
                let mut again = sent[rng.random_range(0..sent.len())].clone();
                if rng.random_bool(0.5) {
                    // Same token, changed request.
                    again.row = row(&again.key, again.ticket, &again.owner, "rvn-changed", 7);
                }
                return Request::Enqueue(again);
            }
            let actual = crate::schema::Snapshot::from_items(&key, &model.partition(&key))
                .ok()
                .and_then(|s| s.counter);
            let counter = match actual {
                Some(c) if rng.random_bool(0.5) => c,
                _ => crate::schema::Counter {
                    last: rng.random_range(0..=5),
                    owner: rng.random_bool(0.7).then(|| pick(rng, &OWNERS).to_owned()),
                    tick_done: None,
                    tick_newest: None,
                    protocol: 1,
                    permits: 1,
                },
            };
            // Ordered ticks around the few values the marks write, so every side of the
            // watermark and of `tickNewest` comes up.
            let tick = (n == 1 && rng.random_bool(0.5)).then(|| rng.random_range(1..=4_i64));
            let newest = tick.and_then(|t| {
                rng.random_bool(0.8)
                    .then(|| counter.tick_newest.map_or(t, |n| n.max(t)))
            });
            let r = EnqueueRequest {
                key: key.clone(),
                ticket,
                counter,
                row: row_under(
                    &key,
                    ticket,
                    owner,
                    pick(rng, &RVNS),
                    1_000,
                    crate::protocol::Speaks::Permits(n).protocol(),
                ),
                owner: owner.to_owned(),
                token: format!("{run:08x}-{:08x}", rng.random::<u32>()),
                seat: rng.random_bool(0.35),
                tick,
                newest,
                permits: n,
            };
            sent.push(r.clone());
            Request::Enqueue(r)
        }
        4..=5 => Request::Heartbeat(Beat {
            key,
            ticket,
            seat: rng.random_bool(0.35),
            owner: owner.to_owned(),
            lease_until_ms: rng.random_range(900..=1_100),
            expires_at: 4_000_000_000,
            rvn: pick(rng, &RVNS).to_owned(),
            acquired_at_ms: rng.random_bool(0.5).then_some(555),
            speaks,
        }),
        6..=7 => Request::DeleteStale {
            key,
            ticket,
            seat: rng.random_bool(0.35),
            rvn: pick(rng, &RVNS).to_owned(),
            speaks,
        },
        8 if rng.random_bool(0.3) => Request::CreateCounter {
            key,
            last: rng.random_range(0..=5),
            owner: owner.to_owned(),
            protocol: crate::protocol::Speaks::Permits(n).protocol(),
            permits: n,
        },
        8 => {
            let row = crate::schema::Snapshot::from_items(&key, &model.partition(&key))
                .ok()
                .and_then(|s| s.rows.first().cloned())
                .filter(|_| rng.random_bool(0.5));
            match row {
                Some(r) => Request::DeleteOwned {
                    key,
                    ticket: r.ticket,
                    seat: r.seat,
                    // Sometimes another owner's release of the entry that is there.
                    owner: if rng.random_bool(0.25) {
                        owner.to_owned()
                    } else {
                        r.owner
                    },
                    done: (r.seat && n == 1 && rng.random_bool(0.3))
                        .then(|| rng.random_range(1..=4)),
                    speaks,
                },
                None => Request::DeleteOwned {
                    key,
                    ticket,
                    seat: rng.random_bool(0.35),
                    owner: owner.to_owned(),
                    done: (n == 1 && rng.random_bool(0.3)).then(|| rng.random_range(1..=4)),
                    speaks,
                },
            }
        }
        10 => {
            // Half the time an entry the model holds, as the sweep would have read it.
            let entry = crate::schema::Snapshot::from_items(&key, &model.partition(&key))
                .ok()
                .map(|s| s.rows)
                .filter(|rows| !rows.is_empty() && rng.random_bool(0.5))
                .map(|rows| rows[rng.random_range(0..rows.len())].clone());
            let cutoff_ms = rng.random_range(900..=1_200);
            Request::SweepDead(match entry {
                Some(r) => SweepDead {
                    key,
                    ticket: r.ticket,
                    seat: r.seat,
                    owner: r.owner,
                    rvn: if rng.random_bool(0.8) {
                        r.rvn
                    } else {
                        pick(rng, &RVNS).to_owned()
                    },
                    cutoff_ms,
                },
                None => SweepDead {
                    key,
                    ticket,
                    seat: rng.random_bool(0.35),
                    owner: owner.to_owned(),
                    rvn: pick(rng, &RVNS).to_owned(),
                    cutoff_ms,
                },
            })
        }
        11 => Request::Scan(ScanRequest {
            segment: 0,
            total_segments: 1,
            start: None,
            limit: rng.random_bool(0.5).then(|| rng.random_range(1..=4)),
            cutoff_ms: rng.random_range(900..=1_200),
        }),
        _ => Request::Query {
            key,
            start: None,
            range: match rng.random_range(0..5) {
                0 | 1 => crate::storage::Range::All,
                2 | 3 => crate::storage::Range::Below {
                    ticket,
                    limit: rng.random_range(1..=3),
                },
                _ => crate::storage::Range::Lowest,
            },
        },
    }
}

/// What is compared: protocol outcomes exactly; pages as their items in order; failures by
/// kind and, for fatal ones, by the service's error code.
fn normalize(result: &Result<Response, Failure>) -> String {
    match result {
        Ok(Response::Page { items, next }) => {
            format!(
                "page {:?} next {:?}",
                sorted(items),
                next.as_ref().map(|n| sorted(std::slice::from_ref(n)))
            )
        }
        Ok(other) => format!("{other:?}"),
        Err(Failure::Retry { .. }) => "retry".into(),
        Err(Failure::Fatal(crate::Error::ProtocolTooNew { table, .. })) => {
            format!("fatal ProtocolTooNew {table}")
        }
        Err(Failure::Fatal(crate::Error::PermitsMismatch {
            table, configured, ..
        })) => {
            format!("fatal PermitsMismatch {table} {configured}")
        }
        Err(Failure::Fatal(e)) => {
            let text = e.to_string();
            let code = text
                .split(|c: char| !c.is_alphanumeric())
                .find(|w| w.ends_with("Exception"))
                .unwrap_or("other")
                .to_owned();
            format!("fatal {code}")
        }
    }
}

fn sorted(items: &[Item]) -> Vec<BTreeMap<String, String>> {
    items
        .iter()
        .map(|i| {
            i.iter()
                .map(|(k, v)| {
                    let v = match v {
                        AttributeValue::S(s) => format!("S:{s}"),
                        AttributeValue::N(n) => format!("N:{n}"),
                        AttributeValue::Bool(b) => format!("B:{b}"),
                        other => format!("{other:?}"),
                    };
                    (k.clone(), v)
                })
                .collect()
        })
        .collect()
}

/// A whole scan, page by page from `first`: the items that passed the filter (normalized, sorted)
/// and the count read, or how it failed.
async fn scan_all(
    first: &ScanRequest,
    mut page: impl AsyncFnMut(Request) -> Result<Response, Failure>,
) -> String {
    let (mut items, mut scanned, mut r) = (Vec::new(), 0, first.clone());
    loop {
        match page(Request::Scan(r.clone())).await {
            Ok(Response::Scanned {
                items: more,
                scanned: read,
                next,
            }) => {
                items.extend(sorted(&more));
                scanned += read;
                match next {
                    Some(next) => r.start = Some(next),
                    None => break,
                }
            }
            other => return normalize(&other),
        }
    }
    items.sort();
    format!("Scanned {scanned} read, {items:?}")
}

/// Sends `seeds` × 150 seeded requests to DynamoDB Local and to the model. `Err`: the first
/// difference (an outcome, or the items left); `Ok`: the kinds of outcome compared, counted.
async fn compare(seeds: u64) -> Result<BTreeMap<String, u32>, String> {
    let endpoint = flightlock_testkit::require_endpoint();
    let client = flightlock_testkit::client(&endpoint).await;
    let table = flightlock_testkit::unique_table("differential");
    crate::table::create_table(&client, &table).await.unwrap();
    let dynamo: Arc<dyn Backend> = Arc::new(Dynamo::new(client, &table));
    let mut model = Table::new(Instant::now(), 0);
    let run: u32 = rand::random();
    let mut kinds = BTreeMap::<String, u32>::new();
    let newer = Request::CreateCounter {
        key: NEWER_KEY.into(),
        last: 3,
        owner: "owner-newer".into(),
        protocol: crate::PROTOCOL + 1,
        permits: 2,
    };
    let created = (
        normalize(&dynamo.call(newer.clone()).await),
        normalize(&model.apply(&newer, Instant::now())),
    );
    if created.0 != created.1 {
        return Err(format!("creating the newer key: {created:?}"));
    }
    let three = Request::CreateCounter {
        key: PERMITS_KEY.into(),
        last: 2,
        owner: "owner-permits".into(),
        protocol: 2,
        permits: 3,
    };
    let created = (
        normalize(&dynamo.call(three.clone()).await),
        normalize(&model.apply(&three, Instant::now())),
    );
    if created.0 != created.1 {
        return Err(format!("creating the key of 3 permits: {created:?}"));
    }
    for seed in 0..seeds {
        let mut rng = StdRng::seed_from_u64(seed);
        // A stream of its own, so the requests of the other keys stay what they were.
        let mut aim = StdRng::seed_from_u64(seed.wrapping_add(0x5eed_0000));
        // And one for the key of 3 permits (issue 26).
        let mut perm = StdRng::seed_from_u64(seed.wrapping_add(0x9e2b_0000));
        // And one for an operator's `flightlock permits --set`.
        let mut ops = StdRng::seed_from_u64(seed.wrapping_add(0x0be7_0000));
        let mut sent = Vec::new();
        for step in 0..150 {
            let req = request(&mut rng, &mut sent, run, &model);
            if perm.random_bool(0.3) {
                let n = [3, 3, 3, 2, 1][perm.random_range(0..5)];
                if let Some(again) = with_permits(&req, &model, n) {
                    let real = normalize(&dynamo.call(again.clone()).await);
                    let modeled = normalize(&model.apply(&again, Instant::now()));
                    if real != modeled {
                        return Err(format!(
                            "seed {seed} step {step} (3 permits): {again:?}\n DynamoDB Local: \
                             {real}\n model: {modeled}"
                        ));
                    }
                    let label: String = modeled.chars().take(26).collect();
                    let seat = if seat_of(&again) { "seat " } else { "" };
                    *kinds
                        .entry(format!("{seat}permits {n} {label}"))
                        .or_default() += 1;
                }
            }
            if aim.random_bool(0.3) {
                if let Some(again) = retarget(&req, &model) {
                    let real = normalize(&dynamo.call(again.clone()).await);
                    let modeled = normalize(&model.apply(&again, Instant::now()));
                    if real != modeled {
                        return Err(format!(
                            "seed {seed} step {step} (newer key): {again:?}\n DynamoDB Local: \
                             {real}\n model: {modeled}"
                        ));
                    }
                    let label: String = modeled.chars().take(26).collect();
                    let label = if seat_of(&again) {
                        format!("seat newer {label}")
                    } else {
                        format!("newer {label}")
                    };
                    *kinds.entry(label).or_default() += 1;
                }
            }
            if ops.random_bool(0.05) {
                // A key of one permit is set to two and back, so the other requests meet the key
                // they expect; the key of 3 permits is set to 3; the newer key refuses.
                let key = ["k0", "k1", PERMITS_KEY, NEWER_KEY][ops.random_range(0..4)];
                let changes: &[u32] = match key {
                    PERMITS_KEY => &[3],
                    NEWER_KEY => &[1],
                    _ => &[2, 1],
                };
                for &permits in changes {
                    let set = Request::SetPermits {
                        key: key.into(),
                        permits,
                    };
                    let real = normalize(&dynamo.call(set.clone()).await);
                    let modeled = normalize(&model.apply(&set, Instant::now()));
                    if real != modeled {
                        return Err(format!(
                            "seed {seed} step {step} (permits --set): {set:?}\n DynamoDB Local: \
                             {real}\n model: {modeled}"
                        ));
                    }
                    let label: String = modeled.chars().take(26).collect();
                    *kinds.entry(format!("set {label}")).or_default() += 1;
                }
            }
            let (a, b) = if let Request::Scan(r) = &req {
                (
                    scan_all(r, async |q| dynamo.call(q).await).await,
                    scan_all(r, async |q| model.apply(&q, Instant::now())).await,
                )
            } else {
                let real = dynamo.call(req.clone()).await;
                let modeled = model.apply(&req, Instant::now());
                (normalize(&real), normalize(&modeled))
            };
            if a != b {
                return Err(format!(
                    "seed {seed} step {step}: {req:?}\n DynamoDB Local: {a}\n model: {b}"
                ));
            }
            let seat = seat_of(&req);
            let label: String = b.chars().take(24).collect();
            let label = match &req {
                Request::SweepDead(_) => format!("sweep {label}"),
                Request::Scan(_) if b.contains("S:") => "Scanned items".to_owned(),
                Request::Scan(_) => "Scanned nothing".to_owned(),
                _ => label,
            };
            let label = if seat { format!("seat {label}") } else { label };
            *kinds.entry(label).or_default() += 1;
        }
        for key in ["k0", "k1", NEWER_KEY, PERMITS_KEY] {
            let real = dynamo
                .call(Request::Query {
                    key: key.into(),
                    start: None,
                    range: crate::storage::Range::All,
                })
                .await;
            let Ok(Response::Page { items, .. }) = real else {
                return Err(format!("query failed: {real:?}"));
            };
            let queue: Vec<Item> = model
                .partition(key)
                .into_iter()
                .filter(|i| {
                    !matches!(i.get(crate::schema::SK), Some(AttributeValue::S(sk))
                        if sk.starts_with(crate::schema::TICK_PREFIX))
                })
                .collect();
            if sorted(&items) != sorted(&queue) {
                return Err(format!("seed {seed}: the tables differ for {key}"));
            }
            for id in TICK_IDS {
                let request = Request::TickRecorded {
                    key: key.into(),
                    id: id.into(),
                };
                let real = normalize(&dynamo.call(request.clone()).await);
                if real != normalize(&model.apply(&request, Instant::now())) {
                    return Err(format!("seed {seed}: the records differ for {key} {id}"));
                }
            }
        }
        // The next seed starts from the same state on both sides: both hold what they hold.
    }
    Ok(kinds)
}

/// The differential tests' bound in real time (they talk to DynamoDB Local; each takes seconds).
const REAL_BOUND: std::time::Duration = std::time::Duration::from_secs(600);

/// Runs a differential test's body for at most [`REAL_BOUND`].
async fn bounded(body: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(REAL_BOUND, body).await.is_err() {
        panic!("the differential test did not end within {REAL_BOUND:?}");
    }
}

#[tokio::test]
async fn the_model_answers_as_dynamodb_local_does() {
    bounded(async move {
        let seeds: u64 = std::env::var("FLIGHTLOCK_DIFF_SEEDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8);
        let kinds = match compare(seeds).await {
            Ok(kinds) => kinds,
            Err(difference) => panic!("{difference}"),
        };
        let compared: u32 = kinds.values().sum();
        eprintln!("differential: {compared} requests compared; outcomes {kinds:?}");
        // Every kind of outcome the protocol distinguishes was met.
        for needed in [
            "Enqueue(Done)",
            "Enqueue(CounterAt",
            "Enqueue(AlreadyOurs)",
            "Enqueue(TicketTaken)",
            "Renewal(Renewed)",
            "Renewal(Superseded)",
            "Renewal(Gone)",
            "StaleDelete(Deleted)",
            "StaleDelete(Gone)",
            "StaleDelete(Revived)",
            "Owned(Yes)",
            "Owned(No)",
            "Created(true)",
            "Created(false)",
            "fatal IdempotentParamete",
            "seat Enqueue(Done)",
            "seat Enqueue(CounterAt",
            "seat Enqueue(AlreadyOurs)",
            "seat Renewal(Renewed)",
            "seat Renewal(Superseded)",
            "seat Renewal(Gone)",
            "seat StaleDelete(Deleted)",
            "seat StaleDelete(Gone)",
            "seat StaleDelete(Revived)",
            "seat Owned(Yes)",
            "seat Owned(No)",
            "seat Owned(NotMarked)",
            "Marked(true)",
            "Marked(false)",
            "Recorded(true)",
            "Recorded(false)",
            "sweep StaleDelete(Deleted)",
            "sweep StaleDelete(Gone)",
            "sweep StaleDelete(Revived)",
            "seat sweep StaleDelete(Deleted)",
            "seat sweep StaleDelete(Gone)",
            "seat sweep StaleDelete(Revived)",
            "Scanned items",
            "Scanned nothing",
            // The newer protocol's key: every write to its counter refused, its reads alike.
            "newer fatal ProtocolTooNew",
            "seat newer fatal ProtocolTooNew",
            "newer page",
            // The key of three permits (issue 26): granted to its own permits, seat and row, renewed;
            // refused to others, and the refusal read as a mismatch naming both values.
            "permits 3 Enqueue(Done)",
            "seat permits 3 Enqueue(Done)",
            "permits 2 fatal PermitsMismatch 3 2",
            "seat permits 1 fatal PermitsMismatch 3 1",
            // An operator's `flightlock permits --set`: written on an empty seat, refused on a taken
            // one and on a key without a counter or on a newer protocol.
            "set PermitsSet(Set)",
            "set PermitsSet(SeatTaken",
            "set PermitsSet(NoCounter)",
            "set fatal ProtocolTooNew",
        ] {
            assert!(
                kinds.keys().any(|k| k.starts_with(needed)),
                "no {needed} among {kinds:?}"
            );
        }
    })
    .await;
}

/// The mutation suite's half for `storage/dynamo.rs`: each request condition broken on purpose must make
/// DynamoDB Local answer differently from the model within the differential's requests. (The
/// simulation runs the model's conditions, so only this test can see `storage/dynamo.rs`'s.)
#[tokio::test]
async fn a_broken_request_condition_in_store_is_caught() {
    bounded(async move {
        use crate::mutant::{plant, Mutant};
        for m in [
            Mutant::StoreHeartbeatOwnerOnly,
            Mutant::StoreVacateAnyOwner,
            Mutant::StoreStaleDeleteUnconditional,
            Mutant::StoreEnqueueIgnoresWatermark,
            Mutant::StoreMarkBackwards,
            Mutant::StoreSweepWithoutRvn,
            Mutant::StoreSeatIgnoresProtocol,
            Mutant::StorePermitsIgnored,
        ] {
            let planted = plant(Some(m));
            let found = compare(8).await;
            drop(planted);
            match found {
                Ok(_) => {
                    panic!(
                        "{m:?} survived the differential test: store.rs's conditions are unchecked"
                    )
                }
                Err(difference) => eprintln!(
                    "mutation {m:?}: caught: {}",
                    difference.lines().next().unwrap_or("")
                ),
            }
        }
    })
    .await;
}
