//! Every numeric setting at its minimum and at its maximum, through a real `delayq`
//! process and a real Redis: each message delivered exactly once, with its fields
//! verbatim, never before its due time, and on record. Bounds that cannot be
//! exercised whole in a test are checked for what they mean: `delayq check-config`
//! accepts each bound and refuses one step outside it, naming the key.

use std::collections::HashMap;
use std::time::Duration;

use delayq::harness::{DelayqProcess, RedisServer};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::support::{Entry, delayq_bin, entries, eventually, patience, redis_config, used_memory};

const INBOX: &str = "delayq:inbox";
const REJECTED: &str = "delayq:inbox:rejected";
const GROUP: &str = "g";

/// What a case pushes, and what it does after the first delivery.
#[derive(Clone, Copy, Debug)]
struct Workload {
    /// Messages pushed through `POST /v1/messages/batch`, all due at one instant.
    http: usize,
    /// Messages per batch request.
    chunk: usize,
    /// Messages XADDed to the inbox: half due at that instant, half after a delay.
    inbox: usize,
    /// Target streams the messages are spread over.
    streams: usize,
    /// Field/value pairs per message.
    fields: usize,
    /// Size of every message as the API counts it (stream name, field names and
    /// values), reached by padding the last value; 0 leaves values short.
    bytes: usize,
    /// After the first delivery every entry is read through a watched group and left
    /// unacknowledged: the sweep redelivers each once as attempt 2, or dead-letters
    /// it when `delivery.max_attempts` is 1.
    redeliver: bool,
    /// `records.retention` is tiny: the records must be forgotten after delivery,
    /// and nothing delivered again.
    forgotten: bool,
}

const W: Workload = Workload {
    http: 200,
    chunk: 100,
    inbox: 100,
    streams: 3,
    fields: 3,
    bytes: 0,
    redeliver: false,
    forgotten: false,
};

/// One message of a workload, and the earliest time it may arrive.
struct Planned {
    id: String,
    stream: String,
    fields: Vec<(String, String)>,
    /// Epoch ms before which it must not be in its stream (filled once pushed).
    due_ms: u64,
}

/// A config file: the given Redis, then `settings` (dotted key, TOML value) over it.
fn config_text(redis_url: &str, settings: &[(&str, &str)]) -> String {
    let mut table = toml::Table::new();
    set(&mut table, "redis.url", &format!("\"{redis_url}\""));
    for (key, value) in settings {
        set(&mut table, key, value);
    }
    toml::to_string(&table).expect("render config")
}

fn set(table: &mut toml::Table, key: &str, value: &str) {
    let mut parsed: toml::Table = format!("v = {value}")
        .parse()
        .unwrap_or_else(|e| panic!("{key} = {value}: {e}"));
    let value = parsed.remove("v").expect("value");
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().expect("key");
    let mut t = table;
    for part in parts {
        t = t
            .entry(part)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("a table");
    }
    t.insert(last.to_owned(), value);
}

fn setting<'a>(settings: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    settings
        .iter()
        .rev()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
}

fn redis_now_ms(conn: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    secs * 1000 + micros / 1000
}

/// Field/value pairs of message `i`: values with quotes, backslashes, a tab and
/// non-ASCII text, the last one padded so that the message is `bytes` long.
fn message_fields(i: usize, stream: &str, w: &Workload) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = (0..w.fields)
        .map(|j| (format!("f{j}"), format!("{i}/{j} \"q\" \\ \t ü ✓")))
        .collect();
    if w.bytes > 0 {
        let last = fields.len() - 1;
        fields[last].1 = format!("{i}:");
        let size: usize =
            stream.len() + fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        assert!(
            size <= w.bytes,
            "message {i} is {size} bytes before padding"
        );
        fields[last].1.push_str(&"x".repeat(w.bytes - size));
    }
    fields
}

fn push_body(m: &Planned, at_ms: u64) -> Value {
    let pairs: Vec<Value> = m.fields.iter().map(|(k, v)| json!([k, v])).collect();
    json!({ "stream": m.stream, "fields": pairs, "deliver_at": at_ms, "id": m.id })
}

/// A push that must be refused with a JSON 4xx whose detail mentions `part`.
async fn assert_refused_push(
    http: &reqwest::Client,
    url: &str,
    body: &Value,
    (what, part): (&str, &str),
) {
    let resp = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    let answer: Value = resp.json().await.unwrap_or(Value::Null);
    let detail = answer["detail"].as_str().unwrap_or_default();
    assert!(
        (400..500).contains(&status) && answer["error"].is_string() && detail.contains(part),
        "{what}: want a JSON 4xx naming {part:?}, got {status} {answer:.300}"
    );
}

