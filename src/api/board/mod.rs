//! What the dashboard shows, as JSON any client can read: this session's scope,
//! the overview (leader, fence, Redis and etcd, pending and overdue, the due-time
//! histogram, the forwarding rate of the last 15 minutes), the nodes, the
//! leadership history, the target streams, the next messages due, the fences; and
//! the operations behind its buttons: pause and resume a stream, reload this node's
//! configuration. The overview and the stream table scan Redis: each node computes
//! them at most once per [`OVERVIEW_TTL`] / [`STREAMS_TTL`] however many pages
//! poll, one computation at a time (an overview that took long, over a large
//! backlog, is served [`OVERVIEW_SHARE`] times as long as it took); the stream
//! table's pending counts are the leader's own (it counts per stream for its
//! metrics anyway), so no page makes Redis count again.

mod day;
mod nodes;
mod operations;
mod series;
mod streams;
mod upcoming;

pub use nodes::*;
pub use operations::*;
pub use streams::*;
pub use upcoming::*;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use utoipa::{IntoParams, ToSchema};

use super::input::{StrictQuery, blank_as_none};
use super::reach::Reach;
use super::streams::StreamPath;
use super::{ApiError, AppState, ErrorBody};
use crate::health::RedisState;
use crate::registry::{SampleRecord, is_gone, now_ms};
use crate::store::TermRecord;

/// How long a computed overview is served again, at least.
pub const OVERVIEW_TTL: Duration = Duration::from_secs(2);
/// An overview is served at least this many times as long as it took to compute:
/// its due-time histogram walks the compact buckets up to a day ahead, and over
/// millions of messages a computation takes a good part of a second of Redis's
/// time, which open pages would otherwise ask for every 2 s.
pub const OVERVIEW_SHARE: u32 = 20;
/// How long a computed stream table is served again.
pub const STREAMS_TTL: Duration = Duration::from_secs(5);
/// The window of the rate series.
const RATE_WINDOW_MS: u64 = 15 * 60_000;
/// Most streams in the stream table.
const MAX_STREAMS: usize = 500;

/// Answers computed recently, shared by every request to this node.
#[derive(Default)]
pub struct BoardCache {
    /// When it was computed, how long it is served, and the overview.
    overview: Mutex<Option<(Instant, Duration, Arc<Overview>)>>,
    /// The stream table, and the day's (with the streams only the day lists).
    streams: TableSlot,
    streams_day: TableSlot,
}

/// A stream table, when it was computed and the streams it lists besides those
/// it always does.
type TableSlot = Mutex<Option<(Instant, BTreeSet<String>, Arc<StreamTable>)>>;

/// What the caller may do.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Session {
    /// `read`, `write` or `admin` (`admin` when no token is configured); null when
    /// tokens are required and the request carries none this node knows.
    #[schema(required)]
    scope: Option<String>,
    /// Whether this node asks for tokens.
    tokens_required: bool,
    /// The patterns of the streams the token reaches (`streams=` in its tokens
    /// file); null: every stream.
    #[schema(required)]
    streams: Option<Vec<String>>,
    node_id: String,
    version: String,
    /// Whether this node keeps a journal (`[journal]`): messages' histories.
    journal: bool,
}

/// This request's scope, for a client deciding which actions to offer (open: a client learns here whether it needs a token, and whether the one it has is known, without a refusal)
#[utoipa::path(get, path = "/v1/session", operation_id = "session",
    responses((status = 200, description = "the caller's scope", body = Session)),
    security(()))]
pub async fn session(State(state): State<AppState>, headers: HeaderMap) -> Json<Session> {
    let live = state.current_config();
    let api = &live.api;
    let held = super::auth::scope_held(&headers, api);
    Json(Session {
        scope: held.as_ref().map(|(scope, _)| scope.to_string()),
        streams: held.and_then(|(_, streams)| streams),
        tokens_required: !(api.tokens.is_empty()
            && api.write_tokens.is_empty()
            && api.read_tokens.is_empty()),
        node_id: state.config.node_id.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        journal: state.ingest.journal().is_some(),
    })
}

