//! Schedules declared in the configuration file: stored at start (marked
//! `declared`, making their messages), refused by the API, and reconciled at a
//! SIGHUP: changed, added, removed, while one made through the API stays.

use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};
use serde_json::{Value, json};

use crate::support::{Api, delayq_bin, entries, eventually};

const NIGHTLY: &str = "[[schedules]]\nid = \"nightly\"\nstream = \"reports\"\npayload = \"go\"\ncron = \"0 3 * * *\"\ntimezone = \"Europe/Berlin\"\n";
const TICK: &str =
    "[[schedules]]\nid = \"tick\"\nstream = \"ticks\"\nfields = { n = \"1\" }\nevery = \"1s\"\n";
const THIRD: &str =
    "[[schedules]]\nid = \"third\"\nstream = \"reports\"\npayload = \"3\"\nevery = \"1h\"\n";

/// The schedules the API lists: id -> schedule.
async fn listed(api: &Api) -> Vec<(String, Value)> {
    let (status, list) = api.get("/v1/schedules").await;
    assert_eq!(status, 200, "{list}");
    list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].as_str().unwrap().to_owned(), s.clone()))
        .collect()
}

#[tokio::test]
async fn declared_schedules_are_stored_refused_by_the_api_and_reconciled_at_a_reload() {
    let redis = RedisServer::start().unwrap();
    let base = format!("[redis]\nurl = \"{}\"\nshards = 2\n", redis.url());
    let process =
        DelayqProcess::start(&delayq_bin(), "declared", &format!("{base}{NIGHTLY}{TICK}")).unwrap();
    let api = Api::new(process.api);
    let both = eventually(
        Duration::from_secs(10),
        "both declared schedules",
        || async {
            let list = listed(&api).await;
            (list.len() == 2).then_some(list)
        },
    )
    .await;
    for (id, schedule) in &both {
        assert_eq!(schedule["declared"], json!(true), "{id}: {schedule}");
    }
    // The declared tick makes its messages like any schedule.
    eventually(Duration::from_secs(10), "a tick delivered", || async {
        entries(&mut redis.client(), "ticks")
            .iter()
            .any(|e| e.get("delayq-id").is_some_and(|id| id.starts_with("tick.")))
            .then_some(())
    })
    .await;

    let (status, made) = api
        .post(
            "/v1/schedules",
            json!({ "id": "api-made", "stream": "reports", "payload": "x", "every": "1h" }),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made.get("declared"), None, "{made}");
    let change = json!({ "stream": "reports", "payload": "x", "every": "1h" }).to_string();
    for (method, path, body) in [
        ("PUT", "/v1/schedules/nightly", Some(change.as_str())),
        ("DELETE", "/v1/schedules/nightly", None),
        ("POST", "/v1/schedules/nightly/pause", None),
        ("POST", "/v1/schedules/tick/resume", None),
    ] {
        let (status, answer) = api.call(method, path, None, body).await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (409, Some("schedule_declared")),
            "{method} {path}: {answer}"
        );
        let detail = answer["detail"].as_str().unwrap();
        assert!(detail.contains("[[schedules]]"), "{detail}");
    }
    let (status, exists) = api
        .post(
            "/v1/schedules",
            json!({ "id": "nightly", "stream": "reports", "payload": "x", "every": "1h" }),
        )
        .await;
    assert_eq!(
        (status, exists["error"].as_str()),
        (409, Some("schedule_exists"))
    );

    // The file changes: nightly at 4, tick gone, a third one.
    let nightly_at_4 = NIGHTLY.replace("0 3 * * *", "0 4 * * *");
    std::fs::write(
        process.config_path(),
        format!("{base}{nightly_at_4}{THIRD}"),
    )
    .unwrap();
    process.signal(libc::SIGHUP);
    let after = eventually(Duration::from_secs(10), "the reload reconciled", || async {
        let list = listed(&api).await;
        let ids: Vec<&str> = list.iter().map(|(id, _)| id.as_str()).collect();
        (ids == ["api-made", "nightly", "third"]).then_some(list)
    })
    .await;
    let nightly = &after[1].1;
    assert_eq!(nightly["cron"], json!("0 4 * * *"), "{nightly}");
    assert_eq!(after[2].1["declared"], json!(true));
    assert_eq!(after[0].1.get("declared"), None, "the API's stays its own");
    assert!(
        process.full_log().contains("declared schedules reconciled"),
        "{}",
        process.full_log()
    );
}
