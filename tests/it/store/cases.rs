//! The scripts, driven through `Store` against a real Redis, as one-line cases.
//!
//! Each case is a list of `(step, expected)`:
//! - `push ID +MS [p=N] [ttl=MS] [key=K] [replace] [to=STREAM]`: due MS after the case's start
//!   (Redis time); answers `scheduled`, `replaced` or `duplicate <state>`
//! - `get ID`, `cancel ID`: the state
//! - `reschedule ID +MS`: `rescheduled` or the state
//! - `wait MS`: lets MS pass; `wait +MS`: until Redis's clock reads MS after the
//!   case's start, however long the steps before took
//! - `forward`: forwards everything due; answers the ids now in stream `s` (in
//!   order) and `dead:ID` for each new entry of `s:dead`
//! - `trim`: forgets the records whose retention has passed; answers how many
//! - `key K [to=STREAM]`: the messages of business key K (pushed with `key=K`), as
//!   `id:state`, by id; `cancelkey K [to=STREAM]`: `N cancelled, M delivered`
//! - `prune`: trims; answers how many ids the key index dropped
//! - `finished [STATE ...] [to=STREAM]`: the stream's finished messages in those states
//!   (any if none named), newest first, as `id:state`, read two a page
//! - `unlist`: trims; answers how many ids the finished lists dropped
//! - `layout compact|hash`: goes on with a store that writes records in that layout
//!   (`records.layout`), on the same Redis

use std::time::Duration;

use delayq_client::message::{Due, MessageId, MessageKey, NewMessage};
use delayq_client::store::{
    BatchItem, Cancelled, PendingLayout, RecordLayout, RecordState, Rescheduled, ScheduleMode,
    Scheduled, Status, Store, StoreError,
};

use crate::support::{
    Bare, entries, eventually, fill_to_maxmemory, ids_in_every_shard, let_pass, libraries,
    redis_config, script_calls,
};

const STREAM: &str = "s";

#[track_caller]
pub(super) fn check(steps: &'static [(&'static str, &'static str)]) -> impl Future<Output = ()> {
    check_with("", steps)
}

/// `check` with more config (TOML) than the single shard.
#[track_caller]
pub(super) fn check_with(
    extra: &'static str,
    steps: &'static [(&'static str, &'static str)],
) -> impl Future<Output = ()> {
    let caller = std::panic::Location::caller();
    async move {
        let bare = Bare::start(&format!("[redis]\nshards = 1\n{extra}")).await;
        run_steps(&bare, steps, caller).await;
    }
}

/// The messages of business key `key` on `stream`, as `id:state`, by id.
pub(super) async fn key_listing(store: &Store, stream: &str, key: &MessageKey) -> String {
    let mut found = store.key_messages(stream, key).await.unwrap();
    found.sort_by(|a, b| a.id.cmp(&b.id));
    let shown: Vec<String> = found
        .iter()
        .map(|m| format!("{}:{}", m.id, m.state.as_str()))
        .collect();
    shown.join(" ")
}

