//! `flightlock run`: acquire, run a command under the lock, release.
//!
//! With `--once ID` the run is for one tick (e.g. the minute of a cron tick,
//! `--once "$(date -u +%Y-%m-%dT%H:%MZ)"`): a command that exits 0 marks the tick done and a
//! later `run --once ID` of the same key (another host's copy of the cron entry, a retry) exits
//! 0 without running, saying so in one stderr line. A command that fails marks nothing.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use flightlock::{EntryState, Error, LockOptions, Locker, ReleaseOutcome, Tick};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    explained, Conn, LockArgs, EXIT_BUSY, EXIT_CANNOT_RUN, EXIT_LOST, EXIT_NOT_FOUND, EXIT_USAGE,
};

/// How often a waiting `run` says on stderr what it waits for, so a waiting terminal is never
/// silent (the first line comes after one period: a quick acquisition prints nothing).
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How long one progress look at the queue may take; a slower answer is reported as such.
const PROGRESS_LOOK: Duration = Duration::from_secs(3);

/// Arguments of `flightlock run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Lock key (1..=1024 bytes of UTF-8).
    #[arg(long)]
    key: String,
    #[command(flatten)]
    pub(crate) lock: LockArgs,
    /// If the lock is lost while CMD runs, send CMD SIGTERM (then SIGKILL after 10 s).
    #[arg(long)]
    kill_on_lost: bool,
    /// Run at most once successfully for this tick: an RFC 3339 time (2026-11-24T10:00Z; the
    /// seconds and the zone are optional, UTC if none) is ordered and free, anything else is
    /// an id kept for --once-keep. A tick already done exits 0 without running CMD; CMD's
    /// failure does not mark it.
    #[arg(long, value_name = "ID", allow_hyphen_values = true, value_parser = parse_tick)]
    once: Option<String>,
    /// How long the record of a done id tick is kept (ids only; times need none).
    #[arg(long, value_name = "DURATION", default_value = crate::defaults::duration(flightlock::options::DEFAULT_TICK_KEEP), requires = "once",
          allow_hyphen_values = true, value_parser = flightlock::parse_duration)]
    once_keep: Duration,
    /// With --once TIME: a tick older than this (by this host's clock) is not run (exit 0, one
    /// stderr line). Default: no bound.
    #[arg(long, value_name = "DURATION", requires = "once", allow_hyphen_values = true,
          value_parser = parse_stale_after)]
    stale_after: Option<StaleAfter>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// `--once`: a time or an id ([`Tick::parse`] tells them apart) that [`Tick::validate`]
/// accepts; kept as typed, for the messages.
fn parse_tick(s: &str) -> Result<String, String> {
    Tick::parse(s).validate()?;
    Ok(s.to_owned())
}

/// `--stale-after`: `off` or a bound, as `FLIGHTLOCK_STALE_AFTER` in Lambda.
#[derive(Debug, Clone, Copy)]
struct StaleAfter(Option<Duration>);

