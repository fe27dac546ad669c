//! The journal's schema on a real MariaDB (started here: its own data directory, a
//! loopback port): `delayq journal migrate` creates it, again changes nothing,
//! several at once migrate once; the password comes from a file and shows nowhere.

use std::path::Path;
use std::process::Output;

use delayq_harness::MariaDbServer;

use crate::support::{delayq_with_config, text};

/// A config naming `db`'s journal, its password in a file in `dir`.
fn config(db: &MariaDbServer, dir: &Path, password: &str) -> std::path::PathBuf {
    let password_file = dir.join("journal-password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    let path = dir.join("delayq.toml");
    std::fs::write(
        &path,
        format!(
            "[journal]\nurl = \"{}\"\npassword_file = \"{}\"\n",
            db.url(),
            password_file.display()
        ),
    )
    .unwrap();
    path
}

fn said(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_made_once_and_migrating_again_changes_nothing() {
    let db = tokio::task::spawn_blocking(MariaDbServer::start)
        .await
        .unwrap()
        .expect("start MariaDB");
    let dir = tempfile::tempdir().unwrap();
    let path = config(&db, dir.path(), &db.password);

    // Three instances migrating at once: one migrates, the others find it done.
    let runs = futures::future::join_all(
        (0..3).map(|_| delayq_with_config(&["journal", "migrate"], &path)),
    )
    .await;
    for out in &runs {
        assert!(out.status.success(), "{}", said(out));
        assert!(!said(out).contains(&db.password), "{}", said(out));
    }
    let outputs: Vec<String> = runs
        .iter()
        .map(|o| text(&o.stdout).trim().to_owned())
        .collect();
    assert_eq!(
        outputs
            .iter()
            .filter(|o| *o == "journal schema: version 0 -> 5")
            .count(),
        1,
        "{outputs:?}"
    );
    assert_eq!(
        outputs
            .iter()
            .filter(|o| *o == "journal schema: version 5 (up to date)")
            .count(),
        2,
        "{outputs:?}"
    );
    let applied = db
        .sql("SELECT version, name FROM delayq.delayq_schema ORDER BY version")
        .unwrap();
    assert_eq!(
        applied.trim(),
        "1\tmessages\n2\tmarker\n3\tpaused\n4\tschedules\n5\ttransitions"
    );
    let indexes = db
        .sql("SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = 'delayq' AND TABLE_NAME = 'delayq_messages' ORDER BY INDEX_NAME")
        .unwrap();
    let mut indexes: Vec<&str> = indexes.split_whitespace().collect();
    indexes.sort_unstable();
    assert_eq!(indexes, ["PRIMARY", "by_state_due", "by_state_updated"]);

    let out = delayq_with_config(&["journal", "version"], &path).await;
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(
        text(&out.stdout).trim(),
        "journal schema: version 5 (this delayq: 5)"
    );

    // A wrong password: refused, and neither password is shown.
    let wrong = tempfile::tempdir().unwrap();
    let bad = config(&db, wrong.path(), "not-the-password");
    let out = delayq_with_config(&["journal", "migrate"], &bad).await;
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(said(&out).contains("Access denied"), "{}", said(&out));
    assert!(!said(&out).contains("not-the-password") && !said(&out).contains(&db.password));
}

/// A MariaDB of its own, and a journal there with its schema.
pub(super) async fn migrated_journal() -> (MariaDbServer, delayq::journal::Journal) {
    let db = tokio::task::spawn_blocking(MariaDbServer::start)
        .await
        .unwrap()
        .expect("start MariaDB");
    let config = delayq_client::config::Config::from_toml(
        &format!("[journal]\nurl = \"{}\"\n", db.url_with_password()),
        std::iter::empty(),
    )
    .unwrap();
    let journal = delayq::journal::Journal::new(config.journal.as_ref().unwrap()).unwrap();
    journal.migrate().await.unwrap();
    (db, journal)
}

/// Schedules' definitions: the later change wins, a deletion keeps its row; a
/// schedule's latest occurrence is read from its messages' ids alone (not those
/// of a schedule whose id it begins, nor of one that differs where `_` would
/// match any character).
#[tokio::test]
async fn schedules_are_kept_by_their_latest_change_and_their_occurrences_read() {
    let (db, journal) = migrated_journal().await;
    journal
        .set_schedule("a", Some("{\"v\":2}"), 20)
        .await
        .unwrap();
    journal
        .set_schedule("a", Some("{\"v\":1}"), 10)
        .await
        .unwrap();
    journal
        .set_schedule("b", Some("{\"v\":1}"), 10)
        .await
        .unwrap();
    journal.set_schedule("b", None, 30).await.unwrap();
    journal
        .set_schedule("b", Some("{\"v\":0}"), 5)
        .await
        .unwrap();
    journal.set_schedule("a_b", Some("{}"), 10).await.unwrap();
    assert_eq!(journal.schedules().await.unwrap(), ["{\"v\":2}", "{}"]);
    db.sql(
        "INSERT INTO delayq.delayq_messages (id, stream, body, due_ms, state, updated_ms) VALUES \
         ('a.100', 's', '{}', 0, 1, 0), ('a.900', 's', '{}', 0, 0, 0), \
         ('a.1.5000', 's', '{}', 0, 1, 0), ('a.x', 's', '{}', 0, 1, 0), \
         ('axb.700', 's', '{}', 0, 1, 0), ('a_b.300', 's', '{}', 0, 1, 0)",
    )
    .unwrap();
    for (id, last) in [
        ("a", Some(900)),
        ("a.1", Some(5000)),
        ("a_b", Some(300)),
        ("b", None),
    ] {
        assert_eq!(journal.last_occurrence(id).await.unwrap(), last, "{id}");
    }
    assert_eq!(
        journal.count_restorable().await.unwrap(),
        3,
        "one message, two schedules"
    );
}

/// The journal's batched writes and reads, on 10 000 messages: scheduled (again as
/// duplicates, once replaced), finished, paged back in due order as they were
/// pushed, and the finished ones trimmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_recorded_finished_paged_and_trimmed() {
    use std::time::{Duration, Instant};

    use delayq::journal::Push;
    use delayq_client::message::{Due, MessageId, NewMessage};
    use delayq_client::store::{OutboxCode, OutboxLine};

    let (db, journal) = migrated_journal().await;

    const N: u64 = 10_000;
    let base = 1_800_000_000_000u64;
    let messages: Vec<(NewMessage, u64)> = (0..N)
        .map(|i| {
            let msg = NewMessage {
                key: None,
                id: MessageId::parse(&format!("j{i}")).unwrap(),
                stream: format!("s{}", i % 7),
                fields: vec![("n".into(), i.to_string()), ("é".into(), "ü ✓".into())],
                due: Due::At(base + (N - i) * 3),
                priority: (i % 10) as u8,
                ttl: (i % 2 == 0).then(|| Duration::from_millis(i + 1)),
            };
            let due = msg.due.as_ms();
            (msg, due)
        })
        .collect();
    let came = delayq::journal::Came::default();
    let refs: Vec<Push<'_>> = messages
        .iter()
        .map(|(msg, due_ms)| Push {
            msg,
            due_ms: *due_ms,
            replace: false,
            at_ms: base,
            came: &came,
        })
        .collect();
    let started = Instant::now();
    for chunk in refs.chunks(500) {
        journal.record_scheduled(chunk).await.unwrap();
    }
    eprintln!("journal: {N} scheduled in {:.2?}", started.elapsed());
    // Pushed again: duplicates change nothing; one replaced is due anew.
    let mut again = messages[0].0.clone();
    again.fields = vec![("changed".into(), "yes".into())];
    let push = |msg, due_ms, replace| Push {
        msg,
        due_ms,
        replace,
        at_ms: base,
        came: &came,
    };
    journal
        .record_scheduled(&[push(&again, base + 1, false)])
        .await
        .unwrap();
    let mut replaced = messages[1].0.clone();
    replaced.fields = vec![("replaced".into(), "yes".into())];
    journal
        .record_scheduled(&[push(&replaced, 1, true)])
        .await
        .unwrap();

    // 4000 delivered, 10 cancelled.
    let finished: Vec<OutboxLine> = (2..4012)
        .map(|i| OutboxLine {
            id: messages[i].0.id.to_string(),
            stream: Some(messages[i].0.stream.clone()),
            code: if i < 4002 {
                OutboxCode::Delivered
            } else {
                OutboxCode::Cancelled
            },
            entry: (i < 4002).then(|| format!("{base}-{i}")),
            at_ms: base + 10,
            attempt: None,
        })
        .collect();
    let started = Instant::now();
    for chunk in finished.chunks(1000) {
        journal.apply(chunk).await.unwrap();
    }
    // Applied again (a copy the outbox gave twice), and a later dead letter of a
    // delivered one (redelivery): the first changes nothing, the second applies.
    journal.apply(&finished[..10]).await.unwrap();
    eprintln!("journal: 4010 finished in {:.2?}", started.elapsed());

    // Paged back: every unfinished one, in due order, as it was pushed.
    let mut back = Vec::new();
    let mut after = None;
    loop {
        let page = journal.unfinished(after.as_ref(), 700).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some((last.due.as_ms(), last.id.to_string(), last.stream.clone()));
        back.extend(page);
    }
    assert_eq!(back.len() as u64, N - 4010);
    assert!(
        back.windows(2)
            .all(|w| w[0].due.as_ms() <= w[1].due.as_ms())
    );
    assert_eq!(back[0].id, replaced.id, "the replaced one, due at 1, first");
    assert_eq!(back[0].fields, replaced.fields);
    let first = back.iter().find(|m| m.id == messages[0].0.id).unwrap();
    assert_eq!(
        first.fields, messages[0].0.fields,
        "a duplicate changed nothing"
    );
    for m in &back[1..] {
        let i: usize = m.id.as_str()[1..].parse().unwrap();
        let (want, due) = &messages[i];
        assert_eq!(
            (&m.stream, &m.fields, m.priority, m.ttl, m.due.as_ms()),
            (&want.stream, &want.fields, want.priority, want.ttl, *due)
        );
    }
    let delivered = db
        .sql("SELECT entry_id FROM delayq.delayq_messages WHERE id = 'j2'")
        .unwrap();
    assert_eq!(delivered.trim(), format!("{base}-2"));

    // Trimmed: the finished ones changed before the cut, a few at a time.
    let mut trimmed = 0;
    loop {
        let n = journal.trim(base + 11, 1500).await.unwrap();
        trimmed += n;
        if n == 0 {
            break;
        }
    }
    assert_eq!(trimmed, 4010);
    let left = db
        .sql("SELECT COUNT(*) FROM delayq.delayq_messages")
        .unwrap();
    assert_eq!(left.trim(), (N - 4010).to_string());
    journal.close().await.unwrap();
}

/// One write to the journal in an ordering case: a push (its Redis time, its
/// payload, its due time, whether it replaces) or an outbox line (its Redis time,
/// what happened; a reschedule's new due time).
#[derive(Clone, Copy)]
enum Write {
    Push(u64, &'static str, u64, bool),
    Line(u64, delayq_client::store::OutboxCode, u64),
}

/// Writes to one id in the order they reach the journal (an outbox line may come
/// after a later push), and the row they must leave: state, payload, due time.
type Ordering = (&'static [Write], (u8, &'static str, u64));

#[rustfmt::skip]
const ORDERINGS: &[Ordering] = {
    use delayq_client::store::OutboxCode::{Cancelled, Delivered, Rescheduled};
    use Write::{Line, Push};
    &[
        // In order: pushed, cancelled, pushed again as new.
        (&[Push(100, "a", 500, false), Line(110, Cancelled, 0), Push(120, "b", 600, false)], (0, "b", 600)),
        // A duplicate push changes nothing; a cancel after it applies.
        (&[Push(100, "a", 500, false), Push(120, "b", 600, false), Line(130, Cancelled, 0)], (4, "a", 500)),
        // Copied late: a cancel, a delivery, a reschedule before a replacing push.
        (&[Push(100, "a", 500, false), Push(120, "b", 600, true), Line(110, Cancelled, 0)], (0, "b", 600)),
        (&[Push(100, "a", 500, false), Push(120, "b", 600, true), Line(110, Delivered, 0)], (0, "b", 600)),
        (&[Push(100, "a", 500, false), Push(120, "b", 600, true), Line(110, Rescheduled, 550)], (0, "b", 600)),
        // In order, each applies.
        (&[Push(100, "a", 500, false), Line(110, Rescheduled, 550)], (0, "a", 550)),
        (&[Push(100, "a", 500, false), Line(110, Delivered, 0), Push(120, "b", 600, true)], (0, "b", 600)),
        (&[Push(100, "a", 500, false), Push(120, "b", 600, true), Line(130, Delivered, 0)], (1, "b", 600)),
        // A replacing push that began before the row's last write is older.
        (&[Push(100, "a", 500, false), Push(120, "b", 600, true), Push(110, "c", 700, true)], (0, "b", 600)),
        // A delivered message is not pushed again as new by the journal.
        (&[Push(100, "a", 500, false), Line(110, Delivered, 0), Push(120, "b", 600, false)], (1, "a", 500)),
    ]
};

/// Writes to one id that reach the journal out of their order leave the row as
/// the last of them in Redis's time left it: an outbox line copied after a later
/// push of the same id does not undo it, and a cancelled id pushed again is
/// scheduled again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_copied_late_never_undo_a_later_push() {
    use delayq::journal::Push;
    use delayq_client::message::{Due, MessageId, NewMessage};
    use delayq_client::store::{OutboxCode, OutboxLine};

    let (db, journal) = migrated_journal().await;
    for (case, (writes, (state, payload, due))) in ORDERINGS.iter().enumerate() {
        let id = format!("o{case}");
        for write in *writes {
            match *write {
                Write::Push(at_ms, payload, due_ms, replace) => {
                    let msg = NewMessage {
                        key: None,
                        id: MessageId::parse(&id).unwrap(),
                        stream: "s".into(),
                        fields: vec![("payload".into(), payload.into())],
                        due: Due::At(due_ms),
                        priority: 0,
                        ttl: None,
                    };
                    let push = Push {
                        msg: &msg,
                        due_ms,
                        replace,
                        at_ms,
                        came: &delayq::journal::Came::default(),
                    };
                    journal.record_scheduled(&[push]).await.unwrap();
                }
                Write::Line(at_ms, code, due_ms) => {
                    let line = OutboxLine {
                        code,
                        id: id.clone(),
                        at_ms,
                        entry: match code {
                            OutboxCode::Delivered => Some(format!("{at_ms}-0")),
                            OutboxCode::Rescheduled => Some(due_ms.to_string()),
                            _ => None,
                        },
                        stream: Some("s".into()),
                        attempt: None,
                    };
                    journal.apply(&[line]).await.unwrap();
                }
            }
        }
        let row = db
            .sql(&format!(
                "SELECT state, due_ms, JSON_VALUE(body, '$.fields[0][1]') FROM delayq.delayq_messages WHERE id = '{id}'"
            ))
            .unwrap();
        assert_eq!(
            row.trim(),
            format!("{state}\t{due}\t{payload}"),
            "case {case}"
        );
    }
    journal.close().await.unwrap();
}

/// `delayq restore` against a MySQL that takes connections but never answers
/// (SIGSTOP) fails within its bound, saying so, instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_against_a_hung_mysql_fails_within_its_bound() {
    let (db, journal) = migrated_journal().await;
    journal.close().await.unwrap();
    let redis = delayq_harness::RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delayq.toml");
    std::fs::write(
        &path,
        format!(
            "[redis]\nurl = \"{}\"\n[journal]\nurl = \"{}\"\n",
            redis.url(),
            db.url_with_password()
        ),
    )
    .unwrap();
    db.pause();
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        delayq_with_config(&["restore", "--json"], &path),
    )
    .await;
    db.resume();
    let out = out.expect("restore ended by itself");
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        said(&out).contains("no answer within 10s"),
        "{}",
        said(&out)
    );
    assert!(started.elapsed().as_secs() < 40, "{:?}", started.elapsed());
    assert!(!said(&out).contains(&db.password), "{}", said(&out));
}
