//! An inbox entry's reserved `delayq-*` fields, read into a message or a reason.

use super::*;

/// Prefix of the reserved fields; any other `delayq-*` field is refused, so a typo
/// (`delayq-dealy`) is reported instead of forwarded.
pub(super) const RESERVED_PREFIX: &str = crate::message::RESERVED_PREFIX;
pub(super) const STREAM_FIELD: &str = "delayq-stream";
pub(super) const DELAY_FIELD: &str = "delayq-delay";
pub(super) const AT_FIELD: &str = "delayq-at";
pub(super) const ID_FIELD: &str = "delayq-id";
pub(super) const PRIORITY_FIELD: &str = "delayq-priority";
pub(super) const TTL_FIELD: &str = "delayq-ttl";
pub(super) const KEY_FIELD: &str = "delayq-key";
pub(super) const RESERVED: &[&str] = &[
    STREAM_FIELD,
    DELAY_FIELD,
    AT_FIELD,
    ID_FIELD,
    PRIORITY_FIELD,
    TTL_FIELD,
    KEY_FIELD,
];
/// Bytes the reserved fields may add to `api.max_message_bytes` in an entry whose
/// fields are still copied into its rejection.
pub(super) const RESERVED_BYTES: usize = 4096;

/// Turns an inbox entry into a message, or says why it cannot be one, naming the field.
pub fn parse_entry(entry: &InboxEntry, config: &Config) -> Result<NewMessage, String> {
    let raw = match &entry.fields {
        EntryFields::Read(raw) => raw,
        EntryFields::Deleted => {
            return Err("entry deleted from the inbox before it was scheduled".into());
        }
        EntryFields::Unread => return Err("entry not read".into()),
    };
    let mut reserved: Vec<(&str, String)> = Vec::new();
    let mut fields = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        let name = std::str::from_utf8(name)
            .map_err(|_| format!("field name {:?}: not UTF-8", String::from_utf8_lossy(name)))?;
        let value =
            String::from_utf8(value.clone()).map_err(|_| format!("{name}: value is not UTF-8"))?;
        if let Some(&known) = RESERVED.iter().find(|&&r| r == name) {
            if reserved.iter().any(|(n, _)| *n == known) {
                return Err(format!("{known}: given more than once"));
            }
            reserved.push((known, value));
        } else if name.starts_with(RESERVED_PREFIX) {
            return Err(format!(
                "{name}: unknown reserved field (known: {})",
                RESERVED.join(", ")
            ));
        } else {
            fields.push((name.to_owned(), value));
        }
    }
    let get = |name: &str| {
        reserved
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    };

    let stream =
        get(STREAM_FIELD).ok_or_else(|| format!("{STREAM_FIELD}: required (the target stream)"))?;
    crate::message::validate_stream(stream).map_err(|e| format!("{STREAM_FIELD}: {e}"))?;
    if let Some(refusal) = config.target_refusal(stream) {
        return Err(format!("{STREAM_FIELD}: {refusal}"));
    }
    let due = match (get(DELAY_FIELD), get(AT_FIELD)) {
        (Some(_), Some(_)) => return Err(format!("{DELAY_FIELD}, {AT_FIELD}: give one, not both")),
        (None, None) => return Err(format!("{DELAY_FIELD} or {AT_FIELD}: required")),
        (Some(delay), None) => Due::In(parse_duration_field(DELAY_FIELD, delay)?),
        (None, Some(at)) => Due::At(epoch_ms(at)?),
    };
    let id = match get(ID_FIELD) {
        Some(id) => MessageId::parse(id).map_err(|e| format!("{ID_FIELD}: {e}"))?,
        None => MessageId::parse(&entry.id).map_err(|e| format!("inbox entry id: {e}"))?,
    };
    let priority = match get(PRIORITY_FIELD) {
        None => 0,
        Some(p) => p
            .trim()
            .parse::<u8>()
            .ok()
            .filter(|&p| p <= crate::message::MAX_PRIORITY)
            .ok_or_else(|| format!("{PRIORITY_FIELD} {p:?}: must be an integer from 0 to 9"))?,
    };
    let ttl = get(TTL_FIELD)
        .map(|t| parse_duration_field(TTL_FIELD, t))
        .transpose()?;
    let key = get(KEY_FIELD)
        .map(|k| MessageKey::parse(k).map_err(|e| format!("{KEY_FIELD}: {e}")))
        .transpose()?;
    if fields.is_empty() {
        return Err(format!(
            "no message fields: the entry holds only {RESERVED_PREFIX}* fields"
        ));
    }
    let msg = NewMessage::new(stream, fields, due)
        .with_id(id)
        .with_priority(priority)
        .with_ttl(ttl)
        .with_key(key);
    msg.validate(&config.api.limits, &config.own_fields())
        .map_err(|e| e.to_string())?;
    Ok(msg)
}

