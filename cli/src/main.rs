//! `flightlock`: the lock from a shell, like `flock(1)` across machines.
//!
//! ```text
//! flightlock create-table --table T
//! flightlock run --table T --key K [--wait 0|DURATION|forever] [--lease D] [--permits N] [--once ID] -- CMD [ARGS...]
//! flightlock status --table T --key K [--json]
//! flightlock permits --table T --key K --set N [--wait DURATION] [--json]
//! flightlock sweep --table T [--grace DURATION] [--dry-run] [--json]
//! ```
//!
//! Endpoint, region and credentials come from the standard AWS SDK configuration
//! (`AWS_ENDPOINT_URL_DYNAMODB`, `AWS_REGION`, profiles, ...); `--endpoint-url` overrides.

mod permits;
mod run;
mod status;
mod sweep;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use flightlock::{ClockSkew, LockOptions, Wait};

/// Exit status when the key stayed held for the whole wait (EX_TEMPFAIL).
pub const EXIT_BUSY: u8 = 75;
/// Exit status when the lock was lost while the command ran and the command itself succeeded.
pub const EXIT_LOST: u8 = 70;
/// Exit status when the command was found but could not be started (as `env(1)` and `flock(1)`).
pub const EXIT_CANNOT_RUN: u8 = 126;
/// Exit status when the command was not found (as `env(1)` and `flock(1)`).
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit status when the key runs a newer flightlock protocol than this build speaks
/// (`EX_PROTOCOL`): nothing was run and nothing was granted; upgrade this build.
pub const EXIT_PROTOCOL: u8 = 76;
/// Exit status when the key allows a different number of holders at a time than `--permits`
/// (`EX_CONFIG`): nothing was run and nothing was granted; use the key's permits, or change
/// them with `flightlock permits`.
pub const EXIT_PERMITS: u8 = 78;
/// Exit status for a bad value: the usage errors clap reports, and options out of range.
pub const EXIT_USAGE: u8 = 2;

/// The log levels `--log-level` accepts (as `FLIGHTLOCK_LOG_LEVEL` does in Lambda).
const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// `flightlock --version`: the crate version and the commit of this build (cli/build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("FLIGHTLOCK_COMMIT"),
    ")"
);

#[derive(Parser, Debug)]
#[command(
    name = "flightlock",
    version = VERSION,
    about = "A FIFO, fenced DynamoDB lock from the shell"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create the lock table (pk/sk, on-demand, TTL on expiresAt); a correct existing one is fine.
    CreateTable {
        #[command(flatten)]
        conn: Conn,
    },
    /// Acquire KEY, run CMD while holding it, release, and exit with CMD's status.
    Run(run::RunArgs),
    /// Print KEY's queue: holders and waiters against its permits, stale rows.
    Status(status::StatusArgs),
    /// Change KEY's permits (how many hold it at a time); waits while the counter's seat is taken.
    Permits(permits::PermitsArgs),
    /// Remove queue rows whose lease ended more than a grace period ago (never counters).
    Sweep(sweep::SweepArgs),
}

/// Where the table is.
#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// Lock table name.
    #[arg(long, env = "FLIGHTLOCK_TABLE")]
    table: String,
    /// DynamoDB endpoint (default: the AWS SDK's configuration, e.g. AWS_ENDPOINT_URL_DYNAMODB).
    #[arg(long, value_parser = parse_endpoint)]
    endpoint_url: Option<String>,
    /// AWS region (default: the AWS SDK's configuration).
    #[arg(long)]
    region: Option<String>,
    /// Log level for flightlock's own messages on stderr.
    #[arg(
        long,
        env = "FLIGHTLOCK_LOG_LEVEL",
        default_value = "warn",
        ignore_case = true,
        value_parser = LOG_LEVELS
    )]
    log_level: String,
}

