//! What a call's trim of the inbox takes (`inbox_entries.forget` in the prelude),
//! in Redis, over any interleaving of entries added, read by several consumers,
//! acknowledged in any order, kept (rejected unread) and let go: never an entry not
//! yet handed out, pending in the group or kept; and once nothing is pending or
//! kept, the next call leaves the inbox empty.

use std::collections::BTreeSet;

use proptest::prelude::*;
use redis::Value;

const INBOX: &str = "inbox";
const GROUP: &str = "g";
const KEPT: &str = "g:kept";

/// One step: add entries, hand some out to a consumer, acknowledge some pending
/// ones (picked by place, in the order given), keep one, or let one kept go.
#[derive(Clone, Debug)]
enum Step {
    Add(usize),
    Read(u8, usize),
    Ack(Vec<usize>),
    Keep(usize),
    LetGo(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1..12usize).prop_map(Step::Add),
        (0..3u8, 1..10usize).prop_map(|(c, n)| Step::Read(c, n)),
        proptest::collection::vec(0..64usize, 1..12).prop_map(Step::Ack),
        (0..64usize).prop_map(Step::Keep),
        (0..64usize).prop_map(Step::LetGo),
    ]
}

/// The ids a reply of stream entries or of `XPENDING` lists, each item's first.
fn firsts(reply: Value) -> Vec<String> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| match item {
            Value::Array(parts) => match parts.into_iter().next() {
                Some(Value::BulkString(id)) => Some(String::from_utf8(id).expect("an id")),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn pending(conn: &mut redis::Connection, group: &str) -> Vec<String> {
    let reply = redis::cmd("XPENDING")
        .arg(INBOX)
        .arg(group)
        .arg("-")
        .arg("+")
        .arg(10_000)
        .query(conn);
    reply.map(firsts).unwrap_or_default()
}

/// Adds an entry: its id.
fn add(conn: &mut redis::Connection) -> String {
    redis::cmd("XADD")
        .arg(INBOX)
        .arg("*")
        .arg("n")
        .arg(1)
        .query(conn)
        .unwrap()
}

/// Hands up to `count` entries out to `consumer`: their ids.
fn read(conn: &mut redis::Connection, consumer: &str, count: usize) -> Vec<String> {
    let reply: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(INBOX)
        .arg(">")
        .query(conn)
        .unwrap();
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    streams
        .into_iter()
        .filter_map(|s| match s {
            Value::Array(parts) => parts.into_iter().nth(1),
            _ => None,
        })
        .flat_map(firsts)
        .collect()
}

fn ack(conn: &mut redis::Connection, group: &str, id: &str) {
    let _: i64 = redis::cmd("XACK")
        .arg(INBOX)
        .arg(group)
        .arg(id)
        .query(conn)
        .unwrap();
}

#[test]
fn a_trim_takes_only_what_was_acknowledged_and_leaves_nothing_behind() {
    let (_redis, conn, sha) = super::scripts::prelude_lab(
        "local acks = {}
         for i = 2, #ARGV do acks[#acks + 1] = ARGV[i] end
         if #acks > 0 then redis.call('XACK', KEYS[1], ARGV[1], unpack(acks)) end
         inbox_entries.forget(KEYS[1], ARGV[1], acks)
         return 1",
    );
    let forget = |conn: &mut redis::Connection, acks: &[String]| {
        let _: i64 = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg(INBOX)
            .arg(GROUP)
            .arg(acks)
            .query(conn)
            .expect("forget");
    };
    let steps = proptest::collection::vec(step(), 1..40);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(64));
    runner
        .run(&steps, |steps| {
            let conn = &mut *conn.borrow_mut();
            let _: i64 = redis::cmd("DEL").arg(INBOX).query(conn).unwrap();
            let () = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(INBOX)
                .arg(GROUP)
                .arg("0")
                .arg("MKSTREAM")
                .query(conn)
                .unwrap();
            let mut added: Vec<String> = Vec::new();
            let mut delivered = BTreeSet::new();
            for step in steps {
                match step {
                    Step::Add(n) => added.extend((0..n).map(|_| add(conn))),
                    Step::Read(consumer, n) => {
                        delivered.extend(read(conn, &format!("c{consumer}"), n))
                    }
                    Step::Ack(picks) => {
                        let held = pending(conn, GROUP);
                        if held.is_empty() {
                            continue;
                        }
                        let mut acks: Vec<String> = Vec::new();
                        for p in picks {
                            let id = held[p % held.len()].clone();
                            if !acks.contains(&id) {
                                acks.push(id);
                            }
                        }
                        forget(conn, &acks);
                    }
                    Step::Keep(p) => {
                        let held = pending(conn, GROUP);
                        if held.is_empty() {
                            continue;
                        }
                        // As reject_inbox.lua keeps an entry rejected unread.
                        let id = &held[p % held.len()];
                        ack(conn, GROUP, id);
                        let _: redis::RedisResult<()> = redis::cmd("XGROUP")
                            .arg("CREATE")
                            .arg(INBOX)
                            .arg(KEPT)
                            .arg("$")
                            .query(conn);
                        let _: Value = redis::cmd("XCLAIM")
                            .arg(INBOX)
                            .arg(KEPT)
                            .arg("delayq")
                            .arg(0)
                            .arg(id)
                            .arg("FORCE")
                            .arg("JUSTID")
                            .query(conn)
                            .unwrap();
                    }
                    Step::LetGo(p) => {
                        let kept = pending(conn, KEPT);
                        if let Some(id) = kept.get(p % kept.len().max(1)) {
                            ack(conn, KEPT, id);
                        }
                    }
                }
                // Whatever is not yet handed out, pending or kept is still there.
                let present: BTreeSet<String> = firsts(
                    redis::cmd("XRANGE")
                        .arg(INBOX)
                        .arg("-")
                        .arg("+")
                        .query(conn)
                        .unwrap(),
                )
                .into_iter()
                .collect();
                let wanted = added
                    .iter()
                    .filter(|id| !delivered.contains(*id))
                    .chain(pending(conn, GROUP).iter())
                    .chain(pending(conn, KEPT).iter())
                    .cloned()
                    .collect::<BTreeSet<String>>();
                let lost: Vec<&String> = wanted.difference(&present).collect();
                prop_assert!(lost.is_empty(), "taken: {:?}", lost);
            }
            // Everything read, acknowledged and let go: the next call empties the inbox.
            add(conn);
            read(conn, "c0", 10_000);
            for id in pending(conn, KEPT) {
                ack(conn, KEPT, &id);
            }
            let held = pending(conn, GROUP);
            forget(conn, &held);
            let length: usize = redis::cmd("XLEN").arg(INBOX).query(conn).unwrap();
            prop_assert_eq!(length, 0, "entries left once nothing is wanted");
            Ok(())
        })
        .unwrap();
}
