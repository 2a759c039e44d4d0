//! End-to-end harness: emulated Lambda execution environments, each one Runtime Interface
//! Emulator (RIE) with its own `/opt` (the flightlock layer, or nothing), the real extension
//! binary and a real runtime (`awslambdaric` for Python, `aws-lambda-ric` for Node.js, a bash +
//! curl custom runtime, `lambda_runtime` for Rust), against DynamoDB Local.
//!
//! Running them (from the repository root):
//!
//! ```text
//! cargo build --workspace --bins          # the tests start target/debug/{flightlock-extension,demo-rust}
//! eval "$(scripts/e2e-tools)"             # installs RIE + awslambdaric, exports FLIGHTLOCK_RIE / FLIGHTLOCK_PYTHON
//! eval "$(scripts/node-tools)"            # installs the npm aws-lambda-ric, exports FLIGHTLOCK_NODE_RIC
//! scripts/dynamodb-local run -- cargo test -p flightlock-e2e
//! ```
//!
//! The tests are one test binary, `tests/e2e/main.rs`, with a module per group; a filter runs one
//! group (`cargo test -p flightlock-e2e --test e2e platform_modes::`).
//!
//! Each [`Env`] runs in a private mount namespace and PID namespace (`unshare --mount --pid
//! --fork --mount-proc --kill-child`, as root): its `/opt` is a bind mount of a temporary
//! directory laid out like the layer, and dropping the `Env` kills the whole namespace (RIE,
//! extension, runtime).
//! Where RIE cannot go (several invocations or runtime processes in one environment, freeze,
//! refusals, SnapStart restore, the tenant header), [`platform`] is a Lambda platform double that
//! follows each execution mode's documented rules and refuses what Lambda refuses, and
//! [`sandbox`] starts the real extension and wrapped runtime processes on it.
//!
//! Every port is on 127.0.0.1: RIE's invoke endpoint (`--runtime-interface-emulator-address`),
//! its Runtime API (`--runtime-api-address`) and the flightlock proxy (`FLIGHTLOCK_PROXY_PORT`).

// Test support: panicking with a clear message is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub use flightlock_testkit::platform;
mod rounds;
pub mod sandbox;

pub use rounds::{
    check_skip_round, fifo_round, finish, invoke_all, record_file, skip_rounds, start_all, stop_all,
};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Env var with the path of the RIE binary (set by `scripts/e2e-tools`).
pub const RIE_ENV: &str = "FLIGHTLOCK_RIE";
/// Env var with the venv python that has `awslambdaric` (set by `scripts/e2e-tools`).
pub const PYTHON_ENV: &str = "FLIGHTLOCK_PYTHON";
/// Env var with the npm `aws-lambda-ric` entry point (set by `scripts/node-tools`).
pub const NODE_RIC_ENV: &str = "FLIGHTLOCK_NODE_RIC";
/// Env var with a `node_modules` holding `@aws-lambda-powertools/batch` (set by
/// `scripts/node-tools`).
pub const NODE_POWERTOOLS_ENV: &str = "FLIGHTLOCK_NODE_POWERTOOLS";
/// Env var with a directory holding aws-lambda-powertools (`pip install --target`, set by
/// `scripts/client-python-tools`): the Powertools handler's own dependencies.
pub const POWERTOOLS_ENV: &str = "FLIGHTLOCK_POWERTOOLS_PATH";
/// Env var with the Go runtime `tests/e2e/runtimes/go` built (set by `scripts/go-tools`).
pub const GO_RUNTIME_ENV: &str = "FLIGHTLOCK_GO_RUNTIME";

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A binary of the workspace, built by `cargo build --workspace --bins`.
pub fn workspace_bin(name: &str) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("target"));
    let path = target.join("debug").join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the workspace binaries first with `cargo build --workspace --bins`",
        path.display()
    );
    path
}

fn tool(var: &str) -> PathBuf {
    let script = match var {
        NODE_RIC_ENV => "scripts/node-tools",
        GO_RUNTIME_ENV => "scripts/go-tools",
        _ => "scripts/e2e-tools",
    };
    let path = std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run `eval \"$({script})\"` first (it installs the tool into .tools/ and exports {var})")
    });
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "{var}={} does not exist; re-run `eval \"$({script})\"`",
        path.display()
    );
    path
}

pub use flightlock_testkit::free_port;

