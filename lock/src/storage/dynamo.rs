//! The DynamoDB implementation of the storage seam: one API call per [`Request`].
//!
//! Each request is exactly one call (the SDK may retry it underneath: same request, same
//! idempotency token) and comes back either as a protocol outcome — a conditional write that lost
//! is an enum variant, not an error — or a [`Failure`] that says whether trying again can help.
//! Retrying, budgets and decisions live in `locker/` and `membership.rs`; the sweep's Scan and the
//! removal of a dead entry are in `dynamo/scan.rs` and `dynamo/removal.rs`.
//!
//! Every read that decides ownership is a strongly consistent `Query` on the base table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    Put, ReturnValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;
use futures::future::BoxFuture;

use super::answers::{
    enqueue_outcome, permits_refused, protocol_refused, renewal_refused, seat_refused,
    seat_release_refused,
};
use super::{
    counter_key, entry_key, row_key, Backend, Beat, Enqueue, EnqueueRequest, Failure, Item, Owned,
    PermitsSet, Range, Renewal, Request, Response, Speaks,
};
use crate::error::{BoxError, Error};
use crate::protocol::{self, PERMITS_NAME, PERMITS_VALUE};
use crate::schema::{self, n, s, PK, SK};

mod removal;
mod scan;

pub use removal::DELETE_CONDITION;
#[cfg(test)]
pub(crate) use scan::scan_names;
pub use scan::{FILTER, PROJECTION};

/// A lock table in DynamoDB, reached through `client`.
#[derive(Clone, Debug)]
pub(crate) struct Dynamo {
    client: Client,
    table: Arc<str>,
    /// Set once DynamoDB (or anything at the endpoint) has sent a response to this client.
    answered: Arc<AtomicBool>,
}

/// Records that a response arrived. Until one has, a failure to reach the endpoint (refused,
/// unresolvable) or to sign (no region, no credentials) is a setting to fix, reported at once;
/// after one has, the same failure is a fault and is retried within the caller's budget.
#[derive(Debug)]
struct Answered(Arc<AtomicBool>);

impl aws_sdk_dynamodb::config::Intercept for Answered {
    fn name(&self) -> &'static str {
        "flightlock-answered"
    }

    fn read_before_deserialization(
        &self,
        _context: &aws_sdk_dynamodb::config::interceptors::BeforeDeserializationInterceptorContextRef<'_>,
        _runtime_components: &aws_sdk_dynamodb::config::RuntimeComponents,
        _cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        self.0.store(true, Ordering::Relaxed);
        Ok(())
    }
}

impl Backend for Dynamo {
    fn answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    fn call(&self, request: Request) -> BoxFuture<'static, Result<Response, Failure>> {
        let this = self.clone();
        Box::pin(async move {
            match request {
                Request::Query { key, start, range } => this.query(&key, start, range).await,
                Request::Enqueue(r) => this.enqueue(&r).await.map(Response::Enqueue),
                Request::DeleteStale {
                    key,
                    ticket,
                    seat,
                    rvn,
                    speaks,
                } => this
                    .remove_dead(&key, ticket, seat, &rvn, None, speaks)
                    .await
                    .map(Response::StaleDelete),
                Request::SweepDead(d) => this
                    .remove_dead(
                        &d.key,
                        d.ticket,
                        d.seat,
                        &d.rvn,
                        Some((&d.owner, d.cutoff_ms)),
                        Speaks::Any,
                    )
                    .await
                    .map(Response::StaleDelete),
                Request::Scan(r) => this.scan(r).await,
                Request::Heartbeat(beat) => this.heartbeat(&beat).await.map(Response::Renewal),
                Request::DeleteOwned {
                    key,
                    ticket,
                    seat: true,
                    owner,
                    done: Some(tick),
                    ..
                } => this
                    .release_seat_done(&key, ticket, &owner, tick)
                    .await
                    .map(Response::Owned),
                Request::DeleteOwned {
                    key,
                    ticket,
                    seat,
                    owner,
                    speaks,
                    ..
                } => this
                    .delete_owned(&key, ticket, seat, &owner, speaks)
                    .await
                    .map(Response::Owned),
                Request::MarkDone { key, tick } => {
                    this.mark_done(&key, tick).await.map(Response::Marked)
                }
                Request::TickRecorded { key, id } => {
                    this.tick_recorded(&key, &id).await.map(Response::Recorded)
                }
                Request::RecordTick {
                    key,
                    id,
                    expires_at,
                } => this
                    .record_tick(&key, &id, expires_at)
                    .await
                    .map(Response::Recorded),
                Request::CreateCounter {
                    key,
                    last,
                    owner,
                    protocol,
                    permits,
                } => this
                    .create_counter(&key, last, &owner, protocol, permits)
                    .await
                    .map(Response::Created),
                Request::SetPermits { key, permits } => this
                    .set_permits(&key, permits)
                    .await
                    .map(Response::PermitsSet),
            }
        })
    }
}

