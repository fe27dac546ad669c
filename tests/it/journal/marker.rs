//! The journal's marker through a restore: written provisionally when a full
//! restore begins and made final when it ends only if Redis kept it, so that a
//! second loss of Redis's data during the restore leaves the marker missing (the
//! hold on forwarding stays, the keeper finds the loss) instead of hiding it.

use std::sync::atomic::{AtomicBool, Ordering};

use delayq::restore::{RestoreError, RestoreOptions, restore};
use serde_json::json;

use super::daemon::journaled;
use crate::support::now_ms;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_during_a_restore_leaves_the_marker_missing_and_a_restore_after_it_ends_the_hold() {
    // Three messages journaled by a node, which then stops: only the restores
    // below touch the marker.
    let (db, redis, mut node, api) = journaled().await;
    let mut conn = redis.client();
    let due = now_ms() + 3_600_000;
    for i in 0..3 {
        let body = json!({"id": format!("m{i}"), "stream": "s", "payload": "x", "deliver_at": due});
        assert_eq!(api.post("/v1/messages", body).await.0, 201);
    }
    node.kill();
    let config = delayq_client::config::Config::from_toml(
        &format!(
            "[redis]\nurl = \"{}\"\nshards = 4\n[journal]\nurl = \"{}\"\n",
            redis.url(),
            db.url_with_password()
        ),
        std::iter::empty(),
    )
    .unwrap();
    let journal = delayq::journal::Journal::new(config.journal.as_ref().unwrap()).unwrap();
    let store = delayq_client::store::Store::connect(&config.store_config())
        .await
        .unwrap();
    let options = RestoreOptions {
        include_overdue: true,
        dry_run: false,
        id: None,
        lost_seen_ms: None,
        records_retention: config.records.retention,
        by: Default::default(),
    };
    let max_delay = config.api.limits.max_delay;

    // Redis loses its data, and again while the restore runs (after its
    // messages are written).
    let () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let lost_again = AtomicBool::new(false);
    let client = redis::Client::open(redis.url()).unwrap();
    let progress = |_: u64, _: u64| {
        if !lost_again.swap(true, Ordering::SeqCst) {
            let mut c = client.get_connection().unwrap();
            let () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
        }
    };
    let interrupted = restore(&store, &journal, &options, max_delay, &progress).await;
    assert!(lost_again.load(Ordering::SeqCst), "the loss came during it");
    assert!(
        matches!(interrupted, Err(RestoreError::Interrupted)),
        "{interrupted:?}"
    );
    assert_eq!(marker(&mut conn), None, "no marker hides the second loss");

    // Run again, nothing lost meanwhile: every message back, the marker written.
    let report = restore(&store, &journal, &options, max_delay, &|_, _| {})
        .await
        .unwrap();
    assert_eq!(report.restored, 3, "{report:?}");
    let written = marker(&mut conn);
    assert!(
        written
            .as_deref()
            .is_some_and(|m| !m.starts_with("provisional:")),
        "{written:?}"
    );
    assert_eq!(
        store.journal_marker().await.unwrap(),
        written,
        "the store reads it as the marker"
    );
}

/// A full restore while Redis has its data (nothing lost) keeps the marker it
/// finds, and restores nothing Redis holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_with_nothing_lost_keeps_the_marker() {
    let (_db, redis, _node, api) = journaled().await;
    let mut conn = redis.client();
    let body = json!({"id": "m", "stream": "s", "payload": "x", "delay": "1h"});
    assert_eq!(api.post("/v1/messages", body).await.0, 201);
    let before = marker(&mut conn);
    assert!(before.is_some(), "the node wrote the marker");
    let (status, report) = api.post("/v1/admin/restore", json!({})).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        (&report["restored"], &report["already_present"]),
        (&json!(0), &json!(1)),
        "{report}"
    );
    assert_eq!(marker(&mut conn), before);
}

/// The marker as Redis holds it (a provisional one too).
fn marker(conn: &mut redis::Connection) -> Option<String> {
    redis::cmd("GET").arg("delayq:journal").query(conn).unwrap()
}
