//! Marked reads of the inbox (`delayq_client::store::InboxRead`), against a real
//! Redis: over any interleaving of entries added, reads by two readers (marked or
//! not), reads stored whole, released, abandoned and taken over, no entry is ever
//! trimmed before it is stored or rejected, each ends stored or rejected, none is
//! stored twice, and nothing is left pending once every read has ended.

use std::collections::BTreeSet;
use std::time::Duration;

use delayq_client::store::{
    BatchItem, CopyLimit, EntryFields, InboxAck, InboxEntry, InboxQueue, InboxRead, InboxReader,
    MAX_PER_CALL, Rejection, ScheduleMode, Scheduled, is_read_consumer,
};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use crate::support::{Bare, entries, pending_entries, redis_cases, redis_config, xadd};

const GROUP: &str = "delayq";
/// Most delay a call takes; an entry due later is too far ahead, and rejected.
const MAX_DELAY: Duration = Duration::from_secs(3600);

#[derive(Clone, Debug)]
enum Step {
    /// Entries added: n valid ones, the last one too far ahead when the flag says.
    Add(usize, bool),
    /// Reader r reads up to n entries, marked or not.
    Read(usize, usize, bool),
    /// An open read (picked by place) stored whole and settled.
    Settle(usize),
    /// An open read released by its reader, its entries then stored one by one, or
    /// (the flag) left pending one by one: its reader stopped right after.
    Release(usize, bool),
    /// An open read abandoned: its reader stopped.
    Abandon(usize),
    /// Reader r takes over every pending entry and read.
    Reclaim(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1..6usize, any::<bool>()).prop_map(|(n, far)| Step::Add(n, far)),
        3 => (0..2usize, 1..8usize, prop::bool::weighted(0.8)).prop_map(|(r, n, m)| Step::Read(r, n, m)),
        2 => (0..8usize).prop_map(Step::Settle),
        1 => (0..8usize, any::<bool>()).prop_map(|(p, stop)| Step::Release(p, stop)),
        1 => (0..8usize).prop_map(Step::Abandon),
        1 => (0..2usize).prop_map(Step::Reclaim),
    ]
}

/// The inbox of the tests that read one: `inbox`, its group [`GROUP`].
fn inbox() -> InboxQueue {
    InboxQueue {
        stream: "inbox".into(),
        group: GROUP.into(),
        rejected_stream: "inbox:rejected".into(),
    }
}

/// A Redis of its own, the inbox on it, and the reader of node "n0".
async fn with_reader() -> (Bare, InboxQueue, InboxReader) {
    let bare = Bare::start("").await;
    let queue = inbox();
    let reader = bare.store.inbox_reader(&queue, "n0").await.unwrap();
    (bare, queue, reader)
}

/// A field of [`GROUP`]'s on `stream`, as `XINFO GROUPS` tells it.
fn group_field(conn: &mut redis::Connection, stream: &str, field: &str) -> redis::Value {
    let groups: Vec<Vec<redis::Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query(conn)
        .unwrap();
    let group = groups
        .iter()
        .find(|g| g.contains(&redis::Value::BulkString(GROUP.into())))
        .expect("the group");
    let at = group
        .iter()
        .position(|v| *v == redis::Value::BulkString(field.as_bytes().to_vec()))
        .unwrap_or_else(|| panic!("no {field} in {group:?}"));
    group[at + 1].clone()
}

/// An entry id as its two numbers, which order ids as Redis does.
fn entry_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').expect("an entry id");
    (ms.parse().unwrap(), seq.parse().unwrap())
}

/// What the entries came to so far.
#[derive(Default)]
struct Tally {
    added: Vec<String>,
    far: BTreeSet<String>,
    stored: BTreeSet<String>,
    rejected: BTreeSet<String>,
}

struct Case<'a> {
    bare: &'a Bare,
    queue: InboxQueue,
    readers: Vec<InboxReader>,
    /// Reads not yet ended, with the node that read them.
    open: Vec<(usize, InboxRead)>,
    tally: Tally,
}

