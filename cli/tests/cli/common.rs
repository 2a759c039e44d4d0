//! The shared setup: a table of its own and bounded waits (`flightlock_testkit::env`, shared with
//! the lock's protocol tests), and the CLI against it.

use std::process::{Command, Stdio};

pub use flightlock_testkit::env::*;

/// The `flightlock` binary of this build against `env`'s table, with dummy credentials and no
/// `FLIGHTLOCK_PERMITS` from the caller's environment.
pub fn cli(env: &Env) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flightlock"));
    c.env("AWS_ENDPOINT_URL_DYNAMODB", &env.endpoint)
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_REGION", "us-east-1")
        .env("FLIGHTLOCK_TABLE", &env.table)
        .env_remove("FLIGHTLOCK_PERMITS")
        .stdin(Stdio::null());
    c
}
