//! The `/v1` task handlers, and the task JSON every surface shows: status, a
//! plain-words message, attempts, artifacts, and whether a retry is possible and what it
//! may cost.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::openapi::{JsonRejected, NotFound, StoreFailure};
use super::{AppState, JsonBody, OptionalJsonBody, json_response};
use crate::clock::rfc3339;
use crate::domain::{TaskStatus, status_message};
use crate::engine::Engine;
use crate::providers::{Image, sniff_image};
use crate::store::{ArtifactView, CancelOutcome, NewTask, ResolveOutcome, RetryOutcome, SubmitOutcome, TaskView};

/// The default page size of `GET /v1/tasks`.
pub const DEFAULT_LIMIT: usize = 50;
/// The largest page size of `GET /v1/tasks`.
pub const MAX_LIMIT: usize = 500;
/// The longest operator note accepted by resolve, in bytes.
const MAX_NOTE_BYTES: usize = 2000;

/// A task as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskJson {
    pub id: String,
    pub status: TaskStatus,
    /// Plain words for the status (the honest wording for `unknown`).
    pub message: String,
    pub attempts: i64,
    pub provider: String,
    pub prompt: String,
    /// The provider parameters the task was submitted with (`{}` for none).
    #[schema(value_type = Object)]
    pub params: Value,
    pub idempotency_key: Option<String>,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// RFC 3339, UTC.
    pub updated_at: String,
    pub artifacts: Vec<ArtifactJson>,
    pub retry: RetryJson,
    pub retry_of: Option<String>,
    /// The image set this job is a shot of, and the shot's role (`main`, `selling_point`,
    /// `scene`); null for a job of its own.
    pub set_id: Option<String>,
    pub shot_role: Option<String>,
    pub cancel_requested: bool,
    pub failure_kind: Option<String>,
    /// The stored detail behind the message (why it failed, what it waits for).
    pub reason: Option<String>,
    /// For `unknown` tasks: how the provider bills, in plain words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub billing_note: Option<String>,
}

/// An artifact as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ArtifactJson {
    pub id: String,
    pub sha256: String,
    pub bytes: i64,
    pub media_type: String,
    /// Where to download it: `/v1/artifacts/{id}`.
    pub url: String,
}

/// Whether a task can be retried and what that may cost.
#[derive(Debug, Serialize, ToSchema)]
pub struct RetryJson {
    /// True for `failed`, `unknown` and `canceled` tasks.
    pub allowed: bool,
    /// True when a request for this task may already have been charged: a retry must then
    /// acknowledge that generating again may be charged again.
    pub requires_cost_acknowledgement: bool,
    pub note: String,
}

fn retry_json(t: &TaskView) -> RetryJson {
    let allowed = matches!(t.status, TaskStatus::Failed | TaskStatus::Unknown | TaskStatus::Canceled);
    let note = match (allowed, t.may_have_charged, t.status) {
        (false, _, TaskStatus::Succeeded) => {
            "This task succeeded. Generating again would be a new task, which the provider may charge for.".to_string()
        }
        (false, _, _) => {
            "This task has not finished; it can be retried once it has failed, been canceled or its outcome is unknown."
                .to_string()
        }
        (true, true, _) => "A request for this task reached the provider, so it may already have been charged. \
             Retrying creates a new task: generating again is a new operation that may be charged again."
            .to_string(),
        (true, false, _) => "Nothing for this task was sent to the provider, so retrying creates a new task \
             without the risk of paying twice for this one."
            .to_string(),
    };
    RetryJson { allowed, requires_cost_acknowledgement: t.may_have_charged, note }
}

fn artifact_json(a: &ArtifactView) -> ArtifactJson {
    ArtifactJson {
        id: a.id.clone(),
        sha256: a.sha256.clone(),
        bytes: a.bytes,
        media_type: a.media_type.clone(),
        url: format!("/v1/artifacts/{}", a.id),
    }
}

