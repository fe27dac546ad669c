//! Scripts at their limits, against a real Redis: batches larger than one Lua
//! `unpack` can carry, Redis refusing writes (maxmemory), targets and dead-letter
//! streams that refuse a message for reasons of their own, and calls that must be
//! all or nothing.

use std::time::Duration;

use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::{
    BatchItem, ForwardBatch, ForwardOptions, InboxAck, RecordState, ScheduleMode, Status, Store,
};

use crate::support::{Bare, Tally, entries, eventually, redis_config, used_memory};

const MAX_DELAY: Duration = Duration::from_secs(3600);

/// Schedules `count` messages `m0..` to `stream`, all due now, through the batch path.
async fn schedule_due_now(store: &Store, stream: &str, count: usize) -> Vec<MessageId> {
    let items: Vec<BatchItem> = (0..count)
        .map(|i| {
            let mut msg = NewMessage::payload(stream, &format!("p{i}"), Duration::ZERO);
            msg.id = MessageId::parse(&format!("m{i}")).unwrap();
            msg.due = Due::In(Duration::ZERO);
            BatchItem::new(msg)
        })
        .collect();
    for outcome in store.schedule_many(&items, MAX_DELAY, None).await {
        outcome.expect("scheduled");
    }
    items.into_iter().map(|i| i.msg.id).collect()
}

fn options(bare: &Bare, batch_size: usize, retention: Duration) -> ForwardOptions {
    ForwardOptions {
        batch_size,
        retention,
        ..bare.config.forward_options()
    }
}

async fn forward(store: &Store, options: &ForwardOptions) -> ForwardBatch {
    store.forward(0, 1, options).await.expect("forward")
}

