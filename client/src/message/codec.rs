//! How a message crosses into the store's scripts and back: a new message as the
//! arguments of a schedule call, and [`StoredMessage`], a scheduled message as the
//! store holds it, as a script answers it. The Lua side of both is the store's
//! prelude (`read_new_message`; the body schema `body_fields` and `body_values`).

use redis::{RedisWrite, ToRedisArgs, Value};

use super::{Due, Fields, NewMessage};

/// A scheduled message as the store holds it: what `Store::get` answers. Its fields
/// are the body schema's (the prelude's `body_fields`), in the same order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMessage {
    pub stream: String,
    pub fields: Fields,
    pub due_ms: u64,
    pub priority: u8,
    /// When this attempt was stored.
    pub created_ms: u64,
    /// 1, and one more for each redelivery.
    pub attempt: u64,
    /// After this the message is dead-lettered as expired instead of delivered.
    pub expire_at_ms: Option<u64>,
    /// On a redelivery: when attempt 1 reached the stream.
    pub first_delivered_ms: Option<u64>,
    /// On a redelivery: why it was redelivered (the entry left unacknowledged, by whom).
    pub redelivery_reason: Option<String>,
    /// The producer's business key, if it gave one.
    pub key: Option<String>,
}

impl StoredMessage {
    /// Reads a stored message as a script answers it (the prelude's `body_values`):
    /// the schema's fields in order, an optional one nil when it is not set.
    pub(crate) fn from_values(values: &[Value]) -> Result<StoredMessage, String> {
        let mut next = Reader(values.iter());
        Ok(StoredMessage {
            stream: text(next.required("stream")?)?,
            fields: pairs(next.required("fields")?)?,
            due_ms: number(next.required("due")?)?,
            priority: u8::try_from(number(next.required("priority")?)?)
                .map_err(|_| "priority above 255".to_owned())?,
            created_ms: number(next.required("created")?)?,
            attempt: number(next.required("attempt")?)?,
            expire_at_ms: Some(number(next.required("expire_at")?)?).filter(|&ms| ms > 0),
            first_delivered_ms: next
                .optional()
                .map(number)
                .transpose()?
                .filter(|&ms| ms > 0),
            redelivery_reason: next
                .optional()
                .map(text)
                .transpose()?
                .filter(|r| !r.is_empty()),
            key: next.optional().map(text).transpose()?,
        })
    }

    /// This message as a script answers it: the inverse of [`StoredMessage::from_values`].
    #[cfg(test)]
    pub(crate) fn to_values(&self) -> Vec<Value> {
        let number = |n: u64| Value::Int(n as i64);
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let fields = self
            .fields
            .iter()
            .flat_map(|(name, value)| [text(name), text(value)])
            .collect();
        vec![
            text(&self.stream),
            Value::Array(fields),
            number(self.due_ms),
            number(u64::from(self.priority)),
            number(self.created_ms),
            number(self.attempt),
            number(self.expire_at_ms.unwrap_or(0)),
            self.first_delivered_ms.map_or(Value::Nil, number),
            self.redelivery_reason.as_deref().map_or(Value::Nil, text),
            self.key.as_deref().map_or(Value::Nil, text),
        ]
    }
}

/// A script's answer, read value by value in order.
struct Reader<'a>(std::slice::Iter<'a, Value>);

impl<'a> Reader<'a> {
    /// The next value; None when it is nil or the answer has ended.
    fn optional(&mut self) -> Option<&'a Value> {
        self.0.next().filter(|v| !matches!(v, Value::Nil))
    }

    fn required(&mut self, name: &str) -> Result<&'a Value, String> {
        self.optional()
            .ok_or_else(|| format!("stored message without {name}"))
    }
}

/// A reply value as text: a string, or a number written out.
pub(crate) fn text(v: &Value) -> Result<String, String> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(n) => Ok(n.to_string()),
        other => Err(format!("expected a string, got {other:?}")),
    }
}

/// A reply value as a number: an integer, or a string holding one.
pub(crate) fn int(v: &Value) -> Result<i64, String> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("expected a number, got {b:?}")),
        other => Err(format!("expected a number, got {other:?}")),
    }
}

/// A reply value as a count of something: a number, a negative one read as 0.
fn number(v: &Value) -> Result<u64, String> {
    Ok(int(v)?.max(0) as u64)
}

/// A flat reply array `field, value, ...` as pairs.
fn pairs(v: &Value) -> Result<Fields, String> {
    match v {
        Value::Array(flat) if flat.len() % 2 == 0 => flat
            .chunks(2)
            .map(|pair| Ok((text(&pair[0])?, text(&pair[1])?)))
            .collect(),
        other => Err(format!("expected field/value pairs, got {other:?}")),
    }
}

