//! The report as Markdown tables, for people (bench/RESULTS.md is the latest full
//! run's).

use crate::cli::bench::rows::Delayq;
use std::fmt::Write as _;

use super::Report;
use super::cell::Cell;
use super::targets::{burst_throughput, ratio};
use crate::cli::bench::rows::{Measured, Quantiles};

/// "N: p50 / p99 / max" over a failover's rounds ("N: –" when none took over).
fn takeover_rounds(f: &crate::cli::bench::rows::Failover) -> String {
    rounds(f.takeovers_ms.len(), f.takeover_quantiles_ms)
}

fn rounds(n: usize, quantiles: Option<[f64; 3]>) -> String {
    match quantiles {
        Some([p50, p99, max]) => format!("{n}: {} / {} / {}", p50.cell(), p99.cell(), max.cell()),
        None => format!("{n}: –"),
    }
}

fn quantiles<T: Cell>(q: &Quantiles<T>) -> String {
    format!(
        "{} / {} / {} / {}",
        q.p50.cell(),
        q.p99.cell(),
        q.p99_9.cell(),
        q.max.cell()
    )
}

fn lateness<T: Cell>(q: Option<&Quantiles<T>>) -> String {
    q.map_or_else(|| "–".to_owned(), quantiles)
}

fn cpu(m: &Measured) -> String {
    let c = &m.cpu_us_per_message;
    let mut plain = format!("{} / {}", c.redis.cell(), c.process_us().cell());
    if let Some(bench) = c.bench {
        plain.push_str(&format!(", bench {}", bench.cell()));
    }
    match &c.scripts {
        Some(s) => format!(
            "{plain} ({} × {} µs: {} commands, {} rest)",
            s.per_message.cell(),
            s.us_each.cell(),
            s.us_commands.cell(),
            s.us_rest.cell()
        ),
        None => plain,
    }
}

fn stalls(m: &Measured) -> String {
    format!(
        "{} / {}",
        m.redis_unresponsive_ms.cell(),
        m.redis_longest_event_ms.cell()
    )
}

/// The load average when the row started, and the share of CPU time the
/// hypervisor took during it where measured: "1.20 1.31 1.40, 2.5% stolen".
fn load(m: &Measured) -> String {
    match m.cpu_stolen_percent {
        Some(stolen) => format!("{}, {stolen}% stolen", m.load_average),
        None => m.load_average.clone(),
    }
}

