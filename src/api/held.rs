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
    #[param(minimum = 1, value_type = Option<u64>)]
    #[serde(default, deserialize_with = "crate::api::any_count")]
    pub limit: Option<usize>,
}

/// `GET /v1/held` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct HeldList {
    /// How many jobs are held in all.
    pub total: i64,
    /// Held jobs, oldest first (at most `limit`); each has its `held` object.
    pub tasks: Vec<TaskJson>,
    /// What start-up noticed and must be said (a lost tail of commits: work that is gone from
    /// the database, and the providers whose dashboards to check), until dismissed.
    pub notices: Vec<NoticeJson>,
}

/// A notice of start-up's (`kind` `lost_tail`: commits lost with a missing write-ahead log).
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct NoticeJson {
    pub id: i64,
    pub kind: String,
    /// When it was noticed (RFC 3339).
    pub at: String,
    /// What happened and what to do, in plain words.
    pub message: String,
    /// How many commits are missing.
    pub missing_commits: Option<i64>,
    /// The window they were made in (RFC 3339; `from` is null for an empty database).
    pub from: Option<String>,
    pub until: Option<String>,
    /// The providers that may have received requests in that window: check their dashboards.
    pub providers: Vec<String>,
}

/// The notices in `lang`.
pub(crate) async fn notices(state: &AppState) -> Result<Vec<NoticeJson>, ApiError> {
    let lang = super::lang::request_lang();
    Ok(state
        .engine()
        .store()
        .notices()
        .await?
        .into_iter()
        .map(|(id, kind, at, data)| {
            let mut providers: Vec<String> = data["providers"]
                .as_array()
                .map(|a| a.iter().filter_map(|p| p.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            // The lost commits may hold the provider list too: add every provider that bills
            // now (each may have been configured then).
            for p in state.engine().provider_list().into_iter().filter(|p| p.price.billable) {
                if !providers.contains(&p.name) {
                    providers.push(p.name);
                }
            }
            providers.sort();
            let n = data["missing_commits"].as_i64();
            let (from, until) = (data["from"].as_str().map(str::to_string), data["until"].as_str().map(str::to_string));
            let message = crate::domain::words::tf(
                lang,
                if from.is_some() { "notice.lost_tail" } else { "notice.lost_tail_all" },
                &[
                    ("n", &n.unwrap_or(0).to_string()),
                    ("from", from.as_deref().unwrap_or("?")),
                    ("until", until.as_deref().unwrap_or("?")),
                    ("providers", &providers.join(", ")),
                ],
            );
            NoticeJson { id, kind, at: crate::clock::rfc3339(at), message, missing_commits: n, from, until, providers }
        })
        .collect())
}

/// `POST /v1/held/release` body: name the jobs, or all of them.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// Task ids to release.
    #[serde(default)]
    pub ids: Vec<String>,
    /// Release every held job (the named ones among them). Neither: nothing is released.
    #[serde(default)]
    pub all: bool,
}

/// The notice a dismissal names.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct NoticePath {
    /// The notice's id (`notices[].id` of `GET /v1/held`).
    pub id: i64,
}

/// `POST /v1/held/notices/{id}/dismiss`: the owner has read a notice (and checked the
/// dashboards it names); it is no longer shown.
#[utoipa::path(
    post,
    path = "/held/notices/{id}/dismiss",
    operation_id = "dismiss_notice",
    tag = "tasks",
    params(NoticePath),
    responses(
        (status = 200, description = "Dismissed; the notices still shown.", body = Vec<NoticeJson>),
        (status = 404, description = "No such notice, or already dismissed (`not_found`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn dismiss(
    State(state): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    // An id that is not a notice's (not a number, out of range) names nothing: 404 like any other.
    let Ok(id) = id.parse::<i64>() else { return Err(ApiError::not_found("notice")) };
    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
    if !state.engine().store().dismiss_notice(id, now).await? {
        return Err(ApiError::not_found("notice"));
    }
    Ok(json_response(StatusCode::OK, &notices(&state).await?))
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
    let notices = notices(&state).await?;
    Ok(json_response(StatusCode::OK, &HeldList { total, tasks, notices }))
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
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn release(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ReleaseBody>,
) -> Result<Response, ApiError> {
    let which = match (body.all, body.ids.is_empty()) {
        // Every held job, the named ones among them.
        (true, _) => Release::All,
        (false, false) => Release::Ids(body.ids),
        // Nothing named: nothing released (a request the document allows; not an error).
        (false, true) => Release::Ids(Vec::new()),
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
