//! When a message falls due, as a push or a reschedule says it: exactly one of
//! `delay`, `delay_ms` and `deliver_at`, each refused with a detail naming it.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::given::{Given, Keyed};
use crate::api::ApiError;
use crate::message::{Due, parse_duration};

/// The fields that say when a message is due; a request gives exactly one.
pub(super) const DUE_KEYS: &[&str] = &["delay", "delay_ms", "deliver_at"];

/// `deliver_at`: a time, as epoch milliseconds or RFC 3339 text.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum DeliverAt {
    /// Epoch milliseconds.
    EpochMs(u64),
    /// An RFC 3339 time such as `2026-11-22T10:00:00Z`, not before 1970.
    #[schema(format = DateTime)]
    Rfc3339(String),
}

/// The due time of a push or a reschedule, read from the body's keys (a due-time key
/// that is present but unusable is refused, not ignored).
pub(super) fn parse_due(body: &impl Keyed) -> Result<Due, ApiError> {
    let given: Vec<(&str, Given)> = DUE_KEYS
        .iter()
        .filter_map(|&key| body.get(key).map(|value| (key, value)))
        .collect();
    match given[..] {
        [("delay", v)] => Ok(Due::In(human_duration("delay", v)?)),
        [("delay_ms", v)] => Ok(Due::In(Duration::from_millis(non_negative_ms(
            "delay_ms", v,
        )?))),
        [("deliver_at", v)] => parse_deliver_at(v),
        [] => Err(ApiError::invalid(
            "delay: required (or delay_ms, or deliver_at)",
        )),
        _ => {
            let names: Vec<&str> = given.iter().map(|(key, _)| *key).collect();
            Err(ApiError::invalid(format!(
                "{}: give only one",
                names.join(", ")
            )))
        }
    }
}

/// Parses `"20m"`-style text; a leading minus is called out as negative.
pub(super) fn human_duration(key: &str, v: Given) -> Result<Duration, ApiError> {
    match v {
        Given::Text(s) if s.trim_start().starts_with('-') => Err(ApiError::invalid(format!(
            "{key} {s:?}: must not be negative"
        ))),
        Given::Text(s) => parse_duration(s).map_err(|e| ApiError::invalid(format!("{key}: {e}"))),
        v if v.is_number() => Err(ApiError::invalid(format!(
            "{key}: must be text such as \"20m\"; for milliseconds use {key}_ms"
        ))),
        _ => Err(ApiError::invalid(format!(
            "{key}: must be text such as \"20m\""
        ))),
    }
}

pub(super) fn non_negative_ms(key: &str, v: Given) -> Result<u64, ApiError> {
    match v {
        Given::Whole(ms) => Ok(ms),
        Given::Tree(Value::Number(n)) if n.as_i64().is_some_and(|n| n < 0) => Err(
            ApiError::invalid(format!("{key} {n}: must not be negative")),
        ),
        Given::Tree(Value::Number(n)) => Err(ApiError::invalid(format!(
            "{key} {n}: must be a whole number of milliseconds"
        ))),
        _ => Err(ApiError::invalid(format!(
            "{key}: must be a whole number of milliseconds"
        ))),
    }
}

pub(super) fn parse_deliver_at(v: Given) -> Result<Due, ApiError> {
    match v {
        v if v.is_number() => Ok(Due::At(non_negative_ms("deliver_at", v)?)),
        Given::Text(s) => {
            let ts = rfc3339(s)?;
            let ms = ts.as_millisecond();
            if ms < 0 {
                return Err(ApiError::invalid(format!("deliver_at {s:?}: before 1970")));
            }
            Ok(Due::At(ms as u64))
        }
        _ => Err(ApiError::invalid(
            "deliver_at: must be epoch milliseconds or an RFC 3339 time",
        )),
    }
}

/// The latest offset from UTC RFC 3339 allows (its hours go to 23).
const MAX_OFFSET_SECONDS: i32 = 24 * 3600 - 60;