impl Conn {
    /// A DynamoDB client for these settings (credentials and region from the usual chain).
    async fn client(&self) -> aws_sdk_dynamodb::Client {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(region) = &self.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some(url) = &self.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        aws_sdk_dynamodb::Client::new(&loader.load().await)
    }
}

/// `--endpoint-url`: an `http://` or `https://` URL with a host, checked here so a typo is one
/// line naming the accepted form (the SDK would report it per request, as a dump of the request).
fn parse_endpoint(s: &str) -> Result<String, String> {
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"));
    let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or_default());
    match host {
        Some(h) if !h.is_empty() && !h.starts_with(':') && !h.contains(char::is_whitespace) => {
            Ok(s.to_owned())
        }
        _ => Err(format!(
            "{s:?} is not an endpoint URL; use http://HOST[:PORT] or https://HOST[:PORT], e.g. \
             http://127.0.0.1:8000 for DynamoDB Local"
        )),
    }
}

/// The options' defaults, as `--help` shows them: each is the library's own
/// ([`LockOptions::default`], [`flightlock::sweep::SweepOptions::default`]), defined there once.
pub mod defaults {
    use std::time::Duration;

    use flightlock::{ClockSkew, LockOptions, Wait};

    /// A duration as the options accept it, in the largest unit that holds it whole (`20s`,
    /// `100ms`, `30h`).
    pub fn duration(d: Duration) -> String {
        let ms = d.as_millis();
        let units = [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1000),
        ];
        match units.iter().find(|(_, n)| ms > 0 && ms.is_multiple_of(*n)) {
            Some((unit, n)) => format!("{}{unit}", ms / n),
            None => format!("{ms}ms"),
        }
    }

    /// [`LockOptions::default`]'s wait.
    pub fn wait() -> String {
        match LockOptions::default().wait {
            Wait::Forever => Wait::FOREVER_WORDS[0].to_owned(),
            Wait::NoWait => "0".to_owned(),
            Wait::For(d) => duration(d),
        }
    }

    /// [`LockOptions::default`]'s clock-skew allowance.
    pub fn clock_skew() -> String {
        match LockOptions::default().clock_skew {
            ClockSkew::Bounded(d) => duration(d),
            ClockSkew::Unbounded => ClockSkew::UNBOUNDED_WORDS[0].to_owned(),
        }
    }
}

/// Lock options shared by commands that acquire. Their values may start with `-` (`--wait -1`):
/// a bad value to report with the accepted forms, not an option to suggest `-- -1` for.
#[derive(Args, Debug, Clone)]
pub struct LockArgs {
    /// How long to wait: 0 (fail at once if held), a duration (500ms, 10s, 1m30s, 2h; a bare
    /// number is seconds) or forever (also inf, infinite).
    #[arg(long, default_value = defaults::wait(), allow_hyphen_values = true, value_parser = Wait::parse)]
    wait: Wait,
    /// Lease: how long the lock survives without a heartbeat.
    #[arg(long, default_value = defaults::duration(LockOptions::default().lease), allow_hyphen_values = true, value_parser = flightlock::parse_duration)]
    lease: std::time::Duration,
    /// Heartbeat interval (default: a third of the lease).
    #[arg(long, allow_hyphen_values = true, value_parser = flightlock::parse_duration)]
    heartbeat: Option<std::time::Duration>,
    /// Poll interval of the waiter next in line.
    #[arg(long, default_value = defaults::duration(LockOptions::default().poll), allow_hyphen_values = true, value_parser = flightlock::parse_duration)]
    poll: std::time::Duration,
    /// How far clocks may disagree (a duration such as 500ms or 1s), or `unbounded` (also
    /// clock-free) for clock-free mode.
    #[arg(long, default_value = defaults::clock_skew(), allow_hyphen_values = true, value_parser = ClockSkew::parse)]
    max_clock_skew: ClockSkew,
    /// How many may hold the key at a time (1 to 100): every participant on a key must use the
    /// key's number (see `flightlock permits`).
    #[arg(long, env = "FLIGHTLOCK_PERMITS", default_value = LockOptions::default().permits.to_string(), allow_hyphen_values = true,
          value_parser = parse_permits)]
    permits: u32,
}

