//! What waiting cannot fix is answered at once, whatever the wait: an endpoint that refuses
//! connections or does not resolve, no region, no credentials, a table of another shape. Each
//! test gives a wait of 10 minutes and a harness limit far below it: the process must have
//! exited by itself, with one line that names the fix. (No timed assertion: the limit only keeps
//! a broken build from hanging the suite, and it is far above what a loaded machine needs.)

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use flightlock::LockOptions;

use crate::common::*;

/// The harness's limit: far below the 10-minute waits the tests ask for.
const LIMIT: Duration = Duration::from_secs(120);

/// Runs `c` to its end, or panics if it is still running after [`LIMIT`] (then it waited, which
/// is the bug these tests look for).
async fn finish(mut c: Command) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while started.elapsed() < LIMIT {
            if child.try_wait().unwrap().is_some() {
                return child.wait_with_output().unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "still waiting after {LIMIT:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .await
    .unwrap()
}

/// Asserts exit status `code` and a single stderr line containing every one of `needles`.
fn assert_answer(out: &Output, code: i32, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{n:?} missing from: {stderr}");
    }
}

/// A local port that refuses connections (bound, then closed).
fn refusing_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// The CLI against `endpoint`, with the real server's table name and dummy credentials.
fn cli_at(env: &Env, endpoint: &str) -> Command {
    let mut c = cli(env);
    c.env("AWS_ENDPOINT_URL_DYNAMODB", endpoint);
    c
}

/// Environment that leaves the SDK no other place to find a region or credentials.
fn isolate(c: &mut Command) {
    for var in [
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_SESSION_TOKEN",
    ] {
        c.env_remove(var);
    }
    c.env("AWS_CONFIG_FILE", "/nonexistent/flightlock-test-config")
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/flightlock-test-credentials",
        )
        .env("AWS_EC2_METADATA_DISABLED", "true");
}

#[tokio::test]
async fn run_against_a_refusing_endpoint_answers_at_once_naming_the_endpoint_variable() {
    let env = Env::new("ffrefused").await;
    let mut c = cli_at(&env, &refusing_endpoint());
    c.args(["run", "--key", "job", "--wait", "10m", "--", "true"]);
    let out = finish(c).await;
    assert_answer(
        &out,
        1,
        &[
            "Connection refused",
            "AWS_ENDPOINT_URL_DYNAMODB",
            "--endpoint-url",
        ],
    );
}

#[tokio::test]
async fn run_against_an_unresolvable_host_answers_at_once() {
    let env = Env::new("ffdns").await;
    // `.invalid` never resolves (RFC 2606 reserves it).
    let mut c = cli_at(&env, "http://flightlock-nowhere.invalid:8000");
    c.args(["run", "--key", "job", "--wait", "10m", "--", "true"]);
    let out = finish(c).await;
    assert_answer(
        &out,
        1,
        &["cannot reach DynamoDB", "AWS_ENDPOINT_URL_DYNAMODB"],
    );
}

#[tokio::test]
async fn run_without_a_region_answers_at_once_naming_aws_region() {
    let env = Env::new("ffregion").await;
    let mut c = cli(&env);
    isolate(&mut c);
    c.env_remove("AWS_REGION").env_remove("AWS_DEFAULT_REGION");
    c.args(["run", "--key", "job", "--wait", "10m", "--", "true"]);
    let out = finish(c).await;
    assert_answer(&out, 1, &["no AWS region", "AWS_REGION", "--region"]);
}

