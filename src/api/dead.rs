//! `/v1/streams/{stream}/dead`: a stream's dead letters, listed, replayed (scheduled
//! again, due now) and purged.

use std::collections::BTreeSet;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::messages::{check_stream_allowed, read_json};
use super::streams::{ENTRY_ID_RULE, bad_query, entry_id};
use super::{ApiError, AppState};
use crate::metrics as m;
use crate::store::{DeadLetter, Replayed};

/// Most entries one list or one `all` request goes through; the answer's `next`
/// continues from there.
const MAX_LIMIT: usize = 10_000;
const DEFAULT_LIMIT: usize = 100;
/// Page size when looking dead letters up by message id.
const SCAN_PAGE: usize = 500;
/// A replay or purge request is a list of ids at most.
const MAX_BODY: usize = 1 << 20;

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
}

/// A stream name from the path, with its dead-letter stream.
fn streams(state: &AppState, stream: &str) -> Result<(String, String), ApiError> {
    crate::message::validate_stream(stream)?;
    let config = state.current_config();
    check_stream_allowed(stream, &config)?;
    Ok((stream.to_owned(), config.dead_letter_stream(stream)))
}

fn limit(given: Option<usize>) -> Result<usize, ApiError> {
    match given {
        None => Ok(DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::invalid(format!(
            "limit {n}: must be 1 to {MAX_LIMIT}"
        ))),
    }
}

fn entry_cursor(after: Option<String>) -> Result<Option<String>, ApiError> {
    match after {
        Some(a) if !entry_id(&a) => Err(ApiError::invalid(format!("after {a:?}: {ENTRY_ID_RULE}"))),
        other => Ok(other),
    }
}

impl AppState {
    fn own_fields(&self) -> (&str, &str) {
        let f = &self.config.forwarder;
        (
            f.id_field.as_deref().unwrap_or(""),
            f.attempt_field.as_deref().unwrap_or(""),
        )
    }
}

fn letter_json(letter: &DeadLetter, attempt_field: &str) -> Value {
    let number = |name: &str| letter.annotation(name).and_then(|v| v.parse::<u64>().ok());
    let annotations: Map<String, Value> = letter
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    json!({
        "entry_id": letter.entry_id,
        "id": letter.message_id.as_ref().map(|id| id.as_str()),
        "reason": letter.annotation("delayq-reason"),
        "attempt": number(attempt_field),
        "first_delivery": number("delayq-first-delivery"),
        "last_delivery": number("delayq-last-delivery"),
        "fields": letter.fields.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        "delayq": annotations,
    })
}

pub async fn list(
    State(state): State<AppState>,
    Path(stream): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let (stream, dead_stream) = streams(&state, &stream)?;
    let Query(query) = query.map_err(bad_query)?;
    let limit = limit(query.limit)?;
    let after = entry_cursor(query.after)?;
    let (letters, next) = page(&state, &dead_stream, after.as_deref(), limit).await?;
    let (_, attempt_field) = state.own_fields();
    Ok(Json(json!({
        "stream": stream,
        "dead_letter_stream": dead_stream,
        "entries": letters.iter().map(|l| letter_json(l, attempt_field)).collect::<Vec<_>>(),
        "next": next,
    })))
}

/// Up to `limit` dead letters after `after`, and the cursor of the next page (None:
/// this one reached the end).
async fn page(
    state: &AppState,
    dead_stream: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<DeadLetter>, Option<String>), ApiError> {
    let (id_field, attempt_field) = state.own_fields();
    let letters = state
        .store
        .dead_letters(dead_stream, after, limit, id_field, attempt_field)
        .await?;
    let next = (letters.len() == limit)
        .then(|| letters.last().map(|l| l.entry_id.clone()))
        .flatten();
    Ok((letters, next))
}

/// Which dead letters a replay or purge is about.
enum Selection {
    /// Every dead letter carrying one of these message ids.
    Ids(BTreeSet<String>),
    /// Every dead letter after `after`, at most `limit` of them (None: none given).
    All {
        after: Option<String>,
        limit: Option<usize>,
    },
}

fn parse_selection(body: &Value) -> Result<Selection, ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::malformed("body must be a JSON object"))?;
    const KEYS: &[&str] = &["ids", "all", "after", "limit"];
    if let Some(unknown) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(ApiError::invalid(format!(
            "{unknown}: unknown field (known: {})",
            KEYS.join(", ")
        )));
    }
    let all = match obj.get("all") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(ApiError::invalid("all: must be true or false")),
    };
    match (obj.get("ids"), all) {
        (Some(_), true) => Err(ApiError::invalid("ids, all: give one, not both")),
        (None, false) => Err(ApiError::invalid(
            "ids: required (a list of message ids), or \"all\": true",
        )),
        (Some(ids), false) => {
            if obj.contains_key("after") || obj.contains_key("limit") {
                return Err(ApiError::invalid("after, limit: only with \"all\": true"));
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
                .map(Selection::Ids)
        }
        (None, true) => {
            let after = match obj.get("after") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => return Err(ApiError::invalid("after: must be a stream entry id")),
            };
            let limit = match obj.get("limit") {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| ApiError::invalid("limit: must be a whole number"))?,
                ),
            };
            if let Some(n) = limit {
                self::limit(Some(n))?;
            }
            Ok(Selection::All {
                after: entry_cursor(after)?,
                limit,
            })
        }
    }
}

