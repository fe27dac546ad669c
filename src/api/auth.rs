//! Bearer tokens in three scopes, each allowing what the one below allows and more:
//! `read` (`api.read_tokens`) looks without changing anything; `write`
//! (`api.write_tokens`) schedules, cancels, reschedules and consumes (a long poll
//! moves entries to its consumer and counts a delivery, so it is a write);
//! `admin` (`api.tokens`) also replays and purges dead letters and makes the
//! leader resign. With any token configured, every `/v1/*` request needs one of
//! the scope its route needs ([`ROUTES`]); `/healthz`, `/readyz`, `/leader` and
//! `/metrics` stay open for load balancers and scrapers, the dashboard's files
//! (`/ui`) and `/v1/session` (which says whether a token is needed and known) for
//! browsers.

use std::fmt;

use axum::extract::Request;
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::reach::Reach;
use super::{ApiError, AppState};
use crate::config::{ApiConfig, ApiToken};
use crate::metrics as m;
use crate::secret::ExposeSecret;

/// Paths under this prefix need a token when tokens are configured, unknown ones too.
const PROTECTED: &str = "/v1/";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Scope {
    Read,
    Write,
    Admin,
}

impl Scope {
    /// The configuration keys whose tokens have this scope or a higher one.
    pub(super) fn granted_by(self) -> &'static str {
        match self {
            Scope::Read => "api.read_tokens, api.write_tokens or api.tokens",
            Scope::Write => "api.write_tokens or api.tokens",
            Scope::Admin => "api.tokens",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        })
    }
}

/// What a route asks of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Access {
    Open,
    Token(Scope),
}

use Access::{Open, Token};
use Scope::{Admin, Read, Write};

/// Every route (method, pattern as routed) and what it needs. The OpenAPI document
/// names each scope from here; a test holds this table and the routes in step.
pub(super) const ROUTES: &[(&str, &str, Access)] = &[
    ("POST", "/v1/messages", Token(Write)),
    ("POST", "/v1/messages/batch", Token(Write)),
    ("GET", "/v1/messages/batch", Token(Read)),
    ("DELETE", "/v1/messages/batch", Token(Write)),
    ("GET", "/v1/messages/{id}", Token(Read)),
    ("DELETE", "/v1/messages/{id}", Token(Write)),
    ("POST", "/v1/messages/{id}/reschedule", Token(Write)),
    ("GET", "/v1/streams/{stream}/next", Token(Write)),
    ("POST", "/v1/streams/{stream}/ack", Token(Write)),
    ("GET", "/v1/streams/{stream}/dead", Token(Read)),
    ("POST", "/v1/streams/{stream}/dead/replay", Token(Admin)),
    ("POST", "/v1/streams/{stream}/dead/purge", Token(Admin)),
    ("GET", "/v1/streams/{stream}/keys/{key}", Token(Read)),
    ("DELETE", "/v1/streams/{stream}/keys/{key}", Token(Write)),
    ("GET", "/v1/streams/{stream}/finished", Token(Read)),
    ("GET", "/v1/messages/{id}/history", Token(Read)),
    ("POST", "/v1/schedules", Token(Write)),
    ("GET", "/v1/schedules", Token(Read)),
    ("GET", "/v1/schedules/{id}", Token(Read)),
    ("PUT", "/v1/schedules/{id}", Token(Write)),
    ("DELETE", "/v1/schedules/{id}", Token(Write)),
    ("POST", "/v1/schedules/{id}/pause", Token(Write)),
    ("POST", "/v1/schedules/{id}/resume", Token(Write)),
    ("GET", "/v1/stats", Token(Read)),
    ("GET", "/v1/leader", Token(Read)),
    ("GET", "/v1/openapi.json", Token(Read)),
    ("POST", "/v1/admin/resign", Token(Admin)),
    ("POST", "/v1/admin/restore", Token(Admin)),
    ("POST", "/v1/admin/restore/{id}", Token(Admin)),
    ("GET", "/v1/session", Open),
    ("GET", "/v1/overview", Token(Read)),
    ("GET", "/v1/nodes", Token(Read)),
    ("GET", "/v1/leadership/history", Token(Read)),
    ("GET", "/v1/streams", Token(Read)),
    ("GET", "/v1/upcoming", Token(Read)),
    ("GET", "/v1/fences", Token(Read)),
    ("POST", "/v1/streams/{stream}/pause", Token(Admin)),
    ("POST", "/v1/streams/{stream}/resume", Token(Admin)),
    ("POST", "/v1/admin/reload", Token(Admin)),
    ("POST", "/v1/admin/switchover", Token(Admin)),
    ("GET", "/v1/admin/audit", Token(Admin)),
    ("GET", "/ui", Open),
    ("GET", "/ui/app.js", Open),
    ("GET", "/ui/app.css", Open),
    ("GET", "/leader", Open),
    ("GET", "/healthz", Open),
    ("GET", "/readyz", Open),
    ("GET", "/metrics", Open),
];

