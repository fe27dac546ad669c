//! The message model: ids, due times, priorities and the rules a message
//! must satisfy before it is stored. Everything here is pure.

use std::fmt;
use std::time::Duration;

use thiserror::Error;

/// Longest id a client may supply.
pub const MAX_ID_LEN: usize = 128;
/// Highest priority; higher is forwarded first among messages due in the same millisecond.
pub const MAX_PRIORITY: u8 = 9;

/// A message id: client-supplied (`[A-Za-z0-9._:-]{1,128}`) or generated (a ULID,
/// which sorts by creation time).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    /// Checks a client-supplied id.
    pub fn parse(id: &str) -> Result<Self, InvalidMessage> {
        if id.is_empty() || id.len() > MAX_ID_LEN {
            return Err(InvalidMessage::Id(format!(
                "id {id:?}: must be 1 to {MAX_ID_LEN} characters long"
            )));
        }
        if let Some(bad) = id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
        {
            return Err(InvalidMessage::Id(format!(
                "id {id:?}: character {bad:?} is not allowed (allowed: A-Z a-z 0-9 . _ : -)"
            )));
        }
        Ok(MessageId(id.to_owned()))
    }

    /// A fresh, time-sortable id.
    pub fn generate() -> Self {
        MessageId(ulid::Ulid::new().to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shard this id lives in. CRC-32 (IEEE) is fixed by a standard, so every
    /// version of the daemon and of the client agrees on it.
    pub fn shard(&self, shards: u16) -> u16 {
        (crc32fast::hash(self.0.as_bytes()) % u32::from(shards)) as u16
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// When a message falls due. A relative delay is resolved against Redis's clock
/// inside the schedule script, never against this process's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    In(Duration),
    /// Epoch milliseconds. A time in the past means "as soon as possible".
    At(u64),
}

impl Due {
    pub fn as_ms(&self) -> u64 {
        match self {
            Due::In(d) => d.as_millis() as u64,
            Due::At(ms) => *ms,
        }
    }
}

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
    /// A message with a single `payload` field, due after `delay`.
    pub fn payload(stream: &str, payload: &str, delay: Duration) -> Self {
        NewMessage {
            id: MessageId::generate(),
            stream: stream.to_owned(),
            fields: vec![("payload".to_owned(), payload.to_owned())],
            due: Due::In(delay),
            priority: 0,
            ttl: None,
        }
    }

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
                "fields: {} pairs is more than the {} allowed",
                self.fields.len(),
                limits.max_fields
            )));
        }
        check_field_names(&self.fields, own)?;
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
                humantime::format_duration(ttl),
                u64::MAX
            )));
        }
        let size = self.size();
        if size > limits.max_message_bytes {
            return Err(InvalidMessage::TooLarge(format!(
                "message is {size} bytes, more than max_message_bytes {}",
                limits.max_message_bytes
            )));
        }
        Ok(())
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

/// Prefix of the field names delayq keeps for itself: inbox instructions,
/// dead-letter annotations and, by default, the id and attempt fields it adds to
/// every delivered entry.
pub const RESERVED_PREFIX: &str = "delayq-";

/// The fields the forwarder adds to each delivered entry (`forwarder.id_field`,
/// `forwarder.attempt_field`); None when it adds none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnFields {
    pub id_field: Option<String>,
    pub attempt_field: Option<String>,
}

impl OwnFields {
    /// The names a daemon with this configuration writes.
    pub fn of(forwarder: &crate::config::ForwarderConfig) -> Self {
        OwnFields {
            id_field: forwarder.id_field.clone(),
            attempt_field: forwarder.attempt_field.clone(),
        }
    }
}