/// How a conditional `UpdateItem` ended ([`Dynamo::update`]).
pub(super) enum Updated {
    /// The condition held: the update was applied.
    Applied,
    /// The condition refused it: the item as it stood (`ALL_OLD`; `None`: there was none).
    Refused(Option<Item>),
}

impl Dynamo {
    pub(crate) fn new(client: Client, table: &str) -> Dynamo {
        let answered = Arc::new(AtomicBool::new(false));
        let config = client
            .config()
            .to_builder()
            .interceptor(Answered(answered.clone()))
            .build();
        Dynamo {
            client: Client::from_conf(config),
            table: table.into(),
            answered,
        }
    }

    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// One page of a strongly consistent `Query` on the key's partition.
    async fn query(
        &self,
        key: &str,
        start: Option<crate::storage::Item>,
        range: Range,
    ) -> Result<Response, Failure> {
        let mut query = self
            .client
            .query()
            .table_name(&*self.table)
            .expression_attribute_names("#pk", PK)
            .expression_attribute_values(":pk", s(key))
            .consistent_read(true)
            .set_exclusive_start_key(start);
        query = match range {
            // From the counter to the highest row: never a done tick's record (`tick#…`).
            Range::All => query
                .key_condition_expression("#pk = :pk AND #sk BETWEEN :lo AND :hi")
                .expression_attribute_names("#sk", schema::SK)
                .expression_attribute_values(":lo", s(schema::COUNTER_SK))
                .expression_attribute_values(":hi", s(&schema::queue_sk(u64::MAX))),
            Range::Below { ticket, limit } => query
                .key_condition_expression("#pk = :pk AND #sk BETWEEN :lo AND :hi")
                .expression_attribute_names("#sk", schema::SK)
                .expression_attribute_values(":lo", s(schema::COUNTER_SK))
                .expression_attribute_values(":hi", s(&schema::queue_sk(ticket)))
                .scan_index_forward(false)
                .limit(i32::try_from(limit).unwrap_or(i32::MAX)),
            Range::Lowest => query
                .key_condition_expression("#pk = :pk AND #sk BETWEEN :lo AND :hi")
                .expression_attribute_names("#sk", schema::SK)
                .expression_attribute_values(":lo", s(schema::COUNTER_SK))
                .expression_attribute_values(":hi", s(&schema::queue_sk(u64::MAX)))
                .limit(2),
        };
        let out = query.send().await.map_err(|e| self.classify("Query", e))?;
        Ok(Response::Page {
            items: out.items.unwrap_or_default(),
            next: out.last_evaluated_key.filter(|k| !k.is_empty()),
        })
    }

    /// Puts a key's counter at `protocol` (with `permits` above 1) if it has none.
    async fn create_counter(
        &self,
        key: &str,
        last: u64,
        owner: &str,
        protocol: u32,
        permits: u32,
    ) -> Result<bool, Failure> {
        let mut item = counter_key(key);
        item.insert(schema::LAST.into(), n(last));
        item.insert(
            schema::LAST_OWNER.into(),
            s(&schema::last_owner(owner, last)),
        );
        item.insert(schema::PROTOCOL_ATTR.into(), n(protocol));
        if permits > 1 {
            item.insert(schema::PERMITS_ATTR.into(), n(permits));
        }
        self.put_new(item).await
    }

