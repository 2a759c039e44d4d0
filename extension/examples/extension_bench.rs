//! Overhead benchmark of the flightlock extension (run it in release mode):
//!
//! ```text
//! make layer-x86_64      # or: cargo build --release -p flightlock-extension
//! scripts/dynamodb-local run -- cargo run --release -p flightlock-extension --example extension_bench [-- N]
//! ```
//!
//! It starts the release extension binary on the Lambda platform double
//! (`flightlock_testkit::platform`: Runtime API, Extensions API and Telemetry API of one standard
//! execution environment on 127.0.0.1) and DynamoDB Local, plays the runtime itself, and reports:
//! - the proxy hop alone: a passed-through request via the proxy vs. straight to a double of its
//!   own (the same double, with no extension registered);
//! - a whole invocation (GET next + POST response) via the proxy (lock acquire + release against
//!   DynamoDB Local included) vs. straight to that double, and the DynamoDB requests per gated
//!   invocation (counted by a proxy in front of DynamoDB Local);
//! - init time (spawn → registered with the proxy listening), resident memory (VmRSS / VmHWM);
//! - the lock API (a second extension, `FLIGHTLOCK_GATE=off`, DynamoDB requests counted by a
//!   proxy in front of DynamoDB Local): a record's acquire + release through the API vs. the same
//!   cycle by a `Locker` in this process (the API's own overhead), DynamoDB requests per record
//!   cycle, and 10 records over 10 free keys acquired at once vs. one (taken concurrently, not
//!   one after another);
//! - the layer zip sizes, if `make layer` has built them.
//!
//! `BENCH_WARMUP=K` (default 20) plays K invocations before measuring: a fresh DynamoDB Local
//! answers slower until its JVM has compiled its hot paths (about 1,500 invocations halve the
//! gated overhead). `BENCH_EXT_LOG=debug` shows the extensions' logs (timestamps per decision).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use flightlock_testkit::platform::{Mode, Options, Platform};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const NEXT: &str = "/2018-06-01/runtime/invocation/next";
const INIT_ERROR: &str = "/2018-06-01/runtime/init/error";

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn call(client: &HttpClient, method: &str, addr: SocketAddr, path: &str) -> Bytes {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(Full::new(if method == "GET" {
            Bytes::new()
        } else {
            Bytes::from_static(b"{\"ok\":true}")
        }))
        .unwrap();
    let r = client.request(req).await.unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
    r.into_body().collect().await.unwrap().to_bytes()
}

/// One invocation of `platform` as a runtime sees it through `addr` (the proxy, or the double
/// itself): next, then response. A registered extension gets the INVOKE event from the double,
/// as in Lambda.
async fn invocation(client: &HttpClient, platform: &Platform, addr: SocketAddr) {
    let id = platform.invoke(serde_json::json!({"detail": {"job": "bench"}}));
    let _event = call(client, "GET", addr, NEXT).await;
    call(
        client,
        "POST",
        addr,
        &format!("/2018-06-01/runtime/invocation/{id}/response"),
    )
    .await;
}

/// A lock API call through the proxy at `addr`; returns the status.
async fn api(
    client: &HttpClient,
    addr: SocketAddr,
    id: &str,
    op: &str,
    body: serde_json::Value,
) -> hyper::StatusCode {
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/flightlock/v1/invocations/{id}/{op}"))
        .header("x-flightlock-token", API_TOKEN)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let r = client.request(req).await.unwrap();
    let status = r.status();
    let _ = r.into_body().collect().await;
    status
}

/// Keys the record cycles rotate over (each warmed once).
const KEYS: usize = 50;
const API_TOKEN: &str = "bench-session-token";

