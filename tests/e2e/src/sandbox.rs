//! Processes of one execution environment on the platform double: the real extension binary and
//! runtime processes started through the layer's wrapper, each in its own process group (so the
//! double can freeze, thaw or kill a process with everything it started).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::platform::{Mode, Platform};
use crate::{repo_root, workspace_bin};

/// The extension process.
pub struct Extension {
    /// The process (killed on drop).
    pub child: tokio::process::Child,
    /// Its stdout and stderr.
    pub log: PathBuf,
    /// The proxy port.
    pub proxy_port: u16,
}

impl Extension {
    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its process group (= its pid).
    pub fn group(&self) -> i32 {
        self.child.id().unwrap_or(0) as i32
    }

    /// Waits until its log contains `needle`, at most `limit`.
    pub async fn wait_log(&self, needle: &str, limit: Duration) -> bool {
        let end = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < end {
            if self.log().contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.log().contains(needle)
    }

    /// Waits for it to exit, at most `limit`.
    pub async fn exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }
}

impl Drop for Extension {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The `AWS_SESSION_TOKEN` the double's processes get (Lambda sets it for the runtime and the
/// extensions alike; callers of the lock API send it).
pub const SESSION_TOKEN: &str = "e2e-double-session-token";

/// The credentials' variables Lambda gives the environment's processes: `AWS_SESSION_TOKEN`
/// ([`SESSION_TOKEN`]), except in a function restored from a SnapStart snapshot, which gets the
/// container credentials endpoint and its token instead (the token's value is then
/// [`SESSION_TOKEN`] too).
pub fn credentials(platform: &Platform) -> Vec<(&'static str, String)> {
    match platform.mode() {
        Mode::SnapStart => vec![
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                format!("http://{}/credentials", platform.addr()),
            ),
            (
                "AWS_CONTAINER_AUTHORIZATION_TOKEN",
                SESSION_TOKEN.to_owned(),
            ),
        ],
        _ => vec![("AWS_SESSION_TOKEN", SESSION_TOKEN.to_owned())],
    }
}

/// Env var naming another extension binary to run instead of the workspace's (to show what an
/// older build does on the double, e.g. one that registers INVOKE on Managed Instances).
pub const EXTENSION_BIN_ENV: &str = "FLIGHTLOCK_E2E_EXTENSION";

/// Starts `binary` (default: [`EXTENSION_BIN_ENV`] if set, else the workspace's extension) as
/// the environment's extension, with
/// the mode's Lambda variables, DynamoDB Local at `endpoint`, lock table `table`, and `extra`.
/// Returns once its proxy listens or it has exited (an init failure).
pub async fn extension(
    platform: &Platform,
    endpoint: &str,
    table: &str,
    extra: &[(&str, &str)],
    binary: Option<&Path>,
) -> Extension {
    let proxy_port = crate::free_port();
    let log = std::env::temp_dir().join(format!(
        "flightlock-double-{}-{proxy_port}.log",
        std::process::id()
    ));
    let bin = binary.map_or_else(
        || {
            std::env::var(EXTENSION_BIN_ENV)
                .map(PathBuf::from)
                .unwrap_or_else(|_| workspace_bin("flightlock-extension"))
        },
        Path::to_path_buf,
    );
    // stdout (EMF metric lines) and stderr (logs) in one file, appended.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env_clear()
        .envs(platform.lambda_env())
        .env("AWS_LAMBDA_FUNCTION_NAME", "double")
        .env("AWS_ENDPOINT_URL_DYNAMODB", endpoint)
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("FLIGHTLOCK_TABLE", table)
        .env("FLIGHTLOCK_PROXY_PORT", proxy_port.to_string())
        .envs(credentials(platform))
        .envs(extra.iter().copied())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    // Lambda starts the runtime only once every extension has registered (a runtime that asks
    // for an event earlier closes registration: the double refuses late registrations).
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", proxy_port))
        .await
        .is_err()
        || (platform.registrations().is_empty() && platform.refusals().is_empty())
    {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the extension did not listen and register"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Extension {
        child,
        log,
        proxy_port,
    }
}

