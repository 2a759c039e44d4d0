//! # flightlock-extension
//!
//! An external Lambda extension that makes an existing function single-flight without code
//! changes: it is also a **Runtime API proxy** on 127.0.0.1. The layer ships the binary as
//! `/opt/extensions/flightlock` and a wrapper script `/opt/flightlock-wrapper`; with
//! `AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper` the runtime fetches its events through the
//! proxy, which takes the DynamoDB lock before handing an event over, heartbeats it while the
//! handler runs, and releases it once the response has gone upstream.
//!
//! ## Layout
//!
//! | module | what |
//! |---|---|
//! | `runtime_api` | Runtime API paths and headers, route classification (pure) |
//! | `proxy` | the proxy (`Proxy`): forward everything; on `GET next` fetch events (fail closed), lock each one within its deadline (through the shared gate), hand it over, and release once it is answered; its parts with a concern of their own: `proxy::fetches` (the `GET next` fetch tasks a disconnecting runtime cannot cancel), `proxy::context` (the ticket written into the handler's client context) |
//! | `invocations` | invocations in flight, by request id (proxy ↔ extension), and each one's crash watch (`Slot::watch`: until it is finished or its runtime's whole process tree is gone) |
//! | `lock_api` | the lock API on the proxy's listener: the handler takes and releases locks of its own (a lock per record of a batch), all released when its invocation ends |
//! | `mode` | the execution mode (standard or Lambda Managed Instances) and what it registers (pure) |
//! | `extensions_api` | the Extensions and Telemetry API client (requests pure, sending thin) |
//! | `lifecycle` | Extensions API events: INVOKE (wait until done; unenforced detection), SHUTDOWN; the Managed Instances unenforced check |
//! | `telemetry` | Managed Instances: `platform.start` from the Telemetry API drives the unenforced check |
//! | `processes` | the runtime's processes: which one got each event (`Processes`), found in `/proc` as the process the wrapper exec'd (`processes::runtime`: a runtime whose whole process tree dies mid-invocation releases at once) or, on Managed Instances, as the one on the other end of each connection (`processes::peer`: `/proc/net/tcp` → socket → process → wrapped ancestor) |
//! | `otel` | with an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`): spans of the lock wait and the hold in the invocation's trace, sent off the hot path, flushed at SHUTDOWN |
//! | `body` | streamed bodies, end-of-body notification |
//! | `build_info` | the version and commit of this build (the init log line names both) |
//! | `config` | the settings only the extension reads: the proxy's port, the upstream Runtime API, the wrapper check (pure) |
//! | `wrapper_check` | init fails on a managed runtime that does not start through the wrapper |
//!
//! Configuration is the `FLIGHTLOCK_*` table in [`flightlock_lambda::config`], plus the
//! extension's own settings ([`config`]). The CloudWatch EMF metrics are the in-process layer's,
//! from [`flightlock_lambda::metrics`]. User docs, the skip and error bodies and the metric names
//! are in the guide (`docs/src/reference/responses.md`, `docs/src/reference/metrics.md`).

pub mod body;
pub mod build_info;
pub mod config;
pub mod extensions_api;
pub mod invocations;
pub mod lifecycle;
pub mod lock_api;
pub mod mode;
pub mod otel;
pub mod processes;
pub mod proxy;
pub mod runtime_api;
pub mod telemetry;
pub mod wrapper_check;
