//! Whole in-process daemons and their consumers: one that acknowledges, one that
//! never does, one that holds on to its entry; dead letters listed, replayed and
//! purged over HTTP and with `delayq dead`.

use std::time::Duration;

use serde_json::json;

use super::{CONSUMER, GROUP, delivery, first_delivery};
use crate::support::{
    Entry, Env, ack, claim, create_group, delayq_bin, entries, eventually, never, pending_ids,
    read_group, value, xlen,
};

/// What a consumer does with the first delivery of a message.
#[derive(Clone, Copy, Debug)]
enum Consumer {
    /// Reads and never acknowledges (it crashed).
    NeverAcks,
    /// Acknowledges at once.
    Acks,
    /// Works slowly, XCLAIMing the entry to itself every so often, then acknowledges.
    Claims(Duration),
}

/// Pushes one message to `stream`, lets a consumer handle its first delivery as
/// `consumer` says for 4 ack timeouts, and checks whether it was redelivered.
async fn consume(env: &Env, stream: &str, consumer: Consumer, redelivered: bool) {
    let mut conn = env.redis.client();
    create_group(&mut conn, stream, GROUP);
    let id = format!("{stream}-1");
    let (status, body) = env
        .api
        .post("/v1/messages", json!({ "stream": stream, "id": id, "fields": [["order", "42"], ["kind", "reminder"]], "delay_ms": 0 }))
        .await;
    assert_eq!(status, 201, "{body}");
    let first = first_delivery(&mut conn, stream).await;
    if let Consumer::Acks = consumer {
        ack(&mut conn, stream, GROUP, &first.id);
    }
    // The consumer's side of one look: a slow one claims its entry again now and
    // then; every one reads what the group hands it.
    let window = Duration::from_millis(2000);
    let mut last_claim = std::time::Instant::now();
    let mut look = |conn: &mut redis::Connection| {
        if let Consumer::Claims(every) = consumer
            && last_claim.elapsed() >= every
        {
            claim(conn, stream, GROUP, CONSUMER, &first.id);
            last_claim = std::time::Instant::now();
        }
        read_group(conn, stream, GROUP, CONSUMER).pop()
    };
    if !redelivered {
        never(
            window,
            &format!("{stream} ({consumer:?}): redelivered"),
            || std::future::ready(look(&mut conn)),
        )
        .await;
        assert_eq!(xlen(&mut conn, stream), 1, "{stream} ({consumer:?})");
        if let Consumer::Claims(_) = consumer {
            assert_eq!(
                pending_ids(&mut conn, stream, GROUP),
                vec![first.id.clone()],
                "{stream}: the slow consumer still holds its entry"
            );
            ack(&mut conn, stream, GROUP, &first.id);
        }
        return;
    }
    let again = eventually(
        window,
        &format!("{stream} ({consumer:?}): redelivered"),
        || std::future::ready(look(&mut conn)),
    )
    .await;
    assert_eq!(again.get("delayq-id"), Some(id.as_str()), "{stream}");
    assert_eq!(again.get("delayq-attempt"), Some("2"), "{stream}");
    assert_eq!(
        again.producer_fields(),
        first.producer_fields(),
        "{stream}: same fields, same order"
    );
    assert_eq!(
        again.fields.len(),
        first.fields.len(),
        "{stream}: {again:?}"
    );
    assert!(
        again.ms() >= first.ms() + 500,
        "{stream}: redelivered before ack_timeout: {} after",
        again.ms() - first.ms()
    );
    assert_eq!(
        pending_ids(&mut conn, stream, GROUP),
        vec![again.id.clone()],
        "{stream}: the stale entry was acknowledged"
    );
    ack(&mut conn, stream, GROUP, &again.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_that_do_not_ack_in_time_get_the_message_again() {
    let env = Env::start(&delivery(&["never-acks", "acks", "claims"], "")).await;
    tokio::join!(
        consume(&env, "never-acks", Consumer::NeverAcks, true),
        consume(&env, "acks", Consumer::Acks, false),
        consume(
            &env,
            "claims",
            Consumer::Claims(Duration::from_millis(150)),
            false
        ),
    );
    let metrics = env.api.metrics().await.unwrap();
    assert!(
        metrics.contains("delayq_messages_redelivered_total{stream=\"never-acks\"} 1"),
        "{metrics}"
    );
    // Watched, so at 0 from the start.
    assert_eq!(
        value(
            &metrics,
            "delayq_messages_redelivered_total{stream=\"acks\"}"
        ),
        Some(0.0),
        "{metrics}"
    );
    assert!(
        value(&metrics, "delayq_sweep_duration_seconds_count").is_some_and(|n| n > 0.0),
        "{metrics}"
    );
}

/// Runs `delayq dead ...` against the daemon; returns exit code and stdout.
async fn cli(env: &Env, args: &[&str]) -> (i32, String) {
    let url = env.url("");
    let mut cmd = tokio::process::Command::new(delayq_bin());
    cmd.arg("dead").args(args).arg("--url").arg(url);
    let out = cmd.output().await.expect("run delayq");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_can_be_listed_replayed_and_purged() {
    let stream = "orders";
    let env = Env::start(&delivery(&[stream], "max_attempts = 3")).await;
    let mut conn = env.redis.client();
    create_group(&mut conn, stream, GROUP);
    for id in ["d1", "d2"] {
        let (status, body) = env.api
            .post("/v1/messages", json!({ "stream": stream, "id": id, "fields": { "order": id, "kind": "reminder" }, "delay_ms": 0 }))
            .await;
        assert_eq!(status, 201, "{body}");
    }
    // A consumer that reads everything and never acknowledges.
    let mut seen: Vec<Entry> = Vec::new();
    eventually(
        Duration::from_secs(15),
        "both messages dead-lettered",
        || {
            seen.extend(read_group(&mut conn, stream, GROUP, CONSUMER));
            std::future::ready((xlen(&mut conn, "orders:dead") == 2).then_some(()))
        },
    )
    .await;
    for id in ["d1", "d2"] {
        let attempts: Vec<&str> = seen
            .iter()
            .filter(|e| e.get("delayq-id") == Some(id))
            .map(|e| e.get("delayq-attempt").unwrap())
            .collect();
        assert_eq!(
            attempts,
            ["1", "2", "3"],
            "{id}: delivered three times, then no more"
        );
        let (_, status) = env.api.get(&format!("/v1/messages/{id}")).await;
        assert_eq!(status["state"], "dead", "{status}");
        assert_eq!(status["stream"], "orders:dead", "{status}");
    }
    assert_eq!(
        pending_ids(&mut conn, stream, GROUP),
        Vec::<String>::new(),
        "every stale entry acknowledged"
    );

    let (status, list) = env.api.get(&format!("/v1/streams/{stream}/dead")).await;
    assert_eq!(status, 200, "{list}");
    let letters = list["entries"].as_array().unwrap();
    assert_eq!(letters.len(), 2, "{list}");
    let d1 = letters.iter().find(|l| l["id"] == "d1").expect("d1 listed");
    assert_eq!(d1["reason"], "max_attempts");
    assert_eq!(d1["attempt"], 3);
    assert_eq!(d1["fields"], json!([["order", "d1"], ["kind", "reminder"]]));
    let first_ms = seen
        .iter()
        .find(|e| e.get("delayq-id") == Some("d1"))
        .unwrap()
        .ms();
    let last_ms = seen
        .iter()
        .rfind(|e| e.get("delayq-id") == Some("d1"))
        .unwrap()
        .ms();
    assert_eq!(d1["first_delivery"], first_ms);
    assert_eq!(d1["last_delivery"], last_ms);
    assert_eq!(d1["delayq"]["delayq-group"], GROUP);

    let (code, out) = cli(&env, &["list", stream]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("2 dead letter(s) in orders:dead")
            && out.contains("id=d1")
            && out.contains("reason=max_attempts"),
        "{out}"
    );

    // Replay one by id: back in the stream as attempt 1, gone from the dead letters.
    let (code, out) = cli(&env, &["replay", stream, "--id", "d1"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("replayed 1 dead letter(s)"), "{out}");
    let replayed = eventually(Duration::from_secs(5), "replayed message delivered", || {
        std::future::ready(read_group(&mut conn, stream, GROUP, CONSUMER).pop())
    })
    .await;
    assert_eq!(replayed.get("delayq-id"), Some("d1"));
    assert_eq!(replayed.get("delayq-attempt"), Some("1"));
    assert_eq!(
        replayed.producer_fields(),
        [
            ("order".into(), "d1".into()),
            ("kind".into(), "reminder".into())
        ]
    );
    ack(&mut conn, stream, GROUP, &replayed.id);
    let dead = entries(&mut conn, "orders:dead");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].get("delayq-id"), Some("d2"));

    // An id that is not a dead letter is reported; nothing else changes.
    let (status, body) = env
        .api
        .post(
            &format!("/v1/streams/{stream}/dead/replay"),
            json!({ "ids": ["nope"] }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["not_found"], json!(["nope"]));
    assert_eq!(body["replayed"], json!([]));
    let (code, _) = cli(&env, &["replay", stream, "--id", "nope"]).await;
    assert_eq!(code, 3, "an id with no dead letter is not found");
    let (status, body) = env
        .api
        .post(&format!("/v1/streams/{stream}/dead/replay"), json!({}))
        .await;
    assert_eq!(status, 422, "{body}");

    // The dead one says where its dead letter is, and where a replay sends it.
    let (_, status) = env.api.get("/v1/messages/d2").await;
    assert_eq!(
        (
            status["state"].as_str(),
            status["dead_letter"].as_str(),
            status["target"].as_str()
        ),
        (Some("dead"), Some("present"), Some(stream)),
        "{status}"
    );
    // Purge the rest.
    let (code, out) = cli(&env, &["purge", stream, "--all"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("purged 1 dead letter(s)"), "{out}");
    assert_eq!(xlen(&mut conn, "orders:dead"), 0);
    let (_, status) = env.api.get("/v1/messages/d2").await;
    assert_eq!(status["dead_letter"], "purged", "{status}");

    never(
        Duration::from_millis(1000),
        "something more arrives",
        || {
            let more = read_group(&mut conn, stream, GROUP, CONSUMER);
            std::future::ready((!more.is_empty()).then_some(more))
        },
    )
    .await;
    let (_, status) = env.api.get("/v1/messages/d1").await;
    assert_eq!(status["state"], "delivered", "{status}");
}