impl Case<'_> {
    fn node(r: usize) -> String {
        format!("n{r}")
    }

    fn ack<'s>(&'s self, read: Option<&'s str>) -> InboxAck<'s> {
        InboxAck {
            stream: &self.queue.stream,
            group: &self.queue.group,
            read,
        }
    }

    /// Schedules `entries` (settling `read` when given), then rejects those too far.
    async fn store(&mut self, entries: &[InboxEntry], read: Option<&str>) {
        let items: Vec<BatchItem> = entries
            .iter()
            .map(|e| BatchItem {
                msg: delayq::inbox::parse_entry(e, &self.bare.config).expect("valid"),
                mode: ScheduleMode::New,
                inbox_entry: Some(e.id.clone()),
            })
            .collect();
        let outcomes = self
            .bare
            .store
            .schedule_many(&items, MAX_DELAY, Some(self.ack(read)))
            .await;
        let mut far = Vec::new();
        for (entry, outcome) in entries.iter().zip(outcomes) {
            match outcome {
                Ok(Scheduled::Duplicate { .. }) => {}
                Ok(_) => assert!(
                    self.tally.stored.insert(entry.id.clone()),
                    "{} stored twice",
                    entry.id
                ),
                Err(e) => {
                    assert!(e.to_string().contains("max_delay"), "{e}");
                    far.push(entry);
                }
            }
        }
        let limit = CopyLimit {
            pairs: 100,
            bytes: 100_000,
        };
        let rejections: Vec<Rejection> = far
            .iter()
            .map(|e| Rejection::new(e, "too far".into(), limit))
            .collect();
        self.bare
            .store
            .reject_inbox_entries(&self.queue, &rejections)
            .await
            .expect("rejected");
        self.tally.rejected.extend(far.iter().map(|e| e.id.clone()));
    }

    async fn reclaim(&mut self, r: usize) {
        let mut cursor = "-".to_owned();
        loop {
            let (next, taken) = self.readers[r]
                .reclaim(Duration::ZERO, 100, &cursor)
                .await
                .expect("reclaim");
            let taken: Vec<InboxEntry> = taken
                .into_iter()
                .filter(|e| matches!(e.fields, EntryFields::Read(_)))
                .collect();
            self.store(&taken, None).await;
            if next.is_empty() {
                return;
            }
            cursor = next;
        }
    }

    async fn step(&mut self, step: Step) {
        match step {
            Step::Add(n, far) => {
                let mut conn = self.bare.redis.client();
                for i in 0..n {
                    let too_far = far && i == n - 1;
                    let delay = if too_far { "7200000" } else { "60000" };
                    let id = xadd(
                        &mut conn,
                        &self.queue.stream,
                        &[
                            ("delayq-stream", "jobs"),
                            ("delayq-delay", delay),
                            ("n", "1"),
                        ],
                    );
                    if too_far {
                        self.tally.far.insert(id.clone());
                    }
                    self.tally.added.push(id);
                }
            }
            Step::Read(r, n, marked) => {
                let reader = &mut self.readers[r];
                let read = if marked {
                    reader.next_marked(n, Duration::from_millis(1)).await
                } else {
                    reader
                        .next(n, Duration::from_millis(1))
                        .await
                        .map(|entries| InboxRead {
                            entries,
                            marked: None,
                        })
                }
                .expect("read");
                if read.marked.is_some() {
                    self.open.push((r, read));
                } else {
                    self.store(&read.entries, None).await;
                }
            }
            Step::Settle(p) if !self.open.is_empty() => {
                let (_, read) = self.open.remove(p % self.open.len());
                self.store(&read.entries, read.marked.as_deref()).await;
            }
            Step::Release(p, stop) if !self.open.is_empty() => {
                let (r, read) = self.open.remove(p % self.open.len());
                let marked = read.marked.as_deref().unwrap();
                let ids = self
                    .bare
                    .store
                    .release_inbox_read(&self.queue, marked, &Self::node(r), 0, Duration::ZERO)
                    .await
                    .expect("released");
                let released: Vec<InboxEntry> = read
                    .entries
                    .into_iter()
                    .filter(|e| ids.contains(&e.id))
                    .collect();
                let mut conn = self.bare.redis.client();
                let pending =
                    pending_entries(&mut conn, &self.queue.stream, GROUP, Some(&Self::node(r)));
                for e in &released {
                    assert!(
                        pending.iter().any(|(id, _)| *id == e.id),
                        "{} released, not pending",
                        e.id
                    );
                }
                if !stop {
                    self.store(&released, None).await;
                }
            }
            Step::Abandon(p) if !self.open.is_empty() => {
                self.open.remove(p % self.open.len());
            }
            Step::Reclaim(r) => self.reclaim(r).await,
            Step::Settle(_) | Step::Release(..) | Step::Abandon(_) => {}
        }
    }

    /// `/v1/stats`'s pending entries are the entries read (up to the group's last
    /// delivered id) and not yet stored or rejected: a marked read counts as its
    /// entries, not as its two ends.
    async fn pending_counted(&self) -> Result<(), TestCaseError> {
        let mut conn = self.bare.redis.client();
        let stream = &self.queue.stream;
        let last: String =
            redis::from_redis_value(group_field(&mut conn, stream, "last-delivered-id")).unwrap();
        let last = entry_id(&last);
        let read = entries(&mut conn, stream)
            .into_iter()
            .filter(|e| entry_id(&e.id) <= last)
            .filter(|e| !self.tally.stored.contains(&e.id) && !self.tally.rejected.contains(&e.id))
            .count() as u64;
        let stats = self.bare.store.inbox_stats(&self.queue).await.unwrap();
        prop_assert_eq!(stats.pending, read, "pending entries");
        Ok(())
    }

    /// Every entry not yet stored or rejected is still in the inbox.
    fn none_trimmed(&self) -> Result<(), TestCaseError> {
        let mut conn = self.bare.redis.client();
        let present: BTreeSet<String> = entries(&mut conn, &self.queue.stream)
            .into_iter()
            .map(|e| e.id)
            .collect();
        let lost: Vec<&String> = self
            .tally
            .added
            .iter()
            .filter(|id| !self.tally.stored.contains(*id) && !self.tally.rejected.contains(*id))
            .filter(|id| !present.contains(*id))
            .collect();
        prop_assert!(
            lost.is_empty(),
            "trimmed before stored or rejected: {:?}",
            lost
        );
        Ok(())
    }
}

