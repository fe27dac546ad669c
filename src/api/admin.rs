//! `POST /v1/admin/reload` (this node rereads its configuration file, as on
//! SIGHUP) and `POST /v1/admin/switchover` (hand leadership to a chosen node, or
//! to any standby).

use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use utoipa::ToSchema;

use super::input::{documented_keys, object, read_json_or_empty};
use super::{ApiError, AppState, ErrorBody};
use crate::registry::{is_gone, now_ms};

/// How long a switchover may take before the request gives up (and the switchover
/// key expires).
pub const SWITCHOVER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a switchover asked of a node that knows no leader waits for one to be
/// named before it is refused.
const LEADER_NAMED_WITHIN: Duration = Duration::from_secs(3);

/// A reload asked over HTTP: answered by the process's reloader (see `service`).
pub type ReloadRequest = oneshot::Sender<Result<Reloaded, String>>;

/// What a reload changed.
#[derive(Debug, Serialize, ToSchema)]
pub struct Reloaded {
    node_id: String,
    /// Keys whose new value was applied.
    changed: Vec<String>,
    /// Keys changed in the file that apply only at a restart.
    restart_needed: Vec<String>,
    /// Reloadable keys a `DELAYQ_*` variable sets, as `key (VARIABLE)`: the
    /// environment does not change at a reload, so the file's value is not used.
    from_environment: Vec<String>,
}

impl Reloaded {
    pub fn new(node_id: String, outcome: &crate::reload::Outcome) -> Reloaded {
        Reloaded {
            node_id,
            changed: outcome.applied.iter().map(|c| c.key.clone()).collect(),
            restart_needed: outcome
                .needs_restart
                .iter()
                .map(|c| c.key.clone())
                .collect(),
            from_environment: outcome
                .from_environment
                .iter()
                .map(|(key, variable)| format!("{key} ({variable})"))
                .collect(),
        }
    }
}

