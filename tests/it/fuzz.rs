//! Malformed input of many kinds at a running `delayq` process, from a fixed seed
//! (`DELAYQ_FUZZ_SEED` picks another): requests to every endpoint of the OpenAPI
//! document, some over raw TCP, and entries in the inbox, with valid ones mixed in.
//! No answer is a 5xx, every 4xx is `{"error","detail"}` JSON (except hyper's own
//! bare 400s for requests it cannot parse), the daemon stays up, every accepted
//! message is delivered once with its fields verbatim, and every rejected inbox entry
//! appears once in the rejected stream.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use delayq::harness::{DelayqProcess, RedisServer};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};

use crate::support::{delayq_bin, entries, eventually, patience};

const DEFAULT_SEED: u64 = 0x5eed_0fde_1a79;
const REQUESTS: usize = 3000;
const RAW_REQUESTS: usize = 60;
const INBOX_ENTRIES: usize = 400;
const INBOX: &str = "delayq:inbox";
const REJECTED: &str = "delayq:inbox:rejected";
const STREAMS: &[&str] = &["fz-0", "fz-1", "fz-2"];

const CONFIG: &str = "[api]\nmax_message_bytes = 4096\nmax_fields = 50\nmax_batch = 20\n\
    max_body_bytes = 65536\nmax_wait = \"100ms\"\nmax_delay = \"1h\"\n\
    [streams]\nallow = [\"fz*\"]\n[log]\nlevel = \"warn\"\n";

/// An inbox entry's field/value pairs, as bytes.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Status, content type and body of an answer.
type Answer = (u16, Option<String>, Vec<u8>);

/// One HTTP request as generated.
#[derive(Clone, Debug)]
struct Req {
    kind: &'static str,
    method: String,
    path: String,
    body: Option<Vec<u8>>,
}

/// A message the daemon accepted: where it must arrive, with what, not before when.
#[derive(Clone, Debug)]
struct Accepted {
    stream: String,
    fields: Vec<(String, String)>,
    due_ms: u64,
    how: String,
}

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

/// Text with the characters most likely to trip a parser or a Redis command.
fn nasty_text(rng: &mut StdRng) -> String {
    const PARTS: &[&str] = &[
        "a", "ü", "✓", "\u{0}", "\u{1b}", "\t", "\r\n", " ", "\"", "\\", "{", "}", "%", "*", "$",
        "delayq-", "-", "\u{feff}", "\u{202e}", "𝄞", ":", "..", "/", "?", "#",
    ];
    (0..rng.random_range(0..12))
        .map(|_| *pick(rng, PARTS))
        .collect()
}

/// Field values a valid message may carry: anything that is a string.
fn value_text(rng: &mut StdRng) -> String {
    match rng.random_range(0..4) {
        0 => String::new(),
        1 => nasty_text(rng),
        2 => format!("v{}", rng.random_range(0..1_000_000)),
        _ => "x".repeat(rng.random_range(1..300)),
    }
}

fn valid_push(rng: &mut StdRng, id: &str) -> Value {
    let n = rng.random_range(1..6);
    let fields: Vec<Value> = (0..n)
        .map(|j| {
            let name: String = nasty_text(rng)
                .chars()
                .filter(|c| !c.is_control() && !c.is_whitespace())
                .collect();
            json!([format!("k{j}{name}"), value_text(rng)])
        })
        .collect();
    let mut body = Map::new();
    body.insert("stream".into(), json!(pick(rng, STREAMS)));
    if rng.random_bool(0.2) {
        body.insert("payload".into(), json!(value_text(rng)));
    } else {
        body.insert("fields".into(), Value::Array(fields));
    }
    match rng.random_range(0..3) {
        0 => body.insert("delay_ms".into(), json!(rng.random_range(0..400))),
        1 => body.insert(
            "delay".into(),
            json!(format!("{}ms", rng.random_range(0..400))),
        ),
        _ => body.insert("deliver_at".into(), json!(1_600_000_000_000u64)),
    };
    body.insert("id".into(), json!(id));
    if rng.random_bool(0.3) {
        body.insert("priority".into(), json!(rng.random_range(0..10)));
    }
    Value::Object(body)
}