/// Asserts that every id reached `stream` exactly once and is on record as delivered
/// with the entry that carries it.
async fn assert_delivered_once_on_record(bare: &Bare, stream: &str, ids: &[MessageId]) {
    let mut conn = bare.redis.client();
    let written = entries(&mut conn, stream);
    Tally::of_ids(ids.iter().map(MessageId::as_str), &written).assert_exact(stream);
    for id in ids {
        let entry = written
            .iter()
            .find(|e| e.get("delayq-id") == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{id} not delivered"));
        match bare.store.get(id).await.unwrap() {
            Status::Done(record) => {
                assert_eq!(record.state, RecordState::Delivered, "{id}");
                assert_eq!(record.entry_id.as_deref(), Some(entry.id.as_str()), "{id}");
            }
            other => panic!("{id}: not on record as delivered: {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_largest_batch_moves_whole_and_on_record_and_trims_whole() {
    let bare = Bare::start("[redis]\nshards = 1").await;
    let store = &bare.store;
    // More due at one instant than the largest allowed batch holds.
    let ids = schedule_due_now(store, "big", 12_000).await;
    let options = options(&bare, 10_000, Duration::from_millis(1));
    let first = forward(store, &options).await;
    assert_eq!((first.forwarded, first.dead), (10_000, 0));
    let second = forward(store, &options).await;
    assert_eq!((second.forwarded, second.dead), (2_000, 0));
    assert_eq!(forward(store, &options).await.moved(), 0);
    assert_delivered_once_on_record(&bare, "big", &ids).await;

    // The first batch's 10,000 records share one expiry entry: trim takes it whole.
    let forgotten = std::cell::Cell::new(0);
    eventually(Duration::from_secs(10), "every record trimmed", || async {
        let trimmed = store.trim_records(0, 1, 20_000).await.expect("trim");
        forgotten.set(forgotten.get() + trimmed.forgotten);
        (forgotten.get() >= 12_000).then_some(())
    })
    .await;
    assert_eq!(forgotten.get(), 12_000);
    assert!(matches!(store.get(&ids[0]).await.unwrap(), Status::Unknown));
}

#[tokio::test]
async fn a_redis_out_of_memory_holds_messages_back_and_loses_none() {
    let bare = Bare::start("[redis]\nshards = 1").await;
    let store = &bare.store;
    let mut conn = bare.redis.client();
    let ids = schedule_due_now(store, "oom", 200).await;
    let used = used_memory(&mut conn);
    redis_config(&mut conn, "maxmemory-policy", "noeviction");
    redis_config(&mut conn, "maxmemory", &(used / 2).to_string());

    let options = options(&bare, 500, Duration::from_secs(60));
    for _ in 0..5 {
        let err = store.forward(0, 1, &options).await.unwrap_err();
        assert!(err.is_transient(), "a transient refusal: {err}");
        assert!(err.to_string().contains("OOM"), "{err}");
    }
    assert!(entries(&mut conn, "oom").is_empty());
    assert!(entries(&mut conn, &store.keys().unreadable_stream(0)).is_empty());
    for id in &ids {
        assert!(
            matches!(store.get(id).await.unwrap(), Status::Scheduled(_)),
            "{id} still scheduled"
        );
    }

    redis_config(&mut conn, "maxmemory", "0");
    let batch = forward(store, &options).await;
    assert_eq!(
        (batch.forwarded, batch.dead, batch.held_back),
        (200, 0, None)
    );
    assert_delivered_once_on_record(&bare, "oom", &ids).await;
}

#[tokio::test]
async fn a_message_no_stream_will_take_is_parked_not_deleted() {
    let bare = Bare::start("[redis]\nshards = 1").await;
    let store = &bare.store;
    let mut conn = bare.redis.client();
    // The target and the last-resort stream are both keys of another type.
    for key in ["refuses".to_owned(), store.keys().unreadable_stream(0)] {
        let () = redis::cmd("SET")
            .arg(key)
            .arg("x")
            .query(&mut conn)
            .unwrap();
    }
    let mut stuck = NewMessage::payload("refuses", "p", Duration::ZERO);
    stuck.id = MessageId::parse("stuck").unwrap();
    store
        .schedule(&stuck, ScheduleMode::New, MAX_DELAY)
        .await
        .unwrap();
    let ids = schedule_due_now(store, "fine", 30).await;

    let options = options(&bare, 10, Duration::from_secs(60));
    let mut parked = 0;
    loop {
        let batch = forward(store, &options).await;
        parked += batch.parked;
        assert_eq!((batch.dead, batch.held_back.as_deref()), (0, None));
        if batch.moved() == 0 {
            break;
        }
    }
    assert_eq!(parked, 1);
    assert_delivered_once_on_record(&bare, "fine", &ids).await;
    assert!(matches!(
        store.get(&stuck.id).await.unwrap(),
        Status::Scheduled(_)
    ));
    // Kept with its body and due time, but its place in the due set moved on.
    let now = store.now_ms().await.unwrap();
    let score: u64 = redis::cmd("ZSCORE")
        .arg(&store.keys().shard(0).due)
        .arg("stuck")
        .query(&mut conn)
        .unwrap();
    assert!(score / 10 > now + 30_000, "parked for later: {score}");
}

#[tokio::test]
async fn a_batch_schedule_is_all_or_nothing() {
    let bare = Bare::start("[redis]\nshards = 1").await;
    let store = &bare.store;
    let mut conn = bare.redis.client();
    // A cancelled record that a new push of the same id would forget, and an inbox
    // key of the wrong type that only shows at the acknowledgement.
    let mut cancelled = NewMessage::payload("s", "p", Duration::from_secs(60));
    cancelled.id = MessageId::parse("again").unwrap();
    store
        .schedule(&cancelled, ScheduleMode::New, MAX_DELAY)
        .await
        .unwrap();
    store
        .cancel(&cancelled.id, Duration::from_secs(60))
        .await
        .unwrap();
    let () = redis::cmd("SET")
        .arg("inbox-not-a-stream")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let items: Vec<BatchItem> = ["again", "fresh"]
        .iter()
        .map(|id| {
            let mut msg = NewMessage::payload("s", "p", Duration::from_secs(60));
            msg.id = MessageId::parse(id).unwrap();
            BatchItem {
                msg,
                mode: ScheduleMode::New,
                inbox_entry: Some("1-1".to_owned()),
            }
        })
        .collect();
    let ack = InboxAck {
        read: None,
        stream: "inbox-not-a-stream",
        group: "g",
    };
    for outcome in store.schedule_many(&items, MAX_DELAY, Some(ack)).await {
        let err = outcome.unwrap_err();
        assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    }
    match store.get(&cancelled.id).await.unwrap() {
        Status::Done(r) => assert_eq!(r.state, RecordState::Cancelled),
        other => panic!("the cancelled record must be untouched: {other:?}"),
    }
    let fresh = MessageId::parse("fresh").unwrap();
    assert!(matches!(store.get(&fresh).await.unwrap(), Status::Unknown));
}
