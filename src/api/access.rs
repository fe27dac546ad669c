//! The access log: one `debug` line per request, `target: delayq::api::access`, with
//! the method, the route pattern (`/v1/messages/{id}`, never the path itself, so
//! ids and query values stay out), the status, the time taken and the size of the
//! answer when it is known up front. Headers are not logged, the `Authorization`
//! header included. Enable it alone with `log.level = "info,delayq::api::access=debug"`.

use std::time::Duration;

use axum::body::HttpBody as _;
use axum::http::Method;
use axum::response::Response;
use tracing::Span;

/// A `debug` span per request with its method and route pattern; the access line is
/// logged in it, and so is anything a handler logs.
pub(super) fn span(method: &Method, route: Option<&str>) -> Span {
    tracing::debug_span!("request", method = %method, route = %route.unwrap_or("unmatched"))
}

/// The access line of an answered request, logged in its span.
pub(super) fn line(response: &Response, latency: Duration) {
    tracing::debug!(
        target: "delayq::api::access",
        status = response.status().as_u16(),
        ms = latency.as_secs_f64() * 1000.0,
        bytes = response.body().size_hint().exact(),
        "answered"
    );
}
