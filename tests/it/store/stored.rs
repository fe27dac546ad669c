//! The stored message across the Rust/Lua boundary, against a real Redis: what a
//! producer schedules is what `get` reads back, the bodies keep the bytes they
//! have always had, and bodies already stored (with or without redelivery fields)
//! read, move and deliver as before.

use std::time::Duration;

use delayq_client::message::{Due, MessageId, MessageKey, NewMessage, StoredMessage};
use delayq_client::store::{BatchItem, Rescheduled, ScheduleMode, Scheduled, Status, Store};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use crate::support::{Bare, entries, redis_cases};

const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// A body exactly as the scripts have always packed it (an array, format 1 first).
const PACK: &str = "return cmsgpack.pack(cjson.decode(ARGV[1]))";

/// A new message; of a batch's, many share their stream, priority, ttl or kind of
/// due time (what a schedule call carries once for all that share it).
fn new_message() -> impl Strategy<Value = NewMessage> {
    let due = prop_oneof![
        (0u64..1_000_000_000).prop_map(|ms| Due::In(Duration::from_millis(ms))),
        (0u64..1_000).prop_map(Due::At),
        (2_000_000_000_000u64..2_100_000_000_000).prop_map(Due::At),
        Just(Due::In(Duration::from_secs(60))),
    ];
    let stream = prop_oneof![
        prop::sample::select(vec!["orders", "invoices"]).prop_map(String::from),
        "[a-z:._-]{1,20}",
    ];
    let fields = prop::collection::vec(("\\PC{1,10}", "\\PC{0,30}"), 1..5);
    let ttl = prop_oneof![
        Just(None),
        Just(Some(Duration::from_secs(60))),
        (1u64..1_000_000_000).prop_map(|ms| Some(Duration::from_millis(ms))),
    ];
    (stream, fields, due, 0u8..=9, ttl).prop_map(|(stream, fields, due, priority, ttl)| {
        NewMessage {
            key: None,
            id: MessageId::generate(),
            stream,
            fields,
            due,
            priority,
            ttl,
        }
    })
}

/// Schedules `msgs` in one batch, each new or replacing (nothing), and reads each
/// back: the store holds what the producer gave, due and created by Redis's clock.
async fn read_back(store: &Store, msgs: Vec<(NewMessage, bool)>) -> Result<(), TestCaseError> {
    let before = store.now_ms().await.unwrap();
    let items: Vec<BatchItem> = msgs
        .iter()
        .map(|(msg, replace)| BatchItem {
            mode: if *replace {
                ScheduleMode::Replace
            } else {
                ScheduleMode::New
            },
            ..BatchItem::new(msg.clone())
        })
        .collect();
    for outcome in store.schedule_many(&items, 100 * YEAR, None).await {
        prop_assert!(
            matches!(outcome, Ok(Scheduled::Scheduled { .. })),
            "{outcome:?}"
        );
    }
    let after = store.now_ms().await.unwrap();
    for (msg, _) in msgs {
        let Status::Scheduled(stored) = store.get(&msg.id).await.unwrap() else {
            return Err(TestCaseError::fail(format!("{} is not scheduled", msg.id)));
        };
        let (earliest, latest) = match msg.due {
            Due::In(delay) => (
                before + delay.as_millis() as u64,
                after + delay.as_millis() as u64,
            ),
            Due::At(ms) => (ms.max(before), ms.max(after)),
        };
        prop_assert!((earliest..=latest).contains(&stored.due_ms), "{stored:?}");
        prop_assert!((before..=after).contains(&stored.created_ms), "{stored:?}");
        let expected = StoredMessage {
            key: None,
            stream: msg.stream,
            fields: msg.fields,
            due_ms: stored.due_ms,
            priority: msg.priority,
            created_ms: stored.created_ms,
            attempt: 1,
            expire_at_ms: msg.ttl.map(|ttl| stored.due_ms + ttl.as_millis() as u64),
            first_delivered_ms: None,
            redelivery_reason: None,
        };
        prop_assert_eq!(stored, expected);
    }
    Ok(())
}

/// Alone or in a batch of up to 40 over both shards, each message new or replacing,
/// whatever it shares with the others.
#[test]
fn a_scheduled_message_reads_back_as_it_was_given() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let bare = runtime.block_on(Bare::start("[redis]\nshards = 2\n"));
    let batch = prop::collection::vec((new_message(), any::<bool>()), 1..40);
    let mut runner = TestRunner::new(redis_cases(64));
    runner
        .run(&batch, |msgs| {
            runtime.block_on(read_back(&bare.store, msgs))
        })
        .unwrap();
}

