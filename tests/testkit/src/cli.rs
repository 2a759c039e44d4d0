//! The `flightlock` CLI binary for the tests of other crates.
//!
//! Cargo hands `CARGO_BIN_EXE_flightlock` only to the tests of the binary's own package
//! (`flightlock-cli`, `cli/`). The lock's protocol and sweep tests run the CLI too (as a process
//! they can kill, and for its exit statuses), so they find it with [`cli_bin`] beside the test
//! binary, where `cargo build --workspace --bins` (the first build of `scripts/test`) and
//! `cargo test --workspace` put it — as the end-to-end tests find the extension.
//!
//! It is not built from here: a cargo run from inside a test inherits the test's environment,
//! which makes build scripts run again and every dependency compile again.

use std::path::{Path, PathBuf};

/// The path of the `flightlock` CLI binary of this build (same target directory and profile as
/// the running test). Panics, saying how to build it, when it is missing.
pub fn cli_bin() -> PathBuf {
    // A test binary lives in <target dir>/<profile>/deps/.
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => panic!("cli_bin: cannot find the running test binary: {e}"),
    };
    let Some(profile_dir) = exe.parent().and_then(Path::parent) else {
        panic!(
            "cli_bin: {} is not in <target>/<profile>/deps",
            exe.display()
        );
    };
    let bin = profile_dir.join("flightlock");
    assert!(
        bin.is_file(),
        "{} is missing: build the CLI first with `cargo build --workspace --bins` (or `cargo build -p flightlock-cli`)",
        bin.display()
    );
    bin
}
