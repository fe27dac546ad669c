//! `delayq bench`: delayq measured against the physical limit and a peer, on one
//! Redis, in one run.
//!
//! - `scenarios`: delayq's burst, spread, spread search and backlog.
//! - `catchup`: a backlog drained at a stream's limit while live traffic goes on.
//! - `idle`: a leader with nothing to move (its Redis cost a second).
//! - `ingest`: messages into delayq: single HTTP pushes, batch HTTP, the inbox stream
//!   (drained and live).
//! - `ceiling`: the same work as a bare Lua script, and `redis-benchmark`.
//! - `failover`: the leader stopped (SIGTERM, SIGKILL, SIGSTOP, cut off from Redis) during a spread, two daemons
//!   elected through etcd.
//! - `leaders`: a burst drained by several leaders at once (`election.mode =
//!   "per_shard"`).
//! - `cluster`: Redis Cluster against a standalone Redis, 1 and 8 streams, 1 and 3
//!   leaders.
//! - `peer`: BullMQ delayed jobs (node, `bench/peer/`).
//! - `measure`: CPU, memory, the PING probe, stream tallies (lateness, lost, duplicated).
//! - `rows`: what each scenario measured, one type per kind of row.
//! - `report`: the JSON report, the Markdown tables and the targets.
//!
//! Lateness is always stream entry time − due time, both on Redis's clock (for
//! BullMQ: worker pick time − due time, see `peer`).

mod catchup;
mod ceiling;
mod cluster;
mod failover;
mod idle;
mod ingest;
mod leaders;
mod measure;
mod peer;
mod report;
mod rows;
mod scenarios;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use redis::IntoConnectionInfo;
use redis::aio::MultiplexedConnection;

