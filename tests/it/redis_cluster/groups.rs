//! `election.mode = "per_shard"` on Redis Cluster: the hash slots split into
//! election groups, three real `delayq` processes each leading a share; one is
//! SIGKILLed while messages fall due, and its groups move to the others with every
//! message forwarded once, none early.

use std::time::Duration;

use delayq::harness::{DelayqProcess, EtcdServer};
use delayq::store::Store;

use super::forwarding::{check_exactly_once, messages, now_ms, schedule_all};
use super::{cluster_config, cluster_toml, reader, shared_cluster};
use crate::support::{Api, delayq_bin, eventually};

const GROUPS: usize = 3;

/// The groups `api` leads (None when it does not answer).
async fn led(api: &Api) -> Option<Vec<usize>> {
    let (status, view) = api.try_get("/v1/leader").await?;
    (status == 200).then_some(())?;
    Some(
        view["groups"]
            .as_array()?
            .iter()
            .filter(|g| g["is_leader"] == true)
            .filter_map(|g| g["group"].as_u64().map(|g| g as usize))
            .collect(),
    )
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
    let etcd = EtcdServer::start().expect("start etcd");
    let settings = format!(
        "[etcd]\nendpoints = [\"{}\"]\nlease_ttl = \"2s\"\n[election]\nmode = \"per_shard\"\ngroups = {GROUPS}\n",
        etcd.endpoint()
    );
    let text = cluster_toml(&cluster, "groups", &settings);
    let mut nodes: Vec<DelayqProcess> = (0..3)
        .map(|i| {
            DelayqProcess::start(&delayq_bin(), &format!("g{i}"), &text).expect("start delayq")
        })
        .collect();
    let apis: Vec<Api> = nodes
        .iter()
        .map(|n| Api::new(n.api).with_timeout(Duration::from_secs(2)))
        .collect();
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
    nodes[0].kill();
    eventually(
        Duration::from_secs(15),
        "the killed node's group taken over",
        || spread(&apis, &[1, 2]),
    )
    .await;
    let mut conn = reader(&cluster);
    tokio::task::spawn_blocking(move || {
        check_exactly_once(&mut conn, &streams, &items, Duration::from_secs(60));
    })
    .await
    .unwrap();
    drop(nodes);
}