/// Copies the Python client (`clients/python/src/flightlock`) into `opt` as the layer zip
/// carries it (`python/flightlock`, Makefile `zip_layer`), which Lambda mounts as
/// `/opt/python/flightlock`.
pub fn layer_python_client(opt: &Path) {
    let to = opt.join("python/flightlock");
    std::fs::create_dir_all(&to).unwrap();
    for file in std::fs::read_dir(repo_root().join("clients/python/src/flightlock")).unwrap() {
        let file = file.unwrap().path();
        if file.is_file() {
            std::fs::copy(&file, to.join(file.file_name().unwrap())).unwrap();
        }
    }
}

/// A fresh lock table on DynamoDB Local; returns (endpoint, table).
pub async fn table(prefix: &str) -> (String, String) {
    let fresh = flightlock_testkit::fresh_table(prefix).await;
    (fresh.endpoint, fresh.table)
}

/// What runs as the function.
#[derive(Debug, Clone)]
pub enum Runtime {
    /// `functions/demo-python/handler.py` under `awslambdaric`.
    Python,
    /// `demo-rust` (a `lambda_runtime` function).
    Rust,
    /// `demo-rust` with the in-process tower layer (`DEMO_IN_PROCESS_LOCK=1`).
    RustInProcess,
    /// `tests/e2e/runtimes/raw_runtime.py`, a bare stdlib client that records raw events.
    Raw,
    /// `tests/e2e/runtimes/node_handler.mjs` under the npm `aws-lambda-ric` on Node.js.
    Node,
    /// `tests/e2e/runtimes/go` built as `bootstrap`: an OS-only runtime (`provided.al2023`) in Go,
    /// started through the wrapper, whose client context Go's `encoding/json` reads into the
    /// shape aws-lambda-go declares.
    Go,
    /// `tests/e2e/runtimes/curl_bootstrap.sh` as `bootstrap`: a bash + curl custom runtime as in
    /// the AWS tutorial, one short-lived curl process per Runtime API request.
    Curl,
    /// `tests/e2e/runtimes/records_handler.py` under `awslambdaric`: the SQS recipe's batch
    /// handler (`docs/src/recipes/sqs/sqs_batch.py`), the very file the guide includes, with the
    /// client `flightlock` imported from the layer's `/opt/python` ([`layer_python_client`]).
    PythonRecords,
    /// `tests/e2e/runtimes/records_handler.mjs` under `aws-lambda-ric`: the same with the
    /// Node.js recipe (`sqs_batch.mjs`), which imports the package `flightlock` from the layer's
    /// `/opt/nodejs/node_modules` ([`layer_node_client`]).
    NodeRecords,
    /// `tests/e2e/runtimes/powertools_handler.mjs` under `aws-lambda-ric`: the SQS recipe's FIFO
    /// consumer on Powertools' `SqsFifoPartialProcessorAsync`
    /// (`docs/src/recipes/sqs/sqs_fifo_powertools.mjs`), `flightlock/powertools` imported from
    /// the layer and Powertools from the function's `node_modules` ([`NODE_POWERTOOLS_ENV`]).
    NodePowertools,
    /// `tests/e2e/runtimes/powertools_handler.py` under `awslambdaric`: the SQS recipe's FIFO
    /// consumer on Powertools' `SqsFifoPartialProcessor` with `flightlock.powertools`
    /// (`docs/src/recipes/sqs/sqs_fifo_powertools.py`), the client imported from the layer's
    /// `/opt/python` and Powertools from [`POWERTOOLS_ENV`].
    PythonPowertools,
    /// `tests/e2e/runtimes/kinesis_powertools_handler.py` under `awslambdaric`: the SQS recipe's
    /// Kinesis consumer on Powertools' `BatchProcessor` with `flightlock.powertools`
    /// (`docs/src/recipes/sqs/kinesis_powertools.py`), imported as for [`Runtime::PythonPowertools`].
    PythonKinesisPowertools,
    /// `tests/e2e/runtimes/records_bootstrap.sh`: a bash + curl custom runtime whose handler
    /// locks one key per event with the guide's shell client
    /// (`docs/src/guide/lock-api/flightlock_locks.sh`).
    CurlRecords,
}