/// How long a reload waits for the service loop to take reload requests, at start.
const RELOADS_TAKEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Reread this node's configuration file and apply what may change while running (as SIGHUP does)
#[utoipa::path(post, path = "/v1/admin/reload", operation_id = "reload",
    responses(
        (status = 200, description = "reloaded", body = Reloaded),
        (status = 409, description = "no configuration file to reread (started without --config)", body = ErrorBody),
        (status = 422, description = "the file is refused; the running configuration stays; the detail names the file and the key, or why the file cannot be read", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn reload(State(state): State<AppState>) -> Result<Json<Reloaded>, ApiError> {
    let no_file = || {
        ApiError::new(
            StatusCode::CONFLICT,
            "no_config_file",
            "this node was started without a configuration file (--config): there is nothing to reread",
        )
    };
    // `delayq run` takes reload requests moments after the API starts serving: a
    // reload sent right after the node first answered waits for that (it was
    // answered 409 as if there were no file), bounded.
    let mut taken = state.reloads.clone();
    let waited = tokio::time::timeout(RELOADS_TAKEN_WITHIN, taken.wait_for(Option::is_some));
    let Some(requests) = waited
        .await
        .ok()
        .and_then(|taken| taken.ok().and_then(|sender| sender.clone()))
    else {
        return Err(no_file());
    };
    let (tx, rx) = oneshot::channel();
    requests.send(tx).await.map_err(|_| no_file())?;
    match rx.await {
        Ok(Ok(reloaded)) => Ok(Json(reloaded)),
        Ok(Err(problem)) => Err(ApiError::invalid(problem)),
        Err(_) => Err(no_file()),
    }
}

/// Which node to hand leadership to.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({ "to": "node-2" }))]
pub struct SwitchoverRequest {
    /// A running standby's node id; left out: any standby.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// A switchover done.
#[derive(Debug, Serialize, ToSchema)]
pub struct Switched {
    from: String,
    to: String,
    /// The new leader's epoch.
    #[schema(required)]
    epoch: Option<u64>,
    took_ms: u64,
}

/// Hand leadership to a chosen standby (or any): the leader resigns, the other standbys stand aside until it leads
#[utoipa::path(post, path = "/v1/admin/switchover", operation_id = "switchover",
    request_body = SwitchoverRequest,
    responses(
        (status = 200, description = "the chosen node leads", body = Switched),
        (status = 400, description = "body is not a JSON object", body = ErrorBody),
        (status = 404, description = "no running node has that id", body = ErrorBody),
        (status = 413, description = "body larger than 4 KiB", body = ErrorBody),
        (status = 409, description = "not possible now: no leader, no standby, the node leads already, or no etcd election (standalone, per_shard)", body = ErrorBody),
        (status = 422, description = "a field breaks a rule", body = ErrorBody),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
        (status = 504, description = "the node did not take over within 10 s; nothing changed for good (the leader may have moved)", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn switchover(
    State(state): State<AppState>,
    body: Body,
) -> Result<Json<Switched>, ApiError> {
    static KEYS: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(documented_keys::<SwitchoverRequest>);
    let value = read_json_or_empty(body, 4096).await?;
    let obj = object(
        &value,
        &KEYS,
        "body must be a JSON object such as {\"to\": \"node-2\"}",
    )?;
    let to = match obj.get("to") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                "to: must be a node id (a non-empty string)",
            ));
        }
    };
    let conflict =
        |detail: String| ApiError::new(StatusCode::CONFLICT, "switchover_refused", detail);
    let info = state.leadership.info();
    if !state.groups.is_empty() {
        return Err(conflict(
            "election.mode = \"per_shard\" spreads leadership over the nodes by itself; switchover moves a single leader (resign a node instead)".into(),
        ));
    }
    if info.mode != "etcd" {
        return Err(conflict(
            "no etcd election: a standalone node has no one to hand over to".into(),
        ));
    }
    // A node that has just started, or that asks while a handover is under way,
    // may not know the leader yet: it waits a little for one to be named (at once
    // when it knows one).
    let mut updates = state.leadership.info_updates();
    let named = tokio::time::timeout(
        LEADER_NAMED_WITHIN,
        updates.wait_for(|i| i.node_id.is_some()),
    )
    .await;
    let Ok(Ok(Some(from))) = named.map(|r| r.map(|info| info.node_id.clone())) else {
        return Err(conflict("no node leads now".into()));
    };
    let now = now_ms();
    let running: Vec<String> = state
        .store
        .nodes(now)
        .await?
        .into_iter()
        .filter(|n| !is_gone(n, now))
        .map(|n| n.node_id)
        .collect();
    let to = match to {
        Some(to) if to == from => return Err(conflict(format!("{to} leads already"))),
        Some(to) if !running.contains(&to) => {
            return Err(ApiError::not_found(format!(
                "no running node is called {to:?} (running: {})",
                running.join(", ")
            )));
        }
        Some(to) => to,
        None => running
            .into_iter()
            .find(|n| *n != from)
            .ok_or_else(|| conflict("no standby is running".into()))?,
    };
    tracing::info!(%from, %to, "switchover requested");
    let started = Instant::now();
    state
        .store
        .request_switchover(&to, SWITCHOVER_TIMEOUT)
        .await?;
    let mut info_updates = state.leadership.info_updates();
    let done = tokio::time::timeout(SWITCHOVER_TIMEOUT, async {
        info_updates
            .wait_for(|i| i.node_id.as_deref() == Some(to.as_str()))
            .await
            .map(|i| i.epoch)
    })
    .await;
    match done {
        Ok(Ok(epoch)) => Ok(Json(Switched {
            from,
            to,
            epoch,
            took_ms: started.elapsed().as_millis() as u64,
        })),
        _ => {
            let _ = state.store.clear_switchover(&to).await;
            Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "switchover_timeout",
                format!(
                    "{to} did not take over within {}s; the election goes on as usual (see /v1/leader)",
                    SWITCHOVER_TIMEOUT.as_secs()
                ),
            ))
        }
    }
}
