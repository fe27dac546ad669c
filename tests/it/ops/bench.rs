//! `delayq bench` at a tiny scale: the command runs every scenario (no peer) against
//! its own Redis (and etcd, for failover) and writes a well-formed report with nothing lost or duplicated;
//! and the bench's Python scripts run against the working tree's Lua.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::delayq_bin;

fn rows<'a>(report: &'a Value, system: &str, scenario: &str) -> Vec<&'a Value> {
    report["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["system"] == system && r["scenario"] == scenario)
        .collect()
}

#[track_caller]
fn check_delivered(row: &Value) {
    let t = &row["tally"];
    assert_eq!(t["lost"], 0, "lost in {row}");
    assert_eq!(t["duplicated"], 0, "duplicated in {row}");
    assert_eq!(t["delivered"], row["messages"], "delivered in {row}");
}

#[track_caller]
fn check_lateness(row: &Value) {
    let l = &row["lateness_ms"];
    let q = |k: &str| {
        l[k].as_f64()
            .unwrap_or_else(|| panic!("lateness {k} in {row}"))
    };
    assert!(
        q("p50") <= q("p99") && q("p99") <= q("p99_9") && q("p99_9") <= q("max"),
        "{row}"
    );
}

#[track_caller]
fn check_measured(row: &Value) {
    assert!(
        row["throughput_per_sec"].as_f64().unwrap_or(0.0) > 0.0,
        "throughput in {row}"
    );
    assert!(
        row["cpu_us_per_message"]["redis"].as_f64().unwrap_or(0.0) > 0.0,
        "Redis CPU in {row}"
    );
    assert!(
        row["redis_unresponsive_ms"].as_f64().unwrap_or(0.0) > 0.0,
        "probe in {row}"
    );
    assert!(
        !row["load_average"].as_str().unwrap_or("").is_empty(),
        "load in {row}"
    );
    // Linux counts stolen CPU time in /proc/stat in ticks of 10 ms a core, so a row
    // that took a few ticks has its share; a shorter one (a ceiling's drain of 5 ms)
    // may have seen no tick pass, and then names none.
    let stolen = &row["cpu_stolen_percent"];
    let long = row["drain_ms"].as_f64().is_none_or(|ms| ms >= 100.0);
    assert!(
        stolen
            .as_f64()
            .map_or(!long && stolen.is_null(), |share| (0.0..=100.0)
                .contains(&share)),
        "stolen share in {row}"
    );
    let scripts = &row["cpu_us_per_message"]["scripts"];
    assert!(
        scripts["per_message"].as_f64().unwrap_or(0.0) > 0.0
            && scripts["us_each"].as_f64().unwrap_or(0.0) > 0.0,
        "script calls in {row}"
    );
    // A call's µs split into other commands' and the rest, which add up.
    let part = |k: &str| scripts[k].as_f64().unwrap_or(-1.0);
    assert!(
        part("us_commands") >= 0.0
            && part("us_rest") >= 0.0
            && (part("us_commands") + part("us_rest") - part("us_each")).abs() <= 0.2,
        "a call's split in {row}"
    );
}

