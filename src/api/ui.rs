//! The dashboard: three files embedded in the binary, served at `/ui`. The page
//! reads and acts only through the documented `/v1` endpoints (with the token the
//! user gives it); the files themselves are open, like `/healthz`.

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::response::IntoResponse;

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// Only this origin's scripts, styles, images and requests; nothing inline.
const POLICY: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, content_type),
            (CONTENT_SECURITY_POLICY, POLICY),
            (CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// The dashboard page
#[utoipa::path(get, path = "/ui", operation_id = "dashboard",
    responses((status = 200, description = "the dashboard (HTML)", content_type = "text/html")),
    security(()))]
pub async fn index() -> impl IntoResponse {
    asset("text/html; charset=utf-8", INDEX)
}

/// The dashboard's script
#[utoipa::path(get, path = "/ui/app.js", operation_id = "dashboardScript",
    responses((status = 200, description = "JavaScript", content_type = "text/javascript")),
    security(()))]
pub async fn script() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// The dashboard's style sheet
#[utoipa::path(get, path = "/ui/app.css", operation_id = "dashboardStyle",
    responses((status = 200, description = "CSS", content_type = "text/css")),
    security(()))]
pub async fn style() -> impl IntoResponse {
    asset("text/css; charset=utf-8", STYLE)
}
