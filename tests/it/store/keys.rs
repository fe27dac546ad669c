//! Business keys in the scripts: a shard's key index, listing, cancelling by key,
//! the key field on entries, and the index pruned by trim.

use std::time::Duration;

use delayq_client::message::{Due, MessageId, MessageKey, NewMessage};
use delayq_client::store::{KeyedState, ScheduleMode};

use super::cases::{check, check_with};
use crate::support::{Bare, entries};

const DAY: Duration = Duration::from_secs(86400);

#[tokio::test]
async fn a_key_lists_its_stream_s_messages_and_cancels_the_pending_ones_once() {
    check(&[
        ("push a +0 key=k", "scheduled"),
        ("push b +60000 key=k", "scheduled"),
        ("push c +60000 key=other", "scheduled"),
        ("push d +60000 key=k to=t", "scheduled"),
        ("push e +60000", "scheduled"),
        ("forward", "a"),
        ("key k", "a:delivered b:scheduled"),
        ("key k to=t", "d:scheduled"),
        ("cancelkey k", "1 cancelled, 1 delivered"),
        ("key k", "a:delivered b:cancelled"),
        // Again: nothing more to cancel.
        ("cancelkey k", "0 cancelled, 1 delivered"),
        ("cancelkey nobody", "0 cancelled, 0 delivered"),
        ("get b", "cancelled"),
        ("get c", "scheduled"),
        ("get d", "scheduled"),
        ("get e", "scheduled"),
    ])
    .await;
}

#[tokio::test]
async fn keys_work_alike_in_the_hash_pending_layout() {
    check_with(
        "[pending]\nlayout = \"hash\"\n",
        &[
            ("push a +0 key=k", "scheduled"),
            ("push b +60000 key=k", "scheduled"),
            ("forward", "a"),
            ("key k", "a:delivered b:scheduled"),
            ("cancelkey k", "1 cancelled, 1 delivered"),
            ("key k", "a:delivered b:cancelled"),
        ],
    )
    .await;
}

#[tokio::test]
async fn a_replaced_message_moves_to_its_new_key() {
    check(&[
        ("push a +60000 key=k", "scheduled"),
        ("push a +60000 key=j replace", "replaced"),
        ("key k", ""),
        ("key j", "a:scheduled"),
        ("cancelkey k", "0 cancelled, 0 delivered"),
        ("get a", "scheduled"),
        ("push a +60000 replace", "replaced"),
        ("key j", ""),
    ])
    .await;
}

#[tokio::test]
async fn trim_drops_from_the_index_what_is_neither_pending_nor_on_record() {
    check_with(
        "[records]\nretention = \"0s\"\n",
        &[
            ("push a +0 key=k", "scheduled"),
            ("push b +60000 key=k", "scheduled"),
            ("forward", "a"),
            // Delivered with no record kept: no longer listed, then no longer indexed.
            ("key k", "b:scheduled"),
            ("prune", "1"),
            ("prune", "0"),
            ("key k", "b:scheduled"),
        ],
    )
    .await;
}

fn keyed(id: &str, key: &str, stream: &str, after: Duration) -> NewMessage {
    NewMessage::new(
        stream,
        vec![("k".to_owned(), id.to_owned())],
        Due::In(after),
    )
    .with_id(MessageId::parse(id).unwrap())
    .with_key(Some(MessageKey::parse(key).unwrap()))
}

#[tokio::test]
async fn a_held_message_is_listed_as_held_and_cancelled_with_its_key() {
    let bare = Bare::start("").await;
    bare.store.keep_apart(["s".to_owned()]);
    for id in ["h1", "h2"] {
        bare.store
            .schedule(
                &keyed(id, "k", "s", Duration::from_secs(60)),
                ScheduleMode::New,
                DAY,
            )
            .await
            .unwrap();
    }
    let key = MessageKey::parse("k").unwrap();
    let listed = bare.store.key_messages("s", &key).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(
        listed.iter().all(|m| m.state == KeyedState::Held),
        "{listed:?}"
    );
    let done = bare.store.cancel_key("s", &key, DAY).await.unwrap();
    assert_eq!(done.cancelled.len(), 2);
    let left: u64 = bare
        .store
        .pending_per_shard()
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert_eq!(left, 0);
    for id in ["h1", "h2"] {
        let got = bare
            .store
            .get(&MessageId::parse(id).unwrap())
            .await
            .unwrap();
        assert!(
            matches!(got, delayq_client::store::Status::Done(_)),
            "{id}: {got:?}"
        );
    }
}

