//! `GET /v1/held` and `POST /v1/held/release`: jobs held because the database turned out
//! older than what was served (`store::held`, `store::sqlite::lineage`), and the owner's "send it
//! again", one by one or all together; `POST /v1/held/check` looks them up at their providers
//! (`engine::lookup`).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::openapi::{JsonRejected, StoreFailure};
use super::task_json::{TaskJson, task_json};
use super::{AppState, JsonBody, json_response};
use crate::store::held::Release;

/// `GET /v1/held` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HeldQuery {
    /// At most this many jobs: 1 to 500 (larger values give 500); 500 when absent.
    #[param(minimum = 1)]
    pub limit: Option<usize>,
}

/// `GET /v1/held` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct HeldList {
    /// How many jobs are held in all.
    pub total: i64,
    /// Held jobs, oldest first (at most `limit`); each has its `held` object.
    pub tasks: Vec<TaskJson>,
}

/// `POST /v1/held/release` body: name the jobs, or all of them.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// Task ids to release.
    #[serde(default)]
    pub ids: Vec<String>,
    /// Release every held job.
    #[serde(default)]
    pub all: bool,
}

/// What a release did.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReleaseJson {
    /// Released: queued to be sent again (each may be charged again).
    pub released: Vec<String>,
    /// Named but not held (unknown ids, or already released or canceled).
    pub not_held: Vec<String>,
}

/// `GET /v1/held`: the held jobs, oldest first.
#[utoipa::path(
    get,
    path = "/held",
    operation_id = "list_held",
    tag = "tasks",
    params(HeldQuery),
    responses(
        (status = 200, description = "The held jobs and how many there are.", body = HeldList),
        (status = 400, description = "A bad query string (`bad_request`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<HeldQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let limit = super::tasks::page_limit(q.limit, super::tasks::MAX_LIMIT)?;
    let (total, rows) = state.engine().store().held_tasks(limit).await?;
    let tasks = rows.iter().map(|t| task_json(state.engine(), t)).collect();
    Ok(json_response(StatusCode::OK, &HeldList { total, tasks }))
}

/// `POST /v1/held/release`: send held jobs again — those named in `ids`, or all with
/// `{"all": true}`. Each released job makes a new request to its provider, which may be a
/// second charge if the daemon the copy came from sent it already.
#[utoipa::path(
    post,
    path = "/held/release",
    operation_id = "release_held",
    tag = "tasks",
    request_body = ReleaseBody,
    responses(
        (status = 200, description = "What was released, and which named jobs were not held.", body = ReleaseJson),
        (status = 422, description = "Neither `ids` nor `all`, or both (`invalid_request`).", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn release(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ReleaseBody>,
) -> Result<Response, ApiError> {
    let which = match (body.all, body.ids.is_empty()) {
        (true, true) => Release::All,
        (false, false) => Release::Ids(body.ids),
        (true, false) => return Err(ApiError::invalid("give either `ids` or `all`, not both")),
        (false, true) => return Err(ApiError::invalid("name the jobs to release in `ids`, or give `\"all\": true`")),
    };
    let r = state.engine().release_held(which).await?;
    Ok(json_response(StatusCode::OK, &ReleaseJson { released: r.released, not_held: r.not_held }))
}

/// What `POST /v1/held/check` did.
#[derive(Debug, Serialize, ToSchema)]
pub struct CheckJson {
    /// Held jobs looked at.
    pub looked: usize,
    /// Found at their provider: their result is fetched, nothing is sent again.
    pub found: usize,
    /// Still held; each one's `held.reason` says what the look found.
    pub kept: usize,
}

/// `POST /v1/held/check`: look every held job up at its provider now (tally also does at
/// start-up). A job the provider shows as sent already is settled from the provider's record —
/// its result fetched, nothing sent again; the others stay held, and their reason says what the
/// provider showed or why it cannot be asked. Nothing is released by a check.
#[utoipa::path(
    post,
    path = "/held/check",
    operation_id = "check_held",
    tag = "tasks",
    responses(
        (status = 200, description = "How many held jobs were looked at, found and kept.", body = CheckJson),
        StoreFailure,
    )
)]
pub async fn check(State(state): State<AppState>) -> Result<Response, ApiError> {
    let r = state.engine().look_up_held().await?;
    Ok(json_response(StatusCode::OK, &CheckJson { looked: r.looked, found: r.found, kept: r.kept }))
}
