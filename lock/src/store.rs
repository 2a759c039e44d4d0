//! The thin I/O shell: every DynamoDB request the lock makes, one function each.
//!
//! Each function makes exactly one request (the SDK may retry it underneath: same request, same
//! idempotency token) and returns either a protocol outcome — a conditional write that lost is
//! an enum variant, not an error — or a [`Failure`] that says whether trying again can help.
//! Retrying, budgets and decisions live in `locker.rs` and `heartbeat.rs`.
//!
//! Every read that decides ownership is a strongly consistent `Query` on the base table.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;

use crate::error::{BoxError, Error};
use crate::schema::{self, n, queue_sk, s, NewRow, Snapshot, COUNTER_SK, PK, SK};

/// Why a request did not produce an outcome.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Worth retrying after a backoff: throttling, 5xx, timeouts, lost connections. A write that
    /// failed this way may or may not have happened (an *ambiguous* write).
    Retry {
        /// The service said to slow down.
        throttled: bool,
        /// Operation name, for the final error.
        operation: &'static str,
        /// The error.
        source: BoxError,
    },
    /// Retrying will not help; the user must act.
    Fatal(Error),
}

impl Failure {
    /// The error to report once the retry budget is spent.
    pub(crate) fn into_error(self) -> Error {
        match self {
            Failure::Fatal(e) => e,
            Failure::Retry {
                throttled: true,
                operation,
                source,
            } => Error::Throttled { operation, source },
            Failure::Retry {
                operation, source, ..
            } => Error::Dynamo { operation, source },
        }
    }
}

/// Result of the atomic enqueue transaction.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Enqueue {
    /// The counter moved from `expected` to `expected + 1` and our row was put, atomically.
    Done,
    /// The counter was not at `expected`; it is at `last` now. Nothing was written.
    CounterAt(u64),
    /// Our row with this ticket already exists: an earlier, ambiguous attempt committed.
    AlreadyOurs,
    /// Another transaction on the same items was in flight; try again after a backoff.
    Conflict,
}

/// Result of a conditional delete of a stale row.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StaleDelete {
    /// We deleted it.
    Deleted,
    /// It was already gone.
    Gone,
    /// Its `rvn` changed: its owner is alive after all.
    Revived,
}

/// Result of a conditional write on our own row.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Owned {
    /// The row was ours and the write happened.
    Yes,
    /// The row is gone or belongs to someone else: the lock is lost.
    No,
}

/// The table and the client: all DynamoDB calls of the lock.
#[derive(Clone, Debug)]
pub(crate) struct Store {
    client: Client,
    table: Arc<str>,
    /// Background releases (of dropped guards), so a process can wait for them before exiting.
    background: tokio_util::task::TaskTracker,
}

impl Store {
    pub(crate) fn new(client: Client, table: &str) -> Store {
        Store {
            client,
            table: table.into(),
            background: tokio_util::task::TaskTracker::new(),
        }
    }

    pub(crate) fn background(&self) -> &tokio_util::task::TaskTracker {
        &self.background
    }

    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    fn row_key(key: &str, ticket: u64) -> HashMap<String, AttributeValue> {
        HashMap::from([(PK.into(), s(key)), (SK.into(), s(&queue_sk(ticket)))])
    }

