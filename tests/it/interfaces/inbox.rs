//! The inbox: producers XADD delayed sends into a stream; every instance schedules
//! them once, rejects malformed ones with a reason, and takes over what a dead
//! instance left unacknowledged.

use std::time::Duration;

use delayq_client::store::{BatchItem, EntryFields, InboxAck, InboxEntry, ScheduleMode, Scheduled};
use delayq_harness::DelayqProcess;

use crate::support::{
    Deliveries, Entry, Env, Tally, create_group, delayq_bin, entries, eventually, never,
    pending_count, read_group, value, xadd, xlen,
};

const INBOX: &str = "delayq:inbox";
const REJECTED: &str = "delayq:inbox:rejected";

/// Entries pending in the inbox's group.
fn inbox_pending(conn: &mut redis::Connection) -> u64 {
    pending_count(conn, INBOX, "delayq").expect("the inbox group")
}

async fn wait_for_entries(conn: &mut redis::Connection, stream: &str, n: usize) -> Vec<Entry> {
    eventually(
        Duration::from_secs(20),
        &format!("{n} entries in {stream}"),
        || {
            let found = entries(conn, stream);
            async move { (found.len() >= n).then_some(found) }
        },
    )
    .await
}

#[tokio::test]
async fn inbox_entries_are_scheduled_once_and_delivered_verbatim() {
    let env = Env::start("").await;
    let mut conn = env.redis.client();
    let now = env.store.now_ms().await.unwrap();
    let past = (now - 1000).to_string();
    let first = xadd(
        &mut conn,
        INBOX,
        &[
            ("delayq-stream", "orders"),
            ("delayq-delay", "100"),
            ("a", "1"),
            ("b", "2"),
        ],
    );
    let second = xadd(
        &mut conn,
        INBOX,
        &[
            ("c", "3"),
            ("delayq-at", &past),
            ("delayq-stream", "orders"),
        ],
    );
    // A producer retrying with its own id: one message.
    for _ in 0..2 {
        xadd(
            &mut conn,
            INBOX,
            &[
                ("delayq-stream", "orders"),
                ("delayq-delay", "50ms"),
                ("delayq-id", "order-9"),
                ("d", "4"),
            ],
        );
    }
    let later = xadd(
        &mut conn,
        INBOX,
        &[
            ("delayq-stream", "orders"),
            ("delayq-delay", "1h"),
            ("delayq-priority", "5"),
            ("delayq-ttl", "10m"),
            ("e", "5"),
        ],
    );

    let (tally, delivered) = Deliveries::new(&env.redis.url(), &["orders"])
        .exactly_once(
            [first.as_str(), second.as_str(), "order-9"],
            Duration::from_secs(20),
        )
        .await;
    tally.assert_exact("three messages from five inbox entries");
    let by_id = |id: &str| {
        delivered
            .iter()
            .find(|e| e.get("delayq-id") == Some(id))
            .unwrap_or_else(|| panic!("{id} delivered: {delivered:?}"))
            .clone()
    };
    let pairs = |e: &Entry| {
        e.fields
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        pairs(&by_id(&first)),
        [
            "a=1".to_string(),
            "b=2".to_string(),
            format!("delayq-id={first}"),
            "delayq-attempt=1".to_string()
        ]
    );
    assert_eq!(pairs(&by_id(&second))[0], "c=3");
    assert_eq!(pairs(&by_id("order-9"))[0], "d=4");

    // Still scheduled, under the inbox entry id, with its options.
    let (status, got) = env.api.get(&format!("/v1/messages/{later}")).await;
    assert_eq!(
        (status, got["state"].as_str(), got["priority"].as_u64()),
        (200, Some("scheduled"), Some(5)),
        "{got}"
    );
    assert_eq!(
        got["expires_at"].as_u64().unwrap() - got["deliver_at"].as_u64().unwrap(),
        600_000
    );

    // Every entry left the inbox, acknowledged; nothing was rejected.
    eventually(Duration::from_secs(5), "inbox drained", || {
        let done = xlen(&mut conn, INBOX) == 0 && inbox_pending(&mut conn) == 0;
        async move { done.then_some(()) }
    })
    .await;
    assert_eq!(xlen(&mut conn, REJECTED), 0);
    // Read marked: each read's entries handed out together, its consumer gone with it.
    let text = env.api.metrics().await.expect("metrics");
    let reads = |way: &str| value(&text, &format!("delayq_inbox_reads_total{{way=\"{way}\"}}"));
    assert!(reads("marked").unwrap_or(0.0) >= 1.0, "{text}");
    assert_eq!(reads("entries"), Some(0.0), "{text}");
}

