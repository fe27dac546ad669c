//! Failover under load: two `delayq run` processes elected through etcd, a spread
//! running, and the leader stopped mid-way: by SIGTERM (a clean stop: it finishes
//! its batch and resigns, so the standby is elected at once), by SIGKILL (a crash:
//! the standby sees the leader's Redis connection close and ends its lease), by
//! SIGSTOP (a pause held until the standby leads: it finds the leader's Redis probe
//! silent), or by cutting the leader off from Redis alone (each node reaches Redis
//! through a proxy of its own; etcd stays in reach, so the leader keeps renewing its
//! lease and only the standby's judgement moves the leadership).
//!
//! Two figures: `takeover_ms`, from the signal until the standby answers `/leader`
//! with 200 (polled every 2 ms; each round's is also read by the new leader's own
//! clock, `since_ms` of `/v1/leader`, which leaves out how long the answer and the
//! bench's polling took on loaded cores), and `forwarding_gap_ms`, the longest time between two
//! consecutive stream entries while messages kept falling due every millisecond or
//! so: what a consumer sees. With several rounds, the stopped node is started again
//! as the standby and the new leader is stopped in turn; every round's takeover is
//! kept, with p50 / p99 / max over them.
//!
//! A round slower than its row's p99 target (or one with no takeover) keeps what the
//! two daemons and etcd logged from just before its stop until the takeover, in
//! `<out>/failover-slow/`: the daemons log their election, leadership and fencing
//! steps with timestamps to the microsecond, etcd its slow disk writes and requests.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use super::Bench;
use super::measure::{self, CpuMeter, PingProbe, measured, summary, tally_stream, wall_ms};
use super::rows::{Delayq, Failover, Figures, ProcessCpu};
use super::scenarios::SPREAD_DELAY;
use delayq_harness::{DelayqProcess, EtcdServer, Proxy};

const STREAM: &str = "bench:failover";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stop {
    /// A clean stop: the leader resigns.
    #[value(name = "sigterm")]
    Term,
    /// A crash: a standby finds the leader gone from Redis and ends its lease.
    #[value(name = "sigkill")]
    Kill,
    /// A pause (SIGSTOP) held until a standby leads, then SIGCONT: the woken leader
    /// finds its lease gone and stands by.
    #[value(name = "pause")]
    Pause,
    /// The leader cut off from Redis (not from etcd) until a standby leads.
    #[value(name = "redis-cut")]
    RedisCut,
}

impl Stop {
    pub fn name(self) -> &'static str {
        match self {
            Stop::Term => "sigterm",
            Stop::Kill => "sigkill",
            Stop::Pause => "pause",
            Stop::RedisCut => "redis-cut",
        }
    }

    /// Whether the stopped leader's process ends (and is started again as the
    /// standby), or lives on to stand by once the fault is undone.
    fn ends_the_process(self) -> bool {
        matches!(self, Stop::Term | Stop::Kill)
    }

    /// The p99 target of this stop's row (ms): a round slower than this keeps its
    /// logs.
    fn slow_round_ms(self) -> f64 {
        match self {
            Stop::Term => 20.0,
            Stop::Kill => 800.0,
            Stop::Pause | Stop::RedisCut => 5000.0,
        }
    }
}

/// The daemons' log filter during failover: quiet, but every step of an election,
/// a term and a stop, so that a slow round's log shows where its time went.
const HANDOVER_LOG: &str =
    "warn,delayq::election=debug,delayq::leadership=info,delayq::leader=info,delayq::daemon=info";

/// Where each log of a round stood just before its stop.
struct LogMarks {
    at: SystemTime,
    logs: Vec<(String, PathBuf, u64)>,
}

impl LogMarks {
    fn take(logs: &[(String, PathBuf)]) -> LogMarks {
        let logs = logs
            .iter()
            .map(|(name, path)| {
                let len = std::fs::metadata(path).map_or(0, |m| m.len());
                (name.clone(), path.clone(), len)
            })
            .collect();
        LogMarks {
            at: SystemTime::now(),
            logs,
        }
    }

    /// When the marks were taken (just before the stop), in ms since the epoch, to
    /// the µs.
    fn wall_ms(&self) -> f64 {
        self.at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }

    /// Writes what each log gained since the mark into `dir/<file>`, under a header
    /// naming the round; returns the file written.
    fn keep(&self, dir: &Path, file: &str, header: &str) -> std::io::Result<PathBuf> {
        use std::io::{Read, Seek, SeekFrom};
        std::fs::create_dir_all(dir)?;
        let mut text = format!(
            "{header}\nstopped at {}\n",
            humantime::format_rfc3339_micros(self.at)
        );
        for (name, path, from) in &self.logs {
            let mut gained = String::new();
            if let Ok(mut log) = std::fs::File::open(path) {
                log.seek(SeekFrom::Start(*from))?;
                log.read_to_string(&mut gained)?;
            }
            text.push_str(&format!("\n== {name} ({})\n{gained}", path.display()));
        }
        let path = dir.join(file);
        std::fs::write(&path, text)?;
        Ok(path)
    }
}

impl Bench {
    /// A spread at `rate` with the leader stopped by `stop` after `stop_after`.
    pub async fn failover(
        &self,
        etcd: &EtcdServer,
        stop: Stop,
        rate: u64,
        stop_after: Duration,
        lease_ttl: Duration,
        rounds: u32,
    ) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        // A cluster name of its own: a previous run's dead leader may still hold a lease.
        let cluster = format!("bench-{}-{}", stop.name(), wall_ms());
        let config = format!(
            "{}[etcd]\nendpoints = [\"{}\"]\ncluster = \"{cluster}\"\nlease_ttl = \"{}s\"\n",
            self.delayq_config,
            etcd.endpoint(),
            lease_ttl.as_secs()
        );
        // Each node reaches Redis through a proxy of its own, for the cut.
        let (mut cut, mut kept) = (Proxy::start().await, Proxy::start().await);
        let via = |proxy: &Proxy| {
            proxy.lead_to(&self.url);
            let through = config.replacen(&self.url, &proxy.redis_url(), 1);
            if stop == Stop::RedisCut {
                through
            } else {
                config.clone()
            }
        };
        // Over the configuration's log level, as an operator would.
        let log = [("DELAYQ_LOG_LEVEL", HANDOVER_LOG)];
        let mut leader = self
            .start_delayq_with_env("bench-a", &via(&cut), &log)
            .await?;
        let mut standby =
            DelayqProcess::start_with_env(&self.delayq_bin, "bench-b", &via(&kept), &log)?;
        let mut standby_since = Instant::now();
        let etcd_config = delayq_client::config::Config::from_toml(&config, std::iter::empty())?
            .etcd
            .ok_or_else(|| anyhow::anyhow!("the failover configuration names no etcd"))?;

        let rounds = rounds.max(1);
        let tail = match stop {
            Stop::Term => Duration::from_secs(2),
            Stop::Kill | Stop::Pause | Stop::RedisCut => lease_ttl + Duration::from_secs(2),
        };
        let per_round = settle(stop) + Duration::from_millis(300);
        let total = (rate as f64
            * (stop_after + Duration::from_secs(1) + per_round * (rounds - 1) + tail).as_secs_f64())
        .round() as u64;
        let prefix = format!("{}-", stop.name());
        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let meter = CpuMeter::start(&mut conn, None).await?;
        let producer = tokio::spawn(self.producer(STREAM, &prefix, rate, total));