    /// Reads a key's counter and queue: one strongly consistent `Query` (more pages only past
    /// 1 MB, i.e. thousands of waiters).
    pub(crate) async fn read(&self, key: &str) -> Result<Snapshot, Failure> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&*self.table)
                .key_condition_expression("#pk = :pk")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_values(":pk", s(key))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.classify("Query", e))?;
            items.extend(out.items.unwrap_or_default());
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        Snapshot::from_items(key, &items).map_err(Failure::Fatal)
    }

    /// Takes ticket `expected + 1` and puts our row in one `TransactWriteItems`: the counter
    /// update is conditioned on `last = expected`, the row put on the row not existing. This
    /// closes the late-enqueue race: no row can appear with a ticket below one already issued.
    /// `token` makes a retried transaction idempotent on the service side; [`Enqueue::AlreadyOurs`]
    /// makes it idempotent on ours too, for servers that ignore the token.
    pub(crate) async fn enqueue(
        &self,
        row: &NewRow<'_>,
        expected: u64,
        token: &str,
    ) -> Result<Enqueue, Failure> {
        let counter = Update::builder()
            .table_name(&*self.table)
            .key(PK, s(row.key))
            .key(SK, s(COUNTER_SK))
            .update_expression("SET #last = :next")
            .condition_expression(if expected == 0 {
                "attribute_not_exists(#last)"
            } else {
                "#last = :expected"
            })
            .expression_attribute_names("#last", schema::LAST)
            .set_expression_attribute_values(Some(if expected == 0 {
                HashMap::from([(":next".into(), n(row.ticket))])
            } else {
                HashMap::from([
                    (":next".into(), n(row.ticket)),
                    (":expected".into(), n(expected)),
                ])
            }))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| fatal_build("TransactWriteItems", e))?;
        let put = Put::builder()
            .table_name(&*self.table)
            .set_item(Some(row.to_item()))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| fatal_build("TransactWriteItems", e))?;
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(counter).build())
            .transact_items(TransactWriteItem::builder().put(put).build())
            .client_request_token(token)
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(Enqueue::Done),
            Err(e) => e,
        };
        if let Some(TransactWriteItemsError::TransactionCanceledException(c)) =
            err.as_service_error()
        {
            let reasons = c.cancellation_reasons();
            let code = |i: usize| reasons.get(i).and_then(|r| r.code()).unwrap_or("None");
            let item = |i: usize| reasons.get(i).and_then(|r| r.item());
            if code(1) == "ConditionalCheckFailed" {
                let mine = item(1)
                    .and_then(|it| it.get(schema::OWNER))
                    .is_some_and(|o| o.as_s().is_ok_and(|o| o == row.owner));
                if mine {
                    return Ok(Enqueue::AlreadyOurs);
                }
            }
            if code(0) == "ConditionalCheckFailed" {
                let last = match item(0) {
                    None => 0,
                    Some(it) => {
                        Snapshot::from_items(row.key, [it])
                            .map_err(Failure::Fatal)?
                            .last
                    }
                };
                return Ok(Enqueue::CounterAt(last));
            }
            if reasons
                .iter()
                .any(|r| r.code() == Some("TransactionConflict"))
            {
                return Ok(Enqueue::Conflict);
            }
            let throttled = reasons.iter().any(|r| {
                matches!(
                    r.code(),
                    Some("ThrottlingError" | "ProvisionedThroughputExceeded")
                )
            });
            if throttled || code(1) == "ConditionalCheckFailed" {
                // A row at our ticket that is not ours while the counter was where we expected
                // cannot happen in a healthy table; treat it as transient and re-read.
                return Err(Failure::Retry {
                    throttled,
                    operation: "TransactWriteItems",
                    source: Box::new(err),
                });
            }
        }
        if let Some(TransactWriteItemsError::TransactionInProgressException(_)) =
            err.as_service_error()
        {
            return Ok(Enqueue::Conflict);
        }
        Err(self.classify("TransactWriteItems", err))
    }

    /// Deletes a row we judged stale, only if it still carries the `rvn` we judged.
    pub(crate) async fn delete_stale(
        &self,
        key: &str,
        ticket: u64,
        rvn: &str,
    ) -> Result<StaleDelete, Failure> {
        let result = self
            .client
            .delete_item()
            .table_name(&*self.table)
            .set_key(Some(Self::row_key(key, ticket)))
            .condition_expression("#rvn = :rvn")
            .expression_attribute_names("#rvn", schema::RVN)
            .expression_attribute_values(":rvn", s(rvn))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(StaleDelete::Deleted),
            Err(e) => match e.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(c)) => Ok(match c.item() {
                    Some(_) => StaleDelete::Revived,
                    None => StaleDelete::Gone,
                }),
                _ => Err(self.classify("DeleteItem", e)),
            },
        }
    }

    /// Renews our row's lease, conditioned on `owner` only (not on the previous `rvn`: after an
    /// ambiguous heartbeat the retry must still succeed). An update of a deleted row fails its
    /// condition, so a late heartbeat never brings a released or removed row back.
    pub(crate) async fn heartbeat(&self, beat: &Beat<'_>) -> Result<Owned, Failure> {
        let mut values = HashMap::from([
            (":owner".to_owned(), s(beat.owner)),
            (":until".to_owned(), n(beat.lease_until_ms)),
            (
                ":exp".to_owned(),
                n(schema::ttl_seconds(beat.lease_until_ms + beat.grace_ms)),
            ),
            (":rvn".to_owned(), s(beat.rvn)),
        ]);
        let mut names = HashMap::from([
            ("#owner".to_owned(), schema::OWNER.to_owned()),
            ("#until".to_owned(), schema::LEASE_UNTIL_MS.to_owned()),
            ("#exp".to_owned(), schema::EXPIRES_AT.to_owned()),
            ("#rvn".to_owned(), schema::RVN.to_owned()),
        ]);
        let mut update = "SET #until = :until, #exp = :exp, #rvn = :rvn".to_owned();
        if let Some(at) = beat.acquired_at_ms {
            update.push_str(", #acq = if_not_exists(#acq, :acq)");
            names.insert("#acq".into(), schema::ACQUIRED_AT_MS.into());
            values.insert(":acq".into(), n(at));
        }
        let result = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(Self::row_key(beat.key, beat.ticket)))
            .update_expression(update)
            .condition_expression("#owner = :owner")
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Owned::Yes),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(Owned::No),
                _ => Err(self.classify("UpdateItem", e)),
            },
        }
    }

    /// Deletes our own row (release, or giving up a wait), conditioned on `owner`.
    ///
    /// The SDK's own retries are off for this request: the caller retries, and must know whether
    /// an earlier attempt may have deleted the row already (its response lost), or else it would
    /// report a lock it released itself as lost.
    pub(crate) async fn delete_owned(
        &self,
        key: &str,
        ticket: u64,
        owner: &str,
    ) -> Result<Owned, Failure> {
        let no_sdk_retry = aws_sdk_dynamodb::config::Builder::default()
            .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled());
        let result = self
            .client
            .delete_item()
            .table_name(&*self.table)
            .set_key(Some(Self::row_key(key, ticket)))
            .condition_expression("#owner = :owner")
            .expression_attribute_names("#owner", schema::OWNER)
            .expression_attribute_values(":owner", s(owner))
            .customize()
            .config_override(no_sdk_retry)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Owned::Yes),
            Err(e) => match e.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(_)) => Ok(Owned::No),
                _ => Err(self.classify("DeleteItem", e)),
            },
        }
    }

    /// Maps an SDK error to retry-or-fatal, with actionable messages for what a user must fix.
    pub(crate) fn classify<E>(
        &self,
        operation: &'static str,
        err: SdkError<E, aws_smithy_runtime_api::http::Response>,
    ) -> Failure
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let status = err.raw_response().map(|r| r.status().as_u16());
        let code = err.code().unwrap_or_default().to_owned();
        let message = err.message().unwrap_or_default().to_owned();
        enum Kind {
            Retry(bool),
            NotFound,
            Denied,
            Other,
        }
        let kind = match code.as_str() {
            "ResourceNotFoundException" => Kind::NotFound,
            "AccessDeniedException"
            | "UnrecognizedClientException"
            | "InvalidSignatureException"
            | "MissingAuthenticationTokenException"
            | "ExpiredTokenException" => Kind::Denied,
            "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded"
            | "LimitExceededException" => Kind::Retry(true),
            "InternalServerError" | "ServiceUnavailable" | "TransactionInProgressException" => {
                Kind::Retry(false)
            }
            _ if status.is_some_and(|s| s >= 500) => Kind::Retry(false),
            _ if status.is_none() => Kind::Retry(false), // timeouts, refused or dropped connections
            _ => Kind::Other,
        };
        match kind {
            Kind::Retry(throttled) => Failure::Retry {
                throttled,
                operation,
                source: Box::new(ServiceError {
                    code,
                    message,
                    source: Box::new(err),
                }),
            },
            Kind::NotFound => Failure::Fatal(Error::TableNotFound {
                table: self.table.to_string(),
            }),
            Kind::Denied => Failure::Fatal(Error::AccessDenied {
                operation,
                table: self.table.to_string(),
                message: if message.is_empty() { code } else { message },
            }),
            Kind::Other => Failure::Fatal(Error::Dynamo {
                operation,
                source: Box::new(ServiceError {
                    code,
                    message,
                    source: Box::new(err),
                }),
            }),
        }
    }
}

