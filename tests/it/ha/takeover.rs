//! Takeover without waiting out the lease: a standby that sees the leader gone
//! from Redis (its process dead, or cut off from Redis while etcd still renews its
//! lease) ends the leader's lease; a leader that is only slow keeps its role, and a
//! Redis restart seen by everybody moves nobody. The lease here is 6 s, so a
//! takeover by lease expiry would take 4 s or more.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::{Delivery, Monitor, Producer, check_exactly_once, flowing, node_counter, takeover};
use crate::support::{Cluster, eventually, never};
use delayq::election::LEADER_IN_SIGHT;
use delayq_harness::Proxy;

const LONG_TTL: &str =
    "[redis]\nshards = 4\n[etcd]\ncluster = \"ha\"\nlease_ttl = \"6s\"\n[log]\nlevel = \"info\"\n";
const LEASES_ENDED: &str = "delayq_leader_leases_ended_total";

/// Leases ended by any node so far.
async fn leases_ended(cluster: &Cluster) -> f64 {
    let mut sum = 0.0;
    for i in 0..cluster.nodes.len() {
        sum += node_counter(cluster, i, LEASES_ENDED).await;
    }
    sum
}

/// Three nodes with a 6 s lease, n0 reaching Redis through the returned proxy
/// (the others directly), so that n0 alone can be cut off from Redis or stalled.
async fn n0_through_a_proxy() -> (Proxy, Cluster) {
    let proxy = Proxy::start().await;
    let cluster = Cluster::start_via(3, 1, LONG_TTL, |i, url| {
        proxy.lead_to(url);
        if i == 0 {
            proxy.redis_url()
        } else {
            url.to_owned()
        }
    })
    .await;
    (proxy, cluster)
}

/// Three nodes with a 6 s lease under load; returns the leader once the standbys
/// have held their presence long enough to judge (about 2 s of deliveries).
async fn settled(cluster: &Cluster) -> (usize, u64, Producer, Monitor) {
    let (leader, epoch) = cluster.one_leader().wait(|| cluster.logs()).await;
    let producer = Producer::start(&cluster.store);
    let monitor = Monitor::start(&cluster.apis);
    // One message every 20 ms: 120 deliveries take about 2.4 s.
    flowing(cluster, 120).await;
    (leader, epoch, producer, monitor)
}

