//! `GET /v1/openapi.json`: the API described for client generators and people,
//! generated (once, at the first request) from what the router is built from: each
//! route's method, path, parameters, bodies and responses come from its handler's
//! `#[utoipa::path]` and the request and response types, which the handlers read and
//! answer with. What every route shares is added here from the same tables the
//! server uses: the scope a route needs and the refusals of a missing or weak token
//! (`auth::ROUTES`), and the refusals of an overloaded or slow request (the group
//! `guard` bounds it with).

use std::collections::HashMap;
use std::sync::OnceLock;

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi as _};

use super::auth::{Access, ROUTES, Scope};
use super::{Routes, routes};

/// The document, as served.
static DOCUMENT: OnceLock<String> = OnceLock::new();

/// This document
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    responses((status = 200, description = "this OpenAPI 3.1 document", body = Object)),
    security(("bearer" = [])),
)]
pub async fn document() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], text())
}

/// The document as JSON text, built on first use.
pub(super) fn text() -> &'static str {
    DOCUMENT.get_or_init(|| serde_json::to_string(&build()).expect("the document serialises"))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "delayq",
        version = "1",
        description = "Delivers delayed messages into Redis Streams on time. Every instance, leader or standby, accepts writes. When tokens are configured, every /v1/* endpoint needs `Authorization: Bearer <token>` with the scope its x-delayq-scope names: read (any token), write (api.write_tokens or api.tokens) or admin (api.tokens); a token of a lower scope gets 403 `insufficient_scope`. /healthz, /readyz, /leader and /metrics stay open. Every error is `{\"error\": code, \"detail\": text}`. Any /v1 endpoint may answer 429 `overloaded` (with Retry-After) past api.max_concurrent_requests, and 503 `timeout` past api.request_timeout (long polls: api.max_wait longer)."
    ),
    modifiers(&BearerScheme),
    security(("bearer" = [])),
)]
struct Head;

/// The `bearer` security scheme the operations name.
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, doc: &mut OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "one of api.tokens (admin scope), api.write_tokens (write) or api.read_tokens (read)",
            ))
            .build();
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// The whole document: the head, then each group of routes with the refusals of the
/// bounds on it, then what the access table says of each route.
fn build() -> OpenApi {
    let Routes {
        requests,
        polls,
        open,
    } = routes();
    let mut doc = Head::openapi();
    let bounded = [
        (requests, Some("api.request_timeout")),
        (polls, Some("api.max_wait + api.request_timeout")),
        (open, None),
    ];
    for (group, timeout_key) in bounded {
        let mut part = group.into_openapi();
        if let Some(timeout_key) = timeout_key {
            for item in part.paths.paths.values_mut() {
                for (_, op) in operations(item) {
                    add_error(
                        op,
                        429,
                        "overloaded: api.max_concurrent_requests requests are being served already; retry after Retry-After",
                    );
                    add_error(
                        op,
                        503,
                        &format!(
                            "no answer within {timeout_key} (timeout): what was asked may or may not have been done"
                        ),
                    );
                }
            }
        }
        doc.merge(part);
    }
    for (method, path, access) in ROUTES {
        let item = doc.paths.paths.get_mut(*path);
        let Some(op) = item.and_then(|item| operation(item, method)) else {
            // A route the router does not serve: the test of the table says so.
            continue;
        };
        let Access::Token(scope) = access else {
            continue;
        };
        op.extensions
            .get_or_insert_with(Default::default)
            .insert("x-delayq-scope".to_owned(), scope.to_string().into());
        add_error(
            op,
            401,
            "no or unknown bearer token (missing_token, invalid_token), when tokens are configured",
        );
        // Every token has the read scope at least.
        if *scope > Scope::Read {
            add_error(
                op,
                403,
                &format!(
                    "the token's scope is below {scope} (insufficient_scope): this needs a token of {}",
                    scope.granted_by()
                ),
            );
        }
    }
    doc
}

