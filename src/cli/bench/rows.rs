//! What the scenarios measured: one type per kind of row of the report, named in
//! JSON by `system` and `scenario` (results.json's `rows` and `redis_benchmark`).

use serde::{Deserialize, Serialize};

mod cpu;

pub use cpu::{Cpu, ProcessCpu, ScriptCalls};

/// What one scenario measured in one run: the figures' fields, then `run`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    #[serde(flatten)]
    pub figures: Figures,
    pub run: u32,
}

/// A row's figures, by the system that did the work.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "system", rename_all = "lowercase")]
pub enum Figures {
    Delayq(Delayq),
    Ceiling(Ceiling),
    Bullmq(Bullmq),
}

impl From<Delayq> for Figures {
    fn from(d: Delayq) -> Figures {
        Figures::Delayq(d)
    }
}

impl From<Ceiling> for Figures {
    fn from(c: Ceiling) -> Figures {
        Figures::Ceiling(c)
    }
}

impl From<Bullmq> for Figures {
    fn from(b: Bullmq) -> Figures {
        Figures::Bullmq(b)
    }
}

/// delayq's scenarios, by name.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "scenario", rename_all = "kebab-case")]
pub enum Delayq {
    Burst(Burst),
    Spread(Spread),
    BacklogSpread(Spread),
    Catchup(Catchup),
    /// A leader with nothing to move: its figures are per second, not per message.
    Idle(Idle),
    /// Recurring schedules firing together: figures per occurrence.
    Schedules(Schedules),
    IngestHttp(Ingest),
    /// The same single pushes without ids: delayq makes them (those of one
    /// millisecond in one shard, see `MessageId::generate_in`).
    IngestHttpIdsGenerated(Ingest),
    IngestHttpBatch(Ingest),
    /// The same batches without ids: delayq makes them (in order, see `MessageId`).
    IngestHttpBatchIdsGenerated(Ingest),
    /// The batches with ids, journaled into a MariaDB of the bench's own.
    IngestHttpBatchJournaled(Ingest),
    IngestInboxDrain(Ingest),
    IngestInbox(Ingest),
    FailoverSigterm(Failover),
    FailoverSigkill(Failover),
    FailoverPause(Failover),
    FailoverRedisCut(Failover),
    ClusterBurst(ClusterBurst),
}

/// The same work as a delayq burst, without delayq.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "scenario", rename_all = "kebab-case")]
pub enum Ceiling {
    Burst(CeilingBurst),
}

/// The peer's scenarios.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "scenario", rename_all = "kebab-case")]
pub enum Bullmq {
    Burst(PeerBurst),
    Spread(PeerSpread),
}

/// What every row measures: how many messages, how fast, at what cost, and what
/// reached the other end.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Measured {
    pub messages: u64,
    /// The load average when the scenario started, as `uptime` prints it.
    pub load_average: String,
    pub throughput_per_sec: u64,
    pub cpu_us_per_message: Cpu,
    /// The longest PING round trip during the scenario.
    pub redis_unresponsive_ms: f64,
    /// The longest event Redis's latency monitor saw.
    pub redis_longest_event_ms: u64,
    /// The share (%) of the machine's CPU time the hypervisor took during the
    /// scenario (absent where `/proc/stat` has no steal count, and in results
    /// from before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_stolen_percent: Option<f64>,
    pub tally: Counts,
}

/// What reached the other end, against what was sent.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Counts {
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// Entries that were none of the messages sent (stream tallies only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unexpected: Option<u64>,
    /// Requests the API refused (HTTP ingest only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<u64>,
}

/// p50, p99, p99.9 and max.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Quantiles<T> {
    pub p50: T,
    pub p99: T,
    pub p99_9: T,
    pub max: T,
}

/// Lateness in ms: stream entry (or worker pick) time − due time; whole ms, and
/// below zero when the peer's worker picks a job early.
pub type Lateness = Quantiles<i64>;

/// delayq's burst: n messages due at one instant, scheduled before the daemon
/// starts, drained.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Burst {
    #[serde(flatten)]
    pub measured: Measured,
    pub schedule_rate_per_sec: u64,
    /// From the first message's due time to the last's: 0 unless the load was slow.
    pub due_spread_ms: u64,
    pub drain_ms: u64,
    pub lateness_ms: Option<Lateness>,
    pub bytes_per_pending_message: i64,
    /// Redis memory per delivery record once drained, the target stream deleted (so
    /// what is left is the records, with whatever the drain itself left behind).
    #[serde(default)]
    pub bytes_per_record: i64,
    /// `records.layout` when not the default (compact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_layout: Option<String>,
    /// `pending.layout` when not the default (compact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_layout: Option<String>,
    /// `records.retention` when not the default (24h): "0s" keeps no record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_retention: Option<String>,
    /// Messages under one business key, when they were pushed with keys (None:
    /// without).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_per_key: Option<u64>,
    /// With `election.mode = "per_shard"`: the leaders that drained it, one
    /// election group each (None: one leader of every shard, the default mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaders: Option<u32>,
}

