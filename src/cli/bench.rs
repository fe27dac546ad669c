//! `delayq bench`: forwarding throughput and lateness, measured on Redis's clock.
//!
//! Burst: N messages all due at one instant, scheduled before the forwarder starts;
//! measures how fast the backlog drains. Spread: a steady rate of messages, each due
//! a fixed delay after it was sent; measures lateness (stream entry time − due).
//! Ingest (in `ingest`): messages into delayq through batch HTTP and the inbox, and
//! single-push latency.

mod ingest;

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use hdrhistogram::Histogram;
use redis::AsyncCommands;
use serde_json::{Value, json};

use crate::config::Config;
use crate::harness::RedisServer;
use crate::message::{Due, MessageId, NewMessage};
use crate::store::{ScheduleMode, Store};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Messages in the burst scenario.
    #[arg(long, default_value_t = 100_000)]
    pub burst: u64,
    /// Messages per second in the spread scenario (0 skips it).
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// How long the spread scenario sends.
    #[arg(long, default_value = "10s", value_parser = crate::message::parse_duration)]
    pub duration: Duration,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub payload: usize,
    /// Shards (redis.shards).
    #[arg(long, default_value_t = 16)]
    pub shards: u16,
    /// Messages per forward call (forwarder.batch_size).
    #[arg(long, default_value_t = 200)]
    pub batch_size: usize,
    /// Messages in each ingest scenario (batch HTTP, inbox); 0 skips them.
    #[arg(long, default_value_t = 100_000)]
    pub ingest_messages: u64,
    /// Messages per batch request in the batch HTTP scenario (at most 5000).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=5000))]
    pub http_batch: u64,
    /// Sequential single pushes timed for latency; 0 skips it.
    #[arg(long, default_value_t = 2000)]
    pub push_latency_requests: u64,
    /// Use this Redis instead of starting one (its data under prefix "delayq-bench" is wiped).
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub async fn main(args: BenchArgs) -> anyhow::Result<()> {
    let server = match &args.redis_url {
        Some(_) => None,
        None => Some(RedisServer::start().context("start a local redis-server for the benchmark")?),
    };
    let url = args
        .redis_url
        .clone()
        .unwrap_or_else(|| server.as_ref().expect("started").url());
    let mut results = Vec::new();
    if args.burst > 0 {
        results.push(burst(&args, &url).await?);
    }
    if args.rate > 0 {
        results.push(spread(&args, &url).await?);
    }
    if args.ingest_messages > 0 {
        results.push(ingest::http_batch(&args, &url).await?);
        results.push(ingest::inbox(&args, &url).await?);
    }
    if args.push_latency_requests > 0 {
        results.push(ingest::push_latency(&args, &url).await?);
    }
    let redis_version = redis_info_field(&url, "server", "redis_version")
        .await
        .unwrap_or_default();
    let report = json!({
        "machine": { "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "redis": redis_version },
        "parameters": { "payload_bytes": args.payload, "shards": args.shards, "batch_size": args.batch_size },
        "scenarios": results,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn bench_config(args: &BenchArgs, url: &str) -> anyhow::Result<Config> {
    let text = format!(
        "[redis]\nurl = \"{url}\"\nprefix = \"delayq-bench\"\nshards = {}\n[api]\nlisten = \"127.0.0.1:0\"\nmax_batch = {}\n[forwarder]\nbatch_size = {}\n[log]\nlevel = \"warn\"\n",
        args.shards, args.http_batch, args.batch_size
    );
    Ok(Config::from_toml(&text, std::iter::empty())?)
}

async fn wipe(url: &str) -> anyhow::Result<()> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let () = redis::cmd("FLUSHDB").query_async(&mut conn).await?;
    Ok(())
}

fn message(stream: &str, payload: &str, due: Due, n: u64) -> NewMessage {
    NewMessage {
        id: MessageId::parse(&format!("b{n}")).expect("valid id"),
        stream: stream.to_owned(),
        fields: vec![("payload".to_owned(), payload.to_owned())],
        due,
        priority: 0,
        ttl: None,
    }
}

async fn burst(args: &BenchArgs, url: &str) -> anyhow::Result<Value> {
    wipe(url).await?;
    let config = bench_config(args, url)?;
    let store = Store::connect(&config.store_config()).await?;
    let payload = "x".repeat(args.payload);
    let mem_before = redis_info_field(url, "memory", "used_memory")
        .await?
        .parse::<f64>()?;
    let due_at = store.now_ms().await? + 1000;
    let started = Instant::now();
    let max_delay = config.api.limits.max_delay;
    futures::stream::iter(0..args.burst)
        .map(|n| {
            let store = store.clone();
            let msg = message("bench:burst", &payload, Due::At(due_at), n);
            async move { store.schedule(&msg, ScheduleMode::New, max_delay).await }
        })
        .buffer_unordered(256)
        .try_for_each_ok()
        .await?;
    let schedule_secs = started.elapsed().as_secs_f64();
    let mem_after = redis_info_field(url, "memory", "used_memory")
        .await?
        .parse::<f64>()?;
    let bytes_per_pending = (mem_after - mem_before) / args.burst as f64;

    // Everything is due before the forwarder starts: a pure drain.
    while store.now_ms().await? < due_at {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cpu = CpuMeter::start(url).await?;
    let forward_start_ms = store.now_ms().await?;
    let daemon = crate::start(config).await?;
    let mut conn = store.separate_connection().await?;
    loop {
        let len: u64 = conn.xlen("bench:burst").await?;
        if len >= args.burst {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let cpu = cpu.stop(args.burst).await?;
    daemon.stop().await;
    let (lateness, last_entry_ms) = entry_lateness(&store, "bench:burst", |_| due_at).await?;
    let drain_ms = last_entry_ms.saturating_sub(forward_start_ms).max(1);
    Ok(json!({
        "scenario": "burst",
        "messages": args.burst,
        "schedule_rate_per_sec": (args.burst as f64 / schedule_secs).round(),
        "drain_ms": drain_ms,
        "drain_rate_per_sec": (args.burst as f64 * 1000.0 / drain_ms as f64).round(),
        "lateness_ms": summary(&lateness),
        "bytes_per_pending_message": bytes_per_pending.round(),
        "cpu_us_per_message": cpu,
    }))
}

async fn spread(args: &BenchArgs, url: &str) -> anyhow::Result<Value> {
    wipe(url).await?;
    let config = bench_config(args, url)?;
    let store = Store::connect(&config.store_config()).await?;
    let daemon = crate::start(config.clone()).await?;
    let payload = "x".repeat(args.payload);
    let delay = Duration::from_millis(500);
    let total = args.rate * args.duration.as_secs().max(1);
    let cpu = CpuMeter::start(url).await?;
    // One tick per millisecond; each sends its share so the rate holds on average.
    let started = Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let max_delay = config.api.limits.max_delay;
    let mut inflight = futures::stream::FuturesUnordered::new();
    while sent < total {
        tick.tick().await;
        let target = ((started.elapsed().as_secs_f64() * args.rate as f64) as u64).min(total);
        while sent < target {
            let store = store.clone();
            let mut msg = message("bench:spread", &payload, Due::In(delay), sent);
            msg.fields.push(("sent".to_owned(), String::new()));
            inflight.push(async move {
                // The due time is resolved by Redis; stamp it into the message by scheduling
                // it as an absolute time computed from Redis's clock just before.
                let now = store.now_ms().await?;
                let due = now + delay.as_millis() as u64;
                msg.due = Due::At(due);
                msg.fields.last_mut().expect("pushed").1 = due.to_string();
                store
                    .schedule(&msg, ScheduleMode::New, max_delay)
                    .await
                    .map(|_| ())
            });
            sent += 1;
        }
        while let Some(Some(done)) = futures::FutureExt::now_or_never(inflight.next()) {
            done?;
        }
    }
    while let Some(done) = inflight.next().await {
        done?;
    }
    let send_secs = started.elapsed().as_secs_f64();
    let mut conn = store.separate_connection().await?;
    let deadline = Instant::now() + delay + Duration::from_secs(30);
    loop {
        let len: u64 = conn.xlen("bench:spread").await?;
        if len >= total || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cpu = cpu.stop(total).await?;
    daemon.stop().await;
    let (lateness, _) = entry_lateness(&store, "bench:spread", |fields| {
        fields.get("sent").and_then(|s| s.parse().ok()).unwrap_or(0)
    })
    .await?;
    Ok(json!({
        "scenario": "spread",
        "messages": total,
        "delivered": lateness.len(),
        "rate_per_sec": args.rate,
        "achieved_send_rate_per_sec": (total as f64 / send_secs).round(),
        "lateness_ms": summary(&lateness),
        "cpu_us_per_message": cpu,
    }))
}

/// Lateness of every entry of a stream (entry ms − due ms), and the last entry's ms.
async fn entry_lateness(
    store: &Store,
    stream: &str,
    due_of: impl Fn(&std::collections::HashMap<String, String>) -> u64,
) -> anyhow::Result<(Histogram<u64>, u64)> {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000, 3)?;
    let mut conn = store.separate_connection().await?;
    let mut start = "-".to_owned();
    let mut last_ms = 0;
    loop {
        let reply: redis::streams::StreamRangeReply =
            conn.xrange_count(stream, &start, "+", 10_000).await?;
        if reply.ids.is_empty() {
            break;
        }
        for entry in &reply.ids {
            let ms: u64 = entry.id.split('-').next().unwrap_or("0").parse()?;
            let fields: std::collections::HashMap<String, String> = entry
                .map
                .iter()
                .filter_map(|(k, v)| {
                    redis::from_redis_value_ref::<String>(v)
                        .ok()
                        .map(|v| (k.clone(), v))
                })
                .collect();
            hist.record(ms.saturating_sub(due_of(&fields)).max(1))?;
            last_ms = last_ms.max(ms);
        }
        let last = &reply.ids.last().expect("not empty").id;
        start = format!("({last}");
    }
    Ok((hist, last_ms))
}

fn summary(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return json!(null);
    }
    json!({
        "p50": h.value_at_quantile(0.5),
        "p99": h.value_at_quantile(0.99),
        "p99_9": h.value_at_quantile(0.999),
        "max": h.max(),
    })
}

async fn redis_info_field(url: &str, section: &str, field: &str) -> anyhow::Result<String> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await?;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .with_context(|| format!("INFO {section} has no {field}"))
}

/// Redis's and this process's CPU time over a scenario.
struct CpuMeter {
    url: String,
    redis_start: f64,
    self_start: f64,
}

fn own_cpu_secs() -> f64 {
    // SAFETY: getrusage fills the struct we hand it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

async fn redis_cpu_secs(url: &str) -> anyhow::Result<f64> {
    let user: f64 = redis_info_field(url, "cpu", "used_cpu_user")
        .await?
        .parse()?;
    let sys: f64 = redis_info_field(url, "cpu", "used_cpu_sys")
        .await?
        .parse()?;
    Ok(user + sys)
}

impl CpuMeter {
    async fn start(url: &str) -> anyhow::Result<Self> {
        Ok(CpuMeter {
            url: url.to_owned(),
            redis_start: redis_cpu_secs(url).await?,
            self_start: own_cpu_secs(),
        })
    }

    async fn stop(self, messages: u64) -> anyhow::Result<Value> {
        let redis = redis_cpu_secs(&self.url).await? - self.redis_start;
        let own = own_cpu_secs() - self.self_start;
        let per = |secs: f64| (secs * 1e6 / messages.max(1) as f64 * 10.0).round() / 10.0;
        Ok(json!({ "redis": per(redis), "delayq": per(own) }))
    }
}

trait TryForEachOk {
    async fn try_for_each_ok(self) -> anyhow::Result<()>;
}

impl<S, T, E> TryForEachOk for S
where
    S: futures::Stream<Item = Result<T, E>> + Unpin,
    E: Into<anyhow::Error>,
{
    async fn try_for_each_ok(mut self) -> anyhow::Result<()> {
        while let Some(item) = self.next().await {
            item.map_err(Into::into)?;
        }
        Ok(())
    }
}

fn print_table(report: &Value) {
    println!(
        "delayq bench: {} cores, Redis {}, payload {} B, {} shards, batch {}",
        report["machine"]["cores"],
        report["machine"]["redis"].as_str().unwrap_or("?"),
        report["parameters"]["payload_bytes"],
        report["parameters"]["shards"],
        report["parameters"]["batch_size"]
    );
    println!();
    println!(
        "| scenario | messages | throughput (msg/s) | lateness p50 / p99 / p99.9 / max (ms) | bytes/pending msg | CPU µs/msg Redis / delayq |"
    );
    println!("|---|---|---|---|---|---|");
    let (ingest, forwarding): (Vec<&Value>, Vec<&Value>) = report["scenarios"]
        .as_array()
        .into_iter()
        .flatten()
        .partition(|s| !matches!(s["scenario"].as_str(), Some("burst" | "spread")));
    for s in forwarding {
        let l = &s["lateness_ms"];
        let throughput = if s["scenario"] == "burst" {
            format!("{} drained", s["drain_rate_per_sec"])
        } else {
            format!("{} sent", s["achieved_send_rate_per_sec"])
        };
        println!(
            "| {} | {} | {} | {} / {} / {} / {} | {} | {} / {} |",
            s["scenario"].as_str().unwrap_or("?"),
            s["messages"],
            throughput,
            l["p50"],
            l["p99"],
            l["p99_9"],
            l["max"],
            s.get("bytes_per_pending_message")
                .map_or("-".to_owned(), |v| v.to_string()),
            s["cpu_us_per_message"]["redis"],
            s["cpu_us_per_message"]["delayq"],
        );
    }
    ingest::print_table(&ingest);
}
