//! OTLP spans for the lock wait and the hold of each gated invocation, when an OTLP endpoint is
//! configured (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or `OTEL_EXPORTER_OTLP_ENDPOINT` as the
//! OpenTelemetry Lambda layer sets it). The spans join the invocation's own trace
//! ([`xray`]) and keep its sampling decision; what they carry is in [`spans`].
//!
//! Export never delays a decision, an answer or a release: the proxy hands each finished span
//! to [`Traces::record`], which puts it on a bounded queue without waiting (a full queue drops
//! it, and the drops are counted in a warning); one task sends batches with the OpenTelemetry
//! project's OTLP/HTTP exporter (protobuf, over hyper); SHUTDOWN flushes the queue within its
//! deadline ([`Traces::flush`]). Without an endpoint nothing is built: the proxy's only cost
//! is a branch on `None`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use tokio::sync::{mpsc, oneshot};

use crate::build_info;

pub mod spans;
pub mod xray;

/// Where spans go, used as is (the OTLP exporter specification: it takes precedence).
pub const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// The collector's base URL; spans go to its `/v1/traces`.
pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// `true` turns the export off whatever the endpoints say (the OpenTelemetry SDKs' switch).
pub const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";

/// Spans waiting to be sent; more are dropped. Two per invocation: a full queue means the
/// collector has been unreachable or slow for a long while.
pub const QUEUE: usize = 2048;
/// Most spans in one export request.
const BATCH: usize = 512;
/// Longest one export request may take (retries included) before it is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// A traces setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error(
    "{var}={value:?}: {reason}; accepted: an http:// URL of an OTLP/HTTP collector, such as \
     http://localhost:4318 ({ENDPOINT}, spans go to its /v1/traces) or \
     http://localhost:4318/v1/traces ({TRACES_ENDPOINT}, used as is)"
)]
pub struct EndpointError {
    var: &'static str,
    value: String,
    reason: String,
}

/// The OTLP/HTTP traces URL from the environment: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is,
/// else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`; `None` (no export) when neither is set
/// (or both are empty) or `OTEL_SDK_DISABLED=true`. Only `http://`: the collector of a Lambda
/// function listens on localhost, and the exporter speaks no TLS. Pure.
pub fn traces_endpoint(env: &HashMap<String, String>) -> Result<Option<String>, EndpointError> {
    if env
        .get(SDK_DISABLED)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    {
        return Ok(None);
    }
    let set = |var: &str| env.get(var).map(|v| v.trim()).filter(|v| !v.is_empty());
    let (var, url) = if let Some(v) = set(TRACES_ENDPOINT) {
        (TRACES_ENDPOINT, v.to_owned())
    } else if let Some(v) = set(ENDPOINT) {
        (ENDPOINT, format!("{}/v1/traces", v.trim_end_matches('/')))
    } else {
        return Ok(None);
    };
    let error = |reason: &str| EndpointError {
        var,
        value: env.get(var).cloned().unwrap_or_default(),
        reason: reason.to_owned(),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| error(&format!("not a URL ({e})")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(error("https is not supported")),
        _ => return Err(error("not an http:// URL")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(error("no host"));
    }
    Ok(Some(url))
}

/// The `service.name` the extension sets: the function's name, unless `OTEL_SERVICE_NAME` or a
/// `service.name` in `OTEL_RESOURCE_ATTRIBUTES` names the service (then `None`: the SDK's
/// resource keeps theirs). Pure.
pub fn service_name(env: &HashMap<String, String>, function: Option<&str>) -> Option<String> {
    let named = |var: &str| env.get(var).map(|v| v.trim()).filter(|v| !v.is_empty());
    if named("OTEL_SERVICE_NAME").is_some()
        || named("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attrs| {
            attrs.split(',').any(|kv| {
                kv.split_once('=')
                    .is_some_and(|(k, _)| k.trim() == "service.name")
            })
        })
    {
        return None;
    }
    function.map(str::to_owned)
}

/// A hold being traced: what its span needs at the release.
#[derive(Debug, Clone)]
pub struct HoldTrace {
    /// What the invocation's spans share.
    pub inv: spans::Invocation,
    /// The fencing token.
    pub ticket: u64,
    /// When the lock was taken.
    pub start: std::time::SystemTime,
}

/// The export of spans: a bounded queue and the task that sends it. Cheap to share.
#[derive(Debug)]
pub struct Traces {
    spans: mpsc::Sender<SpanData>,
    flushes: mpsc::UnboundedSender<oneshot::Sender<()>>,
    dropped: AtomicU64,
    scope: InstrumentationScope,
    endpoint: String,
}

impl Traces {
    /// Starts exporting to `endpoint` (a full traces URL, see [`traces_endpoint`]). The spans'
    /// resource is the SDK's (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), with
    /// `service.name` = `service` if given (see [`service_name`]). Spawns the sending task:
    /// call inside the Tokio runtime.
    pub fn start(endpoint: &str, service: Option<&str>) -> Result<Arc<Traces>, String> {
        Traces::start_with(endpoint, service, QUEUE, EXPORT_TIMEOUT)
    }

    /// [`Traces::start`] with a queue of `queue` spans and `timeout` for each export request,
    /// retries included (tests fill a small queue, and keep a blocked receiver's requests
    /// open).
    pub fn start_with(
        endpoint: &str,
        service: Option<&str>,
        queue: usize,
        timeout: Duration,
    ) -> Result<Arc<Traces>, String> {
        let client = opentelemetry_http::hyper::HyperClient::with_default_connector(timeout, None);
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .with_timeout(timeout)
            .with_http_client(client)
            .build()
            .map_err(|e| format!("cannot build the OTLP exporter for {endpoint}: {e}"))?;
        let mut resource = Resource::builder();
        if let Some(name) = service {
            resource = resource.with_service_name(name.to_owned());
        }
        let resource = resource.build();
        exporter.set_resource(&resource);
        let (spans, rx) = mpsc::channel(queue.max(1));
        let (flushes, flush_rx) = mpsc::unbounded_channel();
        tokio::spawn(send(exporter, rx, flush_rx, endpoint.to_owned()));
        Ok(Arc::new(Traces {
            spans,
            flushes,
            dropped: AtomicU64::new(0),
            scope: InstrumentationScope::builder("flightlock")
                .with_version(build_info::VERSION)
                .build(),
            endpoint: endpoint.to_owned(),
        }))
    }

    /// Where spans go.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The instrumentation scope of flightlock's spans.
    pub fn scope(&self) -> &InstrumentationScope {
        &self.scope
    }

    /// Queues `span` for export without waiting: when the queue is full, drops it and counts
    /// the drop (a warning at the 1st, 2nd, 4th, 8th, ... drop, with the total).
    pub fn record(&self, span: SpanData) {
        if self.spans.try_send(span).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    dropped_total = n,
                    queue = self.spans.max_capacity(),
                    endpoint = %self.endpoint,
                    "OTLP span queue full (the collector is slow or unreachable): spans dropped"
                );
            }
        }
    }

    /// Spans dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sends everything queued, within `budget`. True if it all went out (or failed to and was
    /// given up) in time; false if the budget ran out first (what was left is lost with the
    /// environment). Logs the drops, if any.
    pub async fn flush(&self, budget: Duration) -> bool {
        let (tx, rx) = oneshot::channel();
        let done = self.flushes.send(tx).is_ok()
            && tokio::time::timeout(budget, rx)
                .await
                .is_ok_and(|r| r.is_ok());
        let dropped = self.dropped();
        if !done {
            tracing::warn!(
                budget_ms = budget.as_millis() as u64,
                dropped_total = dropped,
                "OTLP spans not all sent before the shutdown deadline"
            );
        } else if dropped > 0 {
            tracing::warn!(
                dropped_total = dropped,
                "OTLP spans flushed; some had been dropped (queue full)"
            );
        }
        done
    }
}

