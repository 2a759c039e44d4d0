//! A scripted schedule: the one way an acquisition's release of an old seat entry could empty its
//! own new seat, were the seat's release conditioned on the owner alone.
//!
//! The script (a backend over the model that answers a few requests its own way):
//! 1. The acquisition's first seat request (ticket 1) times out without landing.
//! 2. Its retry is answered "no counter" (the counter was deleted and restored as it was: an
//!    operator restoring a copy, which nothing can detect), so it reads the queue again and sends
//!    a *new* seat request for ticket 1 (another version).
//! 3. The first request lands just before the second: the second meets our own older entry
//!    (`OursOlder`), which the acquisition removes, keeping ticket 1 among the entries its
//!    requests may have written.
//! 4. It reads again and takes the seat at ticket 2. On success it abandons the entries of its
//!    earlier attempts: a background release of the seat at ticket 1, same owner. Conditioned on
//!    the owner alone it would empty the seat at ticket 2 under its holder; conditioned on the
//!    ticket too (`storage/dynamo.rs`, and the model after it) it finds nothing to release.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::model::Table;
use super::net::describe;
use crate::options::{LockOptions, Wait};
use crate::schema::Snapshot;
use crate::storage::{Backend, Enqueue, Failure, Request, Response};
use crate::Locker;

#[derive(Debug)]
struct Scripted {
    table: Mutex<Table>,
    seats: Mutex<u32>,
    first: Mutex<Option<Request>>,
    answers: Mutex<Vec<String>>,
}

impl Scripted {
    fn answer(&self, request: Request) -> Result<Response, Failure> {
        let now = Instant::now();
        let mut table = self.table.lock().unwrap();
        if matches!(&request, Request::Enqueue(e) if e.seat) {
            let n = {
                let mut seats = self.seats.lock().unwrap();
                *seats += 1;
                *seats
            };
            match n {
                1 => {
                    *self.first.lock().unwrap() = Some(request.clone());
                    self.note(&request, "timed out (not landed yet)");
                    return Err(Failure::Retry {
                        throttled: false,
                        operation: "UpdateItem",
                        source: "script: attempt timeout".into(),
                    });
                }
                2 => {
                    self.note(&request, "CounterAt(None) (deleted and restored meanwhile)");
                    return Ok(Response::Enqueue(Enqueue::CounterAt(None)));
                }
                3 => {
                    let first = self.first.lock().unwrap().take().unwrap();
                    let landed = table.apply(&first, now);
                    self.note(&first, &format!("landed late: {landed:?}"));
                }
                _ => {}
            }
        }
        let result = table.apply(&request, now);
        self.note(&request, &format!("{result:?}"));
        result
    }

    fn note(&self, request: &Request, what: &str) {
        self.answers
            .lock()
            .unwrap()
            .push(format!("{} -> {what}", describe(request)));
    }
}

#[derive(Debug)]
struct Shared(Arc<Scripted>);

impl Backend for Shared {
    fn call(&self, request: Request) -> BoxFuture<'static, Result<Response, Failure>> {
        let result = self.0.answer(request);
        Box::pin(async move { result })
    }
}

#[tokio::test(start_paused = true)]
async fn a_release_of_an_old_seat_entry_never_empties_the_new_seat() {
    super::bounded(async move {
        let script = Arc::new(Scripted {
            table: Mutex::new(Table::new(Instant::now(), super::scenario::EPOCH_MS)),
            seats: Mutex::new(0),
            first: Mutex::new(None),
            answers: Mutex::new(Vec::new()),
        });
        let locker = Locker::on(Arc::new(Shared(script.clone())), "scripted");
        let opts = LockOptions {
            wait: Wait::Forever,
            lease: Duration::from_secs(20),
            ..LockOptions::default()
        };
        let guard = locker.acquire("k", &opts).await.expect("granted");
        // The background release of the abandoned entry (and its second pass after the attempt
        // timeout) has run.
        locker.flush().await;
        let answers = script.answers.lock().unwrap().join("\n");
        assert!(
            answers.contains("OursOlder"),
            "the script no longer reaches OursOlder:\n{answers}"
        );
        assert_eq!(guard.token(), 2, "{answers}");
        let items = script.table.lock().unwrap().partition("k");
        let snap = Snapshot::from_items("k", &items).unwrap();
        let seat = snap.rows.iter().find(|r| r.seat);
        assert!(
            seat.is_some_and(|s| s.ticket == 2 && s.owner == guard.owner()),
            "the holder's seat was emptied under it:\n{answers}\nseat: {seat:?}"
        );
        assert!(guard.lost_reason().is_none(), "{answers}");
        guard.release().await.unwrap();
    })
    .await;
}
