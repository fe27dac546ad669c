//! Each stream's finished messages, newest first (`Store::finished`): states, pages,
//! streams apart, trimmed with their records, off with `records.finished_list`.

use std::time::Duration;

use delayq_client::message::{MessageId, NewMessage};
use delayq_client::store::{RecordState, ScheduleMode};

use super::cases::{check, check_with};
use crate::support::Bare;

const DAY: Duration = Duration::from_secs(86400);

#[tokio::test]
async fn a_stream_lists_what_finished_newest_first_in_every_state() {
    check(&[
        ("push a +0", "scheduled"),
        ("push b +0", "scheduled"),
        ("push c +0 ttl=1", "scheduled"),
        ("push d +60000", "scheduled"),
        ("push e +0 to=t", "scheduled"),
        ("finished", ""),
        // Past c's expiry however late its push came (a due time past is now).
        ("wait 20", ""),
        ("forward", "a b dead:c"),
        ("cancel d", "cancelled"),
        // One forward call's records share their time: the last written shows first.
        ("finished", "d:cancelled c:expired b:delivered a:delivered"),
        ("finished delivered", "b:delivered a:delivered"),
        ("finished expired cancelled", "d:cancelled c:expired"),
        ("finished dead", ""),
        ("finished to=t", "e:delivered"),
        ("finished delivered to=t", "e:delivered"),
    ])
    .await;
}

#[tokio::test]
async fn an_id_finished_again_shows_once_where_it_finished_last() {
    check(&[
        ("push a +0", "scheduled"),
        ("push b +0", "scheduled"),
        ("forward", "a b"),
        ("push c +60000", "scheduled"),
        ("cancel c", "cancelled"),
        // A cancelled id can be pushed again, as new.
        ("push c +0", "scheduled"),
        ("wait 2", ""),
        ("forward", "a b c"),
        ("finished", "c:delivered b:delivered a:delivered"),
    ])
    .await;
}

#[tokio::test]
async fn nothing_is_listed_without_records_or_with_the_list_off() {
    for extra in [
        "[records]\nretention = \"0s\"\n",
        "[records]\nfinished_list = false\n",
    ] {
        let bare = Bare::start(&format!("[redis]\nshards = 1\n{extra}")).await;
        bare.store
            .schedule(
                &NewMessage::payload("s", "x", Duration::ZERO),
                ScheduleMode::New,
                DAY,
            )
            .await
            .unwrap();
        let forwarded = bare
            .store
            .forward(0, 1, &bare.config.forward_options())
            .await
            .unwrap();
        assert_eq!(forwarded.moved(), 1, "{extra}");
        let page = bare.store.finished("s", None, 10, &[]).await.unwrap();
        assert!(
            page.messages.is_empty() && page.next.is_none(),
            "{extra}: {page:?}"
        );
        let lists: u64 = redis::cmd("DBSIZE")
            .query(&mut bare.redis.client())
            .unwrap();
        let names: Vec<String> = redis::cmd("KEYS")
            .arg("*:fin*")
            .query(&mut bare.redis.client())
            .unwrap();
        assert!(names.is_empty(), "{extra}: {names:?} of {lists} keys");
    }
}

#[tokio::test]
async fn trim_unlists_what_is_no_longer_on_record() {
    check_with(
        "[records]\nretention = \"1s\"\n",
        &[
            ("push a +0", "scheduled"),
            ("push b +0", "scheduled"),
            ("forward", "a b"),
            ("finished", "b:delivered a:delivered"),
            ("unlist", "0"),
            // A record is kept between one and one and a half retentions (and a
            // generation at least a second).
            ("wait 2600", ""),
            // The same call forgets the records and unlists their ids.
            ("unlist", "2"),
            ("finished", ""),
            ("unlist", "0"),
            ("get a", "unknown"),
        ],
    )
    .await;
}