/// An SDK error shown the way a person wants to read it (`Code: message`), keeping the SDK's
/// error as its source.
#[derive(Debug)]
pub(crate) struct ServiceError {
    code: String,
    message: String,
    source: BoxError,
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code.is_empty(), self.message.is_empty()) {
            (false, false) => write!(f, "{}: {}", self.code, self.message),
            (false, true) => f.write_str(&self.code),
            _ => {
                // No service code (a connection or timeout failure): the chain of causes, each
                // once, e.g. "dispatch failure: io error: ...: Connection refused (os error 111)".
                let mut parts: Vec<String> = Vec::new();
                let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&*self.source);
                while let Some(e) = next {
                    let s = e.to_string();
                    if parts.last() != Some(&s) {
                        parts.push(s);
                    }
                    next = e.source();
                }
                f.write_str(&parts.join(": "))
            }
        }
    }
}

/// The SDK error is kept for `Debug`; the display above already carries its causes.
impl std::error::Error for ServiceError {}

fn fatal_build(operation: &'static str, e: aws_sdk_dynamodb::error::BuildError) -> Failure {
    Failure::Fatal(Error::Dynamo {
        operation,
        source: Box::new(e),
    })
}

/// One heartbeat's new values.
#[derive(Debug)]
pub(crate) struct Beat<'a> {
    pub key: &'a str,
    pub ticket: u64,
    pub owner: &'a str,
    pub lease_until_ms: i64,
    pub grace_ms: i64,
    pub rvn: &'a str,
    /// Set `acquiredAtMs` if it is not set yet (the row has just been granted).
    pub acquired_at_ms: Option<i64>,
}