/// The files the guide includes and the batch handlers run, copied into every task directory
/// (source in the repository, name in the task directory).
pub const RECORD_FILES: &[(&str, &str)] = &[
    (
        "docs/src/guide/lock-api/flightlock_locks.sh",
        "flightlock_locks.sh",
    ),
    (
        "tests/e2e/runtimes/records_bootstrap.sh",
        "records_bootstrap.sh",
    ),
    ("docs/src/recipes/sqs/sqs_batch.py", "sqs_batch.py"),
    ("docs/src/recipes/sqs/sqs_batch.mjs", "sqs_batch.mjs"),
    (
        "docs/src/recipes/sqs/sqs_fifo_powertools.mjs",
        "sqs_fifo_powertools.mjs",
    ),
    (
        "tests/e2e/runtimes/powertools_handler.mjs",
        "powertools_handler.mjs",
    ),
    (
        "tests/e2e/runtimes/records_handler.py",
        "records_handler.py",
    ),
    (
        "tests/e2e/runtimes/powertools_handler.py",
        "powertools_handler.py",
    ),
    (
        "docs/src/recipes/sqs/sqs_fifo_powertools.py",
        "sqs_fifo_powertools.py",
    ),
    (
        "tests/e2e/runtimes/kinesis_powertools_handler.py",
        "kinesis_powertools_handler.py",
    ),
    (
        "docs/src/recipes/sqs/kinesis_powertools.py",
        "kinesis_powertools.py",
    ),
    (
        "tests/e2e/runtimes/records_handler.mjs",
        "records_handler.mjs",
    ),
];

/// How an environment is laid out.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Function name (`AWS_LAMBDA_FUNCTION_NAME`, the default key).
    pub function: String,
    /// The runtime.
    pub runtime: Runtime,
    /// Install the layer's extension in `/opt/extensions`.
    pub extension: bool,
    /// Start the runtime through `/opt/flightlock-wrapper` (as `AWS_LAMBDA_EXEC_WRAPPER` does).
    pub wrapper: bool,
    /// Function timeout, seconds (`AWS_LAMBDA_FUNCTION_TIMEOUT`, which RIE turns into deadlines).
    pub timeout_secs: u64,
    /// Extra environment (`FLIGHTLOCK_*` and others).
    pub env: Vec<(String, String)>,
}

impl Spec {
    /// The layer attached, started through the wrapper.
    pub fn layered(function: &str, runtime: Runtime) -> Spec {
        Spec {
            function: function.to_owned(),
            runtime,
            extension: true,
            wrapper: true,
            timeout_secs: 30,
            env: Vec::new(),
        }
    }

    /// Adds an environment variable.
    pub fn with(mut self, k: &str, v: &str) -> Spec {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }
}

/// One emulated execution environment.
pub struct Env {
    /// Name (for records and messages).
    pub name: String,
    /// The RIE invoke port.
    pub port: u16,
    /// The flightlock proxy port (`FLIGHTLOCK_PROXY_PORT`).
    pub proxy_port: u16,
    /// The environment's private directory (its /opt, task dir, log).
    pub dir: PathBuf,
    /// Its `AWS_SESSION_TOKEN` (the extension and the runtime see it; callers of the lock API
    /// send it).
    pub session_token: String,
    child: tokio::process::Child,
}

/// The response of an invocation.
#[derive(Debug)]
pub struct Invoked {
    /// HTTP status from RIE.
    pub status: u16,
    /// Response headers.
    pub headers: http::HeaderMap,
    /// Body bytes.
    pub body: Bytes,
    /// The environment's name and log when the body was empty (what to show if a test needs it).
    context: Option<String>,
}

impl Invoked {
    /// The body as JSON (panics with the body if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response (status {}) is not JSON ({e}): {}{}",
                self.status,
                String::from_utf8_lossy(&self.body[..self.body.len().min(500)]),
                self.context.as_deref().unwrap_or_default()
            )
        })
    }
}

