use super::*;

/// A row as results.json has it reads as `kind` and writes back the same.
#[track_caller]
fn check(json: &str, kind: &str) {
    let value: serde_json::Value = serde_json::from_str(json).expect("JSON");
    let row: Row = serde_json::from_value(value.clone()).expect("a row");
    let read = match &row.figures {
        Figures::Delayq(d) => d.scenario(),
        Figures::Ceiling(Ceiling::Burst(_)) => "ceiling burst",
        Figures::Bullmq(Bullmq::Burst(_)) => "bullmq burst",
        Figures::Bullmq(Bullmq::Spread(_)) => "bullmq spread",
    };
    assert_eq!(read, kind);
    assert_eq!(serde_json::to_value(&row).expect("written"), value);
}

/// JSON fields of rows, for tests of what reads them too.
pub(in crate::cli::bench) const MEASURED: &str = r#""messages": 1000, "load_average": "0.5 0.4 0.3", "throughput_per_sec": 500, "redis_unresponsive_ms": 2.8, "redis_longest_event_ms": 1"#;
pub(in crate::cli::bench) const TALLY: &str =
    r#""tally": {"delivered": 1000, "lost": 0, "duplicated": 0, "unexpected": 0}"#;
/// The ceiling's burst of 1000 messages in run 1, drained at `throughput` msg/s.
pub(in crate::cli::bench) fn ceiling_burst(throughput: u64) -> Row {
    let measured = MEASURED.replace(
        "\"throughput_per_sec\": 500",
        &format!("\"throughput_per_sec\": {throughput}"),
    );
    serde_json::from_str(&format!(
        r#"{{"system": "ceiling", "scenario": "burst", {measured}, "cpu_us_per_message": {{"redis": 1.8}}, {TALLY}, "drain_ms": 1, "run": 1}}"#
    ))
    .expect("a ceiling row")
}
const LATENESS: &str = r#""lateness_ms": {"p50": 2, "p99": 5, "p99_9": 8, "max": 9}"#;

#[test]
fn every_kind_of_row_reads_and_writes_back() {
    let delayq = r#""cpu_us_per_message": {"redis": 8.0, "delayq": 10.0}"#;
    let row = |system: &str, scenario: &str, rest: &str| {
        format!(
            r#"{{"system": "{system}", "scenario": "{scenario}", {MEASURED}, {rest}, "run": 1}}"#
        )
    };
    check(
        &row(
            "delayq",
            "burst",
            &format!(
                r#"{delayq}, {TALLY}, {LATENESS}, "schedule_rate_per_sec": 18572, "due_spread_ms": 0, "drain_ms": 20, "bytes_per_pending_message": 246, "bytes_per_record": 45"#
            ),
        ),
        "burst",
    );
    check(
        &row(
            "delayq",
            "burst",
            &format!(
                r#"{delayq}, {TALLY}, {LATENESS}, "schedule_rate_per_sec": 18572, "due_spread_ms": 0, "drain_ms": 20, "bytes_per_pending_message": 246, "bytes_per_record": 120, "records_layout": "hash""#
            ),
        ),
        "burst",
    );
    let no_records = row(
        "delayq",
        "burst",
        &format!(
            r#"{delayq}, {TALLY}, {LATENESS}, "schedule_rate_per_sec": 18572, "due_spread_ms": 0, "drain_ms": 20, "bytes_per_pending_message": 246, "bytes_per_record": 2, "records_retention": "0s""#
        ),
    );
    check(&no_records, "burst");
    let row_read: Row = serde_json::from_str(&no_records).expect("a row");
    let Figures::Delayq(Delayq::Burst(b)) = &row_read.figures else {
        panic!("a burst");
    };
    assert_eq!(b.layouts().as_deref(), Some("records.retention = 0s"));
    check(
        &row(
            "ceiling",
            "burst",
            &format!(r#""cpu_us_per_message": {{"redis": 1.8}}, {TALLY}, "drain_ms": 5"#),
        ),
        "ceiling burst",
    );
    let spread = format!(
        r#"{delayq}, {TALLY}, "rate_per_sec": 500, "on_time": true, "producer_kept_up": true, {LATENESS}"#
    );
    check(&row("delayq", "spread", &spread), "spread");
    check(
        &row(
            "delayq",
            "backlog-spread",
            &format!(
                r#"{spread}, "backlog": 2000, "schedule_rate_per_sec": 18225, "bytes_per_pending_message": 245, "backlog_still_pending": 2000"#
            ),
        ),
        "backlog-spread",
    );
    for scenario in ["ingest-http", "ingest-http-ids-generated"] {
        check(
            &row(
                "delayq",
                scenario,
                &format!(
                    r#"{delayq}, "tally": {{"delivered": 1000, "lost": 0, "duplicated": 0, "refused": 0}}, "request_ms": {{"p50": 19.5, "p99": 61.2, "p99_9": 62.1, "max": 62.1}}"#
                ),
            ),
            scenario,
        );
    }
    let ingest = format!(r#"{delayq}, "tally": {{"delivered": 1000, "lost": 0, "duplicated": 0}}"#);
    for scenario in ["ingest-http-batch", "ingest-http-batch-ids-generated"] {
        check(
            &row("delayq", scenario, &format!(r#"{ingest}, "batch": 500"#)),
            scenario,
        );
    }
    for scenario in ["ingest-inbox-drain", "ingest-inbox"] {
        check(
            &row(
                "delayq",
                scenario,
                &format!(r#"{ingest}, "producer_rate_per_sec": 164875"#),
            ),
            scenario,
        );
    }
    for scenario in [
        "failover-sigterm",
        "failover-sigkill",
        "failover-pause",
        "failover-redis-cut",
    ] {
        check(
            &row(
                "delayq",
                scenario,
                &format!(
                    r#""cpu_us_per_message": {{"redis": 317.8, "delayq": null}}, {TALLY}, "rate_per_sec": 500, "lease_ttl_ms": 2000, "takeover_ms": null, "old_leader_exit_ms": 166.1, "forwarding_gap_ms": 22, "forwarding_gap_ended_after_stop_ms": -484, "lateness_ms": null"#
                ),
            ),
            scenario,
        );
    }
    let worker = r#""cpu_us_per_message": {"redis": 12.5, "worker": null}"#;
    check(
        &row(
            "bullmq",
            "burst",
            &format!(
                r#"{worker}, {TALLY}, "schedule_rate_per_sec": null, "drain_ms": 100, "lateness_ms": {{"p50": -1, "p99": 12, "p99_9": 13, "max": 14}}, "bytes_per_pending_message": 500, "worker_concurrency": 100"#
            ),
        ),
        "bullmq burst",
    );
    check(
        &row(
            "bullmq",
            "spread",
            &format!(
                r#"{worker}, {TALLY}, "rate_per_sec": 500, "on_time": false, "producer_kept_up": true, {LATENESS}, "worker_concurrency": 100"#
            ),
        ),
        "bullmq spread",
    );
}

#[test]
fn a_row_of_another_kind_is_refused() {
    let unknown = format!(
        r#"{{"system": "delayq", "scenario": "sprint", {MEASURED}, "cpu_us_per_message": {{"redis": 1.0}}, {TALLY}, "run": 1}}"#
    );
    assert!(serde_json::from_str::<Row>(&unknown).is_err());
}