#[tokio::test]
async fn malformed_inbox_entries_are_rejected_with_reason_and_original_fields() {
    let env = Env::start(
        "[streams]\nallow = [\"orders*\"]\n[api]\nlisten = \"127.0.0.1:0\"\nmax_delay = \"1h\"\n",
    )
    .await;
    let mut conn = env.redis.client();
    let far = (env.store.now_ms().await.unwrap() + 3 * 3_600_000).to_string();
    #[rustfmt::skip]
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("a", "1")], "delayq-stream: required"),
        (&[("delayq-stream", "orders"), ("a", "1")], "delayq-delay or delayq-at: required"),
        (&[("delayq-stream", "payroll"), ("delayq-delay", "1s"), ("a", "1")], "delayq-stream: stream \"payroll\": not allowed (allowed: orders*)"),
        (&[("delayq-stream", "orders"), ("delayq-delay", "-5"), ("a", "1")], "delayq-delay \"-5\": must not be negative"),
        (&[("delayq-stream", "orders"), ("delayq-delay", "2h"), ("a", "1")], "longer than api.max_delay 1h"),
        (&[("delayq-stream", "orders"), ("delayq-at", &far), ("a", "1")], "delayq-at: due time"),
        (&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-id", "a b"), ("a", "1")], "delayq-id: id \"a b\""),
        (&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-priority", "high"), ("a", "1")], "delayq-priority \"high\""),
        (&[("delayq-stream", "orders"), ("delayq-delay", "1s")], "no message fields"),
        (&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-prio", "1"), ("a", "1")], "delayq-prio: unknown reserved field"),
    ];
    let mut ids = Vec::new();
    for (fields, _) in cases {
        ids.push(xadd(&mut conn, INBOX, fields));
    }
    let good = xadd(
        &mut conn,
        INBOX,
        &[
            ("delayq-stream", "orders"),
            ("delayq-delay", "0"),
            ("ok", "yes"),
        ],
    );

    let rejected = wait_for_entries(&mut conn, REJECTED, cases.len()).await;
    assert_eq!(rejected.len(), cases.len());
    for ((fields, reason), id) in cases.iter().zip(&ids) {
        let r = rejected
            .iter()
            .find(|e| e.get("delayq-inbox-id") == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{id} rejected"));
        let why = r.get("delayq-reason").expect("reason");
        assert!(why.contains(reason), "{why:?} should contain {reason:?}");
        let original: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            r.fields[2..],
            original[..],
            "original fields kept, in order"
        );
    }
    let delivered = wait_for_entries(&mut conn, "orders", 1).await;
    assert_eq!(delivered[0].get("delayq-id"), Some(good.as_str()));
    eventually(Duration::from_secs(5), "inbox drained", || {
        let done = xlen(&mut conn, INBOX) == 0 && inbox_pending(&mut conn) == 0;
        async move { done.then_some(()) }
    })
    .await;
}

