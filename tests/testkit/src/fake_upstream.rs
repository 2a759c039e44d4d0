//! A tiny HTTP/1.1 server standing in for DynamoDB in the proxy's own tests:
//! it records every request and answers with a predictable response. Not a Lambda double (that
//! is [`crate::platform`]): [`crate::FaultProxy`]'s tests need an upstream whose answers they
//! choose per request, which DynamoDB Local cannot give.
//!
//! Response: status from the `x-respond-status` request header (default 200),
//! `content-type: application/x-amz-json-1.0`, `x-upstream-seq: N` (1-based
//! arrival number), `x-amzn-requestid: upstream-N`, and as body the request
//! body if the request has an `x-echo` header, else `{}` (a valid empty
//! DynamoDB result, so the SDK can parse it).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One request as the upstream received it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub method: Method,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub(crate) struct FakeUpstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeUpstream {
    pub async fn start() -> FakeUpstream {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(accept(listener, Arc::clone(&seen)));
        FakeUpstream { addr, seen, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn accept(listener: TcpListener, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut conns = tokio::task::JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        let seen = Arc::clone(&seen);
        conns.spawn(async move {
            let service = service_fn(move |req| respond(Arc::clone(&seen), req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn respond(
    seen: Arc<Mutex<Vec<Seen>>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let echo = parts.headers.contains_key("x-echo");
    let status = parts
        .headers
        .get("x-respond-status")
        .and_then(|v| v.to_str().ok()?.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    let seq = {
        let mut seen = seen.lock().unwrap();
        seen.push(Seen {
            method: parts.method,
            path_and_query: parts
                .uri
                .path_and_query()
                .map_or("/".to_owned(), |pq| pq.to_string()),
            headers: parts.headers,
            body: body.clone(),
            at: Instant::now(),
        });
        seen.len()
    };
    let out = if echo {
        body
    } else {
        Bytes::from_static(b"{}")
    };
    let response = Response::builder()
        .status(status)
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-upstream-seq", seq.to_string())
        .header("x-amzn-requestid", format!("upstream-{seq}"))
        .body(Full::new(out))
        .unwrap();
    Ok(response)
}