/// One script argument, borrowed from the message it belongs to (or made for it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Arg<'a> {
    Text(&'a str),
    Number(u64),
    Bytes(Vec<u8>),
}

impl ToRedisArgs for Arg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        match self {
            Arg::Text(text) => text.write_redis_args(out),
            Arg::Number(n) => n.write_redis_args(out),
            Arg::Bytes(bytes) => out.write_arg(bytes),
        }
    }
}

impl Due {
    /// The due time as the scripts take it: its kind (`in`: the value is a delay in
    /// ms; `at`: epoch ms) and its value.
    pub(crate) fn script_args(self) -> [Arg<'static>; 2] {
        [Arg::Text(self.kind()), Arg::Number(self.as_ms())]
    }

    /// The due time's kind as the scripts take it.
    fn kind(self) -> &'static str {
        match self {
            Due::In(_) => "in",
            Due::At(_) => "at",
        }
    }
}

/// What messages of one schedule call may share, carried once for all of them (a
/// context, in the layout the prelude's `read_new_message` reads): the due time's
/// kind, priority, ttl ms (0 = none) and target stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SharedArgs<'a> {
    pub due_kind: &'static str,
    pub priority: u8,
    pub ttl_ms: u64,
    pub stream: &'a str,
}

impl NewMessage {
    /// What this message may share with others of its call ([`SharedArgs`]).
    pub(crate) fn shared_args(&self) -> SharedArgs<'_> {
        SharedArgs {
            due_kind: self.due.kind(),
            priority: self.priority,
            ttl_ms: self.ttl.map_or(0, |ttl| ttl.as_millis() as u64),
            stream: &self.stream,
        }
    }

    /// This message's own arguments in a schedule call, after its context's number
    /// (see [`SharedArgs`]): id, due value, key ("" = none), then its fields packed
    /// ([`packed_fields`]).
    pub(crate) fn script_args(&self) -> [Arg<'_>; 4] {
        [
            Arg::Text(self.id.as_str()),
            Arg::Number(self.due.as_ms()),
            Arg::Text(self.key.as_ref().map_or("", |k| k.as_str())),
            Arg::Bytes(packed_fields(&self.fields)),
        ]
    }
}

/// Field/value pairs as the body of a stored message holds them: one MessagePack
/// array of their strings, `[field, value, ...]`, each in the shortest form, as
/// Redis's `cmsgpack.pack` writes a table of strings. The push's script splices it
/// into the body as it is, rather than packing the pairs itself.
pub(crate) fn packed_fields(fields: &Fields) -> Vec<u8> {
    let size: usize = fields.iter().map(|(f, v)| f.len() + v.len() + 10).sum();
    let mut out = Vec::with_capacity(size + 5);
    // Writing into a Vec cannot fail, and no message has 2^32 strings.
    let _ = rmp::encode::write_array_len(&mut out, (2 * fields.len()) as u32);
    for (name, value) in fields {
        let _ = rmp::encode::write_str(&mut out, name);
        let _ = rmp::encode::write_str(&mut out, value);
    }
    out
}

/// A message's own parts as the journal keeps them in its `body` column: JSON
/// `{"fields": [[name, value], …], "priority": p, "ttl_ms": ms or null}`, with
/// `"key": k` when the message has a business key; the id, stream and due time have
/// columns of their own.
#[derive(serde::Serialize, serde::Deserialize)]
struct JournalBody {
    fields: Fields,
    priority: u8,
    ttl_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

impl NewMessage {
    /// This message's journal `body` (see `JournalBody`).
    pub fn journal_body(&self) -> Vec<u8> {
        serde_json::to_vec(&JournalBody {
            fields: self.fields.clone(),
            priority: self.priority,
            ttl_ms: self.ttl.map(|t| t.as_millis() as u64),
            key: self.key.as_ref().map(|k| k.as_str().to_owned()),
        })
        .expect("strings and numbers serialize")
    }

