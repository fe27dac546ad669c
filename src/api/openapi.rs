//! `GET /v1/openapi.json`: the API described for client generators and people. The
//! document is written by hand in `openapi.json`; a test keeps it and the router in
//! step (every route documented, nothing documented that is not routed).

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

const DOCUMENT: &str = include_str!("openapi.json");

pub async fn document() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], DOCUMENT)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    const METHODS: &[&str] = &["get", "post", "put", "delete", "patch"];

    /// (method, path) of every route declared in the API's sources (`Router::route` calls).
    fn routed() -> BTreeSet<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
        let mut out = BTreeSet::new();
        for file in std::fs::read_dir(&dir).expect("src/api") {
            let path = file.expect("dir entry").path();
            // This file declares no routes, and its scanner's needles would look like some.
            if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("openapi.rs") {
                let text = std::fs::read_to_string(&path).expect("read source");
                out.extend(routes_in(&text));
            }
        }
        out
    }

    fn routes_in(text: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find(".route(") {
            let after = rest[at + ".route(".len()..].trim_start();
            let Some(after) = after.strip_prefix('"') else {
                rest = after;
                continue;
            };
            let end = after.find('"').expect("closing quote");
            let path = after[..end].to_owned();
            // The method routers: up to the `.route(` call's closing parenthesis.
            let mut depth = 1;
            let mut close = after.len();
            for (i, c) in after[end..].char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    close = end + i;
                    break;
                }
            }
            let call = &after[end..close];
            for method in METHODS {
                let needle = format!("{method}(");
                let found = call.match_indices(&needle).any(|(i, _)| {
                    i == 0
                        || !call[..i]
                            .ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
                });
                if found {
                    out.push((method.to_string(), path.clone()));
                }
            }
            rest = &after[end..];
        }
        out
    }

    fn documented() -> BTreeSet<(String, String)> {
        let doc: Value = serde_json::from_str(super::DOCUMENT).expect("openapi.json is JSON");
        let mut out = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in METHODS {
                if item.get(*method).is_some() {
                    out.insert((method.to_string(), path.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn every_route_is_documented_and_nothing_else() {
        let routed = routed();
        let documented = documented();
        assert!(
            routed.contains(&("post".into(), "/v1/messages".into())),
            "the scan finds routes: {routed:?}"
        );
        let missing: Vec<_> = routed.difference(&documented).collect();
        assert!(
            missing.is_empty(),
            "routes missing from openapi.json: {missing:?}"
        );
        let stale: Vec<_> = documented.difference(&routed).collect();
        assert!(
            stale.is_empty(),
            "openapi.json documents routes that do not exist: {stale:?}"
        );
    }

    /// The access table of `auth`, as (method, path) and the scope's name (None: open).
    fn access_table() -> Vec<((String, String), Option<String>)> {
        use crate::api::auth::{Access, ROUTES};
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

        let doc: Value = serde_json::from_str(super::DOCUMENT).expect("openapi.json is JSON");
        for ((method, path), scope) in &table {
            let op = &doc["paths"][path][method];
            let case = format!("{method} {path}");
            match scope {
                Some(scope) => {
                    assert_eq!(op["x-delayq-scope"], scope.as_str(), "{case}");
                    assert!(
                        op.get("security").is_none(),
                        "{case}: needs the bearer scheme"
                    );
                }
                None => {
                    assert!(op.get("x-delayq-scope").is_none(), "{case}: open");
                    assert_eq!(op["security"], serde_json::json!([]), "{case}: open");
                }
            }
        }
    }

    #[test]
    fn the_route_scan_reads_method_chains() {
        let text = r#".route("/a/{id}", get(h::status).delete(h::cancel)).route(
            "/b", post(x::post_it))"#;
        assert_eq!(
            routes_in(text),
            [
                ("get".into(), "/a/{id}".into()),
                ("delete".into(), "/a/{id}".into()),
                ("post".into(), "/b".into())
            ]
        );
    }
}
