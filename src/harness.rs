//! Real servers for tests, the benchmark, the drill and the demo: `redis-server`,
//! `etcd` and `delayq` processes on free loopback ports, each in its own temporary
//! directory, killed when dropped. Binaries are found on `PATH` unless
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

#[cfg(feature = "server")]
mod proxy;
#[cfg(feature = "server")]
pub use proxy::Proxy;

/// A loopback port nobody listens on right now, below the kernel's ephemeral
/// range (`ip_local_port_range`). A server stopped and started again on its port
/// (a restart, a container's `docker start`) leaves it unbound in between, and an
/// ephemeral port may then go to another process's outgoing connection or
/// `bind(0)`, and stay taken for a minute in TIME_WAIT: the start would fail with
/// "address already in use". The kernel hands out no port below the range, and a
/// counter keeps this process from handing out one twice until it wraps. Where
/// the range starts too low to leave room, the kernel picks (`bind(0)`).
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
            if TcpListener::bind(("127.0.0.1", port)).is_ok() && also_free(port) {
                return port;
            }
        }
        panic!("no free loopback port in {range:?}")
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

/// Options for a Redis server.
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// Append-only file with `appendfsync always`: nothing acknowledged is lost on a crash.
    pub aof: bool,
    /// A TLS port besides the plain one, with these certificates.
    pub tls: Option<RedisTlsFiles>,
    /// A replica of the master on this port.
    pub replica_of: Option<u16>,
    /// A Redis Cluster node (`cluster-enabled yes`), on a port whose cluster bus
    /// port (+10000) is free too; see [`RedisCluster`].
    pub cluster: bool,
}

/// The PEM files a TLS-serving `redis-server` or `etcd` uses.
#[derive(Clone, Debug)]
pub struct RedisTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA that signs client certificates.
    pub ca: PathBuf,
    /// Whether clients must present a certificate the CA signed.
    pub client_auth: bool,
}

/// A `redis-server` of our own.
pub struct RedisServer {
    pub port: u16,
    /// The TLS port, with `RedisOptions::tls`.
    pub tls_port: Option<u16>,
    options: RedisOptions,
    dir: TempDir,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(RedisOptions::default())
    }

    pub fn start_with(options: RedisOptions) -> anyhow::Result<Self> {
        retry_port_clash(|| {
            let dir = tempfile::Builder::new().prefix("delayq-redis-").tempdir()?;
            let mut server = RedisServer {
                port: if options.cluster {
                    free_cluster_port()
                } else {
                    free_port()
                },
                tls_port: options.tls.as_ref().map(|_| free_port()),
                options: options.clone(),
                dir,
                child: None,
            };
            server.spawn()?;
            Ok(server)
        })
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new(binary("DELAYQ_TEST_REDIS_SERVER", "redis-server"));
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args([
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--protected-mode",
                "no",
                // So that a test can move `dir` away and make saves fail (MISCONF).
                "--enable-protected-configs",
                "local",
                "--daemonize",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(["--appendonly", if self.options.aof { "yes" } else { "no" }])
            .args(["--appendfsync", "always"]);
        if let (Some(tls), Some(port)) = (&self.options.tls, self.tls_port) {
            cmd.arg("--tls-port")
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .args([
                    "--tls-auth-clients",
                    if tls.client_auth { "yes" } else { "no" },
                ]);
        }
        if !self.options.cluster && self.options.tls.is_some() {
            // A replica replicates over TLS (from the master's TLS port), and a
            // master demoted by Sentinel does so too.
            cmd.args(["--tls-replication", "yes"]);
        }
        if self.options.cluster && self.options.tls.is_some() {
            // The cluster bus and replication over TLS too, and the TLS ports
            // announced to clients.
            cmd.args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
        }
        if self.options.cluster {
            // A replica's first sync at once (not after the 5 s diskless delay): one
            // that never synced cannot take over its master.
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--repl-diskless-sync-delay", "0"])
                .arg("--cluster-config-file")
                .arg(self.dir.path().join("nodes.conf"));
        }
        if let Some(master) = self.options.replica_of {
            cmd.arg("--replicaof")
                .arg("127.0.0.1")
                .arg(master.to_string());
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .context("start redis-server (is it installed? set DELAYQ_TEST_REDIS_SERVER)")?;
        self.child = Some(child);
        if !wait_for_port(self.port, Duration::from_secs(10)) {
            bail!(
                "redis-server on port {} did not come up; its log:\n{}",
                self.port,
                self.log()
            );
        }
        // The port opens before an AOF is replayed; until then commands answer LOADING.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let pong = redis::Client::open(self.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            match pong {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    bail!(
                        "redis-server on port {} does not answer PING ({e}); its log:\n{}",
                        self.port,
                        self.log()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TLS port's URL (`rediss://`), with `RedisOptions::tls`.
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("rediss://127.0.0.1:{port}"))
    }

    pub fn log(&self) -> String {
        tail(&self.dir.path().join("redis.log"), 40)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: a crash, with no chance to write anything more.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_wait(&mut child);
        }
    }

    /// Starts again on the same port and directory (so an AOF is replayed).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
    }

    /// A field of `INFO replication` (`role`, `master_link_status`, …).
    pub fn replication(&self, field: &str) -> Option<String> {
        let mut client = redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .ok()?;
        let text: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut client)
            .ok()?;
        crate::store::info_value(&text, field).map(str::to_owned)
    }

    /// A synchronous connection, for test assertions.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .unwrap_or_else(|e| panic!("connect to redis on {}: {e}\n{}", self.port, self.log()))
    }
}

