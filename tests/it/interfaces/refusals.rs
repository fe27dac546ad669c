//! Refusals: every bad input to the HTTP API answered with the right status, an
//! error code and a detail naming the problem, whoever sends it.

use std::time::Duration;

use serde_json::{Value, json};

use super::{T, TOKEN, strict};
use crate::support::{Env, assert_refused, entries};

/// One bad (or good) request and what it must be answered with.
struct Case {
    line: u32,
    method: &'static str,
    path: &'static str,
    token: Option<&'static str>,
    body: Option<String>,
    status: u16,
    code: &'static str,
    detail: &'static str,
}

fn case(
    line: u32,
    method: &'static str,
    path: &'static str,
    token: Option<&'static str>,
    body: Option<&str>,
    (status, code, detail): (u16, &'static str, &'static str),
) -> Case {
    Case {
        line,
        method,
        path,
        token,
        body: body.map(str::to_owned),
        status,
        code,
        detail,
    }
}

async fn check(env: &Env, c: &Case) {
    let (status, answer) = env
        .api
        .call(c.method, c.path, c.token, c.body.as_deref())
        .await;
    assert_refused(
        (status, &answer),
        (c.status, c.code, c.detail),
        &format!("case at line {}: {} {}", c.line, c.method, c.path),
    );
}

