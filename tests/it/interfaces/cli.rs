//! The `delayq` command, the real binary, against an in-process daemon: every client
//! command, its output and its exit code.

use std::process::Output;

use serde_json::Value;

use super::{T, strict};
use crate::support::{Env, delayq_bin};

async fn delayq(env: &Env, args: &[&str], token: Option<&str>) -> Output {
    let mut cmd = tokio::process::Command::new(delayq_bin());
    cmd.args(args)
        .env("DELAYQ_URL", env.url(""))
        .env_remove("DELAYQ_TOKEN");
    if let Some(token) = token {
        cmd.env("DELAYQ_TOKEN", token);
    }
    cmd.output().await.expect("run delayq")
}

/// Runs `delayq args` and checks its exit code and that stdout (or stderr, on
/// failure) contains `says`. Returns stdout.
async fn check(
    env: &Env,
    line: u32,
    args: &[&str],
    token: Option<&str>,
    code: i32,
    says: &str,
) -> String {
    let out = delayq(env, args, token).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "line {line}: delayq {args:?}\nstdout: {stdout}\nstderr: {stderr}"
    );
    let text = if code == 0 { &stdout } else { &stderr };
    assert!(
        text.contains(says),
        "line {line}: delayq {args:?}: {text:?} should contain {says:?}"
    );
    stdout
}

/// One command: source line, arguments, token, exit code, what it prints.
type Step = (
    u32,
    &'static [&'static str],
    Option<&'static str>,
    i32,
    &'static str,
);

async fn run_steps(env: &Env, steps: &[Step]) {
    for &(line, args, token, code, says) in steps {
        check(env, line, args, token, code, says).await;
    }
}

