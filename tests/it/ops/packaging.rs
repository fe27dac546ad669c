//! What delayq ships to run it: the systemd unit and sysusers file (verified by
//! systemd's own tools), the compose files and the Dockerfile, and the health
//! command their health checks run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};

use super::{delayq, tool};
use crate::support::{delayq_bin, eventually, repo, text};

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