/// Adds an error answer to `op`, or (if it has one of that status) what else the
/// status may mean.
fn add_error(op: &mut Operation, status: u16, description: &str) {
    let responses = &mut op.responses.responses;
    match responses.get_mut(&status.to_string()) {
        Some(RefOr::T(response)) => {
            response.description = format!("{}; or {description}", response.description);
        }
        Some(RefOr::Ref(_)) => unreachable!("the handlers' responses are inline"),
        None => {
            let content = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Error")))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/json", content)
                .build();
            responses.insert(status.to_string(), RefOr::T(response));
        }
    }
}

/// The operations of a path item, by lower-case method.
fn operations(item: &mut PathItem) -> impl Iterator<Item = (&'static str, &mut Operation)> {
    [
        ("get", item.get.as_mut()),
        ("put", item.put.as_mut()),
        ("post", item.post.as_mut()),
        ("delete", item.delete.as_mut()),
        ("patch", item.patch.as_mut()),
        ("head", item.head.as_mut()),
        ("options", item.options.as_mut()),
        ("trace", item.trace.as_mut()),
    ]
    .into_iter()
    .filter_map(|(method, op)| op.map(|op| (method, op)))
}

/// Each operation's query parameters, by path as routed and method in lower case:
/// what `query::refuse_unknown` lets through.
pub(super) fn query_parameters() -> HashMap<String, HashMap<String, Vec<String>>> {
    use utoipa::openapi::path::ParameterIn;
    let mut doc = build();
    let mut out: HashMap<String, HashMap<String, Vec<String>>> = HashMap::new();
    for (path, item) in doc.paths.paths.iter_mut() {
        for (method, op) in operations(item) {
            let names = op
                .parameters
                .iter()
                .flatten()
                .filter(|p| matches!(p.parameter_in, ParameterIn::Query))
                .map(|p| p.name.clone())
                .collect();
            out.entry(path.clone())
                .or_default()
                .insert(method.to_owned(), names);
        }
    }
    out
}

