//! The message model: ids, due times, priorities, the rules a message must
//! satisfy before it is stored, and the message as the store holds it. Everything
//! here is pure (no I/O).
//!
//! - `id.rs`: [`MessageId`] (checks, generation, shard) and [`EntryId`].
//! - `due.rs`: [`Due`], due-set scores and the durations clients write.
//! - `validate.rs`: [`NewMessage::validate`] and the rules behind it.
//! - `codec.rs`: [`StoredMessage`], and how a message crosses into the store's
//!   scripts and back.

pub(crate) mod codec;
mod due;
mod id;
mod validate;

use std::time::Duration;

pub use codec::StoredMessage;
pub use due::{Due, due_score, parse_duration, parse_duration_field};
pub use id::{EntryId, MAX_ID_LEN, MessageId};
pub use validate::{
    InvalidMessage, Limits, OwnFields, RESERVED_PREFIX, check_field_names, is_plain,
    validate_stream,
};

/// Highest priority; higher is forwarded first among messages due in the same millisecond.
pub const MAX_PRIORITY: u8 = 9;

/// Ordered field/value pairs, XADDed verbatim when the message falls due.
pub type Fields = Vec<(String, String)>;

/// A message as a producer hands it over.
#[derive(Clone, Debug, PartialEq)]
pub struct NewMessage {
    pub id: MessageId,
    pub stream: String,
    pub fields: Fields,
    pub due: Due,
    pub priority: u8,
    /// After `due + ttl` the message is no longer worth delivering: it goes to the
    /// dead-letter stream with reason `expired` instead.
    pub ttl: Option<Duration>,
}

impl NewMessage {
    /// A message to `stream` with `fields`, due `due`, under a fresh id, at priority
    /// 0 and with no ttl; `with_id`, `with_priority` and `with_ttl` set the rest.
    pub fn new(stream: impl Into<String>, fields: Fields, due: Due) -> Self {
        NewMessage {
            id: MessageId::generate(),
            stream: stream.into(),
            fields,
            due,
            priority: 0,
            ttl: None,
        }
    }

    /// A message with a single `payload` field, due after `delay`.
    pub fn payload(stream: &str, payload: &str, delay: Duration) -> Self {
        NewMessage::new(
            stream,
            vec![("payload".to_owned(), payload.to_owned())],
            Due::In(delay),
        )
    }

    /// The same message under `id`.
    pub fn with_id(self, id: MessageId) -> Self {
        NewMessage { id, ..self }
    }

    /// The same message at `priority` (0-9, higher first among messages due in the
    /// same millisecond; [`NewMessage::validate`] checks the range).
    pub fn with_priority(self, priority: u8) -> Self {
        NewMessage { priority, ..self }
    }

    /// The same message, past `due + ttl` dead-lettered as expired instead (None: never).
    pub fn with_ttl(self, ttl: Option<Duration>) -> Self {
        NewMessage { ttl, ..self }
    }

    /// Bytes of stream name, field names and values: what the message costs to hold.
    pub fn size(&self) -> usize {
        self.stream.len()
            + self
                .fields
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}

/// What the property tests of client-input parsers share: strategies for the input
/// and one check of a parser's answer.
#[cfg(test)]
pub(crate) mod props {
    use std::fmt::Debug;

    use proptest::prelude::*;
    use serde_json::Value;

    /// Text a client could send: anything, or the characters parsers look at.
    pub fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[0-9a-zA-Z :.+_-]{0,40}",
            "[0-9]{15,45}(-[0-9]{0,45})?",
        ]
    }

    /// A whole number in decimal that does not fit in 64 bits.
    pub fn beyond_u64() -> impl Strategy<Value = String> {
        prop_oneof![
            (u128::from(u64::MAX) + 1..=u128::MAX).prop_map(|n| n.to_string()),
            "[1-9][0-9]{39,60}",
        ]
    }

    /// Any JSON value, with object keys drawn from `keys` or made up.
    pub fn json(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            text().prop_map(Value::from),
        ];
        let key = prop_oneof![prop::sample::select(keys).prop_map(str::to_owned), text()];
        leaf.prop_recursive(3, 48, 8, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
                prop::collection::btree_map(key.clone(), inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// The fields a daemon with the default configuration adds.
    pub fn daemon_fields() -> super::OwnFields {
        super::OwnFields {
            id_field: Some("delayq-id".into()),
            attempt_field: Some("delayq-attempt".into()),
        }
    }

    /// Checks a parser's answer to `input`: `Ok(want)` when `want` is given, an
    /// error otherwise.
    pub fn expect<T: PartialEq + Debug, E: Debug>(
        input: &str,
        got: Result<T, E>,
        want: Option<T>,
    ) -> Result<(), TestCaseError> {
        match (got, want) {
            (Ok(got), Some(want)) => prop_assert_eq!(got, want, "input {:?}", input),
            (Err(_), None) => {}
            (got, want) => prop_assert!(false, "input {input:?}: got {got:?}, expected {want:?}"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::props::{daemon_fields, text};
    use super::*;

    proptest! {
        #[test]
        fn parsers_never_panic(text in text()) {
            let _ = parse_duration(&text);
            let _ = parse_duration_field("delay", &text);
            let _ = MessageId::parse(&text);
            let _ = EntryId::parse(&text);
            let _ = validate_stream(&text);
            let _ = check_field_names(&[(text.clone(), text.clone())], &daemon_fields());
        }
    }
}
