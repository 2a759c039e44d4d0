//! A scripted fake of the Lambda Runtime API + Extensions API on 127.0.0.1, for what RIE cannot
//! do: several invocations in flight in one environment (Lambda Managed Instances).
//!
//! The test queues runtime events and extension events; every other request (responses,
//! errors) is recorded and answered 202.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{Mutex, Notify};

/// A request the fake received (other than the long polls).
#[derive(Debug, Clone)]
pub struct Received {
    /// Path.
    pub path: String,
    /// Headers.
    pub headers: http::HeaderMap,
    /// Body.
    pub body: Bytes,
}

#[derive(Default)]
struct State {
    runtime: Mutex<VecDeque<(String, String)>>,
    runtime_ready: Notify,
    extension: Mutex<VecDeque<serde_json::Value>>,
    extension_ready: Notify,
    received: Mutex<Vec<Received>>,
    received_ready: Notify,
}

/// The fake API; dropping it stops the server.
pub struct FakeLambda {
    /// Its address (`AWS_LAMBDA_RUNTIME_API`).
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeLambda {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pop<T>(q: &Mutex<VecDeque<T>>, ready: &Notify) -> T {
    loop {
        let notified = ready.notified();
        if let Some(v) = q.lock().await.pop_front() {
            return v;
        }
        notified.await;
    }
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let path = req.uri().path().to_owned();
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let mut resp = Response::new(Full::new(Bytes::new()));
    match path.as_str() {
        "/2020-01-01/extension/register" => {
            *resp.body_mut() = Full::new(Bytes::from_static(
                br#"{"functionName":"fake","functionVersion":"$LATEST","handler":"x"}"#,
            ));
            resp.headers_mut().insert(
                "lambda-extension-identifier",
                http::HeaderValue::from_static("fake-ext"),
            );
        }
        "/2020-01-01/extension/event/next" => {
            let ev = pop(&state.extension, &state.extension_ready).await;
            *resp.body_mut() = Full::new(Bytes::from(ev.to_string()));
        }
        "/2018-06-01/runtime/invocation/next" => {
            let (id, event) = pop(&state.runtime, &state.runtime_ready).await;
            *resp.body_mut() = Full::new(Bytes::from(event));
            let h = resp.headers_mut();
            h.insert("lambda-runtime-aws-request-id", id.parse().unwrap());
            h.insert(
                "lambda-runtime-deadline-ms",
                (now_ms() + 60_000).to_string().parse().unwrap(),
            );
            h.insert(
                "lambda-runtime-invoked-function-arn",
                http::HeaderValue::from_static(
                    "arn:aws:lambda:us-east-1:000000000000:function:fake",
                ),
            );
        }
        _ => {
            *resp.status_mut() = http::StatusCode::ACCEPTED;
            state.received.lock().await.push(Received {
                path,
                headers: parts.headers,
                body,
            });
            state.received_ready.notify_waiters();
        }
    }
    Ok(resp)
}

impl FakeLambda {
    /// Starts the fake on a free port of 127.0.0.1.
    pub async fn start() -> FakeLambda {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let s = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = http1::Builder::new()
                        .serve_connection(
                            TokioIo::new(stream),
                            service_fn(move |r| handle(s.clone(), r)),
                        )
                        .await;
                });
            }
        });
        FakeLambda { addr, state, task }
    }

    /// Queues an invocation: its event for the runtime and its INVOKE for the extension.
    pub async fn invoke(&self, id: &str, event: serde_json::Value) {
        self.state
            .runtime
            .lock()
            .await
            .push_back((id.to_owned(), event.to_string()));
        self.state.runtime_ready.notify_one();
        self.extension_event(serde_json::json!({
            "eventType": "INVOKE",
            "deadlineMs": (now_ms() + 60_000) as u64,
            "requestId": id,
            "invokedFunctionArn": "arn:aws:lambda:us-east-1:000000000000:function:fake",
            "tracing": {"type": "X-Amzn-Trace-Id", "value": "Root=1-0-0"},
        }))
        .await;
    }

    /// Queues an event for the extension (e.g. SHUTDOWN).
    pub async fn extension_event(&self, event: serde_json::Value) {
        self.state.extension.lock().await.push_back(event);
        self.state.extension_ready.notify_one();
    }

    /// Waits until a request to `path` was received (at most `limit`).
    pub async fn wait_for(&self, path: &str, limit: Duration) -> Option<Received> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.state.received_ready.notified();
            if let Some(r) = self
                .state
                .received
                .lock()
                .await
                .iter()
                .find(|r| r.path == path)
            {
                return Some(r.clone());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Everything received so far.
    pub async fn received(&self) -> Vec<Received> {
        self.state.received.lock().await.clone()
    }
}
