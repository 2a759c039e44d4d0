//! Which Lambda execution mode the extension runs in, and what that changes. Pure: it reads an
//! environment map.
//!
//! | | standard (on-demand, provisioned, SnapStart) | Lambda Managed Instances |
//! |---|---|---|
//! | `AWS_LAMBDA_INITIALIZATION_TYPE` | `on-demand`, `provisioned-concurrency`, `snap-start` or unset | `lambda-managed-instances` |
//! | events registered | `INVOKE`, `SHUTDOWN` | `SHUTDOWN` only: the Extensions API refuses `INVOKE` there |
//! | invocations at once | one; the sandbox freezes between them | up to `AWS_LAMBDA_MAX_CONCURRENCY`, from several runtime processes; never frozen |
//! | crash watch of an invocation | started by its `INVOKE` event | started by the proxy when it hands the event to a runtime process |
//! | unenforced invocations | an `INVOKE` the proxy did not see | a Telemetry API `platform.start` the proxy did not see |
//!
//! Sources: the Managed Instances refusal of `INVOKE` is in AWS's own emulator
//! (aws/aws-lambda-runtime-interface-emulator, `internal/lambda-managed-instances/core/
//! externalagent.go`, `ValidateExternalAgentEvent` accepts `SHUTDOWN` only, and `rapi/handler/
//! agentregister.go` answers 403 `Extension.InvalidEventType`), and it is what
//! open-telemetry/opentelemetry-lambda PR #2083 and honeycombio/honeycomb-lambda-extension PR #170
//! fixed in their extensions.

use std::collections::HashMap;

/// Lambda's variable naming how the environment was initialized.
pub const INITIALIZATION_TYPE: &str = "AWS_LAMBDA_INITIALIZATION_TYPE";
/// Its value on Lambda Managed Instances.
pub const MANAGED_INSTANCES: &str = "lambda-managed-instances";
/// Lambda's variable giving the invocations an environment runs at once (Managed Instances).
pub const MAX_CONCURRENCY: &str = "AWS_LAMBDA_MAX_CONCURRENCY";
/// The proxy's connection cap when the environment does not ask for more.
pub const DEFAULT_CONNECTIONS: usize = 256;

/// The execution mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One invocation at a time per environment, frozen between invocations.
    Standard,
    /// Lambda Managed Instances: many invocations at once, several runtime processes, no
    /// `INVOKE` events, no freeze.
    ManagedInstances,
}

impl Mode {
    /// The mode named by `AWS_LAMBDA_INITIALIZATION_TYPE` in `env`.
    pub fn from_env(env: &HashMap<String, String>) -> Mode {
        match env.get(INITIALIZATION_TYPE).map(|v| v.trim()) {
            Some(v) if v.eq_ignore_ascii_case(MANAGED_INSTANCES) => Mode::ManagedInstances,
            _ => Mode::Standard,
        }
    }

    /// The Extensions API events to register for.
    pub fn events(self) -> &'static [&'static str] {
        match self {
            Mode::Standard => &["INVOKE", "SHUTDOWN"],
            Mode::ManagedInstances => &["SHUTDOWN"],
        }
    }

    /// A short name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Standard => "standard",
            Mode::ManagedInstances => "lambda-managed-instances",
        }
    }
}

/// How many runtime connections the proxy serves at once (pure): the default, or room for
/// every invocation `AWS_LAMBDA_MAX_CONCURRENCY` allows to be in flight with its `GET next` and
/// its answer on separate connections, whichever is more. A value that is not a number is
/// Lambda's to get right: the default then.
pub fn connection_cap(env: &HashMap<String, String>) -> usize {
    env.get(MAX_CONCURRENCY)
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(DEFAULT_CONNECTIONS, |n| {
            DEFAULT_CONNECTIONS.max(n.saturating_mul(2).saturating_add(16))
        })
}

/// The `errorType` and `errorMessage` of an Extensions API error body, as one line (pure). A body
/// that is not the documented JSON is quoted as it is (shortened).
pub fn error_summary(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    match (field("errorType"), field("errorMessage")) {
        (Some(t), Some(m)) => format!("{t}: {m}"),
        (Some(t), None) => t,
        (None, Some(m)) => m,
        (None, None) => {
            let short: String = body.chars().take(200).collect();
            format!("{short:?}")
        }
    }
}

