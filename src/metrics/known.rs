//! The series delayq exports from its start, before their first event: every
//! metric's [`Start`] in [`METRICS`], for one configuration.

use crate::config::Config;

use super::{Described, Kind, METRICS, Start};

/// One series: a metric and its label values, in the order of its labels.
#[derive(Clone, Debug)]
pub struct Series {
    pub metric: &'static Described,
    pub labels: Vec<(&'static str, String)>,
}

impl Series {
    /// The series as `/metrics` writes it before its value: `name{label="value",…}`,
    /// or the bare name without labels (a histogram's lines add `_bucket`, `_sum`,
    /// `_count` to the name).
    pub fn selector(&self) -> String {
        if self.labels.is_empty() {
            return self.metric.name.to_owned();
        }
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(label, value)| format!("{label}=\"{value}\""))
            .collect();
        format!("{}{{{}}}", self.metric.name, labels.join(","))
    }

    /// Creates the series in the recorder, at 0 (a histogram with no samples); a
    /// series that exists already keeps its value.
    fn register(&self) {
        let labels: Vec<metrics::Label> = self
            .labels
            .iter()
            .map(|(label, value)| metrics::Label::new(*label, value.clone()))
            .collect();
        let name = self.metric.name;
        match self.metric.kind {
            Kind::Counter => {
                let _ = metrics::counter!(name, labels);
            }
            Kind::Gauge => {
                let _ = metrics::gauge!(name, labels);
            }
            Kind::Histogram => {
                let _ = metrics::histogram!(name, labels);
            }
        }
    }
}

/// Every series `config` lets delayq know at its start, in [`METRICS`]' order.
pub fn known_series(config: &Config) -> Vec<Series> {
    let mut series = Vec::new();
    for metric in METRICS {
        for values in label_values(metric, config) {
            debug_assert_eq!(values.len(), metric.labels.len(), "{}", metric.name);
            series.push(Series {
                metric,
                labels: metric.labels.iter().copied().zip(values).collect(),
            });
        }
    }
    series
}

/// Creates every series of [`known_series`] in the installed recorder (see
/// `install`), without changing the value of any that exists already. Called at
/// the daemon's start, before anything is counted.
pub fn register_known(config: &Config) {
    for series in known_series(config) {
        series.register();
    }
}

