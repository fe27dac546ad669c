//! Messages under ids that name their score (`MessageId::placed`, what a push without
//! an id gets), against a real Redis: stored in the compact layout with no index
//! entry while they keep that score, found, counted, cancelled and rescheduled by id
//! like any other, and forwarded once; a move to another score gives them an entry,
//! and a move back takes it away.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::{BatchItem, Cancelled, Rescheduled, ScheduleMode, Scheduled, Status};

use crate::support::{Bare, entries};

const DAY: Duration = Duration::from_secs(86_400);

/// Entries in the pending index's buckets, over every shard.
fn index_entries(bare: &Bare) -> u64 {
    let mut conn = bare.redis.client();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*:ix:*").query(&mut conn).unwrap();
    keys.iter()
        .map(|k| redis::cmd("HLEN").arg(k).query::<u64>(&mut conn).unwrap())
        .sum()
}

async fn pending(bare: &Bare) -> u64 {
    let per_shard = bare.store.pending_per_shard().await.unwrap();
    per_shard.iter().map(|(_, n)| n).sum()
}

/// `n` messages under placed ids, due `ahead_ms` from Redis's clock, priorities 0-9.
async fn placed(bare: &Bare, n: usize, ahead_ms: u64, mode: ScheduleMode) -> Vec<BatchItem> {
    let now = bare.store.clock_ahead_ms().await.unwrap();
    (0..n)
        .map(|i| {
            let priority = (i % 10) as u8;
            let due_ms = now + ahead_ms + (i % 7) as u64;
            let id = MessageId::placed(due_ms, priority, bare.store.shards()).unwrap();
            let mut msg = NewMessage::payload("s", id.as_str(), Duration::ZERO);
            (msg.id, msg.due, msg.priority) = (id, Due::At(due_ms), priority);
            BatchItem {
                mode,
                ..BatchItem::new(msg)
            }
        })
        .collect()
}

async fn push_all(bare: &Bare, items: &[BatchItem]) {
    for (item, answer) in items
        .iter()
        .zip(bare.store.schedule_many(items, DAY, None).await)
    {
        match answer {
            // A due time given as a time is kept as it is.
            Ok(Scheduled::Scheduled { due_ms }) => assert!(
                matches!(item.msg.due, Due::In(_)) || Due::At(due_ms) == item.msg.due,
                "{}: {due_ms}",
                item.msg.id.as_str()
            ),
            other => panic!("{}: {other:?}", item.msg.id.as_str()),
        }
    }
}