/// `--permits`, `permits --set`: [`flightlock::options::parse_permits`], as `FLIGHTLOCK_PERMITS`
/// in Lambda.
pub fn parse_permits(s: &str) -> Result<u32, String> {
    flightlock::options::parse_permits(s.trim()).map_err(|_| {
        format!(
            "{s:?} is not a number of permits; use {}",
            flightlock::options::PERMITS_FORMS
        )
    })
}

impl LockArgs {
    fn options(&self) -> LockOptions {
        let defaults = LockOptions::default();
        LockOptions {
            wait: self.wait,
            lease: self.lease,
            heartbeat: self.heartbeat,
            poll: self.poll,
            max_poll: defaults.max_poll.max(self.poll),
            clock_skew: self.max_clock_skew,
            permits: self.permits,
            holder: flightlock::HolderInfo {
                host: Some(flightlock::HolderInfo::this_host()),
                function: std::env::var("AWS_LAMBDA_FUNCTION_NAME").ok(),
                request_id: None,
            },
            ..defaults
        }
    }
}

fn init_logging(level: &str) {
    // clap let only LOG_LEVELS through, each a valid directive.
    let filter = tracing_subscriber::EnvFilter::try_new(format!(
        "flightlock={}",
        level.to_ascii_lowercase()
    ))
    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("flightlock=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::CreateTable { conn } => {
            init_logging(&conn.log_level);
            create_table(&conn).await
        }
        Command::Run(args) => {
            init_logging(&args.conn.log_level);
            run::run(args).await
        }
        Command::Status(args) => {
            init_logging(&args.conn.log_level);
            status::status(args).await
        }
        Command::Sweep(args) => {
            init_logging(&args.conn.log_level);
            sweep::sweep(args).await
        }
        Command::Permits(args) => {
            init_logging(&args.conn.log_level);
            permits::permits(args).await
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // The lock's errors say everything in their own message; others carry context.
            match e.downcast_ref::<flightlock::Error>() {
                Some(lock_error) => {
                    eprintln!("flightlock: {lock_error}");
                    match lock_error {
                        // Values out of range: usage errors, as clap's own are.
                        flightlock::Error::InvalidOption { .. }
                        | flightlock::Error::InvalidKey { .. } => ExitCode::from(EXIT_USAGE),
                        flightlock::Error::ProtocolTooNew { .. } => ExitCode::from(EXIT_PROTOCOL),
                        flightlock::Error::PermitsMismatch { .. } => ExitCode::from(EXIT_PERMITS),
                        _ => ExitCode::FAILURE,
                    }
                }
                None => {
                    eprintln!("flightlock: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The error to show for `error`: when the request may have failed because the table is not a
/// flightlock table (a `ValidationException`), the table check's error, which names the fix.
/// The check is bounded, so a slow endpoint cannot hold the answer back.
pub async fn explained(locker: &flightlock::Locker, error: flightlock::Error) -> anyhow::Error {
    let check = tokio::time::timeout(std::time::Duration::from_secs(10), locker.explain(&error));
    match check.await {
        Ok(Some(better)) => better.into(),
        _ => error.into(),
    }
}

async fn create_table(conn: &Conn) -> anyhow::Result<ExitCode> {
    let client = conn.client().await;
    match flightlock::table::create_table(&client, &conn.table).await? {
        flightlock::table::Created::New => {
            println!("created table {} (pk/sk, TTL on expiresAt)", conn.table)
        }
        flightlock::table::Created::Existing { ttl_turned_on } => {
            if ttl_turned_on {
                println!(
                    "table {} already existed with keys pk/sk; TTL on expiresAt was off: turned it on",
                    conn.table
                )
            } else {
                println!(
                    "table {} already exists with keys pk/sk and TTL on expiresAt: nothing changed",
                    conn.table
                )
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;
    use flightlock::sweep::SweepOptions;
    use flightlock::LockOptions;

    use super::defaults;

    /// The CLI reference: its option table says each option's default.
    const REFERENCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/reference/cli.md");

    /// Where the CLI reference's option table disagrees with the parser's defaults and
    /// environment variables (of every subcommand, as clap holds them).
    fn default_problems(doc: &str) -> Vec<String> {
        use clap::CommandFactory;
        let cells: std::collections::HashMap<&str, &str> = doc
            .lines()
            .filter_map(|l| {
                let mut cells = l.strip_prefix("| `--")?.split(" | ");
                let option = cells.next()?.strip_suffix('`')?;
                Some((option, cells.next()?))
            })
            .collect();
        let mut problems = Vec::new();
        let mut checked = 0;
        for command in super::Cli::command().get_subcommands() {
            for arg in command.get_arguments() {
                let (Some(long), true) = (arg.get_long(), arg.get_action().takes_values()) else {
                    continue;
                };
                let defaults = arg.get_default_values().iter().map(|w| w.to_string_lossy());
                let words = defaults
                    .chain(arg.get_env().map(|w| w.to_string_lossy()))
                    .map(|w| w.into_owned());
                for word in words {
                    checked += 1;
                    match cells.get(long) {
                        Some(cell) if cell.contains(&format!("`{word}`")) => {}
                        cell => problems.push(format!(
                            "{} --{long}: the parser's default is `{word}`, the CLI reference \
                             says {cell:?}",
                            command.get_name()
                        )),
                    }
                }
            }
        }
        assert!(checked >= 10, "only {checked} defaults found");
        problems
    }

    #[test]
    fn the_cli_reference_gives_the_parsers_defaults() {
        let doc = std::fs::read_to_string(REFERENCE).expect("docs/src/reference/cli.md");
        let problems = default_problems(&doc);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        let broken = doc.replacen("| `--lease` | `20s` |", "| `--lease` | `30s` |", 1);
        assert_ne!(broken, doc);
        assert_eq!(default_problems(&broken).len(), 1);
    }

    #[test]
    fn a_default_duration_reads_back_as_the_library_default() {
        for d in [
            Duration::from_secs(20),
            Duration::from_millis(100),
            Duration::from_millis(1500),
            Duration::from_secs(30 * 3600),
            Duration::from_secs(48 * 3600),
            Duration::from_secs(600),
            Duration::ZERO,
        ] {
            let text = defaults::duration(d);
            assert_eq!(flightlock::parse_duration(&text), Ok(d), "{text}");
        }
        assert_eq!(defaults::duration(Duration::from_secs(30 * 3600)), "30h");
    }

    #[test]
    fn options_left_out_are_the_library_defaults() {
        let cli = super::Cli::try_parse_from([
            "flightlock",
            "run",
            "--table",
            "t",
            "--key",
            "k",
            "--",
            "true",
        ])
        .expect("parses");
        let super::Command::Run(run) = cli.command else {
            panic!("not run");
        };
        let got = run.lock.options();
        let want = LockOptions::default();
        assert_eq!(
            (
                got.wait,
                got.lease,
                got.heartbeat,
                got.poll,
                got.clock_skew,
                got.permits
            ),
            (
                want.wait,
                want.lease,
                want.heartbeat,
                want.poll,
                want.clock_skew,
                want.permits
            )
        );
        let cli =
            super::Cli::try_parse_from(["flightlock", "sweep", "--table", "t"]).expect("parses");
        let super::Command::Sweep(sweep) = cli.command else {
            panic!("not sweep");
        };
        let want = SweepOptions::default();
        assert_eq!(
            (sweep.grace, sweep.concurrency, sweep.segments),
            (want.grace, want.concurrency, want.segments)
        );
    }
}