/// A bash + curl runtime (tests/e2e/runtimes/curl_bootstrap.sh) started through the layer's
/// wrapper on `proxy_port`, as Lambda starts each runtime process; it records its runs in
/// `record` as `name`. Its own process group; killed on drop.
pub fn curl_runtime(
    platform: &Platform,
    proxy_port: u16,
    record: &Path,
    name: &str,
) -> tokio::process::Child {
    let bootstrap = repo_root().join("tests/e2e/runtimes/curl_bootstrap.sh");
    let command = ["bash".to_owned(), bootstrap.display().to_string()];
    wrapped(platform, proxy_port, record, name, &command, &repo_root())
}

/// `functions/demo-python/handler.py` under the Python runtime interface client `awslambdaric`
/// (one keep-alive connection for all its requests), otherwise as [`curl_runtime`].
pub fn python_runtime(
    platform: &Platform,
    proxy_port: u16,
    record: &Path,
    name: &str,
) -> tokio::process::Child {
    let python = std::env::var(crate::PYTHON_ENV).unwrap_or_else(|_| {
        panic!(
            "{} is not set: eval \"$(scripts/e2e-tools)\"",
            crate::PYTHON_ENV
        )
    });
    let command = [
        python,
        "-m".into(),
        "awslambdaric".into(),
        "handler.handler".into(),
    ];
    let dir = repo_root().join("functions/demo-python");
    wrapped(platform, proxy_port, record, name, &command, &dir)
}

/// `tests/e2e/runtimes/records_handler.py` (the SQS recipe's batch handler, [`crate::RECORD_FILES`])
/// under `awslambdaric`, otherwise as [`python_runtime`]. Its files are copied into `dir`, and
/// the Python client into `dir/opt/python`, laid out as the layer carries it.
pub fn records_runtime(
    platform: &Platform,
    proxy_port: u16,
    record: &Path,
    name: &str,
    dir: &Path,
) -> tokio::process::Child {
    let python = std::env::var(crate::PYTHON_ENV).unwrap_or_else(|_| {
        panic!(
            "{} is not set: eval \"$(scripts/e2e-tools)\"",
            crate::PYTHON_ENV
        )
    });
    std::fs::create_dir_all(dir).unwrap();
    for (from, to) in crate::RECORD_FILES {
        std::fs::copy(repo_root().join(from), dir.join(to)).unwrap();
    }
    crate::layer_python_client(&dir.join("opt"));
    let command = [
        python,
        "-m".into(),
        "awslambdaric".into(),
        "records_handler.handler".into(),
    ];
    wrapped(platform, proxy_port, record, name, &command, dir)
}

fn wrapped(
    platform: &Platform,
    proxy_port: u16,
    record: &Path,
    name: &str,
    command: &[String],
    dir: &Path,
) -> tokio::process::Child {
    tokio::process::Command::new(repo_root().join("extension/layer/flightlock-wrapper"))
        .args(command)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(platform.lambda_env())
        .envs(credentials(platform))
        .env("FLIGHTLOCK_PROXY_PORT", proxy_port.to_string())
        .env("DEMO_RECORD_FILE", record)
        .env("DEMO_ENV_NAME", name)
        // As Lambda puts a layer's python/ on sys.path (only records_runtime lays one out).
        .env("PYTHONPATH", dir.join("opt/python"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The lock rows of `key` in `table` (holders and waiters).
pub async fn queue(endpoint: &str, table: &str, key: &str) -> usize {
    let locker = flightlock::Locker::new(flightlock_testkit::client(endpoint).await, table);
    locker
        .queue(key, flightlock::ClockSkew::Bounded(Duration::from_secs(1)))
        .await
        .unwrap()
        .len()
}

/// Waits until `key` has no lock row, at most `limit` (a release follows the response that
/// went upstream: the platform sees the response first). True if it got empty.
pub async fn released(endpoint: &str, table: &str, key: &str, limit: Duration) -> bool {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if queue(endpoint, table, key).await == 0 {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
