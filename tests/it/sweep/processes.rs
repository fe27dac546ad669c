//! Real `delayq run` processes: killed in the middle of a sweep, started before
//! the consumer group exists, reloaded with other delivery settings.

use std::collections::BTreeMap;
use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};
use serde_json::json;

use super::{CONSUMER, GROUP, delivery, first_delivery};
use crate::support::{
    Api, Entry, Tally, ack, counter, create_group, delayq_bin, entries, eventually, never,
    pending_ids, read_group, xlen,
};

fn process_config(redis: &RedisServer, extra: &str) -> String {
    format!("[redis]\nurl = \"{}\"\nshards = 4\n\n{extra}", redis.url())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_sweep_loses_and_doubles_nothing() {
    const N: usize = 100;
    let stream = "kill";
    let redis = RedisServer::start().unwrap();
    let mut conn = redis.client();
    create_group(&mut conn, stream, GROUP);
    // Small passes (10 entries per 100 ms) so the kill lands while the sweep works.
    let config = process_config(
        &redis,
        &delivery(
            &[stream],
            "max_attempts = 5\nsweep_batch = 10\nsweep_interval = \"100ms\"",
        ),
    );
    let mut node = DelayqProcess::start(&delayq_bin(), "n1", &config).unwrap();
    let api = Api::new(node.api);
    for i in 0..N {
        let (status, body) = api
            .post("/v1/messages", json!({ "stream": stream, "id": format!("k{i}"), "payload": i.to_string(), "delay_ms": 0 }))
            .await;
        assert_eq!(status, 201, "{body}");
    }
    // The consumer drops attempt 1 of everything (as if it crashed) and acks the rest.
    let mut seen: Vec<Entry> = Vec::new();
    let consume = |conn: &mut redis::Connection, seen: &mut Vec<Entry>| {
        for e in read_group(conn, stream, GROUP, CONSUMER) {
            if e.get("delayq-attempt") != Some("1") {
                ack(conn, stream, GROUP, &e.id);
            }
            seen.push(e);
        }
    };
    eventually(Duration::from_secs(20), "the sweep under way", || {
        consume(&mut conn, &mut seen);
        std::future::ready((xlen(&mut conn, stream) >= N + 10).then_some(()))
    })
    .await;
    node.kill();
    let at_kill = xlen(&mut conn, stream);
    assert!(
        at_kill < 2 * N,
        "the sweep had finished before the kill ({at_kill} entries); the test needs a slower sweep"
    );
    node.restart().unwrap();
    eventually(
        Duration::from_secs(30),
        "every message redelivered once and acknowledged",
        || {
            consume(&mut conn, &mut seen);
            let done = xlen(&mut conn, stream) >= 2 * N
                && pending_ids(&mut conn, stream, GROUP).is_empty();
            std::future::ready(done.then_some(()))
        },
    )
    .await;
    // Anything doubled would show up within a few sweep passes.
    never(
        Duration::from_millis(1500),
        "a message delivered again",
        || {
            consume(&mut conn, &mut seen);
            let len = xlen(&mut conn, stream);
            std::future::ready((len > 2 * N).then_some(len))
        },
    )
    .await;
    let delivered = entries(&mut conn, stream);
    let attempt = |e: &Entry| {
        format!(
            "{}@{}",
            e.get("delayq-id").unwrap_or("?"),
            e.get("delayq-attempt").unwrap_or("?")
        )
    };
    Tally::count(
        (0..N).flat_map(|i| [format!("k{i}@1"), format!("k{i}@2")]),
        delivered.iter().map(attempt),
    )
    .assert_exact(&format!("once per attempt\n{}", node.log()));
    let mut attempts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in &delivered {
        attempts
            .entry(e.get("delayq-id").unwrap().to_owned())
            .or_default()
            .push(e.get("delayq-attempt").unwrap().to_owned());
    }
    assert_eq!(attempts.len(), N, "every message arrived");
    for (id, list) in &attempts {
        assert_eq!(
            list,
            &["1", "2"],
            "{id}: once per attempt, nothing lost, nothing doubled\n{}",
            node.log()
        );
    }
    assert_eq!(seen.len(), 2 * N);
    assert_eq!(pending_ids(&mut conn, stream, GROUP), Vec::<String>::new());
    assert_eq!(xlen(&mut conn, "kill:dead"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_does_not_exist_yet_is_waited_for_quietly() {
    let stream = "early";
    let redis = RedisServer::start().unwrap();
    let mut conn = redis.client();
    let node = DelayqProcess::start(
        &delayq_bin(),
        "n1",
        &process_config(&redis, &delivery(&[stream], "")),
    )
    .unwrap();
    let api = Api::new(node.api);
    let (status, body) = api
        .post(
            "/v1/messages",
            json!({ "stream": stream, "id": "e1", "payload": "x", "delay_ms": 0 }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let metrics = || async { api.metrics().await.unwrap() };
    let missing = format!("delayq_sweep_group_missing{{stream=\"{stream}\",group=\"{GROUP}\"}}");
    let m = eventually(
        Duration::from_secs(5),
        "the missing group reported",
        || async {
            let m = metrics().await;
            m.contains(&format!("{missing} 1")).then_some(m)
        },
    )
    .await;
    // Many sweep intervals (50 ms) on: still one line in the log, no errors.
    let noisy = || {
        let log = node.log();
        let lines = log
            .lines()
            .filter(|l| l.contains("consumer group does not exist"))
            .count();
        (lines != 1 || log.contains("sweep failed")).then_some(log)
    };
    never(
        Duration::from_millis(1500),
        "the missing group logged more than once, or a sweep failed",
        || std::future::ready(noisy()),
    )
    .await;
    assert_eq!(counter(&m, "delayq_sweep_errors_total"), 0.0, "{m}");

    // Once the group exists, its unacknowledged entries are redelivered.
    create_group(&mut conn, stream, GROUP);
    let first = read_group(&mut conn, stream, GROUP, CONSUMER);
    assert_eq!(first.len(), 1);
    let again = eventually(
        Duration::from_secs(10),
        "redelivery once the group exists",
        || std::future::ready(read_group(&mut conn, stream, GROUP, CONSUMER).pop()),
    )
    .await;
    assert_eq!(again.get("delayq-attempt"), Some("2"));
    assert!(metrics().await.contains(&format!("{missing} 0")));
    assert!(
        node.log().contains("consumer group found"),
        "{}",
        node.log()
    );
}

#[tokio::test]
async fn a_reload_that_changes_the_delivery_settings_sweeps_with_them() {
    let stream = "reloaded";
    let redis = RedisServer::start().unwrap();
    let mut conn = redis.client();
    create_group(&mut conn, stream, GROUP);
    let config = process_config(&redis, &delivery(&[stream], "ack_timeout = \"1h\""));
    let node = DelayqProcess::start(&delayq_bin(), "n1", &config).unwrap();
    let (status, body) = Api::new(node.api)
        .post(
            "/v1/messages",
            json!({ "stream": stream, "id": "r1", "payload": "x", "delay_ms": 0 }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    first_delivery(&mut conn, stream).await;
    // Under an ack timeout of an hour, nothing comes back.
    never(
        Duration::from_secs(1),
        "redelivered within the hour",
        || std::future::ready(read_group(&mut conn, stream, GROUP, CONSUMER).pop()),
    )
    .await;

    let file = std::fs::read_to_string(node.config_path()).unwrap();
    std::fs::write(
        node.config_path(),
        file.replace("ack_timeout = \"1h\"", "ack_timeout = \"300ms\""),
    )
    .unwrap();
    node.signal(libc::SIGHUP);
    let again = eventually(Duration::from_secs(10), "a redelivery", || {
        std::future::ready(read_group(&mut conn, stream, GROUP, CONSUMER).pop())
    })
    .await;
    assert_eq!(again.get("delayq-id"), Some("r1"));
    assert_eq!(again.get("delayq-attempt"), Some("2"));
    assert!(
        node.full_log()
            .contains("delivery settings reloaded; sweeping with them"),
        "{}",
        node.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deployments_sharing_a_stream_each_redeliver_only_their_own() {
    const N: usize = 20;
    let stream = "shared";
    let redis = RedisServer::start().unwrap();
    let mut conn = redis.client();
    create_group(&mut conn, stream, GROUP);
    // Two deployments on one Redis (prefixes a and b), both watching the stream.
    let watch = delivery(&[stream], "max_attempts = 3");
    let start = |prefix: &str| {
        let config = format!(
            "[redis]\nurl = \"{}\"\nprefix = \"{prefix}\"\nshards = 2\n\n{watch}",
            redis.url()
        );
        DelayqProcess::start(&delayq_bin(), prefix, &config).unwrap()
    };
    let (a, b) = (start("a"), start("b"));
    for (node, prefix) in [(&a, "a"), (&b, "b")] {
        let api = Api::new(node.api);
        for i in 0..N {
            let (status, body) = api
                .post("/v1/messages", json!({ "stream": stream, "id": format!("{prefix}{i}"), "payload": "x", "delay_ms": 0 }))
                .await;
            assert_eq!(status, 201, "{body}");
        }
    }
    // The consumer drops attempt 1 of everything and acks the rest: each message comes
    // again exactly once, from the deployment that holds it.
    let mut seen: Vec<Entry> = Vec::new();
    eventually(Duration::from_secs(20), "every message twice", || {
        for e in read_group(&mut conn, stream, GROUP, CONSUMER) {
            if e.get("delayq-attempt") != Some("1") {
                ack(&mut conn, stream, GROUP, &e.id);
            }
            seen.push(e);
        }
        std::future::ready((seen.len() >= 4 * N).then_some(()))
    })
    .await;
    // Longer than a sweep pass and a backoff: a third copy would have come by now.
    never(Duration::from_secs(2), "a third delivery", || {
        for e in read_group(&mut conn, stream, GROUP, CONSUMER) {
            ack(&mut conn, stream, GROUP, &e.id);
            seen.push(e);
        }
        std::future::ready((seen.len() > 4 * N).then_some(seen.len()))
    })
    .await;
    let mut attempts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in &seen {
        attempts
            .entry(e.get("delayq-id").unwrap_or("?").to_owned())
            .or_default()
            .push(e.get("delayq-attempt").unwrap_or("?").to_owned());
    }
    assert_eq!(attempts.len(), 2 * N, "{attempts:?}");
    for (id, tries) in &attempts {
        assert_eq!(
            tries,
            &["1", "2"],
            "{id}: {attempts:?}\na: {}\nb: {}",
            a.log(),
            b.log()
        );
    }
    for (node, prefix) in [(&a, "a"), (&b, "b")] {
        let metrics = Api::new(node.api).metrics().await.unwrap();
        assert_eq!(
            counter(
                &metrics,
                &format!("delayq_messages_redelivered_total{{stream=\"{stream}\"}}")
            ),
            N as f64,
            "deployment {prefix}: {metrics}"
        );
    }
}
