//! `flightlock-extension` (shipped as `/opt/extensions/flightlock`): config, register, start the
//! proxy, run. See the crate docs of `flightlock_extension`.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use flightlock::config::{self, Config};
use flightlock::Locker;
use flightlock_extension::invocations::Invocations;
use flightlock_extension::lifecycle;
use flightlock_extension::metrics::Metrics;
use flightlock_extension::proxy::{self, Proxy};
use flightlock_extension::wrapper_check;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lambda_extension::{service_fn, Extension, LambdaEvent};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tracing_subscriber::EnvFilter;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    // The only place the process environment is read; everything below gets this map.
    let env: HashMap<String, String> = std::env::vars().collect();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flightlock: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(env)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "flightlock extension failed");
            eprintln!("flightlock: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(env: &HashMap<String, String>, level: &str) {
    let filter = EnvFilter::new(format!(
        "warn,flightlock={level},flightlock_extension={level}"
    ));
    let json = env
        .get("AWS_LAMBDA_LOG_FORMAT")
        .is_some_and(|f| f.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let _ = if json {
        builder.json().with_current_span(true).try_init()
    } else {
        builder.try_init()
    };
}

/// The extension's name: the file name it was started as (Lambda requires it to match the file
/// in /opt/extensions).
fn extension_name() -> String {
    std::env::args()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "flightlock".to_owned())
}

fn host_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "lambda".to_owned());
    format!("{host}:{}", std::process::id())
}

async fn run(env: HashMap<String, String>) -> Result<(), BoxError> {
    if !env.contains_key(config::RUNTIME_API) {
        return Err(format!(
            "{} is not set: flightlock-extension runs inside Lambda (or an emulator) only",
            config::RUNTIME_API
        )
        .into());
    }
    let name = extension_name();
    // 1. Configuration. A bad value fails init with a message naming the variable.
    let config = match Config::from_map(&env) {
        Ok(c) => c,
        Err(e) => {
            init_tracing(&env, "info");
            tracing::error!(error = %e, "invalid flightlock configuration");
            fail_init(&env, &name, &e.to_string()).await;
            return Err(e.into());
        }
    };
    init_tracing(&env, &config.log_level);
    // Unenforced is caught before the first handler runs: a managed runtime that does not start
    // through the wrapper fails init, saying what to set.
    if let Err(msg) = wrapper_check::check(&env, &config) {
        tracing::error!(error = %msg, "flightlock is not wired in");
        fail_init(&env, &name, &msg).await;
        return Err(msg.into());
    }
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let config = Arc::new(config);
    let upstream = config
        .upstream
        .clone()
        .ok_or("no Runtime API upstream (set AWS_LAMBDA_RUNTIME_API or FLIGHTLOCK_UPSTREAM)")?;

    // 2. The lock. Credentials and endpoint come from the function's environment; nothing is
    // fetched until the first acquisition. Each decision is also bounded by the invocation's
    // deadline (see `proxy::decision_budget`); the SDK timeouts make a hung attempt give way to
    // a retry well inside that budget.
    let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(proxy::SDK_CONNECT_TIMEOUT)
                .operation_attempt_timeout(proxy::SDK_ATTEMPT_TIMEOUT)
                .build(),
        )
        .load()
        .await;
    let locker = Locker::new(aws_sdk_dynamodb::Client::new(&aws), &config.table);

    // 3. The proxy listens before we register, so it is up before the runtime starts.
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, config.proxy_port));
    let listener = match TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            let msg = format!(
                "{}={}: cannot listen on {addr}: {e}; choose a free port (1-65535)",
                config::PROXY_PORT,
                config.proxy_port
            );
            fail_init(&env, &name, &msg).await;
            return Err(msg.into());
        }
    };
    let function = config.function_name.clone().unwrap_or_default();
    let proxy = Arc::new(Proxy::new(
        config.clone(),
        locker,
        Arc::new(Invocations::default()),
        Metrics::new(config.metrics, function),
        upstream,
        host_name(),
    ));
    tokio::spawn(proxy.clone().serve(listener));
    tracing::info!(%addr, key = %config.key, table = %config.table, "flightlock proxy listening");

    // 4. Register for INVOKE and SHUTDOWN and run until SHUTDOWN.
    let (shutdown_tx, mut shutdown_rx) = mpsc::channel::<()>(1);
    let events = service_fn(move |event: LambdaEvent| {
        lifecycle::on_event(proxy.clone(), event, shutdown_tx.clone())
    });
    let extension = Extension::new()
        .with_extension_name(&name)
        .with_events(&["INVOKE", "SHUTDOWN"])
        .with_events_processor(events)
        .register()
        .await?;
    tokio::select! {
        r = extension.run() => r,
        _ = shutdown_rx.recv() => Ok(()),
    }
}

/// Registers (needed for an extension id) and reports an init error, so Lambda fails the init
/// phase with our message instead of a bare "extension crashed".
async fn fail_init(env: &HashMap<String, String>, name: &str, message: &str) {
    let result = async {
        let registered = Extension::new()
            .with_extension_name(name)
            .with_events(&["SHUTDOWN"])
            .register()
            .await?;
        let api =
            config::runtime_api_authority(env.get(config::RUNTIME_API).map_or("", String::as_str))?;
        let body = serde_json::json!({
            "errorMessage": message,
            "errorType": "Extension.ConfigInvalid",
            "stackTrace": [],
        });
        let req = http::Request::post(format!("http://{api}/2020-01-01/extension/init/error"))
            .header("Lambda-Extension-Identifier", &registered.extension_id)
            .header(
                "Lambda-Extension-Function-Error-Type",
                "Extension.ConfigInvalid",
            )
            .header("Content-Type", "application/json")
            .body(Full::new(bytes::Bytes::from(body.to_string())))?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        let resp = tokio::time::timeout(Duration::from_secs(2), client.request(req)).await??;
        let _ = resp.into_body().collect().await;
        Ok::<(), BoxError>(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not report the init error to the Extensions API");
    }
}
