//! Which process is on the other end of a runtime's loopback connection (Linux `/proc`), so the
//! extension notices a runtime that dies in the middle of an invocation and releases its lock at
//! once, instead of leaving it to lapse after a lease. (When the runtime crashes, Lambda resets
//! the sandbox and kills the extension a moment later, without a SHUTDOWN event: this is the
//! only chance to release.)
//!
//! Lookup: `/proc/net/tcp{,6}` maps the runtime's socket (its local port, our listener's port) to
//! an inode; `/proc/<pid>/fd/*` links to `socket:[inode]` name the owners. If anything is
//! unreadable the answer is "unknown" and nothing is released early.

use std::path::Path;

/// The inode of the socket with local port `local_port` connected to remote port `remote_port`
/// on loopback, from the text of `/proc/net/tcp` or `/proc/net/tcp6`.
pub fn find_inode(table: &str, local_port: u16, remote_port: u16) -> Option<u64> {
    let port_of = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            return None;
        }
        (port_of(f[1]) == Some(local_port) && port_of(f[2]) == Some(remote_port))
            .then(|| f[9].parse().ok())
            .flatten()
            .filter(|inode| *inode != 0)
    })
}

/// The processes (other than us) holding the socket with `local_port` → `remote_port`.
pub fn socket_owners(local_port: u16, remote_port: u16) -> Vec<u32> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|p| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| find_inode(&t, local_port, remote_port))
    });
    let Some(inode) = inode else {
        return Vec::new();
    };
    let target = format!("socket:[{inode}]");
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str())
                })
            })
        })
        .collect()
}

/// True if `pid` exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    let stat = Path::new("/proc").join(pid.to_string()).join("stat");
    match std::fs::read_to_string(stat) {
        // The state follows the command name in parentheses, which may contain spaces.
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2329 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:2329 01 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:2329 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 20 4 30 10 -1";

    #[test]
    fn finds_the_peer_socket() {
        // The runtime's socket: local port 0xD431 = 54321, remote = our port 0x2329 = 9001.
        assert_eq!(find_inode(TCP, 54321, 9001), Some(2222));
        // Our accepted socket is the mirror image.
        assert_eq!(find_inode(TCP, 9001, 54321), Some(3333));
        assert_eq!(find_inode(TCP, 1, 9001), None);
        assert_eq!(find_inode("header only", 1, 2), None);
    }

    #[test]
    fn we_are_alive_and_a_pid_that_cannot_exist_is_not() {
        assert!(is_alive(std::process::id()));
        assert!(!is_alive(u32::MAX));
    }

    #[test]
    fn owners_of_a_real_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        let local = c.local_addr().unwrap().port();
        let remote = l.local_addr().unwrap().port();
        // Both ends are this process, which is excluded: nobody else holds it.
        assert!(socket_owners(local, remote).is_empty());
        // ...but the socket itself is found.
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        assert!(find_inode(&table, local, remote).is_some());
    }
}
