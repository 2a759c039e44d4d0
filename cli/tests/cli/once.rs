//! `flightlock run --once ID`: the same cron entry on two hosts runs once per tick. A command
//! that exits 0 marks the tick; a later run of the tick exits 0 without running, with one
//! stderr line; a failing command marks nothing; ids and times alike; stale times dropped.

use std::process::{Command, Output};

use crate::common::{cli, output_within, Env};

async fn output(c: Command) -> Output {
    output_within(
        c,
        std::time::Duration::from_secs(60),
        "a flightlock command",
    )
    .await
}

/// `run --key job --once <tick> [extra...] -- sh -c <script>`.
async fn once(env: &Env, tick: &str, extra: &[&str], script: &str) -> Output {
    let mut c = cli(env);
    c.args(["run", "--key", "job", "--once", tick])
        .args(extra)
        .args(["--", "sh", "-c", script]);
    output(c).await
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn a_tick_runs_once_and_a_later_run_of_it_exits_0_without_running() {
    let env = Env::new("clionce").await;
    for tick in ["2026-11-24T10:00Z", "nightly-batch-7"] {
        let first = once(&env, tick, &[], "echo ran").await;
        assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
        assert_eq!(stdout(&first), "ran");
        // Another host's copy of the cron entry, or a retry.
        let second = once(&env, tick, &[], "echo ran").await;
        assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
        assert_eq!(stdout(&second), "", "the command must not run again");
        assert_eq!(
            stderr(&second).trim(),
            format!("flightlock: already ran for tick {tick}")
        );
    }
    // The same instant written another way is the same tick; the next minute is another.
    let same = once(&env, "2026-11-24T10:00:00+00:00", &[], "echo ran").await;
    assert_eq!(
        (same.status.code(), stdout(&same)),
        (Some(0), String::new())
    );
    let next = once(&env, "2026-11-24T10:01Z", &[], "echo ran").await;
    assert_eq!(stdout(&next), "ran");
    // Nothing is left held.
    assert!(env.queue("job").await.is_empty());
}

#[tokio::test]
async fn a_failing_command_does_not_mark_its_tick() {
    let env = Env::new("clioncefail").await;
    for tick in ["2026-11-24T11:00Z", "batch-8"] {
        let failed = once(&env, tick, &[], "echo ran; exit 4").await;
        assert_eq!(failed.status.code(), Some(4));
        assert_eq!(stdout(&failed), "ran");
        let retry = once(&env, tick, &[], "echo ran again").await;
        assert_eq!(retry.status.code(), Some(0), "{}", stderr(&retry));
        assert_eq!(stdout(&retry), "ran again");
        let done = once(&env, tick, &[], "echo ran").await;
        assert_eq!(stdout(&done), "");
    }
}

#[tokio::test]
async fn stale_times_are_not_run_and_bad_once_options_are_usage_errors() {
    let env = Env::new("clioncestale").await;
    let stale = once(
        &env,
        "2020-01-01T00:00Z",
        &["--stale-after", "10m"],
        "echo ran",
    )
    .await;
    assert_eq!(stale.status.code(), Some(0));
    assert_eq!(stdout(&stale), "");
    assert!(
        stderr(&stale).contains("stale") && stderr(&stale).contains("2020-01-01T00:00Z"),
        "{}",
        stderr(&stale)
    );
    // `off` is no bound.
    let off = once(
        &env,
        "2020-01-01T00:00Z",
        &["--stale-after", "off"],
        "echo ran",
    )
    .await;
    assert_eq!(stdout(&off), "ran");
    // Usage errors (2), nothing run: an id has no age, an empty id, a bound out of range,
    // --once-keep or --stale-after without --once.
    for (args, word) in [
        (
            &["--once", "batch-1", "--stale-after", "10m"][..],
            "an id has no age",
        ),
        (&["--once", ""], "empty"),
        (&["--once", "t", "--stale-after", "0"], "--stale-after"),
        (&["--once", "t", "--once-keep", "0s"], "tick keep"),
        (&["--once-keep", "1h"], "--once"),
        (&["--stale-after", "1h"], "--once"),
    ] {
        let mut c = cli(&env);
        c.args(["run", "--key", "job"])
            .args(args)
            .args(["--", "sh", "-c", "echo ran"]);
        let out = output(c).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "", "{args:?}");
        assert!(stderr(&out).contains(word), "{args:?}: {}", stderr(&out));
    }
}