fn lost_dup(m: &Measured) -> String {
    format!("{} / {}", m.tally.lost.cell(), m.tally.duplicated.cell())
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

pub fn markdown(report: &Report) -> String {
    let mut md = String::new();
    header(&mut md, report);
    let rows = &report.rows;

    let target_rows = report.targets.iter().map(|t| {
        let measured = if t.measured.is_empty() {
            "–".to_owned()
        } else {
            t.measured.join("; ")
        };
        vec![t.target.clone(), measured, t.met.as_str().to_owned()]
    });
    table(&mut md, "Targets", "target | measured | met", target_rows);

    // Columns every drain table shares.
    let measured = "lateness p50 / p99 / p99.9 / max (ms) | CPU µs/msg Redis / worker (script calls/msg × µs each: commands, rest) | Redis unresponsive: probe / longest event (ms)";
    let burst_rows = rows.iter().filter_map(|r| {
        let b = r.figures.burst()?;
        let m = b.measured;
        let vs = |system: &str| {
            if b.system != "delayq" {
                return "–".to_owned();
            }
            burst_throughput(rows, system, r.run, m.messages)
                .and_then(|other| ratio(m.throughput_per_sec, other))
                .map_or("–".to_owned(), |x| {
                    if system == "ceiling" {
                        format!("{:.0}%", x * 100.0)
                    } else {
                        format!("{x}×")
                    }
                })
        };
        Some(vec![
            match &b.layouts {
                Some(layouts) => format!("{} ({layouts})", b.system),
                None => b.system.to_owned(),
            },
            m.messages.cell(),
            r.run.cell(),
            load(m),
            m.throughput_per_sec.cell(),
            vs("ceiling"),
            vs("bullmq"),
            lateness(b.lateness),
            cpu(m),
            stalls(m),
            b.bytes_per_pending_message.cell(),
            b.bytes_per_record.cell(),
            lost_dup(m),
        ])
    });
    table(
        &mut md,
        "Burst: N messages due at one instant, drained",
        &format!(
            "system | N | run | load | drain (msg/s) | vs ceiling | vs BullMQ | {measured} | bytes/pending | bytes/record | lost / dup"
        ),
        burst_rows,
    );

    let spread_rows = rows.iter().filter_map(|r| {
        let s = r.figures.spread()?;
        let m = s.measured;
        let scenario = match s.backlog {
            Some(n) => format!("spread over a backlog of {}", n.cell()),
            None => "spread".to_owned(),
        };
        let on_time = if s.on_time {
            "yes"
        } else if !s.producer_kept_up {
            "no (producer behind)"
        } else {
            "no"
        };
        Some(vec![
            s.system.to_owned(),
            scenario,
            s.rate_per_sec.cell(),
            r.run.cell(),
            load(m),
            m.throughput_per_sec.cell(),
            lateness(s.lateness),
            cpu(m),
            stalls(m),
            lost_dup(m),
            on_time.to_owned(),
        ])
    });
    table(
        &mut md,
        &format!(
            "Spread: a steady rate, each message due {} ms after it is sent",
            report.parameters.spread_delay_ms.cell()
        ),
        &format!(
            "system | scenario | rate (msg/s) | run | load | sent (msg/s) | {measured} | lost / dup | on time (p99 < 10 ms)"
        ),
        spread_rows,
    );

    let ingest_rows = rows.iter().filter_map(|r| {
        let d = r.figures.delayq()?;
        let i = d.ingest()?;
        let m = &i.measured;
        Some(vec![
            d.scenario().to_owned(),
            m.messages.cell(),
            r.run.cell(),
            load(m),
            m.throughput_per_sec.cell(),
            i.request_ms
                .as_ref()
                .map_or_else(|| "– / – / – / –".to_owned(), quantiles),
            cpu(m),
            stalls(m),
            lost_dup(m),
        ])
    });
    table(
        &mut md,
        "Ingest: messages accepted (due in a day, so nothing is forwarded meanwhile)",
        "path | N | run | load | accepted (msg/s) | request p50 / p99 / p99.9 / max (ms) | CPU µs/msg Redis / delayq (script calls/msg × µs each: commands, rest) | Redis unresponsive: probe / longest event (ms) | lost / dup",
        ingest_rows,
    );

    let idle_rows = rows.iter().filter_map(|r| {
        let Some(Delayq::Idle(i)) = r.figures.delayq() else {
            return None;
        };
        let m = &i.measured;
        Some(vec![i.seconds.cell(), r.run.cell(), load(m), cpu(m)])
    });
    table(
        &mut md,
        "Idle: a leader with nothing to move (per second, not per message; no PING probe meanwhile)",
        "seconds | run | load | CPU µs/s Redis / delayq (script calls/s × µs each: commands, rest)",
        idle_rows,
    );

    let schedule_rows = rows.iter().filter_map(|r| {
        let Some(Delayq::Schedules(s)) = r.figures.delayq() else {
            return None;
        };
        let m = &s.measured;
        Some(vec![
            s.schedules.cell(),
            delayq_client::human::duration(std::time::Duration::from_millis(s.every_ms)),
            s.fires.cell(),
            r.run.cell(),
            load(m),
            lateness(s.lateness_ms.as_ref()),
            cpu(m),
            lost_dup(m),
        ])
    });
    table(
        &mut md,
        "Schedules: recurring schedules firing together, made into messages by one leader (per occurrence)",
        "schedules | every | firings | run | load | lateness p50 / p99 / p99.9 / max (ms) | CPU µs/occurrence Redis / delayq (script calls × µs each: commands, rest) | lost / dup",
        schedule_rows,
    );

    let catchup_rows = rows.iter().filter_map(|r| {
        let Some(Delayq::Catchup(c)) = r.figures.delayq() else {
            return None;
        };
        let m = &c.measured;
        Some(vec![
            m.messages.cell(),
            c.limit_per_sec.cell(),
            r.run.cell(),
            load(m),
            c.drain_ms.cell(),
            c.expected_drain_ms.cell(),
            m.throughput_per_sec.cell(),
            format!(
                "{} / {}",
                c.live_rate_per_sec.cell(),
                c.live_sent_per_sec.cell()
            ),
            lateness(c.live_lateness_ms.as_ref()),
            cpu(m),
            stalls(m),
            lost_dup(m),
        ])
    });
    table(
        &mut md,
        "Catch-up at a limit: a backlog overdue for one stream with streams.max_rate, live traffic to another meanwhile",
        "backlog | limit (msg/s) | run | load | drain (ms) | backlog / limit (ms) | drained (msg/s) | live rate: offered / sent (msg/s) | live lateness p50 / p99 / p99.9 / max (ms) | CPU µs/msg Redis / worker (script calls/msg × µs each: commands, rest) | Redis unresponsive: probe / longest event (ms) | lost / dup (both streams)",
        catchup_rows,
    );

    let cluster_rows = rows.iter().filter_map(|r| {
        let Some(Delayq::ClusterBurst(c)) = r.figures.delayq() else {
            return None;
        };
        let m = &c.measured;
        Some(vec![
            format!(
                "{} ({} master{})",
                c.redis,
                c.masters,
                if c.masters == 1 { "" } else { "s" }
            ),
            c.streams.cell(),
            c.leaders.cell(),
            m.messages.cell(),
            r.run.cell(),
            load(m),
            m.throughput_per_sec.cell(),
            cpu(m),
            lost_dup(m),
        ])
    });
    table(
        &mut md,
        "Redis Cluster: a burst drained on 3 masters (a replica each) and on a standalone Redis, side by side",
        "Redis | streams | leaders | N | run | load | drained (msg/s) | CPU µs/msg Redis (masters) / delayq | lost / dup",
        cluster_rows,
    );

    let failover_rows = rows.iter().filter_map(|r| {
        let (stop, f) = r.figures.delayq()?.failover()?;
        Some(vec![
            stop.to_owned(),
            f.rate_per_sec.cell(),
            r.run.cell(),
            load(&f.measured),
            f.lease_ttl_ms.cell(),
            f.takeover_ms.cell(),
            takeover_rounds(f),
            rounds(f.takeovers_ms.len(), f.led_quantiles_ms),
            f.old_leader_exit_ms.cell(),
            f.forwarding_gap_ms.cell(),
            lateness(f.lateness_ms.as_ref()),
            lost_dup(&f.measured),
        ])
    });
    table(
        &mut md,
        "Failover under load: two daemons elected through etcd, the leader stopped mid-spread",
        "stop | rate (msg/s) | run | load | lease TTL (ms) | standby leading after (ms) | rounds: takeover p50 / p99 / max (ms) | rounds: leading by its own clock p50 / p99 / max (ms) | old leader gone after (ms) | longest forwarding gap (ms) | lateness p50 / p99 / p99.9 / max (ms) | lost / dup",
        failover_rows,
    );

    let reference_rows = report.redis_benchmark.iter().map(|r| {
        let x = &r.results;
        vec![
            r.run.cell(),
            r.load_average.clone(),
            x.xadd_p1_per_sec.cell(),
            x.xadd_p16_per_sec.cell(),
            x.zadd_p1_per_sec.cell(),
            x.zadd_p16_per_sec.cell(),
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

/// The title, and what the figures were taken on, when, and with which parameters.
fn header(md: &mut String, report: &Report) {
    let m = &report.machine;
    let p = &report.parameters;
    let _ = writeln!(md, "# delayq benchmark\n");
    let _ = writeln!(md, "Command: `{}`  ", m.command);
    let _ = writeln!(
        md,
        "Machine: {} × {}, {} GiB, Linux {}; Redis {}; delayq {} ({}){}  ",
        m.cores.cell(),
        m.cpu.cell(),
        m.memory_gib.cell(),
        m.kernel.cell(),
        m.redis.cell(),
        m.delayq,
        m.commit.cell(),
        match &m.peer {
            None => String::new(),
            Some(peer) => format!(
                "; node {}, BullMQ {}, ioredis {}",
                peer.node.cell(),
                peer.bullmq.cell(),
                peer.ioredis.cell()
            ),
        }
    );
    let _ = writeln!(
        md,
        "Run: {} → {}; load average (1/5/15 min) {} at start, {} at end; every row shows the load when it started, and the share of the machine's CPU time the hypervisor took (stolen) while it ran.  ",
        report.started, report.finished, m.load_average_at_start, report.load_average_at_end
    );
    let _ = writeln!(
        md,
        "Parameters: payload {} B, {} shards, batch {}, spread delay {} ms, spread producers sending every {} ms, spreads of {} s, {} run(s) of each scenario.",
        p.payload_bytes.cell(),
        p.shards.cell(),
        p.batch_size.cell(),
        p.spread_delay_ms.cell(),
        p.spread_tick_ms.cell(),
        p.spread_seconds.cell(),
        p.repeat.cell()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(cell: String, expected: &str) {
        assert_eq!(cell, expected);
    }

    #[test]
    fn cells() {
        check(9999u64.cell(), "9999");
        check(1_234_567u64.cell(), "1\u{202f}234\u{202f}567");
        check((-12_345i64).cell(), "-12\u{202f}345");
        check(2.0f64.cell(), "2.0");
        check(4.1f64.cell(), "4.1");
        check(12_000.0f64.cell(), "12\u{202f}000");
        check(12_000.5f64.cell(), "12000.5");
        check(None::<u64>.cell(), "–");
        check(Some("x".to_owned()).cell(), "x");
    }

    /// A row's load cell names the stolen share where it was measured; a row of
    /// results from before it was (no field) reads as it did.
    #[test]
    fn the_load_cell_names_the_stolen_share() {
        let row = |stolen: &str| {
            serde_json::from_str::<Measured>(&format!(
                r#"{{"messages":1,"load_average":"1.20 1.31 1.40","throughput_per_sec":1,
                "cpu_us_per_message":{{"redis":1.0}},"redis_unresponsive_ms":1.0,
                "redis_longest_event_ms":0{stolen},"tally":{{"delivered":1,"lost":0,"duplicated":0}}}}"#
            ))
            .unwrap()
        };
        check(
            load(&row(r#","cpu_stolen_percent":2.5"#)),
            "1.20 1.31 1.40, 2.5% stolen",
        );
        check(
            load(&row(r#","cpu_stolen_percent":0.0"#)),
            "1.20 1.31 1.40, 0% stolen",
        );
        check(load(&row("")), "1.20 1.31 1.40");
    }

    /// The CPU cell names the bench's own share where the row measured it; a row
    /// without it (every other row, and results from before) reads as it did.
    #[test]
    fn the_cpu_cell_names_the_bench_share_where_measured() {
        let row = |bench: &str| {
            serde_json::from_str::<Measured>(&format!(
                r#"{{"messages":1,"load_average":"1","throughput_per_sec":1,
                "cpu_us_per_message":{{"redis":22.5,"delayq":23.7{bench}}},"redis_unresponsive_ms":1.0,
                "redis_longest_event_ms":0,"tally":{{"delivered":1,"lost":0,"duplicated":0}}}}"#
            ))
            .unwrap()
        };
        check(cpu(&row(r#","bench":12.4"#)), "22.5 / 23.7, bench 12.4");
        check(cpu(&row("")), "22.5 / 23.7");
    }
}
