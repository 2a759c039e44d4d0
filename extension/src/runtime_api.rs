//! The Runtime API as the proxy sees it: paths, header names and route classification (pure).

use http::Method;

/// Request id of the invocation (on `GET .../invocation/next` responses).
pub const REQUEST_ID_HEADER: &str = "lambda-runtime-aws-request-id";
/// Invocation deadline, epoch milliseconds (on `GET .../invocation/next` responses).
pub const DEADLINE_HEADER: &str = "lambda-runtime-deadline-ms";
/// Tenant id of the invocation, on `GET .../invocation/next` responses of a function in tenant
/// isolation mode (`TenantIsolationMode=PER_TENANT`; AWS Lambda developer guide, "Tenant
/// isolation"; read as `lambda-runtime-aws-tenant-id` by aws-lambda-rust-runtime and
/// aws-lambda-cpp).
pub const TENANT_HEADER: &str = "lambda-runtime-aws-tenant-id";
/// The invocation's X-Ray trace header (`Root=1-...;Parent=...;Sampled=0|1`), on
/// `GET .../invocation/next` responses.
pub const TRACE_ID_HEADER: &str = "lambda-runtime-trace-id";
/// Error type of an invocation error (on `POST .../error`).
pub const ERROR_TYPE_HEADER: &str = "lambda-runtime-function-error-type";
/// The Runtime API version the proxy answers for.
pub const VERSION: &str = "2018-06-01";

/// What a runtime request is, for the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET /2018-06-01/runtime/invocation/next`: the runtime asks for an event.
    Next,
    /// `POST /2018-06-01/runtime/invocation/{id}/response`.
    Response(String),
    /// `POST /2018-06-01/runtime/invocation/{id}/error`.
    Error(String),
    /// `GET /2018-06-01/runtime/restore/next`: a SnapStart runtime, init done, waits for the
    /// snapshot to be restored, and is answered (200) in each restored environment. Served only
    /// when init is for a snapshot (the emulator's router in aws/aws-lambda-runtime-interface-
    /// emulator; called by awslambdaric's `restore_next` and aws-lambda-java-libs'
    /// `restoreNext`); AWS's SnapStart pages describe the language hooks around it.
    RestoreNext,
    /// Anything else (`/runtime/init/error`, future paths): passed through unchanged.
    Other,
}

/// Classifies a request by method and path.
pub fn route(method: &Method, path: &str) -> Route {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        (&Method::GET, [_version, "runtime", "invocation", "next"]) => Route::Next,
        (&Method::GET, [_version, "runtime", "restore", "next"]) => Route::RestoreNext,
        (&Method::POST, [_version, "runtime", "invocation", id, "response"]) if !id.is_empty() => {
            Route::Response((*id).to_owned())
        }
        (&Method::POST, [_version, "runtime", "invocation", id, "error"]) if !id.is_empty() => {
            Route::Error((*id).to_owned())
        }
        _ => Route::Other,
    }
}

/// Path of the response of invocation `id`.
pub fn response_path(id: &str) -> String {
    format!("/{VERSION}/runtime/invocation/{id}/response")
}

/// Path of the error of invocation `id`.
pub fn error_path(id: &str) -> String {
    format!("/{VERSION}/runtime/invocation/{id}/error")
}

/// True if `id` can be used as a path segment of the Runtime API (non-empty, visible ASCII, no
/// `/`, `?`, `#`, `%` or a backslash). Pure.
pub fn usable_request_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'%' | b'\\'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route(&Method::GET, "/2018-06-01/runtime/invocation/next"),
            Route::Next
        );
        assert_eq!(
            route(&Method::POST, "/2018-06-01/runtime/invocation/abc/response"),
            Route::Response("abc".into())
        );
        assert_eq!(
            route(&Method::POST, "/2018-06-01/runtime/invocation/abc/error"),
            Route::Error("abc".into())
        );
        assert_eq!(
            route(&Method::POST, "/2018-06-01/runtime/init/error"),
            Route::Other
        );
        assert_eq!(
            route(&Method::GET, "/2018-06-01/runtime/restore/next"),
            Route::RestoreNext
        );
        assert_eq!(
            route(&Method::POST, "/2018-06-01/runtime/restore/error"),
            Route::Other
        );
        assert_eq!(
            route(&Method::POST, "/2018-06-01/runtime/invocation/next"),
            Route::Other
        );
        assert_eq!(
            route(&Method::GET, "/2018-06-01/runtime/invocation//response"),
            Route::Other
        );
        assert_eq!(
            response_path("x"),
            "/2018-06-01/runtime/invocation/x/response"
        );
        assert_eq!(error_path("x"), "/2018-06-01/runtime/invocation/x/error");
    }

    #[test]
    fn request_ids_must_be_path_segments() {
        assert!(usable_request_id("8476a536-e9f4-11e8-9739-2dfe598c3fcd"));
        assert!(usable_request_id("req-1"));
        for bad in ["", "a/b", "a b", "a?b", "a#b", "a%2Fb", "..\\x", "é"] {
            assert!(!usable_request_id(bad), "{bad:?}");
        }
        assert!(!usable_request_id(&"x".repeat(257)));
    }
}
