//! The one retry rule: after a [`Failure::Retry`], pause with capped exponential backoff and full
//! jitter, unless the attempts are used up or the pause would end past the caller's deadline.
//! Fatal failures are never retried. The acquisition, the release and the sweeper each pick their
//! own numbers ([`Policy`]); the rule is the same.

use std::time::Duration;

use tokio::time::Instant;

use crate::clock::Clock;
use crate::liveness::backoff;
use crate::storage::Failure;

/// How a caller retries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// First pause (before jitter).
    pub base: Duration,
    /// Longest pause (before jitter).
    pub max: Duration,
    /// Attempts after which no retry is made (`u32::MAX`: only the deadline limits).
    pub attempts: u32,
}

impl Policy {
    /// Sleeps before retry number `attempt` (0 for the first retry) of the request that failed
    /// with `failure`, and returns true; returns false at once if the failure is fatal, the
    /// attempts are used up, or the pause would not end before `deadline`.
    pub(crate) async fn pause(
        &self,
        failure: &Failure,
        attempt: u32,
        deadline: Option<Instant>,
        clock: &dyn Clock,
    ) -> bool {
        let Failure::Retry {
            throttled,
            operation,
            source,
        } = failure
        else {
            return false;
        };
        if attempt >= self.attempts {
            return false;
        }
        let pause = backoff(attempt, self.base, self.max, clock.jitter());
        if deadline.is_some_and(|d| clock.now() + pause >= d) {
            return false;
        }
        tracing::debug!(operation, throttled, attempt, error = %source, "retrying");
        clock.sleep(pause).await;
        true
    }

    /// Sends one request until it is answered, pausing between failures by this policy until
    /// `give_up`; a fatal failure, or the deadline passed, is the error.
    pub(crate) async fn send<T, F, Fut>(
        &self,
        give_up: Instant,
        clock: &dyn Clock,
        mut send: F,
    ) -> Result<T, crate::error::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let mut attempt = 0;
        loop {
            match send().await {
                Ok(v) => return Ok(v),
                Err(failure) => {
                    attempt += 1;
                    if !self.pause(&failure, attempt, Some(give_up), clock).await {
                        return Err(failure.into_error());
                    }
                }
            }
        }
    }
}
