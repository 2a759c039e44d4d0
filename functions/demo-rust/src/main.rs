//! `demo-rust`: an example single-flight job, and the Rust function of the end-to-end tests.
//!
//! Two ways to gate it (see `docs/src/getting-started/rust.md`):
//! - behind the flightlock layer's proxy (`AWS_LAMBDA_EXEC_WRAPPER` on a managed runtime, or a
//!   `bootstrap` that execs `/opt/flightlock-wrapper ./demo-rust` on `provided.al2023`);
//! - in-process with `DEMO_IN_PROCESS_LOCK=1`: the handler is wrapped in
//!   [`flightlock_lambda::FlightlockLayer`], configured by the same `FLIGHTLOCK_*` variables.
//!
//! The event selects a behaviour, like the Python demo: `{"sleepMs": 500}`, `{"mode": "error"}`,
//! `{"mode": "crash"}`, `{"mode": "timeout"}`, `{"mode": "big", "size": N}`; `{"mode": "context"}`
//! answers the fencing token the lock handed over (`flightlock_lambda::ticket`) and the client
//! context. With
//! `DEMO_RECORD_FILE` set, one JSON line per handler start and end is appended to that file.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flightlock_lambda::FlightlockLayer;
use lambda_runtime::tower::ServiceBuilder;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::{json, Value};

const PATTERN: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

fn record(what: &str, request_id: &str, event: &Value) {
    let Ok(path) = std::env::var("DEMO_RECORD_FILE") else {
        return;
    };
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let line = json!({
        "what": what,
        "requestId": request_id,
        "seq": event.get("seq"),
        "env": std::env::var("DEMO_ENV_NAME").unwrap_or_default(),
        "ns": ns as u64,
    });
    // One short O_APPEND write per line: concurrent writers never interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        tracing::warn!(error = %e, path, "could not record");
    }
}

async fn job(event: LambdaEvent<Value>) -> Result<Value, Error> {
    let (payload, ctx) = event.into_parts();
    record("start", &ctx.request_id, &payload);
    let sleep_ms = payload.get("sleepMs").and_then(Value::as_u64).unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
    match payload.get("mode").and_then(Value::as_str).unwrap_or("ok") {
        "crash" => std::process::exit(3),
        "timeout" => tokio::time::sleep(Duration::from_secs(3600)).await,
        "error" => {
            record("end", &ctx.request_id, &payload);
            return Err("demo failure requested by the event".into());
        }
        "context" => {
            // The handler's fencing token: behind the extension or the in-process layer alike.
            let ticket = flightlock_lambda::ticket(&ctx);
            record("end", &ctx.request_id, &payload);
            return Ok(json!({
                "ticket": ticket.map(|t| t.to_string()),
                "requestId": ctx.request_id,
                "clientContext": ctx.client_context,
            }));
        }
        "big" => {
            let size = payload.get("size").and_then(Value::as_u64).unwrap_or(0) as usize;
            let body: String = PATTERN
                .iter()
                .cycle()
                .take(size)
                .map(|&b| char::from(b))
                .collect();
            record("end", &ctx.request_id, &payload);
            return Ok(Value::String(body));
        }
        _ => {}
    }
    record("end", &ctx.request_id, &payload);
    Ok(json!({"ok": true, "requestId": ctx.request_id, "seq": payload.get("seq")}))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let env: HashMap<String, String> = std::env::vars().collect();
    if env.get("DEMO_IN_PROCESS_LOCK").is_some_and(|v| v == "1") {
        let layer = FlightlockLayer::from_env(&env).await?;
        let service = ServiceBuilder::new().layer(layer).service(service_fn(job));
        lambda_runtime::run(service).await
    } else {
        lambda_runtime::run(service_fn(job)).await
    }
}
