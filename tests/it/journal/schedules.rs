//! Recurring schedules and the journal: after Redis loses its data, the restore
//! puts every schedule back (a deleted one stays deleted), each made as far as the
//! journal has its occurrences, so that none is made a second time.

use crate::support::now_ms;
use std::time::Duration;

use delayq_harness::RedisServer;
use serde_json::{Value, json};

use super::daemon::{journaled_node, mariadb};
use crate::support::{Api, entries, eventually, within, xlen};

async fn created(api: &Api, body: Value) {
    let (status, answer) = api.post("/v1/schedules", body).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer.get("not_journaled"), None, "{answer}");
}

#[tokio::test]
async fn a_restore_brings_schedules_back_made_as_far_as_the_journal_knows() {
    let db = mariadb().await;
    let redis = RedisServer::start().unwrap();
    let node = journaled_node(&redis, &db, "[scheduler]\nhorizon = \"1s\"\n");
    let api = Api::new(node.api);
    // Four ticks, a second apart, then none: every one missed would be sent again.
    let start = (now_ms() as i64 / 1000 + 2) * 1000;
    let end = start + 3000;
    created(
        &api,
        json!({ "id": "tick", "stream": "ticks", "payload": "t", "every": "1s",
        "start_at": start, "end_at": end, "misfire": "all", "max_catch_up": 1000 }),
    )
    .await;
    created(
        &api,
        json!({ "id": "probe", "stream": "probes", "payload": "p", "every": "1s" }),
    )
    .await;
    created(
        &api,
        json!({ "id": "nightly", "stream": "reports", "payload": "n",
        "cron": "0 3 * * *", "timezone": "Europe/Berlin" }),
    )
    .await;
    created(
        &api,
        json!({ "id": "gone", "stream": "reports", "payload": "g", "every": "1h" }),
    )
    .await;
    let (status, answer) = api.delete("/v1/schedules/gone").await;
    assert_eq!(status, 200, "{answer}");

    eventually(Duration::from_secs(15), "four ticks delivered", || async {
        (xlen(&mut redis.client(), "ticks") == 4).then_some(())
    })
    .await;
    eventually(
        Duration::from_secs(10),
        "the ticks journaled as delivered",
        || async {
            let delivered = db
            .sql("SELECT COUNT(*) FROM delayq.delayq_messages WHERE id LIKE 'tick.%' AND state = 1")
            .unwrap();
            (delivered.trim() == "4").then_some(())
        },
    )
    .await;

    let mut conn = redis.client();
    let () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let listed = within(Duration::from_secs(30), || async {
        let (status, list) = api.get("/v1/schedules").await;
        let all = list["schedules"].as_array().cloned().unwrap_or_default();
        let ids: Vec<&str> = all.iter().filter_map(|s| s["id"].as_str()).collect();
        (status == 200 && ids == ["nightly", "probe", "tick"]).then_some(all)
    })
    .await
    .unwrap_or_else(|| panic!("the schedules restored: {}", node.full_log()));
    let restored = now_ms() as i64;
    let tick = &listed[2];
    assert_eq!(
        tick["last"],
        json!(end),
        "made as far as the journal knew: {tick}"
    );
    assert_eq!(tick["next"], json!([]), "{tick}");
    assert_eq!(listed[0]["cron"], json!("0 3 * * *"), "{}", listed[0]);

    // Once the leader has made a probe after the restore (the horizon is 1 s), its
    // rounds have seen the restored tick: nothing of it was made again.
    eventually(
        Duration::from_secs(15),
        "a probe made after the restore",
        || async {
            entries(&mut redis.client(), "probes")
                .iter()
                .filter_map(|e| {
                    e.get("delayq-id")?
                        .strip_prefix("probe.")?
                        .parse::<i64>()
                        .ok()
                })
                .any(|at| at >= restored + 2000)
                .then_some(())
        },
    )
    .await;
    assert_eq!(xlen(&mut redis.client(), "ticks"), 0, "no tick sent again");
    assert!(
        node.full_log()
            .contains("schedule restored from the journal"),
        "{}",
        node.full_log()
    );
}