    /// Sets the permits of `key`'s counter, if it exists, its seat is empty and it runs a
    /// protocol this build speaks (see [`Request::SetPermits`]).
    async fn set_permits(&self, key: &str, permits: u32) -> Result<PermitsSet, Failure> {
        let names = HashMap::from([
            ("#pk".to_owned(), PK.to_owned()),
            ("#owner".to_owned(), schema::OWNER.to_owned()),
            (PERMITS_NAME.to_owned(), schema::PERMITS_ATTR.to_owned()),
            (protocol::NAME.to_owned(), schema::PROTOCOL_ATTR.to_owned()),
        ]);
        let mut values = HashMap::from([
            (protocol::VALUE.to_owned(), n(protocol::PROTOCOL)),
            (":to".to_owned(), n(Speaks::Permits(permits).protocol())),
        ]);
        let update = if permits > 1 {
            values.insert(PERMITS_VALUE.to_owned(), n(permits));
            "SET #proto = :to, #permits = :permits"
        } else {
            "SET #proto = :to REMOVE #permits"
        };
        let update = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(counter_key(key)))
            .update_expression(update)
            .condition_expression(format!(
                "attribute_exists(#pk) AND attribute_not_exists(#owner) AND {}",
                protocol::CONDITION
            ))
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values));
        match self.update(update).await? {
            Updated::Applied => Ok(PermitsSet::Set),
            Updated::Refused(old) => permits_refused(key, old.as_ref()),
        }
    }

    /// Sends the conditional `UpdateItem` `update`, asking for the item as it stood if its
    /// condition refuses it: a refusal is an answer of the protocol, anything else a [`Failure`].
    pub(super) async fn update(&self, update: UpdateItemFluentBuilder) -> Result<Updated, Failure> {
        let result = update
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Updated::Applied),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    Ok(Updated::Refused(c.item.clone()))
                }
                _ => Err(self.classify("UpdateItem", e)),
            },
        }
    }

    /// `PutItem` of `item` only if no item has its key: whether it was put.
    pub(super) async fn put_new(&self, item: crate::storage::Item) -> Result<bool, Failure> {
        let result = self
            .client
            .put_item()
            .table_name(&*self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) => match e.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.classify("PutItem", e)),
            },
        }
    }

    /// Renews our row's lease (see [`Beat`] for the condition). An update of a deleted row fails
    /// its condition, so a late heartbeat never brings a released or removed row back.
    async fn heartbeat(&self, beat: &Beat) -> Result<Renewal, Failure> {
        let mut values = HashMap::from([
            (":owner".to_owned(), s(&beat.owner)),
            (":until".to_owned(), n(beat.lease_until_ms)),
            (":exp".to_owned(), n(beat.expires_at)),
            (":rvn".to_owned(), s(&beat.rvn)),
        ]);
        let mut names = HashMap::from([
            ("#owner".to_owned(), schema::OWNER.to_owned()),
            ("#until".to_owned(), schema::LEASE_UNTIL_MS.to_owned()),
            ("#exp".to_owned(), schema::EXPIRES_AT.to_owned()),
            ("#rvn".to_owned(), schema::RVN.to_owned()),
        ]);
        let mut condition = heartbeat_condition().to_owned();
        if beat.seat {
            // TTL must never remove a counter: the seat has no `expiresAt`.
            names.remove("#exp");
            values.remove(":exp");
            // The seat lives on the counter: only on a protocol we speak.
            let version = beat.speaks.condition(&mut names, &mut values);
            condition = format!("{condition} AND {version}");
        }
        let mut update = if beat.seat {
            "SET #until = :until, #rvn = :rvn".to_owned()
        } else {
            "SET #until = :until, #exp = :exp, #rvn = :rvn".to_owned()
        };
        if let Some(at) = beat.acquired_at_ms {
            update.push_str(", #acq = if_not_exists(#acq, :acq)");
            names.insert("#acq".into(), schema::ACQUIRED_AT_MS.into());
            values.insert(":acq".into(), n(at));
        }
        let update = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(entry_key(&beat.key, beat.ticket, beat.seat)))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::None);
        match self.update(update).await? {
            Updated::Applied => Ok(Renewal::Renewed),
            Updated::Refused(old) => {
                if beat.seat {
                    protocol_refused(&beat.key, old.as_ref(), beat.speaks)?;
                }
                Ok(renewal_refused(old.as_ref(), &beat.owner))
            }
        }
    }

    /// Deletes our own row (release, or giving up a wait), conditioned on `owner`.
    ///
    /// The SDK's own retries are off for this request: the caller retries, and must know whether
    /// an earlier attempt may have deleted the row already (its response lost), or else it would
    /// report a lock it released itself as lost.
    async fn delete_owned(
        &self,
        key: &str,
        ticket: u64,
        seat: bool,
        owner: &str,
        speaks: Speaks,
    ) -> Result<Owned, Failure> {
        let no_sdk_retry = aws_sdk_dynamodb::config::Builder::default()
            .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled());
        if seat {
            // On the ticket too: the seat may hold a later entry of the same owner (an
            // acquisition that met an older entry of its own, removed it and took the seat
            // again at another ticket), which a release of the old ticket must not empty.
            let result = self
                .vacate(
                    key,
                    &[(schema::OWNER, s(owner)), (schema::TICKET, n(ticket))],
                    None,
                    speaks,
                )
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .customize()
                .config_override(no_sdk_retry)
                .send()
                .await;
            return match result {
                Ok(_) => Ok(Owned::Yes),
                Err(e) => match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                        protocol_refused(key, c.item(), speaks)?;
                        Ok(Owned::No)
                    }
                    _ => Err(self.classify("UpdateItem", e)),
                },
            };
        }
        let result = self
            .client
            .delete_item()
            .table_name(&*self.table)
            .set_key(Some(row_key(key, ticket)))
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
}

