//! What a scenario measures besides its own clock: CPU time of Redis and of the
//! process doing the work, Redis memory, how long Redis stopped answering (a PING
//! probe on a connection of its own, and Redis's latency monitor), and what reached
//! a stream (lateness, lost, duplicated).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use hdrhistogram::Histogram;
use redis::Value;
use redis::aio::MultiplexedConnection;

use super::rows::{Counts, Cpu, Lateness, Measured, ProcessCpu, ScriptCalls};
use delayq_client::store::info_value;

/// Wall clock in epoch milliseconds: the clock Redis's `TIME` and node's `Date.now()`
/// read on this machine, so figures from all three compare.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One field of `INFO <section>`.
pub async fn info_field(
    conn: &mut MultiplexedConnection,
    section: &str,
    field: &str,
) -> anyhow::Result<String> {
    let info: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
    info_value(&info, field)
        .map(str::to_owned)
        .with_context(|| format!("INFO {section} has no {field}"))
}

async fn redis_cpu_secs(conn: &mut MultiplexedConnection) -> anyhow::Result<f64> {
    // Both from one INFO, so they describe the same instant.
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let secs = |field| -> anyhow::Result<f64> {
        Ok(info_value(&info, field)
            .with_context(|| format!("INFO cpu has no {field}"))?
            .parse()?)
    };
    Ok(secs("used_cpu_user")? + secs("used_cpu_sys")?)
}

/// Script calls (`EVAL`, `EVALSHA`, `FCALL` and their read-only forms) Redis has
/// run since it started or its stats were last reset, their µs (nested commands
/// included), and the µs of every other command but the bench's own (`INFO`,
/// `CONFIG`, `PING`, ...): the scripts' nested commands and delayq's few direct
/// ones, so an upper bound of what the scripts' commands took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScriptTotals {
    pub calls: u64,
    pub usec: u64,
    pub other_usec: u64,
}

async fn script_totals(conn: &mut MultiplexedConnection) -> anyhow::Result<ScriptTotals> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(scripts_in(&info))
}

/// The script calls, their µs and the other commands' µs in `INFO commandstats`
/// text; lines it does not understand count nothing.
fn scripts_in(info: &str) -> ScriptTotals {
    const SCRIPTS: [&str; 6] = [
        "eval",
        "evalsha",
        "eval_ro",
        "evalsha_ro",
        "fcall",
        "fcall_ro",
    ];
    /// What the bench itself asks while it measures, and script loading.
    const NOT_COUNTED: [&str; 9] = [
        "info", "config", "ping", "latency", "slowlog", "client", "memory", "function", "dbsize",
    ];
    let n = |v: &str| v.parse::<u64>().unwrap_or(0);
    let mut totals = ScriptTotals::default();
    for line in info.lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|rest| rest.split_once(':'))
        else {
            continue;
        };
        let script = SCRIPTS.contains(&name);
        let family = name.split('|').next().unwrap_or(name);
        if !script && NOT_COUNTED.contains(&family) {
            continue;
        }
        for pair in stats.trim().split(',') {
            match (pair.split_once('='), script) {
                (Some(("calls", v)), true) => totals.calls = totals.calls.saturating_add(n(v)),
                (Some(("usec", v)), true) => totals.usec = totals.usec.saturating_add(n(v)),
                (Some(("usec", v)), false) => {
                    totals.other_usec = totals.other_usec.saturating_add(n(v))
                }
                _ => {}
            }
        }
    }
    totals
}

/// User + system CPU seconds a live process has used, from `/proc/<pid>/stat`.
pub fn process_cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after its ')' are plain.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after ')'.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / per_sec.max(1.0))
}

/// CPU of Redis and of one worker process over a phase, and the longest Redis event
/// its latency monitor saw (`latency-monitor-threshold` is 1 ms on the bench Redis).
pub struct CpuMeter {
    redis_start: f64,
    /// Script calls and their µs so far (see [`script_totals`]).
    scripts_start: ScriptTotals,
    /// The processes doing the work beside Redis (their CPU is summed).
    worker_pids: Vec<u32>,
    worker_start: f64,
    /// The machine's CPU time so far, for the share the hypervisor took.
    host_start: Option<HostCpu>,
}

impl CpuMeter {
    pub async fn start(
        conn: &mut MultiplexedConnection,
        worker_pid: Option<u32>,
    ) -> anyhow::Result<Self> {
        let _: i64 = redis::cmd("LATENCY").arg("RESET").query_async(conn).await?;
        Ok(CpuMeter {
            redis_start: redis_cpu_secs(conn).await?,
            scripts_start: script_totals(conn).await?,
            worker_pids: worker_pid.into_iter().collect(),
            worker_start: worker_pid.and_then(process_cpu_secs).unwrap_or(0.0),
            host_start: HostCpu::now(),
        })
    }