#[test]
fn no_entry_of_a_marked_read_is_lost_or_stored_twice() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let bare = runtime.block_on(Bare::start("[redis]\nshards = 2\n"));
    let case = std::sync::atomic::AtomicUsize::new(0);
    let mut runner = TestRunner::new(redis_cases(48));
    runner
        .run(&prop::collection::vec(step(), 1..30), |steps| {
            let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            runtime.block_on(async {
                let queue = InboxQueue {
                    stream: format!("inbox{case}"),
                    group: GROUP.into(),
                    rejected_stream: format!("inbox{case}:rejected"),
                };
                let mut readers = Vec::new();
                for r in 0..2 {
                    let node = Case::node(r);
                    readers.push(bare.store.inbox_reader(&queue, &node).await.unwrap());
                }
                let mut c = Case {
                    bare: &bare,
                    queue,
                    readers,
                    open: Vec::new(),
                    tally: Tally::default(),
                };
                for step in steps {
                    c.step(step).await;
                    c.none_trimmed()?;
                    c.pending_counted().await?;
                }
                // Every read ends: the open ones settled, the abandoned ones taken over,
                // and what is left read and stored.
                while !c.open.is_empty() {
                    c.step(Step::Settle(0)).await;
                }
                c.reclaim(0).await;
                loop {
                    let read = c.readers[1]
                        .next_marked(100, Duration::from_millis(1))
                        .await
                        .unwrap();
                    if read.entries.is_empty() {
                        break;
                    }
                    c.store(&read.entries, read.marked.as_deref()).await;
                }
                c.none_trimmed()?;
                let Tally {
                    added,
                    far,
                    stored,
                    rejected,
                } = &c.tally;
                let valid: BTreeSet<String> = added
                    .iter()
                    .filter(|id| !far.contains(*id))
                    .cloned()
                    .collect();
                prop_assert_eq!(stored, &valid, "every valid entry stored");
                prop_assert_eq!(rejected, far, "every entry too far rejected");
                let mut conn = bare.redis.client();
                let stream = &c.queue.stream;
                prop_assert_eq!(pending_entries(&mut conn, stream, GROUP, None), vec![]);
                prop_assert_eq!(entries(&mut conn, stream).len(), 0, "the inbox emptied");
                let consumers: Vec<redis::Value> = redis::cmd("XINFO")
                    .arg("CONSUMERS")
                    .arg(stream)
                    .arg(GROUP)
                    .query(&mut conn)
                    .unwrap();
                let names = format!("{consumers:?}");
                prop_assert!(
                    !names.split('"').any(is_read_consumer),
                    "a read's consumer left: {}",
                    names
                );
                Ok(())
            })
        })
        .unwrap();
}

