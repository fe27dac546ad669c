//! One schedule call that mixes every kind of message is answered and stored in the
//! compact layout exactly as in the hash layout, against two real Redis servers.
//!
//! The compact layout stores the common kind of message (new or fresh, no business
//! key, not yet in the call, due within `max_delay`) without a table of its own; the
//! hash layout takes every message the one way. So a call of new, replacing and
//! repeated ids, keyed or not, too far or not, over ids that are unknown, pending,
//! delivered or cancelled before it, must give the same outcomes, the same stored
//! messages and the same key lists in both.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use delayq_client::message::{Due, MessageId, MessageKey, NewMessage};
use delayq_client::store::{BatchItem, ScheduleMode, Status, Store};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use super::cases::key_listing;
use crate::support::{Bare, redis_cases};

const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
/// Far enough ahead that nothing pushed at it comes due during a case.
const AHEAD: u64 = 2_000_000_000_000;
/// Past `max_delay` (a hundred years) from now.
const TOO_FAR: u64 = 9_000_000_000_000;
const POOL: usize = 5;
const STREAM: &str = "s";

/// What an id of the pool was before the call.
#[derive(Clone, Copy, Debug)]
enum Before {
    Unknown,
    Pending,
    Delivered,
    Cancelled,
}

/// A message of the call: the pool id it names, replacing, a key (of two), its due
/// time (AHEAD + n, or TOO_FAR), priority.
type Item = (usize, bool, Option<u8>, Option<u64>, u8);

fn cases() -> impl Strategy<Value = (Vec<Before>, Vec<Item>)> {
    let before = prop_oneof![
        Just(Before::Unknown),
        Just(Before::Pending),
        Just(Before::Delivered),
        Just(Before::Cancelled),
    ];
    let due = prop_oneof![4 => (0..3u64).prop_map(Some), 1 => Just(None)];
    let item = (
        0..POOL,
        prop::bool::weighted(0.3),
        prop::option::of(0..2u8),
        due,
        0..10u8,
    );
    (
        prop::collection::vec(before, POOL),
        prop::collection::vec(item, 1..12),
    )
}

/// Pool id `n` of case `case`.
fn id(case: usize, n: usize) -> MessageId {
    MessageId::parse(&format!("c{case}-{n}")).unwrap()
}

fn message(case: usize, n: usize, key: Option<u8>, due: u64, priority: u8) -> NewMessage {
    NewMessage {
        id: id(case, n),
        stream: STREAM.into(),
        fields: vec![("n".into(), format!("{n}-{due}-{priority}"))],
        due: Due::At(due),
        priority,
        ttl: (priority % 2 == 1).then_some(Duration::from_secs(3600)),
        key: key.map(|k| MessageKey::parse(&format!("c{case}-k{k}")).unwrap()),
    }
}

/// Sets the pool up as `before` says, makes the call, and tells what it answered and
/// what each id and key holds after it.
async fn run(bare: &Bare, case: usize, before: &[Before], items: &[Item]) -> Vec<String> {
    let store: &Store = &bare.store;
    let options = bare.config.forward_options();
    for (n, state) in before.iter().enumerate() {
        let due = match state {
            Before::Unknown => continue,
            Before::Pending | Before::Cancelled => AHEAD + 500,
            Before::Delivered => 1,
        };
        store
            .schedule(
                &message(case, n, None, due, 0),
                ScheduleMode::New,
                100 * YEAR,
            )
            .await
            .unwrap();
        if let Before::Cancelled = state {
            store.cancel(&id(case, n), options.retention).await.unwrap();
        }
    }
    for shard in 0..store.shards() {
        while store.forward(shard, 1, &options).await.unwrap().moved() > 0 {}
    }
    let batch: Vec<BatchItem> = items
        .iter()
        .map(|&(n, replace, key, due, priority)| BatchItem {
            mode: if replace {
                ScheduleMode::Replace
            } else {
                ScheduleMode::New
            },
            ..BatchItem::new(message(
                case,
                n,
                key,
                due.map_or(TOO_FAR, |d| AHEAD + d),
                priority,
            ))
        })
        .collect();
    let mut seen: Vec<String> = store
        .schedule_many(&batch, 100 * YEAR, None)
        .await
        .into_iter()
        .map(|outcome| match outcome {
            Ok(scheduled) => format!("{scheduled:?}"),
            Err(e) => format!(
                "refused: {}",
                e.to_string().split(" after now").next().unwrap()
            ),
        })
        .collect();
    for n in 0..POOL {
        let id = id(case, n);
        seen.push(match store.get(&id).await.unwrap() {
            Status::Scheduled(mut stored) => {
                stored.created_ms = 0;
                format!("{id}: {stored:?}")
            }
            Status::Done(record) => format!("{id}: {}", record.state.as_str()),
            other => format!("{id}: {other:?}"),
        });
    }
    for k in 0..2 {
        let key = MessageKey::parse(&format!("c{case}-k{k}")).unwrap();
        seen.push(format!("{key}: {}", key_listing(store, STREAM, &key).await));
    }
    seen
}

#[test]
fn a_call_of_every_kind_is_answered_and_stored_in_the_compact_layout_as_in_the_hash_one() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (compact, hash) = runtime.block_on(async {
        tokio::join!(
            Bare::start("[redis]\nshards = 2\n"),
            Bare::start("[redis]\nshards = 2\n[pending]\nlayout = \"hash\"\n"),
        )
    });
    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(redis_cases(64));
    runner
        .run(&cases(), |(before, items)| {
            let n = case.fetch_add(1, Ordering::Relaxed);
            let (a, b) = runtime.block_on(async {
                tokio::join!(
                    run(&compact, n, &before, &items),
                    run(&hash, n, &before, &items)
                )
            });
            prop_assert_eq!(a, b);
            Ok(())
        })
        .unwrap();
}