#[test]
fn tiny_suite_reports_every_scenario_with_nothing_lost() {
    let out = tempfile::tempdir().expect("temp dir");
    let started = std::time::Instant::now();
    let status = Command::new(delayq_bin())
        .args(["bench", "--suite", "tiny", "--no-peer", "--out"])
        .arg(out.path())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run delayq bench");
    assert!(status.success(), "delayq bench failed: {status}");
    assert!(
        started.elapsed() < Duration::from_secs(300) * crate::support::patience(),
        "took {:?}",
        started.elapsed()
    );

    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("results.json")).expect("results.json"),
    )
    .expect("JSON");
    assert_eq!(
        report["machine"]["redis"]
            .as_str()
            .map(|v| v.starts_with(|c: char| c.is_ascii_digit())),
        Some(true)
    );

    // One burst with the default layouts, then one with the hash layouts of both
    // records and pending messages, then one that keeps no record, then one pushed
    // with business keys, then one drained by two leaders of one election group
    // each (`election.mode = "per_shard"`).
    let burst = rows(&report, "delayq", "burst");
    assert_eq!(burst.len(), 5);
    assert_eq!(burst[0].get("records_layout"), None, "{}", burst[0]);
    assert_eq!(burst[0].get("pending_layout"), None, "{}", burst[0]);
    assert_eq!(burst[0].get("records_retention"), None, "{}", burst[0]);
    assert_eq!(burst[0].get("leaders"), None, "{}", burst[0]);
    assert_eq!(burst[1]["records_layout"], "hash", "{}", burst[1]);
    assert_eq!(burst[1]["pending_layout"], "hash", "{}", burst[1]);
    assert_eq!(burst[2]["records_retention"], "0s", "{}", burst[2]);
    assert_eq!(burst[2].get("records_layout"), None, "{}", burst[2]);
    assert_eq!(burst[3]["messages_per_key"], 3, "{}", burst[3]);
    assert_eq!(burst[4]["leaders"], 2, "{}", burst[4]);
    assert_eq!(burst[4].get("pending_layout"), None, "{}", burst[4]);
    for b in &burst {
        check_delivered(b);
        check_lateness(b);
        check_measured(b);
        if b.get("records_retention").is_none() {
            assert!(b["bytes_per_record"].as_f64().unwrap_or(0.0) > 10.0, "{b}");
        }
    }
    // The keyed burst measures its pending messages too (what a key adds is the
    // difference at the full suite's sizes; at 2000 messages it is within Redis's
    // allocation noise, either way).
    assert!(
        burst[3]["bytes_per_pending_message"]
            .as_f64()
            .unwrap_or(0.0)
            > 100.0,
        "{}",
        burst[3]
    );
    // Kept no record: what the drain itself left behind, well below the records.
    let bytes = |b: &serde_json::Value| b["bytes_per_record"].as_f64().unwrap_or(f64::MAX);
    assert!(
        bytes(burst[2]) < bytes(burst[0]) / 2.0,
        "{} against {}",
        burst[2],
        burst[0]
    );
    assert!(
        burst[0]["bytes_per_pending_message"]
            .as_f64()
            .unwrap_or(0.0)
            > 100.0,
        "{}",
        burst[0]
    );
    assert!(
        burst[0]["cpu_us_per_message"]["delayq"].is_number(),
        "{}",
        burst[0]
    );
    // A burst moves many messages a call.
    assert!(
        burst[0]["cpu_us_per_message"]["scripts"]["per_message"]
            .as_f64()
            .is_some_and(|calls| calls < 1.0),
        "{}",
        burst[0]
    );

    // Recurring schedules firing together: every occurrence once.
    let schedules = rows(&report, "delayq", "schedules");
    assert_eq!(schedules.len(), 1);
    check_delivered(schedules[0]);
    // No PING probe runs meanwhile (as for idle): its round trips would cost Redis
    // more than a few schedules do.
    assert!(
        schedules[0]["cpu_us_per_message"]["redis"]
            .as_f64()
            .unwrap_or(0.0)
            > 0.0,
        "{}",
        schedules[0]
    );
    assert_eq!(
        (
            schedules[0]["schedules"].as_u64(),
            schedules[0]["fires"].as_u64()
        ),
        (Some(50), Some(3)),
        "{}",
        schedules[0]
    );
    assert!(
        schedules[0]["lateness_ms"]["p99"].is_number(),
        "{}",
        schedules[0]
    );

    let ceiling = rows(&report, "ceiling", "burst");
    assert_eq!(ceiling.len(), 1);
    check_delivered(ceiling[0]);
    check_measured(ceiling[0]);

    for scenario in ["spread", "backlog-spread"] {
        let spread = rows(&report, "delayq", scenario);
        assert_eq!(spread.len(), 1, "{scenario}");
        check_delivered(spread[0]);
        check_lateness(spread[0]);
        check_measured(spread[0]);
    }
    assert_eq!(
        rows(&report, "delayq", "backlog-spread")[0]["backlog_still_pending"],
        2000
    );

    // An idle leader, per second: some script calls (its timers), no message.
    let idle = rows(&report, "delayq", "idle");
    assert_eq!(idle.len(), 1);
    let i = idle[0];
    assert_eq!(i["messages"], i["seconds"], "{i}");
    assert_eq!(i["tally"]["delivered"], 0, "{i}");
    assert!(
        i["cpu_us_per_message"]["redis"].as_f64().unwrap_or(0.0) > 0.0,
        "{i}"
    );

    for scenario in [
        "ingest-http",
        "ingest-http-ids-generated",
        "ingest-http-batch",
        "ingest-http-batch-ids-generated",
        "ingest-inbox-drain",
        "ingest-inbox",
    ] {
        let ingest = rows(&report, "delayq", scenario);
        assert_eq!(ingest.len(), 1, "{scenario}");
        check_delivered(ingest[0]);
        check_measured(ingest[0]);
    }
    // Single pushes: every one answered 201 over the bench's own connections, each
    // answer timed, and what the pushers cost the bench process measured.
    for scenario in ["ingest-http", "ingest-http-ids-generated"] {
        let row = rows(&report, "delayq", scenario)[0];
        assert_eq!(row["tally"]["refused"], 0, "{row}");
        let request = &row["request_ms"];
        assert!(request["p50"].as_f64().is_some_and(|p| p > 0.0), "{row}");
        assert!(request["p50"].as_f64() <= request["max"].as_f64(), "{row}");
        let bench = row["cpu_us_per_message"]["bench"].as_f64();
        assert!(bench.is_some_and(|us| us > 0.0), "{row}");
    }

    // The catch-up: 2000 overdue at 1000/s while live traffic goes to another stream.
    let catchup = rows(&report, "delayq", "catchup");
    assert_eq!(catchup.len(), 1);
    let c = catchup[0];
    assert_eq!(c["tally"]["lost"], 0, "{c}");
    assert_eq!(c["tally"]["duplicated"], 0, "{c}");
    assert!(
        c["tally"]["delivered"].as_u64() > c["messages"].as_u64(),
        "the backlog and the live messages: {c}"
    );
    let (drain, expected) = (c["drain_ms"].as_u64(), c["expected_drain_ms"].as_u64());
    assert!(
        drain
            .zip(expected)
            .is_some_and(|(d, e)| e == 2000 && d * 10 >= e * 8),
        "the limit was not kept: {c}"
    );
    assert!(c["live_lateness_ms"]["p99"].is_number(), "{c}");
    check_measured(c);

    let failover = rows(&report, "delayq", "failover-sigterm");
    assert_eq!(failover.len(), 1);
    check_delivered(failover[0]);
    check_lateness(failover[0]);
    assert!(
        failover[0]["takeover_ms"].as_f64().is_some(),
        "no takeover: {}",
        failover[0]
    );
    // Two rounds: the stopped leader stands by again and the new one is stopped.
    let rounds = failover[0]["takeovers_ms"].as_array().expect("rounds");
    assert!(
        rounds.len() == 2 && rounds.iter().all(Value::is_number),
        "{}",
        failover[0]
    );
    let q = failover[0]["takeover_quantiles_ms"]
        .as_array()
        .expect("quantiles");
    assert!(
        q.len() == 3 && q[0].as_f64() <= q[1].as_f64() && q[1].as_f64() <= q[2].as_f64(),
        "{}",
        failover[0]
    );
    // By the new leader's own clock (to the ms) its leadership began no later than
    // its first 200 answer.
    let led = failover[0]["led_quantiles_ms"]
        .as_array()
        .expect("quantiles by the leader's clock");
    let led: Vec<f64> = led.iter().filter_map(Value::as_f64).collect();
    assert!(
        led.len() == 3 && led[0] <= led[1] && led[1] <= led[2] && led[0] >= -1.0,
        "{}",
        failover[0]
    );
    assert!(
        led[2] <= q[2].as_f64().expect("max") + 1.0,
        "{}",
        failover[0]
    );
    assert!(
        failover[0]["forwarding_gap_ms"].as_u64().unwrap_or(0) > 0,
        "{}",
        failover[0]
    );

    let reference = &report["redis_benchmark"][0]["results"];
    for key in [
        "xadd_p1_per_sec",
        "xadd_p16_per_sec",
        "zadd_p1_per_sec",
        "zadd_p16_per_sec",
    ] {
        assert!(
            reference[key].as_f64().unwrap_or(0.0) > 0.0,
            "{key}: {reference}"
        );
    }

    let targets = report["targets"].as_array().expect("targets");
    let zero_loss = targets
        .iter()
        .find(|t| t["target"] == "0 lost, 0 duplicated")
        .expect("loss target");
    assert_eq!(zero_loss["met"], "yes", "{zero_loss}");
    assert!(
        targets
            .iter()
            .all(|t| t["met"].is_string() && t["measured"].is_array())
    );

    let markdown = std::fs::read_to_string(out.path().join("results.md")).expect("results.md");
    for heading in [
        "## Targets",
        "## Burst",
        "## Spread",
        "## Ingest",
        "## Catch-up",
        "## Idle",
        "## redis-benchmark",
    ] {
        assert!(
            markdown.contains(heading),
            "{heading} missing from:\n{markdown}"
        );
    }
    assert!(markdown.contains("| delayq | 2000 |"), "{markdown}");
    assert!(
        markdown.contains("(script calls/msg × µs each: commands, rest)")
            && markdown.contains(" rest) |"),
        "{markdown}"
    );
}