/// The heartbeat's condition: the row is ours, and its lease is not later than the one we write.
pub(crate) const HEARTBEAT_CONDITION: &str = "#owner = :owner AND #until <= :until";

/// [`HEARTBEAT_CONDITION`], or under the test-only mutant the owner alone (the differential test
/// must see the difference).
fn heartbeat_condition() -> &'static str {
    #[cfg(test)]
    if crate::mutant::on(crate::mutant::Mutant::StoreHeartbeatOwnerOnly) {
        return "#owner = :owner AND #until = #until";
    }
    HEARTBEAT_CONDITION
}

impl Dynamo {
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
        if status.is_none() && !self.answered.load(Ordering::Relaxed) {
            if let Some(e) = crate::error::setup_error(&err) {
                return Failure::Fatal(e);
            }
        }
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
            "InternalServerError"
            | "ServiceUnavailable"
            | "TransactionInProgressException"
            // A single-item write to an item an ongoing transaction is writing (the seat lives
            // on the counter, which every enqueue transaction updates).
            | "TransactionConflictException" => {
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

pub(crate) fn fatal_build(
    operation: &'static str,
    e: aws_sdk_dynamodb::error::BuildError,
) -> Failure {
    Failure::Fatal(Error::Dynamo {
        operation,
        source: Box::new(e),
    })
}

impl Dynamo {
    /// The enqueue transaction (see [`EnqueueRequest`]). `ClientRequestToken` makes a retried
    /// transaction idempotent on the service side; [`Enqueue::AlreadyOurs`] makes it idempotent
    /// on ours too, for servers that ignore the token.
    pub(super) async fn enqueue(&self, r: &EnqueueRequest) -> Result<Enqueue, Failure> {
        if r.seat {
            return self.take_seat(r).await;
        }
        let (update, names, values, version) = counter_move(r);
        let counter = Update::builder()
            .table_name(&*self.table)
            .set_key(Some(counter_key(&r.key)))
            .update_expression(update)
            .condition_expression(counter_condition(r, version))
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| fatal_build("TransactWriteItems", e))?;
        let put = Put::builder()
            .table_name(&*self.table)
            .set_item(Some(r.row.clone()))
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
            .client_request_token(&r.token)
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
            let reasons: Vec<(&str, Option<&crate::storage::Item>)> =
                (0..2).map(|i| (code(i), item(i))).collect();
            if let Some(outcome) = enqueue_outcome(r, &reasons)? {
                return Ok(outcome);
            }
            let throttled = c.cancellation_reasons().iter().any(|r| {
                matches!(
                    r.code(),
                    Some("ThrottlingError" | "ProvisionedThroughputExceeded")
                )
            });
            if throttled {
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

    /// The seat's enqueue (see [`EnqueueRequest`]): one `UpdateItem` of the counter, conditioned
    /// on the counter as read and an empty seat. A retry of an attempt that landed finds the seat
    /// ours ([`Enqueue::AlreadyOurs`]); any other refusal reports the counter as it is.
    pub(super) async fn take_seat(&self, r: &EnqueueRequest) -> Result<Enqueue, Failure> {
        let (mut update, mut names, mut values, version) = counter_move(r);
        // The seat's attributes under their one placeholder each (`schema::seat_placeholder`),
        // which the condition uses too. A new row always carries `owner`.
        for (name, value) in schema::seat_attributes(&r.row) {
            let placeholder = schema::seat_placeholder(name);
            let value_placeholder = placeholder.replacen('#', ":", 1);
            update.push_str(&format!(", {placeholder} = {value_placeholder}"));
            names.insert(placeholder, name.to_owned());
            values.insert(value_placeholder, value.clone());
        }
        let condition = format!(
            "{} AND attribute_not_exists({})",
            counter_condition(r, version),
            schema::seat_placeholder(schema::OWNER)
        );
        let update = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(counter_key(&r.key)))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values));
        match self.update(update).await? {
            Updated::Applied => Ok(Enqueue::Done),
            Updated::Refused(old) => seat_refused(r, old.as_ref()),
        }
    }
}

