//! The real `flightlock-cleanup` binary under the Lambda Runtime Interface Emulator (shipped in
//! the aws-sam-cli wheel that `scripts/python-tools` puts in .tools/py-venv),
//! against DynamoDB Local: the invocation returns the summary, and stdout carries the EMF line.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flightlock::schema::{queue_sk, s, seed, PK, SK};
use flightlock::{Clock, SystemClock};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The emulator binary for this machine: `FLIGHTLOCK_RIE`, or what `scripts/python-tools`
/// installs (the aws-sam-cli wheel ships it).
fn rie() -> PathBuf {
    if let Ok(path) = std::env::var("FLIGHTLOCK_RIE") {
        return PathBuf::from(path);
    }
    let out = Command::new(repo_root().join("scripts/python-tools"))
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/python-tools failed");
    let exports = String::from_utf8(out.stdout).unwrap();
    let path = exports
        .lines()
        .find_map(|l| l.strip_prefix("export FLIGHTLOCK_RIE="))
        .expect("scripts/python-tools printed no FLIGHTLOCK_RIE");
    PathBuf::from(path.trim())
}

/// Kills the emulator (and with it the function) when the test ends, even on panic.
struct Emulator(Child);

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn invoke(port: u16, body: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("emulator never listened: {e}"),
        }
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        stream,
        "POST /2015-03-31/functions/function/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{response}");
    body.to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_function_sweeps_under_the_runtime_emulator() {
    let flightlock_testkit::FreshTable {
        endpoint,
        client,
        table,
    } = flightlock_testkit::fresh_table("cleanup_rie").await;
    let now = SystemClock.wall_ms();
    let item = seed::row("dead", 1, "o", "r", now - 3_600_000);
    client
        .put_item()
        .table_name(&table)
        .set_item(Some(item))
        .send()
        .await
        .unwrap();

    let rie = tokio::task::spawn_blocking(rie).await.unwrap();
    let port = flightlock_testkit::free_port();
    let stdout = std::env::temp_dir().join(format!("{table}.out"));
    let child = Command::new(rie)
        .arg("--runtime-interface-emulator-address")
        .arg(format!("127.0.0.1:{port}"))
        .arg(env!("CARGO_BIN_EXE_flightlock-cleanup"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FLIGHTLOCK_TABLE", &table)
        .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoint)
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_LAMBDA_FUNCTION_TIMEOUT", "30")
        .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        // The emulator's own log; shown by the assertion below when the EMF check fails.
        .stderr(std::fs::File::create(stdout.with_extension("err")).unwrap())
        .spawn()
        .unwrap();
    let _emulator = Emulator(child);

    let dry = include_str!("../../../events/cleanup-dry-run.json").to_owned();
    let body = tokio::task::spawn_blocking(move || invoke(port, &dry))
        .await
        .unwrap();
    let summary: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(summary["dryRun"], true, "{body}");
    assert_eq!(summary["dead"], 1);
    assert_eq!(summary["deleted"], 0);
    assert_eq!(summary["complete"], true);

    let scheduled = include_str!("../../../events/scheduled.json").to_owned();
    let body = tokio::task::spawn_blocking(move || invoke(port, &scheduled))
        .await
        .unwrap();
    let summary: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(summary["deleted"], 1, "{body}");
    let gone = client
        .get_item()
        .table_name(&table)
        .key(PK, s("dead"))
        .key(SK, s(&queue_sk(1)))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .is_none();
    assert!(gone);

    // The function's stdout: JSON logs and one EMF document per invocation.
    let out = std::fs::read_to_string(&stdout).unwrap();
    let emf: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("_aws").is_some())
        .collect();
    let emulator_log = std::fs::read_to_string(stdout.with_extension("err")).unwrap_or_default();
    assert_eq!(emf.len(), 2, "{out}\n{emulator_log}");
    assert_eq!(emf[1]["SweepDeleted"], 1);
    assert_eq!(emf[1]["Table"], table.as_str());
    let logs = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|v| v["fields"]["message"] == "sweep finished");
    assert!(logs, "no JSON log line for the sweep:\n{out}");
    let _ = std::fs::remove_file(&stdout);
    let _ = std::fs::remove_file(stdout.with_extension("err"));
}
