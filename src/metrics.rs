//! Metric names, in one place, and the Prometheus recorder.
//!
//! A metric, its log field and its config key share one name where they describe
//! the same thing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const SCHEDULED: &str = "delayq_messages_scheduled_total";
pub const DUPLICATES: &str = "delayq_messages_duplicate_total";
pub const CANCELLED: &str = "delayq_messages_cancelled_total";
pub const RESCHEDULED: &str = "delayq_messages_rescheduled_total";
pub const FORWARDED: &str = "delayq_messages_forwarded_total";
pub const EXPIRED: &str = "delayq_messages_expired_total";
pub const DEAD: &str = "delayq_messages_dead_total";
pub const PENDING: &str = "delayq_pending_messages";
pub const FORWARD_BATCH: &str = "delayq_forward_batch_messages";
pub const SCRIPT_SECONDS: &str = "delayq_script_duration_seconds";
pub const LATENESS_SECONDS: &str = "delayq_forward_lateness_seconds";
pub const FORWARD_ERRORS: &str = "delayq_forward_errors_total";
pub const RECORDS_TRIMMED: &str = "delayq_records_trimmed_total";
pub const IS_LEADER: &str = "delayq_is_leader";
pub const EPOCH: &str = "delayq_leader_epoch";
pub const TRANSITIONS: &str = "delayq_leadership_transitions_total";
pub const FENCED: &str = "delayq_fenced_total";
pub const LEASE_REMAINING: &str = "delayq_lease_remaining_seconds";
/// Leader leases this standby ended because the leader was gone from Redis.
pub const LEASES_ENDED: &str = "delayq_leader_leases_ended_total";
pub const KEEPALIVE_SECONDS: &str = "delayq_keepalive_seconds";
pub const HTTP_REQUESTS: &str = "delayq_http_requests_total";
pub const REDELIVERED: &str = "delayq_messages_redelivered_total";
pub const DEAD_LETTERED: &str = "delayq_messages_dead_lettered_total";
pub const PENDING_TOO_LONG: &str = "delayq_entries_pending_too_long";
pub const SWEEP_SECONDS: &str = "delayq_sweep_duration_seconds";
pub const SWEEP_GROUP_MISSING: &str = "delayq_sweep_group_missing";
pub const SWEEP_ERRORS: &str = "delayq_sweep_errors_total";
pub const SWEEP_ENTRIES: &str = "delayq_sweep_entries_total";
pub const DEAD_REPLAYED: &str = "delayq_dead_letters_replayed_total";
pub const DEAD_PURGED: &str = "delayq_dead_letters_purged_total";
pub const HTTP_SECONDS: &str = "delayq_http_request_duration_seconds";
pub const CONFIG_RELOADS: &str = "delayq_config_reloads_total";
pub const BUILD_INFO: &str = "delayq_build_info";
/// Inbox entries handled, by outcome (scheduled, duplicate, rejected).
pub const INBOX_ENTRIES: &str = "delayq_inbox_entries_total";
/// Inbox entries taken over from instances that left them unacknowledged.
pub const INBOX_RECLAIMED: &str = "delayq_inbox_reclaimed_total";
/// Failed inbox reads or batches (retried with backoff).
pub const INBOX_ERRORS: &str = "delayq_inbox_errors_total";
/// 1 while this node's probe write to Redis succeeds, 0 while Redis refuses writes
/// (READONLY, OOM, MISCONF) or does not answer.
pub const REDIS_WRITABLE: &str = "delayq_redis_writable";
/// Requests refused for a missing or unknown bearer token.
pub const AUTH_FAILURES: &str = "delayq_http_auth_failures_total";
/// 1 while etcd answered this node's last query (about every second), 0 while it
/// does not. Absent without etcd.
pub const ETCD_REACHABLE: &str = "delayq_etcd_reachable";
/// Now − due time of the earliest message still scheduled (0 when none is overdue),
/// by Redis's clock. Set by the leader; 0 on standbys.
pub const OLDEST_OVERDUE: &str = "delayq_oldest_overdue_seconds";
/// Messages due and not yet forwarded (a backlog, or one held back by
/// `forwarder.max_rate`), and how long the limit takes to drain them.
pub const OVERDUE: &str = "delayq_overdue_messages";
pub const THROTTLE_DRAIN: &str = "delayq_forward_throttle_drain_seconds";

/// Scheduled messages per target stream, for the largest streams (see
/// [`PendingStreams`]). Set by the leader; 0 on standbys.
pub const PENDING_STREAM: &str = "delayq_pending_stream_messages";

