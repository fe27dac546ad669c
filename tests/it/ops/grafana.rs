//! The Grafana dashboard shipped in `config/grafana/delayq.json`: every panel
//! queries metrics delayq exports, with labels those metrics carry, in PromQL that
//! `promtool` accepts; and it covers what an operator watches first.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use super::tool;
use crate::support::{repo, text};

/// Labels every scraped series carries besides its own, and a histogram's `le`.
const SCRAPE_LABELS: &[&str] = &["instance", "job", "le"];

/// Every panel, rows' nested ones included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        out.push(panel);
        if let Some(inner) = panel["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// The expression with the dashboard's variables as Prometheus itself would get
/// them.
fn as_sent(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$stream", ".*")
        .replace("$job", ".*")
}

/// The metric names an expression reads (a histogram's series by its family).
fn metric_names(expr: &str) -> Vec<(String, &'static [&'static str])> {
    let mut out = Vec::new();
    for prefix in ["delayq_", "process_"] {
        for (at, _) in expr.match_indices(prefix) {
            if at > 0 && expr[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = expr[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(&name)
                .to_owned();
            let metric = delayq::metrics::METRICS
                .iter()
                .find(|m| m.name == family || m.name == name)
                .unwrap_or_else(|| panic!("{expr}: {name} is not a metric delayq exports"));
            out.push((metric.name.to_owned(), metric.labels));
        }
    }
    out
}

/// Label names an expression selects on (`{a=~"…"}`) or groups by (`by (a, b)`).
fn label_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for part in expr.split('{').skip(1) {
        let inside = part.split('}').next().unwrap_or_default();
        for matcher in inside.split(',') {
            let name: String = matcher
                .trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    for part in expr.split("by (").skip(1) {
        for name in part.split(')').next().unwrap_or_default().split(',') {
            out.insert(name.trim().to_owned());
        }
    }
    out
}

#[test]
fn the_grafana_dashboard_reads_exported_metrics_in_valid_promql() {
    let path = repo().join("config/grafana/delayq.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
    assert_eq!(dashboard["uid"], "delayq");
    let mut exprs = Vec::new();
    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("an id")),
            "{title}: its id twice"
        );
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("expr");
            let metrics = metric_names(expr);
            assert!(
                !metrics.is_empty(),
                "{title}: {expr} reads no delayq metric"
            );
            // Every label named is one of the metrics' own, or the scrape's.
            for label in label_names(expr) {
                assert!(
                    SCRAPE_LABELS.contains(&label.as_str())
                        || metrics
                            .iter()
                            .any(|(_, labels)| labels.contains(&label.as_str())),
                    "{title}: {expr}: no metric it reads has the label {label}"
                );
            }
            exprs.push((title.to_owned(), as_sent(expr)));
        }
    }
    assert!(exprs.len() >= 30, "{} queries", exprs.len());
    let read: BTreeSet<String> = exprs
        .iter()
        .flat_map(|(_, e)| metric_names(e).into_iter().map(|(name, _)| name))
        .collect();
    for first in [
        "delayq_is_leader",
        "delayq_messages_forwarded_total",
        "delayq_forward_lateness_seconds",
        "delayq_held_messages",
        "delayq_pending_stream_messages",
        "delayq_redis_writable",
        "delayq_messages_dead_lettered_total",
        "delayq_journal_lag_seconds",
    ] {
        assert!(read.contains(first), "the dashboard does not show {first}");
    }

    // promtool parses each query as a recording rule's expression.
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("dashboard.yml");
    let mut yaml = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, expr)) in exprs.iter().enumerate() {
        yaml.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(expr).unwrap()
        ));
    }
    std::fs::write(&rules, yaml).unwrap();
    let out = Command::new(tool("promtool"))
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
