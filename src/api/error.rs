//! The API's one error type: every failure becomes `{"error": {"code", "message"}}` with a
//! fitting status. Client errors keep their message; store failures become a generic 503 and
//! are logged here, so no internal detail (or secret) reaches a response. A damaged stored
//! image is the exception: 500 `image_damaged`, naming the image, because trying again cannot
//! help.

use axum::Json;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::domain::words::{say, say_with};
use crate::engine::EngineError;
use crate::store::StoreError;

/// An error answered to an API client.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable, machine-readable code (`not_found`, `cost_acknowledgement_required`, …).
    pub code: &'static str,
    /// Plain words for a person.
    pub message: String,
    /// The task a retry refusal is about (`{"id", "status"}`), so a client can name it in
    /// its own words (`retry_in_progress`, `already_retried`).
    pub retried_as: Option<serde_json::Value>,
    /// What the refused request is estimated to cost (`cost_acknowledgement_required` of more
    /// candidates): `{"amount", "currency", "images"}`.
    pub estimated_cost: Option<serde_json::Value>,
}

impl ApiError {
    /// An error with the given status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into(), retried_as: None, estimated_cost: None }
    }

    /// 400: the request is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 404: no such task or artifact.
    pub fn not_found(what: &str) -> Self {
        let message = match what {
            "task" => say("say.error_task_not_found"),
            "set" => say("say.error_set_not_found"),
            _ => {
                let key = match what {
                    "delivery" => Some("say.what_delivery"),
                    "artifact" => Some("say.what_artifact_any"),
                    "delivered file" => Some("say.what_delivered_file"),
                    "draft" => Some("say.what_draft"),
                    "image" => Some("say.what_image"),
                    "notice" => Some("say.what_notice"),
                    "provider" => Some("say.what_provider"),
                    "route" => Some("say.what_route"),
                    "session" => Some("say.what_session"),
                    "shot" => Some("say.what_shot"),
                    "upload" => Some("say.what_upload_any"),
                    _ => None,
                };
                let named = key.map_or_else(|| what.to_string(), say);
                say_with("say.error_not_found", &[("what", &named)])
            }
        };
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 409: the request conflicts with the current state.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, code, message)
    }

    /// 422: well-formed, but not acceptable.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    }

    /// 503: the store failed; the detail is logged, the client gets a generic message.
    pub fn unavailable(detail: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "request failed in the store");
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", say("say.error_store"))
    }
}

impl ApiError {
    /// 500 `image_damaged`: the stored image `id` no longer matches its recorded size or
    /// sha256. Not a passing problem, so not 503: asking again gives the same damaged bytes.
    pub fn damaged(id: &str, why: &str) -> Self {
        tracing::error!(image = %id, %why, "a stored image is damaged");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "image_damaged",
            format!(
                "the stored image {id} is damaged ({why}), so tally will not send it; run `tally check` on the \
                 daemon's machine to list every damaged image, then restore a backup that has it, or make it again \
                 (retry the job, or upload the photo again)"
            ),
        )
    }
}

/// The body of every error answer: `{"error": {"code", "message"}}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong, for a program (`code`) and for a person (`message`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// A stable, machine-readable code such as `not_found`, `unauthorized`,
    /// `idempotency_conflict` or `cost_acknowledgement_required`.
    pub code: String,
    /// Plain words for a person.
    pub message: String,
    /// With `retry_in_progress` and `already_retried`: the task the earlier retry made,
    /// `{"id", "status"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<super::tasks::RetriedAsJson>)]
    pub retried_as: Option<serde_json::Value>,
    /// With `cost_acknowledgement_required` from `POST /v1/sets/{id}/shots/{index}/candidates`:
    /// what the new candidates are estimated to cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<EstimatedCost>)]
    pub estimated_cost: Option<serde_json::Value>,
}

/// What a refused request is estimated to cost.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct EstimatedCost {
    /// The configured price times `images`; null when the provider bills but has no price.
    pub amount: Option<f64>,
    pub currency: Option<String>,
    /// How many new images (generations) the request asks for.
    pub images: u32,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // In the request's language (`api::lang`): a said line (`domain::words::say`) is
        // rendered in it; a message made as plain text stays as it is.
        let error = ErrorDetail {
            code: self.code.to_string(),
            message: crate::domain::words::render(super::lang::request_lang(), &self.message),
            retried_as: self.retried_as,
            estimated_cost: self.estimated_cost,
        };
        let body = ErrorBody { error };
        (self.status, Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Damaged { id, why } => ApiError::damaged(&id, &why),
            StoreError::Gone { .. } => ApiError::not_found("image"),
            e => ApiError::unavailable(&e),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Invalid(msg) => ApiError::invalid(msg),
            EngineError::Store(e) => e.into(),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::JsonSyntaxError(e) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                say_with("say.error_not_json", &[("why", &e.body_text())]),
            ),
            JsonRejection::JsonDataError(e) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                say_with("say.error_shape", &[("why", &e.body_text())]),
            ),
            JsonRejection::MissingJsonContentType(_) => unsupported_media_type(),
            JsonRejection::BytesRejection(e) => e.into(),
            other => ApiError::bad_request(other.body_text()),
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large()
        } else {
            ApiError::bad_request(format!("could not read the request body: {}", r.body_text()))
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::bad_request(format!("bad query string: {}", r.body_text()))
    }
}

/// 415: a body that is not declared as JSON.
pub fn unsupported_media_type() -> ApiError {
    ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", say("say.error_body_json"))
}

/// 413: a body over `server.max_body_bytes`.
pub fn too_large() -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", say("say.error_too_large"))
}