/// The API's view of a task.
pub fn task_json(engine: &Engine, t: &TaskView) -> TaskJson {
    TaskJson {
        id: t.id.clone(),
        status: t.status,
        message: status_message(t.status, t.reason.as_deref(), t.cancel_requested),
        attempts: t.attempts,
        provider: t.provider.clone(),
        prompt: t.prompt.clone(),
        params: t.params.clone(),
        idempotency_key: t.idempotency_key.clone(),
        created_at: rfc3339(t.created_at),
        updated_at: rfc3339(t.updated_at),
        artifacts: t.artifacts.iter().map(artifact_json).collect(),
        retry: retry_json(t),
        retry_of: t.retry_of.clone(),
        set_id: t.set_id.clone(),
        shot_role: t.shot_role.clone(),
        cancel_requested: t.cancel_requested,
        failure_kind: t.failure_kind.clone(),
        reason: t.reason.clone(),
        billing_note: if t.status == TaskStatus::Unknown { engine.billing_note(&t.provider) } else { None },
    }
}

/// Load a task or answer 404.
async fn load(state: &AppState, id: &str) -> Result<TaskView, ApiError> {
    state.engine().store().get_task(id.to_string()).await?.ok_or_else(|| ApiError::not_found("task"))
}

async fn task_response(state: &AppState, status: StatusCode, id: &str) -> Result<Response, ApiError> {
    let t = load(state, id).await?;
    Ok(if status == StatusCode::CREATED {
        created(state, id, &t)
    } else {
        json_response(status, &task_json(state.engine(), &t))
    })
}

/// A 201 answer with the task and its `Location`.
fn created(state: &AppState, id: &str, t: &TaskView) -> Response {
    let mut r = json_response(StatusCode::CREATED, &task_json(state.engine(), t));
    if let Ok(v) = header::HeaderValue::from_str(&format!("/v1/tasks/{id}")) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// The idempotency key from the `Idempotency-Key` header and/or the body; both must agree.
pub(crate) fn idempotency_key(headers: &HeaderMap, body: Option<String>) -> Result<Option<String>, ApiError> {
    let header = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::bad_request("the Idempotency-Key header must be visible ASCII"))?
                .to_string(),
        ),
    };
    match (header, body) {
        (Some(h), Some(b)) if h != b => Err(ApiError::bad_request(
            "the Idempotency-Key header and the idempotency_key field differ; send one, or the same value in both",
        )),
        (h, b) => Ok(h.or(b)),
    }
}

/// `POST /v1/tasks` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    /// What to generate (not blank; at most 8 KiB).
    #[schema(min_length = 1, example = "red sneaker on a white background")]
    pub prompt: String,
    /// A configured provider's name (`GET /v1/providers`); the default one when absent.
    pub provider: Option<String>,
    /// Provider parameters, e.g. `{"size": "1024x1024"}`.
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
    /// Makes resending this request safe: the same key with the same request returns the same
    /// task (1 to 256 bytes; or send the `Idempotency-Key` header).
    #[schema(min_length = 1)]
    pub idempotency_key: Option<String>,
}

/// `POST /v1/tasks`: 201 when new, 200 for a replay of the same key and body, 409 for the
/// same key with a different body.
#[utoipa::path(
    post,
    path = "/tasks",
    operation_id = "submit_task",
    tag = "tasks",
    params(IdempotencyKey),
    request_body = SubmitBody,
    responses(
        (status = 201, description = "A new task.", body = TaskJson,
            headers(("Location" = String, description = "`/v1/tasks/{id}`"))),
        (status = 200, description = "The task this idempotency key made, for the same request.", body = TaskJson),
        (status = 409, description = "The idempotency key was used for a different request \
            (`idempotency_conflict`).", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn submit(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<SubmitBody>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers, body.idempotency_key)?;
    let params = match body.params {
        None | Some(Value::Null) => json!({}),
        Some(p) => p,
    };
    let provider = body.provider.unwrap_or_else(|| state.default_provider().to_string());
    let t = NewTask { provider, prompt: body.prompt, params, idempotency_key: key, ..NewTask::default() };
    let (outcome, view) = state.engine().submit_and_get(t).await?;
    match (outcome, view) {
        (SubmitOutcome::Created(id), Some(t)) => Ok(created(&state, &id, &t)),
        (SubmitOutcome::Existing(_), Some(t)) => Ok(json_response(StatusCode::OK, &task_json(state.engine(), &t))),
        (SubmitOutcome::Created(id) | SubmitOutcome::Existing(id), None) => {
            task_response(&state, StatusCode::OK, &id).await
        }
        (SubmitOutcome::Conflict(id), _) => Err(ApiError::conflict(
            "idempotency_conflict",
            format!("this idempotency key was already used for a different request (task {id})"),
        )),
    }
}

/// The `Idempotency-Key` header (the same key may instead be sent in the body).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKey {
    /// The same as the body's `idempotency_key` (both may be sent if they are equal).
    #[param(rename = "Idempotency-Key", min_length = 1)]
    #[allow(dead_code)]
    key: Option<String>,
}

