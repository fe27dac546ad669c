//! Poison input is isolated, never retried forever: an inbox entry too large to copy,
//! one whose scheduling fails on its own, one handed out too often, one that cannot
//! be read (in the instance that read it, or in one that took it over), a rejected
//! stream out of ids, and a stale entry whose redelivery fails each leave the others
//! to be handled.

use std::collections::BTreeMap;
use std::time::Duration;

use delayq::inbox::MAX_ATTEMPTS;
use delayq_client::message::MessageId;
use redis::Value;
use serde_json::json;

use crate::support::{
    Bare, Cluster, Entry, Env, Tally, counter, create_group, entries, eventually, pending_count,
    pending_entries, read_group, redis_config, xadd, xlen,
};
use delayq_harness::Proxy;

const INBOX: &str = "delayq:inbox";
const GROUP: &str = "delayq";
const REJECTED: &str = "delayq:inbox:rejected";

/// An ordinary inbox entry for `orders`, due now, numbered `n`, with `extra` fields first.
fn ordinary(n: usize, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    fields.push(("delayq-stream".into(), "orders".into()));
    fields.push(("delayq-delay".into(), "0".into()));
    fields.push(("n".into(), n.to_string()));
    fields
}

/// Waits until a daemon's reader has made the inbox's group.
async fn inbox_group_made(redis: &delayq_harness::RedisServer) {
    eventually(Duration::from_secs(10), "the inbox group", || {
        let mut conn = redis.client();
        async move {
            let groups: Value = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(INBOX)
                .query(&mut conn)
                .ok()?;
            matches!(groups, Value::Array(ref g) if !g.is_empty()).then_some(())
        }
    })
    .await;
}

/// Makes the pending `entry` `consumer`'s, as if handed out `times` times already.
fn hand_out(conn: &mut redis::Connection, entry: &str, consumer: &str, times: u64) {
    let _: Value = redis::cmd("XCLAIM")
        .arg(INBOX)
        .arg(GROUP)
        .arg(consumer)
        .arg(0)
        .arg(entry)
        .arg("RETRYCOUNT")
        .arg(times)
        .arg("JUSTID")
        .query(conn)
        .expect("XCLAIM");
}

/// Adds `entries` to the inbox and hands them to `consumer` in one transaction, so
/// that no reader waiting for new entries sees them; returns their ids.
fn handed_out_unseen(
    conn: &mut redis::Connection,
    consumer: &str,
    entries: &[Vec<(String, String)>],
) -> Vec<String> {
    let mut pipe = redis::pipe();
    pipe.atomic();
    for fields in entries {
        let flat: Vec<&str> = fields.iter().flat_map(|(k, v)| [k.as_str(), v]).collect();
        pipe.cmd("XADD").arg(INBOX).arg("*").arg(flat);
    }
    pipe.cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("STREAMS")
        .arg(INBOX)
        .arg(">")
        .ignore();
    pipe.query(conn).expect("XADD, XREADGROUP")
}

/// Waits until the inbox holds nothing, pending or not, and nothing is left to
/// forward; then returns the deliveries to `orders` and the rejections by inbox
/// entry id.
async fn settled(env: &Env) -> (Vec<Entry>, BTreeMap<String, Entry>) {
    let mut conn = env.redis.client();
    eventually(
        Duration::from_secs(30),
        "inbox drained, nothing due",
        || {
            let drained = xlen(&mut conn, INBOX) == 0
                // No group yet: the daemon has not read the inbox.
                && pending_count(&mut conn, INBOX, GROUP) == Some(0);
            async move { (drained && env.scheduled().await == 0).then_some(()) }
        },
    )
    .await;
    let mut rejected = BTreeMap::new();
    for e in entries(&mut conn, REJECTED) {
        let id = e.get("delayq-inbox-id").expect("inbox id").to_owned();
        assert!(
            rejected.insert(id.clone(), e).is_none(),
            "{id} rejected twice"
        );
    }
    (entries(&mut conn, "orders"), rejected)
}

/// Each of `ns` delivered exactly once (by the field `n`), and nothing else.
#[track_caller]
fn assert_delivered_once(delivered: &[Entry], ns: impl Iterator<Item = usize>) {
    Tally::count(
        ns.map(|n| n.to_string()),
        delivered.iter().map(|e| e.get("n").expect("n")),
    )
    .assert_exact("deliveries by n");
}

