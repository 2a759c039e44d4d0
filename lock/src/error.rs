//! The one error type of the crate.
//!
//! Protocol outcomes that are part of normal operation (a condition that failed because someone
//! else moved first, a stale row that came back to life) are *not* errors: they are enum
//! variants of the functions that meet them. What reaches [`Error`] is either something a user
//! must fix (table missing, access denied, bad key) or the end of a budget (busy, throttled).

use std::time::Duration;

use crate::schema::HolderInfo;

/// A boxed source error, kept so nothing about the cause is thrown away.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong with the lock.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The table does not exist (or is in another region or account).
    #[error(
        "lock table `{table}` was not found: create it with `flightlock create-table --table \
         {table}` (or deploy template.yaml), and check the region and endpoint"
    )]
    TableNotFound {
        /// Table name.
        table: String,
    },
    /// The table exists but its keys are not `pk` (S, HASH) and `sk` (S, RANGE).
    #[error(
        "table `{table}` has the wrong key schema ({found}): flightlock needs `pk` (S, HASH) and \
         `sk` (S, RANGE); use another table name or recreate it with `flightlock create-table`"
    )]
    WrongKeySchema {
        /// Table name.
        table: String,
        /// What the table has.
        found: String,
    },
    /// TTL is off or set on another attribute.
    #[error(
        "table `{table}`: {found}; flightlock needs TTL on the number attribute `expiresAt` \
         (epoch seconds): `aws dynamodb update-time-to-live --table-name {table} \
         --time-to-live-specification Enabled=true,AttributeName=expiresAt`"
    )]
    WrongTtl {
        /// Table name.
        table: String,
        /// What the table has.
        found: String,
    },
    /// IAM refused a call.
    #[error(
        "access denied calling dynamodb:{operation} on `{table}`: {message}. Grant the role \
         dynamodb:Query, PutItem, UpdateItem, DeleteItem and the transaction actions on this table"
    )]
    AccessDenied {
        /// DynamoDB operation.
        operation: &'static str,
        /// Table name.
        table: String,
        /// The service's message.
        message: String,
    },
    /// A lock key that is empty or too long.
    #[error("invalid lock key {key:?}: {problem}")]
    InvalidKey {
        /// The key (shortened for display).
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// An option out of range (e.g. a heartbeat not shorter than the lease).
    #[error("invalid option {name}: {problem}")]
    InvalidOption {
        /// Option name.
        name: &'static str,
        /// What is wrong and what is accepted.
        problem: String,
    },
    /// The key stayed held for the whole wait (`wait = 0`: it was held).
    #[error("lock `{key}` is busy: {} (gave up after {waited:.1?})", describe_holder(.holder))]
    Busy {
        /// Lock key.
        key: String,
        /// How long we waited.
        waited: Duration,
        /// The holder, if known.
        holder: Option<Box<HeldBy>>,
    },
    /// DynamoDB kept throttling past the retry budget.
    #[error(
        "DynamoDB throttled dynamodb:{operation} beyond the retry budget: lower the request rate \
         (longer poll interval) or raise the table's capacity: {source}"
    )]
    Throttled {
        /// DynamoDB operation.
        operation: &'static str,
        /// Last error.
        source: BoxError,
    },
    /// An item in the table does not look like a flightlock item. Nobody can judge whether its
    /// owner is alive, so the key stays unusable until the item is fixed or removed by hand.
    #[error(
        "malformed lock item (pk `{key}`, sk `{sk}`): attribute `{field}`: {problem}. No one can \
         tell whether it is held, so key `{key}` is stuck until the item is removed: check what \
         wrote it, then `aws dynamodb delete-item --table-name <lock table> --key \
         '{{\"pk\":{{\"S\":{key:?}}},\"sk\":{{\"S\":{sk:?}}}}}'`"
    )]
    MalformedItem {
        /// Lock key.
        key: String,
        /// The item's sort key (`?` if it has none).
        sk: String,
        /// Attribute.
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// Any other DynamoDB failure, after retries.
    #[error("dynamodb:{operation} failed: {source}")]
    Dynamo {
        /// DynamoDB operation.
        operation: &'static str,
        /// The SDK's error.
        source: BoxError,
    },
}

/// Who held a key when an acquisition gave up.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldBy {
    /// The holder's ticket (fencing token).
    pub ticket: u64,
    /// The holder's acquisition id.
    pub owner: String,
    /// Details for people.
    #[serde(flatten)]
    pub info: HolderInfo,
}

fn describe_holder(holder: &Option<Box<HeldBy>>) -> String {
    match holder {
        None => "held by another owner".into(),
        Some(h) => {
            let mut s = format!("held by ticket {} (owner {}", h.ticket, h.owner);
            for (label, v) in [
                ("function", &h.info.function),
                ("request", &h.info.request_id),
                ("host", &h.info.host),
            ] {
                if let Some(v) = v {
                    s.push_str(&format!(", {label} {v}"));
                }
            }
            s.push(')');
            s
        }
    }
}

impl Error {
    /// True for [`Error::Busy`]: the key was held for the whole wait.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }
}