    /// The message a journal row holds: its id, stream and due time, and its body.
    pub fn from_journal(
        id: super::MessageId,
        stream: String,
        body: &[u8],
        due: Due,
    ) -> Result<NewMessage, String> {
        let body: JournalBody = serde_json::from_slice(body).map_err(|e| format!("body: {e}"))?;
        let key = body
            .key
            .as_deref()
            .map(super::MessageKey::parse)
            .transpose()
            .map_err(|e| format!("body: {e}"))?;
        Ok(NewMessage::new(stream, body.fields, due)
            .with_id(id)
            .with_priority(body.priority)
            .with_ttl(body.ttl_ms.map(std::time::Duration::from_millis))
            .with_key(key))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::message::MessageId;

    #[test]
    fn a_journal_body_reads_back_as_the_message_it_was() {
        let fields = vec![
            ("order".to_owned(), "42".to_owned()),
            ("e".into(), "".into()),
        ];
        for (priority, ttl, key) in [
            (0, None, None),
            (9, Some(Duration::from_millis(1500)), Some("order-42")),
            (5, Some(Duration::ZERO), None),
        ] {
            let key = key.map(|k| crate::message::MessageKey::parse(k).unwrap());
            let msg = NewMessage::new("s".to_owned(), fields.clone(), Due::At(1_700_000_000_000))
                .with_id(MessageId::parse("m-1").unwrap())
                .with_priority(priority)
                .with_ttl(ttl)
                .with_key(key.clone());
            let back =
                NewMessage::from_journal(msg.id.clone(), "s".into(), &msg.journal_body(), msg.due)
                    .unwrap();
            assert_eq!(
                (back.fields, back.priority, back.ttl, back.key),
                (fields.clone(), priority, ttl, key)
            );
        }
        // A key the journal holds is checked like any other.
        let bad = br#"{"fields":[["a","b"]],"priority":0,"ttl_ms":null,"key":"a b"}"#;
        assert!(
            NewMessage::from_journal(MessageId::parse("x").unwrap(), "s".into(), bad, Due::At(1))
                .is_err()
        );
        // What journals hold already reads (the body's names are its format).
        let old = br#"{"fields":[["a","b"]],"priority":3,"ttl_ms":null}"#;
        let back =
            NewMessage::from_journal(MessageId::parse("x").unwrap(), "s".into(), old, Due::At(1))
                .unwrap();
        assert_eq!(
            (back.fields, back.priority, back.ttl),
            (vec![("a".into(), "b".into())], 3, None)
        );
        assert!(
            NewMessage::from_journal(MessageId::parse("x").unwrap(), "s".into(), b"{", Due::At(1))
                .is_err()
        );
    }

    /// The body schema's names after the format: the order in which
    /// [`StoredMessage::from_values`] reads a stored message's fields.
    const SCHEMA: [&str; 10] = [
        "stream",
        "fields",
        "due",
        "priority",
        "created",
        "attempt",
        "expire_at",
        "first_delivered",
        "reason",
        "key",
    ];

    /// The largest whole number a Lua number (a double) holds exactly: every number
    /// a script answers is one.
    const MAX_EXACT: u64 = 1 << 53;

    fn stored_message() -> impl Strategy<Value = StoredMessage> {
        let ms = || 0..=MAX_EXACT;
        let text = || "\\PC{0,12}";
        (
            (text(), prop::collection::vec((text(), text()), 0..6)),
            (ms(), any::<u8>(), ms(), ms()),
            (
                prop::option::of(1..=MAX_EXACT),
                prop::option::of(1..=MAX_EXACT),
                prop::option::of("\\PC{1,40}"),
                prop::option::of("[A-Za-z0-9._:-]{1,20}"),
            ),
        )
            .prop_map(
                |(
                    (stream, fields),
                    (due_ms, priority, created_ms, attempt),
                    (expire_at_ms, first_delivered_ms, redelivery_reason, key),
                )| StoredMessage {
                    stream,
                    fields,
                    due_ms,
                    priority,
                    created_ms,
                    attempt,
                    expire_at_ms,
                    first_delivered_ms,
                    redelivery_reason,
                    key,
                },
            )
    }

    /// Any reply value a script could give, nested a little.
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Nil),
            any::<i64>().prop_map(Value::Int),
            "\\PC{0,8}|-?[0-9]{1,21}".prop_map(|s| Value::BulkString(s.into_bytes())),
        ];
        leaf.prop_recursive(2, 16, 6, |inner| {
            prop::collection::vec(inner, 0..6).prop_map(Value::Array)
        })
    }

    proptest! {
        #[test]
        fn stored_messages_round_trip(msg in stored_message()) {
            prop_assert_eq!(StoredMessage::from_values(&msg.to_values()), Ok(msg));
        }

        #[test]
        fn any_answer_is_read_or_refused(values in prop::collection::vec(value(), 0..12)) {
            let _ = StoredMessage::from_values(&values);
        }

        #[test]
        fn a_body_from_before_redeliveries_reads_without_them(msg in stored_message()) {
            let mut values = msg.to_values();
            values.truncate(7);
            let read = StoredMessage::from_values(&values);
            prop_assert_eq!(read, Ok(StoredMessage {
                first_delivered_ms: None,
                redelivery_reason: None,
                key: None,
                ..msg
            }));
        }
    }

    #[test]
    fn a_required_field_left_out_is_refused() {
        let msg = StoredMessage {
            stream: "orders".into(),
            fields: vec![("k".into(), "v".into())],
            due_ms: 5,
            priority: 1,
            created_ms: 4,
            attempt: 1,
            expire_at_ms: None,
            first_delivered_ms: None,
            redelivery_reason: None,
            key: None,
        };
        for (i, name) in SCHEMA.iter().enumerate().take(7) {
            let mut values = msg.to_values();
            values[i] = Value::Nil;
            let refusal = StoredMessage::from_values(&values).unwrap_err();
            assert_eq!(refusal, format!("stored message without {name}"));
        }
    }

    /// The prelude's body schema (`name = b[position]`) names the fields this codec
    /// reads, in the same order after the format.
    #[test]
    fn the_prelude_schema_is_this_codec_order() {
        let prelude = include_str!("../store/lua/prelude/20-body.lua");
        let schema = &prelude[prelude.find("local function body_fields(b)").unwrap()..];
        let schema = &schema[..schema.find("\nend").unwrap()];
        let mut named: Vec<(usize, &str)> = schema
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.trim().split_once(" = b[")?;
                Some((rest.split_once(']')?.0.parse().ok()?, name))
            })
            .collect();
        named.sort();
        let positions: Vec<usize> = named.iter().map(|&(i, _)| i).collect();
        assert_eq!(positions, (1..=SCHEMA.len() + 1).collect::<Vec<_>>());
        let names: Vec<&str> = named.iter().map(|&(_, name)| name).collect();
        assert_eq!(names[0], "format");
        assert_eq!(names[1..], SCHEMA);
    }

    /// What the message shares, then its own arguments, as text (the packed fields
    /// last as their hex).
    #[track_caller]
    fn check_args(msg: NewMessage, expected: &str) {
        let shared = msg.shared_args();
        let own: Vec<String> = msg
            .script_args()
            .into_iter()
            .map(|arg| match arg {
                Arg::Text(text) => text.to_owned(),
                Arg::Number(n) => n.to_string(),
                Arg::Bytes(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
            })
            .collect();
        let shared = format!(
            "{} {} {} {}",
            shared.due_kind, shared.priority, shared.ttl_ms, shared.stream
        );
        assert_eq!(format!("{shared} | {}", own.join(" ")), expected);
    }

    /// The head of a packed string of `len` bytes, by MessagePack's forms.
    #[test]
    fn fields_are_packed_in_the_shortest_form_of_each_length() {
        let head = |len: usize| {
            let packed = packed_fields(&vec![("f".into(), "x".repeat(len))]);
            assert_eq!(&packed[..3], [0x92, 0xa1, b'f'], "{len}");
            assert!(packed.ends_with(&"x".repeat(len).into_bytes()), "{len}");
            packed[3..packed.len() - len].to_vec()
        };
        for (len, expected) in [
            (0, vec![0xa0]),
            (31, vec![0xbf]),
            (32, vec![0xd9, 32]),
            (255, vec![0xd9, 255]),
            (256, vec![0xda, 1, 0]),
            (65_535, vec![0xda, 255, 255]),
            (65_536, vec![0xdb, 0, 1, 0, 0]),
        ] {
            assert_eq!(head(len), expected, "a string of {len} bytes");
        }
        let pairs = |n: usize| -> Vec<u8> {
            let fields = (0..n).map(|_| (String::new(), String::new())).collect();
            packed_fields(&fields)[..3].to_vec()
        };
        assert_eq!(pairs(7)[0], 0x9e, "14 strings: a fixarray");
        assert_eq!(pairs(8), [0xdc, 0, 16], "16 strings: an array 16");
        assert_eq!(
            packed_fields(&vec![("a".into(), "1".into())]),
            [0x92, 0xa1, b'a', 0xa1, b'1']
        );
    }

    fn msg() -> NewMessage {
        NewMessage {
            id: MessageId::parse("m1").unwrap(),
            ..NewMessage::payload("orders", "hi", Duration::from_millis(1500))
        }
    }

    #[test]
    fn a_new_message_as_script_arguments() {
        // The fields last, packed: [ "payload", "hi" ].
        check_args(msg(), "in 0 0 orders | m1 1500  92a77061796c6f6164a26869");
        check_args(
            NewMessage {
                due: Due::At(1_700_000_000_000),
                priority: 9,
                ttl: Some(Duration::from_secs(60)),
                fields: vec![("a".into(), "1".into()), ("b".into(), "".into())],
                ..msg()
            },
            "at 9 60000 orders | m1 1700000000000  94a161a131a162a0",
        );
        check_args(
            msg().with_key(Some(crate::message::MessageKey::parse("order-42").unwrap())),
            "in 0 0 orders | m1 1500 order-42 92a77061796c6f6164a26869",
        );
    }
}
