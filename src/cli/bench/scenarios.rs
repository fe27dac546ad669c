//! delayq's scenarios: burst, spread (fixed rates or a search for the highest rate
//! that stays on time), backlog (spread over a large far-future backlog) and HTTP
//! ingest. The daemon under test is a separate `delayq run` process, so its CPU is
//! its own; producers run in this process and write through `Store`, as the API does.

mod daemon;
mod spread;

pub(super) use daemon::until_meters_start;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use redis::AsyncCommands;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::measure::{self, CpuMeter, PingProbe, measured_delayq, summary, tally_stream};
use super::rows::{Backlog, Burst, Delayq, Figures, Spread};
use super::{Bench, memory};
use delayq_client::message::{Due, MessageId, MessageKey, NewMessage};
use delayq_client::store::{BatchItem, PendingLayout, Scheduled, Store};
use delayq_harness::DelayqProcess;

/// How long after it is sent a spread message falls due.
pub const SPREAD_DELAY: Duration = Duration::from_millis(500);
/// Schedule calls of the spread producer in flight at once, and the most messages
/// one carries (a producer behind its rate catches up in calls of this size).
const PRODUCER_CALLS_IN_FLIGHT: usize = 32;
const PRODUCER_MAX_BATCH: u64 = 1000;
/// Messages per `schedule_many` while a scenario loads its messages, and such calls
/// in flight at once.
const LOAD_BATCH: u64 = 2000;
const LOAD_IN_FLIGHT: usize = 8;
/// The p99 lateness a spread rate must stay under to count as on time.
pub const SPREAD_P99_LIMIT_MS: u64 = 10;
/// Spread rates with a p99 lateness target (msg/s, ms): measured even above the
/// first rate found late; the report checks them.
pub const SPREAD_TARGETS: [(u64, f64); 3] = [(1000, 2.0), (10_000, 10.0), (50_000, 5.0)];

pub(super) const BURST_STREAM: &str = "bench:burst";
const SPREAD_STREAM: &str = "bench:spread";
const BACKLOG_STREAM: &str = "bench:backlog";

/// How the daemon draining a burst is set up, for the frontier of memory against
/// speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BurstSetup {
    /// The default layouts and retention.
    Defaults,
    /// `records.layout` and `pending.layout` "hash" (the messages are stored so too).
    HashLayouts,
    /// The default layouts, with `records.retention = "0s"`: no record kept.
    NoRecords,
    /// The defaults, every message pushed with a business key, one key for each
    /// [`MESSAGES_PER_KEY`] messages (an order's few reminders): what a key costs.
    Keyed,
}

/// Messages under one business key in the keyed burst.
pub const MESSAGES_PER_KEY: u64 = 3;

impl BurstSetup {
    pub const ALL: [BurstSetup; 4] = [
        BurstSetup::Defaults,
        BurstSetup::HashLayouts,
        BurstSetup::NoRecords,
        BurstSetup::Keyed,
    ];

    /// What the daemon's configuration adds to the bench's.
    fn config(self) -> &'static str {
        match self {
            BurstSetup::Defaults | BurstSetup::Keyed => "",
            BurstSetup::HashLayouts => {
                "[records]\nlayout = \"hash\"\n[pending]\nlayout = \"hash\"\n"
            }
            BurstSetup::NoRecords => "[records]\nretention = \"0s\"\n",
        }
    }

    /// ", what differs from the defaults", for progress lines.
    pub fn note(self) -> &'static str {
        match self {
            BurstSetup::Defaults => "",
            BurstSetup::HashLayouts => ", records.layout = pending.layout = hash",
            BurstSetup::NoRecords => ", records.retention = 0s",
            BurstSetup::Keyed => ", a business key per 3 messages",
        }
    }

    /// The row's records layout, pending layout and retention, where not the defaults.
    fn row_settings(self) -> (Option<String>, Option<String>, Option<String>) {
        match self {
            BurstSetup::Defaults | BurstSetup::Keyed => (None, None, None),
            BurstSetup::HashLayouts => (Some("hash".into()), Some("hash".into()), None),
            BurstSetup::NoRecords => (None, None, Some("0s".into())),
        }
    }

    /// Messages per business key, for the keyed burst.
    fn keyed(self) -> Option<u64> {
        matches!(self, BurstSetup::Keyed).then_some(MESSAGES_PER_KEY)
    }
}

impl Bench {
    pub(super) fn message(&self, stream: &str, id: String, due: Due) -> NewMessage {
        NewMessage::new(
            stream,
            vec![("payload".to_owned(), self.payload.clone())],
            due,
        )
        .with_id(MessageId::parse(&id).expect("bench ids are valid"))
    }

    /// Schedules `<prefix>0 .. <prefix>n-1` through the schedule script, in batches of
    /// `LOAD_BATCH` (script calls of up to 1000 messages), `LOAD_IN_FLIGHT` batches at once;
    /// returns each message's due time (Redis ms) and the rate achieved.
    pub(super) async fn load(
        &self,
        stream: &str,
        prefix: &str,
        n: u64,
        due: Due,
    ) -> anyhow::Result<(Vec<u64>, f64)> {
        self.load_with(&self.store, stream, prefix, n, due, None)
            .await
    }