/// What a request to `route` (None: no route matched) at `path` needs. A method
/// the route does not serve (answered 405) or an unknown path under `/v1/` needs
/// a token of any scope, as every `/v1/*` request does.
pub(super) fn access(method: &Method, route: Option<&str>, path: &str) -> Access {
    // A GET route answers HEAD too.
    let method = if method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    let listed = route.and_then(|route| {
        ROUTES
            .iter()
            .find(|(m, r, _)| *m == method && *r == route)
            .map(|(_, _, access)| *access)
    });
    match listed {
        Some(access) => access,
        None if path.starts_with(PROTECTED) => Token(Read),
        None => Open,
    }
}

/// Lets a request through (None) when its route (the pattern it matched, None for
/// none) needs no token or it carries one of the scope needed (what that token may
/// reach then goes with it, [`Reach`]); else the refusal to answer with (401, or
/// 403 with the scope needed).
pub(super) fn require_token(
    state: &AppState,
    request: &mut Request,
    route: Option<&str>,
) -> Option<Response> {
    // Tokens follow reloads: the running configuration's, not the start's.
    let live = state.live_config.borrow().clone();
    let api = &live.api;
    let needed = match access(request.method(), route, request.uri().path()) {
        Token(needed) if authenticates(api) => needed,
        _ => return None,
    };
    let refusal = match bearer(request) {
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_token",
            format!(
                "this endpoint needs Authorization: Bearer <token> of the {needed} scope (one of {})",
                needed.granted_by()
            ),
        ),
        Some(presented) => match token_of(presented, api) {
            None => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                "the bearer token is not one of api.tokens, api.write_tokens or api.read_tokens",
            ),
            Some((held, token)) if held >= needed => {
                let reach = Reach {
                    who: known_as(presented, Some(token)),
                    streams: token.streams.clone().map(Into::into),
                };
                request.extensions_mut().insert(reach);
                return None;
            }
            Some((held, _)) => {
                let mut response = ApiError::new(
                    StatusCode::FORBIDDEN,
                    "insufficient_scope",
                    format!(
                        "{} {} needs the {needed} scope (a token of {}); this token has the {held} scope",
                        request.method(),
                        route.unwrap_or("this endpoint"),
                        needed.granted_by()
                    ),
                )
                .into_response();
                let challenge = format!(
                    "Bearer realm=\"delayq\", error=\"insufficient_scope\", scope=\"{needed}\""
                );
                if let Ok(value) = HeaderValue::from_str(&challenge) {
                    response.headers_mut().insert(WWW_AUTHENTICATE, value);
                }
                return Some(response);
            }
        },
    };
    metrics::counter!(m::AUTH_FAILURES).increment(1);
    let mut response = refusal.into_response();
    response.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"delayq\""),
    );
    Some(response)
}

/// Whether requests need a token: some token, of any scope, is configured.
fn authenticates(api: &ApiConfig) -> bool {
    !(api.tokens.is_empty() && api.write_tokens.is_empty() && api.read_tokens.is_empty())
}

/// The configured token `presented` equals, if any, and its scope (the highest of
/// the lists that hold it). Every list is searched in full ([`accepted`]).
fn token_of<'a>(presented: &[u8], api: &'a ApiConfig) -> Option<(Scope, &'a ApiToken)> {
    [
        (Admin, &api.tokens),
        (Write, &api.write_tokens),
        (Read, &api.read_tokens),
    ]
    .into_iter()
    .filter_map(|(scope, tokens)| accepted(presented, tokens).map(|t| (scope, t)))
    .max_by_key(|(scope, _)| *scope)
}

/// Who a presented token is, as logs and the audit trail say: its name (no `:` in
/// one), else its fingerprint `token:<hex>` (never the token).
pub(super) fn known_as(presented: &[u8], token: Option<&ApiToken>) -> String {
    match token.and_then(|t| t.name.as_deref()) {
        Some(name) => name.to_owned(),
        None => crate::who::fingerprint(presented),
    }
}

/// [`known_as`] the token of these headers, looked up in `api`; "no token" without one.
pub(super) fn who(headers: &axum::http::HeaderMap, api: &ApiConfig) -> String {
    match bearer_of(headers) {
        None => "no token".to_owned(),
        Some(presented) => known_as(presented, token_of(presented, api).map(|(_, t)| t)),
    }
}

/// The scope a request's token holds and the streams it is limited to (None:
/// every stream): `admin` when no token is configured (every request may do
/// everything), None when it carries no token this node knows.
pub(super) fn scope_held(
    headers: &axum::http::HeaderMap,
    api: &ApiConfig,
) -> Option<(Scope, Option<Vec<String>>)> {
    if !authenticates(api) {
        return Some((Admin, None));
    }
    let (scope, token) = token_of(bearer_of(headers)?, api)?;
    Some((scope, token.streams.clone()))
}

/// The token of an `Authorization: Bearer <token>` header, if there is one.
pub(super) fn bearer(request: &Request) -> Option<&[u8]> {
    bearer_of(request.headers())
}

