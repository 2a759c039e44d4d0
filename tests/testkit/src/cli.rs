//! The `flightlock` CLI binary for the tests of other crates.
//!
//! Cargo hands `CARGO_BIN_EXE_flightlock` only to the tests of the binary's own package
//! (`flightlock-cli`, `cli/`). The lock's protocol and sweep tests run the CLI too (as a process
//! they can kill, and for its exit statuses), so they get it from [`cli_bin`]: built once per
//! test process by the cargo that runs the tests, into the same target directory and profile, as
//! `cargo build --workspace --bins --tests` builds it. That is the build `scripts/test` makes
//! first and `cargo test --workspace` makes too (the same packages and features: building
//! `flightlock-cli` alone would resolve other features and compile every dependency again), so
//! there it is a no-op; a stale binary is never run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The path of the `flightlock` CLI binary, built first if it is missing or stale (once per
/// process). Panics with cargo's output if the build fails.
pub fn cli_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(build).clone()
}

fn build() -> PathBuf {
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
    let Some(target_dir) = profile_dir.parent() else {
        panic!("cli_bin: {} has no target directory", profile_dir.display());
    };
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => panic!("cli_bin: {} names no profile", profile_dir.display()),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet", "--workspace", "--bins", "--tests"])
        .args(["--profile", profile])
        .arg("--target-dir")
        .arg(target_dir)
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "cli_bin: `cargo build --workspace --bins --tests` failed ({}):\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("cli_bin: cannot run cargo: {e}"),
    }
    let bin = profile_dir.join("flightlock");
    assert!(bin.is_file(), "cli_bin: {} was not built", bin.display());
    bin
}