impl Burst {
    /// "records.layout = …, pending.layout = …" for the layouts not the default, the
    /// records' retention if not the default, and the leaders of
    /// `election.mode = "per_shard"`.
    pub fn layouts(&self) -> Option<String> {
        let set: Vec<String> = [
            ("records", &self.records_layout),
            ("pending", &self.pending_layout),
        ]
        .into_iter()
        .filter_map(|(what, layout)| layout.as_ref().map(|l| format!("{what}.layout = {l}")))
        .chain(
            self.records_retention
                .as_ref()
                .map(|r| format!("records.retention = {r}")),
        )
        .chain(
            self.messages_per_key
                .map(|k| format!("a business key per {k} messages")),
        )
        .chain(self.leaders.map(|k| {
            format!(
                "election.mode = per_shard, {k} leader{}",
                if k == 1 { "" } else { "s" }
            )
        }))
        .collect();
        (!set.is_empty()).then(|| set.join(", "))
    }
}

/// A leader with nothing to move, watched for `seconds`: its `messages` are those
/// seconds, so its CPU and script calls "per message" are per second.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Idle {
    #[serde(flatten)]
    pub measured: Measured,
    pub seconds: u64,
}

/// Recurring schedules, all firing at the same instants: `messages` are the
/// occurrences expected (`schedules` × `fires`), the CPU is per occurrence, and the
/// lateness is each occurrence's entry time less its instant.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Schedules {
    #[serde(flatten)]
    pub measured: Measured,
    pub schedules: u64,
    pub every_ms: u64,
    pub fires: u32,
    pub lateness_ms: Option<Lateness>,
}

/// delayq's catch-up at a limit: a backlog of overdue messages for one stream with
/// a `streams.max_rate`, drained while live traffic goes to another stream. The
/// measured figures are the backlog's (`tally` adds the live messages' counts).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Catchup {
    #[serde(flatten)]
    pub measured: Measured,
    pub limit_per_sec: u64,
    pub drain_ms: u64,
    /// backlog / limit.
    pub expected_drain_ms: u64,
    pub live_rate_per_sec: u64,
    pub live_sent_per_sec: u64,
    pub live_messages: u64,
    pub live_lateness_ms: Option<Lateness>,
}

/// The ceiling's burst: the same moves as a bare Lua script.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CeilingBurst {
    #[serde(flatten)]
    pub measured: Measured,
    pub drain_ms: u64,
}

/// BullMQ's burst: delayed jobs due at one instant, added before the worker starts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerBurst {
    #[serde(flatten)]
    pub measured: Measured,
    /// The producer's rate, as it reported it (null when it could not tell).
    pub schedule_rate_per_sec: Option<u64>,
    pub drain_ms: u64,
    pub lateness_ms: Option<Lateness>,
    pub bytes_per_pending_message: i64,
    pub worker_concurrency: u32,
}

/// delayq's spread: a steady rate, each message due shortly after it is sent; with
/// `backlog`, over a backlog of far-future messages.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spread {
    #[serde(flatten)]
    pub measured: Measured,
    pub rate_per_sec: u64,
    /// p99 under the limit, the producer kept up and nothing was lost.
    pub on_time: bool,
    pub producer_kept_up: bool,
    pub lateness_ms: Option<Lateness>,
    #[serde(flatten)]
    pub backlog: Option<Backlog>,
}

/// The backlog a backlog spread ran over.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Backlog {
    pub backlog: u64,
    pub schedule_rate_per_sec: u64,
    pub bytes_per_pending_message: i64,
    /// Counted after the spreads: still all there, none forwarded early.
    pub backlog_still_pending: u64,
}

/// BullMQ's spread.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerSpread {
    #[serde(flatten)]
    pub measured: Measured,
    pub rate_per_sec: u64,
    pub on_time: bool,
    pub producer_kept_up: bool,
    pub lateness_ms: Option<Lateness>,
    pub worker_concurrency: u32,
}

