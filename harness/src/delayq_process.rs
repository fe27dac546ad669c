//! A delayq process (the binary under test) with a configuration of its own, stopped
//! with SIGTERM or SIGKILL, paused and resumed.

use super::*;

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
pub(super) fn with_listen(config: &str, port: u16) -> String {
    let line = format!("listen = \"127.0.0.1:{port}\"");
    if config.contains("[api]") {
        config.replacen("[api]", &format!("[api]\n{line}"), 1)
    } else {
        format!("{config}\n[api]\n{line}\n")
    }
}
