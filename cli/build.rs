//! Build script: `FLIGHTLOCK_COMMIT`, the commit of this build, for `flightlock --version` (see
//! build/commit.rs for where it comes from).

include!("build/commit.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/commit.rs");
    emit_commit();
}
