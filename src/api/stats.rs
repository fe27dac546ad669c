//! `GET /v1/stats`: what is scheduled (per shard, per stream), when the next message
//! falls due, how late recent forwards were, the inbox, and who leads.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::reach::Reach;
use super::{ApiError, AppState, ErrorBody};
use crate::config::InboxConfig;
use crate::metrics::{LatenessSummary, lateness_summary};

/// Most scheduled messages looked at to count them per stream; past it the counts
/// are marked inexact rather than holding the request (and Redis) for long.
const STREAM_COUNT_LIMIT: usize = 200_000;

/// What this instance sees of the whole.
#[derive(Debug, Serialize, ToSchema)]
pub struct Stats {
    node_id: String,
    leader: StatsLeader,
    pending: Pending,
    lateness_ms: Lateness,
    /// The inbox stream; null without one.
    #[schema(required)]
    inbox: Option<Inbox>,
}

/// Who leads, as this instance sees it.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatsLeader {
    /// Whether this instance leads.
    is_leader: bool,
    #[schema(required)]
    node_id: Option<String>,
    #[schema(required)]
    address: Option<String>,
    #[schema(required)]
    epoch: Option<u64>,
    /// `standalone` or `etcd`.
    mode: String,
}

/// The messages scheduled.
#[derive(Debug, Serialize, ToSchema)]
pub struct Pending {
    total: u64,
    /// Per shard, in shard order (standalone Redis; empty on Redis Cluster).
    per_shard: Vec<u64>,
    /// Redis Cluster: per hash slot in use (a stream's messages live in its slot).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    per_slot: BTreeMap<u16, u64>,
    per_stream: BTreeMap<String, u64>,
    /// False when counting stopped early on a very large backlog.
    per_stream_exact: bool,
    /// When the next message falls due, epoch milliseconds.
    #[schema(required)]
    next_due: Option<u64>,
    #[schema(required)]
    next_due_in_ms: Option<u64>,
}

/// Forward time minus due time of the messages this instance forwarded.
#[derive(Debug, Serialize, ToSchema)]
pub struct Lateness {
    scope: String,
    /// The last minutes; null before the first forward.
    #[schema(required)]
    recent: Option<LatenessStats>,
    #[schema(required)]
    since_start: Option<LatenessStats>,
}

/// A lateness summary, in milliseconds.
#[derive(Debug, Serialize, ToSchema)]
pub struct LatenessStats {
    count: u64,
    p50: u64,
    p99: u64,
    max: u64,
}

impl From<LatenessSummary> for LatenessStats {
    fn from(s: LatenessSummary) -> Self {
        LatenessStats {
            count: s.count,
            p50: s.p50,
            p99: s.p99,
            max: s.max,
        }
    }
}

/// The inbox stream.
#[derive(Debug, Serialize, ToSchema)]
pub struct Inbox {
    stream: String,
    /// Entries not yet read, or read and not yet scheduled.
    length: u64,
    /// Entries read and not yet scheduled or rejected.
    pending: u64,
}

/// Pending messages per shard and stream, next due time, lateness, inbox, leader
#[utoipa::path(
    get,
    path = "/v1/stats",
    operation_id = "stats",
    responses(
        (status = 200, description = "statistics", body = Stats),
        (status = 503, description = "Redis unreachable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn stats(State(state): State<AppState>, reach: Reach) -> Result<Json<Stats>, ApiError> {
    let store = &state.store;
    let inbox = state.config.inbox.as_ref().map(InboxConfig::queue);
    let inbox_stats = async {
        match &inbox {
            Some(queue) => store.inbox_stats(queue).await.map(Some),
            None => Ok(None),
        }
    };
    let (pending, per_stream, now, inbox_stats) = tokio::try_join!(
        store.pending_report(0),
        store.pending_per_stream(STREAM_COUNT_LIMIT, 0),
        store.now_ms(),
        inbox_stats,
    )?;
    let inbox = match (inbox, inbox_stats) {
        (Some(queue), Some(s)) => Some(Inbox {
            stream: queue.stream,
            length: s.length,
            pending: s.pending,
        }),
        _ => None,
    };
    let (per_shard, next_due) = (pending.per_shard, pending.earliest_due_ms);
    let role = state.leadership.current();
    let info = state.leadership.info();
    let (recent, since_start) = lateness_summary();
    Ok(Json(Stats {
        node_id: state.config.node_id.clone(),
        leader: StatsLeader {
            is_leader: role.is_leader(),
            node_id: info.node_id,
            address: info.address,
            epoch: info.epoch,
            mode: info.mode.to_owned(),
        },
        pending: Pending {
            total: per_shard.iter().map(|(_, n)| n).sum(),
            per_slot: match state.store.is_cluster() {
                true => per_shard.iter().copied().collect(),
                false => BTreeMap::new(),
            },
            per_shard: match state.store.is_cluster() {
                true => Vec::new(),
                false => per_shard.iter().map(|(_, n)| *n).collect(),
            },
            // Only the streams the token reaches (the totals count every stream).
            per_stream: per_stream
                .per_stream
                .into_iter()
                .filter(|(stream, _)| reach.sees(stream))
                .collect(),
            per_stream_exact: per_stream.exact,
            next_due,
            next_due_in_ms: next_due.map(|due| due.saturating_sub(now)),
        },
        lateness_ms: Lateness {
            scope: "messages forwarded by this instance".to_owned(),
            recent: recent.map(LatenessStats::from),
            since_start: since_start.map(LatenessStats::from),
        },
        inbox,
    }))
}
