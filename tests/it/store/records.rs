//! Terminal records in both layouts (`records.layout`), against a real Redis: any
//! id, stream and attempt reads back as it was recorded, and a compact generation
//! that grows by splitting its buckets keeps every record findable, in buckets small
//! enough for Redis's listpack encoding.

use std::collections::HashMap;
use std::time::Duration;

use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::{
    BatchItem, Cancelled, ForwardOptions, RecordLayout, RecordState, Scheduled, Status, Store,
    StoreError,
};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use crate::support::{Bare, entries, redis_cases};

const DAY: Duration = Duration::from_secs(86_400);

/// What one case records: messages delivered (`true`) or cancelled (`false`).
fn cases() -> impl Strategy<Value = Vec<(String, String, bool)>> {
    // Ids of every allowed length and shape (the compact layout keeps ids over 64
    // bytes too, in a bucket that then leaves the listpack encoding).
    let id = prop_oneof!["[A-Za-z0-9:._-]{1,30}", "[a-z0-9-]{60,128}"];
    prop::collection::vec((id, "[a-z:._-]{1,40}", any::<bool>()), 1..40)
}

fn assert_all_stored(answers: Vec<Result<Scheduled, StoreError>>) {
    for answer in answers {
        assert!(
            matches!(answer, Ok(Scheduled::Scheduled { .. })),
            "{answer:?}"
        );
    }
}

fn item(id: &str, stream: &str, due: Due) -> BatchItem {
    let mut msg = NewMessage::payload(stream, "p", Duration::ZERO);
    msg.id = MessageId::parse(id).unwrap();
    msg.due = due;
    BatchItem::new(msg)
}

/// The milliseconds of a stream entry's id.
fn entry_ms(entry: &str) -> u64 {
    entry.split('-').next().unwrap().parse().unwrap()
}

/// Shard 0's records key, and its generations (`<records>:gens`: start -> state).
fn generations(bare: &Bare) -> (String, HashMap<String, String>) {
    let records = bare.store.keys().shard(0).records;
    let gens = redis::cmd("HGETALL")
        .arg(format!("{records}:gens"))
        .query(&mut bare.redis.client())
        .unwrap();
    (records, gens)
}

/// Delivers or cancels each message of the case, then reads every record back.
async fn round_trip(
    store: &Store,
    options: &ForwardOptions,
    bare: &Bare,
    compact: bool,
    case: Vec<(String, String, bool)>,
) -> Result<(), TestCaseError> {
    let mut seen = HashMap::new();
    let case: Vec<_> = case
        .into_iter()
        .filter(|(id, _, _)| seen.insert(id.clone(), ()).is_none())
        .collect();
    let items: Vec<BatchItem> = case
        .iter()
        .map(|(id, stream, deliver)| {
            let due = if *deliver {
                Due::In(Duration::ZERO)
            } else {
                Due::In(DAY)
            };
            item(id, stream, due)
        })
        .collect();
    assert_all_stored(store.schedule_many(&items, DAY, None).await);
    for (id, _, deliver) in &case {
        if !deliver {
            let cancelled = store.cancel(&MessageId::parse(id).unwrap(), DAY).await;
            prop_assert_eq!(cancelled.unwrap(), Cancelled::Cancelled);
        }
    }
    for shard in 0..store.shards() {
        while store.forward(shard, 1, options).await.unwrap().moved() > 0 {}
    }
    let mut conn = bare.redis.client();
    for (id, stream, deliver) in &case {
        let Status::Done(record) = store.get(&MessageId::parse(id).unwrap()).await.unwrap() else {
            return Err(TestCaseError::fail(format!("{id}: no record")));
        };
        if *deliver {
            let entry = entries(&mut conn, stream)
                .into_iter()
                .find(|e| e.get("delayq-id") == Some(id.as_str()))
                .map(|e| e.id);
            prop_assert_eq!(record.state, RecordState::Delivered, "{}", id);
            prop_assert_eq!(record.stream.as_deref(), Some(stream.as_str()), "{}", id);
            prop_assert!(entry.is_some(), "{} not in {}", id, stream);
            prop_assert_eq!(&record.entry_id, &entry, "{}", id);
            let entry_ms = entry_ms(&entry.unwrap());
            // The hash layout records the forward call's start (the entry may be a
            // ms later); the compact layout the entry's own time, which it need not
            // write out.
            if compact {
                prop_assert_eq!(record.at_ms, entry_ms, "{}", id);
            } else {
                prop_assert!(
                    record.at_ms <= entry_ms && entry_ms < record.at_ms + 1000,
                    "{}: at {} entry {}",
                    id,
                    record.at_ms,
                    entry_ms
                );
            }
            prop_assert_eq!(record.attempt, 1, "{}", id);
        } else {
            prop_assert_eq!(record.state, RecordState::Cancelled, "{}", id);
            prop_assert_eq!(record.entry_id, None, "{}", id);
            prop_assert_eq!(record.attempt, 0, "{}", id);
        }
        // A delivered or cancelled id pushed again is answered from its record.
    }
    let again: Vec<BatchItem> = case
        .iter()
        .map(|(id, stream, _)| item(id, stream, Due::In(DAY)))
        .collect();
    let answers = store.schedule_many(&again, DAY, None).await;
    for ((id, _, deliver), answer) in case.iter().zip(answers) {
        let answer = format!("{:?}", answer.unwrap());
        let expected = if *deliver { "Duplicate" } else { "Scheduled" };
        prop_assert!(answer.starts_with(expected), "{}: {}", id, answer);
    }
    Ok(())
}

