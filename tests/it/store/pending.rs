//! Scheduled messages in both layouts (`pending.layout`) and in the held sets of
//! streams kept apart (`streams.max_rate`), against a real Redis: any mix of pushes,
//! replaces, reschedules and cancels, each written by a store of either layout or
//! one keeping the stream apart (as after a change of the setting, or an upgrade), is
//! found where it was put, counted, and forwarded exactly once and in due order,
//! with or without a rate limit's budget; the compact layout's buckets never outgrow
//! their bound, every forward call names the earliest due time left, and nothing is
//! left behind.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use delayq_client::message::{Due, MessageId, NewMessage, placed_score};
use delayq_client::store::{
    BatchItem, Cancelled, ForwardOptions, PendingLayout, RecordState, Rescheduled, ScheduleMode,
    Scheduled, Status, Store,
};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use crate::support::{Bare, calls_of, compact_buckets, config, entries, redis_cases, schedule_new};

const DAY: Duration = Duration::from_secs(86_400);

/// What happens to a message after its push.
#[derive(Clone, Debug)]
enum Fate {
    Stays,
    Cancelled,
    Rescheduled(u64),
    /// Pushed again with replace: a new delay and priority.
    Replaced(u64, u8),
}

/// One message of a case: id tail, delay ms, priority, the store that writes it (see
/// [`Stores::of`]), and its fate (written by any store too).
type Case = Vec<(String, u64, u8, u8, Fate, u8)>;

/// A case, the forward calls' batch, and the stream's budget in each call (None: no
/// limit).
fn cases() -> impl Strategy<Value = (Case, usize, Option<usize>)> {
    let fate = prop_oneof![
        6 => Just(Fate::Stays),
        1 => Just(Fate::Cancelled),
        1 => (0..300u64).prop_map(Fate::Rescheduled),
        1 => (0..300u64, 0..10u8).prop_map(|(d, p)| Fate::Replaced(d, p)),
    ];
    // Delays from a few values only, so that equal due times are common; ids of every
    // length (the index keeps ids over 64 bytes too, outside the listpack encoding),
    // and ids that share a long prefix, as ULIDs of one millisecond do (ids are compared
    // eight bytes at a time).
    let delay = prop_oneof![Just(0u64), Just(150), 0..300u64];
    // PLACED: an id that names its score, as the daemon makes them (see `ids`).
    let tail = prop_oneof![
        "[A-Za-z0-9:._-]{0,12}",
        "[a-z0-9-]{60,110}",
        "01KAB7Z3QX[0-9A-Z]{0,4}[01]{0,12}",
        Just(PLACED.to_owned()),
    ];
    let message = (tail, delay, 0..10u8, 0..3u8, fate, 0..3u8);
    let budget = prop_oneof![2 => Just(None), 1 => (1..40usize).prop_map(Some)];
    (prop::collection::vec(message, 1..400), 1..80usize, budget)
}

/// The tail of a case's message whose id names its score (`MessageId::placed`).
const PLACED: &str = "placed";

/// A message pushed with a delay, or, under an id that names a score, due at the
/// score's time.
fn item(id: &str, delay_ms: u64, priority: u8, mode: ScheduleMode) -> BatchItem {
    let mut msg = NewMessage::payload("s", id, Duration::from_millis(delay_ms));
    msg.id = MessageId::parse(id).unwrap();
    msg.due = match placed_score(id) {
        Some(score) => Due::At(score / 10),
        None => Due::In(Duration::from_millis(delay_ms)),
    };
    msg.priority = priority;
    BatchItem {
        msg,
        mode,
        inbox_entry: None,
    }
}

struct Stores {
    compact: Store,
    hash: Store,
    /// Compact, keeping the stream "s" apart (its held set).
    apart: Store,
}

impl Stores {
    fn of(&self, writer: u8) -> &Store {
        match writer {
            0 => &self.compact,
            1 => &self.hash,
            _ => &self.apart,
        }
    }
}

/// Scheduled answers' due times, or a failure naming the message.
fn due_of(id: &str, answer: Scheduled) -> Result<u64, TestCaseError> {
    match answer {
        Scheduled::Scheduled { due_ms, .. } | Scheduled::Replaced { due_ms, .. } => Ok(due_ms),
        other => Err(TestCaseError::fail(format!("{id}: {other:?}"))),
    }
}

