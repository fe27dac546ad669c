//! delayq's scenarios: burst, spread (fixed rates or a search for the highest rate
//! that stays on time), backlog (spread over a large far-future backlog) and HTTP
//! ingest. The daemon under test is a separate `delayq run` process, so its CPU is
//! its own; producers run in this process and write through `Store`, as the API does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use redis::AsyncCommands;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::Bench;
use super::measure::{self, CpuMeter, PingProbe, measured_delayq, summary, tally_stream};
use super::rows::{Backlog, Burst, Delayq, Figures, Spread};
use crate::harness::DelayqProcess;
use crate::message::{Due, MessageId, NewMessage};
use crate::store::{BatchItem, PendingLayout, Scheduled, Store};

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
}

impl BurstSetup {
    pub const ALL: [BurstSetup; 3] = [
        BurstSetup::Defaults,
        BurstSetup::HashLayouts,
        BurstSetup::NoRecords,
    ];

    /// What the daemon's configuration adds to the bench's.
    fn config(self) -> &'static str {
        match self {
            BurstSetup::Defaults => "",
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
        }
    }

    /// The row's records layout, pending layout and retention, where not the defaults.
    fn row_settings(self) -> (Option<String>, Option<String>, Option<String>) {
        match self {
            BurstSetup::Defaults => (None, None, None),
            BurstSetup::HashLayouts => (Some("hash".into()), Some("hash".into()), None),
            BurstSetup::NoRecords => (None, None, Some("0s".into())),
        }
    }
}

impl Bench {
    pub(super) fn message(&self, stream: &str, id: String, due: Due) -> NewMessage {
        NewMessage {
            id: MessageId::parse(&id).expect("bench ids are valid"),
            stream: stream.to_owned(),
            fields: vec![("payload".to_owned(), self.payload.clone())],
            due,
            priority: 0,
            ttl: None,
        }
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
        self.load_with(&self.store, stream, prefix, n, due).await
    }

