//! End-to-end: every lock decision ends before the invocation's deadline. With DynamoDB
//! unreachable (a blackhole that accepts connections and never answers, or a port that refuses
//! them), `FLIGHTLOCK_WAIT=0` and a 3 s function timeout, the caller gets `FlightlockLockError`
//! from flightlock, not the platform's "Task timed out", and the handler never runs.

use flightlock_e2e::{finish, free_port, record_file, runs, Env, Runtime, Spec};
use serde_json::json;
use tokio::net::TcpListener;

/// Accepts connections and holds them open without ever reading or answering.
async fn blackhole() -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    (endpoint, task)
}

async fn lock_error_within_the_timeout(name: &str, endpoint: &str, wait: &str) {
    let record = record_file(name);
    let spec = Spec {
        timeout_secs: 3,
        ..Spec::layered(name, Runtime::Python).with("FLIGHTLOCK_WAIT", wait)
    };
    let env = Env::start(name, &spec, endpoint, "flightlock-unreachable", &record).await;
    for seq in 0..2 {
        let r = env.invoke(json!({"seq": seq})).await;
        let body = String::from_utf8_lossy(&r.body).into_owned();
        assert!(
            !body.contains("timed out"),
            "{name}: the platform timeout answered, not flightlock: {body}\n{}",
            env.log()
        );
        assert_eq!(
            r.json()["errorType"],
            "FlightlockLockError",
            "{name}: {body}\n{}",
            env.log()
        );
    }
    assert!(runs(&record).is_empty(), "the handler ran without the lock");
    finish(env, &record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_dynamodb_fails_the_invocation_before_its_deadline() {
    let (endpoint, task) = blackhole().await;
    lock_error_within_the_timeout("blackhole", &endpoint, "0").await;
    lock_error_within_the_timeout("blackholewait", &endpoint, "forever").await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_dynamodb_fails_the_invocation_before_its_deadline() {
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    lock_error_within_the_timeout("refused", &endpoint, "0").await;
}
