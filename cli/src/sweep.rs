//! `flightlock sweep`: remove queue rows whose lease ended more than a grace period ago.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use flightlock::sweep::{ResumePoint, SweepOptions, Sweeper};

use crate::Conn;

/// Arguments of `flightlock sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Remove rows whose lease ended more than this long ago. Must be at least the largest
    /// clock-skew allowance of any lock user (plus the sweeper's own clock error).
    #[arg(long, default_value = crate::defaults::duration(SweepOptions::default().grace), allow_hyphen_values = true, value_parser = flightlock::parse_duration)]
    pub(crate) grace: Duration,
    /// Report what would be deleted; delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Conditional deletes in flight at once.
    #[arg(long, default_value_t = SweepOptions::default().concurrency, allow_negative_numbers = true, value_parser = count::<usize>)]
    pub(crate) concurrency: usize,
    /// Parallel scan segments.
    #[arg(long, default_value_t = SweepOptions::default().segments, allow_negative_numbers = true, value_parser = count::<u32>)]
    pub(crate) segments: u32,
    /// Items read per Scan page (default: DynamoDB's 1 MB pages).
    #[arg(long, allow_negative_numbers = true, value_parser = count::<u32>)]
    page_size: Option<u32>,
    /// Stop starting new work after this long and report where to resume.
    #[arg(long, allow_hyphen_values = true, value_parser = flightlock::parse_duration)]
    budget: Option<Duration>,
    /// Continue an incomplete sweep: the `resume` array of its JSON summary.
    #[arg(long, value_name = "JSON")]
    resume: Option<String>,
}

/// A count: a whole number from 1 up (the sweeper checks the upper bound of each).
fn count<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => s
            .trim()
            .parse::<T>()
            .map_err(|_| format!("{s:?} is too large")),
        _ => Err(format!(
            "{s:?} is not a count; accepted: a whole number from 1 up, e.g. 8"
        )),
    }
}

pub async fn sweep(args: SweepArgs) -> anyhow::Result<ExitCode> {
    let resume: Vec<ResumePoint> = match &args.resume {
        Some(json) => serde_json::from_str(json)
            .context("--resume: expected the `resume` array of a sweep summary")?,
        None => Vec::new(),
    };
    let opts = SweepOptions {
        grace: args.grace,
        concurrency: args.concurrency,
        segments: args.segments,
        page_size: args.page_size,
        budget: args.budget,
        dry_run: args.dry_run,
        resume,
        ..SweepOptions::default()
    };
    let client = args.conn.client().await;
    // A table with other keys would sweep as "0 queue rows": say what it is instead. Only that
    // verdict stops the sweep; a check that cannot run (no DescribeTable permission, say) leaves
    // the sweep to report for itself.
    if let Err(e @ flightlock::Error::WrongKeySchema { .. }) =
        flightlock::table::verify_table(&client, &args.conn.table).await
    {
        return Err(e.into());
    }
    let sweeper = Sweeper::new(client, &args.conn.table);
    let summary = sweeper.sweep(&opts).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        let verb = if summary.dry_run {
            "would delete"
        } else {
            "deleted"
        };
        let count = if summary.dry_run {
            summary.dead
        } else {
            summary.deleted
        };
        println!(
            "{}: examined {} items ({} queue rows) in {} pages, {verb} {count}, still live {}, \
             revived {}, already gone {}, errors {}, {} ms{}",
            args.conn.table,
            summary.items_examined,
            summary.queue_rows_examined,
            summary.pages,
            summary.still_live,
            summary.revived,
            summary.already_gone,
            summary.errors,
            summary.duration_ms,
            if summary.complete {
                String::new()
            } else {
                format!(
                    "; INCOMPLETE (budget spent), resume with --resume '{}'",
                    serde_json::to_string(&summary.resume)?
                )
            }
        );
        for e in &summary.error_samples {
            eprintln!("flightlock: sweep error: {e}");
        }
        if summary.newer_protocol > 0 {
            eprintln!(
                "flightlock: left {} entries alone on keys that run a newer protocol than this \
                 build speaks ({}): {}; upgrade (see {})",
                summary.newer_protocol,
                flightlock::PROTOCOL,
                summary.newer_protocol_keys.join(", "),
                flightlock::error::UPGRADE_GUIDE
            );
        }
    }
    Ok(if summary.errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