/// Pushes `items` through `store`, checking the wake-up: a call that moves the
/// earliest due time earlier (or stores the first message) publishes.
async fn push(
    store: &Store,
    conn: &mut redis::Connection,
    items: &[BatchItem],
) -> Result<Vec<delayq_client::store::Result<Scheduled>>, TestCaseError> {
    let before = store.earliest_scheduled_ms().await.unwrap();
    let published = calls_of(conn, "publish");
    let answers = store.schedule_many(items, DAY, None).await;
    let after = store.earliest_scheduled_ms().await.unwrap();
    if after.is_some_and(|after| before.is_none_or(|before| after < before)) {
        prop_assert!(
            calls_of(conn, "publish") > published,
            "earliest due {:?} -> {:?} and no wake-up",
            before,
            after
        );
    }
    Ok(answers)
}

async fn round_trip(
    stores: &Stores,
    bare: &Bare,
    case: Case,
    batch: usize,
    budget: Option<usize>,
) -> Result<(), TestCaseError> {
    // Unique: what follows the last '-' is the index alone; an id that names its
    // score is unique by its count.
    let now = stores.compact.clock_ahead_ms().await.unwrap();
    let ids: Vec<String> = case
        .iter()
        .enumerate()
        .map(|(i, m)| match m.0.as_str() {
            PLACED => MessageId::placed(now + m.1, m.2, 1)
                .unwrap()
                .as_str()
                .to_owned(),
            tail => format!("{tail}-{i}"),
        })
        .collect();
    let mut conn = bare.redis.client();
    // Pushed in runs of one layout, in the case's order.
    let mut expected: HashMap<String, (u64, u8)> = HashMap::new();
    let mut i = 0;
    while i < case.len() {
        let writer = case[i].3;
        let mut run = Vec::new();
        while i < case.len() && case[i].3 == writer {
            run.push(item(&ids[i], case[i].1, case[i].2, ScheduleMode::New));
            i += 1;
        }
        let answers = push(stores.of(writer), &mut conn, &run).await?;
        for (item, answer) in run.iter().zip(answers) {
            let id = item.msg.id.as_str();
            let due = due_of(id, answer.unwrap())?;
            expected.insert(id.to_owned(), (due, item.msg.priority));
        }
    }
    for (m, id) in case.iter().zip(&ids) {
        let store = stores.of(m.5);
        let message_id = MessageId::parse(id).unwrap();
        match &m.4 {
            Fate::Stays => {}
            Fate::Cancelled => {
                prop_assert_eq!(
                    store.cancel(&message_id, DAY).await.unwrap(),
                    Cancelled::Cancelled
                );
                expected.remove(id);
            }
            Fate::Rescheduled(delay) => {
                let due = Due::In(Duration::from_millis(*delay));
                match store.reschedule(&message_id, due, DAY).await.unwrap() {
                    Rescheduled::Rescheduled { due_ms, .. } => {
                        expected.get_mut(id).unwrap().0 = due_ms;
                    }
                    other => return Err(TestCaseError::fail(format!("{id}: {other:?}"))),
                }
            }
            Fate::Replaced(delay, priority) => {
                let again = [item(id, *delay, *priority, ScheduleMode::Replace)];
                let answer = push(store, &mut conn, &again).await?.remove(0);
                let due = due_of(id, answer.unwrap())?;
                expected.insert(id.clone(), (due, *priority));
            }
        }
    }

    // Every message is found as it now stands, and counted.
    for id in &ids {
        let status = stores
            .hash
            .get(&MessageId::parse(id).unwrap())
            .await
            .unwrap();
        match (expected.get(id), status) {
            (Some(&(due, priority)), Status::Scheduled(m)) => {
                prop_assert_eq!((m.due_ms, m.priority), (due, priority), "{}", id);
                let payload = m.fields.iter().find(|(k, _)| k == "payload");
                prop_assert_eq!(
                    payload.map(|(_, v)| v.as_str()),
                    Some(id.as_str()),
                    "{}",
                    id
                );
            }
            (None, Status::Done(record)) => {
                prop_assert_eq!(record.state, RecordState::Cancelled, "{}", id)
            }
            (want, status) => {
                return Err(TestCaseError::fail(format!(
                    "{id}: {status:?}, want {want:?}"
                )));
            }
        }
    }
    let store = &stores.compact;
    prop_assert_eq!(
        store.pending_per_shard().await.unwrap(),
        vec![(0, expected.len() as u64)]
    );
    let per_stream = store.pending_per_stream(usize::MAX, 0).await.unwrap();
    prop_assert_eq!(
        per_stream.per_stream.get("s").copied().unwrap_or(0),
        expected.len() as u64
    );
    assert_buckets_bounded(&mut conn, store);

    // Forwarded exactly once, in order of due time, then priority.
    let options = ForwardOptions {
        batch_size: batch,
        ..bare.config.forward_options()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut moved = 0;
    while moved < expected.len() as u64 {
        prop_assert!(
            Instant::now() < deadline,
            "{} of {} forwarded",
            moved,
            expected.len()
        );
        let budgets: Vec<(String, usize)> =
            budget.map(|b| ("s".to_owned(), b)).into_iter().collect();
        let forwarded = store
            .forward_at_most(0, 1, &options, batch, &budgets)
            .await
            .unwrap();
        if let Some(b) = budget {
            prop_assert!(
                forwarded.forwarded <= b as u64,
                "{} sent on a budget of {}",
                forwarded.forwarded,
                b
            );
        }
        // The call's next due time (read off what it saw, or asked) is the earliest
        // left; under a budget, the earliest it could send (due held messages wait
        // for permits).
        let earliest = store.earliest_scheduled_ms().await.unwrap();
        match budget {
            None => prop_assert_eq!(forwarded.next_due_ms, earliest),
            Some(_) => prop_assert!(
                forwarded
                    .next_due_ms
                    .is_none_or(|next| earliest.is_some_and(|e| next >= e)),
                "next due {:?}, earliest {:?}",
                forwarded.next_due_ms,
                earliest
            ),
        }
        moved += forwarded.moved();
        if forwarded.moved() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let written: Vec<String> = entries(&mut conn, "s")
        .into_iter()
        .map(|e| e.get("delayq-id").unwrap().to_owned())
        .collect();
    prop_assert_eq!(written.len(), expected.len());
    let mut last = 0;
    for id in &written {
        let Some(&(due, priority)) = expected.get(id) else {
            return Err(TestCaseError::fail(format!(
                "{id} delivered, never expected"
            )));
        };
        let score = due * 10 + 9 - u64::from(priority);
        prop_assert!(score >= last, "{} out of order", id);
        last = score;
    }
    let distinct: std::collections::HashSet<&String> = written.iter().collect();
    prop_assert_eq!(distinct.len(), written.len(), "a message delivered twice");
    assert_nothing_pending(&mut conn, store);
    Ok(())
}

/// Every compact bucket of shard 0 holds at most 128 messages, in listpack-sized
/// index buckets.
fn assert_buckets_bounded(conn: &mut redis::Connection, store: &Store) {
    for key in compact_buckets(conn, &store.keys().shard(0)) {
        let len: u64 = redis::cmd("LLEN").arg(&key).query(conn).unwrap();
        assert!((1..=128).contains(&len), "a bucket of {len}");
    }
}

/// Shard 0 keeps no trace of a pending message.
fn assert_nothing_pending(conn: &mut redis::Connection, store: &Store) {
    let k = store.keys().shard(0);
    for key in [
        k.due.clone(),
        k.bodies.clone(),
        k.buckets(),
        format!("{}:ix", k.bodies),
        k.held.clone(),
        k.held_of("s"),
    ] {
        let exists: bool = redis::cmd("EXISTS").arg(&key).query(conn).unwrap();
        assert!(!exists, "{key} is left");
    }
}

async fn stores_on(bare: &Bare) -> Stores {
    let url = bare.redis.url();
    let connect = |layout: &str| {
        let config = config(
            &url,
            &format!("[redis]\nshards = 1\n[pending]\nlayout = \"{layout}\"\n"),
        );
        async move { Store::connect(&config.store_config()).await.unwrap() }
    };
    let apart = connect("compact").await;
    apart.keep_apart(["s".to_owned()]);
    Stores {
        compact: connect("compact").await,
        hash: connect("hash").await,
        apart,
    }
}

#[test]
fn any_mix_of_layouts_and_changes_is_forwarded_once_in_due_order() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let bare = runtime.block_on(Bare::start("[redis]\nshards = 1\n"));
    assert_eq!(bare.config.pending.layout, PendingLayout::Compact);
    let stores = runtime.block_on(stores_on(&bare));
    let mut runner = TestRunner::new(redis_cases(16));
    runner
        .run(&cases(), |(case, batch, budget)| {
            runtime.block_on(async {
                let () = redis::cmd("FLUSHALL")
                    .query(&mut bare.redis.client())
                    .unwrap();
                round_trip(&stores, &bare, case, batch, budget).await
            })
        })
        .unwrap();
}

/// 3000 messages due in the same ms, pushed in an order unlike their ids': each is
/// found, cancelled or rescheduled by id among buckets that all start at that time,
/// and the rest forwarded once, in due order.
#[tokio::test]
async fn a_crowd_due_in_one_ms_is_found_by_id_and_forwarded_once() {
    crowd_due_in_one_ms(|n| format!("c{n}")).await;
}

/// The same with ids that share their first 22 bytes, as ULIDs made in one
/// millisecond do: ids are compared eight bytes at a time, and these differ only in
/// the last few.
#[tokio::test]
async fn a_crowd_of_ids_sharing_a_long_prefix_is_found_by_id_and_forwarded_once() {
    crowd_due_in_one_ms(|n| format!("01KAB7Z3QXV8R2M4T6W9Y1{n:05}")).await;
}

/// The crowd test with ids made by `id` from numbers below 100,000.
async fn crowd_due_in_one_ms(id: impl Fn(u32) -> String) {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    let crowd_ms = SystemTimeMs::now() + 3_000;
    let due = Due::At(crowd_ms);
    let ids: Vec<String> = (0..3000u32)
        .map(|i| id(i.wrapping_mul(2_654_435_761) % 100_000))
        .collect();
    let items: Vec<BatchItem> = ids
        .iter()
        .map(|id| {
            let mut it = item(id, 0, 0, ScheduleMode::New);
            it.msg.due = due;
            it
        })
        .collect();
    schedule_new(store, &items, DAY).await;
    let mut conn = bare.redis.client();
    assert_buckets_bounded(&mut conn, store);
    let mut dues: HashMap<String, u64> = HashMap::new();
    for (n, id) in ids.iter().enumerate() {
        let message_id = MessageId::parse(id).unwrap();
        match n % 10 {
            0 => assert_eq!(
                store.cancel(&message_id, DAY).await.unwrap(),
                Cancelled::Cancelled
            ),
            1 => match store
                .reschedule(&message_id, Due::In(Duration::ZERO), DAY)
                .await
                .unwrap()
            {
                Rescheduled::Rescheduled { due_ms, .. } => {
                    dues.insert(id.clone(), due_ms);
                }
                other => panic!("{id}: {other:?}"),
            },
            _ => {
                assert!(matches!(
                    store.get(&message_id).await.unwrap(),
                    Status::Scheduled(m) if m.due_ms == crowd_ms
                ));
                dues.insert(id.clone(), crowd_ms);
            }
        }
    }
    forward_until(&bare, 2700).await;
    let written = entries(&mut conn, "s");
    assert_eq!(written.len(), 2700);
    let mut last = 0;
    for e in &written {
        let id = e.get("delayq-id").unwrap();
        let due = dues
            .remove(id)
            .unwrap_or_else(|| panic!("{id} twice or never pushed"));
        assert!(due >= last, "{id} out of order");
        last = due;
    }
    assert!(dues.is_empty());
    assert_nothing_pending(&mut conn, store);
}

/// Forwards shard 0 of the bare store until `n` messages have left it (30 s at most).
async fn forward_until(bare: &Bare, n: u64) {
    let options = bare.config.forward_options();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut moved = 0;
    while moved < n {
        assert!(Instant::now() < deadline, "{moved} of {n} forwarded");
        let batch = bare.store.forward(0, 1, &options).await.unwrap();
        moved += batch.moved();
        if batch.moved() == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

struct SystemTimeMs;

impl SystemTimeMs {
    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    }
}

/// Messages that come in due order, over several calls, fill their buckets whole:
/// a full last bucket is followed by a new one rather than split in two.
#[tokio::test]
async fn messages_that_come_in_order_fill_their_buckets_whole() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    let base = SystemTimeMs::now() + 60_000;
    let items: Vec<BatchItem> = (0..1000u64)
        .map(|i| {
            let mut it = item(&format!("o{i:05}"), 0, 0, ScheduleMode::New);
            it.msg.due = Due::At(base + i / 3);
            it
        })
        .collect();
    for chunk in items.chunks(250) {
        schedule_new(store, chunk, DAY).await;
    }
    let mut conn = bare.redis.client();
    let lens: Vec<u64> = compact_buckets(&mut conn, &store.keys().shard(0))
        .iter()
        .map(|key| redis::cmd("LLEN").arg(key).query(&mut conn).unwrap())
        .collect();
    assert_eq!(lens, [128, 128, 128, 128, 128, 128, 128, 104]);

    // One call: 100 in order, one that lands among them, then 100 more in order:
    // the one out of order counts against its bucket's 128 too.
    let later = base + 10_000;
    let mut mixed: Vec<BatchItem> = (0..200u64)
        .map(|i| {
            let mut it = item(&format!("m{i:05}"), 0, 0, ScheduleMode::New);
            it.msg.due = Due::At(later + 2 * i);
            it
        })
        .collect();
    let mut stray = item("stray", 0, 0, ScheduleMode::New);
    stray.msg.due = Due::At(later + 101);
    mixed.insert(100, stray);
    schedule_new(store, &mixed, DAY).await;
    assert_buckets_bounded(&mut conn, store);
    for (n, it) in items.iter().enumerate().step_by(97) {
        let found = store.get(&it.msg.id).await.unwrap();
        assert!(
            matches!(found, delayq_client::store::Status::Scheduled(_)),
            "{n}: {found:?}"
        );
    }
}

/// Messages that come in order ahead of later buckets (a steady stream over a backlog
/// due later) go to the end of their bucket in a few appends, not one call each, and
/// split it when it is full rather than start a bucket among the later ones: the
/// buckets stay bounded, and everything is forwarded once, in due order.
#[tokio::test]
async fn messages_in_order_ahead_of_later_buckets_are_appended_together() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    let base = SystemTimeMs::now() + 2_000;
    let batch = |prefix: &str, n: u64, from: u64| -> Vec<BatchItem> {
        (0..n)
            .map(|i| {
                let mut it = item(&format!("{prefix}{i:05}"), 0, 0, ScheduleMode::New);
                it.msg.due = Due::At(from + i);
                it
            })
            .collect()
    };
    // Two full buckets soon, then two of a backlog due much later.
    let mut conn = bare.redis.client();
    for (prefix, n, from) in [("x", 256, base), ("z", 200, base + 600_000)] {
        schedule_new(store, &batch(prefix, n, from), DAY).await;
    }
    // 300 in order after the soon ones and before the backlog, in one call.
    let before = calls_of(&mut conn, "rpush") + calls_of(&mut conn, "linsert");
    schedule_new(store, &batch("y", 300, base + 300), DAY).await;
    let writes = calls_of(&mut conn, "rpush") + calls_of(&mut conn, "linsert") - before;
    assert!(
        writes <= 30,
        "{writes} list writes for 300 messages in order"
    );
    assert_buckets_bounded(&mut conn, store);

    // The soon ones and the run are forwarded, each once and in order; the backlog stays.
    forward_until(&bare, 556).await;
    let written: Vec<String> = entries(&mut conn, "s")
        .into_iter()
        .map(|e| e.get("delayq-id").unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..256)
        .map(|i| format!("x{i:05}"))
        .chain((0..300).map(|i| format!("y{i:05}")))
        .collect();
    assert_eq!(written, expected);
    assert_eq!(store.pending_per_shard().await.unwrap(), vec![(0, 200)]);
    assert_buckets_bounded(&mut conn, store);
}

