//! Recurring schedules over HTTP: created, listed with their next occurrences,
//! changed, paused, resumed and deleted; bad input refused naming the field.

use serde_json::{Value, json};

use super::{T, delayq_says, strict};
use crate::support::Env;

async fn call(env: &Env, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string());
    env.api.call(method, path, T, body.as_deref()).await
}

#[tokio::test]
async fn a_schedule_is_created_shown_changed_paused_and_deleted() {
    let env = Env::start(&strict("")).await;
    let nightly = json!({ "id": "nightly", "stream": "orders", "payload": "report", "key": "reports",
                          "cron": "30 2 * * *", "timezone": "Europe/Berlin", "misfire": "once" });
    let (status, made) = call(&env, "POST", "/v1/schedules", Some(nightly.clone())).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(
        (
            made["id"].as_str(),
            made["misfire"].as_str(),
            made["key"].as_str()
        ),
        (Some("nightly"), Some("once"), Some("reports"))
    );
    let next: Vec<i64> = made["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(next.len(), 5, "{made}");
    assert!(
        next.windows(2).all(|w| w[1] - w[0] >= 23 * 3_600_000),
        "a day apart: {next:?}"
    );
    for at in &next {
        let local = jiff::Timestamp::from_millisecond(*at)
            .unwrap()
            .in_tz("Europe/Berlin")
            .unwrap();
        assert_eq!((local.hour(), local.minute()), (2, 30), "{local}");
    }
    let (status, again) = call(&env, "POST", "/v1/schedules", Some(nightly)).await;
    assert_eq!(
        (status, again["error"].as_str()),
        (409, Some("schedule_exists")),
        "{again}"
    );

    let every = json!({ "stream": "orders", "fields": { "kind": "ping" }, "every": "90s" });
    let (status, pinged) = call(&env, "POST", "/v1/schedules", Some(every)).await;
    assert_eq!(status, 201, "{pinged}");
    let ping_id = pinged["id"].as_str().unwrap().to_owned();
    let (_, list) = call(&env, "GET", "/v1/schedules", None).await;
    let ids: Vec<&str> = list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{list}");
    assert!(
        ids.contains(&"nightly") && ids.contains(&ping_id.as_str()),
        "{list}"
    );

    let change = json!({ "stream": "orders", "payload": "report", "every": "1h" });
    let (status, changed) = call(&env, "PUT", "/v1/schedules/nightly", Some(change)).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(
        (changed["every"].as_str(), changed["cron"].as_str()),
        (Some("1h"), None),
        "{changed}"
    );
    let (status, paused) = call(&env, "POST", "/v1/schedules/nightly/pause", None).await;
    assert_eq!(
        (
            status,
            paused["paused"].as_bool(),
            paused["next"].as_array().map(Vec::len)
        ),
        (200, Some(true), Some(0)),
        "{paused}"
    );
    let (status, resumed) = call(&env, "POST", "/v1/schedules/nightly/resume", None).await;
    assert_eq!(
        (
            status,
            resumed["paused"].as_bool(),
            resumed["next"].as_array().map(Vec::len)
        ),
        (200, Some(false), Some(5)),
        "{resumed}"
    );
    let (status, _) = call(&env, "DELETE", "/v1/schedules/nightly", None).await;
    assert_eq!(status, 200);
    for (method, path) in [
        ("GET", "/v1/schedules/nightly"),
        ("DELETE", "/v1/schedules/nightly"),
        ("POST", "/v1/schedules/nightly/pause"),
    ] {
        let (status, answer) = call(&env, method, path, None).await;
        assert_eq!(status, 404, "{method} {path}: {answer}");
    }
}

#[tokio::test]
async fn bad_schedules_are_refused_naming_the_field() {
    let env = Env::start(&strict("")).await;
    let base = json!({ "stream": "orders", "payload": "x", "cron": "0 3 * * *" });
    let with = |changes: Value| {
        let mut body = base.clone();
        for (k, v) in changes.as_object().unwrap() {
            if v.is_null() {
                body.as_object_mut().unwrap().remove(k);
            } else {
                body[k] = v.clone();
            }
        }
        body
    };
    for (changes, status, says) in [
        (
            json!({ "cron": "0 0 31 2 *" }),
            422,
            "cron \"0 0 31 2 *\": never fires",
        ),
        (
            json!({ "cron": "0 0 * *" }),
            422,
            "cron \"0 0 * *\": 4 fields",
        ),
        (
            json!({ "timezone": "Mars/Olympus" }),
            422,
            "timezone \"Mars/Olympus\": not an IANA time zone",
        ),
        (
            json!({ "cron": null, "every": "500ms" }),
            422,
            "every 500ms: must be at least 1s",
        ),
        (
            json!({ "every": "1m" }),
            422,
            "cron, every: give one, not both",
        ),
        (json!({ "cron": null }), 422, "cron or every: required"),
        (
            json!({ "start_at": 2_000_000_000_000u64, "end_at": 1_900_000_000_000u64 }),
            422,
            "end_at 1900000000000: before start_at 2000000000000",
        ),
        (
            json!({ "misfire": "sometimes" }),
            422,
            "misfire \"sometimes\": must be skip, once or all",
        ),
        (json!({ "max_catch_up": 1001 }), 422, "max_catch_up 1001"),
        (json!({ "id": "a b" }), 422, "id \"a b\""),
        (json!({ "key": "a b" }), 422, "key \"a b\""),
        (
            json!({ "stream": "billing" }),
            403,
            "stream \"billing\": not allowed",
        ),
        (json!({ "colour": "red" }), 422, "colour: unknown field"),
    ] {
        let body = with(changes.clone());
        let (got, answer) = call(&env, "POST", "/v1/schedules", Some(body)).await;
        assert_eq!(got, status, "{changes}: {answer}");
        let detail = answer["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(says),
            "{changes}: {detail:?} should say {says:?}"
        );
    }
    let (_, list) = call(&env, "GET", "/v1/schedules", None).await;
    assert_eq!(list["schedules"], json!([]), "nothing was kept");
}

#[tokio::test]
async fn the_command_line_adds_lists_pauses_and_removes_a_schedule() {
    let env = Env::start(&strict("")).await;
    let (code, said) = delayq_says(
        &env,
        &[
            "schedule", "add", "orders", "ping", "--every", "1m", "--id", "cli-ping", "--key",
            "pings",
        ],
    )
    .await;
    assert_eq!(code, 0, "{said}");
    let (code, said) = delayq_says(&env, &["schedule", "list"]).await;
    assert!(code == 0 && said.contains("cli-ping"), "{said}");
    let (code, said) = delayq_says(&env, &["schedule", "pause", "cli-ping"]).await;
    assert!(code == 0 && said.contains("paused: yes"), "{said}");
    let (code, said) = delayq_says(
        &env,
        &["schedule", "add", "orders", "x", "--cron", "0 0 31 2 *"],
    )
    .await;
    assert!(code == 1 && said.contains("never fires"), "{said}");
    let (code, said) = delayq_says(&env, &["schedule", "rm", "cli-ping"]).await;
    assert_eq!(code, 0, "{said}");
    let (code, said) = delayq_says(&env, &["schedule", "get", "cli-ping"]).await;
    assert_eq!(code, 3, "{said}");
}

/// A change or a deletion takes effect at once: the occurrences made ahead (the
/// horizon, a minute by default) and not yet due are withdrawn.
#[tokio::test]
async fn a_changed_or_deleted_schedule_sends_nothing_more_of_what_it_was() {
    use std::time::Duration;

    use crate::support::{eventually, xlen};

    let env = Env::start(&strict("")).await;
    let body =
        json!({ "id": "tick", "stream": "orders", "payload": "a", "every": "1s", "key": "ticks" });
    let (status, answer) = call(&env, "POST", "/v1/schedules", Some(body)).await;
    assert_eq!(status, 201, "{answer}");
    let count = |stream: &str| xlen(&mut env.redis.client(), stream);
    // The schedule's messages still pending in `stream`, by its key.
    let pending = |stream: &'static str| {
        let env = &env;
        async move {
            let path = format!("/v1/streams/{stream}/keys/ticks");
            let (_, list) = call(env, "GET", &path, None).await;
            list["messages"].as_array().map_or(0, |m| {
                m.iter().filter(|m| m["state"] == "scheduled").count()
            })
        }
    };
    eventually(Duration::from_secs(10), "delivering to orders", || async {
        (count("orders") >= 2).then_some(())
    })
    .await;
    assert!(pending("orders").await > 10, "a horizon's worth made ahead");
    let change = json!({ "stream": "orders-b", "payload": "b", "every": "1s", "key": "ticks" });
    let (status, answer) = call(&env, "PUT", "/v1/schedules/tick", Some(change)).await;
    assert_eq!(status, 200, "{answer}");
    eventually(
        Duration::from_secs(10),
        "what was made for orders withdrawn",
        || async { (pending("orders").await == 0).then_some(()) },
    )
    .await;
    let to_a = count("orders");
    eventually(
        Duration::from_secs(10),
        "delivering to orders-b",
        || async { (count("orders-b") >= 2).then_some(()) },
    )
    .await;
    assert_eq!(
        count("orders"),
        to_a,
        "nothing more to the stream it had before"
    );
    let (status, _) = call(&env, "DELETE", "/v1/schedules/tick", None).await;
    assert_eq!(status, 200);
    eventually(
        Duration::from_secs(10),
        "what was made for orders-b withdrawn",
        || async { (pending("orders-b").await == 0).then_some(()) },
    )
    .await;
    let to_b = count("orders-b");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(count("orders-b"), to_b, "nothing more once deleted");
}
