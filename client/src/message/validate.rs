//! The rules a message must satisfy before it is stored: stream and field names,
//! priority, delay, ttl and size. Checked without Redis; absolute due times are
//! bounded by the schedule script against Redis's clock.

use std::time::Duration;

use thiserror::Error;

use super::{Due, MAX_PRIORITY, NewMessage};

impl NewMessage {
    /// Checks what can be checked without Redis: stream name, fields (see
    /// [`check_field_names`]), priority, delay bounds and size. `max_delay` bounds
    /// relative delays here; absolute due times are bounded by the schedule script
    /// against Redis's clock.
    pub fn validate(&self, limits: &Limits, own: &OwnFields) -> Result<(), InvalidMessage> {
        validate_stream(&self.stream)?;
        if self.fields.is_empty() {
            return Err(InvalidMessage::Fields(
                "fields: must hold at least one field/value pair".into(),
            ));
        }
        if self.fields.len() > limits.max_fields {
            return Err(InvalidMessage::Fields(format!(
                "fields: {} pairs is more than the {} allowed (api.max_fields)",
                self.fields.len(),
                limits.max_fields
            )));
        }
        check_field_names(&self.stream, &self.fields, own)?;
        if self.priority > MAX_PRIORITY {
            return Err(InvalidMessage::Priority(format!(
                "priority {}: must be 0 to {MAX_PRIORITY}",
                self.priority
            )));
        }
        limits.check_delay(self.due)?;
        if self.ttl.is_some_and(|ttl| ttl.is_zero()) {
            return Err(InvalidMessage::Ttl("ttl: must be longer than 0".into()));
        }
        if let Some(ttl) = self
            .ttl
            .filter(|ttl| u64::try_from(ttl.as_millis()).is_err())
        {
            return Err(InvalidMessage::Ttl(format!(
                "ttl {}: longer than {} ms, the most a ttl can be",
                crate::human::duration(ttl),
                u64::MAX
            )));
        }
        let size = self.size();
        if size > limits.max_message_bytes {
            return Err(InvalidMessage::TooLarge(format!(
                "message is {size} bytes, more than api.max_message_bytes {}",
                limits.max_message_bytes
            )));
        }
        Ok(())
    }
}

/// Prefix of the field names delayq keeps for itself: inbox instructions,
/// dead-letter annotations and, by default, the id and attempt fields it adds to
/// every delivered entry.
pub const RESERVED_PREFIX: &str = "delayq-";

/// The fields the forwarder adds to each delivered entry (`forwarder.id_field`,
/// `forwarder.attempt_field`, `forwarder.key_field` or the stream's
/// `streams.key_field.<stream>`); None when it adds none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnFields {
    pub id_field: Option<String>,
    pub attempt_field: Option<String>,
    /// The key's field of every stream not in `stream_key_fields`.
    pub key_field: Option<String>,
    /// Streams whose key's field is their own (None: their entries carry no key).
    pub stream_key_fields: Vec<(String, Option<String>)>,
}

impl OwnFields {
    /// The field that carries a message's business key on `stream`'s entries.
    pub fn key_field_for(&self, stream: &str) -> Option<&str> {
        key_field_of(self.key_field.as_deref(), &self.stream_key_fields, stream)
    }
}

/// The field that carries a message's business key on `stream`'s entries: the
/// stream's own in `per_stream` (None there: none), else `default`.
pub fn key_field_of<'a>(
    default: Option<&'a str>,
    per_stream: &'a [(String, Option<String>)],
    stream: &str,
) -> Option<&'a str> {
    match per_stream.iter().find(|(s, _)| s == stream) {
        Some((_, field)) => field.as_deref(),
        None => default,
    }
}

