//! Catch-up at a limit: a backlog of overdue messages for one stream that has a
//! `streams.max_rate`, and live traffic to another stream while it drains. What is
//! measured: how long the backlog takes against backlog / limit, and how late the
//! live messages are meanwhile (they must not wait behind the backlog).

use std::time::{Duration, Instant};

use super::Bench;
use super::measure::{self, measured_delayq, summary, tally_stream};
use super::rows::{Catchup, Delayq, Figures};
use super::scenarios::SPREAD_DELAY;
use delayq_client::message::Due;

const BACKLOG_STREAM: &str = "bench:catchup";
const LIVE_STREAM: &str = "bench:live";

impl Bench {
    /// `n` messages overdue for a stream limited to `limit` a second, drained while
    /// `live_rate` messages a second go to another stream, each due `SPREAD_DELAY`
    /// after it is sent, for as long as the drain should take.
    pub async fn catchup(&self, n: u64, limit: u64, live_rate: u64) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let due_at = self.store.now_ms().await? + 2000 + n / 20;
        // Stored as producers of a deployment with this limit store them: kept apart.
        self.store.keep_apart([BACKLOG_STREAM.to_owned()]);
        let loaded = self.load(BACKLOG_STREAM, "c", n, Due::At(due_at)).await;
        self.store.keep_apart([]);
        let (dues, _) = loaded?;
        let last_due = dues.iter().max().copied().unwrap_or(0);
        self.wait_for_redis_time(last_due).await?;
        let expected = Duration::from_secs_f64(n as f64 / limit as f64);
        let live_total = (live_rate as f64 * expected.as_secs_f64()).round().max(1.0) as u64;
        let config = format!(
            "{}\n[streams.max_rate]\n\"{BACKLOG_STREAM}\" = {limit}\n",
            self.delayq_config
        );

        let load = measure::load_average();
        let run = self.start_metered("bench-catchup", &config).await?;
        let live = tokio::spawn(self.producer(LIVE_STREAM, "l", live_rate, live_total));
        let deadline = Instant::now() + expected * 2 + Duration::from_secs(60);
        let len = self.wait_for_entries(BACKLOG_STREAM, n, deadline).await?;
        let (live_dues, live_achieved) = live.await??;
        let live_deadline = Instant::now() + SPREAD_DELAY + Duration::from_secs(30);
        let live_len = self
            .wait_for_entries(LIVE_STREAM, live_total, live_deadline)
            .await?;
        let short = len < n || live_len < live_total;
        if short {
            eprintln!(
                "catch-up {n}: {len} backlog and {live_len} of {live_total} live entries before the deadline"
            );
        }
        let (cpu, probe) = run.stop(&mut conn, n + live_total, short).await?;
        let backlog = tally_stream(&mut conn, BACKLOG_STREAM, "c", n, |i| dues[i as usize]).await?;
        let live = tally_stream(&mut conn, LIVE_STREAM, "l", live_total, |i| {
            live_dues[i as usize]
        })
        .await?;
        let (drain_ms, drained) =
            measure::drain(backlog.first_ms, backlog.last_ms, backlog.entries);
        let mut counts = backlog.counts();
        let live_counts = live.counts();
        counts.delivered += live_counts.delivered;
        counts.lost += live_counts.lost;
        counts.duplicated += live_counts.duplicated;
        counts.unexpected =
            Some(counts.unexpected.unwrap_or(0) + live_counts.unexpected.unwrap_or(0));
        Ok(Delayq::Catchup(Catchup {
            measured: measured_delayq(n, load, drained, &cpu, &probe, counts),
            limit_per_sec: limit,
            drain_ms,
            expected_drain_ms: expected.as_millis() as u64,
            live_rate_per_sec: live_rate,
            live_sent_per_sec: live_achieved.round() as u64,
            live_messages: live_total,
            live_lateness_ms: summary(&live.lateness),
        })
        .into())
    }
}