/// A field name or value: short text, or a string at one of the lengths where
/// MessagePack's form changes (fixstr, str 8, str 16, str 32).
fn field_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "\\PC{0,12}",
        1 => prop::sample::select(vec![31usize, 32, 255, 256, 65_535, 65_536])
            .prop_map(|len| "x".repeat(len)),
    ]
}

/// A new message's body has the bytes `cmsgpack.pack` makes of it (the push's script
/// splices its fields in packed, and packs the rest itself), whatever its fields:
/// from one pair to more than seven (past a fixarray's 15 strings), each string at
/// any length; with a business key or without (three elements more, two of them
/// `false`).
#[test]
fn a_new_body_has_the_bytes_the_scripts_pack() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let bare = runtime.block_on(Bare::start("[redis]\nshards = 2\n"));
    let fields = prop::collection::vec((field_text(), field_text()), 1..10);
    let key = prop::option::of("[a-z0-9:._-]{1,30}");
    let cases = (fields, 0u8..=9, prop::option::of(1u64..1_000_000), key);
    let mut runner = TestRunner::new(redis_cases(32));
    runner
        .run(&cases, |(fields, priority, ttl_ms, key)| {
            let msg = NewMessage {
                priority,
                ttl: ttl_ms.map(Duration::from_millis),
                fields: fields.clone(),
                key: key.as_deref().map(|k| MessageKey::parse(k).unwrap()),
                ..NewMessage::payload("orders", "", Duration::from_secs(3600))
            };
            let stored = runtime.block_on(async {
                let store = &bare.store;
                store.schedule(&msg, ScheduleMode::New, YEAR).await.unwrap();
                scheduled(store.get(&msg.id).await.unwrap())
            });
            let flat: Vec<&String> = fields.iter().flat_map(|(f, v)| [f, v]).collect();
            let mut body = serde_json::json!([
                1,
                "orders",
                flat,
                stored.due_ms,
                priority,
                stored.created_ms,
                1,
                ttl_ms.map_or(0, |ttl| stored.due_ms + ttl)
            ]);
            if let Some(key) = &key {
                let elements = body.as_array_mut().unwrap();
                elements.extend([false.into(), false.into(), key.as_str().into()]);
            }
            prop_assert_eq!(
                raw_body(&bare, &msg.id),
                as_stored(&bare, body, Layout::Compact)
            );
            Ok(())
        })
        .unwrap();
}

/// The body stored under `id`, as Redis holds it.
/// The body stored for `id`, in whichever pending layout holds it: the bodies hash,
/// or a compact bucket (elements `score (7 bytes) · len(id) · id · body`, the body's
/// due time left out), as [`as_stored`] packs it.
fn raw_body(bare: &Bare, id: &MessageId) -> (Vec<u8>, Layout) {
    let k = bare.store.keys().shard(id.shard(bare.store.shards()));
    let mut conn = bare.redis.client();
    let hashed: Option<Vec<u8>> = redis::cmd("HGET")
        .arg(&k.bodies)
        .arg(id.as_str())
        .query(&mut conn)
        .unwrap();
    if let Some(body) = hashed {
        return (body, Layout::Hash);
    }
    for key in crate::support::compact_buckets(&mut conn, &k) {
        let elems: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query(&mut conn)
            .unwrap();
        for e in elems {
            let n = usize::from(e[7]);
            if &e[8..8 + n] == id.as_str().as_bytes() {
                return (e[8 + n..].to_vec(), Layout::Compact);
            }
        }
    }
    panic!("no body for {id:?}")
}

/// The pending layout a body was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Hash,
    Compact,
}

/// `body` (a JSON array) as `layout` stores it: packed as the scripts have always
/// packed bodies, the due time (element 3) `false` in the compact layout.
fn as_stored(bare: &Bare, mut body: serde_json::Value, layout: Layout) -> (Vec<u8>, Layout) {
    if layout == Layout::Compact {
        body[3] = serde_json::Value::Bool(false);
    }
    (packed(bare, body), layout)
}

/// `body` (a JSON array) packed as the scripts have always packed bodies.
fn packed(bare: &Bare, body: serde_json::Value) -> Vec<u8> {
    redis::cmd("EVAL")
        .arg(PACK)
        .arg(0)
        .arg(body.to_string())
        .query(&mut bare.redis.client())
        .unwrap()
}

fn scheduled(status: Status) -> StoredMessage {
    match status {
        Status::Scheduled(stored) => stored,
        other => panic!("not scheduled: {other:?}"),
    }
}

#[tokio::test]
async fn bodies_keep_the_bytes_they_always_had() {
    for layout in [Layout::Hash, Layout::Compact] {
        let name = if layout == Layout::Hash {
            "hash"
        } else {
            "compact"
        };
        bytes_kept_in(layout, &format!("[pending]\nlayout = \"{name}\"\n")).await;
    }
}

