//! Business keys and the journal: a keyed message comes back with its key after
//! Redis loses its data, and a key cancelled before the loss stays cancelled.

use std::time::Duration;

use delayq_harness::RedisServer;
use serde_json::{Value, json};

use super::daemon::{journaled_node, mariadb};
use crate::support::{Api, eventually};

fn ids_and_states(list: &Value) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = list["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| {
                    (
                        m["id"].as_str().unwrap().to_owned(),
                        m["state"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    all.sort();
    all
}

#[tokio::test]
async fn keyed_messages_come_back_with_their_keys_and_a_cancelled_key_stays_cancelled() {
    let db = mariadb().await;
    let redis = RedisServer::start().unwrap();
    let node = journaled_node(&redis, &db, "");
    let api = Api::new(node.api);
    for (id, key) in [
        ("k0", "order-42"),
        ("k1", "order-42"),
        ("k2", "order-42"),
        ("c0", "order-43"),
        ("c1", "order-43"),
    ] {
        let body = json!({"id": id, "stream": "s", "payload": id, "delay": "1h", "key": key});
        let (status, answer) = api.post("/v1/messages", body).await;
        assert_eq!(status, 201, "{answer}");
    }
    let (status, answer) = api.delete("/v1/streams/s/keys/order-43").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["cancelled"], json!(2), "{answer}");
    assert_eq!(
        answer["not_journaled"],
        json!(null),
        "answered once journaled: {answer}"
    );

    let mut conn = redis.client();
    let () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let scheduled = |id: &str| (id.to_owned(), "scheduled".to_owned());
    eventually(
        Duration::from_secs(30),
        "order-42 restored under its key",
        || async {
            let (status, list) = api.get("/v1/streams/s/keys/order-42").await;
            (status == 200
                && ids_and_states(&list) == [scheduled("k0"), scheduled("k1"), scheduled("k2")])
            .then_some(())
        },
    )
    .await;
    let (status, got) = api.get("/v1/messages/k1").await;
    assert_eq!(
        (status, got["key"].as_str()),
        (200, Some("order-42")),
        "{got}"
    );
    // The cancelled key's messages were not brought back.
    let (status, list) = api.get("/v1/streams/s/keys/order-43").await;
    assert_eq!((status, ids_and_states(&list)), (200, vec![]), "{list}");
    for id in ["c0", "c1"] {
        let (_, got) = api.get(&format!("/v1/messages/{id}")).await;
        assert_eq!(got["state"], json!("cancelled"), "{id}: {got}");
    }
}
