//! Ingest: how fast messages get into delayq, each due in a day so that no
//! forwarding competes. Three paths: single `POST /v1/messages` (64 in flight; with
//! ids, and without),
//! `POST /v1/messages/batch` (500 messages a request, 4 in flight; with ids, and
//! without, for delayq to make; with ids again with the journal on) and the inbox
//! stream, two ways: drained (entries XADDed first, then a daemon started and timed
//! until every one is scheduled: delayq's own intake rate) and live (entries XADDed
//! by a pipelined producer, 1000 per round trip, while the daemon schedules them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use serde_json::json;

use super::measure::{self, CpuMeter, PingProbe, measured};
use super::rows::{Counts, Delayq, Figures, Ingest, ProcessCpu, Quantiles};
use super::{Bench, pushers};

/// Messages per batch request.
pub const HTTP_BATCH: u64 = 500;
/// Single pushes in flight at once, each over a connection of its own.
const SINGLE_CONCURRENCY: usize = 64;
/// Batch requests in flight at once.
const BATCH_CONCURRENCY: usize = 4;
/// Inbox entries XADDed per pipeline round trip.
const XADD_PIPELINE: u64 = 1000;

/// Whether the pushes name their messages' ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ids {
    /// `i0`, `i1`, … (`b0`, … in batches): as a producer that deduplicates its sends.
    Given,
    /// None: delayq makes them.
    Generated,
}

/// The one part of a batch answer the bench reads: parsing the rest is client work.
#[derive(serde::Deserialize)]
struct BatchAnswer {
    failed: u64,
}

impl Bench {
    /// Messages scheduled in all shards.
    pub(super) async fn pending(&self) -> anyhow::Result<u64> {
        Ok(self
            .store
            .pending_per_shard()
            .await?
            .iter()
            .map(|(_, n)| n)
            .sum())
    }

    /// The figures every ingest scenario shares: `pending` of the `n` sent were
    /// scheduled in `secs`.
    fn ingest_row(
        n: u64,
        load: String,
        secs: f64,
        cpu: measure::PhaseCpu,
        probe: &measure::Probe,
        pending: u64,
    ) -> Ingest {
        let tally = Counts {
            delivered: pending.min(n),
            lost: n.saturating_sub(pending),
            duplicated: pending.saturating_sub(n),
            ..Counts::default()
        };
        Ingest {
            measured: measured(
                n,
                load,
                (pending.min(n) as f64 / secs).round() as u64,
                &cpu,
                Some(ProcessCpu::Delayq(cpu.worker_us)),
                probe,
                tally,
            ),
            request_ms: None,
            batch: None,
            producer_rate_per_sec: None,
        }
    }

    /// Ingest over HTTP: `n` single-message POSTs, 64 in flight, each due in a day
    /// (so nothing is forwarded meanwhile), with ids or without. Measures what the
    /// API accepts.
    pub async fn ingest_http(&self, n: u64, ids: Ids) -> anyhow::Result<Figures> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let daemon = self.start_delayq("bench-ingest").await?;
        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let meter = CpuMeter::start(&mut conn, daemon.pid()).await?;
        let own = measure::process_cpu_secs(std::process::id());
        let started = Instant::now();
        // Each body as a producer would send it; what all share made once.
        let head = format!(
            r#"{{"stream":"bench:ingest","payload":{},"delay":"1d""#,
            serde_json::to_string(&self.payload)?
        );
        let body = move |i: u64| match ids {
            Ids::Given => format!(r#"{head},"id":"i{i}"}}"#),
            Ids::Generated => format!("{head}}}"),
        };
        let pushers::Pushed {
            accepted,
            refused,
            latency,
        } = pushers::push_all(daemon.api, "/v1/messages", n, SINGLE_CONCURRENCY, body).await?;
        let secs = started.elapsed().as_secs_f64();
        let own = own
            .zip(measure::process_cpu_secs(std::process::id()))
            .map(|(before, after)| measure::per_message_us(after - before, n));
        let cpu = meter.stop(&mut conn, n).await?;
        let probe = probe.finish()?;
        drop(daemon);
        let pending = self.pending().await?;
        let ms = |q: f64| (latency.value_at_quantile(q) as f64 / 100.0).round() / 10.0;
        let mut row = Self::ingest_row(n, load, secs, cpu, &probe, pending);
        // What the API accepted, rather than what ended up scheduled.
        row.measured.throughput_per_sec = (accepted as f64 / secs).round() as u64;
        row.request_ms = Some(Quantiles {
            p50: ms(0.5),
            p99: ms(0.99),
            p99_9: ms(0.999),
            max: (latency.max() as f64 / 100.0).round() / 10.0,
        });
        row.measured.tally.refused = Some(refused);
        row.measured.cpu_us_per_message.bench = own;
        Ok(match ids {
            Ids::Given => Delayq::IngestHttp(row),
            Ids::Generated => Delayq::IngestHttpIdsGenerated(row),
        }
        .into())
    }

