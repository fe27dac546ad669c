//! The forwarder with a running daemon: exactly once, never early, through Redis
//! crashes, script cache and function flushes, shutdowns and a second standalone
//! instance.

use std::collections::HashMap;
use std::time::Duration;

use delayq::leadership::Role;
use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::{BatchItem, ScheduleMode, Scheduled, Store};
use delayq_harness::{DelayqProcess, RedisOptions};
use futures::StreamExt;
use rand::Rng;

use crate::support::{
    Deliveries, Env, calls_of, delayq_bin, eventually, ids_in_every_shard, let_pass, libraries,
    xlen,
};

/// Schedules `n` messages to `stream`, due `0..spread_ms` from now; returns id → due ms.
async fn schedule_many(
    store: &Store,
    stream: &str,
    n: usize,
    spread_ms: u64,
    tag: &str,
) -> HashMap<String, u64> {
    let dues: Vec<u64> = {
        let mut rng = rand::rng();
        (0..n)
            .map(|_| rng.random_range(0..spread_ms.max(1)))
            .collect()
    };
    futures::stream::iter(dues.into_iter().enumerate())
        .map(|(i, delay)| {
            let store = store.clone();
            let stream = stream.to_owned();
            let id = format!("{tag}-{i}");
            async move {
                let msg = NewMessage {
                    key: None,
                    id: MessageId::parse(&id).unwrap(),
                    stream,
                    fields: vec![("n".into(), i.to_string())],
                    due: Due::In(Duration::from_millis(delay)),
                    priority: 0,
                    ttl: None,
                };
                match store
                    .schedule(&msg, ScheduleMode::New, Duration::from_secs(3600))
                    .await
                {
                    Ok(Scheduled::Scheduled { due_ms }) => (id, due_ms),
                    other => panic!("schedule {id}: {other:?}"),
                }
            }
        })
        .buffer_unordered(128)
        .collect()
        .await
}

