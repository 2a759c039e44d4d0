//! The storage requests of once per tick (see [`crate::tick`]): marking an ordered tick done on
//! the counter, and the record of a done tick id.

use super::{Failure, Request, Response, Store};

impl Store {
    /// Marks the ordered tick `tick` done on `key`'s counter (only forward). `true` if the
    /// watermark stands at `tick` now.
    pub(crate) async fn mark_done(&self, key: &str, tick: i64) -> Result<bool, Failure> {
        let request = Request::MarkDone {
            key: key.to_owned(),
            tick,
        };
        match self.call(request).await? {
            Response::Marked(m) => Ok(m),
            other => Err(Self::wrong("UpdateItem", other)),
        }
    }

    /// Whether the record of the done tick id `id` exists (a strongly consistent read).
    pub(crate) async fn tick_recorded(&self, key: &str, id: &str) -> Result<bool, Failure> {
        let request = Request::TickRecorded {
            key: key.to_owned(),
            id: id.to_owned(),
        };
        match self.call(request).await? {
            Response::Recorded(r) => Ok(r),
            other => Err(Self::wrong("Query", other)),
        }
    }

    /// Writes the record of the done tick id `id`, expiring at `expires_at` (epoch seconds).
    /// `true` if we wrote it, `false` if it existed.
    pub(crate) async fn record_tick(
        &self,
        key: &str,
        id: &str,
        expires_at: i64,
    ) -> Result<bool, Failure> {
        let request = Request::RecordTick {
            key: key.to_owned(),
            id: id.to_owned(),
            expires_at,
        };
        match self.call(request).await? {
            Response::Recorded(r) => Ok(r),
            other => Err(Self::wrong("PutItem", other)),
        }
    }
}
