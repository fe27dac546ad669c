//! etcd itself under test: restarted, losing one member of three (its raft leader),
//! the leader key deleted by hand, and rebuilt empty under a fence an older
//! cluster left in Redis.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use delayq_client::message::NewMessage;
use delayq_client::store::{ScheduleMode, Store};
use delayq_harness::{DelayqProcess, EtcdServer, RedisServer};

use super::{
    STREAM, TTL, campaigners, check_exactly_once, etcd_client, flowing, takeover, under_load,
};
use crate::support::{
    Api, OneLeader, counter, delayq_bin, entries, etcd_config, eventually, patience,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_restart_keeps_or_reforms_leadership_without_loss() {
    let (mut cluster, _, before, producer, monitor) = under_load(1).await;
    cluster.etcd[0].restart().expect("restart etcd");
    cluster.etcd[0].wait_ready().expect("etcd back");
    let (_, after) = cluster
        .one_leader()
        .within(Duration::from_secs(10))
        .wait(|| cluster.logs())
        .await;
    flowing(&cluster, 10).await;
    let pushed = producer.stop().await;
    monitor.finish().await;
    let delivery = check_exactly_once(&cluster, &pushed).await;
    println!("etcd restart: epoch {before} -> {after}; {delivery:?}");
}

/// The raft leader etcd's members see, by member id (0 while there is none).
async fn raft_leader(member: &EtcdServer) -> Option<u64> {
    let status = etcd_client(&member.endpoint()).await.status().await.ok()?;
    Some(status.leader())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_of_three_etcd_members_does_not_interrupt_forwarding() {
    let (mut cluster, leader, epoch, producer, monitor) = under_load(3).await;

    // Kill etcd's own raft leader: the harder case (an etcd election follows).
    let mut found = None;
    for (i, member) in cluster.etcd.iter().enumerate() {
        let status = etcd_client(&member.endpoint())
            .await
            .status()
            .await
            .expect("etcd status");
        let id = status.header().expect("header").member_id();
        if status.leader() == id {
            found = Some((i, id));
        }
    }
    let (raft_leader_member, killed_id) = found.expect("etcd has a raft leader");
    cluster.etcd[raft_leader_member].kill();
    // The others elect a raft leader of their own; forwarding goes on meanwhile and
    // after (anything held up would show in the lateness below).
    for (_, member) in cluster
        .etcd
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != raft_leader_member)
    {
        eventually(
            Duration::from_secs(5),
            "the remaining etcd members elect a raft leader",
            || async {
                let id = raft_leader(member).await?;
                (id != 0 && id != killed_id).then_some(())
            },
        )
        .await;
    }
    flowing(&cluster, 20).await;

    let pushed = producer.stop().await;
    let report = monitor.finish().await;
    assert_eq!(
        cluster.leaders().await,
        vec![(leader, epoch)],
        "the same leader, same term\n{}",
        cluster.logs()
    );
    assert_eq!(report.order, vec![epoch], "no other term began");
    let delivery = check_exactly_once(&cluster, &pushed).await;
    assert!(
        delivery.max_lateness_ms < 1500 * patience() as u64,
        "forwarding was interrupted: {delivery:?}"
    );
    println!("etcd member (raft leader m{raft_leader_member}) killed: {delivery:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_leader_key_by_hand_makes_the_leader_step_down() {
    let (cluster, leader, epoch, producer, monitor) = under_load(1).await;

    let mut etcd = etcd_client(&cluster.etcd[0].endpoint()).await;
    let keys = campaigners(&mut etcd).await;
    let (key, _) = keys
        .iter()
        .find(|(_, rev)| *rev as u64 == epoch)
        .expect("the leader's key")
        .clone();
    let deleted_at = Instant::now();
    etcd.delete(key, None).await.expect("delete the leader key");
    let (_, new_epoch, took) = takeover(&cluster, leader, deleted_at, TTL).await;
    assert!(new_epoch > epoch);
    flowing(&cluster, 10).await;

    let pushed = producer.stop().await;
    monitor.finish().await;
    let delivery = check_exactly_once(&cluster, &pushed).await;
    println!("leader key deleted: new leader after {took:?}; {delivery:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_left_by_an_older_etcd_cluster_is_reported_and_can_be_reset() {
    let redis = RedisServer::start().expect("start redis-server");
    let etcd = EtcdServer::start().expect("start etcd");
    let store = Store::connect(&crate::support::config(&redis.url(), "").store_config())
        .await
        .unwrap();
    // What the leaders of a previous etcd cluster left behind.
    store.raise_fences(1_000_000).await.unwrap();
    let (config, node, api) = elected_node(&redis, &etcd);
    let fenced = Arc::new(AtomicUsize::new(0));
    eventually(
        Duration::from_secs(5),
        "the new leader is fenced",
        || async {
            let n = counter(&api.metrics().await?, "delayq_fenced_total");
            fenced.store(n as usize, Ordering::Relaxed);
            (n >= 1.0).then_some(())
        },
    )
    .await;
    // Fenced, it steps down: no leader until its next win, which it tries again
    // after a backoff that starts short (so a single look may fall inside a term
    // that is about to be fenced again).
    eventually(
        Duration::from_secs(10),
        "the fenced node not leading",
        || async { (api.status("/leader").await == Some(503)).then_some(()) },
    )
    .await;

    let config_path = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config_path.path(), &config).unwrap();
    let fence = |args: &[&str]| {
        let out = Command::new(delayq_bin())
            .arg("fence")
            .args(args)
            .arg("--config")
            .arg(config_path.path())
            .output()
            .expect("run delayq fence");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, shown) = fence(&["show"]);
    assert!(
        ok && shown.contains("fence: 1000000")
            && shown.contains("warning: etcd's revision is below the fence"),
        "{shown}"
    );
    let (ok, refused) = fence(&["reset", "--epoch", "999999"]);
    assert!(
        !ok && refused.contains("above etcd's revision"),
        "{refused}"
    );
    let (ok, reset) = fence(&["reset", "--epoch", "0"]);
    assert!(ok && reset.contains("fence reset: 1000000 -> 0"), "{reset}");

    // The node leads at its next win (its backoff after repeated fencing is at most 5 s).
    OneLeader::among(std::slice::from_ref(&api))
        .within(Duration::from_secs(8))
        .wait(|| node.log())
        .await;
    forwards_one(&store, &redis, "after reset").await;
    assert!(
        store.highest_fence().await.unwrap() > 0,
        "the new leader raised the fence again"
    );
    println!(
        "rebuilt etcd: fenced {} times before the reset",
        fenced.load(Ordering::Relaxed)
    );
}

/// A deployment that ran standalone (epochs from a counter in Redis) and is then
/// elected through a fresh etcd: the first leaders win below that fence, are
/// fenced, say why (the standalone run named first) and, as each campaign raises
/// etcd's revision, one leads within a few elections, with no reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_standalone_run_the_first_elected_leader_is_fenced_says_why_and_leads_soon() {
    let redis = RedisServer::start().expect("start redis-server");
    let standalone = format!("[redis]\nurl = \"{}\"\nshards = 4\n", redis.url());
    let mut standalone_epoch = 0;
    while standalone_epoch < 6 {
        let mut node =
            DelayqProcess::start(&delayq_bin(), "alone", &standalone).expect("start delayq");
        let api = Api::new(node.api);
        standalone_epoch = eventually(
            Duration::from_secs(10),
            "the standalone instance leads",
            || async {
                let (status, view) = api.try_call("GET", "/leader", None, None).await.ok()?;
                (status == 200).then(|| view["epoch"].as_u64()).flatten()
            },
        )
        .await;
        node.terminate(Duration::from_secs(10));
    }

    let etcd = EtcdServer::start().expect("start etcd");
    let (_, node, api) = elected_node(&redis, &etcd);
    // A leader below the fence leads until its first script is refused: wait for
    // one at or above it (equal passes the fence too).
    let epoch = eventually(
        Duration::from_secs(15),
        "a leader not below the standalone fence",
        || async {
            let (status, view) = api.try_call("GET", "/leader", None, None).await.ok()?;
            let epoch = view["epoch"].as_u64().filter(|_| status == 200)?;
            (epoch >= standalone_epoch).then_some(epoch)
        },
    )
    .await;
    let fenced = counter(
        &api.metrics().await.expect("metrics"),
        "delayq_fenced_total",
    );
    assert!(
        fenced >= 1.0,
        "the first leader was not fenced:\n{}",
        node.full_log()
    );
    let log = node.full_log();
    assert!(
        log.contains("a standalone instance (etcd.endpoints = []) ran on this Redis"),
        "{log}"
    );
    let store = Store::connect(&crate::support::config(&redis.url(), "").store_config())
        .await
        .unwrap();
    forwards_one(&store, &redis, "after standalone").await;
    println!(
        "standalone epoch {standalone_epoch}, then elected at {epoch} after {fenced} fencings"
    );
}

/// A node of 4 shards elected through `etcd`: its config, the process and its API.
fn elected_node(redis: &RedisServer, etcd: &EtcdServer) -> (String, DelayqProcess, Api) {
    let config = etcd_config(
        &redis.url(),
        &[etcd.endpoint()],
        "[redis]\nshards = 4\n[etcd]\ncluster = \"ha\"\n",
    );
    let node = DelayqProcess::start(&delayq_bin(), "n0", &config).expect("start delayq");
    let api = Api::new(node.api);
    (config, node, api)
}

/// Schedules one message due now and waits until the leader has forwarded it.
async fn forwards_one(store: &Store, redis: &RedisServer, payload: &str) {
    let msg = NewMessage::payload(STREAM, payload, Duration::ZERO);
    store
        .schedule(&msg, ScheduleMode::New, Duration::from_secs(60))
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "a message is forwarded", || async {
        (!entries(&mut redis.client(), STREAM).is_empty()).then_some(())
    })
    .await;
}