#[tokio::test]
async fn bad_inputs_get_the_right_status_and_name_the_problem() {
    let env = Env::start(&strict("")).await;
    let far = (jiff::Timestamp::now().as_millisecond() + 3 * 3_600_000).to_string();
    let far_at = format!(r#"{{"stream":"orders","payload":"x","deliver_at":{far}}}"#);
    let big_payload = format!(
        r#"{{"stream":"orders","payload":"{}","delay":"1s"}}"#,
        "x".repeat(2000)
    );
    let huge_body = format!(
        r#"{{"stream":"orders","payload":"{}","delay":"1s"}}"#,
        "x".repeat(80_000)
    );
    let item = r#"{"stream":"orders","payload":"x","delay":"1s"}"#;
    let four = format!(r#"{{"messages":[{item},{item},{item},{item}]}}"#);
    let big_batch = format!(
        r#"{{"messages":[{{"stream":"orders","payload":"{}","delay":"1s"}}]}}"#,
        "x".repeat(5000)
    );
    let huge_ack = format!(r#"{{"group":"g","ids":["{}"]}}"#, "1".repeat(1 << 20));
    let beyond = "below 2^64";
    #[rustfmt::skip]
    let cases = [
        // authentication
        case(line!(), "POST", "/v1/messages", None, Some(item), (401, "missing_token", "Authorization: Bearer")),
        case(line!(), "POST", "/v1/messages", Some("wrong"), Some(item), (401, "invalid_token", "not one of api.tokens")),
        case(line!(), "GET", "/v1/stats", None, None, (401, "missing_token", "api.tokens")),
        case(line!(), "GET", "/v1/openapi.json", Some("t0ken-for-test"), None, (401, "invalid_token", "api.tokens")),
        case(line!(), "GET", "/v1/no-such-thing", None, None, (401, "missing_token", "api.tokens")),
        // malformed bodies and wrong types
        case(line!(), "POST", "/v1/messages", T, Some("{not json"), (400, "malformed_json", "body is not valid JSON")),
        case(line!(), "POST", "/v1/messages", T, Some("[1, 2]"), (400, "malformed_json", "body must be a JSON object")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":5,"payload":"x","delay":"1s"}"#), (422, "invalid_field", "stream: must be a string")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"payload":"x","delay":"1s"}"#), (422, "invalid_field", "stream: required")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","delay":"1s"}"#), (422, "invalid_field", "fields: required")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","fields":{"a":[1]},"delay":"1s"}"#), (422, "invalid_field", "fields.a: must be a string")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","delay":5}"#), (422, "invalid_field", "delay: must be text such as \"20m\"")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","delay":"soon"}"#), (422, "invalid_field", "delay: \"soon\" is not a duration")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","colour":"red","delay":"1s"}"#), (422, "invalid_field", "colour: unknown field")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","delay":"1s","replace":"yes"}"#), (422, "invalid_field", "replace: must be true or false")),
        // delays: negative, too long, ambiguous
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","delay":"-5s"}"#), (422, "invalid_field", "delay \"-5s\": must not be negative")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","delay_ms":-5}"#), (422, "invalid_field", "delay_ms -5: must not be negative")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","delay":"2h"}"#), (422, "invalid_field", "longer than api.max_delay 1h")),
        case(line!(), "POST", "/v1/messages", T, Some(&far_at), (422, "invalid_field", "more than api.max_delay (1h) after now")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","delay":"1s","delay_ms":5}"#), (422, "invalid_field", "delay, delay_ms: give only one")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x"}"#), (422, "invalid_field", "delay: required")),
        // ids, priorities, streams, sizes
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","delay":"1s","id":"a b"}"#), (422, "invalid_field", "id \"a b\": character ' ' is not allowed")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","delay":"1s","priority":12}"#), (422, "invalid_field", "priority 12: must be an integer from 0 to 9")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","payload":"x","delay":"1s","ttl":"600000000y"}"#), (422, "invalid_field", "the most a ttl can be")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"billing","payload":"x","delay":"1s"}"#), (403, "stream_not_allowed", "stream \"billing\": not allowed (allowed: orders*, jobs)")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"delayq:inbox","payload":"x","delay":"1s"}"#), (403, "stream_not_allowed", "delayq's own keys")),
        case(line!(), "POST", "/v1/messages", T, Some(&big_payload), (413, "too_large", "more than api.max_message_bytes 1000")),
        case(line!(), "POST", "/v1/messages", T, Some(&huge_body), (413, "too_large", "request body is larger than")),
        case(line!(), "GET", "/v1/messages/a%20b", T, None, (400, "invalid_id", "id \"a b\"")),
        case(line!(), "GET", "/v1/messages/%FF", T, None, (400, "bad_request", "UTF-8")),
        case(line!(), "GET", "/v1/messages/never-pushed", T, None, (404, "not_found", "message never-pushed: unknown")),
        case(line!(), "DELETE", "/v1/messages/never-pushed", T, None, (404, "not_found", "message never-pushed: unknown")),
        // batches
        case(line!(), "POST", "/v1/messages/batch", T, Some(&four), (413, "batch_too_large", "messages: 4 items is more than api.max_batch 3")),
        case(line!(), "POST", "/v1/messages/batch", T, Some(&big_batch), (413, "too_large", "request body is larger than 4096 bytes")),
        case(line!(), "POST", "/v1/messages/batch", T, Some(r#"{"messages":[]}"#), (422, "invalid_field", "messages: must hold at least one")),
        case(line!(), "POST", "/v1/messages/batch", T, Some(r#"{"messages":"x"}"#), (422, "invalid_field", "messages: must be a list")),
        case(line!(), "POST", "/v1/messages/batch", T, Some("{}"), (422, "invalid_field", "messages: required")),
        case(line!(), "POST", "/v1/messages/batch", T, Some("[]"), (400, "malformed_json", "must be a JSON object")),
        case(line!(), "POST", "/v1/messages/batch", T, Some("{\"messages\": ["), (400, "malformed_json", "not valid JSON")),
        // reschedule
        case(line!(), "POST", "/v1/messages/never-pushed/reschedule", T, Some(r#"{"delay":"1m"}"#), (404, "not_found", "message never-pushed: unknown")),
        case(line!(), "POST", "/v1/messages/x/reschedule", T, Some(r#"{"delay":"-1m"}"#), (422, "invalid_field", "must not be negative")),
        case(line!(), "POST", "/v1/messages/x/reschedule", T, Some(r#"{"delay":"3h"}"#), (422, "invalid_field", "longer than api.max_delay 1h")),
        case(line!(), "POST", "/v1/messages/x/reschedule", T, Some(r#"{"when":"1m"}"#), (422, "invalid_field", "when: unknown field (known: delay, delay_ms, deliver_at)")),
        case(line!(), "POST", "/v1/messages/x/reschedule", T, Some("{}"), (422, "invalid_field", "delay: required")),
        case(line!(), "POST", "/v1/messages/a%20b/reschedule", T, Some(r#"{"delay":"1m"}"#), (400, "invalid_id", "id \"a b\"")),
        // long polls and acks
        case(line!(), "GET", "/v1/streams/orders/next?consumer=c", T, None, (422, "invalid_field", "group: required")),
        case(line!(), "GET", "/v1/streams/orders/next?group=g", T, None, (422, "invalid_field", "consumer: required")),
        case(line!(), "GET", "/v1/streams/orders/next?group=g&consumer=c&wait=10s", T, None, (422, "invalid_field", "wait 10s: longer than api.max_wait 5s")),
        case(line!(), "GET", "/v1/streams/orders/next?group=g&consumer=c&wait=-1s", T, None, (422, "invalid_field", "wait \"-1s\": must not be negative")),
        case(line!(), "GET", "/v1/streams/orders/next?group=g&consumer=c&count=0", T, None, (422, "invalid_field", "count \"0\": must be an integer from 1 to 1000")),
        case(line!(), "GET", "/v1/streams/orders/next?group=g&consumer=c&colour=red", T, None, (400, "bad_query", "colour: unknown parameter")),
        case(line!(), "GET", "/v1/streams/orders/next?group=a%20b&consumer=c", T, None, (422, "invalid_field", "group \"a b\"")),
        case(line!(), "GET", "/v1/streams/billing/next?group=g&consumer=c", T, None, (403, "stream_not_allowed", "stream \"billing\": not allowed")),
        case(line!(), "POST", "/v1/streams/orders/ack", T, Some(r#"{"group":"g","ids":["x"]}"#), (422, "invalid_field", "ids[0] \"x\": not a stream entry id")),
        case(line!(), "POST", "/v1/streams/orders/ack", T, Some(r#"{"group":"g","ids":[]}"#), (422, "invalid_field", "ids: must hold 1 to 10000")),
        case(line!(), "POST", "/v1/streams/orders/ack", T, Some(r#"{"ids":["1-0"]}"#), (422, "invalid_field", "group: required")),
        case(line!(), "POST", "/v1/streams/orders/ack", T, Some("nope"), (400, "malformed_json", "not valid JSON")),
        case(line!(), "POST", "/v1/streams/billing/ack", T, Some(r#"{"group":"g","ids":["1-0"]}"#), (403, "stream_not_allowed", "not allowed")),
        case(line!(), "POST", "/v1/streams/orders/ack", T, Some(r#"{"group":"g","ids":["99999999999999999999999-0"]}"#), (422, "invalid_field", beyond)),
        case(line!(), "POST", "/v1/streams/orders/ack", T, Some(r#"{"group":"g","ids":["1-0","18446744073709551616-0"]}"#), (422, "invalid_field", "ids[1] \"18446744073709551616-0\"")),
        case(line!(), "POST", "/v1/streams/orders/ack", T, Some(r#"{"group":"g","ids":["1-18446744073709551616"]}"#), (422, "invalid_field", beyond)),
        case(line!(), "POST", "/v1/streams/orders/ack", T, Some(&huge_ack), (413, "too_large", "request body is larger than")),
        case(line!(), "GET", "/v1/streams/orders/next?group=g&consumer=c&count=99999999999999999999999", T, None, (422, "invalid_field", "must be an integer from 1 to 1000")),
        // dead letters
        case(line!(), "GET", "/v1/streams/orders/dead?after=99999999999999999999999-0", T, None, (422, "invalid_field", beyond)),
        case(line!(), "GET", "/v1/streams/orders/dead?after=18446744073709551616-0", T, None, (422, "invalid_field", beyond)),
        case(line!(), "GET", "/v1/streams/orders/dead?after=1-18446744073709551616", T, None, (422, "invalid_field", beyond)),
        case(line!(), "GET", "/v1/streams/orders/dead?limit=many", T, None, (400, "bad_query", "limit")),
        // bytes that are not UTF-8 once decoded would read as U+FFFD: two names as one
        case(line!(), "GET", "/v1/streams/orders/next?group=%FF&consumer=c&wait=0", T, None, (400, "bad_query", "not UTF-8")),
        case(line!(), "GET", "/v1/streams/orders/next?group=g&consumer=%C3&wait=0", T, None, (400, "bad_query", "not UTF-8")),
        case(line!(), "GET", "/v1/streams/orders/dead?after=%FE", T, None, (400, "bad_query", "not UTF-8")),
        case(line!(), "GET", "/v1/upcoming?stream=orders%FF", T, None, (400, "bad_query", "not UTF-8")),
        case(line!(), "GET", "/v1/streams/orders/dead?limt=5", T, None, (400, "bad_query", "limt: unknown parameter (known: ")),
        case(line!(), "GET", "/v1/upcoming?stream=orders&limt=5", T, None, (400, "bad_query", "limt: unknown parameter (known: ")),
        case(line!(), "GET", "/v1/stats?foo=1", T, None, (400, "bad_query", "foo: unknown parameter (this endpoint takes none)")),
        case(line!(), "GET", "/v1/stats?foo=1", None, None, (401, "missing_token", "api.tokens")),
        case(line!(), "GET", "/v1/streams/orders/dead?limit=many", T, None, (400, "bad_query", "limit: invalid digit")),
        case(line!(), "POST", "/v1/streams/orders/dead/replay", T, Some(r#"{"all":true,"after":"18446744073709551616-0"}"#), (422, "invalid_field", beyond)),
        case(line!(), "POST", "/v1/streams/orders/dead/purge", T, Some(r#"{"all":true,"after":"1-18446744073709551616"}"#), (422, "invalid_field", beyond)),
        case(line!(), "POST", "/v1/streams/orders/dead/purge", T, Some("{\"all\":"), (400, "malformed_json", "not valid JSON")),
        // axum's own refusals, as JSON
        case(line!(), "PUT", "/v1/messages", T, Some(item), (405, "method_not_allowed", "allowed: POST")),
        case(line!(), "GET", "/v1/messages", T, None, (405, "method_not_allowed", "method not allowed")),
        case(line!(), "DELETE", "/v1/streams/orders/dead", T, None, (405, "method_not_allowed", "allowed: GET")),
        case(line!(), "GET", "/v1/streams/orders/ack", T, None, (405, "method_not_allowed", "allowed: POST")),
        case(line!(), "GET", "/nowhere", None, None, (404, "not_found", "no such endpoint")),
        case(line!(), "GET", "/v1/nowhere", T, None, (404, "not_found", "no such endpoint")),
        case(line!(), "GET", "/v1/streams/%FF/dead", T, None, (400, "bad_request", "UTF-8")),
        // fields named like those delayq writes
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","fields":{"a":"1","delayq-id":"x"},"delay":"1s"}"#), (422, "invalid_field", "field name \"delayq-id\" is reserved")),
        case(line!(), "POST", "/v1/messages", T, Some(r#"{"stream":"orders","fields":[["delayq-attempt","2"]],"delay":"1s"}"#), (422, "invalid_field", "field name \"delayq-attempt\" is reserved")),
    ];
    for c in &cases {
        check(&env, c).await;
    }
}

/// One rule for every operation the OpenAPI document lists: a query parameter it
/// does not take is `400 bad_query`, naming the parameter, before the operation
/// reads its body or does anything.
#[tokio::test]
async fn every_operation_refuses_a_query_parameter_it_does_not_take() {
    let env = Env::start(&strict("")).await;
    let (status, doc) = env.api.call("GET", "/v1/openapi.json", T, None).await;
    assert_eq!(status, 200, "{doc}");
    let mut walked = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let path = path
            .replace("{stream}", "orders")
            .replace("{id}", "m1")
            .replace("{node}", "n1")
            .replace("{key}", "k1");
        assert!(!path.contains('{'), "a path parameter to fill in: {path}");
        for (method, _) in item.as_object().expect("operations") {
            let method = method.to_ascii_uppercase();
            let (status, answer) = env
                .api
                .call(&method, &format!("{path}?bogus=1"), T, Some("{}"))
                .await;
            assert_refused(
                (status, &answer),
                (400, "bad_query", "bogus: unknown parameter ("),
                &format!("{method} {path}?bogus=1"),
            );
            walked += 1;
        }
    }
    assert!(walked >= 30, "only {walked} operations walked");
    // Nothing was changed on the way: no message, no pause, no resignation.
    let (_, leader) = env.api.call("GET", "/leader", None, None).await;
    assert_eq!(leader["leader"], true, "{leader}");
    let (_, stats) = env.api.call("GET", "/v1/stats", T, None).await;
    assert_eq!(stats["pending"]["total"], 0, "{stats}");
}

/// A key that holds something other than a stream is a conflict (409) wherever a
/// stream is read, not an outage.
#[tokio::test]
async fn a_key_of_the_wrong_type_is_a_conflict_on_every_stream_read() {
    let env = Env::start(&strict("")).await;
    let mut conn = env.redis.client();
    for key in ["orders", "orders:dead"] {
        redis::cmd("SET")
            .arg(key)
            .arg("not a stream")
            .exec(&mut conn)
            .unwrap();
    }
    let conflict = |key: &'static str| (409, "corrupt", key);
    #[rustfmt::skip]
    let cases = [
        case(line!(), "GET", "/v1/streams/orders/next?group=g&consumer=c&wait=0", T, None, conflict("key \"orders\" holds something other than a stream")),
        case(line!(), "POST", "/v1/streams/orders/ack", T, Some(r#"{"group":"g","ids":["1-0"]}"#), conflict("key \"orders\" holds something other than a stream")),
        case(line!(), "GET", "/v1/streams/orders/dead", T, None, conflict("key \"orders:dead\" holds something other than a stream")),
        case(line!(), "GET", "/v1/streams/orders/dead?after=1-0&limit=5", T, None, conflict("key \"orders:dead\"")),
        case(line!(), "POST", "/v1/streams/orders/dead/replay", T, Some(r#"{"all":true}"#), conflict("key \"orders:dead\"")),
        case(line!(), "POST", "/v1/streams/orders/dead/replay", T, Some(r#"{"ids":["m-1"]}"#), conflict("key \"orders:dead\"")),
        case(line!(), "POST", "/v1/streams/orders/dead/purge", T, Some(r#"{"all":true}"#), conflict("key \"orders:dead\"")),
        case(line!(), "POST", "/v1/streams/orders/dead/purge", T, Some(r#"{"all":true,"limit":5}"#), conflict("key \"orders:dead\"")),
        case(line!(), "POST", "/v1/streams/orders/dead/purge", T, Some(r#"{"ids":["m-1"]}"#), conflict("key \"orders:dead\"")),
    ];
    for c in &cases {
        check(&env, c).await;
    }
}

/// The body is read as JSON whatever its content type says (`curl -d` sends a form
/// type); a body that is not JSON gets the JSON refusal.
#[tokio::test]
async fn bodies_are_read_as_json_whatever_their_content_type() {
    let env = Env::start(&strict("")).await;
    let send = |content_type: &'static str, body: &'static str| {
        env.api
            .request("POST", "/v1/messages")
            .bearer_auth(TOKEN)
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    for (content_type, body) in [
        ("text/xml", "<message stream=\"orders\"/>"),
        (
            "application/x-www-form-urlencoded",
            "stream=orders&payload=x&delay=1s",
        ),
        ("multipart/form-data; boundary=b", "--b\r\n\r\nx\r\n--b--"),
    ] {
        let response = send(content_type, body).await.expect("request");
        let status = response.status().as_u16();
        let answer: Value = response.json().await.expect("a JSON answer");
        assert_refused(
            (status, &answer),
            (400, "malformed_json", "body is not valid JSON"),
            content_type,
        );
    }
    let json_body = r#"{"stream":"orders","payload":"x","delay":"1h"}"#;
    let response = send("application/x-www-form-urlencoded", json_body)
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 201);
}

/// A field named like one delayq adds to delivered entries (`delayq-*`, and the
/// configured `forwarder.id_field`) is refused the same way by a push, a batch, the
/// Rust client and the `delayq push` command, and nothing is stored.
#[tokio::test]
async fn fields_named_like_delayqs_own_are_refused_by_every_producer() {
    let env = Env::start(&strict("[forwarder]\nid_field = \"msg-id\"")).await;
    let producer = delayq_client::client::Producer::with_options(
        delayq_client::client::ProducerOptions::from_config(&env.config),
    )
    .await
    .expect("connect");
    for name in ["delayq-id", "msg-id"] {
        let refusal = format!("fields: field name {name:?} is reserved");
        let body =
            json!({ "stream": "orders", "fields": [["a", "1"], [name, "x"]], "delay": "1s" });
        let (status, answer) = env
            .api
            .call("POST", "/v1/messages", T, Some(&body.to_string()))
            .await;
        assert_refused((status, &answer), (422, "invalid_field", &refusal), "push");

        let batch =
            json!({ "messages": [{ "stream": "orders", "payload": "ok", "delay": "1h" }, body] });
        let (status, answer) = env
            .api
            .call("POST", "/v1/messages/batch", T, Some(&batch.to_string()))
            .await;
        assert_eq!(
            (status, answer["failed"].as_u64()),
            (200, Some(1)),
            "{answer}"
        );
        let item = &answer["results"][1];
        assert_refused(
            (
                item["status"].as_u64().unwrap() as u16,
                &json!({ "error": item["error"], "detail": item["detail"] }),
            ),
            (422, "invalid_field", &format!("messages[1]: {refusal}")),
            "batch",
        );

        for delay in [Duration::ZERO, Duration::from_secs(1)] {
            let sent = producer
                .send("orders", &[("a", "1"), (name, "x")], delay)
                .await;
            let err = sent.expect_err("the client refuses it");
            assert!(
                matches!(err, delayq_client::client::ClientError::Invalid(_)),
                "{err:?}"
            );
            assert!(err.to_string().contains(&refusal), "client: {err}");
        }

        let out = tokio::process::Command::new(crate::support::delayq_bin())
            .args([
                "push",
                "orders",
                "-f",
                "a=1",
                "-f",
                &format!("{name}=x"),
                "--delay",
                "1s",
            ])
            .env("DELAYQ_URL", env.url(""))
            .env("DELAYQ_TOKEN", TOKEN)
            .output()
            .await
            .expect("run delayq");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "cli: {stderr}");
        assert!(
            stderr.contains(&format!("422 invalid_field: {refusal}")),
            "cli: {stderr}"
        );
    }
    assert!(entries(&mut env.redis.client(), "orders").is_empty());
    assert_eq!(
        env.scheduled().await,
        2,
        "only the two good batch items are scheduled"
    );
}
