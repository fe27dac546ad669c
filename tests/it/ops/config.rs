//! The configuration: `check-config` on good and bad files, a bad one at `run`
//! (one line, in the chosen format), every line's priority under the journal, and
//! SIGHUP reloading what may change while running.

use std::process::Command;
use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};

use super::delayq;
use crate::support::{Api, delayq_bin, eventually, text};

#[track_caller]
fn check_bad_config(toml: &str, expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delayq.toml");
    std::fs::write(&path, toml).unwrap();
    let out = delayq(&["check-config", "--config", path.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{toml:?}: {stderr}");
    assert!(
        stderr.contains(expected),
        "{toml:?}: {stderr:?} should name {expected:?}"
    );
    assert!(out.stdout.is_empty(), "nothing printed for a bad config");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr:?}");
}

#[test]
fn check_config_refuses_each_kind_of_bad_config_naming_the_key() {
    // Not TOML at all.
    check_bad_config("[redis\nurl = 1", "line 1, column 7:");
    // A key that does not exist, and one of the wrong type.
    check_bad_config(
        "[redis]\nshard = 4",
        "redis.shard: unknown key (known: url,",
    );
    check_bad_config("[redis]\nshards = \"x\"", "redis.shards");
    check_bad_config("[etcd]\nlease_ttl = \"soon\"", "etcd.lease_ttl");
    // Values that break a rule.
    check_bad_config("[redis]\nshards = 0", "redis.shards: must be 1 to 1024");
    check_bad_config("[redis]\nurl = \"http://x\"", "redis.url");
    check_bad_config(
        "[etcd]\nendpoints = [\"http://e:2379\"]\nlease_ttl = \"1s\"",
        "etcd.lease_ttl",
    );
    check_bad_config("[etcd]\nendpoints = [\"e:2379\"]", "etcd.endpoints");
    check_bad_config("[api]\nlisten = \"everywhere\"", "api.listen");
    check_bad_config("[streams]\nallow = [\"\"]", "streams.allow");
    check_bad_config("[streams.maxlen]\norders = -1", "streams.maxlen.orders");
    check_bad_config("[forwarder]\nbatch_size = 0", "forwarder.batch_size");
    check_bad_config(
        "[records]\ntrim_interval = \"1ms\"",
        "records.trim_interval",
    );
    check_bad_config("[log]\nlevel = \"loud[\"", "log.level");
    check_bad_config("[log]\nformat = \"xml\"", "log.format");
}

#[test]
fn check_config_refuses_a_missing_file_and_a_bad_environment() {
    let out = delayq(&["check-config", "--config", "/nonexistent/delayq.toml"]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr.trim(),
        "delayq: bad configuration: /nonexistent/delayq.toml: cannot read it: No such file or directory (os error 2)"
    );

    let out = Command::new(delayq_bin())
        .args(["check-config"])
        .env("DELAYQ_REDIS_SHARDS", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains("redis.shards (from DELAYQ_REDIS_SHARDS): must be 1 to 1024"),
        "{out:?}"
    );
}

#[test]
fn check_config_prints_the_effective_configuration_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delayq.toml");
    std::fs::write(
        &path,
        "[redis]\nurl = \"redis://app:hunter2@db.internal:6379/0\"\nshards = 8\n\
         [etcd]\nendpoints = [\"http://e1:2379\", \"http://e2:2379\"]\n",
    )
    .unwrap();
    let out = Command::new(delayq_bin())
        .args(["check-config", "--config", path.to_str().unwrap()])
        .env("DELAYQ_NODE_ID", "primary")
        .env("DELAYQ_ETCD_LEASE_TTL", "4s")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(!stdout.contains("hunter2"), "{stdout}");
    let table: toml::Table = stdout.parse().expect("the listing is TOML");
    assert_eq!(
        table["redis"]["url"].as_str(),
        Some("redis://app:<redacted>@db.internal:6379/0")
    );
    assert_eq!(table["redis"]["shards"].as_integer(), Some(8));
    assert_eq!(table["node"]["id"].as_str(), Some("primary"));
    assert_eq!(table["etcd"]["lease_ttl"].as_str(), Some("4s"));
    assert_eq!(
        table["etcd"]["prefix"].as_str(),
        Some("/delayq/default/leader")
    );
    // Defaults are filled in, every section is there.
    for section in [
        "node",
        "redis",
        "etcd",
        "api",
        "streams",
        "forwarder",
        "records",
        "log",
    ] {
        assert!(table.contains_key(section), "{section} missing:\n{stdout}");
    }
    assert_eq!(table["forwarder"]["batch_size"].as_integer(), Some(200));

    // The listing is itself a valid configuration file.
    let again = dir.path().join("again.toml");
    std::fs::write(&again, stdout.replace("<redacted>", "pw")).unwrap();
    let out = delayq(&[
        "check-config",
        "--quiet",
        "--config",
        again.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
}

#[test]
fn a_bad_configuration_at_run_is_one_line_in_the_chosen_format_with_file_key_and_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    for (format, check) in [
        ("json", check_json_startup_error as fn(&str, &str)),
        ("text", check_text_startup_error),
    ] {
        let path = dir.path().join(format!("{format}.toml"));
        std::fs::write(
            &path,
            format!("[log]\nformat = \"{format}\"\n[redis]\nshards = 0\n"),
        )
        .unwrap();
        let out = delayq(&["run", "--config", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(64), "{out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
        let stderr = text(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        check(stderr.trim(), path.to_str().unwrap());
    }
}

fn check_json_startup_error(line: &str, path: &str) {
    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(v["level"], "ERROR", "{line}");
    assert_eq!(v["fields"]["message"], "bad configuration", "{line}");
    assert_eq!(v["fields"]["exit_code"], 64, "{line}");
    let error = v["fields"]["error"].as_str().unwrap();
    assert!(
        error.contains(path) && error.contains("redis.shards: must be 1 to 1024"),
        "{line}"
    );
}

fn check_text_startup_error(line: &str, path: &str) {
    assert!(line.starts_with("delayq: bad configuration: "), "{line}");
    assert!(
        line.contains(path) && line.contains("redis.shards: must be 1 to 1024"),
        "{line}"
    );
    assert!(line.ends_with("(exit code 64)"), "{line}");
}

#[tokio::test]
async fn under_the_journal_every_line_carries_its_priority() {
    let mut redis = RedisServer::start().unwrap();
    let node = DelayqProcess::start_with_env(
        &delayq_bin(),
        "journaled",
        &format!(
            "[redis]\nurl = \"{}\"\nshards = 2\ntimeout = \"200ms\"\n",
            redis.url()
        ),
        &[("JOURNAL_STREAM", "8:12345")],
    )
    .unwrap();
    eventually(Duration::from_secs(10), "an INFO line", || async {
        node.full_log().contains("delayq started").then_some(())
    })
    .await;
    redis.kill();
    eventually(Duration::from_secs(10), "a WARN line", || async {
        node.full_log()
            .lines()
            .any(|l| l.starts_with("<4>"))
            .then_some(())
    })
    .await;
    let log = node.full_log();
    for line in log.lines().filter(|l| !l.is_empty()) {
        let want = if line.contains(" WARN ") {
            "<4>"
        } else if line.contains(" INFO ") {
            "<6>"
        } else if line.contains(" ERROR ") {
            "<3>"
        } else {
            "<7>"
        };
        assert!(line.starts_with(want), "{want} expected: {line}");
    }
}

/// The status of a push to `stream`; 0 when the node does not answer.
async fn post_status(api: &Api, stream: &str) -> u16 {
    let body = format!(r#"{{ "stream": "{stream}", "payload": "x", "delay": "1h" }}"#);
    api.try_call("POST", "/v1/messages", None, Some(&body))
        .await
        .map_or(0, |(status, _)| status)
}

#[tokio::test]
async fn sighup_reloads_the_allow_list_and_log_level_and_keeps_the_rest() {
    let redis = RedisServer::start().unwrap();
    let base = format!("[redis]\nurl = \"{}\"\nshards = 2\n", redis.url());
    let node = DelayqProcess::start(
        &delayq_bin(),
        "reloading",
        &format!("{base}[streams]\nallow = [\"orders\"]\n"),
    )
    .unwrap();
    let api = Api::new(node.api);
    eventually(
        Duration::from_secs(10),
        "the API accepts orders",
        || async { (post_status(&api, "orders").await == 201).then_some(()) },
    )
    .await;
    assert_eq!(post_status(&api, "billing").await, 403);

    // The file keeps its [api] listen line (the harness wrote it); change the
    // allow list, the level, and a key that needs a restart.
    let file = std::fs::read_to_string(node.config_path()).unwrap();
    let changed = file
        .replace("allow = [\"orders\"]", "allow = [\"orders\", \"billing*\"]")
        .replace("shards = 2", "shards = 3")
        + "\n[log]\nlevel = \"debug\"\n";
    std::fs::write(node.config_path(), changed).unwrap();
    node.signal(libc::SIGHUP);

    eventually(
        Duration::from_secs(10),
        "billing accepted after SIGHUP",
        || async { (post_status(&api, "billing-eu").await == 201).then_some(()) },
    )
    .await;
    let log = node.full_log();
    assert!(log.contains("configuration reloaded"), "{log}");
    assert!(log.contains("key=streams.allow"), "{log}");
    assert!(log.contains("key=log.level"), "{log}");
    assert!(
        log.contains("key=redis.shards") && log.contains("changes only at a restart"),
        "{log}"
    );
    // The new level is in force: debug lines appear after the reload.
    assert_eq!(post_status(&api, "orders").await, 201);
    eventually(Duration::from_secs(10), "a debug line", || async {
        let log = node.full_log();
        let after = &log[log.find("configuration reloaded").unwrap()..];
        after.contains("DEBUG").then_some(())
    })
    .await;

    // A bad file changes nothing and says why.
    std::fs::write(node.config_path(), "[redis]\nshards = 0\n").unwrap();
    node.signal(libc::SIGHUP);
    eventually(Duration::from_secs(10), "the refusal logged", || async {
        node.full_log()
            .contains("configuration reload refused")
            .then_some(())
    })
    .await;
    assert!(node.full_log().contains("redis.shards: must be 1 to 1024"));
    assert_eq!(post_status(&api, "billing-us").await, 201);
    assert_eq!(post_status(&api, "payroll").await, 403);
    let metrics = api.metrics().await.unwrap();
    assert!(metrics.contains("delayq_config_reloads_total{result=\"applied\"} 1"));
    assert!(metrics.contains("delayq_config_reloads_total{result=\"refused\"} 1"));
}

#[tokio::test]
async fn a_node_started_without_a_file_answers_a_reload_409() {
    let redis = RedisServer::start().unwrap();
    let port = delayq_harness::free_port();
    let mut child = tokio::process::Command::new(delayq_bin())
        .arg("run")
        .env_clear()
        .env("DELAYQ_REDIS_URL", redis.url())
        .env("DELAYQ_API_LISTEN", format!("127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run delayq without --config");
    let api = Api::new(format!("127.0.0.1:{port}"));
    eventually(Duration::from_secs(10), "the node answers", || async {
        (api.status("/healthz").await == Some(200)).then_some(())
    })
    .await;
    let (status, answer) = api.post("/v1/admin/reload", serde_json::json!({})).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("no_config_file")),
        "{answer}"
    );
    child.kill().await.unwrap();
}

/// A reload whose `[delivery]` breaks a rule against the running value of a key
/// that changes only at a restart is refused, naming the key, and changes nothing:
/// here an ack timeout as long as the running records' retention (which could
/// redeliver a message twice once its record is gone).
#[tokio::test]
async fn a_reload_is_checked_against_the_values_that_keep_running() {
    let redis = RedisServer::start().unwrap();
    let watched = "[delivery.streams.orders]\ngroups = [\"g\"]\nack_timeout = \"3s\"\n";
    let node = DelayqProcess::start(
        &delayq_bin(),
        "rechecked",
        &format!(
            "[redis]\nurl = \"{}\"\nshards = 2\n[records]\nretention = \"10s\"\n{watched}",
            redis.url()
        ),
    )
    .unwrap();
    let api = Api::new(node.api);
    eventually(Duration::from_secs(10), "the node answers", || async {
        (api.status("/healthz").await == Some(200)).then_some(())
    })
    .await;
    let file = std::fs::read_to_string(node.config_path()).unwrap();
    let longer = file
        .replace("retention = \"10s\"", "retention = \"1h\"")
        .replace("ack_timeout = \"3s\"", "ack_timeout = \"30s\"");
    std::fs::write(node.config_path(), longer).unwrap();
    let (status, answer) = api.post("/v1/admin/reload", serde_json::json!({})).await;
    assert_eq!(status, 422, "{answer}");
    let detail = answer["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("delivery.streams.orders.ack_timeout")
            && detail.contains("the running records.retention is 10s"),
        "{detail}"
    );
    // The same file passes once the ack timeout fits the running retention.
    std::fs::write(node.config_path(), file.replace("\"3s\"", "\"9s\"")).unwrap();
    let (status, answer) = api.post("/v1/admin/reload", serde_json::json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let metrics = api.metrics().await.unwrap();
    assert!(metrics.contains("delayq_config_reloads_total{result=\"refused\"} 1"));
    assert!(metrics.contains("delayq_config_reloads_total{result=\"applied\"} 1"));
}
