//! A stream's finished messages over HTTP: every state, newest first, in pages, by
//! state and by key; each refusal names what it refuses.

use std::time::Duration;

use serde_json::{Value, json};

use super::{T, strict};
use crate::support::{Env, eventually};

fn ids(page: &Value) -> Vec<String> {
    page["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            format!(
                "{}:{}",
                m["id"].as_str().unwrap(),
                m["state"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn a_stream_s_finished_messages_come_newest_first_in_pages_by_state_and_key() {
    let env = Env::start(&strict("")).await;
    env.leading().await;
    let api = &env.api;
    for (id, delay, key) in [
        ("f1", "0s", "order-1"),
        ("f2", "0s", "order-2"),
        ("f3", "20m", "order-1"),
        ("f4", "0s", "order-1"),
    ] {
        let body = json!({"stream": "orders", "payload": id, "delay": delay, "id": id, "key": key});
        let (status, answer) = api
            .call("POST", "/v1/messages", T, Some(&body.to_string()))
            .await;
        assert_eq!(status, 201, "{answer}");
        if delay == "0s" {
            // One at a time, so that each finishes in a millisecond of its own.
            eventually(Duration::from_secs(10), id, || async {
                let (_, got) = api
                    .call("GET", &format!("/v1/messages/{id}"), T, None)
                    .await;
                (got["state"] == "delivered").then_some(())
            })
            .await;
        }
    }
    let (status, _) = api.call("DELETE", "/v1/messages/f3", T, None).await;
    assert_eq!(status, 200);
    let list = "/v1/streams/orders/finished";
    let (status, page) = api.call("GET", list, T, None).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        ids(&page),
        [
            "f3:cancelled",
            "f4:delivered",
            "f2:delivered",
            "f1:delivered"
        ],
        "{page}"
    );
    let first = &page["messages"][1];
    assert_eq!(first["written_to"], "orders", "{page}");
    assert_eq!(first["attempt"], 1, "{page}");
    assert!(
        first["entry_id"].as_str().is_some_and(|e| e.contains('-')),
        "{page}"
    );
    assert!(page["messages"][0].get("entry_id").is_none(), "{page}");
    assert_eq!(page["next"], Value::Null);

    // Pages of one, each going on from the one before.
    let mut shown = Vec::new();
    let mut path = format!("{list}?limit=1");
    loop {
        let (status, page) = api.call("GET", &path, T, None).await;
        assert_eq!(status, 200, "{page}");
        shown.extend(ids(&page));
        match page["next"].as_str() {
            Some(next) => path = format!("{list}?limit=1&after={}", next),
            None => break,
        }
        assert!(shown.len() <= 4, "{shown:?}");
    }
    assert_eq!(
        shown,
        [
            "f3:cancelled",
            "f4:delivered",
            "f2:delivered",
            "f1:delivered"
        ]
    );

    for (query, want) in [
        (
            "state=delivered",
            &["f4:delivered", "f2:delivered", "f1:delivered"][..],
        ),
        ("state=cancelled,expired", &["f3:cancelled"][..]),
        ("state=dead", &[][..]),
        (
            "key=order-1",
            &["f3:cancelled", "f4:delivered", "f1:delivered"][..],
        ),
        (
            "key=order-1&state=delivered",
            &["f4:delivered", "f1:delivered"][..],
        ),
        ("key=order-1&state=delivered&limit=1", &["f4:delivered"][..]),
        ("key=nobody", &[][..]),
    ] {
        let (status, page) = api.call("GET", &format!("{list}?{query}"), T, None).await;
        assert_eq!(status, 200, "{query}: {page}");
        assert_eq!(ids(&page), want, "{query}: {page}");
    }
    let (_, page) = api
        .call(
            "GET",
            &format!("{list}?key=order-1&state=delivered&limit=1"),
            T,
            None,
        )
        .await;
    let next = page["next"].as_str().expect("a next page").to_owned();
    let (_, page) = api
        .call(
            "GET",
            &format!("{list}?key=order-1&state=delivered&limit=1&after={}", next),
            T,
            None,
        )
        .await;
    assert_eq!(ids(&page), ["f1:delivered"], "{page}");

    for (path, status, names) in [
        (format!("{list}?state=gone"), 422, "state \"gone\""),
        (format!("{list}?limit=0"), 422, "limit 0"),
        (format!("{list}?limit=1001"), 422, "limit 1001"),
        (format!("{list}?after=nonsense"), 422, "after \"nonsense\""),
        (format!("{list}?key=a%20b"), 422, "key"),
        (format!("{list}?bogus=1"), 400, "bogus"),
        ("/v1/streams/payroll/finished".to_owned(), 403, "payroll"),
    ] {
        let (got, answer) = api.call("GET", &path, T, None).await;
        assert_eq!(got, status, "{path}: {answer}");
        assert!(
            answer["detail"].as_str().is_some_and(|d| d.contains(names)),
            "{path}: {answer}"
        );
    }
    let (status, _) = api.call("GET", list, None, None).await;
    assert_eq!(status, 401, "a token is needed");
}
