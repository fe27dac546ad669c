//! The leader goes: killed (its lease runs out first), terminated (it resigns on
//! the way out), or asked to resign over HTTP and with the CLI.

use std::process::Command;
use std::time::{Duration, Instant};

use super::{TTL, check_exactly_once, flowing, takeover, under_load};
use crate::support::{Cluster, delayq_bin, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_leader_fails_over_within_the_ttl_without_loss() {
    let (mut cluster, mut leader, _, producer, monitor) = under_load(1).await;
    let mut takeovers = Vec::new();
    for _ in 0..3 {
        flowing(&cluster, 10).await;
        let killed_at = Instant::now();
        cluster.nodes[leader].kill();
        let (next, _, took) =
            takeover(&cluster, leader, killed_at, TTL + Duration::from_secs(1)).await;
        takeovers.push(took);
        cluster.nodes[leader]
            .restart()
            .expect("restart the killed node");
        leader = next;
    }
    flowing(&cluster, 10).await;
    let pushed = producer.stop().await;
    let report = monitor.finish().await;
    let delivery = check_exactly_once(&cluster, &pushed).await;
    println!(
        "SIGKILL takeovers: {takeovers:?}; {delivery:?}; epochs {:?}",
        report.order
    );
}

/// `POST /v1/admin/resign` on node `i`: its status and answer. A handover takes a
/// moment, so the request may too.
async fn resign(cluster: &Cluster, i: usize) -> (u16, serde_json::Value) {
    cluster.apis[i]
        .clone()
        .with_timeout(Duration::from_secs(10))
        .call("POST", "/v1/admin/resign", None, None)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_resign_hand_over_at_once_without_loss() {
    let (mut cluster, mut leader, _, producer, monitor) = under_load(1).await;
    let mut handovers = Vec::new();
    for _ in 0..3 {
        flowing(&cluster, 10).await;
        let signalled = Instant::now();
        cluster.nodes[leader].signal(libc::SIGTERM);
        let (next, _, took) = takeover(&cluster, leader, signalled, Duration::from_secs(1)).await;
        handovers.push(took);
        let status = cluster.nodes[leader].wait_exit(Duration::from_secs(5));
        assert!(
            status.is_some_and(|s| s.success()),
            "exit status after SIGTERM: {status:?}"
        );
        cluster.nodes[leader]
            .restart()
            .expect("restart the stopped node");
        leader = next;
    }

    // Planned switchover over HTTP, then with the CLI; a standby refuses.
    let standby = (leader + 1) % 3;
    let (status, body) = resign(&cluster, standby).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("not_leader")),
        "{body}"
    );
    let asked = Instant::now();
    let (status, body) = resign(&cluster, leader).await;
    assert_eq!(
        (status, body["resigned"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    let (next, _, took) = takeover(&cluster, leader, asked, Duration::from_secs(1)).await;
    handovers.push(took);

    let asked = Instant::now();
    let out = Command::new(delayq_bin())
        .args(["resign", "--url", &cluster.apis[next].url("")])
        .output()
        .expect("run delayq resign");
    assert!(
        out.status.success(),
        "delayq resign: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (last, _, took) = takeover(&cluster, next, asked, Duration::from_secs(1)).await;
    handovers.push(took);

    // What every node says about the leader.
    let (_, on_leader) = cluster.apis[last].get("/v1/leader").await;
    assert_eq!(on_leader["is_leader"], true, "{on_leader}");
    let lease_left = on_leader["lease_left_ms"].as_u64().expect("lease_left_ms");
    assert!(
        lease_left > 0 && lease_left <= TTL.as_millis() as u64,
        "{on_leader}"
    );
    assert!(on_leader["since_ms"].as_u64().is_some(), "{on_leader}");
    let name = cluster.nodes[last].name.clone();
    let address = cluster.nodes[last].api.to_string();
    for api in &cluster.apis {
        let view = eventually(
            Duration::from_secs(3),
            "standbys learn the leader",
            || async {
                let (_, v) = api.get("/v1/leader").await;
                (v["leader"]["node_id"] == name.as_str()).then_some(v)
            },
        )
        .await;
        assert_eq!(view["leader"]["address"], address.as_str(), "{view}");
        assert_eq!(view["mode"], "etcd", "{view}");
        let (status, ready) = api.get("/readyz").await;
        assert_eq!(
            (status, ready["etcd"].as_str()),
            (200, Some("ok")),
            "{ready}"
        );
    }

    let pushed = producer.stop().await;
    monitor.finish().await;
    let delivery = check_exactly_once(&cluster, &pushed).await;
    println!(
        "SIGTERM, SIGTERM, SIGTERM, API resign, CLI resign handovers: {handovers:?}; {delivery:?}"
    );
}
