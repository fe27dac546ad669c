//! The request meters (`delayq_http_requests_total` by method, route and status;
//! `delayq_http_request_duration_seconds` by route), each registered with the
//! recorder once and kept here: asked of the recorder on every request, a meter's
//! labels are built, copied and hashed each time, about 2% of the daemon's CPU for a
//! single push. Routes are the router's patterns (or `unmatched`), methods a fixed
//! set and statuses what the handlers answer, so what is kept stays small.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use metrics::{Counter, Histogram};

use crate::metrics as m;

/// The meters of every route a request has come in on.
#[derive(Default)]
pub struct Meters(RwLock<HashMap<Box<str>, Route>>);

/// One route's time, and its counts by method and status.
struct Route {
    seconds: Histogram,
    requests: Vec<(&'static str, u16, Counter)>,
}

impl Meters {
    /// Counts a request of `method` on `route` (None: no route matched) answered
    /// with `status`, and records its time.
    pub fn record(&self, route: Option<&str>, method: &'static str, status: u16, took: Duration) {
        let route = route.unwrap_or("unmatched");
        let took = took.as_secs_f64();
        if let Ok(routes) = self.0.read()
            && let Some(meters) = routes.get(route)
            && let Some(requests) = meters.requests_of(method, status)
        {
            meters.seconds.record(took);
            requests.increment(1);
            return;
        }
        // Met for the first time: registered.
        let mut routes = self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let meters = routes.entry(route.into()).or_insert_with(|| Route {
            seconds: metrics::histogram!(m::HTTP_SECONDS, "route" => route.to_owned()),
            requests: Vec::new(),
        });
        meters.seconds.record(took);
        match meters.requests_of(method, status) {
            Some(requests) => requests.increment(1),
            None => {
                let requests = metrics::counter!(m::HTTP_REQUESTS, "method" => method, "route" => route.to_owned(), "status" => status.to_string());
                requests.increment(1);
                meters.requests.push((method, status, requests));
            }
        }
    }
}

impl Route {
    fn requests_of(&self, method: &str, status: u16) -> Option<&Counter> {
        let found = self
            .requests
            .iter()
            .find(|(m, s, _)| *m == method && *s == status);
        found.map(|(_, _, counter)| counter)
    }
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    /// Kept meters count into the series a lookup each time would: one series per
    /// method, route and status, one histogram per route.
    #[test]
    fn kept_meters_count_into_their_series() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let meters = Meters::default();
            let ms = Duration::from_millis(1);
            for (route, method, status, times) in [
                (Some("/v1/messages"), "POST", 201, 3),
                (Some("/v1/messages"), "POST", 422, 1),
                (Some("/v1/messages/{id}"), "GET", 200, 2),
                (None, "other", 404, 1),
            ] {
                for _ in 0..times {
                    meters.record(route, method, status, ms);
                }
            }
        });
        let text = handle.render();
        for line in [
            r#"delayq_http_requests_total{method="POST",route="/v1/messages",status="201"} 3"#,
            r#"delayq_http_requests_total{method="POST",route="/v1/messages",status="422"} 1"#,
            r#"delayq_http_requests_total{method="GET",route="/v1/messages/{id}",status="200"} 2"#,
            r#"delayq_http_requests_total{method="other",route="unmatched",status="404"} 1"#,
            r#"delayq_http_request_duration_seconds_count{route="/v1/messages"} 4"#,
            r#"delayq_http_request_duration_seconds_count{route="unmatched"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line}:\n{text}");
        }
    }
}
