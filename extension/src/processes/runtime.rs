//! Which processes are the runtime, so the extension notices a runtime that dies in the middle of
//! an invocation and releases its lock at once instead of leaving it to lapse after a lease.
//! (When the runtime crashes, Lambda resets the sandbox and kills the extension a moment later,
//! without a SHUTDOWN event: this is the only chance to release.)
//!
//! **The runtime is the process the wrapper execs, and everything it starts.** The wrapper
//! (`/opt/flightlock-wrapper`) exports [`PID_MARKER`]`=$$` before `exec`, so the runtime is the
//! one process whose environment carries its own pid in that variable (its children inherit the
//! variable, but with a pid that is not theirs). [`find_runtime`] looks for it in `/proc`.
//!
//! A runtime is gone only when its whole tree is gone: [`RuntimeTree`] remembers every
//! descendant it has seen (pid and start time, so a reused pid is not mistaken for a survivor)
//! and says "alive" while any of them lives. A runtime made of a shell that starts a short-lived
//! `curl` per request is therefore alive as long as the shell (or a handler it started) is.
//!
//! Why not the process on the other end of the runtime's socket: for a bash + curl runtime that
//! is the short-lived `curl`, which exits while the handler still runs.
//!
//! When the runtime cannot be identified (no wrapper marker, `/proc` unreadable, two candidates)
//! the answer is "unknown" and nothing is released early: the lock is then released by the
//! response, SHUTDOWN, or the lease capped at the deadline.

use std::collections::HashSet;
use std::path::Path;

/// Environment variable the wrapper sets to its own pid (= the runtime's pid, after `exec`).
/// Deliberately not `FLIGHTLOCK_*`: it is not configuration, and the in-process layer rejects
/// unknown `FLIGHTLOCK_*` names.
pub const PID_MARKER: &str = "_FLIGHTLOCK_RUNTIME_PID";

/// A process, identified by its pid and its start time (clock ticks after boot): a pid reused by
/// a new process is a different `Proc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Proc {
    /// Process id (as this `/proc` numbers it).
    pub pid: u32,
    /// Start time, field 22 of `/proc/<pid>/stat`.
    pub start: u64,
}

/// What `/proc/<pid>/stat` says about one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The process.
    pub proc: Proc,
    /// Its parent's pid.
    pub ppid: u32,
    /// False for a zombie (exited, not yet reaped) or a dead process.
    pub alive: bool,
}

/// Parses the text of `/proc/<pid>/stat` (pure).
pub fn parse_stat(text: &str) -> Option<Stat> {
    // `pid (comm) state ppid ...`; comm may contain spaces and parentheses: split at the last ')'.
    let (head, rest) = text.rsplit_once(')')?;
    let pid = head.split_whitespace().next()?.parse().ok()?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is the state (field 3), so field n is fields[n - 3].
    let state = *fields.first()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some(Stat {
        proc: Proc { pid, start },
        ppid,
        alive: state != "Z" && state != "X",
    })
}

/// True if the NUL-separated environment `environ` has `name=value` (pure).
pub fn environ_has(environ: &[u8], name: &str, value: &str) -> bool {
    let entry = format!("{name}={value}");
    environ.split(|b| *b == 0).any(|e| e == entry.as_bytes())
}

/// Every process in the `/proc` at `proc_root`, as far as it is readable.
pub fn snapshot(proc_root: &Path) -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let text =
                std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
            parse_stat(&text)
        })
        .collect()
}

/// The runtime started by the wrapper that points it at `runtime_api` (`127.0.0.1:<proxy
/// port>`): the one live process whose environment has [`PID_MARKER`] equal to its own pid and
/// `AWS_LAMBDA_RUNTIME_API=runtime_api`. `None` if there is no such process or more than one.
pub fn find_runtime(proc_root: &Path, runtime_api: &str) -> Option<Proc> {
    let mut found = snapshot(proc_root).into_iter().filter(|s| {
        s.alive
            && std::fs::read(proc_root.join(s.proc.pid.to_string()).join("environ")).is_ok_and(
                |env| {
                    environ_has(&env, PID_MARKER, &s.proc.pid.to_string())
                        && environ_has(&env, "AWS_LAMBDA_RUNTIME_API", runtime_api)
                },
            )
    });
    let first = found.next()?;
    // Two candidates: something is off (two wrapped runtimes on one port?); do not guess.
    found.next().is_none().then_some(first.proc)
}

/// True if `proc` is in `/proc` at `proc_root`, with the same start time, and not a zombie.
pub fn is_alive(proc_root: &Path, proc: Proc) -> bool {
    std::fs::read_to_string(proc_root.join(proc.pid.to_string()).join("stat"))
        .ok()
        .and_then(|t| parse_stat(&t))
        .is_some_and(|s| s.alive && s.proc == proc)
}

/// A runtime's process tree, as far as it has been seen: the root and every descendant found by
/// [`RuntimeTree::refresh`].
#[derive(Debug, Clone)]
pub struct RuntimeTree {
    known: HashSet<Proc>,
}

impl RuntimeTree {
    /// The tree of `root`.
    pub fn new(root: Proc) -> RuntimeTree {
        RuntimeTree {
            known: HashSet::from([root]),
        }
    }