/// The counter half of an enqueue: `SET last, lastOwner` (and `tickNewest` with an ordered
/// tick), its names and values.
fn counter_move(
    r: &EnqueueRequest,
) -> (
    String,
    HashMap<String, String>,
    HashMap<String, aws_sdk_dynamodb::types::AttributeValue>,
    &'static str,
) {
    let mut values = HashMap::from([
        (":next".to_owned(), n(r.ticket)),
        (
            ":owner".to_owned(),
            s(&schema::last_owner(&r.owner, r.ticket)),
        ),
        (":expected".to_owned(), n(r.counter.last)),
    ]);
    if let Some(o) = &r.counter.owner {
        values.insert(":by".into(), s(o));
    }
    let mut names = HashMap::from([
        ("#last".to_owned(), schema::LAST.to_owned()),
        ("#by".to_owned(), schema::LAST_OWNER.to_owned()),
    ]);
    let mut update = "SET #last = :next, #by = :owner".to_owned();
    if let Some(tick) = r.tick {
        names.insert("#td".into(), schema::TICK_DONE.into());
        values.insert(":tick".into(), n(tick));
    }
    if let Some(newest) = r.newest {
        names.insert("#tn".into(), schema::TICK_NEWEST.into());
        values.insert(":newest".into(), n(newest));
        update.push_str(", #tn = :newest");
    }
    #[allow(unused_mut)]
    let mut version = Speaks::Permits(r.permits).condition(&mut names, &mut values);
    #[cfg(test)]
    if version == crate::protocol::PERMITS_CONDITION
        && crate::mutant::on(crate::mutant::Mutant::StorePermitsIgnored)
    {
        version = "(#proto = :speaks AND (#permits = :permits OR attribute_exists(#permits)))";
    }
    (update, names, values, version)
}

/// The counter half's condition: exactly the counter as read, on a protocol we speak
/// ([`crate::protocol::CONDITION`]); with an ordered tick, a watermark
/// below it ([`ENQUEUE_TICK_CONDITION`]) and a `tickNewest` not above the one we set.
fn counter_condition(r: &EnqueueRequest, version: &'static str) -> String {
    let mut condition = match &r.counter.owner {
        Some(_) => "#last = :expected AND #by = :by",
        None => "#last = :expected AND attribute_not_exists(#by)",
    }
    .to_owned();
    condition.push_str(" AND ");
    condition.push_str(protocol_condition(r.seat && r.permits == 1, version));
    if r.tick.is_some() {
        condition.push_str(" AND ");
        condition.push_str(enqueue_tick_condition());
    }
    if r.newest.is_some() {
        condition.push_str(" AND (attribute_not_exists(#tn) OR #tn <= :newest)");
    }
    condition
}

/// [`crate::protocol::CONDITION`], or under the test-only mutant, for the seat's take, one that
/// passes whatever protocol the key runs (the version ignored by one request).
fn protocol_condition(seat: bool, version: &'static str) -> &'static str {
    #[cfg(test)]
    if seat && crate::mutant::on(crate::mutant::Mutant::StoreSeatIgnoresProtocol) {
        return "(attribute_not_exists(#proto) OR #proto <= :speaks OR #proto > :speaks)";
    }
    let _ = seat;
    version
}

/// An enqueue's tick condition: the tick is not done (the watermark is absent or below it).
pub(crate) const ENQUEUE_TICK_CONDITION: &str = "(attribute_not_exists(#td) OR #td < :tick)";

/// [`ENQUEUE_TICK_CONDITION`], or under the test-only mutant one that ignores the watermark (the
/// differential test must see the difference).
fn enqueue_tick_condition() -> &'static str {
    #[cfg(test)]
    if crate::mutant::on(crate::mutant::Mutant::StoreEnqueueIgnoresWatermark) {
        return "(attribute_not_exists(#td) OR #td = #td OR :tick = :tick)";
    }
    ENQUEUE_TICK_CONDITION
}

/// The watermark condition of a release that marks `:tick` done: it never moves backwards.
pub(crate) const MARK_CONDITION: &str = "(attribute_not_exists(#td) OR #td <= :tick)";

/// [`MARK_CONDITION`], or under the test-only mutant one that moves the watermark backwards too.
fn mark_condition() -> &'static str {
    #[cfg(test)]
    if crate::mutant::on(crate::mutant::Mutant::StoreMarkBackwards) {
        return "(attribute_not_exists(#td) OR #td = #td OR :tick = :tick)";
    }
    MARK_CONDITION
}

