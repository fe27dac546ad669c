//! The drill's report: per scenario, takeover times and what happened to the
//! messages, as JSON (`--json`) and as a table.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::load::PhaseCount;
use super::target::Target;
use super::{DrillArgs, Scenario};

/// One round of one scenario.
#[derive(Clone, Debug)]
pub(super) struct RoundResult {
    /// Time from the fault to a new leader (for etcd: the longest stretch with
    /// no leader, zero if the leader kept leading; for a Redis failover: to the
    /// first entry written on the new master). None: no takeover in time.
    pub takeover: Option<Duration>,
    pub leader_changed: bool,
    pub problem: Option<String>,
}

/// The whole drill.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Report {
    /// Nothing lost or duplicated, every round ran and took over, and something
    /// was sent.
    pub ok: bool,
    pub cluster: Cluster,
    /// The nodes' names.
    pub nodes: Vec<String>,
    pub stream: String,
    pub parameters: Parameters,
    /// The steady load first, then each scenario's rounds together.
    pub scenarios: Vec<ScenarioResult>,
    pub total: PhaseCount,
    /// Entries the drill read as they came that the stream no longer holds: a
    /// Redis failover discarded them with the old master's data, and the
    /// messages were forwarded again on the new one (the counts above are the
    /// stream's at the end). A consumer may have read those messages twice.
    #[serde(default)]
    pub discarded_entries: u64,
}

/// Whether the drill started the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Cluster {
    Local,
    Existing,
}

impl Cluster {
    fn as_str(self) -> &'static str {
        match self {
            Cluster::Local => "local",
            Cluster::Existing => "existing",
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Parameters {
    pub rounds: u32,
    pub rate_per_second: u32,
    pub delay_ms: u64,
    /// The nodes' lease TTL, when the drill started them.
    pub lease_ttl_ms: Option<u64>,
    pub etcd_hold_ms: u64,
    /// Whether the drill started the nodes on a Redis Cluster.
    #[serde(default)]
    pub redis_cluster: bool,
    #[serde(default)]
    pub redis_sentinel: bool,
}

/// One scenario's rounds, or the steady load before the first ("steady", no
/// rounds, no faults).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct ScenarioResult {
    pub scenario: String,
    pub rounds: usize,
    /// None: no round took over (and none for the steady load).
    pub takeover: Option<Takeover>,
    #[serde(flatten)]
    pub faults: Option<Faults>,
    pub messages: PhaseCount,
}

/// What the faults of a scenario's rounds did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Faults {
    pub leader_changes: usize,
    pub problems: Vec<String>,
}

/// Takeover times over a scenario's rounds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Takeover {
    pub min_ms: u64,
    pub median_ms: u64,
    pub max_ms: u64,
    /// Each round's, in order; null where a round had none.
    pub each_ms: Vec<Option<u64>>,
}

pub(super) fn ms(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2}s", d.as_secs_f64())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Of sorted values; the mean of the middle two for an even count.
fn median(sorted: &[u64]) -> u64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2
    }
}

fn takeover_stats(rounds: &[RoundResult]) -> Option<Takeover> {
    let each_ms: Vec<Option<u64>> = rounds
        .iter()
        .map(|r| r.takeover.map(|t| t.as_millis() as u64))
        .collect();
    let mut times: Vec<u64> = each_ms.iter().flatten().copied().collect();
    times.sort_unstable();
    Some(Takeover {
        min_ms: *times.first()?,
        median_ms: median(&times),
        max_ms: *times.last()?,
        each_ms,
    })
}