use crate::config::Config;
use crate::harness::{EtcdServer, RedisServer};
use crate::store::Store;
use ingest::Ids;
use rows::{Delayq, Figures, Row};
use scenarios::BurstSetup;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Suite {
    /// Seconds: a few thousand messages, every scenario once (a smoke test).
    Tiny,
    /// A few minutes: 100k burst, 1k, 10k and 50k msg/s spreads, 100k backlog, the peer.
    Quick,
    /// Everything, twice: 100k and 1M bursts, the spread search, a 1M backlog, the
    /// peer at the same sizes, ingest.
    Full,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Which set of scenarios and sizes; the options below override its choices.
    #[arg(long, value_enum, default_value = "quick")]
    pub suite: Suite,
    /// Burst sizes (messages due at one instant), comma-separated; 0 skips.
    #[arg(long, value_delimiter = ',')]
    pub burst: Option<Vec<u64>>,
    /// Spread rates (msg/s), comma-separated; with --search, the ladder climbed
    /// until p99 lateness reaches 10 ms.
    #[arg(long = "rate", value_delimiter = ',')]
    pub rates: Option<Vec<u64>>,
    /// Climb the rates until one is not on time (instead of running each).
    #[arg(long)]
    pub search: Option<bool>,
    /// How long each spread sends.
    #[arg(long, value_parser = crate::message::parse_duration)]
    pub duration: Option<Duration>,
    /// Far-future messages pending during the backlog scenario (0 skips it).
    #[arg(long)]
    pub backlog: Option<u64>,
    /// Messages in each ingest scenario (HTTP, batch HTTP, inbox); 0 skips them.
    #[arg(long)]
    pub ingest: Option<u64>,
    /// Overdue messages in the catch-up scenario (0 skips it): drained at
    /// --catchup-limit while 1000 msg/s of live traffic go to another stream.
    #[arg(long)]
    pub catchup: Option<u64>,
    /// The catch-up stream's streams.max_rate (msg/s).
    #[arg(long)]
    pub catchup_limit: Option<u64>,
    /// Runs of every scenario.
    #[arg(long)]
    pub repeat: Option<u32>,
    /// Leaders of the per-shard burst (`election.mode = "per_shard"`, one election
    /// group each, needs etcd), comma-separated: the first burst size drained by
    /// each count of leaders; 0 skips.
    #[arg(long, value_delimiter = ',')]
    pub leaders: Option<Vec<u32>>,
    /// Messages of each Redis Cluster burst (a 3-master cluster against a
    /// standalone Redis, both started for it; 1 and 8 streams, 1 and 3 leaders);
    /// 0 skips.
    #[arg(long)]
    pub cluster: Option<u64>,
    /// Skip the BullMQ peer.
    #[arg(long)]
    pub no_peer: bool,
    /// Skip the ceiling (Lua loop and redis-benchmark).
    #[arg(long)]
    pub no_ceiling: bool,
    /// How the leader is stopped in the failover scenario, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub failover: Option<Vec<failover::Stop>>,
    /// Skip failover under load (needs etcd).
    #[arg(long)]
    pub no_failover: bool,
    /// Rounds of each failover (the leader stopped, started again as the standby,
    /// the new leader stopped in turn); default by suite: SIGTERM 50, SIGKILL 20,
    /// pause and redis-cut 5 in the full suite.
    #[arg(long)]
    pub failover_rounds: Option<u32>,
    /// etcd lease TTL of the daemons in the failover scenario (etcd.lease_ttl).
    #[arg(long, value_parser = crate::message::parse_duration)]
    pub lease_ttl: Option<Duration>,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub payload: usize,
    /// Shards (redis.shards).
    #[arg(long, default_value_t = 16)]
    pub shards: u16,
    /// Messages per forward call (forwarder.batch_size), also the ceiling's batch.
    #[arg(long, default_value_t = 200)]
    pub batch_size: usize,
    /// Use this Redis instead of starting one. It is FLUSHALLed between scenarios.
    #[arg(long)]
    pub redis_url: Option<String>,
    /// The delayq binary to run as the daemon under test (default: this one).
    #[arg(long)]
    pub delayq_bin: Option<PathBuf>,
    /// Journal every daemon's messages into this MySQL / MariaDB (`[journal] url`,
    /// password included), emptied with Redis between scenarios: the ingest rows
    /// then include the journal's cost.
    #[arg(long)]
    pub journal_url: Option<String>,
    /// Where the peer's package.json and script are.
    #[arg(long, default_value = "bench/peer")]
    pub peer_dir: PathBuf,
    /// Dashboards open on the daemon under test during the burst and spread
    /// scenarios: each asks for the overview, the nodes, the history and the
    /// stream table every 2 s, as the page does (0: none).
    #[arg(long, default_value_t = 0)]
    pub dashboards: usize,
    /// Write results.json and results.md here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
}

/// Live traffic during the catch-up scenario, msg/s.
const CATCHUP_LIVE_RATE: u64 = 1000;

/// How long the bench's own script calls (its producers, its setup) may wait for
/// Redis: see [`bench_store`].
const BENCH_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// The bench's own store for `config`. Its calls wait as long as Redis takes: its
/// producers keep calls of up to 1000 messages queued at a saturated Redis on purpose
/// (the spread search's top rates), which can take longer than `redis.timeout`. The
/// daemons under test keep their own.
async fn bench_store(config: &Config) -> anyhow::Result<Store> {
    let mut store_config = config.store_config();
    store_config.response_timeout = BENCH_RESPONSE_TIMEOUT;
    Ok(Store::connect(&store_config).await?)
}

/// What one run does, after the suite's defaults and the options.
#[derive(Clone, Debug)]
struct Plan {
    bursts: Vec<u64>,
    /// Leaders of the per-shard bursts.
    leaders: Vec<u32>,
    /// Messages of each Redis Cluster burst (0: none).
    cluster: u64,
    rates: Vec<u64>,
    search: bool,
    duration: Duration,
    backlog: u64,
    backlog_rates: Vec<u64>,
    ingest: u64,
    catchup: u64,
    catchup_limit: u64,
    repeat: u32,
    peer: bool,
    peer_bursts: Vec<u64>,
    peer_rates: Vec<u64>,
    ceiling: bool,
    redis_benchmark_requests: u64,
    failover_stops: Vec<failover::Stop>,
    failover_rate: u64,
    failover_after: Duration,
    /// Rounds of the SIGTERM and of the SIGKILL failover.
    failover_rounds: (u32, u32),
    lease_ttl: Duration,
}

