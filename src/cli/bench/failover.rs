//! Failover under load: two `delayq run` processes elected through etcd, a spread
//! running, and the leader stopped mid-way, by SIGTERM (a clean stop: it finishes
//! its batch and resigns, so the standby is elected at once) or by SIGKILL (a crash:
//! the standby waits for the dead leader's lease to expire).
//!
//! Two figures: `takeover_ms`, from the signal until the standby answers `/leader`
//! with 200 (polled every 2 ms), and `forwarding_gap_ms`, the longest time between two
//! consecutive stream entries while messages kept falling due every millisecond or
//! so: what a consumer sees.

use std::time::{Duration, Instant};

use super::Bench;
use super::measure::{self, CpuMeter, PingProbe, measured, summary, tally_stream, wall_ms};
use super::rows::{Delayq, Failover, Figures, ProcessCpu};
use super::scenarios::SPREAD_DELAY;
use crate::harness::{DelayqProcess, EtcdServer};

const STREAM: &str = "bench:failover";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stop {
    /// A clean stop: the leader resigns.
    #[value(name = "sigterm")]
    Term,
    /// A crash: the lease must expire.
    #[value(name = "sigkill")]
    Kill,
}

impl Stop {
    pub fn name(self) -> &'static str {
        match self {
            Stop::Term => "sigterm",
            Stop::Kill => "sigkill",
        }
    }
}

impl Bench {
    /// A spread at `rate` with the leader stopped by `stop` after `stop_after`.
    pub async fn failover(
        &self,
        etcd: &EtcdServer,
        stop: Stop,
        rate: u64,
        stop_after: Duration,
        lease_ttl: Duration,
    ) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        // A cluster name of its own: a previous run's dead leader may still hold a lease.
        let cluster = format!("bench-{}-{}", stop.name(), wall_ms());
        let config = format!(
            "{}[etcd]\nendpoints = [\"{}\"]\ncluster = \"{cluster}\"\nlease_ttl = \"{}s\"\n",
            self.delayq_config,
            etcd.endpoint(),
            lease_ttl.as_secs()
        );
        let mut leader = self.start_delayq_with("bench-a", &config).await?;
        let mut standby = DelayqProcess::start(&self.delayq_bin, "bench-b", &config)?;
        // Let the standby's campaign reach etcd before the leader is stopped.
        tokio::time::sleep(Duration::from_millis(500)).await;

        let tail = match stop {
            Stop::Term => Duration::from_secs(2),
            Stop::Kill => lease_ttl + Duration::from_secs(2),
        };
        let total = (rate as f64 * (stop_after + Duration::from_secs(1) + tail).as_secs_f64())
            .round() as u64;
        let prefix = format!("{}-", stop.name());
        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let meter = CpuMeter::start(&mut conn, None).await?;
        let producer = tokio::spawn(self.producer(STREAM, &prefix, rate, total));

        // A random offset, so the stop does not fall at the same point of the daemon's
        // periodic loops (its blocking reads, its timers) in every run.
        let jitter = Duration::from_millis(rand::random_range(0..1000));
        tokio::time::sleep(stop_after + jitter).await;
        let stopped_at_ms = self.store.now_ms().await?;
        let stopped_at = Instant::now();
        match stop {
            Stop::Kill => leader.kill(),
            Stop::Term => leader.signal(libc::SIGTERM),
        }
        let mut takeover_ms = None;
        let mut old_leader_exit_ms = None;
        let give_up = stopped_at + lease_ttl + Duration::from_secs(10);
        while Instant::now() < give_up && (takeover_ms.is_none() || old_leader_exit_ms.is_none()) {
            if takeover_ms.is_none() && self.leads(&standby).await {
                takeover_ms = Some(stopped_at.elapsed().as_secs_f64() * 1000.0);
            }
            if old_leader_exit_ms.is_none() && !leader.is_running() {
                old_leader_exit_ms = Some(stopped_at.elapsed().as_secs_f64() * 1000.0);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let (dues, achieved) = producer.await??;
        let deadline = Instant::now() + SPREAD_DELAY + Duration::from_secs(30);
        self.wait_for_entries(STREAM, total, deadline).await?;
        let cpu = meter.stop(&mut conn, total).await?;
        let probe = probe.finish()?;
        if takeover_ms.is_none() {
            eprintln!(
                "failover {}: no takeover; standby log:\n{}",
                stop.name(),
                standby.log()
            );
        }
        standby.terminate(Duration::from_secs(10));
        leader.kill();
        let tally = tally_stream(&mut conn, STREAM, &prefix, total, |i| dues[i as usize]).await?;
        let round = |ms: Option<f64>| ms.map(|m| (m * 10.0).round() / 10.0);
        let failover = Failover {
            measured: measured(
                total,
                load,
                achieved.round() as u64,
                &cpu,
                // Two daemons shared the work: neither's CPU is the phase's.
                Some(ProcessCpu::Delayq(None)),
                &probe,
                tally.counts(),
            ),
            rate_per_sec: rate,
            lease_ttl_ms: lease_ttl.as_millis() as u64,
            takeover_ms: round(takeover_ms),
            old_leader_exit_ms: round(old_leader_exit_ms),
            forwarding_gap_ms: tally.longest_gap_ms,
            forwarding_gap_ended_after_stop_ms: tally.longest_gap_end_ms as i64
                - stopped_at_ms as i64,
            lateness_ms: summary(&tally.lateness),
        };
        Ok(match stop {
            Stop::Term => Delayq::FailoverSigterm(failover),
            Stop::Kill => Delayq::FailoverSigkill(failover),
        }
        .into())
    }
}