pub(super) fn build_report(
    args: &DrillArgs,
    target: &Target,
    stream: &str,
    scenarios: &[Scenario],
    results: &[Vec<RoundResult>],
    counts: &[PhaseCount],
    discarded_entries: u64,
) -> Report {
    let mut rows = vec![ScenarioResult {
        scenario: "steady".to_owned(),
        rounds: 0,
        takeover: None,
        faults: None,
        messages: counts[0].clone(),
    }];
    for (k, scenario) in scenarios.iter().enumerate() {
        let rounds = results.get(k).map(Vec::as_slice).unwrap_or(&[]);
        rows.push(ScenarioResult {
            scenario: scenario.name().to_owned(),
            rounds: rounds.len(),
            takeover: takeover_stats(rounds),
            faults: Some(Faults {
                leader_changes: rounds.iter().filter(|r| r.leader_changed).count(),
                problems: rounds.iter().filter_map(|r| r.problem.clone()).collect(),
            }),
            // A scenario the drill stopped before has no phase of its own.
            messages: counts.get(k + 1).cloned().unwrap_or_default(),
        });
    }
    let total = counts.iter().fold(PhaseCount::default(), |mut t, c| {
        t.sent += c.sent;
        t.delivered += c.delivered;
        t.lost += c.lost;
        t.duplicated += c.duplicated;
        t.max_lateness_ms = t.max_lateness_ms.max(c.max_lateness_ms);
        t.unconfirmed += c.unconfirmed;
        t
    });
    let rounds_missing =
        scenarios.len() * args.rounds as usize != results.iter().map(Vec::len).sum::<usize>();
    let problems = results.iter().flatten().any(|r| r.problem.is_some()) || rounds_missing;
    Report {
        ok: total.lost == 0 && total.duplicated == 0 && !problems && total.sent > 0,
        cluster: if target.is_local() {
            Cluster::Local
        } else {
            Cluster::Existing
        },
        nodes: target.nodes().iter().map(|n| n.name.clone()).collect(),
        stream: stream.to_owned(),
        parameters: Parameters {
            rounds: args.rounds,
            rate_per_second: args.rate,
            delay_ms: args.delay.as_millis() as u64,
            lease_ttl_ms: target
                .is_local()
                .then_some(args.lease_ttl.as_millis() as u64),
            etcd_hold_ms: args.hold.as_millis() as u64,
            // Refused with an existing cluster (`--node`).
            redis_cluster: args.redis_cluster,
            redis_sentinel: args.redis_sentinel,
        },
        scenarios: rows,
        total,
        discarded_entries,
    }
}