/// The one check of a message's field names, whichever way it comes in: none may
/// be empty, start with [`RESERVED_PREFIX`], or equal a field the forwarder adds
/// (a delivered entry would carry that name twice).
pub fn check_field_names(
    fields: &[(String, String)],
    own: &OwnFields,
) -> Result<(), InvalidMessage> {
    for (name, _) in fields {
        if name.is_empty() {
            return Err(InvalidMessage::Fields(
                "fields: field name \"\" must not be empty".into(),
            ));
        }
        let added = [&own.id_field, &own.attempt_field]
            .into_iter()
            .flatten()
            .any(|f| f == name);
        if added || name.starts_with(RESERVED_PREFIX) {
            return Err(InvalidMessage::Fields(format!(
                "fields: field name {name:?} is reserved: delayq writes {RESERVED_PREFIX}* \
                 fields and the forwarder.id_field / forwarder.attempt_field fields itself; \
                 rename it"
            )));
        }
    }
    Ok(())
}

/// A stream entry id as a client gives it: `<ms>-<seq>` or `<ms>`, each part a
/// decimal number (at most 20 digits) that fits in 64 bits, as Redis requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryId {
    pub ms: u64,
    pub seq: Option<u64>,
}

impl EntryId {
    pub fn parse(text: &str) -> Option<EntryId> {
        let number = |s: &str| {
            (!s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u64>().ok())
                .flatten()
        };
        let (ms, seq) = match text.split_once('-') {
            Some((ms, seq)) => (ms, Some(number(seq)?)),
            None => (text, None),
        };
        Some(EntryId {
            ms: number(ms)?,
            seq,
        })
    }

    /// Whether no entry can come after this one (`XRANGE` refuses an exclusive
    /// start here).
    pub fn is_last(&self) -> bool {
        self.ms == u64::MAX && self.seq == Some(u64::MAX)
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.seq {
            Some(seq) => write!(f, "{}-{seq}", self.ms),
            None => write!(f, "{}", self.ms),
        }
    }
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
            "stream {stream:?}: must be 1 to 256 characters long"
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
                "delay {}: longer than max_delay {}",
                humantime::format_duration(delay),
                humantime::format_duration(self.max_delay)
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

/// Score of a message in its shard's due set: due milliseconds, then priority
/// (higher first) as the tie-break. Exact in an f64 until the year 30000.
pub fn due_score(due_ms: u64, priority: u8) -> u64 {
    due_ms * 10 + u64::from(MAX_PRIORITY - priority)
}

/// Parses a human duration such as `"20m"`, `"1500ms"` or `"1h 30m"`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. \"20m\", \"1500ms\""))
}