/// A call's messages are stored in (due, id) order whatever order they come in
/// (pushes that arrive together, a batch of ids made elsewhere): 300 due in one ms,
/// their ids shuffled, after everything pending, go to the end of the last bucket in
/// a few appends without a search of any bucket, and are forwarded once, in id order.
#[tokio::test]
async fn a_call_in_any_order_is_stored_in_order() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    let mut conn = bare.redis.client();
    let due = SystemTimeMs::now() + 1_500;
    let mut ids: Vec<String> = (0..300).map(|i| format!("r{i:03}")).collect();
    for (i, j) in (0..300).zip((0..300).map(|i| (i * 7_919) % 300)) {
        ids.swap(i, j);
    }
    let calls = |conn: &mut redis::Connection| {
        ["rpush", "lindex", "linsert"].map(|command| calls_of(conn, command))
    };
    let before = calls(&mut conn);
    let items: Vec<BatchItem> = ids
        .iter()
        .map(|id| {
            let mut it = item(id, 0, 0, ScheduleMode::New);
            it.msg.due = Due::At(due);
            it
        })
        .collect();
    schedule_new(store, &items, DAY).await;
    let after = calls(&mut conn);
    let [appends, reads, inserts] = [0, 1, 2].map(|i| after[i] - before[i]);
    assert!(appends <= 5, "{appends} appends for 300 messages");
    // One read: the first message finds the shard empty (no last element to follow).
    assert_eq!((reads, inserts), (1, 0), "bucket reads and insertions");
    assert_buckets_bounded(&mut conn, store);
    forward_until(&bare, 300).await;
    let written: Vec<String> = entries(&mut conn, "s")
        .into_iter()
        .map(|e| e.get("delayq-id").unwrap().to_owned())
        .collect();
    ids.sort();
    assert_eq!(written, ids);
}

