//! Health that tells the truth: a Redis that answers but refuses writes (turned
//! into a replica with REPLICAOF, full at maxmemory, or after a failed background
//! save with MISCONF) makes `/healthz` and
//! `/readyz` fail with the reason, `delayq_redis_writable` drop to 0 and a WARN line
//! name the Redis error; all recover by themselves once Redis takes writes again.
//! An `allkeys-*` eviction policy is a warning of `/readyz`'s and
//! `delayq_redis_evicting`, gone once Redis keeps delayq's keys.
//! Real Redis servers and a real daemon process.

use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};

use crate::support::{
    Api, delayq_bin, delayq_with_config, documented_user, entries, eventually, text,
};

/// How Redis is made to refuse writes, and the error it then answers with.
struct Refusal {
    break_it: fn(&RedisServer, &RedisServer),
    mend_it: fn(&RedisServer, &RedisServer),
    error: &'static str,
}

fn replica_of_other(redis: &RedisServer, other: &RedisServer) {
    run(redis, &["REPLICAOF", "127.0.0.1", &other.port.to_string()]);
}
fn primary_again(redis: &RedisServer, _: &RedisServer) {
    run(redis, &["REPLICAOF", "NO", "ONE"]);
}
fn full(redis: &RedisServer, _: &RedisServer) {
    run(redis, &["CONFIG", "SET", "maxmemory", "1"]);
}
fn unbounded(redis: &RedisServer, _: &RedisServer) {
    run(redis, &["CONFIG", "SET", "maxmemory", "0"]);
}

/// Where a Redis's saves go while they fail: a directory removed under it.
fn gone_dir(redis: &RedisServer) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("delayq-misconf-{}", redis.port))
}
/// A background save that fails (its directory is gone) while saving is
/// configured: Redis then refuses writes with MISCONF.
fn save_failed(redis: &RedisServer, _: &RedisServer) {
    let dir = gone_dir(redis);
    std::fs::create_dir_all(&dir).unwrap();
    run(redis, &["CONFIG", "SET", "dir", dir.to_str().unwrap()]);
    run(redis, &["CONFIG", "SET", "save", "3600 1"]);
    std::fs::remove_dir(&dir).unwrap();
    bgsave_until(redis, "err");
}
/// A save that succeeds, in a directory that exists again.
fn saved(redis: &RedisServer, _: &RedisServer) {
    let dir = gone_dir(redis);
    std::fs::create_dir_all(&dir).unwrap();
    run(redis, &["CONFIG", "SET", "dir", dir.to_str().unwrap()]);
    bgsave_until(redis, "ok");
    run(redis, &["CONFIG", "SET", "save", ""]);
    std::fs::remove_dir_all(&dir).unwrap();
}
/// Starts a background save and waits for it to end with `status`.
fn bgsave_until(redis: &RedisServer, status: &str) {
    let mut conn = redis.client();
    let _: redis::Value = redis::cmd("BGSAVE").query(&mut conn).unwrap();
    let want = format!("rdb_last_bgsave_status:{status}");
    for _ in 0..500 {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut conn)
            .unwrap();
        if info.contains("rdb_bgsave_in_progress:0") && info.contains(&want) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no background save ended with {status}");
}

const REFUSALS: &[Refusal] = &[
    Refusal {
        break_it: replica_of_other,
        mend_it: primary_again,
        error: "READONLY",
    },
    Refusal {
        break_it: full,
        mend_it: unbounded,
        error: "OOM",
    },
    Refusal {
        break_it: save_failed,
        mend_it: saved,
        error: "MISCONF",
    },
];

#[tokio::test]
async fn a_redis_that_refuses_writes_fails_health_with_the_reason_and_recovers() {
    for refusal in REFUSALS {
        check(refusal).await;
    }
}

async fn push(api: &Api, id: &str) -> u16 {
    let body = serde_json::json!({"stream": "h", "id": id, "payload": "p", "delay": "10ms"});
    api.post("/v1/messages", body).await.0
}

fn run(redis: &RedisServer, words: &[&str]) {
    let () = redis::cmd(words[0])
        .arg(&words[1..])
        .query(&mut redis.client())
        .unwrap();
}

