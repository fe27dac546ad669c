//! The journal on Redis Cluster: each slot's outbox is copied by the leader, so
//! every delivery, in whichever slot its stream lives, is journaled with its entry.

use std::collections::BTreeMap;
use std::time::Duration;

use delayq_harness::{DelayqProcess, MariaDbServer};
use serde_json::json;

use super::{cluster_toml, reader, shared_cluster};
use crate::support::{Api, delayq_bin, entries, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_in_every_slot_are_journaled_with_their_entries() {
    let cluster = shared_cluster();
    let db = tokio::task::spawn_blocking(MariaDbServer::start)
        .await
        .unwrap()
        .expect("start MariaDB");
    let journal = format!("[journal]\nurl = \"{}\"\n", db.url_with_password());
    let text = cluster_toml(&cluster, "journaled", &journal);
    let node = DelayqProcess::start(&delayq_bin(), "cj", &text).expect("start delayq");
    let api = Api::new(node.api);
    let streams: Vec<String> = (0..6).map(|i| format!("jrn-{i}")).collect();
    let messages: Vec<_> = (0..600)
        .map(|i| json!({"id": format!("c{i}"), "stream": streams[i % 6], "payload": "x", "delay_ms": 200}))
        .collect();
    let (status, body) = api
        .post("/v1/messages/batch", json!({ "messages": messages }))
        .await;
    assert_eq!((status, &body["scheduled"]), (200, &json!(600)), "{body}");

    let mut conn = reader(&cluster);
    let sent = eventually(Duration::from_secs(30), "all 600 delivered", || {
        let sent: BTreeMap<String, String> = streams
            .iter()
            .flat_map(|s| entries(&mut conn, s))
            .map(|e| (e.get("delayq-id").unwrap().to_owned(), e.id))
            .collect();
        async move { (sent.len() == 600).then_some(sent) }
    })
    .await;
    // The start line names the cluster's seeds, not a default URL.
    assert!(
        node.full_log().contains("redis=cluster via 127.0.0.1:"),
        "{}",
        node.log()
    );
    eventually(Duration::from_secs(30), "all 600 journaled", || {
        let rows = db
            .sql("SELECT id, stream, state, entry_id FROM delayq.delayq_messages")
            .unwrap();
        let journaled: BTreeMap<String, String> = rows
            .lines()
            .filter_map(|l| {
                let p: Vec<&str> = l.split('\t').collect();
                (p.len() == 4 && p[2] == "1").then(|| (p[0].to_owned(), p[3].to_owned()))
            })
            .collect();
        let agree = journaled == sent;
        async move { agree.then_some(()) }
    })
    .await;

    // One id in two streams (an id names a message per slot here): a cancel is
    // journaled before its answer, on the row of the stream it cancelled in.
    for stream in &streams[..2] {
        let body = json!({"id": "twin", "stream": stream, "payload": "x", "delay": "1h"});
        let (status, answer) = api.post("/v1/messages", body).await;
        assert_eq!(status, 201, "{answer}");
    }
    let (status, answer) = api.delete("/v1/messages/twin").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer.get("not_journaled"), None, "{answer}");
    let rows = db
        .sql("SELECT stream, state FROM delayq.delayq_messages WHERE id = 'twin' ORDER BY state")
        .unwrap();
    let states: Vec<&str> = rows.lines().filter_map(|l| l.split('\t').nth(1)).collect();
    assert_eq!(states, ["0", "4"], "{rows}");
    assert!(
        !node.full_log().contains("Redis has lost its data"),
        "a first start is no loss: {}",
        node.log()
    );
}
