//! `delayq push`: the command line's message as the body of `POST /v1/messages`.

use std::io::Read;

use serde_json::{Value, json};

/// What `delayq push` was given.
#[derive(clap::Args, Debug)]
pub struct PushArgs {
    pub stream: String,
    /// Payload (the one field `payload`); `-` reads it from stdin (one trailing
    /// newline dropped, as the shell's `$(…)` does).
    pub payload: Option<String>,
    /// A field, as name=value (repeatable, kept in order); instead of a payload.
    #[arg(long = "field", short = 'f', value_name = "NAME=VALUE")]
    pub fields: Vec<String>,
    /// Delay, e.g. 20m, 1500ms, 1h30m (0 for now); this or --at is required, as
    /// over HTTP.
    #[arg(long, conflicts_with = "at", required_unless_present = "at")]
    pub delay: Option<String>,
    /// Absolute due time: epoch ms or RFC 3339.
    #[arg(long)]
    pub at: Option<String>,
    #[arg(long)]
    pub id: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub priority: u8,
    /// Give up delivering after due time plus this (e.g. 1h).
    #[arg(long)]
    pub ttl: Option<String>,
    /// Overwrite a message with the same id instead of reporting a duplicate.
    #[arg(long)]
    pub replace: bool,
    /// A business key, to list or cancel the stream's messages that carry it
    /// together (`delayq key`, `delayq cancel --key`).
    #[arg(long)]
    pub key: Option<String>,
}

/// The push's JSON body, or why the command line cannot make one. The daemon
/// judges every value; this only shapes them.
pub(super) fn body(args: PushArgs) -> Result<Value, String> {
    let PushArgs {
        stream,
        payload,
        fields,
        delay,
        at,
        id,
        priority,
        ttl,
        replace,
        key,
    } = args;
    let mut body = json!({ "stream": stream, "priority": priority, "replace": replace });
    message_part(&mut body, payload, &fields)?;
    let (name, value) = due_field(delay, at).ok_or("give --delay or --at (--delay 0 for now)")?;
    body[name] = value;
    for (name, given) in [("id", id), ("ttl", ttl), ("key", key)] {
        if let Some(given) = given {
            body[name] = Value::String(given);
        }
    }
    Ok(body)
}

/// A message's payload (`-`: read from stdin) or its `--field name=value` pairs,
/// into `body` as `payload` or `fields`.
pub(super) fn message_part(
    body: &mut Value,
    payload: Option<String>,
    fields: &[String],
) -> Result<(), String> {
    match (payload, fields.is_empty()) {
        (Some(p), true) => {
            let text = if p == "-" {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .map_err(|e| format!("reading stdin: {e}"))?;
                without_final_newline(s)
            } else {
                p
            };
            body["payload"] = Value::String(text);
        }
        (None, false) => {
            let mut pairs = Vec::new();
            for f in fields {
                let (k, v) = f
                    .split_once('=')
                    .ok_or_else(|| format!("--field {f:?}: write it as name=value"))?;
                pairs.push(json!([k, v]));
            }
            body["fields"] = Value::Array(pairs);
        }
        _ => return Err("give a payload or --field name=value (not both)".into()),
    }
    Ok(())
}

/// The API field for `--delay` (as text) or `--at` (epoch ms as a number, else
/// RFC 3339 text); None when neither was given.
pub(super) fn due_field(
    delay: Option<String>,
    at: Option<String>,
) -> Option<(&'static str, Value)> {
    match (delay, at) {
        (Some(d), _) => Some(("delay", Value::String(d))),
        (None, Some(a)) => Some((
            "deliver_at",
            a.parse::<u64>()
                .map(Value::from)
                .unwrap_or(Value::String(a)),
        )),
        (None, None) => None,
    }
}

/// Text read from stdin, its one final line break dropped (`echo x` sends "x\n").
fn without_final_newline(mut text: String) -> String {
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> PushArgs {
        PushArgs {
            stream: "orders".into(),
            payload: Some("hi".into()),
            fields: vec![],
            delay: Some("20m".into()),
            at: None,
            id: None,
            priority: 0,
            ttl: None,
            replace: false,
            key: None,
        }
    }

    #[test]
    fn the_command_line_becomes_the_push_body() {
        assert_eq!(
            body(args()).unwrap(),
            json!({ "stream": "orders", "priority": 0, "replace": false, "payload": "hi", "delay": "20m" })
        );
        let keyed = PushArgs {
            key: Some("order-42".into()),
            id: Some("r-1".into()),
            ..args()
        };
        let b = body(keyed).unwrap();
        assert_eq!(
            (b["key"].as_str(), b["id"].as_str()),
            (Some("order-42"), Some("r-1"))
        );
        let fields = PushArgs {
            payload: None,
            fields: vec!["a=1".into(), "b=x=y".into()],
            ..args()
        };
        assert_eq!(
            body(fields).unwrap()["fields"],
            json!([["a", "1"], ["b", "x=y"]])
        );
        let bad = PushArgs {
            payload: None,
            fields: vec!["a".into()],
            ..args()
        };
        assert_eq!(
            body(bad).unwrap_err(),
            "--field \"a\": write it as name=value"
        );
        let neither = PushArgs {
            payload: None,
            ..args()
        };
        assert!(body(neither).unwrap_err().starts_with("give a payload"));
        let at = PushArgs {
            delay: None,
            at: Some("1700000000000".into()),
            ..args()
        };
        assert_eq!(body(at).unwrap()["deliver_at"], json!(1_700_000_000_000u64));
    }

    #[test]
    fn one_final_newline_is_dropped_from_stdin() {
        for (read, payload) in [
            ("hi\n", "hi"),
            ("hi\r\n", "hi"),
            ("hi", "hi"),
            ("hi\n\n", "hi\n"),
            ("", ""),
        ] {
            assert_eq!(without_final_newline(read.to_owned()), payload, "{read:?}");
        }
    }
}
