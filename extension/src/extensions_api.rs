//! The Extensions API and Telemetry API client. Ours rather than `lambda_extension`'s runner:
//! a refused registration must keep the platform's answer (status and body) for the init error,
//! the events registered depend on the execution mode, and the Telemetry listener must bind
//! where we choose (`lambda_extension` binds 0.0.0.0 and drops the error body).
//!
//! Requests are built by pure functions (paths and headers as constants, as in
//! `lambda-extension`'s `requests.rs`); [`ExtensionsApi`] only sends them. The init error is
//! `lambda_extension::requests::init_error` itself; that crate's register, next and subscribe
//! builders are crate-private, hence ours.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lambda_extension::requests::{self, ErrorRequest};
use lambda_extension::NextEvent;

use crate::body::BoxError;

/// Registration.
pub const REGISTER_PATH: &str = "/2020-01-01/extension/register";
/// The next lifecycle event (long poll).
pub const NEXT_PATH: &str = "/2020-01-01/extension/event/next";
/// Reporting an init failure.
pub const INIT_ERROR_PATH: &str = "/2020-01-01/extension/init/error";
/// Telemetry API subscription.
pub const TELEMETRY_PATH: &str = "/2022-07-01/telemetry";
/// The extension's name (must be its file name in /opt/extensions).
pub const NAME_HEADER: &str = "Lambda-Extension-Name";
/// The id Lambda gives at registration, sent with every later request.
pub const ID_HEADER: &str = "Lambda-Extension-Identifier";
/// The error type of an init or exit error.
pub const ERROR_TYPE_HEADER: &str = "Lambda-Extension-Function-Error-Type";

/// A failed Extensions or Telemetry API call.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The API answered, with a refusal.
    #[error("{what}: the API answered {status}: {body}")]
    Refused {
        /// The call.
        what: &'static str,
        /// Its HTTP status.
        status: StatusCode,
        /// Its body (the documented `{"errorType", "errorMessage"}` JSON, or anything).
        body: String,
    },
    /// No usable answer (connection, timeout, malformed response).
    #[error("{what}: {source}")]
    Transport {
        /// The call.
        what: &'static str,
        /// Why.
        source: BoxError,
    },
}

/// `POST register` for `events` (pure).
pub fn register_request(name: &str, events: &[&str]) -> Result<Request<Full<Bytes>>, http::Error> {
    Request::post(REGISTER_PATH)
        .header(NAME_HEADER, name)
        .header("Content-Type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::json!({ "events": events }).to_string(),
        )))
}

/// `POST init/error` with `message`: `lambda_extension`'s own request (path, id and error-type
/// headers, an `errorMessage`/`errorType`/`stackTrace` body) with the JSON content type added,
/// its in-memory body collected into this client's body type (no I/O).
pub async fn init_error_request(
    id: &str,
    error_type: &str,
    message: &str,
) -> Result<Request<Full<Bytes>>, BoxError> {
    let error = ErrorRequest {
        error_message: message,
        error_type,
        stack_trace: Vec::new(),
    };
    let (mut parts, body) = requests::init_error(id, error_type, Some(error))?.into_parts();
    parts.headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let body = body.collect().await?.to_bytes();
    Ok(Request::from_parts(parts, Full::new(body)))
}

/// `PUT telemetry` with a subscription body (pure).
pub fn subscribe_request(
    id: &str,
    subscription: &serde_json::Value,
) -> Result<Request<Full<Bytes>>, http::Error> {
    Request::put(TELEMETRY_PATH)
        .header(ID_HEADER, id)
        .header("Content-Type", "application/json")
        .body(Full::new(Bytes::from(subscription.to_string())))
}

/// A client of the Extensions API at `host:port`.
#[derive(Debug, Clone)]
pub struct ExtensionsApi {
    client: Client<HttpConnector, Full<Bytes>>,
    authority: String,
}

