//! A burst drained by several active leaders (`election.mode = "per_shard"`): `k`
//! `delayq run` processes on the bench's Redis and etcd, the shards split into `k`
//! election groups, started and spread (each leading one group) before `n`
//! messages are scheduled due at one instant. The row is a burst row with
//! `leaders` set; CPU is Redis's and the sum of the processes'.

use std::time::{Duration, Instant};

use anyhow::bail;

use super::Bench;
use super::measure::{self, CpuMeter, PingProbe, wall_ms};
use super::rows::{Burst, Delayq, Figures};
use super::scenarios::{BURST_STREAM, until_meters_start};
use delayq_harness::{DelayqProcess, EtcdServer};

impl Bench {
    /// `n` messages due at one instant, drained by `leaders` leaders of one group each.
    pub async fn burst_leaders(
        &self,
        etcd: &EtcdServer,
        n: u64,
        leaders: u32,
    ) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        // A cluster name of its own: a previous run's processes may still hold leases.
        let config = format!(
            "{}[etcd]\nendpoints = [\"{}\"]\ncluster = \"bench-leaders-{leaders}-{}\"\nlease_ttl = \"6s\"\n\
             [election]\nmode = \"per_shard\"\ngroups = {leaders}\n",
            self.delayq_config,
            etcd.endpoint(),
            wall_ms()
        );
        let mut daemons = vec![self.start_delayq_with("bench-leader-0", &config).await?];
        for i in 1..leaders {
            daemons.push(DelayqProcess::start(
                &self.delayq_bin,
                &format!("bench-leader-{i}"),
                &config,
            )?);
        }
        self.wait_one_group_each(&daemons, Duration::from_secs(60))
            .await?;

        // The leaders run during the load, so it must end before the messages fall
        // due, or the meters below would miss what was forwarded meanwhile (and
        // Redis's memory per message would count only what was left): allow for a
        // load of 5k messages a second, four times slower than a plain burst's.
        // (Times how busy the machine is: a busy one loads slower.)
        let lead_ms = ((2000 + n / 5) as f64 * measure::busy_factor()) as u64;
        let loaded = self.load_burst(&self.store, n, lead_ms, None).await?;
        until_meters_start(&self.store, n, loaded.first_due, lead_ms).await?;
        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let mut meter = CpuMeter::start(&mut conn, None).await?;
        let pids: Vec<u32> = daemons.iter().filter_map(DelayqProcess::pid).collect();
        meter.attach_processes(&pids);
        let deadline = Instant::now() + Duration::from_secs(60) + Duration::from_millis(n / 2);
        let len = self.wait_for_entries(BURST_STREAM, n, deadline).await?;
        let cpu = meter.stop(&mut conn, n).await?;
        let probe = probe.finish()?;
        // While the daemons still hold their connections, as when the load began.
        let burst = self.burst_drained(n, &loaded, load, &cpu, &probe).await?;
        for mut daemon in daemons {
            daemon.terminate(Duration::from_secs(10));
            if len < n {
                eprintln!("{} log:\n{}", daemon.name, daemon.log());
            }
        }
        Ok(Delayq::Burst(Burst {
            leaders: Some(leaders),
            ..burst
        })
        .into())
    }

    /// Waits until each of `daemons` leads exactly one election group.
    pub(super) async fn wait_one_group_each(
        &self,
        daemons: &[DelayqProcess],
        limit: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let mut counts = Vec::new();
            for daemon in daemons {
                counts.push(self.groups_led(daemon).await);
            }
            if counts.iter().all(|c| *c == Some(1)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the election groups did not spread one to a leader within {limit:?}: {counts:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many election groups `node` leads, as its `/v1/leader` says.
    async fn groups_led(&self, node: &DelayqProcess) -> Option<usize> {
        let view: serde_json::Value = self
            .http
            .get(node.url("/v1/leader"))
            .timeout(Duration::from_millis(500))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        Some(
            view["groups"]
                .as_array()?
                .iter()
                .filter(|g| g["is_leader"] == true)
                .count(),
        )
    }
}
