//! The flightlock demo (`scripts/demo`): a Python function with the flightlock layer, run in
//! several emulated Lambda environments (the Runtime Interface Emulator, the real extension, the
//! real `awslambdaric` client) against DynamoDB Local, narrated for someone who has never seen
//! the project.
//!
//! 1. A scheduled job that must never overlap: a burst of scheduled events hits three
//!    environments at once; one runs, the others are answered "skipped" at once; the same
//!    delivery after the run is answered "duplicate", the next tick runs.
//! 2. Per-key FIFO: events for two accounts; each account's events run one at a time in arrival
//!    order, different accounts in parallel; fencing tokens rise per key.
//! 3. A killed environment: its row stays behind, the next invocation passes over it after the
//!    lease, and the sweeper removes what is left.
//!
//! Run through `scripts/demo`, which installs the tools, builds the binaries and starts DynamoDB
//! Local; it needs root (each environment gets its own `/opt` in a private mount namespace).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flightlock::{ClockSkew, EntryState, Locker};
use flightlock_e2e::{runs, Env, Runtime, Spec};
use serde_json::{json, Value};

/// A section title: bold on a terminal, plain text when the output goes to a file or a pipe.
fn title(s: &str) {
    if std::io::stdout().is_terminal() {
        println!("\n\x1b[1m━━ {s}\x1b[0m");
    } else {
        println!("\n━━ {s}");
    }
}

/// A function's answer as a reader should see it: without `seq`, the field the demo handler
/// echoes for the end-to-end tests' bookkeeping.
fn shown(body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(mut map)) => {
            map.remove("seq");
            Value::Object(map).to_string()
        }
        _ => String::from_utf8_lossy(body).into_owned(),
    }
}

fn note(s: &str) {
    println!("   {s}");
}

async fn show_queue(locker: &Locker, key: &str) {
    let q = locker
        .queue(key, ClockSkew::Bounded(Duration::from_secs(1)))
        .await
        .unwrap();
    if q.is_empty() {
        note(&format!("queue of '{key}': empty"));
        return;
    }
    note(&format!(
        "queue of '{key}' (flightlock status --key {key}):"
    ));
    for e in q {
        let state = match e.state {
            EntryState::Holding => "holding",
            EntryState::Waiting => "waiting",
            EntryState::Stale => "stale  ",
        };
        note(&format!(
            "  ticket {:>2}  {state}  request {}  lease left {:>5.1}s",
            e.ticket,
            e.holder.request_id.as_deref().unwrap_or("-"),
            e.lease_left_ms as f64 / 1000.0
        ));
    }
}

fn event(path: &str) -> Value {
    let root = flightlock_e2e::repo_root();
    serde_json::from_slice(&std::fs::read(root.join(path)).unwrap()).unwrap()
}

async fn start_envs(
    names: &[&str],
    spec: &Spec,
    endpoint: &str,
    table: &str,
    record: &Path,
) -> Vec<Env> {
    let mut envs = Vec::new();
    for name in names {
        envs.push(Env::start(name, spec, endpoint, table, record).await);
    }
    envs
}