/// A daemon on `redis`, and its API.
fn node_on(redis: &RedisServer, name: &str) -> (DelayqProcess, Api) {
    let config = format!("[redis]\nurl = \"{}\"\nshards = 2\n", redis.url());
    let node = DelayqProcess::start(&delayq_bin(), name, &config).unwrap();
    let api = Api::new(node.api);
    (node, api)
}

async fn check(refusal: &Refusal) {
    let redis = RedisServer::start().unwrap();
    let other = RedisServer::start().unwrap();
    let (node, api) = node_on(&redis, "probed");
    let metric = |text: Option<String>| {
        text.and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("delayq_redis_writable "))
                .map(str::to_owned)
        })
    };
    for path in ["/healthz", "/readyz"] {
        eventually(Duration::from_secs(10), "healthy at start", || async {
            (api.get(path).await.0 == 200).then_some(())
        })
        .await;
    }
    assert_eq!(push(&api, "before").await, 201);

    (refusal.break_it)(&redis, &other);
    for path in ["/healthz", "/readyz"] {
        let detail = eventually(Duration::from_secs(10), "health fails", || async {
            let (status, body) = api.get(path).await;
            (status == 503).then(|| body["detail"].as_str().unwrap_or_default().to_owned())
        })
        .await;
        assert!(
            detail.contains("redis refuses writes") && detail.contains(refusal.error),
            "{path}: {detail}"
        );
    }
    let gauge = metric(api.metrics().await);
    assert_eq!(gauge.as_deref(), Some("delayq_redis_writable 0"));
    assert_eq!(push(&api, "refused").await, 503, "a push cannot be stored");
    let log = node.full_log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(refusal.error)),
        "a WARN line names the error:\n{log}"
    );

    (refusal.mend_it)(&redis, &other);
    for path in ["/healthz", "/readyz"] {
        eventually(Duration::from_secs(10), "healthy again", || async {
            (api.get(path).await.0 == 200).then_some(())
        })
        .await;
    }
    let gauge = metric(api.metrics().await);
    assert_eq!(gauge.as_deref(), Some("delayq_redis_writable 1"));
    assert!(node.full_log().contains("redis takes writes again"));
    // And it does its job again: a new message is delivered, once.
    assert_eq!(push(&api, "after").await, 201);
    eventually(
        Duration::from_secs(10),
        "delivered after recovery",
        || async {
            let got = entries(&mut redis.client(), "h");
            let after = got
                .iter()
                .filter(|e| e.get("delayq-id") == Some("after"))
                .count();
            (after == 1).then_some(())
        },
    )
    .await;
}

/// Redis's memory settings, in turn, and whether they can evict delayq's keys
/// (whose data keys carry no expiry, so only `allkeys-*` policies under a limit do).
const EVICTIONS: &[(&str, &str, bool)] = &[
    ("1gb", "allkeys-lru", true),
    ("1gb", "volatile-lru", false),
    ("1gb", "allkeys-random", true),
    ("0", "allkeys-lfu", false),
    ("1gb", "noeviction", false),
];

#[tokio::test]
async fn an_eviction_policy_that_can_drop_messages_is_warned_of_and_cleared() {
    let redis = RedisServer::start().unwrap();
    run(&redis, &["CONFIG", "SET", "maxmemory", "1gb"]);
    run(
        &redis,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    );
    let (node, api) = node_on(&redis, "evicting");
    for &(maxmemory, policy, evicting) in EVICTIONS {
        run(&redis, &["CONFIG", "SET", "maxmemory", maxmemory]);
        run(&redis, &["CONFIG", "SET", "maxmemory-policy", policy]);
        let warnings = warnings_when(
            &api,
            "delayq_redis_evicting",
            evicting,
            "warnings follow Redis",
        )
        .await;
        if evicting {
            let bytes = 1u64 << 30;
            assert_eq!(
                warnings,
                [format!(
                    "redis may evict delayq's keys (maxmemory-policy {policy} with maxmemory {bytes})"
                )],
                "{policy}"
            );
        }
        assert_eq!(push(&api, policy).await, 201, "pushes go on: {policy}");
    }
    let log = node.full_log();
    let warned = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("redis may evict delayq's keys"))
        .count();
    let cleared = log
        .lines()
        .filter(|l| l.contains("redis no longer evicts delayq's keys"))
        .count();
    // One line per change: the start, and each switch after it.
    assert_eq!((warned, cleared), (2, 2), "{log}");
}