/// Starts a Redis and a `delayq` process with `settings`, pushes `w`, waits for every
/// message, and checks exactly once, verbatim, never early and on record; then the
/// redelivery or record trimming the workload asks for.
async fn check_edge(settings: &[(&str, &str)], w: Workload) {
    let redis = RedisServer::start().expect("start redis-server");
    let mut conn = redis.client();
    let streams: Vec<String> = (0..w.streams).map(|s| format!("edge-{s}")).collect();

    let mut all: Vec<(&str, String)> = vec![("log.level", "\"warn\"".into())];
    if w.redeliver {
        for (k, v) in [
            ("delivery.groups", "[\"g\"]"),
            ("delivery.ack_timeout", "\"100ms\""),
            ("delivery.backoff", "\"10ms\""),
            ("delivery.backoff_max", "\"10ms\""),
            ("delivery.sweep_interval", "\"10ms\""),
        ] {
            all.push((k, v.into()));
        }
        for s in &streams {
            // The group exists before the first delivery, so it sees every entry.
            let () = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(s)
                .arg(GROUP)
                .arg("0")
                .arg("MKSTREAM")
                .query(&mut conn)
                .expect("XGROUP CREATE");
        }
    }
    let watched: Vec<String> = streams
        .iter()
        .map(|s| format!("delivery.streams.{s}"))
        .collect();
    if w.redeliver {
        for key in &watched {
            all.push((key.as_str(), "{}".into()));
        }
    }
    if w.forgotten {
        all.push(("records.retention", "\"0s\"".into()));
        all.push(("records.trim_interval", "\"100ms\"".into()));
    }
    all.extend(settings.iter().map(|(k, v)| (*k, v.to_string())));
    let all: Vec<(&str, &str)> = all.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let text = config_text(&redis.url(), &all);
    let node = DelayqProcess::start(&delayq_bin(), "edge", &text)
        .unwrap_or_else(|e| panic!("start delayq with\n{text}\n{e:#}"));
    let http = reqwest::Client::new();
    let ctx = |what: &str| format!("{what}\nconfig:\n{text}\ndelayq log:\n{}", node.log());

    let n = w.http + w.inbox;
    let mut planned: Vec<Planned> = (0..n)
        .map(|i| {
            let stream = streams[i % streams.len()].clone();
            Planned {
                id: format!("{}-{i}", if i < w.http { "h" } else { "i" }),
                fields: message_fields(i, &stream, &w),
                stream,
                due_ms: 0,
            }
        })
        .collect();
    let batch_url = node.url("/v1/messages/batch");
    // For pushes over a limit: refused for that limit alone, not for their due time.
    let far_ms = redis_now_ms(&mut conn) + 3_600_000;

    // One over each limit the case sits at is refused, as JSON.
    let one = &planned[0];
    if setting(settings, "api.max_batch") == Some(&w.chunk.to_string()) {
        let over = json!({ "messages": vec![push_body(one, far_ms); w.chunk + 1] });
        assert_refused_push(
            &http,
            &batch_url,
            &over,
            ("a batch one over api.max_batch", "api.max_batch"),
        )
        .await;
    }
    if setting(settings, "api.max_fields") == Some(&w.fields.to_string()) {
        let mut m = Planned {
            id: "over-fields".into(),
            stream: one.stream.clone(),
            fields: one.fields.clone(),
            due_ms: 0,
        };
        m.fields.push(("one-more".into(), "x".into()));
        let over = json!({ "messages": [push_body(&m, far_ms)] });
        let single = push_body(&m, far_ms);
        assert_refused_push(
            &http,
            &node.url("/v1/messages"),
            &single,
            ("a message one field over api.max_fields", "fields"),
        )
        .await;
        let resp: Value = http
            .post(&batch_url)
            .json(&over)
            .send()
            .await
            .expect("batch")
            .json()
            .await
            .expect("json");
        assert!(
            resp["failed"].as_u64() == Some(1)
                && resp["results"][0]["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("fields")),
            "{}",
            ctx(&format!("one field over in a batch: {resp:.300}"))
        );
    }
    if w.bytes > 0 && setting(settings, "api.max_message_bytes") == Some(&w.bytes.to_string()) {
        let mut m = Planned {
            id: "over-bytes".into(),
            stream: one.stream.clone(),
            fields: one.fields.clone(),
            due_ms: 0,
        };
        m.fields[0].1.push('x');
        assert_refused_push(
            &http,
            &node.url("/v1/messages"),
            &push_body(&m, far_ms),
            (
                "a message one byte over api.max_message_bytes",
                "max_message_bytes",
            ),
        )
        .await;
    }
    // Everything falls due at one instant, far enough ahead that every push lands
    // first (a debug build takes about a second per 10 MB of message).
    let bytes = (n * w.bytes) as u64;
    let lead_ms = (1000 + n as u64 / 5 + bytes / 10_000) * u64::from(patience());
    let at_ms = redis_now_ms(&mut conn) + lead_ms;
    for m in &mut planned {
        m.due_ms = at_ms;
    }

    // Over HTTP, in batches of `chunk`.
    let answers: Vec<(usize, u16, Value)> = futures::stream::iter(
        planned[..w.http].chunks(w.chunk).enumerate(),
    )
    .map(|(c, chunk)| {
        let body =
            json!({ "messages": chunk.iter().map(|m| push_body(m, at_ms)).collect::<Vec<_>>() });
        let (http, url) = (http.clone(), batch_url.clone());
        async move {
            let resp = http
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .expect("batch request");
            let status = resp.status().as_u16();
            (c, status, resp.json().await.unwrap_or(Value::Null))
        }
    })
    .buffer_unordered(4)
    .collect()
    .await;
    for (c, status, answer) in &answers {
        assert_eq!(
            *status,
            200,
            "{}",
            ctx(&format!("batch {c}: {answer:.500}"))
        );
        assert_eq!(
            answer["scheduled"].as_u64(),
            Some(w.chunk.min(w.http - c * w.chunk) as u64),
            "{}",
            ctx(&format!(
                "batch {c}: every item scheduled: {:.500}",
                answer.to_string()
            ))
        );
    }

    // Through the inbox: reserved fields first or last, at the instant or after a delay.
    let mut pipe = redis::pipe();
    for (k, m) in planned[w.http..].iter().enumerate() {
        pipe.cmd("XADD").arg(INBOX).arg("*");
        let mut reserved = vec![
            ("delayq-stream".to_owned(), m.stream.clone()),
            ("delayq-id".to_owned(), m.id.clone()),
        ];
        if k % 2 == 0 {
            reserved.push(("delayq-at".to_owned(), at_ms.to_string()));
        } else {
            reserved.push(("delayq-delay".to_owned(), lead_ms.to_string()));
        }
        let (first, last) = if k % 4 < 2 {
            (&reserved, &m.fields)
        } else {
            (&m.fields, &reserved)
        };
        for (f, v) in first.iter().chain(last.iter()) {
            pipe.arg(f).arg(v);
        }
    }
    let inbox_ids: Vec<String> = if w.inbox > 0 {
        pipe.query(&mut conn).expect("XADD to the inbox")
    } else {
        Vec::new()
    };
    for (k, inbox_id) in inbox_ids.iter().enumerate() {
        if k % 2 == 1 {
            // Scheduled no earlier than its XADD, by Redis's clock.
            let xadd_ms: u64 = inbox_id.split('-').next().unwrap().parse().unwrap();
            planned[w.http + k].due_ms = xadd_ms + lead_ms;
        }
    }

    let pushed_by = redis_now_ms(&mut conn);
    assert!(
        pushed_by < at_ms,
        "{}",
        ctx(&format!(
            "pushing took past the due instant ({pushed_by} >= {at_ms}): raise DELAYQ_TEST_PATIENCE"
        ))
    );

    // Every message arrives.
    let timeout =
        Duration::from_millis(lead_ms) + Duration::from_secs(10) + Duration::from_millis(n as u64);
    let total = |conn: &mut redis::Connection, suffix: &str| -> usize {
        streams
            .iter()
            .map(|s| {
                redis::cmd("XLEN")
                    .arg(format!("{s}{suffix}"))
                    .query::<usize>(conn)
                    .expect("XLEN")
            })
            .sum()
    };
    // Bounded from outside too, so that a timeout shows the daemon's log.
    let waited = tokio::time::timeout(
        timeout * patience(),
        eventually(
            timeout + Duration::from_secs(5),
            "every message delivered",
            || {
                let got = total(&mut conn, "");
                std::future::ready((got >= n).then_some(()))
            },
        ),
    )
    .await;
    if waited.is_err() {
        panic!(
            "{}",
            ctx(&format!(
                "{} of {n} messages delivered in {timeout:?}",
                total(&mut conn, "")
            ))
        );
    }
    let first = check_delivered(&mut conn, &streams, &planned, 1, &ctx);
    assert_eq!(
        redis::cmd("XLEN")
            .arg(REJECTED)
            .query::<usize>(&mut conn)
            .unwrap(),
        0,
        "{}",
        ctx("no inbox entry rejected")
    );

    if !w.forgotten {
        check_records(&http, &node, &planned, &first, "delivered", &ctx).await;
    }
    if w.forgotten {
        eventually(Duration::from_secs(10), "every record forgotten", || {
            let (http, node) = (&http, &node);
            let ids: Vec<&str> = planned.iter().map(|m| m.id.as_str()).collect();
            async move {
                let left = futures::stream::iter(ids)
                    .map(|id| async move {
                        http.get(node.url(&format!("/v1/messages/{id}")))
                            .send()
                            .await
                            .map(|r| r.status().as_u16())
                            .unwrap_or(0)
                    })
                    .buffer_unordered(32)
                    .filter(|s| std::future::ready(*s != 404))
                    .count()
                    .await;
                (left == 0).then_some(())
            }
        })
        .await;
    }

    if w.redeliver {
        // Read every entry through the group, acknowledge none.
        for s in &streams {
            let _: redis::Value = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(GROUP)
                .arg("c")
                .arg("COUNT")
                .arg(n + 1)
                .arg("STREAMS")
                .arg(s)
                .arg(">")
                .query(&mut conn)
                .expect("XREADGROUP");
        }
        let max_attempts: u32 =
            setting(settings, "delivery.max_attempts").map_or(10, |v| v.parse().unwrap());
        let (suffix, want_state) = if max_attempts == 1 {
            (":dead", "dead")
        } else {
            ("", "delivered")
        };
        let want = if max_attempts == 1 { n } else { 2 * n };
        eventually(
            timeout,
            &format!("every message {want_state} again"),
            || {
                let got = total(&mut conn, suffix);
                std::future::ready((got >= want).then_some(()))
            },
        )
        .await;
        let dead: Vec<String> = streams.iter().map(|s| format!("{s}{suffix}")).collect();
        let again = if max_attempts == 1 {
            check_dead(&mut conn, &dead, &planned, &ctx)
        } else {
            check_delivered(&mut conn, &streams, &planned, 2, &ctx)
        };
        check_records(&http, &node, &planned, &again, want_state, &ctx).await;
    }

    // Nothing more arrived meanwhile: still exactly once (twice with a redelivery).
    let redelivered = w.redeliver && setting(settings, "delivery.max_attempts") != Some("1");
    let want = if redelivered { 2 * n } else { n };
    assert_eq!(
        total(&mut conn, ""),
        want,
        "{}",
        ctx("nothing delivered again")
    );
    let health = http
        .get(node.url("/healthz"))
        .send()
        .await
        .map(|r| r.status().as_u16());
    assert_eq!(health.ok(), Some(200), "{}", ctx("the daemon is still up"));
}

/// Checks every planned message is in its stream exactly once as `attempt` (other
/// attempts ignored), verbatim and not early; returns id → entry id.
fn check_delivered(
    conn: &mut redis::Connection,
    streams: &[String],
    planned: &[Planned],
    attempt: u32,
    ctx: &dyn Fn(&str) -> String,
) -> HashMap<String, String> {
    let mut seen: HashMap<String, Vec<(String, Entry)>> = HashMap::new();
    for s in streams {
        for e in entries(conn, s) {
            let id = e
                .get("delayq-id")
                .unwrap_or_else(|| {
                    panic!("{}", ctx(&format!("entry without delayq-id in {s}: {e:?}")))
                })
                .to_owned();
            if e.get("delayq-attempt") == Some(&attempt.to_string()) {
                seen.entry(id).or_default().push((s.clone(), e));
            }
        }
    }
    let by_id: HashMap<&str, &Planned> = planned.iter().map(|m| (m.id.as_str(), m)).collect();
    let unknown: Vec<&String> = seen
        .keys()
        .filter(|id| !by_id.contains_key(id.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "{}",
        ctx(&format!(
            "{} unknown ids delivered, e.g. {:?}",
            unknown.len(),
            &unknown[..unknown.len().min(5)]
        ))
    );
    let mut lost = Vec::new();
    let mut doubled = Vec::new();
    let mut out = HashMap::new();
    for m in planned {
        match seen.get(&m.id).map(Vec::as_slice) {
            None | Some([]) => lost.push(m.id.as_str()),
            Some([(stream, e)]) => {
                assert_eq!(
                    stream,
                    &m.stream,
                    "{}",
                    ctx(&format!("{} in the wrong stream", m.id))
                );
                let mut want = m.fields.clone();
                want.push(("delayq-id".into(), m.id.clone()));
                want.push(("delayq-attempt".into(), attempt.to_string()));
                if e.fields != want {
                    let shown = |f: &[(String, String)]| format!("{:.300}", format!("{f:?}"));
                    panic!(
                        "{}",
                        ctx(&format!(
                            "{} not verbatim: got {} want {}",
                            m.id,
                            shown(&e.fields),
                            shown(&want)
                        ))
                    );
                }
                assert!(
                    e.ms() >= m.due_ms,
                    "{}",
                    ctx(&format!(
                        "{} (attempt {attempt}) delivered at {} before its due time {}",
                        m.id,
                        e.ms(),
                        m.due_ms
                    ))
                );
                out.insert(m.id.clone(), e.id.clone());
            }
            Some(many) => doubled.push((m.id.as_str(), many.len())),
        }
    }
    assert!(
        lost.is_empty() && doubled.is_empty(),
        "{}",
        ctx(&format!(
            "attempt {attempt}: {} lost (e.g. {:?}), {} delivered more than once (e.g. {:?})",
            lost.len(),
            &lost[..lost.len().min(5)],
            doubled.len(),
            &doubled[..doubled.len().min(5)]
        ))
    );
    out
}

/// Checks every planned message is in its dead-letter stream exactly once, for running
/// out of attempts; returns id → dead-letter entry id.
fn check_dead(
    conn: &mut redis::Connection,
    dead: &[String],
    planned: &[Planned],
    ctx: &dyn Fn(&str) -> String,
) -> HashMap<String, String> {
    let mut seen: HashMap<String, Vec<Entry>> = HashMap::new();
    for s in dead {
        for e in entries(conn, s) {
            seen.entry(e.get("delayq-id").unwrap_or_default().to_owned())
                .or_default()
                .push(e);
        }
    }
    let mut out = HashMap::new();
    for m in planned {
        let found = seen.get(&m.id).map(Vec::as_slice).unwrap_or_default();
        let [e] = found else {
            panic!(
                "{}",
                ctx(&format!("{} dead-lettered {} times", m.id, found.len()))
            );
        };
        assert_eq!(
            e.fields[..m.fields.len()],
            m.fields[..],
            "{}",
            ctx(&format!("{} dead letter keeps the fields", m.id))
        );
        assert_eq!(
            e.get("delayq-reason"),
            Some("max_attempts"),
            "{}",
            ctx(&m.id)
        );
        out.insert(m.id.clone(), e.id.clone());
    }
    out
}

/// `GET /v1/messages/{id}` of every planned message says `state`, with the entry id found.
async fn check_records(
    http: &reqwest::Client,
    node: &DelayqProcess,
    planned: &[Planned],
    entry_ids: &HashMap<String, String>,
    state: &str,
    ctx: &dyn Fn(&str) -> String,
) {
    let answers: Vec<(&str, u16, Value)> = futures::stream::iter(planned)
        .map(|m| async move {
            let resp = http
                .get(node.url(&format!("/v1/messages/{}", m.id)))
                .send()
                .await
                .expect("GET record");
            let status = resp.status().as_u16();
            (
                m.id.as_str(),
                status,
                resp.json().await.unwrap_or(Value::Null),
            )
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let wrong: Vec<String> = answers
        .iter()
        .filter(|(id, status, got)| {
            *status != 200
                || got["state"] != state
                || got["entry_id"].as_str() != entry_ids.get(*id).map(String::as_str)
        })
        .map(|(id, status, got)| format!("{id}: {status} {got} (entry {:?})", entry_ids.get(*id)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{}",
        ctx(&format!(
            "{} of {} not on record as {state}, e.g. {:?}",
            wrong.len(),
            planned.len(),
            &wrong[..wrong.len().min(3)]
        ))
    );
}

macro_rules! edges {
    ($($name:ident: [$(($key:literal, $value:literal)),* $(,)?], $workload:expr;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                check_edge(&[$(($key, $value)),*], $workload).await;
            }
        )*
    };
}

edges! {
    shards_min: [("redis.shards", "1")], W;
    shards_max: [("redis.shards", "1024")], W;
    forwarder_batch_min: [("forwarder.batch_size", "1")], W;
    // More due at one instant in one shard than the largest batch holds.
    forwarder_batch_max_one_shard: [("redis.shards", "1"), ("forwarder.batch_size", "10000"), ("api.max_batch", "5000")], Workload { http: 12_000, chunk: 5000, inbox: 0, ..W };
    forwarder_batch_half_max_one_shard: [("redis.shards", "1"), ("forwarder.batch_size", "5000"), ("api.max_batch", "5000")], Workload { http: 6000, chunk: 3000, inbox: 0, ..W };
    idle_wakeup_min: [("forwarder.idle_wakeup", "\"10ms\"")], W;
    // One message a second: five take about four seconds, each once.
    max_rate_min: [("forwarder.max_rate", "1")], Workload { http: 3, chunk: 3, inbox: 2, ..W };
    max_rate_max: [("forwarder.max_rate", "10000000")], W;
    redis_timeout_min: [("redis.timeout", "\"50ms\"")], W;
    max_batch_min: [("api.max_batch", "1")], Workload { http: 60, chunk: 1, inbox: 0, ..W };
    max_batch_max: [("api.max_batch", "5000")], Workload { http: 5000, chunk: 5000, inbox: 0, ..W };
    max_fields_min: [("api.max_fields", "1")], Workload { fields: 1, ..W };
    max_fields_max: [("api.max_fields", "2000")], Workload { http: 4, chunk: 2, inbox: 4, fields: 2000, ..W };
    // The smallest message a limit can usefully allow (name, one field, a value).
    max_message_bytes_small: [("api.max_message_bytes", "24")], Workload { fields: 1, bytes: 24, ..W };
    // One message of exactly the largest size: through a batch (whose body may be
    // larger than the default max_body_bytes) and through the inbox.
    max_message_bytes_max: [("api.max_message_bytes", "67108864"), ("api.max_body_bytes", "268435456")], Workload { http: 1, chunk: 1, inbox: 1, streams: 1, fields: 1, bytes: 64 << 20, ..W };
    inbox_batch_min: [("inbox.batch_size", "1")], Workload { http: 0, inbox: 100, ..W };
    inbox_batch_max: [("inbox.batch_size", "5000")], Workload { http: 0, inbox: 6000, ..W };
    // An instance takes over its own entries while it still works on them.
    inbox_reclaim_after_min: [("inbox.reclaim_after", "\"100ms\""), ("inbox.batch_size", "5000")], Workload { http: 0, inbox: 6000, ..W };
    records_retention_min: [], Workload { forgotten: true, ..W };
    sweep_batch_min_and_ack_timeout_min: [("delivery.sweep_batch", "1"), ("delivery.ack_timeout", "\"10ms\"")], Workload { http: 40, inbox: 20, redeliver: true, ..W };
    sweep_batch_max: [("delivery.sweep_batch", "10000"), ("delivery.backoff_jitter", "1.0")], Workload { http: 3000, chunk: 1000, inbox: 0, redeliver: true, ..W };
    max_attempts_min: [("delivery.max_attempts", "1"), ("delivery.backoff_jitter", "0.0")], Workload { redeliver: true, ..W };
    max_attempts_max: [("delivery.max_attempts", "1000")], Workload { redeliver: true, ..W };
    default_maxlen_max: [("streams.default_maxlen", "9223372036854775807")], W;
    // The low ends (1 request at once, 100ms) are in tests/it/http.rs: there they refuse.
    max_concurrent_requests_max: [("api.max_concurrent_requests", "100000")], W;
    request_timeout_max: [("api.request_timeout", "\"1h\"")], W;
}

/// A key set to a value, and whether `check-config` must accept it.
type Bound = (&'static str, &'static str, bool);

#[rustfmt::skip]
const BOUNDS: &[Bound] = &[
    ("redis.shards", "1", true), ("redis.shards", "1024", true),
    ("redis.shards", "0", false), ("redis.shards", "1025", false),
    // No upper bound on durations unless stated; the lower ones:
    ("redis.timeout", "\"50ms\"", true), ("redis.timeout", "\"49ms\"", false),
    ("api.max_message_bytes", "1", true), ("api.max_message_bytes", "67108864", true),
    ("api.max_message_bytes", "0", false), ("api.max_message_bytes", "67108865", false),
    ("api.max_fields", "1", true), ("api.max_fields", "2000", true),
    ("api.max_fields", "0", false), ("api.max_fields", "2001", false),
    ("api.max_batch", "1", true), ("api.max_batch", "5000", true),
    ("api.max_batch", "0", false), ("api.max_batch", "5001", false),
    // 1 GiB of body is not sent in a test: the bound is checked here.
    ("api.max_body_bytes", "1", true), ("api.max_body_bytes", "1073741824", true),
    ("api.max_body_bytes", "0", false), ("api.max_body_bytes", "1073741825", false),
    ("api.max_polls", "1", true), ("api.max_polls", "10000", true),
    ("api.max_polls", "0", false), ("api.max_polls", "10001", false),
    ("api.max_wait", "\"0s\"", true), ("api.max_wait", "\"1h\"", true), ("api.max_wait", "\"3601s\"", false),
    ("api.request_timeout", "\"100ms\"", true), ("api.request_timeout", "\"1h\"", true),
    ("api.request_timeout", "\"99ms\"", false), ("api.request_timeout", "\"3601s\"", false),
    ("api.max_concurrent_requests", "1", true), ("api.max_concurrent_requests", "100000", true),
    ("api.max_concurrent_requests", "0", false), ("api.max_concurrent_requests", "100001", false),
    ("api.max_delay", "\"1ms\"", true), ("api.max_delay", "\"0s\"", false),
    ("api.max_delay", "\"36500days\"", true), ("api.max_delay", "\"36501days\"", false),
    ("redis.connect_timeout", "\"50ms\"", true), ("redis.connect_timeout", "\"49ms\"", false),
    ("streams.default_maxlen", "0", true), ("streams.default_maxlen", "9223372036854775807", true),
    ("streams.default_maxlen", "-1", false),
    ("streams.maxlen.orders", "0", true), ("streams.maxlen.orders", "-1", false),
    ("forwarder.batch_size", "1", true), ("forwarder.batch_size", "10000", true),
    ("forwarder.batch_size", "0", false), ("forwarder.batch_size", "10001", false),
    ("forwarder.idle_wakeup", "\"10ms\"", true), ("forwarder.idle_wakeup", "\"9ms\"", false),
    ("forwarder.max_rate", "0", true), ("forwarder.max_rate", "10000000", true),
    ("forwarder.max_rate", "-1", false), ("forwarder.max_rate", "10000001", false),
    ("records.trim_interval", "\"100ms\"", true), ("records.trim_interval", "\"99ms\"", false),
    ("delivery.ack_timeout", "\"10ms\"", true), ("delivery.ack_timeout", "\"9ms\"", false),
    ("delivery.max_attempts", "1", true), ("delivery.max_attempts", "1000", true),
    ("delivery.max_attempts", "0", false), ("delivery.max_attempts", "1001", false),
    ("delivery.backoff_jitter", "0.0", true), ("delivery.backoff_jitter", "1.0", true),
    ("delivery.backoff_jitter", "-0.01", false), ("delivery.backoff_jitter", "1.01", false),
    ("delivery.sweep_interval", "\"10ms\"", true), ("delivery.sweep_interval", "\"9ms\"", false),
    ("delivery.sweep_batch", "1", true), ("delivery.sweep_batch", "10000", true),
    ("delivery.sweep_batch", "0", false), ("delivery.sweep_batch", "10001", false),
    ("inbox.batch_size", "1", true), ("inbox.batch_size", "5000", true),
    ("inbox.batch_size", "0", false), ("inbox.batch_size", "5001", false),
    ("inbox.reclaim_after", "\"100ms\"", true), ("inbox.reclaim_after", "\"99ms\"", false),
    ("etcd.lease_ttl", "\"2s\"", true), ("etcd.lease_ttl", "\"1s\"", false), ("etcd.lease_ttl", "\"2500ms\"", false),
    ("etcd.connect_timeout", "\"100ms\"", true), ("etcd.connect_timeout", "\"99ms\"", false),
];

#[tokio::test]
async fn check_config_accepts_each_bound_and_refuses_one_step_outside_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, &(key, value, ok)) in BOUNDS.iter().enumerate() {
        let mut settings = vec![(key, value)];
        if key.starts_with("etcd.") {
            settings.push(("etcd.endpoints", "[\"http://127.0.0.1:2379\"]"));
        }
        let path = dir.path().join(format!("{i}.toml"));
        std::fs::write(&path, config_text("redis://127.0.0.1:6379", &settings))
            .expect("write config");
        let out = tokio::process::Command::new(delayq_bin())
            .args(["check-config", "--quiet", "--config"])
            .arg(&path)
            .env_remove("DELAYQ_CONFIG")
            .output()
            .await
            .expect("run delayq check-config");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if ok {
            assert_eq!(
                out.status.code(),
                Some(0),
                "{key} = {value} must be accepted: {stderr}"
            );
        } else {
            assert_eq!(
                out.status.code(),
                Some(64),
                "{key} = {value} must be refused: {stderr}"
            );
            assert!(
                stderr.contains(&format!("{key}: ")),
                "{key} = {value}: the error names the key: {stderr}"
            );
        }
    }
}

/// A Redis at `maxmemory` with `noeviction` while messages fall due: none is lost or
/// dead-lettered for want of memory, and forwarding resumes once memory is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_loses_nothing_and_forwarding_resumes_when_memory_frees() {
    let redis = RedisServer::start().expect("start redis-server");
    let mut conn = redis.client();
    let text = config_text(&redis.url(), &[("log.level", "\"warn\"")]);
    let node = DelayqProcess::start(&delayq_bin(), "full", &text).expect("start delayq");
    let ctx = |what: &str| format!("{what}\ndelayq log:\n{}", node.log());
    let http = reqwest::Client::new();
    let w = W;
    let streams: Vec<String> = (0..w.streams).map(|s| format!("full-{s}")).collect();
    let lead_ms = 1500 * u64::from(patience());
    let at_ms = redis_now_ms(&mut conn) + lead_ms;
    let planned: Vec<Planned> = (0..w.http)
        .map(|i| {
            let stream = streams[i % streams.len()].clone();
            Planned {
                id: format!("full-{i}"),
                fields: message_fields(i, &stream, &w),
                stream,
                due_ms: at_ms,
            }
        })
        .collect();
    for chunk in planned.chunks(w.chunk) {
        let body =
            json!({ "messages": chunk.iter().map(|m| push_body(m, at_ms)).collect::<Vec<_>>() });
        let answer: Value = http
            .post(node.url("/v1/messages/batch"))
            .json(&body)
            .send()
            .await
            .expect("batch")
            .json()
            .await
            .expect("json");
        assert_eq!(
            answer["scheduled"].as_u64(),
            Some(chunk.len() as u64),
            "{answer:.300}"
        );
    }

    // Redis full: a little room over what it holds, then a filler key up to the limit.
    redis_config(&mut conn, "maxmemory-policy", "noeviction");
    let used = used_memory(&mut conn);
    redis_config(&mut conn, "maxmemory", &(used + (4 << 20)).to_string());
    let chunk = "f".repeat(64 << 10);
    let mut oom = false;
    for _ in 0..10_000 {
        match redis::cmd("APPEND")
            .arg("filler")
            .arg(&chunk)
            .query::<u64>(&mut conn)
        {
            Ok(_) => {}
            Err(e) if e.to_string().contains("OOM") => {
                oom = true;
                break;
            }
            Err(e) => panic!("APPEND: {e}"),
        }
    }
    assert!(oom, "writes never answered OOM");
    assert!(
        redis_now_ms(&mut conn) < at_ms,
        "{}",
        ctx("memory filled before the messages fell due")
    );

    // The messages fall due while no write can succeed; the forwarder tries a while.
    eventually(
        Duration::from_secs(10),
        "the messages overdue by a second",
        || {
            let late = redis_now_ms(&mut conn) > at_ms + 1000;
            std::future::ready(late.then_some(()))
        },
    )
    .await;
    let dead_letters: usize = streams
        .iter()
        .map(|s| {
            redis::cmd("XLEN")
                .arg(format!("{s}:dead"))
                .query::<usize>(&mut conn)
                .unwrap()
        })
        .sum();
    let states: Vec<(String, Value)> = futures::stream::iter(&planned)
        .map(|m| {
            let http = http.clone();
            let url = node.url(&format!("/v1/messages/{}", m.id));
            async move {
                let got: Value = http
                    .get(url)
                    .send()
                    .await
                    .expect("GET")
                    .json()
                    .await
                    .unwrap_or(Value::Null);
                (m.id.clone(), got["state"].clone())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let gone: Vec<&(String, Value)> = states
        .iter()
        .filter(|(_, state)| *state != "scheduled" && *state != "delivered")
        .collect();
    assert!(
        dead_letters == 0 && gone.is_empty(),
        "{}",
        ctx(&format!(
            "while Redis was full: {dead_letters} dead letters, {} messages neither scheduled nor delivered, e.g. {:?}",
            gone.len(),
            &gone[..gone.len().min(5)]
        ))
    );

    // Memory freed: every message arrives, once, verbatim, on record.
    let _: u64 = redis::cmd("DEL").arg("filler").query(&mut conn).unwrap();
    redis_config(&mut conn, "maxmemory", "0");
    eventually(
        Duration::from_secs(15),
        "every message delivered after memory freed",
        || {
            let got: usize = streams
                .iter()
                .map(|s| redis::cmd("XLEN").arg(s).query::<usize>(&mut conn).unwrap())
                .sum();
            std::future::ready((got >= planned.len()).then_some(()))
        },
    )
    .await;
    let entry_ids = check_delivered(&mut conn, &streams, &planned, 1, &ctx);
    check_records(&http, &node, &planned, &entry_ids, "delivered", &ctx).await;
}
