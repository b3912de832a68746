//! "Signed-in devices": `GET /v1/sessions` lists the browser sessions in use (each by the
//! sha256 of its cookie value, which signs nothing in, with the device it signed in and its
//! last use), and `DELETE /v1/sessions/{id}` ends one — a lost phone, or one paired by
//! mistake. Its live stream ends at once on this node; another PostgreSQL node notices within
//! half a minute (`api::sessions`).

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Credential;
use super::error::{ApiError, ErrorBody};
use super::sessions::Sessions;

/// One signed-in browser.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeviceJson {
    /// The session's id in this list (the sha256 of its cookie value: it signs nothing in).
    pub id: String,
    /// The device and browser it signed in with, from its User-Agent ("iPhone · Safari"), or
    /// null for a session older than this list.
    pub device: Option<String>,
    /// When it signed in (RFC 3339, UTC).
    pub created_at: String,
    /// When it was last used, to the hour (RFC 3339, UTC).
    pub last_used_at: String,
    /// Whether this is the session of the browser asking.
    pub current: bool,
}

/// `GET /v1/sessions` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct DevicesJson {
    /// The most recently used first.
    pub sessions: Vec<DeviceJson>,
}

/// The `{id}` of a session in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DeviceId {
    /// A session's `id` from `GET /v1/sessions`.
    #[allow(dead_code)]
    id: String,
}

/// The calling browser's session id, if it is a browser.
fn own(credential: Option<Extension<Credential>>) -> Option<String> {
    match credential.map(|Extension(c)| c) {
        Some(Credential::Session(id)) => Some(Sessions::listed_id(&id)),
        _ => None,
    }
}

/// `GET /v1/sessions`: the browsers signed in to the page.
#[utoipa::path(
    get,
    path = "/sessions",
    operation_id = "list_sessions",
    tag = "session",
    responses(
        (status = 200, description = "The signed-in browsers.", body = DevicesJson),
        crate::api::openapi::StoreFailure,
    )
)]
pub async fn list(
    State(state): State<AppState>,
    credential: Option<Extension<Credential>>,
) -> Result<Response, ApiError> {
    let mine = own(credential);
    let rows = state.sessions().list().await?;
    let sessions = rows
        .into_iter()
        .map(|r| DeviceJson {
            current: mine.as_deref() == Some(r.id_hash.as_str()),
            id: r.id_hash,
            device: r.device,
            created_at: crate::clock::rfc3339(r.created_at),
            last_used_at: crate::clock::rfc3339(r.last_used_at),
        })
        .collect();
    Ok(Json(DevicesJson { sessions }).into_response())
}

/// `DELETE /v1/sessions/{id}` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndedJson {
    /// Always true: the session ended (a 404 says it did not exist).
    pub ended: bool,
    /// Whether it was the calling browser's own session (that browser is signed out now).
    pub was_current: bool,
}

/// `DELETE /v1/sessions/{id}`: sign one browser out (it needs a new link or pairing).
#[utoipa::path(
    delete,
    path = "/sessions/{id}",
    operation_id = "end_session",
    tag = "session",
    params(DeviceId),
    responses(
        (status = 200, description = "The session ended.", body = EndedJson),
        (status = 404, description = "No session with this id is in use (`not_found`).", body = ErrorBody),
        crate::api::openapi::StoreFailure,
    )
)]
pub async fn end(
    State(state): State<AppState>,
    credential: Option<Extension<Credential>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let was_current = own(credential).as_deref() == Some(id.as_str());
    if !state.sessions().end_listed(&id).await? {
        return Err(ApiError::not_found("session"));
    }
    Ok(Json(EndedJson { ended: true, was_current }).into_response())
}