/// A Redis Cluster of our own on loopback: masters with one replica each, joined
/// by `redis-cli --cluster create`; every node is stopped on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` masters (at least 3) and as many replicas, every slot covered.
    pub fn start(masters: usize) -> anyhow::Result<Self> {
        Self::start_with(masters, None)
    }

    /// [`RedisCluster::start`], with `tls`: every node also serves TLS (its
    /// `tls_port`), and the cluster bus and replication run over TLS; clients
    /// that connect over TLS are told the nodes' TLS ports.
    pub fn start_with(masters: usize, tls: Option<RedisTlsFiles>) -> anyhow::Result<Self> {
        let nodes = (0..masters * 2)
            .map(|_| {
                RedisServer::start_with(RedisOptions {
                    cluster: true,
                    tls: tls.clone(),
                    ..RedisOptions::default()
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut create = Command::new(binary("DELAYQ_TEST_REDIS_CLI", "redis-cli"));
        create.args(["--cluster", "create"]);
        match &tls {
            Some(files) => {
                create.args(
                    nodes
                        .iter()
                        .map(|n| format!("127.0.0.1:{}", n.tls_port.unwrap_or(n.port))),
                );
                create
                    .arg("--tls")
                    .arg("--cacert")
                    .arg(&files.ca)
                    .arg("--cert")
                    .arg(&files.cert)
                    .arg("--key")
                    .arg(&files.key);
            }
            None => {
                create.args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
            }
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .context("run redis-cli --cluster create (is redis-tools installed?)")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.is_ok() {
            if Instant::now() > deadline {
                bail!("the Redis Cluster did not reach cluster_state:ok within 30s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    /// Whether every node says `cluster_state:ok` and knows every other node, and
    /// every replica has synced with its master.
    fn is_ok(&self) -> bool {
        self.nodes.iter().all(|n| {
            let connected = redis::Client::open(n.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)));
            let Ok(mut c) = connected else {
                return false;
            };
            let cluster = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c);
            let replication = redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut c);
            cluster.is_ok_and(|i| {
                i.contains("cluster_state:ok")
                    && i.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
            }) && replication
                .is_ok_and(|r| r.contains("role:master") || r.contains("master_link_status:up"))
        })
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A connection to the first node still running.
    fn any_live(&self) -> anyhow::Result<redis::Connection> {
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let connected = redis::Client::open(node.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)));
            if let Ok(conn) = connected {
                return Ok(conn);
            }
        }
        bail!("no node of the Redis Cluster answers")
    }

    /// The `[redis]` settings (without the header) of a daemon on this cluster:
    /// `redis.mode = "cluster"`, the first node as the URL and the others as seeds.
    pub fn redis_section(&self) -> String {
        let urls = self.urls();
        let seeds: Vec<String> = urls[1..]
            .iter()
            .map(|u| format!("\"{}\"", u.trim_start_matches("redis://")))
            .collect();
        format!(
            "mode = \"cluster\"\nurl = \"{}\"\nnodes = [{}]\n",
            urls[0],
            seeds.join(", ")
        )
    }

    /// Which node (index into `nodes`) serves `slot` as master now.
    pub fn master_of(&self, slot: u16) -> anyhow::Result<usize> {
        let mut conn = self.any_live()?;
        let slots: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn)?;
        let (_, port) = crate::store::slot_master(&slots, slot)
            .with_context(|| format!("no master serves slot {slot}"))?;
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .context("CLUSTER SLOTS names a node not ours")
    }

    /// Whether node `i` runs and is a master now.
    pub fn master_of_node(&self, i: usize) -> bool {
        if self.nodes[i].child.is_none() {
            return false;
        }
        let role: redis::RedisResult<Vec<redis::Value>> =
            redis::cmd("ROLE").query(&mut self.nodes[i].client());
        role.ok()
            .and_then(|r| redis::from_redis_value::<String>(r.first()?.clone()).ok())
            .is_some_and(|r| r == "master")
    }

    /// SIGKILLs node `i` and waits (up to 30 s) until another node serves as
    /// master every slot it served: its replica's promotion. When it was killed.
    pub fn kill_master(&mut self, i: usize) -> anyhow::Result<std::time::SystemTime> {
        let slots: Vec<u16> = (0..16384u16)
            .step_by(64)
            .filter(|&s| self.master_of(s).ok() == Some(i))
            .collect();
        self.nodes[i].kill();
        let killed = std::time::SystemTime::now();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let moved = slots
                .iter()
                .all(|&s| self.master_of(s).is_ok_and(|m| m != i));
            if moved {
                return Ok(killed);
            }
            if Instant::now() > deadline {
                bail!("no replica took over node {i}'s slots within 30s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Moves `slot` to node `to` (a master) as `redis-cli --cluster reshard` does,
    /// key by key: IMPORTING and MIGRATING, then `MIGRATE` of `batch` keys at a
    /// time with `pause` between (clients meanwhile get ASK and TRYAGAIN), then the
    /// slot's new owner announced to every master.
    /// Node `i`'s id in the cluster (`CLUSTER MYID`).
    fn node_id(&self, i: usize) -> anyhow::Result<String> {
        Ok(redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.nodes[i].client())?)
    }

    /// Moves `slots` hash slots from node `from` to node `to` (both masters) as an
    /// operator does: `redis-cli --cluster reshard`, which migrates the keys of
    /// each slot in turn while clients go on (ASK, TRYAGAIN meanwhile).
    pub fn reshard(&self, from: usize, to: usize, slots: usize) -> anyhow::Result<()> {
        let out = Command::new(binary("DELAYQ_TEST_REDIS_CLI", "redis-cli"))
            .args(["--cluster", "reshard"])
            .arg(format!("127.0.0.1:{}", self.nodes[from].port))
            .arg("--cluster-from")
            .arg(self.node_id(from)?)
            .arg("--cluster-to")
            .arg(self.node_id(to)?)
            .arg("--cluster-slots")
            .arg(slots.to_string())
            .args(["--cluster-yes", "--cluster-pipeline", "100"])
            .stdin(Stdio::null())
            .output()
            .context("run redis-cli --cluster reshard")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster reshard failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    pub fn move_slot(
        &self,
        slot: u16,
        to: usize,
        batch: usize,
        pause: Duration,
    ) -> anyhow::Result<()> {
        let from = self.master_of(slot)?;
        if from == to {
            return Ok(());
        }
        let (from_id, to_id) = (self.node_id(from)?, self.node_id(to)?);
        let mut source = self.nodes[from].client();
        let mut target = self.nodes[to].client();
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&from_id)
            .query(&mut target)?;
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&to_id)
            .query(&mut source)?;
        loop {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(batch)
                .query(&mut source)?;
            if keys.is_empty() {
                break;
            }
            let () = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.nodes[to].port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut source)?;
            std::thread::sleep(pause);
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].child.is_none() {
                continue;
            }
            let mut conn = self.nodes[i].client();
            let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn)?;
            if redis::from_redis_value::<String>(role[0].clone())? == "master" {
                let () = redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&to_id)
                    .query(&mut conn)?;
            }
        }
        Ok(())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How a Sentinel asks its clients to connect.
