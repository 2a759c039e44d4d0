//! Unenforced detection on Lambda Managed Instances, through the Telemetry API.
//!
//! There are no INVOKE events on Managed Instances, but the Telemetry API is supported there
//! (schema `2025-01-29` only: the subscription schema of AWS's Managed Instances emulator,
//! aws/aws-lambda-runtime-interface-emulator `internal/lambda-managed-instances/aws-lambda-rie/
//! internal/telemetry/schema/telemetry-subscription-schema.json`) and sends a `platform.start`
//! record with the `requestId` of every invocation (Lambda Telemetry API event schema
//! reference). An invocation whose `platform.start` arrives and whose event the proxy has not
//! fetched within the grace did not go through the proxy: it runs unlocked, which is logged as
//! `UNENFORCED:` and counted, as INVOKE events do in the standard mode.
//!
//! The listener binds the address `sandbox.localdomain` resolves to when it does (inside Lambda,
//! where the Telemetry API delivers to that host name), else 127.0.0.1 (emulators, tests).

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::extensions_api::ExtensionsApi;
use crate::lifecycle;
use crate::proxy::Proxy;

/// The schema version Managed Instances accepts.
pub const SCHEMA_VERSION: &str = "2025-01-29";
/// The host name the Telemetry API delivers to inside Lambda.
pub const SANDBOX_HOST: &str = "sandbox.localdomain";
/// Largest batch body read (the subscription asks for at most 256 KiB).
const MAX_BATCH: usize = 1 << 20;

/// The subscription body (pure): platform events only, delivered quickly (the smallest
/// documented buffering: 1000 items, 256 KiB, 25 ms) to `uri`.
pub fn subscription(uri: &str) -> serde_json::Value {
    serde_json::json!({
        "schemaVersion": SCHEMA_VERSION,
        "types": ["platform"],
        "buffering": {"maxItems": 1000, "maxBytes": 262144, "timeoutMs": 25},
        "destination": {"protocol": "HTTP", "URI": uri},
    })
}

/// The request ids of the `platform.start` records in one delivered batch (a JSON array of
/// events). Pure; anything else in the batch is ignored.
pub fn started_request_ids(batch: &[u8]) -> Vec<String> {
    let Ok(serde_json::Value::Array(events)) = serde_json::from_slice(batch) else {
        return Vec::new();
    };
    events
        .iter()
        .filter(|e| e.get("type").and_then(|t| t.as_str()) == Some("platform.start"))
        .filter_map(|e| e.pointer("/record/requestId")?.as_str().map(str::to_owned))
        .collect()
}

/// Where to listen and the URI to give the Telemetry API.
async fn destination() -> (SocketAddr, String) {
    let resolved = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::lookup_host((SANDBOX_HOST, 0)),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .and_then(|mut addrs| addrs.find(SocketAddr::is_ipv4));
    match resolved {
        Some(a) => (a, SANDBOX_HOST.to_owned()),
        None => (
            SocketAddr::from((IpAddr::V4(Ipv4Addr::LOCALHOST), 0)),
            Ipv4Addr::LOCALHOST.to_string(),
        ),
    }
}

/// Starts the listener and subscribes. `Err` says why unenforced invocations cannot be detected
/// here (the caller logs it; the lock itself is enforced either way).
pub async fn start(api: &ExtensionsApi, id: &str, proxy: Arc<Proxy>) -> Result<(), String> {
    let (addr, host) = destination().await;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen for telemetry on {addr}: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("telemetry listener: {e}"))?
        .port();
    tokio::spawn(serve(listener, proxy));
    let uri = format!("http://{host}:{port}/");
    api.subscribe_telemetry(id, &subscription(&uri))
        .await
        .map_err(|e| e.to_string())
}

async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| batch(proxy.clone(), req));
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "telemetry connection ended with an error");
            }
        });
    }
}

async fn batch(
    proxy: Arc<Proxy>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = http_body_util::Limited::new(req.into_body(), MAX_BATCH)
        .collect()
        .await
        .map(|b| b.to_bytes());
    let status = match body {
        Ok(body) => {
            for id in started_request_ids(&body) {
                tokio::spawn(lifecycle::check_enforced(proxy.clone(), id));
            }
            StatusCode::OK
        }
        Err(e) => {
            tracing::warn!(error = %e, "unreadable telemetry batch");
            StatusCode::BAD_REQUEST
        }
    };
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = status;
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_start_records_give_the_request_ids() {
        let batch = br#"[
            {"time":"2025-11-24T06:00:00.000Z","type":"platform.initStart","record":{}},
            {"time":"2025-11-24T06:00:01.000Z","type":"platform.start","record":{"requestId":"r-1","version":"$LATEST"}},
            {"time":"2025-11-24T06:00:01.000Z","type":"platform.report","record":{"requestId":"r-0"}},
            {"time":"2025-11-24T06:00:02.000Z","type":"platform.start","record":{"requestId":"r-2"}}
        ]"#;
        assert_eq!(started_request_ids(batch), ["r-1", "r-2"]);
        assert!(started_request_ids(b"not json").is_empty());
        assert!(started_request_ids(br#"{"type":"platform.start"}"#).is_empty());
    }

    #[test]
    fn the_subscription_is_the_managed_instances_schema() {
        let s = subscription("http://127.0.0.1:1234/");
        assert_eq!(s["schemaVersion"], "2025-01-29");
        assert_eq!(s["types"], serde_json::json!(["platform"]));
        assert_eq!(s["destination"]["URI"], "http://127.0.0.1:1234/");
        assert_eq!(s["buffering"]["timeoutMs"], 25);
    }
}