/// A valid body for each endpoint that takes one.
fn template(rng: &mut StdRng, method: &str, path: &str, serial: usize) -> Option<Value> {
    if method != "POST" {
        return None;
    }
    Some(if path == "/v1/messages" {
        valid_push(rng, &format!("ok-{serial}"))
    } else if path == "/v1/messages/batch" {
        let n = rng.random_range(1..5);
        json!({ "messages": (0..n).map(|j| valid_push(rng, &format!("ok-{serial}-{j}"))).collect::<Vec<_>>() })
    } else if path.ends_with("/reschedule") {
        json!({ "delay": "1s" })
    } else if path.ends_with("/ack") {
        json!({ "group": "g", "ids": ["1-0", "2-1"] })
    } else if path.ends_with("/replay") || path.ends_with("/purge") {
        json!({ "ids": ["1-0"] })
    } else {
        json!({})
    })
}

/// A path parameter: plain, or one of the awkward kinds.
fn path_param(rng: &mut StdRng) -> String {
    match rng.random_range(0..10) {
        0 => "%00".into(),
        1 => "%FF%FE".into(),
        2 => "a%20b".into(),
        3 => "x".repeat(rng.random_range(129..3000)),
        4 => "%2F..%2F".into(),
        5 => "%C3%BC%E2%9C%93".into(),
        6 => "delayq:inbox".into(),
        7 => pick(rng, STREAMS).to_string(),
        _ => format!("px-{}", rng.random_range(0..1000)),
    }
}

