//! This instance: its health for load balancers (`/healthz`, `/readyz`, `/leader`),
//! its metrics, who leads as it sees it (`/v1/leader`), and the planned switchover
//! (`/v1/admin/resign`).

use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::{ApiError, AppState, ErrorBody};
use crate::leadership::{Role, StepDown};

/// `/healthz`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Healthy {
    /// `ok`.
    status: String,
}

/// `/readyz`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Ready {
    /// `ok`.
    status: String,
    /// `ok`.
    redis: String,
    /// `ok`, or `not configured`.
    etcd: String,
    /// What can lose messages although the instance is ready: an `allkeys-*`
    /// `maxmemory-policy` of Redis's, say. Empty when there is nothing to tell.
    warnings: Vec<String>,
}

/// Redis reachable
///
/// Redis takes writes (the last probe, at most a second old): the process can do its
/// job, as leader or standby.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    responses(
        (status = 200, description = "healthy", body = Healthy),
        (status = 503, description = "Redis unreachable", body = ErrorBody),
    ),
    security(()),
)]
pub async fn healthz(State(state): State<AppState>) -> Response {
    // Answers without a Redis round trip of its own.
    match state.health.redis().problem() {
        None => Json(Healthy {
            status: "ok".to_owned(),
        })
        .into_response(),
        Some(problem) => ApiError::unavailable(problem).into_response(),
    }
}

/// Redis and (when configured) etcd reachable
///
/// Redis takes writes and, when an etcd election is configured, etcd answers: the
/// instance can do its job, and take over if the leader goes away; 503
/// `redis_permission` names a command the Redis user may not run. `warnings` names
/// Redis settings that can lose messages (an `allkeys-*` eviction policy) and a
/// master nearly full or refusing writes for want of memory, which do not make the
/// instance unready.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "ready",
    responses(
        (status = 200, description = "ready", body = Ready),
        (status = 503, description = "Redis or etcd unreachable, or the Redis user may not run a command delayq runs (redis_permission)", body = ErrorBody),
    ),
    security(()),
)]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Ready>, ApiError> {
    if let Some(problem) = state.health.redis().problem() {
        return Err(ApiError::unavailable(problem));
    }
    if let Some(problem) = state.health.rights_problem() {
        return Err(ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "redis_permission",
            problem,
        ));
    }
    let etcd = match state.leadership.info().etcd_reachable {
        None => "not configured",
        Some(true) => "ok",
        Some(false) => {
            return Err(ApiError::unavailable("etcd: no answer to the last query"));
        }
    };
    Ok(Json(Ready {
        status: "ok".to_owned(),
        redis: "ok".to_owned(),
        etcd: etcd.to_owned(),
        warnings: state.health.warnings(),
    }))
}

/// `/v1/admin/resign`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Resigned {
    /// `true`.
    resigned: bool,
    node_id: String,
    /// The epoch given up.
    epoch: u64,
}

/// Planned switchover: the leader resigns and a standby takes over
///
/// The leader gives up its term and stays out of the next election for a moment, so
/// that a standby takes over. Answers once this node has stepped down.
#[utoipa::path(
    post,
    path = "/v1/admin/resign",
    operation_id = "resign",
    responses(
        (status = 200, description = "resigned; the epoch given up", body = Resigned),
        (status = 409, description = "not the leader (not_leader), or standalone: no etcd to hand over through", body = ErrorBody),
        (status = 503, description = "still leading after 5 s", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn resign(State(state): State<AppState>) -> Result<Json<Resigned>, ApiError> {
    let info = state.leadership.info();
    if info.mode == "standalone" {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "standalone",
            "no etcd configured: there is no other instance to hand over to",
        ));
    }
    let Role::Leader(term) = state.leadership.current() else {
        let leader = match (info.node_id, info.address) {
            (Some(node), Some(address)) => format!("; the leader is {node} at {address}"),
            _ => String::new(),
        };
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_leader",
            format!("{} is a standby{leader}", state.config.node_id),
        ));
    };
    let mut roles = state.leadership.subscribe();
    state.leadership.step_down(StepDown::Resign);
    let stepped_down = tokio::time::timeout(
        Duration::from_secs(5),
        roles.wait_for(|role| role.epoch() != Some(term.epoch)),
    )
    .await;
    match stepped_down {
        Ok(Ok(_)) => Ok(Json(Resigned {
            resigned: true,
            node_id: state.config.node_id.clone(),
            epoch: term.epoch,
        })),
        _ => Err(ApiError::unavailable(
            "asked to resign, but still leading after 5s",
        )),
    }
}

