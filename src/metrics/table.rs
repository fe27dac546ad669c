//! `METRICS`: every metric delayq exports, with its type, labels and help text.

// The metric names.
use super::*;

/// How Prometheus sees a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// The word in `# TYPE` lines and in the table of docs/metrics.md.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Which of a metric's series delayq exports from its start, before their first
/// event, so that alerts and dashboards see them at once (Prometheus's advice:
/// initialise every series known in advance). `super::known_series` turns this into
/// the series of one configuration; values set before they are registered stay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Its one series (no labels), at 0; a histogram with no samples.
    Zero,
    /// As `Zero`, with etcd (`[etcd]`) only: without etcd it means nothing, and
    /// `delayq_etcd_reachable` at 0 would say that etcd does not answer.
    ZeroWithEtcd,
    /// One series at 0 for each of these values of its one label.
    Each(&'static [&'static str]),
    /// `{shard}` for each of `redis.shards` on standalone Redis. On Redis Cluster
    /// the shards are the slots in use, known only later.
    Shards,
    /// `{group}` for each election group (`election.mode = "per_shard"`, with etcd).
    Groups,
    /// `{stream}` for each stream that has a `streams.max_rate`.
    LimitedStreams,
    /// `[delivery.streams]`: `{stream}` for each watched stream, `{group}` (when the
    /// metric has that label) for each of its groups, and each of these values for
    /// its last label (when there is one more).
    Watched(&'static [&'static str]),
    /// No series until an event names its labels: why.
    Later(&'static str),
}

/// One exported metric. `help` is its `# HELP` text and the "meaning" column of the
/// metrics table of docs/metrics.md (a test keeps the two equal).
#[derive(Clone, Copy, Debug)]
pub struct Described {
    pub name: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
    /// The series exported from the start.
    pub start: Start,
    pub help: &'static str,
}

const fn metric(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    start: Start,
    help: &'static str,
) -> Described {
    Described {
        name,
        kind,
        labels,
        start,
        help,
    }
}

