//! `flightlock-cleanup`: the sweeper Lambda function. The steps, in order: logging, config,
//! client, run the invocation loop.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::BehaviorVersion;
use flightlock::sweep::Sweeper;
use flightlock::SweepSummary;
use flightlock_cleanup::{budget, invoke, metrics, Config};
use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;

/// Connect, attempt and whole-operation timeouts of the sweeper's requests: the whole-operation
/// bound (retries included) stays under the default 5 s margin.
const REQUEST_BOUNDS: (Duration, Duration, Duration) = (
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(3),
);

#[tokio::main]
async fn main() -> Result<(), Error> {
    // JSON logs when the function's log format is JSON (AWS_LAMBDA_LOG_FORMAT), level from
    // AWS_LAMBDA_LOG_LEVEL.
    lambda_runtime::tracing::init_default_subscriber();
    let env: HashMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let config = Config::from_map(&env).inspect_err(|e| {
        tracing::error!(error = %e, "invalid configuration");
    })?;
    let aws = aws_config::load_defaults(BehaviorVersion::latest()).await;
    // The sweep stops starting work at the deadline minus the margin; these bounds make every
    // request already in flight end within the margin too (a hung connection, a blackholed
    // endpoint), so the summary is always returned before the platform's timeout.
    let timeouts = aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
        .connect_timeout(REQUEST_BOUNDS.0)
        .operation_attempt_timeout(REQUEST_BOUNDS.1)
        .operation_timeout(REQUEST_BOUNDS.2)
        .build();
    let dynamodb = aws_sdk_dynamodb::config::Builder::from(&aws)
        .timeout_config(timeouts)
        .build();
    let sweeper = Sweeper::new(aws_sdk_dynamodb::Client::from_conf(dynamodb), &config.table);
    let (sweeper, config) = (&sweeper, &config);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        handle(sweeper, config, event).await
    }))
    .await
}

async fn handle(
    sweeper: &Sweeper,
    config: &Config,
    event: LambdaEvent<Value>,
) -> Result<SweepSummary, Error> {
    let budget = budget(event.context.deadline(), SystemTime::now(), config.margin);
    let summary = invoke(sweeper, config, &event.payload, budget).await?;
    if config.metrics {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        // EMF goes to stdout as one JSON line; the log agent turns it into metrics.
        println!("{}", metrics::emf(&config.table, &summary, now_ms));
    }
    Ok(summary)
}