fn parse_stale_after(s: &str) -> Result<StaleAfter, String> {
    flightlock::options::parse_stale_after(s).map(StaleAfter)
}

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let tick = args.once.as_deref().map(Tick::parse);
    let opts = LockOptions {
        tick: tick.clone(),
        tick_keep: args.once_keep,
        ..args.lock.options()
    };
    // Values out of range are usage errors: reported before any request.
    opts.validate()?;
    let once = args.once.as_deref().unwrap_or_default();
    if let (Some(tick), Some(StaleAfter(Some(bound)))) = (&tick, args.stale_after) {
        let Tick::At(at) = tick else {
            eprintln!(
                "flightlock: --stale-after needs --once to be a time (RFC 3339), not the id \
                 {once:?}: an id has no age"
            );
            return Ok(ExitCode::from(EXIT_USAGE));
        };
        let age = flightlock::tick::age(*at, std::time::SystemTime::now());
        if age > bound {
            eprintln!(
                "flightlock: tick {once} is stale ({}s old, --stale-after {}): not run",
                age.as_secs(),
                humantime::format_duration(bound)
            );
            return Ok(ExitCode::SUCCESS);
        }
    }
    let client = args.conn.client().await;
    let locker = Locker::new(client, &args.conn.table);
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

    let progress = tokio::spawn(progress(locker.clone(), args.key.clone(), opts.clone()));
    let acquired = tokio::select! {
        r = locker.acquire(&args.key, &opts) => r,
        _ = sigint.recv() => return interrupted(&locker, progress, 130).await,
        _ = sigterm.recv() => return interrupted(&locker, progress, 143).await,
    };
    progress.abort();
    let guard = match acquired {
        Ok(g) => g,
        Err(e) if e.is_busy() => {
            eprintln!("flightlock: {e}");
            return Ok(ExitCode::from(EXIT_BUSY));
        }
        Err(Error::TickDone { .. }) => {
            // One line, the tick as given, exit status 0: the tick has run, just not here.
            eprintln!("flightlock: already ran for tick {once}");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(explained(&locker, e).await),
    };
    tracing::info!(key = %args.key, token = guard.token(), waited_ms = guard.waited().as_millis() as u64, "acquired");

    let (program, rest) = args.command.split_first().context("no command given")?;
    let mut child = match Command::new(program)
        .args(rest)
        .env("FLIGHTLOCK_TOKEN", guard.token().to_string())
        .env("FLIGHTLOCK_KEY", &args.key)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            eprintln!("flightlock: could not start {program:?}: {e}");
            // As env(1) and flock(1) do, so scripts can tell "not found" from the command's own
            // failures.
            return Ok(ExitCode::from(
                if e.kind() == std::io::ErrorKind::NotFound {
                    EXIT_NOT_FOUND
                } else {
                    EXIT_CANNOT_RUN
                },
            ));
        }
    };
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(Pid::from_raw);
    let send = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, sig);
        }
    };

    let mut lost = guard.lost_signal();
    let mut lost_seen = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.context("waiting for the command")?,
            reason = lost.wait(), if !lost_seen => {
                lost_seen = true;
                eprintln!("flightlock: LOCK LOST on key {:?} (token {}): {reason}; another holder may run now", args.key, guard.token());
                if args.kill_on_lost {
                    eprintln!("flightlock: sending SIGTERM to the command (--kill-on-lost)");
                    send(Signal::SIGTERM);
                    kill_at = Some(tokio::time::Instant::now() + Duration::from_secs(10));
                }
            }
            _ = sleep_until_opt(kill_at) => {
                send(Signal::SIGKILL);
                kill_at = None;
            }
            _ = sigint.recv() => send(Signal::SIGINT),
            _ = sigterm.recv() => send(Signal::SIGTERM),
        }
    };

    // Only a command that exited 0 marks the tick done: a failure leaves it to a retry.
    let outcome = if status.success() {
        guard.release_done().await
    } else {
        guard.release().await
    };
    let lost = lost_seen || matches!(outcome, Ok(ReleaseOutcome::Lost));
    if let Err(e) = &outcome {
        eprintln!("flightlock: release failed: {e}; the lock will be passed over after its lease");
    }
    if lost && !lost_seen {
        eprintln!(
            "flightlock: LOCK LOST on key {:?}: the row was no longer ours at release",
            args.key
        );
    }
    let code = exit_code(&status);
    Ok(ExitCode::from(if lost && code == 0 {
        EXIT_LOST
    } else {
        code
    }))
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Every [`PROGRESS_EVERY`], one line on stderr: who holds the key and how many wait, or that
/// DynamoDB does not answer (the acquisition keeps retrying such faults within its wait).
async fn progress(locker: Locker, key: String, opts: LockOptions) {
    let started = tokio::time::Instant::now();
    let until = match opts.wait.as_duration() {
        Some(d) => format!("gives up after {d:?}"),
        None => "waits until it gets the key; Ctrl-C to give up".to_owned(),
    };
    loop {
        tokio::time::sleep(PROGRESS_EVERY).await;
        let look = tokio::time::timeout(PROGRESS_LOOK, locker.queue(&key, opts.clock_skew)).await;
        let what = match look {
            Ok(Ok(entries)) => {
                let waiting = entries
                    .iter()
                    .filter(|e| e.state == EntryState::Waiting)
                    .count();
                let holding: Vec<_> = entries
                    .iter()
                    .filter(|e| e.state == EntryState::Holding)
                    .collect();
                match holding.as_slice() {
                    [] => format!("no live holder, {waiting} waiting"),
                    [h] => format!(
                        "held by ticket {} (owner {}{}), {waiting} waiting",
                        h.ticket,
                        h.owner,
                        h.holder
                            .host
                            .as_ref()
                            .map(|host| format!(", host {host}"))
                            .unwrap_or_default()
                    ),
                    many => format!(
                        "held by {} holders (tickets {}) of {} permits, {waiting} waiting",
                        many.len(),
                        many.iter()
                            .map(|h| h.ticket.to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                        opts.permits
                    ),
                }
            }
            Ok(Err(e)) => format!("DynamoDB is not answering as it should ({e}); retrying"),
            Err(_) => format!("DynamoDB did not answer within {PROGRESS_LOOK:?}; retrying"),
        };
        eprintln!(
            "flightlock: waiting for key {key:?} for {}s: {what} ({until})",
            started.elapsed().as_secs()
        );
    }
}

/// Interrupted while waiting: the cancelled acquisition removes its row in the background; wait
/// for that before exiting. If DynamoDB never answered, there is no queue to speak of (a request
/// that landed with its answer lost is removed all the same).
async fn interrupted(
    locker: &Locker,
    progress: tokio::task::JoinHandle<()>,
    code: u8,
) -> anyhow::Result<ExitCode> {
    progress.abort();
    if locker.has_answered() {
        eprintln!("flightlock: interrupted while waiting; leaving the queue");
    } else {
        eprintln!("flightlock: interrupted before DynamoDB ever answered; no lock was held");
    }
    locker.flush().await;
    Ok(ExitCode::from(code))
}

fn exit_code(status: &std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        _ => 1,
    }
}