/// The dead letters a selection names, the ids not found, and where an `all`
/// selection stopped (None: at the end).
async fn select(
    state: &AppState,
    dead_stream: &str,
    selection: &Selection,
) -> Result<(Vec<DeadLetter>, Vec<String>, Option<String>), ApiError> {
    match selection {
        Selection::All { after, limit } => {
            let (letters, next) = page(
                state,
                dead_stream,
                after.as_deref(),
                limit.unwrap_or(MAX_LIMIT),
            )
            .await?;
            Ok((letters, Vec::new(), next))
        }
        Selection::Ids(ids) => {
            let mut found = Vec::new();
            let mut seen = BTreeSet::new();
            let mut cursor: Option<String> = None;
            loop {
                let (letters, next) =
                    page(state, dead_stream, cursor.as_deref(), SCAN_PAGE).await?;
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

pub async fn replay(
    State(state): State<AppState>,
    Path(stream): Path<String>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let (stream, dead_stream) = streams(&state, &stream)?;
    let selection = parse_selection(&read_json(body, MAX_BODY).await?)?;
    let (letters, not_found, next) = select(&state, &dead_stream, &selection).await?;
    let (id_field, attempt_field) = state.own_fields();
    let mut replayed = Vec::new();
    let mut skipped = Vec::new();
    for letter in &letters {
        let id = letter.message_id.as_ref().map(|id| id.as_str());
        match state.store.replay_dead_letter(&dead_stream, letter, &stream, id_field, attempt_field).await? {
            Replayed::Replayed { due_ms } => {
                metrics::counter!(m::DEAD_REPLAYED, "stream" => stream.clone()).increment(1);
                replayed.push(json!({ "id": id, "entry_id": letter.entry_id, "deliver_at": due_ms }));
            }
            Replayed::AlreadyScheduled => skipped.push(json!({ "id": id, "entry_id": letter.entry_id, "why": "already scheduled" })),
            Replayed::Gone => skipped.push(json!({ "id": id, "entry_id": letter.entry_id, "why": "no longer in the dead-letter stream" })),
            Replayed::Foreign => skipped.push(json!({ "id": id, "entry_id": letter.entry_id, "why": "carries no message id" })),
        }
    }
    if !replayed.is_empty() {
        tracing::info!(%stream, %dead_stream, replayed = replayed.len(), skipped = skipped.len(), "dead letters replayed");
    }
    Ok(Json(json!({
        "stream": stream,
        "dead_letter_stream": dead_stream,
        "replayed": replayed,
        "skipped": skipped,
        "not_found": not_found,
        "next": next,
    })))
}

pub async fn purge(
    State(state): State<AppState>,
    Path(stream): Path<String>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let (stream, dead_stream) = streams(&state, &stream)?;
    let selection = parse_selection(&read_json(body, MAX_BODY).await?)?;
    let (purged, not_found, next) = match &selection {
        // Everything, in one command, however long the stream.
        Selection::All {
            after: None,
            limit: None,
        } => (
            state.store.purge_dead_letters(&dead_stream, None).await?,
            Vec::new(),
            None,
        ),
        _ => {
            let (letters, not_found, next) = select(&state, &dead_stream, &selection).await?;
            let entries: Vec<String> = letters.into_iter().map(|l| l.entry_id).collect();
            (
                state
                    .store
                    .purge_dead_letters(&dead_stream, Some(&entries))
                    .await?,
                not_found,
                next,
            )
        }
    };
    metrics::counter!(m::DEAD_PURGED, "stream" => stream.clone()).increment(purged);
    tracing::info!(%stream, %dead_stream, purged, "dead letters purged");
    Ok(Json(json!({
        "stream": stream,
        "dead_letter_stream": dead_stream,
        "purged": purged,
        "not_found": not_found,
        "next": next,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(body: &str, expected: Result<&str, &str>) {
        let value: Value = serde_json::from_str(body).unwrap();
        let got = match parse_selection(&value) {
            Ok(Selection::Ids(ids)) => Ok(format!(
                "ids {}",
                ids.into_iter().collect::<Vec<_>>().join(",")
            )),
            Ok(Selection::All { after, limit }) => Ok(format!(
                "all after {} limit {limit:?}",
                after.unwrap_or_default()
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
        fn selections_never_panic(body in crate::message::props::json(&["ids", "all", "after", "limit"])) {
            let _ = parse_selection(&body);
        }
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
    }
}