/// How long a request other than the event long poll may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl ExtensionsApi {
    /// A client of the API at `authority` (`host:port`, no scheme).
    pub fn new(authority: &str) -> ExtensionsApi {
        ExtensionsApi {
            client: Client::builder(TokioExecutor::new()).build_http(),
            authority: authority.to_owned(),
        }
    }

    /// Sends `req` (its path made absolute here); returns the status, headers and body.
    async fn call(
        &self,
        what: &'static str,
        req: Result<Request<Full<Bytes>>, http::Error>,
        limit: Option<Duration>,
    ) -> Result<(StatusCode, http::HeaderMap, Bytes), ApiError> {
        let transport = |source: BoxError| ApiError::Transport { what, source };
        let mut req = req.map_err(|e| transport(e.into()))?;
        let uri = format!("http://{}{}", self.authority, req.uri());
        *req.uri_mut() = uri
            .parse()
            .map_err(|e: http::uri::InvalidUri| transport(e.into()))?;
        let send = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| transport(e.into()))?;
            let (parts, body) = resp.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| transport(e.into()))?
                .to_bytes();
            Ok::<_, ApiError>((parts.status, parts.headers, body))
        };
        match limit {
            Some(limit) => tokio::time::timeout(limit, send)
                .await
                .map_err(|e| transport(e.into()))?,
            None => send.await,
        }
    }

    fn refused(what: &'static str, status: StatusCode, body: &Bytes) -> ApiError {
        ApiError::Refused {
            what,
            status,
            body: String::from_utf8_lossy(body).into_owned(),
        }
    }

    /// Registers `name` for `events`; returns the extension id.
    pub async fn register(&self, name: &str, events: &[&str]) -> Result<String, ApiError> {
        let what = "register";
        let (status, headers, body) = self
            .call(what, register_request(name, events), Some(CALL_TIMEOUT))
            .await?;
        if !status.is_success() {
            return Err(Self::refused(what, status, &body));
        }
        headers
            .get(ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| ApiError::Transport {
                what,
                source: format!("no {ID_HEADER} header in the answer").into(),
            })
    }

    /// Waits for the next lifecycle event.
    pub async fn next_event(&self, id: &str) -> Result<NextEvent, ApiError> {
        let what = "event/next";
        let req = Request::get(NEXT_PATH)
            .header(ID_HEADER, id)
            .body(Full::new(Bytes::new()));
        let (status, _, body) = self.call(what, req, None).await?;
        if !status.is_success() {
            return Err(Self::refused(what, status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| ApiError::Transport {
            what,
            source: e.into(),
        })
    }

    /// Reports an init error: Lambda fails the init phase with `message`.
    pub async fn init_error(
        &self,
        id: &str,
        error_type: &str,
        message: &str,
    ) -> Result<(), ApiError> {
        let what = "init/error";
        let req = init_error_request(id, error_type, message)
            .await
            .map_err(|source| ApiError::Transport { what, source })?;
        let (status, _, body) = self.call(what, Ok(req), Some(CALL_TIMEOUT)).await?;
        if !status.is_success() {
            return Err(Self::refused(what, status, &body));
        }
        Ok(())
    }

    /// Subscribes to the Telemetry API. A 2xx answer whose body carries an `errorType` (how
    /// AWS's Managed Instances emulator says `Telemetry.NotSupported`, `rapi/handler/
    /// runtimelogs_stub.go`) is a refusal too.
    pub async fn subscribe_telemetry(
        &self,
        id: &str,
        subscription: &serde_json::Value,
    ) -> Result<(), ApiError> {
        let what = "telemetry subscription";
        let req = subscribe_request(id, subscription);
        let (status, _, body) = self.call(what, req, Some(CALL_TIMEOUT)).await?;
        let error_type = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .is_some_and(|v| v.get("errorType").is_some());
        if !status.is_success() || error_type {
            return Err(Self::refused(what, status, &body));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[tokio::test]
    async fn requests_carry_the_documented_paths_and_headers() {
        let r = register_request("flightlock", &["SHUTDOWN"]).unwrap();
        assert_eq!(r.method(), Method::POST);
        assert_eq!(r.uri(), REGISTER_PATH);
        assert_eq!(r.headers()[NAME_HEADER], "flightlock");
        let r = init_error_request("id-1", "Extension.ConfigInvalid", "bad")
            .await
            .unwrap();
        assert_eq!(r.method(), Method::POST);
        assert_eq!(r.uri(), INIT_ERROR_PATH);
        assert_eq!(r.headers()[ID_HEADER], "id-1");
        assert_eq!(r.headers()[ERROR_TYPE_HEADER], "Extension.ConfigInvalid");
        assert_eq!(r.headers()[http::header::CONTENT_TYPE], "application/json");
        let body: serde_json::Value =
            serde_json::from_slice(&r.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "errorMessage": "bad",
                "errorType": "Extension.ConfigInvalid",
                "stackTrace": [],
            })
        );
        let r = subscribe_request("id-1", &serde_json::json!({})).unwrap();
        assert_eq!(r.method(), Method::PUT);
        assert_eq!(r.uri(), TELEMETRY_PATH);
    }
}