/// Epoch milliseconds, or an RFC 3339 time.
fn epoch_ms(value: &str) -> Result<u64, String> {
    let value = value.trim();
    if value.starts_with('-') {
        return Err(format!("{AT_FIELD} {value:?}: must not be negative"));
    }
    if let Ok(ms) = value.parse::<u64>() {
        return Ok(ms);
    }
    let ts: jiff::Timestamp = value
        .parse()
        .map_err(|_| format!("{AT_FIELD} {value:?}: not epoch milliseconds or an RFC 3339 time"))?;
    u64::try_from(ts.as_millisecond()).map_err(|_| format!("{AT_FIELD} {value:?}: before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::from_toml("[streams]\nallow = [\"orders*\"]", std::iter::empty()).unwrap()
    }

    fn entry(fields: &[(&str, &str)]) -> InboxEntry {
        InboxEntry {
            id: "1700000000000-0".into(),
            fields: EntryFields::Read(
                fields
                    .iter()
                    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                    .collect(),
            ),
        }
    }

    /// A parsed message: id, due time, message fields.
    type Parsed<'a> = (&'a str, Due, &'a [(&'a str, &'a str)]);

    #[test]
    fn a_key_field_is_the_message_s_key_not_a_field() {
        let fields = [
            ("delayq-stream", "orders"),
            ("delayq-delay", "1s"),
            ("delayq-key", "order-42"),
            ("a", "1"),
        ];
        let msg = parse_entry(&entry(&fields), &config()).unwrap();
        assert_eq!(msg.key.as_ref().map(|k| k.as_str()), Some("order-42"));
        assert_eq!(msg.fields, vec![("a".to_owned(), "1".to_owned())]);
    }

    #[track_caller]
    fn check(fields: &[(&str, &str)], expected: Result<Parsed<'_>, &str>) {
        let got = parse_entry(&entry(fields), &config());
        match (got, expected) {
            (Ok(msg), Ok((id, due, message_fields))) => {
                assert_eq!(msg.id.as_str(), id);
                assert_eq!(msg.due, due);
                let want: Vec<(String, String)> = message_fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                assert_eq!(msg.fields, want);
            }
            (Err(reason), Err(part)) => {
                assert!(reason.contains(part), "{reason:?} should contain {part:?}")
            }
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    #[test]
    #[rustfmt::skip]
    fn entries() {
        let ms = Duration::from_millis;
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1500"), ("a", "1")], Ok(("1700000000000-0", Due::In(ms(1500)), &[("a", "1")])));
        check(&[("a", "1"), ("delayq-stream", "orders"), ("delayq-delay", "20m"), ("b", "2")], Ok(("1700000000000-0", Due::In(ms(1_200_000)), &[("a", "1"), ("b", "2")])));
        check(&[("delayq-stream", "orders"), ("delayq-at", "1800000000000"), ("delayq-id", "o-1"), ("a", "1")], Ok(("o-1", Due::At(1_800_000_000_000), &[("a", "1")])));
        check(&[("delayq-stream", "orders"), ("delayq-at", "2027-01-15T08:00:00Z"), ("a", "1")], Ok(("1700000000000-0", Due::At(1_800_000_000_000), &[("a", "1")])));
        check(&[("delayq-delay", "1s"), ("a", "1")], Err("delayq-stream: required"));
        check(&[("delayq-stream", "billing"), ("delayq-delay", "1s"), ("a", "1")], Err("not allowed (allowed: orders*)"));
        check(&[("delayq-stream", "orders"), ("a", "1")], Err("delayq-delay or delayq-at: required"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-at", "1"), ("a", "1")], Err("give one, not both"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "-5"), ("a", "1")], Err("delayq-delay \"-5\": must not be negative"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "soon"), ("a", "1")], Err("delayq-delay: \"soon\" is not a duration"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "400days"), ("a", "1")], Err("max_delay"));
        check(&[("delayq-stream", "orders"), ("delayq-at", "tomorrow"), ("a", "1")], Err("delayq-at \"tomorrow\": not epoch milliseconds"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-id", "a b"), ("a", "1")], Err("delayq-id: id \"a b\""));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-key", "a b"), ("a", "1")], Err("delayq-key: key \"a b\""));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-key", ""), ("a", "1")], Err("delayq-key: key \"\": must be 1 to 128"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-priority", "10"), ("a", "1")], Err("delayq-priority \"10\": must be an integer from 0 to 9"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-ttl", "-1s"), ("a", "1")], Err("delayq-ttl \"-1s\": must not be negative"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-dealy", "1s"), ("a", "1")], Err("delayq-dealy: unknown reserved field"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-delay", "2s"), ("a", "1")], Err("delayq-delay: given more than once"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s")], Err("no message fields"));
        check(&[("delayq-stream", "delayq:inbox"), ("delayq-delay", "1s"), ("a", "1")], Err("delayq's own keys"));
        check(&[("delayq-stream", "a b"), ("delayq-delay", "1s"), ("a", "1")], Err("delayq-stream: stream \"a b\""));
    }

    #[test]
    fn deleted_and_binary_entries_are_refused() {
        let deleted = InboxEntry {
            id: "1-0".into(),
            fields: EntryFields::Deleted,
        };
        assert!(
            parse_entry(&deleted, &config())
                .unwrap_err()
                .contains("deleted")
        );
        let binary = InboxEntry {
            id: "1-0".into(),
            fields: EntryFields::Read(vec![
                (b"delayq-stream".to_vec(), b"orders".to_vec()),
                (b"delayq-delay".to_vec(), b"1".to_vec()),
                (b"p".to_vec(), vec![0xff, 0xfe]),
            ]),
        };
        assert_eq!(
            parse_entry(&binary, &config()).unwrap_err(),
            "p: value is not UTF-8"
        );
    }

    mod props {
        use proptest::prelude::*;

        use super::*;
        use delayq_harness::props::text;

        /// Field lists a producer could XADD: delayq's reserved names (with values
        /// that parsers look at, or anything) mixed with arbitrary fields.
        fn fields() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
            let name = prop_oneof![
                prop::sample::select(
                    &[
                        "delayq-stream",
                        "delayq-delay",
                        "delayq-at",
                        "delayq-id",
                        "delayq-priority",
                        "delayq-ttl",
                        "delayq-other",
                        "a",
                    ][..]
                )
                .prop_map(str::to_owned),
                text(),
            ];
            let value = prop_oneof![
                Just("orders".to_owned()),
                "[0-9]{1,25}",
                "-?[0-9]{1,4}(ms|s|m|h|d|y)?",
                "20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9](Z|[+-][01][0-9]:00)",
                text(),
            ];
            let pair = (
                name,
                prop_oneof![value.prop_map(String::into_bytes), any::<Vec<u8>>()],
            );
            prop::collection::vec(pair.prop_map(|(k, v)| (k.into_bytes(), v)), 0..12)
        }

        proptest! {
            /// Whatever an entry holds, parsing answers (a message or a reason) and a
            /// message it accepts is one the rules allow.
            #[test]
            fn any_entry_is_a_message_or_a_reason(fields in fields()) {
                let entry = InboxEntry { id: "1700000000000-0".into(), fields: EntryFields::Read(fields) };
                let config = config();
                if let Ok(msg) = parse_entry(&entry, &config) {
                    prop_assert!(config.target_refusal(&msg.stream).is_none());
                    prop_assert!(msg.priority <= 9);
                    prop_assert!(!msg.fields.is_empty());
                    prop_assert!(msg.fields.iter().all(|(k, _)| !k.starts_with(RESERVED_PREFIX)));
                }
            }

            /// A valid entry becomes its message: the producer's fields in order, the
            /// delay as sent, the entry id as the message id.
            #[test]
            fn valid_entries_round_trip(
                delay in 0u64..86_400_000,
                own in prop::collection::vec(("[a-z][a-z0-9_]{0,8}", "[ -~]{0,20}"), 1..8),
            ) {
                let mut fields = vec![
                    (b"delayq-stream".to_vec(), b"orders".to_vec()),
                    (b"delayq-delay".to_vec(), delay.to_string().into_bytes()),
                ];
                fields.extend(own.iter().map(|(k, v)| (k.clone().into_bytes(), v.clone().into_bytes())));
                let entry = InboxEntry { id: "1700000000000-0".into(), fields: EntryFields::Read(fields) };
                let msg = parse_entry(&entry, &config()).unwrap();
                prop_assert_eq!(msg.id.as_str(), "1700000000000-0");
                prop_assert_eq!(msg.due, Due::In(Duration::from_millis(delay)));
                prop_assert_eq!(msg.fields, own);
            }

            /// Epoch milliseconds read back as themselves; RFC 3339 times as theirs.
            #[test]
            fn due_times_round_trip(ms in 0u64..=253_402_300_799_999) {
                prop_assert_eq!(epoch_ms(&ms.to_string()), Ok(ms));
                let ts = jiff::Timestamp::from_millisecond(ms as i64).unwrap();
                prop_assert_eq!(epoch_ms(&ts.to_string()), Ok(ms));
            }

            /// Numbers past 64 bits and negative times are refused, never wrapped.
            #[test]
            fn out_of_range_due_times_are_refused(n in delayq_harness::props::beyond_u64(), neg in 1u64..) {
                prop_assert!(epoch_ms(&n).is_err());
                let negative = format!("-{neg}");
                prop_assert!(epoch_ms(&negative).is_err());
            }
        }
    }
}
