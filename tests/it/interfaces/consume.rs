//! Consumption over HTTP: long polls on a consumer group, and acknowledgements.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{TOKEN, strict};
use crate::support::{
    Env, assert_refused, blocked_clients, eventually, patience, pending_count, xlen,
};

/// A poll of `jobs` by `workers`/`w1` that does not wait.
async fn poll_now(env: &Env) -> (u16, serde_json::Value) {
    let path = "/v1/streams/jobs/next?group=workers&consumer=w1&wait=0";
    env.api.call("GET", path, Some(TOKEN), None).await
}

#[tokio::test]
async fn a_long_poll_returns_a_message_when_it_falls_due_and_ack_clears_it() {
    let env = Env::start(&strict("")).await;
    // Nothing there yet: wait=0 answers at once with an empty list (and creates the group).
    let started = Instant::now();
    let (status, answer) = poll_now(&env).await;
    assert_eq!(
        (status, answer["messages"].clone()),
        (200, json!([])),
        "{answer}"
    );
    assert!(started.elapsed() < Duration::from_secs(2) * patience());

    // A poll waiting while the message is still scheduled gets it when it falls due.
    let poll = {
        let api = env.api.clone();
        tokio::spawn(async move {
            let path = "/v1/streams/jobs/next?group=workers&consumer=w1&wait=5s&count=10";
            api.call("GET", path, Some(TOKEN), None).await
        })
    };
    let mut conn = env.redis.client();
    // The inbox reader blocks on its own connection too: the poll makes it two.
    eventually(Duration::from_secs(5), "the poll waits in Redis", || {
        std::future::ready((blocked_clients(&mut conn) >= 2).then_some(()))
    })
    .await;
    let (status, _) = env
        .api
        .call(
            "POST",
            "/v1/messages",
            Some(TOKEN),
            Some(r#"{"stream":"jobs","fields":{"job":"7"},"delay_ms":300}"#),
        )
        .await;
    assert_eq!(status, 201);
    let (status, answer) = poll.await.expect("poll task");
    assert_eq!(status, 200, "{answer}");
    let messages = answer["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 1, "{answer}");
    assert_eq!(messages[0]["fields"][0], json!(["job", "7"]));
    let entry_id = messages[0]["id"].as_str().expect("entry id").to_owned();

    assert_eq!(pending_count(&mut conn, "jobs", "workers"), Some(1));
    let ack = json!({ "group": "workers", "ids": [entry_id] }).to_string();
    let (status, answer) = env
        .api
        .call("POST", "/v1/streams/jobs/ack", Some(TOKEN), Some(&ack))
        .await;
    assert_eq!(
        (status, answer["acked"].as_u64()),
        (200, Some(1)),
        "{answer}"
    );
    assert_eq!(pending_count(&mut conn, "jobs", "workers"), Some(0));
    let (_, answer) = env
        .api
        .call("POST", "/v1/streams/jobs/ack", Some(TOKEN), Some(&ack))
        .await;
    assert_eq!(
        answer["acked"].as_u64(),
        Some(0),
        "acknowledging twice changes nothing"
    );

    // A wait that runs out answers an empty list after about the wait.
    let started = Instant::now();
    let (status, answer) = env
        .api
        .call(
            "GET",
            "/v1/streams/jobs/next?group=workers&consumer=w1&wait=300ms",
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!((status, answer["messages"].clone()), (200, json!([])));
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "waited {:?}",
        started.elapsed()
    );
}

/// A group created by the first poll starts at the stream's beginning: entries
/// delivered before anyone polled are not skipped.
#[tokio::test]
async fn a_new_group_reads_entries_delivered_before_the_first_poll() {
    let env = Env::start("").await;
    for i in 0..3 {
        let (status, _) = env
            .api
            .post(
                "/v1/messages",
                json!({ "stream": "jobs", "payload": format!("early {i}"), "delay_ms": 0 }),
            )
            .await;
        assert_eq!(status, 201);
    }
    let mut conn = env.redis.client();
    eventually(Duration::from_secs(10), "3 entries delivered", || {
        std::future::ready((xlen(&mut conn, "jobs") == 3).then_some(()))
    })
    .await;
    let (status, answer) = env
        .api
        .get("/v1/streams/jobs/next?group=late&consumer=c&wait=0&count=10")
        .await;
    assert_eq!(status, 200);
    // Same-millisecond messages in different shards may arrive in any order.
    let mut payloads: Vec<&str> = answer["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["fields"][0][1].as_str().unwrap())
        .collect();
    payloads.sort();
    assert_eq!(payloads, ["early 0", "early 1", "early 2"]);
}

#[tokio::test]
async fn polls_beyond_max_polls_are_refused_with_503_and_the_key_type_is_checked() {
    let env = Env::start("[api]\nlisten = \"127.0.0.1:0\"\nmax_polls = 1\n").await;
    let holder = {
        let api = env.api.clone();
        tokio::spawn(async move {
            api.get("/v1/streams/jobs/next?group=g&consumer=a&wait=3s")
                .await
                .0
        })
    };
    let (status, answer) = eventually(
        Duration::from_secs(5),
        "the second poll is refused",
        || async {
            let (status, answer) = env
                .api
                .get("/v1/streams/jobs/next?group=g&consumer=b&wait=0")
                .await;
            (status == 503).then_some((status, answer))
        },
    )
    .await;
    assert_refused(
        (status, &answer),
        (503, "busy", "api.max_polls"),
        "a poll over api.max_polls",
    );
    assert_eq!(holder.await.unwrap(), 200);

    // A key that is not a stream is a conflict, not an outage.
    let mut conn = env.redis.client();
    let () = redis::cmd("SET")
        .arg("not-a-stream")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let (status, answer) = env
        .api
        .get("/v1/streams/not-a-stream/next?group=g&consumer=c&wait=0")
        .await;
    assert_refused(
        (status, &answer),
        (409, "corrupt", "not-a-stream"),
        "a poll on a key that is not a stream",
    );
}

/// A stream deleted while a long poll waits on it ends the poll with nothing (not a
/// 500); the next poll makes the stream and its group again and reads what comes.
#[tokio::test]
async fn a_stream_deleted_under_a_long_poll_ends_it_empty() {
    // No inbox reader: the poll is the one client Redis holds blocked.
    let env = Env::start(&strict("[inbox]\nenabled = false\n")).await;
    // The longest wait these tests allow (api.max_wait).
    let path = "/v1/streams/jobs/next?group=workers&consumer=w1&wait=5s";
    let poll = {
        let api = env.api.clone();
        tokio::spawn(async move { api.call("GET", path, Some(TOKEN), None).await })
    };
    let mut conn = env.redis.client();
    eventually(Duration::from_secs(5), "the poll waits in Redis", || {
        std::future::ready((blocked_clients(&mut conn) >= 1).then_some(()))
    })
    .await;
    let started = Instant::now();
    let () = redis::cmd("DEL").arg("jobs").query(&mut conn).unwrap();
    let (status, answer) = poll.await.expect("poll task");
    assert_eq!(
        (status, answer["messages"].clone()),
        (200, json!([])),
        "{answer}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "ended by the wait, not the delete: {:?}",
        started.elapsed()
    );
    let () = redis::cmd("XADD")
        .arg("jobs")
        .arg("*")
        .arg("job")
        .arg("8")
        .query::<String>(&mut conn)
        .map(drop)
        .unwrap();
    let (status, answer) = poll_now(&env).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["messages"][0]["fields"][0],
        json!(["job", "8"]),
        "{answer}"
    );
}