#[tokio::test]
async fn the_key_field_carries_the_key_to_the_entry() {
    let bare = Bare::start(
        "[redis]\nshards = 1\n[forwarder]\nkey_field = \"order-key\"\n\
         [streams.key_field]\nbilling = \"bill\"\nquiet = \"\"\n",
    )
    .await;
    for msg in [
        keyed("a", "order-42", "orders", Duration::ZERO),
        NewMessage::payload("orders", "no key", Duration::ZERO)
            .with_id(MessageId::parse("b").unwrap()),
        keyed("c", "order-42", "billing", Duration::ZERO),
        keyed("d", "order-42", "quiet", Duration::ZERO),
    ] {
        bare.store
            .schedule(&msg, ScheduleMode::New, DAY)
            .await
            .unwrap();
    }
    bare.store
        .forward(0, 1, &bare.config.forward_options())
        .await
        .unwrap();
    let got = entries(&mut bare.redis.client(), "orders");
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].get("order-key"), Some("order-42"));
    assert_eq!(got[1].get("order-key"), None);
    // A stream's own field, or none, instead of forwarder.key_field.
    for (stream, field) in [("billing", Some("bill")), ("quiet", None)] {
        let got = entries(&mut bare.redis.client(), stream);
        let own: Vec<&str> = got[0]
            .fields
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| !name.starts_with("delayq-") && *name != "k")
            .collect();
        assert_eq!(
            own,
            field.into_iter().collect::<Vec<_>>(),
            "{stream}: {got:?}"
        );
    }
    // Delivered, still listed under its key while its record is kept.
    let key = MessageKey::parse("order-42").unwrap();
    let stored = bare.store.key_messages("orders", &key).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        stored[0].state,
        KeyedState::Done(delayq_client::store::RecordState::Delivered)
    );
}

#[tokio::test]
async fn each_stream_keeps_its_own_index_and_trim_empties_every_one() {
    let bare = Bare::start("[redis]\nshards = 1\n[records]\nretention = \"0s\"\n").await;
    let streams = ["orders", "billing", "mail"];
    for (i, stream) in streams.iter().enumerate() {
        for n in 0..3 {
            let id = format!("{stream}-{n}");
            let msg = keyed(&id, "order-42", stream, Duration::ZERO);
            bare.store
                .schedule(&msg, ScheduleMode::New, DAY)
                .await
                .unwrap();
        }
        // The same key in another stream is another list.
        let key = MessageKey::parse("order-42").unwrap();
        let listed = bare.store.key_messages(stream, &key).await.unwrap();
        assert_eq!(listed.len(), 3, "{stream} after {i}: {listed:?}");
    }
    let index = format!("{}:keys", bare.store.keys().shard(0).bodies);
    let mut redis = bare.redis.client();
    let indexed: Vec<String> = redis::cmd("HKEYS").arg(&index).query(&mut redis).unwrap();
    assert_eq!(indexed.len(), 3, "{indexed:?}");
    bare.store
        .forward(0, 1, &bare.config.forward_options())
        .await
        .unwrap();
    // Delivered with no record kept: trim, one stream a call, drops them all.
    let mut pruned = 0;
    for _ in 0..200 {
        pruned += bare
            .store
            .trim_records(0, 1, 1000)
            .await
            .unwrap()
            .keys_pruned;
        if pruned == 9 {
            break;
        }
    }
    assert_eq!(pruned, 9);
    let left: u64 = redis::cmd("EXISTS").arg(&index).query(&mut redis).unwrap();
    assert_eq!(left, 0, "an empty index leaves nothing behind");
}
