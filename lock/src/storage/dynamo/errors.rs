//! What an SDK error means for the protocol: retry, or a fatal error that names the fix.

use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};

use super::Dynamo;
use crate::error::{BoxError, Error};
use crate::storage::Failure;

impl Dynamo {
    /// Maps an SDK error to retry-or-fatal, with actionable messages for what a user must fix.
    pub(crate) fn classify<E>(
        &self,
        operation: &'static str,
        err: SdkError<E, aws_smithy_runtime_api::http::Response>,
    ) -> Failure
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let status = err.raw_response().map(|r| r.status().as_u16());
        if status.is_none() && !self.answered.load(Ordering::Relaxed) {
            if let Some(e) = crate::error::setup_error(&err) {
                return Failure::Fatal(e);
            }
        }
        let code = err.code().unwrap_or_default().to_owned();
        let message = err.message().unwrap_or_default().to_owned();
        enum Kind {
            Retry(bool),
            NotFound,
            Denied,
            Other,
        }
        let kind = match code.as_str() {
            "ResourceNotFoundException" => Kind::NotFound,
            "AccessDeniedException"
            | "UnrecognizedClientException"
            | "InvalidSignatureException"
            | "MissingAuthenticationTokenException"
            | "ExpiredTokenException" => Kind::Denied,
            "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded"
            | "LimitExceededException" => Kind::Retry(true),
            "InternalServerError"
            | "ServiceUnavailable"
            | "TransactionInProgressException"
            // A single-item write to an item an ongoing transaction is writing (the seat lives
            // on the counter, which every enqueue transaction updates).
            | "TransactionConflictException" => {
                Kind::Retry(false)
            }
            _ if status.is_some_and(|s| s >= 500) => Kind::Retry(false),
            _ if status.is_none() => Kind::Retry(false), // timeouts, refused or dropped connections
            _ => Kind::Other,
        };
        match kind {
            Kind::Retry(throttled) => Failure::Retry {
                throttled,
                operation,
                source: Box::new(ServiceError {
                    code,
                    message,
                    source: Box::new(err),
                }),
            },
            Kind::NotFound => Failure::Fatal(Error::TableNotFound {
                table: self.table.to_string(),
            }),
            Kind::Denied => Failure::Fatal(Error::AccessDenied {
                operation,
                table: self.table.to_string(),
                message: if message.is_empty() { code } else { message },
            }),
            Kind::Other => Failure::Fatal(Error::Dynamo {
                operation,
                source: Box::new(ServiceError {
                    code,
                    message,
                    source: Box::new(err),
                }),
            }),
        }
    }
}

/// An SDK error shown the way a person wants to read it (`Code: message`), keeping the SDK's
/// error as its source.
#[derive(Debug)]
pub(crate) struct ServiceError {
    code: String,
    message: String,
    source: BoxError,
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code.is_empty(), self.message.is_empty()) {
            (false, false) => write!(f, "{}: {}", self.code, self.message),
            (false, true) => f.write_str(&self.code),
            _ => {
                // No service code (a connection or timeout failure): the chain of causes, each
                // once, e.g. "dispatch failure: io error: ...: Connection refused (os error 111)".
                let mut parts: Vec<String> = Vec::new();
                let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&*self.source);
                while let Some(e) = next {
                    let s = e.to_string();
                    if parts.last() != Some(&s) {
                        parts.push(s);
                    }
                    next = e.source();
                }
                f.write_str(&parts.join(": "))
            }
        }
    }
}

/// The SDK error is kept for `Debug`; the display above already carries its causes.
impl std::error::Error for ServiceError {}

pub(crate) fn fatal_build(
    operation: &'static str,
    e: aws_sdk_dynamodb::error::BuildError,
) -> Failure {
    Failure::Fatal(Error::Dynamo {
        operation,
        source: Box::new(e),
    })
}