        // A random offset, so the stop does not fall at the same point of the daemon's
        // periodic loops (its blocking reads, its timers) in every run.
        let jitter = Duration::from_millis(rand::random_range(0..1000));
        tokio::time::sleep(stop_after + jitter).await;
        let stopped_at_ms = self.store.now_ms().await?;
        let mut takeovers_ms = Vec::new();
        // Each round's start of leadership by the new leader's own clock (to the ms).
        let mut leds_ms: Vec<Option<f64>> = Vec::new();
        let mut old_leader_exit_ms = None;
        for round in 0..rounds {
            if round > 0 {
                // The stopped node stands by again (see `settle` for how long).
                if stop.ends_the_process() {
                    leader.restart()?;
                }
                std::mem::swap(&mut leader, &mut standby);
                std::mem::swap(&mut cut, &mut kept);
                standby_since = Instant::now();
            }
            let settled = standby_since + settle(stop);
            tokio::time::sleep(settled.saturating_duration_since(Instant::now())).await;
            // A takeover is timed from a standby that campaigns: one still starting
            // (a restart slowed by the load) would add its start to the figure.
            campaigning(&etcd_config, &standby).await?;
            let marks = LogMarks::take(&[
                (format!("{} (stopped)", leader.name), leader.log_path()),
                (
                    format!("{} (standing by)", standby.name),
                    standby.log_path(),
                ),
                ("etcd".to_owned(), etcd.log_path()),
            ]);
            let stopped_at = Instant::now();
            match stop {
                Stop::Kill => leader.kill(),
                Stop::Term => leader.signal(libc::SIGTERM),
                Stop::Pause => leader.signal(libc::SIGSTOP),
                Stop::RedisCut => cut.cut(),
            }
            let mut took = None;
            let mut exited = None;
            let give_up = stopped_at + lease_ttl + Duration::from_secs(10);
            let waiting = |took: &Option<f64>, exited: &Option<f64>| {
                took.is_none() || (stop.ends_the_process() && exited.is_none())
            };
            // Each poll of the standby: (sent, answered) in ms after the stop, and
            // whether it led; a slow round's log shows where the bench waited.
            let mut polls: Vec<(f64, f64, bool)> = Vec::new();
            let ms = |at: Instant| at.duration_since(stopped_at).as_secs_f64() * 1000.0;
            while Instant::now() < give_up && waiting(&took, &exited) {
                if took.is_none() {
                    let sent = ms(Instant::now());
                    let leads = self.leads(&standby).await;
                    let answered = ms(Instant::now());
                    polls.push((sent, answered, leads));
                    took = leads.then_some(answered);
                }
                if exited.is_none() && !leader.is_running() {
                    exited = Some(ms(Instant::now()));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            // The fault undone: the old leader finds its lease gone and stands by.
            match stop {
                Stop::Pause => leader.signal(libc::SIGCONT),
                Stop::RedisCut => cut.restore(),
                Stop::Term | Stop::Kill => {}
            }
            if round == 0 {
                old_leader_exit_ms = exited;
            }
            if took.is_some() {
                leds_ms.push(
                    self.leading_since_ms(&standby)
                        .await
                        .map(|since| since as f64 - marks.wall_ms()),
                );
            }
            if let Some(dir) = &self.slow_rounds
                && took.is_none_or(|ms| ms > stop.slow_round_ms())
            {
                let took = took.map_or("no takeover".to_owned(), |ms| format!("{ms:.1} ms"));
                let title = format!("failover by {}, round {round}: {took}", stop.name());
                let polled: Vec<String> = polls[polls.len().saturating_sub(12)..]
                    .iter()
                    .map(|(sent, answered, leads)| {
                        let said = if *leads { "leads" } else { "stands by" };
                        format!("  sent {sent:.1} ms, answered {answered:.1} ms: {said}")
                    })
                    .collect();
                let header = format!(
                    "{title}\nthe bench's last polls of {} (of {}):\n{}",
                    standby.name,
                    polls.len(),
                    polled.join("\n")
                );
                let file = format!("{cluster}-round-{round}.log");
                match marks.keep(dir, &file, &header) {
                    Ok(path) => eprintln!("bench: {title}; logs kept in {}", path.display()),
                    Err(e) => eprintln!("bench: {title}; cannot keep its logs: {e}"),
                }
            }
            takeovers_ms.push(took);
            if took.is_none() {
                break;
            }
        }
        let takeover_ms = takeovers_ms[0];
        let (dues, achieved) = producer.await??;
        let deadline = Instant::now() + SPREAD_DELAY + Duration::from_secs(30);
        self.wait_for_entries(STREAM, total, deadline).await?;
        let cpu = meter.stop(&mut conn, total).await?;
        let probe = probe.finish()?;
        if takeover_ms.is_none() {
            eprintln!(
                "failover {}: no takeover; standby log:\n{}",
                stop.name(),
                standby.log()
            );
        }
        standby.terminate(Duration::from_secs(10));
        leader.kill();
        let tally = tally_stream(&mut conn, STREAM, &prefix, total, |i| dues[i as usize]).await?;
        let round = |ms: Option<f64>| ms.map(|m| (m * 10.0).round() / 10.0);
        let takeovers_ms: Vec<Option<f64>> = takeovers_ms.into_iter().map(round).collect();
        let takeover_quantiles_ms = quantiles(&takeovers_ms);
        let led_quantiles_ms = quantiles(&leds_ms.into_iter().map(round).collect::<Vec<_>>());
        let failover = Failover {
            measured: measured(
                total,
                load,
                achieved.round() as u64,
                &cpu,
                // Two daemons shared the work: neither's CPU is the phase's.
                Some(ProcessCpu::Delayq(None)),
                &probe,
                tally.counts(),
            ),
            rate_per_sec: rate,
            lease_ttl_ms: lease_ttl.as_millis() as u64,
            takeover_ms: round(takeover_ms),
            takeovers_ms,
            takeover_quantiles_ms,
            led_quantiles_ms,
            old_leader_exit_ms: round(old_leader_exit_ms),
            forwarding_gap_ms: tally.longest_gap_ms,
            forwarding_gap_ended_after_stop_ms: tally.longest_gap_end_ms as i64
                - stopped_at_ms as i64,
            lateness_ms: summary(&tally.lateness),
        };
        Ok(match stop {
            Stop::Term => Delayq::FailoverSigterm(failover),
            Stop::Kill => Delayq::FailoverSigkill(failover),
            Stop::Pause => Delayq::FailoverPause(failover),
            Stop::RedisCut => Delayq::FailoverRedisCut(failover),
        }
        .into())
    }
}

impl Bench {
    /// When `node`'s leadership began, by its own clock (`since_ms` of
    /// `/v1/leader`, ms since the epoch); None if it does not say.
    async fn leading_since_ms(&self, node: &DelayqProcess) -> Option<u64> {
        let answer = self
            .http
            .get(node.url("/v1/leader"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        let body: serde_json::Value = answer.json().await.ok()?;
        body["since_ms"].as_u64()
    }
}

/// Waits (up to 20 s) until etcd holds `node`'s campaign (its node id is its name).
async fn campaigning(
    etcd: &delayq_client::config::EtcdConfig,
    node: &DelayqProcess,
) -> anyhow::Result<()> {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let candidates = delayq::election::candidates(etcd).await?;
        if candidates.contains(&node.name) {
            return Ok(());
        }
        if Instant::now() > give_up {
            anyhow::bail!(
                "{} is not campaigning after 20 s (candidates: {candidates:?}); its log:\n{}",
                node.name,
                node.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long a new standby stands by before its leader is stopped (and then until
/// its campaign is in etcd): a pause between rounds, in which a standby judging a
/// crash also sees the leader's presence beside its own (it judges one it has not
/// seen only once its own presence is 2 s old).
fn settle(stop: Stop) -> Duration {
    match stop {
        Stop::Kill | Stop::Term => Duration::from_millis(500),
        // A silent probe is judged against the standby's own, kept for 3 s; the
        // node that stood by after the fault must have rejoined first.
        Stop::Pause | Stop::RedisCut => Duration::from_millis(4_000),
    }
}

/// p50, p99 and max of the rounds that took over (nearest rank).
fn quantiles(takeovers: &[Option<f64>]) -> Option<[f64; 3]> {
    let mut took: Vec<f64> = takeovers.iter().flatten().copied().collect();
    if took.is_empty() {
        return None;
    }
    took.sort_by(f64::total_cmp);
    let rank = |q: f64| took[((q * took.len() as f64).ceil() as usize).clamp(1, took.len()) - 1];
    Some([rank(0.5), rank(0.99), took[took.len() - 1]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_round_holds_what_each_log_gained_after_the_mark() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (a, b) = (dir.path().join("a.log"), dir.path().join("b.log"));
        std::fs::write(&a, "before the stop\n").expect("write");
        let marks = LogMarks::take(&[
            ("a".to_owned(), a.clone()),
            ("b, not yet written".to_owned(), b.clone()),
        ]);
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(&a)
            .expect("open");
        std::io::Write::write_all(&mut log, b"after the stop\n").expect("append");
        std::fs::write(&b, "b's first line\n").expect("write");
        let kept = marks
            .keep(&dir.path().join("slow"), "round-3.log", "round 3: 25.0 ms")
            .expect("keep");
        let text = std::fs::read_to_string(kept).expect("read");
        assert!(text.starts_with("round 3: 25.0 ms\nstopped at "), "{text}");
        assert!(
            text.contains("== a (") && text.contains("after the stop"),
            "{text}"
        );
        assert!(!text.contains("before the stop"), "{text}");
        assert!(text.contains("b's first line"), "{text}");
    }

    #[test]
    fn quantiles_take_the_nearest_rank_of_the_rounds_that_took_over() {
        assert_eq!(quantiles(&[]), None);
        assert_eq!(quantiles(&[None]), None);
        assert_eq!(quantiles(&[Some(5.0)]), Some([5.0, 5.0, 5.0]));
        let rounds: Vec<Option<f64>> = (1..=20).map(|n| Some(n as f64)).collect();
        assert_eq!(quantiles(&rounds), Some([10.0, 20.0, 20.0]));
        let rounds: Vec<Option<f64>> = (1..=200).rev().map(|n| Some(n as f64)).collect();
        assert_eq!(quantiles(&rounds), Some([100.0, 198.0, 200.0]));
        assert_eq!(
            quantiles(&[Some(3.0), None, Some(1.0)]),
            Some([1.0, 3.0, 3.0])
        );
    }
}
