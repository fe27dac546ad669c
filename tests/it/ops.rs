//! Operating delayq: check-config, SIGHUP reload, the service manager protocol
//! (readiness, status, watchdog), the systemd unit, the compose file, the health
//! command, the failover drill and the quickstart demo. Real processes throughout.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use delayq::harness::{DelayqProcess, RedisServer};

use crate::support::{delayq_bin, eventually, metrics, patience};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn delayq(args: &[&str]) -> Output {
    Command::new(delayq_bin())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run delayq")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---- check-config ---------------------------------------------------------------

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
}

#[test]
fn check_config_refuses_each_kind_of_bad_config_naming_the_key() {
    // Not TOML at all.
    check_bad_config("[redis\nurl = 1", "TOML parse error at line 1");
    // A key that does not exist, and one of the wrong type.
    check_bad_config("[redis]\nshard = 4", "unknown field `shard`");
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
    assert!(text(&out.stderr).contains("/nonexistent/delayq.toml"));

    let out = Command::new(delayq_bin())
        .args(["check-config"])
        .env("DELAYQ_REDIS_SHARDS", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("redis.shards"), "{out:?}");
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

// ---- startup errors and the journal ----------------------------------------------

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

// ---- SIGHUP ---------------------------------------------------------------------

async fn post_status(http: &reqwest::Client, node: &DelayqProcess, stream: &str) -> u16 {
    http.post(node.url("/v1/messages"))
        .json(&serde_json::json!({ "stream": stream, "payload": "x", "delay": "1h" }))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
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
    let http = reqwest::Client::new();
    eventually(
        Duration::from_secs(10),
        "the API accepts orders",
        || async { (post_status(&http, &node, "orders").await == 201).then_some(()) },
    )
    .await;
    assert_eq!(post_status(&http, &node, "billing").await, 403);

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
        || async { (post_status(&http, &node, "billing-eu").await == 201).then_some(()) },
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
    assert_eq!(post_status(&http, &node, "orders").await, 201);
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
    assert_eq!(post_status(&http, &node, "billing-us").await, 201);
    assert_eq!(post_status(&http, &node, "payroll").await, 403);
    let metrics = metrics(&http, node.url("/metrics")).await.unwrap();
    assert!(metrics.contains("delayq_config_reloads_total{result=\"applied\"} 1"));
    assert!(metrics.contains("delayq_config_reloads_total{result=\"refused\"} 1"));
}

// ---- the service manager protocol ------------------------------------------------

/// A stand-in for systemd's notification socket: collects what the daemon sends.
struct NotifySocket {
    _dir: tempfile::TempDir,
    path: PathBuf,
    socket: UnixDatagram,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        NotifySocket {
            _dir: dir,
            path,
            socket,
        }
    }

    /// Messages received within `wait`.
    fn receive_for(&self, wait: Duration) -> Vec<String> {
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if let Ok(n) = self.socket.recv(&mut buf) {
                out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        out
    }

    /// Waits for a message containing `needle`; returns every message until then.
    fn wait_for(&self, needle: &str, timeout: Duration) -> Vec<String> {
        self.wait_until(needle, |m| m.contains(needle), timeout)
    }

    /// Waits for a message that `wanted` accepts (`what` names it in a failure);
    /// returns every message until then.
    fn wait_until(
        &self,
        what: &str,
        wanted: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout * patience();
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            seen.extend(self.receive_for(Duration::from_millis(100)));
            if seen.iter().any(|m| wanted(m)) {
                return seen;
            }
        }
        panic!("no {what:?} from the daemon; got {seen:?}");
    }
}