/// An instance that read entries and died before scheduling them: another takes them
/// over after `inbox.reclaim_after`. Handling an entry twice (the first instance
/// was only slow) schedules it once.
#[tokio::test]
async fn entries_left_unacknowledged_are_taken_over_and_scheduled_once() {
    let bare = crate::support::Bare::start("[inbox]\nreclaim_after = \"300ms\"\n").await;
    let mut conn = bare.redis.client();
    create_group(&mut conn, INBOX, "delayq");
    let ids: Vec<String> = (0..20)
        .map(|i| {
            xadd(
                &mut conn,
                INBOX,
                &[
                    ("delayq-stream", "jobs"),
                    ("delayq-delay", "0"),
                    ("n", &i.to_string()),
                ],
            )
        })
        .collect();
    // A consumer that reads everything and then dies.
    read_group(&mut conn, INBOX, "delayq", "ghost");
    assert_eq!(inbox_pending(&mut conn), 20);

    let daemon = delayq::start(bare.config.clone()).await.expect("start");
    let (tally, _) = Deliveries::new(&bare.redis.url(), &["jobs"])
        .exactly_once(&ids, Duration::from_secs(20))
        .await;
    tally.assert_exact("taken over from a dead consumer");
    assert_eq!(inbox_pending(&mut conn), 0);

    // The dead consumer's copies handled again: every one a duplicate, nothing new.
    let items: Vec<BatchItem> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let entry = InboxEntry {
                id: id.clone(),
                fields: EntryFields::Read(vec![
                    (b"delayq-stream".to_vec(), b"jobs".to_vec()),
                    (b"delayq-delay".to_vec(), b"0".to_vec()),
                    (b"n".to_vec(), i.to_string().into_bytes()),
                ]),
            };
            BatchItem {
                msg: delayq::inbox::parse_entry(&entry, &bare.config).expect("valid"),
                mode: ScheduleMode::New,
                inbox_entry: Some(id.clone()),
            }
        })
        .collect();
    let ack = InboxAck {
        read: None,
        stream: INBOX,
        group: "delayq",
    };
    let outcomes = bare
        .store
        .schedule_many(&items, Duration::from_secs(60), Some(ack))
        .await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(Scheduled::Duplicate { .. }))),
        "{outcomes:?}"
    );
    never(Duration::from_millis(200), "a duplicate delivered", || {
        let len = xlen(&mut conn, "jobs");
        std::future::ready((len != 20).then_some(len))
    })
    .await;
    daemon.stop().await;
}

/// Entries `node` holds: pending for its own consumer, or the two ends of a marked
/// read of its (`<node>@<first>..<last>`), which hold the entries between.
fn held_by(conn: &mut redis::Connection, node: &str) -> usize {
    let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(INBOX)
        .arg("delayq")
        .arg("-")
        .arg("+")
        .arg(10_000)
        .query(conn)
        .unwrap_or_default();
    let read = format!("{node}@");
    pending
        .iter()
        .filter(|(_, consumer, ..)| *consumer == node || consumer.starts_with(&read))
        .count()
}

