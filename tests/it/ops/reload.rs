//! A SIGHUP reaches every component that reads a reloadable key: the allow list
//! reaches the HTTP API and the inbox reader, MAXLEN (default and per stream) and
//! the rate limits (over all streams and per stream) reach the forward loops.
//! (`log.level` and `[delivery]` are covered in
//! ops/config.rs and sweep/processes.rs.) Each case starts a real process with one configuration,
//! rewrites the file, sends SIGHUP and checks every component that uses the key.

use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};
use futures::future::BoxFuture;

use crate::support::{Api, delayq_bin, entries, eventually, xadd};

/// What every component that reads a key does, after the reload.
type Probe = for<'a> fn(&'a Node) -> BoxFuture<'a, ()>;

struct Node {
    redis: RedisServer,
    process: DelayqProcess,
    api: Api,
}

#[track_caller]
fn check(
    before: &'static str,
    after: &'static str,
    probes: &'static [Probe],
) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let redis = RedisServer::start().unwrap();
        let base = format!("[redis]\nurl = \"{}\"\nshards = 2\n", redis.url());
        let process =
            DelayqProcess::start(&delayq_bin(), "reloaded", &format!("{base}{before}")).unwrap();
        let node = Node {
            redis,
            api: Api::new(process.api),
            process,
        };
        let file = std::fs::read_to_string(node.process.config_path()).unwrap();
        std::fs::write(node.process.config_path(), file.replace(before, after)).unwrap();
        node.process.signal(libc::SIGHUP);
        eventually(Duration::from_secs(10), "the reload applied", || async {
            node.process
                .full_log()
                .contains("configuration reloaded")
                .then_some(())
        })
        .await;
        for probe in probes {
            probe(&node).await;
        }
    })
}

/// Pushes one message to `stream`; the answer's status.
async fn push(node: &Node, stream: &str) -> u16 {
    let body = serde_json::json!({"stream": stream, "payload": "p", "delay": "1ms"});
    node.api.post("/v1/messages", body).await.0
}

/// Pushes `count` messages to `stream` in one batch; how many were scheduled.
async fn push_many(node: &Node, stream: &str, count: usize) -> u64 {
    let messages: Vec<_> = (0..count)
        .map(|i| serde_json::json!({"stream": stream, "payload": i.to_string(), "delay": "1ms"}))
        .collect();
    let (_, answer) = node
        .api
        .post(
            "/v1/messages/batch",
            serde_json::json!({ "messages": messages }),
        )
        .await;
    answer["scheduled"].as_u64().unwrap_or_default()
}

fn http_allows_billing(node: &Node) -> BoxFuture<'_, ()> {
    Box::pin(async move {
        assert_eq!(
            push(node, "billing").await,
            201,
            "the API takes the new list"
        );
        assert_eq!(push(node, "payroll").await, 403);
    })
}

fn inbox_allows_billing(node: &Node) -> BoxFuture<'_, ()> {
    Box::pin(async move {
        let mut conn = node.redis.client();
        for stream in ["billing", "payroll"] {
            xadd(
                &mut conn,
                "delayq:inbox",
                &[
                    ("delayq-stream", stream),
                    ("delayq-delay", "1ms"),
                    ("via", "inbox"),
                ],
            );
        }
        eventually(
            Duration::from_secs(10),
            "billing delivered from the inbox",
            || async {
                let mut conn = node.redis.client();
                let delivered = entries(&mut conn, "billing")
                    .iter()
                    .any(|e| e.get("via") == Some("inbox"));
                let rejected = entries(&mut conn, "delayq:inbox:rejected");
                (delivered && rejected.len() == 1).then_some(rejected)
            },
        )
        .await
        .iter()
        .for_each(|r| {
            assert!(
                r.get("delayq-reason")
                    .is_some_and(|w| w.contains("payroll"))
            )
        });
    })
}

/// Pushes 300 messages to `stream` and waits until they are all forwarded; MAXLEN ~
/// trims whole nodes of entries, so the stream ends well below 300.
async fn trimmed(node: &Node, stream: &str) {
    assert_eq!(push_many(node, stream, 300).await, 300);
    let len = eventually(Duration::from_secs(10), "all forwarded", || async {
        let (_, stats) = node.api.try_get("/v1/stats").await?;
        (stats["pending"]["total"] == 0).then_some(())?;
        let len: u64 = redis::cmd("XLEN")
            .arg(stream)
            .query(&mut node.redis.client())
            .ok()?;
        Some(len)
    })
    .await;
    assert!(
        len < 300,
        "{stream}: MAXLEN applied after the reload: {len} entries"
    );
}

fn forward_trims_by_default(node: &Node) -> BoxFuture<'_, ()> {
    Box::pin(trimmed(node, "any"))
}

fn forward_trims_one_stream(node: &Node) -> BoxFuture<'_, ()> {
    Box::pin(trimmed(node, "special"))
}

