//! A MariaDB server of its own (mariadbd on a free port, its own data and temporary
//! directories), for the journal.

use super::*;

/// A MariaDB server of our own: a data directory made by `mariadb-install-db` in a
/// temp dir, `mariadbd` on a free loopback port (and a socket in that dir), a
/// database `delayq` and a user `delayq` with all rights on it; stopped on drop.
pub struct MariaDbServer {
    pub port: u16,
    /// The `delayq` user's password.
    pub password: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// `mariadbd` options past the usual ones (TLS), kept for restarts.
    extra: Vec<String>,
}

/// A MariaDB's TLS: its certificate and key (PEM files), and whether it refuses
/// connections without TLS (`require_secure_transport`).
pub struct MariaDbTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub required: bool,
}

impl MariaDbServer {
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(None)
    }

    /// [`MariaDbServer::start`], serving TLS with `tls`.
    pub fn start_with(tls: Option<MariaDbTls>) -> anyhow::Result<Self> {
        let extra: Vec<String> = match &tls {
            None => Vec::new(),
            Some(tls) => {
                let mut args = vec![
                    format!("--ssl-cert={}", tls.cert.display()),
                    format!("--ssl-key={}", tls.key.display()),
                ];
                if tls.required {
                    args.push("--require-secure-transport=ON".into());
                }
                args
            }
        };
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
        let args = extra.clone();
        let (port, child) = retry_port_clash(move || {
            let port = free_port();
            Ok((port, spawn_mariadbd(&data_dir, port, &args)?))
        })?;
        let server = MariaDbServer {
            port,
            password: format!("pw-{}", ulid::Ulid::new()),
            dir,
            child: Some(child),
            extra,
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
        self.child = Some(spawn_mariadbd(&data, self.port, &self.extra)?);
        Ok(())
    }
}

/// A MariaDB's temporary directory of its own, beside its `data`: a server starting
/// deletes every `#sql*` file in its temporary directory, another's included.
pub(super) fn mariadb_tmpdir(data: &Path) -> PathBuf {
    data.with_file_name("tmp")
}

/// `mariadbd` on `data`, listening on loopback `port` and a socket in `data`,
/// once its port accepts connections.
pub(super) fn spawn_mariadbd(data: &Path, port: u16, extra: &[String]) -> anyhow::Result<Child> {
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
        .args(extra)
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