impl Dynamo {
    /// The seat's release with `release_done`: one `UpdateItem` of the counter that empties the
    /// seat *and* sets `tickDone`, if the seat is ours (owner and ticket) and the watermark is
    /// not newer. A seat still ours under a newer watermark is [`Owned::NotMarked`] (nothing
    /// written; the caller releases without the mark).
    pub(super) async fn release_seat_done(
        &self,
        key: &str,
        ticket: u64,
        owner: &str,
        tick: i64,
    ) -> Result<Owned, Failure> {
        let (mut names, remove) = schema::seat_placeholders();
        names.insert("#td".into(), schema::TICK_DONE.into());
        names.insert(crate::protocol::NAME.into(), schema::PROTOCOL_ATTR.into());
        let owner_p = schema::seat_placeholder(schema::OWNER);
        let ticket_p = schema::seat_placeholder(schema::TICKET);
        let values = HashMap::from([
            (":owner".to_owned(), s(owner)),
            (":ticket".to_owned(), n(ticket)),
            (":tick".to_owned(), n(tick)),
            (
                crate::protocol::VALUE.to_owned(),
                n(Speaks::Permits(1).protocol()),
            ),
        ]);
        // The caller retries (as for any release): no SDK retries underneath, so it knows when
        // an earlier attempt may have landed.
        let no_sdk_retry = aws_sdk_dynamodb::config::Builder::default()
            .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled());
        #[allow(unused_mut)]
        let mut ours = format!("{owner_p} = :owner AND {ticket_p} = :ticket");
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::StoreVacateAnyOwner) {
            ours = format!("attribute_exists({owner_p}) AND :owner = :owner AND :ticket = :ticket");
        }
        let result = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(counter_key(key)))
            .update_expression(format!("{remove} SET #td = :tick"))
            .condition_expression(format!(
                "{ours} AND {} AND {}",
                mark_condition(),
                crate::protocol::CONDITION
            ))
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .customize()
            .config_override(no_sdk_retry)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Owned::Yes),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    protocol_refused(key, c.item(), Speaks::Permits(1))?;
                    Ok(seat_release_refused(c.item(), owner, ticket))
                }
                _ => Err(self.classify("UpdateItem", e)),
            },
        }
    }

    /// Marks an ordered tick done on the counter (a queue row's release, before its delete):
    /// `SET tickDone`, if the counter exists and the watermark is not newer.
    pub(super) async fn mark_done(&self, key: &str, tick: i64) -> Result<bool, Failure> {
        let update = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(counter_key(key)))
            .update_expression("SET #td = :tick")
            .condition_expression(format!(
                "attribute_exists(#last) AND {} AND {}",
                mark_condition(),
                crate::protocol::CONDITION
            ))
            .expression_attribute_names("#td", schema::TICK_DONE)
            .expression_attribute_names("#last", schema::LAST)
            .expression_attribute_names(crate::protocol::NAME, schema::PROTOCOL_ATTR)
            .expression_attribute_values(":tick", n(tick))
            .expression_attribute_values(crate::protocol::VALUE, n(Speaks::Permits(1).protocol()));
        match self.update(update).await? {
            Updated::Applied => Ok(true),
            Updated::Refused(old) => {
                protocol_refused(key, old.as_ref(), Speaks::Permits(1))?;
                Ok(false)
            }
        }
    }

    /// Whether the record of a done tick id exists: a strongly consistent `Query` of its one sort
    /// key (a `Query`, which lock users may already make, rather than a `GetItem`).
    pub(super) async fn tick_recorded(&self, key: &str, id: &str) -> Result<bool, Failure> {
        let out = self
            .client
            .query()
            .table_name(&*self.table)
            .key_condition_expression("#pk = :pk AND #sk = :sk")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#sk", SK)
            .expression_attribute_values(":pk", s(key))
            .expression_attribute_values(":sk", s(&schema::tick_sk(id)))
            .projection_expression("#sk")
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.classify("Query", e))?;
        Ok(out.items.is_some_and(|items| !items.is_empty()))
    }

    /// Puts the record of a done tick id if it does not exist, expiring at `expires_at`.
    pub(super) async fn record_tick(
        &self,
        key: &str,
        id: &str,
        expires_at: i64,
    ) -> Result<bool, Failure> {
        self.put_new(schema::tick_record(key, id, expires_at)).await
    }
}
