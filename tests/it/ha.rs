//! High availability with real processes: one Redis, one or three etcd members,
//! three `delayq run` processes (killed, stopped and terminated for real), while
//! messages fall due all the time. Every test ends by checking that each message
//! was delivered exactly once, and watches that no two nodes lead at once.

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use delayq::harness::{DelayqProcess, EtcdServer, RedisServer};
use delayq::message::NewMessage;
use delayq::store::{ScheduleMode, Store};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support::{self, delayq_bin, eventually, patience};

const TTL: Duration = Duration::from_secs(2);
const STREAM: &str = "ha";
const ELECTION_PREFIX: &str = "/delayq/ha/leader";
/// Messages are pushed this far ahead of their due time.
const DELAY: Duration = Duration::from_millis(300);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// One Redis, etcd, and three delayq nodes sharing them.
struct Cluster {
    redis: RedisServer,
    etcd: Vec<EtcdServer>,
    nodes: Vec<DelayqProcess>,
    store: Store,
    http: reqwest::Client,
}

impl Cluster {
    async fn start(etcd_members: usize, failsafe: bool) -> Cluster {
        Self::start_with(etcd_members, failsafe, |_| (0..etcd_members).collect()).await
    }

    /// Node `i` is given the etcd members `members_of(i)`. Node 0 starts first
    /// and is the first leader.
    async fn start_with(
        etcd_members: usize,
        failsafe: bool,
        members_of: impl Fn(usize) -> Vec<usize>,
    ) -> Cluster {
        let redis = RedisServer::start().expect("start redis-server");
        let etcd = if etcd_members == 1 {
            vec![EtcdServer::start().expect("start etcd")]
        } else {
            EtcdServer::cluster(etcd_members).expect("start an etcd cluster")
        };
        let config = |i: usize| {
            let endpoints: Vec<String> = members_of(i)
                .into_iter()
                .map(|m| format!("\"{}\"", etcd[m].endpoint()))
                .collect();
            format!(
                "[redis]\nurl = \"{}\"\nshards = 4\n\n[etcd]\nendpoints = [{}]\ncluster = \"ha\"\nlease_ttl = \"{}s\"\nfailsafe = {failsafe}\n\n[log]\nlevel = \"info\"\n",
                redis.url(),
                endpoints.join(", "),
                TTL.as_secs(),
            )
        };
        let configs: Vec<String> = (0..3).map(config).collect();
        let start = |i: usize| {
            DelayqProcess::start(&delayq_bin(), &format!("n{i}"), &configs[i])
                .expect("start delayq")
        };
        let nodes = vec![start(0)];
        let store = Store::connect(&support::config(&redis.url(), "").store_config())
            .await
            .expect("connect to redis");
        let mut cluster = Cluster {
            redis,
            etcd,
            nodes,
            store,
            http: reqwest::Client::builder()
                .timeout(Duration::from_millis(500))
                .build()
                .unwrap(),
        };
        cluster.wait_leader(Duration::from_secs(5), &[]).await;
        let more = [start(1), start(2)];
        cluster.nodes.extend(more);
        cluster
    }

    /// The epoch node `i` leads under, if it answers `/leader` with 200.
    async fn leads(&self, i: usize) -> Option<u64> {
        let resp = self
            .http
            .get(self.nodes[i].url("/leader"))
            .send()
            .await
            .ok()?;
        if resp.status() != 200 {
            return None;
        }
        let body: serde_json::Value = resp.json().await.ok()?;
        body["epoch"].as_u64()
    }

    /// Which nodes say they lead, with their epochs.
    async fn leaders(&self) -> Vec<(usize, u64)> {
        self.leaders_among(&[]).await
    }

    async fn leaders_among(&self, except: &[usize]) -> Vec<(usize, u64)> {
        let asked: Vec<usize> = (0..self.nodes.len())
            .filter(|i| !except.contains(i))
            .collect();
        let answers = futures::future::join_all(asked.iter().map(|&i| self.leads(i))).await;
        asked
            .into_iter()
            .zip(answers)
            .filter_map(|(i, e)| e.map(|e| (i, e)))
            .collect()
    }