#[test]
fn tells_the_service_manager_ready_status_and_alive_through_a_redis_outage() {
    let mut redis = RedisServer::start().unwrap();
    let notify = NotifySocket::bind();
    let mut node = DelayqProcess::start_with_env(
        &delayq_bin(),
        "notified",
        &format!(
            "[redis]\nurl = \"{}\"\nshards = 2\ntimeout = \"300ms\"\n",
            redis.url()
        ),
        &[
            ("NOTIFY_SOCKET", notify.path.to_str().unwrap()),
            ("WATCHDOG_USEC", "800000"),
        ],
    )
    .unwrap();

    let seen = notify.wait_for("READY=1", Duration::from_secs(10));
    let ready = seen.iter().find(|m| m.contains("READY=1")).unwrap();
    assert!(
        ready.contains("STATUS=leader, epoch 1 (standalone)"),
        "{seen:?}"
    );
    // Alive: several pings within a few watchdog intervals.
    let pings = notify
        .receive_for(Duration::from_secs(2))
        .iter()
        .filter(|m| m.contains("WATCHDOG=1"))
        .count();
    assert!(pings >= 3, "expected pings every 200ms, got {pings}");

    // Redis gone for longer than the watchdog interval: the process itself is fine,
    // so it keeps vouching for itself (no restart storm), and says what is wrong.
    redis.kill();
    notify.wait_for("redis unreachable", Duration::from_secs(10));
    let during = notify.receive_for(Duration::from_secs(2));
    let pings = during.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(pings >= 3, "pings while Redis was down: {during:?}");

    // Redis back: the status says so.
    redis.restart().unwrap();
    notify.wait_until(
        "a leader status without a Redis problem",
        |m| m.contains("STATUS=leader, epoch") && !m.contains("redis"),
        Duration::from_secs(10),
    );

    // A hung process (SIGSTOP) sends nothing.
    node.signal(libc::SIGSTOP);
    let _ = notify.receive_for(Duration::from_millis(200));
    assert!(notify.receive_for(Duration::from_secs(1)).is_empty());
    node.signal(libc::SIGCONT);
    notify.wait_for("WATCHDOG=1", Duration::from_secs(10));

    // SIGTERM: STOPPING=1, then a clean exit.
    node.signal(libc::SIGTERM);
    notify.wait_for("STOPPING=1", Duration::from_secs(10));
    // One signal only: a second one means "exit at once", which is not what is tested.
    let status = node.wait_exit(Duration::from_secs(15) * patience());
    assert!(status.is_some_and(|s| s.success()), "{}", node.log());
}

// ---- the systemd unit -------------------------------------------------------------

fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{name} is not installed: run .ci/install-deps --tests"))
}

/// The unit, with ExecStart pointing at the binary these tests built (verify
/// checks that the executable exists).
fn unit_copy(dir: &Path) -> PathBuf {
    let unit = std::fs::read_to_string(repo().join("systemd/delayq@.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/delayq run --config /etc/delayq/%i.toml"));
    let unit = unit.replace("/usr/bin/delayq", delayq_bin().to_str().unwrap());
    std::fs::write(dir.join("delayq@.service"), unit).unwrap();
    dir.join("delayq@primary.service")
}

#[test]
fn systemd_unit_verifies_and_scores_at_most_2_0() {
    let analyze = tool("systemd-analyze");
    let dir = tempfile::tempdir().unwrap();
    let instance = unit_copy(dir.path());

    let out = Command::new(&analyze)
        .arg("verify")
        .arg(&instance)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    let out = Command::new(&analyze)
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&instance)
        .output()
        .unwrap();
    let report = text(&out.stdout);
    let line = report
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no score in:\n{report}{}", text(&out.stderr)));
    let score: f64 = line
        .split(": ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the score in {line:?}"));
    assert!(score <= 2.0, "exposure {score} > 2.0:\n{report}");

    for setting in [
        "Type=notify",
        "WatchdogSec=",
        "Restart=always",
        "TimeoutStopSec=20s",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "RestartPreventExitStatus=64",
        "LimitNOFILE=65536",
    ] {
        assert!(
            std::fs::read_to_string(repo().join("systemd/delayq@.service"))
                .unwrap()
                .contains(setting),
            "{setting}"
        );
    }
}

