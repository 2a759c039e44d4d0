//! A Lambda platform double on 127.0.0.1: the Runtime API, the Extensions API and the Telemetry
//! API of one execution environment, in each execution mode, following AWS's documented contract
//! and **refusing what the platform refuses**. Each rule cites where it comes from; the HTTP side
//! is in `api.rs`.
//!
//! Modes ([`Mode`]):
//! - **Standard** (on-demand): one invocation at a time. Once the runtime and every extension
//!   wait in `/next`, the whole sandbox is frozen (SIGSTOP to the registered process groups) and
//!   thawed (SIGCONT) for the next invoke ("Lambda execution environment lifecycle": "Lambda
//!   freezes the execution environment when the runtime and each extension have completed and
//!   there are no pending events"). An invocation past its deadline is a timeout: the runtime is
//!   stopped first (SIGKILL to its group), then every extension registered for SHUTDOWN gets
//!   SHUTDOWN with reason `timeout` and a 2 s deadline ("Shutdown phase": extensions get up to
//!   2 s; "Failures during the invoke phase": the runtime is reset before SHUTDOWN).
//! - **Managed Instances** (`AWS_LAMBDA_INITIALIZATION_TYPE=lambda-managed-instances`):
//!   registration for INVOKE is refused with 403 `Extension.InvalidEventType` (AWS's emulator,
//!   aws/aws-lambda-runtime-interface-emulator `internal/lambda-managed-instances/core/
//!   externalagent.go` and `rapi/handler/agentregister.go`; open-telemetry/opentelemetry-lambda
//!   PR #2083, honeycombio/honeycomb-lambda-extension PR #170); several runtime processes call
//!   `/next` concurrently, up to `AWS_LAMBDA_MAX_CONCURRENCY` invocations in flight (Lambda
//!   Managed Instances runtime pages); never frozen; no `platform.runtimeDone` in telemetry; the
//!   Logs API answers `Logs.NotSupported` and the Telemetry API accepts schema `2025-01-29` only
//!   (the same emulator: `rapi/handler/runtimelogs_stub.go`, `telemetry-subscription-schema.json`).
//! - **SnapStart**: the runtime's `/2018-06-01/runtime/restore/next` returns once the snapshot
//!   is restored ([`Platform::restore`]) ("Runtime API: Restore"; "SnapStart runtime hooks").
//!
//! Tenant isolation: with [`Options::tenant`], `/next` answers carry `Lambda-Runtime-Aws-Tenant-Id`
//! (Runtime API, "Next invocation" response headers); Lambda never shares an execution
//! environment between tenants, so the tenant is the environment's.
//!
//! The runtime's answers (`answer.rs`): buffered or streamed, read to their end, kept for tests
//! ([`Platform::answer`], [`Platform::first_chunk`]).
//!
//! Faults ([`NextFault`], [`Platform::invoke_with_fault`]) break one delivery the way a network
//! or a broken platform would; they switch no rule off: the invocation is in flight as any other
//! and an answer to it is held to the same rules.

// A test double: panicking with a clear message on a broken test setup is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod answer;
mod api;
mod reply;
mod schedule;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::net::TcpListener;
use tokio::sync::Notify;

pub use answer::{Answer, KEEP};
use schedule::{schedule, shutdown};

/// The execution mode of the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// On-demand: one invocation at a time, freeze between invocations.
    Standard,
    /// Lambda Managed Instances, with `AWS_LAMBDA_MAX_CONCURRENCY`.
    ManagedInstances {
        /// Invocations in flight at most.
        max_concurrency: usize,
    },
    /// SnapStart (otherwise as standard).
    SnapStart,
}