pub(super) fn print_table(report: &Report) {
    let p = &report.parameters;
    println!(
        "\ndelayq drill: {} cluster ({}){}, {} msg/s due {} ms after sending, {} rounds per scenario{}",
        report.cluster.as_str(),
        report.nodes.join(", "),
        if p.redis_cluster {
            " on a Redis Cluster"
        } else if p.redis_sentinel {
            " on Redis behind Sentinel"
        } else {
            ""
        },
        p.rate_per_second,
        p.delay_ms,
        p.rounds,
        p.lease_ttl_ms
            .map(|t| format!(", lease TTL {} ms", t))
            .unwrap_or_default(),
    );
    println!(
        "\n{:<14} {:>6}  {:>26}  {:>7} {:>9} {:>5} {:>10}  {:>12}",
        "scenario",
        "rounds",
        "takeover min/median/max",
        "sent",
        "delivered",
        "lost",
        "duplicated",
        "max lateness"
    );
    let row = |name: &str, rounds: String, takeover: String, m: &PhaseCount| {
        println!(
            "{:<14} {:>6}  {:>26}  {:>7} {:>9} {:>5} {:>10}  {:>12}",
            name,
            rounds,
            takeover,
            m.sent,
            m.delivered,
            m.lost,
            m.duplicated,
            ms(Duration::from_millis(m.max_lateness_ms)),
        );
    };
    for s in &report.scenarios {
        // The steady load had no rounds and no faults.
        let steady = s.faults.is_none();
        let takeover = match &s.takeover {
            _ if steady => "-".to_owned(),
            None => "none".to_owned(),
            Some(t) => {
                let f = |v: u64| ms(Duration::from_millis(v));
                format!("{} / {} / {}", f(t.min_ms), f(t.median_ms), f(t.max_ms))
            }
        };
        let rounds = if steady {
            "-".to_owned()
        } else {
            s.rounds.to_string()
        };
        row(&s.scenario, rounds, takeover, &s.messages);
    }
    row("total", String::new(), String::new(), &report.total);
    println!(
        "\ntakeover: fault → another node leads under a newer epoch (etcd: longest stretch with no leader; redis-failover: SENTINEL FAILOVER → the first entry written on the new master)."
    );
    println!(
        "lateness: stream entry time − due time, both Redis's clock; per scenario, the messages that fell due during it or were still undelivered when it began."
    );
    if report.discarded_entries > 0 {
        println!(
            "{} entries read as they came were discarded by a Redis failover and their messages forwarded again (counted once, from the stream as it stands; a consumer may have read them twice).",
            report.discarded_entries
        );
    }
    let unconfirmed = report.total.unconfirmed;
    if unconfirmed > 0 {
        println!(
            "{unconfirmed} pushes were never confirmed by any node (counted only if delivered)."
        );
    }
    for s in &report.scenarios {
        for p in s.faults.iter().flat_map(|f| &f.problems) {
            println!("problem in {}: {p}", s.scenario);
        }
    }
    println!(
        "\n{}",
        if report.ok {
            "OK: nothing lost, nothing duplicated, every takeover happened."
        } else {
            "FAILED: see the lost and duplicated columns and the problems above."
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takeover_statistics() {
        let round = |ms: Option<u64>| RoundResult {
            takeover: ms.map(Duration::from_millis),
            leader_changed: ms.is_some(),
            problem: None,
        };
        let stats = takeover_stats(&[
            round(Some(300)),
            round(Some(100)),
            round(None),
            round(Some(200)),
        ]);
        assert_eq!(
            stats,
            Some(Takeover {
                min_ms: 100,
                median_ms: 200,
                max_ms: 300,
                each_ms: vec![Some(300), Some(100), None, Some(200)],
            })
        );
        assert_eq!(median(&[100, 200, 400, 1000]), 300);
        assert_eq!(takeover_stats(&[round(None)]), None);
    }

    #[test]
    fn a_report_reads_and_writes_back() {
        let messages = r#"{"sent": 40, "delivered": 40, "lost": 0, "duplicated": 0, "max_lateness_ms": 12, "unconfirmed_pushes": 1}"#;
        let json = format!(
            r#"{{"ok": true, "cluster": "existing", "nodes": ["a", "b"], "stream": "drill-x",
            "parameters": {{"rounds": 2, "rate_per_second": 20, "delay_ms": 1000, "lease_ttl_ms": null, "etcd_hold_ms": 4000, "redis_cluster": false, "redis_sentinel": false}},
            "scenarios": [
                {{"scenario": "steady", "rounds": 0, "takeover": null, "messages": {messages}}},
                {{"scenario": "kill", "rounds": 2, "takeover": {{"min_ms": 1, "median_ms": 2, "max_ms": 3, "each_ms": [3, null]}},
                  "leader_changes": 1, "problems": ["no new leader within 5s"], "messages": {messages}}}
            ],
            "total": {messages}, "discarded_entries": 0}}"#
        );
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        let report: Report = serde_json::from_value(value.clone()).unwrap();
        assert!(report.scenarios[0].faults.is_none());
        assert_eq!(
            report.scenarios[1].faults.as_ref().unwrap().leader_changes,
            1
        );
        assert_eq!(report.total.unconfirmed, 1);
        assert_eq!(serde_json::to_value(&report).unwrap(), value);
        // A report from before `redis_cluster`, `redis_sentinel` and
        // `discarded_entries` were reported still reads.
        let mut older = value.clone();
        let parameters = older["parameters"].as_object_mut().unwrap();
        parameters.remove("redis_cluster");
        parameters.remove("redis_sentinel");
        older.as_object_mut().unwrap().remove("discarded_entries");
        let older: Report = serde_json::from_value(older).unwrap();
        assert!(!older.parameters.redis_cluster && !older.parameters.redis_sentinel);
        assert_eq!(older.discarded_entries, 0);
    }
}
