//! Business keys through every way in: pushed over HTTP (one and a batch), the
//! inbox and the `delayq` command; shown with a message; listed in pages; cancelled
//! together over HTTP and by the command, each refusal naming the key.

use std::time::Duration;

use serde_json::{Value, json};

use super::{T, delayq_says, strict};
use crate::support::{Env, entries, eventually, xadd};

const LIST: &str = "/v1/streams/orders/keys/order-42";

fn states(list: &Value) -> Vec<(String, String)> {
    list["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_key_pushed_every_way_is_listed_in_pages_and_cancelled_once() {
    let env = Env::start(&strict("")).await;
    let api = &env.api;
    let push = |body: Value| async move {
        api.call("POST", "/v1/messages", T, Some(&body.to_string()))
            .await
    };
    let (status, answer) =
        push(json!({"stream": "orders", "payload": "now", "delay": "0s", "id": "k-now", "key": "order-42"})).await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) =
        push(json!({"stream": "orders", "payload": "later", "delay": "20m", "id": "k-http", "key": "order-42"})).await;
    assert_eq!(status, 201, "{answer}");
    let batch = json!({ "messages": [
        { "stream": "orders", "payload": "b", "delay": "30m", "id": "k-batch", "key": "order-42" },
        { "stream": "orders", "payload": "c", "delay": "30m", "id": "k-other", "key": "order-43" },
        { "stream": "orders", "payload": "d", "delay": "30m", "id": "k-bad", "key": "order 42" },
    ]});
    let (status, answer) = env
        .api
        .call("POST", "/v1/messages/batch", T, Some(&batch.to_string()))
        .await;
    assert_eq!(status, 200, "{answer}");
    let bad = &answer["results"][2];
    assert_eq!(bad["status"].as_u64(), Some(422), "{answer}");
    assert!(
        bad["detail"].as_str().unwrap().contains("key \"order 42\""),
        "{bad}"
    );
    // The inbox's delayq-key, and the command's --key.
    let mut conn = env.redis.client();
    xadd(
        &mut conn,
        "delayq:inbox",
        &[
            ("delayq-stream", "orders"),
            ("delayq-delay", "40m"),
            ("delayq-id", "k-inbox"),
            ("delayq-key", "order-42"),
            ("x", "1"),
        ],
    );
    let (code, said) = delayq_says(
        &env,
        &[
            "push", "orders", "cli", "--delay", "50m", "--id", "k-cli", "--key", "order-42",
        ],
    )
    .await;
    assert_eq!(code, 0, "{said}");

    // A message shows its key; the one due now is delivered and listed last.
    let (status, got) = env.api.call("GET", "/v1/messages/k-http", T, None).await;
    assert_eq!(
        (status, got["key"].as_str()),
        (200, Some("order-42")),
        "{got}"
    );
    let listed = eventually(
        Duration::from_secs(10),
        "the inbox entry stored and k-now delivered",
        || async {
            let (_, list) = env.api.call("GET", LIST, T, None).await;
            let s = states(&list);
            (s.len() == 5 && s.iter().any(|(id, st)| id == "k-now" && st == "delivered"))
                .then_some(list)
        },
    )
    .await;
    let order: Vec<String> = states(&listed).into_iter().map(|(id, _)| id).collect();
    assert_eq!(
        order,
        ["k-http", "k-batch", "k-inbox", "k-cli", "k-now"],
        "{listed}"
    );
    assert!(
        listed["messages"][0]["deliver_at"].as_u64().is_some(),
        "{listed}"
    );
    assert!(
        listed["messages"][4]["entry_id"].as_str().is_some(),
        "{listed}"
    );

    // In pages of two, each page's `next` leads on, the last one's is null.
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("{LIST}?limit=2&after={a}"),
            None => format!("{LIST}?limit=2"),
        };
        let (status, page) = env.api.call("GET", &path, T, None).await;
        assert_eq!(status, 200, "{page}");
        paged.extend(states(&page).into_iter().map(|(id, _)| id));
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(paged, order);
    for (path, says) in [
        ("/v1/streams/orders/keys/order%2042", "key \"order 42\""),
        (
            "/v1/streams/orders/keys/order-42?after=bogus",
            "after \"bogus\"",
        ),
        ("/v1/streams/orders/keys/order-42?limit=0", "limit 0"),
    ] {
        let (status, answer) = env.api.call("GET", path, T, None).await;
        assert_eq!(status, 422, "{path}: {answer}");
        assert!(
            answer["detail"].as_str().unwrap().contains(says),
            "{path}: {answer}"
        );
    }
    let (status, _) = env
        .api
        .call("GET", "/v1/streams/billing/keys/order-42", T, None)
        .await;
    assert_eq!(status, 403);

    // One cancel takes the four pending; again, none; the other key's stays.
    let (status, answer) = env.api.call("DELETE", LIST, T, None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["cancelled"].as_u64(), answer["delivered"].as_u64()),
        (Some(4), Some(1)),
        "{answer}"
    );
    let (code, said) =
        delayq_says(&env, &["cancel", "--key", "order-42", "--stream", "orders"]).await;
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("cancelled: 0") && said.contains("delivered: 1"),
        "{said}"
    );
    let (code, said) = delayq_says(&env, &["key", "orders", "order-42"]).await;
    assert_eq!(code, 0, "{said}");
    assert_eq!(said.matches("cancelled").count(), 4, "{said}");
    let (status, other) = env.api.call("GET", "/v1/messages/k-other", T, None).await;
    assert_eq!(
        (status, other["state"].as_str()),
        (200, Some("scheduled")),
        "{other}"
    );
    let (code, said) = delayq_says(&env, &["cancel", "--key", "order-42"]).await;
    assert_eq!(code, 2, "--key needs --stream: {said}");
}

