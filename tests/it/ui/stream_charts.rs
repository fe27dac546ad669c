//! A stream's last hour and day as the Streams page shows them: from the leader's
//! samples, its worst lateness and its dead letters a minute, a paused stream's
//! wait apart; from the nodes' quarter-hour rollups, its day.

use std::time::Duration;

use delayq_client::message::{MessageId, NewMessage};
use delayq_client::store::ScheduleMode;
use serde_json::{Value, json};

use super::endpoints::{ADMIN, get, push, tokens};
use crate::support::{Cluster, stream_row, within};

/// A stream's last hour on the Streams page: its worst lateness a minute and its
/// dead letters a minute, from the leader's samples; a paused stream's wait is not
/// lateness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_s_last_hour_shows_its_worst_lateness_and_dead_letters_not_held_waits() {
    let cluster = Cluster::start(1, 1, &format!("{}[redis]\nshards = 1\n", tokens())).await;
    let admin = cluster.apis[0].clone().with_token(ADMIN);
    let (status, body) = admin.post("/v1/streams/held/pause", json!({})).await;
    assert_eq!(status, 200, "{body}");
    for i in 0..3 {
        push(&cluster, 0, &format!("h-{i}"), "held", 100).await;
    }
    let held = within(Duration::from_secs(10), || async {
        let table = get(&cluster, 0, "/v1/streams").await;
        let held = table["streams"]
            .as_array()?
            .iter()
            .find(|s| s["stream"] == "held")?["held"]
            .as_u64();
        (held == Some(3)).then_some(())
    })
    .await;
    assert!(held.is_some(), "the paused stream's messages not held");
    // Pushed while the only node is stopped for 3 s, due 300 ms on: forwarded some
    // 2.7 s late; two of them, with a ttl of 500 ms, expire into the dead letters.
    cluster.nodes[0].signal(libc::SIGSTOP);
    for (id, ttl) in [
        ("late-1", None),
        ("gone-1", Some(500)),
        ("gone-2", Some(500)),
    ] {
        let mut msg = NewMessage::payload("late", "x", Duration::from_millis(300))
            .with_id(MessageId::parse(id).unwrap());
        msg.ttl = ttl.map(Duration::from_millis);
        cluster
            .store
            .schedule(&msg, ScheduleMode::New, Duration::from_secs(60))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.nodes[0].signal(libc::SIGCONT);
    let resumed = within(Duration::from_secs(10), || async {
        let (status, _) = admin.post("/v1/streams/held/resume", json!({})).await;
        (status == 200).then_some(())
    })
    .await;
    assert!(resumed.is_some(), "held not resumed");
    let minutes = |s: &Value, field: &str| -> Vec<u64> {
        s[field]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    let last = std::sync::Mutex::new(Value::Null);
    let table = within(Duration::from_secs(20), || async {
        let table = get(&cluster, 0, "/v1/streams").await;
        *last.lock().unwrap() = table.clone();
        let of = |name: &str| {
            table["streams"]
                .as_array()?
                .iter()
                .find(|s| s["stream"] == name)
                .cloned()
        };
        let (late, held) = (of("late")?, of("held")?);
        let done = minutes(&late, "dead_last_hour").iter().sum::<u64>() == 2
            && minutes(&late, "delivered_last_hour").iter().sum::<u64>() == 1
            && minutes(&held, "delivered_last_hour").iter().sum::<u64>() == 3;
        done.then_some(table)
    })
    .await
    .unwrap_or_else(|| panic!("the last hour's figures: {}", last.lock().unwrap()));
    let of = |name: &str| {
        table["streams"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stream"] == name)
            .cloned()
            .unwrap()
    };
    let (late, held) = (of("late"), of("held"));
    for s in [&late, &held] {
        for field in ["dead_last_hour", "worst_lateness_last_hour"] {
            assert_eq!(minutes(s, field).len(), 60, "{field}: {s}");
        }
    }
    let worst = |s: &Value| minutes(s, "worst_lateness_last_hour").into_iter().max();
    assert!(
        worst(&late).is_some_and(|ms| (2_500..60_000).contains(&ms)),
        "{late}"
    );
    // Held 3 s and more by the pause: a wait on purpose, not lateness.
    assert!(worst(&held).is_some_and(|ms| ms < 2_000), "{held}");
    assert_eq!(
        minutes(&held, "dead_last_hour").iter().sum::<u64>(),
        0,
        "{held}"
    );
}

/// A stream's day: the quarter hours before this one from the nodes' rollups (one
/// written here as a node writes it, one written by a node that stops), the one
/// under way from the samples; a window other than hour or day is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_s_day_comes_from_the_rollups_and_the_quarter_hour_under_way() {
    const QUARTER: u64 = 15 * 60_000;
    let mut cluster = Cluster::start(1, 1, &tokens()).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // Two hours ago: eight quarter hours before the one under way.
    let past_end = (now / QUARTER + 1 - 8) * QUARTER;
    // "earlier" had traffic only then: listed in the day, not in the hour.
    let rollup = json!({ "t_ms": past_end, "node_id": "gone", "forwarded": 12,
                         "streams": { "daily": 7, "earlier": 5 }, "p50_ms": null, "p99_ms": null,
                         "worst_ms": { "daily": 250, "earlier": 40 }, "dead": { "daily": 2 } });
    let key = cluster.store.keys().rollups();
    let () = redis::cmd("LPUSH")
        .arg(&key)
        .arg(rollup.to_string())
        .query(&mut cluster.redis.client())
        .unwrap();
    for i in 0..3 {
        push(&cluster, 0, &format!("daily-{i}"), "daily", 50).await;
    }
    let last = std::sync::Mutex::new(Value::Null);
    let daily = within(Duration::from_secs(20), || async {
        let table = get(&cluster, 0, "/v1/streams?window=day").await;
        *last.lock().unwrap() = table.clone();
        let daily = stream_row(&table, "daily")?;
        let now_quarter = daily["delivered_last_day"].as_array()?.last()?.as_u64();
        (now_quarter == Some(3)).then_some(daily)
    })
    .await
    .unwrap_or_else(|| panic!("the day's figures: {}", last.lock().unwrap()));
    let points = |field: &str| -> Vec<u64> {
        daily[field]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    for field in [
        "delivered_last_day",
        "dead_last_day",
        "worst_lateness_last_day",
    ] {
        assert_eq!(points(field).len(), 96, "{field}: {daily}");
    }
    // The quarter hour under way may have turned since `now`: the rollup is 8 or 9
    // quarter hours back.
    let at = (87..=88)
        .find(|&i| points("delivered_last_day")[i] == 7)
        .unwrap_or_else(|| panic!("{daily}"));
    assert_eq!(points("dead_last_day")[at], 2, "{daily}");
    assert_eq!(points("worst_lateness_last_day")[at], 250, "{daily}");
    assert_eq!(
        points("delivered_last_day").iter().sum::<u64>(),
        10,
        "{daily}"
    );
    let day = last.lock().unwrap().clone();
    let earlier = day["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stream"] == "earlier")
        .unwrap_or_else(|| panic!("a stream with traffic earlier in the day: {day}"));
    assert_eq!(earlier["delivered_last_day"][at], 5, "{earlier}");
    assert_eq!(earlier["pending"], 0, "{earlier}");
    // The hour alone carries no day, nor a stream quiet all hour.
    let hour = get(&cluster, 0, "/v1/streams").await;
    assert!(
        hour["streams"][0].get("delivered_last_day").is_none(),
        "{hour}"
    );
    assert!(
        hour["streams"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["stream"] != "earlier"),
        "{hour}"
    );
    let reader = cluster.apis[0].clone().with_token(super::endpoints::READER);
    for (query, status) in [("window=week", 422), ("window=day&days=2", 400)] {
        let (got, body) = reader.get(&format!("/v1/streams?{query}")).await;
        assert_eq!(got, status, "{query}: {body}");
    }
    // A node that stops writes what it forwarded in the quarter hour under way.
    assert!(
        cluster.nodes[0]
            .terminate(Duration::from_secs(20))
            .is_some()
    );
    let rollups: Vec<String> = redis::cmd("LRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .query(&mut cluster.redis.client())
        .unwrap();
    let own: Vec<Value> = rollups
        .iter()
        .filter_map(|r| serde_json::from_str::<Value>(r).ok())
        .filter(|r| r["node_id"] != "gone")
        .collect();
    assert!(
        own.iter()
            .any(|r| r["streams"]["daily"].as_u64().is_some_and(|n| n >= 1)),
        "{rollups:?}"
    );
}