#[test]
fn sysusers_file_creates_the_service_user() {
    let sysusers = tool("systemd-sysusers");
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("etc")).unwrap();
    let out = Command::new(sysusers)
        .arg(format!("--root={}", root.path().display()))
        .arg(repo().join("systemd/delayq.sysusers"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("delayq:") && l.ends_with(":/usr/sbin/nologin")),
        "{passwd}"
    );
}

// ---- Docker ---------------------------------------------------------------------------

#[test]
fn compose_file_is_valid_and_its_delayq_environment_passes_check_config() {
    let compose = tool("docker-compose");
    let file = repo().join("docker/compose.yaml");
    let secrets = tempfile::tempdir().unwrap();
    let tokens = secrets.path().join("api-tokens");
    std::fs::write(&tokens, "compose-test-token\n").unwrap();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(&compose)
            .arg("-f")
            .arg(&file)
            .args(args)
            .env("API_TOKENS_FILE", &tokens)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docker-compose {args:?}: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    let mut services: Vec<String> = run(&["config", "--services"], &[])
        .lines()
        .map(str::to_owned)
        .collect();
    services.sort();
    assert_eq!(
        services,
        [
            "delayq-1", "delayq-2", "delayq-3", "etcd-1", "etcd-2", "etcd-3", "redis"
        ]
    );
    let rendered = run(&["config"], &[]);
    assert!(
        rendered.contains("- --appendonly\n    - \"yes\"\n"),
        "Redis keeps an append-only file:\n{rendered}"
    );
    for n in 1..=3 {
        assert!(
            rendered.contains(&format!("DELAYQ_NODE_ID: delayq-{n}")),
            "{rendered}"
        );
        assert!(
            rendered.contains(&format!("127.0.0.1:707{n}:7070")),
            "{rendered}"
        );
    }
    // Pinned images by default; each one, and the ports, can be chosen.
    for image in ["image: redis:7.4.1", "image: quay.io/coreos/etcd:v3.5.17"] {
        assert!(rendered.contains(image), "{image}:\n{rendered}");
    }
    let chosen = run(
        &["config"],
        &[
            ("REDIS_IMAGE", "local/servers"),
            ("ETCD_IMAGE", "local/servers"),
            ("DELAYQ_IMAGE", "delayq:test"),
            ("DELAYQ_PORT_2", "17072"),
            ("REDIS_PORT", "16379"),
        ],
    );
    assert_eq!(
        chosen.matches("image: local/servers").count(),
        4,
        "{chosen}"
    );
    assert_eq!(chosen.matches("image: delayq:test").count(), 3, "{chosen}");
    assert!(chosen.contains("127.0.0.1:17072:7070"), "{chosen}");
    assert!(chosen.contains("127.0.0.1:16379:6379"), "{chosen}");

    // The instances listen beyond loopback, so they read tokens from the secret.
    assert!(
        rendered.contains(&format!("file: {}", tokens.display())),
        "{rendered}"
    );
    assert!(
        rendered.contains("DELAYQ_API_TOKENS_FILE: /run/secrets/api_tokens"),
        "{rendered}"
    );
    assert!(!rendered.contains("DELAYQ_API_TOKENS:"), "{rendered}");

    // Every DELAYQ_* variable the instances get must make a valid configuration,
    // with the secret where the container sees it.
    let env: Vec<(String, String)> = rendered
        .lines()
        .filter_map(|l| l.trim().split_once(": "))
        .filter(|(k, _)| k.starts_with("DELAYQ_"))
        .map(|(k, v)| {
            let v = v.trim_matches('\'');
            let v = if v == "/run/secrets/api_tokens" {
                tokens.to_str().unwrap()
            } else {
                v
            };
            (k.to_owned(), v.to_owned())
        })
        .collect();
    assert!(
        env.iter().any(|(k, _)| k == "DELAYQ_ETCD_ENDPOINTS"),
        "{env:?}"
    );
    let out = Command::new(delayq_bin())
        .arg("check-config")
        .envs(env.iter().cloned())
        .output()
        .unwrap();
    let effective: toml::Table = text(&out.stdout).parse().expect("TOML");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(effective["api"]["listen"].as_str(), Some("0.0.0.0:7070"));
    assert_eq!(
        effective["etcd"]["endpoints"].as_array().map(Vec::len),
        Some(3)
    );
    assert_eq!(effective["log"]["format"].as_str(), Some("json"));
    // Without the secret an instance refuses to listen beyond loopback.
    let out = Command::new(delayq_bin())
        .arg("check-config")
        .envs(
            env.into_iter()
                .filter(|(k, _)| k != "DELAYQ_API_TOKENS_FILE"),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(text(&out.stderr).contains("api.tokens is empty"), "{out:?}");
}

#[test]
fn per_host_compose_file_runs_one_instance_on_the_host_network() {
    let compose = tool("docker-compose");
    let file = repo().join("docker/compose.node.yaml");
    let vars = [
        ("NODE_ID", "host-a"),
        ("NODE_ADDR", "10.0.0.5"),
        ("REDIS_URL", "redis://redis.internal:6379"),
        ("ETCD_ENDPOINTS", "http://etcd-1:2379,http://etcd-2:2379"),
        ("API_TOKENS_FILE", "/etc/delayq/api-tokens"),
    ];
    let config = |skip: &str| {
        Command::new(&compose)
            .arg("-f")
            .arg(&file)
            .arg("config")
            .envs(vars.iter().filter(|(k, _)| *k != skip).copied())
            .output()
            .unwrap()
    };
    let out = config("");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rendered = text(&out.stdout);
    for line in [
        "network_mode: host",
        "DELAYQ_NODE_ID: host-a",
        "DELAYQ_API_LISTEN: 10.0.0.5:7070",
        "DELAYQ_API_TOKENS_FILE: /run/secrets/api_tokens",
        "file: /etc/delayq/api-tokens",
        "stop_grace_period: 20s",
    ] {
        assert!(rendered.contains(line), "{line}:\n{rendered}");
    }
    // Each host says who it is, and where Redis and etcd are.
    for var in ["NODE_ID", "NODE_ADDR", "REDIS_URL", "ETCD_ENDPOINTS"] {
        let out = config(var);
        assert!(!out.status.success(), "{var} unset");
        assert!(text(&out.stderr).contains(var), "{}", text(&out.stderr));
    }
}

#[test]
fn dockerfile_builds_from_files_that_exist_and_checks_health_with_a_real_command() {
    let dockerfile = std::fs::read_to_string(repo().join("docker/Dockerfile")).unwrap();
    for line in dockerfile.lines().filter(|l| l.starts_with("COPY ")) {
        if line.contains("--from=") {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        for source in &parts[1..parts.len() - 1] {
            assert!(repo().join(source).exists(), "{line}: {source} missing");
        }
    }
    // Base images are arguments, with pinned defaults.
    assert!(dockerfile.contains("ARG BASE_IMAGE=debian:bookworm-slim\n"));
    assert!(dockerfile.contains("ARG RUST_IMAGE=rust:1.95-bookworm\n"));
    assert!(dockerfile.contains("FROM ${BASE_IMAGE} AS runtime\n"));
    // The prebuilt target sits before the Rust stage: builders that run every stage
    // up to the target never need the Rust image for it.
    let prebuilt = dockerfile.find("AS prebuilt\n").expect("a prebuilt target");
    assert!(prebuilt < dockerfile.find("AS build\n").unwrap());
    assert!(dockerfile.contains("USER delayq"));
    assert!(dockerfile.contains("STOPSIGNAL SIGTERM"));
    let health = dockerfile
        .lines()
        .find(|l| l.trim_start().starts_with("CMD [\"delayq\", \"health\""))
        .expect("a HEALTHCHECK running delayq health");
    assert!(health.contains("--timeout"));
    // The compose file gives the drain more time than the unit does.
    let compose = std::fs::read_to_string(repo().join("docker/compose.yaml")).unwrap();
    assert!(compose.contains("stop_grace_period: 20s"));
}

#[tokio::test]
async fn health_command_answers_for_a_live_daemon_and_fails_for_a_dead_one() {
    let redis = RedisServer::start().unwrap();
    let node = DelayqProcess::start(
        &delayq_bin(),
        "healthy",
        &format!("[redis]\nurl = \"{}\"\nshards = 2\n", redis.url()),
    )
    .unwrap();
    let url = format!("http://{}", node.api);
    let out = delayq(&["health", "--url", &url]);
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).contains("healthy"));
    // The default address comes from DELAYQ_API_LISTEN, a wildcard probed on loopback.
    let out = Command::new(delayq_bin())
        .arg("health")
        .env("DELAYQ_API_LISTEN", format!("0.0.0.0:{}", node.api.port()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    // Health is the last write probe's (one a second): unhealthy within a few.
    drop(redis);
    let out = eventually(Duration::from_secs(10), "unhealthy", || async {
        let out = delayq(&["health", "--url", &url, "--timeout", "5s"]);
        (out.status.code() == Some(1)).then_some(out)
    })
    .await;
    assert!(text(&out.stderr).contains("unhealthy: 503"), "{out:?}");
    assert!(text(&out.stderr).contains("redis unreachable"), "{out:?}");
    drop(node);
    let out = delayq(&["health", "--url", &url]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("unreachable"), "{out:?}");
}

// ---- the failover drill ------------------------------------------------------------

fn drill(args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let out = Command::new(delayq_bin())
        .arg("drill")
        .args(args)
        .arg("--json")
        .env_remove("RUST_LOG")
        .output()
        .expect("run delayq drill");
    let stderr = text(&out.stderr);
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}): {}\n{stderr}", text(&out.stdout)));
    (out.status.code(), report, stderr)
}