/// The one check of a message's field names, whichever way it comes in: none may
/// be empty, start with [`RESERVED_PREFIX`], or equal a field the forwarder adds
/// to `stream`'s entries (a delivered entry would carry that name twice).
pub fn check_field_names(
    stream: &str,
    fields: &[(String, String)],
    own: &OwnFields,
) -> Result<(), InvalidMessage> {
    let key_field = own.key_field_for(stream);
    for (name, _) in fields {
        if name.is_empty() {
            return Err(InvalidMessage::Fields(
                "fields: field name \"\" must not be empty".into(),
            ));
        }
        let added = [
            own.id_field.as_deref(),
            own.attempt_field.as_deref(),
            key_field,
        ]
        .into_iter()
        .flatten()
        .any(|f| f == name);
        if added || name.starts_with(RESERVED_PREFIX) {
            return Err(InvalidMessage::Fields(format!(
                "fields: field name {name:?} is reserved: delayq writes {RESERVED_PREFIX}* \
                 fields and the forwarder.id_field / attempt_field / key_field (or the \
                 stream's streams.key_field) fields itself; rename it"
            )));
        }
    }
    Ok(())
}

/// Whether `text` has no spaces and no control characters: the rule for stream,
/// group and consumer names, tokens and field names that travel as plain words.
pub fn is_plain(text: &str) -> bool {
    !text.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// A stream name must be a plain, printable key name; `streams.allow` decides
/// which names are permitted on top of that.
pub fn validate_stream(stream: &str) -> Result<(), InvalidMessage> {
    if stream.is_empty() || stream.len() > 256 {
        return Err(InvalidMessage::Stream(format!(
            "stream {stream:?}: must be 1 to 256 bytes long (UTF-8)"
        )));
    }
    if !is_plain(stream) {
        return Err(InvalidMessage::Stream(format!(
            "stream {stream:?}: must not contain spaces or control characters"
        )));
    }
    Ok(())
}

/// Bounds applied to every message, from config.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_delay: Duration,
    pub max_message_bytes: usize,
    pub max_fields: usize,
}

impl Limits {
    /// Refuses a relative delay longer than `max_delay`. An absolute time is
    /// checked against Redis's clock by the scripts instead.
    pub fn check_delay(&self, due: Due) -> Result<(), InvalidMessage> {
        match due {
            Due::In(delay) if delay > self.max_delay => Err(InvalidMessage::Delay(format!(
                "delay {}: longer than api.max_delay {}",
                crate::human::duration(delay),
                crate::human::duration(self.max_delay)
            ))),
            _ => Ok(()),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_delay: Duration::from_secs(365 * 24 * 3600),
            max_message_bytes: 1 << 20,
            max_fields: 1000,
        }
    }
}

