//! Which dead letters a replay or purge is about: `ids`, or `"all": true` in pages,
//! narrowed by a filter (the reason, when they died), and whether only to count
//! them (`dry_run`), read once with every refusal naming its field.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::super::input::{documented_keys, object};
use super::super::{ApiError, AppState};
use super::{MAX_LIMIT, SCAN_PAGE, entry_cursor, page};
use crate::store::DeadLetter;

/// Which dead letters a replay or purge is about: `ids`, or `"all": true` (in pages:
/// `after`, `limit`; narrowed by `reason`, `since`, `until`); `dry_run` only counts
/// them.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({ "all": true, "reason": "expired", "since": 1796000000000u64, "dry_run": true }))]
pub struct SelectionRequest {
    /// Every dead letter carrying one of these message ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<String>>,
    /// Every dead letter (in pages: `after`, `limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all: Option<bool>,
    /// With `all`: start after this stream entry id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// With `all`: at most this many entries, 1 to 10000.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10000)]
    pub limit: Option<u64>,
    /// With `all`: only those whose reason (`delayq-reason`) begins with this text
    /// (`expired`, `ack_timeout`, `cannot write`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// With `all`: only those dead-lettered at or after this time (epoch ms, the
    /// entry's time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// With `all`: only those dead-lettered at or before this time (epoch ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
    /// Only count what would be replayed or purged (`matched`); nothing changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

pub(super) static SELECTION_KEYS: LazyLock<Vec<String>> =
    LazyLock::new(documented_keys::<SelectionRequest>);

/// What `all` keeps of the dead letters it goes through.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Filter {
    pub reason: Option<String>,
    pub since: Option<u64>,
    pub until: Option<u64>,
}

impl Filter {
    fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    fn keeps(&self, letter: &DeadLetter) -> bool {
        let at = entry_ms(&letter.entry_id);
        self.reason.as_deref().is_none_or(|want| {
            letter
                .annotation("delayq-reason")
                .is_some_and(|reason| reason.starts_with(want))
        }) && self.since.is_none_or(|since| at >= since)
            && self.until.is_none_or(|until| at <= until)
    }
}

/// A stream entry id's milliseconds.
fn entry_ms(entry: &str) -> u64 {
    entry
        .split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

/// Which dead letters a replay or purge is about.
#[derive(Debug)]
pub(super) enum Selection {
    /// Every dead letter carrying one of these message ids.
    Ids(BTreeSet<String>),
    /// Every dead letter after `after` that `filter` keeps, at most `limit` of them
    /// (None: none given).
    All {
        after: Option<String>,
        limit: Option<usize>,
        filter: Filter,
    },
}

impl Selection {
    /// Everything, with nothing to page or filter: a purge takes it in one command.
    pub(super) fn is_everything(&self) -> bool {
        matches!(self, Selection::All { after: None, limit: None, filter } if filter.is_empty())
    }
}

/// The request's selection, and whether it is a dry run.
pub(super) fn parse_selection(body: &Value) -> Result<(Selection, bool), ApiError> {
    let obj = object(body, &SELECTION_KEYS, "body must be a JSON object")?;
    let flag = |name: &str| match obj.get(name) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(false),
        Some(Value::Bool(true)) => Ok(true),
        Some(_) => Err(ApiError::invalid(format!("{name}: must be true or false"))),
    };
    let all = flag("all")?;
    let dry_run = flag("dry_run")?;
    let selection = match (obj.get("ids"), all) {
        (Some(_), true) => return Err(ApiError::invalid("ids, all: give one, not both")),
        (None, false) => {
            return Err(ApiError::invalid(
                "ids: required (a list of message ids), or \"all\": true",
            ));
        }
        (Some(ids), false) => {
            for name in ["after", "limit", "reason", "since", "until"] {
                if obj.contains_key(name) {
                    return Err(ApiError::invalid(format!(
                        "{name}: only with \"all\": true"
                    )));
                }
            }
            let list = ids
                .as_array()
                .ok_or_else(|| ApiError::invalid("ids: must be a list of message ids"))?;
            if list.is_empty() {
                return Err(ApiError::invalid("ids: must not be empty"));
            }
            list.iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => crate::message::MessageId::parse(s)
                        .map(|id| id.as_str().to_owned())
                        .map_err(|e| ApiError::invalid(format!("ids[{i}]: {e}"))),
                    _ => Err(ApiError::invalid(format!("ids[{i}]: must be a string"))),
                })
                .collect::<Result<BTreeSet<_>, _>>()
                .map(Selection::Ids)?
        }
        (None, true) => {
            let after = match obj.get("after") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => return Err(ApiError::invalid("after: must be a stream entry id")),
            };
            let whole = |name: &str| -> Result<Option<u64>, ApiError> {
                match obj.get(name) {
                    None | Some(Value::Null) => Ok(None),
                    Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                        ApiError::invalid(format!("{name}: must be a whole number"))
                    }),
                }
            };
            let limit = whole("limit")?.map(|n| n as usize);
            if let Some(n) = limit {
                super::limit(Some(n))?;
            }
            let reason = match obj.get("reason") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => Some(s.clone()),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "reason: must be text of 1 to 256 bytes (the start of a reason)",
                    ));
                }
            };
            let (since, until) = (whole("since")?, whole("until")?);
            if let (Some(since), Some(until)) = (since, until)
                && until < since
            {
                return Err(ApiError::invalid(format!(
                    "until {until}: before since {since}"
                )));
            }
            Selection::All {
                after: entry_cursor(after)?,
                limit,
                filter: Filter {
                    reason,
                    since,
                    until,
                },
            }
        }
    };
    Ok((selection, dry_run))
}

