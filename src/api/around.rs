//! What every routed request passes through, outermost first: its count and time
//! (`delayq_http_*`, [`meters`]), its access line ([`access`]), its audit record ([`audit`]),
//! its token ([`auth`]) and its query's names ([`query`]). One layer for all five:
//! a layer of its own each cost every request a clone of the route's service and
//! a boxed future to poll through, about a fifth of the daemon's CPU for a single
//! push.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::{AppState, access, audit, auth, query};

pub(super) async fn around(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    // The route's pattern is shared (a reference count), not copied.
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map(MatchedPath::as_str);
    let method = method_label(request.method());
    let span = access::span(request.method(), route);
    let response = async {
        // Before the token's check, so that refusals are recorded too.
        let audit = audit::begin(&state, &request, route);
        // The query's names inside the token's check: a request without a token
        // learns nothing of what an endpoint takes.
        let refusal = auth::require_token(&state, &mut request, route).or_else(|| {
            query::refuse_unknown(&request, route)
                .err()
                .map(IntoResponse::into_response)
        });
        let response = match refusal {
            None => next.run(request).await,
            Some(refusal) => refusal,
        };
        if let Some(audit) = audit {
            audit.answered(&state, response.status().as_u16()).await;
        }
        access::line(&response, started.elapsed());
        response
    }
    .instrument(span)
    .await;
    // Counted and timed by route pattern (not by path, so ids do not make a label
    // each), method and status. Every label value comes from a fixed set, whatever a
    // client sends: paths no route matches count as `unmatched`, methods outside the
    // usual seven as `other`.
    state
        .meters
        .record(route, method, response.status().as_u16(), started.elapsed());
    response
}

/// The `method` label: one of the methods the API knows, or `other`.
fn method_label(method: &Method) -> &'static str {
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
