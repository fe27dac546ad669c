//! The steady cost's targets: what a message of spread traffic costs Redis, what a
//! script call costs beyond the commands it runs, the highest spread rate on time,
//! a burst with its records kept against the ceiling of the same run, and the
//! ingest rates, checked against every run's rows.

use super::cell::Cell;
use super::targets::{
    Target, best_on_time, ceiling_shares, delayq, ingest_checks, spreads, spreads_by_run, target,
};
use crate::cli::bench::rows::{Delayq, Row};

/// Redis's CPU µs a message, at most, in a spread of each rate.
const SPREAD_REDIS_US: [(u64, f64); 2] = [(1_000, 40.0), (10_000, 20.0)];
/// Redis's µs in one script call beyond the commands it runs, at most.
const REST_US: f64 = 10.0;
/// The highest spread rate with p99 lateness under 10 ms, at least.
const ON_TIME_RATE: u64 = 30_000;
/// A burst's drain in the default layouts, records kept, against the ceiling's.
const VS_CEILING: f64 = 0.40;
/// An ingest rate target: its words, its scenarios (each with how it is named in
/// the figures) and the msg/s it asks at least.
struct Ingest {
    what: &'static str,
    scenarios: &'static [(&'static str, &'static str)],
    least: u64,
}

const INGEST: [Ingest; 4] = [
    Ingest {
        what: "batch HTTP ingest",
        scenarios: &[
            ("ingest-http-batch", ""),
            ("ingest-http-batch-ids-generated", "ids generated, "),
        ],
        least: 100_000,
    },
    Ingest {
        what: "single HTTP pushes",
        scenarios: &[
            ("ingest-http", ""),
            ("ingest-http-ids-generated", "ids generated, "),
        ],
        least: 25_000,
    },
    Ingest {
        what: "inbox ingest",
        scenarios: &[
            ("ingest-inbox-drain", "drained, "),
            ("ingest-inbox", "live, "),
        ],
        least: 80_000,
    },
    Ingest {
        what: "journaled batch HTTP ingest",
        scenarios: &[("ingest-http-batch-journaled", "")],
        least: 30_000,
    },
];