async fn run_steps(bare: &Bare, steps: &[(&str, &str)], caller: &std::panic::Location<'_>) {
    let mut current = bare.store.clone();
    let mut conn = bare.redis.client();
    let start = current.now_ms().await.unwrap();
    let mut seen_dead = 0;
    let options = bare.config.forward_options();
    for (step, expected) in steps {
        if let Some(layout) = step.strip_prefix("layout ") {
            let mut config = bare.config.store_config();
            config.record_layout = match layout {
                "compact" => RecordLayout::Compact,
                "hash" => RecordLayout::Hash,
                other => panic!("unknown layout {other}"),
            };
            current = Store::connect(&config).await.unwrap();
            assert_eq!(*expected, "", "step {step:?} of the case at {caller}");
            continue;
        }
        let store = &current;
        let words: Vec<&str> = step.split_whitespace().collect();
        let id = |i: usize| MessageId::parse(words[i]).unwrap();
        let offset = |w: &str| start + w.trim_start_matches('+').parse::<u64>().unwrap();
        let got = match words[0] {
            "push" => {
                let mut msg = NewMessage {
                    key: None,
                    id: id(1),
                    stream: STREAM.into(),
                    fields: vec![("k".into(), words[1].into())],
                    due: Due::At(offset(words[2])),
                    priority: 0,
                    ttl: None,
                };
                let mut mode = ScheduleMode::New;
                for opt in &words[3..] {
                    match opt.split_once('=') {
                        Some(("p", n)) => msg.priority = n.parse().unwrap(),
                        Some(("ttl", n)) => {
                            msg.ttl = Some(Duration::from_millis(n.parse().unwrap()))
                        }
                        Some(("to", s)) => msg.stream = s.into(),
                        Some(("key", k)) => msg.key = Some(MessageKey::parse(k).unwrap()),
                        None if *opt == "replace" => mode = ScheduleMode::Replace,
                        _ => panic!("bad option {opt}"),
                    }
                }
                match store
                    .schedule(&msg, mode, Duration::from_secs(86400))
                    .await
                    .unwrap()
                {
                    Scheduled::Scheduled { .. } => "scheduled".to_owned(),
                    Scheduled::Replaced { .. } => "replaced".to_owned(),
                    Scheduled::Duplicate { state, .. } => format!("duplicate {state}"),
                }
            }
            "get" => match store.get(&id(1)).await.unwrap() {
                Status::Scheduled(_) => "scheduled".to_owned(),
                Status::Done(r) => r.state.as_str().to_owned(),
                Status::Corrupt(_) => "corrupt".to_owned(),
                Status::Unknown => "unknown".to_owned(),
            },
            "cancel" => match store.cancel(&id(1), options.retention).await.unwrap() {
                Cancelled::Cancelled => "cancelled".to_owned(),
                Cancelled::AlreadyDone(s) => s.as_str().to_owned(),
                Cancelled::Unknown => "unknown".to_owned(),
            },
            "reschedule" => match store
                .reschedule(
                    &id(1),
                    Due::At(offset(words[2])),
                    Duration::from_secs(86400),
                )
                .await
                .unwrap()
            {
                Rescheduled::Rescheduled { .. } => "rescheduled".to_owned(),
                Rescheduled::NotScheduled(s) => s.as_str().to_owned(),
                Rescheduled::Unknown => "unknown".to_owned(),
            },
            "wait" if words[1].starts_with('+') => {
                let until = offset(words[1]);
                eventually(Duration::from_secs(10), step, || async {
                    (store.now_ms().await.unwrap() >= until).then_some(())
                })
                .await;
                String::new()
            }
            "wait" => {
                let_pass(Duration::from_millis(words[1].parse().unwrap())).await;
                String::new()
            }
            "forward" => {
                for shard in 0..store.shards() {
                    while store.forward(shard, 1, &options).await.unwrap().moved() > 0 {}
                }
                let mut out: Vec<String> = entries(&mut conn, STREAM)
                    .iter()
                    .map(|e| e.get("k").unwrap().to_owned())
                    .collect();
                let dead = entries(&mut conn, "s:dead");
                out.extend(
                    dead[seen_dead..]
                        .iter()
                        .map(|e| format!("dead:{}", e.get("k").unwrap())),
                );
                seen_dead = dead.len();
                out.join(" ")
            }
            "trim" => {
                let mut forgotten = 0;
                for shard in 0..store.shards() {
                    forgotten += store.trim_records(shard, 1, 1000).await.unwrap().forgotten;
                }
                forgotten.to_string()
            }
            "key" | "cancelkey" => {
                let key = MessageKey::parse(words[1]).unwrap();
                let stream = words
                    .get(2)
                    .and_then(|w| w.strip_prefix("to="))
                    .unwrap_or(STREAM);
                if words[0] == "key" {
                    key_listing(store, stream, &key).await
                } else {
                    let done = store
                        .cancel_key(stream, &key, options.retention)
                        .await
                        .unwrap();
                    format!(
                        "{} cancelled, {} delivered",
                        done.cancelled.len(),
                        done.delivered
                    )
                }
            }
            "finished" => {
                let stream = words
                    .iter()
                    .find_map(|w| w.strip_prefix("to="))
                    .unwrap_or(STREAM);
                let states: Vec<RecordState> = words[1..]
                    .iter()
                    .filter_map(|w| RecordState::parse(w))
                    .collect();
                let mut shown = Vec::new();
                let mut after = None;
                loop {
                    let page = store
                        .finished(stream, after.as_ref(), 2, &states)
                        .await
                        .unwrap();
                    assert!(page.messages.len() <= 2, "{page:?}");
                    shown.extend(
                        page.messages
                            .iter()
                            .map(|m| format!("{}:{}", m.id, m.record.state.as_str())),
                    );
                    match page.next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                shown.join(" ")
            }
            "unlist" => {
                let mut unlisted = 0;
                for shard in 0..store.shards() {
                    unlisted += store.trim_records(shard, 1, 1000).await.unwrap().unlisted;
                }
                unlisted.to_string()
            }
            "prune" => {
                let mut pruned = 0;
                for shard in 0..store.shards() {
                    pruned += store
                        .trim_records(shard, 1, 1000)
                        .await
                        .unwrap()
                        .keys_pruned;
                }
                pruned.to_string()
            }
            other => panic!("unknown step {other}"),
        };
        assert_eq!(&got, expected, "step {step:?} of the case at {caller}");
    }
}

#[tokio::test]
async fn pushing_an_id_twice_is_a_duplicate() {
    check(&[
        ("push a +0", "scheduled"),
        ("push a +0", "duplicate scheduled"),
        ("forward", "a"),
        ("push a +0", "duplicate delivered"),
        ("forward", "a"),
    ])
    .await;
}

#[tokio::test]
async fn replace_reschedules_an_existing_id() {
    check(&[
        ("push a +60000", "scheduled"),
        ("push a +0 replace", "replaced"),
        ("forward", "a"),
        ("push a +0 replace", "replaced"),
        ("forward", "a a"),
    ])
    .await;
}

#[tokio::test]
async fn get_follows_a_message_through_its_life() {
    check(&[
        ("get a", "unknown"),
        ("push a +0", "scheduled"),
        ("get a", "scheduled"),
        ("forward", "a"),
        ("get a", "delivered"),
    ])
    .await;
}

#[tokio::test]
async fn cancel_answers_definitely() {
    check(&[
        ("cancel a", "unknown"),
        ("push a +0", "scheduled"),
        ("cancel a", "cancelled"),
        ("cancel a", "cancelled"),
        ("get a", "cancelled"),
        ("forward", ""),
    ])
    .await;
}

#[tokio::test]
async fn cancel_after_delivery_says_delivered() {
    check(&[
        ("push a +0", "scheduled"),
        ("forward", "a"),
        ("cancel a", "delivered"),
    ])
    .await;
}

#[tokio::test]
async fn a_cancelled_id_can_be_pushed_again() {
    check(&[
        ("push a +0", "scheduled"),
        ("cancel a", "cancelled"),
        ("push a +0", "scheduled"),
        ("forward", "a"),
    ])
    .await;
}

#[tokio::test]
async fn records_are_forgotten_after_retention_unless_written_again() {
    // Records are kept in generations of half the retention (at least 1 s), each
    // forgotten whole once the retention has passed after its last write could be:
    // a, b and c, forwarded at t0 into a generation that takes records until t0 + 1 s,
    // are kept past t0 + 2 s and forgotten by t0 + 3 s; b, delivered again after
    // t0 + 1 s, and d, cancelled then, go into the next generation and outlive them.
    check_with(
        "[records]\nretention = \"2s\"\n",
        &[
            ("push a +0", "scheduled"),
            ("push b +0", "scheduled"),
            ("push c +0", "scheduled"),
            ("forward", "a b c"),
            ("trim", "0"),
            ("wait 1000", ""),
            ("push b +0 replace", "replaced"),
            ("forward", "a b c b"),
            ("push d +60000", "scheduled"),
            ("cancel d", "cancelled"),
            ("wait 1100", ""),
            ("trim", "0"),
            ("get a", "delivered"),
            ("wait 1000", ""),
            ("trim", "2"),
            ("get a", "unknown"),
            ("get c", "unknown"),
            ("get b", "delivered"),
            ("get d", "cancelled"),
            ("push a +0", "scheduled"),
            ("wait 1000", ""),
            ("trim", "2"),
            ("get b", "unknown"),
            ("get d", "unknown"),
            ("get a", "scheduled"),
        ],
    )
    .await;
}

#[tokio::test]
async fn in_the_hash_layout_records_are_forgotten_after_exactly_their_retention() {
    // The hash layout (records.layout = "hash") keeps each forward batch's records
    // for exactly the retention. a and b are forwarded in one batch, which expires as
    // a whole at +2 s; b, delivered again at +1 s, keeps its newer record until +3 s.
    check_with(
        "[records]\nretention = \"2s\"\nlayout = \"hash\"\n",
        &[
            ("push a +0", "scheduled"),
            ("push b +0", "scheduled"),
            ("push c +0", "scheduled"),
            ("forward", "a b c"),
            ("trim", "0"),
            ("wait 1000", ""),
            ("push b +0 replace", "replaced"),
            ("forward", "a b c b"),
            ("push d +60000", "scheduled"),
            ("cancel d", "cancelled"),
            ("wait 1400", ""),
            ("trim", "2"),
            ("get a", "unknown"),
            ("get c", "unknown"),
            ("get b", "delivered"),
            ("get d", "cancelled"),
            ("push a +0", "scheduled"),
            ("wait 1000", ""),
            ("trim", "2"),
            ("get b", "unknown"),
            ("get d", "unknown"),
            ("get a", "scheduled"),
        ],
    )
    .await;
}

#[tokio::test]
async fn records_written_in_either_layout_are_read_replaced_and_trimmed_in_the_other() {
    // records.layout can change on a running deployment's data: whichever layout a
    // record was written in, the other finds it, forgets it when the id is pushed
    // again, and trims it after its retention.
    check_with(
        "[records]\nretention = \"1s\"\n",
        &[
            ("layout hash", ""),
            ("push a +0", "scheduled"),
            ("push b +0", "scheduled"),
            ("forward", "a b"),
            ("push c +60000", "scheduled"),
            ("cancel c", "cancelled"),
            ("layout compact", ""),
            ("get a", "delivered"),
            ("push a +0", "duplicate delivered"),
            ("cancel c", "cancelled"),
            ("push b +0 replace", "replaced"),
            ("push c +0", "scheduled"),
            ("forward", "a b b c"),
            ("get c", "delivered"),
            ("layout hash", ""),
            ("get c", "delivered"),
            ("push c +0", "duplicate delivered"),
            ("push d +60000", "scheduled"),
            ("cancel d", "cancelled"),
            ("wait 2100", ""),
            // a (hash), b and c (compact) and d (hash); b's and c's older records were
            // forgotten when they were pushed again.
            ("trim", "4"),
            ("get a", "unknown"),
            ("get b", "unknown"),
            ("get c", "unknown"),
            ("get d", "unknown"),
        ],
    )
    .await;
}

#[tokio::test]
async fn trim_also_forgets_expiry_entries_of_the_older_layout() {
    // Before batch entries, the expiry index held the bare id.
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let mut conn = bare.redis.client();
    let k = bare.store.keys().shard(0);
    let _: () = redis::pipe()
        .hset(&k.records, "old", "delivered\n1-0\n1\n1\ns")
        .zadd(&k.records_by_expiry, "old", 1)
        .query(&mut conn)
        .unwrap();
    let trimmed = bare.store.trim_records(0, 1, 10).await.unwrap();
    assert_eq!((trimmed.forgotten, trimmed.looked_at), (1, 1));
    let left: u64 = redis::cmd("ZCARD")
        .arg(&k.records_by_expiry)
        .query(&mut conn)
        .unwrap();
    assert_eq!(left, 0);
    assert!(matches!(
        bare.store
            .get(&MessageId::parse("old").unwrap())
            .await
            .unwrap(),
        Status::Unknown
    ));
}

#[tokio::test]
async fn nothing_is_forwarded_early() {
    check(&[
        ("push a +1000", "scheduled"),
        ("forward", ""),
        ("wait +1000", ""),
        ("forward", "a"),
    ])
    .await;
}

#[tokio::test]
async fn due_time_orders_then_priority() {
    check(&[
        ("push low +200 p=0", "scheduled"),
        ("push high +200 p=9", "scheduled"),
        ("push mid +200 p=5", "scheduled"),
        ("push early +100 p=0", "scheduled"),
        ("wait 250", ""),
        ("forward", "early high mid low"),
    ])
    .await;
}

#[tokio::test]
async fn reschedule_moves_only_scheduled_messages() {
    check(&[
        ("reschedule a +0", "unknown"),
        ("push a +60000", "scheduled"),
        ("reschedule a +0", "rescheduled"),
        ("forward", "a"),
        ("reschedule a +0", "delivered"),
    ])
    .await;
}

#[tokio::test]
async fn a_message_past_its_ttl_is_dead_lettered_as_expired() {
    check(&[
        ("push a +0 ttl=1", "scheduled"),
        ("push b +0 ttl=60000", "scheduled"),
        ("wait 30", ""),
        ("forward", "b dead:a"),
        ("get a", "expired"),
        ("get b", "delivered"),
    ])
    .await;
}

#[tokio::test]
async fn a_ttl_moves_with_a_reschedule() {
    check(&[
        // Had the ttl stayed, `a` would have expired at +500, before it is due.
        ("push a +0 ttl=500", "scheduled"),
        ("reschedule a +600", "rescheduled"),
        ("wait +600", ""),
        ("forward", "a"),
    ])
    .await;
}

#[tokio::test]
async fn fields_arrive_verbatim_and_in_order_with_id_and_attempt() {
    let bare = Bare::start("").await;
    let msg = NewMessage {
        key: None,
        id: MessageId::parse("order-42").unwrap(),
        stream: "orders".into(),
        fields: vec![
            ("z".into(), "1".into()),
            ("a".into(), "".into()),
            ("z".into(), "ünïcødé \n x".into()),
            ("m".into(), "{\"j\":1}".into()),
        ],
        due: Due::In(Duration::ZERO),
        priority: 0,
        ttl: None,
    };
    bare.store
        .schedule(&msg, ScheduleMode::New, Duration::from_secs(60))
        .await
        .unwrap();
    for shard in 0..bare.store.shards() {
        bare.store
            .forward(shard, 1, &bare.config.forward_options())
            .await
            .unwrap();
    }
    let got = entries(&mut bare.redis.client(), "orders");
    assert_eq!(got.len(), 1);
    let mut expected = msg.fields.clone();
    expected.push(("delayq-id".into(), "order-42".into()));
    expected.push(("delayq-attempt".into(), "1".into()));
    assert_eq!(got[0].fields, expected);
}

#[tokio::test]
async fn id_and_attempt_fields_can_be_switched_off() {
    let bare = Bare::start("[forwarder]\nid_field = \"\"\nattempt_field = \"\"\n").await;
    let msg = NewMessage::payload("orders", "p", Duration::ZERO);
    bare.store
        .schedule(&msg, ScheduleMode::New, Duration::from_secs(60))
        .await
        .unwrap();
    for shard in 0..bare.store.shards() {
        bare.store
            .forward(shard, 1, &bare.config.forward_options())
            .await
            .unwrap();
    }
    let got = entries(&mut bare.redis.client(), "orders");
    assert_eq!(got[0].fields, vec![("payload".to_owned(), "p".to_owned())]);
}

#[tokio::test]
async fn maxlen_trims_target_streams() {
    let bare =
        Bare::start("[streams]\ndefault_maxlen = 50\n[streams.maxlen]\nbig = 100000\n").await;
    for (stream, n) in [("small", 1000), ("big", 1000)] {
        for i in 0..n {
            let mut msg = NewMessage::payload(stream, "x", Duration::ZERO);
            msg.id = MessageId::parse(&format!("{stream}-{i}")).unwrap();
            bare.store
                .schedule(&msg, ScheduleMode::New, Duration::from_secs(60))
                .await
                .unwrap();
        }
    }
    for shard in 0..bare.store.shards() {
        while bare
            .store
            .forward(shard, 1, &bare.config.forward_options())
            .await
            .unwrap()
            .moved()
            > 0
        {}
    }
    let mut conn = bare.redis.client();
    let small: u64 = redis::cmd("XLEN").arg("small").query(&mut conn).unwrap();
    let big: u64 = redis::cmd("XLEN").arg("big").query(&mut conn).unwrap();
    // MAXLEN ~ trims whole radix-tree nodes (100 entries by default), never below 50.
    assert!((50..=250).contains(&small), "small stream holds {small}");
    assert_eq!(big, 1000);
}

#[tokio::test]
async fn a_lower_epoch_is_fenced_and_a_higher_one_raises_the_fence() {
    let bare = Bare::start("").await;
    let options = bare.config.forward_options();
    bare.store.forward(0, 5, &options).await.unwrap();
    match bare.store.forward(0, 4, &options).await {
        Err(StoreError::Fenced { held: 5, caller: 4 }) => {}
        other => panic!("expected FENCED, got {other:?}"),
    }
    bare.store.raise_fences(9).await.unwrap();
    assert!(matches!(
        bare.store.forward(1, 5, &options).await,
        Err(StoreError::Fenced { held: 9, .. })
    ));
    assert!(matches!(
        bare.store.trim_records(1, 8, 10).await,
        Err(StoreError::Fenced { held: 9, .. })
    ));
    assert!(matches!(
        bare.store.raise_fences(8).await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(bare.store.highest_fence().await.unwrap(), 9);
    // Producers are never fenced.
    let msg = NewMessage::payload("s", "p", Duration::ZERO);
    bare.store
        .schedule(&msg, ScheduleMode::New, Duration::from_secs(60))
        .await
        .unwrap();
    bare.store.reset_fences(2).await.unwrap();
    bare.store
        .forward(msg.id.shard(bare.store.shards()), 3, &options)
        .await
        .unwrap();
    assert_eq!(entries(&mut bare.redis.client(), "s").len(), 1);
}

#[tokio::test]
async fn standalone_epochs_exceed_every_fence() {
    let bare = Bare::start("").await;
    let a = bare.store.next_standalone_epoch(0).await.unwrap();
    let b = bare.store.next_standalone_epoch(0).await.unwrap();
    assert!(b > a);
    bare.store.raise_fences(1000).await.unwrap();
    assert!(bare.store.next_standalone_epoch(0).await.unwrap() > 1000);
    // Above an epoch held before the master moved, whatever this Redis holds.
    let above = bare.store.next_standalone_epoch(5000).await.unwrap();
    assert!(above > 5000, "{above}");
}

#[tokio::test]
async fn a_due_time_beyond_max_delay_is_refused_by_redis_time() {
    let bare = Bare::start("").await;
    let now = bare.store.now_ms().await.unwrap();
    let mut msg = NewMessage::payload("s", "p", Duration::ZERO);
    msg.due = Due::At(now + 3_600_000);
    let err = bare
        .store
        .schedule(&msg, ScheduleMode::New, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::TooFar { .. }) && err.to_string().contains("max_delay"),
        "{err}"
    );
}

#[tokio::test]
async fn corrupt_bodies_and_unwritable_targets_are_dead_lettered_without_stopping_the_batch() {
    let bare = Bare::start("").await;
    let store = &bare.store;
    let mut conn = bare.redis.client();
    // A body that is not msgpack, planted next to good messages in shard 0..n.
    let shard_keys: Vec<_> = (0..store.shards()).map(|s| store.keys().shard(s)).collect();
    for (i, k) in shard_keys.iter().enumerate() {
        let id = format!("corrupt-{i}");
        let () = redis::pipe()
            .hset(&k.bodies, &id, "\u{1}garbage")
            .ignore()
            .zadd(&k.due, &id, 0)
            .ignore()
            .query(&mut conn)
            .unwrap();
    }
    // A target key that is not a stream.
    let () = redis::cmd("SET")
        .arg("not-a-stream")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    for i in 0..20 {
        let mut msg = NewMessage::payload(
            if i == 7 { "not-a-stream" } else { "good" },
            "p",
            Duration::ZERO,
        );
        msg.id = MessageId::parse(&format!("m{i}")).unwrap();
        store
            .schedule(&msg, ScheduleMode::New, Duration::from_secs(60))
            .await
            .unwrap();
    }
    let mut dead = 0;
    for shard in 0..store.shards() {
        loop {
            let batch = store
                .forward(shard, 1, &bare.config.forward_options())
                .await
                .unwrap();
            dead += batch.dead;
            if batch.moved() == 0 {
                break;
            }
        }
    }
    assert_eq!(dead, store.shards() as u64 + 1);
    let good = entries(&mut conn, "good");
    assert_eq!(good.len(), 19, "every good message forwarded exactly once");
    let unreadable = entries(&mut conn, &store.keys().unreadable_stream(0));
    assert_eq!(unreadable.len(), store.shards() as usize + 1);
    assert!(unreadable.iter().any(|e| e.get("delayq-id") == Some("m7")
        && e.get("delayq-reason").is_some_and(
            |r| r.contains("cannot write to not-a-stream") && r.contains("WRONGTYPE")
        )));
    assert!(
        unreadable
            .iter()
            .any(|e| e.get("delayq-id") == Some("corrupt-0")
                && e.get("delayq-reason") == Some("undecodable body")
                || e.get("delayq-reason") == Some("malformed body"))
    );
    match store.get(&MessageId::parse("m7").unwrap()).await.unwrap() {
        Status::Done(r) => assert_eq!(r.state.as_str(), "dead"),
        other => panic!("m7: {other:?}"),
    }
}

/// Pushes `msg`, which must be new.
async fn push_new(bare: &Bare, msg: &NewMessage) {
    let stored = bare
        .store
        .schedule(msg, ScheduleMode::New, Duration::from_secs(3600))
        .await;
    assert!(
        matches!(stored, Ok(Scheduled::Scheduled { .. })),
        "{stored:?}"
    );
}

#[tokio::test]
async fn a_batch_over_every_shard_is_one_script_call_with_an_outcome_each() {
    let bare = Bare::start("[redis]\nshards = 16\n").await;
    let ids = ids_in_every_shard(&bare.store, STREAM, 4);
    let message = |id: &str, after: Duration| NewMessage {
        id: MessageId::parse(id).unwrap(),
        ..NewMessage::payload(STREAM, "x", after)
    };
    let earlier = message(&ids[0], Duration::from_secs(60));
    push_new(&bare, &earlier).await;
    // Every id once, the first twice more (stored before, and again within the
    // batch), and the last once more due too far ahead.
    let item = |id: &str, after: Duration| BatchItem::new(message(id, after));
    let mut items: Vec<BatchItem> = ids
        .iter()
        .map(|id| item(id, Duration::from_secs(60)))
        .collect();
    items.push(item(&ids[0], Duration::from_secs(60)));
    items.push(item("too-far", Duration::from_secs(7200)));
    let before = script_calls(&mut bare.redis.client());
    let outcomes = bare
        .store
        .schedule_many(&items, Duration::from_secs(3600), None)
        .await;
    assert_eq!(
        script_calls(&mut bare.redis.client()) - before,
        1,
        "one call for {} shards",
        ids.len() / 4
    );
    let said: Vec<String> = outcomes
        .iter()
        .map(|o| match o {
            Ok(Scheduled::Scheduled { .. }) => "scheduled".to_owned(),
            Ok(Scheduled::Duplicate { .. }) => "duplicate".to_owned(),
            Err(StoreError::TooFar { .. }) => "too far".to_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    let mut expected = vec!["duplicate"];
    expected.extend(std::iter::repeat_n("scheduled", ids.len() - 1));
    expected.extend(["duplicate", "too far"]);
    assert_eq!(said, expected);
    let per_shard = bare.store.pending_per_shard().await.unwrap();
    assert_eq!(per_shard, (0..16).map(|s| (s, 4)).collect::<Vec<_>>());
}

#[tokio::test]
async fn the_largest_call_spans_every_shard_whole() {
    // 1000 messages (the most one call carries) over 16 shards, in one call.
    let bare = Bare::start("[redis]\nshards = 16\n").await;
    let items: Vec<BatchItem> = (0..1000)
        .map(|i| {
            BatchItem::new(NewMessage {
                id: MessageId::parse(&format!("big-{i}")).unwrap(),
                ..NewMessage::payload(STREAM, "x", Duration::from_secs(60))
            })
        })
        .collect();
    // The scripts loaded first (a first call that Redis does not know counts too).
    let warm = NewMessage::payload(STREAM, "warm", Duration::from_secs(60));
    push_new(&bare, &warm).await;
    let before = script_calls(&mut bare.redis.client());
    let outcomes = bare
        .store
        .schedule_many(&items, Duration::from_secs(3600), None)
        .await;
    assert_eq!(script_calls(&mut bare.redis.client()) - before, 1);
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(Scheduled::Scheduled { .. }))),
        "{:?}",
        outcomes
            .iter()
            .find(|o| !matches!(o, Ok(Scheduled::Scheduled { .. })))
    );
    let per_shard = bare.store.pending_per_shard().await.unwrap();
    assert_eq!(per_shard.len(), 16);
    assert_eq!(per_shard.iter().map(|(_, n)| n).sum::<u64>(), 1001);
}

/// The largest call (1000 messages) into one shard, every message kept apart for a
/// rate limit: the held set and the bodies hash take them whole (in chunks), and one
/// forward call of the largest batch (`forwarder.batch_size` = 10,000) sends them all,
/// each once.
#[tokio::test]
async fn the_largest_call_kept_apart_is_stored_whole_and_sent_by_the_largest_batch() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    bare.store.keep_apart([STREAM.to_owned()]);
    let items: Vec<BatchItem> = (0..1000u64)
        .map(|i| {
            BatchItem::new(NewMessage {
                id: MessageId::parse(&format!("apart-{i:04}")).unwrap(),
                due: Due::At(1 + (i * 7919) % 1000),
                ..NewMessage::payload(STREAM, "x", Duration::ZERO)
            })
        })
        .collect();
    let outcomes = bare
        .store
        .schedule_many(&items, Duration::from_secs(3600), None)
        .await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(Scheduled::Scheduled { .. })))
    );
    let mut conn = bare.redis.client();
    let held_key = bare.store.keys().shard(0).held_of(STREAM);
    let held: u64 = redis::cmd("ZCARD").arg(&held_key).query(&mut conn).unwrap();
    assert_eq!(held, 1000);
    let options = delayq_client::store::ForwardOptions {
        batch_size: 10_000,
        ..bare.config.forward_options()
    };
    let batch = bare.store.forward(0, 1, &options).await.unwrap();
    assert_eq!(batch.forwarded, 1000);
    let written = entries(&mut conn, STREAM);
    assert_eq!(written.len(), 1000);
    let mut distinct: Vec<&str> = written
        .iter()
        .map(|e| e.get("delayq-id").unwrap())
        .collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 1000);
    let exists: bool = redis::cmd("EXISTS")
        .arg(&held_key)
        .query(&mut conn)
        .unwrap();
    assert!(!exists, "the held set is left");
}