/// The `{id}` of a task in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TaskId {
    /// A task's id (from `POST /v1/tasks` or `GET /v1/tasks`).
    #[allow(dead_code)]
    id: String,
}

/// `GET /v1/tasks/{id}`.
#[utoipa::path(
    get,
    path = "/tasks/{id}",
    operation_id = "get_task",
    tag = "tasks",
    params(TaskId),
    responses((status = 200, description = "The task.", body = TaskJson), NotFound, StoreFailure)
)]
pub async fn get_one(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    task_response(&state, StatusCode::OK, &id).await
}

/// `GET /v1/tasks` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only tasks with this status (empty: all).
    #[param(schema_with = status_filter)]
    pub status: Option<String>,
    /// A task id (a page's `next`): list tasks created before it.
    pub before: Option<String>,
    /// The page size: 1 to 500 (larger values give 500); 50 when absent.
    #[param(minimum = 1)]
    pub limit: Option<usize>,
}

/// The schema of the `status` filter: a task status (from [`TaskStatus::ALL`]), or empty for
/// all.
fn status_filter() -> utoipa::openapi::schema::Object {
    let mut values: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
    values.push("");
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(values))
        .build()
}

/// One page of `GET /v1/tasks`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskList {
    /// Newest first.
    pub tasks: Vec<TaskJson>,
    /// The `before` of the next page; null on the last page.
    pub next: Option<String>,
}

/// `GET /v1/tasks?status=&before=&limit=`: newest first, `next` is the cursor of the next page.
#[utoipa::path(
    get,
    path = "/tasks",
    operation_id = "list_tasks",
    tag = "tasks",
    params(ListQuery),
    responses(
        (status = 200, description = "One page of tasks, newest first.", body = TaskList),
        (status = 400, description = "A bad query string: an unknown status, a limit of 0 or not a number \
            (`bad_request`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(TaskStatus::parse(s).ok_or_else(|| {
            let all: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
            ApiError::bad_request(format!("unknown status `{s}`; one of {}", all.join(", ")))
        })?),
    };
    let limit = page_limit(q.limit, DEFAULT_LIMIT)?;
    let mut rows = state.engine().store().list_tasks(status, q.before.filter(|b| !b.is_empty()), limit + 1).await?;
    let next = next_cursor(&mut rows, limit, |t| &t.id);
    let tasks: Vec<TaskJson> = rows.iter().map(|t| task_json(state.engine(), t)).collect();
    Ok(json_response(StatusCode::OK, &TaskList { tasks, next }))
}

/// The page size of a list request: `default` when absent, at most [`MAX_LIMIT`], never 0.
pub(crate) fn page_limit(limit: Option<usize>, default: usize) -> Result<usize, ApiError> {
    match limit {
        None => Ok(default),
        Some(0) => Err(ApiError::bad_request(format!("limit must be between 1 and {MAX_LIMIT}"))),
        Some(n) => Ok(n.min(MAX_LIMIT)),
    }
}

