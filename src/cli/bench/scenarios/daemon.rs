//! The delayq under measurement: started with the run's configuration (and the
//! environment a scenario adds), metered from a moment Redis's clock names, with
//! dashboards open when asked, and waited on until it leads or has written.

use super::*;

/// Waits until Redis's clock, as `store` reads it, has passed `ms`.
pub(super) async fn until_redis_time(store: &Store, ms: u64) -> anyhow::Result<()> {
    while store.now_ms().await? <= ms {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// How long before a burst falls due its meters start when its daemons run
/// during the load: the wait until then is not the drain's (Redis and the
/// daemons spend CPU while idle too), and the meters must not miss its start.
pub(super) const METERS_AHEAD_MS: u64 = 100;

/// For a burst of `n` messages due at `due_at` whose daemons ran during its load:
/// fails if the load outlasted its `allowed_ms` (the daemons then forwarded during
/// it, which the meters would miss), else waits until the meters may start.
pub(crate) async fn until_meters_start(
    store: &Store,
    n: u64,
    due_at: u64,
    allowed_ms: u64,
) -> anyhow::Result<()> {
    if store.now_ms().await? >= due_at {
        anyhow::bail!(
            "loading {n} messages took longer than the {allowed_ms} ms allowed: the daemons forwarded during the load"
        );
    }
    until_redis_time(store, due_at.saturating_sub(METERS_AHEAD_MS)).await
}

/// A daemon under test with its meters running (see [`Bench::start_metered`]).
pub(crate) struct Metered {
    daemon: DelayqProcess,
    meter: CpuMeter,
    probe: PingProbe,
    /// `--dashboards` polling the daemon while it runs.
    _dashboards: Option<tokio_util::sync::DropGuard>,
}

impl Metered {
    /// Stops the meters and the daemon (printing its log when `show_log`): the CPU
    /// per message over `messages` and the probe's findings.
    pub(crate) async fn stop(
        mut self,
        conn: &mut redis::aio::MultiplexedConnection,
        messages: u64,
        show_log: bool,
    ) -> anyhow::Result<(measure::PhaseCpu, measure::Probe)> {
        let cpu = self.meter.stop(conn, messages).await?;
        let probe = self.probe.finish()?;
        self.daemon.terminate(Duration::from_secs(10));
        if show_log {
            eprintln!("delayq log:\n{}", self.daemon.log());
        }
        Ok((cpu, probe))
    }
}

impl Bench {
    /// A `delayq run` process on the bench Redis, leading once this returns.
    pub async fn start_delayq(&self, name: &str) -> anyhow::Result<DelayqProcess> {
        self.start_delayq_with(name, &self.delayq_config).await
    }

    /// A `delayq run` process with `config`, leading once this returns.
    pub(crate) async fn start_delayq_with(
        &self,
        name: &str,
        config: &str,
    ) -> anyhow::Result<DelayqProcess> {
        self.start_delayq_with_env(name, config, &[]).await
    }

    /// [`Bench::start_delayq_with`], with extra environment variables (kept for
    /// restarts).
    pub(crate) async fn start_delayq_with_env(
        &self,
        name: &str,
        config: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<DelayqProcess> {
        let process = DelayqProcess::start_with_env(&self.delayq_bin, name, config, env)?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.leads(&process).await {
                return Ok(process);
            }
            if Instant::now() > deadline {
                bail!(
                    "delayq did not lead within 20s; its log:\n{}",
                    process.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A `delayq run` process with `config`, started now (not waited for), its CPU
    /// and Redis's metered from its first instant, Redis probed meanwhile.
    pub(crate) async fn start_metered(&self, name: &str, config: &str) -> anyhow::Result<Metered> {
        let probe = PingProbe::start(&self.url)?;
        let mut meter = CpuMeter::start(&mut self.conn.clone(), None).await?;
        let daemon = DelayqProcess::start(&self.delayq_bin, name, config)?;
        meter.attach_new_process(daemon.pid());
        let dashboards = self.open_dashboards(&daemon);
        Ok(Metered {
            daemon,
            meter,
            probe,
            _dashboards: dashboards,
        })
    }

    /// `--dashboards` pages polling `daemon` as the dashboard does (the overview
    /// and the stream table, every 2 s), until the guard is dropped.
    pub(crate) fn open_dashboards(
        &self,
        daemon: &DelayqProcess,
    ) -> Option<tokio_util::sync::DropGuard> {
        if self.dashboards == 0 {
            return None;
        }
        let token = tokio_util::sync::CancellationToken::new();
        // What the overview page asks every 2 s, and the stream page's table (the
        // messages page asks for the next due once, when it opens).
        const PATHS: [&str; 4] = [
            "/v1/overview",
            "/v1/nodes",
            "/v1/leadership/history",
            "/v1/streams",
        ];
        for _ in 0..self.dashboards {
            let http = self.http.clone();
            let urls: Vec<String> = PATHS.iter().map(|p| daemon.url(p)).collect();
            let token = token.clone();
            tokio::spawn(async move {
                while !token.is_cancelled() {
                    for url in &urls {
                        if let Ok(answer) = http.get(url).send().await {
                            let _ = answer.bytes().await;
                        }
                    }
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    }
                }
            });
        }
        Some(token.drop_guard())
    }

    /// Whether `node` answers `/leader` with success (it leads).
    pub(crate) async fn leads(&self, node: &DelayqProcess) -> bool {
        match self
            .http
            .get(node.url("/leader"))
            .timeout(Duration::from_millis(500))
            .send()
            .await
        {
            Ok(resp) => resp.status().is_success(),
            Err(_) => false,
        }
    }

    /// Waits until `stream` holds `n` entries or `deadline` passes.
    pub(crate) async fn wait_for_entries(
        &self,
        stream: &str,
        n: u64,
        deadline: Instant,
    ) -> anyhow::Result<u64> {
        let mut conn = self.conn.clone();
        loop {
            let len: u64 = conn.xlen(stream).await?;
            if len >= n || Instant::now() > deadline {
                return Ok(len);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    pub(crate) async fn wait_for_redis_time(&self, ms: u64) -> anyhow::Result<()> {
        until_redis_time(&self.store, ms).await
    }
}