#[derive(Clone, Debug, Default)]
pub struct SentinelOptions {
    /// `requirepass`.
    pub password: Option<String>,
    /// TLS on its port (instead of plain TCP), and to the master it watches.
    pub tls: Option<RedisTlsFiles>,
    /// The data nodes watched over TLS (`tls-replication yes`, with these
    /// files), while clients still reach the Sentinel over plain TCP.
    pub data_tls: Option<RedisTlsFiles>,
    /// `failover-timeout` (10 s when not given). Sentinel also waits this long
    /// before it re-points a replica that replicates from another address than
    /// the master's (through a proxy, say) at the master itself.
    pub failover_timeout: Option<Duration>,
}

/// One `redis-sentinel` watching one master under a name.
pub struct SentinelServer {
    pub port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl SentinelServer {
    /// A Sentinel that watches the master on `master_port` as `name`, with
    /// `quorum`, judging it down after `down_after` (failovers time out after 10 s).
    pub fn start(
        name: &str,
        master_port: u16,
        quorum: u32,
        down_after: Duration,
    ) -> anyhow::Result<Self> {
        Self::start_with(
            name,
            master_port,
            quorum,
            down_after,
            &SentinelOptions::default(),
        )
    }

    /// [`SentinelServer::start`] with a password or TLS.
    pub fn start_with(
        name: &str,
        master_port: u16,
        quorum: u32,
        down_after: Duration,
        options: &SentinelOptions,
    ) -> anyhow::Result<Self> {
        retry_port_clash(|| {
            let dir = tempfile::Builder::new()
                .prefix("delayq-sentinel-")
                .tempdir()?;
            let port = free_port();
            // Sentinel rewrites its configuration file: one of its own, writable.
            let config = dir.path().join("sentinel.conf");
            std::fs::write(
                &config,
                format!(
                    "port {plain}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\n\
                     logfile {dir}/sentinel.log\n\
                     sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
                     sentinel down-after-milliseconds {name} {down}\n\
                     sentinel failover-timeout {name} {failover}\n\
                     sentinel parallel-syncs {name} 1\n{requirepass}{tls}",
                    dir = dir.path().display(),
                    plain = if options.tls.is_some() { 0 } else { port },
                    down = down_after.as_millis(),
                    failover = options
                        .failover_timeout
                        .unwrap_or(Duration::from_secs(10))
                        .as_millis(),
                    requirepass = options
                        .password
                        .as_ref()
                        .map(|p| format!("requirepass {p}\n"))
                        .unwrap_or_default(),
                    // Clients over TLS only; the master watched over TLS too.
                    tls = options
                        .tls
                        .as_ref()
                        .map(|t| format!(
                            "tls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n",
                            t.cert.display(),
                            t.key.display(),
                            t.ca.display()
                        ))
                        .unwrap_or_default(),
                ) + &options
                    .data_tls
                    .as_ref()
                    // Sentinels speak TLS to each other too, on a TLS port of
                    // their own that they announce.
                    .map(|t| format!(
                        "tls-port {}\ntls-auth-clients no\ntls-cert-file {}\ntls-key-file {}\n\
                         tls-ca-cert-file {}\ntls-replication yes\n",
                        free_port(),
                        t.cert.display(),
                        t.key.display(),
                        t.ca.display()
                    ))
                    .unwrap_or_default(),
            )?;
            let child = Command::new(binary("DELAYQ_TEST_REDIS_SENTINEL", "redis-sentinel"))
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context(
                    "start redis-sentinel (is it installed? set DELAYQ_TEST_REDIS_SENTINEL)",
                )?;
            let mut sentinel = SentinelServer {
                port,
                dir,
                child: Some(child),
            };
            if !wait_for_port(port, Duration::from_secs(10)) {
                sentinel.kill();
                bail!("redis-sentinel on port {port} did not come up");
            }
            Ok(sentinel)
        })
    }

    /// "127.0.0.1:port", as `redis.sentinel.nodes` takes it.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A synchronous connection, to ask this Sentinel things.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.port))
            .and_then(|c| c.get_connection())
            .unwrap_or_else(|e| panic!("connect to sentinel on {}: {e}", self.port))
    }

