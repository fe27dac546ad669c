//! The client commands' answers for people: one `name: value` line a field, times
//! as calendar times in this machine's zone with how far off they are, durations
//! as `1h30m`, a message's fields one a line, nothing for a field with no value.
//! `--json` prints the answer as the API gave it, for scripts.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use delayq_client::human;

/// Fields holding epoch milliseconds, besides those named `*_at` or `*_at_ms`.
const TIME_FIELDS: &[&str] = &[
    "at",
    "since_ms",
    "from_ms",
    "to_ms",
    "last_seen_ms",
    "now_ms",
    "t_ms",
];

/// Prints an answer for people (see the module doc).
pub(super) fn print(value: &Value) {
    print!("{}", render(value, now_ms()));
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The text [`print`] prints, with `now_ms` as the present.
pub(super) fn render(value: &Value, now_ms: u64) -> String {
    let mut out = String::new();
    match value {
        Value::Object(_) => object(&mut out, value, 0, now_ms),
        Value::Array(items) => list(&mut out, items, 0, now_ms),
        other => {
            let _ = writeln!(out, "{}", scalar("", other, now_ms));
        }
    }
    out
}

fn object(out: &mut String, value: &Value, depth: usize, now_ms: u64) {
    let Value::Object(map) = value else { return };
    let pad = "  ".repeat(depth);
    for (key, v) in map {
        let label = label(key);
        match v {
            Value::Null => {}
            Value::Object(inner) if inner.is_empty() => {}
            Value::Object(_) => {
                let _ = writeln!(out, "{pad}{label}:");
                object(out, v, depth + 1, now_ms);
            }
            Value::Array(items) if key == "fields" && is_pairs(items) => {
                let _ = writeln!(out, "{pad}{label}:");
                for pair in items {
                    let _ = writeln!(out, "{pad}  {}: {}", plain(&pair[0]), plain(&pair[1]));
                }
            }
            Value::Array(items) if items.is_empty() => {
                let _ = writeln!(out, "{pad}{label}: none");
            }
            Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
                let shown: Vec<String> = items.iter().map(|i| scalar(key, i, now_ms)).collect();
                let _ = writeln!(out, "{pad}{label}: {}", shown.join(", "));
            }
            Value::Array(items) => {
                let _ = writeln!(out, "{pad}{label}:");
                list(out, items, depth + 1, now_ms);
            }
            scalar_value => {
                let _ = writeln!(out, "{pad}{label}: {}", scalar(key, scalar_value, now_ms));
            }
        }
    }
}

/// A list of objects, each a block whose first line starts with `-`.
fn list(out: &mut String, items: &[Value], depth: usize, now_ms: u64) {
    let pad = "  ".repeat(depth);
    for item in items {
        if item.is_object() {
            let mut block = String::new();
            object(&mut block, item, depth + 1, now_ms);
            let inner = "  ".repeat(depth + 1);
            let mut lines = block.lines();
            if let Some(first) = lines.next() {
                let _ = writeln!(
                    out,
                    "{pad}- {}",
                    first.strip_prefix(&inner).unwrap_or(first)
                );
            }
            for line in lines {
                let _ = writeln!(out, "{line}");
            }
        } else {
            let _ = writeln!(out, "{pad}- {}", scalar("", item, now_ms));
        }
    }
}

fn is_pairs(items: &[Value]) -> bool {
    items
        .iter()
        .all(|p| p.as_array().is_some_and(|p| p.len() == 2))
}

/// A field's name as shown: a unit suffix dropped (`lease_left_ms` → `lease_left`),
/// since the value shows its unit.
fn label(key: &str) -> &str {
    key.strip_suffix("_ms").unwrap_or(key)
}

fn is_time(key: &str) -> bool {
    TIME_FIELDS.contains(&key) || key.ends_with("_at") || key.ends_with("_at_ms")
}

fn scalar(key: &str, v: &Value, now_ms: u64) -> String {
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(ms) if is_time(key) => human::time_local(ms, now_ms),
            Some(ms) if key.ends_with("_ms") => human::millis(ms),
            _ => n.to_string(),
        },
        Value::Bool(true) => "yes".to_owned(),
        Value::Bool(false) => "no".to_owned(),
        other => plain(other),
    }
}

/// A JSON value as plain text: a string without its quotes, null as `-`.
pub(super) fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::render;

    const NOW: u64 = 1_795_719_729_000;

    #[track_caller]
    fn check(answer: serde_json::Value, want: &[&str]) {
        let text = render(&answer, NOW);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), want.len(), "{text}");
        for (line, want) in lines.iter().zip(want) {
            assert!(
                line.starts_with(want) || line.ends_with(want) || line == want,
                "{line:?} does not match {want:?} in\n{text}"
            );
        }
    }

    #[test]
    fn answers_read_as_words_and_times() {
        check(
            json!({"id": "m1", "state": "scheduled", "stream": "orders",
                   "deliver_at": NOW + 1_200_000, "priority": 0, "expires_at": null,
                   "fields": [["payload", "hi"], ["kind", "x"]]}),
            &[
                "id: m1",
                "state: scheduled",
                "stream: orders",
                "(in 20m)",
                "priority: 0",
                "fields:",
                "  payload: hi",
                "  kind: x",
            ],
        );
        check(
            json!({"id": "m1", "state": "cancelled", "already": true}),
            &["id: m1", "state: cancelled", "already: yes"],
        );
        check(
            json!({"is_leader": false, "lease_left_ms": 4200, "since_ms": NOW - 3000}),
            &["is_leader: no", "lease_left: 4s200ms", "(3s ago)"],
        );
        check(
            json!({"nodes": [{"id": "a", "role": "leader"}, {"id": "b", "role": "standby"}]}),
            &[
                "nodes:",
                "  - id: a",
                "    role: leader",
                "  - id: b",
                "    role: standby",
            ],
        );
        check(json!({"messages": [], "next": null}), &["messages: none"]);
        check(
            json!({"allow": ["orders", "billing*"]}),
            &["allow: orders, billing*"],
        );
    }

    #[test]
    fn no_line_shows_json_or_null() {
        let text = render(
            &json!({"a": null, "b": {"c": null, "d": [1, 2]}, "e": [{"f": null, "g": "h"}]}),
            NOW,
        );
        assert!(
            !text.contains("null") && !text.contains('{') && !text.contains('['),
            "{text}"
        );
    }
}
