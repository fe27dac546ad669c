//! The report: what the figures were taken on, the parameters, every row, the
//! targets checked against them (results.json), and Markdown tables for people.
//!
//! - `targets`: the targets and how each is checked.
//! - `steady`: the steady cost's targets (a message's Redis time in spread
//!   traffic, a call's beyond its commands, bursts with records, ingest).
//! - `markdown`: the tables (bench/RESULTS.md is the latest full run's).
//! - `cell`: how a figure reads in either.

mod cell;
mod markdown;
mod steady;
mod targets;

use serde::{Deserialize, Serialize};

pub use markdown::markdown;
pub use targets::Target;

use super::peer::PeerVersions;
use super::rows::{Reference, Row};
use super::{Bench, BenchArgs, measure, peer};

/// results.json.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub machine: Machine,
    pub parameters: Parameters,
    pub started: String,
    pub finished: String,
    pub load_average_at_end: String,
    pub targets: Vec<Target>,
    pub rows: Vec<Row>,
    pub redis_benchmark: Vec<Reference>,
}

/// What the figures were taken on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cpu: Option<String>,
    pub cores: usize,
    pub memory_gib: Option<f64>,
    pub kernel: Option<String>,
    pub redis: Option<String>,
    pub delayq: String,
    pub commit: Option<String>,
    /// Null without the peer.
    pub peer: Option<PeerVersions>,
    /// The command line, as `delayq …`.
    pub command: String,
    pub load_average_at_start: String,
}

/// What the run did: the suite's choices after the options.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Parameters {
    pub suite: String,
    pub payload_bytes: usize,
    pub shards: u16,
    pub batch_size: usize,
    pub bursts: Vec<u64>,
    /// Leaders of the per-shard bursts (`election.mode = "per_shard"`).
    #[serde(default)]
    pub leaders: Vec<u32>,
    /// Messages of each Redis Cluster burst (0: none).
    #[serde(default)]
    pub cluster: u64,
    pub spread_rates: Vec<u64>,
    pub spread_search: bool,
    pub spread_seconds: f64,
    pub spread_delay_ms: u64,
    /// How often the spread producers send (`--spread-tick`); 1 before it was set.
    #[serde(default = "one_ms")]
    pub spread_tick_ms: u64,
    pub backlog: u64,
    pub backlog_rates: Vec<u64>,
    pub ingest: u64,
    /// Overdue messages in the catch-up scenario and its stream's limit (msg/s).
    #[serde(default)]
    pub catchup: u64,
    #[serde(default)]
    pub catchup_limit: u64,
    pub repeat: u32,
    pub peer: bool,
    pub peer_worker_concurrency: u32,
    pub ceiling_callers: usize,
    /// How the leader was stopped: "sigterm", "sigkill".
    pub failover: Vec<String>,
    pub failover_rate: u64,
    pub failover_after_seconds: f64,
    /// Rounds of the SIGTERM and of the SIGKILL failover.
    #[serde(default)]
    pub failover_rounds: [u32; 2],
    pub lease_ttl_seconds: f64,
}

/// What the figures were taken on.
pub async fn machine(bench: &Bench, args: &BenchArgs, with_peer: bool) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").parse::<f64>().ok())
        })
        .map(|kb| (kb / 1024.0 / 1024.0).round());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .ok();
    let mut conn = bench.conn.clone();
    let redis = measure::info_field(&mut conn, "server", "redis_version")
        .await
        .ok();
    let commit = tokio::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .await
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    // URLs (--redis-url, --journal-url) shown without their passwords.
    let command = std::iter::once("delayq".to_owned())
        .chain(std::env::args().skip(1).map(|arg| {
            if arg.contains("://") {
                delayq_client::secret::shown_url(&arg)
            } else {
                arg
            }
        }))
        .collect::<Vec<_>>()
        .join(" ");
    Machine {
        cpu,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib,
        kernel,
        redis,
        delayq: env!("CARGO_PKG_VERSION").to_owned(),
        commit,
        peer: if with_peer {
            Some(peer::versions(&args.peer_dir).await)
        } else {
            None
        },
        command,
        load_average_at_start: measure::load_average(),
    }
}

/// The whole report, once every row is in: the targets are checked here.
pub fn assemble(
    machine: Machine,
    parameters: Parameters,
    started: jiff::Timestamp,
    rows: Vec<Row>,
    redis_benchmark: Vec<Reference>,
) -> Report {
    Report {
        machine,
        parameters,
        started: started.to_string(),
        finished: jiff::Timestamp::now().to_string(),
        load_average_at_end: measure::load_average(),
        targets: targets::targets(&rows)
            .into_iter()
            .chain(steady::steady_targets(&rows))
            .collect(),
        rows,
        redis_benchmark,
    }
}

/// `Parameters::spread_tick_ms` of a report written before it was kept.
fn one_ms() -> u64 {
    1
}
