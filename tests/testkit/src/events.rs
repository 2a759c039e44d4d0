//! Sample Lambda events shared by the tests of every adapter.

use serde_json::{json, Value};

/// An EventBridge scheduled event for the instant `time` (RFC 3339) with event id `id`, in the
/// shape a rule delivers it (`events/scheduled.json`). Every delivery of one tick (a duplicate,
/// a retry) carries the same `id` and `time`; the lock reads only `source`, `detail-type` and
/// `time`.
pub fn scheduled(id: &str, time: &str) -> Value {
    json!({
        "version": "0",
        "id": id,
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": time,
        "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/nightly"],
        "detail": {},
    })
}

/// The event id the tests use when one id is enough.
pub const SCHEDULED_ID: &str = "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa";
