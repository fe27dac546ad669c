//! The HTTP API: every endpoint doing its job (push, batch, get, reschedule, cancel,
//! stats, the OpenAPI document), on a leader and on a standby.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use super::{T, TOKEN, strict};
use crate::support::{Env, assert_refused, entries, eventually};

#[tokio::test]
async fn push_batch_get_reschedule_cancel_and_delivery() {
    let env = Env::start(&strict("")).await;
    let (status, pushed) = env.api.call("POST", "/v1/messages", Some("second-token"), Some(r#"{"stream":"orders","fields":[["order","42"],["kind","reminder"]],"delay":"1h","id":"o-42"}"#)).await;
    assert_eq!(
        (status, pushed["state"].as_str()),
        (201, Some("scheduled")),
        "{pushed}"
    );

    let batch = json!({ "messages": [
        { "stream": "orders", "payload": "soon", "delay_ms": 100, "id": "o-soon" },
        { "stream": "billing", "payload": "x", "delay": "1s" },
        { "stream": "orders", "payload": "again", "delay": "1h", "id": "o-42" },
    ]});
    let (status, answer) = env
        .api
        .call(
            "POST",
            "/v1/messages/batch",
            Some(TOKEN),
            Some(&batch.to_string()),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (
            answer["scheduled"].as_u64(),
            answer["duplicates"].as_u64(),
            answer["failed"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{answer}"
    );
    let results = answer["results"].as_array().expect("results");
    assert_eq!(
        results
            .iter()
            .map(|r| r["index"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(
        (results[0]["status"].as_u64(), results[0]["id"].as_str()),
        (Some(201), Some("o-soon"))
    );
    assert_eq!(
        (results[1]["status"].as_u64(), results[1]["error"].as_str()),
        (Some(403), Some("stream_not_allowed"))
    );
    assert!(
        results[1]["detail"]
            .as_str()
            .unwrap()
            .starts_with("messages[1]: stream \"billing\""),
        "{}",
        results[1]
    );
    assert_eq!(
        (
            results[2]["status"].as_u64(),
            results[2]["duplicate"].as_bool()
        ),
        (Some(200), Some(true))
    );

    // The batch's short message arrives in its stream, once.
    let mut conn = env.redis.client();
    let delivered = eventually(Duration::from_secs(10), "o-soon delivered", || {
        let found = entries(&mut conn, "orders");
        async move { (!found.is_empty()).then_some(found) }
    })
    .await;
    assert_eq!(delivered.len(), 1);
    assert_eq!(
        (delivered[0].get("payload"), delivered[0].get("delayq-id")),
        (Some("soon"), Some("o-soon"))
    );

    let (status, got) = env
        .api
        .call("GET", "/v1/messages/o-42", Some(TOKEN), None)
        .await;
    assert_eq!(
        (status, got["state"].as_str(), got["fields"].clone()),
        (
            200,
            Some("scheduled"),
            json!([["order", "42"], ["kind", "reminder"]])
        )
    );
    let due_before = got["deliver_at"].as_u64().unwrap();

    let (status, moved) = env
        .api
        .call(
            "POST",
            "/v1/messages/o-42/reschedule",
            Some(TOKEN),
            Some(r#"{"delay":"30m"}"#),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    let due_after = moved["deliver_at"].as_u64().unwrap();
    assert!(
        due_after + 25 * 60_000 < due_before,
        "rescheduled earlier: {due_after} < {due_before}"
    );
    let (_, got) = env
        .api
        .call("GET", "/v1/messages/o-42", Some(TOKEN), None)
        .await;
    assert_eq!(got["deliver_at"].as_u64(), Some(due_after));

    let (status, _) = env
        .api
        .call("DELETE", "/v1/messages/o-42", Some(TOKEN), None)
        .await;
    assert_eq!(status, 200);
    let (status, answer) = env
        .api
        .call(
            "POST",
            "/v1/messages/o-42/reschedule",
            Some(TOKEN),
            Some(r#"{"delay":"1m"}"#),
        )
        .await;
    assert_refused(
        (status, &answer),
        (409, "already_final", "already cancelled"),
        "reschedule after cancel",
    );
    let (status, answer) = env
        .api
        .call("DELETE", "/v1/messages/o-soon", Some(TOKEN), None)
        .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("already_final")),
        "{answer}"
    );
    let (status, answer) = env
        .api
        .call(
            "POST",
            "/v1/messages/o-soon/reschedule",
            Some(TOKEN),
            Some(r#"{"delay":"1m"}"#),
        )
        .await;
    assert_eq!(status, 409, "{answer}");

    // A message whose id is "batch" stays reachable next to the batch endpoint.
    let (status, _) = env
        .api
        .call(
            "POST",
            "/v1/messages",
            Some(TOKEN),
            Some(r#"{"stream":"orders","payload":"x","delay":"1h","id":"batch"}"#),
        )
        .await;
    assert_eq!(status, 201);
    let (status, got) = env
        .api
        .call("GET", "/v1/messages/batch", Some(TOKEN), None)
        .await;
    assert_eq!((status, got["id"].as_str()), (200, Some("batch")));
    let (status, _) = env
        .api
        .call("DELETE", "/v1/messages/batch", Some(TOKEN), None)
        .await;
    assert_eq!(status, 200);

    // Open endpoints need no token.
    env.leading().await;
    for path in ["/healthz", "/leader", "/metrics"] {
        assert_eq!(env.api.status(path).await, Some(200), "{path}");
    }
    let (status, leader) = env.api.call("GET", "/v1/leader", Some(TOKEN), None).await;
    assert_eq!((status, leader["is_leader"].as_bool()), (200, Some(true)));
}

#[tokio::test]
async fn stats_count_pending_per_shard_and_stream_and_show_the_next_due_time() {
    let env = Env::start("").await;
    let before = env.store.now_ms().await.unwrap();
    let batch = json!({ "messages": [
        { "stream": "orders", "payload": "1", "delay": "10m" },
        { "stream": "orders", "payload": "2", "delay": "20m" },
        { "stream": "billing", "payload": "3", "delay": "5m" },
    ]});
    let (status, _) = env.api.post("/v1/messages/batch", batch).await;
    assert_eq!(status, 200);
    let (status, stats) = env.api.get("/v1/stats").await;
    assert_eq!(status, 200, "{stats}");
    let pending = &stats["pending"];
    assert_eq!(pending["total"].as_u64(), Some(3), "{stats}");
    assert_eq!(pending["per_shard"].as_array().map(Vec::len), Some(4));
    assert_eq!(
        pending["per_shard"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum::<u64>(),
        3
    );
    assert_eq!(pending["per_stream"], json!({ "billing": 1, "orders": 2 }));
    assert_eq!(pending["per_stream_exact"], json!(true));
    let next_due = pending["next_due"].as_u64().expect("next due");
    assert!(
        next_due >= before + 300_000 && next_due < before + 310_000,
        "{next_due} vs {before}"
    );
    assert!(pending["next_due_in_ms"].as_u64().unwrap() <= 300_000);
    assert_eq!(stats["leader"]["is_leader"], json!(true));
    assert_eq!(stats["node_id"].as_str(), Some(env.config.node_id.as_str()));
    assert_eq!(stats["inbox"]["stream"], json!("delayq:inbox"));
    assert!(stats["lateness_ms"].is_object(), "{stats}");

    // Forwarded messages show up in the lateness summary.
    let (status, _) = env
        .api
        .post(
            "/v1/messages",
            json!({ "stream": "orders", "payload": "now", "delay_ms": 0 }),
        )
        .await;
    assert_eq!(status, 201);
    let stats = eventually(Duration::from_secs(10), "lateness recorded", || async {
        let (_, stats) = env.api.get("/v1/stats").await;
        stats["lateness_ms"]["recent"]["count"]
            .as_u64()
            .is_some_and(|n| n >= 1)
            .then_some(stats)
    })
    .await;
    assert!(
        stats["lateness_ms"]["recent"]["p99"].as_u64().is_some(),
        "{stats}"
    );
}

/// Every documented operation is routed (answers something other than "no such
/// endpoint" or "method not allowed"), and the document is served as JSON.
#[tokio::test]
async fn the_openapi_document_describes_every_served_endpoint() {
    let env = Env::start(&strict("")).await;
    let (status, doc) = env
        .api
        .call("GET", "/v1/openapi.json", Some(TOKEN), None)
        .await;
    assert_eq!(status, 200);
    // Generated by utoipa, which writes OpenAPI 3.1.
    assert_eq!(doc["openapi"].as_str(), Some("3.1.0"));
    let mut seen = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in ["get", "post", "delete"] {
            if item.get(method).is_none() {
                continue;
            }
            let concrete = path
                .replace("{id}", "doc-probe")
                .replace("{stream}", "orders");
            let query = if concrete.ends_with("/next") {
                "?group=g&consumer=c&wait=0"
            } else {
                ""
            };
            let body = (method == "post").then_some("{}");
            let (status, answer) = env
                .api
                .call(
                    &method.to_uppercase(),
                    &format!("{concrete}{query}"),
                    Some(TOKEN),
                    body,
                )
                .await;
            assert!(
                status != 405 && answer["detail"] != json!("no such endpoint"),
                "{method} {path}: {status} {answer}"
            );
            seen.insert(format!("{method} {path}"));
        }
    }
    for must in [
        "post /v1/messages/batch",
        "post /v1/messages/{id}/reschedule",
        "get /v1/stats",
        "get /v1/streams/{stream}/next",
        "post /v1/streams/{stream}/ack",
        "get /v1/openapi.json",
    ] {
        assert!(seen.contains(must), "{must} documented");
    }
}

/// Any instance takes writes: a standby (fenced out by a newer standalone instance)
/// stores a push, and the leader delivers it.
#[tokio::test]
async fn a_standby_accepts_writes_and_the_leader_delivers_them() {
    let mut env = Env::start("").await;
    let leader = delayq::start(env.config.clone())
        .await
        .expect("second instance");
    let standby = env.daemon.as_ref().expect("running");
    eventually(
        Duration::from_secs(10),
        "the first instance is fenced out",
        || async { (!standby.leadership.current().is_leader()).then_some(()) },
    )
    .await;
    let (status, pushed) = env
        .api
        .post(
            "/v1/messages",
            json!({ "stream": "jobs", "payload": "via standby", "delay_ms": 50 }),
        )
        .await;
    assert_eq!(status, 201, "{pushed}");
    let mut conn = env.redis.client();
    let got = eventually(Duration::from_secs(10), "delivered by the leader", || {
        let found = entries(&mut conn, "jobs");
        async move { (!found.is_empty()).then_some(found) }
    })
    .await;
    assert_eq!(got[0].get("payload"), Some("via standby"));
    leader.stop().await;
    env.stop().await;
}

#[tokio::test]
async fn redis_down_is_503_for_single_and_batch_pushes() {
    let mut env = Env::start("").await;
    env.redis.kill();
    let cases = [
        (
            "/v1/messages",
            json!({ "stream": "orders", "payload": "x", "delay": "1s" }),
        ),
        (
            "/v1/messages/batch",
            json!({ "messages": [{ "stream": "orders", "payload": "x", "delay": "1s" }] }),
        ),
    ];
    for (path, body) in cases {
        let (status, answer) = env.api.post(path, body).await;
        assert_refused(
            (status, &answer),
            (503, "unavailable", "storage unavailable"),
            path,
        );
    }
    env.stop().await;
}

/// Shows what a batch answer looks like when it has no failures, for the README.
#[tokio::test]
async fn a_clean_batch_schedules_every_item() {
    let env = Env::start("").await;
    let messages: Vec<Value> = (0..50)
        .map(|i| json!({ "stream": "orders", "payload": format!("m{i}"), "delay": "1h" }))
        .collect();
    let (status, answer) = env
        .api
        .post("/v1/messages/batch", json!({ "messages": messages }))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        (answer["scheduled"].as_u64(), answer["failed"].as_u64()),
        (Some(50), Some(0)),
        "{answer}"
    );
    let ids: BTreeSet<&str> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 50);
    assert_eq!(env.scheduled().await, 50);
}

/// An id repeated within one batch follows the same rules as across requests.
#[tokio::test]
async fn an_id_repeated_in_a_batch_is_a_duplicate_unless_replaced() {
    let env = Env::start("").await;
    let batch = json!({ "messages": [
        { "stream": "orders", "payload": "first", "delay": "1h", "id": "twin" },
        { "stream": "orders", "payload": "second", "delay": "1h", "id": "twin" },
        { "stream": "orders", "payload": "third", "delay": "2h", "id": "twin", "replace": true },
    ]});
    let (status, answer) = env.api.post("/v1/messages/batch", batch).await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().unwrap();
    assert_eq!(
        (results[0]["status"].as_u64(), results[0]["state"].as_str()),
        (Some(201), Some("scheduled"))
    );
    assert_eq!(
        (
            results[1]["duplicate"].as_bool(),
            results[1]["state"].as_str()
        ),
        (Some(true), Some("scheduled"))
    );
    assert_eq!(results[1]["deliver_at"], results[0]["deliver_at"]);
    assert_eq!(results[2]["replaced"].as_bool(), Some(true));
    let (_, got) = env.api.get("/v1/messages/twin").await;
    assert_eq!(got["fields"], json!([["payload", "third"]]));
    assert_eq!(got["deliver_at"], results[2]["deliver_at"]);
    assert_eq!(env.scheduled().await, 1);
}

/// An entry id no stream can hold past: nothing comes after it, and asking is no error.
#[tokio::test]
async fn dead_letters_after_the_last_possible_id_are_none() {
    let env = Env::start(&strict("")).await;
    let last = "18446744073709551615-18446744073709551615";
    let (status, answer) = env
        .api
        .call(
            "GET",
            &format!("/v1/streams/orders/dead?after={last}"),
            T,
            None,
        )
        .await;
    assert_eq!(
        (status, answer["entries"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{answer}"
    );
    let body = format!(r#"{{"all":true,"after":"{last}"}}"#);
    let (status, answer) = env
        .api
        .call("POST", "/v1/streams/orders/dead/purge", T, Some(&body))
        .await;
    assert_eq!(
        (status, answer["purged"].as_u64()),
        (200, Some(0)),
        "{answer}"
    );
}

/// Dead letters chosen by their reason and when they died: counted first
/// (`dry_run`, nothing changes), then replayed or purged, and only those.
#[tokio::test]
async fn dead_letters_are_replayed_and_purged_by_reason_and_time() {
    let env = Env::start(&strict("")).await;
    let mut conn = env.redis.client();
    for (entry, id, reason) in [
        ("1000-0", "e1", "expired"),
        ("2000-0", "e2", "expired"),
        ("2500-0", "m1", "max_attempts"),
        ("3000-0", "e3", "expired"),
        ("4000-0", "c1", "cannot write to orders: WRONGTYPE"),
    ] {
        let _: String = redis::cmd("XADD")
            .arg("orders:dead")
            .arg(entry)
            .arg(&["payload", id, "delayq-id", id, "delayq-reason", reason])
            .query(&mut conn)
            .unwrap();
    }
    let post = |path: &'static str, body: Value| {
        let api = &env.api;
        async move {
            let (status, answer) = api.call("POST", path, T, Some(&body.to_string())).await;
            assert_eq!(status, 200, "{path} {body}: {answer}");
            answer
        }
    };
    const REPLAY: &str = "/v1/streams/orders/dead/replay";
    const PURGE: &str = "/v1/streams/orders/dead/purge";
    let counted = post(
        REPLAY,
        json!({ "all": true, "reason": "expired", "since": 1500, "until": 3000, "dry_run": true }),
    )
    .await;
    assert_eq!(
        (counted["matched"].as_u64(), counted["dry_run"].as_bool()),
        (Some(2), Some(true)),
        "{counted}"
    );
    assert_eq!(counted["replayed"], json!([]), "{counted}");
    let counted = post(
        PURGE,
        json!({ "all": true, "reason": "cannot write", "dry_run": true }),
    )
    .await;
    assert_eq!(
        (counted["matched"].as_u64(), counted["purged"].as_u64()),
        (Some(1), Some(0)),
        "{counted}"
    );
    let dead = |conn: &mut redis::Connection| -> Vec<String> {
        entries(conn, "orders:dead")
            .iter()
            .map(|e| e.get("delayq-id").unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        dead(&mut conn),
        ["e1", "e2", "m1", "e3", "c1"],
        "nothing changed"
    );
    let (code, said) = super::delayq_says(
        &env,
        &[
            "dead",
            "replay",
            "orders",
            "--all",
            "--reason",
            "expired",
            "--since",
            "1970-01-01T00:00:01.500Z",
            "--dry-run",
        ],
    )
    .await;
    assert_eq!(
        (code, said.trim()),
        (0, "would replay 2 dead letter(s) of orders")
    );
    let (code, said) = super::delayq_says(
        &env,
        &["dead", "purge", "orders", "--id", "e1", "--reason", "x"],
    )
    .await;
    assert!(
        code == 1 && said.contains("reason: only with \"all\""),
        "{code}: {said}"
    );
    assert_eq!(dead(&mut conn).len(), 5, "nothing changed");

    let replayed = post(
        REPLAY,
        json!({ "all": true, "reason": "expired", "since": 1500 }),
    )
    .await;
    let ids: Vec<&str> = replayed["replayed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["e2", "e3"], "{replayed}");
    let purged = post(PURGE, json!({ "all": true, "until": 2600 })).await;
    assert_eq!(purged["purged"].as_u64(), Some(2), "{purged}");
    assert_eq!(dead(&mut conn), ["c1"]);
    eventually(Duration::from_secs(10), "e2 and e3 delivered", || {
        let got: BTreeSet<String> = entries(&mut env.redis.client(), "orders")
            .iter()
            .filter_map(|e| e.get("delayq-id").map(str::to_owned))
            .collect();
        std::future::ready(
            (got.len() == 2 && got.contains("e2") && got.contains("e3")).then_some(()),
        )
    })
    .await;
}
