//! The peer: BullMQ delayed jobs on the same Redis, same N and payload, driven by
//! `bench/peer/bullmq.mjs` (versions pinned in `bench/peer/package-lock.json`,
//! installed on first use). Producer and worker are separate node
//! processes; the worker reports its own CPU and lateness (see the script's header).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value as Json, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::Bench;
use super::measure::{self, CpuMeter, PingProbe, wall_ms};
use super::scenarios::{SPREAD_DELAY, SPREAD_P99_LIMIT_MS};

/// Jobs the worker runs at once: BullMQ's own advice for I/O-bound work, and far
/// above what a no-op processor needs to keep Redis busy.
pub const WORKER_CONCURRENCY: u32 = 100;

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
    let read = |path: &str| -> anyhow::Result<Json> {
        let text =
            std::fs::read_to_string(dir.join(path)).with_context(|| format!("read {path}"))?;
        Ok(serde_json::from_str(&text)?)
    };
    let pinned = read("package.json")?["dependencies"]["bullmq"].clone();
    let installed = read("node_modules/bullmq/package.json")?["version"].clone();
    if pinned != installed {
        bail!(
            "BullMQ {installed} is installed in {}, not the pinned {pinned}; remove node_modules there",
            dir.display()
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

pub async fn versions(dir: &Path) -> Json {
    let node = Command::new("node").arg("--version").output().await.ok();
    let lock: Option<Json> = std::fs::read_to_string(dir.join("package-lock.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let version_of = |name: &str| {
        lock.as_ref().and_then(|l| {
            l["packages"][format!("node_modules/{name}")]["version"]
                .as_str()
                .map(str::to_owned)
        })
    };
    json!({
        "node": node.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()),
        "bullmq": version_of("bullmq"),
        "ioredis": version_of("ioredis"),
    })
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

    async fn produce(&self, n: u64, extra: &[String]) -> anyhow::Result<Json> {
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
        serde_json::from_str(&line).with_context(|| format!("BullMQ producer said {line:?}"))
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
    ) -> anyhow::Result<Json> {
        let line = tokio::time::timeout(timeout, lines.next_line())
            .await
            .context("the BullMQ worker did not finish in time")??
            .context("the BullMQ worker printed no result")?;
        serde_json::from_str(&line).with_context(|| format!("BullMQ worker said {line:?}"))
    }

    /// BullMQ burst: n delayed jobs due at one instant, added before the worker starts.
    pub async fn peer_burst(&self, n: u64) -> anyhow::Result<Json> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let mem_before = measure::used_memory(&mut conn).await?;
        // Due after the adds should be over (assuming ≥ 5k adds/s); jobs added later
        // are due 1 ms after they were added.
        let due_at = wall_ms() + 2000 + n / 5;
        let produced = self
            .produce(n, &["--due-at".into(), due_at.to_string()])
            .await?;
        let bytes_per_pending = (measure::used_memory(&mut conn).await? - mem_before) / n as f64;
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
        let first = worked["first_ms"].as_u64().unwrap_or(0);
        let last = worked["last_ms"].as_u64().unwrap_or(0);
        let drain_ms = last.saturating_sub(first).max(1);
        let delivered = worked["delivered"].as_u64().unwrap_or(0);
        Ok(json!({
            "system": "bullmq",
            "scenario": "burst",
            "messages": n,
            "load_average": load,
            "schedule_rate_per_sec": produced["add_rate_per_sec"],
            "drain_ms": drain_ms,
            "throughput_per_sec": (delivered as f64 * 1000.0 / drain_ms as f64).round() as u64,
            "lateness_ms": worked["lateness_ms"],
            "cpu_us_per_message": { "redis": cpu.redis_us, "worker": round1(&worked["cpu_us_per_message"]) },
            "redis_unresponsive_ms": probe.longest_overall_ms(),
            "redis_longest_event_ms": cpu.longest_event_ms,
            "bytes_per_pending_message": bytes_per_pending.round() as i64,
            "tally": { "delivered": delivered, "lost": worked["lost"], "duplicated": worked["duplicated"], "unexpected": worked["unexpected"] },
            "worker_concurrency": WORKER_CONCURRENCY,
        }))
    }

    /// BullMQ spread: `rate` jobs a second for `duration`, each due `SPREAD_DELAY`
    /// after it was added, with the worker already waiting.
    pub async fn peer_spread(&self, rate: u64, duration: Duration) -> anyhow::Result<Json> {
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
        let achieved = produced["add_rate_per_sec"]
            .as_f64()
            .unwrap_or(total as f64 / send_secs);
        let p99 = worked["lateness_ms"]["p99"].as_f64();
        let lost = worked["lost"].as_u64().unwrap_or(total);
        Ok(json!({
            "system": "bullmq",
            "scenario": "spread",
            "messages": total,
            "load_average": load,
            "rate_per_sec": rate,
            "throughput_per_sec": achieved.round() as u64,
            "on_time": p99.is_some_and(|p| p < SPREAD_P99_LIMIT_MS as f64) && achieved >= rate as f64 * 0.95 && lost == 0,
            "producer_kept_up": achieved >= rate as f64 * 0.95,
            "lateness_ms": worked["lateness_ms"],
            "cpu_us_per_message": { "redis": cpu.redis_us, "worker": round1(&worked["cpu_us_per_message"]) },
            "redis_unresponsive_ms": probe.longest_overall_ms(),
            "redis_longest_event_ms": cpu.longest_event_ms,
            "tally": { "delivered": worked["delivered"], "lost": worked["lost"], "duplicated": worked["duplicated"], "unexpected": worked["unexpected"] },
            "worker_concurrency": WORKER_CONCURRENCY,
        }))
    }
}

fn round1(v: &Json) -> Json {
    v.as_f64()
        .map_or(Json::Null, |x| json!((x * 10.0).round() / 10.0))
}