#[track_caller]
fn assert_rejected(
    rejected: &BTreeMap<String, Entry>,
    id: &str,
    reason: &[&str],
    fields: &[(String, String)],
) {
    let r = rejected
        .get(id)
        .unwrap_or_else(|| panic!("{id} rejected: {rejected:?}"));
    let why = r.get("delayq-reason").expect("reason");
    for part in reason {
        assert!(why.contains(part), "{why:?} should mention {part:?}");
    }
    assert_eq!(&r.fields[2..], fields, "{id}: fields kept byte for byte");
}

/// Waits for inbox entry `id` to be rejected unread (handed out more than
/// [`MAX_ATTEMPTS`] times, no field copied), then checks that it is kept in the
/// inbox, acknowledged, with its field `kept` (name, value), and that the reader
/// goes on: a new entry is delivered once.
async fn rejected_unread_and_kept(
    redis: &delayq_harness::RedisServer,
    id: &str,
    (field, value): (&str, &str),
) {
    let rejection = eventually(Duration::from_secs(60), "the entry rejected", || {
        let mut conn = redis.client();
        async move { entries(&mut conn, REJECTED).into_iter().next() }
    })
    .await;
    assert_eq!(rejection.get("delayq-inbox-id"), Some(id));
    let reason = rejection.get("delayq-reason").expect("reason");
    let times = format!("handed out {} times", MAX_ATTEMPTS + 1);
    assert!(
        reason.contains(&times) && reason.contains("given up unread"),
        "{reason}"
    );
    assert_eq!(
        rejection.get(field),
        None,
        "no fields copied: {rejection:?}"
    );
    let mut conn = redis.client();
    assert_eq!(pending_count(&mut conn, INBOX, GROUP), Some(0));
    let kept = entries(&mut conn, INBOX);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!((kept[0].id.as_str(), kept[0].get(field)), (id, Some(value)));
    xadd(&mut conn, INBOX, &ordinary(1, &[]));
    eventually(Duration::from_secs(10), "the next entry delivered", || {
        let mut conn = redis.client();
        async move { (xlen(&mut conn, "orders") >= 1).then_some(()) }
    })
    .await;
    assert_delivered_once(&entries(&mut conn, "orders"), 1..2);
    assert_eq!(entries(&mut conn, REJECTED).len(), 1);
    // The next entry's acknowledgement trims the inbox: not past the kept one.
    eventually(
        Duration::from_secs(10),
        "the next entry gone from the inbox",
        || {
            let left = entries(&mut conn, INBOX);
            async move { (left.len() == 1).then_some(()) }
        },
    )
    .await;
    assert_eq!(entries(&mut conn, INBOX)[0].id, id);
    // The reason names the group the entry is kept in (the daemon's name for it
    // against the scripts'), and the command it gives lets it go.
    let kept_group = reason
        .split(&format!("XACK {INBOX} "))
        .nth(1)
        .and_then(|rest| rest.strip_suffix(&format!(" {id} lets it go)")))
        .unwrap_or_else(|| panic!("no XACK command in {reason}"));
    assert_eq!(pending_count(&mut conn, INBOX, kept_group), Some(1));
    let released: u64 = redis::cmd("XACK")
        .arg(INBOX)
        .arg(kept_group)
        .arg(id)
        .query(&mut conn)
        .expect("XACK");
    assert_eq!(released, 1);
    assert_eq!(pending_count(&mut conn, INBOX, kept_group), Some(0));
}

/// Adds `n` entries to the inbox in one pipeline (so that a reader takes them in one
/// batch), each bad (an unknown reserved field); returns their ids.
fn add_bad_together(conn: &mut redis::Connection, n: usize) -> Vec<String> {
    let mut pipe = redis::pipe();
    for n in 0..n {
        let fields: Vec<String> = ordinary(n, &[("delayq-dealy", "1s")])
            .into_iter()
            .flat_map(|(k, v)| [k, v])
            .collect();
        pipe.cmd("XADD").arg(INBOX).arg("*").arg(fields);
    }
    pipe.query(conn).expect("XADD")
}