    /// `n` messages through `POST /v1/messages/batch`, `HTTP_BATCH` a request.
    pub async fn ingest_batch(&self, n: u64, ids: Ids) -> anyhow::Result<Figures> {
        let row = self
            .batch_row(n, ids, "bench-ingest-batch", &self.delayq_config)
            .await?;
        Ok(match ids {
            Ids::Given => Delayq::IngestHttpBatch(row),
            Ids::Generated => Delayq::IngestHttpBatchIdsGenerated(row),
        }
        .into())
    }

    /// [`Bench::ingest_batch`] with ids and the journal on, into the MySQL or
    /// MariaDB at `journal_url` (migrated and emptied first): a push is answered
    /// once both have it.
    pub async fn ingest_batch_journaled(
        &self,
        n: u64,
        journal_url: &str,
    ) -> anyhow::Result<Figures> {
        let config = format!("{}[journal]\nurl = \"{journal_url}\"\n", self.delayq_config);
        let journal = super::migrated_journal(&super::daemon_config(&config)?)
            .await?
            .context("a journal")?;
        journal.truncate().await.context("empty the journal")?;
        let row = self
            .batch_row(n, Ids::Given, "bench-ingest-journaled", &config)
            .await?;
        Ok(Delayq::IngestHttpBatchJournaled(row).into())
    }

