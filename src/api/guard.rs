//! Bounds on the work `/v1` requests can make: at most `api.max_concurrent_requests`
//! served at once (one more is shed at once with `429` and `Retry-After`, not
//! queued), and each answered within its time (`api.request_timeout`; long polls
//! `api.max_wait` longer) or with `503 timeout`. Built from tower's layers; the
//! refusals keep the API's JSON shape.

use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tower::BoxError;
use tower::ServiceBuilder;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::load_shed::error::Overloaded;
use tower::timeout::TimeoutLayer;
use tower::timeout::error::Elapsed;

use super::ApiError;

/// What a shed request is told to wait before it tries again, in seconds.
const RETRY_AFTER_SECS: u64 = 1;

/// `routes` with the bounds: `limit` is shared by every group of routes, so the
/// bound holds for all of them together; `timeout` is this group's, and
/// `timeout_key` names where it comes from in the configuration.
pub(super) fn guarded<S>(
    routes: Router<S>,
    limit: &GlobalConcurrencyLimitLayer,
    max_concurrent: usize,
    timeout: Duration,
    timeout_key: &'static str,
) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    routes.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(move |error: BoxError| async move {
                refusal(&error, max_concurrent, timeout, timeout_key)
            }))
            .layer(LoadShedLayer::new())
            .layer(limit.clone())
            .layer(TimeoutLayer::new(timeout)),
    )
}

/// The answer for an error of the layers above.
fn refusal(
    error: &BoxError,
    max_concurrent: usize,
    timeout: Duration,
    timeout_key: &str,
) -> Response {
    if error.is::<Overloaded>() {
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
    } else if error.is::<Elapsed>() {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            format!(
                "no answer within {} ({timeout_key}); what the request asked for may or may not have been done",
                crate::human::duration(timeout)
            ),
        )
        .into_response()
    } else {
        tracing::warn!(%error, "request failed before reaching its handler");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the request failed before reaching its handler",
        )
        .into_response()
    }
}