/// Stops the load `settled` started; checks every push arrived exactly once.
async fn stop_load(cluster: &Cluster, producer: Producer, monitor: Monitor) -> Delivery {
    let pushed = producer.stop().await;
    monitor.finish().await;
    check_exactly_once(cluster, &pushed).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_long_before_its_lease_runs_out() {
    let mut cluster = Cluster::start(3, 1, LONG_TTL).await;
    let (mut leader, _, producer, monitor) = settled(&cluster).await;
    let mut takeovers = Vec::new();
    for _ in 0..3 {
        // What the leader's lease has left by its own clock, which counts from before
        // each renewal reached etcd, less a margin: etcd keeps the lease longer, so a
        // takeover by its expiry could come no sooner.
        let (_, view) = cluster.apis[leader].get("/v1/leader").await;
        let left = view["lease_left_ms"]
            .as_u64()
            .expect("the leader's lease_left_ms");
        let killed_at = Instant::now();
        cluster.nodes[leader].kill();
        let (next, _, took) = takeover(&cluster, leader, killed_at, Duration::from_secs(10)).await;
        takeovers.push((took, Duration::from_millis(left)));
        cluster.nodes[leader]
            .restart()
            .expect("restart the killed node");
        leader = next;
        // Deliveries flow again under the new leader before the next round (the
        // restarted node judges as soon as it has seen the new leader's presence).
        flowing(&cluster, 20).await;
    }
    let delivery = stop_load(&cluster, producer, monitor).await;
    println!("SIGKILL takeovers with a 6 s lease (took, lease left): {takeovers:?}; {delivery:?}");
    assert!(
        takeovers.iter().all(|(took, left)| took < left),
        "a takeover waited for the lease (took, lease left): {takeovers:?}\n{}",
        cluster.logs()
    );
    // A killed node's counters go with it; the last round's revoker is alive.
    assert!(leases_ended(&cluster).await >= 1.0);
}

/// The presence channels subscribed in Redis now.
fn presences(cluster: &Cluster) -> HashSet<String> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*:presence:*")
        .query(&mut cluster.redis.client())
        .expect("PUBSUB CHANNELS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_just_after_both_standbys_restarted_is_replaced_at_once() {
    let mut cluster = Cluster::start(3, 1, LONG_TTL).await;
    let (leader, _, producer, monitor) = settled(&cluster).await;
    // Both standbys start again (a rolling restart, or a drill's earlier rounds).
    let before = presences(&cluster);
    let standbys: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let mut logged = Vec::new();
    for &i in &standbys {
        logged.push(cluster.nodes[i].full_log().len());
        cluster.nodes[i].kill();
        cluster.nodes[i].restart().expect("restart a standby");
    }
    eventually(
        Duration::from_secs(10),
        "both restarted standbys hold a presence",
        || async { (presences(&cluster).difference(&before).count() == 2).then_some(()) },
    )
    .await;
    // Each has seen the leader's presence beside its own (its first polls, well
    // inside the 2 s a young presence waits before judging a leader it has not
    // seen): from then on it must not wait that out.
    eventually(
        Duration::from_secs(10),
        "both restarted standbys saw the leader's presence",
        || async {
            standbys
                .iter()
                .zip(&logged)
                .all(|(&i, &from)| {
                    let log = cluster.nodes[i].full_log();
                    log.get(from..)
                        .is_some_and(|new| new.contains(LEADER_IN_SIGHT))
                })
                .then_some(())
        },
    )
    .await;
    let killed_at = Instant::now();
    cluster.nodes[leader].kill();
    let (_, _, took) = takeover(&cluster, leader, killed_at, Duration::from_secs(10)).await;
    let delivery = stop_load(&cluster, producer, monitor).await;
    println!("SIGKILL just after both standbys restarted: taken over in {took:?}; {delivery:?}");
    // Judged at once, a few polls; waiting out the young presence's 2 s, most of it.
    assert!(
        took < Duration::from_millis(1_400),
        "took {took:?}: the restarted standbys waited before judging a leader they had seen\n{}",
        cluster.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_redis_alone_hands_over_and_rejoins() {
    // n0 reaches Redis through a proxy that can cut it off; etcd stays in reach.
    let (proxy, cluster) = n0_through_a_proxy().await;
    let (leader, _, producer, monitor) = settled(&cluster).await;
    assert_eq!(leader, 0, "n0 starts first and leads");
    let cut_at = Instant::now();
    proxy.cut();
    // Without the watch, n0 keeps renewing its lease for as long as the cut lasts.
    let (next, _, took) = takeover(&cluster, 0, cut_at, Duration::from_secs(15)).await;
    flowing(&cluster, 20).await;
    proxy.restore();
    // n0 learns its lease is gone and stands by.
    cluster.one_leader().agreed().wait(|| cluster.logs()).await;
    let after = cluster.one_leader().wait(|| cluster.logs()).await;
    assert_eq!(after.0, next, "the new leader stays");
    flowing(&cluster, 10).await;
    let delivery = stop_load(&cluster, producer, monitor).await;
    println!("cut off from Redis: n{next} took over after {took:?}; {delivery:?}");
    assert!(
        took < Duration::from_secs(6),
        "took {took:?}: the cut-off leader was not found from its silent probe"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_for_a_second_keeps_its_term() {
    let cluster = Cluster::start(3, 1, LONG_TTL).await;
    let (leader, epoch, producer, monitor) = settled(&cluster).await;
    cluster.nodes[leader].signal(libc::SIGSTOP);
    // The pause is what is under test.
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.nodes[leader].signal(libc::SIGCONT);
    flowing(&cluster, 50).await;
    stop_load(&cluster, producer, monitor).await;
    let now = cluster.one_leader().wait(|| cluster.logs()).await;
    assert_eq!(now, (leader, epoch), "a 1 s pause moved the leadership");
    assert_eq!(leases_ended(&cluster).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_redis_stalls_for_half_a_second_keeps_its_term() {
    // n0 reaches Redis through a proxy that holds its bytes for 500 ms, as a slow
    // network or a busy Redis would; then Redis itself stalls for everybody.
    let (proxy, cluster) = n0_through_a_proxy().await;
    let (leader, epoch, producer, monitor) = settled(&cluster).await;
    assert_eq!(leader, 0, "n0 starts first and leads");
    proxy.cut();
    // The stall is what is under test.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.restore();
    flowing(&cluster, 30).await;
    // Every client's commands wait 500 ms (DEBUG SLEEP is off by default).
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(500)
        .query(&mut cluster.redis.client())
        .expect("CLIENT PAUSE");
    flowing(&cluster, 30).await;
    let delivery = stop_load(&cluster, producer, monitor).await;
    println!("500 ms stalls of the leader's Redis and of Redis: {delivery:?}");
    let now = cluster.one_leader().wait(|| cluster.logs()).await;
    assert_eq!(now, (leader, epoch), "a 500 ms stall moved the leadership");
    assert_eq!(leases_ended(&cluster).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_seen_by_everybody_moves_nobody() {
    let mut cluster = Cluster::start(3, 1, LONG_TTL).await;
    let (leader, epoch, _producer, _monitor) = settled(&cluster).await;
    cluster.redis.restart().expect("restart redis");
    // Every node connects again; the leader forwards again under the same term.
    flowing(&cluster, 50).await;
    never(
        Duration::from_secs(3),
        "a lease ended after a Redis restart",
        || async {
            let ended = leases_ended(&cluster).await;
            (ended > 0.0).then(|| format!("{ended}\n{}", cluster.logs()))
        },
    )
    .await;
    let now = cluster.one_leader().wait(|| cluster.logs()).await;
    assert_eq!(now, (leader, epoch), "a Redis restart moved the leadership");
    eventually(Duration::from_secs(5), "still one leader", || async {
        (cluster.leaders().await.len() == 1).then_some(())
    })
    .await;
}

/// A node cut off from Redis stays out of the race while a node that reaches
/// Redis campaigns: even first in line when the leader is killed, it never wins
/// (it would win, and lose again to the presence watch, once a lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_redis_never_wins_while_another_campaigns() {
    let (proxy, mut cluster) = n0_through_a_proxy().await;
    let (leader, _, producer, monitor) = settled(&cluster).await;
    assert_eq!(leader, 0, "n0 starts first and leads");
    let cut_at = Instant::now();
    proxy.cut();
    let (next, _, _) = takeover(&cluster, 0, cut_at, Duration::from_secs(15)).await;
    eventually(Duration::from_secs(15), "n0 stands aside", || async {
        cluster.nodes[0]
            .full_log()
            .contains("standing aside while other nodes campaign")
            .then_some(())
    })
    .await;
    let gained = |cluster: &Cluster| cluster.nodes[0].log().matches("leadership gained").count();
    let gained_before = gained(&cluster);
    // The other standby starts again, so that its candidacy is younger than any
    // n0 might hold.
    let other = 3 - next;
    cluster.nodes[other].kill();
    cluster.nodes[other].restart().expect("restart the standby");
    flowing(&cluster, 10).await;
    let killed_at = Instant::now();
    cluster.nodes[next].kill();
    let (last, _, took) = takeover(&cluster, next, killed_at, Duration::from_secs(15)).await;
    assert_eq!(last, other, "the node that reaches Redis leads");
    flowing(&cluster, 20).await;
    assert_eq!(
        gained(&cluster),
        gained_before,
        "n0, cut off from Redis, led meanwhile:\n{}",
        cluster.logs()
    );
    proxy.restore();
    cluster.nodes[next]
        .restart()
        .expect("restart the killed leader");
    let delivery = stop_load(&cluster, producer, monitor).await;
    println!("n0 cut off stood aside; n{last} took over after {took:?}; {delivery:?}");
}
