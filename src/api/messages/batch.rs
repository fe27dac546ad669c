//! `POST /v1/messages/batch`: up to `api.max_batch` push bodies in one request,
//! each answered on its own (in order, with the status a single push would have had).

use std::sync::LazyLock;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::plain::read_object;
use super::push::{PushRequest, parse_push, parse_push_json};
use crate::api::input::{documented_keys, object, parse_json, read_body};
use crate::api::reach::{Reach, id_taken};
use crate::api::{ApiError, AppState, ErrorBody};
use crate::config::Config;
use crate::message::NewMessage;
use crate::metrics as m;
use crate::store::{BatchItem, ScheduleMode, Scheduled};

/// Push bodies to schedule together.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({ "messages": [
    { "stream": "orders", "payload": "a", "delay": "1m" },
    { "stream": "orders", "payload": "b", "delay_ms": 5000, "id": "order-43" },
] }))]
pub struct BatchRequest {
    /// 1 to `api.max_batch` push bodies.
    pub messages: Vec<PushRequest>,
}

/// The answer to a batch; typed rather than built as a JSON map, since a batch
/// answers thousands of items.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchAnswer {
    /// Items stored as new (or replacing) messages.
    scheduled: u64,
    /// Items whose id was known already.
    duplicates: u64,
    /// Items refused.
    failed: u64,
    /// One per item, in order.
    results: Vec<ItemResult>,
}

/// One item's answer, with the status a single push would have had.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
enum ItemResult {
    /// Stored, or a duplicate: what a single push would have answered.
    Stored {
        /// The item's place in `messages`.
        index: usize,
        /// What a single push would have answered: 201 or 200.
        status: u16,
        id: String,
        /// Epoch milliseconds by Redis's clock.
        #[schema(required)]
        deliver_at: Option<u64>,
        state: String,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        replaced: bool,
    },
    /// Refused: the error a single push would have answered.
    Failed {
        /// The item's place in `messages`.
        index: usize,
        /// What a single push would have answered (4xx, 5xx).
        status: u16,
        #[schema(value_type = String)]
        error: &'static str,
        /// Starts with `messages[<index>]: `.
        detail: String,
    },
}

impl ItemResult {
    fn failed(index: usize, e: ApiError) -> Self {
        ItemResult::Failed {
            index,
            status: e.status.as_u16(),
            error: e.code,
            detail: format!("messages[{index}]: {}", e.detail),
        }
    }
}

static BATCH_KEYS: LazyLock<Vec<String>> = LazyLock::new(documented_keys::<BatchRequest>);