fn records_read_back_in(layout: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let bare = runtime.block_on(Bare::start(&format!(
        "[redis]\nshards = 2\n[records]\nlayout = \"{layout}\"\n"
    )));
    let options = bare.config.forward_options();
    let mut runner = TestRunner::new(redis_cases(24));
    runner
        .run(&cases(), |case| {
            runtime.block_on(async {
                let () = redis::cmd("FLUSHALL")
                    .query(&mut bare.redis.client())
                    .unwrap();
                round_trip(&bare.store, &options, &bare, layout == "compact", case).await
            })
        })
        .unwrap();
}

#[test]
fn any_record_reads_back_in_the_compact_layout() {
    records_read_back_in("compact");
}

#[test]
fn any_record_reads_back_in_the_hash_layout() {
    records_read_back_in("hash");
}

#[tokio::test]
async fn a_growing_generation_splits_its_buckets_and_every_record_stays_found() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    assert_eq!(bare.config.records.layout, RecordLayout::Compact);
    let store = &bare.store;
    let options = ForwardOptions {
        batch_size: 10_000,
        ..bare.config.forward_options()
    };
    // One record first: the generation starts with a single bucket, and the 5000
    // that follow within its span make it split about 125 times.
    assert_all_stored(
        store
            .schedule_many(&[item("first", "s", Due::In(Duration::ZERO))], DAY, None)
            .await,
    );
    assert_eq!(store.forward(0, 1, &options).await.unwrap().forwarded, 1);
    let items: Vec<BatchItem> = (0..5000)
        .map(|i| item(&format!("m{i}"), "s", Due::In(Duration::ZERO)))
        .collect();
    assert_all_stored(store.schedule_many(&items, DAY, None).await);
    assert_eq!(store.forward(0, 1, &options).await.unwrap().forwarded, 5000);

    let mut conn = bare.redis.client();
    let (records, gens) = generations(&bare);
    assert_eq!(gens.len(), 1, "{gens:?}");
    let (start, state) = gens.into_iter().next().unwrap();
    let state: Vec<u64> = state.split(' ').map(|v| v.parse().unwrap()).collect();
    let (k, s, n) = (state[1], state[2], state[3]);
    assert_eq!(n, 5001);
    let buckets = (1u64 << k) + s;
    assert!(
        (5001 / 40..=5001 / 40 + 1).contains(&buckets),
        "{buckets} buckets"
    );
    let mut total = 0;
    for b in 0..buckets {
        let key = format!("{records}:{start}:{b}");
        let len: u64 = redis::cmd("HLEN").arg(&key).query(&mut conn).unwrap();
        let encoding: Option<String> = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(&key)
            .query(&mut conn)
            .unwrap();
        assert!(len <= 128, "{key}: {len} records");
        assert_eq!(encoding.as_deref(), Some("listpack"), "{key}");
        total += len;
    }
    assert_eq!(total, 5001);

    let written: HashMap<String, String> = entries(&mut conn, "s")
        .into_iter()
        .map(|e| (e.get("delayq-id").unwrap().to_owned(), e.id))
        .collect();
    for id in std::iter::once("first".to_owned()).chain((0..5000).map(|i| format!("m{i}"))) {
        match store.get(&MessageId::parse(&id).unwrap()).await.unwrap() {
            Status::Done(record) => {
                assert_eq!(record.state, RecordState::Delivered, "{id}");
                assert_eq!(record.entry_id.as_ref(), written.get(&id), "{id}");
            }
            other => panic!("{id}: {other:?}"),
        }
    }
}