fn query(rng: &mut StdRng) -> String {
    const KEYS: &[&str] = &["group", "consumer", "wait", "count", "after", "limit", "x"];
    const VALUES: &[&str] = &[
        "g",
        "c",
        "0",
        "-1",
        "10ms",
        "1h",
        "99999999999999999999",
        "%00",
        "%FF",
        "1-0",
        "a%20b",
        "",
        "1e3",
        "NaN",
    ];
    let n = rng.random_range(0..5);
    let parts: Vec<String> = (0..n)
        .map(|_| format!("{}={}", pick(rng, KEYS), pick(rng, VALUES)))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// Replaces one value somewhere in `v` with a value of another type.
fn confuse(rng: &mut StdRng, v: &mut Value) {
    let replacement = match rng.random_range(0..8) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(-1),
        3 => json!(1.5),
        4 => json!([]),
        5 => json!({}),
        6 => json!(nasty_text(rng)),
        _ => json!([["a", "b"]]),
    };
    match v {
        Value::Object(map) if !map.is_empty() => {
            let key = map
                .keys()
                .nth(rng.random_range(0..map.len()))
                .cloned()
                .unwrap();
            if rng.random_bool(0.5) {
                confuse(rng, map.get_mut(&key).unwrap());
            } else {
                map.insert(key, replacement);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let i = rng.random_range(0..items.len());
            if rng.random_bool(0.5) {
                confuse(rng, &mut items[i]);
            } else {
                items[i] = replacement;
            }
        }
        other => *other = replacement,
    }
}

/// Puts a huge or odd number (as JSON text) where a number or any value goes.
fn huge_number_text(rng: &mut StdRng, v: &Value) -> String {
    const NUMBERS: &[&str] = &[
        "1e400",
        "-1e400",
        "18446744073709551616",
        "18446744073709551615",
        "-9223372036854775809",
        "9007199254740993",
        "-0",
        "0.0000001",
        "1E2",
        "123456789012345678901234567890",
        "4e15",
    ];
    let text = v.to_string();
    let number = pick(rng, NUMBERS);
    for key in ["delay_ms", "deliver_at", "priority", "ttl_ms", "limit"] {
        let at = format!("\"{key}\":");
        if let Some(i) = text.find(&at) {
            let start = i + at.len();
            let end = text[start..]
                .find([',', '}'])
                .map_or(text.len(), |e| start + e);
            return format!("{}{number}{}", &text[..start], &text[end..]);
        }
    }
    match text.strip_suffix('}') {
        Some(head) if head.len() > 1 => format!("{head},\"delay_ms\":{number}}}"),
        _ => format!("{{\"delay_ms\":{number}}}"),
    }
}

fn mutate_bytes(rng: &mut StdRng, mut bytes: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.random_range(1..6) {
        if bytes.is_empty() {
            bytes.push(b'{');
        }
        let i = rng.random_range(0..bytes.len());
        match rng.random_range(0..4) {
            0 => bytes[i] = rng.random(),
            1 => {
                bytes.remove(i);
            }
            2 => bytes.insert(i, *pick(rng, b"{}[]\",:\\0-e.x \x00\xff")),
            _ => {
                let end = (i + rng.random_range(1..20)).min(bytes.len());
                let copy = bytes[i..end].to_vec();
                bytes.splice(i..i, copy);
            }
        }
    }
    bytes
}

/// One malformed (or, now and then, valid) body for an endpoint.
fn body(rng: &mut StdRng, valid: Option<Value>) -> (&'static str, Option<Vec<u8>>) {
    let base = valid.clone().unwrap_or_else(|| json!({"a": 1}));
    let text = base.to_string();
    let roll = rng.random_range(0..100);
    let (kind, bytes): (&'static str, Vec<u8>) = match roll {
        0..=9 => ("valid", text.into_bytes()),
        10..=17 => {
            let n = rng.random_range(0..200);
            ("random-bytes", (0..n).map(|_| rng.random()).collect())
        }
        18..=23 => {
            let cut = rng.random_range(0..text.len().max(1));
            ("truncated", text.as_bytes()[..cut].to_vec())
        }
        24..=29 => {
            let depth = *pick(rng, &[64, 127, 129, 1000, 100_000]);
            let (open, close) = if rng.random_bool(0.5) {
                ("[", "]")
            } else {
                ("{\"a\":", "}")
            };
            (
                "deep-nesting",
                format!("{}1{}", open.repeat(depth), close.repeat(depth)).into_bytes(),
            )
        }
        30..=44 => {
            let mut v = base;
            confuse(rng, &mut v);
            ("type-confusion", v.to_string().into_bytes())
        }
        45..=52 => ("huge-number", huge_number_text(rng, &base).into_bytes()),
        53..=60 => {
            let mut v = base;
            if let Some(map) = v.as_object_mut() {
                for key in ["stream", "id", "group", "delay"] {
                    if map.contains_key(key) {
                        map.insert(
                            key.into(),
                            json!(format!("fz{}\u{1}\u{0}", nasty_text(rng))),
                        );
                    }
                }
            }
            ("control-characters", v.to_string().into_bytes())
        }
        61..=62 => (
            "huge-body",
            format!(
                "{{\"a\":\"{}\"}}",
                "x".repeat(70_000 + rng.random_range(0..2_000_000))
            )
            .into_bytes(),
        ),
        63..=69 => {
            let n = *pick(rng, &[51, 100, 5000]);
            let mut v = base;
            if let Some(map) = v.as_object_mut() {
                if map.contains_key("fields") || map.contains_key("payload") {
                    map.remove("payload");
                    let fields: Map<String, Value> =
                        (0..n).map(|j| (format!("f{j}"), json!("v"))).collect();
                    map.insert("fields".into(), Value::Object(fields));
                } else {
                    for j in 0..n {
                        map.insert(format!("k{j}"), json!(j));
                    }
                }
            }
            ("many-fields", v.to_string().into_bytes())
        }
        70..=94 => ("mutated", mutate_bytes(rng, text.into_bytes())),
        95..=97 => ("empty", Vec::new()),
        _ => (
            "not-an-object",
            pick(rng, &["null", "1", "\"s\"", "[]", "true", "[{}]"])
                .as_bytes()
                .to_vec(),
        ),
    };
    (kind, Some(bytes))
}

fn generate(rng: &mut StdRng, endpoints: &[(String, String)], serial: usize) -> Req {
    let (method, template_path) = pick(rng, endpoints).clone();
    let method = match rng.random_range(0..30) {
        0 => "PUT".to_owned(),
        1 => "PATCH".to_owned(),
        2 => "DELETE".to_owned(),
        _ => method,
    };
    let mut path = template_path.clone();
    while let Some(start) = path.find('{') {
        let end = path[start..]
            .find('}')
            .map_or(path.len(), |e| start + e + 1);
        let param = path_param(rng);
        path.replace_range(start..end, &param);
    }
    if method == "GET" {
        path.push_str(&query(rng));
    }
    let valid = template(rng, &method, &template_path, serial);
    let (kind, body) = if method == "POST" || rng.random_bool(0.1) {
        body(rng, valid)
    } else {
        ("no-body", None)
    };
    Req {
        kind,
        method,
        path,
        body,
    }
}

/// A message's fields as the API reads them from a push body.
fn fields_of(push: &Value) -> Option<Vec<(String, String)>> {
    let scalar = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    if let Some(payload) = push.get("payload") {
        return Some(vec![(
            "payload".into(),
            match payload {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
        )]);
    }
    match push.get("fields")? {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| Some((k.clone(), scalar(v)?)))
            .collect(),
        Value::Array(pairs) => pairs
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([Value::String(k), v]) => Some((k.clone(), scalar(v)?)),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// Records what a push (single or batch) that was answered `status` accepted.
fn record_accepted(
    req: &Req,
    status: u16,
    answer: &Value,
    accepted: &mut HashMap<String, Accepted>,
) -> Result<(), String> {
    let sent: Option<Value> = req
        .body
        .as_deref()
        .and_then(|b| serde_json::from_slice(b).ok());
    let mut take = |push: Option<&Value>, item: &Value| -> Result<(), String> {
        let new = item["state"] == "scheduled" && (item["duplicate"] != true);
        if !new {
            return Ok(());
        }
        let id = item["id"].as_str().ok_or("no id in an accepting answer")?;
        let push = push.ok_or("accepted a body that is not JSON")?;
        let fields = fields_of(push).ok_or("accepted a body without readable fields")?;
        let stream = push["stream"]
            .as_str()
            .ok_or("accepted a body without a stream")?;
        let due_ms = item["deliver_at"].as_u64().ok_or("no deliver_at")?;
        accepted.insert(
            id.to_owned(),
            Accepted {
                stream: stream.to_owned(),
                fields,
                due_ms,
                how: format!("{} {}", req.method, req.path),
            },
        );
        Ok(())
    };
    match (req.path.as_str(), status) {
        ("/v1/messages", 200 | 201) if req.method == "POST" => take(sent.as_ref(), answer),
        ("/v1/messages/batch", 200) if req.method == "POST" => {
            let results = answer["results"]
                .as_array()
                .ok_or("a batch answer without results")?;
            for item in results {
                let i = item["index"].as_u64().ok_or("a result without index")? as usize;
                if matches!(item["status"].as_u64(), Some(200 | 201)) {
                    take(sent.as_ref().and_then(|s| s["messages"].get(i)), item)?;
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Raw requests hyper must refuse by itself or that break off: each gets a 4xx.
fn raw_request(rng: &mut StdRng) -> (&'static str, Vec<u8>, bool) {
    let push = br#"{"stream":"fz-0","payload":"x","delay_ms":0}"#;
    let (kind, text, half_close): (&'static str, Vec<u8>, bool) = match rng.random_range(0..13) {
        0 => ("garbage-request-line", b"GARBAGE\r\n\r\n".to_vec(), false),
        1 => {
            let big = "a".repeat(rng.random_range(500_000..800_000));
            ("huge-header", format!("GET /v1/stats HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").into_bytes(), false)
        }
        2 => ("content-length-not-a-number", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}".to_vec(), false),
        3 => {
            let mut t = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n".to_vec();
            t.extend_from_slice(&push[..20]);
            ("content-length-longer-than-body", t, true)
        }
        4 => {
            let mut t = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n".to_vec();
            t.extend_from_slice(push);
            ("content-length-shorter-than-body", t, false)
        }
        5 => ("content-length-and-chunked", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(), false),
        6 => ("bad-chunk-size", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".to_vec(), false),
        7 => ("control-character-in-header", b"GET /v1/stats HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n".to_vec(), false),
        8 => {
            let long = "a".repeat(rng.random_range(500_000..800_000));
            ("huge-path", format!("GET /v1/messages/{long} HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes(), false)
        }
        9 => ("content-length-overflow", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551616\r\n\r\n{}".to_vec(), false),
        10 => ("content-length-negative", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}".to_vec(), false),
        11 => ("nul-in-path", b"GET /v1/\x00stats HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), false),
        _ => ("two-content-lengths", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x".to_vec(), false),
    };
    (kind, text, half_close)
}

/// Sends raw bytes and returns the status of the first answer (None: no answer).
fn send_raw(addr: std::net::SocketAddr, bytes: &[u8], half_close: bool) -> Option<u16> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // A server may answer and close before reading everything: a failed write is fine.
    let _ = s.write_all(bytes);
    if half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&got);
    line.split(' ').nth(1)?.parse().ok()
}

/// Inbox entries: malformed ones (rejected) and valid ones (delivered), each with
/// what must become of it.
fn inbox_entry(rng: &mut StdRng, k: usize) -> (Pairs, Option<Accepted>) {
    let b = |s: &str| s.as_bytes().to_vec();
    let stream = pick(rng, STREAMS).to_string();
    let msg: Pairs = (0..rng.random_range(1..4))
        .map(|j| (b(&format!("m{j}")), value_text(rng).into_bytes()))
        .collect();
    let mut reserved = vec![
        (b("delayq-stream"), b(&stream)),
        (
            b("delayq-delay"),
            b(&format!("{}", rng.random_range(0..300))),
        ),
        (b("delayq-id"), b(&format!("oki-{k}"))),
    ];
    let bad: Option<(Vec<u8>, Vec<u8>)> = match rng.random_range(0..18) {
        0 => {
            reserved.remove(0);
            None
        }
        1 => {
            reserved.remove(1);
            None
        }
        2 => Some((b("delayq-prio"), b("1"))),
        3 => Some((b("delayq-at"), b("now"))),
        4 => Some((
            b("delayq-priority"),
            b(pick::<&str>(rng, &["high", "10", "-1", "1e3", ""])),
        )),
        5 => {
            reserved[2].1 = b(pick::<&str>(rng, &["a b", "", "é", "x\u{0}y"]));
            None
        }
        6 => {
            reserved[0].1 = b(pick::<&str>(rng, &["payroll", "delayq:x", "fz\u{1}", ""]));
            None
        }
        7 => {
            reserved[1].1 = b(pick::<&str>(
                rng,
                &["-5", "2h", "soon", "99999999999999999999", "1e400", "NaN"],
            ));
            None
        }
        8 => Some((b("delayq-stream"), b("fz-1"))),
        9 => Some((b("m0"), vec![0xff, 0xfe, 0x00])),
        10 => Some((vec![0xc3, 0x28], b("v"))),
        11 => Some((
            b("delayq-ttl"),
            b(pick::<&str>(rng, &["0", "-1", "forever"])),
        )),
        12 => Some((b("big"), vec![b'x'; 5000])),
        13 => {
            for j in 0..51 {
                reserved.push((b(&format!("extra{j}")), b("v")));
            }
            None
        }
        14 => {
            // More pairs than a Lua script can unpack into one command.
            for j in 0..rng.random_range(4100..6000) {
                reserved.push((b(&format!("extra{j}")), b("v")));
            }
            None
        }
        _ => return valid_inbox(rng, k, stream, reserved, msg),
    };
    let mut all = reserved;
    if let Some(extra) = bad {
        all.push(extra);
    }
    if !matches!(rng.random_range(0..3), 0) {
        all.extend(msg);
    }
    (all, None)
}

fn valid_inbox(
    rng: &mut StdRng,
    k: usize,
    stream: String,
    reserved: Pairs,
    msg: Pairs,
) -> (Pairs, Option<Accepted>) {
    let fields = msg
        .iter()
        .map(|(k, v)| {
            (
                String::from_utf8(k.clone()).unwrap(),
                String::from_utf8(v.clone()).unwrap(),
            )
        })
        .collect();
    let all = if rng.random_bool(0.5) {
        reserved.into_iter().chain(msg).collect()
    } else {
        msg.into_iter().chain(reserved).collect()
    };
    let accepted = Accepted {
        stream,
        fields,
        due_ms: 0,
        how: format!("inbox entry {k}"),
    };
    (all, Some(accepted))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_and_inbox_entries_never_break_the_daemon_or_lose_a_message() {
    let seed = std::env::var("DELAYQ_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    let started = Instant::now();
    let budget = Duration::from_secs(60) * patience();
    let redis = RedisServer::start().expect("start redis-server");
    let mut conn = redis.client();
    let config = format!("[redis]\nurl = \"{}\"\n{CONFIG}", redis.url());
    let mut node = DelayqProcess::start(&delayq_bin(), "fuzz", &config).expect("start delayq");
    let ctx = |node: &DelayqProcess, what: &str| {
        format!(
            "seed {seed} (DELAYQ_FUZZ_SEED): {what}\ndelayq log:\n{}",
            node.log()
        )
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        // A fresh connection per request: a server may close one after refusing a
        // body it did not read, and a pooled reuse of it would fail on the client.
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(seed);

    // Every endpoint the OpenAPI document names, with its methods.
    let doc: Value = http
        .get(node.url("/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut endpoints: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for method in ops.as_object().expect("operations").keys() {
            // Besides methods a path item may hold "parameters", "summary" and the like.
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                endpoints.push((method.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    endpoints.sort();
    assert!(endpoints.len() >= 10, "{endpoints:?}");

    // The inbox first, so that its entries are handled while the requests come in.
    let mut inbox_plan: Vec<(Pairs, Option<Accepted>)> = (0..INBOX_ENTRIES)
        .map(|k| inbox_entry(&mut rng, k))
        .collect();
    let mut pipe = redis::pipe();
    for (fields, _) in &inbox_plan {
        pipe.cmd("XADD").arg(INBOX).arg("*");
        for (f, v) in fields {
            pipe.arg(f.as_slice()).arg(v.as_slice());
        }
    }
    let inbox_ids: Vec<String> = pipe.query(&mut conn).expect("XADD to the inbox");
    let mut accepted: HashMap<String, Accepted> = HashMap::new();
    let mut must_reject: Vec<String> = Vec::new();
    for (k, ((fields, valid), inbox_id)) in inbox_plan.iter_mut().zip(&inbox_ids).enumerate() {
        match valid.take() {
            Some(mut a) => {
                let delay: u64 = fields
                    .iter()
                    .find(|(f, _)| f == b"delayq-delay")
                    .map(|(_, v)| String::from_utf8_lossy(v).parse().unwrap())
                    .unwrap();
                a.due_ms = inbox_id.split('-').next().unwrap().parse::<u64>().unwrap() + delay;
                accepted.insert(format!("oki-{k}"), a);
            }
            None => must_reject.push(inbox_id.clone()),
        }
    }

    // The requests, a few at a time.
    let requests: Vec<Req> = (0..REQUESTS)
        .map(|i| generate(&mut rng, &endpoints, i))
        .collect();
    let answers: Vec<(Req, Result<Answer, String>)> = futures::stream::iter(requests)
        .map(|req| {
            let http = http.clone();
            let url = node.url(&req.path);
            async move {
                if started.elapsed() > budget {
                    return (req, Err("skipped: the run's time is up".to_owned()));
                }
                let method = reqwest::Method::from_bytes(req.method.as_bytes()).unwrap();
                let mut r = http.request(method, &url);
                if let Some(body) = &req.body {
                    r = r
                        .header("content-type", "application/json")
                        .body(body.clone());
                }
                let result = match r.send().await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let ct = resp
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        let bytes = resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
                        Ok((status, ct, bytes))
                    }
                    Err(e) => Err(format!("{e:?}")),
                };
                (req, result)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;

    let mut by_kind: HashMap<(&str, u16), usize> = HashMap::new();
    let mut problems: Vec<String> = Vec::new();
    let show = |req: &Req| {
        let body = req
            .body
            .as_deref()
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned());
        format!(
            "[{}] {} {:.200} body {:?}",
            req.kind, req.method, req.path, body
        )
    };
    for (req, result) in &answers {
        let (status, ct, bytes) = match result {
            Ok(r) => r,
            Err(e) if e.starts_with("skipped") => continue,
            Err(e) => {
                problems.push(format!("{}: no answer: {e:.300}", show(req)));
                continue;
            }
        };
        *by_kind.entry((req.kind, *status)).or_default() += 1;
        let answer: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
        if *status >= 500 {
            problems.push(format!(
                "{}: {status} {:.300}",
                show(req),
                String::from_utf8_lossy(bytes)
            ));
        } else if *status >= 400 {
            let json = ct
                .as_deref()
                .is_some_and(|c| c.starts_with("application/json"));
            if !json || !answer["error"].is_string() || !answer["detail"].is_string() {
                problems.push(format!(
                    "{}: {status} not {{error, detail}} JSON: {ct:?} {:.300}",
                    show(req),
                    String::from_utf8_lossy(bytes)
                ));
            }
        } else if req.kind == "valid"
            && req.method == "POST"
            && req.path.starts_with("/v1/messages")
            && !req.path.ends_with("/reschedule")
            && !(*status == 201 || answer["failed"] == 0)
        {
            problems.push(format!(
                "{}: a valid push answered {status} {:.300}",
                show(req),
                answer.to_string()
            ));
        } else if let Err(e) = record_accepted(req, *status, &answer, &mut accepted) {
            problems.push(format!(
                "{}: {status} {e}: {:.300}",
                show(req),
                answer.to_string()
            ));
        }
    }
    let sent = answers
        .iter()
        .filter(|(_, r)| !matches!(r, Err(e) if e.starts_with("skipped")))
        .count();
    assert!(
        sent >= REQUESTS / 2,
        "{}",
        ctx(
            &node,
            &format!("only {sent} requests sent within {budget:?}")
        )
    );

    // Raw requests: hyper's own refusals are bare 400s, so only the status is checked.
    let addr = node.api;
    let raw: Vec<(&str, Vec<u8>, bool)> =
        (0..RAW_REQUESTS).map(|_| raw_request(&mut rng)).collect();
    for (kind, bytes, half_close) in raw {
        let status = tokio::task::spawn_blocking(move || send_raw(addr, &bytes, half_close))
            .await
            .unwrap();
        if !status.is_some_and(|s| (400..500).contains(&s)) {
            problems.push(format!("raw [{kind}]: answered {status:?}, want a 4xx"));
        }
    }
    // The daemon is up and answers.
    let health = http
        .get(node.url("/healthz"))
        .send()
        .await
        .map(|r| r.status().as_u16());
    if health.as_ref().ok() != Some(&200) {
        problems.push(format!("healthz after the run: {health:?}"));
    }
    if !node.is_running() {
        problems.push("the process exited".into());
    }

    // Every accepted message due by now is delivered once, verbatim, not early; the
    // rest are still scheduled.
    let now_ms = {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
        s * 1000 + us / 1000
    };
    let due: Vec<&String> = accepted
        .iter()
        .filter(|(_, a)| a.due_ms <= now_ms + 2000)
        .map(|(id, _)| id)
        .collect();
    let mut streams: Vec<String> = accepted.values().map(|a| a.stream.clone()).collect();
    streams.sort();
    streams.dedup();
    let wait = Duration::from_secs(20);
    let _ = within(wait, "the accepted messages delivered", || {
        let found = delivered(&mut conn, &streams);
        std::future::ready(due.iter().all(|id| found.contains_key(*id)).then_some(()))
    })
    .await;
    let found = delivered(&mut conn, &streams);
    for (id, list) in &found {
        let Some(a) = accepted.get(id) else {
            problems.push(format!(
                "{id}: delivered but never accepted ({} times)",
                list.len()
            ));
            continue;
        };
        let [e] = list.as_slice() else {
            problems.push(format!("{id}: delivered {} times ({})", list.len(), a.how));
            continue;
        };
        let mut want = a.fields.clone();
        want.push(("delayq-id".into(), id.clone()));
        want.push(("delayq-attempt".into(), "1".into()));
        if e.fields != want {
            problems.push(format!(
                "{id}: fields {:.300} want {:.300} ({})",
                format!("{:?}", e.fields),
                format!("{want:?}"),
                a.how
            ));
        }
        if e.ms() < a.due_ms {
            problems.push(format!(
                "{id}: delivered at {} before {} ({})",
                e.ms(),
                a.due_ms,
                a.how
            ));
        }
    }
    for (id, a) in &accepted {
        if found.contains_key(id) {
            continue;
        }
        if a.due_ms <= now_ms + 2000 {
            problems.push(format!(
                "{id}: accepted, due by {}, never delivered ({})",
                a.due_ms, a.how
            ));
            continue;
        }
        let state: Value = http
            .get(node.url(&format!("/v1/messages/{id}")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or(Value::Null);
        if state["state"] != "scheduled" {
            problems.push(format!("{id}: due later, but {state} ({})", a.how));
        }
    }

    // Every malformed inbox entry is in the rejected stream once, and the inbox is empty.
    let _ = within(wait, "the malformed inbox entries rejected", || {
        let got: usize = redis::cmd("XLEN").arg(REJECTED).query(&mut conn).unwrap();
        std::future::ready((got >= must_reject.len()).then_some(()))
    })
    .await;
    let rejected = entries(&mut conn, REJECTED);
    let mut times: HashMap<&str, usize> = HashMap::new();
    for e in &rejected {
        *times
            .entry(e.get("delayq-inbox-id").unwrap_or_default())
            .or_default() += 1;
    }
    for id in &must_reject {
        if times.get(id.as_str()) != Some(&1) {
            problems.push(format!(
                "inbox entry {id}: rejected {:?} times, want once",
                times.get(id.as_str())
            ));
        }
    }
    for id in times
        .keys()
        .filter(|id| !must_reject.iter().any(|m| m == *id))
    {
        problems.push(format!("inbox entry {id}: valid, but rejected"));
    }
    let left: usize = redis::cmd("XLEN").arg(INBOX).query(&mut conn).unwrap();
    if left != 0 {
        problems.push(format!("{left} entries left in the inbox"));
    }
    if node.full_log().contains("panicked") {
        problems.push("a panic in the log".into());
    }
    let mut by_kind: Vec<_> = by_kind.into_iter().collect();
    by_kind.sort();
    let summary = format!(
        "{sent} requests, {} accepted messages, {} malformed inbox entries, {:?}; by kind and status: {by_kind:?}",
        accepted.len(),
        must_reject.len(),
        started.elapsed(),
    );
    assert!(
        problems.is_empty(),
        "{}",
        ctx(
            &node,
            &format!(
                "{} problems, e.g.\n{}\n{summary}",
                problems.len(),
                problems[..problems.len().min(20)].join("\n")
            )
        )
    );
    eprintln!("fuzz seed {seed}: {summary}");
}

/// Entries of `streams` by their `delayq-id`.
fn delivered(
    conn: &mut redis::Connection,
    streams: &[String],
) -> HashMap<String, Vec<crate::support::Entry>> {
    let mut found: HashMap<String, Vec<crate::support::Entry>> = HashMap::new();
    for s in streams {
        for e in entries(conn, s) {
            found
                .entry(e.get("delayq-id").unwrap_or_default().to_owned())
                .or_default()
                .push(e);
        }
    }
    found
}

/// Waits for `check` like `eventually`, but gives up quietly (None) after `timeout`
/// × patience, so that the test can report everything it found.
async fn within<T, F, Fut>(timeout: Duration, what: &str, check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    tokio::time::timeout(timeout * patience(), eventually(timeout * 2, what, check))
        .await
        .ok()
}