/// 300 messages to "rated", all forwarded within 10 s: under the limit of one a
/// second the configuration started with, that would take five minutes.
fn forward_unlimited(node: &Node) -> BoxFuture<'_, ()> {
    Box::pin(async move {
        assert_eq!(push_many(node, "rated", 300).await, 300);
        eventually(Duration::from_secs(10), "all 300 forwarded", || async {
            let len: u64 = redis::cmd("XLEN")
                .arg("rated")
                .query(&mut node.redis.client())
                .ok()?;
            (len == 300).then_some(())
        })
        .await;
    })
}

#[tokio::test]
async fn allow_list_reaches_the_api_and_the_inbox() {
    check(
        "[streams]\nallow = [\"orders\"]\n",
        "[streams]\nallow = [\"orders\", \"billing\"]\n",
        &[http_allows_billing, inbox_allows_billing],
    )
    .await;
}

#[tokio::test]
async fn default_maxlen_reaches_the_forward_loops() {
    check(
        "[streams]\ndefault_maxlen = 0\n",
        "[streams]\ndefault_maxlen = 10\n",
        &[forward_trims_by_default],
    )
    .await;
}

#[tokio::test]
async fn a_stream_maxlen_reaches_the_forward_loops() {
    check(
        "[streams.maxlen]\nother = 5\n",
        "[streams.maxlen]\nspecial = 10\n",
        &[forward_trims_one_stream],
    )
    .await;
}

#[tokio::test]
async fn the_rate_limit_reaches_the_forward_loops() {
    check(
        "[forwarder]\nmax_rate = 1\n",
        "[forwarder]\nmax_rate = 0\n",
        &[forward_unlimited],
    )
    .await;
}

#[tokio::test]
async fn a_stream_rate_limit_reaches_the_forward_loops() {
    check(
        "[streams.max_rate]\nrated = 1\n",
        "[streams.max_rate]\nother = 1\n",
        &[forward_unlimited],
    )
    .await;
}

/// Whether process `pid` catches SIGHUP now (`SigCgt` in /proc/<pid>/status).
fn catches_sighup(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGHUP - 1)) != 0)
}

/// SIGHUPs from the moment `delayq run` catches it (its first step; before that a
/// signal has its default action, as in any program) and every millisecond of its
/// start after (a service manager's reload right after the start): the process
/// goes on, and reloads once it listens for them.
#[tokio::test]
async fn sighups_while_the_daemon_starts_reload_instead_of_ending_the_process() {
    let redis = RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = delayq_harness::free_port();
    let config = dir.path().join("delayq.toml");
    std::fs::write(
        &config,
        format!(
            "[redis]\nurl = \"{}\"\nshards = 2\n[api]\nlisten = \"127.0.0.1:{port}\"\n",
            redis.url()
        ),
    )
    .unwrap();
    let log = dir.path().join("delayq.log");
    let mut child = std::process::Command::new(delayq_bin())
        .arg("run")
        .arg("--config")
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    while !catches_sighup(pid) && child.try_wait().unwrap().is_none() {
        std::hint::spin_loop();
    }
    let mut sent = 0;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        && child.try_wait().unwrap().is_none()
    {
        unsafe { libc::kill(pid as i32, libc::SIGHUP) };
        sent += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    let reloaded = eventually(Duration::from_secs(10), "a reload once listening", || {
        let exited = child.try_wait().unwrap();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        std::future::ready(match exited {
            Some(status) => Some(Err(format!("exited: {status:?}\n{text}"))),
            None => text.contains("configuration reloaded").then_some(Ok(())),
        })
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(sent > 0, "no SIGHUP was sent before the API listened");
    assert_eq!(reloaded, Ok(()), "after {sent} SIGHUPs during the start");
}

/// A reloadable key that a `DELAYQ_*` variable sets keeps the variable's value: a
/// reload says so, over HTTP and in the log, instead of ignoring the file silently.
#[tokio::test]
async fn a_reload_names_the_keys_the_environment_sets() {
    let redis = RedisServer::start().unwrap();
    let config = format!("[redis]\nurl = \"{}\"\nshards = 2\n", redis.url());
    let process = DelayqProcess::start_with_env(
        &delayq_bin(),
        "env-set",
        &config,
        &[
            ("DELAYQ_FORWARDER_MAX_RATE", "5"),
            ("DELAYQ_REDIS_SHARDS", "2"),
        ],
    )
    .unwrap();
    let file = std::fs::read_to_string(process.config_path()).unwrap();
    std::fs::write(
        process.config_path(),
        format!("{file}\n[forwarder]\nmax_rate = 9\n"),
    )
    .unwrap();
    let (status, body) = Api::new(process.api)
        .post("/v1/admin/reload", serde_json::json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    // redis.shards is set by a variable too, but it never reloads: not named.
    assert_eq!(
        body["from_environment"],
        serde_json::json!(["forwarder.max_rate (DELAYQ_FORWARDER_MAX_RATE)"]),
        "{body}"
    );
    assert_eq!(body["changed"], serde_json::json!([]), "{body}");
    eventually(Duration::from_secs(5), "the warning", || {
        let log = process.log();
        std::future::ready(
            (log.contains("comes from the environment")
                && log.contains("DELAYQ_FORWARDER_MAX_RATE"))
            .then_some(()),
        )
    })
    .await;
}