#[tokio::test]
async fn pages_over_many_shards_show_every_message_once_newest_first() {
    let bare = Bare::start("[redis]\nshards = 16\n").await;
    let options = bare.config.forward_options();
    let mut expected = 0;
    for round in 0..5 {
        for i in 0..60 {
            let msg = NewMessage::payload("s", "x", Duration::ZERO)
                .with_id(MessageId::parse(&format!("m{round}-{i}")).unwrap());
            bare.store
                .schedule(&msg, ScheduleMode::New, DAY)
                .await
                .unwrap();
            expected += 1;
        }
        for shard in 0..16 {
            while bare
                .store
                .forward(shard, 1, &options)
                .await
                .unwrap()
                .moved()
                > 0
            {}
        }
        if round == 2 {
            // A few cancelled between the rounds.
            for i in 0..5 {
                let id = MessageId::parse(&format!("c{i}")).unwrap();
                let msg =
                    NewMessage::payload("s", "x", Duration::from_secs(60)).with_id(id.clone());
                bare.store
                    .schedule(&msg, ScheduleMode::New, DAY)
                    .await
                    .unwrap();
                bare.store.cancel(&id, DAY).await.unwrap();
                expected += 1;
            }
        }
    }
    for (limit, states) in [
        (7, &[][..]),
        (1, &[][..]),
        (50, &[][..]),
        (3, &[RecordState::Cancelled][..]),
    ] {
        let mut seen = std::collections::HashSet::new();
        let mut last = u64::MAX;
        let mut after = None;
        let mut pages = 0;
        loop {
            let page = bare
                .store
                .finished("s", after.as_ref(), limit, states)
                .await
                .unwrap();
            assert!(page.messages.len() <= limit);
            for m in &page.messages {
                assert!(m.record.at_ms <= last, "newest first: {m:?} after {last}");
                last = m.record.at_ms;
                assert!(seen.insert(m.id.clone()), "{} twice", m.id);
                assert!(states.is_empty() || states.contains(&m.record.state));
            }
            pages += 1;
            assert!(pages < 1000, "no end");
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let want = if states.is_empty() { expected } else { 5 };
        assert_eq!(seen.len(), want, "limit {limit}, {states:?}");
    }
}

#[tokio::test]
async fn trim_says_when_the_finished_lists_have_more_to_drop_than_one_call_takes() {
    let bare = Bare::start("[redis]\nshards = 1\n[records]\nretention = \"1s\"\n").await;
    let options = bare.config.forward_options();
    for (i, stream) in (0..600).zip(["s", "t", "u"].iter().cycle()) {
        let msg = NewMessage::payload(stream, "x", Duration::ZERO)
            .with_id(MessageId::parse(&format!("m{i}")).unwrap());
        bare.store
            .schedule(&msg, ScheduleMode::New, DAY)
            .await
            .unwrap();
    }
    while bare.store.forward(0, 1, &options).await.unwrap().moved() > 0 {}
    let page = bare.store.finished("t", None, 1000, &[]).await.unwrap();
    assert_eq!(page.messages.len(), 200);
    crate::support::let_pass(Duration::from_millis(2600)).await;
    let mut calls = Vec::new();
    loop {
        let trimmed = bare.store.trim_records(0, 1, 1000).await.unwrap();
        calls.push((trimmed.unlisted, trimmed.more_to_unlist));
        if !trimmed.more_to_unlist {
            break;
        }
        assert!(calls.len() < 10, "{calls:?}");
    }
    assert_eq!(calls[0], (256, true), "{calls:?}");
    assert_eq!(calls.iter().map(|c| c.0).sum::<u64>(), 600, "{calls:?}");
    let names: Vec<String> = redis::cmd("KEYS")
        .arg("*:fin*")
        .query(&mut bare.redis.client())
        .unwrap();
    assert!(names.is_empty(), "{names:?}");
}

#[tokio::test]
async fn a_delivery_record_keeps_how_late_it_was_in_both_layouts() {
    for layout in ["compact", "hash"] {
        let bare = Bare::start(&format!(
            "[redis]\nshards = 1\n[records]\nlayout = \"{layout}\"\n"
        ))
        .await;
        // One whose record needs no optional line but its lateness, one with them.
        for (id, priority) in [("plain", 0), ("urgent", 7)] {
            let msg = NewMessage::payload("s", "x", Duration::ZERO)
                .with_id(MessageId::parse(id).unwrap())
                .with_priority(priority);
            bare.store
                .schedule(&msg, ScheduleMode::New, DAY)
                .await
                .unwrap();
        }
        crate::support::let_pass(Duration::from_millis(150)).await;
        let options = bare.config.forward_options();
        while bare.store.forward(0, 1, &options).await.unwrap().moved() > 0 {}
        let listed = bare.store.finished("s", None, 10, &[]).await.unwrap();
        assert_eq!(listed.messages.len(), 2, "{layout}");
        for m in &listed.messages {
            let late = m.record.late_ms.unwrap_or(0);
            assert!((150..60_000).contains(&late), "{layout}: {m:?}");
            let got = bare
                .store
                .get(&MessageId::parse(&m.id).unwrap())
                .await
                .unwrap();
            let delayq_client::store::Status::Done(record) = got else {
                panic!("{layout}: {got:?}");
            };
            assert_eq!(record, m.record, "{layout}");
        }
    }
}