/// The dead letters a selection names, the ids not found, and where an `all`
/// selection stopped (None: at the end). A filtered `all` goes through at most ten
/// times its limit of entries in one request.
pub(super) async fn select(
    state: &AppState,
    stream: &str,
    dead_stream: &str,
    selection: &Selection,
) -> Result<(Vec<DeadLetter>, Vec<String>, Option<String>), ApiError> {
    match selection {
        Selection::All {
            after,
            limit,
            filter,
        } if filter.is_empty() => {
            let (letters, next) = page(
                state,
                stream,
                dead_stream,
                after.as_deref(),
                limit.unwrap_or(MAX_LIMIT),
            )
            .await?;
            Ok((letters, Vec::new(), next))
        }
        Selection::All {
            after,
            limit,
            filter,
        } => {
            let limit = limit.unwrap_or(MAX_LIMIT);
            let mut kept = Vec::new();
            let mut cursor = after.clone();
            let mut read = 0;
            loop {
                let (letters, next) =
                    page(state, stream, dead_stream, cursor.as_deref(), SCAN_PAGE).await?;
                read += letters.len();
                for letter in letters {
                    // Past `until`: nothing later is kept either.
                    if filter
                        .until
                        .is_some_and(|until| entry_ms(&letter.entry_id) > until)
                    {
                        return Ok((kept, Vec::new(), None));
                    }
                    cursor = Some(letter.entry_id.clone());
                    if filter.keeps(&letter) {
                        kept.push(letter);
                        if kept.len() == limit {
                            return Ok((kept, Vec::new(), cursor));
                        }
                    }
                }
                if next.is_none() {
                    return Ok((kept, Vec::new(), None));
                }
                if read >= limit.saturating_mul(10) {
                    return Ok((kept, Vec::new(), cursor));
                }
            }
        }
        Selection::Ids(ids) => {
            let mut found = Vec::new();
            let mut seen = BTreeSet::new();
            let mut cursor: Option<String> = None;
            loop {
                let (letters, next) =
                    page(state, stream, dead_stream, cursor.as_deref(), SCAN_PAGE).await?;
                for letter in letters {
                    if let Some(id) = letter
                        .message_id
                        .as_ref()
                        .filter(|id| ids.contains(id.as_str()))
                    {
                        seen.insert(id.as_str().to_owned());
                        found.push(letter);
                    }
                }
                cursor = next;
                if cursor.is_none() {
                    break;
                }
            }
            let missing = ids
                .iter()
                .filter(|id| !seen.contains(*id))
                .cloned()
                .collect();
            Ok((found, missing, None))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(body: &str, expected: Result<&str, &str>) {
        let value: Value = serde_json::from_str(body).unwrap();
        let got = match parse_selection(&value) {
            Ok((Selection::Ids(ids), dry)) => Ok(format!(
                "ids {}{}",
                ids.into_iter().collect::<Vec<_>>().join(","),
                if dry { " dry" } else { "" }
            )),
            Ok((
                Selection::All {
                    after,
                    limit,
                    filter,
                },
                dry,
            )) => Ok(format!(
                "all after {} limit {limit:?}{}{}",
                after.unwrap_or_default(),
                if filter.is_empty() {
                    String::new()
                } else {
                    format!(" {filter:?}")
                },
                if dry { " dry" } else { "" }
            )),
            Err(e) => Err(e.detail),
        };
        match (got, expected) {
            (Ok(g), Ok(e)) => assert_eq!(g, e, "{body}"),
            (Err(g), Err(e)) => assert!(g.contains(e), "{body}: {g:?} should contain {e:?}"),
            (g, e) => panic!("{body}: got {g:?}, expected {e:?}"),
        }
    }

    proptest::proptest! {
        #[test]
        fn selections_never_panic(body in delayq_harness::props::json(&["ids", "all", "after", "limit", "reason", "since", "until", "dry_run"])) {
            // What the reader takes, the documented type reads too.
            if parse_selection(&body).is_ok() {
                proptest::prop_assert!(serde_json::from_value::<SelectionRequest>(body.clone()).is_ok(), "{}", body);
            }
        }
    }

    #[test]
    fn the_accepted_keys_are_the_documented_ones() {
        assert_eq!(
            *SELECTION_KEYS,
            [
                "ids", "all", "after", "limit", "reason", "since", "until", "dry_run"
            ]
        );
    }

    #[test]
    fn selections() {
        check(r#"{"ids":["b","a","a"]}"#, Ok("ids a,b"));
        check(r#"{"all":true}"#, Ok("all after  limit None"));
        check(
            r#"{"all":true,"after":"17-0","limit":5}"#,
            Ok("all after 17-0 limit Some(5)"),
        );
        check(r#"{}"#, Err("ids: required"));
        check(r#"{"ids":["a"],"all":true}"#, Err("ids, all: give one"));
        check(r#"{"ids":[]}"#, Err("ids: must not be empty"));
        check(r#"{"ids":["a b"]}"#, Err("ids[0]"));
        check(r#"{"ids":[3]}"#, Err("ids[0]: must be a string"));
        check(r#"{"all":"yes"}"#, Err("all: must be true or false"));
        check(r#"{"all":true,"after":"x"}"#, Err("after \"x\""));
        check(
            r#"{"all":true,"after":"99999999999999999999999-0"}"#,
            Err("below 2^64"),
        );
        check(
            r#"{"all":true,"after":"1-18446744073709551616"}"#,
            Err("below 2^64"),
        );
        check(r#"{"all":true,"limit":0}"#, Err("limit 0"));
        check(r#"{"ids":["a"],"limit":3}"#, Err("only with \"all\""));
        check(r#"{"id":"a"}"#, Err("id: unknown field"));
        check(r#"{"ids":["a"],"dry_run":true}"#, Ok("ids a dry"));
        check(
            r#"{"all":true,"reason":"expired","since":5,"until":9,"dry_run":true}"#,
            Ok(
                "all after  limit None Filter { reason: Some(\"expired\"), since: Some(5), until: Some(9) } dry",
            ),
        );
        check(
            r#"{"all":true,"until":4,"since":5}"#,
            Err("until 4: before since 5"),
        );
        check(r#"{"all":true,"reason":""}"#, Err("reason: must be text"));
        check(
            r#"{"all":true,"since":-1}"#,
            Err("since: must be a whole number"),
        );
        check(
            r#"{"ids":["a"],"reason":"x"}"#,
            Err("reason: only with \"all\""),
        );
        check(
            r#"{"all":true,"dry_run":1}"#,
            Err("dry_run: must be true or false"),
        );
    }

    #[test]
    fn a_filter_keeps_by_reason_and_time() {
        let letter = |entry: &str, reason: Option<&str>| DeadLetter {
            entry_id: entry.into(),
            message_id: None,
            fields: Vec::new(),
            annotations: reason
                .map(|r| vec![("delayq-reason".to_owned(), r.to_owned())])
                .unwrap_or_default(),
        };
        let filter = Filter {
            reason: Some("expired".into()),
            since: Some(10),
            until: Some(20),
        };
        for (entry, reason, kept) in [
            ("15-0", Some("expired"), true),
            ("10-3", Some("expired"), true),
            ("20-9", Some("expired"), true),
            ("9-0", Some("expired"), false),
            ("21-0", Some("expired"), false),
            ("15-0", Some("ack_timeout: entry 1-0"), false),
            ("15-0", None, false),
        ] {
            assert_eq!(
                filter.keeps(&letter(entry, reason)),
                kept,
                "{entry} {reason:?}"
            );
        }
        assert!(Filter::default().keeps(&letter("1-0", None)));
    }
}
