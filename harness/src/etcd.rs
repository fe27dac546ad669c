//! An etcd member or cluster of its own (free client and peer ports, a data
//! directory), stopped, paused and restarted on request.

use super::*;

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