/// A reader reads marked only while no reader of an older release reads the inbox:
/// a plain consumer seen in the last seconds without a `<name>@` beside it is one;
/// a reader of this release (which keeps its `<name>@`) is not, nor is the reader
/// itself, nor a plain consumer long idle.
#[tokio::test]
async fn an_older_release_reading_the_inbox_is_told_from_this_one() {
    let (bare, queue, mut mine) = with_reader().await;
    let mut conn = bare.redis.client();
    let mut other = bare.store.inbox_reader(&queue, "n1").await.unwrap();
    assert!(!mine.older_readers().await.unwrap(), "alone");
    // n0's own plain consumer, fresh (its leftovers read at start), is not another.
    mine.next(1, Duration::from_millis(1)).await.unwrap();
    assert!(
        !mine.older_readers().await.unwrap(),
        "its own plain consumer"
    );
    // n1 of this release: its plain consumer fresh, its `n1@` made as it asks.
    other.next(1, Duration::from_millis(1)).await.unwrap();
    assert!(!other.older_readers().await.unwrap());
    assert!(
        !mine.older_readers().await.unwrap(),
        "a reader of this release"
    );
    // "old" reads as an older release does: plain, every half second (here, an
    // entry it holds).
    let read = |conn: &mut redis::Connection| {
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg("old")
            .arg("COUNT")
            .arg(1)
            .arg("STREAMS")
            .arg("inbox")
            .arg(">")
            .query(conn)
            .unwrap();
    };
    xadd(&mut conn, "inbox", &[("delayq-stream", "jobs")]);
    read(&mut conn);
    assert!(
        mine.older_readers().await.unwrap(),
        "an older release reads"
    );
    assert!(
        other.older_readers().await.unwrap(),
        "an older release reads"
    );
    // Gone: its consumer deleted (as good as idle past the window).
    let () = redis::cmd("XGROUP")
        .arg("DELCONSUMER")
        .arg("inbox")
        .arg(GROUP)
        .arg("old")
        .query(&mut conn)
        .map(|_: i64| ())
        .unwrap();
    assert!(
        !mine.older_readers().await.unwrap(),
        "the older reader gone"
    );
    // Marked reads go on: an entry added is read marked.
    xadd(
        &mut conn,
        "inbox",
        &[("delayq-stream", "jobs"), ("delayq-delay", "60000")],
    );
    let read = mine
        .next_marked(10, Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(read.entries.len(), 1);
    assert!(
        read.marked.as_deref().is_some_and(is_read_consumer),
        "{:?}",
        read.marked
    );
    // The group still counts what was read, so XINFO GROUPS tells the lag.
    xadd(&mut conn, "inbox", &[("delayq-stream", "jobs")]);
    assert_eq!(
        (
            group_field(&mut conn, "inbox", "entries-read"),
            group_field(&mut conn, "inbox", "lag")
        ),
        (redis::Value::Int(2), redis::Value::Int(1))
    );
}

/// As many entries added as one schedule call carries, then read in one marked read.
async fn largest_read(conn: &mut redis::Connection, reader: &mut InboxReader) -> InboxRead {
    let mut pipe = redis::pipe();
    for _ in 0..MAX_PER_CALL {
        pipe.cmd("XADD")
            .arg("inbox")
            .arg("*")
            .arg("delayq-stream")
            .arg("jobs")
            .arg("delayq-delay")
            .arg("60000")
            .arg("n")
            .arg(1)
            .ignore();
    }
    let () = pipe.query(conn).unwrap();
    let read = reader
        .next_marked(MAX_PER_CALL, Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(read.entries.len(), MAX_PER_CALL);
    read
}

/// The largest marked read (as many entries as one schedule call carries): read,
/// stored whole and settled; and read, released, every entry pending on its own
/// (`XCLAIM` in chunks) and taken over once idle.
#[tokio::test]
async fn the_largest_marked_read_is_settled_or_released_whole() {
    let (bare, queue, mut reader) = with_reader().await;
    let mut other = bare.store.inbox_reader(&queue, "n1").await.unwrap();
    let mut conn = bare.redis.client();
    let mut case = Case {
        bare: &bare,
        queue: queue.clone(),
        readers: Vec::new(),
        open: Vec::new(),
        tally: Tally::default(),
    };
    let read = largest_read(&mut conn, &mut reader).await;
    case.store(&read.entries, read.marked.as_deref()).await;
    assert_eq!(case.tally.stored.len(), MAX_PER_CALL);
    assert_eq!(pending_entries(&mut conn, "inbox", GROUP, None), vec![]);
    assert_eq!(entries(&mut conn, "inbox").len(), 0, "settled and trimmed");

    let read = largest_read(&mut conn, &mut reader).await;
    let marked = read.marked.as_deref().unwrap();
    assert_eq!(
        pending_entries(&mut conn, "inbox", GROUP, None).len(),
        2,
        "its two ends"
    );
    let stats = bare.store.inbox_stats(&queue).await.unwrap();
    assert_eq!(stats.pending, MAX_PER_CALL as u64, "counted as its entries");
    let (_, taken) = other
        .reclaim(Duration::from_secs(3600), 100, "-")
        .await
        .unwrap();
    assert!(
        taken.is_empty(),
        "a read younger than the idle time stays its reader's"
    );
    let ids = bare
        .store
        .release_inbox_read(&queue, marked, "n0", 0, Duration::ZERO)
        .await
        .unwrap();
    let read_ids: Vec<String> = read.entries.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids, read_ids);
    let pending = pending_entries(&mut conn, "inbox", GROUP, Some("n0"));
    assert_eq!(pending.len(), MAX_PER_CALL);
    assert!(
        pending.iter().all(|(_, times)| *times == 1),
        "handed out once each"
    );
    let (next, taken) = other
        .reclaim(Duration::ZERO, MAX_PER_CALL, "-")
        .await
        .unwrap();
    assert_eq!(taken.len(), MAX_PER_CALL);
    assert_eq!(next, "(".to_owned() + &read_ids[MAX_PER_CALL - 1]);
    case.store(&taken, None).await;
    assert_eq!(case.tally.stored.len(), 2 * MAX_PER_CALL);
    assert_eq!(pending_entries(&mut conn, "inbox", GROUP, None), vec![]);
}

/// At `maxmemory` Redis refuses `XGROUP CREATECONSUMER`, while reads, claims and the
/// take's script still run: the check for older readers goes on without the
/// reader's `<name>@`, and a read is taken marked and released as at any time (the
/// daemon's inbox loop failed on the check until memory was freed, and read
/// nothing).
#[tokio::test]
async fn at_maxmemory_a_reader_still_reads_marked() {
    let (bare, queue, mut reader) = with_reader().await;
    let mut conn = bare.redis.client();
    let added: Vec<String> = (0..3)
        .map(|_| xadd(&mut conn, "inbox", &[("delayq-stream", "jobs")]))
        .collect();
    redis_config(&mut conn, "maxmemory", "1");
    assert!(!reader.older_readers().await.unwrap(), "no older reader");
    let read = reader
        .next_marked(10, Duration::from_millis(1))
        .await
        .unwrap();
    let marked = read.marked.expect("read marked");
    let ids = bare
        .store
        .release_inbox_read(&queue, &marked, "n0", 0, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(ids, added);
    let pending = pending_entries(&mut conn, "inbox", GROUP, Some("n0"));
    assert_eq!(
        pending,
        added.iter().map(|id| (id.clone(), 1)).collect::<Vec<_>>(),
        "each handed out once"
    );
    redis_config(&mut conn, "maxmemory", "0");
}
