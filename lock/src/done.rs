//! Marking a tick done at the release of a run that succeeded (see [`crate::tick`]), and the
//! check of a done tick id once the lock is held.

use std::time::Duration;

use crate::error::Error;
use crate::heartbeat::{Membership, RELEASE_RETRY};
use crate::retry::Policy;
use crate::schema::ttl_seconds;
use crate::storage::{Failure, Store};
use crate::tick::Tick;

/// Marks `tick` done for the run that holds `m`. Returns the ordered tick the seat's release
/// must mark in its own write (the seat: free); a queue row's release marks the counter here
/// first (one more request), and a tick id's record is written here (one more write).
pub(crate) async fn mark(
    m: &Membership,
    tick: &Tick,
    keep: Duration,
) -> Result<Option<i64>, Error> {
    let (store, clock, key) = (&m.store, &*m.clock, &*m.key);
    match tick {
        Tick::At(t) if m.seat => Ok(Some(*t)),
        Tick::At(t) => {
            let marked = retried(clock, || store.mark_done(key, *t)).await?;
            if !marked {
                tracing::warn!(key, tick = %tick, "a newer tick is marked done already; not marking ours");
            }
            Ok(None)
        }
        Tick::Id(id) => {
            let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
            let expires_at = ttl_seconds(clock.wall_ms().saturating_add(keep_ms));
            retried(clock, || store.record_tick(key, id, expires_at)).await?;
            Ok(None)
        }
    }
}

/// Whether the tick id `id` is recorded done on `key`: one strongly consistent read, made once
/// the lock is held (the holder excludes every other run of the key, so nobody can record it
/// between this read and our run).
pub(crate) async fn recorded(
    store: &Store,
    clock: &dyn crate::Clock,
    key: &str,
    id: &str,
) -> Result<bool, Error> {
    retried(clock, || store.tick_recorded(key, id)).await
}

/// One request, retried like a release: short pauses, for up to 5 s.
async fn retried<T, F, Fut>(clock: &dyn crate::Clock, mut send: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Failure>>,
{
    const POLICY: Policy = RELEASE_RETRY;
    let give_up = clock.now() + Duration::from_secs(5);
    let mut attempt = 0;
    loop {
        match send().await {
            Ok(v) => return Ok(v),
            Err(failure) => {
                attempt += 1;
                if !POLICY.pause(&failure, attempt, Some(give_up), clock).await {
                    return Err(failure.into_error());
                }
            }
        }
    }
}
