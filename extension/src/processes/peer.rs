//! Which runtime process is on the other end of a proxy connection (Lambda Managed Instances,
//! where several runtime processes share one proxy and there are no INVOKE events to say which
//! invocation is whose).
//!
//! 1. The connection's client socket is the line of `/proc/net/tcp` (or `tcp6`, for a dual-stack
//!    client on an IPv4-mapped address) whose local address is the connection's peer address and
//!    whose remote address is the proxy's: that line gives the socket's inode.
//! 2. The processes holding that socket have a `/proc/<pid>/fd/*` link to `socket:[inode]`.
//! 3. From each holder, walk up the parents to the wrapped runtime: the process whose environment
//!    has [`PID_MARKER`] equal to its own pid (see [`super::runtime`]). For a runtime
//!    that speaks HTTP itself (awslambdaric, aws-lambda-ric, `lambda_runtime`) that is the holder
//!    itself; for a bash runtime the holder is a short-lived `curl` and the runtime is its parent.
//!
//! The answer is the runtime process, never the short-lived client: the crash watch then follows
//! the runtime's whole tree (see [`super::runtime::RuntimeTree`]). Anything unreadable
//! gives `None` ("unknown"): nothing is released early then.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use super::runtime::{environ_has, parse_stat, Proc, Stat, PID_MARKER};

/// Parses an address of `/proc/net/tcp` (`0100007F:1F91`) or `/proc/net/tcp6` (32 hex digits,
/// then the port). The kernel prints each 32-bit word of the address as a number in the host's
/// byte order, so the word's native bytes are the address bytes. Pure.
pub fn parse_address(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = ip.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

fn same(a: SocketAddr, b: SocketAddr) -> bool {
    let canonical = |s: SocketAddr| match s.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(s.ip(), IpAddr::V4),
        v4 => v4,
    };
    a.port() == b.port() && canonical(a) == canonical(b)
}

/// The inode of the socket whose local address is `local` and remote address `remote`, from the
/// text of `/proc/net/tcp` or `/proc/net/tcp6`. Pure.
pub fn socket_inode(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
        let f: Vec<&str> = line.split_whitespace().collect();
        let l = parse_address(f.get(1)?)?;
        let r = parse_address(f.get(2)?)?;
        (same(l, local) && same(r, remote))
            .then(|| f.get(9)?.parse().ok())
            .flatten()
            .filter(|inode| *inode != 0)
    })
}

/// A process holding socket `inode`: the newest first (a runtime's HTTP client is usually the
/// newest process), and the scan stops at the first one found. A socket is shared only by
/// processes that inherited it, which all lead to the same runtime.
pub fn socket_holder(proc_root: &Path, inode: u64) -> Option<u32> {
    let target = format!("socket:[{inode}]");
    let mut pids: Vec<u32> = std::fs::read_dir(proc_root)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect();
    pids.sort_unstable_by(|a, b| b.cmp(a));
    pids.into_iter().find(|pid| {
        std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str())
            })
        })
    })
}

/// Walks up from `start` (its parents by `stat_of`) to the first process for which `is_runtime`
/// holds (at most 64 steps; pid 0 and 1 end the walk). Pure given its two functions.
pub fn runtime_ancestor(
    stat_of: impl Fn(u32) -> Option<Stat>,
    start: u32,
    is_runtime: impl Fn(u32) -> bool,
) -> Option<Proc> {
    let mut pid = start;
    for _ in 0..64 {
        let stat = stat_of(pid).filter(|s| s.alive && s.proc.pid == pid)?;
        if is_runtime(pid) {
            return Some(stat.proc);
        }
        if stat.ppid <= 1 {
            return None;
        }
        pid = stat.ppid;
    }
    None
}