/// The deployment at a glance.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Overview {
    node: ThisNode,
    leader: LeaderBrief,
    redis: Component,
    etcd: Component,
    /// The highest fence epoch in Redis.
    fence: u64,
    pending: PendingBrief,
    due: DueHistogram,
    /// Forwarding over the last 15 minutes, oldest first, one point per 5 s sample.
    rate: Vec<RatePoint>,
    /// When this was computed (this node's clock, epoch ms).
    now_ms: u64,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ThisNode {
    node_id: String,
    is_leader: bool,
    version: String,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct LeaderBrief {
    #[serde(flatten)]
    seen: super::node::LeaderSeen,
    /// `etcd`, `standalone` or `per_shard`.
    mode: String,
}

/// A dependency's state as this node sees it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Component {
    /// Redis: `writable`, `refuses`, `unreachable` or `starting`; etcd:
    /// `reachable`, `unreachable` or `not used`.
    status: String,
    #[schema(required)]
    detail: Option<String>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct PendingBrief {
    /// Every message scheduled and not yet forwarded, held ones included.
    total: u64,
    /// Of those, due now or earlier.
    overdue: u64,
    /// How long ago the earliest overdue message fell due; null when none is.
    #[schema(required)]
    oldest_overdue_ms: Option<u64>,
    /// Due, and waiting for their stream's rate limit or a paused stream.
    held: u64,
    paused_streams: u64,
}

/// Pending messages by when they fall due (each class excludes the ones before).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct DueHistogram {
    overdue: u64,
    next_minute: u64,
    next_hour: u64,
    next_day: u64,
    later: u64,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct RatePoint {
    t_ms: u64,
    delivered_per_s: f64,
    /// Lateness percentiles of the sample's forwards (the highest over the leaders
    /// sampled at that time); null when nothing was forwarded.
    #[schema(required)]
    p50_ms: Option<u64>,
    #[schema(required)]
    p99_ms: Option<u64>,
}

/// Leader, fence, Redis and etcd, pending and overdue, due-time histogram, forwarding rate
#[utoipa::path(get, path = "/v1/overview", operation_id = "overview",
    responses(
        (status = 200, description = "the overview", body = Overview),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn overview(State(state): State<AppState>) -> Result<Json<Overview>, ApiError> {
    let mut cached = state.board.overview.lock().await;
    if let Some((at, ttl, o)) = cached.as_ref()
        && at.elapsed() < *ttl
    {
        return Ok(Json(o.as_ref().clone()));
    }
    let started = Instant::now();
    let fresh = Arc::new(compute_overview(&state).await?);
    let ttl = OVERVIEW_TTL.max(started.elapsed() * OVERVIEW_SHARE);
    *cached = Some((Instant::now(), ttl, fresh.clone()));
    Ok(Json(fresh.as_ref().clone()))
}

async fn compute_overview(state: &AppState) -> Result<Overview, ApiError> {
    let store = &state.store;
    let now = store.now_ms().await?;
    let bounds = [now, now + 60_000, now + 3_600_000, now + 86_400_000];
    // One walk of the shards: the histogram counts held messages by their due time
    // too, and finds the earliest; `held` reads only the held sets.
    let (classes, held, fence, paused, samples) = tokio::try_join!(
        store.due_histogram(&bounds),
        store.held(),
        store.highest_fence(),
        store.paused(),
        store.samples(),
    )?;
    let due = classes.counts;
    let next_due = classes.earliest_due_ms;
    let now_here = now_ms();
    let info = state.leadership.info();
    let role = state.leadership.current();
    let total: u64 = due.iter().sum();
    Ok(Overview {
        node: ThisNode {
            node_id: state.config.node_id.clone(),
            is_leader: role.is_leader(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        },
        leader: LeaderBrief {
            mode: match state.groups.is_empty() {
                true => info.mode.to_owned(),
                false => "per_shard".to_owned(),
            },
            seen: info.clone().into(),
        },
        redis: match state.health.redis() {
            RedisState::Writable => component("writable", None),
            RedisState::Starting => component("starting", None),
            RedisState::Refuses(e) => component("refuses", Some(e)),
            RedisState::Unreachable(e) => component("unreachable", Some(e)),
        },
        etcd: match info.etcd_reachable {
            None => component("not used", None),
            Some(true) => component("reachable", None),
            Some(false) => component(
                "unreachable",
                Some("etcd did not answer the last query".into()),
            ),
        },
        fence,
        pending: PendingBrief {
            total,
            overdue: due[0],
            oldest_overdue_ms: next_due.filter(|&d| d <= now).map(|d| now - d),
            held: held.total(),
            paused_streams: paused.len() as u64,
        },
        due: DueHistogram {
            overdue: due[0],
            next_minute: due[1],
            next_hour: due[2],
            next_day: due[3],
            later: due[4],
        },
        rate: rate_series(&samples, now_here),
        now_ms: now_here,
    })
}

fn component(status: &str, detail: Option<String>) -> Component {
    Component {
        status: status.to_owned(),
        detail,
    }
}

fn parse_samples(samples: &[String], since_ms: u64) -> Vec<SampleRecord> {
    samples
        .iter()
        .filter_map(|s| serde_json::from_str::<SampleRecord>(s).ok())
        .filter(|s| s.t_ms >= since_ms)
        .collect()
}

/// The samples of the last 15 minutes, one point per 5 s slot (the leaders'
/// samples in a slot added up).
fn rate_series(samples: &[String], now_ms: u64) -> Vec<RatePoint> {
    let every = crate::registry::SAMPLE_EVERY.as_millis() as u64;
    let mut slots: BTreeMap<u64, RatePoint> = BTreeMap::new();
    for s in parse_samples(samples, now_ms.saturating_sub(RATE_WINDOW_MS)) {
        let slot = s.t_ms / every * every;
        let point = slots.entry(slot).or_insert(RatePoint {
            t_ms: slot,
            delivered_per_s: 0.0,
            p50_ms: None,
            p99_ms: None,
        });
        point.delivered_per_s += s.forwarded as f64 * 1000.0 / every as f64;
        point.p50_ms = point.p50_ms.max(s.p50_ms);
        point.p99_ms = point.p99_ms.max(s.p99_ms);
    }
    slots.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    fn sample(t: u64, node: &str, n: u64, p99: Option<u64>) -> String {
        serde_json::to_string(&SampleRecord {
            t_ms: t,
            node_id: node.into(),
            forwarded: n,
            streams: BTreeMap::from([("orders".to_owned(), n)]),
            p50_ms: p99,
            p99_ms: p99,
            worst_ms: BTreeMap::new(),
            dead: BTreeMap::new(),
        })
        .unwrap()
    }

    #[test]
    fn the_rate_adds_up_leaders_in_a_slot_and_keeps_fifteen_minutes() {
        let now = 20 * 60_000;
        let samples = vec![
            sample(now - 1000, "a", 50, Some(3)),
            sample(now - 2000, "b", 25, Some(7)),
            sample(now - 6000, "a", 5, None),
            sample(now - 16 * 60_000, "a", 500, Some(1)),
            "not json".to_owned(),
        ];
        let points: Vec<(u64, f64, Option<u64>)> = rate_series(&samples, now)
            .iter()
            .map(|p| (p.t_ms, p.delivered_per_s, p.p99_ms))
            .collect();
        assert_eq!(
            points,
            [(now - 10_000, 1.0, None), (now - 5000, 15.0, Some(7))]
        );
    }
}