/// Schedule up to api.max_batch messages
///
/// Each item is a push body and is answered on its own, in order, with the status a
/// single push would have had.
#[utoipa::path(
    post,
    path = "/v1/messages/batch",
    operation_id = "pushBatch",
    request_body = BatchRequest,
    responses(
        (status = 200, description = "per-item results", body = BatchAnswer),
        (status = 400, description = "body is not JSON, or not an object", body = ErrorBody),
        (status = 413, description = "more items than api.max_batch (batch_too_large), or body over api.max_body_bytes", body = ErrorBody),
        (status = 422, description = "messages missing, not a list, or empty", body = ErrorBody),
        (status = 503, description = "Redis unreachable: nothing stored, retry the batch", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn batch(
    State(state): State<AppState>,
    reach: Reach,
    body: Body,
) -> Result<Json<BatchAnswer>, ApiError> {
    // The live configuration: the stream allow list can change on reload.
    let config = state.current_config();
    let bytes = read_body(body, config.api.max_body_bytes).await?;
    let items = parse_items(&bytes, &config)?;
    let mut results: Vec<Option<ItemResult>> = items.iter().map(|_| None).collect();
    let mut valid = Vec::with_capacity(items.len());
    let mut positions = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match item.and_then(|parsed| {
            reach.check(&parsed.0.stream)?;
            Ok(parsed)
        }) {
            Ok((msg, mode)) => {
                valid.push(BatchItem {
                    msg,
                    mode,
                    inbox_entry: None,
                });
                positions.push(i);
            }
            Err(e) => results[i] = Some(ItemResult::failed(i, e)),
        }
    }
    let made_here = valid
        .iter_mut()
        .filter(|item| item.mode == ScheduleMode::Fresh)
        .map(|item| &mut item.msg)
        .collect();
    super::place::place(&state.store, &config, made_here).await;
    if !reach.is_everything() {
        // Ids that name a message of a stream the token does not reach are refused.
        // An id made here names no message yet, and is not looked up.
        let asked: Vec<usize> = (0..valid.len())
            .filter(|&k| valid[k].mode != ScheduleMode::Fresh)
            .collect();
        let found = state
            .store
            .statuses(asked.iter().map(|&k| &valid[k].msg.id))
            .await;
        let mut found = asked.into_iter().zip(found).peekable();
        let suffix = &config.forwarder.dead_letter_suffix;
        let mut kept = (Vec::new(), Vec::new());
        for (k, (item, index)) in valid.into_iter().zip(positions).enumerate() {
            let seen = match found.next_if(|(asked, _)| *asked == k) {
                None => true,
                Some((_, Ok(found))) => reach.sees_status(&found, suffix),
                Some((_, Err(e))) => return Err(e.into()),
            };
            if seen {
                kept.0.push(item);
                kept.1.push(index);
            } else {
                let refusal = id_taken(item.msg.id.as_str());
                results[index] = Some(ItemResult::failed(index, refusal));
            }
        }
        (valid, positions) = kept;
    }
    let outcomes = state
        .ingest
        .schedule_many(
            &valid,
            config.api.limits.max_delay,
            None,
            &crate::journal::Came::api("batch", &config.node_id, &reach.who),
        )
        .await;
    let (mut scheduled, mut duplicates, mut unavailable) = (0u64, 0u64, 0usize);
    // The code of the refusals Redis or the journal gave, while they all agree.
    let mut refusal: Option<&'static str> = None;
    let stored_count = valid.len();
    for ((item, index), outcome) in valid.into_iter().zip(positions).zip(outcomes) {
        let id = item.msg.id.as_str().to_owned();
        let stored = |status, deliver_at, state: &str, duplicate, replaced| ItemResult::Stored {
            index,
            status,
            id,
            deliver_at,
            state: state.to_owned(),
            duplicate,
            replaced,
        };
        results[index] = Some(match outcome {
            Ok(Scheduled::Scheduled { due_ms }) => {
                scheduled += 1;
                stored(201, Some(due_ms), "scheduled", false, false)
            }
            Ok(Scheduled::Replaced { due_ms }) => {
                scheduled += 1;
                stored(200, Some(due_ms), "scheduled", false, true)
            }
            Ok(Scheduled::Duplicate { due_ms, state }) => {
                duplicates += 1;
                stored(200, due_ms, &state, true, false)
            }
            Err(e) => {
                let transient = e.is_transient();
                let e = ApiError::from(e);
                if transient {
                    unavailable += 1;
                    refusal = match refusal {
                        None => Some(e.code),
                        Some(code) if code == e.code => Some(code),
                        Some(_) => Some("unavailable"),
                    };
                }
                ItemResult::failed(index, e)
            }
        });
    }
    if unavailable > 0 && unavailable == stored_count {
        // Nothing could be stored: one answer for the whole batch tells the client to retry it.
        // With the code of a single push's refusal (`journal_unavailable`, ...) when
        // every message was refused alike.
        let code = refusal.unwrap_or("unavailable");
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code,
            format!(
                "storage unavailable: no message of the batch could be stored or confirmed ({code}): retry it; sending the same ids again is safe"
            ),
        ));
    }
    metrics::counter!(m::SCHEDULED).increment(scheduled);
    metrics::counter!(m::DUPLICATES).increment(duplicates);
    let results: Vec<ItemResult> = results.into_iter().flatten().collect();
    let failed = results.len() as u64 - scheduled - duplicates;
    Ok(Json(BatchAnswer {
        scheduled,
        duplicates,
        failed,
        results,
    }))
}

/// A batch body's items, each parsed as a single push body would be. A body that is
/// an object holding only `messages`, a list, has its items read from their own
/// bytes (each of the common shape straight into its values, see `plain`); any
/// other body goes through the tree, whose rules name what is wrong with it.
fn parse_items(bytes: &[u8], config: &Config) -> Result<Vec<Parsed>, ApiError> {
    if let Some(batch) = read_object::<PlainBatch>(bytes) {
        check_count(batch.messages.len(), config)?;
        let items = batch.messages.iter();
        // An item no tree holds (a number past a double's range: the list reads
        // its items' text unchecked) makes the body one no tree holds: it goes to
        // the tree, which refuses it whole.
        let parsed: Option<Vec<Parsed>> = items
            .map(|item| parse_push_json(item.get().as_bytes(), config))
            .collect();
        if let Some(parsed) = parsed {
            return Ok(parsed);
        }
    }
    parse_items_tree(&parse_json(bytes)?, config)
}

