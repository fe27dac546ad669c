//! `election.mode = "per_shard"`: several active leaders, each leading a share of
//! the election groups, with real processes. The groups spread over the nodes,
//! a killed node's groups move to the others, and a node that joins takes its
//! share, while every message is delivered exactly once and no group is ever led
//! by two nodes at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Producer, TTL, check_exactly_once, deliveries, flowing, node_counter};
use crate::support::now_ms;
use crate::support::{self, Api, Cluster, eventually};
use delayq_client::store::Store;

const GROUPS: usize = 6;
const FORWARDED: &str = "delayq_messages_forwarded_total";

/// Six shards in six groups, one per shard.
fn settings() -> String {
    format!(
        "{}[election]\nmode = \"per_shard\"\ngroups = {GROUPS}\n",
        super::settings(true).replace("shards = 4", &format!("shards = {GROUPS}"))
    )
}

/// The groups each of `nodes` says it leads, with its epoch of each; None for a
/// node that does not answer.
async fn led(api: &Api) -> Option<Vec<(usize, u64)>> {
    let (status, view) = api.try_get("/v1/leader").await?;
    if status != 200 {
        return None;
    }
    let groups = view["groups"].as_array()?;
    assert_eq!(groups.len(), GROUPS, "{view}");
    Some(
        groups
            .iter()
            .filter(|g| g["is_leader"] == true)
            .filter_map(|g| Some((g["group"].as_u64()? as usize, g["epoch"].as_u64()?)))
            .collect(),
    )
}

/// How many groups each of `live` leads, once every group is led by exactly one
/// of them and (when `balanced`) the counts differ by at most one.
async fn spread(cluster: &Cluster, live: &[usize], balanced: bool) -> Option<Vec<usize>> {
    let mut counts = Vec::new();
    let mut leaders = [0; GROUPS];
    for &i in live {
        let groups = led(&cluster.apis[i]).await?;
        counts.push(groups.len());
        for (g, _) in groups {
            leaders[g] += 1;
        }
    }
    let (most, fewest) = (*counts.iter().max()?, *counts.iter().min()?);
    (leaders.iter().all(|n| *n == 1) && (!balanced || most <= fewest + 1)).then_some(counts)
}

