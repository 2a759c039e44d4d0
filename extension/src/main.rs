//! `flightlock-extension` (shipped as `/opt/extensions/flightlock`): config, register, start the
//! proxy, run. See the crate docs of `flightlock_extension`.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use flightlock::Locker;
use flightlock_extension::config::{self, Settings};
use flightlock_extension::extensions_api::{ApiError, ExtensionsApi};
use flightlock_extension::invocations::{Invocations, FORGET_AFTER};
use flightlock_extension::lifecycle;
use flightlock_extension::mode::{self, Mode};
use flightlock_extension::proxy::{self, Proxy};
use flightlock_extension::{build_info, otel, telemetry, wrapper_check};
use flightlock_lambda::config::{Config, PROXY_PORT};
use flightlock_lambda::gate::Gate;
use tokio::net::TcpListener;
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

async fn run(env: HashMap<String, String>) -> Result<(), BoxError> {
    if !env.contains_key(config::RUNTIME_API) {
        return Err(format!(
            "{} is not set: flightlock-extension runs inside Lambda (or an emulator) only",
            config::RUNTIME_API
        )
        .into());
    }
    let name = extension_name();
    let mode = Mode::from_env(&env);
    let api = ExtensionsApi::new(
        &config::runtime_api_authority(env.get(config::RUNTIME_API).map_or("", String::as_str))
            .map_err(|e| format!("{}: {e}", config::RUNTIME_API))?,
    );
    // 1. Configuration. A bad value fails init with a message naming the variable.
    let (config, settings) =
        match Config::from_map(&env).and_then(|c| Ok((c, Settings::from_map(&env)?))) {
            Ok(both) => both,
            Err(e) => {
                init_tracing(&env, "info");
                tracing::error!(error = %e, "invalid flightlock configuration");
                fail_init(&api, &name, &e.to_string()).await;
                return Err(e.into());
            }
        };
    init_tracing(&env, &config.log_level);
    // Unenforced is caught before the first handler runs: a managed runtime that does not start
    // through the wrapper fails init, saying what to set.
    if let Err(msg) = wrapper_check::check(&env, &settings) {
        tracing::error!(error = %msg, "flightlock is not wired in");
        fail_init(&api, &name, &msg).await;
        return Err(msg.into());
    }
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    if !config.gate {
        tracing::info!(
            "FLIGHTLOCK_GATE=off: no invocation is gated (FLIGHTLOCK_KEY, FLIGHTLOCK_ON_BUSY, \
             FLIGHTLOCK_TICK and FLIGHTLOCK_COALESCE are not used); the handler locks through \
             the lock API"
        );
    }
    if settings.api_token.is_none() {
        tracing::warn!(
            "neither AWS_SESSION_TOKEN nor AWS_CONTAINER_AUTHORIZATION_TOKEN is set: the lock \
             API refuses every call (Lambda sets one of them; set AWS_SESSION_TOKEN when \
             emulating Lambda locally)"
        );
    }
    let config = Arc::new(config);
    let upstream = settings
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
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, settings.proxy_port));
    let listener = match TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            let msg = format!(
                "{}={}: cannot listen on {addr}: {e}; choose a free port (1-65535)",
                PROXY_PORT, settings.proxy_port
            );
            fail_init(&api, &name, &msg).await;
            return Err(msg.into());
        }
    };
    // On Managed Instances finished invocations are not collected by INVOKE watches: keep them
    // only as long as a late `platform.start` (buffered at most 30 s) may still ask about them.
    let invocations = match mode {
        Mode::Standard => Invocations::forgetting_after(FORGET_AFTER),
        Mode::ManagedInstances => Invocations::forgetting_after(Duration::from_secs(120)),
    };
    let mut proxy = Proxy::new(
        Gate::new(config.clone(), locker, flightlock_lambda::gate::host_id()),
        Arc::new(invocations),
        upstream,
    )
    .with_port(settings.proxy_port)
    .with_mode(mode)
    .with_api_token(settings.api_token.clone())
    .with_limits(proxy::Limits {
        max_connections: mode::connection_cap(&env),
        ..proxy::Limits::default()
    });
    if let Some(traces) = start_traces(&env, config.function_name.as_deref()) {
        proxy = proxy.with_traces(traces);
    }
    let proxy = Arc::new(proxy);
    tokio::spawn(proxy.clone().serve(listener));
    tracing::info!(
        version = build_info::VERSION,
        commit = build_info::COMMIT,
        %addr,
        key = %config.key,
        tick = %config.tick,
        table = %config.table,
        mode = mode.name(),
        "flightlock proxy listening"
    );

    // 4. Register (INVOKE and SHUTDOWN; SHUTDOWN only on Managed Instances, which refuses
    // INVOKE) and run until SHUTDOWN. A refusal is an init error naming the cause and the fix.
    let id = match api.register(&name, mode.events()).await {
        Ok(id) => id,
        Err(ApiError::Refused { status, body, .. }) => {
            let msg = mode::registration_refused(mode, &env, status.as_u16(), &body);
            tracing::error!(error = %msg, "registration refused");
            // Lambda accepts an init error only from a registered extension: try the one
            // registration every mode accepts, to get our message into the init failure.
            if mode.events() != ["SHUTDOWN"] {
                fail_init(&api, &name, &msg).await;
            }
            return Err(msg.into());
        }
        Err(e) => return Err(e.into()),
    };
    if mode == Mode::ManagedInstances {
        match telemetry::start(&api, &id, proxy.clone()).await {
            Ok(()) => tracing::info!(
                "subscribed to the Telemetry API: invocations that bypass the proxy are reported"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "the Telemetry API is not available, so an invocation that bypasses the \
                 flightlock proxy (a runtime process not started through \
                 /opt/flightlock-wrapper) CANNOT be detected here; every invocation fetched \
                 through the proxy is still gated. Start every runtime process through \
                 AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper"
            ),
        }
    }
    loop {
        let event = api.next_event(&id).await?;
        if lifecycle::on_event(proxy.clone(), event).await {
            return Ok(());
        }
    }
}

/// The OTLP export of the wait and hold spans, when an endpoint is configured. An unusable
/// endpoint is logged as an error naming the variable and the accepted forms, and the function
/// runs without the spans: the variables belong to the tracing setup (often another layer),
/// and tracing is no reason to stop gating invocations.
fn start_traces(
    env: &HashMap<String, String>,
    function: Option<&str>,
) -> Option<Arc<otel::Traces>> {
    let endpoint = match otel::traces_endpoint(env) {
        Ok(e) => e?,
        Err(e) => {
            tracing::error!(error = %e, "OTLP spans are not exported");
            return None;
        }
    };
    match otel::Traces::start(&endpoint, otel::service_name(env, function).as_deref()) {
        Ok(t) => {
            tracing::info!(%endpoint, "exporting the lock wait and hold spans of sampled invocations over OTLP");
            Some(t)
        }
        Err(e) => {
            tracing::error!(error = %e, "OTLP spans are not exported");
            None
        }
    }
}

/// Registers (needed for an extension id) and reports an init error, so Lambda fails the init
/// phase with our message instead of a bare "extension crashed".
async fn fail_init(api: &ExtensionsApi, name: &str, message: &str) {
    let result = async {
        let id = api.register(name, &["SHUTDOWN"]).await?;
        api.init_error(&id, "Extension.ConfigInvalid", message)
            .await
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not report the init error to the Extensions API");
        eprintln!("flightlock: could not report the init error to the Extensions API: {e}");
    }
}
