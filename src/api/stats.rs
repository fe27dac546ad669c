//! `GET /v1/stats`: what is scheduled (per shard, per stream), when the next message
//! falls due, how late recent forwards were, the inbox, and who leads.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::{ApiError, AppState};
use crate::config::InboxConfig;
use crate::metrics::{LatenessSummary, lateness_summary};

/// Most scheduled messages looked at to count them per stream; past it the counts
/// are marked inexact rather than holding the request (and Redis) for long.
const STREAM_COUNT_LIMIT: usize = 200_000;

pub async fn stats(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let store = &state.store;
    let inbox = state.config.inbox.as_ref().map(InboxConfig::queue);
    let inbox_stats = async {
        match &inbox {
            Some(queue) => store.inbox_stats(queue).await.map(Some),
            None => Ok(None),
        }
    };
    let (per_shard, next_due, per_stream, now, inbox_stats) = tokio::try_join!(
        store.pending_per_shard(),
        store.next_due_ms(),
        store.pending_per_stream(STREAM_COUNT_LIMIT),
        store.now_ms(),
        inbox_stats,
    )?;
    let inbox = match (&inbox, inbox_stats) {
        (Some(queue), Some(s)) => {
            json!({ "stream": queue.stream, "length": s.length, "pending": s.pending })
        }
        _ => Value::Null,
    };
    let role = state.leadership.current();
    let info = state.leadership.info();
    let (recent, since_start) = lateness_summary();
    Ok(Json(json!({
        "node_id": state.config.node_id,
        "leader": {
            "is_leader": role.is_leader(),
            "node_id": info.node_id,
            "address": info.address,
            "epoch": info.epoch,
            "mode": info.mode,
        },
        "pending": {
            "total": per_shard.iter().sum::<u64>(),
            "per_shard": per_shard,
            "per_stream": per_stream.per_stream,
            "per_stream_exact": per_stream.exact,
            "next_due": next_due,
            "next_due_in_ms": next_due.map(|due| due.saturating_sub(now)),
        },
        "lateness_ms": {
            "scope": "messages forwarded by this instance",
            "recent": recent.map(summary),
            "since_start": since_start.map(summary),
        },
        "inbox": inbox,
    })))
}

fn summary(s: LatenessSummary) -> Value {
    json!({ "count": s.count, "p50": s.p50, "p99": s.p99, "max": s.max })
}