/// Why a message was refused. Each text names the input, the rule and, where
/// it helps, the fix.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum InvalidMessage {
    #[error("{0}")]
    Id(String),
    #[error("{0}")]
    Key(String),
    #[error("{0}")]
    Stream(String),
    #[error("{0}")]
    Fields(String),
    #[error("{0}")]
    Priority(String),
    #[error("{0}")]
    Delay(String),
    #[error("{0}")]
    Ttl(String),
    #[error("{0}")]
    TooLarge(String),
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::props::daemon_fields;
    use super::*;
    use delayq_harness::props::expect;

    fn validated(msg: NewMessage) -> Result<(), InvalidMessage> {
        msg.validate(&Limits::default(), &daemon_fields())
    }

    #[test]
    fn a_stream_s_own_key_field_is_reserved_on_that_stream_only() {
        let own = OwnFields {
            key_field: Some("key".into()),
            stream_key_fields: vec![
                ("orders".into(), Some("order".into())),
                ("quiet".into(), None),
            ],
            ..OwnFields::default()
        };
        for (stream, name, accepted) in [
            ("orders", "order", false),
            ("orders", "key", true),
            ("billing", "key", false),
            ("billing", "order", true),
            ("quiet", "key", true),
        ] {
            let fields = [(name.to_owned(), "v".to_owned())];
            let checked = check_field_names(stream, &fields, &own);
            assert_eq!(checked.is_ok(), accepted, "{stream} {name}: {checked:?}");
        }
        assert_eq!(own.key_field_for("orders"), Some("order"));
        assert_eq!(own.key_field_for("quiet"), None);
        assert_eq!(own.key_field_for("billing"), Some("key"));
    }

    proptest! {
        #[test]
        fn plain_stream_names_are_accepted(name in "[^\\s\\p{Cc}]{1,64}") {
            prop_assert!(is_plain(&name));
            expect(&name, validate_stream(&name), Some(()))?;
        }

        #[test]
        fn names_with_spaces_or_control_characters_are_refused(
            name in "[a-z]{0,10}[\\s\\p{Cc}][a-z]{0,10}",
        ) {
            prop_assert!(!is_plain(&name));
            expect(&name, validate_stream(&name), None)?;
        }

        #[test]
        fn reserved_field_names_are_refused_by_name(rest in "\\PC{0,20}", own in "[a-z-]{1,12}") {
            let own = format!("x-{own}");
            let own_fields = OwnFields { attempt_field: Some(own.clone()), ..OwnFields::default() };
            for name in [format!("{RESERVED_PREFIX}{rest}"), own] {
                let fields = [("a".to_owned(), "1".to_owned()), (name.clone(), "v".to_owned())];
                let refusal = check_field_names("s", &fields, &own_fields).unwrap_err().to_string();
                prop_assert!(refusal.contains(&format!("{name:?} is reserved")), "{}", refusal);
            }
        }

        #[test]
        fn other_field_names_are_accepted(name in "\\PC{1,20}") {
            prop_assume!(!name.starts_with(RESERVED_PREFIX));
            let fields = [(name.clone(), "v".to_owned())];
            expect(&name, check_field_names("s", &fields, &daemon_fields()), Some(()))?;
        }

        #[test]
        fn priorities_above_nine_are_refused(priority: u8) {
            let fits = priority <= MAX_PRIORITY;
            expect("priority", validated(NewMessage { priority, ..msg() }), fits.then_some(()))?;
        }

        #[test]
        fn ttls_must_fit_in_u64_milliseconds(secs: u64) {
            let fits = secs > 0 && secs.checked_mul(1000).is_some();
            let ttl = Some(Duration::from_secs(secs));
            expect("ttl", validated(NewMessage { ttl, ..msg() }), fits.then_some(()))?;
        }
    }

    #[track_caller]
    fn check_valid(msg: NewMessage, expected: Result<(), &str>) {
        let got = msg
            .validate(&Limits::default(), &daemon_fields())
            .map_err(|e| e.to_string());
        match expected {
            Ok(()) => assert_eq!(got, Ok(())),
            Err(part) => {
                let err = got.expect_err("should be invalid");
                assert!(err.contains(part), "{err:?} should mention {part:?}");
            }
        }
    }

    fn msg() -> NewMessage {
        NewMessage::payload("orders", "hello", Duration::from_secs(1))
    }

    #[test]
    fn validation() {
        check_valid(msg(), Ok(()));
        check_valid(
            NewMessage {
                stream: "".into(),
                ..msg()
            },
            Err("stream"),
        );
        check_valid(
            NewMessage {
                stream: "a b".into(),
                ..msg()
            },
            Err("spaces"),
        );
        check_valid(
            NewMessage {
                fields: vec![],
                ..msg()
            },
            Err("at least one"),
        );
        check_valid(
            NewMessage {
                fields: vec![("".into(), "v".into())],
                ..msg()
            },
            Err("field name"),
        );
        check_valid(
            NewMessage {
                fields: vec![("a".into(), "1".into()), ("delayq-id".into(), "x".into())],
                ..msg()
            },
            Err("field name \"delayq-id\" is reserved"),
        );
        check_valid(
            NewMessage {
                priority: 10,
                ..msg()
            },
            Err("priority 10"),
        );
        check_valid(
            NewMessage {
                due: Due::In(Duration::from_secs(366 * 86400)),
                ..msg()
            },
            Err("max_delay"),
        );
        check_valid(
            NewMessage {
                ttl: Some(Duration::ZERO),
                ..msg()
            },
            Err("ttl"),
        );
        check_valid(
            NewMessage {
                fields: vec![("p".into(), "x".repeat(2 << 20))],
                ..msg()
            },
            Err("max_message_bytes"),
        );
    }
}
