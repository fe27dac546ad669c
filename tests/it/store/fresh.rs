//! Messages under ids a node has just made (`ScheduleMode::Fresh`, an HTTP push
//! without an id), against a real Redis: stored in either layout without one lookup
//! of the pending index or the records, and forwarded once, beside messages pushed
//! as new, which look their ids up.

use std::collections::HashMap;
use std::time::Duration;

use delayq_client::message::NewMessage;
use delayq_client::store::{BatchItem, ScheduleMode, Scheduled};

use crate::support::{Bare, calls_of, entries};

const DAY: Duration = Duration::from_secs(86_400);

/// Messages of each kind: the most one HTTP batch may carry (`api.max_batch`),
/// several script calls' worth.
const N: usize = 5000;

/// Lookups of an id so far: in the compact index (`HSETNX` as a push takes the id
/// in, `HGET` otherwise) and the records (`HGET`), and in the hash layout (`ZSCORE`).
fn lookups(bare: &Bare) -> u64 {
    let mut conn = bare.redis.client();
    calls_of(&mut conn, "hget") + calls_of(&mut conn, "hsetnx") + calls_of(&mut conn, "zscore")
}

fn items(n: usize, mode: ScheduleMode) -> Vec<BatchItem> {
    (0..n)
        .map(|_| BatchItem {
            mode,
            ..BatchItem::new(NewMessage::payload("s", "p", Duration::ZERO))
        })
        .collect()
}

async fn fresh_ids_are_stored_unlooked_in(layout: &str) {
    let bare = Bare::start(&format!(
        "[redis]\nshards = 2\n[pending]\nlayout = \"{layout}\"\n"
    ))
    .await;
    let store = &bare.store;
    let options = bare.config.forward_options();
    let forward_all = async || {
        for shard in 0..store.shards() {
            while store.forward(shard, 1, &options).await.unwrap().moved() > 0 {}
        }
    };
    // A delivery first, so that the records have a generation a push would probe.
    let first = store
        .schedule_many(&items(1, ScheduleMode::New), DAY, None)
        .await;
    assert!(
        matches!(first[0], Ok(Scheduled::Scheduled { .. })),
        "{first:?}"
    );
    forward_all().await;

    let mut pushed = Vec::new();
    for (mode, looked_up) in [(ScheduleMode::Fresh, false), (ScheduleMode::New, true)] {
        let batch = items(N, mode);
        let before = lookups(&bare);
        for answer in store.schedule_many(&batch, DAY, None).await {
            assert!(
                matches!(answer, Ok(Scheduled::Scheduled { .. })),
                "{mode:?}: {answer:?}"
            );
        }
        let made = lookups(&bare) - before;
        if looked_up {
            assert!(made >= N as u64, "{layout}, {mode:?}: {made} lookups");
        } else {
            assert_eq!(made, 0, "{layout}, {mode:?}");
        }
        pushed.extend(batch.into_iter().map(|i| i.msg.id.as_str().to_owned()));
    }
    forward_all().await;
    let mut written: HashMap<String, usize> = HashMap::new();
    for entry in entries(&mut bare.redis.client(), "s") {
        *written
            .entry(entry.get("delayq-id").unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(written.len(), 2 * N + 1, "{layout}");
    for id in &pushed {
        assert_eq!(written.get(id), Some(&1), "{layout}: {id}");
    }
}

#[tokio::test]
async fn fresh_ids_are_stored_without_a_lookup_in_the_compact_layout() {
    fresh_ids_are_stored_unlooked_in("compact").await;
}

#[tokio::test]
async fn fresh_ids_are_stored_without_a_lookup_in_the_hash_layout() {
    fresh_ids_are_stored_unlooked_in("hash").await;
}