/// A dead letter keeps its business key through a replay: the key travels on its
/// entries in the stream's `streams.key_field` (over `forwarder.key_field`), and
/// the replayed message is listed under it and delivered with it.
#[tokio::test]
async fn a_replayed_dead_letter_keeps_its_key() {
    let env = Env::start(&strict(
        "[forwarder]\nkey_field = \"k\"\n[streams.key_field]\norders = \"order-key\"\n",
    ))
    .await;
    let api = &env.api.clone().with_token(super::TOKEN);
    // Past its ttl before it is forwarded: dead-lettered as expired.
    api.push_expiring(
        "orders",
        json!({ "id": "x1", "stream": "orders", "payload": "x", "delay_ms": 0, "ttl_ms": 1, "key": "order-7" }),
    )
    .await;
    let dead = eventually(Duration::from_secs(10), "x1 expired", || async {
        entries(&mut env.redis.client(), "orders:dead").pop()
    })
    .await;
    assert_eq!(dead.get("order-key"), Some("order-7"), "{dead:?}");
    let (status, letters) = api.get("/v1/streams/orders/dead").await;
    assert_eq!(status, 200, "{letters}");
    assert_eq!(
        (
            letters["entries"][0]["id"].as_str(),
            letters["entries"][0]["key"].as_str()
        ),
        (Some("x1"), Some("order-7")),
        "{letters}"
    );

    let (status, answer) = api
        .post("/v1/streams/orders/dead/replay", json!({ "ids": ["x1"] }))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["replayed"][0]["id"], "x1", "{answer}");
    let delivered = eventually(Duration::from_secs(10), "x1 delivered again", || async {
        entries(&mut env.redis.client(), "orders")
            .into_iter()
            .find(|e| e.get("delayq-id") == Some("x1"))
    })
    .await;
    assert_eq!(delivered.get("order-key"), Some("order-7"), "{delivered:?}");
    let own: Vec<(String, String)> = delivered
        .producer_fields()
        .into_iter()
        .filter(|(k, _)| k != "order-key")
        .collect();
    assert_eq!(own, [("payload".into(), "x".into())], "{delivered:?}");
    let (status, list) = api.get("/v1/streams/orders/keys/order-7").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(states(&list), [("x1".into(), "delivered".into())], "{list}");
}
