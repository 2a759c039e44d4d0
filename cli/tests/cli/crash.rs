//! Guarantees 4 and 5: dead holders and dead waiters (real processes, SIGKILLed) are passed over
//! within a lease plus the allowance and a poll, and their rows are removed.

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::common::*;

/// Starts `flightlock run` holding or waiting on `key` in its own process group.
fn spawn_cli(env: &Env, key: &str) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(env!("CARGO_BIN_EXE_flightlock"))
        .args([
            "run",
            "--table",
            &env.table,
            "--key",
            key,
            "--endpoint-url",
            &env.endpoint,
        ])
        .args([
            "--lease",
            "1500ms",
            "--heartbeat",
            "300ms",
            "--poll",
            "20ms",
            "--max-clock-skew",
            "300ms",
        ])
        .args(["--", "sleep", "60"])
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_REGION", "us-east-1")
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap()
}

fn sigkill(child: &mut std::process::Child) {
    killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
}

#[tokio::test]
async fn a_sigkilled_holder_is_passed_over_and_its_row_removed() {
    let env = Env::new("crash").await;
    let mut child = spawn_cli(&env, "k");
    until_queue_len(&env, "k", 1).await;
    let dead_owner = env.queue("k").await[0].owner.clone();
    // Let it heartbeat a few times, so the row is not a fresh one.
    tokio::time::sleep(Duration::from_millis(700)).await;
    sigkill(&mut child);
    let killed = Instant::now();

    let locker = env.locker().await;
    let g = env
        .within(
            "k",
            Duration::from_secs(10),
            "the takeover of a SIGKILLed holder",
            locker.acquire("k", &fast()),
        )
        .await
        .unwrap();
    let takeover = killed.elapsed();
    // lease 1.5 s + allowance 0.3 s + poll; generous slack for a loaded machine.
    assert!(
        takeover < Duration::from_secs(6),
        "takeover took {takeover:?}"
    );
    let q = env.queue("k").await;
    assert_eq!(q.len(), 1, "{q:?}");
    assert_ne!(q[0].owner, dead_owner, "the dead row is still there");
    g.release().await.unwrap();
    assert!(env.queue("k").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_waiter_is_passed_over() {
    let env = Env::new("deadwaiter").await;
    let holder = env.locker().await.acquire("k", &fast()).await.unwrap();
    let mut waiter = spawn_cli(&env, "k");
    until_queue_len(&env, "k", 2).await;
    let behind = {
        let locker = env.locker().await;
        tokio::spawn(async move {
            let g = locker.acquire("k", &fast()).await.unwrap();
            let t = g.token();
            g.release().await.unwrap();
            t
        })
    };
    until_queue_len(&env, "k", 3).await;
    sigkill(&mut waiter);
    holder.release().await.unwrap();
    let token = tokio::time::timeout(Duration::from_secs(10), behind)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(token, 3);
    assert!(
        env.queue("k").await.is_empty(),
        "the dead waiter's row was not removed"
    );
}

/// A dead head seen only by waiters more than a page back (eight dead rows between them and it:
/// a holder and seven waiters whose DynamoDB became unreachable, as for killed processes). The
/// far-back look reads only the first row; it must judge it and pass it over like any look, or
/// the queue stays stuck until the sweeper or TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_is_passed_over_by_waiters_far_back() {
    let env = Env::new("deadfar").await;
    let mut proxies = Vec::new();
    let mut dead = Vec::new();
    for i in 0..9 {
        let (locker, proxy) = env.proxied_locker().await;
        proxies.push(proxy);
        if i == 0 {
            let g = locker.acquire("k", &fast()).await.unwrap();
            dead.push(tokio::spawn(async move {
                let _g = g;
                std::future::pending::<()>().await;
            }));
        } else {
            dead.push(tokio::spawn(async move {
                let _ = locker.acquire("k", &fast()).await;
                std::future::pending::<()>().await;
            }));
        }
        until_queue_len(&env, "k", i + 1).await;
    }
    for p in &proxies {
        p.add_rule(flightlock_testkit::Rule::new(
            flightlock_testkit::Fault::ServerError,
        ));
    }
    let probe = Probe::default();
    let mut live = Vec::new();
    for i in 0..3 {
        let locker = env.locker().await;
        let probe = probe.clone();
        live.push(tokio::spawn(async move {
            let g = locker.acquire("k", &fast()).await.unwrap();
            probe.enter(&format!("w{i}"), g.token());
            probe.leave();
            g.release().await.unwrap();
        }));
        until_queue_len(&env, "k", 10 + i).await;
    }
    // A stuck queue would wait for the sweeper, which does not run here: the limit is only
    // there to end the test.
    tokio::time::timeout(Duration::from_secs(60), async {
        for t in live {
            t.await.unwrap();
        }
    })
    .await
    .expect("the waiters far back never got past the dead rows");
    assert_eq!(probe.order(), ["w0", "w1", "w2"]);
    assert_strictly_increasing(&probe.tokens());
    for d in dead {
        d.abort();
    }
    assert!(
        env.queue("k").await.is_empty(),
        "{:?}",
        env.queue("k").await
    );
}
