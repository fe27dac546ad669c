//! High availability with real processes: one Redis, one or three etcd members,
//! three `delayq run` processes (killed, stopped and terminated for real), while
//! messages fall due all the time. Every test ends by checking that each message
//! was delivered exactly once, and most watch that no two nodes lead at once.
//!
//! - `failover`: the leader killed, terminated, or resigning on request;
//! - `lease`: a leader that outlives its lease, or loses etcd, with and without
//!   the failsafe;
//! - `takeover`: a crashed or cut-off leader's lease ended by a standby; a short
//!   pause and a Redis restart that must move nobody;
//! - `groups`: `election.mode = "per_shard"`, groups spread, moved on a kill,
//!   rebalanced when a node joins;
//! - `etcd`: etcd restarted, losing a member, its leader key deleted by hand, or
//!   rebuilt under an older fence;
//! - `schedules`: recurring schedules' occurrences through failovers and outages.

mod etcd;
mod failover;
mod groups;
mod lease;
mod schedules;
mod takeover;

use crate::support::now_ms;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use delayq_client::message::NewMessage;
use delayq_client::store::{ScheduleMode, Store};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support::{Api, Cluster, Deliveries, counter, eventually, leaders};

const TTL: Duration = Duration::from_secs(2);
const STREAM: &str = "ha";
const ELECTION_PREFIX: &str = "/delayq/ha/leader";
/// Messages are pushed this far ahead of their due time.
const DELAY: Duration = Duration::from_millis(300);

/// The nodes' settings here (besides Redis and etcd): 4 shards, a lease of `TTL`,
/// the failsafe as asked, and info logs to show in a failure.
fn settings(failsafe: bool) -> String {
    format!(
        "[redis]\nshards = 4\n[etcd]\ncluster = \"ha\"\nlease_ttl = \"{}s\"\nfailsafe = {failsafe}\n[log]\nlevel = \"info\"\n",
        TTL.as_secs()
    )
}

/// Three nodes on one Redis and `etcd_members` etcd members; n0 leads first.
async fn cluster(etcd_members: usize, failsafe: bool) -> Cluster {
    Cluster::start(3, etcd_members, &settings(failsafe)).await
}

/// Where the messages of these tests are delivered.
fn deliveries(cluster: &Cluster) -> Deliveries {
    Deliveries::new(&cluster.redis.url(), &[STREAM])
}

/// Waits until `more` messages more have been delivered: forwarding goes on under
/// whoever leads now.
async fn flowing(cluster: &Cluster, more: usize) {
    let deliveries = deliveries(cluster);
    let from = deliveries.len().unwrap_or(0);
    eventually(
        Duration::from_secs(10),
        &format!("{more} more deliveries after {from}"),
        || std::future::ready(deliveries.len().filter(|n| *n >= from + more).map(|_| ())),
    )
    .await;
}

/// The sum of a counter on node `i`'s `/metrics`.
async fn node_counter(cluster: &Cluster, i: usize, name: &str) -> f64 {
    let text = cluster.apis[i].metrics().await.expect("metrics");
    counter(&text, name)
}

/// Polls until a node other than `old` leads; returns it, its epoch and how long it
/// took since `since`.
async fn takeover(
    cluster: &Cluster,
    old: usize,
    since: Instant,
    limit: Duration,
) -> (usize, u64, Duration) {
    let (node, epoch) = cluster
        .one_leader()
        .except(&[old])
        .within(limit)
        .wait(|| cluster.logs())
        .await;
    (node, epoch, since.elapsed())
}

#[derive(Debug)]
#[allow(dead_code)] // Read through Debug in reports and failures.
struct Delivery {
    pushed: usize,
    lost: usize,
    duplicated: usize,
    max_lateness_ms: u64,
}

/// Waits until every pushed message arrived, then checks that each arrived exactly
/// once; how late the latest was.
async fn check_exactly_once(cluster: &Cluster, pushed: &[Pushed]) -> Delivery {
    let due: HashMap<&str, u64> = pushed.iter().map(|p| (p.id.as_str(), p.due_ms)).collect();
    let (tally, entries) = deliveries(cluster)
        .exactly_once(due.keys(), Duration::from_secs(10))
        .await;
    let max_lateness_ms = entries
        .iter()
        .filter_map(|e| Some(e.ms().saturating_sub(*due.get(e.get("delayq-id")?)?)))
        .max()
        .unwrap_or(0);
    let delivery = Delivery {
        pushed: due.len(),
        lost: tally.lost.len(),
        duplicated: tally.duplicated.iter().map(|(_, n)| n - 1).sum::<usize>()
            + tally.unexpected.len(),
        max_lateness_ms,
    };
    tally.assert_exact(&format!("{delivery:?}\n{}", cluster.logs()));
    delivery
}

#[derive(Clone, Debug)]
struct Pushed {
    id: String,
    due_ms: u64,
}

/// Pushes a message due in `DELAY` every 20 ms, straight into Redis (any
/// instance accepts writes, so producers do not depend on who leads).
struct Producer {
    stop: CancellationToken,
    task: JoinHandle<Vec<Pushed>>,
}

