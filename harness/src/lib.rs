//! Real servers for tests, the benchmark, the drill and the demo: `redis-server`,
//! `etcd` and `delayq` processes on free loopback ports, each in its own temporary
//! directory, killed when dropped; a file a server (`redis_server.rs`, `cluster.rs`,
//! `sentinel.rs`, `etcd.rs`, `mariadb.rs`, `delayq_process.rs`) beside the shared ports and
//! signals here; `pki.rs` makes a CA and certificates for TLS. Binaries are found on `PATH` unless
//! `DELAYQ_TEST_REDIS_SERVER` / `DELAYQ_TEST_ETCD` name them.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tempfile::TempDir;

mod cluster;
mod delayq_process;
mod etcd;
mod mariadb;
mod pki;
#[cfg(feature = "props")]
pub mod props;
mod proxy;
mod redis_server;
mod sentinel;

pub use cluster::*;
pub use delayq_process::*;
pub use etcd::*;
pub use mariadb::*;
pub use pki::*;
pub use proxy::Proxy;
pub use redis_server::*;
pub use sentinel::*;

/// A loopback port nobody listens on right now, below the kernel's ephemeral
/// range (`ip_local_port_range`). A server stopped and started again on its port
/// (a restart, a container's `docker start`) leaves it unbound in between, and an
/// ephemeral port may then go to another process's outgoing connection or
/// `bind(0)`, and stay taken for a minute in TIME_WAIT: the start would fail with
/// "address already in use". The kernel hands out no port below the range, and a
/// counter keeps this process from handing out one twice until it wraps; a lease
/// kept in a directory every process shares (see `PortLeases`) keeps other
/// processes from it for a while. Where the range starts too low to leave room,
/// the kernel picks (`bind(0)`).
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    match LowPorts::get() {
        Some(low) => LowPorts::pick(&low.plain, &NEXT, |_| true),
        None => ephemeral_port(),
    }
}

/// A free port for a Redis Cluster node: its cluster bus port (+10000) must be free
/// and valid too. Both are below the ephemeral range, as [`free_port`]'s are,
/// and apart from them.
fn free_cluster_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let bus_free = |port: u16| TcpListener::bind(("127.0.0.1", port + CLUSTER_BUS)).is_ok();
    match LowPorts::get() {
        Some(low) => LowPorts::pick(&low.cluster, &NEXT, bus_free),
        None => loop {
            let port = ephemeral_port();
            if port <= u16::MAX - CLUSTER_BUS && bus_free(port) {
                return port;
            }
        },
    }
}

/// Redis Cluster's bus port is the client port + 10000.
const CLUSTER_BUS: u16 = 10_000;

/// Ports below the ephemeral range `E..`: cluster nodes' in `E-12768..E-10000`
/// (their bus ports `E-2768..E`), every other server's in `E-10000..E-2768`.
struct LowPorts {
    cluster: std::ops::Range<u32>,
    plain: std::ops::Range<u32>,
}

impl LowPorts {
    const CLUSTER_PORTS: u32 = 2_768;

    fn get() -> Option<&'static LowPorts> {
        static LOW: OnceLock<Option<LowPorts>> = OnceLock::new();
        LOW.get_or_init(|| {
            let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
                .ok()?
                .split_whitespace()
                .next()?
                .parse::<u32>()
                .ok()?;
            let bus = u32::from(CLUSTER_BUS);
            let lowest = first_ephemeral.checked_sub(bus + Self::CLUSTER_PORTS)?;
            (lowest >= 1_024).then(|| LowPorts {
                cluster: lowest..lowest + Self::CLUSTER_PORTS,
                plain: lowest + Self::CLUSTER_PORTS..first_ephemeral - Self::CLUSTER_PORTS,
            })
        })
        .as_ref()
    }

    /// The next port of `range` from `next` (which starts where this process's id
    /// says, so that processes side by side start apart) that is free and
    /// `also_free` says so.
    fn pick(
        range: &std::ops::Range<u32>,
        next: &AtomicU32,
        also_free: impl Fn(u16) -> bool,
    ) -> u16 {
        let span = range.end - range.start;
        let start = std::process::id().wrapping_mul(7_919) % span;
        for _ in 0..span {
            let step = next.fetch_add(1, Ordering::Relaxed) % span;
            let port = (range.start + (start + step) % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok()
                && also_free(port)
                && PortLeases::take(port)
            {
                return port;
            }
        }
        panic!("no free loopback port in {range:?}")
    }
}

