//! The simulated network between participants and the model table, and the participants'
//! clocks. Every choice comes from the run's seeded generator.
//!
//! A request is *delivered* by a task of its own: it travels (a delay), is applied to the table
//! at the instant it arrives, and may arrive twice (a duplicate, as an SDK retry of a request that
//! did land). The caller waits for the answer for at most one attempt timeout; a request that has
//! not answered by then is a timeout for the caller but still lands whenever it arrives — the
//! "late heartbeat" and the "enqueue still in flight" of the real world. An answer can be lost
//! after the write (the caller sees a connection error, the write happened), a request can be
//! refused before it is applied (throttling, 5xx), and a transaction can meet a conflict.
//!
//! A crashed participant's endpoint swallows every later request: they never arrive and never
//! answer. Requests already on the wire still land.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::Instant;

use super::model::{Mutation, Table};
use super::pacing::{Answered, Sending, Sent};
use super::trace::Trace;
use crate::storage::{Backend, Enqueue, Failure, Request, Response};

mod clock;
mod describe;

pub(crate) use clock::SimClock;
pub(crate) use describe::describe;
use describe::{describe_response, kind};

/// In the lease-edge family, the share of seat takes answered after the taker's lease.
const SLOW_SEAT: f64 = 0.3;

/// How faulty the network is at the moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Faults {
    /// Probability that a request is refused before it is applied (half throttling, half 5xx).
    pub refuse: f64,
    /// Probability that the answer is lost after the write.
    pub lose_answer: f64,
    /// Probability that a request lands twice.
    pub duplicate: f64,
    /// Probability that an enqueue meets a transaction conflict.
    pub conflict: f64,
    /// Probability that a request is slow: up to twice the attempt timeout.
    pub slow: f64,
    /// Ordinary one-way delay, uniform up to this.
    pub delay: Duration,
}

impl Faults {
    /// A healthy network: small delays only.
    pub(crate) const CALM: Faults = Faults {
        refuse: 0.0,
        lose_answer: 0.0,
        duplicate: 0.0,
        conflict: 0.0,
        slow: 0.0,
        delay: Duration::from_millis(3),
    };
}

/// Everything the participants share: the table, the generator, the fault settings, the trace.
pub(crate) struct Net {
    pub table: Mutex<Table>,
    pub rng: Mutex<StdRng>,
    pub faults: Mutex<Faults>,
    pub attempt_timeout: Duration,
    pub trace: Trace,
    pub mutation: Option<Mutation>,
    /// When each record version was first sent (its writer's lease counts from about then).
    pub sent: Mutex<std::collections::HashMap<String, Instant>>,
    /// Per participant, the spans of its requests that met a fault (refused, conflict, answer
    /// lost, timed out, slow, duplicated): the availability checks judge only fault-free spans.
    pub faulted: Mutex<std::collections::HashMap<String, Vec<(Instant, Instant)>>>,
    /// Every write that set a new version of an entry (enqueue, seat, heartbeat), as it landed.
    pub writes: Mutex<Vec<Landed>>,
    /// When each participant sent each of its requests.
    pub requests: Mutex<std::collections::HashMap<String, Vec<Instant>>>,
    /// The longest round trip of a request that meets no fault: twice the one-way delay.
    pub round_trip: Duration,
    /// Per participant, when each of its `Query`s whose answer reached it was applied.
    pub reads: Mutex<std::collections::HashMap<String, Vec<Instant>>>,
    /// Per participant, every request it sent and when its answer reached it (the pacing check).
    pub log: Mutex<std::collections::HashMap<String, Vec<Sent>>>,
    /// The lease-edge family's stalled participant, while the faults last
    /// ([`super::scenario::plan_edge`]); while it is set, a share of seat takes ([`SLOW_SEAT`])
    /// are answered after the taker's lease (not in the clock-rate family).
    pub stalled: Mutex<Option<String>>,
}

