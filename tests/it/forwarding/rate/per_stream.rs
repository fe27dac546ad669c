//! `streams.max_rate`: a stream at its limit drains its backlog at that rate, in due
//! order, while other streams in the same shards stay on time; a held message can be
//! read, cancelled, rescheduled and is a duplicate if pushed again; a reload lifts it;
//! a leader killed mid-drain loses and doubles nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::{Cancelled, Rescheduled, ScheduleMode, Scheduled, Status};

use super::{busiest_second, drained_from, push_overdue_to};
use crate::support::{self, Cluster, Deliveries, Env, eventually};

const SLOW: &str = "slow";
const FAST: &str = "fast";

/// The slow stream's backlog stored as a producer that knows its limit stores it
/// (kept apart: in its held set from the start), or as one that does not (in the
/// pending layouts, set aside by the forward calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_stream_kept_apart_drains_at_its_rate_while_the_others_stay_on_time() {
    drains_at_its_rate_while_the_others_stay_on_time(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_stream_drains_at_its_rate_while_the_others_stay_on_time() {
    drains_at_its_rate_while_the_others_stay_on_time(false).await;
}

async fn drains_at_its_rate_while_the_others_stay_on_time(kept_apart: bool) {
    let env = Env::start("[streams.max_rate]\nslow = 100\n").await;
    if kept_apart {
        env.store.keep_apart([SLOW.to_owned()]);
    }
    let slow = push_overdue_to(&env.store, SLOW, 300).await;
    let fast = push_overdue_to(&env.store, FAST, 100).await;
    let pushed_fast = Instant::now();
    // The fast stream's messages fell due after all of the slow stream's, in the
    // same shards: they must not wait behind them.
    let entries = drained_from(&env, FAST, &fast, Duration::from_secs(20)).await;
    let waited = pushed_fast.elapsed();
    let slow_sent = support::entries(&mut env.redis.client(), SLOW).len();
    assert!(
        slow_sent < 250,
        "the slow stream had {slow_sent} of 300 when the fast one was through after {waited:?}: its limit was not kept"
    );
    assert_eq!(entries.len(), 100);
    let held = env.store.held().await.expect("held");
    assert!(
        held.per_stream.get(SLOW).copied().unwrap_or(0) > 0,
        "{held:?}"
    );
    let slow_entries = drained_from(&env, SLOW, &slow, Duration::from_secs(30)).await;
    let spread = slow_entries.last().unwrap().ms() - slow_entries.first().unwrap().ms();
    // 300 at 100/s, less a first burst of 50 ms of the rate: about 2.95 s.
    assert!(
        spread >= 2_400,
        "drained in {spread} ms: the limit was not kept"
    );
    let busiest = busiest_second(&slow_entries);
    assert!(busiest <= 120, "{busiest} in one second at a limit of 100");
    eventually(Duration::from_secs(5), "nothing held", || async {
        (env.store.held().await.expect("held").total() == 0).then_some(())
    })
    .await;
}

/// Pushes through the daemon's API: `n` messages to `stream` (ids `<stream>-<tag>-<i>`),
/// due in `delay_ms`, with priorities 0-9 in turn; returns each id with its due time.
async fn push_via_api(
    env: &Env,
    stream: &str,
    tag: &str,
    n: usize,
    delay_ms: u64,
) -> HashMap<String, u64> {
    let mut pushed = HashMap::new();
    for i in 0..n {
        let id = format!("{stream}-{tag}-{i}");
        let body = json!({"stream": stream, "payload": "x", "delay": format!("{delay_ms}ms"), "id": id, "priority": i % 10});
        let (status, answer) = env.api.post("/v1/messages", body).await;
        assert_eq!(status, 201, "{answer}");
        pushed.insert(id, answer["deliver_at"].as_u64().expect("deliver_at"));
    }
    pushed
}

/// How many messages the held sets of `stream` keep, over every shard.
fn in_held_sets(env: &Env, stream: &str) -> u64 {
    let mut conn = env.redis.client();
    (0..env.store.shards())
        .map(|shard| {
            let key = env.store.keys().shard(shard).held_of(stream);
            redis::cmd("ZCARD")
                .arg(key)
                .query::<u64>(&mut conn)
                .unwrap()
        })
        .sum()
}

/// Whether `stream`'s held set has message `id`.
fn is_held(env: &Env, stream: &str, id: &str) -> bool {
    let shard = MessageId::parse(id).unwrap().shard(env.store.shards());
    let key = env.store.keys().shard(shard).held_of(stream);
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(key)
        .arg(id)
        .query(&mut env.redis.client())
        .unwrap();
    score.is_some()
}

/// Waits for every pushed message in `stream`; checks each arrived once, never
/// before its due time (both Redis's clock), and in due order.
async fn delivered_on_time(env: &Env, stream: &str, pushed: &HashMap<String, u64>) {
    let entries = drained_from(env, stream, pushed, Duration::from_secs(20)).await;
    for e in &entries {
        let id = e.get("delayq-id").unwrap();
        let due = pushed[id];
        assert!(e.ms() >= due, "{id} due at {due} arrived at {}", e.ms());
    }
}

/// Pushes one message at a time to the slow stream (through the API, due in 1 s)
/// until one is kept apart or not, as `kept` says (a reload reaches the API within a
/// few pushes); returns every one pushed.
async fn push_until_kept_apart(env: &Env, kept: bool, tag: &str) -> HashMap<String, u64> {
    let tries = std::sync::atomic::AtomicUsize::new(0);
    let pushed = std::sync::Mutex::new(HashMap::new());
    eventually(Duration::from_secs(5), "the reload in effect", || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let one = push_via_api(env, SLOW, &format!("{tag}{n}"), 1, 1_000).await;
        // Due in a second: still where it was stored.
        let apart = one.keys().all(|id| is_held(env, SLOW, id));
        pushed.lock().unwrap().extend(one);
        (apart == kept).then_some(())
    })
    .await;
    pushed.into_inner().unwrap()
}

