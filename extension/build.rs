//! Build script: `FLIGHTLOCK_COMMIT`, the commit of this build, for the init log line
//! (see cli/build/commit.rs for where it comes from).

include!("../cli/build/commit.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../cli/build/commit.rs");
    emit_commit();
}