impl Plan {
    fn new(args: &BenchArgs) -> Plan {
        let mut plan = match args.suite {
            Suite::Tiny => Plan {
                bursts: vec![2000],
                leaders: vec![2],
                cluster: 2000,
                rates: vec![500],
                search: false,
                duration: Duration::from_secs(2),
                backlog: 2000,
                backlog_rates: vec![500],
                ingest: 1000,
                catchup: 2000,
                catchup_limit: 1000,
                repeat: 1,
                peer: false,
                peer_bursts: vec![2000],
                peer_rates: vec![500],
                ceiling: true,
                redis_benchmark_requests: 2000,
                failover_stops: vec![failover::Stop::Term],
                failover_rate: 500,
                failover_after: Duration::from_secs(1),
                failover_rounds: (2, 1),
                lease_ttl: Duration::from_secs(2),
            },
            Suite::Quick => Plan {
                bursts: vec![100_000],
                leaders: vec![1, 3],
                cluster: 100_000,
                rates: vec![1000, 10_000, 50_000],
                search: false,
                duration: Duration::from_secs(10),
                backlog: 100_000,
                backlog_rates: vec![1000, 10_000],
                ingest: 20_000,
                catchup: 100_000,
                catchup_limit: 20_000,
                repeat: 1,
                peer: true,
                peer_bursts: vec![100_000],
                peer_rates: vec![1000, 10_000],
                ceiling: true,
                redis_benchmark_requests: 200_000,
                failover_stops: vec![failover::Stop::Term, failover::Stop::Kill],
                failover_rate: 1000,
                failover_after: Duration::from_secs(3),
                failover_rounds: (10, 5),
                lease_ttl: Duration::from_secs(6),
            },
            Suite::Full => Plan {
                bursts: vec![100_000, 1_000_000],
                leaders: vec![1, 3],
                cluster: 200_000,
                rates: vec![1000, 2000, 5000, 10_000, 20_000, 30_000, 50_000],
                search: true,
                duration: Duration::from_secs(10),
                backlog: 1_000_000,
                backlog_rates: vec![1000, 10_000],
                ingest: 100_000,
                catchup: 500_000,
                catchup_limit: 50_000,
                repeat: 2,
                peer: true,
                peer_bursts: vec![100_000, 1_000_000],
                peer_rates: vec![1000, 10_000],
                ceiling: true,
                redis_benchmark_requests: 300_000,
                failover_stops: vec![
                    failover::Stop::Term,
                    failover::Stop::Kill,
                    failover::Stop::Pause,
                    failover::Stop::RedisCut,
                ],
                failover_rate: 1000,
                failover_after: Duration::from_secs(3),
                failover_rounds: (50, 20),
                lease_ttl: Duration::from_secs(6),
            },
        };
        if let Some(bursts) = &args.burst {
            plan.bursts = bursts.iter().copied().filter(|n| *n > 0).collect();
            plan.peer_bursts = plan.bursts.clone();
        }
        if let Some(leaders) = &args.leaders {
            plan.leaders = leaders.iter().copied().filter(|n| *n > 0).collect();
        }
        if let Some(n) = args.cluster {
            plan.cluster = n;
        }
        if let Some(rates) = &args.rates {
            plan.rates = rates.iter().copied().filter(|n| *n > 0).collect();
            plan.backlog_rates = plan.rates.clone();
            plan.peer_rates = plan.rates.clone();
        }
        if let Some(search) = args.search {
            plan.search = search;
        }
        if let Some(d) = args.duration {
            plan.duration = d;
        }
        if let Some(n) = args.backlog {
            plan.backlog = n;
        }
        if let Some(n) = args.ingest {
            plan.ingest = n;
        }
        if let Some(n) = args.catchup {
            plan.catchup = n;
        }
        if let Some(n) = args.catchup_limit {
            plan.catchup_limit = n.max(1);
        }
        if let Some(n) = args.repeat {
            plan.repeat = n.max(1);
        }
        if args.no_peer {
            plan.peer = false;
        }
        if args.no_ceiling {
            plan.ceiling = false;
        }
        if let Some(stops) = &args.failover {
            plan.failover_stops = stops.clone();
        }
        if args.no_failover {
            plan.failover_stops.clear();
        }
        if let Some(rounds) = args.failover_rounds {
            plan.failover_rounds = (rounds, rounds);
        }
        if let Some(ttl) = args.lease_ttl {
            plan.lease_ttl = ttl;
        }
        plan
    }

