//! Shared by the extension's execution-mode tests (tenants, SnapStart restore, streaming,
//! durable replays): a scripted Runtime API, a proxy on DynamoDB Local, and a runtime's calls.
//!
//! The scripted Runtime API keeps to what Lambda's does, per the Runtime API page of the AWS
//! Lambda developer guide and the runtime clients that call it:
//! - `GET /2018-06-01/runtime/invocation/next` is a long poll: it answers only when an event is
//!   queued, with `Lambda-Runtime-Aws-Request-Id`, `Lambda-Runtime-Deadline-Ms` and, for a
//!   function in tenant isolation mode, `Lambda-Runtime-Aws-Tenant-Id` ("Tenant isolation").
//! - `GET /2018-06-01/runtime/restore/next` exists only for a SnapStart init and is answered
//!   (200) once the environment is restored (aws/aws-lambda-runtime-interface-emulator's router
//!   serves it only for a snapshot init); anything else there is refused with 404.
//! - `POST .../{id}/response` and `.../{id}/error` are accepted (202) once per invocation
//!   that was handed out; a second answer, or one for an unknown id, is refused (400, as the
//!   emulator's `InvalidRequestID` / already-answered checks do). A streamed response
//!   (`Lambda-Runtime-Function-Response-Mode: streaming`, chunked) is accepted as soon as its
//!   head arrives and read to its end, counted, never buffered ("Response streaming" in the
//!   Runtime API page; Lambda keeps reading when the invoking client disconnects).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use flightlock::lambda::config::Config;
use flightlock::lambda::gate::Gate;
use flightlock::Locker;
use flightlock_extension::invocations::Invocations;
use flightlock_extension::proxy::Proxy;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

pub const NEXT: &str = "/2018-06-01/runtime/invocation/next";
pub const RESTORE_NEXT: &str = "/2018-06-01/runtime/restore/next";

/// One event to hand out.
#[derive(Clone, Debug)]
pub struct Event {
    pub id: String,
    pub body: String,
    pub tenant: Option<String>,
}

impl Event {
    pub fn new(id: &str, body: &str) -> Event {
        Event {
            id: id.into(),
            body: body.into(),
            tenant: None,
        }
    }

    pub fn tenant(mut self, tenant: &str) -> Event {
        self.tenant = Some(tenant.into());
        self
    }
}

/// An answer the Runtime API accepted.
#[derive(Debug)]
pub struct Answer {
    pub path: String,
    pub headers: http::HeaderMap,
    /// The body if it was small (under 64 KiB), else empty.
    pub body: Bytes,
    /// Bytes in the body.
    pub len: u64,
    /// Whether the body ended cleanly (a streamed body can break off).
    pub complete: bool,
    pub trailers: Option<http::HeaderMap>,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Default)]
struct State {
    events: VecDeque<Event>,
    handed: HashSet<String>,
    answered: HashSet<String>,
}

/// The scripted Runtime API (see the module docs).
pub struct FakeRuntimeApi {
    pub addr: String,
    state: Arc<Mutex<State>>,
    queued: Arc<Notify>,
    /// Set for a SnapStart init; notified to restore.
    restore: Option<Arc<Notify>>,
    /// Answers accepted, in order of their end.
    pub answers: mpsc::UnboundedReceiver<Answer>,
    /// The first body bytes of each streamed answer arrived (its path).
    pub streaming: mpsc::UnboundedReceiver<String>,
}

impl FakeRuntimeApi {
    /// A Runtime API for a standard init.
    pub async fn start() -> FakeRuntimeApi {
        FakeRuntimeApi::with_restore(None).await
    }

    /// A Runtime API for a SnapStart init: `restore/next` waits for [`Self::restore`].
    pub async fn snap_start() -> FakeRuntimeApi {
        FakeRuntimeApi::with_restore(Some(Arc::new(Notify::new()))).await
    }

