//! One rule for every endpoint's query string: a parameter the endpoint does not
//! take is `400 bad_query`, naming it and the ones the endpoint takes, before any
//! handler reads the query (or ignores it). What each endpoint takes is read from
//! the OpenAPI document the routes declare, so the rule and the reference cannot
//! disagree.

use std::collections::HashMap;
use std::sync::OnceLock;

use axum::extract::Request;
use axum::http::{Method, StatusCode};

use super::error::ApiError;

/// Route pattern → method (lower case) → the query parameters the operation
/// takes: looked up by the request's own strings, with nothing allocated.
type Taken = HashMap<String, HashMap<String, Vec<String>>>;

static TAKEN: OnceLock<Taken> = OnceLock::new();

fn taken() -> &'static Taken {
    TAKEN.get_or_init(super::openapi::query_parameters)
}

/// Refuses a request whose query names a parameter its route (the pattern it
/// matched, None for none) does not take. Routes the document does not know (none
/// today) are let through.
pub(super) fn refuse_unknown(request: &Request, route: Option<&str>) -> Result<(), ApiError> {
    let Some(query) = request.uri().query().filter(|q| !q.is_empty()) else {
        return Ok(());
    };
    let Some(route) = route else {
        return Ok(());
    };
    // The document names methods in lower case; axum answers HEAD with the GET route.
    let method = match *request.method() {
        Method::GET | Method::HEAD => "get",
        Method::POST => "post",
        Method::PUT => "put",
        Method::DELETE => "delete",
        Method::PATCH => "patch",
        _ => return Ok(()),
    };
    let Some(known) = taken().get(route).and_then(|methods| methods.get(method)) else {
        return Ok(());
    };
    match unknown_name(query, known) {
        None => Ok(()),
        Some(name) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_query",
            refusal_text(&name, known),
        )),
    }
}

/// The first parameter of `query` (names decoded; `+` is a space) that `known`
/// does not hold. A name that is not UTF-8 once decoded is left to the handler's
/// own check, which says so.
fn unknown_name(query: &str, known: &[String]) -> Option<String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').map_or(pair, |(name, _)| name))
        .filter_map(|name| {
            percent_encoding::percent_decode_str(&name.replace('+', " "))
                .decode_utf8()
                .ok()
                .map(|n| n.into_owned())
        })
        .find(|name| !known.iter().any(|k| k == name))
}

/// "`name`: unknown parameter (known: a, b)", or "(this endpoint takes none)".
fn refusal_text(name: &str, known: &[String]) -> String {
    if known.is_empty() {
        format!("{name}: unknown parameter (this endpoint takes none)")
    } else {
        format!("{name}: unknown parameter (known: {})", known.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_first_name_not_taken_is_named() {
        let k = known(&["limit", "after"]);
        for (query, unknown) in [
            ("limit=5", None),
            ("limit=5&after=x", None),
            ("limit", None),
            ("&&limit=5&", None),
            ("limt=5", Some("limt")),
            ("limit=5&colour=red&size=1", Some("colour")),
            ("li%6Dit=5", None),
            ("a+b=1", Some("a b")),
            ("%FF=1", None),
            ("=1", Some("")),
        ] {
            assert_eq!(unknown_name(query, &k).as_deref(), unknown, "{query}");
        }
    }

    #[test]
    fn the_refusal_names_what_the_endpoint_takes() {
        assert_eq!(
            refusal_text("foo", &[]),
            "foo: unknown parameter (this endpoint takes none)"
        );
        assert_eq!(
            refusal_text("limt", &known(&["limit", "after"])),
            "limt: unknown parameter (known: limit, after)"
        );
    }

    #[test]
    fn every_documented_operation_has_its_parameters() {
        let get = |route: &str| taken().get(route).and_then(|m| m.get("get"));
        assert_eq!(get("/v1/stats"), Some(&Vec::new()));
        let dead = get("/v1/streams/{stream}/dead").expect("the dead-letter list is documented");
        assert!(dead.contains(&"limit".to_owned()), "{dead:?}");
        assert!(
            !dead.contains(&"stream".to_owned()),
            "a path parameter: {dead:?}"
        );
        assert_eq!(
            get("/v1/streams/{stream}/next"),
            Some(&vec![
                "group".to_owned(),
                "consumer".to_owned(),
                "wait".to_owned(),
                "count".to_owned()
            ])
        );
    }
}