/// A real instance SIGKILLed while it holds inbox entries it read but had not
/// scheduled: another instance takes them over; every entry is delivered exactly once.
/// What it holds is mostly a marked read's two ends, whose whole range is taken over.
#[tokio::test]
async fn none_lost_when_an_instance_is_killed_mid_batch() {
    let bare = crate::support::Bare::start("").await;
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 4\n[inbox]\nbatch_size = 500\nreclaim_after = \"1s\"\n[log]\nlevel = \"warn\"\n",
        bare.redis.url()
    );
    let mut conn = bare.redis.client();
    const N: usize = 20_000;
    let mut a = DelayqProcess::start(&delayq_bin(), "node-a", &config).expect("start node-a");
    let mut pipe = redis::pipe();
    for i in 0..N {
        pipe.cmd("XADD")
            .arg(INBOX)
            .arg("*")
            .arg("delayq-stream")
            .arg("jobs")
            .arg("delayq-delay")
            .arg("0")
            .arg("n")
            .arg(i)
            .ignore();
        if i % 2000 == 1999 {
            let () = pipe.query(&mut conn).expect("XADD batch");
            pipe = redis::pipe();
        }
    }
    // Freeze node-a at a moment it holds entries it read and has not scheduled, then kill it.
    let mut held = 0;
    for _ in 0..2000 {
        a.signal(libc::SIGSTOP);
        held = held_by(&mut conn, "node-a");
        if held > 0 {
            break;
        }
        a.signal(libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(held > 0, "caught node-a holding unacknowledged entries");
    a.kill();

    let b = DelayqProcess::start(&delayq_bin(), "node-b", &config).expect("start node-b");
    eventually(Duration::from_secs(60), "every entry delivered", || {
        std::future::ready((xlen(&mut conn, "jobs") >= N).then_some(()))
    })
    .await;
    never(
        Duration::from_millis(300),
        "more deliveries than entries",
        || {
            let len = xlen(&mut conn, "jobs");
            std::future::ready((len > N).then_some(len))
        },
    )
    .await;
    let delivered = entries(&mut conn, "jobs");
    Tally::count(
        (0..N).map(|n| n.to_string()),
        delivered.iter().map(|e| e.get("n").unwrap_or("?")),
    )
    .assert_exact(&format!("by n; node-b log:\n{}", b.log()));
    assert_eq!((xlen(&mut conn, INBOX), inbox_pending(&mut conn)), (0, 0));
}

/// Two deployments on one Redis, told apart by `redis.prefix` alone: each reads
/// its own inbox with its own group, and the same message id pushed to both is a
/// message in each, delivered once by each to its own stream.
#[tokio::test]
async fn two_deployments_on_one_redis_keep_to_their_own_prefix() {
    let redis = delayq_harness::RedisServer::start().unwrap();
    let mut conn = redis.client();
    let nodes: Vec<DelayqProcess> = ["east", "west"]
        .iter()
        .map(|p| {
            let config = format!("[redis]\nurl = \"{}\"\nprefix = \"{p}\"\n", redis.url());
            DelayqProcess::start(&delayq_bin(), p, &config).unwrap()
        })
        .collect();
    for (node, prefix) in nodes.iter().zip(["east", "west"]) {
        let api = crate::support::Api::new(node.api);
        let body = serde_json::json!({"stream": format!("{prefix}-out"), "id": "same", "payload": "h", "delay": "10ms"});
        assert_eq!(api.post("/v1/messages", body).await.0, 201, "{prefix}");
        xadd(
            &mut conn,
            &format!("{prefix}:inbox"),
            &[
                ("delayq-stream", format!("{prefix}-out").as_str()),
                ("delayq-delay", "10ms"),
                ("delayq-id", "same-inbox"),
                ("from", prefix),
            ],
        );
    }
    for prefix in ["east", "west"] {
        let got = wait_for_entries(&mut conn, &format!("{prefix}-out"), 2).await;
        let ids: Vec<&str> = got.iter().filter_map(|e| e.get("delayq-id")).collect();
        let tally = Tally::count(["same", "same-inbox"], ids);
        assert!(tally.is_exact(), "{prefix}: {tally:?}");
        assert!(
            got.iter()
                .filter(|e| e.get("delayq-id") == Some("same-inbox"))
                .all(|e| e.get("from") == Some(prefix)),
            "{prefix}: {got:?}"
        );
        // Each inbox is read by its own deployment's group only, and nothing of
        // one deployment lies outside its prefix.
        let groups: Vec<Vec<redis::Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(format!("{prefix}:inbox"))
            .query(&mut conn)
            .unwrap();
        let names: Vec<String> = groups
            .iter()
            .map(|g| redis::from_redis_value(g[1].clone()).unwrap())
            .collect();
        assert_eq!(names, [prefix], "the groups on {prefix}:inbox");
    }
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    let strays: Vec<&String> = keys
        .iter()
        .filter(|k| {
            !["east", "west"].iter().any(|p| {
                k.starts_with(&format!("{p}:"))
                    || k.starts_with(&format!("{{{p}:"))
                    || k.as_str() == format!("{p}-out")
            })
        })
        .collect();
    assert!(strays.is_empty(), "keys outside both prefixes: {strays:?}");
    // Still exactly once after a while: neither deployment moved the other's.
    never(Duration::from_millis(500), "a second delivery", || {
        let n = xlen(&mut conn, "east-out") + xlen(&mut conn, "west-out");
        std::future::ready((n != 4).then_some(()))
    })
    .await;
}
