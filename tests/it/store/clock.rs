//! Redis's clock (`Store::now_ms`), which a journaled push reads before anything
//! else: with the journal on it is read on a connection of its own, so that it does
//! not wait behind the script calls queued on the store's connection.

use std::time::Duration;

use delayq_client::message::NewMessage;
use delayq_client::store::{ScheduleMode, Scheduled, Store};
use delayq_harness::RedisServer;

use crate::support::config;

/// The last command of each of Redis's clients but the one asking.
fn last_commands(redis: &RedisServer) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut redis.client())
        .unwrap();
    list.lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("cmd=")))
        .filter(|cmd| *cmd != "client|list")
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn with_the_journal_on_the_clock_is_read_on_a_connection_of_its_own() {
    for journal in [false, true] {
        let redis = RedisServer::start().unwrap();
        let mut store_config = config(&redis.url(), "").store_config();
        store_config.journal = journal;
        let store = Store::connect(&store_config).await.unwrap();
        let msg = NewMessage::payload("s", "p", Duration::from_secs(60));
        let stored = store
            .schedule(&msg, ScheduleMode::New, Duration::from_secs(3600))
            .await
            .unwrap();
        assert!(matches!(stored, Scheduled::Scheduled { .. }), "{stored:?}");
        let now = store.now_ms().await.unwrap();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut redis.client()).unwrap();
        let redis_now = secs * 1000 + micros / 1000;
        assert!(
            now <= redis_now && redis_now < now + 1000,
            "{now} against {redis_now}"
        );

        let last = last_commands(&redis);
        assert!(
            last.iter().any(|c| c == "time"),
            "journal {journal}: {last:?}"
        );
        // Without the journal, the clock is read where the push's script went.
        assert_eq!(
            last.iter().any(|c| c == "fcall"),
            journal,
            "journal {journal}: {last:?}"
        );
    }
}

/// Redis's clock in ms, read on a connection of the test's own.
fn redis_ms(conn: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
    secs * 1000 + micros / 1000
}

#[tokio::test]
async fn the_clock_carried_forward_is_never_behind_redis_and_at_most_a_trip_ahead() {
    let redis = RedisServer::start().unwrap();
    let store = Store::connect(&config(&redis.url(), "").store_config())
        .await
        .unwrap();
    let mut conn = redis.client();
    // Over more than a second: readings carried forward, and read again.
    let until = std::time::Instant::now() + Duration::from_millis(1500);
    let mut asked = 0;
    while std::time::Instant::now() < until {
        let before = redis_ms(&mut conn);
        let carried = store.clock_ahead_ms().await.unwrap();
        let after = redis_ms(&mut conn);
        // A millisecond's rounding on each side; ahead by up to the 2 ms trip of
        // the reading carried forward.
        assert!(before <= carried + 2, "{before} > {carried}");
        assert!(carried <= after + 3, "{carried} > {after}");
        asked += 1;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    assert!(asked > 50, "{asked} readings");
}
