//! Removing a dead entry: one conditional request, shared by a waiter passing over a dead row or
//! seat and by the sweeper (the sweep's condition adds the owner and the cutoff), and the seat's
//! `UpdateItem` that a release uses too. A file of its own so that what each function may call is
//! readable by file: the template's least-privilege test grants the cleanup function exactly the
//! actions of `sweep/`, `dynamo/scan.rs` and this file.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;

use super::Dynamo;
use crate::schema::{self, n, s};
use crate::storage::answers::{protocol_refused, row_judged, seat_judged};
use crate::storage::{counter_key, row_key, Failure, Speaks, StaleDelete};

/// The sweep's delete condition: still the dead row that was read, written under a protocol this
/// build speaks (from protocol 2 on, every row carries the `protocol` it was written under).
pub const DELETE_CONDITION: &str = "#owner = :owner AND #rvn = :rvn AND #until < :cutoff \
     AND (attribute_not_exists(#proto) OR #proto <= :speaks)";

impl Dynamo {
    /// Removes an entry judged dead, only if it still carries the `rvn` that was judged: a
    /// waiter's removal of a stale entry, or (with `sweep`: the owner read and the cutoff) the
    /// sweep's, which also requires the same owner and a lease that ended before the cutoff
    /// ([`DELETE_CONDITION`]).
    pub(super) async fn remove_dead(
        &self,
        key: &str,
        ticket: u64,
        seat: bool,
        rvn: &str,
        sweep: Option<(&str, i64)>,
        speaks: Speaks,
    ) -> Result<StaleDelete, Failure> {
        let operation = if seat { "UpdateItem" } else { "DeleteItem" };
        let result = if seat {
            let mut equal = vec![(schema::RVN, s(rvn))];
            if let Some((owner, _)) = sweep {
                equal.push((schema::OWNER, s(owner)));
            }
            self.vacate(key, &equal, sweep.map(|(_, cutoff)| cutoff), speaks)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await
                .map(drop)
                .map_err(|e| match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                        protocol_refused(key, c.item(), speaks)
                            .map(|()| seat_judged(c.item(), ticket))
                    }
                    _ => Err(self.classify(operation, e)),
                })
        } else {
            let mut delete = self
                .client
                .delete_item()
                .table_name(&*self.table)
                .set_key(Some(row_key(key, ticket)))
                .expression_attribute_names("#rvn", schema::RVN)
                .expression_attribute_values(":rvn", s(rvn))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                );
            delete = match sweep {
                None => delete.condition_expression(stale_condition()),
                Some((owner, cutoff)) => delete
                    .condition_expression(sweep_condition())
                    .expression_attribute_names("#owner", schema::OWNER)
                    .expression_attribute_names("#until", schema::LEASE_UNTIL_MS)
                    .expression_attribute_names(crate::protocol::NAME, schema::PROTOCOL_ATTR)
                    .expression_attribute_values(":owner", s(owner))
                    .expression_attribute_values(":cutoff", n(cutoff))
                    .expression_attribute_values(crate::protocol::VALUE, n(Speaks::Any.protocol())),
            };
            delete
                .send()
                .await
                .map(drop)
                .map_err(|e| match e.as_service_error() {
                    // Still there (heartbeated, or another owner's), or gone. A retried removal
                    // whose first attempt landed but whose answer was lost is gone either way.
                    Some(DeleteItemError::ConditionalCheckFailedException(c)) => {
                        if sweep.is_some() {
                            // A row written under a newer protocol: not ours to judge.
                            protocol_refused(key, c.item(), Speaks::Any)?;
                        }
                        Ok(row_judged(c.item()))
                    }
                    _ => Err(self.classify(operation, e)),
                })
        };
        match result {
            Ok(()) => Ok(StaleDelete::Deleted),
            Err(judged) => judged,
        }
    }

    /// An `UpdateItem` of `key`'s counter that empties its seat (removes
    /// [`schema::SEAT_ATTRIBUTES`]) if each seat attribute of `equal` has its value.
    pub(super) fn vacate(
        &self,
        key: &str,
        equal: &[(&str, aws_sdk_dynamodb::types::AttributeValue)],
        lease_before: Option<i64>,
        speaks: Speaks,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        let (names, remove) = schema::seat_placeholders();
        // One placeholder per attribute: the condition uses the one the removal does.
        let mut terms = Vec::new();
        let mut values = HashMap::new();
        for (i, (attribute, value)) in equal.iter().enumerate() {
            terms.push(format!("{} = :v{i}", schema::seat_placeholder(attribute)));
            values.insert(format!(":v{i}"), value.clone());
        }
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::StoreVacateAnyOwner)
            && equal.iter().any(|(a, _)| *a == schema::OWNER)
            && lease_before.is_none()
        {
            terms = vec![format!(
                "attribute_exists({})",
                schema::seat_placeholder(schema::OWNER)
            )];
            values.clear();
        }
        if let Some(cutoff) = lease_before {
            terms.push(format!(
                "{} < :cutoff",
                schema::seat_placeholder(schema::LEASE_UNTIL_MS)
            ));
            values.insert(":cutoff".to_owned(), n(cutoff));
        }
        // The seat lives on the counter: only on a protocol we speak.
        let mut names = names;
        terms.push(speaks.condition(&mut names, &mut values).to_owned());
        let mut update = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(counter_key(key)))
            .update_expression(remove)
            .condition_expression(terms.join(" AND "))
            .set_expression_attribute_names(Some(names));
        if !values.is_empty() {
            update = update.set_expression_attribute_values(Some(values));
        }
        update
    }
}

/// A stale row's delete: still the version that was judged. (Under the test-only mutant: any
/// version, so the differential test must see the difference.)
fn stale_condition() -> &'static str {
    #[cfg(test)]
    if crate::mutant::on(crate::mutant::Mutant::StoreStaleDeleteUnconditional) {
        return "#rvn = :rvn OR attribute_exists(#rvn)";
    }
    "#rvn = :rvn"
}

/// The sweep's delete condition, [`DELETE_CONDITION`]. (Under the test-only mutant: without its
/// `rvn` term, so the differential test must see the difference.)
fn sweep_condition() -> &'static str {
    #[cfg(test)]
    if crate::mutant::on(crate::mutant::Mutant::StoreSweepWithoutRvn) {
        return "#owner = :owner AND (#rvn = :rvn OR attribute_exists(#rvn)) AND #until < :cutoff \
             AND (attribute_not_exists(#proto) OR #proto <= :speaks)";
    }
    DELETE_CONDITION
}
