//! The pending index (id -> score of every message in the compact layout whose id
//! does not name its score), against a real Redis: it starts with 128 buckets, a
//! small hash each that exists while it holds an entry, and splits one bucket at a
//! time once its entries outgrow them; through the splits every bucket stays small
//! enough for Redis's listpack encoding and every id stays found.

use std::collections::HashSet;
use std::time::Duration;

use delayq_client::message::{MessageId, NewMessage};
use delayq_client::store::{BatchItem, Cancelled, Scheduled, Status};

use crate::support::{Bare, schedule_new};

const DAY: Duration = Duration::from_secs(86_400);

/// The buckets an index starts with (INDEX_MIN_K in 60-pending.lua).
const MIN_BUCKETS: u64 = 128;

/// The key of the one shard's index meta.
fn meta_key(bare: &Bare) -> String {
    let metas: Vec<String> = redis::cmd("KEYS")
        .arg("*:ix")
        .query(&mut bare.redis.client())
        .unwrap();
    assert_eq!(metas.len(), 1, "{metas:?}");
    metas[0].clone()
}

/// The index meta's "k s n" of the one shard, and its buckets' keys, sorted.
fn index(bare: &Bare) -> ((u64, u64, u64), Vec<String>) {
    let mut conn = bare.redis.client();
    let meta_key = meta_key(bare);
    let meta: String = redis::cmd("GET").arg(&meta_key).query(&mut conn).unwrap();
    let parts: Vec<u64> = meta.split(' ').map(|v| v.parse().unwrap()).collect();
    let mut buckets: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{meta_key}:*"))
        .query(&mut conn)
        .unwrap();
    buckets.sort();
    ((parts[0], parts[1], parts[2]), buckets)
}

/// The id of the `i`th message a producer gives.
fn given_id(i: u32) -> MessageId {
    MessageId::parse(&format!("given-{i}")).unwrap()
}

fn given(ids: impl Iterator<Item = u32>) -> Vec<BatchItem> {
    ids.map(|i| BatchItem::new(NewMessage::payload("s", "x", DAY / 2).with_id(given_id(i))))
        .collect()
}

#[tokio::test]
async fn a_small_index_has_a_bucket_an_id_and_a_large_one_splits_past_its_first_buckets() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    schedule_new(store, &given(0..10), DAY).await;
    let ((k, s, n), buckets) = index(&bare);
    assert_eq!((1 << k, s, n), (MIN_BUCKETS, 0, 10));
    assert!(buckets.len() <= 10, "{buckets:?}");

    // 6000 entries outgrow 128 buckets of 40: the index splits, a bucket at a time.
    for from in (10..6000).step_by(1000) {
        schedule_new(store, &given(from..(from + 1000).min(6000)), DAY).await;
    }
    let ((k, s, n), buckets) = index(&bare);
    assert_eq!(n, 6000);
    let count = (1u64 << k) + s;
    assert!(
        count > MIN_BUCKETS && count <= 6000 / 40 + 1,
        "{count} buckets"
    );
    let mut conn = bare.redis.client();
    let mut entries = 0;
    for key in &buckets {
        let len: u64 = redis::cmd("HLEN").arg(key).query(&mut conn).unwrap();
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(key)
            .query(&mut conn)
            .unwrap();
        assert!(len <= 128, "{key}: {len}");
        assert_eq!(encoding, "listpack", "{key}");
        entries += len;
    }
    assert_eq!(entries, 6000);

    // Every id is found where its bucket says: a duplicate when pushed again, its
    // status by id, and cancelled by id.
    for answer in store.schedule_many(&given(0..6000), DAY, None).await {
        assert!(
            matches!(answer, Ok(Scheduled::Duplicate { .. })),
            "{answer:?}"
        );
    }
    let mut cancelled = HashSet::new();
    for i in (0..6000).step_by(7) {
        let id = given_id(i);
        assert!(matches!(
            store.get(&id).await.unwrap(),
            Status::Scheduled(_)
        ));
        assert_eq!(store.cancel(&id, DAY).await.unwrap(), Cancelled::Cancelled);
        cancelled.insert(i);
    }
    let ((_, _, n), _) = index(&bare);
    assert_eq!(n, 6000 - cancelled.len() as u64);
    for i in (1..6000).step_by(11).filter(|i| !cancelled.contains(i)) {
        let id = given_id(i);
        match store.get(&id).await.unwrap() {
            Status::Scheduled(m) => assert_eq!(m.stream, "s"),
            other => panic!("given-{i}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_index_emptied_starts_again_with_its_first_buckets() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    schedule_new(store, &given(0..5200), DAY).await;
    let ((k, s, _), _) = index(&bare);
    assert!((1u64 << k) + s > MIN_BUCKETS);
    for i in 0..5200 {
        let id = given_id(i);
        assert_eq!(store.cancel(&id, DAY).await.unwrap(), Cancelled::Cancelled);
    }
    let mut conn = bare.redis.client();
    let left: Vec<String> = redis::cmd("KEYS").arg("*:ix*").query(&mut conn).unwrap();
    assert!(left.is_empty(), "{left:?}");
    schedule_new(store, &given(6000..6001), DAY).await;
    let ((k, s, n), buckets) = index(&bare);
    assert_eq!((1 << k, s, n, buckets.len()), (MIN_BUCKETS, 0, 1, 1));
}

/// An index written before it started with 128 buckets (one bucket while small, as
/// the meta says): read as its meta says, and grown from there.
#[tokio::test]
async fn an_index_of_one_bucket_written_before_is_read_and_grown_as_its_meta_says() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    schedule_new(store, &given(0..30), DAY).await;
    // The same entries as an older release left them: all in bucket 0 of "0 0 30".
    let ((_, _, n), buckets) = index(&bare);
    let mut conn = bare.redis.client();
    let meta = meta_key(&bare);
    let mut all: Vec<(String, String)> = Vec::new();
    for key in &buckets {
        let entries: Vec<(String, String)> =
            redis::cmd("HGETALL").arg(key).query(&mut conn).unwrap();
        all.extend(entries);
        let _: () = redis::cmd("DEL").arg(key).query(&mut conn).unwrap();
    }
    assert_eq!((all.len(), n), (30, 30));
    let _: () = redis::cmd("HSET")
        .arg(format!("{meta}:0"))
        .arg(all)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&meta)
        .arg("0 0 30")
        .query(&mut conn)
        .unwrap();

    for answer in store.schedule_many(&given(0..30), DAY, None).await {
        assert!(
            matches!(answer, Ok(Scheduled::Duplicate { .. })),
            "{answer:?}"
        );
    }
    schedule_new(store, &given(30..400), DAY).await;
    let ((k, s, n), _) = index(&bare);
    assert_eq!(n, 400);
    assert!(
        (1u64 << k) + s < MIN_BUCKETS,
        "grown from one bucket: {k} {s}"
    );
    for i in 0..400 {
        let id = given_id(i);
        assert!(
            matches!(store.get(&id).await.unwrap(), Status::Scheduled(_)),
            "given-{i}"
        );
    }
}

