//! The targets: what delayq aims for, checked against every run's rows.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::cell::Cell;
use crate::cli::bench::rows::{Burst, Delayq, Failover, Lateness, Row, Spread};
use crate::cli::bench::scenarios::SPREAD_TARGETS;

/// One target: what it asks, what each run measured (marked ✗ where it missed),
/// and whether every run met it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Target {
    pub target: String,
    pub measured: Vec<String>,
    pub met: Met,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Met {
    #[serde(rename = "yes")]
    Yes,
    #[serde(rename = "in some runs")]
    InSomeRuns,
    #[serde(rename = "no")]
    No,
    #[serde(rename = "not measured")]
    NotMeasured,
}

impl Met {
    pub fn as_str(self) -> &'static str {
        match self {
            Met::Yes => "yes",
            Met::InSomeRuns => "in some runs",
            Met::No => "no",
            Met::NotMeasured => "not measured",
        }
    }
}

pub(super) fn target(name: &str, checks: Vec<(String, bool)>) -> Target {
    let met = if checks.is_empty() {
        Met::NotMeasured
    } else if checks.iter().all(|(_, ok)| *ok) {
        Met::Yes
    } else if checks.iter().any(|(_, ok)| *ok) {
        Met::InSomeRuns
    } else {
        Met::No
    };
    Target {
        target: name.to_owned(),
        measured: checks
            .into_iter()
            .map(|(m, ok)| format!("{m}{}", if ok { "" } else { " ✗" }))
            .collect(),
        met,
    }
}

/// `a / b`, to two decimals.
pub(super) fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| (a as f64 / b as f64 * 100.0).round() / 100.0)
}