    /// Counts a process that started after `start` in full, from its first tick.
    pub fn attach_new_process(&mut self, pid: Option<u32>) {
        self.worker_pids = pid.into_iter().collect();
        self.worker_start = 0.0;
    }

    /// Counts the processes `pids`, already running, from now on.
    pub fn attach_processes(&mut self, pids: &[u32]) {
        self.worker_pids = pids.to_vec();
        self.worker_start = pids.iter().filter_map(|p| process_cpu_secs(*p)).sum();
    }

    /// Redis and worker CPU µs per message, and the longest Redis event in ms.
    pub async fn stop(
        self,
        conn: &mut MultiplexedConnection,
        messages: u64,
    ) -> anyhow::Result<PhaseCpu> {
        let worker = (!self.worker_pids.is_empty()).then(|| {
            let now: f64 = self
                .worker_pids
                .iter()
                .filter_map(|p| process_cpu_secs(*p))
                .sum();
            now - self.worker_start
        });
        let redis = redis_cpu_secs(conn).await? - self.redis_start;
        let scripts = script_calls(self.scripts_start, script_totals(conn).await?, messages);
        let latest: Value = redis::cmd("LATENCY")
            .arg("LATEST")
            .query_async(conn)
            .await?;
        let mut longest_event_ms = 0u64;
        if let Value::Array(events) = latest {
            for event in events {
                if let Value::Array(parts) = event
                    && let Some(Value::Int(max)) = parts.get(3)
                {
                    longest_event_ms = longest_event_ms.max(*max as u64);
                }
            }
        }
        let per = |secs: f64| per_message_us(secs, messages);
        Ok(PhaseCpu {
            redis_us: per(redis),
            worker_us: worker.map(per),
            longest_event_ms,
            scripts,
            stolen_percent: self.host_start.and_then(HostCpu::stolen_since_now),
        })
    }
}

/// Script calls a message, and µs each (split into other commands' µs and the
/// rest), between two readings of [`script_totals`]; None when there were none,
/// or the stats were reset between.
fn script_calls(start: ScriptTotals, end: ScriptTotals, messages: u64) -> Option<ScriptCalls> {
    let calls = end.calls.checked_sub(start.calls).filter(|&c| c > 0)?;
    let usec = end.usec.checked_sub(start.usec)?;
    let other = end.other_usec.checked_sub(start.other_usec)?;
    let each = |us: u64| (us as f64 / calls as f64 * 10.0).round() / 10.0;
    let (us_each, us_commands) = (each(usec), each(other.min(usec)));
    Some(ScriptCalls {
        per_message: significant(calls as f64 / messages.max(1) as f64, 3),
        us_each,
        us_commands,
        us_rest: ((us_each - us_commands).max(0.0) * 10.0).round() / 10.0,
    })
}

/// `x` (positive) to `digits` significant digits: a batch's few calls a message
/// (0.002) must not round to none.
fn significant(x: f64, digits: i32) -> f64 {
    let places = digits - x.log10().ceil() as i32;
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

pub fn per_message_us(secs: f64, messages: u64) -> f64 {
    (secs * 1e6 / messages.max(1) as f64 * 10.0).round() / 10.0
}

pub struct PhaseCpu {
    pub redis_us: f64,
    pub worker_us: Option<f64>,
    pub longest_event_ms: u64,
    /// None where not measured (Redis Cluster's masters).
    pub scripts: Option<ScriptCalls>,
    /// The share (%) of the machine's CPU time the hypervisor took meanwhile.
    pub stolen_percent: Option<f64>,
}

/// The machine's CPU time so far, all cores (`/proc/stat`'s `cpu` line), and what
/// of it the hypervisor gave to others while this machine wanted to run
/// (`steal`), in ticks. Figures taken while much is stolen measure the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostCpu {
    total: u64,
    stolen: u64,
}

impl HostCpu {
    /// Now; None where `/proc/stat` cannot be read.
    pub fn now() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The first line of a `/proc/stat` text: `cpu` and at least eight counts
    /// (user, nice, system, idle, iowait, irq, softirq, steal).
    fn parse(stat: &str) -> Option<Self> {
        let mut fields = stat.lines().next()?.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks = fields
            .take(8)
            .map(|f| f.parse::<u64>().ok())
            .collect::<Option<Vec<_>>>()?;
        if ticks.len() < 8 {
            return None;
        }
        Some(HostCpu {
            total: ticks.iter().try_fold(0u64, |sum, &t| sum.checked_add(t))?,
            stolen: ticks[7],
        })
    }

