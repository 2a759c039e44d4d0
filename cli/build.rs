//! Build script: `FLIGHTLOCK_COMMIT`, the commit of this build, for `flightlock --version` (see
//! build/commit.rs for where it comes from). Only the CLI (feature `cli`) uses it, so without
//! that feature nothing is asked: a library build does not re-run with every commit.

include!("build/commit.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/commit.rs");
    if std::env::var_os("CARGO_FEATURE_CLI").is_some() {
        emit_commit();
    }
}