    /// Updates the tree from a process table: forgets members that are gone, adds live
    /// descendants of live members. True while any member is alive.
    pub fn refresh(&mut self, table: &[Stat]) -> bool {
        let live: HashSet<Proc> = table.iter().filter(|s| s.alive).map(|s| s.proc).collect();
        self.known.retain(|p| live.contains(p));
        loop {
            let pids: HashSet<u32> = self.known.iter().map(|p| p.pid).collect();
            let before = self.known.len();
            self.known.extend(
                table
                    .iter()
                    .filter(|s| s.alive && pids.contains(&s.ppid))
                    .map(|s| s.proc),
            );
            if self.known.len() == before {
                break;
            }
        }
        !self.known.is_empty()
    }

    /// Reads `/proc` at `proc_root` and refreshes (see [`RuntimeTree::refresh`]).
    pub fn alive(&mut self, proc_root: &Path) -> bool {
        self.refresh(&snapshot(proc_root))
    }

    /// The members seen so far.
    pub fn members(&self) -> Vec<Proc> {
        self.known.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, ppid: u32, start: u64, state: &str) -> Stat {
        let text = format!(
            "{pid} (a (b) c) {state} {ppid} 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 {start} 1000 10"
        );
        parse_stat(&text).unwrap()
    }

    #[test]
    fn stat_lines_parse_even_with_odd_command_names() {
        let s = stat(42, 7, 12345, "S");
        assert_eq!(
            s,
            Stat {
                proc: Proc {
                    pid: 42,
                    start: 12345
                },
                ppid: 7,
                alive: true
            }
        );
        assert!(!stat(42, 7, 1, "Z").alive);
        assert!(parse_stat("garbage").is_none());
        let me = std::fs::read_to_string("/proc/self/stat").unwrap();
        let me = parse_stat(&me).unwrap();
        assert!(me.alive && me.proc.start > 0);
    }

    #[test]
    fn environ_entries_match_whole() {
        let env = b"A=1\0_FLIGHTLOCK_RUNTIME_PID=12\0AWS_LAMBDA_RUNTIME_API=127.0.0.1:9009\0";
        assert!(environ_has(env, PID_MARKER, "12"));
        assert!(!environ_has(env, PID_MARKER, "1"));
        assert!(environ_has(env, "AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9009"));
        assert!(!environ_has(env, "AWS_LAMBDA_RUNTIME_API", "127.0.0.1:900"));
    }

    #[test]
    fn a_tree_lives_while_any_member_lives_and_short_lived_children_do_not_matter() {
        let root = stat(10, 1, 100, "S");
        let mut tree = RuntimeTree::new(root.proc);
        // bash runtime with a curl child: alive.
        assert!(tree.refresh(&[root, stat(11, 10, 101, "S")]));
        // curl exited, bash still there: alive.
        assert!(tree.refresh(&[root]));
        // bash started a handler (a grandchild) and then died: the orphan (now a child of 1) is
        // remembered, so the tree is still alive.
        assert!(tree.refresh(&[root, stat(12, 10, 102, "S"), stat(13, 12, 103, "S")]));
        assert!(tree.refresh(&[stat(10, 1, 100, "Z"), stat(13, 1, 103, "S")]));
        // The orphan's pid reused by an unrelated process (another start time): gone.
        assert!(!tree.refresh(&[stat(13, 1, 999, "S")]));
        // A root that is a zombie is dead.
        let mut tree = RuntimeTree::new(root.proc);
        assert!(!tree.refresh(&[stat(10, 1, 100, "Z")]));
    }

    #[test]
    fn the_wrapped_runtime_and_its_children_are_found_in_proc() {
        // Exactly as Lambda starts it: the layer's wrapper execs the runtime command.
        let port = 40000 + (std::process::id() % 20000) as u16;
        let wrapper = concat!(env!("CARGO_MANIFEST_DIR"), "/layer/flightlock-wrapper");
        let mut child = std::process::Command::new(wrapper)
            .args(["sh", "-c", "sleep 30 & wait"])
            .env("FLIGHTLOCK_PROXY_PORT", port.to_string())
            .spawn()
            .unwrap();
        let proc_root = Path::new("/proc");
        let api = format!("127.0.0.1:{port}");
        let mut root = None;
        for _ in 0..200 {
            root = find_runtime(proc_root, &api);
            if root.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let root = root.expect("the wrapped runtime is found");
        assert_eq!(root.pid, child.id());
        assert!(is_alive(proc_root, root));
        // Nobody else's runtime.
        assert!(find_runtime(proc_root, "127.0.0.1:1").is_none());
        let mut tree = RuntimeTree::new(root);
        for _ in 0..200 {
            assert!(tree.alive(proc_root));
            if tree.members().len() == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let sleeper = tree
            .members()
            .into_iter()
            .find(|p| p.pid != root.pid)
            .expect("the runtime's child is part of the tree");
        // The runtime dies, its child lives on: not gone.
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!is_alive(proc_root, root));
        assert!(tree.alive(proc_root));
        // The child dies too: gone.
        std::process::Command::new("kill")
            .args(["-9", &sleeper.pid.to_string()])
            .status()
            .unwrap();
        let mut gone = false;
        for _ in 0..200 {
            if !tree.alive(proc_root) {
                gone = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(gone, "the tree is gone once every member is");
    }
}
