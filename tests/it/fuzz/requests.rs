//! HTTP requests as the fuzz run generates them: one endpoint of the OpenAPI
//! document at a time, with awkward path parameters and queries, and bodies that
//! are valid now and then and malformed in many ways the rest of the time; and what
//! an accepting answer commits the daemon to deliver.

use std::collections::HashMap;

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};

use super::{Accepted, Req, STREAMS, pick};

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
pub(super) fn value_text(rng: &mut StdRng) -> String {
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

pub(super) fn generate(rng: &mut StdRng, endpoints: &[(String, String)], serial: usize) -> Req {
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
pub(super) fn record_accepted(
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
