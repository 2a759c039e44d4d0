//! The DynamoDB requests of once per tick (see [`crate::tick`]): the seat's release that marks
//! its tick, the mark of a queue row's release, and the record of a done tick id.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;

use super::{Dynamo, Updated};
use crate::schema::{self, n, s, PK, SK};
use crate::storage::answers::{protocol_refused, seat_release_refused};
use crate::storage::Speaks;
use crate::storage::{counter_key, Failure, Owned};

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