    fn parameters(&self, args: &BenchArgs) -> report::Parameters {
        report::Parameters {
            suite: format!("{:?}", args.suite).to_lowercase(),
            payload_bytes: args.payload,
            shards: args.shards,
            batch_size: args.batch_size,
            bursts: self.bursts.clone(),
            leaders: self.leaders.clone(),
            cluster: self.cluster,
            spread_rates: self.rates.clone(),
            spread_search: self.search,
            spread_seconds: self.duration.as_secs_f64(),
            spread_delay_ms: scenarios::SPREAD_DELAY.as_millis() as u64,
            backlog: self.backlog,
            backlog_rates: self.backlog_rates.clone(),
            ingest: self.ingest,
            catchup: self.catchup,
            catchup_limit: self.catchup_limit,
            repeat: self.repeat,
            peer: self.peer,
            peer_worker_concurrency: peer::WORKER_CONCURRENCY,
            ceiling_callers: ceiling::CALLERS,
            failover: self
                .failover_stops
                .iter()
                .map(|s| s.name().to_owned())
                .collect(),
            failover_rate: self.failover_rate,
            failover_after_seconds: self.failover_after.as_secs_f64(),
            failover_rounds: [self.failover_rounds.0, self.failover_rounds.1],
            lease_ttl_seconds: self.lease_ttl.as_secs_f64(),
        }
    }
}

/// What every scenario works with: one Redis, connections to it, the daemon's config.
pub struct Bench {
    url: String,
    host: String,
    port: u16,
    conn: MultiplexedConnection,
    store: Store,
    config: Config,
    delayq_config: String,
    delayq_bin: PathBuf,
    peer_dir: PathBuf,
    payload: String,
    batch_size: usize,
    http: reqwest::Client,
    /// `--journal-url`: emptied with Redis.
    journal: Option<crate::journal::Journal>,
    /// `--dashboards`.
    dashboards: usize,
    /// Where failover rounds slower than their target keep their logs
    /// (`<out>/failover-slow`; none without `--out`).
    slow_rounds: Option<PathBuf>,
}

impl Bench {
    async fn new(args: &BenchArgs, url: String) -> anyhow::Result<Bench> {
        let mut delayq_config = format!(
            "[redis]\nurl = \"{url}\"\nprefix = \"delayq-bench\"\nshards = {}\n[forwarder]\nbatch_size = {}\n[log]\nlevel = \"warn\"\n",
            args.shards, args.batch_size
        );
        if let Some(journal) = &args.journal_url {
            delayq_config.push_str(&format!("[journal]\nurl = \"{journal}\"\n"));
        }
        let config = Config::from_toml(
            &format!("{delayq_config}[api]\nlisten = \"127.0.0.1:0\"\n"),
            std::iter::empty(),
        )?;
        let store = bench_store(&config).await?;
        let conn = store.separate_connection().await?;
        let journal = match &config.journal {
            Some(settings) => {
                let journal = crate::journal::Journal::new(settings)?;
                journal.migrate().await.context("migrate the journal")?;
                Some(journal)
            }
            None => None,
        };
        let info = url.as_str().into_connection_info()?;
        let (host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
            other => anyhow::bail!("the bench needs a TCP Redis, not {other:?}"),
        };
        let delayq_bin = match &args.delayq_bin {
            Some(bin) => bin.clone(),
            None => std::env::current_exe().context("find the delayq binary")?,
        };
        let mut bench = Bench {
            url,
            host,
            port,
            conn,
            store,
            config,
            delayq_config,
            delayq_bin,
            peer_dir: args.peer_dir.clone(),
            payload: "x".repeat(args.payload),
            batch_size: args.batch_size,
            http: reqwest::Client::new(),
            journal,
            dashboards: args.dashboards,
            slow_rounds: args.out.as_ref().map(|dir| dir.join("failover-slow")),
        };
        // Redis records every event over 1 ms, read back per phase (LATENCY LATEST).
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("latency-monitor-threshold")
            .arg(1)
            .query_async(&mut bench.conn)
            .await?;
        bench.warm_up().await?;
        Ok(bench)
    }