impl Env {
    /// Lays out and starts an environment; returns once RIE accepts connections.
    pub async fn start(name: &str, spec: &Spec, endpoint: &str, table: &str, record: &Path) -> Env {
        let rie = tool(RIE_ENV);
        let dir = std::env::temp_dir().join(format!(
            "flightlock-e2e-{}-{name}-{:08x}",
            std::process::id(),
            rand_u32()
        ));
        let opt = dir.join("opt");
        let task = dir.join("task");
        std::fs::create_dir_all(&task).unwrap();
        std::fs::create_dir_all(&opt).unwrap();
        if spec.extension {
            std::fs::create_dir_all(opt.join("extensions")).unwrap();
            // Copied, not linked: Lambda names the extension after its file, and the layer
            // ships the binary as /opt/extensions/flightlock.
            std::fs::copy(
                workspace_bin("flightlock-extension"),
                opt.join("extensions/flightlock"),
            )
            .unwrap();
            layer_node_client(&opt);
            layer_python_client(&opt);
        }
        std::fs::copy(
            repo_root().join("extension/layer/flightlock-wrapper"),
            opt.join("flightlock-wrapper"),
        )
        .unwrap();
        std::fs::copy(
            repo_root().join("functions/demo-python/handler.py"),
            task.join("handler.py"),
        )
        .unwrap();
        std::fs::copy(
            repo_root().join("tests/e2e/runtimes/raw_runtime.py"),
            task.join("raw_runtime.py"),
        )
        .unwrap();
        std::fs::copy(
            repo_root().join("tests/e2e/runtimes/curl_bootstrap.sh"),
            task.join("bootstrap"),
        )
        .unwrap();
        std::fs::copy(
            repo_root().join("tests/e2e/runtimes/node_handler.mjs"),
            task.join("handler.mjs"),
        )
        .unwrap();
        for (from, to) in RECORD_FILES {
            std::fs::copy(repo_root().join(from), task.join(to)).unwrap();
        }

        let mut command: Vec<String> = Vec::new();
        if spec.wrapper {
            command.push("/opt/flightlock-wrapper".into());
        }
        match spec.runtime {
            Runtime::Python => {
                command.push(tool(PYTHON_ENV).display().to_string());
                command.extend(["-m".into(), "awslambdaric".into(), "handler.handler".into()]);
            }
            Runtime::Raw => {
                command.push(tool(PYTHON_ENV).display().to_string());
                command.push("raw_runtime.py".into());
            }
            Runtime::Rust | Runtime::RustInProcess => {
                command.push(workspace_bin("demo-rust").display().to_string());
            }
            Runtime::Curl => command.push(task.join("bootstrap").display().to_string()),
            Runtime::Go => command.push(tool(GO_RUNTIME_ENV).display().to_string()),
            Runtime::Node => {
                command.push("node".into());
                command.push(tool(NODE_RIC_ENV).display().to_string());
                command.push("handler.handler".into());
            }
            Runtime::PythonRecords => {
                command.push(tool(PYTHON_ENV).display().to_string());
                command.extend([
                    "-m".into(),
                    "awslambdaric".into(),
                    "records_handler.handler".into(),
                ]);
            }
            Runtime::PythonPowertools => {
                command.push(tool(PYTHON_ENV).display().to_string());
                command.extend([
                    "-m".into(),
                    "awslambdaric".into(),
                    "powertools_handler.handler".into(),
                ]);
            }
            Runtime::PythonKinesisPowertools => {
                command.push(tool(PYTHON_ENV).display().to_string());
                command.extend([
                    "-m".into(),
                    "awslambdaric".into(),
                    "kinesis_powertools_handler.handler".into(),
                ]);
            }
            Runtime::CurlRecords => {
                command.push("bash".into());
                command.push(task.join("records_bootstrap.sh").display().to_string());
            }
            Runtime::NodeRecords => {
                command.push("node".into());
                command.push(tool(NODE_RIC_ENV).display().to_string());
                command.push("records_handler.handler".into());
            }
            Runtime::NodePowertools => {
                command.push("node".into());
                command.push(tool(NODE_RIC_ENV).display().to_string());
                command.push("powertools_handler.handler".into());
            }
        }

        let port = free_port();
        let api_port = free_port();
        let proxy_port = free_port();
        let log = std::fs::File::create(dir.join("env.log")).unwrap();
        let mut cmd = tokio::process::Command::new("unshare");
        // --mount-proc: the environment sees its own processes in /proc with its own pids, as a
        // Lambda sandbox does (the extension finds the runtime's process tree there).
        cmd.args([
            "--mount",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
        ])
        .arg(r#"mount --bind "$1" /opt || exit 97; shift; exec "$@""#)
        .arg("sh")
        .arg(&opt)
        .arg(&rie)
        .arg("--runtime-interface-emulator-address")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--runtime-api-address")
        .arg(format!("127.0.0.1:{api_port}"))
        .args(&command)
        .current_dir(&task)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true);
        let mut env: HashMap<String, String> = [
            ("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"),
            ("HOME", "/tmp"),
            ("LANG", "C.UTF-8"),
            ("AWS_ACCESS_KEY_ID", "local"),
            ("AWS_SECRET_ACCESS_KEY", "local"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("LOG_LEVEL", "info"),
            ("RUST_LOG", "info"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        env.insert("AWS_ENDPOINT_URL_DYNAMODB".into(), endpoint.to_owned());
        env.insert("AWS_LAMBDA_FUNCTION_NAME".into(), spec.function.clone());
        env.insert(
            "AWS_LAMBDA_FUNCTION_TIMEOUT".into(),
            spec.timeout_secs.to_string(),
        );
        env.insert("FLIGHTLOCK_TABLE".into(), table.to_owned());
        env.insert("FLIGHTLOCK_PROXY_PORT".into(), proxy_port.to_string());
        env.insert("DEMO_RECORD_FILE".into(), record.display().to_string());
        env.insert("DEMO_ENV_NAME".into(), name.to_owned());
        env.insert("RAW_DIR".into(), dir.display().to_string());
        // As Lambda's managed runtimes set it (the extension checks the wrapper then).
        // Lambda sets it for the runtime and the extensions alike; the lock API's callers send it.
        env.insert(
            "AWS_SESSION_TOKEN".into(),
            format!("e2e-session-{name}-{:08x}", rand_u32()),
        );
        match spec.runtime {
            Runtime::Python
            | Runtime::PythonRecords
            | Runtime::PythonPowertools
            | Runtime::PythonKinesisPowertools => {
                env.insert("AWS_EXECUTION_ENV".into(), "AWS_Lambda_python3.12".into());
                // Lambda's Python runtimes put a layer's python/ on sys.path.
                let mut path = vec!["/opt/python".to_owned()];
                if matches!(
                    spec.runtime,
                    Runtime::PythonPowertools | Runtime::PythonKinesisPowertools
                ) {
                    let powertools = std::env::var(POWERTOOLS_ENV).unwrap_or_else(|_| {
                        panic!("{POWERTOOLS_ENV} is not set: run `eval \"$(scripts/client-python-tools)\"` first")
                    });
                    path.push(powertools);
                }
                env.insert("PYTHONPATH".into(), path.join(":"));
            }
            Runtime::Node | Runtime::NodeRecords | Runtime::NodePowertools => {
                env.insert("AWS_EXECUTION_ENV".into(), "AWS_Lambda_nodejs20.x".into());
                // As Lambda's Node.js runtimes set it (a layer's nodejs/node_modules on it), with
                // the managed runtime's ES module lookup on NODE_PATH, which aws-lambda-ric lacks
                // (tests/e2e/runtimes/node_path_esm.mjs says how).
                env.insert(
                    "NODE_PATH".into(),
                    "/opt/nodejs/node20/node_modules:/opt/nodejs/node_modules".into(),
                );
                env.insert(
                    "NODE_OPTIONS".into(),
                    format!(
                        "--import {}",
                        repo_root()
                            .join("tests/e2e/runtimes/node_path_esm.mjs")
                            .display()
                    ),
                );
                if matches!(spec.runtime, Runtime::NodePowertools) {
                    // The function's own node_modules, as its deployment package bundles it.
                    std::os::unix::fs::symlink(
                        tool_dir(NODE_POWERTOOLS_ENV),
                        task.join("node_modules"),
                    )
                    .unwrap();
                }
            }
            _ => {}
        }
        if spec.wrapper {
            // RIE does not run exec wrappers itself: the command above starts it, and this says
            // so as Lambda would see it.
            env.insert(
                "AWS_LAMBDA_EXEC_WRAPPER".into(),
                "/opt/flightlock-wrapper".into(),
            );
        }
        if matches!(spec.runtime, Runtime::RustInProcess) {
            env.insert("DEMO_IN_PROCESS_LOCK".into(), "1".into());
        }
        for (k, v) in &spec.env {
            env.insert(k.clone(), v.clone());
        }
        let session_token = env["AWS_SESSION_TOKEN"].clone();
        cmd.envs(&env);
        let child = cmd
            .spawn()
            .expect("spawn unshare (the e2e tests need root and util-linux)");
        let e = Env {
            name: name.to_owned(),
            port,
            proxy_port,
            dir,
            session_token,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "RIE of {name} did not listen within 10 s; log:\n{}",
                e.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        e
    }

    /// Everything RIE, the extension and the runtime wrote so far.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(self.dir.join("env.log")).unwrap_or_default())
            .into_owned()
    }

    /// Invokes the function with `payload` (and extra request headers), bounded by 90 s.
    pub async fn invoke_with(
        &self,
        payload: impl Into<Bytes>,
        headers: &[(&str, &str)],
    ) -> Invoked {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let mut req = http::Request::post(format!(
            "http://127.0.0.1:{}/2015-03-31/functions/function/invocations",
            self.port
        ));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(payload.into())).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(90), async {
            let resp = client.request(req).await?;
            let (parts, body) = resp.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Invoked {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body,
                context: None,
            })
        })
        .await;
        match resp {
            Ok(Ok(mut r)) => {
                if r.body.is_empty() {
                    r.context = Some(format!(
                        "\nempty answer from {}; log:\n{}",
                        self.name,
                        self.log()
                    ));
                }
                r
            }
            Ok(Err(e)) => panic!("invoke of {} failed: {e}; log:\n{}", self.name, self.log()),
            Err(_) => panic!(
                "invoke of {} took over 90 s; log:\n{}",
                self.name,
                self.log()
            ),
        }
    }

