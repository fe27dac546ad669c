//! Redis Cluster as deployed: three masters and three replicas, every node's
//! Redis user the least-privilege one of docs/redis-rights.md made from its text,
//! `election.mode = "per_shard"` over three delayq nodes elected through etcd,
//! `min_replicas_acked = 1`. Under single pushes over streams on every master: a
//! reshard of 1000 slots by `redis-cli` (as an operator runs it), a master
//! SIGKILLed (its replica takes over, with no replica of its own), a node
//! SIGKILLed and another SIGTERMed. Every push confirmed is delivered once, none
//! early; none sent to the dead master's slots after its death is confirmed (no
//! replica had it); no answer is a 500; and no group has two leaders at once.

use crate::support::now_ms;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use delayq_client::store::{slot_master, slot_of};
use delayq_harness::{EtcdServer, RedisServer};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::redis_cluster::{cluster_toml, kill_master_timed, own_cluster, reader};
use crate::support::{documented_user_with, entries, eventually, led_groups, logs_of};

const GROUPS: usize = 3;

/// 24 streams over every master, four of them in the first 1000 slots of the
/// master that serves slot 0 (the ones the reshard moves): `dep-<k>` names,
/// chosen by their slots in `ranges` (each master's, in slot order).
fn pick_streams(ranges: &[(u16, u16)]) -> Vec<String> {
    let mut picked = Vec::new();
    let mut want = |lo: u16, hi: u16, n: usize| {
        let found: Vec<String> = (0..)
            .map(|k| format!("dep-{k}"))
            .filter(|name| (lo..=hi).contains(&slot_of(name)) && !picked.contains(name))
            .take(n)
            .collect();
        picked.extend(found);
    };
    want(ranges[0].0, ranges[0].0 + 999, 4);
    want(ranges[0].0 + 1000, ranges[0].1, 4);
    for &(lo, hi) in &ranges[1..] {
        want(lo, hi, 8);
    }
    picked
}

/// Each master's slot range in a fresh cluster's `CLUSTER SLOTS`, in slot order.
fn ranges(slots: &redis::Value) -> Vec<(u16, u16)> {
    let redis::Value::Array(ranges) = slots else {
        panic!("CLUSTER SLOTS: {slots:?}")
    };
    let mut found: Vec<(u16, u16)> = ranges
        .iter()
        .map(|r| {
            let redis::Value::Array(parts) = r else {
                panic!("{r:?}")
            };
            let int = |v: &redis::Value| redis::from_redis_value::<u16>(v.clone()).unwrap();
            (int(&parts[0]), int(&parts[1]))
        })
        .collect();
    found.sort();
    found
}

/// Each push: its stream, when it was sent, its answer and the due time named.
#[derive(Clone, Debug)]
struct Push {
    stream: String,
    sent: u64,
    status: u16,
    due: u64,
    /// How long its answer took (ms).
    took: u64,
}