    /// `load` through `store` (e.g. one that writes another pending layout).
    pub(super) async fn load_with(
        &self,
        store: &Store,
        stream: &str,
        prefix: &str,
        n: u64,
        due: Due,
    ) -> anyhow::Result<(Vec<u64>, f64)> {
        let started = Instant::now();
        let max_delay = self.config.api.limits.max_delay;
        let mut dues = vec![0u64; n as usize];
        let mut results = futures::stream::iter((0..n).step_by(LOAD_BATCH as usize))
            .map(|first| {
                let store = store.clone();
                let items: Vec<BatchItem> = (first..(first + LOAD_BATCH).min(n))
                    .map(|i| BatchItem::new(self.message(stream, format!("{prefix}{i}"), due)))
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

    /// A `delayq run` process on the bench Redis, leading once this returns.
    pub async fn start_delayq(&self, name: &str) -> anyhow::Result<DelayqProcess> {
        self.start_delayq_with(name, &self.delayq_config).await
    }

    /// A `delayq run` process with `config`, leading once this returns.
    pub(super) async fn start_delayq_with(
        &self,
        name: &str,
        config: &str,
    ) -> anyhow::Result<DelayqProcess> {
        self.start_delayq_with_env(name, config, &[]).await
    }

    /// [`Bench::start_delayq_with`], with extra environment variables (kept for
    /// restarts).
    pub(super) async fn start_delayq_with_env(
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
    pub(super) async fn start_metered(&self, name: &str, config: &str) -> anyhow::Result<Metered> {
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
    pub(super) fn open_dashboards(
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
    pub(super) async fn leads(&self, node: &DelayqProcess) -> bool {
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
    pub(super) async fn wait_for_entries(
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

    pub(super) async fn wait_for_redis_time(&self, ms: u64) -> anyhow::Result<()> {
        until_redis_time(&self.store, ms).await
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
        let loaded = self.load_burst(&store, n, 2000 + n / 20).await?;
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
    ) -> anyhow::Result<Loaded> {
        let mut conn = self.conn.clone();
        let mem_before = measure::used_memory(&mut conn).await?;
        let due_at = self.store.now_ms().await? + lead_ms;
        let (dues, load_rate) = self
            .load_with(store, BURST_STREAM, "m", n, Due::At(due_at))
            .await?;
        let bytes_per_pending = (measure::used_memory(&mut conn).await? - mem_before) / n as f64;
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
            (measure::used_memory(&mut conn).await? - loaded.mem_before) / n as f64;
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
            leaders: None,
        })
    }

    /// Spread: `rate` messages a second for `duration`, each due `SPREAD_DELAY` after
    /// it is sent, with a daemon already running.
    pub async fn spread(&self, rate: u64, duration: Duration) -> anyhow::Result<Spread> {
        let mut conn = self.conn.clone();
        let _: u64 = conn.del(SPREAD_STREAM).await?;
        let mut daemon = self.start_delayq("bench-spread").await?;
        let _dashboards = self.open_dashboards(&daemon);
        let total = (rate as f64 * duration.as_secs_f64()).round().max(1.0) as u64;
        let prefix = format!("s{rate}-");

        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let meter = CpuMeter::start(&mut conn, daemon.pid()).await?;
        let (dues, achieved) = self.producer(SPREAD_STREAM, &prefix, rate, total).await?;
        let deadline = Instant::now() + SPREAD_DELAY + Duration::from_secs(30);
        self.wait_for_entries(SPREAD_STREAM, total, deadline)
            .await?;
        let cpu = meter.stop(&mut conn, total).await?;
        let probe = probe.finish()?;
        daemon.terminate(Duration::from_secs(10));
        let tally = tally_stream(&mut conn, SPREAD_STREAM, &prefix, total, |i| {
            dues[i as usize]
        })
        .await?;
        let p99 = (!tally.lateness.is_empty()).then(|| tally.lateness.value_at_quantile(0.99));
        let kept_up = achieved >= rate as f64 * 0.95;
        Ok(Spread {
            on_time: p99.is_some_and(|p| p < SPREAD_P99_LIMIT_MS) && kept_up && tally.lost == 0,
            measured: measured_delayq(
                total,
                load,
                achieved.round() as u64,
                &cpu,
                &probe,
                tally.counts(),
            ),
            rate_per_sec: rate,
            producer_kept_up: kept_up,
            lateness_ms: summary(&tally.lateness),
            backlog: None,
        })
    }

    /// Schedules `total` messages `<prefix><n>` at `rate` a second, each due
    /// `SPREAD_DELAY` after it is sent; returns their due times and the rate achieved.
    /// Every millisecond, what is due to be sent goes in one `schedule_many` (one
    /// script call), so the producer can offer well over 100k msg/s.
    pub(super) fn producer(
        &self,
        stream: &str,
        prefix: &str,
        rate: u64,
        total: u64,
    ) -> impl Future<Output = anyhow::Result<(Vec<u64>, f64)>> + Send + 'static {
        let store = self.store.clone();
        let max_delay = self.config.api.limits.max_delay;
        let template = self.message(stream, format!("{prefix}0"), Due::In(SPREAD_DELAY));
        let prefix = prefix.to_owned();
        async move {
            let dues: Arc<Vec<AtomicU64>> =
                Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
            // Bounded in flight: a producer that falls behind shows as a lower achieved
            // rate instead of an ever-growing queue of requests.
            let in_flight = Arc::new(Semaphore::new(PRODUCER_CALLS_IN_FLIGHT));
            let mut tasks = JoinSet::new();
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let started = Instant::now();
            let mut sent = 0u64;
            while sent < total {
                tick.tick().await;
                let target = ((started.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
                while sent < target {
                    let first = sent;
                    sent = target.min(first + PRODUCER_MAX_BATCH);
                    let items: Vec<BatchItem> = (first..sent)
                        .map(|n| {
                            let mut msg = template.clone();
                            msg.id = MessageId::parse(&format!("{prefix}{n}"))
                                .expect("bench ids are valid");
                            BatchItem::new(msg)
                        })
                        .collect();
                    let permit = in_flight.clone().acquire_owned().await?;
                    let store = store.clone();
                    let dues = dues.clone();
                    tasks.spawn(async move {
                        let outcomes = store.schedule_many(&items, max_delay, None).await;
                        drop(permit);
                        for (k, (item, outcome)) in items.iter().zip(outcomes).enumerate() {
                            match outcome? {
                                Scheduled::Scheduled { due_ms } => {
                                    dues[first as usize + k].store(due_ms, Ordering::Relaxed)
                                }
                                other => bail!("schedule {}: {other:?}", item.msg.id.as_str()),
                            }
                        }
                        Ok(())
                    });
                }
                while let Some(done) = tasks.try_join_next() {
                    done??;
                }
            }
            while let Some(done) = tasks.join_next().await {
                done??;
            }
            let achieved = total as f64 / started.elapsed().as_secs_f64();
            let dues = dues.iter().map(|d| d.load(Ordering::Relaxed)).collect();
            Ok((dues, achieved))
        }
    }

    /// Steps up `ladder` until a rate is not on time; every step is a row.
    pub async fn spread_search(
        &self,
        ladder: &[u64],
        duration: Duration,
    ) -> anyhow::Result<Vec<Spread>> {
        self.flush().await?;
        let mut rows: Vec<Spread> = Vec::new();
        for &rate in ladder {
            let row = self.spread(rate, duration).await?;
            let on_time = row.on_time;
            rows.push(row);
            if !on_time {
                break;
            }
        }
        // The rates with a target are measured even above the first late one.
        for (rate, _) in super::report::SPREAD_TARGETS {
            if ladder.contains(&rate) && !rows.iter().any(|r| r.rate_per_sec == rate) {
                rows.push(self.spread(rate, duration).await?);
            }
        }
        Ok(rows)
    }

    /// Backlog: `n` messages due in a day, then the spread scenario at each rate.
    pub async fn backlog(
        &self,
        n: u64,
        rates: &[u64],
        duration: Duration,
    ) -> anyhow::Result<Vec<Figures>> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let mem_before = measure::used_memory(&mut conn).await?;
        let (_, load_rate) = self
            .load(BACKLOG_STREAM, "f", n, Due::In(Duration::from_secs(86_400)))
            .await?;
        let bytes_per_pending = (measure::used_memory(&mut conn).await? - mem_before) / n as f64;
        let mut spreads = Vec::new();
        for &rate in rates {
            spreads.push(self.spread(rate, duration).await?);
        }
        let pending = self.pending().await?;
        Ok(spreads
            .into_iter()
            .map(|spread| {
                Delayq::BacklogSpread(Spread {
                    backlog: Some(Backlog {
                        backlog: n,
                        schedule_rate_per_sec: load_rate.round() as u64,
                        bytes_per_pending_message: bytes_per_pending.round() as i64,
                        backlog_still_pending: pending,
                    }),
                    ..spread
                })
                .into()
            })
            .collect())
    }
}

/// Waits until Redis's clock, as `store` reads it, has passed `ms`.
async fn until_redis_time(store: &Store, ms: u64) -> anyhow::Result<()> {
    while store.now_ms().await? <= ms {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// How long before a burst falls due its meters start when its daemons run
/// during the load: the wait until then is not the drain's (Redis and the
/// daemons spend CPU while idle too), and the meters must not miss its start.
const METERS_AHEAD_MS: u64 = 100;

/// For a burst of `n` messages due at `due_at` whose daemons ran during its load:
/// fails if the load outlasted its `allowed_ms` (the daemons then forwarded during
/// it, which the meters would miss), else waits until the meters may start.
pub(super) async fn until_meters_start(
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

/// A daemon under test with its meters running (see [`Bench::start_metered`]).
pub(super) struct Metered {
    daemon: DelayqProcess,
    meter: CpuMeter,
    probe: PingProbe,
    /// `--dashboards` polling the daemon while it runs.
    _dashboards: Option<tokio_util::sync::DropGuard>,
}

impl Metered {
    /// Stops the meters and the daemon (printing its log when `show_log`): the CPU
    /// per message over `messages` and the probe's findings.
    pub(super) async fn stop(
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