async fn bytes_kept_in(layout: Layout, config: &str) {
    let bare = Bare::start(config).await;
    let store = &bare.store;
    let msg = NewMessage {
        due: Due::At(2_000_000_000_000),
        priority: 7,
        ttl: Some(Duration::from_secs(60)),
        fields: vec![("a".into(), "1".into()), ("b".into(), "two".into())],
        ..NewMessage::payload("orders", "", Duration::ZERO)
    };
    store
        .schedule(&msg, ScheduleMode::New, 100 * YEAR)
        .await
        .unwrap();
    let created = scheduled(store.get(&msg.id).await.unwrap()).created_ms;
    let body = |due: u64| {
        serde_json::json!([
            1,
            "orders",
            ["a", "1", "b", "two"],
            due,
            7,
            created,
            1,
            due + 60_000
        ])
    };
    assert_eq!(
        raw_body(&bare, &msg.id),
        as_stored(&bare, body(2_000_000_000_000), layout)
    );

    let moved = Due::At(2_000_000_500_000);
    let reply = store.reschedule(&msg.id, moved, 100 * YEAR).await.unwrap();
    assert!(
        matches!(&reply, Rescheduled::Rescheduled { due_ms, stream, .. } if *due_ms == moved.as_ms() && *stream == msg.stream),
        "{reply:?}"
    );
    assert_eq!(
        raw_body(&bare, &msg.id),
        as_stored(&bare, body(moved.as_ms()), layout)
    );
}

#[tokio::test]
async fn bodies_stored_before_read_move_and_deliver_as_ever() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    let k = store.keys().shard(0);
    let now = store.now_ms().await.unwrap();
    let reason = "ack_timeout: entry 1-0 pending 5000 ms with consumer c in group g";
    // One body as first scheduled, one as redelivered (two more elements).
    let plain = packed(
        &bare,
        serde_json::json!([1, "s", ["k", "plain"], now, 3, now, 1, 0]),
    );
    let again = serde_json::json!([
        1,
        "s",
        ["k", "again"],
        now,
        0,
        now,
        2,
        0,
        now - 9000,
        reason
    ]);
    let again = packed(&bare, again);
    let () = redis::pipe()
        .hset(&k.bodies, "plain", &plain)
        .ignore()
        .hset(&k.bodies, "again", &again)
        .ignore()
        .zadd(&k.due, "plain", now * 10 + 6)
        .ignore()
        .zadd(&k.due, "again", now * 10 + 9)
        .ignore()
        .query(&mut bare.redis.client())
        .unwrap();

    let id = |id: &str| MessageId::parse(id).unwrap();
    let stored = scheduled(store.get(&id("again")).await.unwrap());
    assert_eq!(
        stored,
        StoredMessage {
            key: None,
            stream: "s".into(),
            fields: vec![("k".into(), "again".into())],
            due_ms: now,
            priority: 0,
            created_ms: now,
            attempt: 2,
            expire_at_ms: None,
            first_delivered_ms: Some(now - 9000),
            redelivery_reason: Some(reason.into()),
        }
    );
    let plain_read = scheduled(store.get(&id("plain")).await.unwrap());
    assert_eq!((plain_read.priority, plain_read.attempt), (3, 1));
    assert_eq!(plain_read.first_delivered_ms, None);

    // A reschedule rewrites the due time alone: both layouts keep their length.
    let mut due = 0;
    for name in ["plain", "again"] {
        store.reschedule(&id(name), Due::At(0), YEAR).await.unwrap();
        due = scheduled(store.get(&id(name)).await.unwrap()).due_ms;
        assert!(due >= now, "{name}");
    }
    // Rescheduled by a store of the default layout: compact now.
    let raw = raw_body(&bare, &id("again"));
    let body = serde_json::json!([
        1,
        "s",
        ["k", "again"],
        due,
        0,
        now,
        2,
        0,
        now - 9000,
        reason
    ]);
    assert_eq!(raw, as_stored(&bare, body, Layout::Compact));

    let options = bare.config.forward_options();
    while store.forward(0, 1, &options).await.unwrap().moved() > 0 {}
    let delivered = entries(&mut bare.redis.client(), "s");
    let attempts: Vec<(&str, &str)> = delivered
        .iter()
        .map(|e| (e.get("k").unwrap(), e.get("delayq-attempt").unwrap()))
        .collect();
    assert_eq!(attempts, [("plain", "1"), ("again", "2")]);
    match store.get(&id("again")).await.unwrap() {
        Status::Done(record) => assert_eq!(record.attempt, 2),
        other => panic!("again: {other:?}"),
    }
}