/// 220 single pushes at once, to a store of `shards` shards: each gets its own
/// outcome, and they share calls.
async fn single_pushes_share_calls(shards: u16) {
    let bare = Bare::start(&format!("[redis]\nshards = {shards}\n")).await;
    let before = script_calls(&mut bare.redis.client());
    let repeated = NewMessage::payload("orders", "again", Duration::from_secs(60));
    let mut pushes = tokio::task::JoinSet::new();
    for i in 0..220 {
        let store = bare.store.clone();
        let repeated_id = repeated.id.clone();
        let msg = if i % 11 == 0 {
            repeated.clone()
        } else {
            NewMessage::payload("orders", &format!("m{i}"), Duration::from_secs(60))
        };
        pushes.spawn(async move {
            let outcome = store
                .schedule(&msg, ScheduleMode::New, Duration::from_secs(3600))
                .await;
            (msg.id == repeated_id, outcome)
        });
    }
    let (mut new, mut duplicates) = (0, 0);
    for (is_repeated, outcome) in pushes.join_all().await {
        match (is_repeated, outcome.expect("stored")) {
            (_, Scheduled::Scheduled { .. }) => new += 1,
            (true, Scheduled::Duplicate { .. }) => duplicates += 1,
            (_, other) => panic!("unexpected outcome {other:?}"),
        }
    }
    // 200 distinct messages and the repeated one once; its 19 other pushes are duplicates.
    assert_eq!((new, duplicates), (201, 19));
    let calls = script_calls(&mut bare.redis.client()) - before;
    let per_shard = bare.store.pending_per_shard().await.unwrap();
    assert_eq!(per_shard.iter().map(|(_, n)| n).sum::<u64>(), 201);
    assert_eq!(per_shard.len(), usize::from(shards));
    // Over several shards, fewer calls than shards: a call carries several.
    let most = if shards == 1 {
        110
    } else {
        u64::from(shards) - 1
    };
    assert!(
        calls <= most,
        "220 concurrent pushes over {shards} shards took {calls} script calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_single_pushes_share_calls_and_each_gets_its_own_outcome() {
    single_pushes_share_calls(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_single_pushes_to_many_shards_share_calls_too() {
    single_pushes_share_calls(16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_dropped_while_its_call_is_in_flight_holds_up_no_other() {
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let push = |text: String| {
        let store = bare.store.clone();
        tokio::spawn(async move {
            let msg = NewMessage::payload("orders", &text, Duration::from_secs(60));
            store
                .schedule(&msg, ScheduleMode::New, Duration::from_secs(3600))
                .await
        })
    };
    for round in 0..5 {
        // Redis holds every call for a moment: the first push's call is sent and
        // in flight, the next ones wait for it, and then the first one's caller
        // gives up (a request cancelled) before the answer.
        let () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(150)
            .query(&mut bare.redis.client())
            .unwrap();
        let dropped = push(format!("first {round}"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let waiting: Vec<_> = (0..5).map(|i| push(format!("{round}-{i}"))).collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        dropped.abort();
        for push in waiting {
            let outcome = tokio::time::timeout(Duration::from_secs(5), push)
                .await
                .expect("a push waiting behind a dropped one still completes")
                .unwrap();
            assert!(
                matches!(outcome, Ok(Scheduled::Scheduled { .. })),
                "{outcome:?}"
            );
        }
    }
    let later = tokio::time::timeout(Duration::from_secs(5), push("later".into()))
        .await
        .expect("the shard is free again")
        .unwrap();
    assert!(
        matches!(later, Ok(Scheduled::Scheduled { .. })),
        "{later:?}"
    );
}

/// At `maxmemory` (noeviction), with the scripts as functions: a push is refused
/// whole, a read and a cancel (which frees memory) still run; once memory is freed
/// pushes go again and nothing was lost.
#[tokio::test]
async fn at_maxmemory_pushes_are_refused_while_reads_and_cancels_run() {
    let bare = Bare::start("").await;
    let kept = NewMessage::payload(STREAM, "kept", Duration::from_secs(3600));
    let cancelled = NewMessage::payload(STREAM, "cancelled", Duration::from_secs(3600));
    push_new(&bare, &kept).await;
    push_new(&bare, &cancelled).await;
    let mut conn = bare.redis.client();
    assert_eq!(
        libraries(&mut conn).len(),
        1,
        "the scripts run as functions"
    );

    fill_to_maxmemory(&mut conn, 1 << 20);

    let refused = NewMessage::payload(STREAM, "refused", Duration::from_secs(3600));
    let pushed = bare
        .store
        .schedule(&refused, ScheduleMode::New, Duration::from_secs(3600))
        .await;
    assert!(
        matches!(&pushed, Err(e) if e.to_string().contains("OOM")),
        "{pushed:?}"
    );
    assert!(matches!(
        bare.store.get(&kept.id).await,
        Ok(Status::Scheduled(_))
    ));
    assert!(matches!(
        bare.store.get(&refused.id).await,
        Ok(Status::Unknown)
    ));
    assert_eq!(
        bare.store
            .cancel(&cancelled.id, Duration::from_secs(60))
            .await
            .unwrap(),
        Cancelled::Cancelled
    );
    // Without the library, which a full Redis does not take, a read goes as EVALSHA.
    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut conn)
        .unwrap();
    assert!(matches!(
        bare.store.get(&kept.id).await,
        Ok(Status::Scheduled(_))
    ));
    assert!(
        libraries(&mut conn).is_empty(),
        "no library loaded at maxmemory"
    );

    let _: u64 = redis::cmd("DEL").arg("filler").query(&mut conn).unwrap();
    redis_config(&mut conn, "maxmemory", "0");
    push_new(&bare, &refused).await;
    assert!(matches!(
        bare.store.get(&kept.id).await,
        Ok(Status::Scheduled(_))
    ));
    assert!(matches!(
        bare.store.get(&cancelled.id).await,
        Ok(Status::Done(_))
    ));
    assert_eq!(
        libraries(&mut conn).len(),
        1,
        "the library is back once memory frees"
    );
}

/// The first store to connect records its shard count in Redis; a store with another
/// is refused, naming the count to set, and so is one whose count leaves messages
/// stored before the count was recorded in shards beyond it. The daemon exits on it.
#[tokio::test]
async fn a_store_with_another_shard_count_is_refused() {
    let bare = Bare::start("[redis]\nshards = 16\n").await;
    let url = bare.redis.url();
    let mut conn = bare.redis.client();
    let connect = |shards: u16| {
        let config = crate::support::config(&url, &format!("[redis]\nshards = {shards}\n"));
        async move { Store::connect(&config.store_config()).await }
    };
    let recorded = |conn: &mut redis::Connection| -> Option<String> {
        redis::cmd("GET")
            .arg("delayq:shard-count")
            .query(conn)
            .unwrap()
    };
    let refusal = |result: Result<Store, StoreError>| match result {
        Err(StoreError::Unsupported(reason)) => reason,
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a store with another shard count connected"),
    };
    assert_eq!(recorded(&mut conn).as_deref(), Some("16"));
    connect(16).await.expect("the recorded count");
    for shards in [1, 4, 32, 1024] {
        assert_eq!(
            refusal(connect(shards).await),
            format!(
                "redis.shards is {shards}, but the messages in Redis are stored in 16 shards \
                 (delayq:shard-count): set redis.shards = 16 (changing it strands pending messages)"
            )
        );
    }

    // Messages stored before the count was recorded: one in shard 9 of 16 is beyond
    // 4 and 9 shards, not 10 or more.
    let id = (0..)
        .map(|i| MessageId::parse(&format!("m{i}")).unwrap())
        .find(|id| id.shard(16) == 9)
        .unwrap();
    let mut msg = NewMessage::payload("s", "x", Duration::from_secs(3600));
    msg.id = id;
    let stored = bare
        .store
        .schedule(&msg, ScheduleMode::New, Duration::from_secs(86_400));
    assert!(matches!(stored.await.unwrap(), Scheduled::Scheduled { .. }));
    for shards in [4, 9] {
        let () = redis::cmd("DEL")
            .arg("delayq:shard-count")
            .query(&mut conn)
            .unwrap();
        assert_eq!(
            refusal(connect(shards).await),
            format!(
                "redis.shards is {shards}, but Redis holds pending messages in shard 9 (stored \
                 with at least 10 shards, before delayq:shard-count recorded the count): set \
                 redis.shards to the count they were stored with"
            )
        );
        assert_eq!(recorded(&mut conn), None, "a refused store records nothing");
    }
    connect(10).await.expect("no message beyond shard 9");
    assert_eq!(recorded(&mut conn).as_deref(), Some("10"));

    // A store told no count (0: a reader such as the drill) takes the recorded one,
    // or the default while none is, and records nothing.
    let adopt = || {
        let mut config = crate::support::config(&url, "").store_config();
        config.shards = 0;
        async move { Store::connect(&config).await }
    };
    assert_eq!(adopt().await.unwrap().shards(), 10);
    let () = redis::cmd("DEL")
        .arg("delayq:shard-count")
        .query(&mut conn)
        .unwrap();
    assert_eq!(adopt().await.unwrap().shards(), 16);
    assert_eq!(recorded(&mut conn), None);
    for garbage in ["0", "1025", "x"] {
        let () = redis::cmd("SET")
            .arg("delayq:shard-count")
            .arg(garbage)
            .query(&mut conn)
            .unwrap();
        let want = format!("delayq:shard-count holds \"{garbage}\", not a shard count (1 to 1024)");
        assert_eq!(refusal(adopt().await), want);
        assert_eq!(refusal(connect(10).await), want);
    }
    let () = redis::cmd("SET")
        .arg("delayq:shard-count")
        .arg("10")
        .query(&mut conn)
        .unwrap();

    // The daemon exits (1) naming it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delayq.toml");
    let toml = format!("[redis]\nurl = \"{url}\"\nshards = 16\n[api]\nlisten = \"127.0.0.1:0\"\n");
    std::fs::write(&path, toml).unwrap();
    let out = crate::support::delayq_with_config(&["run"], &path).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("redis.shards is 16, but the messages in Redis are stored in 10 shards"),
        "{stderr}"
    );
}

/// A user that may not read or write the shard count's key connects all the same
/// (its count is taken at its word), and records nothing.
#[tokio::test]
async fn a_user_without_the_shard_count_key_is_taken_at_its_word() {
    let redis = delayq_harness::RedisServer::start().expect("start redis-server");
    let mut conn = redis.client();
    let dir = tempfile::tempdir().unwrap();
    let extra = crate::support::acl_user(&redis, "dq", &["~{delayq:*", "&*", "+@all"], dir.path());
    let config = crate::support::config(&redis.url(), &extra);
    let store = Store::connect(&config.store_config())
        .await
        .expect("connect");
    assert_eq!(store.shards(), 4);
    let recorded: Option<String> = redis::cmd("GET")
        .arg("delayq:shard-count")
        .query(&mut conn)
        .unwrap();
    assert_eq!(recorded, None);
    // It was asked, and refused.
    let denied: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query(&mut conn).unwrap();
    assert!(!denied.is_empty(), "no command was refused");
}

/// Schedules `n` messages due `after` from now, in calls of 1000, through `store`.
async fn schedule_in_calls(store: &Store, n: usize, after: Duration) {
    for start in (0..n).step_by(1000) {
        let items: Vec<BatchItem> = (start..n.min(start + 1000))
            .map(|_| BatchItem::new(NewMessage::payload(STREAM, "x", after)))
            .collect();
        let outcomes = store
            .schedule_many(&items, Duration::from_secs(7 * 86_400), None)
            .await;
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, Ok(Scheduled::Scheduled { .. }))),
            "{:?}",
            outcomes.iter().find(|o| o.is_err())
        );
    }
}

#[tokio::test]
async fn a_backlog_of_many_buckets_is_counted_whole_in_short_calls() {
    // More due messages than two counting calls look at (64 buckets of at most 128
    // each), some in the hash layout's due set (counted once, not once a call), and
    // messages in every class of the overview's histogram.
    let bare = Bare::start("[redis]\nshards = 1\n").await;
    let hashed = bare.store.with_pending_layout(PendingLayout::Hash);
    schedule_in_calls(&bare.store, 17_000, Duration::ZERO).await;
    schedule_in_calls(&hashed, 300, Duration::ZERO).await;
    schedule_in_calls(&bare.store, 3_000, Duration::from_secs(30)).await;
    schedule_in_calls(&hashed, 200, Duration::from_secs(30 * 60)).await;
    schedule_in_calls(&bare.store, 3_000, Duration::from_secs(30 * 60)).await;
    schedule_in_calls(&bare.store, 2_000, Duration::from_secs(3 * 86_400)).await;
    let now = bare.store.now_ms().await.unwrap();

    let before = script_calls(&mut bare.redis.client());
    assert_eq!(bare.store.pending_report(now).await.unwrap().due, 17_300);
    let calls = script_calls(&mut bare.redis.client()) - before;
    assert!(
        calls >= 3,
        "17,000 compact messages counted in {calls} calls"
    );

    let bounds = [now, now + 60_000, now + 3_600_000, now + 86_400_000];
    let before = script_calls(&mut bare.redis.client());
    let histogram = bare.store.due_histogram(&bounds).await.unwrap();
    assert_eq!(histogram.counts, vec![17_300, 3_000, 3_200, 0, 2_000]);
    assert!(
        histogram.earliest_due_ms.is_some_and(|t| t <= now),
        "{histogram:?}"
    );
    let calls = script_calls(&mut bare.redis.client()) - before;
    assert!(
        calls >= 3,
        "23,000 compact messages up to a day ahead in {calls} calls"
    );

    let per_shard = bare.store.pending_per_shard().await.unwrap();
    assert_eq!(per_shard, vec![(0, 25_500)]);
}
