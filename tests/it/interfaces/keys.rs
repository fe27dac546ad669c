//! Business keys through every way in: pushed over HTTP (one and a batch), the
//! inbox and the `delayq` command; shown with a message; listed in pages; cancelled
//! together over HTTP and by the command, each refusal naming the key.

use std::time::Duration;

use serde_json::{Value, json};

use super::{T, delayq_says, strict};
use crate::support::{Env, eventually, xadd};

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