/// Starts the extension binary `bin` on `platform` with `vars` besides the common ones; returns
/// the child and the proxy's address once it registered.
async fn start_extension(
    bin: &std::path::Path,
    platform: &Platform,
    endpoint: &str,
    table: &str,
    vars: &[(&str, &str)],
) -> (tokio::process::Child, SocketAddr) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = tokio::process::Command::new(bin)
        .env_clear()
        .envs(platform.lambda_env())
        .env("AWS_LAMBDA_FUNCTION_NAME", "bench")
        .env("AWS_ENDPOINT_URL_DYNAMODB", endpoint)
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_SESSION_TOKEN", API_TOKEN)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("FLIGHTLOCK_TABLE", table)
        .env("FLIGHTLOCK_PROXY_PORT", port.to_string())
        .env(
            "FLIGHTLOCK_LOG_LEVEL",
            std::env::var("BENCH_EXT_LOG").unwrap_or("warn".into()),
        )
        .envs(vars.iter().copied())
        .stdout(if std::env::var_os("BENCH_EXT_LOG").is_some() {
            std::process::Stdio::inherit()
        } else {
            std::process::Stdio::null()
        })
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    assert!(
        platform.wait_registered(1, Duration::from_secs(10)).await,
        "the extension did not register: {:?}",
        platform.refusals()
    );
    (child, format!("127.0.0.1:{port}").parse().unwrap())
}