#[tokio::test]
async fn every_client_command_with_its_output_and_exit_code() {
    let mut env = Env::start(&strict("")).await;
    #[rustfmt::skip]
    let steps: &[Step] = &[
        (line!(), &["push", "orders", "hello", "--delay", "1h", "--id", "cli-1"], T, 0, "state: scheduled"),
        (line!(), &["push", "orders", "-f", "a=1", "-f", "b=2", "--delay", "1h", "--id", "cli-1"], T, 0, "duplicate: yes"),
        (line!(), &["push", "orders", "now", "--delay", "0", "--id", "cli-now"], T, 0, "state: scheduled"),
        (line!(), &["get", "cli-1"], T, 0, "state: scheduled"),
        // Times as calendar times with how far off (to the second: "in 1h" at once,
        // "in 59m59s" half a second on), durations as people write them.
        (line!(), &["get", "cli-1"], T, 0, " UTC (in "),
        (line!(), &["reschedule", "cli-1", "--delay", "30m"], T, 0, "deliver_at"),
        (line!(), &["stats"], T, 0, "pending: 1"),
        (line!(), &["stats"], T, 0, "orders: 1"),
        (line!(), &["leader"], T, 0, "is_leader: yes"),
        (line!(), &["leader", "--token", "second-token"], None, 0, "is_leader: yes"),
        (line!(), &["cancel", "cli-1"], T, 0, "state: cancelled"),
        // A second cancel (a retry) answers as the first did.
        (line!(), &["cancel", "cli-1"], T, 0, "already: yes"),
        // Refusals, each with its exit code.
        (line!(), &["push", "orders", "x", "--delay=-5s"], T, 1, "422 invalid_field: delay \"-5s\": must not be negative"),
        (line!(), &["push", "orders", "-f", "novalue", "--delay", "1s"], T, 1, "--field \"novalue\": write it as name=value"),
        (line!(), &["get", "a/b"], T, 1, "400 invalid_id: id \"a/b\""),
        (line!(), &["push", "orders", "--delay", "1s", "--bogus"], T, 2, "--bogus"),
        // As over HTTP, a push names its due time.
        (line!(), &["push", "orders", "x"], T, 2, "--delay <DELAY>"),
        (line!(), &["get", "never-pushed"], T, 3, "404 not_found: message never-pushed: unknown"),
        (line!(), &["reschedule", "cli-1", "--delay", "1m"], T, 4, "409 already_final: message cli-1: already cancelled"),
        (line!(), &["push", "billing", "x", "--delay", "1s"], T, 5, "403 stream_not_allowed"),
        // Not possible here (no etcd: nobody to hand over to), which is not "already delivered".
        (line!(), &["resign"], T, 8, "409 standalone"),
        (line!(), &["push", "orders", "x", "--delay", "1d1h"], T, 1, "delay 1d1h: longer than api.max_delay 1h"),
        (line!(), &["stats"], None, 5, "401 missing_token"),
        (line!(), &["stats"], Some("wrong"), 5, "401 invalid_token"),
    ];
    run_steps(&env, steps).await;

    let out = check(&env, line!(), &["get", "cli-1", "--json"], T, 0, "").await;
    let got: Value = serde_json::from_str(out.trim()).expect("--json prints JSON");
    assert_eq!(got["state"].as_str(), Some("cancelled"));
    let human = check(&env, line!(), &["get", "cli-1"], T, 0, "state: cancelled").await;
    assert!(
        !human.contains("null") && !human.contains('{'),
        "no JSON in {human:?}"
    );

    // A payload from stdin loses the newline echo adds, as $(…) would.
    let mut push = tokio::process::Command::new(delayq_bin());
    push.args(["push", "orders", "-", "--delay", "1h", "--id", "cli-stdin"])
        .env("DELAYQ_URL", env.url(""))
        .env("DELAYQ_TOKEN", T.expect("a token"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    let mut child = push.spawn().expect("run delayq push");
    let mut stdin = child.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"line one\nline two\n")
        .await
        .unwrap();
    drop(stdin);
    assert!(child.wait().await.unwrap().success());
    let out = check(&env, line!(), &["get", "cli-stdin", "--json"], T, 0, "").await;
    let got: Value = serde_json::from_str(out.trim()).expect("--json prints JSON");
    assert_eq!(
        got["fields"],
        serde_json::json!([["payload", "line one\nline two"]])
    );
    let unreachable = format!("http://127.0.0.1:{}", delayq_harness::free_port());
    check(
        &env,
        line!(),
        &["stats", "--url", &unreachable],
        T,
        7,
        "cannot reach",
    )
    .await;

    // The message pushed for now was delivered: too late to cancel.
    crate::support::eventually(
        std::time::Duration::from_secs(10),
        "cli-now delivered",
        || async {
            let out = delayq(&env, &["get", "cli-now", "--json"], T).await;
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            (v["state"] == "delivered").then_some(())
        },
    )
    .await;
    check(
        &env,
        line!(),
        &["cancel", "cli-now"],
        T,
        4,
        "409 already_final",
    )
    .await;
    env.redis.kill();
    check(
        &env,
        line!(),
        &["push", "orders", "x", "--delay", "1s"],
        T,
        6,
        "503",
    )
    .await;
    env.stop().await;
}

#[tokio::test]
async fn help_shows_examples_and_exit_codes() {
    for command in ["push", "get", "cancel", "reschedule", "stats", "leader"] {
        let out = std::process::Command::new(delayq_bin())
            .args([command, "--help"])
            .output()
            .expect("run");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{command} --help");
        for part in [
            "Examples:",
            "Exit codes:",
            "4  conflict",
            "--token",
            "DELAYQ_TOKEN",
        ] {
            assert!(
                text.contains(part),
                "delayq {command} --help should show {part:?}:\n{text}"
            );
        }
    }
}

#[tokio::test]
async fn the_api_refuses_a_public_address_without_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delayq.toml");
    std::fs::write(&path, "[api]\nlisten = \"0.0.0.0:0\"\n").unwrap();
    let out = std::process::Command::new(delayq_bin())
        .arg("run")
        .arg("--config")
        .arg(&path)
        .env_remove("DELAYQ_API_TOKENS")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("api.listen: 0.0.0.0:0 is not loopback and api.tokens is empty"),
        "{stderr}"
    );
}
