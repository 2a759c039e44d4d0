//! The schema's unit tests: sort keys, encoding, decoding errors by field.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{
    n, queue_sk, s, seat_placeholder, seat_placeholders, ttl_seconds, validate_key, HolderInfo,
    NewRow, QueueRow, Snapshot, ACQUIRED_AT_MS, COUNTER_SK, EXPIRES_AT, HOST, LAST, LEASE_UNTIL_MS,
    PK, SEAT_ATTRIBUTES, SK,
};
use crate::error::Error;

fn row(ticket: u64) -> HashMap<String, AttributeValue> {
    NewRow {
        protocol: 1,
        key: "k",
        ticket,
        owner: "o1",
        lease_until_ms: 1_700_000_010_500,
        lease_ms: 10_000,
        expires_at: ttl_seconds(1_700_000_010_500 + 3_600_000),
        clock_free: false,
        rvn: "r1",
        now_ms: 1_700_000_000_500,
        granted: false,
        holder: &HolderInfo {
            function: Some("f".into()),
            request_id: None,
            host: Some(String::new()),
        },
    }
    .to_item()
}

#[test]
fn sort_keys_sort_by_ticket_and_after_counter() {
    assert_eq!(queue_sk(42), "q#00000000000000000042");
    assert!(queue_sk(9) < queue_sk(10));
    assert!(queue_sk(u64::MAX) > queue_sk(u64::MAX - 1));
    assert!(COUNTER_SK < queue_sk(0).as_str());
}

#[test]
fn seat_attributes_have_one_placeholder_each() {
    let (names, remove) = seat_placeholders();
    assert_eq!(names.len(), SEAT_ATTRIBUTES.len());
    let attributes: std::collections::BTreeSet<&String> = names.values().collect();
    assert_eq!(attributes.len(), SEAT_ATTRIBUTES.len(), "{names:?}");
    for a in SEAT_ATTRIBUTES {
        let p = seat_placeholder(a);
        assert_eq!(names.get(&p).map(String::as_str), Some(a));
        assert!(remove.contains(&p), "{remove}");
    }
    assert!(
        !SEAT_ATTRIBUTES.contains(&EXPIRES_AT),
        "TTL must never remove a counter"
    );
}

#[test]
fn keys_are_validated_not_truncated() {
    assert!(validate_key("a").is_ok());
    assert!(validate_key(&"é".repeat(512)).is_ok()); // 1024 bytes
    assert!(matches!(validate_key(""), Err(Error::InvalidKey { .. })));
    let err = validate_key(&"é".repeat(513)).unwrap_err().to_string();
    assert!(err.contains("1026 bytes"), "{err}");
}

#[test]
fn ttl_is_whole_seconds_rounded_up() {
    assert_eq!(ttl_seconds(1_000), 1);
    assert_eq!(ttl_seconds(1_001), 2);
    assert_eq!(ttl_seconds(0), 0);
}

#[test]
fn row_round_trips_and_skips_empty_details() {
    let item = row(7);
    assert!(!item.contains_key(HOST));
    assert!(!item.contains_key(ACQUIRED_AT_MS));
    assert_eq!(item[EXPIRES_AT], n(1_700_003_611_i64));
    let decoded = QueueRow::from_item("k", &item).unwrap();
    assert_eq!(decoded.ticket, 7);
    assert_eq!(decoded.owner, "o1");
    assert_eq!(decoded.lease_ms, 10_000);
    assert_eq!(decoded.holder.function.as_deref(), Some("f"));
}

#[test]
fn millisecond_ttl_is_rejected_by_name() {
    let mut item = row(1);
    item.insert(EXPIRES_AT.into(), n(1_700_003_610_500_i64));
    let err = QueueRow::from_item("k", &item).unwrap_err().to_string();
    assert!(
        err.contains("expiresAt") && err.contains("milliseconds"),
        "{err}"
    );
}

#[test]
fn wrong_types_name_the_field() {
    let mut item = row(1);
    item.insert(LEASE_UNTIL_MS.into(), s("soon"));
    let err = QueueRow::from_item("k", &item).unwrap_err().to_string();
    assert!(err.contains("leaseUntilMs"), "{err}");
    let mut item = row(1);
    item.insert(SK.into(), s(&queue_sk(2)));
    assert!(QueueRow::from_item("k", &item).is_err());
}

#[test]
fn snapshot_orders_rows_and_reads_counter() {
    let mut counter = HashMap::new();
    counter.insert(PK.into(), s("k"));
    counter.insert(SK.into(), s(COUNTER_SK));
    counter.insert(LAST.into(), n(12));
    let items = [row(12), counter, row(3)];
    let snap = Snapshot::from_items("k", &items).unwrap();
    assert_eq!(snap.counter.map(|c| c.last), Some(12));
    assert_eq!(
        snap.rows.iter().map(|r| r.ticket).collect::<Vec<_>>(),
        [3, 12]
    );
}
