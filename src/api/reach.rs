//! What the request's token may reach: its scope, and the streams of a token a
//! tokens file limits (`streams=`). Set by `auth::require_token` on every request
//! to a route that needs a token; a handler takes it as an argument.
//!
//! A stream named by the request that the token may not reach is refused `403
//! stream_not_permitted`; a message of such a stream is unknown to it (`404`, never
//! its contents); lists leave such streams out.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;

use super::ApiError;
use crate::config::glob_match;
use crate::store::Status;

/// The streams a request may reach.
#[derive(Clone, Debug)]
pub struct Reach {
    /// Who, as the audit trail says it: the token's name, or its fingerprint.
    pub who: String,
    /// None: every stream (no limit, or no token needed).
    pub streams: Option<Arc<[String]>>,
}

impl Reach {
    /// Every stream: no token is needed, or the token has no `streams=`.
    pub fn everything(who: String) -> Reach {
        Reach { who, streams: None }
    }

    /// Whether the token may reach `stream`.
    pub fn sees(&self, stream: &str) -> bool {
        match &self.streams {
            None => true,
            Some(patterns) => patterns.iter().any(|p| glob_match(p, stream)),
        }
    }

    /// Whether the token reaches every stream.
    pub fn is_everything(&self) -> bool {
        self.streams.is_none()
    }

    /// Whether the token may see a message in this state. A record names the
    /// stream written to (a dead letter's: the dead-letter stream of the target,
    /// seen with the target) or none (a cancel); a corrupt body names none: such
    /// messages are seen only by a token that reaches every stream.
    pub fn sees_status(&self, status: &Status, dead_letter_suffix: &str) -> bool {
        if self.is_everything() {
            return true;
        }
        match status {
            Status::Unknown => true,
            Status::Scheduled(s) => self.sees(&s.stream),
            Status::Done(r) => r.stream.as_deref().is_some_and(|stream| {
                self.sees(stream)
                    || stream
                        .strip_suffix(dead_letter_suffix)
                        .is_some_and(|target| self.sees(target))
            }),
            Status::Corrupt(_) => false,
        }
    }

    /// `403 stream_not_permitted` for a stream the token may not reach.
    pub fn check(&self, stream: &str) -> Result<(), ApiError> {
        match &self.streams {
            Some(patterns) if !self.sees(stream) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "stream_not_permitted",
                format!(
                    "stream {stream:?}: this token ({}) reaches only the streams {} (streams= in its tokens file)",
                    self.who,
                    patterns.join(", ")
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// `409 id_taken` for a push by a token limited to some streams whose id names a
/// message (scheduled, or its record) it may not see: the push would replace or
/// answer for another stream's message.
pub fn id_taken(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "id_taken",
        format!(
            "id {id:?}: names a message of a stream this token does not reach; choose another id"
        ),
    )
}

impl<S: Send + Sync> FromRequestParts<S> for Reach {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        // `require_token` runs before every route; a route it let through without
        // a token needs none, and reaches every stream.
        Ok(parts
            .extensions
            .get::<Reach>()
            .cloned()
            .unwrap_or_else(|| Reach::everything("no token".to_owned())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limited_reach_sees_its_patterns_and_refuses_the_rest_by_name() {
        let reach = Reach {
            who: "billing".into(),
            streams: Some(vec!["invoices".to_owned(), "tax.*".to_owned()].into()),
        };
        assert!(reach.sees("invoices") && reach.sees("tax.eu"));
        assert!(!reach.sees("orders") && !reach.sees("tax"));
        assert!(reach.check("tax.us").is_ok());
        let refused = reach.check("orders").unwrap_err();
        assert_eq!(
            (refused.status, refused.code),
            (StatusCode::FORBIDDEN, "stream_not_permitted")
        );
        assert!(
            refused.detail.contains("\"orders\"") && refused.detail.contains("billing"),
            "{}",
            refused.detail
        );
        let all = Reach::everything("admin".into());
        assert!(all.sees("orders") && all.check("anything").is_ok() && all.is_everything());
    }
}