/// How the double behaves.
#[derive(Debug, Clone)]
pub struct Options {
    /// The mode.
    pub mode: Mode,
    /// The tenant id handed to the runtime, if tenant isolation is on.
    pub tenant: Option<String>,
    /// False: the Telemetry API answers `Telemetry.NotSupported` (a platform without it).
    pub telemetry: bool,
    /// Every registration is refused with this (status, errorType, errorMessage): a fault.
    pub refuse_registration: Option<(u16, String, String)>,
    /// Invocation timeout (the deadline of each event).
    pub timeout: Duration,
}

impl Options {
    /// Defaults for `mode`: no tenant, Telemetry API there, 60 s timeout.
    pub fn new(mode: Mode) -> Options {
        Options {
            mode,
            tenant: None,
            telemetry: true,
            refuse_registration: None,
            timeout: Duration::from_secs(60),
        }
    }
}

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `POST .../response`, with its body.
    Response(Bytes),
    /// `POST .../error`, with the error type header and body.
    Error(Option<String>, Bytes),
    /// The deadline passed first.
    TimedOut,
}

/// A fault in the delivery of one invocation's event to the runtime's `GET next`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextFault {
    /// The answer lacks `Lambda-Runtime-Aws-Request-Id`.
    NoRequestId,
    /// The answer promises the whole payload (`Content-Length`), sends half and hangs up.
    TruncatedBody,
}

#[derive(Debug)]
struct Ext {
    name: String,
    id: String,
    events: Vec<String>,
    queue: VecDeque<serde_json::Value>,
    waiting: bool,
}

#[derive(Debug, Clone)]
struct Inv {
    id: String,
    payload: Bytes,
    deadline_ms: u64,
    fault: Option<NextFault>,
    /// The `Lambda-Runtime-Trace-Id` header (X-Ray format); `None`: a placeholder root.
    trace: Option<String>,
}

/// A refusal the double answered, for tests to read.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The path asked.
    pub path: String,
    /// The status answered.
    pub status: u16,
    /// The body answered.
    pub body: String,
}

#[derive(Debug, Default)]
struct State {
    exts: Vec<Ext>,
    queue: VecDeque<Inv>,
    running: HashMap<String, Inv>,
    outcomes: HashMap<String, Outcome>,
    answers: HashMap<String, Answer>,
    first_chunks: HashMap<String, Bytes>,
    runtime_waiting: usize,
    runtime_nexts: usize,
    max_in_flight: usize,
    dispatched: usize,
    registration_closed: bool,
    shut_down: bool,
    frozen: bool,
    freezes: usize,
    freeze_groups: Vec<i32>,
    runtime_group: Option<i32>,
    restored: bool,
    init_errors: Vec<(String, Option<String>, String)>,
    refusals: Vec<Refusal>,
    telemetry_uris: Vec<String>,
    next_ext: usize,
    next_inv: usize,
}

struct Shared {
    options: Options,
    state: Mutex<State>,
    changed: Notify,
    addr: SocketAddr,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touch(&self) {
        self.changed.notify_waiters();
    }
}

/// The platform double; dropping it stops its server and background task.
pub struct Platform {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Platform {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        // Never leave a test's processes stopped.
        let s = self.shared.lock();
        signal_groups(&s.freeze_groups, Signal::SIGCONT);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Signals every process group in `groups` (`kill(2)` on `-group`: a system call, not a `kill`
/// process). Callers send it while holding the state lock, so signals reach the sandbox in the
/// order its state changed: a SIGSTOP can never overtake the SIGCONT of the invoke that follows.
fn signal_groups(groups: &[i32], signal: Signal) {
    for g in groups {
        let _ = killpg(Pid::from_raw(*g), signal);
    }
}

impl Platform {
    /// Starts the double on a free port of 127.0.0.1.
    pub async fn start(options: Options) -> Platform {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            options,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            addr,
        });
        let server = tokio::spawn(api::serve(listener, shared.clone()));
        let scheduler = tokio::spawn(schedule(shared.clone()));
        Platform {
            shared,
            tasks: vec![server, scheduler],
        }
    }

    /// `host:port` (what `AWS_LAMBDA_RUNTIME_API` is set to).
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The execution mode.
    pub fn mode(&self) -> Mode {
        self.shared.options.mode
    }

