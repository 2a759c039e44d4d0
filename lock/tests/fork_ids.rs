//! Copies of one process never share an identity. A Lambda SnapStart snapshot is restored into
//! many environments; `fork()` after init is the local stand-in for that copy. A process takes
//! and releases a lock (so whatever random state it keeps is initialised), then forks twice; each
//! child acquires through a renewed locker (new connections, as after a restore) and reports its
//! owner id and a few draws of the clock's chance. Under a userspace generator with no fork
//! protection (`rand` 0.9's `ThreadRng`) both children report the same values; drawing from the
//! OS each time makes them differ. Needs DynamoDB Local (`scripts/dynamodb-local run --`).
//!
//! This file holds one test, so its binary forks while no other test thread is running.

// fork() is unsafe: the child of a multi-threaded process may only use what it sets up itself.
// The parent's runtime is dropped (its threads joined) before forking, and each child builds its
// own runtime and exits right after, so no state of the parent's threads is touched.
#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use flightlock::clock::{Clock, SystemClock};
use flightlock::{LockOptions, Locker, Wait};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// In the child: acquire `key` through a renewed locker, write "owner draw draw" to `out`.
fn child(locker: &Locker, key: &str, mut out: UnixStream) -> i32 {
    let rt = runtime();
    let report = rt.block_on(async {
        let locker = locker.renewed();
        let opts = LockOptions {
            wait: Wait::NoWait,
            ..LockOptions::default()
        };
        let guard = locker
            .acquire(key, &opts)
            .await
            .map_err(|e| e.to_string())?;
        let owner = guard.owner().to_owned();
        guard.release().await.map_err(|e| e.to_string())?;
        let clock = SystemClock;
        Ok::<_, String>(format!("{owner} {} {}", clock.random(), clock.random()))
    });
    let line = report.unwrap_or_else(|e| format!("error {e}"));
    i32::from(out.write_all(line.as_bytes()).is_err())
}

#[test]
fn forked_copies_draw_different_owner_ids_and_chance() {
    let locker = {
        let rt = runtime();
        let locker = rt.block_on(async {
            let fresh = flightlock_testkit::fresh_table("forkids").await;
            let locker = Locker::new(fresh.client, &fresh.table);
            // Take and release once: any generator the process keeps is now seeded.
            let guard = locker
                .acquire("fork-parent", &LockOptions::default())
                .await
                .unwrap();
            guard.release().await.unwrap();
            locker
        });
        drop(rt);
        locker
    };
    let mut readers = Vec::new();
    let mut children = Vec::new();
    for i in 0..2 {
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        // SAFETY: see the note at the top of the file.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                drop(ours);
                let code = child(&locker, &format!("fork-child-{i}"), theirs);
                std::process::exit(code);
            }
            ForkResult::Parent { child } => {
                drop(theirs);
                let mut line = String::new();
                ours.read_to_string(&mut line).unwrap();
                readers.push(line);
                children.push(child);
            }
        }
    }
    for pid in children {
        assert!(matches!(
            waitpid(pid, None).unwrap(),
            WaitStatus::Exited(_, 0)
        ));
    }
    for line in &readers {
        assert!(!line.starts_with("error"), "a child failed: {line}");
        assert_eq!(line.split(' ').count(), 3, "{line}");
    }
    let a: Vec<&str> = readers[0].split(' ').collect();
    let b: Vec<&str> = readers[1].split(' ').collect();
    assert_ne!(a[0], b[0], "both copies acquired with one owner id");
    assert_ne!(a[1..], b[1..], "both copies drew the same chance");
}
