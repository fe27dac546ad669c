//! A Redis at `maxmemory` while messages fall due.

use std::time::Duration;

use serde_json::{Value, json};

use delayq_harness::{DelayqProcess, RedisServer};

use super::checks::{check_delivered, check_records, records};
use super::{Planned, W, config_text, message_fields, push_body};
use crate::support::{
    Api, Deliveries, delayq_bin, eventually, fill_to_maxmemory, patience, redis_config,
    redis_now_ms,
};

/// A Redis at `maxmemory` with `noeviction` while messages fall due: none is lost or
/// dead-lettered for want of memory, and forwarding resumes once memory is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_loses_nothing_and_forwarding_resumes_when_memory_frees() {
    let redis = RedisServer::start().expect("start redis-server");
    let mut conn = redis.client();
    let text = config_text(&redis.url(), &[("log.level", "\"warn\"")]);
    let node = DelayqProcess::start(&delayq_bin(), "full", &text).expect("start delayq");
    let ctx = |what: &str| format!("{what}\ndelayq log:\n{}", node.log());
    let api = Api::new(node.api);
    let w = W;
    let streams: Vec<String> = (0..w.streams).map(|s| format!("full-{s}")).collect();
    let lead_ms = 1500 * u64::from(patience());
    let at_ms = redis_now_ms(&mut conn) + lead_ms;
    let planned: Vec<Planned> = (0..w.http)
        .map(|i| {
            let stream = streams[i % streams.len()].clone();
            Planned {
                id: format!("full-{i}"),
                fields: message_fields(i, &stream, &w),
                stream,
                due_ms: at_ms,
            }
        })
        .collect();
    for chunk in planned.chunks(w.chunk) {
        let body =
            json!({ "messages": chunk.iter().map(|m| push_body(m, at_ms)).collect::<Vec<_>>() });
        let (_, answer) = api.post("/v1/messages/batch", body).await;
        assert_eq!(
            answer["scheduled"].as_u64(),
            Some(chunk.len() as u64),
            "{answer:.300}"
        );
    }

    // Redis full: a little room over what it holds, then a filler key up to the limit.
    fill_to_maxmemory(&mut conn, 4 << 20);
    assert!(
        redis_now_ms(&mut conn) < at_ms,
        "{}",
        ctx("memory filled before the messages fell due")
    );

    // The messages fall due while no write can succeed; the forwarder tries a while.
    eventually(
        Duration::from_secs(10),
        "the messages overdue by a second",
        || {
            let late = redis_now_ms(&mut conn) > at_ms + 1000;
            std::future::ready(late.then_some(()))
        },
    )
    .await;
    let dead_streams: Vec<String> = streams.iter().map(|s| format!("{s}:dead")).collect();
    let dead_streams: Vec<&str> = dead_streams.iter().map(String::as_str).collect();
    let dead_letters = Deliveries::new(&redis.url(), &dead_streams)
        .len()
        .expect("Redis answers");
    let states: Vec<(String, Value)> = records(&api, &planned)
        .await
        .into_iter()
        .map(|(id, _, got)| (id, got["state"].clone()))
        .collect();
    let gone: Vec<&(String, Value)> = states
        .iter()
        .filter(|(_, state)| *state != "scheduled" && *state != "delivered")
        .collect();
    assert!(
        dead_letters == 0 && gone.is_empty(),
        "{}",
        ctx(&format!(
            "while Redis was full: {dead_letters} dead letters, {} messages neither scheduled nor delivered, e.g. {:?}",
            gone.len(),
            &gone[..gone.len().min(5)]
        ))
    );

    // Memory freed: every message arrives, once, verbatim, on record.
    let _: u64 = redis::cmd("DEL").arg("filler").query(&mut conn).unwrap();
    redis_config(&mut conn, "maxmemory", "0");
    let streams_here: Vec<&str> = streams.iter().map(String::as_str).collect();
    let delivered = Deliveries::new(&redis.url(), &streams_here);
    eventually(
        Duration::from_secs(15),
        "every message delivered after memory freed",
        || {
            let got = delivered.len().unwrap_or(0);
            std::future::ready((got >= planned.len()).then_some(()))
        },
    )
    .await;
    let entry_ids = check_delivered(&mut conn, &streams, &planned, 1, &ctx);
    check_records(&api, &planned, &entry_ids, "delivered", &ctx).await;
}
