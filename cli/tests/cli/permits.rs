//! The CLI around permits: `flightlock permits --set N` (what it prints, its JSON, its exit
//! statuses), `run --permits` / `FLIGHTLOCK_PERMITS` (exit 78 on a mismatch) and `status`
//! (holders and waiters against the key's permits). Each test has its own table.
//! (The library under it, `flightlock::permits`: `lock/tests/permits/main.rs`.)

use std::process::{Command, Output};
use std::time::Duration;

use flightlock::permits::set_permits;

use crate::common::{output_within, skip as opts, Env};

/// `flightlock ARGS...` against `e`'s table.
fn cli(e: &Env, args: &[&str]) -> Command {
    let mut c = crate::common::cli(e);
    c.args(args);
    c
}

async fn output(c: Command) -> Output {
    output_within(c, Duration::from_secs(60), "a flightlock command").await
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_set_prints_the_change_and_what_participants_need() {
    let e = Env::new("cli_permits_set").await;
    let out = output(cli(&e, &["permits", "--key", "api", "--set", "3"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("had no counter; created it at 3 permit(s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("--permits 3") && stdout.contains("FLIGHTLOCK_PERMITS=3"),
        "{stdout}"
    );

    let out = output(cli(
        &e,
        &["permits", "--key", "api", "--set", "2", "--json"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"key": "api", "permits": 2, "change": "changed", "from": 3})
    );
    let out = output(cli(&e, &["permits", "--key", "api", "--set", "2"])).await;
    assert!(text(&out.stdout).contains("already 2 permit(s): nothing changed"));

    for bad in ["0", "101", "two"] {
        let out = output(cli(&e, &["permits", "--key", "api", "--set", bad])).await;
        assert_eq!(out.status.code(), Some(2), "--set {bad}");
        assert!(
            text(&out.stderr).contains("up to 100"),
            "{}",
            text(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_other_permits_exits_78_and_status_counts_against_the_key() {
    let (e, locker) = Env::with_locker("cli_permits_run").await;
    let poll = Duration::from_millis(50);
    set_permits(&locker, "api", 2, Duration::ZERO, poll)
        .await
        .unwrap();
    let out = output(cli(&e, &["run", "--key", "api", "--", "true"])).await;
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("allows 2") && stderr.contains("configured with 1"),
        "{stderr}"
    );

    // Once per tick promises one run at a time: refused with more permits, before any request.
    let out = output(cli(
        &e,
        &[
            "run",
            "--key",
            "api",
            "--permits",
            "2",
            "--once",
            "2026-11-24T10:00Z",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("permits"),
        "{}",
        text(&out.stderr)
    );

    // The environment variable and the option alike.
    let mut c = cli(
        &e,
        &[
            "run",
            "--key",
            "api",
            "--",
            "sh",
            "-c",
            "echo $FLIGHTLOCK_TOKEN",
        ],
    );
    c.env("FLIGHTLOCK_PERMITS", "2");
    let out = output(c).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let held = locker.acquire("api", &opts(2)).await.unwrap();
    let out = output(cli(&e, &["status", "--key", "api", "--json"])).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["permits"].as_u64(), v["holding"].as_u64()),
        (Some(2), Some(1)),
        "{v}"
    );
    let out = output(cli(&e, &["status", "--key", "api"])).await;
    assert!(
        text(&out.stdout).contains("api: 1 of 2 permits held, 0 waiting"),
        "{}",
        text(&out.stdout)
    );
    // Both permits held: busy (75), naming both holders.
    let other = locker.acquire("api", &opts(2)).await.unwrap();
    let out = output(cli(
        &e,
        &[
            "run",
            "--key",
            "api",
            "--permits",
            "2",
            "--wait",
            "0",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    for g in [&held, &other] {
        assert!(
            stderr.contains(&format!("ticket {}", g.token())),
            "{stderr}"
        );
    }
    assert!(stderr.contains("(2 of 2 permits)"), "{stderr}");
    // Another number with `--wait 0` on the full key: refused (78), never busy (75), which a
    // script would take for "someone else is running" (issue 36).
    let out = output(cli(
        &e,
        &["run", "--key", "api", "--wait", "0", "--", "true"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    held.release().await.unwrap();
    other.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_exits_75_while_the_seat_stays_taken() {
    let (e, locker) = Env::with_locker("cli_permits_seat").await;
    let guard = locker.acquire("job", &opts(1)).await.unwrap();
    let out = output(cli(
        &e,
        &["permits", "--key", "job", "--set", "2", "--wait", "300ms"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("seat stayed taken"),
        "{}",
        text(&out.stderr)
    );
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}
