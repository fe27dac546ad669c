//! The HTTP API against a real Redis and an in-process daemon.

use serde_json::{Value, json};

use crate::support::{Env, assert_refused, eventually};

const CONFIG: &str = "[streams]\nallow = [\"orders\", \"billing:*\"]\n[api]\nmax_message_bytes = 1000\nmax_delay = \"1d\"\n";

/// POSTs `body` (raw text) to /v1/messages; checks the status, the error code and
/// that the detail mentions the part given.
async fn refused(env: &Env, body: &str, (status, code, detail_part): (u16, &str, &str)) {
    let answer = env.api.post_raw("/v1/messages", body).await;
    assert_refused(
        (answer.0, &answer.1),
        (status, code, detail_part),
        &format!("{body:.200}"),
    );
}

#[tokio::test]
async fn bad_pushes_are_refused_with_a_reason_naming_the_field() {
    let env = Env::start(CONFIG).await;
    let payload = |bytes: usize| {
        format!(
            r#"{{"stream":"orders","payload":"{}","delay":"1s"}}"#,
            "x".repeat(bytes)
        )
    };
    let (big, huge) = (payload(2000), payload(100_000));
    #[rustfmt::skip]
    let cases: &[(&str, (u16, &str, &str))] = &[
        ("{not json", (400, "malformed_json", "not valid JSON")),
        ("[1,2]", (400, "malformed_json", "JSON object")),
        (r#"{"payload":"x","delay":"1s"}"#, (422, "invalid_field", "stream: required")),
        (r#"{"stream":7,"payload":"x","delay":"1s"}"#, (422, "invalid_field", "stream: must be a string")),
        (r#"{"stream":"payroll","payload":"x","delay":"1s"}"#, (403, "stream_not_allowed", "allowed: orders, billing:*")),
        (r#"{"stream":"delayq:x","payload":"x","delay":"1s"}"#, (403, "stream_not_allowed", "delayq's own keys")),
        (r#"{"stream":"orders","delay":"1s"}"#, (422, "invalid_field", "fields: required")),
        (r#"{"stream":"orders","fields":{},"delay":"1s"}"#, (422, "invalid_field", "at least one")),
        (r#"{"stream":"orders","fields":{"a":{"b":1}},"delay":"1s"}"#, (422, "invalid_field", "fields.a")),
        (r#"{"stream":"orders","fields":[["a"]],"delay":"1s"}"#, (422, "invalid_field", "fields[0]")),
        (r#"{"stream":"orders","payload":"x","fields":{"a":"b"},"delay":"1s"}"#, (422, "invalid_field", "not both")),
        (r#"{"stream":"orders","payload":"x"}"#, (422, "invalid_field", "delay: required")),
        (r#"{"stream":"orders","payload":"x","delay":"1s","delay_ms":5}"#, (422, "invalid_field", "give only one")),
        (r#"{"stream":"orders","payload":"x","delay":"-5s"}"#, (422, "invalid_field", "must not be negative")),
        (r#"{"stream":"orders","payload":"x","delay_ms":-5}"#, (422, "invalid_field", "delay_ms -5: must not be negative")),
        (r#"{"stream":"orders","payload":"x","delay":"soon"}"#, (422, "invalid_field", "not a duration")),
        (r#"{"stream":"orders","payload":"x","delay":"2d"}"#, (422, "invalid_field", "max_delay")),
        (r#"{"stream":"orders","payload":"x","deliver_at":"2990-01-01T00:00:00Z"}"#, (422, "invalid_field", "max_delay")),
        (r#"{"stream":"orders","payload":"x","deliver_at":"tomorrow"}"#, (422, "invalid_field", "RFC 3339")),
        (r#"{"stream":"orders","payload":"x","delay":"1s","id":"bad id!"}"#, (422, "invalid_field", "not allowed")),
        (r#"{"stream":"orders","payload":"x","delay":"1s","priority":10}"#, (422, "invalid_field", "priority 10")),
        (r#"{"stream":"orders","payload":"x","delay":"1s","ttl":"0s"}"#, (422, "invalid_field", "ttl")),
        (r#"{"stream":"orders","payload":"x","delay":"1s","colour":"red"}"#, (422, "invalid_field", "colour: unknown field")),
        (r#"{"stream":"orders","payload":"x","delay":"1s","replace":"yes"}"#, (422, "invalid_field", "replace")),
        (&big, (413, "too_large", "max_message_bytes")),
        (&huge, (413, "too_large", "request body is larger")),
    ];
    for &(body, want) in cases {
        refused(&env, body, want).await;
    }
    // A body far past the limit: the client is still sending when the answer is
    // decided, and must still get the 413 rather than a reset connection.
    let vast = payload(6 << 20);
    for _ in 0..5 {
        refused(&env, &vast, (413, "too_large", "request body is larger")).await;
    }
}

#[tokio::test]
async fn push_get_cancel_and_duplicates() {
    let env = Env::start(CONFIG).await;
    let (status, body) = env.api.post("/v1/messages", json!({"stream": "orders", "fields": [["order", "42"], ["kind", "reminder"]], "delay": "1h", "id": "o-42", "priority": 3, "ttl": "1h"})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["id"], "o-42");
    let due = body["deliver_at"].as_u64().unwrap();

    let (status, body) = env.api.get("/v1/messages/o-42").await;
    assert_eq!(status, 200);
    assert_eq!(body["state"], "scheduled");
    assert_eq!(body["stream"], "orders");
    assert_eq!(body["priority"], 3);
    assert_eq!(body["deliver_at"].as_u64(), Some(due));
    assert_eq!(body["expires_at"].as_u64(), Some(due + 3_600_000));
    assert_eq!(
        body["fields"],
        json!([["order", "42"], ["kind", "reminder"]])
    );

    let (status, body) = env
        .api
        .post(
            "/v1/messages",
            json!({"stream": "orders", "payload": "other", "delay": "1s", "id": "o-42"}),
        )
        .await;
    assert_eq!(
        (status, &body["duplicate"], &body["state"]),
        (200, &json!(true), &json!("scheduled")),
        "{body}"
    );

    let (status, body) = env.api.delete("/v1/messages/o-42").await;
    assert_eq!((status, &body["state"]), (200, &json!("cancelled")));
    assert_eq!(
        env.api.get("/v1/messages/o-42").await.1["state"],
        "cancelled"
    );
    assert_eq!(env.api.get("/v1/messages/nope").await.0, 404);
    assert_eq!(env.api.delete("/v1/messages/nope").await.0, 404);
    let (status, body) = env.api.get("/v1/messages/bad%20id").await;
    assert_eq!((status, &body["error"]), (400, &json!("invalid_id")));
    assert_eq!(env.api.get("/v1/nothing-here").await.0, 404);
}

#[tokio::test]
async fn a_delivered_message_reports_its_entry_and_cannot_be_cancelled() {
    let env = Env::start(CONFIG).await;
    let (status, body) = env
        .api
        .post(
            "/v1/messages",
            json!({"stream": "billing:eu", "payload": {"amount": 5}, "delay_ms": 50, "id": "b-1"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let delivered = eventually(std::time::Duration::from_secs(5), "delivery", || async {
        let (_, body) = env.api.get("/v1/messages/b-1").await;
        (body["state"] == "delivered").then_some(body)
    })
    .await;
    assert_eq!(delivered["stream"], "billing:eu");
    let entry = delivered["entry_id"].as_str().unwrap().to_owned();
    let got = crate::support::entries(&mut env.redis.client(), "billing:eu");
    assert_eq!(got[0].id, entry);
    assert_eq!(got[0].get("payload"), Some(r#"{"amount":5}"#));
    // Its page shows the entry's fields as the stream holds them; without the
    // journal too, its due time and lateness (its record keeps how late it was).
    let written: Vec<Value> = got[0].fields.iter().map(|(k, v)| json!([k, v])).collect();
    assert_eq!(delivered["fields"], json!(written), "{delivered}");
    let (due, late, at) = (
        delivered["deliver_at"].as_u64().expect("deliver_at"),
        delivered["lateness_ms"].as_u64().expect("lateness_ms"),
        delivered["at"].as_u64().unwrap(),
    );
    assert!(due + late == at && late < 5000, "{delivered}");
    // Once the stream no longer holds the entry, no fields.
    let () = redis::cmd("DEL")
        .arg("billing:eu")
        .query(&mut env.redis.client())
        .unwrap();
    let (_, gone) = env.api.get("/v1/messages/b-1").await;
    assert_eq!(
        (&gone["state"], gone.get("fields")),
        (&json!("delivered"), None),
        "{gone}"
    );
    let (status, body) = env.api.delete("/v1/messages/b-1").await;
    assert_eq!(
        (status, &body["error"]),
        (409, &json!("already_final")),
        "{body}"
    );
    let (status, body) = env
        .api
        .post(
            "/v1/messages",
            json!({"stream": "billing:eu", "payload": "again", "delay_ms": 0, "id": "b-1"}),
        )
        .await;
    assert_eq!(
        (status, &body["state"]),
        (200, &json!("delivered")),
        "a re-push after delivery is a duplicate: {body}"
    );
}

#[tokio::test]
async fn deliver_at_accepts_epoch_ms_and_rfc3339_with_offsets() {
    let env = Env::start(CONFIG).await;
    let now = env.store.now_ms().await.unwrap();
    let at = now + 60_000;
    let (status, body) = env
        .api
        .post(
            "/v1/messages",
            json!({"stream": "orders", "payload": "x", "deliver_at": at}),
        )
        .await;
    assert_eq!((status, body["deliver_at"].as_u64()), (201, Some(at)));
    let ts = jiff::Timestamp::from_millisecond(at as i64).unwrap();
    let with_offset = ts
        .to_zoned(jiff::tz::TimeZone::fixed(jiff::tz::offset(2)))
        .strftime("%Y-%m-%dT%H:%M:%S%.3f%:z")
        .to_string();
    let (status, body) = env
        .api
        .post(
            "/v1/messages",
            json!({"stream": "orders", "payload": "x", "deliver_at": with_offset}),
        )
        .await;
    assert_eq!(
        (status, body["deliver_at"].as_u64()),
        (201, Some(at)),
        "{with_offset}: {body}"
    );
    // A time in the past means "now".
    let (status, body) = env
        .api
        .post(
            "/v1/messages",
            json!({"stream": "orders", "payload": "x", "deliver_at": 1000}),
        )
        .await;
    assert_eq!(status, 201);
    assert!(body["deliver_at"].as_u64().unwrap() >= now);
}

#[tokio::test]
async fn health_leader_and_metrics_endpoints() {
    let env = Env::start(CONFIG).await;
    assert_eq!(env.api.get("/healthz").await.0, 200);
    env.leading().await;
    let (status, body) = env.api.get("/leader").await;
    assert_eq!((status, &body["leader"]), (200, &json!(true)));
    let (_, body) = env.api.get("/v1/leader").await;
    assert_eq!(body["mode"], "standalone");
    assert!(body["epoch"].as_u64().unwrap() >= 1);
    env.api
        .post(
            "/v1/messages",
            json!({"stream": "orders", "payload": "x", "delay_ms": 0}),
        )
        .await;
    let text = eventually(
        std::time::Duration::from_secs(5),
        "forward metrics",
        || async {
            let text = env.api.metrics().await.unwrap();
            text.contains("delayq_messages_forwarded_total{stream=\"orders\"}")
                .then_some(text)
        },
    )
    .await;
    for name in [
        "delayq_messages_scheduled_total",
        "delayq_forward_lateness_seconds_bucket",
        "delayq_is_leader",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
}

#[tokio::test]
async fn a_repeated_cancel_answers_as_the_first_and_changes_nothing() {
    let env = Env::start(CONFIG).await;
    env.api.schedule("c1", "orders", 3_600_000).await;
    let first = env.api.delete("/v1/messages/c1").await;
    assert_eq!(
        first,
        (
            200,
            json!({"id": "c1", "state": "cancelled", "already": false})
        )
    );
    let again = env.api.delete("/v1/messages/c1").await;
    assert_eq!(
        again,
        (
            200,
            json!({"id": "c1", "state": "cancelled", "already": true})
        )
    );
    // A cancelled message cannot be rescheduled: that one is final.
    let (status, answer) = env
        .api
        .post("/v1/messages/c1/reschedule", json!({"delay": "1m"}))
        .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("already_final")),
        "{answer}"
    );
    // That it is counted once is ops::exported's to check: this daemon's metrics
    // are the test process's, shared with every other in-process daemon.
}

#[tokio::test]
async fn blank_page_parameters_mean_the_default() {
    let env = Env::start(CONFIG).await;
    env.api.schedule("u1", "orders", 3_600_000).await;
    for (path, listed) in [
        ("/v1/streams/orders/dead?after=&limit=", "entries"),
        ("/v1/upcoming?stream=&after=&limit=", "messages"),
        ("/v1/upcoming?limit=%20", "messages"),
    ] {
        let (status, answer) = env.api.get(path).await;
        assert_eq!(status, 200, "{path}: {answer}");
        assert!(answer[listed].is_array(), "{path}: {answer}");
    }
    let (_, upcoming) = env.api.get("/v1/upcoming?after=&limit=").await;
    assert_eq!(upcoming["messages"][0]["id"], "u1", "{upcoming}");
    let (status, answer) = env.api.get("/v1/upcoming?limit=x").await;
    assert_eq!(
        status, 400,
        "a limit that is there must still be a number: {answer}"
    );
    let (status, answer) = env
        .api
        .get("/v1/streams/orders/next?group=g&consumer=c&wait=0&count=")
        .await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn a_delivery_near_the_top_of_the_id_range_reads_back_exactly() {
    // Stream ids past 2^53 ms (set by hand) are more than a double holds: the
    // record keeps the entry id as its text.
    let env = Env::start(CONFIG).await;
    let top = "18446744073709551615";
    let _: String = redis::cmd("XADD")
        .arg("orders")
        .arg(format!("{top}-0"))
        .arg("a")
        .arg("b")
        .query(&mut env.redis.client())
        .unwrap();
    let (status, answer) = env
        .api
        .post(
            "/v1/messages",
            json!({"stream": "orders", "payload": "x", "delay": "0s", "id": "h1"}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let delivered = eventually(
        std::time::Duration::from_secs(10),
        "h1 delivered",
        || async {
            let (status, answer) = env.api.get("/v1/messages/h1").await;
            (status == 200 && answer["state"] == "delivered").then_some(answer)
        },
    )
    .await;
    assert_eq!(delivered["entry_id"], format!("{top}-1"), "{delivered}");
}

/// Messages pushed without an id, due in the same millisecond at one priority, leave
/// a shard in the order they were pushed: the ids delayq makes count up, in either
/// pending layout, within a batch and across batches and single pushes.
#[tokio::test]
async fn messages_pushed_without_ids_and_due_together_are_delivered_in_push_order() {
    for layout in ["compact", "hash"] {
        let env = Env::start(&format!(
            "{CONFIG}[redis]\nshards = 1\n[pending]\nlayout = \"{layout}\"\n"
        ))
        .await;
        let at = env.store.now_ms().await.unwrap() + 1_500;
        let push =
            |n: usize| json!({"stream": "orders", "payload": n.to_string(), "deliver_at": at});
        let mut ids = Vec::new();
        for batch in [0..200, 200..250, 250..400] {
            let messages: Vec<_> = batch.clone().map(push).collect();
            let (status, body) = env
                .api
                .post("/v1/messages/batch", json!({ "messages": messages }))
                .await;
            assert_eq!(
                (status, &body["scheduled"]),
                (200, &json!(batch.len())),
                "{body}"
            );
            ids.extend(
                body["results"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["id"].as_str().unwrap().to_owned()),
            );
            let (status, body) = env.api.post("/v1/messages", push(1000 + batch.end)).await;
            assert_eq!(status, 201, "{body}");
            ids.push(body["id"].as_str().unwrap().to_owned());
        }
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "ids out of push order: {ids:?}"
        );
        let got = eventually(
            std::time::Duration::from_secs(10),
            "every message delivered",
            || async {
                let got = crate::support::entries(&mut env.redis.client(), "orders");
                (got.len() >= ids.len()).then_some(got)
            },
        )
        .await;
        let order: Vec<&str> = got.iter().map(|e| e.get("payload").unwrap()).collect();
        let pushed: Vec<String> = [0..200, 200..250, 250..400]
            .into_iter()
            .flat_map(|b| {
                b.clone()
                    .map(|n| n.to_string())
                    .chain([(1000 + b.end).to_string()])
            })
            .collect();
        assert_eq!(order, pushed, "delivery order, {layout} layout");
        assert!(got.iter().all(|e| e.ms() >= at), "delivered before {at}");
    }
}

/// Messages pushed without an id get ids that name their due time and priority (so
/// that Redis keeps no index entry for them) and that put those made in one
/// millisecond in one shard (so that pushes sharing a call into Redis pay for one
/// shard's part of it): a batch's ids, in the order made, change shard seldom, and
/// Redis holds each message in the shard its id names.
#[tokio::test]
async fn ids_made_here_name_their_time_and_share_their_millisecond_s_shard() {
    let env = Env::start(&format!("{CONFIG}[redis]\nshards = 16\n")).await;
    let messages: Vec<_> = (0..800)
        .map(|n| json!({"stream": "orders", "payload": n.to_string(), "delay": "1h", "priority": n % 10}))
        .collect();
    let (status, body) = env
        .api
        .post("/v1/messages/batch", json!({ "messages": messages }))
        .await;
    assert_eq!((status, &body["scheduled"]), (200, &json!(800)), "{body}");
    let mut shards = Vec::new();
    let mut per_shard = [0u64; 16];
    for (n, r) in body["results"].as_array().unwrap().iter().enumerate() {
        let id = r["id"].as_str().unwrap();
        let due = r["deliver_at"].as_u64().unwrap();
        assert_eq!(
            delayq_client::message::placed_score(id),
            Some(delayq_client::message::due_score(due, (n % 10) as u8)),
            "{r}"
        );
        let shard = delayq_client::message::MessageId::parse(id)
            .unwrap()
            .shard(16);
        shards.push(shard);
        per_shard[usize::from(shard)] += 1;
    }
    // Ids change shard with their millisecond (a batch is placed in a few) and when
    // the count's steps run out (a few percent).
    let changes = shards.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(changes <= 60, "{changes} changes of shard over 800 ids");
    let stored: Vec<(u16, u64)> = env.store.pending_per_shard().await.unwrap();
    for (shard, n) in stored {
        assert_eq!(n, per_shard[usize::from(shard)], "shard {shard}");
    }
}

/// A message of exactly `api.max_message_bytes` is taken however its JSON escapes
/// it (`\u0001` is six bytes of body for one of message, `\u00e9` six for two), and
/// written byte for byte; one byte more is refused for its size, not the body's.
#[tokio::test]
async fn a_message_at_its_limit_is_taken_however_json_escapes_it() {
    const LIMIT: usize = 100_000;
    let env = Env::start(&format!("[api]\nmax_message_bytes = {LIMIT}\n")).await;
    // The stream's name and the field's count towards the limit.
    let room = LIMIT - "orders".len() - "payload".len();
    let push = |id: &str, escaped: &str| {
        format!(r#"{{"stream":"orders","id":"{id}","delay":"0s","payload":"{escaped}"}}"#)
    };
    #[rustfmt::skip]
    let cases: &[(&str, String, String, u16)] = &[
        ("control", "\\u0001".repeat(room), "\u{1}".repeat(room), 201),
        ("accented", "\\u00e9".repeat(room / 2), "é".repeat(room / 2), 201),
        ("over", format!("{}x", "\\u0001".repeat(room)), String::new(), 413),
    ];
    for (id, escaped, _, want) in cases {
        let body = push(id, escaped);
        let (status, answer) = env.api.post_raw("/v1/messages", &body).await;
        assert_eq!(
            status,
            *want,
            "{id}: {} bytes of body: {answer}",
            body.len()
        );
        if *want == 413 {
            assert_eq!(answer["error"], "too_large", "{answer}");
            assert!(
                answer["detail"]
                    .as_str()
                    .unwrap()
                    .contains("max_message_bytes"),
                "{answer}"
            );
        }
    }
    let got = eventually(
        std::time::Duration::from_secs(10),
        "both delivered",
        || async {
            let got = crate::support::entries(&mut env.redis.client(), "orders");
            (got.len() == 2).then_some(got)
        },
    )
    .await;
    for (id, _, raw, _) in &cases[..2] {
        let entry = got
            .iter()
            .find(|e| e.get("delayq-id") == Some(*id))
            .unwrap_or_else(|| panic!("{id} not delivered"));
        assert!(
            entry.get("payload") == Some(raw.as_str()),
            "{id}: payload changed"
        );
    }
}
