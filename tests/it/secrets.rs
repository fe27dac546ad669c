//! Secrets never show: a real daemon whose Redis needs a password, run with the
//! password in its URL or in a credentials file, and tokens from a file. Its whole
//! log (debug, through a Redis outage), `check-config`, its answers and its metrics
//! are searched for the password and the token.

use std::process::Command;
use std::time::Duration;

use delayq::harness::{DelayqProcess, RedisServer};

use crate::support::{delayq_bin, eventually};

const PASSWORD: &str = "hunter2-Kx9";
const TOKEN: &str = "tok-Zq7-secret";

/// How the daemon is given its secrets.
struct Case {
    name: &'static str,
    /// The `[redis]` url; `{port}` is filled in, `{password}` too.
    url: &'static str,
    password_file: bool,
    log_format: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "in-url-text",
        url: "redis://:{password}@127.0.0.1:{port}",
        password_file: false,
        log_format: "text",
    },
    Case {
        name: "in-url-json",
        url: "redis://default:{password}@127.0.0.1:{port}/0",
        password_file: false,
        log_format: "json",
    },
    Case {
        name: "credentials-file",
        url: "redis://127.0.0.1:{port}",
        password_file: true,
        log_format: "text",
    },
];

#[tokio::test]
async fn passwords_and_tokens_never_reach_logs_answers_or_metrics() {
    for case in CASES {
        check(case).await;
    }
}

async fn check(case: &Case) {
    let mut redis = RedisServer::start().unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(PASSWORD)
        .query(&mut redis.client())
        .unwrap();
    // The credentials directory systemd's LoadCredential= would fill.
    let credentials = tempfile::tempdir().unwrap();
    std::fs::write(
        credentials.path().join("redis-password"),
        format!("{PASSWORD}\n"),
    )
    .unwrap();
    std::fs::write(credentials.path().join("tokens"), format!("{TOKEN}\n")).unwrap();
    let url = case
        .url
        .replace("{port}", &redis.port.to_string())
        .replace("{password}", PASSWORD);
    let password_file = if case.password_file {
        "password_file = \"redis-password\"\n"
    } else {
        ""
    };
    let config = format!(
        "[redis]\nurl = \"{url}\"\n{password_file}shards = 2\ntimeout = \"200ms\"\n\
         [api]\ntokens_file = \"tokens\"\n[log]\nlevel = \"debug\"\nformat = \"{}\"\n",
        case.log_format
    );
    let env = [(
        "CREDENTIALS_DIRECTORY",
        credentials.path().to_str().unwrap(),
    )];
    let node = DelayqProcess::start_with_env(&delayq_bin(), case.name, &config, &env).unwrap();
    let http = reqwest::Client::new();
    let mut seen = String::new();

    // Works with the secrets it was given.
    let pushed = http
        .post(node.url("/v1/messages"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"stream": "s", "delay": "1ms", "fields": {"a": "1"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        pushed.status(),
        201,
        "{}: push with the file's token",
        case.name
    );
    seen += &pushed.text().await.unwrap();
    let refused = http.get(node.url("/v1/stats")).send().await.unwrap();
    assert_eq!(refused.status(), 401, "{}: no token", case.name);
    seen += &refused.text().await.unwrap();
    for path in ["/v1/stats", "/v1/leader", "/metrics", "/healthz", "/readyz"] {
        let answer = http
            .get(node.url(path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        seen += &answer.text().await.unwrap();
    }

    // Through a Redis outage: errors are logged at every level.
    redis.kill();
    eventually(Duration::from_secs(10), "errors logged", || async {
        let log = node.full_log();
        (log.contains("WARN") || log.contains("\"level\":\"WARN\"")).then_some(())
    })
    .await;
    for path in ["/v1/stats", "/healthz", "/readyz"] {
        if let Ok(answer) = http.get(node.url(path)).bearer_auth(TOKEN).send().await {
            seen += &answer.text().await.unwrap_or_default();
        }
    }

    // check-config shows the effective configuration; a bad one, or a URL without a
    // host, its error. Each with the config file rewritten, through the real binary.
    let config_path = node.config_path();
    for (command, text, want) in [
        ("check-config", config.clone(), Some(0)),
        (
            "check-config",
            config.replace("shards = 2", "shards = 0"),
            Some(64),
        ),
        ("run", config.replace("127.0.0.1", ""), Some(64)),
    ] {
        std::fs::write(&config_path, &text).unwrap();
        let out = Command::new(delayq_bin())
            .args([command, "--config", config_path.to_str().unwrap()])
            .envs(env)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), want, "{}: {command} {text}", case.name);
        seen += &String::from_utf8_lossy(&out.stdout);
        seen += &String::from_utf8_lossy(&out.stderr);
    }

    seen += &node.full_log();
    assert!(
        seen.contains("redis"),
        "{}: something was captured",
        case.name
    );
    for secret in [PASSWORD, TOKEN] {
        assert!(
            !seen.contains(secret),
            "{}: {secret:?} leaked:\n{}",
            case.name,
            seen.lines()
                .filter(|l| l.contains(secret))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
