//! Tokens limited to streams (`streams=` on a line of a tokens file), against a
//! real daemon: a stream it does not reach is refused 403 by every endpoint that
//! names one, a message of such a stream is unknown to it (404, never its
//! contents, never changed), lists show only its streams, and the tokens files are
//! read again at SIGHUP, the change recorded in the audit trail by name.

use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};
use serde_json::{Value, json};

use crate::support::{Api, delayq_bin, eventually};

const ADMIN: &str = "admin-T9q-secret";
const BILLING: &str = "billing-W3k-secret";
const BILLING_READER: &str = "billing-R8z-secret";
const EVERYONE: &str = "everyone-W5n-secret";

/// One request by the billing writer: method, path, body, the status it gets and
/// the error code (None: not an error).
type Case = (
    &'static str,
    &'static str,
    Option<Value>,
    u16,
    Option<&'static str>,
);

fn cases() -> Vec<Case> {
    let push = |id: &str, stream: &str| {
        Some(json!({"id": id, "stream": stream, "payload": "x", "delay": "1h"}))
    };
    let reschedule = Some(json!({"delay": "2h"}));
    vec![
        (
            "POST",
            "/v1/messages",
            push("o2", "orders"),
            403,
            Some("stream_not_permitted"),
        ),
        ("POST", "/v1/messages", push("b2", "billing.eu"), 201, None),
        // An id made here is nobody's yet.
        (
            "POST",
            "/v1/messages",
            Some(json!({"stream": "billing", "payload": "x", "delay": "1h"})),
            201,
            None,
        ),
        // An id of another stream's message is not taken over, nor its message shown.
        (
            "POST",
            "/v1/messages",
            push("o1", "billing"),
            409,
            Some("id_taken"),
        ),
        ("GET", "/v1/messages/o1", None, 404, Some("not_found")),
        ("GET", "/v1/messages/b1", None, 200, None),
        (
            "POST",
            "/v1/messages/o1/reschedule",
            reschedule.clone(),
            404,
            Some("not_found"),
        ),
        ("POST", "/v1/messages/b1/reschedule", reschedule, 200, None),
        ("DELETE", "/v1/messages/o1", None, 404, Some("not_found")),
        (
            "GET",
            "/v1/streams/orders/next?group=g&consumer=c",
            None,
            403,
            Some("stream_not_permitted"),
        ),
        (
            "POST",
            "/v1/streams/orders/ack",
            Some(json!({"group": "g", "ids": ["1-0"]})),
            403,
            Some("stream_not_permitted"),
        ),
        (
            "GET",
            "/v1/streams/orders/dead",
            None,
            403,
            Some("stream_not_permitted"),
        ),
        (
            "GET",
            "/v1/upcoming?stream=orders",
            None,
            403,
            Some("stream_not_permitted"),
        ),
        ("GET", "/v1/streams/billing/dead", None, 200, None),
        (
            "GET",
            "/v1/streams/orders/keys/k1",
            None,
            403,
            Some("stream_not_permitted"),
        ),
        (
            "DELETE",
            "/v1/streams/orders/keys/k1",
            None,
            403,
            Some("stream_not_permitted"),
        ),
        ("GET", "/v1/streams/billing/keys/k1", None, 200, None),
        ("DELETE", "/v1/streams/billing/keys/k1", None, 200, None),
    ]
}

async fn call(api: &Api, (method, path, body, _, _): &Case) -> (u16, Value) {
    match (*method, body) {
        ("GET", _) => api.get(path).await,
        ("DELETE", _) => api.delete(path).await,
        (_, Some(body)) => api.post(path, body.clone()).await,
        (_, None) => api.post(path, json!({})).await,
    }
}

fn tokens_file(dir: &std::path::Path, name: &str, lines: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, lines).unwrap();
    path.display().to_string()
}

