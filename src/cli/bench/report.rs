//! The report: every row as JSON, the targets checked against them, and Markdown
//! tables for people (bench/RESULTS.md is the latest full run's).

use std::fmt::Write as _;

use serde_json::{Value as Json, json};

use super::{Bench, BenchArgs, measure, peer};

/// What the figures were taken on.
pub async fn machine(bench: &Bench, args: &BenchArgs, with_peer: bool) -> Json {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").parse::<f64>().ok())
        })
        .map(|kb| (kb / 1024.0 / 1024.0).round());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .ok();
    let mut conn = bench.conn.clone();
    let redis = measure::info_field(&mut conn, "server", "redis_version")
        .await
        .ok();
    let commit = tokio::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .await
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let command = std::iter::once("delayq".to_owned())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    json!({
        "cpu": model,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "memory_gib": mem_gib,
        "kernel": kernel,
        "redis": redis,
        "delayq": env!("CARGO_PKG_VERSION"),
        "commit": commit,
        "peer": if with_peer { peer::versions(&args.peer_dir).await } else { Json::Null },
        "command": command,
        "load_average_at_start": measure::load_average(),
    })
}

pub fn assemble(
    machine: Json,
    parameters: Json,
    started: jiff::Timestamp,
    rows: Vec<Json>,
    reference: Vec<Json>,
) -> Json {
    let targets = targets(&rows);
    json!({
        "machine": machine,
        "parameters": parameters,
        "started": started.to_string(),
        "finished": jiff::Timestamp::now().to_string(),
        "load_average_at_end": measure::load_average(),
        "targets": targets,
        "rows": rows,
        "redis_benchmark": reference,
    })
}

fn rows_of<'a>(
    rows: &'a [Json],
    system: &'a str,
    scenario: &'a str,
) -> impl Iterator<Item = &'a Json> {
    rows.iter()
        .filter(move |r| r["system"] == system && r["scenario"] == scenario)
}

fn find<'a>(
    rows: &'a [Json],
    system: &str,
    scenario: &str,
    run: &Json,
    key: &str,
    value: &Json,
) -> Option<&'a Json> {
    rows.iter().find(|r| {
        r["system"] == system && r["scenario"] == scenario && &r["run"] == run && &r[key] == value
    })
}

fn ratio(a: &Json, b: &Json) -> Option<f64> {
    let (a, b) = (a.as_f64()?, b.as_f64()?);
    (b > 0.0).then(|| (a / b * 100.0).round() / 100.0)
}

/// One target: what it asks, what each run measured, and whether every run met it.
fn target(name: &str, checks: Vec<(String, bool)>) -> Json {
    let met = if checks.is_empty() {
        "not measured"
    } else if checks.iter().all(|(_, ok)| *ok) {
        "yes"
    } else if checks.iter().any(|(_, ok)| *ok) {
        "in some runs"
    } else {
        "no"
    };
    json!({
        "target": name,
        "measured": checks.iter().map(|(m, ok)| format!("{m}{}", if *ok { "" } else { " ✗" })).collect::<Vec<_>>(),
        "met": met,
    })
}

fn p99(row: &Json) -> Option<f64> {
    row["lateness_ms"]["p99"].as_f64()
}

