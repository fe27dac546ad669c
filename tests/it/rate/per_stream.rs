//! `streams.max_rate`: a stream at its limit drains its backlog at that rate, in due
//! order, while other streams in the same shards stay on time; a held message can be
//! read, cancelled, rescheduled and is a duplicate if pushed again; a reload lifts it;
//! a leader killed mid-drain loses and doubles nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use delayq::message::{Due, MessageId, NewMessage};
use delayq::store::{Cancelled, Rescheduled, ScheduleMode, Scheduled, Status};

use super::{busiest_second, drained_from, push_overdue_to};
use crate::support::{self, Cluster, Deliveries, Env, eventually};

const SLOW: &str = "slow";
const FAST: &str = "fast";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_stream_drains_at_its_rate_while_the_others_stay_on_time() {
    let env = Env::start("[streams.max_rate]\nslow = 100\n").await;
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
/// messages due before 5 `fast` ones, in one shard: (slow sent, fast sent, held).
async fn one_call(budget: usize) -> (u64, u64, u64) {
    let bare = support::Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    push_overdue_to(store, SLOW, 20).await;
    // Later by Redis's clock, so due after every slow one.
    tokio::time::sleep(Duration::from_millis(5)).await;
    push_overdue_to(store, FAST, 5).await;
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
        assert_eq!(one_call(budget).await, want, "budget {budget}");
    }
}