/// Runs `delayq bench` with `ingest` messages in each ingest scenario, the other
/// scenarios off but as `extra` says; returns its results.json and results.md.
async fn ingest_bench(ingest: &str, extra: &[&str]) -> (Value, String) {
    let out = tempfile::tempdir().expect("temp dir");
    let status = tokio::process::Command::new(delayq_bin())
        .args(["bench", "--ingest", ingest, "--burst", "0", "--rate", "0"])
        .args(["--backlog", "0", "--catchup", "0", "--leaders", "0"])
        .args([
            "--cluster",
            "0",
            "--no-peer",
            "--no-ceiling",
            "--no-failover",
        ])
        .args(extra)
        .arg("--out")
        .arg(out.path())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .expect("run delayq bench");
    assert!(status.success(), "delayq bench failed: {status}");
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("results.json")).expect("results.json"),
    )
    .expect("JSON");
    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    (report, md)
}

/// `--journal-url`: the ingest scenarios run with the daemons journaling into a
/// real MariaDB (emptied with Redis between them), nothing lost, and the report's
/// command shows the URL without its password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_with_the_journal_loses_nothing_and_hides_the_password() {
    let db = tokio::task::spawn_blocking(delayq_harness::MariaDbServer::start)
        .await
        .unwrap()
        .expect("start MariaDB");
    let url = db.url_with_password();
    let (report, md) = ingest_bench("2000", &["--journal-url", &url]).await;
    for scenario in [
        "ingest-http",
        "ingest-http-ids-generated",
        "ingest-http-batch",
        "ingest-http-batch-ids-generated",
        "ingest-inbox-drain",
        "ingest-inbox",
    ] {
        let found = rows(&report, "delayq", scenario);
        assert_eq!(found.len(), 1, "{scenario}");
        check_delivered(found[0]);
        check_measured(found[0]);
    }
    assert!(
        md.contains("--journal-url mysql://delayq:<redacted>@"),
        "{md}"
    );
    assert!(!md.contains(&db.password) && !report.to_string().contains(&db.password));
    // Every scenario's messages went into the journal (emptied between them).
    let status = db.sql("SHOW GLOBAL STATUS LIKE 'Handler_write'").unwrap();
    let inserted: u64 = status.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(inserted >= 5 * 2000, "{status}");
}

