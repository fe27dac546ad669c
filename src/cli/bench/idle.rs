//! Idle: a leader with nothing to move, for as long as a spread sends. What it
//! costs Redis a second (its timers, its metrics' counts, its health probe),
//! which a Redis shared with consumers pays whether or not messages flow. No
//! PING probe runs meanwhile: its thousand round trips a second would cost Redis
//! more than the leader does.

use std::time::{Duration, Instant};

use super::Bench;
use super::measure::{self, CpuMeter, Probe, measured_delayq};
use super::rows::{Counts, Delayq, Figures, Idle};

impl Bench {
    /// A leader that has led a second already, watched for `duration`.
    pub async fn idle(&self, duration: Duration) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let mut daemon = self.start_delayq("bench-idle").await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.leads(&daemon).await {
            anyhow::ensure!(Instant::now() < deadline, "no leader within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let load = measure::load_average();
        let meter = CpuMeter::start(&mut conn, daemon.pid()).await?;
        tokio::time::sleep(duration).await;
        // Per second: the meters divide by the "messages", here the seconds watched.
        let seconds = duration.as_secs().max(1);
        let cpu = meter.stop(&mut conn, seconds).await?;
        daemon.terminate(Duration::from_secs(10));
        Ok(Delayq::Idle(Idle {
            measured: measured_delayq(seconds, load, 0, &cpu, &Probe::none(), Counts::default()),
            seconds,
        })
        .into())
    }
}
