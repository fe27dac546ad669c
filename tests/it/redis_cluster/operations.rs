//! Everything besides forwarding, on Redis Cluster: lookups, cancel and reschedule
//! by id alone (the id's slot is its stream's, unknown to the caller), expiry and
//! redelivery into dead letters named in their stream's slot, replay, and the
//! inbox (its acknowledgement a step of its own, since it lives in another slot);
//! `delayq functions` on every master.

use std::time::Duration;

use serde_json::json;

use super::{cluster_config, cluster_toml, reader, shared_cluster};
use crate::ops::functions::{functions, load_library};
use crate::support::{
    Api, create_group, entries, eventually, libraries, read_group, stream_row, xadd, xlen,
};

const DELIVERY: &str = "[delivery]
groups = [\"g\"]
ack_timeout = \"300ms\"
sweep_interval = \"50ms\"
backoff = \"50ms\"
backoff_max = \"100ms\"
backoff_jitter = 0.0
max_attempts = 2
[delivery.streams.ops-orders]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_works_on_the_cluster() {
    let cluster = shared_cluster();
    let config = cluster_config(&cluster, "ops", DELIVERY);
    let daemon = delayq::start(config).await.expect("start delayq");
    let api = Api::new(daemon.api_addr);
    let mut conn = reader(&cluster);
    let stream = "ops-orders";
    create_group(&mut conn, stream, "g");

    // A message nobody acknowledges: redelivered once, then dead-lettered into
    // "{ops-orders}:dead", in the stream's slot.
    let (status, body) = api
        .post(
            "/v1/messages",
            json!({ "stream": stream, "id": "o1", "fields": { "n": "1" }, "delay_ms": 0 }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let mut attempts = Vec::new();
    eventually(Duration::from_secs(15), "o1 dead-lettered", || {
        for e in read_group(&mut conn, stream, "g", "c") {
            attempts.push(e.get("delayq-attempt").unwrap().to_owned());
        }
        std::future::ready((xlen(&mut conn, "{ops-orders}:dead") == 1).then_some(()))
    })
    .await;
    assert_eq!(attempts, ["1", "2"]);
    let (_, status) = api.get("/v1/messages/o1").await;
    assert_eq!(status["state"], "dead", "{status}");
    assert_eq!(status["stream"], "{ops-orders}:dead", "{status}");
    let (code, list) = api.get(&format!("/v1/streams/{stream}/dead")).await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["dead_letter_stream"], "{ops-orders}:dead");

    // Replayed: back in the stream as attempt 1.
    let (code, body) = api
        .post(
            &format!("/v1/streams/{stream}/dead/replay"),
            json!({ "ids": ["o1"] }),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["replayed"][0]["id"], "o1", "{body}");
    let again = eventually(Duration::from_secs(5), "o1 replayed", || {
        std::future::ready(read_group(&mut conn, stream, "g", "c").pop())
    })
    .await;
    assert_eq!(again.get("delayq-id"), Some("o1"));
    assert_eq!(again.get("delayq-attempt"), Some("1"));

    // Found, rescheduled and cancelled by id alone.
    let (status, body) = api
        .post(
            "/v1/messages",
            json!({ "stream": "ops-later", "id": "o2", "payload": "x", "delay": "1h" }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (_, status) = api.get("/v1/messages/o2").await;
    assert_eq!(status["state"], "scheduled", "{status}");
    let (code, body) = api
        .post("/v1/messages/o2/reschedule", json!({ "delay": "2h" }))
        .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = api.delete("/v1/messages/o2").await;
    assert_eq!(code, 200, "{body}");
    let (_, status) = api.get("/v1/messages/o2").await;
    assert_eq!(status["state"], "cancelled", "{status}");
    let (code, _) = api.get("/v1/messages/nowhere").await;
    assert_eq!(code, 404);

    // Past its ttl before it is forwarded: dead-lettered as expired, in the
    // stream's slot too.
    api.push_expiring(
        "{ops-t}exp",
        json!({ "stream": "{ops-t}exp", "id": "o3", "payload": "x", "delay_ms": 0, "ttl_ms": 1 }),
    )
    .await;
    let dead = eventually(Duration::from_secs(5), "o3 expired", || {
        std::future::ready(entries(&mut conn, "{ops-t}exp:dead").pop())
    })
    .await;
    assert_eq!(dead.get("delayq-reason"), Some("expired"));
    let (_, status) = api.get("/v1/messages/o3").await;
    assert_eq!(
        (status["dead_letter"].as_str(), status["target"].as_str()),
        (Some("present"), Some("{ops-t}exp")),
        "{status}"
    );
    assert_eq!(xlen(&mut conn, "{ops-t}exp"), 0);

    // The inbox: scheduled (then acknowledged and deleted), or rejected into
    // "{ops:inbox}:rejected", in the inbox's slot.
    xadd(
        &mut conn,
        "ops:inbox",
        &[
            ("delayq-stream", "ops-inboxed"),
            ("delayq-delay", "0"),
            ("delayq-id", "o4"),
            ("k", "v"),
        ],
    );
    xadd(&mut conn, "ops:inbox", &[("k", "no target")]);
    let inboxed = eventually(Duration::from_secs(10), "o4 delivered", || {
        std::future::ready(entries(&mut conn, "ops-inboxed").pop())
    })
    .await;
    assert_eq!(inboxed.get("delayq-id"), Some("o4"));
    let rejected = eventually(Duration::from_secs(10), "the bad entry rejected", || {
        std::future::ready(entries(&mut conn, "{ops:inbox}:rejected").pop())
    })
    .await;
    assert_eq!(rejected.get("k"), Some("no target"));
    eventually(Duration::from_secs(5), "the inbox emptied", || {
        std::future::ready((xlen(&mut conn, "ops:inbox") == 0).then_some(()))
    })
    .await;

    // A name with braces but no hash tag cannot share a slot with its dead letters.
    let (status, body) = api
        .post(
            "/v1/messages",
            json!({ "stream": "a{}b", "payload": "x", "delay_ms": 0 }),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("hash tag"),
        "{body}"
    );

    // A long poll waits on a cluster connection of its own for the stream's slot.
    let poll = api.get("/v1/streams/ops-poll/next?group=pg&consumer=c&wait=5s");
    let push = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        api.post(
            "/v1/messages",
            json!({ "stream": "ops-poll", "id": "o5", "payload": "p", "delay_ms": 0 }),
        )
        .await
    };
    let ((code, polled), (pushed, _)) = tokio::join!(poll, push);
    assert_eq!((code, pushed), (200, 201), "{polled}");
    assert_eq!(
        polled["messages"][0]["fields"][1],
        json!(["delayq-id", "o5"]),
        "{polled}"
    );

    // Stats count per slot.
    let (code, stats) = api.get("/v1/stats").await;
    assert_eq!(code, 200, "{stats}");
    assert_eq!(stats["pending"]["per_shard"], json!([]));
    assert!(stats["pending"]["per_slot"].is_object(), "{stats}");

    // `delayq fence show` reads every slot in use's fence.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delayq.toml");
    std::fs::write(&path, super::cluster_toml(&cluster, "ops", DELIVERY)).unwrap();
    let out = crate::support::delayq_with_config(&["fence", "show"], &path).await;
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{shown}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shown.contains("hash slots in use)"), "{shown}");
    assert!(!shown.starts_with("fence: 0 "), "{shown}");
    daemon.stop().await;
}

/// The one operation that takes two steps on Redis Cluster: an inbox entry's
/// message is stored (in its stream's slot), then the entry acknowledged (in the
/// inbox's). With the second step lost, as if the process died between them, the
/// entry stays pending; read again after a restart, its message is a duplicate, the
/// entry is acknowledged, and the message is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_entry_whose_acknowledgement_was_lost_is_delivered_once() {
    use delayq_client::store::faults::lose_inbox_acks;

    let cluster = shared_cluster();
    let config = cluster_config(&cluster, "ack", "[node]\nid = \"ack-node\"\n");
    let mut conn = reader(&cluster);
    lose_inbox_acks("ack:inbox", true);
    let daemon = delayq::start(config.clone()).await.expect("start delayq");
    xadd(
        &mut conn,
        "ack:inbox",
        &[
            ("delayq-stream", "ack-out"),
            ("delayq-delay", "0"),
            ("delayq-id", "a1"),
            ("k", "v"),
        ],
    );
    eventually(Duration::from_secs(10), "a1 delivered", || {
        std::future::ready((xlen(&mut conn, "ack-out") == 1).then_some(()))
    })
    .await;
    assert_eq!(
        xlen(&mut conn, "ack:inbox"),
        1,
        "the entry stays: not acknowledged"
    );
    daemon.stop().await;

    lose_inbox_acks("ack:inbox", false);
    let daemon = delayq::start(config).await.expect("start delayq again");
    eventually(Duration::from_secs(10), "the entry acknowledged", || {
        std::future::ready((xlen(&mut conn, "ack:inbox") == 0).then_some(()))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let delivered = entries(&mut conn, "ack-out");
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0].get("delayq-id"), Some("a1"));
    daemon.stop().await;
}

/// A pause is in force once answered, as on one Redis: every forward call reads its
/// slot's copy of the paused set, so messages due at once, pushed right after the
/// answer, all wait (with the leader's own read of the set alone, every 250 ms, most
/// of them went out); resumed, each is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_is_in_force_as_soon_as_it_is_answered() {
    let cluster = shared_cluster();
    let config = cluster_config(&cluster, "paused", "");
    let daemon = delayq::start(config).await.expect("start delayq");
    let api = Api::new(daemon.api_addr);
    let mut conn = reader(&cluster);
    let stream = "paused-orders";
    api.schedule("before", stream, 0).await;
    eventually(Duration::from_secs(10), "the leader forwarding", || {
        std::future::ready((xlen(&mut conn, stream) == 1).then_some(()))
    })
    .await;
    let (status, body) = api
        .post(&format!("/v1/streams/{stream}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    for i in 0..40 {
        api.schedule(&format!("o-{i:02}"), stream, 0).await;
    }
    eventually(Duration::from_secs(10), "all forty held", || async {
        let (_, streams) = api.get("/v1/streams").await;
        (stream_row(&streams, stream)?["held"] == 40).then_some(())
    })
    .await;
    assert_eq!(
        xlen(&mut conn, stream),
        1,
        "nothing pushed after the pause's answer went out"
    );
    let (status, body) = api
        .post(&format!("/v1/streams/{stream}/resume"), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    eventually(
        Duration::from_secs(10),
        "all delivered once resumed",
        || std::future::ready((xlen(&mut conn, stream) == 41).then_some(())),
    )
    .await;
    let ids: std::collections::HashSet<String> = entries(&mut conn, stream)
        .iter()
        .map(|e| e.get("delayq-id").unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 41);
    daemon.stop().await;
}

/// Streams paused in one call (what a restore from the journal puts back) are held
/// back by the forward script itself in each of their slots, before any leader has
/// read the paused set: a forward call given no budgets sends none of their due
/// messages and holds each.
#[tokio::test]
async fn streams_paused_in_one_call_are_held_in_each_of_their_slots() {
    use super::forwarding::{messages, schedule_all};
    use crate::support::now_ms;

    let cluster = shared_cluster();
    let config = cluster_config(&cluster, "pausemany", "");
    let store = delayq_client::store::Store::connect(&config.store_config())
        .await
        .expect("connect");
    let streams: Vec<String> = ["pm-a", "pm-b", "pm-c", "pm-d"].map(str::to_owned).into();
    let items = messages("pm", streams.len(), &streams, now_ms() - 1000, 1);
    schedule_all(&store, &items).await;
    store.pause_streams(&streams).await.expect("pause");
    let options = config.forward_options();
    for (item, stream) in items.iter().zip(&streams) {
        let shard = store.shard_of(&item.msg.id, stream);
        let batch = store
            .forward_at_most(shard, 1, &options, 100, &[])
            .await
            .expect("forward");
        assert_eq!((batch.forwarded, batch.newly_held), (0, 1), "{stream}");
    }
    assert!(streams.iter().all(|s| xlen(&mut reader(&cluster), s) == 0));
}

/// `delayq functions` on Redis Cluster: each master's libraries listed under its
/// address, and an older version's library removed from every master that holds
/// it, none refused by a master that does not.
#[tokio::test]
async fn functions_prune_reaches_every_master() {
    let cluster = shared_cluster();
    let config = cluster_toml(&cluster, "fnprune", "");
    let masters: Vec<usize> = (0..cluster.nodes.len())
        .filter(|&i| cluster.master_of_node(i))
        .collect();
    assert_eq!(masters.len(), 3);
    // Only on two of the three masters, as after a master joined later.
    let old = "delayq_00000000000000bb";
    for &i in &masters[..2] {
        load_library(&mut cluster.nodes[i].client(), old);
    }
    let at = |i: usize| format!("127.0.0.1:{}", cluster.nodes[i].port);

    let (ok, listed) = functions(&config, &["list"]).await;
    assert!(ok, "{listed}");
    for &i in &masters {
        assert!(listed.contains(&format!("{}: ", at(i))), "{listed}");
    }
    assert_eq!(
        listed
            .matches(&format!("{old}  1 function  (another version)"))
            .count(),
        2,
        "{listed}"
    );

    let (ok, pruned) = functions(&config, &["prune"]).await;
    assert!(ok, "{pruned}");
    for &i in &masters[..2] {
        assert!(
            pruned.contains(&format!("removed {old} on {}\n", at(i))),
            "{pruned}"
        );
    }
    for &i in &masters {
        assert!(
            !libraries(&mut cluster.nodes[i].client()).contains(&old.to_owned()),
            "{pruned}"
        );
    }
}
