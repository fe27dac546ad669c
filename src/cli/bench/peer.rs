//! The peer: BullMQ delayed jobs on the same Redis, same N and payload, driven by
//! `bench/peer/bullmq.mjs` (versions pinned in `bench/peer/package-lock.json`,
//! installed on first use). Producer and worker are separate node
//! processes; the worker reports its own CPU and lateness (see the script's header).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::measure::{self, CpuMeter, PingProbe, measured, wall_ms};
use super::rows::{Bullmq, Counts, Figures, Lateness, PeerBurst, PeerSpread, ProcessCpu};
use super::scenarios::{SPREAD_DELAY, SPREAD_P99_LIMIT_MS};
use super::{Bench, memory};

/// Jobs the worker runs at once: BullMQ's own advice for I/O-bound work, and far
/// above what a no-op processor needs to keep Redis busy.
pub const WORKER_CONCURRENCY: u32 = 100;

/// The versions the peer ran with (the report's `machine.peer`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerVersions {
    pub node: Option<String>,
    pub bullmq: Option<String>,
    pub ioredis: Option<String>,
}

/// The parts of `package.json` files read here.
#[derive(Deserialize)]
struct Package {
    #[serde(default)]
    dependencies: BTreeMap<String, String>,
    version: Option<String>,
}

/// The part of `package-lock.json` read here: each installed package's version.
#[derive(Deserialize)]
struct Lock {
    packages: BTreeMap<String, Package>,
}

/// The producer's last line.
#[derive(Deserialize)]
struct Produced {
    /// Null when the adds took no measurable time.
    add_rate_per_sec: Option<u64>,
}

/// The worker's result line (see the script).
#[derive(Deserialize)]
struct Worked {
    delivered: u64,
    lost: u64,
    duplicated: u64,
    unexpected: u64,
    first_ms: u64,
    last_ms: u64,
    lateness_ms: Option<Lateness>,
    cpu_us_per_message: f64,
}

impl Worked {
    fn counts(&self) -> Counts {
        Counts {
            delivered: self.delivered,
            lost: self.lost,
            duplicated: self.duplicated,
            unexpected: Some(self.unexpected),
            refused: None,
        }
    }

    /// The worker's CPU µs per job, to a tenth.
    fn cpu(&self) -> ProcessCpu {
        ProcessCpu::Worker(Some((self.cpu_us_per_message * 10.0).round() / 10.0))
    }
}

/// Installs the pinned peer packages unless they are there already.
///
/// `npm ci` first. Some npm versions refuse a lock file that lacks the optional
/// native packages of other platforms, or a registry that does not have them, so a
/// refusal falls back to `npm install --no-save`, which still takes the versions in
/// the lock file; either way the installed BullMQ must be the pinned one.
pub async fn ensure_installed(dir: &Path) -> anyhow::Result<()> {
    if !dir.join("node_modules/.package-lock.json").exists() {
        eprintln!("bench: installing the peer (npm ci in {})", dir.display());
        if let Err(ci) = npm(dir, &["ci", "--no-audit", "--no-fund"]).await {
            eprintln!("bench: npm ci refused ({ci:#}); trying npm install --no-save");
            npm(dir, &["install", "--no-save", "--no-audit", "--no-fund"]).await?;
        }
    }
    let read = |path: &str| -> anyhow::Result<Package> {
        let text =
            std::fs::read_to_string(dir.join(path)).with_context(|| format!("read {path}"))?;
        serde_json::from_str(&text).with_context(|| format!("read {path}"))
    };
    let pinned = read("package.json")?.dependencies.remove("bullmq");
    let installed = read("node_modules/bullmq/package.json")?.version;
    if pinned != installed {
        let name = |v: Option<String>| v.map_or("none".to_owned(), |v| format!("{v:?}"));
        bail!(
            "BullMQ {} is installed in {}, not the pinned {}; remove node_modules there",
            name(installed),
            dir.display(),
            name(pinned)
        );
    }
    Ok(())
}

async fn npm(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("npm")
        .args(args)
        .current_dir(dir)
        .kill_on_drop(true)
        .output()
        .await
        .context("run npm (node 20 and npm are needed for the peer; --no-peer skips it)")?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        // npm prints the command's help after the reason; the reason is what matters.
        let reason: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("npm error") && !l.trim_end().ends_with("npm error"))
            .take_while(|l| !l.contains("Usage:") && !l.contains("Clean install a project"))
            .take(8)
            .collect();
        bail!(
            "npm {} in {} failed: {}",
            args[0],
            dir.display(),
            reason.join("; ")
        );
    }
    Ok(())
}

pub async fn versions(dir: &Path) -> PeerVersions {
    let node = Command::new("node").arg("--version").output().await.ok();
    let lock: Option<Lock> = std::fs::read_to_string(dir.join("package-lock.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let version_of = |name: &str| {
        lock.as_ref()
            .and_then(|l| l.packages.get(&format!("node_modules/{name}")))
            .and_then(|p| p.version.clone())
    };
    PeerVersions {
        node: node.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()),
        bullmq: version_of("bullmq"),
        ioredis: version_of("ioredis"),
    }
}

/// One JSON line a peer process printed, read as `T`; `who` names the process.
fn parse_line<T: DeserializeOwned>(line: &str, who: &str) -> anyhow::Result<T> {
    serde_json::from_str(line).with_context(|| format!("{who} said {line:?}"))
}