/// Given up to `limit + 1` rows, keep `limit` and return the cursor of the next page (the last
/// kept row's id), or `None` when this is the last page.
pub(crate) fn next_cursor<T>(rows: &mut Vec<T>, limit: usize, id: impl Fn(&T) -> &String) -> Option<String> {
    if rows.len() <= limit {
        return None;
    }
    rows.truncate(limit);
    rows.last().map(|r| id(r).clone())
}

/// One timeline entry as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventJson {
    /// RFC 3339, UTC.
    pub at: String,
    pub actor: String,
    pub kind: String,
    pub message: String,
    /// The execution (one attempt's worker run) the entry belongs to, if any.
    pub execution: Option<String>,
}

/// `GET /v1/tasks/{id}/events` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventList {
    /// Oldest first.
    pub events: Vec<EventJson>,
}

/// `GET /v1/tasks/{id}/events`: the task's timeline, oldest first.
#[utoipa::path(
    get,
    path = "/tasks/{id}/events",
    operation_id = "task_events",
    tag = "tasks",
    params(TaskId),
    responses((status = 200, description = "The task's timeline.", body = EventList), NotFound, StoreFailure)
)]
pub async fn events(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    load(&state, &id).await?;
    let events: Vec<EventJson> = state
        .engine()
        .store()
        .events(id)
        .await?
        .into_iter()
        .map(|e| EventJson {
            at: rfc3339(e.at),
            actor: e.actor,
            kind: e.kind,
            message: e.message,
            execution: e.execution_token,
        })
        .collect();
    Ok(json_response(StatusCode::OK, &EventList { events }))
}

/// `POST /v1/tasks/{id}/cancel`: 200 when canceled at once, 202 when the provider is already
/// working on it (cancel requested; a result that arrives is kept), 409 when settled.
#[utoipa::path(
    post,
    path = "/tasks/{id}/cancel",
    operation_id = "cancel_task",
    tag = "tasks",
    params(TaskId),
    responses(
        (status = 200, description = "Canceled: nothing had been sent.", body = TaskJson),
        (status = 202, description = "Cancel requested: the provider is already working on it; a result \
            that arrives is kept, since it may have been charged.", body = TaskJson),
        (status = 409, description = "The task is already settled (`already_settled`).", body = ErrorBody),
        NotFound,
        StoreFailure,
    )
)]
pub async fn cancel(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    match state.engine().cancel(&id).await? {
        CancelOutcome::Canceled => task_response(&state, StatusCode::OK, &id).await,
        CancelOutcome::Requested => task_response(&state, StatusCode::ACCEPTED, &id).await,
        CancelOutcome::Settled(s) => {
            Err(ApiError::conflict("already_settled", format!("the task is already {s}; there is nothing to cancel")))
        }
        CancelOutcome::NotFound => Err(ApiError::not_found("task")),
    }
}

/// `POST /v1/tasks/{id}/retry` body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    /// Must be true when the original may have been charged.
    #[serde(default)]
    pub acknowledge_possible_charge: bool,
    /// Makes resending this retry safe: the same key returns the same new task (1 to 256
    /// bytes; or the `Idempotency-Key` header).
    #[schema(min_length = 1)]
    pub idempotency_key: Option<String>,
}