    /// The environment Lambda gives the environment's processes in this mode.
    pub fn lambda_env(&self) -> Vec<(String, String)> {
        let (init_type, concurrency) = match self.shared.options.mode {
            Mode::Standard => ("on-demand", None),
            Mode::ManagedInstances { max_concurrency } => {
                ("lambda-managed-instances", Some(max_concurrency))
            }
            Mode::SnapStart => ("snap-start", None),
        };
        let mut env = vec![
            ("AWS_LAMBDA_RUNTIME_API".to_owned(), self.addr().to_string()),
            (
                "AWS_LAMBDA_INITIALIZATION_TYPE".to_owned(),
                init_type.to_owned(),
            ),
        ];
        if let Some(c) = concurrency {
            env.push(("AWS_LAMBDA_MAX_CONCURRENCY".to_owned(), c.to_string()));
        }
        env
    }

    /// Queues an invocation of `payload`; returns its request id.
    pub fn invoke(&self, payload: serde_json::Value) -> String {
        self.queue(payload, None, None)
    }

    /// Queues an invocation of `payload` whose event reaches the runtime with `fault`; returns
    /// its request id.
    pub fn invoke_with_fault(&self, payload: serde_json::Value, fault: NextFault) -> String {
        self.queue(payload, Some(fault), None)
    }

    /// Queues an invocation of `payload` in the X-Ray trace `trace` (the event's
    /// `Lambda-Runtime-Trace-Id` header, e.g.
    /// `Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1`); returns
    /// its request id.
    pub fn invoke_traced(&self, payload: serde_json::Value, trace: &str) -> String {
        self.queue(payload, None, Some(trace.to_owned()))
    }

    /// Queues `payload` again under the request id `id` of an invocation that has ended, as
    /// Lambda retries an asynchronous invocation (after about 1 and 2 minutes, with the same
    /// request id: a request id names an invocation, not a delivery). The earlier outcome is
    /// forgotten; [`Platform::outcome`] then waits for the retry's.
    pub fn redeliver(&self, id: &str, payload: serde_json::Value) {
        let mut s = self.shared.lock();
        assert!(
            s.outcomes.remove(id).is_some() && !s.running.contains_key(id),
            "Lambda retries an invocation only once it has ended: {id} has not"
        );
        s.queue.push_back(Inv {
            id: id.to_owned(),
            payload: Bytes::from(payload.to_string()),
            deadline_ms: 0,
            fault: None,
            trace: None,
        });
        drop(s);
        self.shared.touch();
    }

    fn queue(
        &self,
        payload: serde_json::Value,
        fault: Option<NextFault>,
        trace: Option<String>,
    ) -> String {
        let mut s = self.shared.lock();
        s.next_inv += 1;
        let id = format!("req-{}-{}", s.next_inv, now_ms() % 100_000);
        s.queue.push_back(Inv {
            id: id.clone(),
            payload: Bytes::from(payload.to_string()),
            deadline_ms: 0,
            fault,
            trace,
        });
        drop(s);
        self.shared.touch();
        id
    }

    /// Waits until invocation `id` ended, at most `limit`.
    pub async fn outcome(&self, id: &str, limit: Duration) -> Option<Outcome> {
        let shared = self.shared.clone();
        wait(&self.shared, limit, move || {
            shared.lock().outcomes.get(id).cloned()
        })
        .await
    }

    /// Waits until the runtime posted an answer to invocation `id` and its body ended or broke,
    /// at most `limit`.
    pub async fn answer(&self, id: &str, limit: Duration) -> Option<Answer> {
        let shared = self.shared.clone();
        wait(&self.shared, limit, move || {
            shared.lock().answers.get(id).cloned()
        })
        .await
    }