/// Messages into delayq, each due in a day.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ingest {
    #[serde(flatten)]
    pub measured: Measured,
    /// Each request's round trip (single HTTP pushes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_ms: Option<Quantiles<f64>>,
    /// Messages a request (batch HTTP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u64>,
    /// How fast the inbox entries were XADDed (the inbox paths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_rate_per_sec: Option<u64>,
}

/// A spread with the leader stopped mid-way.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Failover {
    #[serde(flatten)]
    pub measured: Measured,
    pub rate_per_sec: u64,
    pub lease_ttl_ms: u64,
    /// From the signal until the standby led; null: it did not in time. The
    /// first round's.
    pub takeover_ms: Option<f64>,
    /// Every round's takeover (the leader stopped again after each), in order;
    /// null for a round whose standby did not lead in time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub takeovers_ms: Vec<Option<f64>>,
    /// p50 / p99 / max over the rounds that took over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover_quantiles_ms: Option<[f64; 3]>,
    /// p50 / p99 / max over the rounds of when the new leader's leadership began by
    /// its own clock (`since_ms` of `/v1/leader`, to the ms), after the signal: the
    /// takeover without the time its answer and the bench's polling took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub led_quantiles_ms: Option<[f64; 3]>,
    pub old_leader_exit_ms: Option<f64>,
    /// The longest time between two consecutive stream entries.
    pub forwarding_gap_ms: u64,
    pub forwarding_gap_ended_after_stop_ms: i64,
    pub lateness_ms: Option<Lateness>,
}

/// One `redis-benchmark` run on the bench Redis (`redis_benchmark` in JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "system", rename = "redis-benchmark")]
pub struct Reference {
    pub requests: u64,
    pub load_average: String,
    pub results: ReferenceResults,
    pub run: u32,
}

/// Requests a second, 50 connections, without and with a pipeline of 16.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReferenceResults {
    pub xadd_p1_per_sec: u64,
    pub xadd_p16_per_sec: u64,
    pub zadd_p1_per_sec: u64,
    pub zadd_p16_per_sec: u64,
}

impl Figures {
    /// The `system` name.
    pub fn system(&self) -> &'static str {
        match self {
            Figures::Delayq(_) => "delayq",
            Figures::Ceiling(_) => "ceiling",
            Figures::Bullmq(_) => "bullmq",
        }
    }

    pub fn delayq(&self) -> Option<&Delayq> {
        match self {
            Figures::Delayq(d) => Some(d),
            _ => None,
        }
    }

    /// A burst, whichever system drained it.
    pub fn burst(&self) -> Option<BurstView<'_>> {
        let (measured, lateness, bytes, record, layout) = match self {
            Figures::Delayq(Delayq::Burst(b)) => (
                &b.measured,
                b.lateness_ms.as_ref(),
                Some(b.bytes_per_pending_message),
                Some(b.bytes_per_record).filter(|&r| r != 0),
                b.layouts(),
            ),
            Figures::Ceiling(Ceiling::Burst(c)) => (&c.measured, None, None, None, None),
            Figures::Bullmq(Bullmq::Burst(p)) => (
                &p.measured,
                p.lateness_ms.as_ref(),
                Some(p.bytes_per_pending_message),
                None,
                None,
            ),
            _ => return None,
        };
        Some(BurstView {
            system: self.system(),
            measured,
            lateness,
            bytes_per_pending_message: bytes,
            bytes_per_record: record,
            layouts: layout,
        })
    }

    /// A spread (over a backlog or not), whichever system forwarded it.
    pub fn spread(&self) -> Option<SpreadView<'_>> {
        let (measured, rate, on_time, kept_up, lateness, backlog) = match self {
            Figures::Delayq(Delayq::Spread(s) | Delayq::BacklogSpread(s)) => (
                &s.measured,
                s.rate_per_sec,
                s.on_time,
                s.producer_kept_up,
                s.lateness_ms.as_ref(),
                s.backlog.as_ref().map(|b| b.backlog),
            ),
            Figures::Bullmq(Bullmq::Spread(p)) => (
                &p.measured,
                p.rate_per_sec,
                p.on_time,
                p.producer_kept_up,
                p.lateness_ms.as_ref(),
                None,
            ),
            _ => return None,
        };
        Some(SpreadView {
            system: self.system(),
            measured,
            rate_per_sec: rate,
            on_time,
            producer_kept_up: kept_up,
            lateness,
            backlog,
        })
    }
}