/// An RFC 3339 `deliver_at`: a time with its offset from UTC, which must be one
/// RFC 3339 allows. A time past the end of 9999 is too far, not malformed.
fn rfc3339(s: &str) -> Result<jiff::Timestamp, ApiError> {
    let refused = |why: String| ApiError::invalid(format!("deliver_at {s:?}: {why}"));
    let pieces = jiff::fmt::temporal::Pieces::parse(s);
    match s.parse::<jiff::Timestamp>() {
        Ok(ts) => match pieces.ok().and_then(|p| p.to_numeric_offset()) {
            Some(offset) if offset.seconds().abs() > MAX_OFFSET_SECONDS => Err(refused(format!(
                "the offset {offset} is not one RFC 3339 allows (-23:59 to +23:59)"
            ))),
            _ => Ok(ts),
        },
        Err(_) if pieces.is_ok_and(|p| p.date().year() >= 9999) => Err(refused(
            "later than any time delayq takes (and than api.max_delay allows)".to_owned(),
        )),
        Err(e) => Err(refused(format!(
            "not an RFC 3339 time such as 2026-11-22T10:00:00Z ({e})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use delayq_harness::props::{expect, text};

    /// RFC 3339 texts at the edges of what is taken, and what each is refused for.
    #[test]
    fn deliver_at_text_is_an_rfc3339_time_with_an_offset_it_allows() {
        #[rustfmt::skip]
        let cases: &[(&str, Result<u64, &str>)] = &[
            ("2026-11-22T10:00:00Z", Ok(1_795_341_600_000)),
            ("2026-11-22T10:00:00.5+01:00", Ok(1_795_338_000_500)),
            ("2026-11-22T10:00:00+23:59", Ok(1_795_255_260_000)),
            ("2026-11-22T10:00:00-23:59", Ok(1_795_427_940_000)),
            ("2026-11-22T10:00:00+01:00[Europe/Paris]", Ok(1_795_338_000_000)),
            ("2026-11-22T10:00:00+24:00", Err("the offset +24 is not one RFC 3339 allows")),
            ("2026-11-22T10:00:00-25:30", Err("is not one RFC 3339 allows")),
            ("9999-12-31T23:59:59Z", Err("later than any time delayq takes")),
            ("9999-12-30T22:00:00Z", Ok(253_402_207_200_000)),
            ("9999-12-30T22:00:01Z", Err("later than any time delayq takes")),
            ("2026-11-22T10:00:00", Err("not an RFC 3339 time")),
            ("2026-11-22", Err("not an RFC 3339 time")),
            ("2026-13-01T00:00:00Z", Err("not an RFC 3339 time")),
            ("1969-12-31T23:59:59Z", Err("before 1970")),
        ];
        for (text, want) in cases {
            match (parse_deliver_at(Given::of(&json!(text))), want) {
                (Ok(Due::At(ms)), Ok(want)) => assert_eq!(ms, *want, "{text}"),
                (Err(e), Err(want)) => assert!(e.detail.contains(want), "{text}: {}", e.detail),
                (got, want) => panic!("{text}: {got:?}, wanted {want:?}"),
            }
        }
    }

    proptest! {
        #[test]
        fn deliver_at_never_panics(due in delayq_harness::props::json(DUE_KEYS)) {
            let _ = parse_deliver_at(Given::of(&due));
        }

        #[test]
        fn deliver_at_epoch_ms_round_trips(ms: u64) {
            expect(&ms.to_string(), parse_deliver_at(Given::of(&json!(ms))), Some(Due::At(ms)))?;
        }

        #[test]
        fn deliver_at_rfc3339_round_trips(ms in 0..=jiff::Timestamp::MAX.as_millisecond()) {
            let text = jiff::Timestamp::from_millisecond(ms).unwrap().to_string();
            expect(&text, parse_deliver_at(Given::of(&json!(text))), Some(Due::At(ms as u64)))?;
        }

        #[test]
        fn deliver_at_before_1970_is_refused(ms in jiff::Timestamp::MIN.as_millisecond()..0) {
            let text = jiff::Timestamp::from_millisecond(ms).unwrap().to_string();
            expect(&text, parse_deliver_at(Given::of(&json!(text))), None)?;
            expect(&text, parse_deliver_at(Given::of(&json!(ms))), None)?;
        }

        #[test]
        fn deliver_at_text_that_is_not_a_time_is_refused(text in text()) {
            prop_assume!(text.parse::<jiff::Timestamp>().is_err());
            expect(&text, parse_deliver_at(Given::of(&json!(text))), None)?;
        }

        /// What the reader takes as a `deliver_at`, the documented type reads too.
        #[test]
        fn an_accepted_deliver_at_is_a_documented_one(due in delayq_harness::props::json(DUE_KEYS)) {
            if parse_deliver_at(Given::of(&due)).is_ok() {
                prop_assert!(serde_json::from_value::<DeliverAt>(due.clone()).is_ok(), "{}", due);
            }
        }
    }
}
