//! What leaves the inbox: an entry goes once acknowledged, the entries below the
//! first one still wanted are trimmed together, and nothing another instance holds,
//! nor an entry rejected unread, is ever taken (`inbox_entries.forget` in
//! `lua/prelude/15-inbox.lua`).

use std::time::Duration;

use delayq_client::store::{
    BatchItem, CopyLimit, EntryFields, InboxAck, InboxEntry, InboxQueue, Rejection, ScheduleMode,
};

use crate::support::{Bare, create_group, pending_count, read_group_up_to, xadd};

const INBOX: &str = "delayq:inbox";
const GROUP: &str = "delayq";
const ACK: InboxAck = InboxAck {
    read: None,
    stream: INBOX,
    group: GROUP,
};

/// `n` valid entries added to the inbox (its group made first), their ids in order.
fn add(conn: &mut redis::Connection, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let n = i.to_string();
            xadd(
                conn,
                INBOX,
                &[
                    ("delayq-stream", "jobs"),
                    ("delayq-delay", "60000"),
                    ("n", n.as_str()),
                ],
            )
        })
        .collect()
}

/// Up to `count` entries never handed out, to `consumer`: their ids.
fn take(conn: &mut redis::Connection, consumer: &str, count: usize) -> Vec<String> {
    read_group_up_to(conn, INBOX, GROUP, consumer, count)
        .into_iter()
        .map(|e| e.id)
        .collect()
}

/// The ids the inbox holds, in order.
fn held(conn: &mut redis::Connection) -> Vec<String> {
    crate::support::entries(conn, INBOX)
        .into_iter()
        .map(|e| e.id)
        .collect()
}

/// Stores the messages of `ids` (read already), acknowledging their entries.
async fn store(bare: &Bare, ids: &[String]) {
    let items: Vec<BatchItem> = ids
        .iter()
        .map(|id| {
            let entry = InboxEntry {
                id: id.clone(),
                fields: EntryFields::Read(vec![
                    (b"delayq-stream".to_vec(), b"jobs".to_vec()),
                    (b"delayq-delay".to_vec(), b"60000".to_vec()),
                    (b"n".to_vec(), b"1".to_vec()),
                ]),
            };
            BatchItem {
                msg: delayq::inbox::parse_entry(&entry, &bare.config).expect("valid"),
                mode: ScheduleMode::New,
                inbox_entry: Some(id.clone()),
            }
        })
        .collect();
    for outcome in bare
        .store
        .schedule_many(&items, Duration::from_secs(3600), Some(ACK))
        .await
    {
        outcome.expect("stored");
    }
}

/// Rejects the entry `id` as never read (kept in the inbox): the rejections written.
async fn reject_unread(bare: &Bare, id: &str) -> u64 {
    let queue = InboxQueue {
        stream: INBOX.into(),
        group: GROUP.into(),
        rejected_stream: "delayq:inbox:rejected".into(),
    };
    let unread = InboxEntry {
        id: id.to_owned(),
        fields: EntryFields::Unread,
    };
    let limit = CopyLimit {
        pairs: 100,
        bytes: 10_000,
    };
    let rejection = Rejection::new(&unread, "unread".into(), limit);
    bare.store
        .reject_inbox_entries(&queue, &[rejection])
        .await
        .expect("rejected")
}

async fn inbox() -> (Bare, redis::Connection) {
    let bare = Bare::start("").await;
    let mut conn = bare.redis.client();
    create_group(&mut conn, INBOX, GROUP);
    (bare, conn)
}

/// Entries another instance holds stay, wherever they lie; the acknowledged ones
/// above them go with the first call after them that passes them.
#[tokio::test]
async fn entries_another_instance_holds_stay_and_the_rest_go_once_passed() {
    let (bare, mut conn) = inbox().await;
    let ids = add(&mut conn, 40);
    let other = take(&mut conn, "other", 10);
    let mine = take(&mut conn, "mine", 20);
    store(&bare, &mine).await;
    // The other instance's entries come first: nothing is trimmed yet.
    assert_eq!(held(&mut conn), ids);
    store(&bare, &other).await;
    assert_eq!(held(&mut conn), ids[30..], "all acknowledged entries gone");
    let rest = take(&mut conn, "mine", 10);
    store(&bare, &rest).await;
    assert_eq!(held(&mut conn), Vec::<String>::new());
    assert_eq!(pending_count(&mut conn, INBOX, GROUP), Some(0));
}