/// Whether `api`'s group gauges agree with the groups it says it leads: leader 1
/// with the same epoch for those, 0 for the rest.
async fn gauges_agree(api: &Api) -> Option<()> {
    let led = led(api).await?;
    let text = api.metrics().await?;
    let gauge = |name: &str, g: usize| {
        let series = format!("{name}{{group=\"{g}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&series)?.parse::<f64>().ok())
    };
    (0..GROUPS)
        .all(|g| match led.iter().find(|(led, _)| *led == g) {
            Some((_, epoch)) => {
                gauge("delayq_group_leader", g) == Some(1.0)
                    && gauge("delayq_group_epoch", g) == Some(*epoch as f64)
            }
            None => gauge("delayq_group_leader", g).unwrap_or(0.0) == 0.0,
        })
        .then_some(())
}

/// Waits until the groups are spread over `live`; how long that took.
async fn spread_over(cluster: &Cluster, live: &[usize], limit: Duration) -> Duration {
    let started = Instant::now();
    eventually(limit, &format!("groups spread over nodes {live:?}"), || {
        spread(cluster, live, true)
    })
    .await;
    started.elapsed()
}

/// (group, epoch) → the nodes that claimed to lead the group with that epoch.
type Claims = BTreeMap<(usize, u64), Vec<usize>>;

/// Samples every node's groups all along: a group claimed by two nodes in two
/// samples in a row, one group's epoch claimed by two nodes, or a group's epochs
/// going backwards is a split brain.
struct GroupMonitor {
    stop: CancellationToken,
    samples: Arc<AtomicUsize>,
    /// The longest run of samples with a group led twice, and the claims.
    task: JoinHandle<(usize, Claims)>,
}

impl GroupMonitor {
    /// Samples the nodes in `apis`, as many as it holds at each sample.
    fn start(apis: Arc<Mutex<Vec<Api>>>) -> GroupMonitor {
        let stop = CancellationToken::new();
        let samples = Arc::new(AtomicUsize::new(0));
        let (token, taken) = (stop.clone(), samples.clone());
        let task = tokio::spawn(async move {
            let mut claims = Claims::new();
            let mut runs = [0usize; GROUPS];
            let mut longest = 0;
            while !token.is_cancelled() {
                let mut holders = [0usize; GROUPS];
                let nodes = apis.lock().unwrap().clone();
                for (i, api) in nodes.iter().enumerate() {
                    for (g, epoch) in led(api).await.unwrap_or_default() {
                        holders[g] += 1;
                        let nodes = claims.entry((g, epoch)).or_default();
                        if !nodes.contains(&i) {
                            nodes.push(i);
                        }
                    }
                }
                for g in 0..GROUPS {
                    runs[g] = if holders[g] > 1 { runs[g] + 1 } else { 0 };
                    longest = longest.max(runs[g]);
                }
                taken.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(25)) => {}
                }
            }
            (longest, claims)
        });
        GroupMonitor {
            stop,
            samples,
            task,
        }
    }

    async fn finish(self) -> Claims {
        eventually(Duration::from_secs(10), "enough samples", || {
            std::future::ready((self.samples.load(Ordering::Relaxed) > 10).then_some(()))
        })
        .await;
        self.stop.cancel();
        let (longest, claims) = self.task.await.expect("monitor");
        assert!(longest < 2, "a group led by two nodes at once: {claims:?}");
        assert!(
            claims.values().all(|nodes| nodes.len() == 1),
            "one group's epoch led by two nodes: {claims:?}"
        );
        claims
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_spread_over_the_nodes_move_on_a_kill_and_rebalance_when_a_node_joins_or_resigns() {
    let mut cluster = Cluster::start(3, 1, &settings()).await;
    let first = spread_over(&cluster, &[0, 1, 2], Duration::from_secs(20)).await;
    for api in &cluster.apis {
        eventually(
            Duration::from_secs(5),
            "group gauges agree with /v1/leader",
            || gauges_agree(api),
        )
        .await;
    }
    // A producer with the nodes' shards, so that every group has messages to move.
    let store = Store::connect(
        &support::config(
            &cluster.redis.url(),
            &format!("[redis]\nshards = {GROUPS}\n"),
        )
        .store_config(),
    )
    .await
    .expect("connect to redis");
    let producer = Producer::start(&store);
    flowing(&cluster, 10).await;
    let sampled = Arc::new(Mutex::new(cluster.apis.clone()));
    let monitor = GroupMonitor::start(sampled.clone());

    // SIGKILL a node: its groups go to the other two, within the lease TTL.
    let killed_at = Instant::now();
    cluster.nodes[0].kill();
    eventually(
        TTL + Duration::from_secs(1),
        "the killed node's groups led again",
        || spread(&cluster, &[1, 2], false),
    )
    .await;
    let taken_over = killed_at.elapsed();
    spread_over(&cluster, &[1, 2], Duration::from_secs(10)).await;
    let moved = killed_at.elapsed();
    flowing(&cluster, 10).await;

    // A fourth node joins: it takes its share from the others, by switchovers.
    let joined_ms = now_ms();
    let mut before = Vec::new();
    for i in [1, 2] {
        before.push(node_counter(&cluster, i, FORWARDED).await);
    }
    let new = cluster.join();
    sampled.lock().unwrap().push(cluster.apis[new].clone());
    let rebalanced = spread_over(&cluster, &[1, 2, new], Duration::from_secs(20)).await;
    flowing(&cluster, 10).await;

    // A node asked to resign gives up every group it leads, and gets its share
    // back by the spreading.
    let (status, resigned) = cluster.apis[1]
        .clone()
        .with_timeout(Duration::from_secs(10))
        .call("POST", "/v1/admin/resign", None, None)
        .await;
    assert_eq!(
        (status, &resigned["resigned"]),
        (200, &true.into()),
        "{resigned}"
    );
    let respread = spread_over(&cluster, &[1, 2, new], Duration::from_secs(20)).await;
    flowing(&cluster, 10).await;
    let pushed = producer.stop().await;
    let claims = monitor.finish().await;
    let delivery = check_exactly_once(&cluster, &pushed).await;

    // Every live node forwards its share after the join.
    for (n, i) in [1, 2, new].into_iter().enumerate() {
        let now = node_counter(&cluster, i, FORWARDED).await;
        let was = before.get(n).copied().unwrap_or(0.0);
        assert!(
            now > was,
            "node {i} forwarded nothing after the join ({was} → {now})"
        );
    }
    // Messages due after the join (and the resign) were late by no more than a switchover's worth
    // (generous: this only catches a group left without a leader for long).
    let due: std::collections::HashMap<String, u64> =
        pushed.iter().map(|p| (p.id.clone(), p.due_ms)).collect();
    let late_after_join = deliveries(&cluster)
        .entries()
        .iter()
        .filter_map(|e| {
            let due = *due.get(e.get("delayq-id")?)?;
            (due > joined_ms).then(|| e.ms().saturating_sub(due))
        })
        .max()
        .unwrap_or(0);
    assert!(
        late_after_join < 1_500,
        "a message due after the join was {late_after_join} ms late\n{}",
        cluster.logs()
    );
    // `delayq fence show` names each group's leader, as etcd has it.
    let out = std::process::Command::new(crate::support::delayq_bin())
        .args(["fence", "show", "--config"])
        .arg(cluster.nodes[new].config_path())
        .output()
        .expect("run delayq fence show");
    let shown = String::from_utf8_lossy(&out.stdout);
    for g in 0..GROUPS {
        let line = shown
            .lines()
            .find(|l| l.starts_with(&format!("group {g} (shards [{g}]): leader n")))
            .unwrap_or_else(|| panic!("no leader shown for group {g}: {shown}"));
        assert!(line.contains("(epoch "), "{line}");
    }
    // The failover drill drives single-leader deployments, and says so.
    let mut drill = std::process::Command::new(crate::support::delayq_bin());
    drill
        .args(["drill", "--rounds", "1", "--redis-url"])
        .arg(cluster.redis.url());
    for i in [1, 2, new] {
        drill
            .arg("--node")
            .arg(format!("n{i}={}", cluster.apis[i].url("")));
    }
    let out = drill.output().expect("run delayq drill");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("the drill drives single-leader deployments"),
        "{said}"
    );
    println!(
        "per_shard: spread in {first:?}; a kill's groups led again within {taken_over:?}, spread within {moved:?}; \
         rebalanced after a join in {rebalanced:?} and after a resign in {respread:?}; latest after the join {late_after_join} ms; \
         {delivery:?}; {} group terms",
        claims.len()
    );
}

