//! How the model answers reads: a partition's `Query` page by page (all of it, the rows below a
//! ticket, the lowest row) and the sweep's `Scan`.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{num, pk_sk, segment_of, string, Mutation, Table};
use crate::schema::{self, COUNTER_SK, PK, SK};
use crate::storage::{Item, Response, ScanRequest};

impl Table {
    /// A look's page as the waiter sees it: as stored, but under [`Mutation::SlowTakeover`] with
    /// every lease thirty leases longer.
    pub(super) fn as_shown(&self, page: Response) -> Response {
        let (Some(Mutation::SlowTakeover), Response::Page { items, next }) = (self.mutation, &page)
        else {
            return page;
        };
        let items = items
            .iter()
            .cloned()
            .map(|mut item| {
                let until = num(&item, schema::LEASE_UNTIL_MS);
                let lease = num(&item, schema::LEASE_MS);
                if let (Some(until), Some(lease)) = (until, lease) {
                    item.insert(schema::LEASE_UNTIL_MS.into(), schema::n(until + 30 * lease));
                    item.insert(schema::LEASE_MS.into(), schema::n(31 * lease));
                }
                item
            })
            .collect();
        Response::Page {
            items,
            next: next.clone(),
        }
    }

    pub(super) fn query(&self, key: &str, start: Option<&Item>) -> Response {
        let after = start.and_then(|s| string(s, SK)).map(str::to_owned);
        let mut rest = self
            .items
            .range((key.to_owned(), after.clone().unwrap_or_default())..)
            .take_while(|((pk, _), _)| pk == key)
            .filter(|((_, sk), _)| after.as_ref().is_none_or(|a| sk > a))
            // `sk BETWEEN "counter" AND` the highest row's: never a done tick's record.
            .filter(|((_, sk), _)| sk.as_str() >= COUNTER_SK && *sk <= schema::queue_sk(u64::MAX))
            .map(|(_, s)| s.item.clone());
        let items: Vec<Item> = rest.by_ref().take(self.page_size).collect();
        let next = match (rest.next(), items.last()) {
            (Some(_), Some(last)) => pk_sk(last).map(|(pk, sk)| {
                HashMap::from([
                    (PK.to_owned(), AttributeValue::S(pk)),
                    (SK.to_owned(), AttributeValue::S(sk)),
                ])
            }),
            _ => None,
        };
        Response::Page { items, next }
    }

    /// Rows at or below `ticket`, highest first, then the counter, `limit` items a page.
    pub(super) fn query_below(
        &self,
        key: &str,
        start: Option<&Item>,
        ticket: u64,
        limit: u32,
    ) -> Response {
        let hi = schema::queue_sk(ticket);
        let lo = COUNTER_SK.to_owned();
        let before = start.and_then(|s| string(s, SK)).map(str::to_owned);
        let items: Vec<Item> = self
            .items
            .range((key.to_owned(), lo)..=(key.to_owned(), hi))
            .rev()
            .filter(|((_, sk), _)| before.as_ref().is_none_or(|b| sk < b))
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|(_, s)| s.item.clone())
            .collect();
        // Descending, DynamoDB Local names a next page when the page is full and the partition
        // holds more items below, in the key condition's range or not (the counter sorts below
        // every row, so a look that reaches it is the last page).
        let full = items.len() >= usize::try_from(limit).unwrap_or(usize::MAX);
        let more = items.last().and_then(pk_sk).is_some_and(|(_, last)| {
            self.items
                .range((key.to_owned(), String::new())..(key.to_owned(), last))
                .next()
                .is_some()
        });
        let next = match (full && more, items.last()) {
            (true, Some(last)) => pk_sk(last).map(|(pk, sk)| {
                HashMap::from([
                    (PK.to_owned(), AttributeValue::S(pk)),
                    (SK.to_owned(), AttributeValue::S(sk)),
                ])
            }),
            _ => None,
        };
        Response::Page { items, next }
    }

    /// The counter and the lowest queue row, as an ascending `Limit 2` page: a full page names
    /// its last item as where the next page would start, whatever follows (as DynamoDB Local
    /// does ascending).
    pub(super) fn query_lowest(&self, key: &str) -> Response {
        let lo = COUNTER_SK.to_owned();
        let hi = schema::queue_sk(u64::MAX);
        let items: Vec<Item> = self
            .items
            .range((key.to_owned(), lo)..=(key.to_owned(), hi))
            .take(2)
            .map(|(_, s)| s.item.clone())
            .collect();
        let next = items.get(1).and_then(pk_sk).map(|(pk, sk)| {
            HashMap::from([
                (PK.to_owned(), AttributeValue::S(pk)),
                (SK.to_owned(), AttributeValue::S(sk)),
            ])
        });
        Response::Page { items, next }
    }

    /// One page of the sweep's `Scan` (`ScanRequest`): items in key order within the segment,
    /// `limit` read per page, the filter applied after the read (`ScannedCount` counts every
    /// item read), the projection applied to what passes. Eventual consistency is not modelled:
    /// a page reads the table as it stands, which a real scan may lag behind; the removal's
    /// condition, not the read, is what keeps a live entry safe.
    pub(super) fn scan(&self, r: &ScanRequest) -> Response {
        let start = r.start.as_ref().and_then(pk_sk);
        let limit = r
            .limit
            .map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX))
            .max(1);
        let names = crate::storage::scan_names();
        let mut page = self
            .items
            .iter()
            .filter(|((pk, _), _)| segment_of(pk, r.total_segments) == r.segment)
            .filter(|(k, _)| start.as_ref().is_none_or(|s| *k > s))
            .peekable();
        let (mut items, mut scanned, mut next) = (Vec::new(), 0u64, None);
        while let Some(((pk, sk), stored)) = page.next() {
            scanned += 1;
            let entry = sk.starts_with(schema::QUEUE_PREFIX) || sk == COUNTER_SK;
            let dead = num(&stored.item, schema::LEASE_UNTIL_MS).is_some_and(|u| u < r.cutoff_ms);
            if entry && dead {
                let projected: Item = stored
                    .item
                    .iter()
                    .filter(|(name, _)| names.values().any(|v| v == *name))
                    .map(|(n, v)| (n.clone(), v.clone()))
                    .collect();
                items.push(projected);
            }
            if scanned as usize == limit && page.peek().is_some() {
                next = Some(HashMap::from([
                    (PK.to_owned(), AttributeValue::S(pk.clone())),
                    (SK.to_owned(), AttributeValue::S(sk.clone())),
                ]));
                break;
            }
        }
        Response::Scanned {
            items,
            scanned,
            next,
        }
    }
}