/// A write that set an entry's version.
#[derive(Debug, Clone)]
pub(crate) struct Landed {
    pub key: String,
    pub who: String,
    /// The entry's owner id.
    pub owner: String,
    /// When its request was sent.
    pub sent: Instant,
    /// When the table applied it.
    pub at: Instant,
}

impl fmt::Debug for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Net")
    }
}

impl Net {
    /// A number in `[0, 1)` from the run's generator.
    pub(crate) fn roll(&self) -> f64 {
        self.rng.lock().map_or(0.5, |mut r| r.random::<f64>())
    }

    fn delay(&self, faults: &Faults) -> Duration {
        let slow = self.roll() < faults.slow;
        let r = self.roll();
        if slow {
            self.attempt_timeout.mul_f64(2.0 * r)
        } else {
            faults.delay.mul_f64(r)
        }
    }

    /// How many requests `who` sent at or after `from`.
    pub(crate) fn sent_since(&self, who: &str, from: Instant) -> usize {
        self.requests.lock().map_or(0, |r| {
            r.get(who)
                .map_or(0, |sent| sent.iter().filter(|&&at| at >= from).count())
        })
    }

    /// How many looks below its row (first pages) `who` sent at or after `from`.
    pub(crate) fn looks_since(&self, who: &str, from: Instant) -> usize {
        self.log.lock().map_or(0, |l| {
            l.get(who).map_or(0, |sent| {
                sent.iter()
                    .filter(|s| s.sent >= from && matches!(s.what, Sending::Look { .. }))
                    .count()
            })
        })
    }

    /// Whether a request of `who` met a fault at any moment of `[from, to]`.
    pub(crate) fn faulted(&self, who: &str, from: Instant, to: Instant) -> bool {
        self.faulted.lock().map_or(true, |f| {
            f.get(who)
                .is_some_and(|spans| spans.iter().any(|&(a, b)| a <= to && b >= from))
        })
    }

    fn fault(&self, who: &str, from: Instant, to: Instant) {
        if let Ok(mut f) = self.faulted.lock() {
            f.entry(who.to_owned()).or_default().push((from, to));
        }
    }

    /// Applies a request at the current instant.
    fn apply(&self, who: &str, request: &Request, sent: Instant) -> Result<Response, Failure> {
        let now = Instant::now();
        let result = match self.table.lock() {
            Ok(mut t) => {
                let result = t.apply(request, now);
                match &result {
                    Ok(response) => t.outcomes.count(&kind(request, response)),
                    Err(f) => t.outcomes.count(&format!(
                        "{} failed: {}",
                        request.operation(),
                        f.describe().chars().take(40).collect::<String>()
                    )),
                }
                result
            }
            Err(_) => Err(Failure::Fatal(crate::Error::Dynamo {
                operation: "model",
                source: "the model's lock is poisoned".into(),
            })),
        };
        let versioned = matches!(
            result,
            Ok(Response::Enqueue(Enqueue::Done | Enqueue::AlreadyOurs)
                | Response::Renewal(crate::storage::Renewal::Renewed))
        );
        let entry = match request {
            Request::Enqueue(e) => Some((&e.key, &e.owner)),
            Request::Heartbeat(b) => Some((&b.key, &b.owner)),
            _ => None,
        };
        if let (true, Some((key, owner)), Ok(mut w)) = (versioned, entry, self.writes.lock()) {
            w.push(Landed {
                key: key.clone(),
                who: who.to_owned(),
                owner: owner.clone(),
                sent,
                at: now,
            });
        }
        self.trace.line(format!(
            "{who} applied {} -> {}",
            describe(request),
            match &result {
                Ok(r) => describe_response(r),
                Err(f) => format!("error {}", f.describe()),
            }
        ));
        result
    }
}

/// One participant's connection to the table.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub net: Arc<Net>,
    pub who: Arc<str>,
    pub dead: Arc<AtomicBool>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Endpoint({})", self.who)
    }
}

fn retry(operation: &'static str, what: &str, throttled: bool) -> Failure {
    Failure::Retry {
        throttled,
        operation,
        source: what.to_owned().into(),
    }
}