/// Waits until every expected id arrived in `stream`, then checks each arrived exactly
/// once and not before its due time.
async fn assert_exactly_once(
    env: &Env,
    stream: &str,
    expected: &HashMap<String, u64>,
    timeout: Duration,
) {
    let (tally, got) = Deliveries::new(&env.redis.url(), &[stream])
        .exactly_once(expected.keys(), timeout)
        .await;
    tally.assert_exact(stream);
    for e in &got {
        let id = e.get("delayq-id").expect("delayq-id field");
        let due = expected[id];
        assert!(
            e.ms() >= due,
            "{id} forwarded at {} before its due time {due}",
            e.ms()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_messages_are_forwarded_exactly_once_and_never_early() {
    let env = Env::start("[redis]\nshards = 16\n").await;
    let expected = schedule_many(&env.store, "orders", 100_000, 3000, "m").await;
    assert_exactly_once(&env, "orders", &expected, Duration::from_secs(60)).await;
    assert_eq!(env.scheduled().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_resumes_after_redis_is_killed_and_restarted_from_its_aof() {
    let mut env = Env::start_with(
        RedisOptions {
            aof: true,
            ..RedisOptions::default()
        },
        "",
    )
    .await;
    let expected = schedule_many(&env.store, "orders", 3000, 3000, "m").await;
    // Killed while forwarding is under way: some delivered, most still scheduled.
    let mut conn = env.redis.client();
    eventually(Duration::from_secs(10), "forwarding under way", || {
        std::future::ready((xlen(&mut conn, "orders") > 0).then_some(()))
    })
    .await;
    env.redis.kill();
    // Down for a while, with messages falling due meanwhile.
    let_pass(Duration::from_millis(500)).await;
    env.redis.restart().expect("restart redis");
    // Everything acknowledged before the crash is still there and arrives once.
    assert_exactly_once(&env, "orders", &expected, Duration::from_secs(30)).await;
    // New pushes work again through the same daemon.
    let (status, body) = env
        .api
        .post(
            "/v1/messages",
            serde_json::json!({"stream": "after", "payload": "x", "delay_ms": 0}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let mut conn = env.redis.client();
    eventually(
        Duration::from_secs(10),
        "the push after the restart arrives",
        || std::future::ready((xlen(&mut conn, "after") == 1).then_some(())),
    )
    .await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_script_and_function_flush() {
    let env = Env::start("").await;
    let mut conn = env.redis.client();
    let first = schedule_many(&env.store, "orders", 200, 500, "a").await;
    // Redis 7 runs them as delayq's library of functions.
    let loaded = libraries(&mut conn);
    assert!(
        loaded.len() == 1 && loaded[0].starts_with("delayq_"),
        "{loaded:?}"
    );
    let fcalls = calls_of(&mut conn, "fcall");
    assert!(fcalls > 0, "no FCALL");
    let () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut conn)
        .unwrap();
    let second = schedule_many(&env.store, "orders", 200, 500, "b").await;
    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut conn)
        .unwrap();
    let all: HashMap<String, u64> = first.into_iter().chain(second).collect();
    assert_exactly_once(&env, "orders", &all, Duration::from_secs(20)).await;
    assert_eq!(libraries(&mut conn), loaded, "loaded again, the same");
    assert!(calls_of(&mut conn, "fcall") > fcalls);
    assert_eq!(calls_of(&mut conn, "evalsha"), 0, "no call went as EVALSHA");
}

/// A user that may not load or call functions (or a Redis before 7) gets every
/// script as EVALSHA, exactly once all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_go_as_evalsha_where_functions_are_not_allowed() {
    let redis = delayq_harness::RedisServer::start().expect("start redis-server");
    let dir = tempfile::tempdir().unwrap();
    let rules = ["~*", "&*", "+@all", "-function", "-fcall", "-fcall_ro"];
    let extra = crate::support::acl_user(&redis, "dq", &rules, dir.path());
    let env = crate::support::Bare::start_on(redis, &extra)
        .await
        .daemon()
        .await;
    let first = schedule_many(&env.store, "orders", 200, 500, "a").await;
    assert_exactly_once(&env, "orders", &first, Duration::from_secs(20)).await;
    let mut conn = env.redis.client();
    assert!(libraries(&mut conn).is_empty(), "nothing was loaded");
    assert_eq!(calls_of(&mut conn, "fcall"), 0);
    assert!(
        calls_of(&mut conn, "evalsha") > 0,
        "the scripts went as EVALSHA"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_message_wakes_the_forwarder_at_once() {
    // A long idle sleep: only the schedule script's wake-up can make this fast.
    let env = Env::start("[forwarder]\nidle_wakeup = \"60s\"\n[redis]\nshards = 1\n").await;
    env.leading().await;
    // Its forward loop found nothing due and went to sleep for the idle wake-up.
    let_pass(Duration::from_millis(300)).await;
    let far = schedule_many(&env.store, "later", 1, 1, "far").await;
    let _ = far;
    let start = std::time::Instant::now();
    let near = schedule_many(&env.store, "soon", 1, 1, "near").await;
    assert_exactly_once(&env, "soon", &near, Duration::from_secs(5)).await;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_every_shard_wakes_each_shards_forwarder() {
    // One schedule call stores into every shard: each shard's wake-up must go out.
    let env = Env::start("[forwarder]\nidle_wakeup = \"60s\"\n[redis]\nshards = 8\n").await;
    env.leading().await;
    let_pass(Duration::from_millis(300)).await;
    let items: Vec<BatchItem> = ids_in_every_shard(&env.store, "soon", 2)
        .into_iter()
        .map(|id| {
            BatchItem::new(NewMessage {
                id: MessageId::parse(&id).unwrap(),
                ..NewMessage::payload("soon", "x", Duration::from_millis(200))
            })
        })
        .collect();
    let outcomes = env
        .store
        .schedule_many(&items, Duration::from_secs(3600), None)
        .await;
    let expected: HashMap<String, u64> = items
        .iter()
        .zip(outcomes)
        .map(|(item, outcome)| match outcome {
            Ok(Scheduled::Scheduled { due_ms }) => (item.msg.id.as_str().to_owned(), due_ms),
            other => panic!("{}: {other:?}", item.msg.id.as_str()),
        })
        .collect();
    assert_eq!(expected.len(), 16);
    assert_exactly_once(&env, "soon", &expected, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_mid_drain_loses_nothing_and_a_successor_finishes() {
    let mut env = Env::start("[redis]\nshards = 8\n").await;
    env.stop().await;
    let expected = schedule_many(&env.store, "orders", 20_000, 1, "m").await;
    let first = delayq::start(env.config.clone()).await.unwrap();
    let mut conn = env.redis.client();
    eventually(Duration::from_secs(20), "the drain to begin", || {
        std::future::ready((xlen(&mut conn, "orders") > 0).then_some(()))
    })
    .await;
    first.stop().await;
    let forwarded_by_first = xlen(&mut conn, "orders");
    env.run(delayq::start(env.config.clone()).await.unwrap());
    assert_exactly_once(&env, "orders", &expected, Duration::from_secs(30)).await;
    assert!(forwarded_by_first > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_standalone_instance_fences_out_the_older() {
    let env = Env::start("").await;
    let old = env.daemon.as_ref().unwrap();
    let old_epoch = eventually(Duration::from_secs(5), "first instance leads", || {
        std::future::ready(old.leadership.current().epoch())
    })
    .await;
    let mut cfg = env.config.clone();
    cfg.node_id = "newer".into();
    let newer = delayq::start(cfg).await.unwrap();
    let new_epoch = eventually(Duration::from_secs(5), "second instance leads", || {
        std::future::ready(newer.leadership.current().epoch())
    })
    .await;
    assert!(new_epoch > old_epoch);
    // The old leader learns from its next script call that it is fenced out.
    eventually(Duration::from_secs(5), "older instance steps down", || {
        std::future::ready((old.leadership.current() == Role::Follower).then_some(()))
    })
    .await;
    let expected = schedule_many(&env.store, "orders", 500, 300, "m").await;
    assert_exactly_once(&env, "orders", &expected, Duration::from_secs(20)).await;
    newer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_forgotten_after_the_retention() {
    let env = Env::start("[records]\nretention = \"300ms\"\ntrim_interval = \"100ms\"\n").await;
    let (status, body) = env
        .api
        .post(
            "/v1/messages",
            serde_json::json!({"stream": "s", "payload": "x", "delay_ms": 0, "id": "short-lived"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    eventually(Duration::from_secs(5), "delivered", || async {
        (env.api.get("/v1/messages/short-lived").await.1["state"] == "delivered").then_some(())
    })
    .await;
    eventually(Duration::from_secs(5), "record forgotten", || async {
        (env.api.get("/v1/messages/short-lived").await.0 == 404).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_exits_zero_and_bad_config_exits_64() {
    let redis = delayq_harness::RedisServer::start().unwrap();
    let mut node = DelayqProcess::start(
        &delayq_bin(),
        "n1",
        &format!("[redis]\nurl = \"{}\"\n", redis.url()),
    )
    .unwrap();
    let status = node
        .terminate(Duration::from_secs(10) * crate::support::patience())
        .expect("exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", node.log());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[redis]\nshards = 0\n").unwrap();
    let out = std::process::Command::new(delayq_bin())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("redis.shards: must be 1 to 1024 (got 0)"),
        "{stderr}"
    );
}
