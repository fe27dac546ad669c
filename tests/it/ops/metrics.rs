//! The metrics an operator reads about: the README's table equals what delayq
//! describes and exports, and the alert rules pass their tests and name only
//! exported metrics.

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::tool;
use crate::support::{Cluster, documented_metrics, eventually, repo, text};

/// Documented metrics a plain leader on etcd does not export, and why (the rest
/// are there from the start: see `Start` in src/metrics/table.rs).
const ONLY_WITH: &[(&str, &str)] = &[
    ("delayq_group_leader", "election.mode = \"per_shard\""),
    ("delayq_group_epoch", "election.mode = \"per_shard\""),
    ("delayq_held_messages", "streams.max_rate"),
    ("delayq_messages_redelivered_total", "[delivery] groups"),
    ("delayq_messages_dead_lettered_total", "[delivery] groups"),
    ("delayq_entries_pending_too_long", "[delivery] groups"),
    ("delayq_sweep_entries_total", "[delivery] groups"),
    ("delayq_sweep_group_missing", "[delivery] groups"),
    ("delayq_dead_letters_replayed_total", "a dead-letter replay"),
    ("delayq_dead_letters_purged_total", "a dead-letter purge"),
    ("delayq_schedule_occurrences_total", "a recurring schedule"),
    (
        "delayq_forward_held_wait_seconds",
        "a paused or rate-limited stream",
    ),
    ("delayq_schedule_missed_total", "a schedule's misfire"),
    ("delayq_schedule_skipped_total", "a schedule's misfire"),
];

/// The README's table as `src/metrics/table.rs` describes it.
fn described_metrics() -> Vec<(String, String, String, String)> {
    delayq::metrics::METRICS
        .iter()
        .map(|m| {
            (
                m.name.to_owned(),
                m.labels.join(","),
                m.kind.as_str().to_owned(),
                m.help.to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_documented_metrics_table_matches_what_delayq_exports() {
    let documented = documented_metrics();
    let described = described_metrics();
    let table: String = described
        .iter()
        .map(|(name, labels, kind, help)| {
            let labels = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{labels}}}")
            };
            format!("| `{name}{labels}` | {kind} | {help} |\n")
        })
        .collect();
    assert!(
        documented == described,
        "the metrics table of docs/metrics.md differs from src/metrics/table.rs (METRICS); it should read:\n{table}"
    );

    // One node on etcd, leading (Cluster::start waits for that).
    let cluster = Cluster::start(1, 1, "").await;
    let api = &cluster.apis[0];
    for body in [
        json!({ "id": "m1", "stream": "s", "payload": "x", "delay_ms": 0 }),
        json!({ "id": "m1", "stream": "s", "payload": "x", "delay_ms": 0 }),
        json!({ "id": "m2", "stream": "s", "payload": "x", "delay": "1h" }),
    ] {
        api.post("/v1/messages", body).await;
    }
    api.delete("/v1/messages/m2").await;
    let text = eventually(Duration::from_secs(10), "forwarded and counted", || async {
        let text = api.metrics().await?;
        (text.contains("delayq_messages_forwarded_total{stream=\"s\"} 1")
            && text.contains("delayq_keepalive_seconds"))
        .then_some(text)
    })
    .await;
    // Two new messages (201) and one duplicate (200).
    assert!(
        text.contains(
            "delayq_http_requests_total{method=\"POST\",route=\"/v1/messages\",status=\"201\"} 2"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "delayq_http_requests_total{method=\"POST\",route=\"/v1/messages\",status=\"200\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("route=\"/v1/messages/{id}\""),
        "ids must not become labels: {text}"
    );
    assert!(text.contains("delayq_build_info{version=\""), "{text}");
    let exported: std::collections::BTreeSet<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    assert!(exported.len() >= 15, "{exported:?}");
    // And the other way: every documented metric is exported here, but those that
    // only a feature this node does not use (or an event that did not happen) makes.
    let missing: Vec<&str> = documented
        .iter()
        .map(|(name, ..)| name.as_str())
        .filter(|name| !exported.iter().any(|(e, _)| e == name))
        .filter(|name| !ONLY_WITH.iter().any(|(only, _)| only == name))
        .collect();
    assert!(
        missing.is_empty(),
        "in the metrics table of docs/metrics.md but not exported: {missing:?}"
    );
    for (name, kind) in exported {
        let row = documented.iter().find(|(d, ..)| d == name);
        assert!(
            row.is_some(),
            "{name} is exported but missing from the metrics table of docs/metrics.md"
        );
        assert_eq!(row.unwrap().2, kind, "{name}: type");
    }
}

/// The alert rules load in Prometheus, pass their unit tests
/// (`config/alerts.test.yml`), and name only metrics delayq exports.
#[test]
fn the_alert_rules_are_valid_and_use_exported_metrics() {
    let promtool = tool("promtool");
    for args in [
        ["check", "rules", "config/alerts.yml"],
        ["test", "rules", "config/alerts.test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }

    let rules = std::fs::read_to_string(repo().join("config/alerts.yml")).unwrap();
    let count = |key: &str| {
        rules
            .lines()
            .filter(|l| l.trim_start().starts_with(key))
            .count()
    };
    let alerts = count("- alert: ");
    assert!(alerts >= 8, "{alerts} alerts");
    for key in [
        "expr: ",
        "for: ",
        "severity: ",
        "summary: ",
        "description: ",
    ] {
        assert_eq!(count(key), alerts, "every alert has its {key:?}");
    }
    let exported: Vec<&str> = delayq::metrics::METRICS.iter().map(|m| m.name).collect();
    let mut used = 0;
    for (at, _) in rules.match_indices("delayq_") {
        let name: String = rules[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        assert!(
            exported.contains(&name.as_str()) || exported.contains(&base),
            "config/alerts.yml names {name}, which delayq does not export"
        );
        used += 1;
    }
    assert!(used >= 8, "{used}");
}