    /// Invokes the function with a JSON event.
    pub async fn invoke(&self, event: serde_json::Value) -> Invoked {
        self.invoke_with(event.to_string(), &[]).await
    }

    /// Polls the log until it contains `needle` (at most `limit`).
    pub async fn wait_log(&self, needle: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.log().contains(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the environment (the whole PID namespace dies with `unshare`).
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A directory named by `var` (set by `scripts/node-tools`).
fn tool_dir(var: &str) -> PathBuf {
    let path = PathBuf::from(std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run `eval \"$(scripts/node-tools)\"` first")
    }));
    assert!(
        path.is_dir(),
        "{var}={} does not exist; re-run `eval \"$(scripts/node-tools)\"`",
        path.display()
    );
    path
}

/// The layer's Node.js package, as the layer zip carries it: `clients/node`'s files (its
/// package.json `files`, and package.json) in `opt/nodejs/node_modules/flightlock`, which
/// Lambda's Node.js runtimes find on `NODE_PATH`.
pub fn layer_node_client(opt: &Path) {
    let from = repo_root().join("clients/node");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(from.join("package.json")).unwrap()).unwrap();
    let to = opt.join("nodejs/node_modules/flightlock");
    std::fs::create_dir_all(&to).unwrap();
    let files = manifest["files"]
        .as_array()
        .expect("clients/node/package.json has files");
    for file in files
        .iter()
        .map(|f| f.as_str().unwrap())
        .chain(["package.json"])
    {
        std::fs::copy(from.join(file), to.join(file))
            .unwrap_or_else(|e| panic!("clients/node/{file}: {e}"));
    }
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish() as u32
}

