//! Responses the proxy makes up itself: DynamoDB-shaped errors and 502s.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use rand::Rng;

const JSON_1_0: &str = "application/x-amz-json-1.0";
const THROTTLE_TYPE: &str =
    "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException";
const THROTTLE_MESSAGE: &str = "The level of configured provisioned throughput for the table was \
     exceeded. Consider increasing your provisioning level with the UpdateTable API.";
const SERVER_ERROR_TYPE: &str = "com.amazonaws.dynamodb.v20120810#InternalServerError";
const SERVER_ERROR_MESSAGE: &str = "Internal server error";

/// DynamoDB's throttling error (HTTP 400, `ProvisionedThroughputExceededException`).
pub(crate) fn throttle() -> Response<Full<Bytes>> {
    dynamodb_error(StatusCode::BAD_REQUEST, THROTTLE_TYPE, THROTTLE_MESSAGE)
}

/// DynamoDB's internal error (HTTP 500, `InternalServerError`).
pub(crate) fn server_error() -> Response<Full<Bytes>> {
    dynamodb_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        SERVER_ERROR_TYPE,
        SERVER_ERROR_MESSAGE,
    )
}

/// A `502 Bad Gateway` for upstream failures (the SDK treats it as transient).
pub(crate) fn bad_gateway(message: &str) -> Response<Full<Bytes>> {
    tracing::warn!(message, "fault proxy: bad gateway");
    let mut response = Response::new(Full::new(Bytes::from(format!("fault proxy: {message}"))));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

/// A response shaped exactly like a DynamoDB error.
fn dynamodb_error(status: StatusCode, error_type: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "__type": error_type, "message": message }).to_string();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(JSON_1_0));
    if let Ok(id) = HeaderValue::from_str(&request_id()) {
        headers.insert("x-amzn-requestid", id);
    }
    response
}

/// A random request id in DynamoDB's style (52 upper-case alphanumerics).
fn request_id() -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..52)
        .map(|_| char::from(CHARS[rng.random_range(0..CHARS.len())]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_look_like_dynamodb() {
        let id = request_id();
        assert_eq!(id.len(), 52);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()));
        assert_ne!(id, request_id());
    }
}
