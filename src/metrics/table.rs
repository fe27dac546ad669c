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
        "messages scheduled, per target stream: the 100 largest, the rest under `(the rest)`; refreshed by the leader every 2 to 30 s (longer for a larger backlog), 0 on standbys",
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
        GROUP_LEADER,
        Kind::Gauge,
        &["group"],
        "election.mode = \"per_shard\": 1 while this node leads the group, else 0",
    ),
    metric(
        GROUP_EPOCH,
        Kind::Gauge,
        &["group"],
        "election.mode = \"per_shard\": epoch of this node's latest term of the group",
    ),
    metric(
        GROUPS_RESIGNED,
        Kind::Counter,
        &[],
        "election groups this node resigned so that every node leads its share",
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
        "how long the rate limits take to drain what is overdue: overdue messages / forwarder.max_rate, or a stream's held messages / its streams.max_rate, whichever is longer (0 without a limit)",
    ),
    metric(
        HELD,
        Kind::Gauge,
        &["stream"],
        "due messages held back by their stream's own limit (streams.max_rate); refreshed every 5 s by the leader",
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
    metric(
        JOURNAL_PUSHES,
        Kind::Counter,
        &["outcome"],
        "pushes the journal committed (`committed`) or could not (`failed`: answered 503)",
    ),
    metric(
        JOURNAL_CHANGES,
        Kind::Counter,
        &[],
        "deliveries, expiries, dead letters, cancellations and new due times copied into the journal",
    ),
    metric(
        JOURNAL_LAG,
        Kind::Histogram,
        &[],
        "from a change in Redis to its commit in the journal",
    ),
    metric(
        JOURNAL_OUTBOX,
        Kind::Gauge,
        &[],
        "script calls' changes waiting in the leader's shards' outboxes for the journal",
    ),
    metric(
        JOURNAL_ERRORS,
        Kind::Counter,
        &["op"],
        "failed journal calls of the leader: `copy`, `marker`, `trim`, `reconcile`",
    ),
    metric(
        JOURNAL_REDIS_LOST,
        Kind::Gauge,
        &[],
        "1 while Redis has lost the journal's data: forwarding waits for a restore",
    ),
    metric(
        JOURNAL_RESTORED,
        Kind::Counter,
        &[],
        "messages scheduled again from the journal",
    ),
    metric(
        JOURNAL_TRIMMED,
        Kind::Counter,
        &[],
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