/// The runtime process (started by the wrapper, pointed at `runtime_api`) on the other end of
/// the connection from `peer` to the proxy listening on `proxy`; `None` if it cannot be known.
pub fn runtime_of_connection(
    proc_root: &Path,
    peer: SocketAddr,
    proxy: SocketAddr,
    runtime_api: &str,
) -> Option<Proc> {
    let inode = ["net/tcp", "net/tcp6"].iter().find_map(|t| {
        let text = std::fs::read_to_string(proc_root.join(t)).ok()?;
        socket_inode(&text, peer, proxy)
    })?;
    let stat_of = |pid: u32| {
        let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
        parse_stat(&text)
    };
    let is_runtime = |pid: u32| {
        std::fs::read(proc_root.join(pid.to_string()).join("environ")).is_ok_and(|env| {
            environ_has(&env, PID_MARKER, &pid.to_string())
                && environ_has(&env, "AWS_LAMBDA_RUNTIME_API", runtime_api)
        })
    };
    runtime_ancestor(stat_of, socket_holder(proc_root, inode)?, is_runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2331 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:2331 01 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:2331 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 20 4 30 10 -1
";

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_client_side_of_a_connection_is_found_by_its_addresses() {
        assert_eq!(parse_address("0100007F:2331"), Some(a("127.0.0.1:9009")));
        assert_eq!(
            parse_address("0000000000000000FFFF00000100007F:2331"),
            Some(a("[::ffff:127.0.0.1]:9009"))
        );
        assert_eq!(parse_address("zz:1"), None);
        let (proxy, client) = (a("127.0.0.1:9009"), a("127.0.0.1:54321"));
        // The client's socket, not the proxy's accepted one (3333) nor the listener (1111).
        assert_eq!(socket_inode(TCP, client, proxy), Some(2222));
        assert_eq!(socket_inode(TCP, proxy, client), Some(3333));
        assert_eq!(socket_inode(TCP, a("127.0.0.1:1"), proxy), None);
        // A dual-stack client: the same connection seen through an IPv4-mapped address.
        assert_eq!(
            socket_inode(TCP, a("[::ffff:127.0.0.1]:54321"), proxy),
            Some(2222)
        );
    }

    fn stat(pid: u32, ppid: u32) -> Stat {
        parse_stat(&format!(
            "{pid} (x) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {pid}00 1 1"
        ))
        .unwrap()
    }

    #[test]
    fn the_walk_up_stops_at_the_wrapped_runtime() {
        // init(1) -> sandbox(5) -> bash runtime(10) -> curl(11); and a second runtime (20).
        let table = [stat(5, 1), stat(10, 5), stat(11, 10), stat(20, 5)];
        let stat_of = |pid: u32| table.iter().find(|s| s.proc.pid == pid).copied();
        let runtimes = |pid: u32| pid == 10 || pid == 20;
        let walk = |start| runtime_ancestor(stat_of, start, runtimes).map(|p| p.pid);
        assert_eq!(walk(11), Some(10));
        assert_eq!(walk(10), Some(10));
        assert_eq!(walk(20), Some(20));
        // Not under a runtime, or gone.
        assert_eq!(walk(5), None);
        assert_eq!(walk(99), None);
    }

    #[test]
    fn a_real_connection_is_traced_to_the_process_holding_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(proxy).unwrap();
        let (_accepted, peer) = listener.accept().unwrap();
        let proc_root = Path::new("/proc");
        let text = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let inode = socket_inode(&text, peer, proxy).expect("the client socket is listed");
        assert_eq!(socket_holder(proc_root, inode), Some(std::process::id()));
        // This test process is no wrapped runtime: unknown.
        assert_eq!(
            runtime_of_connection(proc_root, peer, proxy, &proxy.to_string()),
            None
        );
        drop(client);
    }

    #[test]
    fn a_curl_started_by_a_wrapped_bash_runtime_is_traced_to_the_runtime() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = listener.local_addr().unwrap();
        // As Lambda starts it: the layer's wrapper execs the runtime (bash), which runs curl
        // against the proxy port the wrapper gave it.
        let wrapper = concat!(env!("CARGO_MANIFEST_DIR"), "/layer/flightlock-wrapper");
        let mut runtime = std::process::Command::new(wrapper)
            .args([
                "bash",
                "-c",
                "curl -s -m 20 \"http://${AWS_LAMBDA_RUNTIME_API}/x\" >/dev/null; sleep 20",
            ])
            .env("FLIGHTLOCK_PROXY_PORT", proxy.port().to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let (_accepted, peer) = listener.accept().unwrap();
        let mut found = None;
        for _ in 0..200 {
            found = runtime_of_connection(Path::new("/proc"), peer, proxy, &proxy.to_string());
            if found.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let found = found.expect("the runtime behind the curl is found");
        assert_eq!(found.pid, runtime.id(), "the bash runtime, not its curl");
        runtime.kill().unwrap();
        runtime.wait().unwrap();
    }
}