/// A batch of the largest allowed size (`inbox.batch_size = 5000`) of entries that
/// are all bad goes to the rejected stream in full, each with its reason and fields,
/// and leaves the inbox (the rejection script acknowledges and deletes in chunks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_largest_batch_of_bad_entries_is_rejected_in_full() {
    const N: usize = 5000;
    let bare = Bare::start("[inbox]\nbatch_size = 5000\n").await;
    let mut conn = bare.redis.client();
    let ids = add_bad_together(&mut conn, N);
    let env = bare.daemon().await;

    let (delivered, rejected) = settled(&env).await;
    assert!(delivered.is_empty(), "{} delivered", delivered.len());
    assert_eq!(rejected.len(), N);
    for (n, id) in ids.iter().enumerate() {
        let mut fields = vec![("delayq-dealy".to_owned(), "1s".to_owned())];
        fields.extend(ordinary(n, &[]));
        assert_rejected(
            &rejected,
            id,
            &["delayq-dealy: unknown reserved field"],
            &fields,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_too_large_to_copy_is_rejected_alone_without_its_fields() {
    let bare = Bare::start("").await;
    let mut conn = bare.redis.client();
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(xadd(&mut conn, INBOX, &ordinary(n, &[])));
    }
    let mut huge = ordinary(999, &[]);
    huge.extend((0..5000).map(|i| (format!("f{i}"), format!("v{i}"))));
    let huge_id = xadd(&mut conn, INBOX, &huge);
    for n in 20..40 {
        ids.push(xadd(&mut conn, INBOX, &ordinary(n, &[])));
    }
    let env = bare.daemon().await;

    let (delivered, rejected) = settled(&env).await;
    assert_delivered_once(&delivered, 0..40);
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_rejected(
        &rejected,
        &huge_id,
        &[
            "5001 pairs is more than the 1000 allowed",
            "too large to copy",
            "5003 field/value pairs",
        ],
        &[],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_fails_to_schedule_on_its_own_is_isolated_from_its_batch() {
    let bare = Bare::start("").await;
    let mut conn = bare.redis.client();
    let shards = bare.store.shards();
    let shard = MessageId::parse("poison").unwrap().shard(shards);
    // A record Redis cannot read makes every schedule call carrying this id fail.
    let () = redis::cmd("HSET")
        .arg(bare.store.keys().shard(shard).records)
        .arg("poison")
        .arg("not a record")
        .query(&mut conn)
        .unwrap();
    // Batch-mates in the same shard share its script call; others are in other calls.
    let same_shard: Vec<String> = (0..)
        .map(|i| format!("mate-{i}"))
        .filter(|id| MessageId::parse(id).unwrap().shard(shards) == shard)
        .take(10)
        .collect();
    let mut poison_id = String::new();
    for (n, id) in same_shard.iter().enumerate() {
        if n == 5 {
            poison_id = xadd(&mut conn, INBOX, &ordinary(100, &[("delayq-id", "poison")]));
        }
        xadd(&mut conn, INBOX, &ordinary(n, &[("delayq-id", id)]));
    }
    for n in 10..15 {
        xadd(&mut conn, INBOX, &ordinary(n, &[]));
    }
    let env = bare.daemon().await;
    let (delivered, rejected) = settled(&env).await;
    assert_delivered_once(&delivered, 0..15);
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_rejected(
        &rejected,
        &poison_id,
        &["cannot be scheduled"],
        &ordinary(100, &[("delayq-id", "poison")]),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_handed_out_too_often_is_rejected_untried() {
    let bare = Bare::start("[inbox]\nreclaim_after = \"100ms\"\n").await;
    let mut conn = bare.redis.client();
    let node = bare.config.node_id.clone();
    create_group(&mut conn, INBOX, GROUP);
    let own = xadd(&mut conn, INBOX, &ordinary(0, &[]));
    let others = xadd(&mut conn, INBOX, &ordinary(1, &[]));
    let last_own = xadd(&mut conn, INBOX, &ordinary(2, &[]));
    let last_others = xadd(&mut conn, INBOX, &ordinary(3, &[]));
    read_group(&mut conn, INBOX, GROUP, "ghost");
    // Handed out MAX_ATTEMPTS times already: the next read is one too many, whether
    // this instance reads its own leftovers or takes over another's.
    hand_out(&mut conn, &own, &node, MAX_ATTEMPTS);
    hand_out(&mut conn, &others, "ghost", MAX_ATTEMPTS);
    // One attempt left: scheduled.
    hand_out(&mut conn, &last_own, &node, MAX_ATTEMPTS - 1);
    hand_out(&mut conn, &last_others, "ghost", MAX_ATTEMPTS - 1);
    let fresh = xadd(&mut conn, INBOX, &ordinary(4, &[]));
    let env = bare.daemon().await;

    let (delivered, rejected) = settled(&env).await;
    assert_delivered_once(&delivered, 2..5);
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    let times = format!("handed out {} times", MAX_ATTEMPTS + 1);
    assert_rejected(&rejected, &own, &[&times, "given up"], &ordinary(0, &[]));
    assert_rejected(&rejected, &others, &[&times, "given up"], &ordinary(1, &[]));
    assert!(!rejected.contains_key(&fresh));
}

/// A rejected stream that runs out of ids part way through a call (its last id set
/// near the largest there is) takes none of the call's rejections: the rejections
/// go one at a time, the entry that fits is rejected and leaves the inbox, the other
/// stays pending; once the stream is mended (renamed away) that one is rejected too,
/// and no entry is rejected twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_stream_running_out_of_ids_rejects_no_entry_twice() {
    const ARCHIVE: &str = "rejected-archive";
    let bare = Bare::start("[inbox]\nreclaim_after = \"500ms\"\n").await;
    let mut conn = bare.redis.client();
    // One id left after this one.
    let _: String = redis::cmd("XADD")
        .arg(REJECTED)
        .arg("18446744073709551615-18446744073709551614")
        .arg("seed")
        .arg("1")
        .query(&mut conn)
        .unwrap();
    // Both bad, added together so that one call rejects them.
    let ids = add_bad_together(&mut conn, 2);
    let env = bare.daemon().await;
    let rejected_in = |conn: &mut redis::Connection, key: &str| -> Vec<String> {
        entries(conn, key)
            .iter()
            .filter_map(|e| e.get("delayq-inbox-id").map(str::to_owned))
            .collect()
    };
    eventually(Duration::from_secs(20), "one entry rejected", || {
        let mut conn = env.redis.client();
        async move {
            let one = rejected_in(&mut conn, REJECTED).len() == 1 && xlen(&mut conn, INBOX) == 1;
            one.then_some(())
        }
    })
    .await;
    let first = rejected_in(&mut conn, REJECTED);
    let left = entries(&mut conn, INBOX);
    assert_eq!(left.len(), 1);
    assert_ne!(first[0], left[0].id, "the entry rejected left the inbox");
    let () = redis::cmd("RENAME")
        .arg(REJECTED)
        .arg(ARCHIVE)
        .query(&mut conn)
        .unwrap();
    eventually(Duration::from_secs(30), "the other entry rejected", || {
        let mut conn = env.redis.client();
        async move {
            let done =
                xlen(&mut conn, INBOX) == 0 && pending_count(&mut conn, INBOX, GROUP) == Some(0);
            done.then_some(())
        }
    })
    .await;
    let mut all = rejected_in(&mut conn, ARCHIVE);
    all.extend(rejected_in(&mut conn, REJECTED));
    all.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(all, want, "each entry rejected exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_refusing_writes_costs_an_entry_no_attempt() {
    let env = Env::start("").await;
    let mut conn = env.redis.client();
    // The reader creates its group once it starts; Redis must not be full before that.
    inbox_group_made(&env.redis).await;
    // Entries added, then Redis over its memory limit at once (one transaction): the
    // reader reads them, and every script that would schedule them is refused (OOM).
    let mut pipe = redis::pipe();
    pipe.atomic();
    for n in 0..5 {
        pipe.cmd("XADD").arg(INBOX).arg("*").arg(
            ordinary(n, &[])
                .into_iter()
                .flat_map(|(k, v)| [k, v])
                .collect::<Vec<_>>(),
        );
    }
    pipe.cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .ignore();
    let ids: Vec<String> = pipe.query(&mut conn).expect("XADD, then maxmemory 1");
    eventually(Duration::from_secs(10), "three failed tries", || async {
        let text = env.api.metrics().await?;
        (counter(&text, "delayq_inbox_errors_total") >= 3.0).then_some(())
    })
    .await;
    // Retried as held, not read again: each still handed out once, none rejected.
    let pending = pending_entries(&mut conn, INBOX, GROUP, None);
    assert_eq!(pending.len(), ids.len(), "{pending:?}");
    for (entry, times) in &pending {
        assert_eq!(*times, 1, "{entry}: handed out once");
    }
    assert_eq!(xlen(&mut conn, REJECTED), 0);

    redis_config(&mut conn, "maxmemory", "0");
    let (delivered, rejected) = settled(&env).await;
    assert_delivered_once(&delivered, 0..5);
    assert!(rejected.is_empty(), "{rejected:?}");
}

/// A daemon logging in to Redis as ACL user `dq`, holding inbox entries numbered
/// `ns` for `orders`: pending for its consumer, handed out once, never seen by its
/// reader (which waits for new entries: they wait for its next life).
struct Held {
    env: Env,
    node: String,
    /// The ACL user's files.
    _dir: tempfile::TempDir,
}

impl Held {
    async fn start(ns: std::ops::Range<usize>) -> Held {
        let redis = delayq_harness::RedisServer::start().expect("start redis-server");
        let dir = tempfile::tempdir().unwrap();
        let extra = crate::support::acl_user(&redis, "dq", &["~*", "&*", "+@all"], dir.path());
        let bare = Bare::start_on(redis, &extra).await;
        let node = bare.config.node_id.clone();
        let env = bare.daemon().await;
        let mut conn = env.redis.client();
        // One entry through the inbox first: once it is delivered, the reader is past
        // its own leftovers and waits for new entries.
        xadd(
            &mut conn,
            INBOX,
            &[
                ("delayq-stream", "probe"),
                ("delayq-delay", "0"),
                ("n", "0"),
            ],
        );
        eventually(Duration::from_secs(10), "the probe delivered", || {
            let mut conn = env.redis.client();
            async move { (xlen(&mut conn, "probe") == 1).then_some(()) }
        })
        .await;
        let entries: Vec<_> = ns.clone().map(|n| ordinary(n, &[])).collect();
        handed_out_unseen(&mut conn, &node, &entries);
        let pending = pending_entries(&mut conn, INBOX, GROUP, None);
        assert_eq!(pending.len(), ns.len(), "{pending:?}");
        Held {
            env,
            node,
            _dir: dir,
        }
    }

    /// Changes what the daemon's ACL user may do.
    fn acl(&self, rule: &str) {
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("dq")
            .arg(rule)
            .query(&mut self.env.redis.client())
            .expect("ACL SETUSER");
    }

    /// Cuts every connection of the daemon's, ending its reader's life; returns
    /// once the test's own store (cut too) answers again.
    async fn cut(&self) {
        let _: Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("USER")
            .arg("dq")
            .query(&mut self.env.redis.client())
            .expect("CLIENT KILL");
        eventually(
            Duration::from_secs(10),
            "the test's store again",
            || async { self.env.store.pending_per_shard().await.ok() },
        )
        .await;
    }
}

/// A reader that fails again and again and starts over each time reads its own
/// entries again without using their attempts: entries with one attempt left,
/// pending for this instance, are still scheduled after several of the reader's
/// lives in a row ended right after they read them (here: `XPENDING` refused; under
/// load, a Redis that answers too late for the reader).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_starting_over_again_and_again_uses_no_attempt() {
    let held = Held::start(0..3).await;
    let env = &held.env;
    let mut conn = env.redis.client();
    for (entry, _) in &pending_entries(&mut conn, INBOX, GROUP, None) {
        hand_out(&mut conn, entry, &held.node, MAX_ATTEMPTS - 1);
    }
    // Every life of the reader from now on fails once it has read its own entries,
    // until XPENDING is allowed again.
    held.acl("-xpending");
    held.cut().await;
    eventually(Duration::from_secs(20), "five failed lives", || async {
        let text = env.api.metrics().await?;
        (counter(&text, "delayq_inbox_errors_total") >= 5.0).then_some(())
    })
    .await;
    held.acl("+xpending");
    let (delivered, rejected) = settled(env).await;
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_delivered_once(&delivered, 0..3);
}

/// An entry that cannot be read even on its own (here: `XRANGE` refused; in life,
/// one too large to read within `redis.timeout`) uses an attempt each time its
/// reading fails, and once given up is rejected unread, left in the inbox,
/// acknowledged and pending in the kept group, with its fields, through the trims
/// of later entries; the reader goes on with new entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_cannot_be_read_even_alone_is_rejected_unread_and_kept() {
    let held = Held::start(0..1).await;
    let env = &held.env;
    let mut conn = env.redis.client();
    let id = pending_entries(&mut conn, INBOX, GROUP, None)[0].0.clone();
    held.acl("-xrange");
    held.cut().await;
    // New entries after it are read with XREADGROUP, still allowed.
    rejected_unread_and_kept(&env.redis, &id, ("n", "0")).await;
}

/// An entry that no instance can read, left pending by one that died, is taken
/// over by another and given up there as in the instance that read it: the
/// take-over (`XAUTOCLAIM`, whose reply is lost) counts one hand-out, each of the
/// taker's later lives that fails to read it alone one more, and once handed out
/// more than five times it is rejected unread and kept in the inbox. Here n1
/// reaches Redis through a proxy that ends any connection about to carry the
/// entry's bytes (the command applied, its reply never read: a reply too large to
/// read within `redis.timeout`); n0 is killed, and the entry is then made pending
/// for n0's consumer, as if n0 had read it just before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_entry_left_by_a_dead_instance_is_taken_over_and_rejected_unread() {
    const MARKER: &str = "unreadable-c0ffee";
    let proxy = Proxy::start().await;
    let mut cluster = Cluster::start_via(2, 1, "[inbox]\nreclaim_after = \"1s\"\n", |i, url| {
        proxy.lead_to(url);
        if i == 1 {
            proxy.redis_url()
        } else {
            url.to_owned()
        }
    })
    .await;
    inbox_group_made(&cluster.redis).await;
    cluster.nodes[0].kill();
    proxy.end_replies_with(MARKER.as_bytes());
    let mut conn = cluster.redis.client();
    let blob = MARKER.repeat(100);
    let [id] = handed_out_unseen(&mut conn, "n0", &[ordinary(0, &[("blob", &blob)])])
        .try_into()
        .expect("one id");
    assert_eq!(
        pending_entries(&mut conn, INBOX, GROUP, Some("n0")),
        vec![(id.clone(), 1)]
    );
    rejected_unread_and_kept(&cluster.redis, &id, ("blob", &blob)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_goes_on_past_an_entry_it_cannot_dead_letter() {
    let env = Env::start(
        "[delivery]\ngroups = [\"g\"]\nack_timeout = \"300ms\"\nsweep_interval = \"50ms\"\nbackoff = \"50ms\"\nbackoff_max = \"50ms\"\nbackoff_jitter = 0.0\nmax_attempts = 2\n[delivery.streams.orders]\n",
    )
    .await;
    let mut conn = env.redis.client();
    create_group(&mut conn, "orders", "g");
    // The dead-letter key holds a string: dead-lettering fails, on every sweep.
    let () = redis::cmd("SET")
        .arg("orders:dead")
        .arg("not a stream")
        .query(&mut conn)
        .unwrap();
    let push = |id: &'static str| {
        let env = &env;
        async move {
            let (status, body) = env
                .api
                .post(
                    "/v1/messages",
                    json!({ "stream": "orders", "id": id, "fields": [["m", id]], "delay_ms": 0 }),
                )
                .await;
            assert_eq!(status, 201, "{body}");
        }
    };
    // A consumer that reads every delivery and never acknowledges one; answers
    // (message id, attempt) of every delivery so far.
    let read = |conn: &mut redis::Connection| {
        read_group(conn, "orders", "g", "c");
        entries(conn, "orders")
            .iter()
            .map(|e| {
                (
                    e.get("delayq-id").unwrap().to_owned(),
                    e.get("delayq-attempt").unwrap().to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    // `poison` reaches its last attempt first; its stale entry then comes first in
    // every sweep, and dead-lettering it fails.
    push("poison").await;
    eventually(Duration::from_secs(10), "poison delivered twice", || {
        let got = read(&mut conn);
        let twice = got.contains(&("poison".into(), "2".into()));
        async move { twice.then_some(()) }
    })
    .await;
    for id in ["a", "b", "c"] {
        push(id).await;
    }
    eventually(
        Duration::from_secs(10),
        "a, b and c redelivered despite poison",
        || {
            let got = read(&mut conn);
            let all = ["a", "b", "c"]
                .iter()
                .all(|id| got.contains(&(id.to_string(), "2".into())));
            async move { all.then_some(()) }
        },
    )
    .await;
    let metrics = env.api.metrics().await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("delayq_sweep_entries_total")
                && l.contains("outcome=\"failed\"")
                && !l.ends_with(" 0")),
        "{metrics}"
    );
    // The poisoned entry is still pending, tried again on each sweep; once the
    // dead-letter key is fixed it is dead-lettered, before the others (which reach
    // their last attempt after it).
    let () = redis::cmd("DEL")
        .arg("orders:dead")
        .query(&mut conn)
        .unwrap();
    let dead = eventually(Duration::from_secs(10), "poison dead-lettered", || {
        let dead = entries(&mut conn, "orders:dead");
        async move { (!dead.is_empty()).then_some(dead) }
    })
    .await;
    assert_eq!(dead[0].get("delayq-id"), Some("poison"), "{dead:?}");
}