impl Producer {
    fn start(store: &Store) -> Producer {
        let stop = CancellationToken::new();
        let store = store.clone();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let mut pushed = Vec::new();
            while !token.is_cancelled() {
                let msg = NewMessage::payload(STREAM, "tick", DELAY);
                let due_ms = now_ms() + DELAY.as_millis() as u64;
                if store
                    .schedule(&msg, ScheduleMode::New, Duration::from_secs(3600))
                    .await
                    .is_ok()
                {
                    pushed.push(Pushed {
                        id: msg.id.as_str().to_owned(),
                        due_ms,
                    });
                }
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
            pushed
        });
        Producer { stop, task }
    }

    async fn stop(self) -> Vec<Pushed> {
        self.stop.cancel();
        self.task.await.expect("producer")
    }
}

/// Samples `/leader` on every node all along. A split brain shows as two
/// leaders in two samples in a row (one sample can straddle a clean handover),
/// or as one epoch claimed by two nodes.
struct Monitor {
    stop: CancellationToken,
    /// Samples taken so far.
    samples: Arc<AtomicUsize>,
    task: JoinHandle<MonitorReport>,
}

/// Samples a monitor takes at the least before it vouches for anything.
const ENOUGH_SAMPLES: usize = 11;

#[derive(Debug, Default)]
struct MonitorReport {
    samples: usize,
    /// Samples in a row with more than one leader, at most.
    split_brain_run: usize,
    /// Which node each epoch was seen on.
    epochs: BTreeMap<u64, Vec<usize>>,
    /// Epochs in the order they were first seen.
    order: Vec<u64>,
}

impl Monitor {
    /// Samples the nodes at `apis` (they keep their addresses through restarts).
    fn start(apis: &[Api]) -> Monitor {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let apis = apis.to_vec();
        let samples = Arc::new(AtomicUsize::new(0));
        let taken = samples.clone();
        let task = tokio::spawn(async move {
            let mut report = MonitorReport::default();
            let mut run = 0;
            while !token.is_cancelled() {
                let leaders = leaders(&apis, &[]).await;
                report.samples += 1;
                taken.store(report.samples, Ordering::Relaxed);
                run = if leaders.len() > 1 { run + 1 } else { 0 };
                report.split_brain_run = report.split_brain_run.max(run);
                for (node, epoch) in leaders {
                    let nodes = report.epochs.entry(epoch).or_default();
                    if !nodes.contains(&node) {
                        nodes.push(node);
                    }
                    if !report.order.contains(&epoch) {
                        report.order.push(epoch);
                    }
                }
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(25)) => {}
                }
            }
            report
        });
        Monitor {
            stop,
            samples,
            task,
        }
    }

    /// Stops sampling, once it has sampled enough, and asserts that leadership was
    /// never shared.
    async fn finish(self) -> MonitorReport {
        eventually(
            Duration::from_secs(10),
            "enough samples of who leads",
            || {
                let taken = self.samples.load(Ordering::Relaxed);
                std::future::ready((taken >= ENOUGH_SAMPLES).then_some(()))
            },
        )
        .await;
        self.stop.cancel();
        let report = self.task.await.expect("monitor");
        assert!(report.samples > 10, "too few samples: {report:?}");
        assert!(
            report.split_brain_run < 2,
            "two leaders at once: {report:?}"
        );
        assert!(
            report.epochs.values().all(|nodes| nodes.len() == 1),
            "an epoch led by two nodes: {report:?}"
        );
        assert!(
            report.order.windows(2).all(|w| w[0] < w[1]),
            "epochs went backwards: {report:?}"
        );
        report
    }
}

/// A cluster on `etcd_members` etcd members; once it has a leader (returned with its
/// epoch), a producer's load runs, and the leader forwards it.
async fn loaded(etcd_members: usize, failsafe: bool) -> (Cluster, usize, u64, Producer) {
    let cluster = cluster(etcd_members, failsafe).await;
    let (leader, epoch) = cluster.one_leader().wait(|| cluster.logs()).await;
    let producer = Producer::start(&cluster.store);
    flowing(&cluster, 10).await;
    (cluster, leader, epoch, producer)
}

/// `loaded` with the failsafe on, and the monitor watching who leads.
async fn under_load(etcd_members: usize) -> (Cluster, usize, u64, Producer, Monitor) {
    let (cluster, leader, epoch, producer) = loaded(etcd_members, true).await;
    let monitor = Monitor::start(&cluster.apis);
    flowing(&cluster, 10).await;
    (cluster, leader, epoch, producer, monitor)
}

async fn etcd_client(endpoint: &str) -> etcd_client::Client {
    etcd_client::Client::connect([endpoint], None)
        .await
        .expect("connect to etcd")
}

/// Keys under the election prefix: one per node campaigning or leading.
async fn campaigners(etcd: &mut etcd_client::Client) -> Vec<(String, i64)> {
    let resp = etcd
        .get(
            format!("{ELECTION_PREFIX}/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .expect("read the election keys");
    resp.kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap_or("?").to_owned(), kv.create_revision()))
        .collect()
}

/// Waits until all three nodes campaign or lead again, as etcd at `endpoint` sees it.
async fn all_campaign(endpoint: &str, timeout: Duration) {
    let etcd = etcd_client(endpoint).await;
    eventually(timeout, "every node campaigns again", || async {
        (campaigners(&mut etcd.clone()).await.len() == 3).then_some(())
    })
    .await;
}