impl Bench {
    fn node(&self, role: &str, n: u64) -> Command {
        let mut cmd = Command::new("node");
        cmd.arg("bullmq.mjs")
            .arg(role)
            .args([
                "--host",
                &self.host,
                "--port",
                &self.port.to_string(),
                "--n",
                &n.to_string(),
            ])
            .args(["--payload", &self.payload.len().to_string()])
            .current_dir(&self.peer_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        cmd
    }

    async fn produce(&self, n: u64, extra: &[String]) -> anyhow::Result<Produced> {
        let child = self
            .node("produce", n)
            .args(extra)
            .spawn()
            .context("start node")?;
        let mut lines = BufReader::new(child.stdout.expect("piped")).lines();
        let mut last = None;
        while let Some(line) = lines.next_line().await? {
            last = Some(line);
        }
        let line = last.context("the BullMQ producer printed nothing")?;
        parse_line(&line, "BullMQ producer")
    }

    /// Starts a worker expecting `n` jobs; returns once it has printed "ready".
    async fn start_worker(
        &self,
        n: u64,
    ) -> anyhow::Result<(
        Child,
        tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    )> {
        let mut child = self
            .node("work", n)
            .args([
                "--concurrency",
                &WORKER_CONCURRENCY.to_string(),
                "--timeout-ms",
                "30000",
            ])
            .spawn()
            .context("start node")?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
            Ok(Ok(Some(line))) if line == "ready" => Ok((child, lines)),
            other => bail!("the BullMQ worker did not get ready: {other:?}"),
        }
    }

    async fn worker_result(
        mut lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
        timeout: Duration,
    ) -> anyhow::Result<Worked> {
        let line = tokio::time::timeout(timeout, lines.next_line())
            .await
            .context("the BullMQ worker did not finish in time")??
            .context("the BullMQ worker printed no result")?;
        parse_line(&line, "BullMQ worker")
    }

    /// BullMQ burst: n delayed jobs due at one instant, added before the worker starts.
    pub async fn peer_burst(&self, n: u64) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let mem_before = memory::used_memory(&mut conn).await?;
        // Due after the adds should be over (assuming ≥ 5k adds/s); jobs added later
        // are due 1 ms after they were added.
        let due_at = wall_ms() + 2000 + n / 5;
        let produced = self
            .produce(n, &["--due-at".into(), due_at.to_string()])
            .await?;
        let bytes_per_pending = (memory::used_memory(&mut conn).await? - mem_before) / n as f64;
        while wall_ms() <= due_at {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let meter = CpuMeter::start(&mut conn, None).await?;
        let (_child, lines) = self.start_worker(n).await?;
        let worked =
            Self::worker_result(lines, Duration::from_secs(60) + Duration::from_millis(n)).await?;
        let cpu = meter.stop(&mut conn, n).await?;
        let probe = probe.finish()?;
        let (drain_ms, drained) = measure::drain(worked.first_ms, worked.last_ms, worked.delivered);
        Ok(Bullmq::Burst(PeerBurst {
            measured: measured(
                n,
                load,
                drained,
                &cpu,
                Some(worked.cpu()),
                &probe,
                worked.counts(),
            ),
            schedule_rate_per_sec: produced.add_rate_per_sec,
            drain_ms,
            lateness_ms: worked.lateness_ms,
            bytes_per_pending_message: bytes_per_pending.round() as i64,
            worker_concurrency: WORKER_CONCURRENCY,
        })
        .into())
    }

    /// BullMQ spread: `rate` jobs a second for `duration`, each due `SPREAD_DELAY`
    /// after it was added, with the worker already waiting.
    pub async fn peer_spread(&self, rate: u64, duration: Duration) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let total = (rate as f64 * duration.as_secs_f64()).round().max(1.0) as u64;
        let (_child, lines) = self.start_worker(total).await?;
        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let meter = CpuMeter::start(&mut conn, None).await?;
        let started = Instant::now();
        let produced = self
            .produce(
                total,
                &[
                    "--rate".into(),
                    rate.to_string(),
                    "--delay".into(),
                    SPREAD_DELAY.as_millis().to_string(),
                ],
            )
            .await?;
        let send_secs = started.elapsed().as_secs_f64();
        let worked = Self::worker_result(lines, Duration::from_secs(60)).await?;
        let cpu = meter.stop(&mut conn, total).await?;
        let probe = probe.finish()?;
        let achieved = produced
            .add_rate_per_sec
            .map_or(total as f64 / send_secs, |r| r as f64);
        let p99 = worked.lateness_ms.map(|l| l.p99 as f64);
        let kept_up = achieved >= rate as f64 * 0.95;
        Ok(Bullmq::Spread(PeerSpread {
            on_time: p99.is_some_and(|p| p < SPREAD_P99_LIMIT_MS as f64)
                && kept_up
                && worked.lost == 0,
            measured: measured(
                total,
                load,
                achieved.round() as u64,
                &cpu,
                Some(worked.cpu()),
                &probe,
                worked.counts(),
            ),
            rate_per_sec: rate,
            producer_kept_up: kept_up,
            lateness_ms: worked.lateness_ms,
            worker_concurrency: WORKER_CONCURRENCY,
        })
        .into())
    }
}
