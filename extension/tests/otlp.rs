//! The OTLP spans of gated invocations, as a collector receives them: a real OTLP/HTTP receiver
//! on 127.0.0.1 (`POST /v1/traces`, the protobuf decoded with `opentelemetry-proto`'s types)
//! behind the proxy's exporter. The spans join the trace of the event's
//! `Lambda-Runtime-Trace-Id` header, carry the key's hash (never the key), the ticket, the
//! outcome and, for a scheduled tick, `faas.trigger`/`faas.time`; an unsampled trace exports
//! nothing; a failed decision and a lock lost mid-run are error spans; a receiver that does not
//! answer delays no invocation (its spans are dropped and counted); SHUTDOWN flushes what is
//! queued. Needs DynamoDB Local.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::AttributeValue;
use bytes::Bytes;
use flightlock_extension::otel::{Traces, QUEUE};
use flightlock_extension::proxy::{Limits, Proxy};
use flightlock_testkit::platform::{Outcome, Platform};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::{status::StatusCode as SpanStatus, Span};
use prost::Message;
use sha2::{Digest, Sha256};
use support::{get, respond, LIMIT, NEXT};
use tokio::net::TcpListener;
use tokio::sync::watch;

const TRACE_1: &str = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
const TRACE_2: &str = "Root=1-6759e988-0d862e3fe1be46a994272794;Parent=1111222233334444;Sampled=1";
const UNSAMPLED: &str =
    "Root=1-7759e988-cd862e3fe1be46a994272795;Parent=5555666677778888;Sampled=0";

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A span as received, with the resource's `service.name` and the scope's name.
#[derive(Debug, Clone)]
struct Got {
    service: Option<String>,
    scope: String,
    span: Span,
}

impl Got {
    fn attr(&self, name: &str) -> Option<String> {
        attr(&self.span.attributes, name)
    }

    fn trace_parent(&self) -> (Vec<u8>, Vec<u8>) {
        (self.span.trace_id.clone(), self.span.parent_span_id.clone())
    }
}

fn attr(attributes: &[KeyValue], name: &str) -> Option<String> {
    let kv = attributes.iter().find(|kv| kv.key == name)?;
    match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// The trace and parent a header names, as the bytes OTLP carries.
fn ids(trace: &str) -> (Vec<u8>, Vec<u8>) {
    let root = trace
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("Root=1-");
    let parent = trace
        .split(';')
        .nth(1)
        .unwrap()
        .trim_start_matches("Parent=");
    (hex(&root.replace('-', "")), hex(parent))
}

/// An OTLP/HTTP receiver on 127.0.0.1 that keeps what it decoded. While blocked, requests
/// wait (unanswered) until it is opened.
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Got>>>,
    arrived: watch::Receiver<usize>,
    open: watch::Sender<bool>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let (arrivals, arrived) = watch::channel(0usize);
        let (open, _) = watch::channel(true);
        let (state, opened) = (got.clone(), open.clone());
        let arrivals = Arc::new(arrivals);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (state, opened, arrivals) = (state.clone(), opened.clone(), arrivals.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        receive(req, state.clone(), opened.subscribe(), arrivals.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver {
            addr,
            got,
            arrived,
            open,
        }
    }

    /// The base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`'s form) and the traces URL.
    fn traces_url(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    fn spans(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    fn block(&self) {
        self.open.send_replace(false);
    }

    fn unblock(&self) {
        self.open.send_replace(true);
    }

    /// Waits until `n` export requests have arrived (answered or not), bounded.
    async fn wait_arrived(&self, n: usize) {
        let mut rx = self.arrived.clone();
        tokio::time::timeout(LIMIT, rx.wait_for(|a| *a >= n))
            .await
            .expect("export requests arrived")
            .unwrap();
    }
}

async fn receive(
    req: Request<Incoming>,
    got: Arc<Mutex<Vec<Got>>>,
    mut open: watch::Receiver<bool>,
    arrivals: Arc<watch::Sender<usize>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::POST || req.uri().path() != "/v1/traces" {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::NOT_FOUND;
        return Ok(r);
    }
    let content_type = req.headers().get("content-type").cloned();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        content_type.as_ref().and_then(|v| v.to_str().ok()),
        Some("application/x-protobuf")
    );
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
    arrivals.send_modify(|n| *n += 1);
    let _ = open.wait_for(|o| *o).await;
    let mut all = got.lock().unwrap();
    for rs in request.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| attr(&r.attributes, "service.name"));
        for ss in rs.scope_spans {
            let scope = ss
                .scope
                .as_ref()
                .map(|s| s.name.clone())
                .unwrap_or_default();
            for span in ss.spans {
                all.push(Got {
                    service: service.clone(),
                    scope: scope.clone(),
                    span,
                });
            }
        }
    }
    let mut r = Response::new(Full::new(Bytes::from(
        ExportTraceServiceResponse::default().encode_to_vec(),
    )));
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/x-protobuf"),
    );
    Ok(r)
}