/// Pushes to a limited stream, through the daemon's API (which keeps them apart, as
/// its running configuration says), wait in the stream's held set from the start,
/// not in the due order in front of the other streams: counted as scheduled and not
/// yet due, nothing held back, readable, and sent at their due time in due order.
/// A reload that lifts the limit leaves those already stored waiting for their time;
/// one that sets a limit keeps the next pushes apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_to_a_limited_stream_wait_in_its_held_set_until_due() {
    let env = Env::start("[streams.max_rate]\nslow = 1000\n").await;
    env.leading().await;
    let mut slow = push_via_api(&env, SLOW, "a", 40, 2_000).await;
    let fast = push_via_api(&env, FAST, "a", 10, 2_000).await;
    assert_eq!(in_held_sets(&env, SLOW), 40);
    assert_eq!(in_held_sets(&env, FAST), 0);
    let now = env.store.now_ms().await.expect("now");
    let report = env.store.pending_report(now).await.expect("report");
    let scheduled: u64 = report.per_shard.iter().map(|(_, n)| n).sum();
    assert_eq!(
        (scheduled, report.due, report.held.total()),
        (50, 0, 0),
        "{report:?}"
    );
    let earliest = *slow.values().chain(fast.values()).min().unwrap();
    assert_eq!(report.earliest_due_ms, Some(earliest), "{report:?}");
    let (status, overview) = env.api.get("/v1/overview").await;
    assert_eq!(status, 200, "{overview}");
    let p = &overview["pending"];
    assert_eq!(
        (
            p["total"].as_u64(),
            p["overdue"].as_u64(),
            p["held"].as_u64()
        ),
        (Some(50), Some(0), Some(0)),
        "{overview}"
    );
    assert_eq!(
        overview["due"]["next_minute"].as_u64(),
        Some(50),
        "{overview}"
    );
    let (_, message) = env.api.get(&format!("/v1/messages/{SLOW}-a-3")).await;
    assert_eq!(
        (message["state"].as_str(), message["stream"].as_str()),
        (Some("scheduled"), Some(SLOW)),
        "{message}"
    );
    let (_, streams) = env.api.get("/v1/streams").await;
    let row = streams["streams"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["stream"] == SLOW).cloned());
    assert!(row.as_ref().is_some_and(|r| r["held"] == 0), "{streams}");

    // Lifted: what the held set keeps still waits for its time; the next pushes
    // are no longer kept apart.
    let daemon = env.daemon.as_ref().expect("running");
    daemon
        .live_config()
        .send_replace(Arc::new(support::config(&env.redis.url(), "")));
    slow.extend(push_until_kept_apart(&env, false, "b").await);
    delivered_on_time(&env, FAST, &fast).await;
    delivered_on_time(&env, SLOW, &slow).await;
    assert_eq!(in_held_sets(&env, SLOW), 0);

    // Set again: the next pushes go to the held set.
    daemon.live_config().send_replace(Arc::new(support::config(
        &env.redis.url(),
        "[streams.max_rate]\nslow = 1000\n",
    )));
    slow.extend(push_until_kept_apart(&env, true, "c").await);
    delivered_on_time(&env, SLOW, &slow).await;
    assert_eq!(in_held_sets(&env, SLOW), 0);
}

