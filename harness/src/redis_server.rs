//! A redis-server of its own: a free loopback port, a temporary directory, optional
//! TLS and ACL users; stopped on drop.

use super::*;

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
    pub(super) child: Option<Child>,
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
        let prefix = format!("{field}:");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map(|value| value.trim().to_owned())
    }

    /// A synchronous connection, for test assertions.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .unwrap_or_else(|e| panic!("connect to redis on {}: {e}\n{}", self.port, self.log()))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