/// A daemon on `redis` as the user `delayq` whose password is in `password`,
/// with `h` its only target stream.
fn node_as_user(
    redis: &RedisServer,
    password: &std::path::Path,
    name: &str,
) -> (DelayqProcess, Api) {
    let node = DelayqProcess::start(&delayq_bin(), name, &user_config(redis, password)).unwrap();
    let api = Api::new(node.api);
    (node, api)
}

fn user_config(redis: &RedisServer, password: &std::path::Path) -> String {
    let url = redis.url().replace("redis://", "redis://delayq@");
    format!(
        "[redis]\nurl = \"{url}\"\npassword_file = \"{}\"\nshards = 2\n[streams]\nallow = [\"h\"]\n",
        password.display()
    )
}

/// `delayq check-config --connect` on the user's configuration: whether it
/// passed, and what it printed.
async fn check_connect(redis: &RedisServer, password: &std::path::Path) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delayq.toml");
    std::fs::write(&path, user_config(redis, password)).unwrap();
    let out = delayq_with_config(&["check-config", "--quiet", "--connect"], &path).await;
    (out.status.success(), text(&out.stderr))
}

/// The documented rule, as written, on one Redis: ready, and a push delivered.
/// Without its `~{delayq:*` (what the docs once said for one Redis) the shard
/// keys are out of reach: `/readyz` answers 503 naming a command and such a
/// key, and a push 503 `redis_permission`, not 500.
#[tokio::test]
async fn the_documented_redis_rights_suffice_and_a_missing_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start().unwrap();
    let password = documented_user(&[&redis], "h", &[], dir.path());
    let (_node, api) = node_as_user(&redis, &password, "rights");
    eventually(Duration::from_secs(10), "ready with the rule", || async {
        (api.get("/readyz").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(push(&api, "ruled").await, 201);
    eventually(Duration::from_secs(10), "delivered as the user", || async {
        let got = entries(&mut redis.client(), "h");
        got.iter()
            .any(|e| e.get("delayq-id") == Some("ruled"))
            .then_some(())
    })
    .await;

    let (passed, said) = check_connect(&redis, &password).await;
    assert!(passed, "{said}");

    let other = RedisServer::start().unwrap();
    let password = documented_user(&[&other], "h", &["~{delayq:*"], dir.path());
    let (passed, said) = check_connect(&other, &password).await;
    assert!(
        !passed && said.contains("may not run") && said.contains("{delayq:0}:due"),
        "{said}"
    );
    let (node, api) = node_as_user(&other, &password, "no-rights");
    let (status, body) = api.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "redis_permission", "{body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("{delayq:0}:due"), "{detail}");
    let body = serde_json::json!({"stream": "h", "id": "denied", "payload": "p", "delay": "10ms"});
    let (status, answer) = api.post("/v1/messages", body).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (503, Some("redis_permission")),
        "{answer}"
    );
    let log = node.full_log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("may not run") && l.contains("{delayq:0}")),
        "a WARN line names the missing right:\n{log}"
    );
}

/// The `INFO memory` field `field` of `redis`, as a number.
fn memory_field(redis: &RedisServer, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut redis.client())
        .unwrap();
    delayq_client::store::info_value(&info, field)
        .unwrap()
        .parse()
        .unwrap()
}

/// `/readyz`'s warnings once it answers 200 with some (`warned`) or none, and
/// `/metrics` shows `gauge` at 1 or 0 alike.
async fn warnings_when(api: &Api, gauge: &str, warned: bool, what: &str) -> Vec<String> {
    let gauge = format!("{gauge} {}", u8::from(warned));
    eventually(Duration::from_secs(15), what, || async {
        let (status, body) = api.get("/readyz").await;
        let shown = api.metrics().await.unwrap_or_default();
        let warnings: Vec<String> = body["warnings"]
            .as_array()?
            .iter()
            .map(|w| w.as_str().unwrap_or_default().to_owned())
            .collect();
        let settled =
            status == 200 && warnings.is_empty() != warned && shown.lines().any(|l| l == gauge);
        settled.then_some(warnings)
    })
    .await
}

