//! Cancelling by business key while the forwarder moves the same messages, with a
//! real daemon: what a cancel answered for never arrives after the answer, and
//! every other message arrives once.

use std::collections::HashMap;
use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};
use serde_json::json;

use crate::support::{Api, delayq_bin, entries, eventually, xlen};

const MESSAGES: usize = 10_000;
const KEYS: usize = 1_000;

fn key_of(i: usize) -> String {
    format!("order-{}", i % KEYS)
}

/// Redis's clock, in ms.
fn redis_ms(conn: &mut redis::Connection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    s * 1000 + us / 1000
}

#[tokio::test]
async fn keys_cancelled_during_forwarding_lose_nothing_and_deliver_nothing_after_the_answer() {
    let redis = RedisServer::start().unwrap();
    let config = format!(
        "[redis]\nurl = \"{}\"\n[forwarder]\nkey_field = \"order-key\"\n",
        redis.url()
    );
    let node = DelayqProcess::start(&delayq_bin(), "keys", &config).unwrap();
    let api = Api::new(node.api);
    let mut conn = redis.client();
    // Due from 1 s to 4 s from now, every key's ten messages spread over all of it.
    for chunk in (0..MESSAGES).collect::<Vec<_>>().chunks(1000) {
        let messages: Vec<_> = chunk
            .iter()
            .map(|&i| {
                json!({ "stream": "orders", "payload": i.to_string(), "id": format!("m-{i}"),
                        "key": key_of(i), "delay_ms": 1000 + (i * 7919) % 3000 })
            })
            .collect();
        let (status, answer) = api
            .post("/v1/messages/batch", json!({ "messages": messages }))
            .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            answer["scheduled"].as_u64(),
            Some(chunk.len() as u64),
            "{answer}"
        );
    }
    // Once forwarding is well under way (some of every other key's messages are
    // delivered then), every other key is cancelled, one after another.
    eventually(Duration::from_secs(10), "forwarding under way", || async {
        (xlen(&mut redis.client(), "orders") > 500).then_some(())
    })
    .await;
    let mut answered: HashMap<String, (u64, u64, u64)> = HashMap::new();
    for k in (0..KEYS).step_by(2) {
        let key = format!("order-{k}");
        let (status, answer) = api.delete(&format!("/v1/streams/orders/keys/{key}")).await;
        assert_eq!(status, 200, "{key}: {answer}");
        let at = redis_ms(&mut conn);
        let cancelled = answer["cancelled"].as_u64().unwrap();
        let delivered = answer["delivered"].as_u64().unwrap();
        answered.insert(key, (cancelled, delivered, at));
    }
    let cancelled: u64 = answered.values().map(|a| a.0).sum();
    assert!(
        cancelled > 0 && cancelled < (MESSAGES / 2) as u64,
        "the cancels met forwarding under way: {cancelled} cancelled"
    );
    let want = MESSAGES as u64 - cancelled;
    eventually(
        Duration::from_secs(60),
        "every message not cancelled delivered",
        || async { (xlen(&mut redis.client(), "orders") as u64 >= want).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let got = entries(&mut conn, "orders");
    assert_eq!(got.len() as u64, want, "no more than that, either");
    let mut per_key: HashMap<String, Vec<u64>> = HashMap::new();
    let mut ids = std::collections::HashSet::new();
    for e in &got {
        let id = e.get("delayq-id").expect("the id field");
        assert!(ids.insert(id.to_owned()), "{id} delivered twice");
        let key = e.get("order-key").expect("the key field");
        let i: usize = id.trim_start_matches("m-").parse().unwrap();
        assert_eq!(key, key_of(i), "{id}");
        let ms: u64 = e.id.split('-').next().unwrap().parse().unwrap();
        per_key.entry(key.to_owned()).or_default().push(ms);
    }
    let per = (MESSAGES / KEYS) as u64;
    for k in 0..KEYS {
        let key = format!("order-{k}");
        let arrived = per_key.get(&key).map_or(&[][..], Vec::as_slice);
        match answered.get(&key) {
            Some(&(cancelled, delivered, at)) => {
                assert_eq!(
                    arrived.len() as u64,
                    delivered,
                    "{key}: delivered before its cancel"
                );
                assert_eq!(
                    delivered + cancelled,
                    per,
                    "{key}: each message delivered or cancelled"
                );
                assert!(
                    arrived.iter().all(|&ms| ms <= at),
                    "{key}: an entry after the cancel's answer ({at}): {arrived:?}"
                );
            }
            None => assert_eq!(arrived.len() as u64, per, "{key}: every message once"),
        }
    }
}
