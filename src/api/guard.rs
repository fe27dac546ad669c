//! Bounds on the work `/v1` requests can make: at most `api.max_concurrent_requests`
//! served at once (one more is shed at once with `429` and `Retry-After`, not
//! queued), and each answered within its time (`api.request_timeout`; long polls
//! `api.max_wait` longer) or with `503 timeout`. The refusals keep the API's JSON
//! shape.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::ApiError;

/// What a shed request is told to wait before it tries again, in seconds.
const RETRY_AFTER_SECS: u64 = 1;

/// A group of routes' bounds: the permits every group shares, and this group's time.
#[derive(Clone)]
struct Bounds {
    permits: Arc<Semaphore>,
    max_concurrent: usize,
    timeout: Duration,
    timeout_key: &'static str,
}

/// `routes` with the bounds: `permits` (`api.max_concurrent_requests` of them) are
/// shared by every group of routes, so the bound holds for all of them together;
/// `timeout` is this group's, and `timeout_key` names where it comes from in the
/// configuration. One layer, not tower's four (shedding, the limit, the timeout and
/// their errors made answers): each layer costs every request a clone of the
/// route's service and a future to poll through.
pub(super) fn guarded<S>(
    routes: Router<S>,
    permits: &Arc<Semaphore>,
    max_concurrent: usize,
    timeout: Duration,
    timeout_key: &'static str,
) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let bounds = Bounds {
        permits: permits.clone(),
        max_concurrent,
        timeout,
        timeout_key,
    };
    routes.layer(axum::middleware::from_fn_with_state(bounds, bounded))
}

/// Serves a request within the bounds: shed at once without a permit, answered
/// `503 timeout` past its time (the handler's future dropped), the permit held
/// until it is answered.
async fn bounded(State(bounds): State<Bounds>, request: Request, next: Next) -> Response {
    let Ok(_permit) = bounds.permits.try_acquire() else {
        return overloaded(bounds.max_concurrent);
    };
    match tokio::time::timeout(bounds.timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => timed_out(bounds.timeout, bounds.timeout_key),
    }
}

fn overloaded(max_concurrent: usize) -> Response {
    let mut response = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "overloaded",
        format!(
            "{max_concurrent} requests are being served already (api.max_concurrent_requests); retry after {RETRY_AFTER_SECS}s"
        ),
    )
    .into_response();
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    response
}

fn timed_out(timeout: Duration, timeout_key: &str) -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "timeout",
        format!(
            "no answer within {} ({timeout_key}); what the request asked for may or may not have been done",
            crate::human::duration(timeout)
        ),
    )
    .into_response()
}