fn scenario<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["scenarios"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["scenario"] == name))
        .unwrap_or_else(|| panic!("no {name} row in {report:#}"))
}

#[track_caller]
fn check_scenario(report: &serde_json::Value, name: &str, rounds: u64) {
    let row = scenario(report, name);
    let m = &row["messages"];
    assert_eq!(row["rounds"], rounds, "{name}: {row:#}");
    assert!(
        row["problems"].as_array().is_some_and(Vec::is_empty),
        "{name}: {row:#}"
    );
    assert!(!row["takeover"].is_null(), "{name}: no takeover: {row:#}");
    assert!(m["sent"].as_u64().unwrap() > 0, "{name}: no load: {row:#}");
    assert_eq!(m["lost"], 0, "{name}: {row:#}");
    assert_eq!(m["duplicated"], 0, "{name}: {row:#}");
    assert_eq!(m["delivered"], m["sent"], "{name}: {row:#}");
}

#[test]
fn drill_on_a_local_cluster_loses_nothing_in_any_scenario() {
    let (code, report, stderr) = drill(&[
        "--rounds",
        "2",
        "--rate",
        "40",
        "--steady",
        "1s",
        "--gap",
        "500ms",
        "--hold",
        "3s",
        "--lease-ttl",
        "2s",
    ]);
    assert_eq!(code, Some(0), "{report:#}\n{stderr}");
    assert_eq!(report["ok"], true);
    assert_eq!(report["cluster"], "local");
    for name in ["kill", "term", "pause", "etcd", "switchover"] {
        check_scenario(&report, name, 2);
    }
    // A crashed or frozen leader is replaced only when its lease runs out: a
    // takeover much faster than that would mean the drill measured the wrong thing.
    for name in ["kill", "pause"] {
        let fastest = scenario(&report, name)["takeover"]["min_ms"]
            .as_u64()
            .unwrap();
        assert!(
            fastest >= 500,
            "{name}: takeover in {fastest} ms with a 2s lease"
        );
    }
    // Every crash and stop changed the leader; losing one etcd member of three did not
    // stop forwarding for longer than a lease.
    assert_eq!(scenario(&report, "kill")["leader_changes"], 2);
    assert_eq!(scenario(&report, "switchover")["leader_changes"], 2);
    let etcd_gap = scenario(&report, "etcd")["takeover"]["max_ms"]
        .as_u64()
        .unwrap();
    assert!(etcd_gap < 2000 * u64::from(patience()), "{report:#}");
    let total = &report["total"];
    assert_eq!(total["lost"], 0);
    assert!(total["sent"].as_u64().unwrap() >= 200, "{total}");
}