/// The lock API's figures (see the module docs), printed as rows.
async fn lock_api_bench(bin: &std::path::Path, endpoint: &str, table: &str, n: usize) {
    let counter = flightlock_testkit::FaultProxy::start(endpoint)
        .await
        .unwrap();
    let platform = Platform::start(Options::new(Mode::Standard)).await;
    let (mut child, addr) = start_extension(
        bin,
        &platform,
        &counter.endpoint(),
        table,
        &[("FLIGHTLOCK_GATE", "off")],
    )
    .await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let locker =
        flightlock::Locker::new(flightlock_testkit::client(&counter.endpoint()).await, table);
    let options = flightlock::LockOptions::default();
    let id = platform.invoke(serde_json::json!({"Records": []}));
    let _event = call(&client, "GET", addr, NEXT).await;
    let key = |i: usize| serde_json::json!({ "key": format!("record-{}", i % KEYS) });
    // Warm up both paths, every key once (a key this process never released costs a read).
    for i in 0..KEYS {
        assert!(api(&client, addr, &id, "acquire", key(i))
            .await
            .is_success());
        assert!(api(&client, addr, &id, "release", key(i))
            .await
            .is_success());
        let g = locker
            .acquire(&format!("direct-{}", i % KEYS), &options)
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    let (mut via_api, mut direct) = (Vec::new(), Vec::new());
    let mut api_requests = 0;
    for i in 0..n {
        counter.reset_counts();
        let t = Instant::now();
        assert!(api(&client, addr, &id, "acquire", key(i))
            .await
            .is_success());
        assert!(api(&client, addr, &id, "release", key(i))
            .await
            .is_success());
        via_api.push(t.elapsed());
        api_requests += counter.total();
        let t = Instant::now();
        let g = locker
            .acquire(&format!("direct-{}", i % KEYS), &options)
            .await
            .unwrap();
        g.release().await.unwrap();
        direct.push(t.elapsed());
    }
    // A batch of 10 records over 10 free keys: all at once, against one alone.
    let (mut one, mut ten) = (Vec::new(), Vec::new());
    for round in 0..(n / 10).max(5) {
        let keys: Vec<serde_json::Value> = (0..10)
            .map(|k| serde_json::json!({ "key": format!("batch-{round}-{k}") }))
            .collect();
        let t = Instant::now();
        assert!(api(&client, addr, &id, "acquire", keys[0].clone())
            .await
            .is_success());
        one.push(t.elapsed());
        assert!(api(&client, addr, &id, "release", keys[0].clone())
            .await
            .is_success());
        let t = Instant::now();
        let all = futures::future::join_all(
            keys.iter()
                .map(|k| api(&client, addr, &id, "acquire", k.clone())),
        )
        .await;
        ten.push(t.elapsed());
        assert!(all.iter().all(|s| s.is_success()), "{all:?}");
        futures::future::join_all(
            keys.iter()
                .map(|k| api(&client, addr, &id, "release", k.clone())),
        )
        .await;
    }
    call(
        &client,
        "POST",
        addr,
        &format!("/2018-06-01/runtime/invocation/{id}/response"),
    )
    .await;
    platform.shutdown("spindown");
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;

    let (a50, a99) = (pct(via_api.clone(), 0.5), pct(via_api, 0.99));
    let (d50, d99) = (pct(direct.clone(), 0.5), pct(direct, 0.99));
    println!(
        "  {:<58} {d50:>10.3} {d99:>10.3}",
        "record acquire + release by a Locker in process"
    );
    println!(
        "  {:<58} {a50:>10.3} {a99:>10.3}",
        "record acquire + release through the lock API"
    );
    println!(
        "  {:<58} {:>10.3} {:>10.3}",
        "  => lock API overhead per record (target < 1 ms)",
        a50 - d50,
        a99 - d99
    );
    println!(
        "  {:<58} {:>10.3} {:>10.3}",
        "10 records over 10 free keys, acquired at once",
        pct(ten.clone(), 0.5),
        pct(ten, 0.99)
    );
    println!(
        "  {:<58} {:>10.3} {:>10.3}",
        "  one record alone (10 one after another: 10 x this)",
        pct(one.clone(), 0.5),
        pct(one, 0.99)
    );
    println!(
        "  DynamoDB requests per uncontended record cycle through the API, target 2: {:.2}",
        api_requests as f64 / n as f64
    );
}

fn pct(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

fn rss_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The most recently changed Rust source the extension is built from, and when.
fn newest_source(root: &std::path::Path) -> Option<(std::time::SystemTime, std::path::PathBuf)> {
    let mut newest = None;
    let mut dirs: Vec<std::path::PathBuf> = ["lock/src", "lambda/src", "extension/src"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let changed = entry.metadata().and_then(|m| m.modified()).ok();
                if let Some(changed) = changed {
                    if newest.as_ref().is_none_or(|(t, _)| changed > *t) {
                        newest = Some((changed, path));
                    }
                }
            }
        }
    }
    newest
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(500);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The binary the x86_64 layer ships (`make layer-x86_64`), else a plain release build.
    let bin = [
        "target/lambda/x86_64/extensions/flightlock-extension",
        "target/release/flightlock-extension",
    ]
    .iter()
    .map(|p| root.join(p))
    .find(|p| p.is_file())
    .expect("no release build of the extension: run `make layer-x86_64` or `cargo build --release -p flightlock-extension` first");
    // A binary older than the sources would be measured silently in their place.
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
    let newest = newest_source(&root);
    if let (Some(built), Some((changed, file))) = (built, newest) {
        assert!(
            built >= changed,
            "{} is older than {}: rebuild it (`make layer-x86_64` or `cargo build --release -p \
             flightlock-extension`) so the figures are this code's",
            bin.display(),
            file.display()
        );
    }
    let flightlock_testkit::FreshTable {
        endpoint, table, ..
    } = flightlock_testkit::fresh_table("bench_ext").await;
    eprintln!("bench: created table {table}");

    // The extension's environment, and one without an extension for the straight baseline.
    let platform = Platform::start(Options::new(Mode::Standard)).await;
    let direct = Platform::start(Options::new(Mode::Standard)).await;
    let api_addr = direct.addr();
    let started = Instant::now();
    // The gated extension's DynamoDB requests pass a counting proxy, as the lock API's do.
    let counter = flightlock_testkit::FaultProxy::start(&endpoint)
        .await
        .unwrap();
    let (mut child, proxy_addr) =
        start_extension(&bin, &platform, &counter.endpoint(), &table, &[]).await;
    let pid = child.id().unwrap();
    let init = started.elapsed();
    let rss_idle = rss_kb(pid, "VmRSS:").unwrap_or(0);

    eprintln!("bench: extension registered after {init:?}; warming up");
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    // Warm up both paths (connections, the SDK's first request).
    let warmup: usize = std::env::var("BENCH_WARMUP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for _ in 0..warmup {
        call(&client, "POST", api_addr, INIT_ERROR).await;
        call(&client, "POST", proxy_addr, INIT_ERROR).await;
        invocation(&client, &direct, api_addr).await;
        invocation(&client, &platform, proxy_addr).await;
    }
    eprintln!("bench: measuring {n} samples");
    counter.reset_counts();
    let (mut hop_direct, mut hop_proxy, mut inv_direct, mut inv_proxy) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        call(&client, "POST", api_addr, INIT_ERROR).await;
        hop_direct.push(t.elapsed());
        let t = Instant::now();
        call(&client, "POST", proxy_addr, INIT_ERROR).await;
        hop_proxy.push(t.elapsed());
        let t = Instant::now();
        invocation(&client, &direct, api_addr).await;
        inv_direct.push(t.elapsed());
        let t = Instant::now();
        invocation(&client, &platform, proxy_addr).await;
        inv_proxy.push(t.elapsed());
    }
    let gated_requests = counter.total() as f64 / n as f64;
    let rss_peak = rss_kb(pid, "VmHWM:").unwrap_or(0);
    let rss_after = rss_kb(pid, "VmRSS:").unwrap_or(0);

    // SHUTDOWN: the extension releases and exits.
    platform.shutdown("spindown");
    let exited = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;

    let (d50, d99) = (pct(hop_direct.clone(), 0.5), pct(hop_direct, 0.99));
    let (p50, p99) = (pct(hop_proxy.clone(), 0.5), pct(hop_proxy, 0.99));
    let (id50, id99) = (pct(inv_direct.clone(), 0.5), pct(inv_direct, 0.99));
    let (ip50, ip99) = (pct(inv_proxy.clone(), 0.5), pct(inv_proxy, 0.99));
    println!(
        "flightlock extension benchmark: {} ({n} samples each, DynamoDB Local at {endpoint})",
        bin.display()
    );
    println!("  {:<58} {:>10} {:>10}", "measure", "p50 ms", "p99 ms");
    println!(
        "  {:<58} {d50:>10.3} {d99:>10.3}",
        "request straight to the API"
    );
    println!(
        "  {:<58} {p50:>10.3} {p99:>10.3}",
        "request through the proxy"
    );
    println!(
        "  {:<58} {:>10.3} {:>10.3}",
        "  => proxy hop overhead (target p99 < 1 ms)",
        p50 - d50,
        p99 - d99
    );
    println!(
        "  {:<58} {id50:>10.3} {id99:>10.3}",
        "invocation (next + response) straight to the API"
    );
    println!(
        "  {:<58} {ip50:>10.3} {ip99:>10.3}",
        "invocation through the proxy, lock acquire + release"
    );
    println!(
        "  {:<58} {:>10.3} {:>10.3}",
        "  => proxy + lock overhead per invocation",
        ip50 - id50,
        ip99 - id99
    );
    println!("  DynamoDB requests per gated invocation, target 2: {gated_requests:.2}");
    println!(
        "  init (spawn -> proxy listening + registered), target < 50 ms: {:.1} ms",
        init.as_secs_f64() * 1000.0
    );
    println!(
        "  resident memory, target < 20 MB: idle {:.1} MB, after the run {:.1} MB, peak {:.1} MB",
        rss_idle as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        rss_peak as f64 / 1024.0
    );
    println!(
        "  shutdown: {}",
        match exited {
            Ok(Ok(s)) => format!("exited ({s})"),
            _ => "did not exit within 5 s".to_owned(),
        }
    );
    lock_api_bench(&bin, &endpoint, &table, n).await;
    for arch in ["x86_64", "arm64"] {
        let zip = root.join(format!("target/layer/flightlock-layer-{arch}.zip"));
        match std::fs::metadata(&zip) {
            Ok(m) => println!(
                "  layer zip {arch}, target < 10 MB: {:.2} MB ({} bytes)",
                m.len() as f64 / 1_048_576.0,
                m.len()
            ),
            Err(_) => println!("  layer zip {arch}: not built (run `make layer`)"),
        }
    }
}
