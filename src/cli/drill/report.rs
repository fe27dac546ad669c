//! The drill's report: per scenario, takeover times and what happened to the
//! messages, as JSON and as a table.

use std::time::Duration;

use serde_json::{Value, json};

use super::load::PhaseCount;
use super::target::Target;
use super::{DrillArgs, Scenario};

/// One round of one scenario.
#[derive(Clone, Debug)]
pub(super) struct RoundResult {
    /// Time from the fault to a new leader (for etcd: the longest stretch with
    /// no leader, zero if the leader kept leading). None: no takeover in time.
    pub takeover: Option<Duration>,
    pub leader_changed: bool,
    pub problem: Option<String>,
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

fn takeover_stats(rounds: &[RoundResult]) -> Value {
    let mut times: Vec<u64> = rounds
        .iter()
        .filter_map(|r| r.takeover.map(|t| t.as_millis() as u64))
        .collect();
    times.sort_unstable();
    if times.is_empty() {
        return Value::Null;
    }
    json!({
        "min_ms": times[0],
        "median_ms": median(&times),
        "max_ms": times[times.len() - 1],
        "each_ms": rounds.iter().map(|r| r.takeover.map(|t| t.as_millis() as u64)).collect::<Vec<_>>(),
    })
}

fn count_json(c: &PhaseCount) -> Value {
    json!({
        "sent": c.sent,
        "delivered": c.delivered,
        "lost": c.lost,
        "duplicated": c.duplicated,
        "max_lateness_ms": c.max_lateness_ms,
        "unconfirmed_pushes": c.unconfirmed,
    })
}

pub(super) fn build_report(
    args: &DrillArgs,
    target: &Target,
    stream: &str,
    scenarios: &[Scenario],
    results: &[Vec<RoundResult>],
    counts: &[PhaseCount],
) -> Value {
    let mut rows = vec![json!({
        "scenario": "steady",
        "rounds": 0,
        "takeover": Value::Null,
        "messages": count_json(&counts[0]),
    })];
    for (k, scenario) in scenarios.iter().enumerate() {
        let rounds = results.get(k).map(Vec::as_slice).unwrap_or(&[]);
        rows.push(json!({
            "scenario": scenario.name(),
            "rounds": rounds.len(),
            "takeover": takeover_stats(rounds),
            "leader_changes": rounds.iter().filter(|r| r.leader_changed).count(),
            "problems": rounds.iter().filter_map(|r| r.problem.clone()).collect::<Vec<_>>(),
            "messages": count_json(&counts[k + 1]),
        }));
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
    json!({
        "ok": total.lost == 0 && total.duplicated == 0 && !problems && total.sent > 0,
        "cluster": if target.is_local() { "local" } else { "existing" },
        "nodes": target.nodes().iter().map(|n| n.name.clone()).collect::<Vec<_>>(),
        "stream": stream,
        "parameters": {
            "rounds": args.rounds,
            "rate_per_second": args.rate,
            "delay_ms": args.delay.as_millis() as u64,
            "lease_ttl_ms": target.is_local().then_some(args.lease_ttl.as_millis() as u64),
            "etcd_hold_ms": args.hold.as_millis() as u64,
        },
        "scenarios": rows,
        "total": count_json(&total),
    })
}

pub(super) fn print_table(report: &Value) {
    let p = &report["parameters"];
    println!(
        "\ndelayq drill: {} cluster ({}), {} msg/s due {} ms after sending, {} rounds per scenario{}",
        report["cluster"].as_str().unwrap_or(""),
        report["nodes"]
            .as_array()
            .map(|n| n
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
        p["rate_per_second"],
        p["delay_ms"],
        p["rounds"],
        p["lease_ttl_ms"]
            .as_u64()
            .map(|t| format!(", lease TTL {} ms", t))
            .unwrap_or_default(),
    );
    println!(
        "\n{:<11} {:>6}  {:>26}  {:>7} {:>9} {:>5} {:>10}  {:>12}",
        "scenario",
        "rounds",
        "takeover min/median/max",
        "sent",
        "delivered",
        "lost",
        "duplicated",
        "max lateness"
    );
    let row = |name: &str, rounds: String, takeover: String, m: &Value| {
        let n = |k: &str| m[k].as_u64().unwrap_or(0);
        println!(
            "{:<11} {:>6}  {:>26}  {:>7} {:>9} {:>5} {:>10}  {:>12}",
            name,
            rounds,
            takeover,
            n("sent"),
            n("delivered"),
            n("lost"),
            n("duplicated"),
            ms(Duration::from_millis(
                m["max_lateness_ms"].as_u64().unwrap_or(0)
            )),
        );
    };
    for s in report["scenarios"].as_array().into_iter().flatten() {
        let name = s["scenario"].as_str().unwrap_or("");
        let t = &s["takeover"];
        let takeover = if name == "steady" {
            "-".to_owned()
        } else if t.is_null() {
            "none".to_owned()
        } else {
            let f = |k: &str| ms(Duration::from_millis(t[k].as_u64().unwrap_or(0)));
            format!("{} / {} / {}", f("min_ms"), f("median_ms"), f("max_ms"))
        };
        let rounds = if name == "steady" {
            "-".to_owned()
        } else {
            s["rounds"].to_string()
        };
        row(name, rounds, takeover, &s["messages"]);
    }
    row("total", String::new(), String::new(), &report["total"]);
    println!(
        "\ntakeover: fault → another node leads under a newer epoch (etcd: longest stretch with no leader)."
    );
    println!(
        "lateness: stream entry time − due time, both Redis's clock; per scenario, the messages that fell due during it or were still undelivered when it began."
    );
    let unconfirmed = report["total"]["unconfirmed_pushes"].as_u64().unwrap_or(0);
    if unconfirmed > 0 {
        println!(
            "{unconfirmed} pushes were never confirmed by any node (counted only if delivered)."
        );
    }
    for s in report["scenarios"].as_array().into_iter().flatten() {
        for p in s["problems"].as_array().into_iter().flatten() {
            println!(
                "problem in {}: {}",
                s["scenario"].as_str().unwrap_or(""),
                p.as_str().unwrap_or("")
            );
        }
    }
    println!(
        "\n{}",
        if report["ok"].as_bool().unwrap_or(false) {
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
        assert_eq!(stats["min_ms"], 100);
        assert_eq!(stats["median_ms"], 200);
        assert_eq!(median(&[100, 200, 400, 1000]), 300);
        assert_eq!(stats["max_ms"], 300);
        assert_eq!(stats["each_ms"], json!([300, 100, null, 200]));
        assert!(takeover_stats(&[round(None)]).is_null());
    }
}