/// `POST /v1/tasks/{id}/retry`: 201 with the new task; 409 `cost_acknowledgement_required`
/// when the original may have been charged and the body does not acknowledge it.
#[utoipa::path(
    post,
    path = "/tasks/{id}/retry",
    operation_id = "retry_task",
    tag = "tasks",
    params(TaskId, IdempotencyKey),
    request_body(content = Option<RetryBody>, description = "Optional: an empty body is `{}`."),
    responses(
        (status = 201, description = "The new task, linked to the original by `retry_of`.", body = TaskJson,
            headers(("Location" = String, description = "`/v1/tasks/{id}` of the new task"))),
        (status = 200, description = "The retry this idempotency key made before.", body = TaskJson),
        (status = 409, description = "The original may have been charged and the body does not acknowledge \
            it (`cost_acknowledgement_required`), or the task cannot be retried (`not_retryable`).",
            body = ErrorBody),
        NotFound,
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn retry(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    OptionalJsonBody(body): OptionalJsonBody<RetryBody>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers, body.idempotency_key)?;
    if let Some(k) = &key
        && (k.is_empty() || k.len() > 256)
    {
        return Err(ApiError::invalid("the idempotency key must be 1 to 256 characters"));
    }
    match state.engine().retry(&id, body.acknowledge_possible_charge, key).await? {
        RetryOutcome::Created(new_id) => task_response(&state, StatusCode::CREATED, &new_id).await,
        RetryOutcome::Existing(new_id) => task_response(&state, StatusCode::OK, &new_id).await,
        RetryOutcome::NeedsAcknowledgement => Err(ApiError::conflict(
            "cost_acknowledgement_required",
            "The first request may already have been charged. Generating again is a new operation that may be \
             charged again; send {\"acknowledge_possible_charge\": true} to retry anyway.",
        )),
        RetryOutcome::NotRetryable(s) => Err(ApiError::conflict(
            "not_retryable",
            format!("a {s} task cannot be retried; only failed, unknown or canceled tasks can"),
        )),
        RetryOutcome::NotFound => Err(ApiError::not_found("task")),
    }
}

/// How an operator resolves an `unknown` task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResolveAs {
    Succeeded,
    Failed,
}

/// `POST /v1/tasks/{id}/resolve` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveBody {
    pub outcome: ResolveAs,
    /// What the operator found (at most 2000 bytes).
    pub note: Option<String>,
    /// The image found at the provider (required with `succeeded`).
    pub image_base64: Option<String>,
}

/// `POST /v1/tasks/{id}/resolve`: an operator settles an `unknown` task by hand.
#[utoipa::path(
    post,
    path = "/tasks/{id}/resolve",
    operation_id = "resolve_task",
    tag = "tasks",
    params(TaskId),
    request_body = ResolveBody,
    responses(
        (status = 200, description = "The task, settled as the operator recorded.", body = TaskJson),
        (status = 409, description = "Only an unknown task can be resolved by hand (`not_unknown`).",
            body = ErrorBody),
        NotFound,
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn resolve(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ResolveBody>,
) -> Result<Response, ApiError> {
    let note = body.note.unwrap_or_default();
    if note.len() > MAX_NOTE_BYTES {
        return Err(ApiError::invalid(format!("the note is longer than {MAX_NOTE_BYTES} bytes")));
    }
    let image = match (body.outcome, body.image_base64) {
        (ResolveAs::Succeeded, None) => {
            return Err(ApiError::invalid("resolving as succeeded needs the image (image_base64)"));
        }
        (ResolveAs::Failed, Some(_)) => {
            return Err(ApiError::invalid("an image only goes with outcome \"succeeded\""));
        }
        (ResolveAs::Failed, None) => None,
        (ResolveAs::Succeeded, Some(b64)) => {
            let bytes = BASE64_STANDARD
                .decode(b64.trim())
                .map_err(|e| ApiError::invalid(format!("image_base64 is not valid base64: {e}")))?;
            let media_type =
                sniff_image(&bytes).ok_or_else(|| ApiError::invalid("the image is not a PNG, JPEG or WebP image"))?;
            Some(Image { bytes, media_type: media_type.into() })
        }
    };
    // Check first, for a clear answer before the image is verified and sent to the writer.
    let t = load(&state, &id).await?;
    if t.status != TaskStatus::Unknown {
        return Err(not_unknown(t.status));
    }
    match state.engine().resolve(&id, image, &note).await? {
        ResolveOutcome::Resolved => task_response(&state, StatusCode::OK, &id).await,
        ResolveOutcome::NotUnknown(s) => Err(not_unknown(s)),
        ResolveOutcome::NotFound => Err(ApiError::not_found("task")),
    }
}

fn not_unknown(s: TaskStatus) -> ApiError {
    ApiError::conflict("not_unknown", format!("only an unknown task can be resolved by hand; this one is {s}"))
}