    /// Loads delayq's scripts into Redis once, so that memory measured later is the
    /// messages' alone and not the script cache's (FLUSHALL keeps scripts).
    async fn warm_up(&self) -> anyhow::Result<()> {
        let msg = self.message(
            "bench:warm-up",
            "warm-up".to_owned(),
            crate::message::Due::In(Duration::ZERO),
        );
        self.store
            .schedule(
                &msg,
                crate::store::ScheduleMode::New,
                self.config.api.limits.max_delay,
            )
            .await?;
        let leader = self.start_delayq("bench-warm-up").await?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        self.wait_for_entries("bench:warm-up", 1, deadline).await?;
        drop(leader);
        self.flush().await
    }

    /// Empties Redis.
    async fn flush(&self) -> anyhow::Result<()> {
        let mut conn = self.conn.clone();
        let () = redis::cmd("FLUSHALL")
            .arg("SYNC")
            .query_async(&mut conn)
            .await?;
        if let Some(journal) = &self.journal {
            journal.truncate().await.context("empty the journal")?;
        }
        Ok(())
    }
}

pub async fn main(args: BenchArgs) -> anyhow::Result<()> {
    let plan = Plan::new(&args);
    let server = match &args.redis_url {
        Some(_) => None,
        None => Some(RedisServer::start().context("start a local redis-server for the benchmark")?),
    };
    let url = args
        .redis_url
        .clone()
        .unwrap_or_else(|| server.as_ref().expect("started").url());
    let bench = Bench::new(&args, url).await?;
    if plan.peer {
        peer::ensure_installed(&args.peer_dir).await?;
    }
    let etcd = if plan.failover_stops.is_empty() && plan.leaders.is_empty() && plan.cluster == 0 {
        None
    } else {
        Some(EtcdServer::start().context(
            "start etcd for the failover, per-shard and cluster scenarios (--no-failover --leaders 0 --cluster 0 skip them)",
        )?)
    };
    let started = jiff::Timestamp::now();
    let machine = report::machine(&bench, &args, plan.peer).await;
    let mut rows: Vec<Row> = Vec::new();
    let mut reference = Vec::new();
    let progress = |what: &str| eprintln!("bench: {what} (load {})", measure::load_average());
    for run in 1..=plan.repeat {
        let mut add = |figures: Figures| rows.push(Row { figures, run });
        for &n in &plan.bursts {
            // The defaults, then the other setups: the frontier of memory against speed.
            for setup in BurstSetup::ALL {
                progress(&format!("run {run}: delayq burst {n}{}", setup.note()));
                add(bench.burst(n, setup).await?);
            }
            if plan.ceiling {
                progress(&format!("run {run}: ceiling burst {n}"));
                add(bench.ceiling(n).await?);
            }
        }
        if let (Some(etcd), Some(&n)) = (&etcd, plan.bursts.first()) {
            for &k in &plan.leaders {
                progress(&format!(
                    "run {run}: delayq burst {n}, election.mode = per_shard with {k} leader(s)"
                ));
                add(bench.burst_leaders(etcd, n, k).await?);
            }
        }
        if plan.cluster > 0 {
            progress(&format!(
                "run {run}: Redis Cluster bursts of {}",
                plan.cluster
            ));
            for figures in bench.cluster_bursts(etcd.as_ref(), plan.cluster).await? {
                add(figures);
            }
        }
        if plan.peer {
            for &n in &plan.peer_bursts {
                progress(&format!("run {run}: BullMQ burst {n}"));
                add(bench.peer_burst(n).await?);
            }
        }
        if plan.search {
            progress(&format!("run {run}: delayq spread search"));
            for spread in bench.spread_search(&plan.rates, plan.duration).await? {
                add(Delayq::Spread(spread).into());
            }
        } else {
            bench.flush().await?;
            for &rate in &plan.rates {
                progress(&format!("run {run}: delayq spread {rate}/s"));
                add(Delayq::Spread(bench.spread(rate, plan.duration).await?).into());
            }
        }
        if plan.peer {
            for &rate in &plan.peer_rates {
                progress(&format!("run {run}: BullMQ spread {rate}/s"));
                add(bench.peer_spread(rate, plan.duration).await?);
            }
        }
        if plan.backlog > 0 {
            progress(&format!("run {run}: delayq backlog {}", plan.backlog));
            for row in bench
                .backlog(plan.backlog, &plan.backlog_rates, plan.duration)
                .await?
            {
                add(row);
            }
        }
        if !plan.rates.is_empty() {
            progress(&format!("run {run}: delayq idle for {:?}", plan.duration));
            add(bench.idle(plan.duration).await?);
        }
        if plan.catchup > 0 {
            progress(&format!(
                "run {run}: delayq catch-up of {} at {}/s with {CATCHUP_LIVE_RATE}/s live",
                plan.catchup, plan.catchup_limit
            ));
            add(bench
                .catchup(plan.catchup, plan.catchup_limit, CATCHUP_LIVE_RATE)
                .await?);
        }
        if plan.ingest > 0 {
            progress(&format!(
                "run {run}: delayq ingest {} (HTTP, batch HTTP, inbox)",
                plan.ingest
            ));
            add(bench.ingest_http(plan.ingest).await?);
            add(bench.ingest_batch(plan.ingest, Ids::Given).await?);
            add(bench.ingest_batch(plan.ingest, Ids::Generated).await?);
            add(bench.ingest_inbox_drain(plan.ingest).await?);
            add(bench.ingest_inbox(plan.ingest).await?);
        }
        if let Some(etcd) = &etcd {
            for &stop in &plan.failover_stops {
                progress(&format!(
                    "run {run}: delayq failover by {} at {}/s",
                    stop.name(),
                    plan.failover_rate
                ));
                add(bench
                    .failover(
                        etcd,
                        stop,
                        plan.failover_rate,
                        plan.failover_after,
                        plan.lease_ttl,
                        match stop {
                            failover::Stop::Term => plan.failover_rounds.0,
                            failover::Stop::Kill => plan.failover_rounds.1,
                            // About 8 s a round: fewer of them.
                            failover::Stop::Pause | failover::Stop::RedisCut => {
                                plan.failover_rounds.1.clamp(1, 5)
                            }
                        },
                    )
                    .await?);
            }
        }
        if plan.ceiling {
            progress(&format!("run {run}: redis-benchmark"));
            reference.push(
                bench
                    .redis_benchmark(plan.redis_benchmark_requests, run)
                    .await?,
            );
        }
    }
    bench.flush().await?;
    let report = report::assemble(machine, plan.parameters(&args), started, rows, reference);
    let markdown = report::markdown(&report);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(&report)?,
        )?;
        std::fs::write(dir.join("results.md"), &markdown)?;
        eprintln!(
            "bench: wrote {0}/results.json and {0}/results.md",
            dir.display()
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{markdown}");
    }
    Ok(())
}
