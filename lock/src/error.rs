//! The one error type of the crate.
//!
//! Protocol outcomes that are part of normal operation (a condition that failed because someone
//! else moved first, a stale row that came back to life) are *not* errors: they are enum
//! variants of the functions that meet them. What reaches [`Error`] is either something a user
//! must fix (table missing, access denied, bad key) or the end of a budget (busy, throttled).

use std::time::Duration;

use crate::holder::HolderInfo;

/// Where a user who meets [`Error::ProtocolTooNew`] reads what to do.
pub const UPGRADE_GUIDE: &str = "docs/src/operations/upgrades.md";

/// Where a user who meets [`Error::PermitsMismatch`] reads how to change a key's permits.
pub const PERMITS_GUIDE: &str = "docs/src/guide/n-at-a-time.md";

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
         dynamodb:Query, PutItem, UpdateItem, DeleteItem, DescribeTable and DescribeTimeToLive \
         on this table (template.yaml's LockUserPolicy lists them)"
    )]
    AccessDenied {
        /// DynamoDB operation.
        operation: &'static str,
        /// Table name.
        table: String,
        /// The service's message.
        message: String,
    },
    /// No region was configured, so the SDK could not sign or route a request.
    #[error(
        "no AWS region is configured ({cause}): set AWS_REGION (e.g. `export \
         AWS_REGION=us-east-1`), a profile with a region (AWS_PROFILE), or pass --region"
    )]
    NoRegion {
        /// The SDK's words.
        cause: String,
    },
    /// No credentials could be found or loaded before DynamoDB ever answered.
    #[error(
        "no AWS credentials ({cause}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
         AWS_PROFILE, or run where a role provides them (DynamoDB Local accepts any values)"
    )]
    NoCredentials {
        /// The SDK's words.
        cause: String,
    },
    /// The endpoint refused the connection or its host name does not resolve, and DynamoDB has
    /// not answered this process once: a setting to fix, not a fault to wait out.
    #[error(
        "cannot reach DynamoDB ({cause}): check the endpoint (AWS_ENDPOINT_URL_DYNAMODB, \
         AWS_ENDPOINT_URL or --endpoint-url; for DynamoDB Local start it with \
         `scripts/dynamodb-local start`), the region (AWS_REGION) and the network"
    )]
    Unreachable {
        /// The SDK's words, e.g. `Connection refused (os error 111)`.
        cause: String,
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
    #[error("lock `{key}` is busy: {} (gave up after {waited:.1?})", describe_holders(.holders, *.permits))]
    Busy {
        /// Lock key.
        key: String,
        /// How long we waited.
        waited: Duration,
        /// The holders, when known (the first live entries of the queue, at most `permits`):
        /// empty when the acquisition gave up without reading them (it lost the race to
        /// enqueue).
        holders: Vec<HeldBy>,
        /// The key's number of permits ([`crate::LockOptions::permits`]): busy means that many
        /// were held, or earlier waiters were queued.
        permits: u32,
    },
    /// Once per tick: the tick already ran successfully (a duplicate delivery or a retry of a
    /// run that succeeded), or a newer tick did (a schedule never runs backwards). The lock is
    /// not held and nothing was left in the table.
    #[error(
        "lock `{key}`: tick {tick} is already done (the key's last successful tick is {done})"
    )]
    TickDone {
        /// Lock key.
        key: String,
        /// Our tick.
        tick: String,
        /// The done tick that covers ours: ours, or a newer one.
        done: String,
    },
    /// Coalesce: a newer tick (or a later waiter) queued behind this waiter, which withdrew.
    /// The lock is not held and nothing was left in the table.
    #[error("lock `{key}`: tick {tick} was superseded by {by}, which waits for the key instead")]
    Superseded {
        /// Lock key.
        key: String,
        /// Our tick (or our ticket, without a tick).
        tick: String,
        /// The newer tick (or ticket) that replaced us.
        by: String,
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
    /// The key's counter says it runs a newer protocol than this build speaks (see
    /// [`crate::PROTOCOL`]): the table was switched by newer participants. Refused without being
    /// granted and without removing anything but our own waiting entry; upgrade this
    /// participant.
    #[error(
        "lock `{key}` runs flightlock protocol {table}, but this build speaks protocol {speaks} \
         at most: it was refused, not granted. Upgrade this participant to a release that speaks \
         protocol {table} (see the upgrade guide: {guide})", guide = UPGRADE_GUIDE
    )]
    ProtocolTooNew {
        /// Lock key.
        key: String,
        /// The protocol the key's counter carries.
        table: u32,
        /// The highest protocol this build speaks ([`crate::PROTOCOL`]).
        speaks: u32,
    },
    /// The key's counter says it allows a different number of holders at a time than this
    /// participant was configured with ([`crate::LockOptions::permits`]). Refused without being
    /// granted and without removing anything but our own waiting entry: a key has one number of
    /// permits, agreed by everyone on it, so nobody grants beyond what the key allows.
    #[error(
        "lock `{key}` allows {table} holder(s) at a time, but this participant is configured with \
         {configured}: it was refused, not granted. Configure every participant on the key with \
         permits = {table} (`--permits`, `FLIGHTLOCK_PERMITS`), or change the key's permits with \
         `flightlock permits --key {key} --set N` (see {guide})",
        guide = PERMITS_GUIDE
    )]
    PermitsMismatch {
        /// Lock key.
        key: String,
        /// The permits the key's counter carries (1 when it carries none).
        table: u32,
        /// The permits this participant was configured with.
        configured: u32,
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

fn describe_holders(holders: &[HeldBy], permits: u32) -> String {
    let of = if permits > 1 {
        format!(" ({} of {permits} permits)", holders.len())
    } else {
        String::new()
    };
    if holders.is_empty() {
        return if permits > 1 {
            format!("all {permits} permits held, or earlier waiters queued")
        } else {
            "held by another owner".into()
        };
    }
    let each = holders
        .iter()
        .map(|h| {
            let mut s = format!("ticket {} (owner {}", h.ticket, h.owner);
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
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!("held by {each}{of}")
}

impl Error {
    /// True for [`Error::Busy`]: the key was held for the whole wait.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }

    /// True for [`Error::PermitsMismatch`]: the key allows a different number of holders than
    /// this participant was configured with.
    pub fn is_permits_mismatch(&self) -> bool {
        matches!(self, Error::PermitsMismatch { .. })
    }
}

/// The error a request failed with before it reached DynamoDB, when that failure is a setting to
/// fix rather than a fault to wait out: no region, no credentials, an endpoint that refuses
/// connections or whose host does not resolve. `None` for everything else (timeouts, dropped
/// connections, throttling), which the lock keeps retrying within its budget.
///
/// The SDK reports these as a dispatch or construction failure whose causes are only text (the
/// SDK's credential and DNS error types are not part of its public surface), so the chain of
/// causes is read: a refused connection by its `io::ErrorKind`, the rest by the SDK's own words
/// ("missing signing region", "Missing Region", "credentials", "dns error").
pub(crate) fn setup_error(err: &(dyn std::error::Error + 'static)) -> Option<Error> {
    let mut parts: Vec<String> = Vec::new();
    let mut refused = false;
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        let text = e.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        next = e.source();
    }
    // One line: the SDK's credential chain lists its providers one per line.
    let cause = parts
        .last()
        .map(|c| c.lines().map(str::trim).collect::<Vec<_>>().join("; "))
        .unwrap_or_default();
    let all = parts.join(": ").to_lowercase();
    if all.contains("missing signing region") || all.contains("missing region") {
        Some(Error::NoRegion { cause })
    } else if all.contains("credential") || all.contains("imds") {
        Some(Error::NoCredentials { cause })
    } else if refused
        || ((all.contains("dns error")
            || all.contains("failed to lookup address")
            || all.contains("name or service not known"))
            // EAI_AGAIN: the resolver could not answer now, which may pass.
            && !all.contains("temporary failure"))
    {
        Some(Error::Unreachable { cause })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Link {
        text: &'static str,
        #[source]
        source: Option<BoxError>,
    }

    /// An error whose display is `texts[0]`, caused by `texts[1]`, ..., caused by `last`.
    fn chain(texts: &[&'static str], last: Option<BoxError>) -> Link {
        let mut it = texts.iter().rev();
        let mut link = Link {
            text: it.next().copied().unwrap_or(""),
            source: last,
        };
        for text in it {
            link = Link {
                text,
                source: Some(Box::new(link)),
            };
        }
        link
    }

    #[test]
    fn a_refused_connection_is_unreachable_by_its_io_kind() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = chain(&["dispatch failure", "io error"], Some(Box::new(io)));
        let got = setup_error(&e);
        assert!(matches!(got, Some(Error::Unreachable { .. })), "{got:?}");
        assert!(got
            .map(|e| e.to_string())
            .is_some_and(|m| m.contains("AWS_ENDPOINT_URL_DYNAMODB")));
    }

    #[test]
    fn setup_problems_are_named_by_the_sdk_words() {
        type Case = (&'static [&'static str], fn(&Error) -> bool);
        let cases: [Case; 4] = [
            (
                &["dispatch failure", "other", "missing signing region"],
                |e| matches!(e, Error::NoRegion { .. }),
            ),
            (
                &["dispatch failure", "Invalid Configuration: Missing Region"],
                |e| matches!(e, Error::NoRegion { .. }),
            ),
            (
                &[
                    "dispatch failure",
                    "an error occurred while loading credentials",
                ],
                |e| matches!(e, Error::NoCredentials { .. }),
            ),
            (
                &[
                    "dispatch failure",
                    "io error",
                    "dns error",
                    "failed to lookup address",
                ],
                |e| matches!(e, Error::Unreachable { .. }),
            ),
        ];
        for (texts, expected) in cases {
            let got = setup_error(&chain(texts, None));
            assert!(got.as_ref().is_some_and(expected), "{texts:?}: {got:?}");
        }
    }

    #[test]
    fn faults_worth_waiting_out_are_not_setup_errors() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let e = chain(&["dispatch failure", "io error"], Some(Box::new(reset)));
        assert!(setup_error(&e).is_none());
        let e = chain(&["timeout", "HTTP read timeout occurred after 5s"], None);
        assert!(setup_error(&e).is_none());
        let e = chain(
            &[
                "dispatch failure",
                "dns error",
                "failed to lookup address information: Temporary failure in name resolution",
            ],
            None,
        );
        assert!(setup_error(&e).is_none());
    }
}