/// Process metrics, in the names Prometheus client libraries use (collected by
/// `metrics-process`; see [`upkeep`]).
pub const PROCESS_CPU: &str = "process_cpu_seconds_total";
pub const PROCESS_RSS: &str = "process_resident_memory_bytes";
pub const PROCESS_VIRTUAL: &str = "process_virtual_memory_bytes";
pub const PROCESS_VIRTUAL_MAX: &str = "process_virtual_memory_max_bytes";
pub const PROCESS_OPEN_FDS: &str = "process_open_fds";
pub const PROCESS_MAX_FDS: &str = "process_max_fds";
pub const PROCESS_THREADS: &str = "process_threads";
pub const PROCESS_START: &str = "process_start_time_seconds";

/// How Prometheus sees a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// The word in `# TYPE` lines and in the README's table.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One exported metric. `help` is its `# HELP` text and the "meaning" column of the
/// README's metrics table (a test keeps the two equal).
#[derive(Clone, Copy, Debug)]
pub struct Described {
    pub name: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

const fn metric(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Described {
    Described {
        name,
        kind,
        labels,
        help,
    }
}

/// Every metric delayq exports, in the README's order.
pub const METRICS: &[Described] = &[
    metric(
        SCHEDULED,
        Kind::Counter,
        &[],
        "messages accepted through the API",
    ),
    metric(
        DUPLICATES,
        Kind::Counter,
        &[],
        "pushes answered as duplicates",
    ),
    metric(CANCELLED, Kind::Counter, &[], "cancellations"),
    metric(
        RESCHEDULED,
        Kind::Counter,
        &[],
        "reschedules through the API",
    ),
    metric(
        FORWARDED,
        Kind::Counter,
        &["stream"],
        "messages written to their stream",
    ),
    metric(
        EXPIRED,
        Kind::Counter,
        &[],
        "messages past their ttl, dead-lettered to `<stream>:dead`",
    ),
    metric(
        DEAD,
        Kind::Counter,
        &[],
        "messages that could not be read or written, dead-lettered to `delayq:unreadable`",
    ),
    metric(
        PENDING,
        Kind::Gauge,
        &["shard"],
        "messages scheduled, per shard (leader)",
    ),
    metric(
        PENDING_STREAM,
        Kind::Gauge,
        &["stream"],
        "messages scheduled, per target stream: the 100 largest, the rest under `(the rest)`; refreshed every 30 s by the leader, 0 on standbys",
    ),
    metric(
        FORWARD_BATCH,
        Kind::Histogram,
        &[],
        "messages moved per forward call",
    ),
    metric(
        SCRIPT_SECONDS,
        Kind::Histogram,
        &["script"],
        "script round trip",
    ),
    metric(
        LATENESS_SECONDS,
        Kind::Histogram,
        &[],
        "forward time − due time, both Redis's clock (buckets from 0.5 ms to 1 h)",
    ),
    metric(
        OLDEST_OVERDUE,
        Kind::Gauge,
        &[],
        "now − due time of the earliest message still scheduled, 0 when none is overdue; refreshed every 5 s by the leader, 0 on standbys",
    ),
    metric(
        FORWARD_ERRORS,
        Kind::Counter,
        &["shard"],
        "failed forward calls (retried with backoff)",
    ),
    metric(
        RECORDS_TRIMMED,
        Kind::Counter,
        &[],
        "terminal records forgotten after the retention",
    ),
    metric(
        IS_LEADER,
        Kind::Gauge,
        &[],
        "1 while this node leads, else 0",
    ),
    metric(EPOCH, Kind::Gauge, &[], "epoch of this node's latest term"),
    metric(
        TRANSITIONS,
        Kind::Counter,
        &[],
        "changes of this node's role",
    ),
    metric(
        FENCED,
        Kind::Counter,
        &[],
        "terms ended because a newer leader holds the fence",
    ),
    metric(
        LEASE_REMAINING,
        Kind::Gauge,
        &[],
        "leader's etcd lease time left at the last renewal",
    ),
    metric(
        OVERDUE,
        Kind::Gauge,
        &[],
        "messages due and not yet forwarded; refreshed every 5 s by the leader, 0 on standbys",
    ),
    metric(
        THROTTLE_DRAIN,
        Kind::Gauge,
        &[],
        "overdue messages / forwarder.max_rate: how long the rate limit takes to drain them (0 without a limit)",
    ),
    metric(
        LEASES_ENDED,
        Kind::Counter,
        &[],
        "leader leases this standby ended because the leader was gone from Redis or silent there",
    ),
    metric(
        KEEPALIVE_SECONDS,
        Kind::Histogram,
        &[],
        "etcd lease renewal round trip",
    ),
    metric(
        ETCD_REACHABLE,
        Kind::Gauge,
        &[],
        "1 while etcd answered this node's last query (about every second), 0 while it does not; absent without etcd",
    ),
    metric(
        REDIS_WRITABLE,
        Kind::Gauge,
        &[],
        "1 while this node's probe write to Redis succeeds (every second), 0 while Redis refuses writes or does not answer",
    ),
    metric(
        HTTP_REQUESTS,
        Kind::Counter,
        &["method", "route", "status"],
        "API requests, by route pattern (`unmatched` when none matches) and method (`other` beyond GET, POST, PUT, DELETE, PATCH, HEAD, OPTIONS)",
    ),
    metric(
        HTTP_SECONDS,
        Kind::Histogram,
        &["route"],
        "API request handling time",
    ),
    metric(
        AUTH_FAILURES,
        Kind::Counter,
        &[],
        "requests refused for a missing or unknown bearer token",
    ),
    metric(
        INBOX_ENTRIES,
        Kind::Counter,
        &["outcome"],
        "inbox entries handled: `scheduled`, `duplicate` or `rejected`",
    ),
    metric(
        INBOX_RECLAIMED,
        Kind::Counter,
        &[],
        "inbox entries taken over from instances that left them unacknowledged",
    ),
    metric(
        INBOX_ERRORS,
        Kind::Counter,
        &[],
        "failed inbox reads or batches (retried with backoff)",
    ),
    metric(
        REDELIVERED,
        Kind::Counter,
        &["stream"],
        "unacknowledged entries scheduled again",
    ),
    metric(
        DEAD_LETTERED,
        Kind::Counter,
        &["stream", "reason"],
        "messages out of attempts, dead-lettered",
    ),
    metric(
        PENDING_TOO_LONG,
        Kind::Gauge,
        &["stream", "group"],
        "entries found pending past `ack_timeout` in the last sweep (at most `sweep_batch`)",
    ),
    metric(
        SWEEP_SECONDS,
        Kind::Histogram,
        &[],
        "one sweep over every watched group",
    ),
    metric(
        SWEEP_ENTRIES,
        Kind::Counter,
        &["stream", "group", "outcome"],
        "what the sweep did with each stale entry: `rescheduled`, `dead`, `fresh`, `superseded`, `gone`, `foreign`, or `failed` (its redelivery failed on its own, e.g. the dead-letter key holds another type: logged, passed over, tried again on each sweep)",
    ),
    metric(
        SWEEP_GROUP_MISSING,
        Kind::Gauge,
        &["stream", "group"],
        "1 while a watched group does not exist",
    ),
    metric(
        SWEEP_ERRORS,
        Kind::Counter,
        &[],
        "failed sweeps (retried with backoff)",
    ),
    metric(
        DEAD_REPLAYED,
        Kind::Counter,
        &["stream"],
        "dead letters scheduled again by an operator",
    ),
    metric(
        DEAD_PURGED,
        Kind::Counter,
        &["stream"],
        "dead letters removed by an operator",
    ),
    metric(
        CONFIG_RELOADS,
        Kind::Counter,
        &["result"],
        "SIGHUP reloads, `applied` or `refused`",
    ),
    metric(
        BUILD_INFO,
        Kind::Gauge,
        &["version"],
        "always 1; the running version",
    ),
    metric(
        PROCESS_CPU,
        Kind::Counter,
        &[],
        "CPU time used, user and system, in whole seconds",
    ),
    metric(PROCESS_RSS, Kind::Gauge, &[], "resident memory, bytes"),
    metric(PROCESS_VIRTUAL, Kind::Gauge, &[], "virtual memory, bytes"),
    metric(
        PROCESS_VIRTUAL_MAX,
        Kind::Gauge,
        &[],
        "virtual memory limit, bytes",
    ),
    metric(PROCESS_OPEN_FDS, Kind::Gauge, &[], "open file descriptors"),
    metric(PROCESS_MAX_FDS, Kind::Gauge, &[], "file descriptor limit"),
    metric(PROCESS_THREADS, Kind::Gauge, &[], "OS threads"),
    metric(
        PROCESS_START,
        Kind::Gauge,
        &[],
        "process start time, seconds since the Unix epoch",
    ),
];

/// Installs the process-wide recorder the first time, and returns its handle.
/// Every metric gets its help text, and the series an alert may look at before
/// anything happened start at zero: counters without labels, the reload results,
/// whether this node leads, and how overdue the oldest message is.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let seconds = [
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ];
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)
                .and_then(|b| {
                    // Fine at the low end, where a healthy forwarder lives, and up to
                    // an hour, where a stuck one (or a long failover) shows.
                    let lateness: Vec<f64> = seconds
                        .iter()
                        .copied()
                        .chain([10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0])
                        .collect();
                    b.set_buckets_for_metric(Matcher::Full(LATENESS_SECONDS.into()), &lateness)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(FORWARD_BATCH.into()),
                        &[1.0, 10.0, 50.0, 100.0, 200.0, 500.0, 1000.0],
                    )
                })
                .expect("bucket lists are not empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder may be installed already (an embedding program's); then
            // delayq's metrics go there and this handle renders an empty page.
            let _ = metrics::set_global_recorder(recorder);
            for m in METRICS {
                match m.kind {
                    Kind::Counter => metrics::describe_counter!(m.name, m.help),
                    Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
                    Kind::Histogram => metrics::describe_histogram!(m.name, m.help),
                }
                if m.kind == Kind::Counter && m.labels.is_empty() {
                    metrics::counter!(m.name).increment(0);
                }
            }
            for result in ["applied", "refused"] {
                metrics::counter!(CONFIG_RELOADS, "result" => result).increment(0);
            }
            metrics::gauge!(IS_LEADER).set(0.0);
            metrics::gauge!(OLDEST_OVERDUE).set(0.0);
            metrics::gauge!(OVERDUE).set(0.0);
            metrics::gauge!(THROTTLE_DRAIN).set(0.0);
            process().collect();
            handle
        })
        .clone()
}