/// What the burst table shows of any system's burst.
pub struct BurstView<'a> {
    pub system: &'static str,
    pub measured: &'a Measured,
    pub lateness: Option<&'a Lateness>,
    pub bytes_per_pending_message: Option<i64>,
    /// delayq's alone (BullMQ's completed jobs are not comparable records).
    pub bytes_per_record: Option<i64>,
    /// delayq's layouts when not the defaults (see [`Burst::layouts`]).
    pub layouts: Option<String>,
}

/// What the spread table shows of any system's spread.
pub struct SpreadView<'a> {
    pub system: &'static str,
    pub measured: &'a Measured,
    pub rate_per_sec: u64,
    pub on_time: bool,
    pub producer_kept_up: bool,
    pub lateness: Option<&'a Lateness>,
    pub backlog: Option<u64>,
}

impl Delayq {
    /// The `scenario` name.
    pub fn scenario(&self) -> &'static str {
        match self {
            Delayq::Burst(_) => "burst",
            Delayq::Spread(_) => "spread",
            Delayq::BacklogSpread(_) => "backlog-spread",
            Delayq::Catchup(_) => "catchup",
            Delayq::Idle(_) => "idle",
            Delayq::Schedules(_) => "schedules",
            Delayq::IngestHttp(_) => "ingest-http",
            Delayq::IngestHttpIdsGenerated(_) => "ingest-http-ids-generated",
            Delayq::IngestHttpBatch(_) => "ingest-http-batch",
            Delayq::IngestHttpBatchIdsGenerated(_) => "ingest-http-batch-ids-generated",
            Delayq::IngestHttpBatchJournaled(_) => "ingest-http-batch-journaled",
            Delayq::IngestInboxDrain(_) => "ingest-inbox-drain",
            Delayq::IngestInbox(_) => "ingest-inbox",
            Delayq::FailoverSigterm(_) => "failover-sigterm",
            Delayq::FailoverSigkill(_) => "failover-sigkill",
            Delayq::FailoverPause(_) => "failover-pause",
            Delayq::FailoverRedisCut(_) => "failover-redis-cut",
            Delayq::ClusterBurst(_) => "cluster-burst",
        }
    }

    /// The figures every delayq row has.
    pub fn measured(&self) -> &Measured {
        match self {
            Delayq::Burst(b) => &b.measured,
            Delayq::Spread(s) | Delayq::BacklogSpread(s) => &s.measured,
            Delayq::Catchup(c) => &c.measured,
            Delayq::Idle(i) => &i.measured,
            Delayq::Schedules(s) => &s.measured,
            Delayq::IngestHttp(i)
            | Delayq::IngestHttpIdsGenerated(i)
            | Delayq::IngestHttpBatch(i)
            | Delayq::IngestHttpBatchIdsGenerated(i)
            | Delayq::IngestHttpBatchJournaled(i)
            | Delayq::IngestInboxDrain(i)
            | Delayq::IngestInbox(i) => &i.measured,
            Delayq::FailoverSigterm(f)
            | Delayq::FailoverSigkill(f)
            | Delayq::FailoverPause(f)
            | Delayq::FailoverRedisCut(f) => &f.measured,
            Delayq::ClusterBurst(c) => &c.measured,
        }
    }

    /// An ingest row's figures.
    pub fn ingest(&self) -> Option<&Ingest> {
        match self {
            Delayq::IngestHttp(i)
            | Delayq::IngestHttpIdsGenerated(i)
            | Delayq::IngestHttpBatch(i)
            | Delayq::IngestHttpBatchIdsGenerated(i)
            | Delayq::IngestHttpBatchJournaled(i)
            | Delayq::IngestInboxDrain(i)
            | Delayq::IngestInbox(i) => Some(i),
            _ => None,
        }
    }

    /// A failover row: (the signal's name, its figures).
    pub fn failover(&self) -> Option<(&'static str, &Failover)> {
        match self {
            Delayq::FailoverSigterm(f) => Some(("SIGTERM", f)),
            Delayq::FailoverSigkill(f) => Some(("SIGKILL", f)),
            Delayq::FailoverPause(f) => Some(("SIGSTOP", f)),
            Delayq::FailoverRedisCut(f) => Some(("Redis cut", f)),
            _ => None,
        }
    }
}

/// A burst drained on one kind of Redis, by some leaders, into some streams.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterBurst {
    #[serde(flatten)]
    pub measured: Measured,
    /// "standalone" or "cluster".
    pub redis: String,
    /// Masters that did the work (1 for standalone).
    pub masters: u32,
    pub streams: u32,
    pub leaders: u32,
}

#[cfg(test)]
pub(in crate::cli::bench) mod tests;
