//! Metric names, in one place, and the Prometheus recorder.
//!
//! A metric, its log field and its config key share one name where they describe
//! the same thing.

use std::sync::OnceLock;

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
pub const KEEPALIVE_SECONDS: &str = "delayq_keepalive_seconds";
pub const HTTP_REQUESTS: &str = "delayq_http_requests_total";

/// Installs the process-wide recorder the first time, and returns its handle.
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
            handle
        })
        .clone()
}
