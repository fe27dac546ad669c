//! Redis Cluster, on a real cluster of three masters and three replicas (shared by
//! the tests that run at once, stopped once the last lets it go). delayq runs on a
//! standalone Redis or one behind Sentinel: pointed at a Cluster node, the daemon,
//! `delayq fence` and the Rust client refuse at once and say why, instead of failing call
//! by call with MOVED and CROSSSLOT errors.

use std::sync::{Arc, Mutex, Weak};

use delayq::harness::RedisCluster;
use delayq::store::{Store, StoreError};

use crate::support::{self, delayq_bin};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_is_refused_at_once_with_the_reason() {
    let cluster = shared_cluster();
    let url = &cluster.urls()[0];
    const REASON: &str = "this is a Redis Cluster node (cluster_enabled:1): delayq runs on a \
                          standalone Redis or one behind Sentinel; Redis Cluster is not supported yet";

    // The daemon exits (1) naming the node and the reason.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delayq.toml");
    std::fs::write(&path, format!("[redis]\nurl = \"{url}\"\n")).unwrap();
    let delayq = |command: &'static [&'static str]| {
        tokio::process::Command::new(delayq_bin())
            .args(command)
            .arg("--config")
            .arg(&path)
            .env_remove("DELAYQ_CONFIG")
            .output()
    };
    let out = delayq(&["run"]).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("connect to Redis at {url}")) && stderr.contains(REASON),
        "{stderr}"
    );

    // So do the operators' commands that speak to Redis, and the Rust client.
    let out = delayq(&["fence", "show"]).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(REASON), "{stderr}");
    match Store::connect(&support::config(url, "").store_config()).await {
        Err(StoreError::Unsupported(reason)) => assert_eq!(reason, REASON),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a Redis Cluster node was taken for a standalone Redis"),
    }
}