/// [`parse_items`] of a body read as a JSON tree.
fn parse_items_tree(value: &Value, config: &Config) -> Result<Vec<Parsed>, ApiError> {
    let obj = object(
        value,
        &BATCH_KEYS,
        "body must be a JSON object such as {\"messages\": [...]}",
    )?;
    let items = match obj.get("messages") {
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::invalid("messages: must be a list of push bodies")),
        None => {
            return Err(ApiError::invalid(
                "messages: required (a list of push bodies)",
            ));
        }
    };
    check_count(items.len(), config)?;
    Ok(items.iter().map(|item| parse_push(item, config)).collect())
}

/// What parsing one item made, or its refusal.
type Parsed = Result<(NewMessage, ScheduleMode), ApiError>;

/// A batch body of the common shape: `messages` alone, a list, its items unread.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlainBatch<'a> {
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

/// At least one item, and at most `api.max_batch`.
fn check_count(items: usize, config: &Config) -> Result<(), ApiError> {
    if items == 0 {
        return Err(ApiError::invalid(
            "messages: must hold at least one message",
        ));
    }
    if items > config.api.max_batch {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "batch_too_large",
            format!(
                "messages: {items} items is more than api.max_batch {}; split the batch",
                config.api.max_batch
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::super::push::tests::{outcome, push_like, refusal};
    use super::*;

    fn config() -> Config {
        Config::from_toml("[api]\nmax_batch = 4", std::iter::empty()).unwrap()
    }

    /// What parsing a batch made of each item, or the batch's refusal.
    fn outcomes(parsed: Result<Vec<Parsed>, ApiError>) -> Result<Vec<String>, String> {
        parsed
            .map(|items| items.iter().map(outcome).collect())
            .map_err(|e| refusal(&e))
    }

    /// A batch body: mostly `messages` holding push bodies, sometimes another key
    /// beside it, or `messages` of another kind.
    fn batch_like() -> impl Strategy<Value = Value> {
        let items = prop::collection::vec(
            prop_oneof![4 => push_like(), 1 => delayq_harness::props::json(&["stream"])],
            0..6,
        );
        prop_oneof![
            8 => items.prop_map(|items| json!({ "messages": items })),
            1 => items_beside().prop_map(|(items, other)| json!({ "messages": items, "colour": other })),
            1 => delayq_harness::props::json(&["messages"]),
        ]
    }

    fn items_beside() -> impl Strategy<Value = (Vec<Value>, Value)> {
        (
            prop::collection::vec(push_like(), 1..3),
            delayq_harness::props::json(&["a"]),
        )
    }

    /// A body whose items a list reads but a tree cannot hold (a number past a
    /// double's range) is refused whole, as the tree refuses it, not item by item.
    #[test]
    fn a_body_no_tree_holds_is_refused_whole() {
        let config = config();
        for body in [
            r#"{"messages":[{"stream":"a","payload":"x","delay":"1s"},{"stream":"a","payload":"y","delay_ms":-1e400}]}"#,
            r#"{"messages":[{"stream":"a","payload":"x","delay":"1s"},1e400]}"#,
            r#"{"messages":[{"stream":"a","payload":"x","delay":"1s","colour":[1e999]}]}"#,
        ] {
            let refusal = outcomes(parse_items(body.as_bytes(), &config)).unwrap_err();
            assert!(
                refusal.starts_with(
                    "400 Bad Request malformed_json: body is not valid JSON: number out of range"
                ),
                "{body}: {refusal}"
            );
        }
    }

    proptest! {
        /// Read from its bytes (each item straight into its values when it has the
        /// common shape) or through the tree, a batch makes the same items or the
        /// same refusal.
        #[test]
        fn a_batch_reads_the_same_either_way(body in batch_like()) {
            let config = config();
            let from_bytes = outcomes(parse_items(body.to_string().as_bytes(), &config));
            prop_assert_eq!(from_bytes, outcomes(parse_items_tree(&body, &config)), "{}", body);
        }
    }
}
