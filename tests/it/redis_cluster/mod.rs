//! Redis Cluster (`redis.mode = "cluster"`), on real clusters of three masters and
//! three replicas: one shared by the tests that only read and write through delayq
//! (stopped once the last lets it go), and one of its own for each test that kills
//! a master or moves a slot. A stream's messages live in its own hash slot, so the
//! forward script runs there unchanged; these tests check that every message is
//! forwarded exactly once, none early, through failovers and slot migrations.

mod failover;
mod fences;
mod forwarding;
mod groups;
mod journal;
mod operations;

use std::sync::{Arc, Mutex, Weak};

use delayq_client::config::Config;
use delayq_client::store::{Store, StoreError};
use delayq_harness::RedisCluster;

use crate::support::{self, toml_layers};

/// The cluster the tests running now share, started by the first.
fn shared_cluster() -> Arc<RedisCluster> {
    static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(cluster) = shared.upgrade() {
        return cluster;
    }
    let cluster = Arc::new(RedisCluster::start(3).expect("start a Redis Cluster"));
    *shared = Arc::downgrade(&cluster);
    cluster
}

/// The config text of a node on `cluster` (every node a seed), a test prefix of
/// its own, with `extra` (TOML) merged over it.
pub(crate) fn cluster_toml(cluster: &RedisCluster, prefix: &str, extra: &str) -> String {
    let base = format!(
        "[redis]\n{}prefix = \"{prefix}\"\n",
        cluster.redis_section()
    );
    toml_layers(&[&base, extra])
}

/// [`cluster_toml`] as a config, with an ephemeral API port.
fn cluster_config(cluster: &RedisCluster, prefix: &str, extra: &str) -> Config {
    let text = cluster_toml(
        cluster,
        prefix,
        &toml_layers(&["[api]\nlisten = \"127.0.0.1:0\"\n", extra]),
    );
    Config::from_toml(&text, std::iter::empty())
        .unwrap_or_else(|e| panic!("test config: {e}\n{text}"))
}

/// A cluster of its own, for a test that kills a master or moves a slot (started
/// on a thread of its own: the harness waits blocking).
pub(crate) async fn own_cluster() -> RedisCluster {
    tokio::task::spawn_blocking(|| RedisCluster::start(3).expect("start a Redis Cluster"))
        .await
        .unwrap()
}

/// SIGKILLs the master of `slot` and waits until its replica serves the slot
/// (the harness waits blocking, so on a thread of its own); returns the cluster.
async fn kill_master_of(cluster: RedisCluster, slot: u16) -> RedisCluster {
    kill_master_timed(cluster, slot).await.0
}

/// [`kill_master_of`], and when the master was killed (epoch ms).
pub(crate) async fn kill_master_timed(mut cluster: RedisCluster, slot: u16) -> (RedisCluster, u64) {
    tokio::task::spawn_blocking(move || {
        let victim = cluster.master_of(slot).unwrap();
        let killed = cluster.kill_master(victim).unwrap();
        let ms = killed
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        (cluster, ms)
    })
    .await
    .unwrap()
}

/// A synchronous cluster connection for the test's own reads.
pub(crate) fn reader(cluster: &RedisCluster) -> redis::cluster::ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .and_then(|c| c.get_connection())
        .expect("connect to the Redis Cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_is_refused_unless_cluster_mode_is_set() {
    let cluster = shared_cluster();
    let url = &cluster.urls()[0];
    const REASON: &str = "this is a Redis Cluster node (cluster_enabled:1): set redis.mode = \
                          \"cluster\" to run on Redis Cluster (seed nodes in redis.url and redis.nodes)";

    // The daemon exits (1) naming the node and the reason.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delayq.toml");
    std::fs::write(&path, format!("[redis]\nurl = \"{url}\"\n")).unwrap();
    let delayq = |args: &'static [&'static str]| support::delayq_with_config(args, &path);
    let out = delayq(&["run"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("connect to Redis at {url}"))
            && stderr.contains(&REASON.replace('"', "\\\"")),
        "{stderr}"
    );

    // So do the operators' commands that speak to Redis, and the Rust client.
    let out = delayq(&["fence", "show"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(REASON), "{stderr}");
    match Store::connect(&support::config(url, "").store_config()).await {
        Err(StoreError::Unsupported(reason)) => assert_eq!(reason, REASON),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a Redis Cluster node was taken for a standalone Redis"),
    }

    // With the mode set, the same node is a seed, and the store reaches the cluster.
    let config = cluster_config(&cluster, "refused", "");
    let store = Store::connect(&config.store_config())
        .await
        .expect("connect");
    assert!(store.is_cluster());
    assert_eq!(store.shards_in_use().await.unwrap(), Vec::<u16>::new());
}