/// The init error for a registration the Extensions API refused (pure): what was asked, what
/// the platform answered, and what to do.
pub fn registration_refused(
    mode: Mode,
    env: &HashMap<String, String>,
    status: u16,
    body: &str,
) -> String {
    let asked = mode.events().join(", ");
    let answer = error_summary(body);
    let init_type = env
        .get(INITIALIZATION_TYPE)
        .map_or_else(|| "is not set".to_owned(), |v| format!("is {v:?}"));
    let fix = if mode == Mode::Standard && body.contains("InvalidEventType") {
        format!(
            "this platform refuses INVOKE as Lambda Managed Instances does, but {INITIALIZATION_TYPE} \
             {init_type}; flightlock registers for SHUTDOWN only when it is {MANAGED_INSTANCES:?}. \
             If this is a Managed Instances environment, report it with this message; otherwise \
             detach the flightlock layer until this execution mode is supported"
        )
    } else if body.contains("InvalidExtensionName") {
        "the extension's file name must be its registered name: keep the layer's \
         /opt/extensions/flightlock as it is"
            .to_owned()
    } else {
        format!(
            "flightlock cannot run in this execution environment ({INITIALIZATION_TYPE} \
             {init_type}); detach the layer or report this message"
        )
    };
    format!(
        "the Lambda Extensions API refused to register flightlock for [{asked}] \
         ({status} {answer}): {fix}. Nothing was gated: the function did not start."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_mode_comes_from_the_initialization_type() {
        assert_eq!(Mode::from_env(&env(&[])), Mode::Standard);
        for v in ["on-demand", "provisioned-concurrency", "snap-start", ""] {
            assert_eq!(
                Mode::from_env(&env(&[(INITIALIZATION_TYPE, v)])),
                Mode::Standard
            );
        }
        assert_eq!(
            Mode::from_env(&env(&[(INITIALIZATION_TYPE, "lambda-managed-instances")])),
            Mode::ManagedInstances
        );
        assert_eq!(Mode::Standard.events(), ["INVOKE", "SHUTDOWN"]);
        assert_eq!(Mode::ManagedInstances.events(), ["SHUTDOWN"]);
    }

    #[test]
    fn the_connection_cap_makes_room_for_the_allowed_concurrency() {
        assert_eq!(connection_cap(&env(&[])), 256);
        assert_eq!(connection_cap(&env(&[(MAX_CONCURRENCY, "64")])), 256);
        assert_eq!(connection_cap(&env(&[(MAX_CONCURRENCY, "1000")])), 2016);
        assert_eq!(connection_cap(&env(&[(MAX_CONCURRENCY, "lots")])), 256);
    }

    #[test]
    fn a_refused_registration_names_the_cause_and_the_fix() {
        let body = r#"{"errorType":"Extension.InvalidEventType","errorMessage":"INVOKE: invalid event type"}"#;
        let m = registration_refused(Mode::Standard, &env(&[]), 403, body);
        assert!(m.contains("[INVOKE, SHUTDOWN]"), "{m}");
        assert!(
            m.contains("403 Extension.InvalidEventType: INVOKE: invalid event type"),
            "{m}"
        );
        assert!(
            m.contains("AWS_LAMBDA_INITIALIZATION_TYPE is not set"),
            "{m}"
        );
        assert!(m.contains("\"lambda-managed-instances\""), "{m}");
        let m = registration_refused(
            Mode::ManagedInstances,
            &env(&[(INITIALIZATION_TYPE, MANAGED_INSTANCES)]),
            403,
            r#"{"errorType":"Extension.RegistrationClosed","errorMessage":"closed"}"#,
        );
        assert!(
            m.contains("[SHUTDOWN]") && m.contains("RegistrationClosed"),
            "{m}"
        );
        assert!(m.contains("detach the layer"), "{m}");
        let m = registration_refused(Mode::Standard, &env(&[]), 500, "<html>oops");
        assert!(m.contains("500 \"<html>oops\""), "{m}");
    }
}
