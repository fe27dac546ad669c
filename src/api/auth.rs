//! Bearer tokens: with `api.tokens` set, every `/v1/*` request must carry
//! `Authorization: Bearer <one of them>`, `/v1/leader` and `/v1/admin/resign`
//! included. `/healthz`, `/readyz`, `/leader` and `/metrics` stay open for load
//! balancers and scrapers.

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};
use crate::metrics as m;
use crate::secret::{ExposeSecret, SecretString};

/// Paths under this prefix need a token when tokens are configured.
const PROTECTED: &str = "/v1/";

pub(super) async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let tokens = &state.config.api.tokens;
    if tokens.is_empty() || !request.uri().path().starts_with(PROTECTED) {
        return next.run(request).await;
    }
    let refusal = match bearer(&request) {
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_token",
            "this endpoint needs Authorization: Bearer <token> (one of api.tokens)",
        ),
        Some(presented) if !accepted(presented.as_bytes(), tokens) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "the bearer token is not one of api.tokens",
        ),
        Some(_) => return next.run(request).await,
    };
    metrics::counter!(m::AUTH_FAILURES).increment(1);
    let mut response = refusal.into_response();
    response.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"delayq\""),
    );
    response
}

/// The token of an `Authorization: Bearer <token>` header, if there is one.
fn bearer(request: &Request) -> Option<&str> {
    let value = request.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether `presented` equals one of `tokens`. Every token is compared in full, in
/// time that depends only on the lengths, so timing tells nothing of how close a
/// guess came.
fn accepted(presented: &[u8], tokens: &[SecretString]) -> bool {
    tokens.iter().fold(false, |found, token| {
        found | constant_time_eq(presented, token.expose_secret().as_bytes())
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
        let tokens: Vec<SecretString> = tokens.iter().map(|&t| t.into()).collect();
        assert_eq!(
            accepted(presented.as_bytes(), &tokens),
            expected,
            "{presented:?} in {tokens:?}"
        );
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