/// `forwarder.max_rate` below the number of groups: each group leader gets a
/// fraction of a message a second, so together they keep to the limit (each
/// group's bucket starting with one permit) instead of one a second each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_below_the_group_count_is_kept_by_the_groups_together() {
    let cluster = Cluster::start(1, 1, &format!("{}[forwarder]\nmax_rate = 2\n", settings())).await;
    let api = &cluster.apis[0];
    eventually(Duration::from_secs(20), "every group led", || async {
        led(api).await.filter(|g| g.len() == GROUPS).map(|_| ())
    })
    .await;
    let items: Vec<_> = (0..40)
        .map(|i| serde_json::json!({ "id": format!("r{i}"), "stream": "limited", "payload": "x", "delay_ms": 0 }))
        .collect();
    let (status, answer) = api
        .post(
            "/v1/messages/batch",
            serde_json::json!({ "messages": items }),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let mut conn = cluster.redis.client();
    let first = eventually(Duration::from_secs(10), "a first delivery", || {
        std::future::ready(
            support::entries(&mut cluster.redis.client(), "limited")
                .first()
                .map(|e| e.id.clone()),
        )
    })
    .await;
    let first_ms: u64 = first.split('-').next().unwrap().parse().unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let entries = support::entries(&mut conn, "limited");
    let in_window = entries
        .iter()
        .filter(|e| e.id.split('-').next().unwrap().parse::<u64>().unwrap() < first_ms + 5_000)
        .count();
    // 2 a second for 5 s, the groups' first permits, and one step of slack; one a
    // second per group would have sent 30.
    assert!(
        in_window <= 2 * 5 + GROUPS + 2,
        "{in_window} in 5 s: {entries:?}"
    );
    assert!(in_window >= 5, "{in_window} in 5 s");

    // Lifted: the rest goes at once, each message once.
    let file = std::fs::read_to_string(cluster.nodes[0].config_path()).unwrap();
    std::fs::write(
        cluster.nodes[0].config_path(),
        file.replace("max_rate = 2", "max_rate = 0"),
    )
    .unwrap();
    let (status, answer) = api.post("/v1/admin/reload", serde_json::json!({})).await;
    assert_eq!(status, 200, "{answer}");
    eventually(Duration::from_secs(10), "all 40 delivered", || {
        std::future::ready(
            (support::entries(&mut cluster.redis.client(), "limited").len() >= 40).then_some(()),
        )
    })
    .await;
    let mut ids: Vec<String> = support::entries(&mut conn, "limited")
        .iter()
        .filter_map(|e| e.get("delayq-id").map(str::to_owned))
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 40);
    assert_eq!(support::entries(&mut conn, "limited").len(), 40);
}