impl Backend for Endpoint {
    fn call(&self, request: Request) -> BoxFuture<'static, Result<Response, Failure>> {
        let ep = self.clone();
        Box::pin(async move {
            if ep.dead.load(Ordering::SeqCst) {
                return std::future::pending().await;
            }
            let index = ep.net.log.lock().ok().map(|mut log| {
                let mine = log.entry(ep.who.to_string()).or_default();
                mine.push(Sent::of(&request, Instant::now()));
                mine.len() - 1
            });
            let result = ep.exchange(request).await;
            let answered = match &result {
                Ok(Response::Enqueue(Enqueue::Conflict)) | Err(_) => Answered::Failed,
                Ok(Response::Renewal(r)) if *r != crate::storage::Renewal::Renewed => {
                    Answered::Failed
                }
                Ok(_) => Answered::Ok,
            };
            if let (Some(i), Ok(mut log)) = (index, ep.net.log.lock()) {
                if let Some(sent) = log.get_mut(&*ep.who).and_then(|l| l.get_mut(i)) {
                    sent.answered = Some((Instant::now(), answered));
                }
            }
            result
        })
    }
}

impl Endpoint {
    /// One request over the network: its delays, faults and delivery.
    async fn exchange(&self, request: Request) -> Result<Response, Failure> {
        let ep = self.clone();
        {
            let net = ep.net.clone();
            let rvn = match &request {
                Request::Enqueue(e) => match e.row.get(crate::schema::RVN) {
                    Some(aws_sdk_dynamodb::types::AttributeValue::S(r)) => Some(r.clone()),
                    _ => None,
                },
                Request::Heartbeat(b) => Some(b.rvn.clone()),
                _ => None,
            };
            if let (Some(rvn), Ok(mut sent)) = (rvn, net.sent.lock()) {
                super::rates::wrote(&rvn, &ep.who);
                sent.entry(rvn).or_insert_with(Instant::now);
            }
            let faults = net.faults.lock().map_or(Faults::CALM, |f| *f);
            let operation = request.operation();
            let go = net.delay(&faults);
            let mut back = net.delay(&faults);
            let started = Instant::now();
            if let Ok(mut r) = net.requests.lock() {
                r.entry(ep.who.to_string()).or_default().push(started);
            }
            let stalled = net
                .stalled
                .lock()
                .is_ok_and(|s| s.as_deref() == Some(&*ep.who));
            // The clock-rate family stalls its participant's heartbeats only (`rates.rs`).
            let (stalled, refuse_beat) = super::rates::stall(stalled, &request, &net.table);
            if refuse_beat || stalled {
                if refuse_beat {
                    // A fault from the start: the checks that run meanwhile know it.
                    net.fault(&ep.who, started, started + go);
                    tokio::time::sleep(go).await;
                    net.trace.line(format!(
                        "{} stalled: refused {}",
                        ep.who,
                        describe(&request)
                    ));
                    return Err(retry(operation, "stalled: heartbeat refused", true));
                }
                back = net.attempt_timeout.mul_f64(1.0 + net.roll());
                net.fault(&ep.who, started, started + go + back);
            }
            let edge = net.stalled.lock().is_ok_and(|s| s.is_some()) && !super::rates::family();
            if edge && matches!(&request, Request::Enqueue(e) if e.seat) && net.roll() < SLOW_SEAT {
                // The lease-edge family: a seat taken (by anyone) is answered between one and
                // one and a half leases (four to six attempt timeouts: the family has one key)
                // later: past the taker's own lease, and past the takeover of a watcher that
                // judged the seat dead meanwhile.
                back = net.attempt_timeout.mul_f64(4.0 + 2.0 * net.roll());
                net.fault(&ep.who, started, started + go + back);
            }
            if go > faults.delay || back > faults.delay {
                net.fault(&ep.who, started, started + go + back);
            }
            if net.roll() < faults.refuse {
                tokio::time::sleep(go).await;
                net.fault(&ep.who, started, Instant::now());
                let throttled = net.roll() < 0.5;
                net.trace.line(format!(
                    "{} refused {} ({})",
                    ep.who,
                    describe(&request),
                    if throttled { "throttled" } else { "500" }
                ));
                return Err(retry(operation, "refused by the network model", throttled));
            }
            if matches!(request, Request::Enqueue(_)) && net.roll() < faults.conflict {
                tokio::time::sleep(go).await;
                net.fault(&ep.who, started, Instant::now());
                if let Ok(mut t) = net.table.lock() {
                    let seat = matches!(&request, Request::Enqueue(e) if e.seat);
                    t.outcomes.count(if seat {
                        "TakeSeat Conflict"
                    } else {
                        "Enqueue Conflict"
                    });
                }
                net.trace
                    .line(format!("{} conflict on {}", ep.who, describe(&request)));
                return Ok(Response::Enqueue(Enqueue::Conflict));
            }
            let lose = net.roll() < faults.lose_answer || (stalled && net.roll() < 0.5);
            let duplicate = net.roll() < faults.duplicate;
            let again = net.delay(&faults) + faults.delay;
            let (tx, rx) = tokio::sync::oneshot::channel();
            let two_writes = net.mutation == Some(Mutation::TwoWriteEnqueue)
                && matches!(request, Request::Enqueue(_));
            let between = net.delay(&faults) + Duration::from_millis(1);
            let who = ep.who.clone();
            if duplicate {
                net.fault(&ep.who, started, started + go + again);
            }
            // Delivery: independent of the caller, who may stop waiting.
            tokio::spawn(async move {
                tokio::time::sleep(go).await;
                let result = if two_writes {
                    deliver_in_two_writes(&net, &who, &request, between, started).await
                } else {
                    net.apply(&who, &request, started)
                };
                let _ = tx.send(result);
                if duplicate {
                    tokio::time::sleep(again).await;
                    net.trace
                        .line(format!("{who} duplicate of {}", describe(&request)));
                    drop(net.apply(&who, &request, started));
                }
            });
            // The SDK's attempt timeout is a timer on the caller's machine: its clock's rate.
            let timeout = super::rates::true_duration(&ep.who, ep.net.attempt_timeout);
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(result)) => {
                    tokio::time::sleep(back).await;
                    if lose {
                        ep.net.fault(&ep.who, started, Instant::now());
                        ep.net.trace.line(format!("{} lost the answer", ep.who));
                        return Err(retry(operation, "answer lost by the network model", false));
                    }
                    if operation == "Query" && result.is_ok() {
                        if let Ok(mut r) = ep.net.reads.lock() {
                            r.entry(ep.who.to_string()).or_default().push(started + go);
                        }
                    }
                    result
                }
                Ok(Err(_)) => Err(retry(operation, "delivery task ended", false)),
                Err(_) => {
                    ep.net.fault(&ep.who, started, Instant::now());
                    ep.net.trace.line(format!("{} timed out", ep.who));
                    Err(retry(operation, "attempt timeout", false))
                }
            }
        }
    }
}

/// The old, broken enqueue: the counter first, the row a moment later.
async fn deliver_in_two_writes(
    net: &Net,
    who: &str,
    request: &Request,
    between: Duration,
    sent: Instant,
) -> Result<Response, Failure> {
    let Request::Enqueue(r) = request else {
        return net.apply(who, request, sent);
    };
    if r.seat {
        return net.apply(who, request, sent); // one write already
    }
    let first = match net.table.lock() {
        Ok(mut t) => t.take_ticket(r, Instant::now()),
        Err(_) => Err(false),
    };
    match first {
        Ok(answer) => Ok(answer),
        Err(_) => {
            tokio::time::sleep(between).await;
            if let Ok(mut t) = net.table.lock() {
                t.put_row(r, Instant::now());
            }
            net.trace
                .line(format!("{who} two-write enqueue of ticket {}", r.ticket));
            Ok(Response::Enqueue(Enqueue::Done))
        }
    }
}