    /// The share (%, to 0.1) of the CPU time between `self` and `later` that was
    /// stolen; None when no time passed or the counts went back.
    fn stolen_until(self, later: HostCpu) -> Option<f64> {
        let total = later.total.checked_sub(self.total).filter(|&t| t > 0)?;
        let stolen = later.stolen.checked_sub(self.stolen)?.min(total);
        Some((stolen as f64 * 1000.0 / total as f64).round() / 10.0)
    }

    /// [`HostCpu::stolen_until`] now.
    pub fn stolen_since_now(self) -> Option<f64> {
        self.stolen_until(Self::now()?)
    }
}

/// A drain from its first entry (ms) to its last: how long it took (at least
/// 1 ms) and how many `entries` a second that is.
pub fn drain(first_ms: u64, last_ms: u64, entries: u64) -> (u64, u64) {
    let drain_ms = last_ms.saturating_sub(first_ms).max(1);
    let rate = (entries as f64 * 1000.0 / drain_ms as f64).round() as u64;
    (drain_ms, rate)
}

/// [`measured`] for a phase in which delayq's daemon did the work beside Redis.
pub fn measured_delayq(
    messages: u64,
    load_average: String,
    throughput_per_sec: u64,
    cpu: &PhaseCpu,
    probe: &Probe,
    tally: Counts,
) -> Measured {
    let process = Some(ProcessCpu::Delayq(cpu.worker_us));
    measured(
        messages,
        load_average,
        throughput_per_sec,
        cpu,
        process,
        probe,
        tally,
    )
}

/// The figures every row shares, from a phase's meters; `process` is the CPU of
/// whichever process did the work beside Redis.
pub fn measured(
    messages: u64,
    load_average: String,
    throughput_per_sec: u64,
    cpu: &PhaseCpu,
    process: Option<ProcessCpu>,
    probe: &Probe,
    tally: Counts,
) -> Measured {
    Measured {
        messages,
        load_average,
        throughput_per_sec,
        cpu_us_per_message: Cpu {
            redis: cpu.redis_us,
            process,
            scripts: cpu.scripts.clone(),
            bench: None,
        },
        redis_unresponsive_ms: probe.longest_overall_ms(),
        redis_longest_event_ms: cpu.longest_event_ms,
        cpu_stolen_percent: cpu.stolen_percent,
        tally,
    }
}

/// Sends PING on a connection of its own once a millisecond, on a thread of its own
/// (so a busy async runtime does not delay it), and keeps every round trip.
pub struct PingProbe {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<anyhow::Result<Vec<(u64, u32)>>>,
}

impl PingProbe {
    pub fn start(url: &str) -> anyhow::Result<Self> {
        let mut conn = redis::Client::open(url)?.get_connection()?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bench-ping-probe".into())
            .spawn(move || {
                let mut samples = Vec::new();
                // At least one sample, however early the probe is stopped.
                loop {
                    let at = wall_ms();
                    let sent = Instant::now();
                    let _: String = redis::cmd("PING").query(&mut conn)?;
                    let rtt = sent.elapsed();
                    samples.push((at, rtt.as_micros().min(u32::MAX as u128) as u32));
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Some(rest) = Duration::from_millis(1).checked_sub(rtt) {
                        std::thread::sleep(rest);
                    }
                }
                Ok(samples)
            })?;
        Ok(PingProbe { stop, thread })
    }

    pub fn finish(self) -> anyhow::Result<Probe> {
        self.stop.store(true, Ordering::Relaxed);
        let samples = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the PING probe thread panicked"))??;
        Ok(Probe { samples })
    }
}

/// PING round trips: (wall ms when sent, µs until the answer).
#[derive(Default)]
pub struct Probe {
    samples: Vec<(u64, u32)>,
}

impl Probe {
    /// No probe ran (a row whose Redis CPU the probe's own PINGs would swamp).
    pub fn none() -> Probe {
        Probe {
            samples: Vec::new(),
        }
    }

    /// The longest round trip of a PING sent between two wall-clock times, in ms,
    /// rounded up to a tenth (a round trip is never shown as 0).
    pub fn longest_ms(&self, from_ms: u64, to_ms: u64) -> f64 {
        let us = self
            .samples
            .iter()
            .filter(|(at, _)| *at >= from_ms && *at <= to_ms)
            .map(|(_, rtt)| *rtt)
            .max()
            .unwrap_or(0);
        (us as f64 / 100.0).ceil() / 10.0
    }

    pub fn longest_overall_ms(&self) -> f64 {
        self.longest_ms(0, u64::MAX)
    }
}

/// What reached a stream, checked against what was sent: ids are
/// `<prefix><n>` for n in 0..expected, read from the `delayq-id` field.
pub struct Tally {
    pub lateness: Histogram<u64>,
    pub entries: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub unexpected: u64,
    pub first_ms: u64,
    pub last_ms: u64,
    /// The longest time between two consecutive entries, with the wall-clock ms
    /// (Redis's) at which it ended: during a steady spread, how long forwarding stopped.
    pub longest_gap_ms: u64,
    pub longest_gap_end_ms: u64,
}