/// A platform double and a proxy exporting through `traces`, on a fresh table.
async fn environment(
    prefix: &str,
    vars: &[(&str, &str)],
    traces: Arc<Traces>,
) -> (Platform, u16, Arc<Proxy>) {
    let (table, client) = support::table(prefix).await;
    let platform = support::standard().await;
    let (port, proxy) = support::start_proxy_full(
        &platform,
        &table,
        client,
        vars,
        "env-1",
        Limits::default(),
        Some(traces),
    )
    .await;
    (platform, port, proxy)
}

/// Waits until the proxy counts invocation `id` as done (answered upstream, its spans queued).
async fn done(proxy: &Proxy, id: &str) {
    let slot = proxy
        .invocations()
        .get(id)
        .expect("the proxy saw the invocation");
    assert!(slot.wait_done(LIMIT).await, "{id} done");
}

fn key_hash(key: &str) -> String {
    Sha256::digest(key.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_and_the_hold_join_the_invocations_trace() {
    let receiver = Receiver::start().await;
    let traces = Traces::start_with(&receiver.traces_url(), Some("f"), QUEUE, LIMIT).unwrap();
    // The key carries an account id: the spans must not.
    let (platform, port, proxy) = environment(
        "otlp-trace",
        &[("FLIGHTLOCK_KEY", "nightly-{/account}")],
        traces.clone(),
    )
    .await;
    let tick = flightlock_testkit::events::scheduled(
        flightlock_testkit::events::SCHEDULED_ID,
        "2026-11-25T03:00:00Z",
    );

    // 1. A scheduled tick runs: a wait (acquired) and a hold (ran), children of the header's
    // parent in its trace.
    let id = platform.invoke_traced(tick.clone(), TRACE_1);
    assert_eq!(
        get(port, NEXT).await.request_id.as_deref(),
        Some(id.as_str())
    );
    assert!(respond(port, &id, "{}").await.is_success());
    assert!(traces.flush(LIMIT).await);
    let spans = receiver.spans();
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let wait = spans
        .iter()
        .find(|s| s.span.name == "flightlock.wait")
        .unwrap();
    let hold = spans
        .iter()
        .find(|s| s.span.name == "flightlock.hold")
        .unwrap();
    for s in [wait, hold] {
        assert_eq!(s.trace_parent(), ids(TRACE_1));
        assert_eq!(s.service.as_deref(), Some("f"));
        assert_eq!(s.scope, "flightlock");
        assert_eq!(s.attr("faas.invocation_id").as_deref(), Some(id.as_str()));
        assert_eq!(
            s.attr("flightlock.key_hash"),
            Some(key_hash("nightly-123456789012"))
        );
        assert_eq!(s.attr("faas.trigger").as_deref(), Some("timer"));
        assert_eq!(
            s.attr("faas.time").as_deref(),
            Some("2026-11-25T03:00:00.000Z")
        );
        assert!(
            s.span
                .attributes
                .iter()
                .all(|kv| !format!("{:?}", kv.value).contains("123456789012")),
            "the raw key is in {s:#?}"
        );
        assert!(s.span.start_time_unix_nano <= s.span.end_time_unix_nano);
    }
    assert_ne!(wait.span.span_id, hold.span.span_id);
    assert_eq!(wait.attr("flightlock.outcome").as_deref(), Some("acquired"));
    assert_eq!(hold.attr("flightlock.outcome").as_deref(), Some("ran"));
    let ticket = wait.attr("flightlock.ticket").unwrap();
    assert!(ticket.parse::<u64>().unwrap() > 0);
    assert_eq!(hold.attr("flightlock.ticket"), Some(ticket));
    // The hold starts where the wait ends.
    assert_eq!(wait.span.end_time_unix_nano, hold.span.start_time_unix_nano);

    // 2. A second delivery of the tick (another trace): answered as a duplicate without
    // running: one wait span, no hold.
    let again = platform.invoke_traced(tick, TRACE_2);
    let waiting = tokio::spawn(async move { get(port, NEXT).await });
    assert!(matches!(
        platform.outcome(&again, LIMIT).await,
        Some(Outcome::Response(_))
    ));
    done(&proxy, &again).await;
    assert!(traces.flush(LIMIT).await);
    let spans = receiver.spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    let dup = &spans[2];
    assert_eq!(dup.span.name, "flightlock.wait");
    assert_eq!(dup.trace_parent(), ids(TRACE_2));
    assert_eq!(dup.attr("flightlock.outcome").as_deref(), Some("duplicate"));
    assert_eq!(dup.attr("flightlock.ticket"), None);

    // 3. An unsampled trace (Sampled=0) runs and exports nothing.
    let later = flightlock_testkit::events::scheduled(
        "a9b8c7d6-0000-4000-8000-000000000001",
        "2026-11-25T04:00:00Z",
    );
    let third = platform.invoke_traced(later, UNSAMPLED);
    let got = tokio::time::timeout(LIMIT, waiting).await.unwrap().unwrap();
    assert_eq!(got.request_id.as_deref(), Some(third.as_str()));
    assert!(respond(port, &third, "{}").await.is_success());
    assert!(traces.flush(LIMIT).await);
    assert_eq!(receiver.spans().len(), 3, "{:#?}", receiver.spans());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_decision_is_an_error_span_without_a_key() {
    let receiver = Receiver::start().await;
    let traces = Traces::start_with(&receiver.traces_url(), Some("f"), QUEUE, LIMIT).unwrap();
    let (platform, port, proxy) = environment(
        "otlp-failed",
        &[("FLIGHTLOCK_KEY", "acct-{/account}")],
        traces.clone(),
    )
    .await;
    let id = platform.invoke_traced(serde_json::json!({"other": 1}), TRACE_1);
    let waiting = tokio::spawn(async move { get(port, NEXT).await });
    assert!(matches!(
        platform.outcome(&id, LIMIT).await,
        Some(Outcome::Error(_, _))
    ));
    done(&proxy, &id).await;
    assert!(traces.flush(LIMIT).await);
    let spans = receiver.spans();
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let s = &spans[0];
    assert_eq!(s.span.name, "flightlock.wait");
    assert_eq!(s.trace_parent(), ids(TRACE_1));
    assert_eq!(s.attr("flightlock.outcome").as_deref(), Some("failed"));
    assert_eq!(
        s.attr("flightlock.error_type").as_deref(),
        Some("FlightlockKeyError")
    );
    assert_eq!(s.attr("flightlock.key_hash"), None);
    assert_eq!(
        s.span.status.as_ref().map(|st| st.code),
        Some(SpanStatus::Error as i32)
    );
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_does_not_answer_delays_no_invocation() {
    let receiver = Receiver::start().await;
    receiver.block();
    // A queue of one span: the sender takes at most two before its request hangs.
    let traces = Traces::start_with(&receiver.traces_url(), Some("f"), 1, LIMIT).unwrap();
    let (platform, port, _proxy) = environment("otlp-blocked", &[], traces.clone()).await;
    let traced = [TRACE_1, TRACE_2, TRACE_1];
    for trace in traced {
        let id = platform.invoke_traced(serde_json::json!({}), trace);
        // Each step is bounded by the test's own limit: a gate waiting on the export would
        // hang here.
        assert_eq!(
            get(port, NEXT).await.request_id.as_deref(),
            Some(id.as_str())
        );
        assert!(respond(port, &id, "{}").await.is_success());
    }
    receiver.wait_arrived(1).await;
    assert!(
        receiver.spans().is_empty(),
        "the receiver answered nothing yet"
    );
    // Six spans made; at most two in the hanging request and one queued.
    let dropped = traces.dropped();
    assert!(dropped >= 3, "dropped {dropped}");
    receiver.unblock();
    assert!(traces.flush(LIMIT).await);
    let mut ids: Vec<Vec<u8>> = receiver
        .spans()
        .into_iter()
        .map(|s| s.span.span_id)
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len() as u64 + dropped, 2 * traced.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_while_the_handler_runs_ends_the_hold_as_lost() {
    let receiver = Receiver::start().await;
    let traces = Traces::start_with(&receiver.traces_url(), Some("f"), QUEUE, LIMIT).unwrap();
    let (table, client) = support::table("otlp-lost").await;
    let platform = support::standard().await;
    // A short lease: heartbeats (every lease / 3) notice the loss soon.
    let (port, proxy) = support::start_proxy_full(
        &platform,
        &table,
        client.clone(),
        &[("FLIGHTLOCK_LEASE", "2s")],
        "env-1",
        Limits::default(),
        Some(traces.clone()),
    )
    .await;
    let id = platform.invoke_traced(serde_json::json!({}), TRACE_1);
    assert_eq!(
        get(port, NEXT).await.request_id.as_deref(),
        Some(id.as_str())
    );
    // The row goes behind the holder's back (the key is the function name, `f`).
    client
        .delete_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("f".into()))
        .key("sk", AttributeValue::S("counter".into()))
        .send()
        .await
        .unwrap();
    let slot = proxy.invocations().get(&id).unwrap();
    tokio::time::timeout(LIMIT, async {
        while !slot.lock_lost() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a heartbeat noticed the loss");
    assert!(respond(port, &id, "{}").await.is_success());
    assert!(traces.flush(LIMIT).await);
    let spans = receiver.spans();
    let hold = spans
        .iter()
        .find(|s| s.span.name == "flightlock.hold")
        .unwrap_or_else(|| panic!("no hold span in {spans:#?}"));
    assert_eq!(hold.attr("flightlock.outcome").as_deref(), Some("lost"));
    assert_eq!(
        hold.span.status.as_ref().map(|st| st.code),
        Some(SpanStatus::Error as i32)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_then_flushes_the_spans() {
    let receiver = Receiver::start().await;
    let traces = Traces::start_with(&receiver.traces_url(), Some("f"), QUEUE, LIMIT).unwrap();
    let (platform, port, proxy) = environment("otlp-shutdown", &[], traces).await;
    let id = platform.invoke_traced(serde_json::json!({}), TRACE_1);
    assert_eq!(
        get(port, NEXT).await.request_id.as_deref(),
        Some(id.as_str())
    );
    // The handler never answers; SHUTDOWN comes.
    proxy.release_all(LIMIT).await;
    // Sent before `release_all` returned: no wait, no flush of our own.
    let spans = receiver.spans();
    let hold = spans
        .iter()
        .find(|s| s.span.name == "flightlock.hold")
        .unwrap_or_else(|| panic!("no hold span in {spans:#?}"));
    assert_eq!(hold.attr("flightlock.outcome").as_deref(), Some("shutdown"));
    assert_eq!(hold.trace_parent(), ids(TRACE_1));
    assert_eq!(spans.len(), 2, "{spans:#?}");
}