/// With `records.retention = 0` nothing is kept on record, in either layout: a
/// delivered or cancelled message is unknown at once, its id can be pushed again,
/// and Redis holds no records key.
async fn a_zero_retention_keeps_nothing_in(layout: &str) {
    let bare = Bare::start(&format!(
        "[redis]\nshards = 1\n[records]\nlayout = \"{layout}\"\nretention = \"0s\"\n"
    ))
    .await;
    let store = &bare.store;
    let options = bare.config.forward_options();
    assert_eq!(options.retention, Duration::ZERO);
    let id = |s: &str| MessageId::parse(s).unwrap();
    assert_all_stored(
        store
            .schedule_many(
                &[
                    item("sent", "s", Due::In(Duration::ZERO)),
                    item("dropped", "s", Due::In(DAY)),
                ],
                DAY,
                None,
            )
            .await,
    );
    assert_eq!(
        store.cancel(&id("dropped"), Duration::ZERO).await.unwrap(),
        Cancelled::Cancelled
    );
    assert_eq!(store.forward(0, 10, &options).await.unwrap().forwarded, 1);
    assert_eq!(entries(&mut bare.redis.client(), "s").len(), 1);

    for gone in ["sent", "dropped"] {
        let status = store.get(&id(gone)).await.unwrap();
        assert!(
            matches!(status, Status::Unknown),
            "{layout} {gone}: {status:?}"
        );
    }
    assert_eq!(
        store.cancel(&id("dropped"), Duration::ZERO).await.unwrap(),
        Cancelled::Unknown,
        "{layout}: a second cancel finds nothing"
    );
    let records = store.keys().shard(0).records;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{records}*"))
        .query(&mut bare.redis.client())
        .unwrap();
    assert!(keys.is_empty(), "{layout}: records keys {keys:?}");
    // Without a record, the id is new again.
    assert_all_stored(
        store
            .schedule_many(&[item("sent", "s", Due::In(DAY))], DAY, None)
            .await,
    );
}

#[tokio::test]
async fn a_zero_retention_keeps_nothing_on_record_in_the_compact_layout() {
    a_zero_retention_keeps_nothing_in("compact").await;
}

#[tokio::test]
async fn a_zero_retention_keeps_nothing_on_record_in_the_hash_layout() {
    a_zero_retention_keeps_nothing_in("hash").await;
}

/// A compact record that writes its own time out (every record whose time was not
/// its entry's, as earlier releases wrote them, or one more than `AT_SLACK` before
/// it) reads back that time, not the entry's.
#[tokio::test]
async fn a_compact_record_with_a_time_of_its_own_reads_back_that_time() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    let options = bare.config.forward_options();
    let id = MessageId::parse("own-time").unwrap();
    assert_all_stored(
        store
            .schedule_many(&[item("own-time", "s", Due::In(Duration::ZERO))], DAY, None)
            .await,
    );
    assert_eq!(store.forward(0, 1, &options).await.unwrap().forwarded, 1);
    let Status::Done(delivered) = store.get(&id).await.unwrap() else {
        panic!("no record");
    };
    let entry_ms = entry_ms(delivered.entry_id.as_deref().unwrap());
    assert_eq!(delivered.at_ms, entry_ms);

    let mut conn = bare.redis.client();
    let (records, gens) = generations(&bare);
    let start = gens.keys().next().unwrap().clone();
    let base: u64 = start.parse().unwrap();
    let bucket = format!("{records}:{start}:0");
    let written: String = redis::cmd("HGET")
        .arg(&bucket)
        .arg("own-time")
        .query(&mut conn)
        .unwrap();
    for before in [1, 3, 999, 1001, 2000] {
        let mut lines: Vec<String> = written.split('\n').map(str::to_owned).collect();
        lines.resize(lines.len().max(3), String::new());
        // Relative to the generation's start, which may be after that time.
        lines[2] = (entry_ms as i64 - before as i64 - base as i64).to_string();
        let () = redis::cmd("HSET")
            .arg(&bucket)
            .arg("own-time")
            .arg(lines.join("\n"))
            .query(&mut conn)
            .unwrap();
        let Status::Done(record) = store.get(&id).await.unwrap() else {
            panic!("no record");
        };
        assert_eq!(
            record.at_ms,
            entry_ms - before,
            "{before} ms before its entry"
        );
        assert_eq!(record.entry_id, delivered.entry_id);
        assert_eq!(record.state, RecordState::Delivered);
    }
}