/// `--journaled true`: batch ingest once more with the journal on, into a MariaDB
/// the bench starts itself; nothing lost, the row and its target in the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journaled_ingest_runs_into_a_mariadb_of_its_own() {
    let (report, md) = ingest_bench("1000", &["--schedules", "0", "--journaled", "true"]).await;
    let found = rows(&report, "delayq", "ingest-http-batch-journaled");
    assert_eq!(found.len(), 1, "{report}");
    check_delivered(found[0]);
    check_measured(found[0]);
    assert!(
        md.contains("| journaled batch HTTP ingest ≥ 30")
            && md.contains("| ingest-http-batch-journaled |"),
        "{md}"
    );
}

/// `--journaled` takes true or false; anything else is refused, naming it, before
/// the bench starts anything.
#[test]
fn journaled_takes_true_or_false_and_refuses_the_rest() {
    let out = std::process::Command::new(delayq_bin())
        .args(["bench", "--journaled", "maybe"])
        .output()
        .expect("run delayq bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--journaled") && stderr.contains("maybe"),
        "{stderr}"
    );
}

/// The bench's Python scripts load the working tree's Lua themselves: a small run of
/// each still gets through its calls (those that compare a git revision with the
/// working tree, against HEAD).
#[test]
fn the_lua_bench_scripts_run_against_the_working_tree() {
    for (script, args, says) in [
        ("key_memory.py", &["3000", "1"][..], "a key adds"),
        ("kept_apart.py", &["2000"][..], "kept apart"),
        ("records_memory.py", &["2000", "1"][..], "the list adds"),
        ("id_length.py", &["20", "2"][..], "b<n>"),
        ("call_floor.py", &["50", "1"][..], "least push"),
        ("arg_cost.py", &["1"][..], "shared values once"),
        // inbox_read stops unless each way read every entry.
        (
            "inbox_read.py",
            &["2000", "400", "1"][..],
            "XREAD from a cursor",
        ),
        (
            "inbox_trim.py",
            &["2000", "500", "1"][..],
            "XACK + XTRIM MINID",
        ),
        // inbox_intake stops unless each way read every entry and left none.
        (
            "inbox_intake.py",
            &["2000", "400", "1"][..],
            "reads in flight",
        ),
        // Its levers find the text they change, or it stops.
        ("levers.py", &["random", "20", "1"][..], "all      as it is"),
        // These two compare a revision with the working tree: here HEAD's.
        (
            "script_ab.py",
            &["HEAD", "arrival", "20", "2", "1"][..],
            "working tree",
        ),
        (
            "forward_ab.py",
            &["HEAD", "200", "1", "1000"][..],
            "working tree",
        ),
        (
            "replay_cost.py",
            &["1000", "0.3", "1"][..],
            "commands replayed",
        ),
        (
            "spread_floor.py",
            &["0.1", "1", "20", "2000"][..],
            "Redis memory a message",
        ),
        // Its drain stops unless every forward moved each message exactly once.
        (
            "spread_floor.py",
            &["drain", "1", "200", "2000"][..],
            "least compact, no records",
        ),
    ] {
        let out = std::process::Command::new("python3")
            .arg(format!("{}/bench/{script}", env!("CARGO_MANIFEST_DIR")))
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(says),
            "{script}: {}\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
