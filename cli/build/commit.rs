// The commit a build is from, shared by the build scripts of `flightlock-cli` (cli/build.rs) and
// `flightlock-extension` (extension/build.rs, which includes this file). Never fails the build:
// where no commit can be known, the answer is "unknown".
//
// In order:
// 1. `FLIGHTLOCK_BUILD_COMMIT`, when set and non-empty (a build from a source archive; letters,
//    digits, '-' and '.' only, at most 64 characters, else it is ignored with a warning);
// 2. `.cargo_vcs_info.json` beside the manifest: `cargo package` writes the commit the crate was
//    packed from there, so a build of the crate from crates.io names the release's commit (and
//    asking git there could answer with the commit of an unrelated repository around it);
// 3. `git rev-parse HEAD` in the package's directory, watching HEAD and the branch it points to
//    so a new commit re-runs the build script;
// 4. "unknown".

/// Commits are shown with this many hex digits (as `git log --abbrev=12`).
const COMMIT_DIGITS: usize = 12;

/// Emits `cargo:rustc-env=FLIGHTLOCK_COMMIT=<commit>` and what should re-run the build script.
fn emit_commit() {
    println!("cargo:rerun-if-env-changed=FLIGHTLOCK_BUILD_COMMIT");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".to_owned());
    let commit = from_env()
        .or_else(|| from_vcs_info(&dir))
        .or_else(|| from_git(&dir))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=FLIGHTLOCK_COMMIT={commit}");
}

fn from_env() -> Option<String> {
    let v = std::env::var("FLIGHTLOCK_BUILD_COMMIT").ok()?;
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    let ok = v.len() <= 64
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if !ok {
        println!(
            "cargo:warning=FLIGHTLOCK_BUILD_COMMIT='{v}' ignored: accepted are letters, digits, '-' and '.', at most 64 characters"
        );
        return None;
    }
    Some(short(v))
}

/// The `"sha1": "<hex>"` of `.cargo_vcs_info.json` (written by `cargo package`).
fn from_vcs_info(dir: &str) -> Option<String> {
    let path = std::path::Path::new(dir).join(".cargo_vcs_info.json");
    // Watched only when present (a packed crate): cargo re-runs a build script on every build
    // while a watched file is missing, and a checkout never has this one.
    let text = std::fs::read_to_string(&path).ok()?;
    println!("cargo:rerun-if-changed={}", path.display());
    let rest = &text[text.find("\"sha1\"")? + "\"sha1\"".len()..];
    let rest = &rest[rest.find('"')? + 1..];
    let sha = &rest[..rest.find('"')?];
    sha.chars()
        .all(|c| c.is_ascii_hexdigit())
        .then(|| short(sha))
}

fn git(dir: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn from_git(dir: &str) -> Option<String> {
    let sha = git(dir, &["rev-parse", "HEAD"])?;
    // HEAD names the branch; the branch's file (or packed-refs) changes with each commit. Only
    // existing paths are watched (cargo re-runs a build script on every build while a watched
    // path is missing); a branch whose ref is packed has no file yet, so its directory is
    // watched instead, where the next commit writes it.
    let mut watch = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for name in watch {
        let Some(path) = git(
            dir,
            &["rev-parse", "--path-format=absolute", "--git-path", &name],
        ) else {
            continue;
        };
        let path = std::path::PathBuf::from(path);
        let watched = if path.exists() {
            Some(path.as_path())
        } else if name.starts_with("refs/") {
            path.parent().filter(|p| p.is_dir())
        } else {
            None
        };
        if let Some(p) = watched {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    Some(short(&sha))
}

fn short(commit: &str) -> String {
    commit.chars().take(COMMIT_DIGITS).collect()
}