#[tokio::test]
async fn run_without_credentials_answers_at_once_naming_the_variables() {
    let env = Env::new("ffcreds").await;
    let mut c = cli(&env);
    isolate(&mut c);
    c.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY");
    c.args(["run", "--key", "job", "--wait", "10m", "--", "true"]);
    let out = finish(c).await;
    assert_answer(
        &out,
        1,
        &["no AWS credentials", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"],
    );
}

#[tokio::test]
async fn status_and_sweep_report_a_refusing_endpoint_not_a_spent_budget() {
    let env = Env::new("ffsweep").await;
    let endpoint = refusing_endpoint();
    let mut c = cli_at(&env, &endpoint);
    c.args(["status", "--key", "job"]);
    assert_answer(
        &finish(c).await,
        1,
        &["Connection refused", "--endpoint-url"],
    );
    let mut c = cli_at(&env, &endpoint);
    c.args(["sweep", "--budget", "10m"]);
    let out = finish(c).await;
    assert_answer(&out, 1, &["Connection refused", "--endpoint-url"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("INCOMPLETE"));
}

#[tokio::test]
async fn a_table_of_another_shape_is_named_by_run_status_and_sweep() {
    let env = Env::new("ffshape").await;
    let name = flightlock_testkit::unique_table("ffshapeid");
    create_table_keyed_by(&env.client, &name, "id").await;
    for args in [
        &["run", "--key", "job", "--wait", "10m", "--", "true"][..],
        &["status", "--key", "job"],
        &["sweep"],
    ] {
        let mut c = cli(&env);
        c.env("FLIGHTLOCK_TABLE", &name).args(args);
        assert_answer(
            &finish(c).await,
            1,
            &[
                "wrong key schema",
                "`id` (S, HASH)",
                "flightlock create-table",
            ],
        );
    }
}

/// A server that accepts connections and never answers is a fault worth waiting out: `run` keeps
/// trying, says so on stderr while it waits, and a Ctrl-C then does not claim a queue it never
/// reached.
#[tokio::test]
async fn a_silent_endpoint_is_retried_with_progress_lines_and_ctrl_c_is_truthful() {
    let env = Env::new("ffsilent").await;
    // Bound and listening, never accepting: connections complete in the kernel, no answer comes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let mut c = cli_at(&env, &endpoint);
    c.args(["run", "--key", "job", "--wait", "10m", "--", "true"]);
    let mut child: Child = c.stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let (code, stderr) =
        blocking_within(pid, LIMIT, "the run against a silent endpoint", move || {
            let mut lines = BufReader::new(child.stderr.take().unwrap());
            let mut first = String::new();
            // The first progress line (after a few seconds); EOF would mean the process gave up.
            lines.read_line(&mut first).unwrap();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
                nix::sys::signal::Signal::SIGINT,
            )
            .unwrap();
            let mut rest = String::new();
            lines.read_to_string(&mut rest).unwrap();
            (child.wait().unwrap().code(), first + &rest)
        })
        .await;
    drop(silent);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.starts_with("flightlock: waiting for key \"job\"")
            && stderr.contains("did not answer"),
        "{stderr}"
    );
    assert!(
        stderr.contains("before DynamoDB ever answered") && !stderr.contains("leaving the queue"),
        "{stderr}"
    );
}

/// While `run` waits behind a holder, stderr says every few seconds who holds the key; the busy
/// line still ends the wait.
#[tokio::test]
async fn a_waiting_run_names_the_holder_while_it_waits() {
    let env = Env::new("ffprogress").await;
    // A lease longer than the run's 7 s wait: a heartbeat late under load (seen on moto's
    // server with both cores busy) must not hand the key to the run.
    let holder = LockOptions {
        lease: Duration::from_secs(15),
        heartbeat: Some(Duration::from_secs(3)),
        ..fast()
    };
    let g = env.locker().await.acquire("job", &holder).await.unwrap();
    let mut c = cli(&env);
    c.args(["run", "--key", "job", "--wait", "7s", "--", "true"]);
    let out = finish(c).await;
    let owner = g.owner().to_owned();
    g.release().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("flightlock: waiting for key \"job\""))
        .collect();
    assert!(!progress.is_empty(), "{stderr}");
    for line in progress {
        assert!(
            line.contains("held by ticket 1") && line.contains(&owner),
            "{line}"
        );
    }
}
