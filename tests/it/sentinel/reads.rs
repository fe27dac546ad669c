//! Blocking reads through a planned failover: the inbox's reads and the HTTP long
//! polls wait in `XREADGROUP … BLOCK` on connections of their own. The old master
//! of a planned switch goes on answering until Sentinel makes it a replica
//! (seconds later, minutes on a loaded machine); reads left there would find
//! nothing of what producers write to the new master meanwhile.

use super::*;
use crate::support::{blocked_clients, now_ms};

const INBOX: &str = "delayq:inbox";

/// `XADD`s an inbox entry for stream `s`, due at once, carrying `n`.
fn send_to_inbox(node: &RedisServer, n: &str) {
    let _: String = redis::cmd("XADD")
        .arg(INBOX)
        .arg("*")
        .arg("delayq-stream")
        .arg("s")
        .arg("delayq-delay")
        .arg("0")
        .arg("n")
        .arg(n)
        .query(&mut node.client())
        .expect("XADD to the inbox");
}

/// When the entry carrying `n` was written to stream `s` on `node` (by its id), if
/// it was.
fn delivered_at(node: &RedisServer, n: &str) -> Option<u64> {
    entries_on(node, "s")
        .iter()
        .find(|e| e.get("n") == Some(n))
        .map(Entry::ms)
}

/// The inbox's entries read but not acknowledged on `node`: id, consumer, ms since
/// it was read, times read (`XPENDING`).
fn pending_entries(node: &RedisServer) -> redis::Value {
    redis::cmd("XPENDING")
        .arg(INBOX)
        .arg("delayq")
        .arg("-")
        .arg("+")
        .arg(100)
        .query(&mut node.client())
        .unwrap_or(redis::Value::Nil)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_planned_failover_the_inbox_and_long_polls_read_the_new_master_at_once() {
    let watched = watched(1).await;
    // How the reads moved, in the logs printed if the test fails.
    let logged = "[log]\nlevel = \"info,delayq_client::store::conn=debug\"\n";
    let (nodes, _apis) = instances(&[("a", &format!("{}{logged}", config(&watched, "")))]);
    send_to_inbox(&watched.master, "before");
    eventually(
        Duration::from_secs(20),
        "the inbox entry delivered",
        || async { delivered_at(&watched.master, "before") },
    )
    .await;
    // A consumer's long poll, waiting once every entry so far is read.
    let poller = Api::new(nodes[0].api).with_timeout(Duration::from_secs(40));
    let next = "/v1/streams/s/next?group=g&consumer=c&count=10";
    let (status, answer) = poller
        .call("GET", &format!("{next}&wait=0"), None, None)
        .await;
    assert_eq!(status, 200, "{answer}");
    let poll = tokio::spawn(async move {
        let answer = poller
            .call("GET", &format!("{next}&wait=30s"), None, None)
            .await;
        (answer, Instant::now())
    });
    // The inbox's read and the poll.
    eventually(Duration::from_secs(10), "both reads blocked", || async {
        (blocked_clients(&mut watched.master.client()) >= 2).then_some(())
    })
    .await;

    let new_master = planned_failover(&watched, 0).await;
    let (promoted, promoted_ms) = (Instant::now(), now_ms());
    send_to_inbox(new_master, "after");
    let delivered_ms = eventually(
        Duration::from_secs(20),
        "the entry sent to the new master's inbox delivered",
        || async { delivered_at(new_master, "after") },
    )
    .await;
    let delivered = Duration::from_millis(delivered_ms.saturating_sub(promoted_ms));
    let old_role = watched.master.replication("role");
    let ((status, answer), answered) = poll.await.expect("the poll");
    assert_eq!(status, 200, "{answer}");
    let fields = &answer["messages"][0]["fields"];
    assert!(
        fields
            .as_array()
            .is_some_and(|f| f.contains(&json!(["n", "after"]))),
        "the poll answered {answer}\ninbox entries pending on the new master: {:?}\n{}",
        pending_entries(new_master),
        logs_of(&nodes)
    );
    let polled = answered.duration_since(promoted);
    assert!(
        delivered < Duration::from_secs(5) && polled < Duration::from_secs(5),
        "the inbox took {delivered:?} and the poll {polled:?} after the promotion\n{}",
        logs_of(&nodes)
    );
    // Both before Sentinel reconfigured the old master (which breaks its clients'
    // connections): the reads had moved by themselves.
    assert_eq!(
        old_role.as_deref(),
        Some("master"),
        "the old master was reconfigured first"
    );
    println!(
        "planned failover: inbox entry delivered {delivered:?}, long poll answered {polled:?} after the promotion"
    );
}
