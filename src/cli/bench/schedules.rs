//! Schedules: many recurring schedules firing together (10,000 every minute in the
//! full suite), made into messages by one leader: the Redis and delayq CPU time of
//! an occurrence (its making a horizon ahead, its forward and the leader's rounds)
//! and how late occurrences reach their stream. No PING probe runs meanwhile (as
//! for idle): its thousand round trips a second would cost Redis more than a few
//! schedules do.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hdrhistogram::Histogram;

use super::Bench;
use super::measure::{self, CpuMeter, Probe, measured_delayq, summary};
use super::rows::{Counts, Delayq, Figures, Schedules};
use delayq_client::schedule::{Misfire, ScheduleSpec};

const STREAM: &str = "bench-schedules";

impl Bench {
    /// `n` schedules `every` apart, all firing at the same instants, watched for
    /// `fires` firings.
    pub async fn schedules(&self, n: u64, every: Duration, fires: u32) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let now = self.store.now_ms().await?;
        // The first firing 3 s on, on a whole second, for every schedule.
        let start = (now / 1000 + 3) * 1000;
        let every_ms = every.as_millis() as u64;
        let specs = (0..n).map(|i| ScheduleSpec {
            id: format!("s{i}"),
            stream: STREAM.to_owned(),
            fields: vec![("payload".to_owned(), self.payload.clone())],
            key: None,
            cron: None,
            timezone: None,
            every: Some(every),
            start_at: Some(start),
            end_at: Some(start + every_ms * u64::from(fires - 1)),
            jitter: None,
            misfire: Misfire::Skip,
            max_catch_up: 0,
            paused: false,
            declared: false,
            created_at: now,
            since: now,
        });
        let mut made = futures::stream::iter(specs)
            .map(|spec| {
                let store = self.store.clone();
                async move { store.put_schedule(&spec).await }
            })
            .buffer_unordered(64);
        while let Some(stored) = made.next().await {
            stored?;
        }

        let mut daemon = self.start_delayq("bench-schedules").await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.leads(&daemon).await {
            anyhow::ensure!(Instant::now() < deadline, "no leader within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let load = measure::load_average();
        let watched = Instant::now();
        let meter = CpuMeter::start(&mut conn, daemon.pid()).await?;
        let expected = n * u64::from(fires);
        let last = start + every_ms * u64::from(fires - 1);
        let deadline = Instant::now()
            + Duration::from_millis(last.saturating_sub(now))
            + Duration::from_secs(60);
        loop {
            let len: u64 = redis::cmd("XLEN")
                .arg(STREAM)
                .query_async(&mut conn)
                .await?;
            if len >= expected || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let cpu = meter.stop(&mut conn, expected).await?;
        let watched = watched.elapsed().as_secs_f64().max(0.001);
        daemon.terminate(Duration::from_secs(10));

        let entries: Vec<(String, Vec<(String, String)>)> = {
            let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(STREAM)
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await?;
            reply
                .ids
                .into_iter()
                .map(|e| {
                    let fields = e
                        .map
                        .iter()
                        .filter_map(|(k, v)| {
                            Some((
                                k.clone(),
                                redis::from_redis_value::<String>(v.clone()).ok()?,
                            ))
                        })
                        .collect();
                    (e.id, fields)
                })
                .collect()
        };
        let mut lateness = Histogram::<u64>::new_with_bounds(1, 86_400_000, 3)?;
        let (mut seen, mut duplicated) = (HashSet::new(), 0);
        for (entry, fields) in &entries {
            let Some((_, id)) = fields.iter().find(|(k, _)| k == "delayq-id") else {
                continue;
            };
            let Some(at) = id
                .split_once('.')
                .and_then(|(_, at)| at.parse::<u64>().ok())
            else {
                continue;
            };
            if !seen.insert(id.clone()) {
                duplicated += 1;
            }
            let sent: u64 = entry.split('-').next().unwrap_or("0").parse().unwrap_or(0);
            lateness.record(sent.saturating_sub(at))?;
        }
        let delivered = seen.len() as u64;
        let counts = Counts {
            delivered,
            lost: expected.saturating_sub(delivered),
            duplicated,
            unexpected: None,
            refused: None,
        };
        Ok(Delayq::Schedules(Schedules {
            // Occurrences a second over the time watched, firings and the gaps
            // between them alike.
            measured: measured_delayq(
                expected,
                load,
                (delivered as f64 / watched).round() as u64,
                &cpu,
                &Probe::none(),
                counts,
            ),
            schedules: n,
            every_ms,
            fires,
            lateness_ms: summary(&lateness),
        })
        .into())
    }
}
