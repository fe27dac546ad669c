//! The message model: ids, due times, priorities, the rules a message must
//! satisfy before it is stored, and the message as the store holds it. Everything
//! here is pure (no I/O).
//!
//! - `id.rs`: [`MessageId`] (checks, generation, shard) and [`EntryId`];
//!   `made.rs` and `placed.rs` the ids this process makes.
//! - `key.rs`: [`MessageKey`], a message's business key.
//! - `due.rs`: [`Due`], due-set scores and the durations clients write.
//! - `validate.rs`: [`NewMessage::validate`] and the rules behind it.
//! - `codec.rs`: [`StoredMessage`], and how a message crosses into the store's
//!   scripts and back.

pub(crate) mod codec;
mod due;
mod id;
mod key;
mod made;
mod placed;
mod validate;

use std::time::Duration;

pub use codec::StoredMessage;
pub use due::{Due, due_score, parse_duration, parse_duration_field};
pub use id::{EntryId, MAX_ID_LEN, MessageId};
pub use key::{MAX_KEY_LEN, MessageKey};
pub use placed::placed_score;
pub use validate::{
    InvalidMessage, Limits, OwnFields, RESERVED_PREFIX, check_field_names, is_plain, key_field_of,
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
    /// The producer's business key, under which the message can be listed and
    /// cancelled with the others of its stream that carry it.
    pub key: Option<MessageKey>,
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
            key: None,
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

    /// The same message under business key `key` (None: none).
    pub fn with_key(self, key: Option<MessageKey>) -> Self {
        NewMessage { key, ..self }
    }

    /// Bytes of stream name, key, field names and values: what the message costs to hold.
    pub fn size(&self) -> usize {
        self.stream.len()
            + self.key.as_ref().map_or(0, |k| k.as_str().len())
            + self
                .fields
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}

/// The shard of the id whose text is `text` (see [`MessageId::shard`]; the id maker
/// reads it off ids it has not written out yet).
fn shard_of_text(text: &[u8], shards: u16) -> u16 {
    (crc32fast::hash(text) % u32::from(shards)) as u16
}

/// The fields a daemon with the default configuration adds, for the parsers'
/// property tests (their strategies are `delayq_harness::props`).
#[cfg(test)]
pub(crate) mod props {
    /// The fields a daemon with the default configuration adds.
    pub fn daemon_fields() -> super::OwnFields {
        super::OwnFields {
            id_field: Some("delayq-id".into()),
            attempt_field: Some("delayq-attempt".into()),
            ..super::OwnFields::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::props::daemon_fields;
    use super::*;
    use delayq_harness::props::text;

    proptest! {
        #[test]
        fn parsers_never_panic(text in text()) {
            let _ = parse_duration(&text);
            let _ = parse_duration_field("delay", &text);
            let _ = MessageId::parse(&text);
            let _ = MessageKey::parse(&text);
            let _ = EntryId::parse(&text);
            let _ = validate_stream(&text);
            let _ = check_field_names(&text, &[(text.clone(), text.clone())], &daemon_fields());
        }
    }
}