/// How many slots the master on `port` serves in a `CLUSTER SLOTS` reply.
fn owned(slots: &redis::Value, port: u16) -> usize {
    (0..16384u16)
        .filter(|&slot| slot_master(slots, slot).is_some_and(|(_, p)| p == port))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_groups_and_acks_through_a_reshard_a_master_kill_and_node_deaths() {
    let cluster = own_cluster().await;
    let slots: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut reader(&cluster))
        .unwrap();
    let ranges = ranges(&slots);
    assert_eq!(ranges.len(), 3, "{ranges:?}");
    let streams = pick_streams(&ranges);
    // Every node's user made from docs/redis-rights.md's rule, for the prefix
    // `dep` and the streams `dep-<k>` (dead letters in their own slots).
    let dir = tempfile::tempdir().unwrap();
    let words = [
        ("~delayq:*", "~dep:*".to_owned()),
        ("~{delayq:*", "~{dep:*".to_owned()),
        ("&delayq:*", "&dep:*".to_owned()),
        ("~orders", "~dep-*".to_owned()),
        ("~orders:dead", "~{dep-*".to_owned()),
    ];
    let data: Vec<&RedisServer> = cluster.nodes.iter().collect();
    let password = documented_user_with(&data, &words, &[], dir.path());
    let allow: Vec<String> = streams.iter().map(|s| format!("\"{s}\"")).collect();
    let etcd = EtcdServer::start().expect("start etcd");
    let extra = format!(
        "[redis]\nmin_replicas_acked = 1\nreplicas_ack_timeout = \"500ms\"\npassword_file = \"{}\"\n\
         [etcd]\nendpoints = [\"{}\"]\nlease_ttl = \"6s\"\n\
         [election]\nmode = \"per_shard\"\ngroups = {GROUPS}\n\
         [streams]\nallow = [{}]\n",
        password.display(),
        etcd.endpoint(),
        allow.join(", ")
    );
    let text = cluster_toml(&cluster, "dep", &extra)
        .replace("url = \"redis://", "url = \"redis://delayq@");
    let (mut nodes, apis) = super::ready_nodes(
        &(0..3).map(|i| format!("dep{i}")).collect::<Vec<_>>(),
        &text,
    )
    .await;
    eventually(Duration::from_secs(20), "every group led", || async {
        let mut seen = Vec::new();
        for api in &apis {
            seen.extend(led_groups(api).await?.into_iter().map(|(g, _)| g));
        }
        seen.sort();
        (seen == (0..GROUPS).collect::<Vec<_>>()).then_some(())
    })
    .await;

    let live = Arc::new(Mutex::new(vec![0usize, 1, 2]));
    let stop = CancellationToken::new();
    let pushes = Arc::new(Mutex::new(BTreeMap::<String, Push>::new()));
    let answers_500 = Arc::new(Mutex::new(Vec::<String>::new()));
    let load = tokio::spawn({
        let (apis, live, stop) = (apis.clone(), live.clone(), stop.clone());
        let (pushes, answers_500, streams) = (pushes.clone(), answers_500.clone(), streams.clone());
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            for i in 0usize.. {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let api = {
                    let live = live.lock().unwrap();
                    apis[live[i % live.len()]]
                        .clone()
                        .with_timeout(Duration::from_secs(30))
                };
                let (id, stream, sent) = (
                    format!("c-{i}"),
                    streams[i % streams.len()].clone(),
                    now_ms(),
                );
                let body = json!({"id": id, "stream": stream, "payload": "x",
                                  "delay_ms": 300 + (i * 37) % 1200});
                let answer = api
                    .try_call("POST", "/v1/messages", None, Some(&body.to_string()))
                    .await;
                let (status, answer) = answer.unwrap_or((0, Value::Null));
                if status == 500 {
                    answers_500.lock().unwrap().push(answer.to_string());
                }
                let due = answer["deliver_at"].as_u64().unwrap_or(0);
                let took = now_ms().saturating_sub(sent);
                pushes.lock().unwrap().insert(
                    id,
                    Push {
                        stream,
                        sent,
                        status,
                        due,
                        took,
                    },
                );
            }
        }
    });
    // Who leads each group, sampled: two leaders of one group in two samples
    // running is two leaders at once (one sample may straddle a handover).
    let doubled = Arc::new(Mutex::new(Vec::<String>::new()));
    let sampler = tokio::spawn({
        let (apis, live, stop, doubled) =
            (apis.clone(), live.clone(), stop.clone(), doubled.clone());
        async move {
            let mut before: Vec<usize> = Vec::new();
            while !stop.is_cancelled() {
                let asked = live.lock().unwrap().clone();
                let mut claims: BTreeMap<usize, Vec<(usize, u64)>> = BTreeMap::new();
                for i in asked {
                    for (g, epoch) in led_groups(&apis[i]).await.unwrap_or_default() {
                        claims.entry(g).or_default().push((i, epoch));
                    }
                }
                let now: Vec<usize> = claims
                    .iter()
                    .filter(|(_, c)| c.len() > 1)
                    .map(|(g, _)| *g)
                    .collect();
                for g in now.iter().filter(|g| before.contains(g)) {
                    doubled
                        .lock()
                        .unwrap()
                        .push(format!("group {g}: {:?}", claims[g]));
                }
                before = now;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    confirms(&pushes, 120, "before the faults").await;

    // 1. 1000 slots move from the first master to the second while pushes go
    // on; the third master is the one to die.
    let victim_slot = ranges[2].0;
    let (from_slot, to_slot) = (ranges[0].0, ranges[1].0);
    let (cluster, to) = tokio::task::spawn_blocking(move || {
        let from = cluster.master_of(from_slot).unwrap();
        let to = cluster.master_of(to_slot).unwrap();
        cluster.reshard(from, to, 1000).unwrap();
        let to = cluster.urls()[to].clone();
        (cluster, to)
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    confirms(&pushes, 100, "after the reshard").await;

    // 2. The master of stream 0's slot dies; its replica takes over alone.
    let slots_now: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut reader(&cluster))
        .unwrap();
    let victim = slot_master(&slots_now, victim_slot).unwrap();
    let on_victim: Vec<String> = streams
        .iter()
        .filter(|s| slot_master(&slots_now, slot_of(s)).as_ref() == Some(&victim))
        .cloned()
        .collect();
    let port: u16 = to.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(
        owned(&slots_now, port),
        owned(&slots, port) + 1000,
        "the reshard moved 1000 slots"
    );
    let moved = streams[..4]
        .iter()
        .filter(|s| slot_master(&slots_now, slot_of(s)).is_some_and(|(_, p)| p == port))
        .count();
    assert_eq!(moved, 4, "the first four streams moved with the reshard");
    let (cluster, killed_at) = kill_master_timed(cluster, victim_slot).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    confirms(&pushes, 100, "after the master died").await;

    // 3. A node dies (SIGKILL), then another stops (SIGTERM): the last leads all.
    live.lock().unwrap().retain(|&i| i != 0);
    nodes[0].kill();
    tokio::time::sleep(Duration::from_secs(4)).await;
    confirms(&pushes, 100, "after a node died").await;
    live.lock().unwrap().retain(|&i| i != 1);
    nodes[1].signal(libc::SIGTERM);
    eventually(
        Duration::from_secs(30),
        "the last node leads every group",
        || async {
            let leading: Vec<usize> = led_groups(&apis[2])
                .await?
                .into_iter()
                .map(|(g, _)| g)
                .collect();
            (leading.len() == GROUPS).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    confirms(&pushes, 100, "with one node left").await;
    stop.cancel();
    load.await.unwrap();
    sampler.await.unwrap();
    let pushes = std::mem::take(&mut *pushes.lock().unwrap());

    // Every push is answered in bounded time, whatever the cluster connection
    // meets (a slot refresh that hangs included): each Redis call gives up after
    // `redis.timeout` (2 s), and the connection is then made anew from the seeds
    // (within 2 × `connect_timeout`).
    let slowest = pushes.values().map(|p| p.took).max().unwrap_or(0);
    println!("slowest answer: {slowest} ms of {} pushes", pushes.len());
    assert!(
        slowest < 10_000,
        "a push waited {slowest} ms for its answer\n{}",
        logs_of(&nodes)
    );
    let answers_500 = answers_500.lock().unwrap().clone();
    assert!(answers_500.is_empty(), "answers 500: {answers_500:?}");
    let doubled = doubled.lock().unwrap().clone();
    assert!(
        doubled.is_empty(),
        "two leaders of a group at once: {doubled:?}\n{}",
        logs_of(&nodes)
    );
    let unreplicated: Vec<&String> = pushes
        .iter()
        .filter(|(_, p)| p.status == 201 && p.sent > killed_at && on_victim.contains(&p.stream))
        .map(|(id, _)| id)
        .collect();
    assert!(
        unreplicated.is_empty(),
        "confirmed though their master had no replica: {unreplicated:?}"
    );

    let confirmed: Vec<&String> = pushes
        .iter()
        .filter(|(_, p)| p.status == 201)
        .map(|(id, _)| id)
        .collect();
    let seen = eventually(
        Duration::from_secs(60),
        "every confirmed push delivered",
        || {
            let mut conn = reader(&cluster);
            let mut seen: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
            for s in &streams {
                for e in entries(&mut conn, s) {
                    seen.entry(e.get("delayq-id").unwrap_or_default().to_owned())
                        .or_default()
                        .push((s.clone(), e.ms()));
                }
            }
            let missing = confirmed
                .iter()
                .filter(|id| !seen.contains_key(**id))
                .count();
            async move { (missing == 0).then_some(seen) }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut twice, mut early, mut unknown) = (Vec::new(), Vec::new(), Vec::new());
    for (id, at) in &seen {
        let Some(push) = pushes.get(id) else {
            unknown.push(id.clone());
            continue;
        };
        if at.len() > 1 {
            twice.push(format!("{id}: {at:?}"));
        }
        if at.iter().any(|(s, _)| *s != push.stream) {
            twice.push(format!("{id} in another stream: {at:?}"));
        }
        if push.status == 201 && at.iter().any(|(_, ms)| *ms < push.due) {
            early.push(format!("{id}: {at:?}, due {}", push.due));
        }
    }
    assert!(twice.is_empty(), "twice: {twice:?}");
    assert!(early.is_empty(), "early: {early:?}");
    assert!(unknown.is_empty(), "never pushed: {unknown:?}");
    let mut refused: BTreeMap<u16, usize> = BTreeMap::new();
    for p in pushes.values().filter(|p| p.status != 201) {
        *refused.entry(p.status).or_default() += 1;
    }
    // Each phase waited for its confirmed pushes (520 in all).
    assert!(confirmed.len() > 500, "{} confirmed", confirmed.len());
    println!(
        "deployed (Redis Cluster 3+3, ACL user, per_shard, acks, 3 nodes): {} confirmed and delivered once, refused by status (0: no answer) {refused:?}; \
         reshard of 1000 slots, master SIGKILL ({} streams on it), node SIGKILL and SIGTERM",
        confirmed.len(),
        on_victim.len()
    );
}

/// Waits until `more` pushes beyond those confirmed now are confirmed (201).
async fn confirms(pushes: &Mutex<BTreeMap<String, Push>>, more: usize, phase: &str) {
    let confirmed = || {
        let pushes = pushes.lock().unwrap();
        pushes.values().filter(|p| p.status == 201).count()
    };
    super::confirmed_more(confirmed, more, phase).await;
}
