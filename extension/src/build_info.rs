//! The version and commit of this build. The init log line ("flightlock proxy listening") names
//! both; the layer's description (set by the publisher, `release/publish.py`) names them too.

/// The crate version (the workspace's, as released).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit this build is from, 12 hex digits, or "unknown" when the build could not know it
/// (no git and no `FLIGHTLOCK_BUILD_COMMIT`; see `cli/build/commit.rs`).
pub const COMMIT: &str = env!("FLIGHTLOCK_COMMIT");

#[cfg(test)]
mod tests {
    use super::*;

    /// In a git checkout, the commit is this checkout's HEAD (so a new commit re-ran the build
    /// script); without git there is nothing to compare with.
    #[test]
    fn commit_is_the_checkout_head() {
        let out = std::process::Command::new("git")
            .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
            .output();
        let Some(out) = out.ok().filter(|o| o.status.success()) else {
            assert_eq!(COMMIT, "unknown");
            return;
        };
        let head = String::from_utf8_lossy(&out.stdout);
        if std::env::var_os("FLIGHTLOCK_BUILD_COMMIT").is_none() {
            assert_eq!(COMMIT, &head.trim()[..12]);
        }
        assert_eq!(VERSION.split('.').count(), 3, "{VERSION}");
    }
}
