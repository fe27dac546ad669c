//! The access log: one `debug` line per request, `target: delayq::api::access`, with
//! the method, the route pattern (`/v1/messages/{id}`, never the path itself, so
//! ids and query values stay out), the status, the time taken and the size of the
//! answer when it is known up front. Headers are not logged, the `Authorization`
//! header included. Enable it alone with `log.level = "info,delayq::api::access=debug"`.

use std::time::Duration;

use axum::body::{Body, HttpBody as _};
use axum::extract::{MatchedPath, Request};
use axum::response::Response;
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::{MakeSpan, OnResponse, TraceLayer};
use tracing::Span;

/// The layer; every other event of tower-http's tracing is off (in particular its
/// ERROR line for every 5xx answer, which the handlers log themselves where it matters).
pub(super) fn layer()
-> TraceLayer<SharedClassifier<ServerErrorsAsFailures>, RouteSpan, (), AccessLine, (), (), ()> {
    TraceLayer::new_for_http()
        .make_span_with(RouteSpan)
        .on_request(())
        .on_response(AccessLine)
        .on_body_chunk(())
        .on_eos(())
        .on_failure(())
}

/// A `debug` span per request with its method and route pattern; the access line is
/// logged in it, and so is anything a handler logs.
#[derive(Clone, Copy, Debug)]
pub(super) struct RouteSpan;

impl MakeSpan<Body> for RouteSpan {
    fn make_span(&mut self, request: &Request) -> Span {
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map_or("unmatched", MatchedPath::as_str);
        tracing::debug_span!("request", method = %request.method(), route = %route)
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct AccessLine;

impl OnResponse<Body> for AccessLine {
    fn on_response(self, response: &Response, latency: Duration, _: &Span) {
        tracing::debug!(
            target: "delayq::api::access",
            status = response.status().as_u16(),
            ms = latency.as_secs_f64() * 1000.0,
            bytes = response.body().size_hint().exact(),
            "answered"
        );
    }
}
