//! Schedules' definitions as the store writes them: a put replaces and resets how
//! far one is made, an add keeps the first of two, a delete says whether there was
//! one; each answers Redis's time of the change.

use delayq_client::schedule::{Misfire, ScheduleSpec};

use crate::support::Bare;

fn spec(created_at: u64) -> ScheduleSpec {
    ScheduleSpec {
        id: "tick".into(),
        stream: "ticks".into(),
        fields: vec![("t".into(), "1".into())],
        key: None,
        cron: None,
        timezone: None,
        every: Some(std::time::Duration::from_secs(60)),
        start_at: None,
        end_at: None,
        jitter: None,
        misfire: Misfire::Skip,
        max_catch_up: 10,
        paused: false,
        declared: true,
        created_at,
        since: created_at,
    }
}

#[tokio::test]
async fn an_add_keeps_the_first_a_put_replaces_and_a_delete_says_whether_there_was_one() {
    let bare = Bare::start("").await;
    let store = &bare.store;
    let now = store.now_ms().await.unwrap();
    let first = store.add_schedule(&spec(1)).await.unwrap();
    assert!(first.changed && first.at_ms >= now, "{first:?}");
    let second = store.add_schedule(&spec(2)).await.unwrap();
    assert!(!second.changed, "{second:?}");
    let (kept, _) = store.schedule_spec("tick").await.unwrap().unwrap();
    assert_eq!(kept.created_at, 1, "the first add stays");
    assert_eq!(store.schedule_count().await.unwrap(), 1);

    let put = store.put_schedule(&spec(3)).await.unwrap();
    assert!(
        !put.changed,
        "a put of a known id is no new schedule: {put:?}"
    );
    let (kept, _) = store.schedule_spec("tick").await.unwrap().unwrap();
    assert_eq!(kept.created_at, 3);
    assert!(kept.declared);

    let gone = store.delete_schedule("tick").await.unwrap();
    assert!(gone.changed && gone.at_ms >= put.at_ms, "{gone:?}");
    assert!(!store.delete_schedule("tick").await.unwrap().changed);
    assert_eq!(store.schedule_spec("tick").await.unwrap(), None);
}
