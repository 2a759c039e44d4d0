//! The `flightlock` CLI contract: exit statuses, environment, stderr lines, JSON.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::common::*;

async fn output(c: Command) -> Output {
    output_within(c, Duration::from_secs(60), "a flightlock command").await
}

#[tokio::test]
async fn run_passes_token_and_key_and_exit_status() {
    let env = Env::new("clirun").await;
    let mut c = cli(&env);
    c.args([
        "run",
        "--key",
        "job",
        "--",
        "sh",
        "-c",
        "echo $FLIGHTLOCK_KEY $FLIGHTLOCK_TOKEN; exit 3",
    ]);
    let out = output(c).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "job 1");
    assert!(env.queue("job").await.is_empty(), "not released");
}

#[tokio::test]
async fn run_on_a_busy_key_exits_75_naming_the_holder() {
    let env = Env::new("clibusy").await;
    let g = env.locker().await.acquire("job", &fast()).await.unwrap();
    let mut c = cli(&env);
    c.args(["run", "--key", "job", "--wait", "0", "--", "true"]);
    let out = output(c).await;
    assert_eq!(out.status.code(), Some(75));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(g.owner()) && stderr.contains("ticket 1"),
        "{stderr}"
    );
    assert_eq!(env.queue("job").await.len(), 1);
    g.release().await.unwrap();
}

#[tokio::test]
async fn status_json_shows_the_holder() {
    let env = Env::new("clistatus").await;
    let g = env.locker().await.acquire("job", &fast()).await.unwrap();
    let mut c = cli(&env);
    c.args(["status", "--key", "job", "--json"]);
    let out = output(c).await;
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["queue"][0]["state"], "holding");
    assert_eq!(v["queue"][0]["owner"], g.owner());
    assert_eq!(v["queue"][0]["ticket"], 1);
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_lock_lost_while_running_is_reported_and_fails_the_run() {
    let env = Env::new("clilost").await;
    let mut c = cli(&env);
    c.args([
        "run",
        "--key",
        "job",
        "--lease",
        "1500ms",
        "--heartbeat",
        "300ms",
        "--kill-on-lost",
        "--",
        "sleep",
        "30",
    ]);
    c.stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    until_queue_len(&env, "job", 1).await;
    let holder = env.queue("job").await.remove(0);
    // The holder's entry: its row, or the counter if it sits in the seat.
    let sk = if holder.seat {
        "counter".to_owned()
    } else {
        format!("q#{:020}", holder.ticket)
    };
    env.client
        .delete_item()
        .table_name(&env.table)
        .key("pk", AttributeValue::S("job".into()))
        .key("sk", AttributeValue::S(sk))
        .send()
        .await
        .unwrap();
    let out = child_within(
        child,
        Duration::from_secs(20),
        "--kill-on-lost stopping the command",
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("LOCK LOST"), "{stderr}");
    assert_ne!(out.status.code(), Some(0));
}

#[tokio::test]
async fn sigterm_is_passed_to_the_command_and_the_lock_released() {
    let env = Env::new("cliterm").await;
    let mut c = cli(&env);
    c.args([
        "run",
        "--key",
        "job",
        "--",
        "sh",
        "-c",
        "trap 'exit 9' TERM; while true; do sleep 0.05; done",
    ]);
    let child = c.spawn().unwrap();
    until_queue_len(&env, "job", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child_within(child, Duration::from_secs(20), "the command after SIGTERM").await;
    assert_eq!(out.status.code(), Some(9));
    assert!(env.queue("job").await.is_empty());
}

#[tokio::test]
async fn bad_arguments_name_the_option() {
    let env = Env::new("cliargs").await;
    let mut c = cli(&env);
    c.args(["run", "--key", "job", "--wait", "soonish", "--", "true"]);
    let out = output(c).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--wait") && stderr.contains("soonish"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_command_that_cannot_start_exits_127_or_126_and_releases() {
    let env = Env::new("clinoexec").await;
    // Not found: 127, as env(1) and flock(1).
    let mut c = cli(&env);
    c.args([
        "run",
        "--key",
        "job",
        "--",
        "/nonexistent/flightlock-test-cmd",
    ]);
    let out = output(c).await;
    assert_eq!(out.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("could not start") && stderr.contains("flightlock-test-cmd"),
        "{stderr}"
    );
    // Found but not executable (no x bit; root cannot run it either): 126.
    let file = std::env::temp_dir().join(format!("flightlock-noexec-{}", std::process::id()));
    std::fs::write(&file, "#!/bin/sh\nexit 0\n").unwrap();
    let mut c = cli(&env);
    c.args(["run", "--key", "job", "--"]).arg(&file);
    let out = output(c).await;
    std::fs::remove_file(&file).unwrap();
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    // Either way the lock was released.
    assert!(env.queue("job").await.is_empty());
}

/// `flightlock --version` names the crate version and the commit of the build: this checkout's
/// HEAD when git can tell (cli/build.rs watches HEAD, so a new commit rebuilds).
#[test]
fn version_names_the_version_and_the_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_flightlock"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let head = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout)[..12].to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let commit = std::env::var("FLIGHTLOCK_BUILD_COMMIT")
        .ok()
        .map(|c| c.trim().chars().take(12).collect::<String>())
        .filter(|c| !c.is_empty())
        .unwrap_or(head);
    assert_eq!(
        line,
        format!("flightlock {} (commit {commit})", env!("CARGO_PKG_VERSION"))
    );
}

/// A malformed row makes the key unusable: `status` names the row and how to remove it, and
/// exits non-zero (the library's error: `lock/tests/protocol/defects.rs`).
#[tokio::test]
async fn status_names_a_malformed_row_with_the_way_out() {
    let env = Env::new("climalformed").await;
    let mut row = flightlock::schema::seed::row("k", 3, "o", "r", now_ms());
    row.insert("leaseUntilMs".into(), AttributeValue::S("soon".into()));
    env.put(vec![row]).await;
    let mut c = cli(&env);
    c.args(["status", "--key", "k"]);
    let out = output(c).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("q#00000000000000000003") && stderr.contains("delete-item"),
        "{stderr}"
    );
}