fn process() -> &'static metrics_process::Collector {
    static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();
    // Described from [`METRICS`] with the rest, not by the collector.
    PROCESS.get_or_init(|| metrics_process::Collector::new(""))
}

/// Periodic housekeeping (every few seconds): the exporter's own upkeep, and a
/// fresh reading of the process metrics (CPU, memory, file descriptors).
pub fn upkeep(handle: &PrometheusHandle) {
    handle.run_upkeep();
    process().collect();
}

/// The `stream` label of what [`PendingStreams`] does not show by name. Stream
/// names have no spaces, so no stream is called this.
pub const REST_OF_STREAMS: &str = "(the rest)";

/// Keeps `delayq_pending_stream_messages` to a bounded set of series: the `top`
/// largest streams of each count by name, the rest summed under
/// [`REST_OF_STREAMS`]. A stream that drops out of the top reads 0 (the exporter
/// cannot remove a series); once `ever` streams have had a series, newcomers are
/// counted in the rest.
pub struct PendingStreams {
    top: usize,
    ever: usize,
    named: BTreeSet<String>,
}

impl PendingStreams {
    pub fn new(top: usize, ever: usize) -> PendingStreams {
        PendingStreams {
            top,
            ever,
            named: BTreeSet::new(),
        }
    }

    /// The gauge values for one count: `counted` per stream (possibly a part of
    /// the messages; "" for bodies that could not be read) out of `total` scheduled.
    pub fn values(&mut self, counted: &BTreeMap<String, u64>, total: u64) -> Vec<(String, u64)> {
        let mut ranked: Vec<(&String, u64)> = counted
            .iter()
            .filter(|(stream, n)| !stream.is_empty() && **n > 0)
            .map(|(stream, n)| (stream, *n))
            .collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let mut shown: BTreeMap<String, u64> = BTreeMap::new();
        for (stream, n) in ranked.into_iter().take(self.top) {
            if self.named.contains(stream) || self.named.len() < self.ever {
                self.named.insert(stream.clone());
                shown.insert(stream.clone(), n);
            }
        }
        let rest = total.saturating_sub(shown.values().sum());
        let mut values: Vec<(String, u64)> = self
            .named
            .iter()
            .map(|stream| (stream.clone(), shown.get(stream).copied().unwrap_or(0)))
            .collect();
        values.push((REST_OF_STREAMS.to_owned(), rest));
        values
    }