impl Tally {
    pub fn counts(&self) -> Counts {
        Counts {
            delivered: self.entries - self.duplicated - self.unexpected,
            lost: self.lost,
            duplicated: self.duplicated,
            unexpected: Some(self.unexpected),
            refused: None,
        }
    }
}

/// Reads a whole stream and tallies it. `due_of(n)` is message n's due time (Redis ms).
pub async fn tally_stream(
    conn: &mut MultiplexedConnection,
    stream: &str,
    id_prefix: &str,
    expected: u64,
    due_of: impl Fn(u64) -> u64,
) -> anyhow::Result<Tally> {
    tally_streams(conn, &[stream], id_prefix, expected, due_of).await
}

/// [`tally_stream`] over several streams, the messages sent spread over them.
pub async fn tally_streams(
    conn: &mut impl redis::aio::ConnectionLike,
    streams: &[&str],
    id_prefix: &str,
    expected: u64,
    due_of: impl Fn(u64) -> u64,
) -> anyhow::Result<Tally> {
    let mut seen = vec![0u8; expected as usize];
    let mut tally = Tally {
        lateness: Histogram::new_with_bounds(1, 24 * 3_600_000, 3)?,
        entries: 0,
        lost: 0,
        duplicated: 0,
        unexpected: 0,
        first_ms: u64::MAX,
        last_ms: 0,
        longest_gap_ms: 0,
        longest_gap_end_ms: 0,
    };
    for stream in streams {
        let mut start = "-".to_owned();
        loop {
            let reply: Value = redis::cmd("XRANGE")
                .arg(stream)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(10_000)
                .query_async(conn)
                .await?;
            let Value::Array(items) = reply else {
                anyhow::bail!("XRANGE {stream}: unexpected reply {reply:?}")
            };
            if items.is_empty() {
                break;
            }
            for item in &items {
                let Value::Array(parts) = item else { continue };
                let (Some(id), Some(Value::Array(fields))) = (parts.first(), parts.get(1)) else {
                    continue;
                };
                let id: String = redis::from_redis_value_ref(id)?;
                let ms: u64 = id.split('-').next().unwrap_or("0").parse()?;
                if tally.entries > 0 && ms.saturating_sub(tally.last_ms) > tally.longest_gap_ms {
                    tally.longest_gap_ms = ms - tally.last_ms;
                    tally.longest_gap_end_ms = ms;
                }
                tally.entries += 1;
                tally.first_ms = tally.first_ms.min(ms);
                tally.last_ms = tally.last_ms.max(ms);
                start = format!("({id}");
                let n = fields
                    .chunks(2)
                    .find(|p| matches!(&p[0], Value::BulkString(b) if b == b"delayq-id"))
                    .and_then(|p| redis::from_redis_value_ref::<String>(&p[1]).ok())
                    .and_then(|v| {
                        v.strip_prefix(id_prefix)
                            .and_then(|n| n.parse::<u64>().ok())
                    })
                    .filter(|n| *n < expected);
                match n {
                    Some(n) if seen[n as usize] == 0 => {
                        seen[n as usize] = 1;
                        tally.lateness.record(ms.saturating_sub(due_of(n)))?;
                    }
                    Some(_) => tally.duplicated += 1,
                    None => tally.unexpected += 1,
                }
            }
        }
    }
    tally.lost = seen.iter().filter(|s| **s == 0).count() as u64;
    if tally.entries == 0 {
        tally.first_ms = 0;
    }
    Ok(tally)
}

/// p50, p99, p99.9 and max of a lateness histogram, in ms (none when empty).
pub fn summary(h: &Histogram<u64>) -> Option<Lateness> {
    // The histogram's bound (a day) keeps every value well within i64.
    let ms = |v: u64| v as i64;
    (!h.is_empty()).then(|| Lateness {
        p50: ms(h.value_at_quantile(0.5)),
        p99: ms(h.value_at_quantile(0.99)),
        p99_9: ms(h.value_at_quantile(0.999)),
        max: ms(h.max()),
    })
}

/// How many times over the machine is busy: its 1-minute load average per CPU, at
/// least 1 (1 when it cannot be read). Waits that must outlast work on a busy
/// machine (a burst's load before it falls due) are stretched by it.
pub fn busy_factor() -> f64 {
    let load = load_average()
        .split_whitespace()
        .next()
        .and_then(|one| one.parse::<f64>().ok())
        .unwrap_or(0.0);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    (load / cpus).max(1.0)
}

/// The 1-, 5- and 15-minute load averages, as `uptime` prints them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
