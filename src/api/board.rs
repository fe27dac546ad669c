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
    streams: Mutex<Option<(Instant, Arc<StreamTable>)>>,
}

/// What the caller may do.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Session {
    /// `read`, `write` or `admin` (`admin` when no token is configured); null when
    /// tokens are required and the request carries none this node knows.
    #[schema(required)]
    scope: Option<String>,
    /// Whether this node asks for tokens.
    tokens_required: bool,
    node_id: String,
    version: String,
}

/// This request's scope, for a client deciding which actions to offer (open: a client learns here whether it needs a token, and whether the one it has is known, without a refusal)
#[utoipa::path(get, path = "/v1/session", operation_id = "session",
    responses((status = 200, description = "the caller's scope", body = Session)),
    security(()))]
pub async fn session(State(state): State<AppState>, headers: HeaderMap) -> Json<Session> {
    let api = &state.config.api;
    Json(Session {
        scope: super::auth::scope_held(&headers, api).map(|s| s.to_string()),
        tokens_required: !(api.tokens.is_empty()
            && api.write_tokens.is_empty()
            && api.read_tokens.is_empty()),
        node_id: state.config.node_id.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
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

/// The nodes that ever registered (forgotten a day after they were last seen).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Nodes {
    nodes: Vec<NodeView>,
    now_ms: u64,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct NodeView {
    node_id: String,
    /// `leader`, `standby`, or `gone` (stopped, or silent for 10 s).
    role: String,
    #[schema(required)]
    epoch: Option<u64>,
    address: String,
    version: String,
    started_at_ms: u64,
    last_seen_ms: u64,
}

/// Every node, its role, address, version, start and last sign of life
#[utoipa::path(get, path = "/v1/nodes", operation_id = "nodes",
    responses(
        (status = 200, description = "the nodes", body = Nodes),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn nodes(State(state): State<AppState>) -> Result<Json<Nodes>, ApiError> {
    let now = now_ms();
    let records = state.store.nodes(now).await?;
    let nodes = records
        .into_iter()
        .map(|n| {
            let gone = is_gone(&n, now);
            NodeView {
                role: match (gone, n.leader) {
                    (true, _) => "gone",
                    (false, true) => "leader",
                    (false, false) => "standby",
                }
                .to_owned(),
                epoch: n.epoch.filter(|_| !gone),
                node_id: n.node_id,
                address: n.address,
                version: n.version,
                started_at_ms: n.started_at_ms,
                last_seen_ms: n.last_seen_ms,
            }
        })
        .collect();
    Ok(Json(Nodes { nodes, now_ms: now }))
}

/// The leadership terms kept (the newest 200), newest first.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct History {
    terms: Vec<TermView>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct TermView {
    node_id: String,
    epoch: u64,
    /// The election group (`election.mode = "per_shard"`).
    #[schema(required)]
    group: Option<u16>,
    from_ms: u64,
    /// Null while it lasts.
    #[schema(required)]
    to_ms: Option<u64>,
    /// `resigned`, `switchover`, `shut down`, `lease lost`, `fenced`, `master moved`
    /// (as its leader said), `taken over` (a later term began without a word from
    /// it: a crash or a cut), `node gone` (its node stopped answering, and no term
    /// followed yet); null while it lasts.
    #[schema(required)]
    ended: Option<String>,
}

/// Who led, from when to when, and why each term ended
#[utoipa::path(get, path = "/v1/leadership/history", operation_id = "leadershipHistory",
    responses(
        (status = 200, description = "the terms, newest first", body = History),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn history(State(state): State<AppState>) -> Result<Json<History>, ApiError> {
    let now = now_ms();
    let (terms, nodes) = tokio::try_join!(state.store.terms(), state.store.nodes(now))?;
    let gone: BTreeMap<&str, u64> = nodes
        .iter()
        .filter(|n| is_gone(n, now))
        .map(|n| (n.node_id.as_str(), n.last_seen_ms))
        .collect();
    let views = term_views(terms, &gone);
    Ok(Json(History { terms: views }))
}

/// The terms as shown (newest first, as `terms` come): a term its leader did not
/// end is `taken over` from the start of the next term of its group, or `node
/// gone` (at its node's last sign of life) when its node is `gone` (node id → last
/// seen) and no term followed.
fn term_views(terms: Vec<TermRecord>, gone: &BTreeMap<&str, u64>) -> Vec<TermView> {
    // Newest first: the term after each is the one seen last of its group.
    let mut later: BTreeMap<Option<u16>, u64> = BTreeMap::new();
    let mut views = Vec::with_capacity(terms.len());
    for t in terms {
        let (to_ms, ended) = match (t.to_ms, t.ended) {
            (Some(to), Some(why)) => (Some(to), Some(why)),
            (to, why) => match later.get(&t.group) {
                Some(&next) => (
                    Some(to.unwrap_or(next)),
                    Some(why.unwrap_or_else(|| "taken over".into())),
                ),
                None => match gone.get(t.node_id.as_str()) {
                    Some(&seen) => (Some(seen), Some("node gone".into())),
                    None => (None, None),
                },
            },
        };
        later.insert(t.group, t.from_ms);
        views.push(TermView {
            node_id: t.node_id,
            epoch: t.epoch,
            group: t.group,
            from_ms: t.from_ms,
            to_ms,
            ended,
        });
    }
    views
}

/// Every target stream delayq knows of.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct StreamTable {
    streams: Vec<StreamView>,
    /// False when the last count stopped early on a very large backlog (or there
    /// is none yet).
    exact: bool,
    /// When the leader last counted the pending messages per stream (it does every
    /// 2 to 30 s, by the backlog; Redis's clock, epoch ms); null before its first
    /// count. Held, paused, delivered, dead letters and groups are read live.
    #[schema(required)]
    counted_at_ms: Option<u64>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct StreamView {
    stream: String,
    /// Scheduled and not yet forwarded, held ones included, as last counted.
    pending: u64,
    /// Of those, due within the hour after the count.
    due_next_hour: u64,
    /// Due, waiting for the stream's rate limit or its pause.
    held: u64,
    paused: bool,
    /// Over the last minute of samples.
    delivered_per_s: f64,
    /// Entries in its dead-letter stream.
    dead: u64,
    dead_letter_stream: String,
    groups: Vec<GroupView>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct GroupView {
    name: String,
    /// Entries the group has not been given yet; null when Redis cannot tell.
    #[schema(required)]
    lag: Option<u64>,
    /// Given and not acknowledged.
    pending: u64,
}

/// Per target stream: pending, due within the hour, held, paused, delivered/s, dead letters, consumer groups
#[utoipa::path(get, path = "/v1/streams", operation_id = "streams",
    responses(
        (status = 200, description = "the streams", body = StreamTable),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn streams(State(state): State<AppState>) -> Result<Json<StreamTable>, ApiError> {
    let mut cached = state.board.streams.lock().await;
    if let Some((at, t)) = cached.as_ref()
        && at.elapsed() < STREAMS_TTL
    {
        return Ok(Json(t.as_ref().clone()));
    }
    let fresh = Arc::new(compute_streams(&state).await?);
    *cached = Some((Instant::now(), fresh.clone()));
    Ok(Json(fresh.as_ref().clone()))
}

async fn compute_streams(state: &AppState) -> Result<StreamTable, ApiError> {
    let store = &state.store;
    let config = state.current_config();
    let (counts, held, paused, samples) = tokio::try_join!(
        store.stream_counts(),
        store.held(),
        store.paused(),
        store.samples(),
    )?;
    let counted_at_ms = counts.as_ref().map(|c| c.at_ms);
    let exact = counts.as_ref().is_some_and(|c| c.exact);
    let counts = counts.map(|c| c.streams).unwrap_or_default();
    let recent = parse_samples(&samples, now_ms().saturating_sub(60_000));
    let mut delivered: BTreeMap<String, u64> = BTreeMap::new();
    for s in &recent {
        for (stream, n) in &s.streams {
            *delivered.entry(stream.clone()).or_default() += n;
        }
    }
    let mut names: BTreeSet<String> = BTreeSet::new();
    names.extend(counts.keys().filter(|s| !s.is_empty()).cloned());
    names.extend(held.per_stream.keys().cloned());
    names.extend(paused.iter().cloned());
    names.extend(delivered.keys().cloned());
    names.extend(config.delivery.streams.iter().map(|d| d.stream.clone()));
    names.extend(config.streams.max_rate.iter().map(|(s, _)| s.clone()));
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort_by_key(|s| std::cmp::Reverse(counts.get(s).map_or(0, |c| c.0)));
    names.truncate(MAX_STREAMS);
    names.sort();
    let dead_names: Vec<String> = names.iter().map(|s| config.dead_letter_stream(s)).collect();
    let dead = store.stream_lengths(&dead_names).await?;
    let groups = futures::future::try_join_all(names.iter().map(|s| store.groups_of(s))).await?;
    let streams = names
        .into_iter()
        .zip(dead_names)
        .zip(dead)
        .zip(groups)
        .map(
            |(((stream, dead_letter_stream), dead), groups)| StreamView {
                pending: counts.get(&stream).map_or(0, |c| c.0),
                due_next_hour: counts.get(&stream).map_or(0, |c| c.1),
                held: held.per_stream.get(&stream).copied().unwrap_or(0),
                paused: paused.contains(&stream),
                delivered_per_s: delivered.get(&stream).copied().unwrap_or(0) as f64 / 60.0,
                dead,
                dead_letter_stream,
                groups: groups
                    .into_iter()
                    .map(|g| GroupView {
                        name: g.name,
                        lag: g.lag,
                        pending: g.pending,
                    })
                    .collect(),
                stream,
            },
        )
        .collect();
    Ok(StreamTable {
        streams,
        exact,
        counted_at_ms,
    })
}

/// A page of the next messages due.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UpcomingQuery {
    /// Only messages to this stream.
    #[serde(default, deserialize_with = "blank_as_none")]
    stream: Option<String>,
    /// Start after this cursor (the `next` of the page before).
    #[serde(default, deserialize_with = "blank_as_none")]
    after: Option<String>,
    /// At most this many messages: 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    #[serde(default, deserialize_with = "blank_as_none")]
    limit: Option<usize>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct UpcomingPage {
    messages: Vec<UpcomingView>,
    /// The `after` of the next page; null once every message was listed.
    #[schema(required)]
    next: Option<String>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct UpcomingView {
    id: String,
    stream: String,
    /// Epoch milliseconds.
    deliver_at: u64,
    priority: u8,
    /// Due, and waiting for its stream's rate limit or its pause.
    held: bool,
}

/// The next messages due, in due order, of every stream or of one
#[utoipa::path(get, path = "/v1/upcoming", operation_id = "upcoming", params(UpcomingQuery),
    responses(
        (status = 200, description = "a page of messages; a page may be short (even empty) with a `next` when a stream filter matches little", body = UpcomingPage),
        (status = 400, description = "the query cannot be parsed, or names an unknown parameter (bad_query)", body = ErrorBody),
        (status = 422, description = "a parameter breaks a rule (limit out of range, a cursor not given by `next`, a bad stream name); the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn upcoming(
    State(state): State<AppState>,
    StrictQuery(q): StrictQuery<UpcomingQuery>,
) -> Result<Json<UpcomingPage>, ApiError> {
    let limit = match q.limit {
        None => 50,
        Some(n @ 1..=1000) => n,
        Some(n) => {
            return Err(ApiError::invalid(format!(
                "limit: {n} is not between 1 and 1000"
            )));
        }
    };
    if let Some(stream) = q.stream.as_deref() {
        crate::message::validate_stream(stream)?;
    }
    let after = q.after.as_deref().map(parse_cursor).transpose()?;
    let page = state
        .store
        .upcoming(
            after.as_ref().map(|(s, id)| (*s, id.as_str())),
            limit,
            q.stream.as_deref(),
        )
        .await?;
    Ok(Json(UpcomingPage {
        messages: page
            .messages
            .into_iter()
            .map(|m| UpcomingView {
                deliver_at: m.score / 10,
                priority: 9 - (m.score % 10) as u8,
                id: m.id,
                stream: m.stream,
                held: m.held,
            })
            .collect(),
        next: page.next.map(|(score, id)| format!("{score}-{id}")),
    }))
}

/// A cursor `<score>-<id>`, as `next` gives it.
fn parse_cursor(cursor: &str) -> Result<(u64, String), ApiError> {
    let bad = || {
        ApiError::invalid(format!(
            "after: {cursor:?} is not a cursor this endpoint gave (`next`)"
        ))
    };
    let (score, id) = cursor.split_once('-').ok_or_else(bad)?;
    let score: u64 = score.parse().map_err(|_| bad())?;
    let id = crate::message::MessageId::parse(id).map_err(|_| bad())?;
    Ok((score, id.as_str().to_owned()))
}

/// The shards' fences.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Fences {
    highest: u64,
    shards: Vec<ShardFence>,
    /// The epoch of the leader this node knows of.
    #[schema(required)]
    leader_epoch: Option<u64>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ShardFence {
    shard: u16,
    /// The highest epoch that touched the shard (0: none yet).
    fence: u64,
}

/// Each shard's fence: the highest leader epoch that touched it
#[utoipa::path(get, path = "/v1/fences", operation_id = "fences",
    responses(
        (status = 200, description = "the fences", body = Fences),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn fences(State(state): State<AppState>) -> Result<Json<Fences>, ApiError> {
    let shards = state.store.fences().await?;
    Ok(Json(Fences {
        highest: shards.iter().map(|(_, f)| *f).max().unwrap_or(0),
        shards: shards
            .into_iter()
            .map(|(shard, fence)| ShardFence { shard, fence })
            .collect(),
        leader_epoch: state.leadership.info().epoch,
    }))
}

/// A stream's forwarding state.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct PauseAnswer {
    stream: String,
    paused: bool,
    /// Whether this request changed it.
    changed: bool,
    /// The journal (`[journal]`) did not take the change within 1 s: a loss of
    /// Redis's data before it does would undo it. Repeating it is safe.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    not_journaled: bool,
}

/// Pause forwarding to a stream: its messages wait, in due order, until it is resumed
#[utoipa::path(post, path = "/v1/streams/{stream}/pause", operation_id = "pauseStream", params(StreamPath),
    responses(
        (status = 200, description = "paused (takes effect within 250 ms)", body = PauseAnswer),
        (status = 400, description = "the stream name breaks a rule", body = ErrorBody),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn pause(
    state: State<AppState>,
    path: Path<StreamPath>,
) -> Result<Json<PauseAnswer>, ApiError> {
    set_paused(state, path, true).await
}

/// Resume forwarding to a paused stream: what waited goes first, in due order
#[utoipa::path(post, path = "/v1/streams/{stream}/resume", operation_id = "resumeStream", params(StreamPath),
    responses(
        (status = 200, description = "resumed", body = PauseAnswer),
        (status = 400, description = "the stream name breaks a rule", body = ErrorBody),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn resume(
    state: State<AppState>,
    path: Path<StreamPath>,
) -> Result<Json<PauseAnswer>, ApiError> {
    set_paused(state, path, false).await
}

async fn set_paused(
    State(state): State<AppState>,
    Path(StreamPath { stream }): Path<StreamPath>,
    paused: bool,
) -> Result<Json<PauseAnswer>, ApiError> {
    crate::message::validate_stream(&stream)?;
    let (changed, at_ms) = state.store.set_paused(&stream, paused).await?;
    if changed {
        tracing::info!(%stream, paused, "stream forwarding {}", if paused { "paused" } else { "resumed" });
    }
    // Kept in the journal too, so that a restore after a loss of Redis's data
    // pauses the stream again before forwarding resumes.
    let not_journaled = match state.ingest.journal() {
        Some(journal) => {
            let write = async {
                journal
                    .set_paused(&stream, paused, at_ms)
                    .await
                    .map(|()| true)
            };
            !super::durable::journaled(write).await
        }
        None => false,
    };
    *state.board.streams.lock().await = None;
    Ok(Json(PauseAnswer {
        stream,
        paused,
        changed,
        not_journaled,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(
        node: &str,
        epoch: u64,
        group: Option<u16>,
        from: u64,
        end: Option<(u64, &str)>,
    ) -> TermRecord {
        TermRecord {
            node_id: node.into(),
            epoch,
            group,
            from_ms: from,
            to_ms: end.map(|(t, _)| t),
            ended: end.map(|(_, why)| why.into()),
        }
    }

    fn shown(views: &[TermView]) -> Vec<(String, u64, Option<u64>, Option<String>)> {
        views
            .iter()
            .map(|v| (v.node_id.clone(), v.epoch, v.to_ms, v.ended.clone()))
            .collect()
    }

    #[test]
    fn terms_end_as_their_leader_said_or_as_what_came_after_them() {
        let gone = BTreeMap::from([("c", 950)]);
        type Shown<'a> = (&'a str, u64, Option<u64>, Option<&'a str>);
        let cases: Vec<(Vec<TermRecord>, Vec<Shown>)> = vec![
            // Ended in order: kept as said.
            (
                vec![term("a", 2, None, 100, Some((200, "resigned")))],
                vec![("a", 2, Some(200), Some("resigned"))],
            ),
            // Still leading.
            (
                vec![term("a", 2, None, 100, None)],
                vec![("a", 2, None, None)],
            ),
            // Silent, and a later term began: taken over at its start.
            (
                vec![term("b", 5, None, 300, None), term("a", 2, None, 100, None)],
                vec![
                    ("b", 5, None, None),
                    ("a", 2, Some(300), Some("taken over")),
                ],
            ),
            // Silent, its node gone, nobody followed: ended with its node.
            (
                vec![term("c", 7, None, 900, None)],
                vec![("c", 7, Some(950), Some("node gone"))],
            ),
            // Groups follow each other only within themselves.
            (
                vec![
                    term("b", 9, Some(1), 500, None),
                    term("a", 8, Some(0), 400, None),
                ],
                vec![("b", 9, None, None), ("a", 8, None, None)],
            ),
        ];
        for (terms, want) in cases {
            let want: Vec<_> = want
                .into_iter()
                .map(|(n, e, to, why)| (n.to_owned(), e, to, why.map(str::to_owned)))
                .collect();
            assert_eq!(shown(&term_views(terms.clone(), &gone)), want, "{terms:?}");
        }
    }

    fn sample(t: u64, node: &str, n: u64, p99: Option<u64>) -> String {
        serde_json::to_string(&SampleRecord {
            t_ms: t,
            node_id: node.into(),
            forwarded: n,
            streams: BTreeMap::from([("orders".to_owned(), n)]),
            p50_ms: p99,
            p99_ms: p99,
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