    /// Every series at 0: this node no longer leads.
    pub fn zeroes(&self) -> Vec<(String, u64)> {
        self.named
            .iter()
            .map(String::as_str)
            .chain([REST_OF_STREAMS])
            .map(|stream| (stream.to_owned(), 0))
            .collect()
    }
}

/// How long the recent lateness window lasts (reported: the last one to two windows).
const LATENESS_WINDOW: Duration = Duration::from_secs(60);

/// Lateness of the messages this process forwarded, kept for `/v1/stats` (Prometheus
/// histograms cannot be read back): since start, and recently.
struct Lateness {
    since_start: Histogram<u64>,
    current: Histogram<u64>,
    previous: Histogram<u64>,
    current_since: Instant,
}

fn lateness() -> &'static Mutex<Lateness> {
    static LATENESS: OnceLock<Mutex<Lateness>> = OnceLock::new();
    LATENESS.get_or_init(|| {
        let new =
            || Histogram::new_with_bounds(1, 24 * 3_600_000, 2).expect("valid histogram bounds");
        Mutex::new(Lateness {
            since_start: new(),
            current: new(),
            previous: new(),
            current_since: Instant::now(),
        })
    })
}

impl Lateness {
    fn rotate(&mut self) {
        let elapsed = self.current_since.elapsed();
        if elapsed >= LATENESS_WINDOW {
            std::mem::swap(&mut self.current, &mut self.previous);
            self.current.reset();
            if elapsed >= 2 * LATENESS_WINDOW {
                self.previous.reset();
            }
            self.current_since = Instant::now();
        }
    }
}

