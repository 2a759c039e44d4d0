//! End-to-end with the Node.js runtime interface client `aws-lambda-ric` from npm (3.3.x on
//! Node 20), started through `/opt/flightlock-wrapper` as Lambda's managed Node.js runtime would
//! be; and FIFO across three runtime clients that are not ours (Node.js, Python, bash + curl).
//! Needs `eval "$(scripts/node-tools)"` besides the usual e2e tools.

use flightlock_e2e::{
    fifo_round, finish, record_file, runs, skip_rounds, start_all, stop_all, table, Env, Runtime,
    Spec,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_runtime_single_flight_skip() {
    let (endpoint, table) = table("e2e_node_skip").await;
    let record = record_file("node-skip");
    let specs: Vec<Spec> = (0..3)
        .map(|_| Spec::layered("nodeskip", Runtime::Node).with("FLIGHTLOCK_WAIT", "0"))
        .collect();
    let envs = start_all("node", &specs, &endpoint, &table, &record).await;
    skip_rounds(&envs, &record, "nodeskip", 1500).await;
    for e in &envs {
        assert!(!e.log().contains("UNENFORCED"), "{}", e.log());
    }
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_across_node_python_and_curl_runtimes() {
    let (endpoint, table) = table("e2e_three_fifo").await;
    let record = record_file("three-fifo");
    let specs: Vec<Spec> = [Runtime::Node, Runtime::Python, Runtime::Curl]
        .into_iter()
        .map(|r| Spec::layered("three", r).with("FLIGHTLOCK_WAIT", "forever"))
        .collect();
    let envs = start_all("mix3", &specs, &endpoint, &table, &record).await;
    fifo_round(&envs, &record).await;
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_handler_error_reaches_the_caller_and_releases_the_lock() {
    let (endpoint, table) = table("e2e_node_err").await;
    let record = record_file("node-err");
    // Lease 20 s and wait 0: a lock left held would skip the next invocation.
    let spec = Spec::layered("nodeerr", Runtime::Node)
        .with("FLIGHTLOCK_WAIT", "0")
        .with("FLIGHTLOCK_LEASE", "20s");
    let env = Env::start("nodeerr", &spec, &endpoint, &table, &record).await;
    let r = env.invoke(json!({"seq": 0, "mode": "error"})).await.json();
    assert_eq!(r["errorType"], "Error", "{r}\n{}", env.log());
    assert!(
        r["errorMessage"]
            .as_str()
            .unwrap_or_default()
            .contains("demo failure"),
        "{r}"
    );
    let r = env.invoke(json!({"seq": 1})).await.json();
    assert_eq!(r["ok"], true, "{r}\n{}", env.log());
    assert_eq!(runs(&record).len(), 2);
    finish(env, &record).await;
}