    /// The figures of `n` messages batch-pushed to a daemon started with `config`.
    async fn batch_row(
        &self,
        n: u64,
        ids: Ids,
        name: &str,
        config: &str,
    ) -> anyhow::Result<Ingest> {
        self.flush().await?;
        let mut conn = self.conn.clone();
        let daemon = self.start_delayq_with(name, config).await?;
        let url = daemon.url("/v1/messages/batch");
        // Bodies are built before the clock starts: the client's JSON work is not delayq's.
        let bodies: Vec<String> = (0..n)
            .collect::<Vec<_>>()
            .chunks(HTTP_BATCH as usize)
            .map(|chunk| {
                let messages: Vec<serde_json::Value> = chunk
                    .iter()
                    .map(|i| {
                        let mut msg = json!({ "stream": "bench:ingest", "payload": self.payload, "delay": "1d" });
                        if ids == Ids::Given {
                            msg["id"] = json!(format!("b{i}"));
                        }
                        msg
                    })
                    .collect();
                json!({ "messages": messages }).to_string()
            })
            .collect();
        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let meter = CpuMeter::start(&mut conn, daemon.pid()).await?;
        let started = Instant::now();
        let mut replies = futures::stream::iter(bodies)
            .map(|body| {
                let req = self
                    .http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body);
                async move {
                    let resp = req.send().await?;
                    let status = resp.status();
                    let body = resp.bytes().await?;
                    let answer: BatchAnswer = serde_json::from_slice(&body).with_context(|| {
                        format!("batch answer {status}: {}", String::from_utf8_lossy(&body))
                    })?;
                    anyhow::Ok((status, answer))
                }
            })
            .buffer_unordered(BATCH_CONCURRENCY);
        while let Some(reply) = replies.next().await {
            let (status, answer) = reply?;
            if !status.is_success() || answer.failed != 0 {
                bail!("batch refused: {status}, {} failed", answer.failed);
            }
        }
        let secs = started.elapsed().as_secs_f64();
        let cpu = meter.stop(&mut conn, n).await?;
        let probe = probe.finish()?;
        drop(daemon);
        let pending = self.pending().await?;
        let mut row = Self::ingest_row(n, load, secs, cpu, &probe, pending);
        row.batch = Some(HTTP_BATCH);
        Ok(row)
    }

    /// XADDs inbox entries `x<from>` .. `x<to - 1>`, pipelined.
    async fn fill_inbox(&self, inbox: &str, from: u64, to: u64) -> anyhow::Result<Duration> {
        let mut producer = self.store.separate_connection().await?;
        let started = Instant::now();
        let mut sent = from;
        while sent < to {
            let mut pipe = redis::pipe();
            let end = (sent + XADD_PIPELINE).min(to);
            for i in sent..end {
                pipe.cmd("XADD")
                    .arg(inbox)
                    .arg("*")
                    .arg("delayq-stream")
                    .arg("bench:ingest")
                    .arg("delayq-delay")
                    .arg("1d")
                    .arg("delayq-id")
                    .arg(format!("x{i}"))
                    .arg("payload")
                    .arg(&self.payload)
                    .ignore();
            }
            let () = pipe.query_async(&mut producer).await?;
            sent = end;
        }
        Ok(started.elapsed())
    }

    /// The inbox stream of the bench's config.
    fn inbox_stream(&self) -> anyhow::Result<String> {
        let inbox = self.config.inbox.as_ref();
        Ok(inbox
            .context("the bench config enables the inbox")?
            .stream
            .clone())
    }

    /// Waits until the inbox is empty once `produced` is set (a generous deadline
    /// aside), then counts what is pending. An entry leaves the inbox in the call
    /// that schedules it, so its length says when the daemon is done; a `XLEN` a
    /// poll costs Redis next to nothing, where counting the shards' pending
    /// messages every poll took script calls the rows would charge to delayq.
    async fn wait_inbox_drained(
        &self,
        inbox: &str,
        n: u64,
        started: Instant,
        produced: &AtomicBool,
    ) -> anyhow::Result<u64> {
        let deadline = started + Duration::from_secs(60) + Duration::from_millis(n);
        let mut conn = self.conn.clone();
        loop {
            let done = produced.load(Ordering::Acquire);
            let left: u64 = redis::cmd("XLEN").arg(inbox).query_async(&mut conn).await?;
            if (done && left == 0) || Instant::now() > deadline {
                return self.pending().await;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The inbox, drained: `n` entries XADDed first, then a daemon started and timed
    /// until every one is scheduled.
    pub async fn ingest_inbox_drain(&self, n: u64) -> anyhow::Result<Figures> {
        self.flush().await?;
        let inbox = self.inbox_stream()?;
        let mut conn = self.conn.clone();
        let produced_in = self.fill_inbox(&inbox, 0, n).await?;
        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let mut meter = CpuMeter::start(&mut conn, None).await?;
        let started = Instant::now();
        let daemon = delayq_harness::DelayqProcess::start(
            &self.delayq_bin,
            "bench-ingest-inbox",
            &self.delayq_config,
        )?;
        meter.attach_new_process(daemon.pid());
        let pending = self
            .wait_inbox_drained(&inbox, n, started, &AtomicBool::new(true))
            .await?;
        let secs = started.elapsed().as_secs_f64();
        let cpu = meter.stop(&mut conn, n).await?;
        let probe = probe.finish()?;
        drop(daemon);
        let mut row = Self::ingest_row(n, load, secs, cpu, &probe, pending);
        row.producer_rate_per_sec = Some((n as f64 / produced_in.as_secs_f64()).round() as u64);
        Ok(Delayq::IngestInboxDrain(row).into())
    }

    /// The inbox, live: `n` entries XADDed while a daemon schedules them, timed until
    /// the last is scheduled (producer and delayq sharing Redis, as in production).
    pub async fn ingest_inbox(&self, n: u64) -> anyhow::Result<Figures> {
        self.flush().await?;
        let inbox = self.inbox_stream()?;
        let mut conn = self.conn.clone();
        let daemon = self.start_delayq("bench-ingest-inbox").await?;
        let load = measure::load_average();
        let probe = PingProbe::start(&self.url)?;
        let meter = CpuMeter::start(&mut conn, daemon.pid()).await?;
        let started = Instant::now();
        let produced = AtomicBool::new(false);
        let fill = async {
            let filled = self.fill_inbox(&inbox, 0, n).await;
            produced.store(true, Ordering::Release);
            filled
        };
        let (produced_in, pending) =
            tokio::join!(fill, self.wait_inbox_drained(&inbox, n, started, &produced));
        let (produced_in, pending) = (produced_in?, pending?);
        let secs = started.elapsed().as_secs_f64();
        let cpu = meter.stop(&mut conn, n).await?;
        let probe = probe.finish()?;
        drop(daemon);
        let mut row = Self::ingest_row(n, load, secs, cpu, &probe, pending);
        row.producer_rate_per_sec = Some((n as f64 / produced_in.as_secs_f64()).round() as u64);
        Ok(Delayq::IngestInbox(row).into())
    }
}
