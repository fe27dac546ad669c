//! The HTTP API. Handlers validate input and call `store`; they never build a
//! Redis key.

mod access;
mod auth;
mod dead;
mod error;
mod guard;
mod messages;
mod openapi;
mod stats;
mod streams;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use tower::limit::GlobalConcurrencyLimitLayer;

pub use error::ApiError;

use crate::config::Config;
use crate::leadership::{Leadership, Role, StepDown};
use crate::store::Store;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// The configuration at start. Keys that a reload may change (see
    /// `crate::reload::RELOADABLE`) are read from `live_config` instead.
    pub config: Arc<Config>,
    pub live_config: tokio::sync::watch::Receiver<Arc<Config>>,
    pub store: Store,
    pub leadership: Leadership,
    /// The Redis write probe's findings, for `/healthz` and `/readyz`.
    pub health: crate::health::Health,
    pub metrics: PrometheusHandle,
}

impl AppState {
    /// The running configuration, with the latest reload applied.
    pub fn current_config(&self) -> Arc<Config> {
        self.live_config.borrow().clone()
    }
}

pub fn router(state: AppState) -> Router {
    let api = &state.config.api;
    // One bound for every guarded route together.
    let limit = GlobalConcurrencyLimitLayer::new(api.max_concurrent_requests);
    // A long poll waits up to api.max_wait by design: its time is that and the usual.
    let polls = guard::guarded(
        Router::new().route("/v1/streams/{stream}/next", get(streams::next)),
        &limit,
        api.max_concurrent_requests,
        api.max_wait + api.request_timeout,
        "api.max_wait + api.request_timeout",
    );
    let v1 = Router::new()
        .route("/v1/messages", post(messages::push))
        // The static segment wins over `{id}`: GET and DELETE here still reach the
        // message whose id is "batch".
        .route(
            "/v1/messages/batch",
            post(messages::batch)
                .get(|state: State<AppState>| {
                    messages::status(state, axum::extract::Path("batch".to_owned()))
                })
                .delete(|state: State<AppState>| {
                    messages::cancel(state, axum::extract::Path("batch".to_owned()))
                }),
        )
        .route(
            "/v1/messages/{id}",
            get(messages::status).delete(messages::cancel),
        )
        .route("/v1/streams/{stream}/dead", get(dead::list))
        .route("/v1/streams/{stream}/dead/replay", post(dead::replay))
        .route("/v1/streams/{stream}/dead/purge", post(dead::purge))
        .route("/v1/messages/{id}/reschedule", post(messages::reschedule))
        .route("/v1/stats", get(stats::stats))
        .route("/v1/streams/{stream}/ack", post(streams::ack))
        .route("/v1/openapi.json", get(openapi::document))
        .route("/v1/leader", get(leader))
        .route("/v1/admin/resign", post(resign));
    let v1 = guard::guarded(
        v1,
        &limit,
        api.max_concurrent_requests,
        api.request_timeout,
        "api.request_timeout",
    );
    // Open routes, outside the bounds: load balancers and scrapers get their answer
    // under overload too.
    let app = v1
        .merge(polls)
        .route("/leader", get(leader_only))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .layer(access::layer())
        .layer(axum::middleware::from_fn(count_requests))
        .with_state(state);
    // Around the whole router, not per route: axum completes some answers (the Allow
    // header of a 405) outside route-level layers.
    Router::new()
        .fallback_service(app)
        .layer(axum::middleware::map_response(error::json_errors))
}

/// Counts every request and times it, by route pattern (not by path, so ids do
/// not make a label each), method and status. Every label value comes from a fixed
/// set, whatever a client sends: paths no route matches count as `unmatched`,
/// methods outside the usual seven as `other`.
async fn count_requests(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = method_label(request.method());
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!(crate::metrics::HTTP_SECONDS, "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(crate::metrics::HTTP_REQUESTS, "method" => method, "route" => route, "status" => status)
        .increment(1);
    response
}

/// The `method` label: one of the methods the API knows, or `other`.
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Redis takes writes (the last probe, at most a second old): the process can do
/// its job, as leader or standby. Answers without a Redis round trip of its own.
async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    match state.health.redis().problem() {
        None => (StatusCode::OK, Json(json!({ "status": "ok" }))).into_response(),
        Some(problem) => ApiError::unavailable(problem).into_response(),
    }
}

/// Redis takes writes and, when an etcd election is configured, etcd answers: the
/// instance can do its job, and take over if the leader goes away.
async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if let Some(problem) = state.health.redis().problem() {
        return ApiError::unavailable(problem).into_response();
    }
    let etcd = match state.leadership.info().etcd_reachable {
        None => "not configured",
        Some(true) => "ok",
        Some(false) => {
            return ApiError::unavailable("etcd: no answer to the last query").into_response();
        }
    };
    (
        StatusCode::OK,
        Json(json!({ "status": "ok", "redis": "ok", "etcd": etcd })),
    )
        .into_response()
}

/// Planned switchover: the leader gives up its term and stays out of the next
/// election for a moment, so that a standby takes over. Answers once this node
/// has stepped down.
async fn resign(State(state): State<AppState>) -> impl IntoResponse {
    let info = state.leadership.info();
    if info.mode == "standalone" {
        return ApiError::new(
            StatusCode::CONFLICT,
            "standalone",
            "no etcd configured: there is no other instance to hand over to",
        )
        .into_response();
    }
    let Role::Leader(term) = state.leadership.current() else {
        let leader = match (info.node_id, info.address) {
            (Some(node), Some(address)) => format!("; the leader is {node} at {address}"),
            _ => String::new(),
        };
        return ApiError::new(
            StatusCode::CONFLICT,
            "not_leader",
            format!("{} is a standby{leader}", state.config.node_id),
        )
        .into_response();
    };
    let mut roles = state.leadership.subscribe();
    state.leadership.step_down(StepDown::Resign);
    let stepped_down = tokio::time::timeout(
        Duration::from_secs(5),
        roles.wait_for(|role| role.epoch() != Some(term.epoch)),
    )
    .await;
    match stepped_down {
        Ok(Ok(_)) => (
            StatusCode::OK,
            Json(json!({ "resigned": true, "node_id": state.config.node_id, "epoch": term.epoch })),
        )
            .into_response(),
        _ => ApiError::unavailable("asked to resign, but still leading after 5s").into_response(),
    }
}

async fn leader(State(state): State<AppState>) -> impl IntoResponse {
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
    Json(json!({
        "node_id": state.config.node_id,
        "is_leader": role.is_leader(),
        "mode": info.mode,
        "leader": {
            "node_id": info.node_id,
            "address": info.address,
            "epoch": info.epoch,
        },
        "epoch": role.epoch(),
        "since_ms": since_ms,
        "lease_left_ms": info.lease_left().map(|d| d.as_millis() as u64),
    }))
}

/// 200 only on the leader, for load balancers and health checks.
async fn leader_only(State(state): State<AppState>) -> impl IntoResponse {
    match state.leadership.current() {
        Role::Leader(term) => (
            StatusCode::OK,
            Json(json!({ "leader": true, "node_id": state.config.node_id, "epoch": term.epoch })),
        )
            .into_response(),
        Role::Follower => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_leader",
            format!("{} is a standby", state.config.node_id),
        )
        .into_response(),
    }
}

async fn render_metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
