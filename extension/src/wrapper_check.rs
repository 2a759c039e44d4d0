//! The init check that the wrapper is configured: an extension without it gates nothing, and
//! every invocation would run unlocked. Pure: it reads an environment map.
//!
//! On a managed runtime (Lambda sets `AWS_EXECUTION_ENV`, e.g. `AWS_Lambda_python3.12`), the
//! runtime is started through `AWS_LAMBDA_EXEC_WRAPPER` if it is set; it must be the flightlock
//! wrapper. OS-only runtimes (`provided.*`: no `AWS_EXECUTION_ENV`) ignore that variable and start
//! the wrapper from their own `bootstrap`, which init cannot see: the per-invocation check covers
//! them. `FLIGHTLOCK_WRAPPER_CHECK=off` skips this check for setups that chain wrappers and run
//! ours from another one.

use std::collections::HashMap;
use std::path::Path;

use flightlock_lambda::config::WRAPPER_CHECK;

use crate::config::Settings;

/// Lambda's variable naming a managed runtime.
pub const EXECUTION_ENV: &str = "AWS_EXECUTION_ENV";
/// Lambda's variable naming the exec wrapper of a managed runtime.
pub const EXEC_WRAPPER: &str = "AWS_LAMBDA_EXEC_WRAPPER";
/// Where the layer puts the wrapper.
pub const WRAPPER_PATH: &str = "/opt/flightlock-wrapper";

/// `Err(message)` if the function runs a managed runtime that will not start through the
/// flightlock wrapper; the message says what to set.
pub fn check(env: &HashMap<String, String>, settings: &Settings) -> Result<(), String> {
    if !settings.wrapper_check {
        return Ok(());
    }
    let Some(runtime) = env.get(EXECUTION_ENV).filter(|v| !v.trim().is_empty()) else {
        return Ok(());
    };
    let wrapper = env.get(EXEC_WRAPPER).map(|v| v.trim()).unwrap_or_default();
    let is_ours = Path::new(wrapper)
        .file_name()
        .is_some_and(|n| n == "flightlock-wrapper");
    if is_ours {
        return Ok(());
    }
    let found = if wrapper.is_empty() {
        "is not set".to_owned()
    } else {
        format!("is {wrapper:?}")
    };
    Err(format!(
        "{EXEC_WRAPPER} {found}, so the {runtime} runtime would not go through the flightlock \
         proxy and every invocation would run WITHOUT the lock: set \
         {EXEC_WRAPPER}={WRAPPER_PATH} on the function (if another wrapper runs \
         {WRAPPER_PATH} itself, set {WRAPPER_CHECK}=off)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = [
            ("FLIGHTLOCK_TABLE", "locks"),
            ("AWS_LAMBDA_FUNCTION_NAME", "f"),
        ]
        .iter()
        .chain(pairs)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        m.retain(|_, v| !v.is_empty());
        m
    }

    fn run(pairs: &[(&str, &str)]) -> Result<(), String> {
        let e = env(pairs);
        check(&e, &Settings::from_map(&e).unwrap())
    }

    #[test]
    fn a_managed_runtime_needs_the_wrapper() {
        let py = (EXECUTION_ENV, "AWS_Lambda_python3.12");
        let e = run(&[py]).unwrap_err();
        assert!(e.contains("AWS_LAMBDA_EXEC_WRAPPER is not set"), "{e}");
        assert!(
            e.contains("AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper"),
            "{e}"
        );
        assert!(e.contains("FLIGHTLOCK_WRAPPER_CHECK=off"), "{e}");
        let e = run(&[py, (EXEC_WRAPPER, "/opt/otel-handler")]).unwrap_err();
        assert!(e.contains("\"/opt/otel-handler\""), "{e}");
        run(&[py, (EXEC_WRAPPER, "/opt/flightlock-wrapper")]).unwrap();
        // Chained wrappers, on purpose.
        run(&[
            py,
            (EXEC_WRAPPER, "/opt/otel-handler"),
            ("FLIGHTLOCK_WRAPPER_CHECK", "off"),
        ])
        .unwrap();
    }

    #[test]
    fn os_only_runtimes_are_left_to_the_per_invocation_check() {
        run(&[]).unwrap();
        run(&[(EXECUTION_ENV, "")]).unwrap();
    }
}