/// The backlog gauges with several active leaders: the node leading group 0 counts
/// every shard, the others report nothing of it, so a sum (or max) over the nodes
/// is the deployment's figure whichever node leads which groups. Thirty messages
/// due now to a paused stream wait in every group's held sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_gauges_count_every_shard_once_over_the_nodes() {
    let cluster = Cluster::start(2, 1, &settings()).await;
    eventually(
        Duration::from_secs(30),
        "groups spread over both nodes",
        || spread(&cluster, &[0, 1], true),
    )
    .await;
    let api = &cluster.apis[0];
    let (status, answer) = api.post("/v1/streams/p/pause", serde_json::json!({})).await;
    assert_eq!(status, 200, "{answer}");
    // In force at once (every forward call reads the set); each group's leader
    // also reads it for its own waits, within 250 ms.
    eventually(
        Duration::from_secs(10),
        "the pause read by every group",
        || {
            let read: usize = cluster
                .nodes
                .iter()
                .map(|n| {
                    n.full_log()
                        .matches("paused streams paused={\"p\"}")
                        .count()
                })
                .sum();
            std::future::ready((read >= GROUPS).then_some(()))
        },
    )
    .await;
    let items: Vec<_> = (0..30)
        .map(|i| serde_json::json!({ "id": format!("h{i}"), "stream": "p", "payload": "x", "delay_ms": 0 }))
        .collect();
    let (status, answer) = api
        .post(
            "/v1/messages/batch",
            serde_json::json!({ "messages": items }),
        )
        .await;
    assert_eq!(
        (status, &answer["scheduled"]),
        (200, &serde_json::json!(30)),
        "{answer}"
    );
    let (_, stats) = api.get("/v1/stats").await;
    let shards_used = stats["pending"]["per_shard"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n.as_u64() > Some(0))
        .count();
    assert!(shards_used > 1, "all in one shard: {stats}");
    let held = |text: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix("delayq_held_messages{stream=\"p\"} ")?
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    // Reported every 5 s by the node leading group 0.
    let last = Mutex::new(Vec::new());
    let per_node = support::within(Duration::from_secs(30), || async {
        let mut per_node = Vec::new();
        for api in &cluster.apis {
            per_node.push(held(&api.metrics().await?));
        }
        *last.lock().unwrap() = per_node.clone();
        (per_node.iter().sum::<f64>() == 30.0).then_some(per_node)
    })
    .await
    .unwrap_or_else(|| panic!("not 30 held over the nodes: {:?}", last.lock().unwrap()));
    let mut zero_leader = None;
    for i in [0, 1] {
        if led(&cluster.apis[i])
            .await
            .is_some_and(|g| g.iter().any(|(g, _)| *g == 0))
        {
            zero_leader = Some(i);
        }
    }
    let zero_leader = zero_leader.expect("a node leads group 0");
    assert_eq!(per_node[zero_leader], 30.0, "{per_node:?}");
    assert_eq!(per_node[1 - zero_leader], 0.0, "{per_node:?}");
}
