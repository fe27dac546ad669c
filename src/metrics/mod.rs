//! Metric names, in one place, and the Prometheus recorder.
//!
//! A metric, its log field and its config key share one name where they describe
//! the same thing.
//!
//! - `table`: `METRICS`, every metric's type, labels, help text and the series it
//!   has from the start (the metrics table of docs/metrics.md must equal it).
//! - `known`: those series for one configuration (`known_series`), created at the
//!   daemon's start (`register_known`) so that alerts see them before any event.
//! - `exporter`: the Prometheus recorder (`install`) and the process metrics
//!   (`upkeep`).
//! - `pending`: `PendingStreams`, which bounds the per-stream pending series;
//!   `streams`: `stream_label`, which bounds the other per-stream series.
//! - `lateness`: the in-memory lateness histograms behind `/v1/stats`.

mod exporter;
mod known;
mod lateness;
mod pending;
mod streams;
mod table;

pub use exporter::{install, upkeep};
pub use known::{Series, known_series, register_known};
pub use lateness::{
    LatenessSummary, Sample, lateness_summary, record_batch, record_dead, take_sample,
};
pub use pending::{PendingStreams, REST_OF_STREAMS};
pub use streams::{OTHER_STREAMS, schedule_label, set_max_streams, stream_label};
pub use table::{Described, Kind, METRICS, Start};

pub const SCHEDULED: &str = "delayq_messages_scheduled_total";
pub const DUPLICATES: &str = "delayq_messages_duplicate_total";
pub const CANCELLED: &str = "delayq_messages_cancelled_total";
pub const RESCHEDULED: &str = "delayq_messages_rescheduled_total";
pub const SCHEDULE_OCCURRENCES: &str = "delayq_schedule_occurrences_total";
pub const SCHEDULE_MISSED: &str = "delayq_schedule_missed_total";
pub const SCHEDULE_SKIPPED: &str = "delayq_schedule_skipped_total";
pub const FORWARDED: &str = "delayq_messages_forwarded_total";
pub const EXPIRED: &str = "delayq_messages_expired_total";
pub const DEAD: &str = "delayq_messages_dead_total";
pub const PENDING: &str = "delayq_pending_messages";
pub const FORWARD_BATCH: &str = "delayq_forward_batch_messages";
pub const SCRIPT_SECONDS: &str = "delayq_script_duration_seconds";
pub const LATENESS_SECONDS: &str = "delayq_forward_lateness_seconds";
pub const HELD_WAIT_SECONDS: &str = "delayq_forward_held_wait_seconds";
pub const FORWARD_ERRORS: &str = "delayq_forward_errors_total";
pub const RECORDS_TRIMMED: &str = "delayq_records_trimmed_total";
pub const IS_LEADER: &str = "delayq_is_leader";
pub const EPOCH: &str = "delayq_leader_epoch";
pub const TRANSITIONS: &str = "delayq_leadership_transitions_total";
/// `election.mode = "per_shard"`: whether this node leads a group, and its epoch.
pub const GROUP_LEADER: &str = "delayq_group_leader";
pub const GROUP_EPOCH: &str = "delayq_group_epoch";
/// Groups this node resigned to spread the groups over the nodes.
pub const GROUPS_RESIGNED: &str = "delayq_groups_resigned_total";
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
/// Inbox reads that took entries, by way (marked, entries).
pub const INBOX_READS: &str = "delayq_inbox_reads_total";
/// Failed inbox reads or batches (retried with backoff).
pub const INBOX_ERRORS: &str = "delayq_inbox_errors_total";
/// 1 while this node's probe write to Redis succeeds, 0 while Redis refuses writes
/// (READONLY, OOM, MISCONF) or does not answer.
pub const REDIS_WRITABLE: &str = "delayq_redis_writable";
/// 1 while a Redis master's `maxmemory-policy` (an `allkeys-*` one, with a
/// `maxmemory` set) can evict delayq's keys, 0 otherwise.
pub const REDIS_EVICTING: &str = "delayq_redis_evicting";
/// 1 while a Redis master uses more than 95% of its `maxmemory`, or Redis refused
/// a write of this node's for want of memory (OOM) within the last 10 s; 0 otherwise.
pub const REDIS_NEARLY_FULL: &str = "delayq_redis_nearly_full";
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
/// Due messages a stream's own limit (`streams.max_rate`) holds back.
pub const HELD: &str = "delayq_held_messages";

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
/// Pushes the journal committed or failed (`[journal]`).
pub const JOURNAL_PUSHES: &str = "delayq_journal_pushes_total";
/// Changes (deliveries, expiries, dead letters, cancellations, new due times)
/// copied from the outbox into the journal.
pub const JOURNAL_CHANGES: &str = "delayq_journal_changes_total";
/// From a change in Redis to its commit in the journal.
pub const JOURNAL_LAG: &str = "delayq_journal_lag_seconds";
pub const JOURNAL_OUTBOX: &str = "delayq_journal_outbox_items";
pub const JOURNAL_ERRORS: &str = "delayq_journal_errors_total";
/// Journal transactions run again after InnoDB ended them as a deadlock's victim.
pub const JOURNAL_DEADLOCKS: &str = "delayq_journal_deadlocks_total";
/// 1 while Redis has lost the journal's data and forwarding waits for a restore.
pub const JOURNAL_REDIS_LOST: &str = "delayq_journal_redis_data_lost";
pub const JOURNAL_RESTORED: &str = "delayq_journal_restored_total";
pub const JOURNAL_TRIMMED: &str = "delayq_journal_trimmed_total";

/// Counts messages a restore scheduled again.
pub fn journal_restored(n: u64, dry_run: bool) {
    if !dry_run {
        metrics::counter!(JOURNAL_RESTORED).increment(n);
    }
}

/// Counts a group commit of `rows` pushes.
pub fn journal_commit(rows: usize, ok: bool) {
    let outcome = if ok { "committed" } else { "failed" };
    metrics::counter!(JOURNAL_PUSHES, "outcome" => outcome).increment(rows as u64);
}
