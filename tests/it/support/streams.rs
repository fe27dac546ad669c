//! Redis streams as producers and consumers see them, over a plain synchronous
//! connection: entries with their field order kept, consumer groups, pending
//! entries; and the few server settings tests change.

use redis::{ToRedisArgs, Value};

/// A stream entry: id and fields, in the order they were written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: String,
    pub fields: Vec<(String, String)>,
}

impl Entry {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Milliseconds part of the entry id: when Redis wrote it.
    pub fn ms(&self) -> u64 {
        self.id.split('-').next().unwrap().parse().unwrap()
    }

    /// The producer's fields: everything but those delayq adds (`delayq-*`).
    pub fn producer_fields(&self) -> Vec<(String, String)> {
        self.fields
            .iter()
            .filter(|(k, _)| !k.starts_with("delayq-"))
            .cloned()
            .collect()
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

/// An entry as XRANGE and XREADGROUP answer it: `[id, [field, value, ...]]`.
pub fn entry(item: &Value) -> Entry {
    let Value::Array(parts) = item else {
        panic!("entry: {item:?}")
    };
    let Value::Array(kv) = &parts[1] else {
        panic!("fields: {parts:?}")
    };
    Entry {
        id: text(&parts[0]),
        fields: kv.chunks(2).map(|p| (text(&p[0]), text(&p[1]))).collect(),
    }
}

/// Every entry of a stream, in order, with field order kept.
pub fn entries(conn: &mut impl redis::ConnectionLike, stream: &str) -> Vec<Entry> {
    try_entries(conn, stream).expect("XRANGE")
}

/// [`entries`], with Redis's error returned, for a connection that may be cut
/// (Sentinel kills the clients of a node it reconfigures).
pub fn try_entries(
    conn: &mut impl redis::ConnectionLike,
    stream: &str,
) -> redis::RedisResult<Vec<Entry>> {
    let mut out = Vec::new();
    let mut start = "-".to_owned();
    loop {
        let reply: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(10_000)
            .query(conn)?;
        let Value::Array(items) = reply else {
            panic!("XRANGE reply")
        };
        if items.is_empty() {
            return Ok(out);
        }
        for item in &items {
            let e = entry(item);
            start = format!("({}", e.id);
            out.push(e);
        }
        // A short page is the last (and an exclusive start past the largest id there
        // is would be refused).
        if items.len() < 10_000 {
            return Ok(out);
        }
    }
}

/// XADD of `fields`, in order; the new entry's id.
pub fn xadd<K: ToRedisArgs, V: ToRedisArgs>(
    conn: &mut impl redis::ConnectionLike,
    stream: &str,
    fields: &[(K, V)],
) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (k, v) in fields {
        cmd.arg(k).arg(v);
    }
    cmd.query(conn).expect("XADD")
}

pub fn xlen(conn: &mut impl redis::ConnectionLike, stream: &str) -> usize {
    redis::cmd("XLEN").arg(stream).query(conn).expect("XLEN")
}

/// Creates `group` on `stream` (and the stream), reading from its first entry.
pub fn create_group(conn: &mut impl redis::ConnectionLike, stream: &str, group: &str) {
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query(conn)
        .expect("XGROUP CREATE");
}

/// XREADGROUP `>` as `consumer`: every entry never handed to the group before,
/// without blocking.
pub fn read_group(
    conn: &mut impl redis::ConnectionLike,
    stream: &str,
    group: &str,
    consumer: &str,
) -> Vec<Entry> {
    let mut out = Vec::new();
    loop {
        let read = read_group_up_to(conn, stream, group, consumer, 10_000);
        if read.is_empty() {
            return out;
        }
        out.extend(read);
    }
}

/// One XREADGROUP `>` as `consumer`: up to `count` entries never handed to the group
/// before, without blocking.
pub fn read_group_up_to(
    conn: &mut impl redis::ConnectionLike,
    stream: &str,
    group: &str,
    consumer: &str,
    count: usize,
) -> Vec<Entry> {
    let reply: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query(conn)
        .expect("XREADGROUP");
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for s in streams {
        let Value::Array(parts) = s else {
            panic!("stream: {s:?}")
        };
        let Value::Array(items) = &parts[1] else {
            panic!("entries: {parts:?}")
        };
        out.extend(items.iter().map(entry));
    }
    out
}

/// Reads through the group the entries the stream holds now, not those added while
/// it reads (a sweep redelivering what an earlier read left pending, say): one
/// XREADGROUP of as many entries as XLEN counted, the oldest the group has not had.
pub fn read_group_present(
    conn: &mut impl redis::ConnectionLike,
    stream: &str,
    group: &str,
    consumer: &str,
) -> usize {
    let len: usize = redis::cmd("XLEN").arg(stream).query(conn).expect("XLEN");
    if len == 0 {
        return 0;
    }
    let reply: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(len)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query(conn)
        .expect("XREADGROUP");
    match reply {
        Value::Array(streams) => streams
            .iter()
            .map(|s| match s {
                Value::Array(parts) => match &parts[1] {
                    Value::Array(items) => items.len(),
                    other => panic!("entries: {other:?}"),
                },
                other => panic!("stream: {other:?}"),
            })
            .sum(),
        _ => 0,
    }
}

pub fn ack(conn: &mut impl redis::ConnectionLike, stream: &str, group: &str, entry: &str) {
    let _: u64 = redis::cmd("XACK")
        .arg(stream)
        .arg(group)
        .arg(entry)
        .query(conn)
        .expect("XACK");
}

/// XCLAIM of a pending entry to `consumer`, which resets its idle time.
pub fn claim(
    conn: &mut impl redis::ConnectionLike,
    stream: &str,
    group: &str,
    consumer: &str,
    entry: &str,
) {
    let _: Value = redis::cmd("XCLAIM")
        .arg(stream)
        .arg(group)
        .arg(consumer)
        .arg(0)
        .arg(entry)
        .query(conn)
        .expect("XCLAIM");
}

/// How many entries the group holds pending; None when there is no such group.
pub fn pending_count(
    conn: &mut impl redis::ConnectionLike,
    stream: &str,
    group: &str,
) -> Option<u64> {
    let reply: Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query(conn)
        .ok()?;
    match reply {
        Value::Array(items) => match items.first() {
            Some(Value::Int(n)) => Some(*n as u64),
            other => panic!("XPENDING count: {other:?}"),
        },
        other => panic!("XPENDING: {other:?}"),
    }
}

/// Entry ids pending in the group (for `consumer` alone when given), oldest first,
/// with how many times each was handed out.
pub fn pending_entries(
    conn: &mut impl redis::ConnectionLike,
    stream: &str,
    group: &str,
    consumer: Option<&str>,
) -> Vec<(String, u64)> {
    let mut cmd = redis::cmd("XPENDING");
    cmd.arg(stream).arg(group).arg("-").arg("+").arg(10_000);
    if let Some(consumer) = consumer {
        cmd.arg(consumer);
    }
    let Ok(Value::Array(items)) = cmd.query(conn) else {
        return Vec::new();
    };
    items
        .iter()
        .map(|i| match i {
            Value::Array(p) => match &p[3] {
                Value::Int(times) => (text(&p[0]), *times as u64),
                other => panic!("pending item {other:?}"),
            },
            other => panic!("pending item {other:?}"),
        })
        .collect()
}

/// Entry ids pending in the group, oldest first.
pub fn pending_ids(
    conn: &mut impl redis::ConnectionLike,
    stream: &str,
    group: &str,
) -> Vec<String> {
    pending_entries(conn, stream, group, None)
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// Redis's clock (`TIME`), in ms.
pub fn redis_now_ms(conn: &mut impl redis::ConnectionLike) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    secs * 1000 + micros / 1000
}

/// `CONFIG SET key value` on a test's Redis.
pub fn redis_config(conn: &mut impl redis::ConnectionLike, key: &str, value: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(key)
        .arg(value)
        .query(conn)
        .unwrap_or_else(|e| panic!("CONFIG SET {key} {value}: {e}"));
}

/// Redis's `used_memory` (INFO memory), bytes.
pub fn used_memory(conn: &mut impl redis::ConnectionLike) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// Calls of `command` (lower case, as `INFO commandstats` names it) Redis has run.
pub fn calls_of(conn: &mut impl redis::ConnectionLike, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let line = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Script calls Redis has run so far (FCALL, EVALSHA and EVAL).
pub fn script_calls(conn: &mut impl redis::ConnectionLike) -> u64 {
    ["fcall", "evalsha", "eval"]
        .iter()
        .map(|c| calls_of(conn, c))
        .sum()
}

/// The names of the function libraries Redis holds (`FUNCTION LIST`).
pub fn libraries(conn: &mut impl redis::ConnectionLike) -> Vec<String> {
    let list: Vec<std::collections::HashMap<String, redis::Value>> =
        redis::cmd("FUNCTION").arg("LIST").query(conn).unwrap();
    list.iter()
        .filter_map(|l| redis::from_redis_value_ref(l.get("library_name")?).ok())
        .collect()
}

/// Makes Redis full: `noeviction`, `maxmemory` `headroom` bytes over what it uses,
/// then a filler key (`filler`) grown until writes answer `OOM`.
pub fn fill_to_maxmemory(conn: &mut impl redis::ConnectionLike, headroom: u64) {
    redis_config(conn, "maxmemory-policy", "noeviction");
    let used = used_memory(conn);
    redis_config(conn, "maxmemory", &(used + headroom).to_string());
    let chunk = "f".repeat(64 << 10);
    for _ in 0..10_000 {
        match redis::cmd("APPEND")
            .arg("filler")
            .arg(&chunk)
            .query::<u64>(conn)
        {
            Ok(_) => {}
            Err(e) if e.to_string().contains("OOM") => return,
            Err(e) => panic!("APPEND: {e}"),
        }
    }
    panic!("writes never answered OOM");
}

/// The keys of a shard's compact pending buckets (`<buckets>:<floor>`), in order.
pub fn compact_buckets(
    conn: &mut redis::Connection,
    shard: &delayq_client::store::ShardKeys,
) -> Vec<Vec<u8>> {
    let buckets = shard.buckets();
    let floors: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(&buckets)
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap();
    floors
        .into_iter()
        .map(|floor| {
            let mut key = format!("{buckets}:").into_bytes();
            key.extend_from_slice(&floor);
            key
        })
        .collect()
}

/// How many clients Redis holds blocked (reads waiting in `XREADGROUP … BLOCK`).
pub fn blocked_clients(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("clients").query(conn).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("blocked_clients in INFO clients")
}