    /// Waits until exactly one node leads, not counting (nor asking) `except`,
    /// which may be stopped.
    async fn wait_leader(&self, timeout: Duration, except: &[usize]) -> (usize, u64) {
        let give_up = Instant::now() + timeout * patience();
        loop {
            let leaders = self.leaders_among(except).await;
            if let [(i, epoch)] = leaders.as_slice() {
                return (*i, *epoch);
            }
            if Instant::now() > give_up {
                panic!(
                    "no single leader (besides {except:?}) within {:?}: {leaders:?}\n{}",
                    timeout * patience(),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn get(&self, i: usize, path: &str) -> (u16, serde_json::Value) {
        let resp = self
            .http
            .get(self.nodes[i].url(path))
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(serde_json::Value::Null))
    }

    async fn post(&self, i: usize, path: &str) -> (u16, serde_json::Value) {
        let resp = self
            .http
            .post(self.nodes[i].url(path))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// The sum of a counter on node `i`'s `/metrics`.
    async fn counter(&self, i: usize, name: &str) -> f64 {
        let text = support::metrics(&self.http, self.nodes[i].url("/metrics"))
            .await
            .expect("metrics");
        support::counter(&text, name)
    }

    /// Entries of the target stream.
    fn delivered(&self) -> Vec<support::Entry> {
        support::entries(&mut self.redis.client(), STREAM)
    }

    /// Waits until every pushed message arrived, then counts losses and duplicates.
    async fn check_exactly_once(&self, pushed: &[Pushed]) -> Delivery {
        let ids: HashMap<&str, u64> = pushed.iter().map(|p| (p.id.as_str(), p.due_ms)).collect();
        let count = |entries: &[support::Entry]| {
            let mut seen: HashMap<String, usize> = HashMap::new();
            for e in entries {
                *seen
                    .entry(e.get("delayq-id").unwrap_or("?").to_owned())
                    .or_default() += 1;
            }
            seen
        };
        let waited = tokio::time::timeout(Duration::from_secs(10) * patience(), async {
            loop {
                let seen = count(&self.delivered());
                if ids.keys().all(|id| seen.contains_key(*id)) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        // Give a late duplicate the chance to show.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let entries = self.delivered();
        let seen = count(&entries);
        let lost = ids.keys().filter(|id| !seen.contains_key(**id)).count();
        let duplicated = seen.values().map(|n| n - 1).sum::<usize>()
            + seen
                .keys()
                .filter(|id| !ids.contains_key(id.as_str()))
                .count();
        let max_lateness_ms = entries
            .iter()
            .filter_map(|e| Some(e.ms().saturating_sub(*ids.get(e.get("delayq-id")?)?)))
            .max()
            .unwrap_or(0);
        let delivery = Delivery {
            pushed: ids.len(),
            lost,
            duplicated,
            max_lateness_ms,
        };
        assert!(
            waited.is_ok() && lost == 0 && duplicated == 0,
            "{delivery:?}\n{}",
            self.logs()
        );
        delivery
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}", n.name, n.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[derive(Debug)]
#[allow(dead_code)] // Read through Debug in reports and failures.
struct Delivery {
    pushed: usize,
    lost: usize,
    duplicated: usize,
    max_lateness_ms: u64,
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
    task: JoinHandle<MonitorReport>,
}

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
    fn start(cluster: &Arc<tokio::sync::RwLock<Cluster>>) -> Monitor {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let cluster = cluster.clone();
        let task = tokio::spawn(async move {
            let mut report = MonitorReport::default();
            let mut run = 0;
            while !token.is_cancelled() {
                let leaders = cluster.read().await.leaders().await;
                report.samples += 1;
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
        Monitor { stop, task }
    }

    /// Stops sampling and asserts that leadership was never shared.
    async fn finish(self) -> MonitorReport {
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

/// Polls until a node other than `old` leads; returns it and how long it took.
async fn takeover(
    cluster: &Cluster,
    old: usize,
    since: Instant,
    limit: Duration,
) -> (usize, u64, Duration) {
    let (node, epoch) = cluster.wait_leader(limit, &[old]).await;
    (node, epoch, since.elapsed())
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

/// A cluster with `etcd_members` etcd members (failsafe on), shared between the test
/// and its monitor; once it has a leader (returned with its epoch), a producer's load
/// runs and the monitor watches who leads.
async fn under_load(
    etcd_members: usize,
) -> (
    Arc<tokio::sync::RwLock<Cluster>>,
    usize,
    u64,
    Producer,
    Monitor,
) {
    let cluster = Arc::new(tokio::sync::RwLock::new(
        Cluster::start(etcd_members, true).await,
    ));
    let (leader, epoch) = cluster
        .read()
        .await
        .wait_leader(Duration::from_secs(5), &[])
        .await;
    let producer = Producer::start(&cluster.read().await.store);
    let monitor = Monitor::start(&cluster);
    (cluster, leader, epoch, producer, monitor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_leader_fails_over_within_the_ttl_without_loss() {
    let (cluster, mut leader, _, producer, monitor) = under_load(1).await;
    let mut takeovers = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let killed_at = Instant::now();
        cluster.write().await.nodes[leader].kill();
        let c = cluster.read().await;
        let (next, _, took) = takeover(&c, leader, killed_at, TTL + Duration::from_secs(1)).await;
        drop(c);
        takeovers.push(took);
        cluster.write().await.nodes[leader]
            .restart()
            .expect("restart the killed node");
        leader = next;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pushed = producer.stop().await;
    let report = monitor.finish().await;
    let delivery = cluster.read().await.check_exactly_once(&pushed).await;
    println!(
        "SIGKILL takeovers: {takeovers:?}; {delivery:?}; epochs {:?}",
        report.order
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_resign_hand_over_at_once_without_loss() {
    let (cluster, mut leader, _, producer, monitor) = under_load(1).await;
    let mut handovers = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let signalled = Instant::now();
        cluster.read().await.nodes[leader].signal(libc::SIGTERM);
        let c = cluster.read().await;
        let (next, _, took) = takeover(&c, leader, signalled, Duration::from_secs(1)).await;
        drop(c);
        handovers.push(took);
        let status = cluster.write().await.nodes[leader].wait_exit(Duration::from_secs(5));
        assert!(
            status.is_some_and(|s| s.success()),
            "exit status after SIGTERM: {status:?}"
        );
        cluster.write().await.nodes[leader]
            .restart()
            .expect("restart the stopped node");
        leader = next;
    }

    // Planned switchover over HTTP, then with the CLI; a standby refuses.
    let c = cluster.read().await;
    let standby = (leader + 1) % 3;
    let (status, body) = c.post(standby, "/v1/admin/resign").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("not_leader")),
        "{body}"
    );
    let asked = Instant::now();
    let (status, body) = c.post(leader, "/v1/admin/resign").await;
    assert_eq!(
        (status, body["resigned"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    let (next, _, took) = takeover(&c, leader, asked, Duration::from_secs(1)).await;
    handovers.push(took);

    let asked = Instant::now();
    let out = Command::new(delayq_bin())
        .args(["resign", "--url", &format!("http://{}", c.nodes[next].api)])
        .output()
        .expect("run delayq resign");
    assert!(
        out.status.success(),
        "delayq resign: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (last, _, took) = takeover(&c, next, asked, Duration::from_secs(1)).await;
    handovers.push(took);

    // What every node says about the leader.
    let (_, on_leader) = c.get(last, "/v1/leader").await;
    assert_eq!(on_leader["is_leader"], true, "{on_leader}");
    let lease_left = on_leader["lease_left_ms"].as_u64().expect("lease_left_ms");
    assert!(
        lease_left > 0 && lease_left <= TTL.as_millis() as u64,
        "{on_leader}"
    );
    assert!(on_leader["since_ms"].as_u64().is_some(), "{on_leader}");
    let name = c.nodes[last].name.clone();
    let address = c.nodes[last].api.to_string();
    for i in 0..3 {
        let view = eventually(
            Duration::from_secs(3),
            "standbys learn the leader",
            || async {
                let (_, v) = c.get(i, "/v1/leader").await;
                (v["leader"]["node_id"] == name.as_str()).then_some(v)
            },
        )
        .await;
        assert_eq!(view["leader"]["address"], address.as_str(), "{view}");
        assert_eq!(view["mode"], "etcd", "{view}");
        let (status, ready) = c.get(i, "/readyz").await;
        assert_eq!(
            (status, ready["etcd"].as_str()),
            (200, Some("ok")),
            "{ready}"
        );
    }
    drop(c);

    let pushed = producer.stop().await;
    monitor.finish().await;
    let delivery = cluster.read().await.check_exactly_once(&pushed).await;
    println!(
        "SIGTERM, SIGTERM, SIGTERM, API resign, CLI resign handovers: {handovers:?}; {delivery:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_past_its_lease_is_fenced_and_rejoins_as_a_standby() {
    let cluster = Cluster::start(1, true).await;
    let (old, old_epoch) = cluster.wait_leader(Duration::from_secs(5), &[]).await;
    let first = Producer::start(&cluster.store);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut pushed = first.stop().await;
    // Let the old leader finish what is due, so that it is idle when stopped:
    // any later forward of its would show in its counter.
    let all = pushed.len();
    eventually(Duration::from_secs(5), "first batch delivered", || async {
        (cluster.delivered().len() >= all).then_some(())
    })
    .await;
    let forwarded_before = cluster
        .counter(old, "delayq_messages_forwarded_total")
        .await;

    cluster.nodes[old].signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let second = Producer::start(&cluster.store);
    let (new, new_epoch) = cluster
        .wait_leader(TTL + Duration::from_secs(1), &[old])
        .await;
    let took = stopped.elapsed();
    assert!(
        new_epoch > old_epoch,
        "new epoch {new_epoch} after {old_epoch}"
    );
    // Keep it stopped well past its lease, with messages falling due meanwhile.
    tokio::time::sleep((TTL + Duration::from_secs(1)).saturating_sub(stopped.elapsed())).await;
    cluster.nodes[old].signal(libc::SIGCONT);

    eventually(
        Duration::from_secs(3),
        "the old leader steps down",
        || async {
            let (_, v) = cluster.get(old, "/v1/leader").await;
            (v["is_leader"] == false).then_some(())
        },
    )
    .await;
    let etcd = etcd_client(&cluster.etcd[0].endpoint()).await;
    eventually(
        Duration::from_secs(5),
        "the old leader campaigns again",
        || async { (campaigners(&mut etcd.clone()).await.len() == 3).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let forwarded_after = cluster
        .counter(old, "delayq_messages_forwarded_total")
        .await;
    assert_eq!(
        forwarded_before,
        forwarded_after,
        "the deposed leader forwarded after it resumed\n{}",
        cluster.logs()
    );
    assert_eq!(
        cluster.leaders().await,
        vec![(new, new_epoch)],
        "the new leader keeps leading"
    );

    pushed.extend(second.stop().await);
    let delivery = cluster.check_exactly_once(&pushed).await;
    let fenced = cluster.counter(old, "delayq_fenced_total").await;
    println!(
        "SIGSTOP: takeover after {took:?}; old leader fenced {} times; {delivery:?}",
        fenced as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_alone_is_stopped_by_the_fence() {
    // n0 talks to etcd member m0 only, the others to m1 and m2: stopping m0 cuts
    // off n0 alone, which leads on under failsafe while the others elect anew.
    let cluster = Cluster::start_with(3, true, |i| if i == 0 { vec![0] } else { vec![1, 2] }).await;
    let (old, old_epoch) = cluster.wait_leader(Duration::from_secs(5), &[]).await;
    assert_eq!(old, 0);
    let producer = Producer::start(&cluster.store);
    tokio::time::sleep(Duration::from_millis(500)).await;

    cluster.etcd[0].pause();
    let cut_off = Instant::now();
    let (new, new_epoch) = cluster.wait_leader(TTL * 3, &[old]).await;
    let elected = cut_off.elapsed();
    assert!(
        new_epoch > old_epoch,
        "new epoch {new_epoch} after {old_epoch}"
    );
    eventually(
        Duration::from_secs(2),
        "the cut-off leader is fenced",
        || async {
            let fenced = cluster.counter(old, "delayq_fenced_total").await;
            (fenced >= 1.0 && cluster.leads(old).await.is_none()).then_some(())
        },
    )
    .await;
    let fenced_after = cut_off.elapsed() - elected;
    assert_eq!(cluster.leaders().await, vec![(new, new_epoch)]);

    cluster.etcd[0].resume();
    let etcd = etcd_client(&cluster.etcd[1].endpoint()).await;
    eventually(
        Duration::from_secs(10),
        "the old leader campaigns again",
        || async { (campaigners(&mut etcd.clone()).await.len() == 3).then_some(()) },
    )
    .await;
    let pushed = producer.stop().await;
    let delivery = cluster.check_exactly_once(&pushed).await;
    println!(
        "leader cut off from etcd: new leader after {elected:?}, old one fenced {fenced_after:?} later; {delivery:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_restart_keeps_or_reforms_leadership_without_loss() {
    let (cluster, _, before, producer, monitor) = under_load(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    {
        let mut c = cluster.write().await;
        c.etcd[0].restart().expect("restart etcd");
        c.etcd[0].wait_ready().expect("etcd back");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, after) = cluster
        .read()
        .await
        .wait_leader(Duration::from_secs(5), &[])
        .await;
    let pushed = producer.stop().await;
    monitor.finish().await;
    let delivery = cluster.read().await.check_exactly_once(&pushed).await;
    println!("etcd restart: epoch {before} -> {after}; {delivery:?}");
}

/// How many entries the stream holds.
fn stream_len(cluster: &Cluster) -> usize {
    cluster.delivered().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_failsafe_the_leader_keeps_forwarding_while_etcd_is_stopped() {
    // An 8 s outage: four lease TTLs, as telling as 20 s and quicker.
    const OUTAGE: Duration = Duration::from_secs(8);
    let cluster = Cluster::start(1, true).await;
    let (leader, epoch) = cluster.wait_leader(Duration::from_secs(5), &[]).await;
    let producer = Producer::start(&cluster.store);
    tokio::time::sleep(Duration::from_millis(500)).await;

    cluster.etcd[0].pause();
    let stopped = Instant::now();
    // Past the lease deadline: the leader goes on, and readiness reports etcd.
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    let during = stream_len(&cluster);
    for i in 0..3 {
        eventually(
            Duration::from_secs(4),
            "readyz reports etcd unreachable",
            || async { (cluster.get(i, "/readyz").await.0 == 503).then_some(()) },
        )
        .await;
    }
    tokio::time::sleep(OUTAGE.saturating_sub(stopped.elapsed())).await;
    assert_eq!(
        cluster.leaders().await,
        vec![(leader, epoch)],
        "the leader still leads"
    );
    let later = stream_len(&cluster);
    assert!(
        later > during + 50,
        "forwarding stalled during the outage: {during} -> {later}\n{}",
        cluster.logs()
    );
    cluster.etcd[0].resume();

    let (_, after) = cluster.wait_leader(Duration::from_secs(10), &[]).await;
    let pushed = producer.stop().await;
    let delivery = cluster.check_exactly_once(&pushed).await;
    println!(
        "failsafe, etcd stopped {OUTAGE:?}: {} entries during the outage; epoch {epoch} -> {after}; {delivery:?}",
        later - during
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_failsafe_forwarding_stops_at_the_lease_deadline_while_etcd_is_stopped() {
    const OUTAGE: Duration = Duration::from_secs(8);
    let cluster = Cluster::start(1, false).await;
    cluster.wait_leader(Duration::from_secs(5), &[]).await;
    let producer = Producer::start(&cluster.store);
    tokio::time::sleep(Duration::from_millis(500)).await;

    cluster.etcd[0].pause();
    let stopped = Instant::now();
    eventually(TTL, "nobody leads", || async {
        cluster.leaders().await.is_empty().then_some(())
    })
    .await;
    let stepped_down = stopped.elapsed();
    // Let the batch in flight land, then nothing may move.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let frozen = stream_len(&cluster);
    tokio::time::sleep(OUTAGE.saturating_sub(stopped.elapsed())).await;
    assert_eq!(
        stream_len(&cluster),
        frozen,
        "forwarded without a lease\n{}",
        cluster.logs()
    );
    assert!(cluster.leaders().await.is_empty());
    cluster.etcd[0].resume();

    cluster.wait_leader(Duration::from_secs(10), &[]).await;
    let pushed = producer.stop().await;
    let delivery = cluster.check_exactly_once(&pushed).await;
    println!(
        "no failsafe, etcd stopped {OUTAGE:?}: leader stepped down after {stepped_down:?}; {delivery:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_of_three_etcd_members_does_not_interrupt_forwarding() {
    let (cluster, leader, epoch, producer, monitor) = under_load(3).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Kill etcd's own raft leader: the harder case (an etcd election follows).
    let raft_leader = {
        let c = cluster.read().await;
        let mut found = None;
        for (i, member) in c.etcd.iter().enumerate() {
            let status = etcd_client(&member.endpoint())
                .await
                .status()
                .await
                .expect("etcd status");
            if status.leader() == status.header().expect("header").member_id() {
                found = Some(i);
            }
        }
        found.expect("etcd has a raft leader")
    };
    cluster.write().await.etcd[raft_leader].kill();
    tokio::time::sleep(Duration::from_secs(4)).await;

    let pushed = producer.stop().await;
    let report = monitor.finish().await;
    let c = cluster.read().await;
    assert_eq!(
        c.leaders().await,
        vec![(leader, epoch)],
        "the same leader, same term\n{}",
        c.logs()
    );
    assert_eq!(report.order, vec![epoch], "no other term began");
    let delivery = c.check_exactly_once(&pushed).await;
    assert!(
        delivery.max_lateness_ms < 1500 * patience() as u64,
        "forwarding was interrupted: {delivery:?}"
    );
    println!("etcd member (raft leader m{raft_leader}) killed: {delivery:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_leader_key_by_hand_makes_the_leader_step_down() {
    let (cluster, leader, epoch, producer, monitor) = under_load(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut etcd = etcd_client(&cluster.read().await.etcd[0].endpoint()).await;
    let keys = campaigners(&mut etcd).await;
    let (key, _) = keys
        .iter()
        .find(|(_, rev)| *rev as u64 == epoch)
        .expect("the leader's key")
        .clone();
    let deleted_at = Instant::now();
    etcd.delete(key, None).await.expect("delete the leader key");
    let c = cluster.read().await;
    let (_, new_epoch, took) = takeover(&c, leader, deleted_at, TTL).await;
    assert!(new_epoch > epoch);
    drop(c);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let pushed = producer.stop().await;
    monitor.finish().await;
    let delivery = cluster.read().await.check_exactly_once(&pushed).await;
    println!("leader key deleted: new leader after {took:?}; {delivery:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_left_by_an_older_etcd_cluster_is_reported_and_can_be_reset() {
    let redis = RedisServer::start().expect("start redis-server");
    let etcd = EtcdServer::start().expect("start etcd");
    let store = Store::connect(&support::config(&redis.url(), "").store_config())
        .await
        .unwrap();
    // What the leaders of a previous etcd cluster left behind.
    store.raise_fences(1_000_000).await.unwrap();
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 4\n\n[etcd]\nendpoints = [\"{}\"]\ncluster = \"ha\"\nlease_ttl = \"2s\"\n",
        redis.url(),
        etcd.endpoint()
    );
    let node = DelayqProcess::start(&delayq_bin(), "n0", &config).expect("start delayq");
    let http = reqwest::Client::new();
    let fenced = Arc::new(AtomicUsize::new(0));
    eventually(
        Duration::from_secs(5),
        "the new leader is fenced",
        || async {
            let text = support::metrics(&http, node.url("/metrics")).await?;
            let n = support::counter(&text, "delayq_fenced_total");
            fenced.store(n as usize, Ordering::Relaxed);
            (n >= 1.0).then_some(())
        },
    )
    .await;
    assert_eq!(
        http.get(node.url("/leader")).send().await.unwrap().status(),
        503
    );

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
    eventually(
        Duration::from_secs(8),
        "the node leads after the reset",
        || async {
            (http.get(node.url("/leader")).send().await.ok()?.status() == 200).then_some(())
        },
    )
    .await;
    let msg = NewMessage::payload(STREAM, "after reset", Duration::ZERO);
    store
        .schedule(&msg, ScheduleMode::New, Duration::from_secs(60))
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "a message is forwarded", || async {
        (!support::entries(&mut redis.client(), STREAM).is_empty()).then_some(())
    })
    .await;
    assert!(
        store.highest_fence().await.unwrap() > 0,
        "the new leader raised the fence again"
    );
    println!(
        "rebuilt etcd: fenced {} times before the reset",
        fenced.load(Ordering::Relaxed)
    );
}
