//! The DynamoDB implementation of the storage seam: one API call per [`Request`].
//!
//! Each request is exactly one call (the SDK may retry it underneath: same request, same
//! idempotency token) and comes back either as a protocol outcome — a conditional write that lost
//! is an enum variant, not an error — or a [`Failure`] that says whether trying again can help.
//! Retrying, budgets and decisions live in `locker/` and `heartbeat.rs`; the sweep's Scan and the
//! removal of a dead entry are in `dynamo/scan.rs` and `dynamo/removal.rs`.
//!
//! Every read that decides ownership is a strongly consistent `Query` on the base table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;
use futures::future::BoxFuture;

use super::answers::{permits_refused, protocol_refused, renewal_refused};
use super::Speaks;
use super::{
    counter_key, entry_key, row_key, Beat, Failure, Item, Owned, PermitsSet, Range, Renewal,
    Request, Response, Storage,
};
use crate::protocol::{self, PERMITS_NAME, PERMITS_VALUE};
use crate::schema::{self, n, s, PK};

mod enqueue;
mod errors;
mod removal;
mod scan;
mod ticks;

pub(crate) use errors::fatal_build;

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

impl Storage for Dynamo {
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
