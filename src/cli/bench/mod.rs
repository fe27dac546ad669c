//! `delayq bench`: delayq measured against the physical limit and a peer, on one
//! Redis, in one run.
//!
//! - `scenarios`: delayq's burst, spread, spread search and backlog.
//! - `catchup`: a backlog drained at a stream's limit while live traffic goes on.
//! - `idle`: a leader with nothing to move (its Redis cost a second).
//! - `schedules`: recurring schedules firing together (Redis CPU per occurrence).
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
pub use args::BenchArgs;
use plan::Plan;

mod args;
mod ceiling;
mod cluster;
mod failover;
mod idle;
mod ingest;
mod leaders;
mod measure;
mod memory;
mod peer;
mod plan;
mod pushers;
mod report;
mod rows;
mod scenarios;
mod schedules;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use redis::IntoConnectionInfo;
use redis::aio::MultiplexedConnection;

use delayq_client::config::Config;
use delayq_client::store::Store;
use delayq_harness::{EtcdServer, RedisServer};
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

/// Live traffic during the catch-up scenario, msg/s.
const CATCHUP_LIVE_RATE: u64 = 1000;

/// How long the bench's own script calls (its producers, its setup) may wait for
/// Redis: see [`bench_store`].
const BENCH_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// The daemons' config as delayq reads it (`delayq_config` and an API on any port).
fn daemon_config(delayq_config: &str) -> anyhow::Result<Config> {
    Ok(Config::from_toml(
        &format!("{delayq_config}[api]\nlisten = \"127.0.0.1:0\"\n"),
        std::iter::empty(),
    )?)
}

/// The journal `config` names, migrated; None without one.
async fn migrated_journal(config: &Config) -> anyhow::Result<Option<delayq::journal::Journal>> {
    let Some(settings) = &config.journal else {
        return Ok(None);
    };
    let journal = delayq::journal::Journal::new(settings)?;
    journal.migrate().await.context("migrate the journal")?;
    Ok(Some(journal))
}

/// The bench's own store for `config`. Its calls wait as long as Redis takes: its
/// producers keep calls of up to 1000 messages queued at a saturated Redis on purpose
/// (the spread search's top rates), which can take longer than `redis.timeout`. The
/// daemons under test keep their own.
async fn bench_store(config: &Config) -> anyhow::Result<Store> {
    let mut store_config = config.store_config();
    store_config.response_timeout = BENCH_RESPONSE_TIMEOUT;
    Ok(Store::connect(&store_config).await?)
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
    /// `--spread-tick`: how often the spread producers send.
    spread_tick: Duration,
    http: reqwest::Client,
    /// `--journal-url`: emptied with Redis.
    journal: Option<delayq::journal::Journal>,
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
        let config = daemon_config(&delayq_config)?;
        let store = bench_store(&config).await?;
        let conn = store.separate_connection().await?;
        let journal = migrated_journal(&config).await?;
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
            spread_tick: args.spread_tick,
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
            delayq_client::message::Due::In(Duration::ZERO),
        );
        self.store
            .schedule(
                &msg,
                delayq_client::store::ScheduleMode::New,
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
    // The journaled ingest's MariaDB: without one, that row is not measured.
    let mariadb = if plan.journaled && plan.ingest > 0 {
        match delayq_harness::MariaDbServer::start() {
            Ok(db) => Some(db),
            Err(e) => {
                eprintln!("bench: no journaled ingest: {e:#}");
                None
            }
        }
    } else {
        None
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
        let (schedules, every, fires) = plan.schedules;
        if schedules > 0 {
            progress(&format!(
                "run {run}: delayq {schedules} schedules firing every {every:?}, {fires} times"
            ));
            add(bench.schedules(schedules, every, fires).await?);
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
            add(bench.ingest_http(plan.ingest, Ids::Given).await?);
            add(bench.ingest_http(plan.ingest, Ids::Generated).await?);
            add(bench.ingest_batch(plan.ingest, Ids::Given).await?);
            add(bench.ingest_batch(plan.ingest, Ids::Generated).await?);
            if let Some(db) = &mariadb {
                add(bench
                    .ingest_batch_journaled(plan.ingest, &db.url_with_password())
                    .await?);
            }
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