/// The token's bytes as sent: one that is not UTF-8 is a token presented (and
/// unknown), not a missing one.
fn bearer_of(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    let value = headers.get(AUTHORIZATION)?.as_bytes().trim_ascii();
    let space = value.iter().position(|b| *b == b' ')?;
    let (scheme, token) = (&value[..space], &value[space + 1..]);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| token.trim_ascii())
}

/// The one of `tokens` that `presented` equals, if any. Every token is compared in
/// full, in time that depends only on the lengths, so timing tells nothing of how
/// close a guess came.
fn accepted<'a>(presented: &[u8], tokens: &'a [ApiToken]) -> Option<&'a ApiToken> {
    tokens.iter().fold(None, |found, token| {
        let equal = constant_time_eq(presented, token.secret.expose_secret().as_bytes());
        if equal { Some(token) } else { found }
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(presented: &str, tokens: &[&str], expected: bool) {
        let tokens: Vec<ApiToken> = tokens.iter().map(|&t| ApiToken::plain(t.into())).collect();
        assert_eq!(
            accepted(presented.as_bytes(), &tokens).is_some(),
            expected,
            "{presented:?} in {tokens:?}"
        );
    }

    #[test]
    fn a_token_has_the_scope_of_the_list_that_holds_it() {
        let c = crate::config::Config::from_toml(
            "[api]\ntokens = [\"a\"]\nwrite_tokens = [\"w\", \"w2\"]\nread_tokens = [\"r\"]",
            std::iter::empty(),
        )
        .unwrap();
        for (presented, expected) in [
            ("a", Some(Admin)),
            ("w", Some(Write)),
            ("w2", Some(Write)),
            ("r", Some(Read)),
            ("rr", None),
            ("A", None),
            ("", None),
        ] {
            assert_eq!(
                token_of(presented.as_bytes(), &c.api).map(|(scope, _)| scope),
                expected,
                "{presented:?}"
            );
        }
        assert!(authenticates(&c.api));
        let open = crate::config::Config::from_toml("", std::iter::empty()).unwrap();
        assert!(!authenticates(&open.api));
    }

    /// What an `Authorization` header presents: a token that is not UTF-8 is
    /// presented (and then unknown), not missing.
    #[test]
    fn the_bearer_token_is_read_as_bytes() {
        #[rustfmt::skip]
        let cases: &[(&[u8], Option<&[u8]>)] = &[
            (b"Bearer abc", Some(b"abc")),
            (b"bearer  abc ", Some(b"abc")),
            (b" BEARER abc", Some(b"abc")),
            (b"Bearer \xff\xfe", Some(b"\xff\xfe")),
            (b"Bearer a\x80b", Some(b"a\x80b")),
            (b"Bearer ", None),
            (b"Basic abc", None),
            (b"Bearer", None),
            (b"Bearerabc", None),
            (b"", None),
        ];
        for (header, expected) in cases {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert(AUTHORIZATION, HeaderValue::from_bytes(header).unwrap());
            assert_eq!(bearer_of(&headers), *expected, "{header:?}");
        }
        assert_eq!(bearer_of(&axum::http::HeaderMap::new()), None);
    }

    #[test]
    fn a_request_needs_what_its_route_needs() {
        let purge = "/v1/streams/{stream}/dead/purge";
        let next = "/v1/streams/{stream}/next";
        for (method, route, path, expected) in [
            (Method::GET, Some("/v1/stats"), "/v1/stats", Token(Read)),
            (Method::HEAD, Some("/v1/stats"), "/v1/stats", Token(Read)),
            (
                Method::GET,
                Some("/v1/messages/{id}"),
                "/v1/messages/x",
                Token(Read),
            ),
            (
                Method::DELETE,
                Some("/v1/messages/{id}"),
                "/v1/messages/x",
                Token(Write),
            ),
            (Method::GET, Some(next), "/v1/streams/o/next", Token(Write)),
            (
                Method::POST,
                Some(purge),
                "/v1/streams/o/dead/purge",
                Token(Admin),
            ),
            (
                Method::POST,
                Some("/v1/admin/resign"),
                "/v1/admin/resign",
                Token(Admin),
            ),
            // Answered 405 or 404, after a token of any scope.
            (
                Method::PUT,
                Some("/v1/messages"),
                "/v1/messages",
                Token(Read),
            ),
            (Method::GET, None, "/v1/nowhere", Token(Read)),
            (Method::GET, Some("/healthz"), "/healthz", Open),
            (Method::HEAD, Some("/metrics"), "/metrics", Open),
            (Method::POST, Some("/leader"), "/leader", Open),
            (Method::GET, None, "/nowhere", Open),
        ] {
            assert_eq!(access(&method, route, path), expected, "{method} {path}");
        }
    }

    #[test]
    fn tokens_match_exactly() {
        check("s3cret", &["s3cret"], true);
        check("s3cret", &["other", "s3cret"], true);
        check("s3cre", &["s3cret"], false);
        check("s3cretX", &["s3cret"], false);
        check("S3cret", &["s3cret"], false);
        check("", &["s3cret"], false);
        check("s3cret", &[], false);
        check("s3cret\0", &["s3cret"], false);
    }
}
