//! `election.mode = "per_shard"` on Redis Cluster: the hash slots split into
//! election groups, three real `delayq` processes each leading a share; one is
//! SIGKILLed while messages fall due, and its groups move to the others with every
//! message forwarded once, none early. The lease is 6 s: the takeover must come
//! from the presence watch (every node's presence on one master), not its expiry;
//! that master's own failover ends no lease.

use std::time::{Duration, Instant};

use delayq_client::store::{Keys, Store};
use delayq_harness::{DelayqProcess, EtcdServer, RedisCluster};

use super::forwarding::{check_exactly_once, messages, schedule_all};
use super::{cluster_config, cluster_toml, kill_master_of, own_cluster, reader, shared_cluster};
use crate::support::now_ms;
use crate::support::{
    Api, OneLeader, counter, delayq_bin, eventually, kill_and_time_takeover, led_groups, logs_of,
};

const GROUPS: usize = 3;
/// A takeover by the presence watch, with room for a loaded machine; by lease
/// expiry (6 s) it would take at least 4 s.
const FAST: Duration = Duration::from_millis(2_500);

/// An etcd, and three `delayq run` processes on `cluster` under `prefix` (named
/// `<prefix>0`…) elected through it with a 6 s lease and `extra` (TOML), with
/// their APIs.
fn start_nodes(
    cluster: &RedisCluster,
    prefix: &str,
    extra: &str,
) -> (EtcdServer, Vec<DelayqProcess>, Vec<Api>) {
    let etcd = EtcdServer::start().expect("start etcd");
    let settings = format!(
        "[etcd]\nendpoints = [\"{}\"]\nlease_ttl = \"6s\"\n{extra}",
        etcd.endpoint()
    );
    let text = cluster_toml(cluster, prefix, &settings);
    let nodes: Vec<DelayqProcess> = (0..3)
        .map(|i| {
            DelayqProcess::start(&delayq_bin(), &format!("{prefix}{i}"), &text)
                .expect("start delayq")
        })
        .collect();
    let apis = nodes
        .iter()
        .map(|n| Api::new(n.api).with_timeout(Duration::from_secs(2)))
        .collect();
    (etcd, nodes, apis)
}

/// The groups `api` leads (None when it does not answer).
async fn led(api: &Api) -> Option<Vec<usize>> {
    Some(led_groups(api).await?.into_iter().map(|(g, _)| g).collect())
}

/// Some(counts) once every group is led by exactly one of `apis`, each leading one
/// at least.
async fn spread(apis: &[Api], live: &[usize]) -> Option<Vec<usize>> {
    let mut holders = [0usize; GROUPS];
    let mut counts = Vec::new();
    for &i in live {
        let groups = led(&apis[i]).await?;
        counts.push(groups.len());
        for g in groups {
            holders[g] += 1;
        }
    }
    (holders.iter().all(|n| *n == 1) && counts.iter().all(|n| *n > 0)).then_some(counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_of_slots_spread_over_leaders_and_move_when_one_is_killed() {
    let cluster = shared_cluster();
    let election = format!("[election]\nmode = \"per_shard\"\ngroups = {GROUPS}\n");
    let (_etcd, mut nodes, apis) = start_nodes(&cluster, "groups", &election);
    eventually(
        Duration::from_secs(20),
        "one group led by each node",
        || spread(&apis, &[0, 1, 2]),
    )
    .await;

    let store = Store::connect(&cluster_config(&cluster, "groups", "").store_config())
        .await
        .unwrap();
    let streams: Vec<String> = (0..24).map(|i| format!("groups-s{i}")).collect();
    let items = messages("groups", 6000, &streams, now_ms() + 300, 5000);
    schedule_all(&store, &items).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = Instant::now();
    nodes[0].kill();
    eventually(
        Duration::from_secs(15),
        "the killed node's group taken over",
        || spread(&apis, &[1, 2]),
    )
    .await;
    let took = killed_at.elapsed();
    println!("per-group SIGKILL takeover on Redis Cluster with a 6 s lease: {took:?}");
    assert!(took < FAST, "the takeover waited for the lease: {took:?}");
    let mut conn = reader(&cluster);
    tokio::task::spawn_blocking(move || {
        check_exactly_once(&mut conn, &streams, &items, Duration::from_secs(60));
    })
    .await
    .unwrap();
    drop(nodes);
}

/// Waits 4 s, past the standbys' grace after they subscribed again, and checks
/// that no node's takeover watch ended a lease while `what` happened.
async fn no_lease_ended(apis: &[Api], what: &str, logs: impl Fn() -> String) {
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut ended = 0.0;
    for api in apis {
        let text = api.metrics().await.expect("metrics");
        ended += counter(&text, "delayq_leader_leases_ended_total");
    }
    assert_eq!(
        ended,
        0.0,
        "a standby ended a lease while {what}\n{}",
        logs()
    );
}

/// Every node's presence lives on the master of one slot. Killing that master
/// breaks every presence at once, which singles out nobody: no standby ends a
/// lease meanwhile. Once its replica took over, the presences are held there
/// again, and they follow the slot to the master it is then moved to: a leader
/// SIGKILLed afterwards is taken over long before its lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_follows_its_slot_through_a_failover_and_a_move_ending_no_lease() {
    let cluster = own_cluster().await;
    let (_etcd, mut nodes, apis) = start_nodes(&cluster, "presence", "");
    let (leader, epoch) = OneLeader::among(&apis).wait(|| logs_of(&nodes)).await;
    // The standbys judge once they have held their presence for 2 s.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let slot = Keys::cluster("presence").presence_slot();
    let victim = cluster.master_of(slot).unwrap();
    let cluster = kill_master_of(cluster, slot).await;
    no_lease_ended(&apis, "the presence master failed over", || logs_of(&nodes)).await;
    let (now, after) = OneLeader::among(&apis).wait(|| logs_of(&nodes)).await;
    println!(
        "presence master (Redis node {victim}) killed: n{leader} (epoch {epoch}) led before, n{now} (epoch {after}) after"
    );
    let (leader, epoch) = (now, after);

    // The slot moved to another master: everybody subscribes there again.
    let cluster = tokio::task::spawn_blocking(move || {
        let from = cluster.master_of(slot).unwrap();
        let to = (0..6)
            .find(|&i| i != from && cluster.master_of_node(i))
            .expect("another master");
        cluster.move_slot(slot, to, 10, Duration::ZERO).unwrap();
        cluster
    })
    .await
    .unwrap();
    no_lease_ended(&apis, "the presence slot moved", || logs_of(&nodes)).await;

    let (next, took) = kill_and_time_takeover(&mut nodes, &apis, (leader, epoch)).await;
    println!(
        "after the presence master's failover and the slot's move: n{leader} SIGKILLed, n{next} leads after {took:?}"
    );
    assert!(
        took < FAST,
        "the takeover waited for the lease: {took:?}\n{}",
        logs_of(&nodes)
    );
    drop(nodes);
    drop(cluster);
}