/// A batch read ahead (pending, same consumer) stays while the one before it goes.
#[tokio::test]
async fn a_batch_read_ahead_stays_while_the_one_before_goes() {
    let (bare, mut conn) = inbox().await;
    let ids = add(&mut conn, 30);
    let first = take(&mut conn, "mine", 10);
    let second = take(&mut conn, "mine", 10);
    store(&bare, &first).await;
    assert_eq!(held(&mut conn), ids[10..]);
    store(&bare, &second).await;
    assert_eq!(held(&mut conn), ids[20..]);
}

/// Entries stored out of the order they were read in: the last one, stored first,
/// stays while those below it are pending, and goes with them.
#[tokio::test]
async fn entries_stored_out_of_their_order_all_go() {
    let (bare, mut conn) = inbox().await;
    add(&mut conn, 12);
    let mut read = take(&mut conn, "mine", 12);
    read.reverse();
    store(&bare, &read[..1]).await;
    assert_eq!(
        held(&mut conn).len(),
        12,
        "below it, the first entries are still pending"
    );
    store(&bare, &read[1..]).await;
    assert_eq!(held(&mut conn), Vec::<String>::new());
}

/// An entry rejected unread stays in the inbox, pending in the kept group, through
/// every later trim; acknowledged there, it goes with the next call.
#[tokio::test]
async fn an_entry_rejected_unread_stays_until_let_go() {
    let (bare, mut conn) = inbox().await;
    let ids = add(&mut conn, 30);
    let read = take(&mut conn, "mine", 30);
    assert_eq!(reject_unread(&bare, &read[5]).await, 1);
    let others: Vec<String> = read.iter().filter(|id| **id != read[5]).cloned().collect();
    store(&bare, &others).await;
    assert_eq!(held(&mut conn), vec![ids[5].clone()]);
    assert_eq!(pending_count(&mut conn, INBOX, GROUP), Some(0));
    assert_eq!(pending_count(&mut conn, INBOX, "delayq:kept"), Some(1));
    let more = add(&mut conn, 10);
    let read = take(&mut conn, "mine", 10);
    store(&bare, &read).await;
    assert_eq!(
        held(&mut conn),
        vec![ids[5].clone()],
        "kept through a later trim"
    );
    let released: i64 = redis::cmd("XACK")
        .arg(INBOX)
        .arg("delayq:kept")
        .arg(&ids[5])
        .query(&mut conn)
        .expect("XACK");
    assert_eq!(released, 1);
    let last = add(&mut conn, 1);
    let read = take(&mut conn, "mine", 1);
    store(&bare, &read).await;
    assert_eq!(
        held(&mut conn),
        Vec::<String>::new(),
        "let go: {more:?} {last:?}"
    );
}

/// The most entries a read takes (`inbox.batch_size` at most 5000), stored in calls
/// of the most messages a call carries: every one leaves the inbox; with an entry
/// kept before them, they go one by one (each call's full list) and it stays.
#[tokio::test]
async fn the_largest_reads_leave_whole_with_or_without_an_entry_kept() {
    let (bare, mut conn) = inbox().await;
    let ids = add(&mut conn, 5000);
    let read = take(&mut conn, "mine", 5000);
    assert_eq!(read, ids);
    store(&bare, &read).await;
    assert_eq!(held(&mut conn), Vec::<String>::new());
    let ids = add(&mut conn, 5001);
    let read = take(&mut conn, "mine", 5001);
    assert_eq!(reject_unread(&bare, &read[0]).await, 1);
    store(&bare, &read[1..]).await;
    assert_eq!(held(&mut conn), vec![ids[0].clone()]);
}