#[tokio::test]
async fn placed_ids_need_no_index_entry_and_are_found_moved_and_forwarded_once() {
    let bare = Bare::start("[redis]\nshards = 4\n").await;
    let store = &bare.store;
    let later = placed(&bare, 600, DAY.as_millis() as u64 / 2, ScheduleMode::Fresh).await;
    push_all(&bare, &later).await;
    assert_eq!(index_entries(&bare), 0, "placed ids, stored fresh");
    // Pushed again as new (a producer's retry): each is looked up and is a duplicate.
    let again: Vec<BatchItem> = later[..50]
        .iter()
        .map(|item| BatchItem::new(item.msg.clone()))
        .collect();
    for answer in store.schedule_many(&again, DAY, None).await {
        assert!(
            matches!(answer, Ok(Scheduled::Duplicate { .. })),
            "{answer:?}"
        );
    }
    // And again with another due time: the index has no entry for them, so the push
    // enters one, and the bucket its id names still finds it pending: a duplicate,
    // whose entry is taken back.
    let elsewhere: Vec<BatchItem> = later[50..100]
        .iter()
        .map(|item| {
            let mut msg = item.msg.clone();
            msg.due = Due::At(item.msg.due.as_ms() + 1000);
            BatchItem::new(msg)
        })
        .collect();
    for answer in store.schedule_many(&elsewhere, DAY, None).await {
        assert!(
            matches!(answer, Ok(Scheduled::Duplicate { .. })),
            "{answer:?}"
        );
    }
    assert_eq!(index_entries(&bare), 0, "every entry taken back");
    assert_eq!(pending(&bare).await, 600);
    // Ids given by producers keep their entries beside them.
    let given: Vec<BatchItem> = (0..300)
        .map(|i| {
            BatchItem::new(
                NewMessage::payload("s", "given", DAY / 2)
                    .with_id(MessageId::parse(&format!("given-{i}")).unwrap()),
            )
        })
        .collect();
    push_all(&bare, &given).await;
    assert_eq!(index_entries(&bare), 300);
    assert_eq!(pending(&bare).await, 900);

    for item in &later[..20] {
        match store.get(&item.msg.id).await.unwrap() {
            Status::Scheduled(m) => assert_eq!(
                (Due::At(m.due_ms), m.priority),
                (item.msg.due, item.msg.priority)
            ),
            other => panic!("{}: {other:?}", item.msg.id.as_str()),
        }
    }
    let cancelled = &later[0].msg.id;
    assert_eq!(
        store.cancel(cancelled, DAY).await.unwrap(),
        Cancelled::Cancelled
    );
    assert!(matches!(
        store.get(cancelled).await.unwrap(),
        Status::Done(_)
    ));
    assert_eq!((index_entries(&bare), pending(&bare).await), (300, 899));

    // Moved to another time: an entry; moved back to the time its id names: none.
    let moved = &later[1].msg;
    let back = moved.due;
    for (due, entries) in [(Due::At(back.as_ms() + 5), 301), (back, 300)] {
        match store.reschedule(&moved.id, due, DAY).await.unwrap() {
            Rescheduled::Rescheduled { due_ms, .. } => assert_eq!(Due::At(due_ms), due),
            other => panic!("{other:?}"),
        }
        assert_eq!((index_entries(&bare), pending(&bare).await), (entries, 899));
        match store.get(&moved.id).await.unwrap() {
            Status::Scheduled(m) => assert_eq!(Due::At(m.due_ms), due),
            other => panic!("{other:?}"),
        }
    }

    // Due soon: forwarded once each, leaving the others and their counts as they
    // were. Far enough ahead that the push comes before the due time on a loaded
    // machine: a due time already past is stored as now, another score than the id
    // names, which takes an index entry.
    let soon = placed(&bare, 400, 1500, ScheduleMode::Fresh).await;
    push_all(&bare, &soon).await;
    assert_eq!((index_entries(&bare), pending(&bare).await), (300, 1299));
    let options = bare.config.forward_options();
    let deadline = Instant::now() + Duration::from_secs(30);
    while pending(&bare).await > 899 {
        assert!(
            Instant::now() < deadline,
            "{} pending",
            pending(&bare).await
        );
        for shard in 0..store.shards() {
            store.forward(shard, 1, &options).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut written: HashMap<String, usize> = HashMap::new();
    for entry in entries(&mut bare.redis.client(), "s") {
        *written
            .entry(entry.get("delayq-id").unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(written.len(), soon.len());
    for item in &soon {
        assert_eq!(written.get(item.msg.id.as_str()), Some(&1));
        assert!(matches!(
            store.get(&item.msg.id).await.unwrap(),
            Status::Done(_)
        ));
    }
    assert_eq!((index_entries(&bare), pending(&bare).await), (300, 899));
}

#[tokio::test]
async fn an_id_of_the_placed_shape_at_another_time_keeps_an_entry() {
    let bare = Bare::start("").await;
    // A producer's id that names a score its message does not have.
    let mut items = placed(&bare, 50, 60_000, ScheduleMode::New).await;
    for item in &mut items {
        item.msg.due = Due::At(item.msg.due.as_ms() + 1000);
    }
    push_all(&bare, &items).await;
    assert_eq!(index_entries(&bare), 50);
    for item in &items {
        match bare.store.get(&item.msg.id).await.unwrap() {
            Status::Scheduled(m) => assert_eq!(Due::At(m.due_ms), item.msg.due),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            bare.store.cancel(&item.msg.id, DAY).await.unwrap(),
            Cancelled::Cancelled
        );
    }
    assert_eq!((index_entries(&bare), pending(&bare).await), (0, 0));
}
