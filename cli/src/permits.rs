//! `flightlock permits`: change a key's permits (how many hold it at a time), then say what
//! every participant must now be configured with. The work is [`flightlock::permits`].

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use flightlock::permits::{set_permits, Change, PermitsError};
use flightlock::Locker;

use crate::{parse_permits, Conn, EXIT_USAGE};

/// How often a taken seat is looked at again.
const POLL: Duration = Duration::from_millis(200);

/// Exit status when the counter's seat stayed taken for the whole `--wait` (EX_TEMPFAIL, as a
/// busy `run`): nothing was changed.
const EXIT_SEAT_TAKEN: u8 = crate::EXIT_BUSY;

/// Arguments of `flightlock permits`.
#[derive(Args, Debug)]
pub struct PermitsArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Lock key.
    #[arg(long)]
    key: String,
    /// The key's new permits: 1 (one at a time) up to 100.
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = parse_permits)]
    set: u32,
    /// How long to keep retrying while a holder sits on the counter's seat (a holder granted
    /// without a queue row would lose its lock if the permits changed under it).
    #[arg(long, default_value = "30s", allow_hyphen_values = true, value_parser = flightlock::parse_duration)]
    wait: Duration,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn permits(args: PermitsArgs) -> anyhow::Result<ExitCode> {
    let locker = Locker::new(args.conn.client().await, &args.conn.table);
    let done = match set_permits(&locker, &args.key, args.set, args.wait, POLL).await {
        Ok(done) => done,
        Err(e @ PermitsError::SeatTaken { .. }) => {
            eprintln!("flightlock: {e}");
            return Ok(ExitCode::from(EXIT_SEAT_TAKEN));
        }
        Err(e @ PermitsError::OutOfRange(_)) => {
            eprintln!("flightlock: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
        Err(PermitsError::Lock(e)) => return Err(crate::explained(&locker, e).await),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&done)?);
        return Ok(ExitCode::SUCCESS);
    }
    let key = &args.key;
    let n = done.permits;
    match done.change {
        Change::Unchanged => println!("{key}: already {n} permit(s): nothing changed"),
        Change::Created { last } => println!(
            "{key}: had no counter; created it at {n} permit(s) (tickets continue after {last})"
        ),
        Change::Changed { from } => println!("{key}: permits {from} -> {n}"),
    }
    println!(
        "Every participant on {key} must now use permits = {n}: `flightlock run --permits {n}` \
         (FLIGHTLOCK_PERMITS={n}), FLIGHTLOCK_PERMITS={n} for the Lambda layer, \
         LockOptions {{ permits: {n}, .. }} in Rust. Until it is, a participant with another \
         number is refused (PermitsMismatch), never granted beyond {n}."
    );
    if let Change::Changed { from } = done.change {
        if from > n {
            println!(
                "Holders granted under {from} permits keep their permits until they release: \
                 new grants wait until fewer than {n} hold."
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