/// An "existing" cluster for the drill: started here, driven through its APIs
/// and shell commands, as the drill would drive containers or systemd units.
struct Existing {
    redis: RedisServer,
    _etcd: delayq::harness::EtcdServer,
    nodes: Vec<DelayqProcess>,
}

impl Existing {
    fn start() -> Existing {
        let redis = RedisServer::start().unwrap();
        let etcd = delayq::harness::EtcdServer::start().unwrap();
        let config = format!(
            "[redis]\nurl = \"{}\"\nshards = 2\n[etcd]\nendpoints = [\"{}\"]\nlease_ttl = \"2s\"\n",
            redis.url(),
            etcd.endpoint()
        );
        let nodes = (1..=2)
            .map(|i| DelayqProcess::start(&delayq_bin(), &format!("e{i}"), &config).unwrap())
            .collect();
        Existing {
            redis,
            _etcd: etcd,
            nodes,
        }
    }

    /// `--node` arguments naming each node by its pid, so `kill -STOP {node}` works.
    fn node_args(&self) -> Vec<String> {
        self.nodes
            .iter()
            .flat_map(|n| {
                [
                    "--node".to_owned(),
                    format!("{}={}", n.pid().unwrap(), n.url("")),
                ]
            })
            .collect()
    }
}

#[test]
fn drill_drives_an_existing_cluster_through_its_commands() {
    let cluster = Existing::start();
    let mut args: Vec<String> = cluster.node_args();
    args.extend(
        [
            "--redis-url",
            &cluster.redis.url(),
            "--pause-cmd",
            "kill -STOP {node}",
            "--resume-cmd",
            "kill -CONT {node}",
            "--rounds",
            "1",
            "--rate",
            "40",
            "--steady",
            "1s",
            "--gap",
            "500ms",
        ]
        .map(str::to_owned),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, report, stderr) = drill(&args);
    assert_eq!(code, Some(0), "{report:#}\n{stderr}");
    assert_eq!(report["cluster"], "existing");
    // Without kill, start or etcd commands, only what the commands allow ran.
    let names: Vec<&str> = report["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["steady", "pause", "switchover"]);
    check_scenario(&report, "pause", 1);
    check_scenario(&report, "switchover", 1);

    // Asking for a scenario the commands cannot run is refused up front.
    let out = Command::new(delayq_bin())
        .arg("drill")
        .args(&args)
        .args(["--scenarios", "kill"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("scenario kill: needs --kill-cmd and --start-cmd"),
        "{out:?}"
    );
}

#[test]
fn drill_exits_non_zero_when_messages_are_not_seen() {
    // Reading the wrong id field, the drill sees none of its messages arrive:
    // every one counts as lost, and the exit status says so.
    let cluster = Existing::start();
    let mut args: Vec<String> = cluster.node_args();
    args.extend(
        [
            "--redis-url",
            &cluster.redis.url(),
            "--id-field",
            "no-such-field",
            "--scenarios",
            "switchover",
            "--rounds",
            "1",
            "--rate",
            "20",
            "--steady",
            "500ms",
            "--delay",
            "200ms",
            "--takeover-timeout",
            "10s",
        ]
        .map(str::to_owned),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, report, _) = drill(&args);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["ok"], false);
    let total = &report["total"];
    assert!(total["sent"].as_u64().unwrap() > 0);
    assert_eq!(total["lost"], total["sent"], "{total}");
    assert_eq!(total["delivered"], 0);
}

// ---- the quickstart ------------------------------------------------------------------

#[test]
fn demo_shows_a_delayed_message_and_the_standby_taking_over() {
    let out = delayq(&["demo", "--once", "--delay", "1s"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("leader (epoch"), "{stdout}");
    assert!(stdout.contains("standby (leader: primary)"), "{stdout}");
    assert_eq!(stdout.matches("   arrived after").count(), 2, "{stdout}");
    assert!(
        stdout.contains("order=42 event=reminder delayq-id="),
        "{stdout}"
    );
    assert!(
        stdout.contains("order=43 event=reminder delayq-id="),
        "{stdout}"
    );
    assert!(stdout.contains("the standby took over after"), "{stdout}");
    assert!(
        stdout.contains("the primary exited: exit status: 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("stands by: standby (leader: standby)"),
        "{stdout}"
    );
}

#[test]
fn demo_tears_everything_down_on_ctrl_c() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(delayq_bin())
        .args(["demo", "--delay", "200ms"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let done = line.contains("Ctrl-C stops everything");
        seen.push(line);
        if done {
            break;
        }
    }
    let ports: Vec<u16> = seen
        .iter()
        .filter(|l| {
            ["redis-server", "etcd", "primary", "standby"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter_map(|l| l.split("127.0.0.1:").nth(1))
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(ports.len(), 4, "{seen:#?}");
    for port in &ports {
        assert!(std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok());
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    for port in ports {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "port {port} still open after Ctrl-C"
        );
    }
}

// ---- metrics ----------------------------------------------------------------------

/// The README's metrics table, one `(name, labels, type, meaning)` per row.
fn documented_metrics() -> Vec<(String, String, String, String)> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let table = &readme[readme.find("## Metrics").expect("a Metrics section")..];
    let table = &table[..table[3..].find("\n## ").map_or(table.len(), |i| i + 3)];
    table
        .lines()
        .filter(|l| l.starts_with("| `delayq_") || l.starts_with("| `process_"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 3, "a row of three cells: {l}");
            let series = cells[0].trim_matches('`');
            let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
            (
                name.to_owned(),
                labels.trim_end_matches('}').to_owned(),
                cells[1].to_owned(),
                cells[2].to_owned(),
            )
        })
        .collect()
}

/// The README's table as `src/metrics/table.rs` describes it.
fn described_metrics() -> Vec<(String, String, String, String)> {
    delayq::metrics::METRICS
        .iter()
        .map(|m| {
            (
                m.name.to_owned(),
                m.labels.join(","),
                m.kind.as_str().to_owned(),
                m.help.to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_readme_metrics_table_matches_what_delayq_exports() {
    let documented = documented_metrics();
    let described = described_metrics();
    let table: String = described
        .iter()
        .map(|(name, labels, kind, help)| {
            let labels = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{labels}}}")
            };
            format!("| `{name}{labels}` | {kind} | {help} |\n")
        })
        .collect();
    assert!(
        documented == described,
        "the README's metrics table differs from src/metrics/table.rs (METRICS); it should read:\n{table}"
    );

    let redis = RedisServer::start().unwrap();
    let etcd = delayq::harness::EtcdServer::start().unwrap();
    let node = DelayqProcess::start(
        &delayq_bin(),
        "metered",
        &format!(
            "[redis]\nurl = \"{}\"\nshards = 2\n[etcd]\nendpoints = [\"{}\"]\nlease_ttl = \"2s\"\n",
            redis.url(),
            etcd.endpoint()
        ),
    )
    .unwrap();
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(10), "the node leads", || async {
        let r = http.get(node.url("/leader")).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    for body in [
        serde_json::json!({ "id": "m1", "stream": "s", "payload": "x", "delay_ms": 0 }),
        serde_json::json!({ "id": "m1", "stream": "s", "payload": "x", "delay_ms": 0 }),
        serde_json::json!({ "id": "m2", "stream": "s", "payload": "x", "delay": "1h" }),
    ] {
        http.post(node.url("/v1/messages"))
            .json(&body)
            .send()
            .await
            .unwrap();
    }
    http.delete(node.url("/v1/messages/m2"))
        .send()
        .await
        .unwrap();
    let text = eventually(Duration::from_secs(10), "forwarded and counted", || async {
        let text = metrics(&http, node.url("/metrics")).await?;
        (text.contains("delayq_messages_forwarded_total{stream=\"s\"} 1")
            && text.contains("delayq_keepalive_seconds"))
        .then_some(text)
    })
    .await;
    // Two new messages (201) and one duplicate (200).
    assert!(
        text.contains(
            "delayq_http_requests_total{method=\"POST\",route=\"/v1/messages\",status=\"201\"} 2"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "delayq_http_requests_total{method=\"POST\",route=\"/v1/messages\",status=\"200\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("route=\"/v1/messages/{id}\""),
        "ids must not become labels: {text}"
    );
    assert!(text.contains("delayq_build_info{version=\""), "{text}");
    let exported: std::collections::BTreeSet<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    assert!(exported.len() >= 15, "{exported:?}");
    for (name, kind) in exported {
        let row = documented.iter().find(|(d, ..)| d == name);
        assert!(
            row.is_some(),
            "{name} is exported but missing from the README's metrics table"
        );
        assert_eq!(row.unwrap().2, kind, "{name}: type");
    }
}

/// The alert rules load in Prometheus, pass their unit tests
/// (`config/alerts.test.yml`), and name only metrics delayq exports.
#[test]
fn the_alert_rules_are_valid_and_use_exported_metrics() {
    let promtool = tool("promtool");
    for args in [
        ["check", "rules", "config/alerts.yml"],
        ["test", "rules", "config/alerts.test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }

    let rules = std::fs::read_to_string(repo().join("config/alerts.yml")).unwrap();
    let count = |key: &str| {
        rules
            .lines()
            .filter(|l| l.trim_start().starts_with(key))
            .count()
    };
    let alerts = count("- alert: ");
    assert!(alerts >= 8, "{alerts} alerts");
    for key in [
        "expr: ",
        "for: ",
        "severity: ",
        "summary: ",
        "description: ",
    ] {
        assert_eq!(count(key), alerts, "every alert has its {key:?}");
    }
    let exported: Vec<&str> = delayq::metrics::METRICS.iter().map(|m| m.name).collect();
    let mut used = 0;
    for (at, _) in rules.match_indices("delayq_") {
        let name: String = rules[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        assert!(
            exported.contains(&name.as_str()) || exported.contains(&base),
            "config/alerts.yml names {name}, which delayq does not export"
        );
        used += 1;
    }
    assert!(used >= 8, "{used}");
}

#[test]
fn status_follows_leadership_in_an_etcd_pair() {
    let redis = RedisServer::start().unwrap();
    let etcd = delayq::harness::EtcdServer::start().unwrap();
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 2\n[etcd]\nendpoints = [\"{}\"]\nlease_ttl = \"2s\"\n",
        redis.url(),
        etcd.endpoint()
    );
    let (first_socket, second_socket) = (NotifySocket::bind(), NotifySocket::bind());
    let start = |name: &str, socket: &NotifySocket| {
        DelayqProcess::start_with_env(
            &delayq_bin(),
            name,
            &config,
            &[("NOTIFY_SOCKET", socket.path.to_str().unwrap())],
        )
        .unwrap()
    };
    let mut first = start("first", &first_socket);
    // Ready once the election answered; then the status follows the role.
    let mut seen = first_socket.wait_for("READY=1", Duration::from_secs(10));
    if !seen.iter().any(|m| m.contains("STATUS=leader, epoch")) {
        seen = first_socket.wait_for("STATUS=leader, epoch", Duration::from_secs(10));
    }
    assert!(seen.join("|").contains("(etcd)"), "{seen:?}");

    let second = start("second", &second_socket);
    let seen = second_socket.wait_for("READY=1", Duration::from_secs(10));
    let ready = seen.iter().find(|m| m.contains("READY=1")).unwrap();
    assert!(
        ready.contains("STATUS=standby; leader first, epoch"),
        "{seen:?}\n{}",
        second.log()
    );

    // The leader goes; the standby's status says it leads now.
    first.kill();
    second_socket.wait_for("STATUS=leader, epoch", Duration::from_secs(10));
}