/// The operation of `item` for `method` (upper case, as in `auth::ROUTES`).
fn operation<'a>(item: &'a mut PathItem, method: &str) -> Option<&'a mut Operation> {
    operations(item)
        .find(|(m, _)| m.eq_ignore_ascii_case(method))
        .map(|(_, op)| op)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::{Value, json};

    use super::*;

    fn doc() -> Value {
        serde_json::from_str(text()).expect("the document is JSON")
    }

    /// (method, path) of every route the router is built from (`routes()`, whose
    /// method routers `utoipa_axum` builds from the same annotations).
    fn routed() -> BTreeSet<(String, String)> {
        let Routes {
            requests,
            polls,
            open,
        } = routes();
        let mut out = BTreeSet::new();
        for group in [requests, polls, open] {
            for (path, item) in group.into_openapi().paths.paths.iter_mut() {
                for (method, _) in operations(item) {
                    out.insert((method.to_owned(), path.clone()));
                }
            }
        }
        out
    }

    fn documented() -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, item) in doc()["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if !["parameters", "summary", "description"].contains(&method.as_str()) {
                    out.insert((method.clone(), path.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn every_route_is_documented_and_nothing_else() {
        let routed = routed();
        assert!(
            routed.contains(&("post".into(), "/v1/messages".into())),
            "the routes are read: {routed:?}"
        );
        let documented = documented();
        let missing: Vec<_> = routed.difference(&documented).collect();
        assert!(
            missing.is_empty(),
            "routes missing from the document: {missing:?}"
        );
        let stale: Vec<_> = documented.difference(&routed).collect();
        assert!(stale.is_empty(), "documented but not routed: {stale:?}");
    }

    /// The access table of `auth`, as (method, path) and the scope's name (None: open).
    fn access_table() -> Vec<((String, String), Option<String>)> {
        ROUTES
            .iter()
            .map(|(method, path, access)| {
                let scope = match access {
                    Access::Open => None,
                    Access::Token(scope) => Some(scope.to_string()),
                };
                ((method.to_ascii_lowercase(), path.to_string()), scope)
            })
            .collect()
    }

    #[test]
    fn every_route_has_one_access_rule_and_the_document_names_its_scope() {
        let table = access_table();
        let listed: BTreeSet<_> = table.iter().map(|(route, _)| route.clone()).collect();
        assert_eq!(listed.len(), table.len(), "a route is listed twice");
        let routed = routed();
        let unlisted: Vec<_> = routed.difference(&listed).collect();
        assert!(
            unlisted.is_empty(),
            "routes without an access rule: {unlisted:?}"
        );
        let stale: Vec<_> = listed.difference(&routed).collect();
        assert!(
            stale.is_empty(),
            "access rules for routes that do not exist: {stale:?}"
        );

        let doc = doc();
        assert_eq!(doc["security"], json!([{ "bearer": [] }]));
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
        for ((method, path), scope) in &table {
            let op = &doc["paths"][path][method];
            let case = format!("{method} {path}");
            match scope {
                Some(scope) => {
                    assert_eq!(op["x-delayq-scope"], scope.as_str(), "{case}");
                    assert_eq!(op["security"], json!([{ "bearer": [] }]), "{case}");
                }
                None => {
                    assert!(op.get("x-delayq-scope").is_none(), "{case}: open");
                    // An empty requirement: no token needed.
                    assert_eq!(op["security"], json!([{}]), "{case}: open");
                }
            }
        }
    }

    /// Operations that cannot fail: their route always answers 200.
    const NEVER_FAIL: &[(&str, &str)] = &[
        ("get", "/metrics"),
        ("get", "/ui"),
        ("get", "/ui/app.js"),
        ("get", "/ui/app.css"),
        ("get", "/v1/session"),
    ];

    #[test]
    fn every_operation_documents_its_success_and_its_errors() {
        let doc = doc();
        let error = json!({ "$ref": "#/components/schemas/Error" });
        let access: std::collections::BTreeMap<_, _> = access_table().into_iter().collect();
        for (method, path) in documented() {
            let op = &doc["paths"][&path][&method];
            let case = format!("{method} {path}");
            let responses = op["responses"].as_object().expect("responses");
            let statuses: BTreeSet<u16> = responses
                .keys()
                .map(|s| s.parse().expect("a numeric status"))
                .collect();
            assert!(
                statuses.iter().any(|s| (200..300).contains(s)),
                "{case}: no success answer"
            );
            for (status, response) in responses {
                let content = response["content"].as_object();
                assert!(
                    content.is_some_and(|c| !c.is_empty()),
                    "{case} {status}: no body"
                );
                if status.starts_with(['4', '5']) {
                    assert_eq!(
                        response["content"]["application/json"]["schema"], error,
                        "{case} {status}: the error body"
                    );
                }
            }
            let must: &[u16] = match access.get(&(method.clone(), path.clone())) {
                Some(Some(scope)) if scope == "read" => &[401, 429, 503],
                Some(Some(_)) => &[401, 403, 429, 503],
                _ if NEVER_FAIL.contains(&(method.as_str(), path.as_str())) => &[],
                _ => &[503],
            };
            for status in must {
                assert!(statuses.contains(status), "{case}: no {status} answer");
            }
            if op.get("requestBody").is_some() {
                for status in [400, 413, 422] {
                    assert!(
                        statuses.contains(&status),
                        "{case}: no {status} for its body"
                    );
                }
            }
            let in_path = op["parameters"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p["in"] == "path"));
            if in_path {
                assert!(
                    statuses.iter().any(|s| [400, 403, 404].contains(s)),
                    "{case}: nothing says a bad path parameter is refused"
                );
            }
        }
    }

    /// Every `$ref` names a schema the document holds.
    #[test]
    fn every_reference_resolves() {
        fn refs(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(map) => {
                    if let Some(Value::String(r)) = map.get("$ref") {
                        out.push(r.clone());
                    }
                    map.values().for_each(|v| refs(v, out));
                }
                Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let doc = doc();
        let mut found = Vec::new();
        refs(&doc, &mut found);
        assert!(!found.is_empty());
        for r in found {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("{r}: not a schema reference"));
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "{r}: no such schema"
            );
        }
    }

    #[test]
    fn the_document_is_openapi_3_1() {
        let doc = doc();
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["info"]["title"], "delayq");
    }
}