    async fn with_restore(restore: Option<Arc<Notify>>) -> FakeRuntimeApi {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state: Arc<Mutex<State>> = Arc::default();
        let queued = Arc::new(Notify::new());
        let (tx, answers) = mpsc::unbounded_channel();
        let (stx, streaming) = mpsc::unbounded_channel();
        let shared = Shared {
            state: state.clone(),
            queued: queued.clone(),
            restore: restore.clone(),
            answers: tx,
            streaming: stx,
        };
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| shared.clone().serve(req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        FakeRuntimeApi {
            addr,
            state,
            queued,
            restore,
            answers,
            streaming,
        }
    }

    /// Queues an event for the next `GET next`.
    pub fn push(&self, event: Event) {
        self.state.lock().unwrap().events.push_back(event);
        self.queued.notify_waiters();
        self.queued.notify_one();
    }

    /// Restores the snapshot: a waiting `restore/next` is answered.
    pub fn restore(&self) {
        self.restore
            .as_ref()
            .expect("a SnapStart init")
            .notify_one();
    }

    /// The next accepted answer (bounded wait).
    pub async fn answer(&mut self) -> Answer {
        tokio::time::timeout(Duration::from_secs(60), self.answers.recv())
            .await
            .expect("an answer reached the Runtime API")
            .unwrap()
    }
}

#[derive(Clone)]
struct Shared {
    state: Arc<Mutex<State>>,
    queued: Arc<Notify>,
    restore: Option<Arc<Notify>>,
    answers: mpsc::UnboundedSender<Answer>,
    streaming: mpsc::UnboundedSender<String>,
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, body: &str) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r
}

fn deadline_ms() -> u128 {
    (SystemTime::now() + Duration::from_secs(120))
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

impl Shared {
    async fn serve(self, req: Request<Incoming>) -> Result<Reply, std::convert::Infallible> {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        if method == http::Method::GET && path == NEXT {
            return Ok(self.next().await);
        }
        if method == http::Method::GET && path == RESTORE_NEXT {
            return Ok(match &self.restore {
                Some(restored) => {
                    restored.notified().await;
                    reply(StatusCode::OK, "")
                }
                None => reply(StatusCode::NOT_FOUND, "not a SnapStart init"),
            });
        }
        let id = path
            .strip_prefix("/2018-06-01/runtime/invocation/")
            .and_then(|rest| {
                rest.strip_suffix("/response")
                    .or_else(|| rest.strip_suffix("/error"))
            })
            .map(str::to_owned);
        let Some(id) = id.filter(|_| method == http::Method::POST) else {
            return Ok(reply(StatusCode::NOT_FOUND, "unknown path"));
        };
        {
            let mut st = self.state.lock().unwrap();
            if !st.handed.contains(&id) || !st.answered.insert(id.clone()) {
                return Ok(reply(StatusCode::BAD_REQUEST, "InvalidRequestID"));
            }
        }
        let streamed = req
            .headers()
            .get("lambda-runtime-function-response-mode")
            .is_some_and(|v| v == "streaming");
        let (parts, body) = req.into_parts();
        let reader = read_body(
            path.clone(),
            parts.headers,
            body,
            self.answers.clone(),
            streamed.then(|| self.streaming.clone()),
        );
        if streamed {
            // Accepted on its head; the body is read to its end meanwhile.
            tokio::spawn(reader);
        } else {
            reader.await;
        }
        Ok(reply(StatusCode::ACCEPTED, "{}"))
    }

    async fn next(&self) -> Reply {
        let event = loop {
            let waiting = self.queued.notified();
            if let Some(e) = self.state.lock().unwrap().events.pop_front() {
                break e;
            }
            waiting.await;
        };
        self.state.lock().unwrap().handed.insert(event.id.clone());
        let mut r = reply(StatusCode::OK, &event.body);
        let h = r.headers_mut();
        h.insert("lambda-runtime-aws-request-id", event.id.parse().unwrap());
        h.insert(
            "lambda-runtime-deadline-ms",
            deadline_ms().to_string().parse().unwrap(),
        );
        if let Some(t) = &event.tenant {
            h.insert("lambda-runtime-aws-tenant-id", t.parse().unwrap());
        }
        r
    }
}

async fn read_body(
    path: String,
    headers: http::HeaderMap,
    mut body: Incoming,
    answers: mpsc::UnboundedSender<Answer>,
    first: Option<mpsc::UnboundedSender<String>>,
) {
    let (mut small, mut len, mut trailers, mut complete) = (Vec::new(), 0u64, None, true);
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    if len == 0 {
                        if let Some(first) = &first {
                            let _ = first.send(path.clone());
                        }
                    }
                    len += d.len() as u64;
                    if small.len() < 64 * 1024 {
                        small.extend_from_slice(d);
                    }
                } else if let Ok(t) = f.into_trailers() {
                    trailers = Some(t);
                }
            }
            Err(_) => {
                complete = false;
                break;
            }
        }
    }
    if len >= 64 * 1024 {
        small.clear();
    }
    let _ = answers.send(Answer {
        path,
        headers,
        body: Bytes::from(small),
        len,
        complete,
        trailers,
    });
}