/// Pushes one message already due to `stream`.
async fn push_one(env: &Env, stream: &str) -> NewMessage {
    let mut msg = NewMessage::payload(stream, "x", Duration::ZERO);
    msg.due = Due::At(1);
    let stored = env
        .store
        .schedule(&msg, ScheduleMode::New, Duration::from_secs(3600))
        .await
        .expect("schedule");
    assert!(matches!(stored, Scheduled::Scheduled { .. }), "{stored:?}");
    msg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_messages_stay_scheduled_for_reads_cancels_reschedules_and_duplicates() {
    let mut env = Env::start("[streams.max_rate]\nslow = 1\n").await;
    let mut msgs = Vec::new();
    for _ in 0..12 {
        msgs.push(push_one(&env, SLOW).await);
    }
    eventually(Duration::from_secs(10), "messages held back", || async {
        (env.store.held().await.expect("held").total() >= 8).then_some(())
    })
    .await;
    // Held messages count as scheduled and as due, and the earliest may be theirs:
    // every message here is due, held or not.
    let now = env.store.now_ms().await.expect("now");
    let report = env.store.pending_report(now).await.expect("report");
    let scheduled: u64 = report.per_shard.iter().map(|(_, n)| n).sum();
    assert_eq!(report.due, scheduled, "{report:?}");
    assert!((1..=scheduled).contains(&report.held.total()), "{report:?}");
    assert!(
        report.earliest_due_ms.is_some_and(|t| t <= now)
            && report.earliest_due_ms <= report.held.earliest_due_ms,
        "{report:?}"
    );
    let sent = |env: &Env| support::entries(&mut env.redis.client(), SLOW);
    let delivered: Vec<String> = sent(&env)
        .iter()
        .map(|e| e.get("delayq-id").unwrap().to_owned())
        .collect();
    let waiting: Vec<&NewMessage> = msgs
        .iter()
        .filter(|m| !delivered.iter().any(|d| d == m.id.as_str()))
        .collect();
    assert!(waiting.len() >= 8, "{} still waiting", waiting.len());
    let (cancel, moved, again) = (waiting[0], waiting[1], waiting[2]);

    match env.store.get(&again.id).await.expect("get") {
        Status::Scheduled(m) => assert_eq!(m.stream, SLOW),
        other => panic!("a held message reads as {other:?}"),
    }
    let repeat = env
        .store
        .schedule(again, ScheduleMode::New, Duration::from_secs(3600))
        .await
        .expect("repeat");
    assert!(
        matches!(repeat, Scheduled::Duplicate { .. }),
        "a held id pushed again: {repeat:?}"
    );
    let replaced = env
        .store
        .schedule(again, ScheduleMode::Replace, Duration::from_secs(3600))
        .await
        .expect("replace");
    assert!(
        matches!(replaced, Scheduled::Replaced { .. }),
        "{replaced:?}"
    );
    let retention = Duration::from_secs(60);
    assert_eq!(
        env.store
            .cancel(&cancel.id, retention)
            .await
            .expect("cancel"),
        Cancelled::Cancelled
    );
    let later = Due::In(Duration::from_secs(3600));
    let out = env
        .store
        .reschedule(&moved.id, later, Duration::from_secs(7200))
        .await
        .expect("reschedule");
    assert!(matches!(out, Rescheduled::Rescheduled { .. }), "{out:?}");

    // Lifted: everything left goes at once, each message once, except the cancelled
    // one and the one now due in an hour.
    let daemon = env.daemon.as_ref().expect("running");
    daemon
        .live_config()
        .send_replace(Arc::new(support::config(&env.redis.url(), "")));
    let entries = eventually(Duration::from_secs(10), "the rest delivered", || async {
        let entries = sent(&env);
        (entries.len() >= msgs.len() - 2).then_some(entries)
    })
    .await;
    let ids: Vec<&str> = entries
        .iter()
        .map(|e| e.get("delayq-id").unwrap())
        .collect();
    for m in &msgs {
        let n = ids.iter().filter(|id| **id == m.id.as_str()).count();
        let want = usize::from(m.id != cancel.id && m.id != moved.id);
        assert_eq!(n, want, "{} delivered {n} times", m.id.as_str());
    }
    assert_eq!(env.store.held().await.expect("held").total(), 0);
    assert_eq!(env.scheduled().await, 1, "only the rescheduled one is left");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_sets_a_limit_on_a_stream_that_had_none() {
    let mut env = Env::start("").await;
    let daemon = env.daemon.as_ref().expect("running");
    daemon.live_config().send_replace(Arc::new(support::config(
        &env.redis.url(),
        "[streams.max_rate]\nslow = 50\n",
    )));
    // A reload reaches the forward loops before their next batch; give them one.
    let marker = push_one(&env, FAST).await;
    eventually(
        Duration::from_secs(5),
        "a batch after the reload",
        || async {
            support::entries(&mut env.redis.client(), FAST)
                .iter()
                .any(|e| e.get("delayq-id") == Some(marker.id.as_str()))
                .then_some(())
        },
    )
    .await;
    let slow = push_overdue_to(&env.store, SLOW, 150).await;
    let entries = drained_from(&env, SLOW, &slow, Duration::from_secs(20)).await;
    let spread = entries.last().unwrap().ms() - entries.first().unwrap().ms();
    // 150 at 50/s, less the first burst: about 2.95 s.
    assert!(spread >= 2_400, "drained in {spread} ms at a limit of 50");
    let ids: Vec<MessageId> = slow
        .keys()
        .map(|id| MessageId::parse(id).unwrap())
        .collect();
    assert_eq!(ids.len(), 150);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_while_a_limited_stream_drains_loses_and_doubles_nothing() {
    let mut cluster = Cluster::start(
        2,
        1,
        "[redis]\nshards = 4\n[etcd]\ncluster = \"rate\"\n[streams.max_rate]\nslow = 200\n[log]\nlevel = \"info\"\n",
    )
    .await;
    let (leader, _) = cluster.one_leader().wait(|| cluster.logs()).await;
    let slow = push_overdue_to(&cluster.store, SLOW, 800).await;
    let deliveries = Deliveries::new(&cluster.redis.url(), &[SLOW]);
    eventually(Duration::from_secs(10), "the drain under way", || {
        std::future::ready(deliveries.len().filter(|n| *n >= 150).map(|_| ()))
    })
    .await;
    let held = cluster.store.held().await.expect("held").total();
    assert!(held > 0, "nothing held back at 200/s");
    cluster.nodes[leader].kill();
    let (tally, _) = deliveries
        .exactly_once(slow.keys(), Duration::from_secs(30))
        .await;
    tally.assert_exact(&cluster.logs());
    assert_eq!(cluster.store.held().await.expect("held").total(), 0);
}

/// The script reads a body's stream off its first bytes to decide whether it waits:
/// names of every length the body's encoding treats differently (1 to 31 bytes, 32
/// and more, past 255, the longest allowed), with a multi-byte character, are held
/// under their own names and delivered to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_every_name_length_are_held_under_their_own_name() {
    let names: Vec<String> = [1, 31, 32, 255, 256]
        .iter()
        .map(|&n: &usize| format!("é{}", "s".repeat(n.saturating_sub(2))))
        .collect();
    let limits: String = names.iter().map(|n| format!("\"{n}\" = 1\n")).collect();
    let env = Env::start(&format!("[streams.max_rate]\n{limits}")).await;
    for name in &names {
        for _ in 0..3 {
            push_one(&env, name).await;
        }
    }
    let held = eventually(Duration::from_secs(10), "each stream holds two", || async {
        let held = env.store.held().await.expect("held");
        names
            .iter()
            .all(|n| held.per_stream.get(n).copied().unwrap_or(0) >= 1)
            .then_some(held)
    })
    .await;
    assert_eq!(held.per_stream.len(), names.len(), "{held:?}");
    for name in &names {
        let sent = support::entries(&mut env.redis.client(), name);
        assert!(sent.len() <= 2, "{name}: {} sent at 1/s", sent.len());
    }
}

/// One forward call of a batch of 10 with a budget for `slow`, over 20 `slow`
/// messages (kept apart: in its held set from the start, or in the pending layouts)
/// due before `fast` ones, in one shard: (slow sent, fast sent, held).
async fn one_call(kept_apart: bool, budget: usize, fast: usize) -> (u64, u64, u64) {
    let bare = support::Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    if kept_apart {
        store.keep_apart([SLOW.to_owned()]);
    }
    push_overdue_to(store, SLOW, 20).await;
    // Later by Redis's clock, so due after every slow one.
    tokio::time::sleep(Duration::from_millis(5)).await;
    push_overdue_to(store, FAST, fast).await;
    let options = bare.config.forward_options();
    let batch = store
        .forward_at_most(0, 1, &options, 10, &[(SLOW.to_owned(), budget)])
        .await
        .expect("forward");
    let sent = |stream: &str| {
        batch
            .per_stream
            .iter()
            .find(|(s, _)| s == stream)
            .map_or(0, |(_, n)| *n)
    };
    let held = store.held().await.expect("held").total();
    (sent(SLOW), sent(FAST), held)
}

/// A budget above what the call may send (the limit does not bind) sends the batch
/// in due order and sets nothing aside; one the call uses up sets the rest of its
/// stream aside, so that the messages behind go in the same call if it has room.
#[tokio::test]
async fn a_call_sets_a_limited_stream_aside_only_when_its_budget_runs_out() {
    for (budget, want) in [
        (11, (10, 0, 0)),
        (1000, (10, 0, 0)),
        (10, (10, 0, 10)),
        (3, (3, 5, 17)),
        (0, (0, 5, 20)),
    ] {
        assert_eq!(one_call(false, budget, 5).await, want, "budget {budget}");
    }
}

/// A held backlog leaves the streams behind it room in every call, at least half
/// the batch, however large its budget (a limit that does not bind); with no other
/// stream due, or one with fewer due than half, it takes the rest.
#[tokio::test]
async fn a_held_backlog_shares_each_call_with_the_streams_behind_it() {
    for (budget, fast, want) in [
        (1000, 0, (10, 0, 10)),
        (11, 0, (10, 0, 10)),
        (1000, 3, (7, 3, 13)),
        (1000, 5, (5, 5, 15)),
        (1000, 8, (5, 5, 15)),
        (11, 20, (5, 5, 15)),
        (3, 5, (3, 5, 17)),
        (3, 20, (3, 7, 17)),
        (0, 5, (0, 5, 20)),
    ] {
        assert_eq!(
            one_call(true, budget, fast).await,
            want,
            "budget {budget}, {fast} fast"
        );
    }
}

/// A held backlog left for want of room holds back what comes after it of its
/// stream in the same call, wherever that was stored: `slow` has 6 messages kept
/// apart (a call's worth: its budget does not hold them back) and 2 newer in the
/// pending layouts (stored by a producer that did not keep it apart), `fast` 4 behind
/// those. The first call of 6 leaves `fast` room for 3, so 3 held messages stay: the
/// 2 newer `slow` ones must not go before them. Each stream arrives in due order.
#[tokio::test]
async fn a_held_backlog_left_for_room_keeps_its_stream_in_due_order() {
    let bare = support::Bare::start("[redis]\nshards = 1\n").await;
    let mut due = HashMap::new();
    for (apart, stream, n) in [(true, SLOW, 6), (false, SLOW, 2), (false, FAST, 4)] {
        bare.store.keep_apart(apart.then(|| SLOW.to_owned()));
        // Each later by Redis's clock than the one before.
        tokio::time::sleep(Duration::from_millis(5)).await;
        due.extend(push_overdue_to(&bare.store, stream, n).await);
    }
    let options = bare.config.forward_options();
    let mut conn = bare.redis.client();
    let first = bare
        .store
        .forward_at_most(0, 1, &options, 6, &[(SLOW.to_owned(), 1000)])
        .await
        .expect("forward");
    assert_eq!(
        (first.per_stream.clone(), first.newly_held),
        (vec![(SLOW.to_owned(), 3), (FAST.to_owned(), 3)], 2),
        "3 held sent, the 2 newer slow set aside behind the 3 left, 3 fast"
    );
    for calls in 0.. {
        let drained = support::entries(&mut conn, SLOW).len() == 8
            && support::entries(&mut conn, FAST).len() == 4;
        if drained {
            break;
        }
        assert!(calls < 10, "not drained after {calls} more calls");
        bare.store
            .forward_at_most(0, 1, &options, 6, &[(SLOW.to_owned(), 1000)])
            .await
            .expect("forward");
    }
    for stream in [SLOW, FAST] {
        let dues: Vec<u64> = support::entries(&mut conn, stream)
            .iter()
            .map(|e| due[e.get("delayq-id").unwrap()])
            .collect();
        assert!(dues.is_sorted(), "{stream} out of due order: {dues:?}");
    }
    assert_eq!(bare.store.held().await.expect("held").total(), 0);
}