fn targets(rows: &[Json]) -> Vec<Json> {
    let mut out = Vec::new();

    let mut vs_ceiling = Vec::new();
    let mut vs_peer = Vec::new();
    for r in rows_of(rows, "delayq", "burst") {
        let label = format!("{} (run {})", r["messages"], r["run"]);
        if let Some(c) = find(
            rows,
            "ceiling",
            "burst",
            &r["run"],
            "messages",
            &r["messages"],
        ) && let Some(x) = ratio(&r["throughput_per_sec"], &c["throughput_per_sec"])
        {
            vs_ceiling.push((format!("{:.0}% at {label}", x * 100.0), x >= 0.70));
        }
        if let Some(p) = find(
            rows,
            "bullmq",
            "burst",
            &r["run"],
            "messages",
            &r["messages"],
        ) && let Some(x) = ratio(&r["throughput_per_sec"], &p["throughput_per_sec"])
        {
            vs_peer.push((format!("{x}× at {label}"), x >= 5.0));
        }
    }
    out.push(target("burst drain ≥ 70% of the ceiling", vs_ceiling));
    out.push(target("burst drain ≥ 5× BullMQ's", vs_peer));

    for (rate, limit) in [(1000u64, 5.0), (10_000, 10.0)] {
        let checks = rows_of(rows, "delayq", "spread")
            .filter(|r| r["rate_per_sec"] == rate)
            .filter_map(|r| p99(r).map(|p| (format!("{p} ms (run {})", r["run"]), p <= limit)))
            .collect();
        out.push(target(
            &format!("spread p99 lateness ≤ {limit} ms at {rate} msg/s"),
            checks,
        ));
    }

    let mut highest = Vec::new();
    let runs: std::collections::BTreeSet<u64> =
        rows.iter().filter_map(|r| r["run"].as_u64()).collect();
    for run in runs {
        let spreads: Vec<&Json> = rows_of(rows, "delayq", "spread")
            .filter(|r| r["run"] == run)
            .collect();
        if spreads.is_empty() {
            continue;
        }
        let best = spreads
            .iter()
            .filter(|r| r["on_time"] == true)
            .filter_map(|r| r["rate_per_sec"].as_u64())
            .max();
        let failed = spreads.iter().find(|r| r["on_time"] == false);
        let why = match failed {
            Some(f) if f["producer_kept_up"] == false => format!(
                "; at {}/s the producer reached only {}/s",
                f["rate_per_sec"], f["throughput_per_sec"]
            ),
            Some(f) => format!(
                "; at {}/s p99 was {} ms",
                f["rate_per_sec"], f["lateness_ms"]["p99"]
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
    out.push(target(
        "highest spread rate with p99 < 10 ms (reported)",
        highest,
    ));

    let backlog_checks = rows_of(rows, "delayq", "backlog-spread")
        .filter_map(|b| {
            let base = find(
                rows,
                "delayq",
                "spread",
                &b["run"],
                "rate_per_sec",
                &b["rate_per_sec"],
            )?;
            let (with, without) = (p99(b)?, p99(base)?);
            let change = (with - without) / without.max(1.0);
            Some((
                format!(
                    "{}/s: {without} → {with} ms ({:+.0}%, run {})",
                    b["rate_per_sec"],
                    change * 100.0,
                    b["run"]
                ),
                change < 0.20,
            ))
        })
        .collect();
    out.push(target(
        "a backlog (1M in the full suite) changes spread p99 by < 20%",
        backlog_checks,
    ));

    let first_backlog_rate = rows_first_backlog_rate(rows);
    let bytes = rows
        .iter()
        .filter(|r| r["system"] == "delayq" && r["bytes_per_pending_message"].is_number())
        .filter(|r| r["scenario"] == "burst" || r["rate_per_sec"] == first_backlog_rate)
        .map(|r| {
            let b = r["bytes_per_pending_message"].as_f64().unwrap_or(f64::MAX);
            (
                format!(
                    "{b} B ({} {}, run {})",
                    r["scenario"].as_str().unwrap_or(""),
                    r["backlog"]
                        .as_u64()
                        .or(r["messages"].as_u64())
                        .unwrap_or(0),
                    r["run"]
                ),
                b <= 300.0,
            )
        })
        .collect();
    out.push(target("≤ 300 bytes per pending 100-byte message", bytes));

    for (stop, name) in [
        ("failover-sigterm", "SIGTERM takeover ≤ 100 ms"),
        ("failover-sigkill", "SIGKILL takeover ≤ lease TTL + 0.5 s"),
    ] {
        let checks = rows_of(rows, "delayq", stop)
            .map(|r| {
                let gap = r["forwarding_gap_ms"].as_f64().unwrap_or(f64::MAX);
                let limit = if stop == "failover-sigterm" {
                    100.0
                } else {
                    r["lease_ttl_ms"].as_f64().unwrap_or(0.0) + 500.0
                };
                (
                    format!(
                        "forwarding gap {} ms, standby leading after {} ms (run {})",
                        text(&r["forwarding_gap_ms"]),
                        text(&r["takeover_ms"]),
                        r["run"]
                    ),
                    gap <= limit && r["takeover_ms"].is_number(),
                )
            })
            .collect();
        out.push(target(name, checks));
    }

    let (mut lost, mut dup) = (0u64, 0u64);
    let mut counted = 0;
    for r in rows.iter().filter(|r| r["system"] == "delayq") {
        lost += r["tally"]["lost"].as_u64().unwrap_or(0);
        dup += r["tally"]["duplicated"].as_u64().unwrap_or(0);
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

/// Backlog rows repeat the same bytes figure per rate; count it once per run.
fn rows_first_backlog_rate(rows: &[Json]) -> Json {
    rows_of(rows, "delayq", "backlog-spread")
        .next()
        .map_or(Json::Null, |r| r["rate_per_sec"].clone())
}

fn text(v: &Json) -> String {
    match v {
        Json::Null => "–".to_owned(),
        Json::String(s) => s.clone(),
        Json::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            if f.fract() == 0.0 && f.abs() >= 10_000.0 {
                group(f as i64)
            } else {
                n.to_string()
            }
        }
        other => other.to_string(),
    }
}

/// 1234567 → "1 234 567", so large rates read at a glance.
fn group(n: i64) -> String {
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('\u{202f}');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn lateness(r: &Json) -> String {
    let l = &r["lateness_ms"];
    if l.is_null() {
        return "–".to_owned();
    }
    format!(
        "{} / {} / {} / {}",
        text(&l["p50"]),
        text(&l["p99"]),
        text(&l["p99_9"]),
        text(&l["max"])
    )
}

fn cpu(r: &Json) -> String {
    let c = &r["cpu_us_per_message"];
    let worker = if c["delayq"].is_null() {
        &c["worker"]
    } else {
        &c["delayq"]
    };
    format!("{} / {}", text(&c["redis"]), text(worker))
}

fn stalls(r: &Json) -> String {
    format!(
        "{} / {}",
        text(&r["redis_unresponsive_ms"]),
        text(&r["redis_longest_event_ms"])
    )
}

fn lost_dup(r: &Json) -> String {
    format!(
        "{} / {}",
        text(&r["tally"]["lost"]),
        text(&r["tally"]["duplicated"])
    )
}

/// Whether a row's scenario name begins with `prefix` ("ingest-http", "failover-kill").
fn scenario_starts_with(row: &Json, prefix: &str) -> bool {
    row["scenario"]
        .as_str()
        .is_some_and(|s| s.starts_with(prefix))
}

/// Appends a section: its title, then a table whose columns are named in `columns`
/// ("a | b | c"), with one line per row. Nothing at all when there are no rows.
fn table(md: &mut String, title: &str, columns: &str, rows: impl Iterator<Item = Vec<String>>) {
    let mut rows = rows.peekable();
    if rows.peek().is_none() {
        return;
    }
    let _ = writeln!(md, "\n## {title}\n");
    let _ = writeln!(md, "| {columns} |");
    let _ = writeln!(md, "|{}", "---|".repeat(columns.split(" | ").count()));
    for row in rows {
        let _ = writeln!(md, "| {} |", row.join(" | "));
    }
}

pub fn markdown(report: &Json) -> String {
    let mut md = String::new();
    let m = &report["machine"];
    let p = &report["parameters"];
    let rows = report["rows"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(md, "# delayq benchmark\n");
    let _ = writeln!(md, "Command: `{}`  ", text(&m["command"]));
    let _ = writeln!(
        md,
        "Machine: {} × {}, {} GiB, Linux {}; Redis {}; delayq {} ({}){}  ",
        text(&m["cores"]),
        text(&m["cpu"]),
        text(&m["memory_gib"]),
        text(&m["kernel"]),
        text(&m["redis"]),
        text(&m["delayq"]),
        text(&m["commit"]),
        if m["peer"].is_null() {
            String::new()
        } else {
            format!(
                "; node {}, BullMQ {}, ioredis {}",
                text(&m["peer"]["node"]),
                text(&m["peer"]["bullmq"]),
                text(&m["peer"]["ioredis"])
            )
        }
    );
    let _ = writeln!(
        md,
        "Run: {} → {}; load average (1/5/15 min) {} at start, {} at end; every row shows the load when it started.  ",
        text(&report["started"]),
        text(&report["finished"]),
        text(&m["load_average_at_start"]),
        text(&report["load_average_at_end"])
    );
    let _ = writeln!(
        md,
        "Parameters: payload {} B, {} shards, batch {}, spread delay {} ms, spreads of {} s, {} run(s) of each scenario.",
        text(&p["payload_bytes"]),
        text(&p["shards"]),
        text(&p["batch_size"]),
        text(&p["spread_delay_ms"]),
        text(&p["spread_seconds"]),
        text(&p["repeat"])
    );

    let target_rows = report["targets"].as_array().into_iter().flatten().map(|t| {
        let measured: Vec<String> = t["measured"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        let measured = if measured.is_empty() {
            "–".to_owned()
        } else {
            measured.join("; ")
        };
        vec![text(&t["target"]), measured, text(&t["met"])]
    });
    table(&mut md, "Targets", "target | measured | met", target_rows);

    // Columns every drain table shares.
    let measured = "lateness p50 / p99 / p99.9 / max (ms) | CPU µs/msg Redis / worker | Redis unresponsive: probe / longest event (ms)";
    let burst_rows = rows.iter().filter(|r| r["scenario"] == "burst").map(|r| {
        let vs = |system: &str| {
            if r["system"] != "delayq" {
                return "–".to_owned();
            }
            find(
                &rows,
                system,
                "burst",
                &r["run"],
                "messages",
                &r["messages"],
            )
            .and_then(|o| ratio(&r["throughput_per_sec"], &o["throughput_per_sec"]))
            .map_or("–".to_owned(), |x| {
                if system == "ceiling" {
                    format!("{:.0}%", x * 100.0)
                } else {
                    format!("{x}×")
                }
            })
        };
        vec![
            text(&r["system"]),
            text(&r["messages"]),
            text(&r["run"]),
            text(&r["load_average"]),
            text(&r["throughput_per_sec"]),
            vs("ceiling"),
            vs("bullmq"),
            lateness(r),
            cpu(r),
            stalls(r),
            text(&r["bytes_per_pending_message"]),
            lost_dup(r),
        ]
    });
    table(
        &mut md,
        "Burst: N messages due at one instant, drained",
        &format!(
            "system | N | run | load | drain (msg/s) | vs ceiling | vs BullMQ | {measured} | bytes/pending | lost / dup"
        ),
        burst_rows,
    );

    let spread_rows = rows
        .iter()
        .filter(|r| r["scenario"] == "spread" || r["scenario"] == "backlog-spread")
        .map(|r| {
            let scenario = match r["backlog"].as_u64() {
                Some(n) => format!("spread over a backlog of {}", text(&json!(n))),
                None => "spread".to_owned(),
            };
            let on_time = if r["on_time"] == true {
                "yes"
            } else if r["producer_kept_up"] == false {
                "no (producer behind)"
            } else {
                "no"
            };
            vec![
                text(&r["system"]),
                scenario,
                text(&r["rate_per_sec"]),
                text(&r["run"]),
                text(&r["load_average"]),
                text(&r["throughput_per_sec"]),
                lateness(r),
                cpu(r),
                stalls(r),
                lost_dup(r),
                on_time.to_owned(),
            ]
        });
    table(
        &mut md,
        &format!(
            "Spread: a steady rate, each message due {} ms after it is sent",
            text(&p["spread_delay_ms"])
        ),
        &format!(
            "system | scenario | rate (msg/s) | run | load | sent (msg/s) | {measured} | lost / dup | on time (p99 < 10 ms)"
        ),
        spread_rows,
    );

    let ingest_rows = rows
        .iter()
        .filter(|r| scenario_starts_with(r, "ingest"))
        .map(|r| {
            let q = &r["request_ms"];
            vec![
                text(&r["scenario"]),
                text(&r["messages"]),
                text(&r["run"]),
                text(&r["load_average"]),
                text(&r["throughput_per_sec"]),
                format!(
                    "{} / {} / {} / {}",
                    text(&q["p50"]),
                    text(&q["p99"]),
                    text(&q["p99_9"]),
                    text(&q["max"])
                ),
                cpu(r),
                stalls(r),
                lost_dup(r),
            ]
        });
    table(
        &mut md,
        "Ingest: messages accepted (due in a day, so nothing is forwarded meanwhile)",
        "path | N | run | load | accepted (msg/s) | request p50 / p99 / p99.9 / max (ms) | CPU µs/msg Redis / delayq | Redis unresponsive: probe / longest event (ms) | lost / dup",
        ingest_rows,
    );

    let failover_rows = rows
        .iter()
        .filter(|r| scenario_starts_with(r, "failover"))
        .map(|r| {
            vec![
                r["scenario"]
                    .as_str()
                    .unwrap_or("")
                    .trim_start_matches("failover-")
                    .to_uppercase(),
                text(&r["rate_per_sec"]),
                text(&r["run"]),
                text(&r["load_average"]),
                text(&r["lease_ttl_ms"]),
                text(&r["takeover_ms"]),
                text(&r["old_leader_exit_ms"]),
                text(&r["forwarding_gap_ms"]),
                lateness(r),
                lost_dup(r),
            ]
        });
    table(
        &mut md,
        "Failover under load: two daemons elected through etcd, the leader stopped mid-spread",
        "stop | rate (msg/s) | run | load | lease TTL (ms) | standby leading after (ms) | old leader gone after (ms) | longest forwarding gap (ms) | lateness p50 / p99 / p99.9 / max (ms) | lost / dup",
        failover_rows,
    );

    let reference_rows = report["redis_benchmark"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let x = &r["results"];
            vec![
                text(&r["run"]),
                text(&r["load_average"]),
                text(&x["xadd_p1_per_sec"]),
                text(&x["xadd_p16_per_sec"]),
                text(&x["zadd_p1_per_sec"]),
                text(&x["zadd_p16_per_sec"]),
            ]
        });
    table(
        &mut md,
        "redis-benchmark on the same Redis (requests/s, 50 connections)",
        "run | load | XADD | XADD, pipeline 16 | ZADD | ZADD, pipeline 16",
        reference_rows,
    );
    let _ = writeln!(md, "\nWhat each figure means: bench/README.md.");
    md
}
