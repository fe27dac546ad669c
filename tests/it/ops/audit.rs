//! The audit trail: admin actions and cancels, refused ones too, recorded once each
//! with who (a token's fingerprint, never the token), from where, what, on what and
//! the answer; read at `GET /v1/admin/audit` (admin scope) and logged.

use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::{Api, delayq_bin, eventually};

const ADMIN: &str = "admin-Qx7-secret";
const WRITER: &str = "writer-Pk2-secret";
const READER: &str = "reader-Mz4-secret";

fn fingerprint(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("token:{hex}")
}

#[tokio::test]
async fn admin_actions_and_cancels_are_recorded_once_with_who_where_what_and_the_answer() {
    let redis = RedisServer::start().unwrap();
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 2\n[api]\ntokens = [\"{ADMIN}\"]\nwrite_tokens = [\"{WRITER}\"]\nread_tokens = [\"{READER}\"]\n",
        redis.url()
    );
    let node = DelayqProcess::start(&delayq_bin(), "audited", &config).unwrap();
    let api = |token: &str| Api::new(node.api).with_token(token);
    let push = json!({"id": "m1", "stream": "s", "payload": "x", "delay": "1h"});
    assert_eq!(api(WRITER).post("/v1/messages", push).await.0, 201);
    assert_eq!(
        api(ADMIN).post("/v1/streams/p/pause", json!({})).await.0,
        200
    );
    assert_eq!(api(WRITER).delete("/v1/messages/m1").await.0, 200);
    assert_eq!(api(READER).post("/v1/admin/resign", json!({})).await.0, 403);
    let (status, body) = api(READER).get("/v1/admin/audit").await;
    assert_eq!(status, 403, "a read token may not read the trail: {body}");

    let (status, body) = api(ADMIN).get("/v1/admin/audit").await;
    assert_eq!(status, 200, "{body}");
    let shown: Vec<(String, String, String, String, String)> = body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let f = |k: &str| e[k].as_str().unwrap_or("-").to_owned();
            (f("who"), f("from"), f("what"), f("target"), f("status"))
        })
        .collect();
    let entry = |token: &str, what: &str, target: &str, status: &str| {
        (
            fingerprint(token),
            "127.0.0.1".to_owned(),
            what.to_owned(),
            target.to_owned(),
            status.to_owned(),
        )
    };
    // Newest first; the push and the reads are not recorded.
    assert_eq!(
        shown,
        vec![
            entry(READER, "POST /v1/admin/resign", "/v1/admin/resign", "403"),
            entry(WRITER, "DELETE /v1/messages/{id}", "/v1/messages/m1", "200"),
            entry(
                ADMIN,
                "POST /v1/streams/{stream}/pause",
                "/v1/streams/p/pause",
                "200"
            ),
        ],
        "{body}"
    );
    let text = body.to_string();
    for token in [ADMIN, WRITER, READER] {
        assert!(!text.contains(token), "a token shown: {text}");
    }
    assert!(
        body["entries"][0]["at"]
            .as_str()
            .and_then(|a| a.parse::<u64>().ok())
            .is_some(),
        "{body}"
    );
    assert_eq!(body["next"], Value::Null, "{body}");

    // A page of one, and the next from its cursor.
    let (_, first) = api(ADMIN).get("/v1/admin/audit?limit=1").await;
    let next = first["next"].as_str().expect("a cursor").to_owned();
    let (_, second) = api(ADMIN)
        .get(&format!("/v1/admin/audit?limit=1&before={next}"))
        .await;
    assert_eq!(
        second["entries"][0]["what"], "DELETE /v1/messages/{id}",
        "{second}"
    );
    let (status, _) = api(ADMIN).get("/v1/admin/audit?limit=0").await;
    assert_eq!(status, 422);

    // Each is a log line too, never with the token.
    let log = eventually(Duration::from_secs(5), "the audit lines", || {
        let log = node.log();
        std::future::ready((log.matches("delayq::audit").count() >= 3).then_some(log))
    })
    .await;
    assert!(log.contains(&fingerprint(READER)), "{log}");
    for token in [ADMIN, WRITER, READER] {
        assert!(!log.contains(token), "a token in the log");
    }
}