/// Milliseconds (`1500`) or human text (`20m`), as an inbox field or a query
/// parameter gives a duration; never negative. Errors name the field.
pub fn parse_duration_field(name: &str, value: &str) -> Result<Duration, String> {
    let value = value.trim();
    if value.starts_with('-') {
        return Err(format!("{name} {value:?}: must not be negative"));
    }
    if let Ok(ms) = value.parse::<u64>() {
        return Ok(Duration::from_millis(ms));
    }
    parse_duration(value).map_err(|e| format!("{name}: {e}"))
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

    use super::props::{beyond_u64, expect, text};
    use super::*;

    /// The fields a daemon with the default configuration adds.
    fn daemon_fields() -> OwnFields {
        OwnFields {
            id_field: Some("delayq-id".into()),
            attempt_field: Some("delayq-attempt".into()),
        }
    }

    fn validated(msg: NewMessage) -> Result<(), InvalidMessage> {
        msg.validate(&Limits::default(), &daemon_fields())
    }

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

        #[test]
        fn milliseconds_round_trip(ms: u64) {
            let text = ms.to_string();
            expect(&text, parse_duration_field("delay", &text), Some(Duration::from_millis(ms)))?;
        }

        #[test]
        fn human_durations_round_trip(secs: u64, nanos in 0u32..1_000_000_000) {
            let duration = Duration::new(secs, nanos);
            let text = humantime::format_duration(duration).to_string();
            expect(&text, parse_duration_field("delay", &text), Some(duration))?;
        }

        #[test]
        fn durations_beyond_u64_are_refused(n in beyond_u64(), unit in "|ms|s|m|h|d") {
            let text = format!("{n}{unit}");
            expect(&text, parse_duration_field("delay", &text), None)?;
        }

        #[test]
        fn durations_that_overflow_are_refused_not_wrapped(n: u64) {
            let text = format!("{n}h");
            expect(&text, parse_duration(&text), n.checked_mul(3600).map(Duration::from_secs))?;
        }

        #[test]
        fn negative_durations_are_refused(text in "-[0-9a-z ]{0,20}") {
            expect(&text, parse_duration_field("delay", &text), None)?;
        }

        #[test]
        fn message_ids_round_trip(id in "[A-Za-z0-9._:-]{1,128}") {
            expect(&id, MessageId::parse(&id).map(|m| m.as_str().to_owned()), Some(id.clone()))?;
        }

        #[test]
        fn long_message_ids_or_other_characters_are_refused(
            id in "[A-Za-z0-9._:-]{129,300}|[a-z0-9]{0,5}[^A-Za-z0-9._:-][a-z0-9]{0,5}",
        ) {
            expect(&id, MessageId::parse(&id), None)?;
        }

        #[test]
        fn entry_ids_round_trip(ms: u64, seq: Option<u64>) {
            let id = EntryId { ms, seq };
            expect(&id.to_string(), EntryId::parse(&id.to_string()).ok_or(()), Some(id))?;
        }

        #[test]
        fn entry_ids_beyond_u64_are_refused(big in beyond_u64(), small: u64) {
            for text in [format!("{big}-{small}"), format!("{small}-{big}"), big.clone()] {
                expect(&text, EntryId::parse(&text).ok_or(()), None)?;
            }
        }

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
            let own_fields = OwnFields { id_field: None, attempt_field: Some(own.clone()) };
            for name in [format!("{RESERVED_PREFIX}{rest}"), own] {
                let fields = [("a".to_owned(), "1".to_owned()), (name.clone(), "v".to_owned())];
                let refusal = check_field_names(&fields, &own_fields).unwrap_err().to_string();
                prop_assert!(refusal.contains(&format!("{name:?} is reserved")), "{}", refusal);
            }
        }

        #[test]
        fn other_field_names_are_accepted(name in "\\PC{1,20}") {
            prop_assume!(!name.starts_with(RESERVED_PREFIX));
            let fields = [(name.clone(), "v".to_owned())];
            expect(&name, check_field_names(&fields, &daemon_fields()), Some(()))?;
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
    fn check_id(id: &str, ok: bool) {
        assert_eq!(MessageId::parse(id).is_ok(), ok, "id {id:?}");
    }

    #[test]
    fn ids() {
        check_id("order-42", true);
        check_id("a.b_c:d-e", true);
        check_id(&"x".repeat(128), true);
        check_id(&"x".repeat(129), false);
        check_id("", false);
        check_id("has space", false);
        check_id("slash/no", false);
        check_id("ünï", false);
        check_id(MessageId::generate().as_str(), true);
    }

    #[test]
    fn generated_ids_sort_by_time() {
        let a = MessageId::generate();
        std::thread::sleep(Duration::from_millis(2));
        let b = MessageId::generate();
        assert!(a < b, "{a} < {b}");
    }

    #[test]
    fn shards_are_stable_and_spread() {
        let id = MessageId::parse("order-42").unwrap();
        assert_eq!(id.shard(16), id.shard(16));
        let mut seen = [0u32; 16];
        for i in 0..1600 {
            seen[MessageId::parse(&format!("m{i}")).unwrap().shard(16) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "uneven spread: {seen:?}");
    }

    #[test]
    fn scores_order_by_due_then_priority() {
        assert!(due_score(1000, 0) < due_score(1001, 9));
        assert!(due_score(1000, 9) < due_score(1000, 0));
        assert_eq!(due_score(1000, 9), 10_000);
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

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20m"), Ok(Duration::from_secs(1200)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("not a duration")
        );
    }
}