/// `/v1/leader`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeaderView {
    node_id: String,
    /// Whether this instance leads.
    is_leader: bool,
    /// `standalone` or `etcd`.
    mode: String,
    leader: LeaderSeen,
    /// This instance's epoch while it leads.
    #[schema(required)]
    epoch: Option<u64>,
    /// Since when this instance leads, epoch milliseconds.
    #[schema(required)]
    since_ms: Option<u64>,
    /// Lease time left while this instance leads (etcd mode).
    #[schema(required)]
    lease_left_ms: Option<u64>,
    /// `election.mode = "per_shard"`: each election group, its shards and who leads
    /// it (empty in the single-leader mode, where `leader` leads every shard).
    groups: Vec<GroupView>,
}

/// One election group as this instance sees it.
#[derive(Debug, Serialize, ToSchema)]
pub struct GroupView {
    group: u16,
    shards: Vec<u16>,
    /// Whether this instance leads the group.
    is_leader: bool,
    /// This instance's epoch of the group while it leads it.
    #[schema(required)]
    epoch: Option<u64>,
    leader: LeaderSeen,
    /// Lease time left while this instance leads the group.
    #[schema(required)]
    lease_left_ms: Option<u64>,
}

/// The leader as this instance knows it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct LeaderSeen {
    #[schema(required)]
    node_id: Option<String>,
    #[schema(required)]
    address: Option<String>,
    #[schema(required)]
    epoch: Option<u64>,
}

impl From<crate::leadership::LeaderInfo> for LeaderSeen {
    fn from(info: crate::leadership::LeaderInfo) -> Self {
        LeaderSeen {
            node_id: info.node_id,
            address: info.address,
            epoch: info.epoch,
        }
    }
}

/// Who leads, as this instance sees it
#[utoipa::path(
    get,
    path = "/v1/leader",
    operation_id = "leader",
    responses((status = 200, description = "leadership", body = LeaderView)),
    security(("bearer" = [])),
)]
pub async fn leader(State(state): State<AppState>) -> Json<LeaderView> {
    let role = state.leadership.current();
    let info = state.leadership.info();
    let since_ms = match &role {
        Role::Leader(term) => term
            .since
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(|d| d.as_millis() as u64),
        Role::Follower => None,
    };
    Json(LeaderView {
        node_id: state.config.node_id.clone(),
        is_leader: role.is_leader(),
        mode: info.mode.to_owned(),
        lease_left_ms: info.lease_left().map(|d| d.as_millis() as u64),
        leader: info.into(),
        epoch: role.epoch(),
        since_ms,
        groups: state
            .groups
            .iter()
            .map(|g| {
                let info = g.leadership.info();
                let role = g.leadership.current();
                GroupView {
                    group: g.group,
                    shards: g.shards.clone(),
                    is_leader: role.is_leader(),
                    epoch: role.epoch(),
                    lease_left_ms: info.lease_left().map(|d| d.as_millis() as u64),
                    leader: info.into(),
                }
            })
            .collect(),
    })
}

/// `/leader`'s answer on the leader.
#[derive(Debug, Serialize, ToSchema)]
pub struct Leading {
    /// `true`.
    leader: bool,
    node_id: String,
    epoch: u64,
}

/// 200 only on the leader, for load balancers
#[utoipa::path(
    get,
    path = "/leader",
    operation_id = "isLeader",
    responses(
        (status = 200, description = "this instance leads", body = Leading),
        (status = 503, description = "this instance is a standby (not_leader)", body = ErrorBody),
    ),
    security(()),
)]
pub async fn leader_only(State(state): State<AppState>) -> Result<Json<Leading>, ApiError> {
    match state.leadership.current() {
        Role::Leader(term) => Ok(Json(Leading {
            leader: true,
            node_id: state.config.node_id.clone(),
            epoch: term.epoch,
        })),
        Role::Follower => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_leader",
            format!("{} is a standby", state.config.node_id),
        )),
    }
}

/// Prometheus metrics
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")),
    security(()),
)]
pub async fn render_metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
