//! The admin API's error answer: `{"error": "..."}` with its status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::store::StoreError;

/// An error answer: `{"error": "..."}` with its status.
pub(super) struct ApiError(pub(super) StatusCode, pub(super) String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1}))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let status = match e {
            StoreError::NotFound(_) => StatusCode::NOT_FOUND,
            StoreError::WrongState { .. } | StoreError::NoMessage(_) => StatusCode::CONFLICT,
            StoreError::BadCursor(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

impl From<crate::ops::OpsError> for ApiError {
    /// A replay's failure: the status of what went wrong inside it, the text with
    /// its chain of causes (what `outboxd store` prints).
    fn from(e: crate::ops::OpsError) -> ApiError {
        use crate::ops::OpsError;
        let mut inner = &e;
        while let OpsError::Replay { error, .. } | OpsError::Rerun { error, .. } = inner {
            inner = error;
        }
        let status = match inner {
            OpsError::NotFound(_) => StatusCode::NOT_FOUND,
            OpsError::Store(StoreError::WrongState { .. } | StoreError::NoMessage(_)) => StatusCode::CONFLICT,
            OpsError::BadNewKey(_) | OpsError::ReasonTooLong { .. } | OpsError::ReasonNotText => StatusCode::BAD_REQUEST,
            OpsError::Reread { .. } => StatusCode::BAD_GATEWAY,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, crate::error::with_causes(&e))
    }
}
