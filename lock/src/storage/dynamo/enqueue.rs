//! The enqueue: the two-item transaction (counter moved, row put) and the seat's `UpdateItem`,
//! with the counter's conditions (the counter as read; with an ordered tick, the watermark and
//! `tickNewest`).

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

use super::{fatal_build, Dynamo, Updated};
use crate::schema::{self, n, s, PK};
use crate::storage::answers::{enqueue_outcome, seat_refused};
use crate::storage::{counter_key, Enqueue, EnqueueRequest, Failure, Speaks};

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