/// Pushed (id, ms after a base), cancelled first, whether the push wakes the forwarder.
type WakeCase = (&'static [(&'static str, u64)], Option<&'static str>, bool);

/// A push wakes the shard's forwarder exactly when it goes ahead of every message
/// (the compact layout tells from where it stored the message, asking nothing
/// more): into an empty shard, before every bucket, and first in the first bucket
/// after what led it was cancelled; not when it goes behind the first.
#[tokio::test]
async fn a_push_wakes_the_forwarder_only_when_it_goes_first() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    let mut conn = bare.redis.client();
    let base = SystemTimeMs::now() + 600_000;
    let at = |id: &str, offset: u64| {
        let mut it = item(id, 0, 0, ScheduleMode::New);
        it.msg.due = Due::At(base + offset);
        it
    };
    let cases: [WakeCase; 7] = [
        (&[("wake-a", 100), ("wake-b", 300)], None, true), // an empty shard
        (&[("wake-c", 400)], None, false),                 // appended behind the first
        (&[("wake-d", 200)], None, false),                 // inserted behind the first
        (&[("wake-e", 50)], None, true),                   // before every bucket
        (&[("wake-f", 50)], None, false),                  // behind its equal (same ms, id after)
        (&[("wake-g", 60)], Some("wake-e"), false),        // behind f, the first left
        (&[("wake-h", 55)], Some("wake-f"), true), // first in the first bucket, e's floor kept
    ];
    for (n, (push, cancel, wakes)) in cases.into_iter().enumerate() {
        if let Some(id) = cancel {
            let id = MessageId::parse(id).unwrap();
            assert_eq!(store.cancel(&id, DAY).await.unwrap(), Cancelled::Cancelled);
        }
        let items: Vec<BatchItem> = push.iter().map(|&(id, offset)| at(id, offset)).collect();
        let published = calls_of(&mut conn, "publish");
        for answer in store.schedule_many(&items, DAY, None).await {
            assert!(
                matches!(answer.unwrap(), Scheduled::Scheduled { .. }),
                "case {n}"
            );
        }
        let woke = calls_of(&mut conn, "publish") > published;
        assert_eq!(woke, wakes, "case {n}: {push:?}");
    }
    // Every message is still there, in due order.
    let order = ["h", "g", "a", "d", "b", "c"].map(|l| format!("wake-{l}"));
    let buckets = compact_buckets(&mut conn, &store.keys().shard(0));
    assert_eq!(buckets.len(), 1);
    let elems: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(&buckets[0])
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    let ids: Vec<String> = elems
        .iter()
        .map(|e| {
            let named = |id: &&String| e.windows(id.len()).any(|w| w == id.as_bytes());
            order.iter().find(named).unwrap().clone()
        })
        .collect();
    assert_eq!(ids, order);
}