/// Ports handed out to any test process lately, one file each in a directory all
/// of them share. A port a process handed out is not handed out again by another
/// for [`PortLeases::HELD`], though its server is gone: a test that kills a
/// server keeps others (replicas, Sentinels) trying its address, and another
/// test's server started there meanwhile would answer them as if it were it (a
/// killed master's port taken over keeps Sentinel from ever seeing it down).
struct PortLeases;

impl PortLeases {
    const HELD: Duration = Duration::from_secs(300);

    /// Takes `port`'s lease: false while another process's is fresh. Where the
    /// directory cannot be used, every port is free to take.
    fn take(port: u16) -> bool {
        static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
        let Some(dir) = DIR.get_or_init(|| {
            let dir = std::env::temp_dir().join("delayq-harness-ports");
            std::fs::create_dir_all(&dir).ok().map(|()| dir)
        }) else {
            return true;
        };
        let lease = dir.join(port.to_string());
        let create = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lease)
                .is_ok()
        };
        if create() {
            return true;
        }
        let stale = std::fs::metadata(&lease)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Self::HELD);
        // Of two processes that find it stale, one creates it again.
        stale && std::fs::remove_file(&lease).is_ok() && create()
    }
}

/// A port the kernel picks from its ephemeral range.
fn ephemeral_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback port")
}

fn binary(env: &str, default: &str) -> PathBuf {
    std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// Ports come from [`free_port`], which cannot reserve them: another process may
/// take one (even as the local end of an outgoing connection) before the server
/// binds it. Such a start is tried again, on fresh ports.
fn retry_port_clash<T>(mut start: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let mut attempts = 1;
    loop {
        match start() {
            Err(e)
                if attempts < 4
                    && format!("{e:#}")
                        .to_ascii_lowercase()
                        .contains("address already in use") =>
            {
                attempts += 1;
            }
            other => return other,
        }
    }
}

fn wait_for_port(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Sends a signal to a child process.
pub fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid we own; a stale pid only yields ESRCH.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// [`signal`] to a process that is still ours (none after a kill).
fn signal_running(child: &Option<Child>, sig: libc::c_int) {
    if let Some(child) = child {
        signal(child, sig);
    }
}

fn kill_and_wait(child: &mut Child) {
    signal(child, libc::SIGCONT);
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_handed_out_is_leased_to_no_other_process_until_its_lease_is_stale() {
        let port = free_port();
        // Another process asking now is refused it.
        assert!(!PortLeases::take(port));
        let lease = std::env::temp_dir()
            .join("delayq-harness-ports")
            .join(port.to_string());
        let old = std::time::SystemTime::now() - PortLeases::HELD - Duration::from_secs(1);
        File::options()
            .write(true)
            .open(&lease)
            .and_then(|f| f.set_modified(old))
            .expect("age the lease");
        assert!(PortLeases::take(port));
        assert!(!PortLeases::take(port));
    }

    #[test]
    fn free_ports_are_below_the_ephemeral_range_distinct_and_cluster_ports_apart() {
        let low = LowPorts::get().expect("room below this kernel's ephemeral range");
        let first_ephemeral = low.plain.end + LowPorts::CLUSTER_PORTS;
        let plain: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let mut distinct = plain.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), plain.len(), "{plain:?}");
        assert!(
            plain.iter().all(|&p| low.plain.contains(&u32::from(p))),
            "{plain:?}"
        );
        for _ in 0..50 {
            let node = u32::from(free_cluster_port());
            assert!(low.cluster.contains(&node), "{node}");
            let bus = node + u32::from(CLUSTER_BUS);
            assert!(bus >= low.plain.end && bus < first_ephemeral, "{bus}");
        }
    }
}