    /// Waits until the first chunk of the runtime's answer to `id` arrived (while a streamed
    /// answer still runs), at most `limit`; returns that chunk.
    pub async fn first_chunk(&self, id: &str, limit: Duration) -> Option<Bytes> {
        let shared = self.shared.clone();
        wait(&self.shared, limit, move || {
            shared.lock().first_chunks.get(id).cloned()
        })
        .await
    }

    /// How many runtime `GET invocation/next` requests arrived.
    pub fn runtime_nexts(&self) -> usize {
        self.shared.lock().runtime_nexts
    }

    /// Waits until `f` of the state holds, at most `limit`.
    async fn until(&self, limit: Duration, f: impl Fn(&State) -> bool) -> bool {
        let shared = self.shared.clone();
        wait(&self.shared, limit, move || f(&shared.lock()).then_some(()))
            .await
            .is_some()
    }

    /// Process groups frozen and thawed with the sandbox (the runtime's and the extension's).
    pub fn freeze_groups(&self, groups: &[i32]) {
        self.shared.lock().freeze_groups = groups.to_vec();
    }

    /// The runtime's process group, killed first on a timeout.
    pub fn runtime_group(&self, group: i32) {
        self.shared.lock().runtime_group = Some(group);
    }

    /// True while the sandbox is frozen.
    pub fn is_frozen(&self) -> bool {
        self.shared.lock().frozen
    }

    /// How many times the sandbox has been frozen.
    pub fn freezes(&self) -> usize {
        self.shared.lock().freezes
    }

    /// Waits until the sandbox has been frozen at least `n` times (and is frozen now).
    pub async fn wait_frozen(&self, n: usize, limit: Duration) -> bool {
        self.until(limit, |s| s.frozen && s.freezes >= n).await
    }

    /// Waits until the extensions have registered `n` times.
    pub async fn wait_registered(&self, n: usize, limit: Duration) -> bool {
        self.until(limit, |s| s.exts.len() >= n).await
    }

    /// Waits until an init error was reported.
    pub async fn wait_init_error(&self, limit: Duration) -> bool {
        self.until(limit, |s| !s.init_errors.is_empty()).await
    }

    /// Waits until `n` runtime `/next` calls are pending at once.
    pub async fn wait_runtimes_waiting(&self, n: usize, limit: Duration) -> bool {
        self.until(limit, |s| s.runtime_waiting >= n).await
    }

    /// The registrations accepted: (extension name, events).
    pub fn registrations(&self) -> Vec<(String, Vec<String>)> {
        let s = self.shared.lock();
        s.exts
            .iter()
            .map(|e| (e.name.clone(), e.events.clone()))
            .collect()
    }

    /// The init errors reported: (who, error type header, body).
    pub fn init_errors(&self) -> Vec<(String, Option<String>, String)> {
        self.shared.lock().init_errors.clone()
    }

    /// Every request the double refused.
    pub fn refusals(&self) -> Vec<Refusal> {
        self.shared.lock().refusals.clone()
    }

    /// The most invocations that were in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.shared.lock().max_in_flight
    }

    /// Telemetry destinations subscribed.
    pub fn telemetry_subscribers(&self) -> Vec<String> {
        self.shared.lock().telemetry_uris.clone()
    }

    /// SnapStart: the snapshot is restored; the runtime's `restore/next` returns.
    pub fn restore(&self) {
        self.shared.lock().restored = true;
        self.shared.touch();
    }

    /// Sends SHUTDOWN (reason, 2 s deadline) to every extension registered for it, thawing the
    /// sandbox first.
    pub fn shutdown(&self, reason: &str) {
        shutdown(&self.shared, reason);
    }
}

async fn wait<T>(shared: &Shared, limit: Duration, f: impl Fn() -> Option<T>) -> Option<T> {
    let end = tokio::time::Instant::now() + limit;
    loop {
        let changed = shared.changed.notified();
        if let Some(v) = f() {
            return Some(v);
        }
        if tokio::time::timeout_at(end, changed).await.is_err() {
            return f();
        }
    }
}
