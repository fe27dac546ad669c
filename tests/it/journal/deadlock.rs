//! A journal transaction that InnoDB ends as a deadlock's victim is run again, not
//! failed: against a real MariaDB, another transaction takes the rows an outbox
//! copy locks in the opposite order.

use std::time::Duration;

use delayq_client::store::{OutboxCode, OutboxLine};
use mysql_async::prelude::*;

use super::schema::migrated_journal;
use crate::support::eventually;

/// Cancels of scheduled messages `a` and `b` (the outbox copy locks their rows in
/// key order, `a` first); another transaction, heavier (2000 rows written, so that
/// InnoDB picks the copy as the victim), holds `b` and then asks for `a` while the
/// copy waits for `b`: a deadlock. The copy is run again once the other ends, and
/// both cancels are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_copy_ended_as_a_deadlock_s_victim_is_run_again() {
    let (db, journal) = migrated_journal().await;
    db.sql(
        "INSERT INTO delayq.delayq_messages (id, stream, body, due_ms, state, updated_ms) \
         VALUES ('a', 's', '', 1, 0, 1), ('b', 's', '', 1, 0, 1)",
    )
    .unwrap();
    let mut conn = mysql_async::Conn::from_url(db.url_with_password())
        .await
        .expect("connect to MariaDB");
    let mut other = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .unwrap();
    other
        .query_drop(
            "INSERT INTO delayq_messages (id, stream, body, due_ms, state, updated_ms) \
             SELECT CONCAT('z', seq), 's', '', 1, 0, 1 FROM seq_0_to_1999",
        )
        .await
        .unwrap();
    other
        .query_drop("SELECT 1 FROM delayq_messages WHERE id = 'b' FOR UPDATE")
        .await
        .unwrap();
    let lines: Vec<OutboxLine> = ["a", "b"]
        .into_iter()
        .map(|id| OutboxLine {
            code: OutboxCode::Cancelled,
            id: id.into(),
            at_ms: 10,
            entry: None,
            stream: Some("s".into()),
            attempt: None,
        })
        .collect();
    let copy = {
        let journal = journal.clone();
        tokio::spawn(async move { journal.apply(&lines).await })
    };
    eventually(
        Duration::from_secs(10),
        "the outbox copy waits for b",
        || async {
            let waiting = db
                .sql("SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'")
                .unwrap();
            (waiting.trim() == "1").then_some(())
        },
    )
    .await;
    // The deadlock: this transaction wins it (the copy, lighter, is rolled back).
    other
        .query_drop("SELECT 1 FROM delayq_messages WHERE id = 'a' FOR UPDATE")
        .await
        .expect("the heavier transaction wins the deadlock");
    other.rollback().await.unwrap();
    let applied = tokio::time::timeout(Duration::from_secs(30), copy)
        .await
        .expect("the copy ends")
        .unwrap();
    applied.expect("the copy, run again after the deadlock, is applied");
    let status = db.sql("SHOW ENGINE INNODB STATUS").unwrap();
    assert!(
        status.contains("LATEST DETECTED DEADLOCK"),
        "no deadlock happened: {status}"
    );
    let states = db
        .sql("SELECT id, state FROM delayq.delayq_messages WHERE id IN ('a', 'b') ORDER BY id")
        .unwrap();
    assert_eq!(states, "a\t4\nb\t4\n", "both cancelled");
}