/// delayq's rows that `pick` chooses, with their run.
pub(super) fn delayq<'a, T: 'a>(
    rows: &'a [Row],
    pick: impl Fn(&'a Delayq) -> Option<&'a T>,
) -> impl Iterator<Item = (u32, &'a T)> {
    rows.iter()
        .filter_map(move |r| Some((r.run, pick(r.figures.delayq()?)?)))
}

pub(super) fn bursts(d: &Delayq) -> Option<&Burst> {
    match d {
        Delayq::Burst(b) => Some(b),
        _ => None,
    }
}

/// Spreads without a backlog.
pub(super) fn spreads(d: &Delayq) -> Option<&Spread> {
    match d {
        Delayq::Spread(s) => Some(s),
        _ => None,
    }
}

fn backlog_spreads(d: &Delayq) -> Option<&Spread> {
    match d {
        Delayq::BacklogSpread(s) => Some(s),
        _ => None,
    }
}

/// ", records.layout = …" for a burst drained with layouts not the defaults.
fn layout_note(b: &Burst) -> String {
    b.layouts().map_or(String::new(), |l| format!(", {l}"))
}

/// The throughput of the burst of `messages` that `system` drained in `run`.
pub(super) fn burst_throughput(rows: &[Row], system: &str, run: u32, messages: u64) -> Option<u64> {
    rows.iter()
        .filter(|r| r.run == run && r.figures.system() == system)
        .filter_map(|r| r.figures.burst())
        .find(|b| b.measured.messages == messages)
        .map(|b| b.measured.throughput_per_sec)
}

fn p99(lateness: Option<&Lateness>) -> Option<f64> {
    lateness.map(|l| l.p99 as f64)
}

pub fn targets(rows: &[Row]) -> Vec<Target> {
    let mut out = Vec::new();

    let vs_ceiling = ceiling_shares(rows)
        .map(|(run, b, x)| {
            let label = format!("{}{} (run {run})", b.measured.messages, layout_note(b));
            (format!("{:.0}% at {label}", x * 100.0), x >= 0.70)
        })
        .collect();
    let mut vs_peer = Vec::new();
    for (run, b) in delayq(rows, bursts) {
        let (messages, throughput) = (b.measured.messages, b.measured.throughput_per_sec);
        let label = format!("{messages}{} (run {run})", layout_note(b));
        if let Some(x) =
            burst_throughput(rows, "bullmq", run, messages).and_then(|p| ratio(throughput, p))
        {
            vs_peer.push((format!("{x}× at {label}"), x >= 5.0));
        }
    }
    out.push(target("burst drain ≥ 70% of the ceiling", vs_ceiling));
    out.push(target("burst drain ≥ 5× BullMQ's", vs_peer));

    for (rate, limit) in SPREAD_TARGETS {
        let checks = delayq(rows, spreads)
            .filter(|(_, s)| s.rate_per_sec == rate)
            .filter_map(|(run, s)| {
                p99(s.lateness_ms.as_ref()).map(|p| (format!("{p} ms (run {run})"), p <= limit))
            })
            .collect();
        out.push(target(
            &format!("spread p99 lateness ≤ {limit} ms at {rate} msg/s"),
            checks,
        ));
    }

    for (scenarios, what, floor) in [
        (
            &[
                ("ingest-http", ""),
                ("ingest-http-ids-generated", "ids generated, "),
            ][..],
            "single pushes",
            50_000u64,
        ),
        (
            &[
                ("ingest-http-batch", ""),
                ("ingest-http-batch-ids-generated", "ids generated, "),
            ],
            "batches",
            150_000,
        ),
    ] {
        out.push(target(
            &format!("HTTP ingest of {what} ≥ {} msg/s", floor.cell()),
            ingest_checks(rows, scenarios, floor),
        ));
    }

    out.push(target(
        "highest spread rate with p99 < 10 ms (reported)",
        highest_rates(rows),
    ));

    let backlog_checks = delayq(rows, backlog_spreads)
        .filter_map(|(run, b)| {
            let base = delayq(rows, spreads)
                .find(|(r, s)| *r == run && s.rate_per_sec == b.rate_per_sec)?
                .1;
            let (with, without) = (
                p99(b.lateness_ms.as_ref())?,
                p99(base.lateness_ms.as_ref())?,
            );
            let change = (with - without) / without.max(1.0);
            Some((
                format!(
                    "{}/s: {without} → {with} ms ({:+.0}%, run {run})",
                    b.rate_per_sec,
                    change * 100.0,
                ),
                change < 0.20,
            ))
        })
        .collect();
    out.push(target(
        "a backlog (1M in the full suite) changes spread p99 by < 20%",
        backlog_checks,
    ));

    out.push(target(
        "≤ 200 bytes per pending 100-byte message",
        bytes_per_pending(rows),
    ));
    out.push(target(
        "a business key adds ≤ 40 bytes per pending message",
        key_bytes(rows),
    ));
    out.push(target(
        "≤ 60 bytes per delivery record kept",
        delayq(rows, Some)
            .filter_map(|(run, d)| match d {
                // A drain that keeps no record has no record's bytes to count.
                Delayq::Burst(b) if b.leaders.is_none() && b.records_retention.is_none() => Some((
                    format!(
                        "{} B (burst {}{}, run {run})",
                        b.bytes_per_record,
                        b.measured.messages,
                        layout_note(b)
                    ),
                    b.bytes_per_record <= 60,
                )),
                _ => None,
            })
            .collect(),
    ));

    for (stop, name) in [
        ("SIGTERM", "SIGTERM takeover p99 ≤ 20 ms over its rounds"),
        (
            "SIGKILL",
            "SIGKILL takeover p50 ≤ 300 ms, p99 ≤ 800 ms over its rounds",
        ),
        (
            "Redis cut",
            "leader cut off from Redis only (etcd reachable): a standby leads within 5 s",
        ),
    ] {
        let checks = delayq(rows, |d| {
            d.failover().filter(|(s, _)| *s == stop).map(|f| f.1)
        })
        .map(|(run, f)| failover_check(run, f, stop))
        .collect();
        out.push(target(name, checks));
    }

    let (mut lost, mut dup) = (0u64, 0u64);
    let mut counted = 0;
    for d in rows.iter().filter_map(|r| r.figures.delayq()) {
        lost += d.measured().tally.lost;
        dup += d.measured().tally.duplicated;
        counted += 1;
    }
    let mut checks = Vec::new();
    if counted > 0 {
        checks.push((
            format!("{lost} lost, {dup} duplicated over {counted} delayq rows"),
            lost == 0 && dup == 0,
        ));
    }
    out.push(target("0 lost, 0 duplicated", checks));
    out
}

/// The ingest rows of `scenarios` (each with how it is named in the figures), each
/// checked against `floor` msg/s.
pub(super) fn ingest_checks(
    rows: &[Row],
    scenarios: &[(&str, &str)],
    floor: u64,
) -> Vec<(String, bool)> {
    rows.iter()
        .filter_map(|r| {
            let d = r.figures.delayq()?;
            let (_, label) = scenarios.iter().find(|(s, _)| *s == d.scenario())?;
            let rate = d.ingest()?.measured.throughput_per_sec;
            Some((
                format!("{} msg/s ({label}run {})", rate.cell(), r.run),
                rate >= floor,
            ))
        })
        .collect()
}

/// Per run: the highest spread rate on time, and why the next was not.
fn highest_rates(rows: &[Row]) -> Vec<(String, bool)> {
    let mut highest = Vec::new();
    for (run, in_run) in spreads_by_run(rows) {
        let best = best_on_time(&in_run);
        let why = match in_run.iter().find(|s| !s.on_time) {
            Some(f) if !f.producer_kept_up => format!(
                "; at {}/s the producer reached only {}/s",
                f.rate_per_sec, f.measured.throughput_per_sec
            ),
            Some(f) => format!(
                "; at {}/s p99 was {} ms",
                f.rate_per_sec,
                f.lateness_ms
                    .map_or_else(|| "null".to_owned(), |l| l.p99.to_string())
            ),
            None => "; every rate tried was on time".to_owned(),
        };
        highest.push((
            format!(
                "{} msg/s (run {run}){why}",
                best.map_or("none".to_owned(), |b| b.to_string())
            ),
            best.is_some(),
        ));
    }
    highest
}

/// Each run's spreads (without a backlog), runs without any left out.
pub(super) fn spreads_by_run(rows: &[Row]) -> Vec<(u32, Vec<&Spread>)> {
    let runs: BTreeSet<u32> = rows.iter().map(|r| r.run).collect();
    runs.into_iter()
        .map(|run| {
            let in_run = delayq(rows, spreads)
                .filter(|(r, _)| *r == run)
                .map(|(_, s)| s)
                .collect();
            (run, in_run)
        })
        .filter(|(_, in_run): &(u32, Vec<&Spread>)| !in_run.is_empty())
        .collect()
}

/// The highest rate of `spreads` that was on time.
pub(super) fn best_on_time(spreads: &[&Spread]) -> Option<u64> {
    spreads
        .iter()
        .filter(|s| s.on_time)
        .map(|s| s.rate_per_sec)
        .max()
}

/// delayq's bursts with their run and their drain rate as a share of the ceiling's
/// burst of the same size and run (those with a ceiling beside them).
pub(super) fn ceiling_shares(rows: &[Row]) -> impl Iterator<Item = (u32, &Burst, f64)> {
    delayq(rows, bursts).filter_map(|(run, b)| {
        let x = burst_throughput(rows, "ceiling", run, b.measured.messages)
            .and_then(|c| ratio(b.measured.throughput_per_sec, c))?;
        Some((run, b, x))
    })
}

/// Bursts, and the backlog spreads at the first backlog rate (they repeat the same
/// bytes figure at every rate; count it once per run).
fn bytes_per_pending(rows: &[Row]) -> Vec<(String, bool)> {
    let first_backlog_rate = delayq(rows, backlog_spreads)
        .next()
        .map(|(_, s)| s.rate_per_sec);
    let mut checks = Vec::new();
    for (run, d) in delayq(rows, Some) {
        let (bytes, size) = match d {
            // The records layout alone does not change what a pending message costs.
            // Neither do the leaders that drain it.
            // A business key is counted apart (`key_bytes`).
            Delayq::Burst(b)
                if b.leaders.is_none()
                    && b.records_retention.is_none()
                    && b.messages_per_key.is_none()
                    && (b.records_layout.is_none() || b.pending_layout.is_some()) =>
            {
                (b.bytes_per_pending_message, b.measured.messages)
            }
            Delayq::BacklogSpread(s) if Some(s.rate_per_sec) == first_backlog_rate => {
                match &s.backlog {
                    Some(b) => (b.bytes_per_pending_message, b.backlog),
                    None => continue,
                }
            }
            _ => continue,
        };
        let b = bytes as f64;
        let note = match d {
            Delayq::Burst(burst) => layout_note(burst),
            _ => String::new(),
        };
        checks.push((
            format!("{b} B ({} {size}{note}, run {run})", d.scenario()),
            b <= 200.0,
        ));
    }
    checks
}

/// What a business key adds to a pending message: each keyed burst against the
/// burst of the same size and run in the default layouts without keys.
fn key_bytes(rows: &[Row]) -> Vec<(String, bool)> {
    let bursts: Vec<(u32, &Burst)> = delayq(rows, Some)
        .filter_map(|(run, d)| match d {
            Delayq::Burst(b) if b.leaders.is_none() => Some((run, b)),
            _ => None,
        })
        .collect();
    let plain = |run: u32, n: u64| {
        bursts
            .iter()
            .find(|(r, b)| *r == run && b.measured.messages == n && b.layouts().is_none())
    };
    bursts
        .iter()
        .filter(|(_, b)| b.messages_per_key.is_some())
        .filter_map(|&(run, keyed)| {
            let (_, without) = plain(run, keyed.measured.messages)?;
            let added = keyed.bytes_per_pending_message - without.bytes_per_pending_message;
            Some((
                format!(
                    "+{added} B ({} against {} B, burst {}{}, run {run})",
                    keyed.bytes_per_pending_message,
                    without.bytes_per_pending_message,
                    keyed.measured.messages,
                    layout_note(keyed)
                ),
                added <= 40,
            ))
        })
        .collect()
}

fn failover_check(run: u32, f: &Failover, stop: &str) -> (String, bool) {
    // (p50 limit, p99 limit) in ms.
    let (p50_limit, p99_limit) = match stop {
        "SIGTERM" => (20.0, 20.0),
        "SIGKILL" => (300.0, 800.0),
        _ => (5000.0, 5000.0),
    };
    let every_round = f.takeovers_ms.iter().all(Option::is_some) && f.takeover_ms.is_some();
    let met = every_round
        && f.takeover_quantiles_ms
            .is_some_and(|[p50, p99, _]| p50 <= p50_limit && p99 <= p99_limit);
    let quantiles = f
        .takeover_quantiles_ms
        .map_or("–".to_owned(), |[p50, p99, max]| {
            format!("{} / {} / {}", p50.cell(), p99.cell(), max.cell())
        });
    (
        format!(
            "{} rounds: takeover p50 / p99 / max {quantiles} ms, longest forwarding gap {} ms (run {run})",
            f.takeovers_ms.len().max(1),
            f.forwarding_gap_ms.cell(),
        ),
        met,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::rows::tests::{MEASURED, TALLY, ceiling_burst};

    #[test]
    fn a_target_is_met_when_every_run_met_it() {
        let met = |checks: &[bool]| {
            target("t", checks.iter().map(|ok| ("m".to_owned(), *ok)).collect()).met
        };
        assert_eq!(met(&[]), Met::NotMeasured);
        assert_eq!(met(&[true, true]), Met::Yes);
        assert_eq!(met(&[true, false]), Met::InSomeRuns);
        assert_eq!(met(&[false]), Met::No);
        assert_eq!(
            target("t", vec![("a".into(), true), ("b".into(), false)]).measured,
            ["a", "b ✗"]
        );
    }

    /// A drain that keeps no record counts towards the drain targets, named, but
    /// not towards the bytes of a record or of a pending message.
    #[test]
    fn a_burst_without_records_has_no_record_bytes_to_count() {
        let burst = |bytes: i64, extra: &str| -> Row {
            serde_json::from_str(&format!(
                r#"{{"system": "delayq", "scenario": "burst", {MEASURED}, "cpu_us_per_message": {{"redis": 8.0, "delayq": 1.0}}, {TALLY}, "lateness_ms": null, "schedule_rate_per_sec": 1, "due_spread_ms": 0, "drain_ms": 2, "bytes_per_pending_message": 190, "bytes_per_record": {bytes}{extra}, "run": 1}}"#
            ))
            .expect("a row")
        };
        // The ceiling drained twice as fast: delayq's bursts are at 50% of it.
        let rows = [
            burst(45, ""),
            burst(2, r#", "records_retention": "0s""#),
            ceiling_burst(1000),
        ];
        let all = targets(&rows);
        let find = |name: &str| {
            all.iter()
                .find(|t| t.target.starts_with(name))
                .unwrap_or_else(|| panic!("{name}"))
        };
        assert_eq!(
            find("≤ 60 bytes per delivery record").measured,
            ["45 B (burst 1000, run 1)"]
        );
        assert_eq!(find("≤ 200 bytes per pending").measured.len(), 1);
        assert_eq!(
            find("burst drain ≥ 70% of the ceiling").measured,
            [
                "50% at 1000 (run 1) ✗",
                "50% at 1000, records.retention = 0s (run 1) ✗"
            ]
        );
    }

    /// A keyed burst is measured against the plain one of its size and run, and
    /// kept out of the plain message's bytes.
    #[test]
    fn a_key_s_bytes_are_what_the_keyed_burst_adds() {
        let burst = |pending: i64, extra: &str| -> Row {
            serde_json::from_str(&format!(
                r#"{{"system": "delayq", "scenario": "burst", {MEASURED}, "cpu_us_per_message": {{"redis": 8.0, "delayq": 1.0}}, {TALLY}, "lateness_ms": null, "schedule_rate_per_sec": 1, "due_spread_ms": 0, "drain_ms": 2, "bytes_per_pending_message": {pending}, "bytes_per_record": 45{extra}, "run": 1}}"#
            ))
            .expect("a row")
        };
        let rows = [burst(190, ""), burst(236, r#", "messages_per_key": 3"#)];
        let all = targets(&rows);
        let find = |name: &str| all.iter().find(|t| t.target.starts_with(name)).unwrap();
        assert_eq!(
            find("a business key adds").measured,
            ["+46 B (236 against 190 B, burst 1000, a business key per 3 messages, run 1) ✗"]
        );
        assert_eq!(
            find("≤ 200 bytes per pending").measured,
            ["190 B (burst 1000, run 1)"]
        );
    }
}