    /// `load` through `store` (e.g. one that writes another pending layout); with
    /// `keyed`, message i under business key `k<i / keyed>`.
    pub(super) async fn load_with(
        &self,
        store: &Store,
        stream: &str,
        prefix: &str,
        n: u64,
        due: Due,
        keyed: Option<u64>,
    ) -> anyhow::Result<(Vec<u64>, f64)> {
        let started = Instant::now();
        let max_delay = self.config.api.limits.max_delay;
        let mut dues = vec![0u64; n as usize];
        let mut results = futures::stream::iter((0..n).step_by(LOAD_BATCH as usize))
            .map(|first| {
                let store = store.clone();
                let items: Vec<BatchItem> = (first..(first + LOAD_BATCH).min(n))
                    .map(|i| {
                        let key = keyed.map(|per| {
                            MessageKey::parse(&format!("k{}", i / per))
                                .expect("bench keys are valid")
                        });
                        BatchItem::new(
                            self.message(stream, format!("{prefix}{i}"), due)
                                .with_key(key),
                        )
                    })
                    .collect();
                async move { (first, store.schedule_many(&items, max_delay, None).await) }
            })
            .buffer_unordered(LOAD_IN_FLIGHT);
        while let Some((first, outcomes)) = results.next().await {
            for (k, outcome) in outcomes.into_iter().enumerate() {
                let i = first + k as u64;
                match outcome.with_context(|| format!("schedule {prefix}{i}"))? {
                    Scheduled::Scheduled { due_ms } => dues[i as usize] = due_ms,
                    other => {
                        bail!("schedule {prefix}{i}: {other:?} (the bench Redis was not empty)")
                    }
                }
            }
        }
        Ok((dues, n as f64 / started.elapsed().as_secs_f64()))
    }

    /// Burst: n messages due at one instant, all scheduled before the daemon starts,
    /// so what is measured is a pure drain, with the daemon set up as `setup` says.
    pub async fn burst(&self, n: u64, setup: BurstSetup) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let store = match setup {
            BurstSetup::HashLayouts => self.store.with_pending_layout(PendingLayout::Hash),
            _ => self.store.clone(),
        };
        // The daemon starts after the load: a slower load only leaves the last
        // messages due when they were scheduled (`due_spread_ms` says so).
        let loaded = self
            .load_burst(&store, n, 2000 + n / 20, setup.keyed())
            .await?;
        self.wait_for_redis_time(loaded.last_due).await?;

        let load = measure::load_average();
        let config = format!("{}{}", self.delayq_config, setup.config());
        let run = self.start_metered("bench-burst", &config).await?;
        let deadline = Instant::now() + Duration::from_secs(60) + Duration::from_millis(n / 2);
        let len = self.wait_for_entries(BURST_STREAM, n, deadline).await?;
        if len < n {
            eprintln!("burst {n}: only {len} entries before the deadline");
        }
        let (cpu, probe) = run.stop(&mut conn, n, len < n).await?;
        let burst = self.burst_drained(n, &loaded, load, &cpu, &probe).await?;
        let (records_layout, pending_layout, records_retention) = setup.row_settings();
        Ok(Delayq::Burst(Burst {
            records_layout,
            pending_layout,
            records_retention,
            messages_per_key: setup.keyed(),
            ..burst
        })
        .into())
    }

    /// A burst's `n` messages scheduled by `store` into `BURST_STREAM`, due at one
    /// instant `lead_ms` after the load starts (by Redis's clock). A load that takes
    /// longer leaves the last messages due when they were scheduled instead
    /// (`due_spread_ms` says so).
    pub(super) async fn load_burst(
        &self,
        store: &Store,
        n: u64,
        lead_ms: u64,
        keyed: Option<u64>,
    ) -> anyhow::Result<Loaded> {
        let mut conn = self.conn.clone();
        let mem_before = memory::used_memory(&mut conn).await?;
        let due_at = self.store.now_ms().await? + lead_ms;
        let (dues, load_rate) = self
            .load_with(store, BURST_STREAM, "m", n, Due::At(due_at), keyed)
            .await?;
        let bytes_per_pending = (memory::used_memory(&mut conn).await? - mem_before) / n as f64;
        Ok(Loaded {
            first_due: dues.iter().min().copied().unwrap_or(0),
            last_due: dues.iter().max().copied().unwrap_or(0),
            dues,
            load_rate,
            mem_before,
            bytes_per_pending,
        })
    }

    /// The row of a burst drained into `BURST_STREAM` (in the default layouts, by
    /// one leader: callers set what differs), from its tally; the stream is deleted,
    /// and what Redis holds beyond `loaded.mem_before` then is the records.
    pub(super) async fn burst_drained(
        &self,
        n: u64,
        loaded: &Loaded,
        load: String,
        cpu: &measure::PhaseCpu,
        probe: &measure::Probe,
    ) -> anyhow::Result<Burst> {
        let mut conn = self.conn.clone();
        let dues = &loaded.dues;
        let tally = tally_stream(&mut conn, BURST_STREAM, "m", n, |i| dues[i as usize]).await?;
        let (drain_ms, drained) = measure::drain(tally.first_ms, tally.last_ms, tally.entries);
        let _: u64 = conn.del(BURST_STREAM).await?;
        let bytes_per_record =
            (memory::used_memory(&mut conn).await? - loaded.mem_before) / n as f64;
        Ok(Burst {
            measured: measured_delayq(n, load, drained, cpu, probe, tally.counts()),
            schedule_rate_per_sec: loaded.load_rate.round() as u64,
            due_spread_ms: loaded.last_due - loaded.first_due,
            drain_ms,
            lateness_ms: summary(&tally.lateness),
            bytes_per_pending_message: loaded.bytes_per_pending.round() as i64,
            bytes_per_record: bytes_per_record.round() as i64,
            records_layout: None,
            pending_layout: None,
            records_retention: None,
            messages_per_key: None,
            leaders: None,
        })
    }
}

/// A burst's messages, scheduled (see [`Bench::load_burst`]).
pub(super) struct Loaded {
    dues: Vec<u64>,
    pub(super) first_due: u64,
    last_due: u64,
    load_rate: f64,
    /// Redis's `used_memory` before the load.
    mem_before: f64,
    bytes_per_pending: f64,
}