/// One handler run, from the record file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// Request id.
    pub request_id: String,
    /// `seq` of the event.
    pub seq: Option<i64>,
    /// Environment name.
    pub env: String,
    /// Start, epoch ns.
    pub start: u64,
    /// End, epoch ns (`None`: never ended, e.g. crashed).
    pub end: Option<u64>,
}

/// Reads the runs recorded by the demo handlers.
pub fn runs(record: &Path) -> Vec<Run> {
    let text = std::fs::read_to_string(record).unwrap_or_default();
    let mut runs: Vec<Run> = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let id = v["requestId"].as_str().unwrap().to_owned();
        let ns = v["ns"].as_u64().unwrap();
        match v["what"].as_str().unwrap() {
            "start" => runs.push(Run {
                request_id: id,
                seq: v["seq"].as_i64(),
                env: v["env"].as_str().unwrap_or_default().to_owned(),
                start: ns,
                end: None,
            }),
            _ => {
                if let Some(r) = runs.iter_mut().find(|r| r.request_id == id) {
                    r.end = Some(ns);
                }
            }
        }
    }
    runs.sort_by_key(|r| r.start);
    runs
}

/// Panics if two runs overlap in time.
pub fn assert_no_overlap(runs: &[Run]) {
    for pair in runs.windows(2) {
        let end = pair[0]
            .end
            .unwrap_or_else(|| panic!("run {:?} never ended", pair[0]));
        assert!(
            end <= pair[1].start,
            "runs overlap: {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
}
