//! The audit trail: every admin action and every cancel through the API (which the
//! dashboard and the CLI use too), refused ones included, recorded once after it
//! is answered: when, who (the token's name, else its fingerprint; never the
//! token), from where, what (method and route), on what (the path) and the
//! answer's status. Each is an INFO log line (target `delayq::audit`) and an entry of the capped stream
//! `<prefix>:audit` (`api.audit_length`), read at `GET /v1/admin/audit`.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::Method;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Access, Scope, access};
use super::input::{StrictQuery, blank_as_none, page_cursor, page_limit};
use super::listener::Peer;
use super::{ApiError, AppState, ErrorBody};

/// Whether a request to `route` is recorded: the admin scope's changes, and cancels.
fn audited(method: &Method, route: Option<&str>, path: &str) -> bool {
    if method == Method::GET || method == Method::HEAD {
        return false;
    }
    matches!(access(method, route, path), Access::Token(Scope::Admin))
        || (method == Method::DELETE && path.starts_with("/v1/messages"))
}

/// An action to record once it is answered: what was known of it when it came.
pub(super) struct Pending {
    who: String,
    from: String,
    what: String,
    path: String,
}

/// The record of this request to come (its route: the pattern it matched, None for
/// none), when it is one the trail keeps.
pub(super) fn begin(state: &AppState, request: &Request, route: Option<&str>) -> Option<Pending> {
    let (method, path) = (request.method(), request.uri().path());
    if !audited(method, route, path) {
        return None;
    }
    let who = super::auth::who(request.headers(), &state.live_config.borrow().api);
    let from = request
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map_or_else(|| "unknown".to_owned(), |c| c.0.0.ip().to_string());
    Some(Pending {
        who,
        from,
        what: format!("{method} {}", route.unwrap_or("unmatched")),
        path: path.to_owned(),
    })
}

impl Pending {
    /// Records the action with the status it was answered.
    pub(super) async fn answered(self, state: &AppState, status: u16) {
        let Pending {
            who,
            from,
            what,
            path,
        } = self;
        tracing::info!(target: "delayq::audit", %who, %from, %what, target = %path, status, "audit");
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let fields = [
            ("at", at.to_string()),
            ("node", state.config.node_id.clone()),
            ("who", who),
            ("from", from),
            ("what", what),
            ("target", path),
            ("status", status.to_string()),
        ];
        if let Err(e) = state
            .store
            .append_audit(&fields, state.config.api.audit_length)
            .await
        {
            tracing::warn!(error = %e, "the audit trail could not be written to Redis (the log has the action)");
        }
    }
}

/// Which recorded actions to show: the newest first, before `before` when given.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Older than this entry id (the `next` of the page before).
    #[serde(default, deserialize_with = "blank_as_none")]
    before: Option<String>,
    /// At most this many: 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    #[serde(default, deserialize_with = "blank_as_none")]
    limit: Option<usize>,
}

/// A page of the audit trail.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditPage {
    /// Newest first: `id` (the entry's), `at` (ms), `node`, `who`, `from`, `what`,
    /// `target`, `status`.
    entries: Vec<IndexMap<String, String>>,
    /// The `before` of the next page; null at the end.
    #[schema(required)]
    next: Option<String>,
}

/// The audit trail: admin actions and cancels through the API, dashboard or CLI, refused ones too, newest first
#[utoipa::path(get, path = "/v1/admin/audit", operation_id = "audit", params(AuditQuery),
    responses(
        (status = 200, description = "a page of recorded actions", body = AuditPage),
        (status = 400, description = "query cannot be parsed, or names an unknown parameter (bad_query)", body = ErrorBody),
        (status = 422, description = "a parameter breaks a rule; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn trail(
    State(state): State<AppState>,
    StrictQuery(query): StrictQuery<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = page_limit(query.limit, 100, 1000)?;
    let before = page_cursor("before", query.before)?;
    let found = state.store.audit(limit, before.as_deref()).await?;
    let next = (found.len() == limit)
        .then(|| found.last().map(|e| e.id.clone()))
        .flatten();
    let entries = found
        .into_iter()
        .map(|e| {
            let mut entry = IndexMap::new();
            entry.insert("id".to_owned(), e.id);
            entry.extend(e.fields);
            entry
        })
        .collect();
    Ok(Json(AuditPage { entries, next }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_changes_and_cancels_are_audited_and_nothing_else() {
        for (method, route, path, expected) in [
            (
                Method::POST,
                "/v1/streams/{stream}/dead/purge",
                "/v1/streams/o/dead/purge",
                true,
            ),
            (
                Method::POST,
                "/v1/admin/switchover",
                "/v1/admin/switchover",
                true,
            ),
            (
                Method::POST,
                "/v1/streams/{stream}/pause",
                "/v1/streams/o/pause",
                true,
            ),
            (Method::DELETE, "/v1/messages/{id}", "/v1/messages/m1", true),
            (
                Method::DELETE,
                "/v1/messages/batch",
                "/v1/messages/batch",
                true,
            ),
            (Method::POST, "/v1/messages", "/v1/messages", false),
            (
                Method::GET,
                "/v1/streams/{stream}/dead",
                "/v1/streams/o/dead",
                false,
            ),
            (
                Method::POST,
                "/v1/messages/{id}/reschedule",
                "/v1/messages/m1/reschedule",
                false,
            ),
        ] {
            assert_eq!(
                audited(&method, Some(route), path),
                expected,
                "{method} {route}"
            );
        }
    }
}