pub(super) fn steady_targets(rows: &[Row]) -> Vec<Target> {
    let mut out = Vec::new();
    for (rate, most) in SPREAD_REDIS_US {
        let checks = delayq(rows, spreads)
            .filter(|(_, s)| s.rate_per_sec == rate)
            .map(|(run, s)| {
                let us = s.measured.cpu_us_per_message.redis;
                (format!("{} µs (run {run})", us.cell()), us <= most)
            })
            .collect();
        out.push(target(
            &format!("Redis CPU ≤ {most} µs per message in a spread of {rate} msg/s"),
            checks,
        ));
    }

    let checks = delayq(rows, Some)
        .filter_map(|(run, d)| {
            let what = match d {
                Delayq::Spread(s) => format!("spread of {} msg/s", s.rate_per_sec),
                Delayq::Idle(_) => "idle leader".to_owned(),
                _ => return None,
            };
            let rest = d.measured().cpu_us_per_message.scripts.as_ref()?.us_rest;
            Some((
                format!("{} µs ({what}, run {run})", rest.cell()),
                rest <= REST_US,
            ))
        })
        .collect();
    out.push(target(
        &format!("a script call's Redis time beyond its commands ≤ {REST_US} µs"),
        checks,
    ));

    let checks = spreads_by_run(rows)
        .into_iter()
        .map(|(run, in_run)| {
            let best = best_on_time(&in_run);
            (
                format!(
                    "{} msg/s (run {run})",
                    best.map_or("none".to_owned(), |b| b.cell())
                ),
                best.is_some_and(|b| b >= ON_TIME_RATE),
            )
        })
        .collect();
    out.push(target(
        &format!(
            "highest spread rate with p99 < 10 ms ≥ {} msg/s",
            ON_TIME_RATE.cell()
        ),
        checks,
    ));

    let checks = ceiling_shares(rows)
        .filter(|(_, b, _)| b.layouts().is_none())
        .map(|(run, b, x)| {
            (
                format!("{:.0}% at {} (run {run})", x * 100.0, b.measured.messages),
                x >= VS_CEILING,
            )
        })
        .collect();
    out.push(target(
        &format!(
            "burst drain, records kept, ≥ {:.0}% of the ceiling",
            VS_CEILING * 100.0
        ),
        checks,
    ));

    for Ingest {
        what,
        scenarios,
        least,
    } in INGEST
    {
        out.push(target(
            &format!("{what} ≥ {} msg/s", least.cell()),
            ingest_checks(rows, scenarios, least),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::report::targets::Met;
    use crate::cli::bench::rows::tests::{MEASURED, TALLY, ceiling_burst};

    /// The narrow space between a large figure's groups of three digits.
    const NB: char = '\u{202f}';

    fn row(scenario: &str, throughput: u64, rest: &str, run: u32) -> Row {
        let measured = MEASURED.replace(
            "\"throughput_per_sec\": 500",
            &format!("\"throughput_per_sec\": {throughput}"),
        );
        serde_json::from_str(&format!(
            r#"{{"system": "delayq", "scenario": "{scenario}", {measured}, {TALLY}, {rest}, "run": {run}}}"#
        ))
        .unwrap_or_else(|e| panic!("{scenario}: {e}"))
    }

    fn spread(rate: u64, redis_us: f64, rest_us: f64, on_time: bool, run: u32) -> Row {
        row(
            "spread",
            rate,
            &format!(
                r#""cpu_us_per_message": {{"redis": {redis_us}, "delayq": 5.0, "scripts": {{"per_message": 1.0, "us_each": {}, "us_commands": 10.0, "us_rest": {rest_us}}}}}, "lateness_ms": null, "rate_per_sec": {rate}, "on_time": {on_time}, "producer_kept_up": true"#,
                rest_us + 10.0
            ),
            run,
        )
    }

    fn find<'a>(all: &'a [Target], name: &str) -> &'a Target {
        all.iter()
            .find(|t| t.target.starts_with(name))
            .unwrap_or_else(|| panic!("{name}"))
    }

    /// Each spread rate is held to its own figure; the rest of a call counts in
    /// spreads and the idle leader alike.
    #[test]
    fn spreads_are_checked_per_rate_and_the_idle_leader_per_call() {
        let idle = row(
            "idle",
            1,
            r#""cpu_us_per_message": {"redis": 3000.0, "delayq": 200.0, "scripts": {"per_message": 40.0, "us_each": 21.0, "us_commands": 4.0, "us_rest": 17.0}}, "seconds": 10"#,
            1,
        );
        let rows = [
            spread(1_000, 39.0, 9.5, true, 1),
            spread(10_000, 83.0, 100.0, false, 1),
            idle,
        ];
        let all = steady_targets(&rows);
        let at_1k = find(&all, "Redis CPU ≤ 40 µs per message in a spread of 1000");
        assert_eq!(
            (at_1k.measured.as_slice(), at_1k.met),
            (&["39.0 µs (run 1)".to_owned()][..], Met::Yes)
        );
        let at_10k = find(&all, "Redis CPU ≤ 20 µs per message in a spread of 10000");
        assert_eq!(at_10k.measured, ["83.0 µs (run 1) ✗"]);
        let rest = find(
            &all,
            "a script call's Redis time beyond its commands ≤ 10 µs",
        );
        assert_eq!(
            rest.measured,
            [
                "9.5 µs (spread of 1000 msg/s, run 1)",
                "100.0 µs (spread of 10000 msg/s, run 1) ✗",
                "17.0 µs (idle leader, run 1) ✗"
            ]
        );
        assert_eq!(rest.met, Met::InSomeRuns);
        assert_eq!(
            find(&all, "highest spread rate with p99 < 10 ms").measured,
            ["1000 msg/s (run 1) ✗"]
        );
    }

    /// The highest rate on time is each run's own; a run with none on time says so.
    #[test]
    fn the_highest_rate_on_time_is_each_run_s() {
        let rows = [
            spread(10_000, 15.0, 5.0, true, 1),
            spread(30_000, 15.0, 5.0, true, 1),
            spread(1_000, 50.0, 5.0, false, 2),
        ];
        let all = steady_targets(&rows);
        let highest = find(&all, "highest spread rate with p99 < 10 ms ≥ 30");
        assert_eq!(
            highest.measured,
            [
                format!("30{NB}000 msg/s (run 1)"),
                "none msg/s (run 2) ✗".to_owned()
            ]
        );
        assert_eq!(highest.met, Met::InSomeRuns);
    }

    /// Only a burst in the default layouts with its records kept counts against the
    /// ceiling; ingest rows each against their own floor.
    #[test]
    fn bursts_with_records_and_ingest_rows_are_held_to_their_floors() {
        let burst = |throughput: u64, extra: &str| {
            row(
                "burst",
                throughput,
                &format!(
                    r#""cpu_us_per_message": {{"redis": 8.0, "delayq": 1.0}}, "lateness_ms": null, "schedule_rate_per_sec": 1, "due_spread_ms": 0, "drain_ms": 2, "bytes_per_pending_message": 190, "bytes_per_record": 45{extra}"#
                ),
                1,
            )
        };
        let ingest = |scenario: &str, rate: u64| {
            row(
                scenario,
                rate,
                r#""cpu_us_per_message": {"redis": 20.0, "delayq": 30.0}"#,
                1,
            )
        };
        let rows = [
            burst(400, ""),
            burst(900, r#", "records_retention": "0s""#),
            ceiling_burst(1000),
            ingest("ingest-http", 26_000),
            ingest("ingest-http-batch", 99_000),
            ingest("ingest-inbox-drain", 80_000),
            ingest("ingest-inbox", 45_000),
        ];
        let all = steady_targets(&rows);
        assert_eq!(
            find(&all, "burst drain, records kept, ≥ 40% of the ceiling").measured,
            ["40% at 1000 (run 1)"]
        );
        assert_eq!(find(&all, "single HTTP pushes ≥ 25").met, Met::Yes);
        assert_eq!(
            find(&all, "batch HTTP ingest ≥ 100").measured,
            [format!("99{NB}000 msg/s (run 1) ✗")]
        );
        assert_eq!(
            find(&all, "inbox ingest ≥ 80").measured,
            [
                format!("80{NB}000 msg/s (drained, run 1)"),
                format!("45{NB}000 msg/s (live, run 1) ✗")
            ]
        );
    }
}
