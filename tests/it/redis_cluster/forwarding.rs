//! Forwarding on Redis Cluster: exactly once and never early, over streams whose
//! slots spread across the masters.

use crate::support::now_ms;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::{BatchItem, Store, slot_of};

use super::{cluster_config, reader, shared_cluster};
use crate::support::{entries, schedule_new, xlen};

/// `n` messages to `streams`, ids `<prefix>-<i>`, due at `start` plus 0 to `spread_ms`.
pub(super) fn messages(
    prefix: &str,
    n: usize,
    streams: &[String],
    start: u64,
    spread_ms: u64,
) -> Vec<BatchItem> {
    (0..n)
        .map(|i| {
            let jitter = (i as u64).wrapping_mul(2_654_435_761) % spread_ms.max(1);
            BatchItem::new(NewMessage {
                key: None,
                id: MessageId::parse(&format!("{prefix}-{i}")).unwrap(),
                stream: streams[i % streams.len()].clone(),
                fields: vec![("n".to_owned(), i.to_string())],
                due: Due::At(start + jitter),
                priority: 0,
                ttl: None,
            })
        })
        .collect()
}

/// Schedules `items` a thousand at a time; panics unless each is stored anew.
pub(super) async fn schedule_all(store: &Store, items: &[BatchItem]) {
    for chunk in items.chunks(1000) {
        schedule_new(store, chunk, Duration::from_secs(3600)).await;
    }
}

/// Waits until `streams` hold `n` entries in all (panics after `timeout`), then
/// checks that each of `items` is there exactly once, in its own stream, not before
/// its due time; returns how many entries each id has (for the caller's reports).
pub(super) fn check_exactly_once(
    conn: &mut redis::cluster::ClusterConnection,
    streams: &[String],
    items: &[BatchItem],
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let total: usize = streams.iter().map(|s| xlen(conn, s)).sum();
        if total >= items.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{total} of {} forwarded after {timeout:?}",
            items.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let due: HashMap<&str, (&str, u64)> = items
        .iter()
        .map(|i| {
            (
                i.msg.id.as_str(),
                (i.msg.stream.as_str(), i.msg.due.as_ms()),
            )
        })
        .collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for stream in streams {
        for e in entries(conn, stream) {
            let id = e.get("delayq-id").expect("an id field").to_owned();
            let (want_stream, due_ms) = due[id.as_str()];
            assert_eq!(want_stream, stream, "{id} went to the wrong stream");
            assert!(
                e.ms() >= due_ms,
                "{id} forwarded {} ms early",
                due_ms - e.ms()
            );
            *seen.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "forwarded more than once: {twice:?}");
    assert_eq!(
        seen.len(),
        items.len(),
        "lost: {}",
        items.len() - seen.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_thousand_messages_are_forwarded_once_and_none_early_across_the_masters() {
    let cluster = shared_cluster();
    let config = cluster_config(&cluster, "once", "");
    let store = Store::connect(&config.store_config()).await.unwrap();
    // 24 streams, every eighth under a hash tag of its own; their slots spread
    // over the three masters.
    let streams: Vec<String> = (0..24)
        .map(|i| match i % 8 {
            0 => format!("{{once-t{i}}}orders"),
            _ => format!("once-s{i}"),
        })
        .collect();
    let masters: std::collections::BTreeSet<u16> =
        streams.iter().map(|s| slot_of(s) / 5462).collect();
    assert_eq!(masters.len(), 3, "the streams' slots reach every master");

    // One master without delayq's function library (as after a restart without its
    // data, or a master added later): the first call there loads it again.
    let node = |url: &String| {
        redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap()
    };
    let masters: Vec<String> = cluster
        .urls()
        .into_iter()
        .filter(|url| {
            let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut node(url)).unwrap();
            matches!(&role[0], redis::Value::BulkString(r) if r == b"master")
        })
        .collect();
    assert_eq!(masters.len(), 3, "{:?}", cluster.urls());
    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut node(&masters[2]))
        .unwrap();

    let daemon = delayq::start(config).await.expect("start delayq");
    let items = messages("once", 50_000, &streams, now_ms() + 500, 4000);
    schedule_all(&store, &items).await;
    let mut in_use = store.shards_in_use().await.unwrap();
    let mut slots: Vec<u16> = streams.iter().map(|s| slot_of(s)).collect();
    in_use.sort_unstable();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(in_use, slots, "the slots in use are the streams'");

    let mut conn = reader(&cluster);
    check_exactly_once(&mut conn, &streams, &items, Duration::from_secs(90));
    // Nothing stays behind, and nothing more arrives.
    let pending: u64 = store
        .pending_per_shard()
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert_eq!(pending, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let total: usize = streams.iter().map(|s| xlen(&mut conn, s)).sum();
    assert_eq!(total, items.len());
    for url in &masters {
        assert_eq!(
            crate::support::libraries(&mut node(url)).len(),
            1,
            "{url} holds delayq's library"
        );
    }
    daemon.stop().await;
}

/// Streams with a rate limit of their own, their messages kept apart when stored
/// (each in its stream's held set, in the stream's slot): forwarded once, none
/// early, at most at the limit, beside unlimited streams on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_kept_apart_for_a_rate_limit_are_forwarded_once_and_none_early() {
    let cluster = shared_cluster();
    let streams: Vec<String> = (0..6).map(|i| format!("apart-s{i}")).collect();
    let limited = &streams[..3];
    let limits: String = limited
        .iter()
        .map(|s| format!("\"{s}\" = 1000\n"))
        .collect();
    let config = cluster_config(&cluster, "apart", &format!("[streams.max_rate]\n{limits}"));
    let store = Store::connect(&config.store_config()).await.unwrap();
    store.keep_apart(config.kept_apart());
    // All due at once: only the limit spreads a limited stream's out.
    let items = messages("apart", 6_000, &streams, now_ms() + 1_500, 1);
    schedule_all(&store, &items).await;
    let mut conn = reader(&cluster);
    for stream in limited {
        let key = store.keys().shard(slot_of(stream)).held_of(stream);
        let held: u64 = redis::cmd("ZCARD").arg(&key).query(&mut conn).unwrap();
        assert_eq!(held, 1_000, "{key}");
    }
    let daemon = delayq::start(config).await.expect("start delayq");
    check_exactly_once(&mut conn, &streams, &items, Duration::from_secs(60));
    for stream in limited {
        let times: Vec<u64> = entries(&mut conn, stream).iter().map(|e| e.ms()).collect();
        let spread = times.last().unwrap() - times.first().unwrap();
        // 1000 due at once, sent at 1000/s less the first burst (about 0.95 s; a
        // generous bound, which catches a limit not applied at all).
        assert!(
            spread >= 500,
            "{stream}: 1000 sent in {spread} ms at a limit of 1000/s"
        );
    }
    daemon.stop().await;
}