/// Config for a proxy in front of `upstream` on `table`, from `vars` (plus the table, the
/// function name and the upstream).
pub fn config(table: &str, upstream: &str, vars: &[(&str, &str)]) -> Arc<Config> {
    let mut env: std::collections::HashMap<String, String> = [
        ("FLIGHTLOCK_TABLE", table),
        ("AWS_LAMBDA_FUNCTION_NAME", "f"),
        // No EMF lines on the test output.
        ("FLIGHTLOCK_METRICS", "off"),
        ("AWS_LAMBDA_RUNTIME_API", upstream),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    for (k, v) in vars {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    Arc::new(Config::from_map(&env).unwrap())
}

/// A fresh lock table on DynamoDB Local; returns its name and a client for it.
pub async fn table(prefix: &str) -> (String, aws_sdk_dynamodb::Client) {
    let fresh = flightlock_testkit::fresh_table(prefix).await;
    (fresh.table, fresh.client)
}

/// Starts a proxy (one execution environment's extension) in front of `upstream` with
/// `config`, locking through `client`. Returns its port and the proxy.
pub async fn start_proxy(
    config: Arc<Config>,
    client: aws_sdk_dynamodb::Client,
    upstream: &str,
    host: &str,
) -> (u16, Arc<Proxy>) {
    let gate = Gate::new(
        config.clone(),
        Locker::new(client, &config.table),
        host.to_owned(),
    );
    let proxy = Arc::new(Proxy::new(
        gate,
        Arc::new(Invocations::default()),
        upstream.to_owned(),
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(proxy.clone().serve(listener));
    (port, proxy)
}

/// What the runtime got from `GET next` through the proxy.
#[derive(Debug)]
pub struct Got {
    pub status: StatusCode,
    pub request_id: Option<String>,
    pub tenant: Option<String>,
    pub body: Bytes,
}

/// The runtime's `GET path` through the proxy on `port` (a new connection), bounded.
pub async fn get(port: u16, path: &str) -> Got {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let uri: http::Uri = format!("http://127.0.0.1:{port}{path}").parse().unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(60), client.get(uri))
        .await
        .expect("the proxy answered")
        .unwrap();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (status, request_id, tenant) = (
        resp.status(),
        header("lambda-runtime-aws-request-id"),
        header("lambda-runtime-aws-tenant-id"),
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Got {
        status,
        request_id,
        tenant,
        body,
    }
}

/// The runtime posts a (small) response for `id` through the proxy; returns the status.
pub async fn respond(port: u16, id: &str, body: &str) -> StatusCode {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = Request::post(format!(
        "http://127.0.0.1:{port}/2018-06-01/runtime/invocation/{id}/response"
    ))
    .body(Full::new(Bytes::from(body.to_owned())))
    .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(60), client.request(req))
        .await
        .expect("the proxy answered")
        .unwrap();
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    status
}
