//! Per-invocation overrides carried by the event. Any JSON event is accepted (a scheduled
//! EventBridge event carries none of these fields); when present they must have the right type:
//!
//! | field | type | effect |
//! |---|---|---|
//! | `dryRun` | bool | judge and report, delete nothing |
//! | `grace` | string duration (`15m`) | replaces `FLIGHTLOCK_SWEEP_GRACE` for this run |
//! | `resume` | the `resume` array of an earlier summary | continue an incomplete sweep |

use std::time::Duration;

use flightlock::sweep::{ResumePoint, MIN_GRACE};
use serde_json::Value;

/// An override with the wrong type or value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid event field `{field}`: {problem}")]
pub struct EventError {
    /// The field.
    pub field: &'static str,
    /// What is wrong and what is accepted.
    pub problem: String,
}

/// Overrides read from the event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `dryRun`.
    pub dry_run: Option<bool>,
    /// `grace`.
    pub grace: Option<Duration>,
    /// `resume`.
    pub resume: Vec<ResumePoint>,
}

impl Overrides {
    /// Reads the overrides of an event.
    pub fn from_event(event: &Value) -> Result<Overrides, EventError> {
        let mut out = Overrides::default();
        let Some(obj) = event.as_object() else {
            return Ok(out);
        };
        if let Some(v) = obj.get("dryRun").filter(|v| !v.is_null()) {
            out.dry_run = Some(v.as_bool().ok_or_else(|| EventError {
                field: "dryRun",
                problem: format!("expected true or false, found {v}"),
            })?);
        }
        if let Some(v) = obj.get("grace").filter(|v| !v.is_null()) {
            let bad = |problem| EventError {
                field: "grace",
                problem,
            };
            let text = v.as_str().ok_or_else(|| {
                bad(format!(
                    "expected a duration string like \"15m\", found {v}"
                ))
            })?;
            let grace = flightlock::parse_duration(text).map_err(bad)?;
            if grace < MIN_GRACE {
                return Err(bad(format!("{grace:?} is below the minimum {MIN_GRACE:?}")));
            }
            out.grace = Some(grace);
        }
        if let Some(v) = obj.get("resume").filter(|v| !v.is_null()) {
            out.resume = serde_json::from_value(v.clone()).map_err(|e| EventError {
                field: "resume",
                problem: format!("expected the `resume` array of a sweep summary: {e}"),
            })?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scheduled_events_carry_no_overrides() {
        let scheduled = json!({
            "version": "0", "id": "x", "detail-type": "Scheduled Event",
            "source": "aws.events", "detail": {}
        });
        assert_eq!(
            Overrides::from_event(&scheduled).unwrap(),
            Overrides::default()
        );
        assert_eq!(
            Overrides::from_event(&json!("text")).unwrap(),
            Overrides::default()
        );
    }

    #[test]
    fn overrides_are_read_and_checked() {
        let o = Overrides::from_event(&json!({"dryRun": true, "grace": "15m", "resume": [
            {"segment": 0, "totalSegments": 1, "lastEvaluatedKey": {"pk": "k", "sk": "counter"}}
        ]}))
        .unwrap();
        assert_eq!(o.dry_run, Some(true));
        assert_eq!(o.grace, Some(Duration::from_secs(900)));
        assert_eq!(o.resume.len(), 1);
        for (event, field) in [
            (json!({"dryRun": "yes"}), "dryRun"),
            (json!({"grace": 60}), "grace"),
            (json!({"grace": "soon"}), "grace"),
            (json!({"grace": "1ms"}), "grace"),
            (json!({"resume": {"segment": 0}}), "resume"),
        ] {
            assert_eq!(Overrides::from_event(&event).unwrap_err().field, field);
        }
    }
}
