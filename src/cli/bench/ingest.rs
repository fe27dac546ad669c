//! Ingest scenarios of `delayq bench`: how fast messages get *into* delayq, through
//! the batch HTTP endpoint and through the inbox stream, and the latency of a single
//! HTTP push. Messages are due in an hour, so no forwarding competes.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde_json::{Value, json};

use super::{BenchArgs, CpuMeter, bench_config, wipe};
use crate::store::Store;

/// Batch requests in flight at once.
const HTTP_CONCURRENCY: usize = 4;
/// Inbox entries XADDed per pipeline round trip by the producer.
const XADD_PIPELINE: usize = 1000;

/// Messages pending in all shards.
async fn pending(store: &Store) -> anyhow::Result<u64> {
    Ok(store.pending_per_shard().await?.iter().sum())
}

async fn wait_pending(store: &Store, n: u64, patience: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + patience;
    while pending(store).await? < n {
        if Instant::now() > deadline {
            bail!(
                "only {} of {n} messages scheduled after {patience:?}",
                pending(store).await?
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// N messages through `POST /v1/messages/batch`, `HTTP_CONCURRENCY` requests at a time.
pub(super) async fn http_batch(args: &BenchArgs, url: &str) -> anyhow::Result<Value> {
    wipe(url).await?;
    let config = bench_config(args, url)?;
    let store = Store::connect(&config.store_config()).await?;
    let daemon = crate::start(config).await?;
    let endpoint = format!("http://{}/v1/messages/batch", daemon.api_addr);
    let payload = "x".repeat(args.payload);
    // Bodies are built before the clock starts: the client's JSON work is not delayq's.
    let bodies: Vec<String> = (0..args.ingest_messages)
        .collect::<Vec<_>>()
        .chunks(args.http_batch as usize)
        .map(|chunk| {
            let messages: Vec<Value> = chunk
                .iter()
                .map(|n| json!({ "stream": "bench:ingest", "payload": payload, "delay": "1h", "id": format!("h{n}") }))
                .collect();
            json!({ "messages": messages }).to_string()
        })
        .collect();
    let http = reqwest::Client::new();
    let cpu = CpuMeter::start(url).await?;
    let started = Instant::now();
    let mut responses = futures::stream::iter(bodies)
        .map(|body| {
            let request = http
                .post(&endpoint)
                .header("content-type", "application/json")
                .body(body);
            async move {
                let resp = request.send().await?;
                let status = resp.status();
                let answer: Value = resp.json().await?;
                anyhow::Ok((status, answer))
            }
        })
        .buffer_unordered(HTTP_CONCURRENCY);
    while let Some(result) = responses.next().await {
        let (status, answer) = result?;
        if !status.is_success() || answer["failed"].as_u64() != Some(0) {
            bail!("batch refused: {status} {answer}");
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu.stop(args.ingest_messages).await?;
    let stored = pending(&store).await?;
    daemon.stop().await;
    if stored != args.ingest_messages {
        bail!("{stored} of {} messages stored", args.ingest_messages);
    }
    Ok(json!({
        "scenario": "ingest-http-batch",
        "messages": args.ingest_messages,
        "batch": args.http_batch,
        "concurrency": HTTP_CONCURRENCY,
        "rate_per_sec": (args.ingest_messages as f64 / secs).round(),
        "cpu_us_per_message": cpu,
    }))
}

/// N entries XADDed into the inbox (pipelined), timed until every one is scheduled.
pub(super) async fn inbox(args: &BenchArgs, url: &str) -> anyhow::Result<Value> {
    wipe(url).await?;
    let config = bench_config(args, url)?;
    let inbox = config
        .inbox
        .clone()
        .context("the inbox is enabled in the bench config")?;
    let store = Store::connect(&config.store_config()).await?;
    let daemon = crate::start(config).await?;
    let payload = "x".repeat(args.payload);
    let mut producer = store.separate_connection().await?;
    let cpu = CpuMeter::start(url).await?;
    let started = Instant::now();
    let total = args.ingest_messages;
    let produce = async {
        let mut sent = 0;
        while sent < total {
            let mut pipe = redis::pipe();
            let n = (total - sent).min(XADD_PIPELINE as u64);
            for _ in 0..n {
                pipe.cmd("XADD")
                    .arg(&inbox.stream)
                    .arg("*")
                    .arg("delayq-stream")
                    .arg("bench:inbox")
                    .arg("delayq-delay")
                    .arg("1h")
                    .arg("payload")
                    .arg(&payload)
                    .ignore();
            }
            let () = pipe.query_async(&mut producer).await?;
            sent += n;
        }
        anyhow::Ok(started.elapsed())
    };
    let (produced_in, scheduled) = tokio::join!(
        produce,
        wait_pending(&store, total, Duration::from_secs(300))
    );
    let produced_in = produced_in?;
    scheduled?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu.stop(total).await?;
    daemon.stop().await;
    Ok(json!({
        "scenario": "ingest-inbox",
        "messages": total,
        "inbox_batch": inbox.batch_size,
        "rate_per_sec": (total as f64 / secs).round(),
        "producer_rate_per_sec": (total as f64 / produced_in.as_secs_f64()).round(),
        "cpu_us_per_message": cpu,
    }))
}

/// Sequential single pushes (`POST /v1/messages`), one at a time, round trip timed.
pub(super) async fn push_latency(args: &BenchArgs, url: &str) -> anyhow::Result<Value> {
    wipe(url).await?;
    let config = bench_config(args, url)?;
    let daemon = crate::start(config).await?;
    let endpoint = format!("http://{}/v1/messages", daemon.api_addr);
    let payload = "x".repeat(args.payload);
    let http = reqwest::Client::new();
    let mut micros = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    const WARM_UP: u64 = 100;
    for n in 0..args.push_latency_requests + WARM_UP {
        let body = json!({ "stream": "bench:latency", "payload": payload, "delay": "1h", "id": format!("l{n}") }).to_string();
        let started = Instant::now();
        let resp = http
            .post(&endpoint)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        let status = resp.status();
        resp.bytes().await?;
        let took = started.elapsed();
        if status.as_u16() != 201 {
            bail!("push answered {status}");
        }
        if n >= WARM_UP {
            micros.record(took.as_micros().max(1) as u64)?;
        }
    }
    daemon.stop().await;
    Ok(json!({
        "scenario": "push-latency",
        "messages": args.push_latency_requests,
        "latency_us": {
            "p50": micros.value_at_quantile(0.5),
            "p99": micros.value_at_quantile(0.99),
            "p99_9": micros.value_at_quantile(0.999),
            "max": micros.max(),
        },
        "rate_per_sec": (args.push_latency_requests as f64 * 1e6 / (micros.mean() * micros.len() as f64)).round(),
    }))
}

/// The ingest scenarios as a table.
pub(super) fn print_table(scenarios: &[&Value]) {
    if scenarios.is_empty() {
        return;
    }
    println!();
    println!(
        "| ingest scenario | messages | rate (msg/s) | single push latency p50 / p99 / p99.9 / max (µs) | CPU µs/msg Redis / delayq |"
    );
    println!("|---|---|---|---|---|");
    for s in scenarios {
        let latency = &s["latency_us"];
        let latency = if latency.is_object() {
            format!(
                "{} / {} / {} / {}",
                latency["p50"], latency["p99"], latency["p99_9"], latency["max"]
            )
        } else {
            "-".to_owned()
        };
        let cpu = &s["cpu_us_per_message"];
        let cpu = if cpu.is_object() {
            format!("{} / {}", cpu["redis"], cpu["delayq"])
        } else {
            "-".to_owned()
        };
        println!(
            "| {} | {} | {} | {latency} | {cpu} |",
            s["scenario"].as_str().unwrap_or("?"),
            s["messages"],
            s["rate_per_sec"]
        );
    }
}