    /// The port of the master this Sentinel names for `name`.
    pub fn master_port(&self, name: &str) -> Option<u16> {
        let addr: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(name)
            .query(&mut self.client())
            .ok()?;
        addr?.1.parse().ok()
    }

    pub fn log(&self) -> String {
        tail(&self.dir.path().join("sentinel.log"), 40)
    }

    /// Sends `sig` to the Sentinel (SIGSTOP: it misses what happens until SIGCONT).
    pub fn signal(&self, sig: libc::c_int) {
        signal_running(&self.child, sig);
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_wait(&mut child);
        }
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A master, its replicas and three Sentinels (quorum 2) watching it under a
/// name, as a delayq deployment on Sentinel has them.
pub struct SentinelSet {
    pub name: String,
    pub master: RedisServer,
    pub replicas: Vec<RedisServer>,
    pub sentinels: Vec<SentinelServer>,
}

impl SentinelSet {
    /// Starts them; the replicas replicate from `upstream` (the master's port, or
    /// a proxy's in front of it). Sentinels judge the master down after 1 s.
    /// Not ready for a failover until [`SentinelSet::ready`].
    pub fn start(
        name: &str,
        replicas: usize,
        upstream: Option<u16>,
        options: &SentinelOptions,
    ) -> anyhow::Result<Self> {
        // With `options.data_tls`, every data node serves TLS too and replicates
        // over it, and the Sentinels watch the TLS ports.
        let master = RedisServer::start_with(RedisOptions {
            tls: options.data_tls.clone(),
            ..RedisOptions::default()
        })
        .context("start the master")?;
        let watched = master.tls_port.filter(|_| options.data_tls.is_some());
        let upstream = upstream.unwrap_or(watched.unwrap_or(master.port));
        let replicas = (0..replicas)
            .map(|_| {
                RedisServer::start_with(RedisOptions {
                    replica_of: Some(upstream),
                    tls: options.data_tls.clone(),
                    ..RedisOptions::default()
                })
                .context("start a replica")
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let sentinels = (0..3)
            .map(|_| {
                SentinelServer::start_with(
                    name,
                    watched.unwrap_or(master.port),
                    2,
                    Duration::from_millis(1000),
                    options,
                )
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(SentinelSet {
            name: name.to_owned(),
            master,
            replicas,
            sentinels,
        })
    }

    /// Whether a failover can happen now: every replica's link to its master is
    /// up, and every Sentinel knows every replica and the two other Sentinels (to
    /// reach the quorum and elect one of them to lead the failover).
    pub fn ready(&self) -> bool {
        let linked = self
            .replicas
            .iter()
            .all(|r| r.replication("master_link_status").as_deref() == Some("up"));
        linked
            && self.sentinels.iter().all(|s| {
                let mut c = s.client();
                let mut count = |what: &str| {
                    redis::cmd("SENTINEL")
                        .arg(what)
                        .arg(&self.name)
                        .query::<Vec<redis::Value>>(&mut c)
                        .map_or(0, |v| v.len())
                };
                count("replicas") == self.replicas.len() && count("sentinels") == 2
            })
    }

    /// Waits until [`SentinelSet::ready`], up to `timeout`.
    pub fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.ready() {
            if Instant::now() > deadline {
                bail!("Sentinels not ready within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The `[redis]` section's lines of a delayq configuration that finds the
    /// master through all the Sentinels, with `extra` lines (as
    /// [`RedisCluster::redis_section`], without the header).
    pub fn redis_section(&self, extra: &str) -> String {
        self.redis_section_asking(extra, &self.sentinels)
    }

    /// [`SentinelSet::redis_section`], with only `sentinels` to ask.
    pub fn redis_section_asking(&self, extra: &str, sentinels: &[SentinelServer]) -> String {
        let nodes: Vec<String> = sentinels
            .iter()
            .map(|s| format!("\"{}\"", s.address()))
            .collect();
        format!(
            "url = \"redis://{name}\"\n{extra}\nsentinel = {{ master = \"{name}\", nodes = [{}] }}\n",
            nodes.join(", "),
            name = self.name,
        )
    }

    /// Sets every Sentinel's failover-timeout.
    pub fn failover_timeout(&self, timeout: Duration) -> anyhow::Result<()> {
        for sentinel in &self.sentinels {
            let () = redis::cmd("SENTINEL")
                .arg("SET")
                .arg(&self.name)
                .arg("failover-timeout")
                .arg(timeout.as_millis() as u64)
                .query(&mut sentinel.client())
                .context("SENTINEL SET failover-timeout")?;
        }
        Ok(())
    }

    /// The master's port as every Sentinel names it, once they agree.
    pub fn master_port(&self) -> Option<u16> {
        let mut ports = self.sentinels.iter().map(|s| s.master_port(&self.name));
        let first = ports.next()??;
        ports.all(|p| p == Some(first)).then_some(first)
    }

    /// The server on `port` (plain or TLS): the master or one of the replicas.
    pub fn server(&self, port: u16) -> Option<&RedisServer> {
        std::iter::once(&self.master)
            .chain(&self.replicas)
            .find(|r| r.port == port || r.tls_port == Some(port))
    }
}

/// A MariaDB server of our own: a data directory made by `mariadb-install-db` in a
/// temp dir, `mariadbd` on a free loopback port (and a socket in that dir), a
/// database `delayq` and a user `delayq` with all rights on it; stopped on drop.
pub struct MariaDbServer {
    pub port: u16,
    /// The `delayq` user's password.
    pub password: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl MariaDbServer {
    pub fn start() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("delayq-mariadb-")
            .tempdir()?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(mariadb_tmpdir(&data))?;
        let out = Command::new(binary(
            "DELAYQ_TEST_MARIADB_INSTALL_DB",
            "mariadb-install-db",
        ))
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--tmpdir={}", mariadb_tmpdir(&data).display()))
        .args([
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ])
        .stdin(Stdio::null())
        .output()
        .context("run mariadb-install-db (is mariadb-server installed?)")?;
        if !out.status.success() {
            bail!(
                "mariadb-install-db failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let data_dir = data.clone();
        let (port, child) = retry_port_clash(move || {
            let port = free_port();
            Ok((port, spawn_mariadbd(&data_dir, port)?))
        })?;
        let server = MariaDbServer {
            port,
            password: format!("pw-{}", ulid::Ulid::new()),
            dir,
            child: Some(child),
        };
        server.sql(&format!(
            "CREATE DATABASE delayq; CREATE USER 'delayq'@'%' IDENTIFIED BY '{}'; \
             GRANT ALL ON delayq.* TO 'delayq'@'%';",
            server.password
        ))?;
        Ok(server)
    }

    /// Runs `sql` as root over the server's socket.
    pub fn sql(&self, sql: &str) -> anyhow::Result<String> {
        let socket = self.dir.path().join("data/mariadb.sock");
        let out = Command::new(binary("DELAYQ_TEST_MARIADB", "mariadb"))
            .arg("--no-defaults")
            .arg(format!("--socket={}", socket.display()))
            .args(["-uroot", "--batch", "--skip-column-names", "-e", sql])
            .stdin(Stdio::null())
            .output()
            .context("run mariadb (the client)")?;
        if !out.status.success() {
            bail!(
                "mariadb -e {sql:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `mysql://delayq@127.0.0.1:<port>/delayq`, without the password.
    pub fn url(&self) -> String {
        format!("mysql://delayq@127.0.0.1:{}/delayq", self.port)
    }

    /// The URL with the password in it.
    pub fn url_with_password(&self) -> String {
        format!(
            "mysql://delayq:{}@127.0.0.1:{}/delayq",
            self.password, self.port
        )
    }

    /// SIGKILLs the server.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_wait(&mut child);
        }
    }

    /// SIGSTOP: the server hangs, its connections stay open.
    pub fn pause(&self) {
        signal_running(&self.child, libc::SIGSTOP);
    }

    pub fn resume(&self) {
        signal_running(&self.child, libc::SIGCONT);
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        let data = self.dir.path().join("data");
        self.child = Some(spawn_mariadbd(&data, self.port)?);
        Ok(())
    }
}

/// A MariaDB's temporary directory of its own, beside its `data`: a server starting
/// deletes every `#sql*` file in its temporary directory, another's included.
fn mariadb_tmpdir(data: &Path) -> PathBuf {
    data.with_file_name("tmp")
}

/// `mariadbd` on `data`, listening on loopback `port` and a socket in `data`,
/// once its port accepts connections.
fn spawn_mariadbd(data: &Path, port: u16) -> anyhow::Result<Child> {
    let mut child = Command::new(binary("DELAYQ_TEST_MARIADBD", "mariadbd"))
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--tmpdir={}", mariadb_tmpdir(data).display()))
        .arg(format!("--socket={}", data.join("mariadb.sock").display()))
        .arg(format!("--pid-file={}", data.join("mariadb.pid").display()))
        .arg(format!("--log-error={}", data.join("error.log").display()))
        .arg(format!("--port={port}"))
        .args([
            "--user=root",
            "--bind-address=127.0.0.1",
            "--skip-name-resolve",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=128M",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start mariadbd (is mariadb-server installed?)")?;
    if !wait_for_port(port, Duration::from_secs(30)) {
        kill_and_wait(&mut child);
        let log = std::fs::read_to_string(data.join("error.log")).unwrap_or_default();
        bail!("mariadbd on port {port} did not come up; its log:\n{log}");
    }
    Ok(child)
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One `etcd` member (or a single-member cluster).
pub struct EtcdServer {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    /// A TLS client port besides the plain one, with [`EtcdServer::start_tls`].
    pub tls_port: Option<u16>,
    tls: Option<RedisTlsFiles>,
    initial_cluster: String,
    dir: TempDir,
    child: Option<Child>,
}

impl EtcdServer {
    /// A single-member etcd cluster.
    pub fn start() -> anyhow::Result<Self> {
        let mut cluster = Self::cluster(1)?;
        Ok(cluster.remove(0))
    }

    /// A single-member etcd cluster that also serves clients over TLS with these
    /// files (on [`EtcdServer::tls_endpoint`]); the plain port stays for the test.
    pub fn start_tls(tls: RedisTlsFiles) -> anyhow::Result<Self> {
        let mut cluster = retry_port_clash(|| Self::cluster_on_free_ports(1, Some(&tls)))?;
        Ok(cluster.remove(0))
    }

    /// An etcd cluster of `n` members, all on loopback.
    pub fn cluster(n: usize) -> anyhow::Result<Vec<Self>> {
        retry_port_clash(|| Self::cluster_on_free_ports(n, None))
    }

    fn cluster_on_free_ports(n: usize, tls: Option<&RedisTlsFiles>) -> anyhow::Result<Vec<Self>> {
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::with_capacity(n);
        for (i, (client_port, peer_port)) in ports.into_iter().enumerate() {
            let mut member = EtcdServer {
                name: format!("m{i}"),
                client_port,
                peer_port,
                tls_port: tls.map(|_| free_port()),
                tls: tls.cloned(),
                initial_cluster: initial_cluster.clone(),
                dir: tempfile::Builder::new().prefix("delayq-etcd-").tempdir()?,
                child: None,
            };
            member.spawn(false)?;
            members.push(member);
        }
        for member in &members {
            member.wait_ready()?;
        }
        Ok(members)
    }

    fn spawn(&mut self, existing: bool) -> anyhow::Result<()> {
        let log = File::create(self.dir.path().join("etcd.log"))?;
        let plain = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new(binary("DELAYQ_TEST_ETCD", "etcd"));
        let client = match (&self.tls, self.tls_port) {
            (Some(tls), Some(port)) => {
                command
                    .arg("--cert-file")
                    .arg(&tls.cert)
                    .arg("--key-file")
                    .arg(&tls.key)
                    .arg("--trusted-ca-file")
                    .arg(&tls.ca);
                if tls.client_auth {
                    command.arg("--client-cert-auth");
                }
                format!("{plain},https://127.0.0.1:{port}")
            }
            _ => plain,
        };
        let child = command
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            .arg("--initial-cluster-state")
            .arg(if existing { "existing" } else { "new" })
            .args([
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start etcd (is it installed? set DELAYQ_TEST_ETCD)")?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until this member answers on its client port and reports health.
    pub fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client_port)) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                let req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
                let mut body = String::new();
                if s.write_all(req.as_bytes()).is_ok()
                    && s.read_to_string(&mut body).is_ok()
                    && body.contains("\"health\":\"true\"")
                {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "etcd {} on port {} did not become healthy; its log:\n{}",
            self.name,
            self.client_port,
            self.log()
        )
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The TLS client endpoint (`https://`), with [`EtcdServer::start_tls`].
    pub fn tls_endpoint(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("https://127.0.0.1:{port}"))
    }

    pub fn log(&self) -> String {
        tail(&self.log_path(), 40)
    }

    /// The file its output goes to (started afresh with the process).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_wait(&mut child);
        }
    }

    /// SIGSTOP: the member hangs, its connections stay open.
    pub fn pause(&self) {
        signal_running(&self.child, libc::SIGSTOP);
    }

    pub fn resume(&self) {
        signal_running(&self.child, libc::SIGCONT);
    }

    /// Starts the member again with its data (it rejoins its cluster).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn(true)?;
        Ok(())
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `delayq run` process with its own config file and log.
pub struct DelayqProcess {
    pub name: String,
    pub api: SocketAddr,
    bin: PathBuf,
    env: Vec<(String, String)>,
    dir: TempDir,
    child: Option<Child>,
}

impl DelayqProcess {
    /// Starts `bin run --config <file>` with `config` (TOML) and waits until its
    /// API answers. `[api] listen` is set here, on a free port.
    pub fn start(bin: &Path, name: &str, config: &str) -> anyhow::Result<Self> {
        Self::start_with_env(bin, name, config, &[])
    }

    /// [`DelayqProcess::start`] with extra environment variables (kept for restarts).
    pub fn start_with_env(
        bin: &Path,
        name: &str,
        config: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        retry_port_clash(|| Self::start_on_a_free_port(bin, name, config, env))
    }

    fn start_on_a_free_port(
        bin: &Path,
        name: &str,
        config: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let port = free_port();
        let dir = tempfile::Builder::new().prefix("delayq-node-").tempdir()?;
        let text = format!("[node]\nid = \"{name}\"\n\n{}", with_listen(config, port));
        std::fs::write(dir.path().join("delayq.toml"), text)?;
        let mut process = DelayqProcess {
            name: name.to_owned(),
            api: SocketAddr::from(([127, 0, 0, 1], port)),
            bin: bin.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            dir,
            child: None,
        };
        process.spawn()?;
        Ok(process)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let child = Command::new(&self.bin)
            .arg("run")
            .arg("--config")
            .arg(self.dir.path().join("delayq.toml"))
            .env_remove("RUST_LOG")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", self.bin.display()))?;
        self.child = Some(child);
        // Waits for the API, and gives up at once if the process exited (a bad
        // config, a port taken meanwhile).
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if wait_for_port(self.api.port(), Duration::from_millis(100)) {
                return Ok(());
            }
            if !self.is_running() {
                break;
            }
        }
        bail!(
            "delayq {} did not open its API on {}; its log:\n{}",
            self.name,
            self.api,
            self.log()
        )
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.api, path)
    }

    /// The file its output (stdout and stderr) goes to, kept across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("delayq.log")
    }

    /// The config file the process reads (rewrite it, then SIGHUP, to reload).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("delayq.toml")
    }

    /// The whole log so far.
    pub fn full_log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn log(&self) -> String {
        tail(&self.log_path(), 60)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn signal(&self, sig: libc::c_int) {
        signal_running(&self.child, sig);
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_wait(&mut child);
        }
    }

    /// SIGTERM, then waits up to `timeout` for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.signal(libc::SIGTERM);
        self.wait_exit(timeout)
    }

    /// Waits up to `timeout` for the process to exit by itself (after a signal sent
    /// with [`DelayqProcess::signal`]); kills it if it does not.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        kill_and_wait(&mut child);
        None
    }

    /// Starts the process again with the same config and port.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for DelayqProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Puts `listen = "127.0.0.1:<port>"` into the `[api]` table of a config text.
fn with_listen(config: &str, port: u16) -> String {
    let line = format!("listen = \"127.0.0.1:{port}\"");
    if config.contains("[api]") {
        config.replacen("[api]", &format!("[api]\n{line}"), 1)
    } else {
        format!("{config}\n[api]\n{line}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
