//! Redis behind Sentinel: redis-sentinel processes watching a master and its
//! replicas, and the set of them a test fails over.

use super::*;

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

/// How long a [`SentinelSet`]'s Sentinels wait before they judge a node down.
///
/// Sentinel promotes only a replica whose link to the master has been down for
/// less than ten times this, plus how long the master has been judged down. A
/// machine that stalls for 2 s puts every Sentinel in TILT mode for 30 s, during
/// which none judges anything: a master killed just before is judged down only
/// then, its replicas' links down for over 30 s already. With 1 s, no replica was
/// ever good enough again (`-failover-abort-no-good-slave`, measured beside two
/// CPU hogs); 5 s leaves 50 s.
pub const DOWN_AFTER: Duration = Duration::from_secs(5);

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
    /// Every Sentinel's log (its last lines), one after the other: what a test
    /// shows when a failover did not happen.
    pub fn logs(&self) -> String {
        let logs: Vec<String> = self.sentinels.iter().map(|s| s.log()).collect();
        logs.join("\n---\n")
    }

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
                    DOWN_AFTER,
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
        self.unready().is_empty()
    }

    /// What keeps [`SentinelSet::ready`] false, a line each: a replica whose link
    /// is not up, a Sentinel that does not know every replica or the two other
    /// Sentinels (what it knows of them: each one's address and flags). Empty when
    /// ready.
    pub fn unready(&self) -> Vec<String> {
        let mut unready = Vec::new();
        for r in &self.replicas {
            let link = r.replication("master_link_status");
            if link.as_deref() != Some("up") {
                unready.push(format!("replica {}: master link {link:?}", r.port));
            }
        }
        for s in &self.sentinels {
            let mut c = s.client();
            let mut known = |what: &str| {
                redis::cmd("SENTINEL")
                    .arg(what)
                    .arg(&self.name)
                    .query::<Vec<std::collections::HashMap<String, String>>>(&mut c)
                    .map(|all| {
                        all.iter()
                            .map(|one| {
                                let at = |k: &str| one.get(k).map_or("?", String::as_str);
                                format!("{}:{} ({})", at("ip"), at("port"), at("flags"))
                            })
                            .collect::<Vec<_>>()
                    })
                    .map_err(|e| e.to_string())
            };
            let (replicas, sentinels) = (known("replicas"), known("sentinels"));
            let enough = |known: &Result<Vec<String>, String>, want: usize| {
                known.as_ref().is_ok_and(|k| k.len() == want)
            };
            if !enough(&replicas, self.replicas.len()) || !enough(&sentinels, 2) {
                unready.push(format!(
                    "Sentinel {}: knows replicas {replicas:?}, Sentinels {sentinels:?}",
                    s.port
                ));
            }
        }
        unready
    }

    /// Waits until [`SentinelSet::ready`], up to `timeout`.
    pub fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.ready() {
            if Instant::now() > deadline {
                bail!(
                    "Sentinels not ready within {timeout:?}: {}\n{}",
                    self.unready().join("; "),
                    self.logs()
                );
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

    /// The server every Sentinel names as the master, once they agree.
    pub fn current_master(&self) -> Option<&RedisServer> {
        self.server(self.master_port()?)
    }

    /// The server on `port` (plain or TLS): the master or one of the replicas.
    pub fn server(&self, port: u16) -> Option<&RedisServer> {
        std::iter::once(&self.master)
            .chain(&self.replicas)
            .find(|r| r.port == port || r.tls_port == Some(port))
    }
}
