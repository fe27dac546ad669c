//! The Prometheus recorder: buckets, help texts, and the process metrics read on
//! every upkeep. The series that start at zero are `known`'s.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::{FORWARD_BATCH, HELD_WAIT_SECONDS, JOURNAL_LAG, Kind, LATENESS_SECONDS, METRICS};

/// Installs the process-wide recorder the first time, and returns its handle.
/// Every metric gets its help text; the process metrics are read once. The series
/// known from the start are created by `register_known`, which needs the
/// configuration.
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
                        .and_then(|b| {
                            // A burst of deliveries can outrun the journal for a while.
                            b.set_buckets_for_metric(Matcher::Full(JOURNAL_LAG.into()), &lateness)
                        })
                        .and_then(|b| {
                            b.set_buckets_for_metric(
                                Matcher::Full(HELD_WAIT_SECONDS.into()),
                                &lateness,
                            )
                        })
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
            }
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