async fn memory_warnings(api: &Api, full: bool, what: &str) -> Vec<String> {
    warnings_when(api, "delayq_redis_nearly_full", full, what).await
}

/// Past 95% of `maxmemory` Redis is called nearly full (`/readyz` stays 200 and
/// warns, the gauge is 1); a batch Redis refuses for want of memory while a small
/// probe write still passes is warned of too, for 10 s.
#[tokio::test]
async fn a_nearly_full_redis_and_a_refused_batch_are_warned_of() {
    let redis = RedisServer::start().unwrap();
    let (_node, api) = node_on(&redis, "memory");
    memory_warnings(&api, false, "no warning at start").await;
    // A filler, so that the margins below (hundreds of KB) dwarf what delayq's
    // own background writes add meanwhile.
    let filler = "f".repeat(16 << 20);
    run(&redis, &["SET", "test-filler", &filler]);

    let used = memory_field(&redis, "used_memory");
    run(
        &redis,
        &["CONFIG", "SET", "maxmemory", &(used * 100 / 97).to_string()],
    );
    let warnings = memory_warnings(&api, true, "nearly full").await;
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("redis is nearly full (used ")),
        "{warnings:?}"
    );
    run(&redis, &["CONFIG", "SET", "maxmemory", "0"]);
    memory_warnings(&api, false, "room again").await;

    // Room for a probe, not for one message of the batch (Redis counts the
    // arguments of a call it reads against maxmemory).
    let used = memory_field(&redis, "used_memory");
    run(
        &redis,
        &[
            "CONFIG",
            "SET",
            "maxmemory",
            &(used + 512 * 1024).to_string(),
        ],
    );
    let payload = "x".repeat(900 * 1024);
    let messages: Vec<_> = (0..8)
        .map(|i| serde_json::json!({"stream": "h", "id": format!("big-{i}"), "payload": payload, "delay": "1h"}))
        .collect();
    let (status, answer) = api
        .post(
            "/v1/messages/batch",
            serde_json::json!({ "messages": messages }),
        )
        .await;
    let refused = answer.to_string();
    assert!(
        status == 503 || refused.contains("OOM"),
        "the batch is refused for want of memory: {status} {refused:.400}"
    );
    let warnings = memory_warnings(&api, true, "a refusal for want of memory").await;
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("refused a write for want of memory (OOM)")),
        "{warnings:?}"
    );
    // A probe write made while Redis still held the refused batch's arguments
    // (a query buffer it frees within a second or so) may have been refused too;
    // the next ones pass.
    eventually(
        Duration::from_secs(10),
        "a small write still passes",
        || async { (api.get("/readyz").await.0 == 200).then_some(()) },
    )
    .await;
    run(&redis, &["CONFIG", "SET", "maxmemory", "0"]);
    memory_warnings(&api, false, "the refusal forgotten after 10 s").await;
}

/// A node started while its Redis does not answer waits for it (up to 30 s)
/// instead of exiting, says so, and works once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_before_its_redis_waits_for_it() {
    let mut redis = RedisServer::start().unwrap();
    redis.kill();
    let config = format!(
        "[redis]\nurl = \"{}\"\nconnect_timeout = \"200ms\"\n",
        redis.url()
    );
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        redis.restart().expect("Redis back");
        redis
    });
    let node = DelayqProcess::start(&delayq_bin(), "early", &config).expect("waits for Redis");
    let redis = back.join().unwrap();
    assert!(
        node.log().contains("Redis does not answer yet"),
        "{}",
        node.log()
    );
    let api = Api::new(node.api);
    let body = serde_json::json!({ "id": "m1", "stream": "s", "payload": "x", "delay_ms": 0 });
    let (status, answer) = api.post("/v1/messages", body).await;
    assert_eq!(status, 201, "{answer}");
    eventually(Duration::from_secs(10), "m1 delivered", || async {
        (entries(&mut redis.client(), "s").len() == 1).then_some(())
    })
    .await;
}
