//! Errors the API returns: `{ "error": code, "detail": text }` with the status that
//! fits the cause.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::message::InvalidMessage;
use crate::store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            detail: detail.into(),
        }
    }

    /// The body could not be read as JSON at all.
    pub fn malformed(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed_json", detail)
    }

    /// Well-formed JSON, but a field breaks a rule.
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }
}

impl From<InvalidMessage> for ApiError {
    fn from(e: InvalidMessage) -> Self {
        match e {
            InvalidMessage::TooLarge(detail) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", detail)
            }
            other => ApiError::invalid(other.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::TooFar(detail) => ApiError::invalid(format!("deliver_at: {detail}")),
            StoreError::Corrupt(detail) => ApiError::new(StatusCode::CONFLICT, "corrupt", detail),
            other => {
                tracing::warn!(error = %other, "request failed in Redis");
                ApiError::unavailable(format!("storage unavailable: {other}"))
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "error": self.code, "detail": self.detail })),
        )
            .into_response()
    }
}
