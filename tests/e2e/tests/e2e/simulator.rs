//! The layer under a Lambda simulator nobody here wrote: the `lambda-simulator` crate
//! (crates.io, djvcom/lambda-observability; Runtime, Extensions and Telemetry APIs). The real
//! extension binary registers with it, its proxy gates an invocation through DynamoDB Local, and
//! SHUTDOWN releases and ends it.
//!
//! Two differences from AWS's documented contract, and what the test does about them:
//! - The simulator sets `AWS_EXECUTION_ENV=AWS_Lambda_provided.al2`; AWS leaves that variable
//!   unset for OS-only (`provided`) runtimes (Lambda "Defined runtime environment variables").
//!   The extension's init check therefore takes this for a managed runtime and requires the exec
//!   wrapper, so the test sets `AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper` as a function on
//!   a managed runtime would.
//! - Its process freeze (`FreezeMode::Process`) stops the registered processes once the response
//!   has arrived and the extensions are back in `/next`, without waiting for the runtime's next
//!   `/next`; AWS freezes only when the runtime has asked for its next event too ("Lambda
//!   execution environment lifecycle"). The proxy releases the lock between those two moments, so
//!   under that freeze a release can be stopped halfway: freeze stays off here, and the freeze
//!   rule is tested on our platform double (`platform_modes.rs`), which follows AWS's wording.

use std::process::Stdio;
use std::time::Duration;

use flightlock_e2e::sandbox::{queue, released};
use flightlock_e2e::{free_port, table, workspace_bin};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lambda_simulator::{InvocationStatus, ShutdownReason, Simulator, SimulatorPhase};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extension_gates_an_invocation_under_lambda_simulator() {
    let (endpoint, table) = table("e2e_simulator").await;
    let sim = Simulator::builder()
        .function_name("sim-fn")
        .build()
        .await
        .unwrap();
    let proxy_port = free_port();
    let log = std::env::temp_dir().join(format!("flightlock-sim-{}.log", std::process::id()));
    let mut ext = tokio::process::Command::new(workspace_bin("flightlock-extension"))
        .env_clear()
        .envs(sim.lambda_env_vars())
        .env("AWS_LAMBDA_EXEC_WRAPPER", "/opt/flightlock-wrapper")
        .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoint)
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("FLIGHTLOCK_TABLE", &table)
        .env("FLIGHTLOCK_PROXY_PORT", proxy_port.to_string())
        .env("FLIGHTLOCK_KEY", "sim-job")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    sim.wait_for(
        || async { sim.extension_count().await >= 1 },
        Duration::from_secs(20),
    )
    .await
    .unwrap_or_else(|e| panic!("the extension did not register: {e}\n{}", read_log()));
    let registered = sim.get_registered_extensions().await;
    assert_eq!(registered.len(), 1, "{registered:?}");

    // This test is the runtime, talking to the proxy as a wrapped runtime would. Its first
    // `/next` ends init (Lambda invokes only after it); then the invocation comes.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let next = http::Request::get(format!(
        "http://127.0.0.1:{proxy_port}/2018-06-01/runtime/invocation/next"
    ))
    .body(Full::default())
    .unwrap();
    let waiting = tokio::spawn(client.request(next));
    sim.wait_for_phase(SimulatorPhase::Ready, Duration::from_secs(10))
        .await
        .unwrap();
    let id = sim.enqueue_payload(json!({"job": 1})).await;
    let resp = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("no event through the proxy")
        .unwrap()
        .unwrap();
    assert_eq!(resp.headers()["lambda-runtime-aws-request-id"], id.as_str());
    // Handed over with the lock held.
    assert_eq!(
        queue(&endpoint, &table, "sim-job").await,
        1,
        "{}",
        read_log()
    );
    let answer = http::Request::post(format!(
        "http://127.0.0.1:{proxy_port}/2018-06-01/runtime/invocation/{id}/response"
    ))
    .body(Full::new(bytes::Bytes::from_static(b"{\"done\":true}")))
    .unwrap();
    let status = client.request(answer).await.unwrap().status();
    assert!(status.is_success(), "{status}");
    assert!(released(&endpoint, &table, "sim-job", Duration::from_secs(5)).await);
    let state = sim
        .wait_for_invocation_complete(&id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(state.status, InvocationStatus::Success);
    assert!(!read_log().contains("UNENFORCED"), "{}", read_log());

    sim.graceful_shutdown(ShutdownReason::Spindown).await;
    let exit = tokio::time::timeout(Duration::from_secs(10), ext.wait())
        .await
        .expect("the extension did not exit after SHUTDOWN")
        .unwrap();
    assert!(exit.success(), "{exit}\n{}", read_log());
    let _ = std::fs::remove_file(&log);
}
