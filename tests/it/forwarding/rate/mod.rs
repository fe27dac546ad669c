//! `forwarder.max_rate`: a backlog drains at the limit, each shard in due order,
//! with nothing lost or doubled; a reload changes the limit at once.
//! `streams.max_rate`: see `per_stream`.

mod per_stream;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::{BatchItem, Scheduled, Store};

use crate::support::{self, Entry, Env, eventually};

const STREAM: &str = "catchup";

/// Pushes `n` messages already due to `stream` in schedule calls of up to 1000
/// (so that the backlog is there at once, however slow the machine, rather than
/// draining as it is pushed); returns each id with its due time as delayq took it
/// (a time in the past is taken as the moment of the push).
async fn push_overdue_to(store: &Store, stream: &str, n: usize) -> HashMap<String, u64> {
    let mut pushed = HashMap::new();
    let items: Vec<BatchItem> = (0..n)
        .map(|_| {
            let mut msg = NewMessage::payload(stream, "x", Duration::ZERO);
            msg.due = Due::At(1);
            BatchItem::new(msg)
        })
        .collect();
    for chunk in items.chunks(1000) {
        let outcomes = store
            .schedule_many(chunk, Duration::from_secs(3600), None)
            .await;
        for (item, stored) in chunk.iter().zip(outcomes) {
            let Ok(Scheduled::Scheduled { due_ms }) = stored else {
                panic!("{stored:?}");
            };
            pushed.insert(item.msg.id.as_str().to_owned(), due_ms);
        }
    }
    pushed
}

async fn push_overdue(env: &Env, n: usize) -> HashMap<String, u64> {
    push_overdue_to(&env.store, STREAM, n).await
}

async fn drained(env: &Env, pushed: &HashMap<String, u64>, within: Duration) -> Vec<Entry> {
    drained_from(env, STREAM, pushed, within).await
}

/// Waits until every pushed message is in `stream`; checks each arrived once and
/// that every shard forwarded in due order; returns the entries.
async fn drained_from(
    env: &Env,
    stream: &str,
    pushed: &HashMap<String, u64>,
    within: Duration,
) -> Vec<Entry> {
    let entries = eventually(within, "the backlog drained", || async {
        let entries = support::entries(&mut env.redis.client(), stream);
        (entries.len() >= pushed.len()).then_some(entries)
    })
    .await;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for e in &entries {
        *seen
            .entry(e.get("delayq-id").expect("id field"))
            .or_default() += 1;
    }
    assert!(
        pushed.keys().all(|id| seen.get(id.as_str()) == Some(&1)) && seen.len() == pushed.len(),
        "not exactly once: {} pushed, {} entries, {} distinct",
        pushed.len(),
        entries.len(),
        seen.len()
    );
    let shards = env.store.shards();
    let mut last_due = vec![0u64; shards as usize];
    for e in &entries {
        let id = e.get("delayq-id").unwrap();
        let shard = MessageId::parse(id).unwrap().shard(shards) as usize;
        let due = pushed[id];
        assert!(
            due >= last_due[shard],
            "shard {shard} out of due order at {id}: due {due} after {}",
            last_due[shard]
        );
        last_due[shard] = due;
    }
    entries
}

/// Most entries written within any one second.
fn busiest_second(entries: &[Entry]) -> usize {
    let times: Vec<u64> = entries.iter().map(Entry::ms).collect();
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= 1000 {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_drains_at_the_limit_in_due_order_without_loss() {
    let env = Env::start("[forwarder]\nmax_rate = 250\n").await;
    let pushed = push_overdue(&env, 750).await;
    let entries = drained(&env, &pushed, Duration::from_secs(30)).await;
    let spread = entries.last().unwrap().ms() - entries.first().unwrap().ms();
    let busiest = busiest_second(&entries);
    // 750 at 250/s, less the first burst (50 ms of the rate): about 2.95 s.
    assert!(
        spread >= 2_400,
        "drained in {spread} ms: the limit was not kept"
    );
    assert!(busiest <= 300, "{busiest} in one second at a limit of 250");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_lifts_the_limit_at_once() {
    let mut env = Env::start("[forwarder]\nmax_rate = 50\n").await;
    let pushed = push_overdue(&env, 400).await;
    eventually(Duration::from_secs(10), "forwarding began", || async {
        let n = support::entries(&mut env.redis.client(), STREAM).len();
        (n >= 20).then_some(())
    })
    .await;
    let daemon = env.daemon.as_ref().expect("running");
    let lifted = support::config(&env.redis.url(), "[forwarder]\nmax_rate = 0\n");
    daemon.live_config().send_replace(Arc::new(lifted));
    // At 50/s the rest would take about 7 s more; lifted, it goes at once.
    let entries = drained(&env, &pushed, Duration::from_secs(10)).await;
    let busiest = busiest_second(&entries);
    assert!(
        busiest > 150,
        "at most {busiest} in one second after the limit of 50 was lifted"
    );
    env.stop().await;
}