/// The label values of each series of `metric` known at the start, each in the
/// order of the metric's labels.
fn label_values(metric: &Described, config: &Config) -> Vec<Vec<String>> {
    let numbered = |n: u16| (0..n).map(|i| vec![i.to_string()]).collect();
    match metric.start {
        Start::Zero => vec![Vec::new()],
        Start::ZeroWithEtcd if config.etcd.is_some() => vec![Vec::new()],
        Start::ZeroWithEtcd => Vec::new(),
        Start::Each(values) => values.iter().map(|v| vec![(*v).to_owned()]).collect(),
        Start::Shards if config.is_cluster() => Vec::new(),
        Start::Shards => numbered(config.redis.shards),
        Start::Groups if config.etcd.is_some() && config.election.per_shard => {
            numbered(config.election.groups)
        }
        Start::Groups => Vec::new(),
        Start::LimitedStreams => config
            .streams
            .max_rate
            .iter()
            .map(|(stream, _)| vec![stream.clone()])
            .collect(),
        Start::Watched(values) => {
            let mut out = Vec::new();
            for watched in &config.delivery.streams {
                let groups: Vec<Option<&String>> = if metric.labels.contains(&"group") {
                    watched.groups.iter().map(Some).collect()
                } else {
                    vec![None]
                };
                let values: Vec<Option<&str>> = if values.is_empty() {
                    vec![None]
                } else {
                    values.iter().copied().map(Some).collect()
                };
                for group in &groups {
                    for value in &values {
                        let labels = metric.labels.iter().map(|label| match *label {
                            "stream" => watched.stream.clone(),
                            "group" => group.cloned().unwrap_or_default(),
                            _ => value.unwrap_or_default().to_owned(),
                        });
                        out.push(labels.collect());
                    }
                }
            }
            out
        }
        Start::Later(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    fn config(toml: &str) -> Config {
        Config::from_toml(toml, Vec::<(String, String)>::new()).unwrap()
    }

    /// Shards, rate limits, watched streams and per-shard elections: every kind of
    /// label known from the configuration.
    const EVERYTHING: &str = r#"
[redis]
shards = 3
[etcd]
endpoints = ["http://127.0.0.1:2379"]
[election]
mode = "per_shard"
groups = 2
[streams.max_rate]
orders = 50
[delivery]
groups = ["workers"]
[delivery.streams.orders]
[delivery.streams.billing]
groups = ["invoicing", "audit"]
"#;

    /// What each [`Start`] says fits the metric's labels, and every metric without
    /// labels is there from the start: a new metric has to say which of its series
    /// are, or why none can be.
    #[test]
    fn every_metric_says_which_series_it_has_from_the_start() {
        for m in METRICS {
            let labels = m.labels;
            let fits = match m.start {
                Start::Zero | Start::ZeroWithEtcd => labels.is_empty(),
                Start::Each(values) => labels.len() == 1 && !values.is_empty(),
                Start::Shards => labels == ["shard"],
                Start::Groups => labels == ["group"],
                Start::LimitedStreams => labels == ["stream"],
                Start::Watched(values) => {
                    let rest = labels.iter().skip(1).filter(|l| **l != "group").count();
                    labels.first() == Some(&"stream")
                        && labels.iter().skip(1).all(|l| *l != "stream")
                        && rest == usize::from(!values.is_empty())
                }
                Start::Later(why) => !labels.is_empty() && !why.is_empty(),
            };
            assert!(fits, "{}: {:?} with labels {labels:?}", m.name, m.start);
        }
    }

    #[test]
    fn the_series_known_from_a_configuration() {
        let series = known_series(&config(EVERYTHING));
        let shown: Vec<String> = series.iter().map(Series::selector).collect();
        let unique: BTreeSet<&String> = shown.iter().collect();
        assert_eq!(unique.len(), shown.len(), "{shown:#?}");
        for s in &series {
            let labels: Vec<&str> = s.labels.iter().map(|(l, _)| *l).collect();
            assert_eq!(labels, s.metric.labels, "{}", s.selector());
        }
        for expected in [
            "delayq_messages_cancelled_total",
            "delayq_is_leader",
            "delayq_forward_lateness_seconds",
            "delayq_etcd_reachable",
            "delayq_lease_remaining_seconds",
            "delayq_config_reloads_total{result=\"refused\"}",
            "delayq_pending_stream_messages{stream=\"(the rest)\"}",
            "delayq_script_duration_seconds{script=\"forward\"}",
            "delayq_forward_errors_total{shard=\"2\"}",
            "delayq_pending_messages{shard=\"0\"}",
            "delayq_group_leader{group=\"1\"}",
            "delayq_group_epoch{group=\"0\"}",
            "delayq_held_messages{stream=\"orders\"}",
            "delayq_messages_redelivered_total{stream=\"billing\"}",
            "delayq_messages_dead_lettered_total{stream=\"orders\",reason=\"max_attempts\"}",
            "delayq_entries_pending_too_long{stream=\"billing\",group=\"audit\"}",
            "delayq_sweep_group_missing{stream=\"orders\",group=\"workers\"}",
            "delayq_sweep_entries_total{stream=\"billing\",group=\"invoicing\",outcome=\"failed\"}",
            "delayq_journal_errors_total{op=\"restore\"}",
            &format!(
                "delayq_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            ),
        ] {
            assert!(unique.contains(&expected.to_owned()), "{expected}");
        }
        let count = |name: &str| series.iter().filter(|s| s.metric.name == name).count();
        assert_eq!(count(super::super::FORWARD_ERRORS), 3);
        assert_eq!(count(super::super::GROUP_LEADER), 2);
        // One per watched stream, group and outcome: orders/workers, billing/invoicing
        // and billing/audit.
        assert_eq!(count(super::super::SWEEP_ENTRIES), 3 * 7);
        assert_eq!(count(super::super::REDELIVERED), 2);
        assert_eq!(count(super::super::FORWARDED), 0);
        assert_eq!(count(super::super::HTTP_REQUESTS), 0);
    }

    #[test]
    fn without_etcd_watched_streams_or_limits_only_what_every_node_has() {
        let series = known_series(&config("[redis]\nshards = 2"));
        let names: BTreeSet<&str> = series.iter().map(|s| s.metric.name).collect();
        for absent in [
            super::super::ETCD_REACHABLE,
            super::super::LEASE_REMAINING,
            super::super::KEEPALIVE_SECONDS,
            super::super::GROUP_LEADER,
            super::super::HELD,
            super::super::SWEEP_ENTRIES,
            super::super::SWEEP_GROUP_MISSING,
        ] {
            assert!(!names.contains(absent), "{absent}");
        }
        let shards: Vec<String> = series
            .iter()
            .filter(|s| s.metric.name == super::super::PENDING)
            .map(Series::selector)
            .collect();
        assert_eq!(
            shards,
            [
                "delayq_pending_messages{shard=\"0\"}",
                "delayq_pending_messages{shard=\"1\"}"
            ]
        );
    }

    #[test]
    fn on_redis_cluster_the_shards_are_known_only_later() {
        let series = known_series(&config(
            "[redis]\nmode = \"cluster\"\nurl = \"redis://127.0.0.1:7000\"",
        ));
        assert!(
            series.iter().all(|s| s.metric.labels != ["shard"]),
            "{series:#?}"
        );
        assert!(
            series
                .iter()
                .any(|s| s.metric.name == super::super::SCHEDULED)
        );
    }

    /// The exporter shows every registered series before its first event: counters
    /// and gauges at 0, histograms with empty buckets; a value set before
    /// registering stays.
    #[test]
    fn registered_series_are_rendered_at_zero() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let config = config(EVERYTHING);
        let series = known_series(&config);
        metrics::with_local_recorder(&recorder, || {
            metrics::gauge!(super::super::IS_LEADER).set(1.0);
            register_known(&config);
        });
        let text = handle.render();
        for s in &series {
            let line = match s.metric.kind {
                Kind::Histogram if s.labels.is_empty() => format!("{}_count 0", s.metric.name),
                Kind::Histogram => {
                    let selector = s.selector();
                    let (name, labels) = selector.split_once('{').unwrap();
                    format!("{name}_count{{{labels} 0")
                }
                _ if s.metric.name == super::super::IS_LEADER => format!("{} 1", s.selector()),
                _ => format!("{} 0", s.selector()),
            };
            assert!(text.lines().any(|l| l == line), "{line}:\n{text}");
        }
    }
}
