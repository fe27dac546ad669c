//! Secrets never show: a real daemon whose Redis needs a password, run with the
//! password in its URL or in a credentials file, and tokens from a file. Its whole
//! log (debug, through a Redis outage), `check-config`, its answers and its metrics
//! are searched for the password and the token.

use std::process::Command;
use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};

use crate::support::{Api, delayq_bin, eventually};

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
    let api = Api::new(node.api);
    // Every answer's status and text, whatever its status.
    let answer = |method: &'static str,
                  path: &'static str,
                  token: Option<&'static str>,
                  body: Option<&'static str>| {
        let api = &api;
        async move {
            let resp = api
                .send(method, path, token, body.map(str::as_bytes))
                .await?;
            Ok::<_, reqwest::Error>((resp.status().as_u16(), resp.text().await?))
        }
    };
    let mut seen = String::new();

    // Works with the secrets it was given.
    let body = r#"{"stream": "s", "delay": "1ms", "fields": {"a": "1"}}"#;
    let (status, text) = answer("POST", "/v1/messages", Some(TOKEN), Some(body))
        .await
        .expect("an answer");
    assert_eq!(status, 201, "{}: push with the file's token", case.name);
    seen += &text;
    let (status, text) = answer("GET", "/v1/stats", None, None)
        .await
        .expect("an answer");
    assert_eq!(status, 401, "{}: no token", case.name);
    seen += &text;
    for path in ["/v1/stats", "/v1/leader", "/metrics", "/healthz", "/readyz"] {
        seen += &answer("GET", path, Some(TOKEN), None)
            .await
            .expect("an answer")
            .1;
    }

    // Through a Redis outage: errors are logged at every level.
    redis.kill();
    eventually(Duration::from_secs(10), "errors logged", || async {
        let log = node.full_log();
        (log.contains("WARN") || log.contains("\"level\":\"WARN\"")).then_some(())
    })
    .await;
    for path in ["/v1/stats", "/healthz", "/readyz"] {
        if let Ok((_, text)) = answer("GET", path, Some(TOKEN), None).await {
            seen += &text;
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