/// A push looks its id up and enters it in the index in one command; one that fails
/// after that (here the shard's records cannot be read) takes its entries back: the
/// call changes nothing, and the same push is then scheduled, not a duplicate.
#[tokio::test]
async fn a_push_that_fails_after_entering_its_ids_takes_them_back() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    schedule_new(store, &given(0..3), DAY).await;
    let (meta, buckets) = index(&bare);
    let mut conn = bare.redis.client();
    let meta_key = meta_key(&bare);
    let gens = format!("{}:done:gens", meta_key.strip_suffix(":msg:ix").unwrap());
    let _: () = redis::cmd("SET")
        .arg(&gens)
        .arg("not a hash")
        .query(&mut conn)
        .unwrap();

    for answer in store.schedule_many(&given(3..300), DAY, None).await {
        let error = answer.expect_err("refused");
        assert!(format!("{error:#}").contains("WRONGTYPE"), "{error:#}");
    }
    assert_eq!(index(&bare), (meta, buckets.clone()));
    let mut entries = 0;
    for key in &buckets {
        let len: u64 = redis::cmd("HLEN").arg(key).query(&mut conn).unwrap();
        entries += len;
    }
    assert_eq!(entries, 3);

    let _: () = redis::cmd("DEL").arg(&gens).query(&mut conn).unwrap();
    schedule_new(store, &given(3..300), DAY).await;
    let ((_, _, n), _) = index(&bare);
    assert_eq!(n, 300);
}

/// A push that fails while the index splits to make room for its ids (here the
/// bucket a split would fill is not a hash) keeps the splits done before, as its
/// meta says, and takes its entries back: every id pushed before is still found, and
/// none of the failed push's.
#[tokio::test]
async fn a_push_that_fails_while_the_index_splits_keeps_it_whole() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let store = &bare.store;
    schedule_new(store, &given(0..5100), DAY).await;
    let ((k, s, n), _) = index(&bare);
    assert_eq!((1 << k, s, n), (MIN_BUCKETS, 0, 5100));
    let mut conn = bare.redis.client();
    // Room for 5400 entries takes seven splits, of buckets 0 to 6; the seventh
    // would fill bucket 134.
    let blocked = format!("{}:134", meta_key(&bare));
    let _: () = redis::cmd("SET")
        .arg(&blocked)
        .arg("not a hash")
        .query(&mut conn)
        .unwrap();

    for answer in store.schedule_many(&given(5100..5400), DAY, None).await {
        let error = answer.expect_err("refused");
        assert!(format!("{error:#}").contains("WRONGTYPE"), "{error:#}");
    }
    let ((k, s, n), _) = index(&bare);
    assert_eq!((1 << k, s, n), (MIN_BUCKETS, 6, 5100));
    for answer in store.schedule_many(&given(0..5100), DAY, None).await {
        assert!(
            matches!(answer, Ok(Scheduled::Duplicate { .. })),
            "{answer:?}"
        );
    }
    for i in (5100..5400).step_by(13) {
        let id = given_id(i);
        assert!(
            matches!(store.get(&id).await.unwrap(), Status::Unknown),
            "given-{i}"
        );
    }

    let _: () = redis::cmd("DEL").arg(&blocked).query(&mut conn).unwrap();
    schedule_new(store, &given(5100..5400), DAY).await;
    let ((k, s, n), _) = index(&bare);
    assert_eq!((1 << k, s, n), (MIN_BUCKETS, 7, 5400));
}
