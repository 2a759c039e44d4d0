//! Creating and checking the lock table.

use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};
use aws_sdk_dynamodb::Client;

use crate::error::Error;
use crate::schema::{EXPIRES_AT, PK, SK};
use crate::storage::Dynamo;

/// What [`create_table`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The table was created (and TTL enabled).
    New,
    /// A table with the right keys already existed.
    Existing {
        /// TTL was off and `create_table` turned it on (on `expiresAt`).
        ttl_turned_on: bool,
    },
}

/// Creates the lock table (on-demand, `pk`/`sk`, TTL on `expiresAt`) and waits until it is
/// active. An existing table is checked: a correct one is fine, a wrong one is an error that
/// says what is wrong.
pub async fn create_table(client: &Client, table: &str) -> Result<Created, Error> {
    let store = Dynamo::new(client.clone(), table);
    let attr = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
    };
    let key = |name: &str, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
    };
    let request = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr(PK).map_err(build_err)?)
        .attribute_definitions(attr(SK).map_err(build_err)?)
        .key_schema(key(PK, KeyType::Hash).map_err(build_err)?)
        .key_schema(key(SK, KeyType::Range).map_err(build_err)?);
    let created = match request.send().await {
        Ok(_) => None,
        Err(e) if e.code() == Some("ResourceInUseException") => Some(()),
        Err(e) => return Err(store.classify("CreateTable", e).into_error()),
    };
    wait_active(&store).await?;
    check_keys(&store).await?;
    let ttl_turned_on = ensure_ttl(&store).await?;
    Ok(match created {
        None => Created::New,
        Some(()) => Created::Existing { ttl_turned_on },
    })
}

/// Checks that `table` exists, has the flightlock key schema and TTL on `expiresAt`.
pub async fn verify_table(client: &Client, table: &str) -> Result<(), Error> {
    let store = Dynamo::new(client.clone(), table);
    check_keys(&store).await?;
    let ttl = describe_ttl(&store).await?;
    match ttl {
        (Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling), Some(a))
            if a == EXPIRES_AT =>
        {
            Ok(())
        }
        (status, attr) => Err(Error::WrongTtl {
            table: table.to_owned(),
            found: describe_ttl_state(status, attr),
        }),
    }
}

fn describe_ttl_state(status: Option<TimeToLiveStatus>, attr: Option<String>) -> String {
    match (status, attr) {
        (Some(s), Some(a)) => format!("TTL is {} on attribute `{a}`", s.as_str()),
        (Some(s), None) => format!("TTL is {}", s.as_str()),
        _ => "TTL is not enabled".into(),
    }
}

fn build_err(e: aws_sdk_dynamodb::error::BuildError) -> Error {
    Error::Dynamo {
        operation: "CreateTable",
        source: Box::new(e),
    }
}

async fn wait_active(store: &Dynamo) -> Result<(), Error> {
    for _ in 0..600 {
        let out = store
            .client()
            .describe_table()
            .table_name(store.table())
            .send()
            .await
            .map_err(|e| store.classify("DescribeTable", e).into_error())?;
        if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(Error::Dynamo {
        operation: "DescribeTable",
        source: format!(
            "table `{}` did not become ACTIVE within 2 minutes",
            store.table()
        )
        .into(),
    })
}

async fn check_keys(store: &Dynamo) -> Result<(), Error> {
    let out = store
        .client()
        .describe_table()
        .table_name(store.table())
        .send()
        .await
        .map_err(|e| store.classify("DescribeTable", e).into_error())?;
    let desc = out.table();
    let keys: Vec<(String, String)> = desc
        .map(|t| t.key_schema())
        .unwrap_or_default()
        .iter()
        .map(|k| {
            (
                k.attribute_name().to_owned(),
                k.key_type().as_str().to_owned(),
            )
        })
        .collect();
    let types: Vec<(String, String)> = desc
        .map(|t| t.attribute_definitions())
        .unwrap_or_default()
        .iter()
        .map(|a| {
            (
                a.attribute_name().to_owned(),
                a.attribute_type().as_str().to_owned(),
            )
        })
        .collect();
    let type_of = |name: &str| {
        types
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    };
    let ok =
        keys == [
            (PK.to_owned(), "HASH".to_owned()),
            (SK.to_owned(), "RANGE".to_owned()),
        ] && type_of(PK) == Some("S")
            && type_of(SK) == Some("S");
    if ok {
        return Ok(());
    }
    let found = keys
        .iter()
        .map(|(n, k)| format!("`{n}` ({}, {k})", type_of(n).unwrap_or("?")))
        .collect::<Vec<_>>()
        .join(", ");
    Err(Error::WrongKeySchema {
        table: store.table().to_owned(),
        found,
    })
}

async fn describe_ttl(store: &Dynamo) -> Result<(Option<TimeToLiveStatus>, Option<String>), Error> {
    let out = store
        .client()
        .describe_time_to_live()
        .table_name(store.table())
        .send()
        .await
        .map_err(|e| store.classify("DescribeTimeToLive", e).into_error())?;
    let d = out.time_to_live_description();
    Ok((
        d.and_then(|d| d.time_to_live_status()).cloned(),
        d.and_then(|d| d.attribute_name()).map(str::to_owned),
    ))
}

/// Turns TTL on `expiresAt` on if it is off; true if it did.
async fn ensure_ttl(store: &Dynamo) -> Result<bool, Error> {
    match describe_ttl(store).await? {
        (Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling), Some(a))
            if a == EXPIRES_AT =>
        {
            Ok(false)
        }
        (Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling), attr) => {
            Err(Error::WrongTtl {
                table: store.table().to_owned(),
                found: describe_ttl_state(Some(TimeToLiveStatus::Enabled), attr),
            })
        }
        _ => {
            let spec = TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name(EXPIRES_AT)
                .build()
                .map_err(build_err)?;
            store
                .client()
                .update_time_to_live()
                .table_name(store.table())
                .time_to_live_specification(spec)
                .send()
                .await
                .map_err(|e| store.classify("UpdateTimeToLive", e).into_error())?;
            Ok(true)
        }
    }
}