#[tokio::main]
async fn main() {
    let endpoint = flightlock_testkit::require_endpoint();
    let client = flightlock_testkit::client(&endpoint).await;
    let table = format!("flightlock-demo-{}", std::process::id());
    flightlock::table::create_table(&client, &table)
        .await
        .unwrap();
    let locker = Locker::new(client.clone(), &table);
    let work = std::env::temp_dir().join(format!("flightlock-demo-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let t0 = Instant::now();

    println!("flightlock demo — lock table '{table}' on DynamoDB Local at {endpoint}");
    note("Each environment below is one Lambda execution environment: the Runtime Interface");
    note("Emulator, the flightlock extension from the layer (/opt/extensions/flightlock), and the");
    note("Python runtime client awslambdaric started through AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper,");
    note("running functions/demo-python/handler.py unchanged.");

    part_one(&endpoint, &table, &locker, &work).await;
    part_two(&endpoint, &table, &locker, &work).await;
    part_three(&endpoint, &table, &locker, &work).await;

    let _ = std::fs::remove_dir_all(&work);
    title(&format!(
        "Done in {:.0} s. Everything started here has been stopped.",
        t0.elapsed().as_secs_f64()
    ));
}

async fn part_one(endpoint: &str, table: &str, locker: &Locker, work: &Path) {
    title("1. A scheduled job that must never overlap (FLIGHTLOCK_WAIT=0, on busy: skip)");
    note("Three environments of 'nightly-report'; EventBridge fires the schedule, and overlapping");
    note("deliveries (retries, a slow previous run, duplicates) hit all three at once.");
    let record = work.join("part1.jsonl");
    let spec = Spec::layered("nightly-report", Runtime::Python)
        .with("FLIGHTLOCK_WAIT", "0")
        .with("FLIGHTLOCK_LEASE", "6s");
    let envs = start_envs(
        &["env-a", "env-b", "env-c"],
        &spec,
        endpoint,
        table,
        &record,
    )
    .await;
    let mut ev = event("events/scheduled.json");
    ev["sleepMs"] = json!(2000);
    let started = Instant::now();
    let calls = envs.iter().map(|e| {
        let ev = ev.clone();
        async move {
            let t = Instant::now();
            let r = e.invoke(ev).await;
            (e.name.clone(), r, t.elapsed())
        }
    });
    let burst = futures::future::join_all(calls);
    let peek = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        show_queue(locker, "nightly-report").await;
    };
    let (results, ()) = tokio::join!(burst, peek);
    note("Answers:");
    for (name, r, took) in &results {
        let body = shown(&r.body);
        note(&format!(
            "  {name}  {:>6.0} ms  HTTP {}  {body}",
            took.as_secs_f64() * 1000.0,
            r.status
        ));
    }
    let ran = runs(&record);
    note(&format!(
        "→ {} of {} ran the handler (2 s of work); the others never reached it and got the \"skipped\"",
        ran.len(),
        results.len()
    ));
    note(&format!(
        "  body naming the holder (their time is mostly the emulator's cold start). Burst done in {:.1} s.",
        started.elapsed().as_secs_f64()
    ));
    note("Once the run is over, the same delivery again (a duplicate or a retry of this tick) is");
    note("answered without running: the tick is the event's `time` (FLIGHTLOCK_TICK=auto):");
    let again = envs[1].invoke(ev.clone()).await;
    note(&format!(
        "  env-b  HTTP {}  {}",
        again.status,
        shown(&again.body)
    ));
    note("The next tick runs normally:");
    let mut next = ev.clone();
    next["time"] = json!("2026-11-21T12:05:00Z");
    next["id"] = json!("0d3f5a1e-9b7c-4e2a-8f61-3c2b7d9e4a10");
    next["sleepMs"] = json!(0);
    let next = envs[1].invoke(next).await;
    note(&format!(
        "  env-b  HTTP {}  {}",
        next.status,
        shown(&next.body)
    ));
    for e in envs {
        e.stop().await;
    }
}

async fn part_two(endpoint: &str, table: &str, locker: &Locker, work: &Path) {
    title("2. One entity at a time, in arrival order (FLIGHTLOCK_KEY=account-{/detail/accountId}, WAIT=30s)");
    note("Four environments of 'account-sync'. Events for acct-1, acct-1, acct-2, acct-1 arrive 300 ms");
    note("apart; each takes 1.5 s. The key comes from the event, so acct-1's events queue behind each");
    note("other (FIFO) while acct-2 runs alongside.");
    let record = work.join("part2.jsonl");
    let spec = Spec::layered("account-sync", Runtime::Python)
        .with("FLIGHTLOCK_KEY", "account-{/detail/accountId}")
        .with("FLIGHTLOCK_WAIT", "30s")
        .with("FLIGHTLOCK_LEASE", "6s");
    let envs = start_envs(
        &["env-1", "env-2", "env-3", "env-4"],
        &spec,
        endpoint,
        table,
        &record,
    )
    .await;
    let accounts = ["acct-1", "acct-1", "acct-2", "acct-1"];
    let started = Instant::now();
    let calls = envs.iter().zip(accounts).enumerate().map(|(i, (e, acct))| {
        let mut ev = event("events/keyed.json");
        ev["detail"]["accountId"] = json!(acct);
        ev["seq"] = json!(i + 1);
        ev["sleepMs"] = json!(1500);
        async move {
            tokio::time::sleep(Duration::from_millis(300 * i as u64)).await;
            e.invoke(ev).await
        }
    });
    let peek = async {
        tokio::time::sleep(Duration::from_millis(1300)).await;
        show_queue(locker, "account-acct-1").await;
        show_queue(locker, "account-acct-2").await;
    };
    let (_, ()) = tokio::join!(futures::future::join_all(calls), peek);
    let base = runs(&record).first().map(|r| r.start).unwrap_or(0);
    note("Timeline (seconds since the first start):");
    for r in runs(&record) {
        let seq = r.seq.unwrap_or(0) as usize;
        let acct = accounts.get(seq.wrapping_sub(1)).copied().unwrap_or("?");
        let end = r
            .end
            .map(|e| format!("{:>4.1}", (e - base) as f64 / 1e9))
            .unwrap_or("  - ".into());
        note(&format!(
            "  event {seq} ({acct})  in {}  runs {:>4.1} → {end}",
            r.env,
            (r.start - base) as f64 / 1e9
        ));
    }
    note(&format!(
        "→ acct-1's events ran 1, 2, 4 — one at a time, in arrival order; acct-2 (event 3) did not wait. ({:.1} s)",
        started.elapsed().as_secs_f64()
    ));
    for e in envs {
        e.stop().await;
    }
}

async fn part_three(endpoint: &str, table: &str, locker: &Locker, work: &Path) {
    title("3. An environment dies holding the lock");
    note("'billing-run' (lease 4 s) starts a long run in env-x; the environment is then killed");
    note("outright (SIGKILL: no SHUTDOWN, no release). Its queue row stays behind.");
    let record = work.join("part3.jsonl");
    let spec = Spec::layered("billing-run", Runtime::Python)
        .with("FLIGHTLOCK_WAIT", "30s")
        .with("FLIGHTLOCK_LEASE", "4s");
    let envs = start_envs(&["env-x", "env-y"], &spec, endpoint, table, &record).await;
    let mut envs = envs.into_iter();
    let (victim, survivor) = (envs.next().unwrap(), envs.next().unwrap());
    let long = async { victim.invoke(json!({"sleepMs": 60_000})).await };
    let kill = async {
        while runs(&record).is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    tokio::select! {
        _ = long => {}
        () = kill => {}
    }
    victim.stop().await;
    let killed = Instant::now();
    note("env-x killed. The row it left:");
    show_queue(locker, "billing-run").await;
    note("An invocation arrives in env-y; it waits and passes over the dead row once its lease ends:");
    let r = survivor.invoke(json!({"sleepMs": 200})).await;
    note(&format!(
        "  env-y  HTTP {}  {}  — {:.1} s after the kill (lease 4 s + clock-skew allowance 1 s at most)",
        r.status,
        shown(&r.body),
        killed.elapsed().as_secs_f64()
    ));
    survivor.stop().await;

    note("Rows of dead participants are also removed by the scheduled cleanup function. A waiter");
    note("that never comes leaves a dead row behind; here two environments die while waiting:");
    let spec = Spec::layered("billing-run", Runtime::Python)
        .with("FLIGHTLOCK_WAIT", "30s")
        .with("FLIGHTLOCK_LEASE", "4s");
    let holder = locker
        .acquire(
            "billing-run",
            &flightlock::LockOptions {
                lease: Duration::from_secs(4),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let waiters = start_envs(&["env-p", "env-q"], &spec, endpoint, table, &record).await;
    let pending = waiters.iter().map(|e| e.invoke(json!({})));
    let wait_rows = async {
        for _ in 0..100 {
            if locker
                .queue("billing-run", ClockSkew::Unbounded)
                .await
                .unwrap()
                .len()
                >= 3
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        _ = futures::future::join_all(pending) => {}
        () = wait_rows => {}
    }
    for w in waiters {
        w.stop().await;
    }
    holder.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    show_queue(locker, "billing-run").await;
    let bin = cli_bin();
    note("The cleanup function's sweep (here from the shell: flightlock sweep --grace 1s):");
    let out = std::process::Command::new(&bin)
        .args([
            "sweep",
            "--table",
            table,
            "--grace",
            "1s",
            "--endpoint-url",
            endpoint,
        ])
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
    {
        note(&format!("  {line}"));
    }
    show_queue(locker, "billing-run").await;
}

/// The CLI built with this demo (the same profile directory), else any build of it.
fn cli_bin() -> PathBuf {
    if let Some(beside) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("flightlock")))
        .filter(|p| p.is_file())
    {
        return beside;
    }
    let root = flightlock_e2e::repo_root();
    for profile in ["debug", "release"] {
        let p = root.join("target").join(profile).join("flightlock");
        if p.is_file() {
            return p;
        }
    }
    panic!("the flightlock CLI is not built: cargo build -p flightlock-cli");
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn answers_are_shown_without_the_test_only_seq() {
        assert_eq!(
            shown(br#"{"ok":true,"requestId":"r1","seq":null}"#),
            r#"{"ok":true,"requestId":"r1"}"#
        );
        assert_eq!(shown(b"plain text"), "plain text");
    }
}