/// Every metric delayq exports, in the order of docs/metrics.md.
pub const METRICS: &[Described] = &[
    metric(
        SCHEDULED,
        Kind::Counter,
        &[],
        Start::Zero,
        "messages accepted through the API",
    ),
    metric(
        DUPLICATES,
        Kind::Counter,
        &[],
        Start::Zero,
        "pushes answered as duplicates",
    ),
    metric(CANCELLED, Kind::Counter, &[], Start::Zero, "cancellations"),
    metric(
        RESCHEDULED,
        Kind::Counter,
        &[],
        Start::Zero,
        "reschedules through the API",
    ),
    metric(
        SCHEDULE_OCCURRENCES,
        Kind::Counter,
        &["schedule"],
        Start::Later("each schedule starts at its first occurrence made"),
        "recurring schedules' occurrences made into messages by this node's leader, per schedule (the first `metrics.max_streams` schedules named, the rest under `schedule=\"_other\"`)",
    ),
    metric(
        SCHEDULE_MISSED,
        Kind::Counter,
        &["schedule"],
        Start::Later("each schedule starts at its first misfire"),
        "recurring schedules' occurrences missed while no leader made them (the misfire policy says which were sent), per schedule, bounded as above",
    ),
    metric(
        SCHEDULE_SKIPPED,
        Kind::Counter,
        &["schedule"],
        Start::Later("each schedule starts at its first misfire"),
        "missed occurrences the misfire policy did not send, per schedule, bounded as above",
    ),
    metric(
        FORWARDED,
        Kind::Counter,
        &["stream"],
        Start::Later("any stream may be a target: each starts at its first forward"),
        "messages written to their stream",
    ),
    metric(
        EXPIRED,
        Kind::Counter,
        &[],
        Start::Zero,
        "messages past their ttl, dead-lettered to their stream's dead-letter stream (`<stream>:dead` unless configured otherwise)",
    ),
    metric(
        DEAD,
        Kind::Counter,
        &[],
        Start::Zero,
        "messages that could not be read or written, dead-lettered to `<redis.prefix>:unreadable` (`delayq:unreadable` by default)",
    ),
    metric(
        PENDING,
        Kind::Gauge,
        &["shard"],
        Start::Shards,
        "messages scheduled, per shard (leader)",
    ),
    metric(
        PENDING_STREAM,
        Kind::Gauge,
        &["stream"],
        Start::Each(&[REST_OF_STREAMS]),
        "messages scheduled, per target stream: the 100 largest, the rest under `(the rest)`; refreshed by the leader every 2 to 30 s (longer for a larger backlog), 0 on standbys",
    ),
    metric(
        FORWARD_BATCH,
        Kind::Histogram,
        &[],
        Start::Zero,
        "messages moved per forward call that moved any",
    ),
    metric(
        SCRIPT_SECONDS,
        Kind::Histogram,
        &["script"],
        Start::Each(&["forward"]),
        "script round trip",
    ),
    metric(
        LATENESS_SECONDS,
        Kind::Histogram,
        &[],
        Start::Zero,
        "forward time − due time, both Redis's clock (buckets from 0.5 ms to 1 h), of messages no held set kept",
    ),
    metric(
        HELD_WAIT_SECONDS,
        Kind::Histogram,
        &[],
        Start::Zero,
        "forward time − due time of messages their stream held on purpose (paused, or kept to streams.max_rate), apart from the lateness (buckets as it)",
    ),
    metric(
        OLDEST_OVERDUE,
        Kind::Gauge,
        &[],
        Start::Zero,
        "now − due time of the earliest message still scheduled, 0 when none is overdue; refreshed by the leader every 5 s, or every 20 times as long as counting took if longer, 0 on standbys",
    ),
    metric(
        FORWARD_ERRORS,
        Kind::Counter,
        &["shard"],
        Start::Shards,
        "failed forward calls (retried with backoff), and messages set aside for a minute because their stream and dead-letter stream both refuse them",
    ),
    metric(
        RECORDS_TRIMMED,
        Kind::Counter,
        &[],
        Start::Zero,
        "terminal records forgotten after the retention",
    ),
    metric(
        IS_LEADER,
        Kind::Gauge,
        &[],
        Start::Zero,
        "1 while this node leads, else 0",
    ),
    metric(
        EPOCH,
        Kind::Gauge,
        &[],
        Start::Zero,
        "epoch of this node's latest term",
    ),
    metric(
        TRANSITIONS,
        Kind::Counter,
        &[],
        Start::Zero,
        "changes of this node's role",
    ),
    metric(
        GROUP_LEADER,
        Kind::Gauge,
        &["group"],
        Start::Groups,
        "election.mode = \"per_shard\": 1 while this node leads the group, else 0",
    ),
    metric(
        GROUP_EPOCH,
        Kind::Gauge,
        &["group"],
        Start::Groups,
        "election.mode = \"per_shard\": epoch of this node's latest term of the group",
    ),
    metric(
        GROUPS_RESIGNED,
        Kind::Counter,
        &[],
        Start::Zero,
        "election groups this node resigned so that every node leads its share",
    ),
    metric(
        FENCED,
        Kind::Counter,
        &[],
        Start::Zero,
        "terms ended because a newer leader holds the fence",
    ),
    metric(
        LEASE_REMAINING,
        Kind::Gauge,
        &[],
        Start::ZeroWithEtcd,
        "leader's etcd lease time left at the last renewal",
    ),
    metric(
        OVERDUE,
        Kind::Gauge,
        &[],
        Start::Zero,
        "messages due and not yet forwarded; refreshed by the leader every 5 s, or every 20 times as long as counting took if longer, 0 on standbys",
    ),
    metric(
        THROTTLE_DRAIN,
        Kind::Gauge,
        &[],
        Start::Zero,
        "how long the rate limits take to drain what is overdue: overdue messages / forwarder.max_rate, or a stream's held messages / its streams.max_rate, whichever is longer (0 without a limit)",
    ),
    metric(
        HELD,
        Kind::Gauge,
        &["stream"],
        Start::LimitedStreams,
        "due messages held back by their stream's own limit (streams.max_rate); refreshed by the leader every 5 s, or every 20 times as long as counting took if longer",
    ),
    metric(
        LEASES_ENDED,
        Kind::Counter,
        &[],
        Start::Zero,
        "leader leases this standby ended because the leader was gone from Redis or silent there",
    ),
    metric(
        KEEPALIVE_SECONDS,
        Kind::Histogram,
        &[],
        Start::ZeroWithEtcd,
        "etcd lease renewal round trip",
    ),
    metric(
        ETCD_REACHABLE,
        Kind::Gauge,
        &[],
        Start::ZeroWithEtcd,
        "1 while etcd answered this node's last query (about every second), 0 while it does not; absent without etcd",
    ),
    metric(
        REDIS_WRITABLE,
        Kind::Gauge,
        &[],
        Start::Zero,
        "1 while this node's probe write to Redis succeeds (every second), 0 while Redis refuses writes or does not answer",
    ),
    metric(
        REDIS_EVICTING,
        Kind::Gauge,
        &[],
        Start::Zero,
        "1 while a Redis master's `maxmemory-policy` (an `allkeys-*` one, with `maxmemory` set) can evict delayq's keys, read every second; 0 otherwise",
    ),
    metric(
        REDIS_NEARLY_FULL,
        Kind::Gauge,
        &[],
        Start::Zero,
        "1 while a Redis master uses more than 95% of its `maxmemory` (read every second), or Redis refused a write of this node's for want of memory (OOM) within the last 10 s; 0 otherwise",
    ),
    metric(
        HTTP_REQUESTS,
        Kind::Counter,
        &["method", "route", "status"],
        Start::Later("the status is known once a request is answered"),
        "API requests, by route pattern (`unmatched` when none matches) and method (`other` beyond GET, POST, PUT, DELETE, PATCH, HEAD, OPTIONS)",
    ),
    metric(
        HTTP_SECONDS,
        Kind::Histogram,
        &["route"],
        Start::Later("a route's series starts at its first request"),
        "API request handling time",
    ),
    metric(
        AUTH_FAILURES,
        Kind::Counter,
        &[],
        Start::Zero,
        "requests refused for a missing or unknown bearer token",
    ),
    metric(
        INBOX_ENTRIES,
        Kind::Counter,
        &["outcome"],
        Start::Each(&["scheduled", "duplicate", "rejected"]),
        "inbox entries handled: `scheduled`, `duplicate` or `rejected`",
    ),
    metric(
        INBOX_RECLAIMED,
        Kind::Counter,
        &[],
        Start::Zero,
        "inbox entries taken over from instances that left them unacknowledged",
    ),
    metric(
        INBOX_READS,
        Kind::Counter,
        &["way"],
        Start::Each(&["marked", "entries"]),
        "inbox reads that took entries: `marked` (handed out together) or `entries` (one by one)",
    ),
    metric(
        INBOX_ERRORS,
        Kind::Counter,
        &[],
        Start::Zero,
        "failed inbox reads or batches (retried with backoff)",
    ),
    metric(
        REDELIVERED,
        Kind::Counter,
        &["stream"],
        Start::Watched(&[]),
        "unacknowledged entries scheduled again",
    ),
    metric(
        DEAD_LETTERED,
        Kind::Counter,
        &["stream", "reason"],
        Start::Watched(&["max_attempts"]),
        "messages out of attempts, dead-lettered",
    ),
    metric(
        PENDING_TOO_LONG,
        Kind::Gauge,
        &["stream", "group"],
        Start::Watched(&[]),
        "entries found pending past `ack_timeout` in the last sweep (at most `sweep_batch`)",
    ),
    metric(
        SWEEP_SECONDS,
        Kind::Histogram,
        &[],
        Start::Zero,
        "one sweep over every watched group",
    ),
    metric(
        SWEEP_ENTRIES,
        Kind::Counter,
        &["stream", "group", "outcome"],
        Start::Watched(&[
            "rescheduled",
            "dead",
            "fresh",
            "superseded",
            "gone",
            "foreign",
            "failed",
        ]),
        "what the sweep did with each stale entry: `rescheduled`, `dead`, `fresh`, `superseded`, `gone`, `foreign`, or `failed` (its redelivery failed on its own, e.g. the dead-letter key holds another type: logged, passed over, tried again on each sweep)",
    ),
    metric(
        SWEEP_GROUP_MISSING,
        Kind::Gauge,
        &["stream", "group"],
        Start::Watched(&[]),
        "1 while a watched group does not exist",
    ),
    metric(
        SWEEP_ERRORS,
        Kind::Counter,
        &[],
        Start::Zero,
        "failed sweeps (retried with backoff)",
    ),
    metric(
        DEAD_REPLAYED,
        Kind::Counter,
        &["stream"],
        Start::Later("a stream's series starts at its first replay"),
        "dead letters scheduled again by an operator",
    ),
    metric(
        DEAD_PURGED,
        Kind::Counter,
        &["stream"],
        Start::Later("a stream's series starts at its first purge"),
        "dead letters removed by an operator",
    ),
    metric(
        CONFIG_RELOADS,
        Kind::Counter,
        &["result"],
        Start::Each(&["applied", "refused"]),
        "configuration reloads (SIGHUP or `POST /v1/admin/reload`), `applied` or `refused`",
    ),
    metric(
        BUILD_INFO,
        Kind::Gauge,
        &["version"],
        Start::Each(&[env!("CARGO_PKG_VERSION")]),
        "always 1; the running version",
    ),
    metric(
        PROCESS_CPU,
        Kind::Counter,
        &[],
        Start::Zero,
        "CPU time used, user and system, in whole seconds",
    ),
    metric(
        PROCESS_RSS,
        Kind::Gauge,
        &[],
        Start::Zero,
        "resident memory, bytes",
    ),
    metric(
        PROCESS_VIRTUAL,
        Kind::Gauge,
        &[],
        Start::Zero,
        "virtual memory, bytes",
    ),
    metric(
        PROCESS_VIRTUAL_MAX,
        Kind::Gauge,
        &[],
        Start::Zero,
        "virtual memory limit, bytes",
    ),
    metric(
        PROCESS_OPEN_FDS,
        Kind::Gauge,
        &[],
        Start::Zero,
        "open file descriptors",
    ),
    metric(
        PROCESS_MAX_FDS,
        Kind::Gauge,
        &[],
        Start::Zero,
        "file descriptor limit",
    ),
    metric(PROCESS_THREADS, Kind::Gauge, &[], Start::Zero, "OS threads"),
    metric(
        PROCESS_START,
        Kind::Gauge,
        &[],
        Start::Zero,
        "process start time, seconds since the Unix epoch",
    ),
    metric(
        JOURNAL_PUSHES,
        Kind::Counter,
        &["outcome"],
        Start::Each(&["committed", "failed"]),
        "pushes the journal committed (`committed`) or could not (`failed`: answered 503)",
    ),
    metric(
        JOURNAL_CHANGES,
        Kind::Counter,
        &[],
        Start::Zero,
        "deliveries, expiries, dead letters, cancellations and new due times copied into the journal",
    ),
    metric(
        JOURNAL_LAG,
        Kind::Histogram,
        &[],
        Start::Zero,
        "from a change in Redis to its commit in the journal",
    ),
    metric(
        JOURNAL_OUTBOX,
        Kind::Gauge,
        &[],
        Start::Zero,
        "script calls' changes waiting in the leader's shards' outboxes for the journal",
    ),
    metric(
        JOURNAL_ERRORS,
        Kind::Counter,
        &["op"],
        Start::Each(&["copy", "marker", "trim", "reconcile", "restore"]),
        "failed journal calls of the leader: `copy`, `marker`, `trim`, `reconcile`, `restore` (`journal.auto_restore`)",
    ),
    metric(
        JOURNAL_DEADLOCKS,
        Kind::Counter,
        &["op"],
        Start::Each(&["push", "copy"]),
        "journal transactions InnoDB ended as a deadlock's victim and that were run again (up to four times in all): `push` (pushes' rows), `copy` (the outbox's changes)",
    ),
    metric(
        JOURNAL_REDIS_LOST,
        Kind::Gauge,
        &[],
        Start::Zero,
        "1 while Redis has lost the journal's data: forwarding waits for a restore",
    ),
    metric(
        JOURNAL_RESTORED,
        Kind::Counter,
        &[],
        Start::Zero,
        "messages scheduled again from the journal",
    ),
    metric(
        JOURNAL_TRIMMED,
        Kind::Counter,
        &[],
        Start::Zero,
        "finished messages deleted from the journal after `journal.retention`",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_described_once() {
        let mut names: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before);
    }
}