/// Records the lateness (forward time − due time, ms) of forwarded messages.
pub fn record_lateness(lateness_ms: &[u64]) {
    if lateness_ms.is_empty() {
        return;
    }
    let mut l = lateness().lock().expect("lateness lock");
    l.rotate();
    for &ms in lateness_ms {
        // Zero-lateness forwards count as 1 ms: the histogram's floor.
        let ms = ms.max(1);
        l.since_start.saturating_record(ms);
        l.current.saturating_record(ms);
    }
}

/// Percentiles of some forwards' lateness, in ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatenessSummary {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

fn summarize(h: &Histogram<u64>) -> Option<LatenessSummary> {
    (!h.is_empty()).then(|| LatenessSummary {
        count: h.len(),
        p50: h.value_at_quantile(0.5),
        p99: h.value_at_quantile(0.99),
        max: h.max(),
    })
}

/// Lateness of what this process forwarded: (the last one to two minutes, since start).
pub fn lateness_summary() -> (Option<LatenessSummary>, Option<LatenessSummary>) {
    let mut l = lateness().lock().expect("lateness lock");
    l.rotate();
    let mut recent = l.previous.clone();
    recent.add(&l.current).expect("same bounds");
    (summarize(&recent), summarize(&l.since_start))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(s, n)| (s.to_string(), *n)).collect()
    }

    fn get(values: &[(String, u64)], stream: &str) -> Option<u64> {
        values.iter().find(|(s, _)| s == stream).map(|(_, n)| *n)
    }

    #[test]
    fn the_largest_streams_are_shown_and_the_rest_is_summed() {
        let mut p = PendingStreams::new(2, 10);
        let v = p.values(&counts(&[("a", 5), ("b", 1), ("c", 3), ("", 2)]), 20);
        assert_eq!(v.len(), 3, "{v:?}");
        assert_eq!(get(&v, "a"), Some(5));
        assert_eq!(get(&v, "c"), Some(3));
        // b, the unreadable and the 9 not counted.
        assert_eq!(get(&v, REST_OF_STREAMS), Some(12));
        // Equal counts rank by name: the same streams from one count to the next.
        let v = p.values(&counts(&[("x", 1), ("a", 1), ("m", 1)]), 3);
        assert_eq!(get(&v, "a"), Some(1));
        assert_eq!(get(&v, "m"), Some(1));
        assert_eq!(get(&v, "x"), None);
        assert_eq!(get(&v, "c"), Some(0), "dropped out: 0");
        assert_eq!(get(&v, REST_OF_STREAMS), Some(1));
    }

    #[test]
    fn the_streams_ever_shown_are_bounded() {
        let mut p = PendingStreams::new(2, 3);
        p.values(&counts(&[("a", 2), ("b", 1)]), 3);
        p.values(&counts(&[("c", 2), ("d", 1)]), 3);
        let v = p.values(&counts(&[("e", 5), ("a", 1)]), 6);
        let names: Vec<&str> = v.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", REST_OF_STREAMS]);
        assert_eq!(get(&v, "a"), Some(1));
        assert_eq!(
            get(&v, REST_OF_STREAMS),
            Some(5),
            "e is a newcomer past the cap"
        );
        let zeroes = p.zeroes();
        assert_eq!(zeroes.len(), 4);
        assert!(zeroes.iter().all(|(_, n)| *n == 0));
    }

    #[test]
    fn every_metric_is_described_once() {
        let mut names: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before);
    }
}
