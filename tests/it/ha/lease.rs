//! A leader that loses its lease or etcd: stopped past its lease (fenced when it
//! wakes), cut off from etcd alone (stopped by the fence), and etcd stopped for
//! everyone, with the failsafe (forwarding goes on) and without (it stops at the
//! lease deadline).

use std::time::{Duration, Instant};

use super::{
    Delivery, Producer, TTL, all_campaign, check_exactly_once, cluster, deliveries, flowing,
    loaded, node_counter, settings,
};
use crate::support::{Cluster, eventually, let_pass, never};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_past_its_lease_is_fenced_and_rejoins_as_a_standby() {
    let cluster = cluster(1, true).await;
    let (old, old_epoch) = cluster.one_leader().wait(|| cluster.logs()).await;
    let first = Producer::start(&cluster.store);
    flowing(&cluster, 20).await;
    let mut pushed = first.stop().await;
    // Let the old leader finish what is due, so that it is idle when stopped:
    // any later forward of its would show in its counter.
    let all = pushed.len();
    let delivered = deliveries(&cluster);
    eventually(Duration::from_secs(5), "first batch delivered", || {
        std::future::ready(delivered.len().filter(|n| *n >= all).map(|_| ()))
    })
    .await;
    // A node counts a forward when the call's answer is back, a moment after its
    // entries are in the stream: the count is read once it has every one of them.
    let forwarded_before = eventually(
        Duration::from_secs(5),
        "the old leader counts every forward",
        || async {
            let n = node_counter(&cluster, old, "delayq_messages_forwarded_total").await;
            (n >= all as f64).then_some(n)
        },
    )
    .await;

    cluster.nodes[old].signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let second = Producer::start(&cluster.store);
    let (new, new_epoch) = cluster
        .one_leader()
        .except(&[old])
        .within(TTL + Duration::from_secs(1))
        .wait(|| cluster.logs())
        .await;
    let took = stopped.elapsed();
    assert!(
        new_epoch > old_epoch,
        "new epoch {new_epoch} after {old_epoch}"
    );
    // Kept stopped well past its lease, with messages falling due meanwhile.
    let_pass((TTL + Duration::from_secs(1)).saturating_sub(stopped.elapsed())).await;
    cluster.nodes[old].signal(libc::SIGCONT);

    eventually(
        Duration::from_secs(3),
        "the old leader steps down",
        || async {
            let (_, v) = cluster.apis[old].get("/v1/leader").await;
            (v["is_leader"] == false).then_some(())
        },
    )
    .await;
    all_campaign(&cluster.etcd[0].endpoint(), Duration::from_secs(5)).await;
    never(
        Duration::from_millis(500),
        &format!(
            "the deposed leader forwarded after it resumed\n{}",
            cluster.logs()
        ),
        || async {
            let after = node_counter(&cluster, old, "delayq_messages_forwarded_total").await;
            (after != forwarded_before).then_some((forwarded_before, after))
        },
    )
    .await;
    assert_eq!(
        cluster.leaders().await,
        vec![(new, new_epoch)],
        "the new leader keeps leading"
    );

    pushed.extend(second.stop().await);
    let delivery = check_exactly_once(&cluster, &pushed).await;
    let fenced = node_counter(&cluster, old, "delayq_fenced_total").await;
    println!(
        "SIGSTOP: takeover after {took:?}; old leader fenced {} times; {delivery:?}",
        fenced as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_alone_is_stopped_by_the_fence() {
    // n0 talks to etcd member m0 only, the others to m1 and m2: stopping m0 cuts
    // off n0 alone, which leads on under failsafe while the others elect anew.
    let cluster = Cluster::start_with(3, 3, &settings(true), |i| {
        if i == 0 { vec![0] } else { vec![1, 2] }
    })
    .await;
    let (old, old_epoch) = cluster.one_leader().wait(|| cluster.logs()).await;
    assert_eq!(old, 0);
    let producer = Producer::start(&cluster.store);
    flowing(&cluster, 10).await;

    cluster.etcd[0].pause();
    let cut_off = Instant::now();
    // When m0 was etcd's raft leader, m1 and m2 elect another first, and the new
    // raft leader starts every lease's TTL again (plus an election timeout): n0's
    // lease then lapses that long after the election, not after the cut (about
    // 3.5 s in all, more on a loaded machine).
    let (new, new_epoch) = cluster
        .one_leader()
        .except(&[old])
        .within(TTL * 5)
        .wait(|| cluster.logs())
        .await;
    let elected = cut_off.elapsed();
    assert!(
        new_epoch > old_epoch,
        "new epoch {new_epoch} after {old_epoch}"
    );
    eventually(
        Duration::from_secs(2),
        "the cut-off leader is fenced",
        || async {
            let fenced = node_counter(&cluster, old, "delayq_fenced_total").await;
            (fenced >= 1.0 && crate::support::leads(&cluster.apis[old]).await.is_none())
                .then_some(())
        },
    )
    .await;
    let fenced_after = cut_off.elapsed() - elected;
    assert_eq!(cluster.leaders().await, vec![(new, new_epoch)]);

    cluster.etcd[0].resume();
    all_campaign(&cluster.etcd[1].endpoint(), Duration::from_secs(10)).await;
    let pushed = producer.stop().await;
    let delivery = check_exactly_once(&cluster, &pushed).await;
    println!(
        "leader cut off from etcd: new leader after {elected:?}, old one fenced {fenced_after:?} later; {delivery:?}"
    );
}

/// An 8 s outage: four lease TTLs, as telling as 20 s and quicker.
const OUTAGE: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_failsafe_the_leader_keeps_forwarding_while_etcd_is_stopped() {
    let (cluster, leader, epoch, producer) = loaded(1, true).await;
    let delivered = deliveries(&cluster);

    cluster.etcd[0].pause();
    let stopped = Instant::now();
    // Past the lease deadline: the leader goes on, and readiness reports etcd.
    let_pass(TTL + Duration::from_secs(1)).await;
    let during = delivered.len().expect("Redis answers");
    for api in &cluster.apis {
        eventually(
            Duration::from_secs(4),
            "readyz reports etcd unreachable",
            || async { (api.get("/readyz").await.0 == 503).then_some(()) },
        )
        .await;
    }
    // The outage lasts.
    let_pass(OUTAGE.saturating_sub(stopped.elapsed())).await;
    assert_eq!(
        cluster.leaders().await,
        vec![(leader, epoch)],
        "the leader still leads"
    );
    let later = delivered.len().expect("Redis answers");
    assert!(
        later > during + 50,
        "forwarding stalled during the outage: {during} -> {later}\n{}",
        cluster.logs()
    );
    let (after, delivery) = etcd_back(&cluster, producer).await;
    println!(
        "failsafe, etcd stopped {OUTAGE:?}: {} entries during the outage; epoch {epoch} -> {after}; {delivery:?}",
        later - during
    );
}

/// etcd resumes: one node leads (its epoch returned), and every message pushed is
/// delivered exactly once.
async fn etcd_back(cluster: &Cluster, producer: Producer) -> (u64, Delivery) {
    cluster.etcd[0].resume();
    let (_, epoch) = cluster
        .one_leader()
        .within(Duration::from_secs(10))
        .wait(|| cluster.logs())
        .await;
    let pushed = producer.stop().await;
    (epoch, check_exactly_once(cluster, &pushed).await)
}

/// How many times node `i`'s log says a term's leader loops stopped.
fn loops_stopped(cluster: &Cluster, i: usize) -> usize {
    cluster.nodes[i]
        .full_log()
        .matches("leader loops stopped")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_failsafe_forwarding_stops_at_the_lease_deadline_while_etcd_is_stopped() {
    let (cluster, leader, _, producer) = loaded(1, false).await;
    let delivered = deliveries(&cluster);
    let terms_ended = loops_stopped(&cluster, leader);

    cluster.etcd[0].pause();
    let stopped = Instant::now();
    eventually(TTL, "nobody leads", || async {
        cluster.leaders().await.is_empty().then_some(())
    })
    .await;
    let stepped_down = stopped.elapsed();
    // The batch in flight lands, then the leader's loops end: nothing may move after.
    eventually(TTL, "the leader's loops stopped", || {
        std::future::ready((loops_stopped(&cluster, leader) > terms_ended).then_some(()))
    })
    .await;
    let frozen = delivered.len().expect("Redis answers");
    never(
        OUTAGE.saturating_sub(stopped.elapsed()),
        &format!("forwarded without a lease\n{}", cluster.logs()),
        || std::future::ready(delivered.len().filter(|n| *n != frozen)),
    )
    .await;
    assert!(cluster.leaders().await.is_empty());
    let (_, delivery) = etcd_back(&cluster, producer).await;
    println!(
        "no failsafe, etcd stopped {OUTAGE:?}: leader stepped down after {stepped_down:?}; {delivery:?}"
    );
}
