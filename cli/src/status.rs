//! `flightlock status`: print a key's queue.

use std::process::ExitCode;

use clap::Args;
use flightlock::{ClockSkew, EntryState, Locker};

use crate::Conn;

/// Arguments of `flightlock status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Lock key.
    #[arg(long)]
    key: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// How far clocks may disagree when judging stale rows.
    #[arg(long, default_value = crate::defaults::clock_skew(), allow_hyphen_values = true, value_parser = ClockSkew::parse)]
    max_clock_skew: ClockSkew,
}

pub async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let locker = Locker::new(args.conn.client().await, &args.conn.table);
    let state = match locker.state(&args.key, args.max_clock_skew).await {
        Ok(state) => state,
        Err(flightlock::Error::ProtocolTooNew { table, speaks, .. }) if args.json => {
            // A queue this build cannot read: its protocol, and no queue.
            let out = serde_json::json!({
                "table": args.conn.table,
                "key": args.key,
                "protocol": table,
                "speaks": speaks,
                "permits": null,
                "queue": null,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
            return Ok(ExitCode::from(crate::EXIT_PROTOCOL));
        }
        Err(e) => return Err(crate::explained(&locker, e).await),
    };
    let count = |s: EntryState| state.queue.iter().filter(|e| e.state == s).count();
    let (holding, waiting) = (count(EntryState::Holding), count(EntryState::Waiting));
    if args.json {
        let out = serde_json::json!({
            "table": args.conn.table,
            "key": args.key,
            "protocol": state.protocol,
            "speaks": flightlock::PROTOCOL,
            "permits": state.permits,
            "holding": holding,
            "waiting": waiting,
            "queue": state.queue,
            "counterBehind": state.counter_behind,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(row) = state.counter_behind {
        // Set back by a restore or a hand edit: until it is raised, a warm participant's fast
        // path may be granted a ticket below a live holder's.
        eprintln!(
            "WARNING: {}: the counter's last ticket is below a queued row's ({row}): it was set \
             back (a table restore, or an old counter item put by hand). Raise it before anyone \
             uses the key: aws dynamodb update-item --table-name {} --key \
             '{{\"pk\":{{\"S\":{:?}}},\"sk\":{{\"S\":\"counter\"}}}}' --update-expression \
             'SET #l = :l' --expression-attribute-names '{{\"#l\":\"last\"}}' \
             --expression-attribute-values '{{\":l\":{{\"N\":\"{row}\"}}}}' \
             (lock/PROTOCOL.md, \"What remains assumed\")",
            args.key, args.conn.table, args.key
        );
    }
    if state.protocol != flightlock::PROTOCOL {
        println!("{}: protocol {}", args.key, state.protocol);
    }
    if state.queue.is_empty() {
        let of = if state.permits > 1 {
            format!(", {} permits", state.permits)
        } else {
            String::new()
        };
        println!("{}: free (no rows{of})", args.key);
        return Ok(ExitCode::SUCCESS);
    }
    if state.permits > 1 {
        println!(
            "{}: {holding} of {} permits held, {waiting} waiting",
            args.key, state.permits
        );
    }
    println!("TICKET   STATE    OWNER                LEASE LEFT  HOLDER");
    for e in state.queue {
        let state = match e.state {
            EntryState::Holding => "holding",
            EntryState::Waiting => "waiting",
            EntryState::Stale => "stale",
        };
        // A seated entry lives on the counter item (an uncontended grant): not a row to delete.
        let seat = e.seat.then(|| "(counter's seat)".to_owned());
        let who: Vec<String> = seat
            .into_iter()
            .chain(
                [
                    ("fn", &e.holder.function),
                    ("host", &e.holder.host),
                    ("req", &e.holder.request_id),
                ]
                .into_iter()
                .filter_map(|(l, v)| v.as_ref().map(|v| format!("{l}={v}"))),
            )
            .collect();
        println!(
            "{:<8} {:<8} {:<20} {:>9.1}s  {}",
            e.ticket,
            state,
            e.owner,
            e.lease_left_ms as f64 / 1000.0,
            who.join(" ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