/// The sending task: batches of what is queued, one export at a time; a flush request sends
/// everything queued before it is answered.
async fn send<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    mut flushes: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    endpoint: String,
) {
    let mut failing = false;
    loop {
        let (first, flush) = tokio::select! {
            biased;
            Some(reply) = flushes.recv() => (None, Some(reply)),
            Some(span) = spans.recv() => (Some(span), None),
            else => return,
        };
        let mut batch: Vec<SpanData> = first.into_iter().collect();
        loop {
            while batch.len() < BATCH {
                match spans.try_recv() {
                    Ok(s) => batch.push(s),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            let n = batch.len();
            let result = exporter.export(std::mem::take(&mut batch)).await;
            match result {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!(%endpoint, "OTLP spans are being sent again");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(%endpoint, error = %e, spans = n, "could not send OTLP spans; they are dropped (said once until sending works again)");
                }
                Err(e) => {
                    tracing::debug!(%endpoint, error = %e, spans = n, "could not send OTLP spans")
                }
            }
            // A flush empties the queue; otherwise one batch at a time, so a flush request
            // is not kept waiting behind a steady stream.
            if flush.is_none() {
                break;
            }
        }
        if let Some(reply) = flush {
            let _ = reply.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> HashMap<String, String> {
        vars.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_traces_endpoint_wins_and_the_base_gets_v1_traces() {
        assert_eq!(traces_endpoint(&env(&[])).unwrap(), None);
        assert_eq!(traces_endpoint(&env(&[(ENDPOINT, "")])).unwrap(), None);
        assert_eq!(
            traces_endpoint(&env(&[(ENDPOINT, "http://localhost:4318/")])).unwrap(),
            Some("http://localhost:4318/v1/traces".to_owned())
        );
        assert_eq!(
            traces_endpoint(&env(&[
                (ENDPOINT, "http://localhost:4318"),
                (TRACES_ENDPOINT, "http://127.0.0.1:9/custom")
            ]))
            .unwrap(),
            Some("http://127.0.0.1:9/custom".to_owned())
        );
        assert_eq!(
            traces_endpoint(&env(&[
                (ENDPOINT, "http://localhost:4318"),
                (SDK_DISABLED, "TRUE")
            ]))
            .unwrap(),
            None
        );
    }

    #[test]
    fn the_function_name_is_the_service_unless_opentelemetry_names_one() {
        assert_eq!(service_name(&env(&[]), Some("f")).as_deref(), Some("f"));
        assert_eq!(service_name(&env(&[]), None), None);
        assert_eq!(
            service_name(&env(&[("OTEL_SERVICE_NAME", "billing")]), Some("f")),
            None
        );
        assert_eq!(
            service_name(
                &env(&[("OTEL_RESOURCE_ATTRIBUTES", "team=a, service.name=billing")]),
                Some("f")
            ),
            None
        );
        assert_eq!(
            service_name(&env(&[("OTEL_RESOURCE_ATTRIBUTES", "team=a")]), Some("f")).as_deref(),
            Some("f")
        );
    }

    #[test]
    fn unusable_endpoints_name_the_variable_and_the_accepted_forms() {
        for (var, value) in [
            (ENDPOINT, "localhost:4318"),
            (ENDPOINT, "https://collector:4318"),
            (TRACES_ENDPOINT, "http://"),
            (TRACES_ENDPOINT, "grpc://localhost:4317"),
        ] {
            let e = traces_endpoint(&env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("{var}=")), "{e}");
            assert!(e.contains("http://localhost:4318"), "{e}");
        }
    }
}
