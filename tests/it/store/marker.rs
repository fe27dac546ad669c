//! The journal's marker in Redis, against a real Redis: written provisionally
//! before the journal is counted and confirmed after, so that a loss of Redis's
//! data in between leaves it missing (for the keeper to find) instead of written
//! into an emptied Redis; a provisional marker reads as none, and never takes the
//! place of a final one.

use crate::support::Bare;

#[tokio::test]
async fn a_provisional_marker_is_confirmed_only_if_redis_kept_it() {
    let bare = Bare::start("").await;
    let store = &bare.store;
    assert_eq!(store.journal_marker().await.unwrap(), None);

    // Kept: confirmed, and read from then on.
    let provisional = store
        .set_provisional_journal_marker("t1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.journal_marker().await.unwrap(),
        None,
        "provisional reads as none"
    );
    assert!(
        store
            .confirm_journal_marker(&provisional, "t1")
            .await
            .unwrap()
    );
    assert_eq!(store.journal_marker().await.unwrap().as_deref(), Some("t1"));

    // Lost in between: not confirmed, still missing.
    let () = redis::cmd("DEL")
        .arg("delayq:journal")
        .query(&mut bare.redis.client())
        .unwrap();
    let provisional = store
        .set_provisional_journal_marker("t2")
        .await
        .unwrap()
        .unwrap();
    let () = redis::cmd("FLUSHALL")
        .query(&mut bare.redis.client())
        .unwrap();
    assert!(
        !store
            .confirm_journal_marker(&provisional, "t2")
            .await
            .unwrap()
    );
    assert_eq!(store.journal_marker().await.unwrap(), None);
    let raw: Option<String> = redis::cmd("GET")
        .arg("delayq:journal")
        .query(&mut bare.redis.client())
        .unwrap();
    assert_eq!(raw, None);

    // Another value meanwhile (a restore's marker) is left as it is.
    let provisional = store
        .set_provisional_journal_marker("t3")
        .await
        .unwrap()
        .unwrap();
    store.set_journal_marker("restored").await.unwrap();
    assert!(
        !store
            .confirm_journal_marker(&provisional, "t3")
            .await
            .unwrap()
    );
    assert_eq!(
        store.journal_marker().await.unwrap().as_deref(),
        Some("restored")
    );
}

/// A check reads no marker, counts the journal, and only then writes its
/// provisional marker: a restore's marker written in between stays, so that the
/// next check sees it (overwritten, the keeper held forwarding until the next
/// restore).
#[tokio::test]
async fn a_restore_s_marker_is_never_overwritten_by_a_provisional_one() {
    let bare = Bare::start("").await;
    let store = &bare.store;
    store.set_journal_marker("restored").await.unwrap();
    assert_eq!(
        store.set_provisional_journal_marker("t").await.unwrap(),
        None,
        "a final marker is there"
    );
    assert_eq!(
        store.journal_marker().await.unwrap().as_deref(),
        Some("restored")
    );

    // A provisional marker an earlier check left (the journal held something to
    // restore) is taken up again, and confirmed as any other.
    let () = redis::cmd("FLUSHALL")
        .query(&mut bare.redis.client())
        .unwrap();
    let left = store.set_provisional_journal_marker("t").await.unwrap();
    assert_eq!(left.as_deref(), Some("provisional:t"));
    let again = store.set_provisional_journal_marker("t").await.unwrap();
    assert_eq!(again, left);
    assert!(
        store
            .confirm_journal_marker(&again.unwrap(), "t")
            .await
            .unwrap()
    );
    assert_eq!(store.journal_marker().await.unwrap().as_deref(), Some("t"));
}
