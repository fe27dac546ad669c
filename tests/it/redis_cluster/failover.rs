//! Redis Cluster failovers and slot migrations under load, each on a cluster of its
//! own: pushes go on throughout, confirmed ones (with `redis.min_replicas_acked = 1`
//! when a master is killed) must each be forwarded exactly once, none early, and
//! no push, confirmed or not, may be forwarded twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::{BatchItem, Scheduled, Store, slot_master, slot_of};
use delayq_harness::RedisCluster;
use tokio_util::sync::CancellationToken;

use super::{cluster_config, kill_master_timed, own_cluster, reader};
use crate::support::entries;
use crate::support::now_ms;

/// What the producers pushed: confirmed ids with their stream and due time, and how
/// many pushes failed (each may or may not have been stored).
#[derive(Default)]
struct Pushed {
    confirmed: HashMap<String, (String, u64)>,
    /// When each confirmed push was sent (epoch ms).
    sent: HashMap<String, u64>,
    failed: usize,
}

/// Pushes batches of 20 messages to `streams`, due 0 to 1.5 s ahead, from two
/// tasks, until `stop`.
fn produce(store: Store, streams: Vec<String>, stop: CancellationToken) -> Arc<Mutex<Pushed>> {
    let pushed = Arc::new(Mutex::new(Pushed::default()));
    for task in 0..2 {
        let (store, streams, stop, pushed) =
            (store.clone(), streams.clone(), stop.clone(), pushed.clone());
        tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.is_cancelled() {
                let now = now_ms();
                let items: Vec<BatchItem> = (0..20)
                    .map(|k| {
                        n += 1;
                        BatchItem::new(NewMessage {
                            key: None,
                            id: MessageId::parse(&format!("p{task}-{n}")).unwrap(),
                            stream: streams[n % streams.len()].clone(),
                            fields: vec![("k".to_owned(), k.to_string())],
                            due: Due::At(now + (n as u64 * 37) % 1500),
                            priority: 0,
                            ttl: None,
                        })
                    })
                    .collect();
                let outcomes = store
                    .schedule_many(&items, Duration::from_secs(3600), None)
                    .await;
                {
                    let mut pushed = pushed.lock().unwrap();
                    for (item, outcome) in items.iter().zip(outcomes) {
                        match outcome {
                            Ok(Scheduled::Scheduled { .. }) => {
                                pushed.confirmed.insert(
                                    item.msg.id.to_string(),
                                    (item.msg.stream.clone(), item.msg.due.as_ms()),
                                );
                                pushed.sent.insert(item.msg.id.to_string(), now);
                            }
                            _ => pushed.failed += 1,
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    pushed
}

/// Waits until every confirmed push is in its stream, or (with `lossy`) until
/// nothing more arrives for 3 s, then checks: nothing twice, nothing early, each
/// in its own stream. Returns how many confirmed pushes are missing (0 unless
/// `lossy`; otherwise it panics after 60 s).
fn check(cluster: &RedisCluster, streams: &[String], pushed: &Pushed, lossy: bool) -> usize {
    let mut conn = reader(cluster);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut last_total, mut still_since) = (usize::MAX, Instant::now());
    let (seen, missing) = loop {
        let mut seen: HashMap<String, Vec<(String, u64)>> = HashMap::new();
        for stream in streams {
            for e in entries(&mut conn, stream) {
                let id = e.get("delayq-id").unwrap().to_owned();
                seen.entry(id).or_default().push((stream.clone(), e.ms()));
            }
        }
        let missing = pushed
            .confirmed
            .keys()
            .filter(|id| !seen.contains_key(*id))
            .count();
        let total: usize = seen.values().map(Vec::len).sum();
        if total != last_total {
            (last_total, still_since) = (total, Instant::now());
        }
        if missing == 0 || (lossy && still_since.elapsed() > Duration::from_secs(3)) {
            break (seen, missing);
        }
        assert!(
            Instant::now() < deadline,
            "{missing} of {} confirmed pushes lost",
            pushed.confirmed.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let twice: Vec<_> = seen.iter().filter(|(_, at)| at.len() > 1).collect();
    assert!(twice.is_empty(), "forwarded twice: {twice:?}");
    for (id, (stream, due)) in &pushed.confirmed {
        if let Some((to, at)) = seen.get(id).map(|s| &s[0]) {
            assert_eq!(to, stream, "{id}");
            assert!(at >= due, "{id} forwarded {} ms early", due - at);
        }
    }
    missing
}

/// Pushes under load, SIGKILLs the master of the first stream's slot (its
/// replica takes over), pushes on, and checks what was forwarded (see [`check`]).
/// Returns the confirmed pushes, those that failed, and those lost.
async fn kill_a_master_under_load(
    prefix: &'static str,
    extra: &str,
    lossy: bool,
) -> (usize, usize, usize) {
    let cluster = own_cluster().await;
    let config = cluster_config(&cluster, prefix, extra);
    let streams = streams(prefix);
    let store = Store::connect(&config.store_config()).await.unwrap();
    let daemon = delayq::start(config).await.expect("start delayq");
    let stop = CancellationToken::new();
    let pushed = produce(store, streams.clone(), stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The streams the victim serves: once it is killed, its replica takes over
    // with no replica of its own, so with replica acks no push to them sent after
    // the kill may be confirmed.
    let slots: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut reader(&cluster))
        .unwrap();
    let victim = slot_master(&slots, slot_of(&streams[0])).unwrap();
    let on_victim: Vec<&String> = streams
        .iter()
        .filter(|s| slot_master(&slots, slot_of(s)).as_ref() == Some(&victim))
        .collect();
    let (cluster, killed_at) = kill_master_timed(cluster, slot_of(&streams[0])).await;
    // Pushes to the other masters' slots are confirmed again (with replica acks,
    // not those to the promoted replica's: it has no replica of its own).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_end = pushed.lock().unwrap().confirmed.len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    let pushed = std::mem::take(&mut *pushed.lock().unwrap());
    assert!(
        pushed.confirmed.len() > before_end,
        "pushes are confirmed again after the failover"
    );
    if !lossy {
        let unreplicated: Vec<&String> = pushed
            .confirmed
            .iter()
            .filter(|(id, (stream, _))| on_victim.contains(&stream) && pushed.sent[*id] > killed_at)
            .map(|(id, _)| id)
            .collect();
        assert!(
            unreplicated.is_empty(),
            "confirmed though their master had no replica (sent after the kill to {on_victim:?}): {unreplicated:?}"
        );
    }
    let (cluster, lost) = tokio::task::spawn_blocking(move || {
        let lost = check(&cluster, &streams, &pushed, lossy);
        (cluster, (pushed.confirmed.len(), pushed.failed, lost))
    })
    .await
    .unwrap();
    daemon.stop().await;
    drop(cluster);
    lost
}

/// 24 streams over every master.
fn streams(prefix: &str) -> Vec<String> {
    (0..24).map(|i| format!("{prefix}-s{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_loses_and_duplicates_no_confirmed_push() {
    let (confirmed, failed, lost) = kill_a_master_under_load(
        "kill",
        "[redis]\nmin_replicas_acked = 1\nreplicas_ack_timeout = \"500ms\"\n",
        false,
    )
    .await;
    assert_eq!(lost, 0);
    eprintln!(
        "master killed (min_replicas_acked = 1): {confirmed} confirmed pushes forwarded once each; {failed} failed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replica_acks_a_killed_master_may_lose_pushes_but_duplicates_none() {
    let (confirmed, failed, lost) = kill_a_master_under_load("nowait", "", true).await;
    eprintln!(
        "master killed (no replica acks): {lost} of {confirmed} confirmed pushes lost; {failed} failed; none twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_migrated_under_load_lose_and_duplicate_nothing() {
    let cluster = own_cluster().await;
    let config = cluster_config(&cluster, "move", "");
    let streams = streams("move");
    let store = Store::connect(&config.store_config()).await.unwrap();
    let daemon = delayq::start(config).await.expect("start delayq");
    let stop = CancellationToken::new();
    let pushed = produce(store, streams.clone(), stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Three streams' slots (each holding the stream, its delay queue and fence)
    // move to another master while messages fall due, a few keys at a time.
    let cluster = tokio::task::spawn_blocking(move || {
        for stream in &streams[..3] {
            let slot = slot_of(stream);
            let from = cluster.master_of(slot).unwrap();
            let to = (0..cluster.nodes.len())
                .find(|&i| i != from && cluster.master_of_node(i))
                .unwrap();
            cluster
                .move_slot(slot, to, 2, Duration::from_millis(50))
                .unwrap();
            assert_eq!(cluster.master_of(slot).unwrap(), to);
        }
        cluster
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let pushed = std::mem::take(&mut *pushed.lock().unwrap());
    let streams = self::streams("move");
    let cluster = tokio::task::spawn_blocking(move || {
        assert_eq!(check(&cluster, &streams, &pushed, false), 0);
        eprintln!(
            "slots moved: {} confirmed pushes forwarded once each; {} failed during the moves",
            pushed.confirmed.len(),
            pushed.failed
        );
        cluster
    })
    .await
    .unwrap();
    daemon.stop().await;
    drop(cluster);
}