#[tokio::test]
async fn a_token_reaches_only_its_streams_and_tokens_change_at_sighup() {
    let redis = RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let write_file = tokens_file(
        dir.path(),
        "write",
        &format!(
            "# team tokens\n{BILLING} name=billing streams=billing,billing.*\n{EVERYONE} name=everyone\n"
        ),
    );
    let read_file = tokens_file(
        dir.path(),
        "read",
        &format!("{BILLING_READER} name=billing-reader streams=billing\n"),
    );
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 2\n[api]\ntokens = [\"{ADMIN}\"]\n\
         write_tokens_file = \"{write_file}\"\nread_tokens_file = \"{read_file}\"\n",
        redis.url()
    );
    let node = DelayqProcess::start(&delayq_bin(), "limited", &config).unwrap();
    let api = |token: &str| Api::new(node.api).with_token(token);
    for (id, stream) in [("o1", "orders"), ("b1", "billing")] {
        let body = json!({"id": id, "stream": stream, "payload": "secret-payload", "delay": "1h"});
        assert_eq!(api(EVERYONE).post("/v1/messages", body).await.0, 201);
    }

    for case in cases() {
        let (status, answer) = call(&api(BILLING), &case).await;
        let what = format!("{} {}: {answer}", case.0, case.1);
        assert_eq!(status, case.3, "{what}");
        assert_eq!(answer["error"].as_str(), case.4, "{what}");
        assert!(
            !answer.to_string().contains("secret-payload") || case.1.ends_with("b1"),
            "{what}"
        );
        if case.4 == Some("stream_not_permitted") {
            let detail = answer["detail"].as_str().unwrap();
            assert!(
                detail.contains("\"orders\"") && detail.contains("billing"),
                "{detail}"
            );
        }
    }
    // Nothing of orders changed: o1 is as pushed.
    let (status, o1) = api(ADMIN).get("/v1/messages/o1").await;
    assert_eq!(
        (status, o1["state"].as_str()),
        (200, Some("scheduled")),
        "{o1}"
    );
    assert_eq!(o1["stream"], "orders", "{o1}");

    // A batch: the item for a stream out of reach is refused, the others taken.
    let (status, answer) = api(BILLING)
        .post(
            "/v1/messages/batch",
            json!({"messages": [
                {"stream": "orders", "payload": "x", "delay": "1h"},
                {"stream": "billing", "payload": "x", "delay": "1h"},
                {"id": "o1", "stream": "billing", "payload": "x", "delay": "1h"},
                {"stream": "billing", "payload": "x", "delay": "1h"},
                {"id": "b3", "stream": "billing", "payload": "x", "delay": "1h"},
            ]}),
        )
        .await;
    assert_eq!((status, &answer["scheduled"]), (200, &json!(3)), "{answer}");
    let errors: Vec<&str> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["error"].as_str())
        .collect();
    assert_eq!(errors, ["stream_not_permitted", "id_taken"], "{answer}");

    // Lists show only the streams the token reaches; the reader is limited too.
    // (The table lists a stream once the leader has counted it.)
    eventually(Duration::from_secs(30), "both streams counted", || async {
        let table = api(ADMIN).get("/v1/streams").await.1.to_string();
        (table.contains("\"orders\"") && table.contains("\"billing\"")).then_some(())
    })
    .await;
    for token in [BILLING, BILLING_READER] {
        let (_, upcoming) = api(token).get("/v1/upcoming").await;
        let streams: Vec<&str> = upcoming["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["stream"].as_str().unwrap())
            .collect();
        assert!(
            !streams.is_empty() && !streams.contains(&"orders"),
            "{upcoming}"
        );
        let (_, table) = api(token).get("/v1/streams").await;
        let names: Vec<&str> = table["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["stream"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"billing") && !names.contains(&"orders"),
            "{table}"
        );
        let (_, stats) = api(token).get("/v1/stats").await;
        assert_eq!(
            stats["pending"]["per_stream"].get("orders"),
            None,
            "{stats}"
        );
    }
    let (_, session) = api(BILLING).get("/v1/session").await;
    assert_eq!(
        session["streams"],
        json!(["billing", "billing.*"]),
        "{session}"
    );
    let (_, session) = api(EVERYONE).get("/v1/session").await;
    assert_eq!(session["streams"], Value::Null, "{session}");
    // The reader may look, not write, within its streams.
    assert_eq!(api(BILLING_READER).get("/v1/messages/o1").await.0, 404);
    assert_eq!(api(BILLING_READER).get("/v1/messages/b1").await.0, 200);

    // A cancel is recorded by the token's name.
    assert_eq!(api(BILLING).delete("/v1/messages/b2").await.0, 200);
    let (_, trail) = api(ADMIN).get("/v1/admin/audit").await;
    let cancel = &trail["entries"][0];
    assert_eq!(
        (cancel["who"].as_str(), cancel["target"].as_str()),
        (Some("billing"), Some("/v1/messages/b2")),
        "{trail}"
    );
    // Its record names the stream: the canceller sees it cancelled, a token of
    // "billing" alone does not see it at all.
    let (status, cancelled) = api(BILLING).get("/v1/messages/b2").await;
    assert_eq!(
        (
            status,
            cancelled["state"].as_str(),
            cancelled["stream"].as_str()
        ),
        (200, Some("cancelled"), Some("billing.eu")),
        "{cancelled}"
    );
    assert_eq!(api(BILLING_READER).get("/v1/messages/b2").await.0, 404);

    // SIGHUP: the billing token is withdrawn, a new one comes, nothing restarts.
    const NEW: &str = "billing-N4v-secret";
    std::fs::write(
        &write_file,
        format!("{NEW} name=billing-2 streams=billing\n{EVERYONE} name=everyone\n"),
    )
    .unwrap();
    node.signal(libc::SIGHUP);
    eventually(Duration::from_secs(10), "the tokens reloaded", || async {
        (api(BILLING).get("/v1/messages/b1").await.0 == 401).then_some(())
    })
    .await;
    assert_eq!(api(NEW).get("/v1/messages/b1").await.0, 200);
    assert_eq!(api(NEW).get("/v1/messages/o1").await.0, 404);
    let (_, trail) = api(ADMIN).get("/v1/admin/audit").await;
    let change = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["what"] == "tokens changed")
        .unwrap_or_else(|| panic!("no token change in {trail}"));
    let target = change["target"].as_str().unwrap();
    assert_eq!(change["who"], "SIGHUP", "{change}");
    assert!(target.starts_with("api.write_tokens: "), "{target}");
    assert!(
        target.contains("billing (streams=billing,billing.*)")
            && target.contains("billing-2 (streams=billing)"),
        "{target}"
    );
    let log = node.full_log();
    for secret in [ADMIN, BILLING, BILLING_READER, EVERYONE, NEW] {
        assert!(
            !log.contains(secret) && !trail.to_string().contains(secret),
            "{secret} shown"
        );
    }
}
