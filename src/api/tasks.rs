//! The `/v1` task handlers: submit, list and search, one task, its events, cancel, retry and
//! resolve. The task JSON they answer with is in [`super::task_json`].

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
pub use super::task_json::*;
use super::{AppState, JsonBody, OptionalJsonBody, json_response};
use crate::clock::rfc3339;
use crate::domain::operation::Operation;
use crate::domain::words::{say, say_with};
use crate::domain::{Charge, TaskStatus, money};
use crate::providers::{Image, sniff_image};
use crate::store::{
    CancelOutcome, NewTask, OwnerCharge, ResolveOutcome, RetryAck, RetryOutcome, SubmitOutcome, TaskFilter, TaskView,
};

/// The default page size of `GET /v1/tasks`.
pub const DEFAULT_LIMIT: usize = 50;
/// The largest page size of `GET /v1/tasks`.
pub const MAX_LIMIT: usize = 500;
/// The longest operator note accepted by resolve, in bytes.
const MAX_NOTE_BYTES: usize = 2000;

/// Load a task or answer 404.
async fn load(state: &AppState, id: &str) -> Result<TaskView, ApiError> {
    state.engine().store().get_task(id.to_string()).await?.ok_or_else(|| ApiError::not_found("task"))
}

async fn task_response(state: &AppState, status: StatusCode, id: &str) -> Result<Response, ApiError> {
    let t = load(state, id).await?;
    Ok(if status == StatusCode::CREATED {
        created(state, id, &t)
    } else {
        let mut j = task_json(state.engine(), &t);
        // One job: its history adds when the request was sent and the provider's id for it.
        if let Some(w) = j.where_to_look.as_mut() {
            let events = state.engine().store().events(id.to_string()).await?;
            super::task_help::add_request_details(w, &events);
        }
        json_response(status, &j)
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
    /// What to generate, or for an `edit` the instruction (not blank; at most 8 KiB). A
    /// `cutout` takes none.
    #[schema(min_length = 1, example = "red sneaker on a white background")]
    #[serde(default)]
    pub prompt: Option<String>,
    /// What the call makes: `generate` (the default), `edit` (an image and an instruction →
    /// one image) or `cutout` (an image → the product on a transparent background). A
    /// provider that does not offer it is refused (422) before anything is recorded.
    pub operation: Option<Operation>,
    /// The image an `edit` or `cutout` works on: `{"artifact": ID}` (an image tally made),
    /// `{"upload": ID}` (an uploaded photo) or `{"task": ID}` (that task's image; 422 while it
    /// has none).
    pub image: Option<super::source::ImageRef>,
    /// A configured provider's name (`GET /v1/providers`); the default one when absent.
    pub provider: Option<String>,
    /// Provider parameters, e.g. `{"size": "1024x1024"}`. A task makes one image: `n`,
    /// `num_outputs`, `num_images`, `sampleCount` or `number_of_images` other than 1 is refused
    /// (422 `invalid_request`), before anything is sent.
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
    /// Makes resending this request safe: the same key with the same request returns the same
    /// task (1 to 256 bytes; or send the `Idempotency-Key` header).
    #[schema(min_length = 1)]
    pub idempotency_key: Option<String>,
    /// Jobs with the same group share a fairness key: a big batch in one group takes turns
    /// with other groups' jobs instead of holding them back.
    pub group: Option<String>,
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
    let source = match body.image {
        Some(r) => Some(super::source::resolve_image(&state, r).await?),
        None => None,
    };
    let t = NewTask {
        provider,
        prompt: body.prompt.unwrap_or_default(),
        params,
        idempotency_key: key,
        group: body.group,
        operation: body.operation.unwrap_or_default(),
        source,
        ..NewTask::default()
    };
    let (outcome, view) = state.engine().submit_and_get(t).await?;
    match (outcome, view) {
        (SubmitOutcome::Created(id), Some(t)) => Ok(created(&state, &id, &t)),
        (SubmitOutcome::Existing(_), Some(t)) => Ok(json_response(StatusCode::OK, &task_json(state.engine(), &t))),
        (SubmitOutcome::Created(id) | SubmitOutcome::Existing(id), None) => {
            task_response(&state, StatusCode::OK, &id).await
        }
        (SubmitOutcome::Conflict(id), _) => Err(ApiError::conflict(
            "idempotency_conflict",
            crate::domain::words::say_with("say.error_idem_task", &[("id", &id)]),
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
    #[param(schema_with = super::openapi::or_empty::<TaskStatus>)]
    pub status: Option<String>,
    /// A task id (a page's `next`): list tasks created before it.
    pub before: Option<String>,
    /// The page size: 1 to 500 (larger values give 500); 50 when absent.
    #[param(minimum = 1, value_type = Option<u64>)]
    #[serde(default, deserialize_with = "crate::api::any_count")]
    pub limit: Option<usize>,
    /// Only tasks that need the owner: `unknown` ones not yet resolved or retried, and held ones
    /// (see `GET /v1/held`).
    pub needs_attention: Option<bool>,
    /// Only tasks whose prompt, or whose image set's product, contains this text (at most 200
    /// bytes; ASCII letters match either case; empty: all).
    pub q: Option<String>,
}

/// One page of `GET /v1/tasks`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskList {
    /// Newest first.
    pub tasks: Vec<TaskJson>,
    /// The `before` of the next page; null on the last page.
    pub next: Option<String>,
}

/// The longest search text `GET /v1/tasks?q=` takes.
const MAX_SEARCH_BYTES: usize = 200;

/// `GET /v1/tasks?status=&needs_attention=&q=&before=&limit=`: newest first, `next` is the
/// cursor of the next page.
#[utoipa::path(
    get,
    path = "/tasks",
    operation_id = "list_tasks",
    tag = "tasks",
    params(ListQuery),
    responses(
        (status = 200, description = "One page of tasks, newest first.", body = TaskList),
        (status = 400, description = "A bad query string: an unknown status, a limit of 0, a search text \
            over 200 bytes, or a value that is not a number or a boolean (`bad_request`).", body = ErrorBody),
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
    let search = q.q.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    if search.as_ref().is_some_and(|s| s.len() > MAX_SEARCH_BYTES) {
        return Err(ApiError::bad_request(format!("q is longer than {MAX_SEARCH_BYTES} bytes")));
    }
    let filter = TaskFilter { status, needs_attention: q.needs_attention.unwrap_or(false), search };
    let mut rows = state.engine().store().list_tasks(filter, q.before.filter(|b| !b.is_empty()), limit + 1).await?;
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
#[allow(missing_docs)]
pub struct EventJson {
    /// RFC 3339, UTC.
    pub at: String,
    pub actor: String,
    pub kind: String,
    /// What happened, in the answer's language (`api::lang`): a said line rendered from its
    /// key (`domain::words::render`); a line stored as plain text (a provider's own message,
    /// an older version's English) is shown as it was stored.
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
    let lang = super::lang::request_lang();
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
            message: crate::domain::words::render(lang, &e.message),
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
        CancelOutcome::Settled(s) => Err(ApiError::conflict(
            "already_settled",
            crate::domain::words::say_with(
                "say.error_already_settled",
                &[("status", &crate::domain::words::say(&format!("say.status_{}", s.as_str())))],
            ),
        )),
        CancelOutcome::NotFound => Err(ApiError::not_found("task")),
    }
}

/// `POST /v1/tasks/{id}/retry` body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    /// Must be true when a request of the original was possibly charged or charged.
    #[serde(default)]
    pub acknowledge_possible_charge: bool,
    /// Once the task was retried, another retry must name its latest retry (`retried_as.id`).
    pub acknowledge_retried_as: Option<String>,
    /// Makes resending this retry safe; scoped to this task (another task's retry with the
    /// same key is a different retry). 1 to 256 bytes; or the `Idempotency-Key` header.
    #[schema(min_length = 1)]
    pub idempotency_key: Option<String>,
}

/// `POST /v1/tasks/{id}/retry`: 201 with the new task (200 for a replay of the same key);
/// 409 `cost_acknowledgement_required` when a request of the original may have been charged
/// and the body does not acknowledge it, `retry_in_progress` while a retry of it (or of its
/// shot) is live, `already_retried` when it was retried and the body does not name that
/// retry.
#[utoipa::path(
    post,
    path = "/tasks/{id}/retry",
    operation_id = "retry_task",
    tag = "tasks",
    params(TaskId, IdempotencyKey),
    request_body(content = Option<RetryBody>, description = "Optional: an empty body (or `null`) is `{}`."),
    responses(
        (status = 201, description = "The new task, linked to the original by `retry_of`.", body = TaskJson,
            headers(("Location" = String, description = "`/v1/tasks/{id}` of the new task"))),
        (status = 200, description = "The retry this idempotency key made before.", body = TaskJson),
        (status = 409, description = "A request of the original may have been charged and the body does not \
            acknowledge it (`cost_acknowledgement_required`); a retry of it is still live (`retry_in_progress`, \
            with `retried_as`); it was retried and the body does not name that retry (`already_retried`, with \
            `retried_as`); or the task cannot be retried (`not_retryable`).",
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
    let ack = RetryAck { possible_charge: body.acknowledge_possible_charge, retried_as: body.acknowledge_retried_as };
    match state.engine().retry(&id, ack, key).await? {
        RetryOutcome::Created(new_id) => task_response(&state, StatusCode::CREATED, &new_id).await,
        RetryOutcome::Existing(new_id) => task_response(&state, StatusCode::OK, &new_id).await,
        RetryOutcome::NeedsAcknowledgement => {
            let t = load(&state, &id).await?;
            let again = match state.engine().price_of(&t.provider, &t.params) {
                Some((m, c)) => say_with("say.charged_again_about", &[("amount", &money(m, &c))]),
                None => say("say.charged_again"),
            };
            let key =
                if t.charge.state == Charge::Charged { "say.error_ack_charged" } else { "say.error_ack_possible" };
            Err(ApiError::conflict("cost_acknowledgement_required", say_with(key, &[("again", &again)])))
        }
        RetryOutcome::RetryInProgress { id: live, status } => Err(retried_as(
            ApiError::conflict(
                "retry_in_progress",
                crate::domain::words::say_with(
                    "say.error_retry_live",
                    &[
                        ("id", &live),
                        ("status", &crate::domain::words::say(&format!("say.status_{}", status.as_str()))),
                    ],
                ),
            ),
            &live,
            status,
        )),
        RetryOutcome::AlreadyRetried { id: made, status } => {
            let t = load(&state, &id).await?;
            let cost = if t.charge.state.may_cost() { ", which may be charged again" } else { "" };
            Err(retried_as(
                ApiError::conflict(
                    "already_retried",
                    format!(
                        "this task was already retried as task {made} ({status}). Retrying it again makes another new \
                         task{cost}; to do it anyway, name that retry: send {{\"acknowledge_retried_as\": \"{made}\"}}."
                    ),
                ),
                &made,
                status,
            ))
        }
        RetryOutcome::NotRetryable(s) => Err(ApiError::conflict(
            "not_retryable",
            crate::domain::words::say_with(
                "say.error_not_retryable",
                &[("status", &crate::domain::words::say(&format!("say.status_{}", s.as_str())))],
            ),
        )),
        RetryOutcome::NotFound => Err(ApiError::not_found("task")),
    }
}

fn retried_as(mut e: ApiError, id: &str, status: TaskStatus) -> ApiError {
    e.retried_as = Some(json!({ "id": id, "status": status }));
    e
}

/// How an operator resolves an `unknown` task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum ResolveAs {
    Succeeded,
    Failed,
}

/// What the provider's dashboard shows about the charge, recorded with a resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResolveCharge {
    /// The dashboard shows a charge: the task's unproven requests become `charged`.
    Charged,
    /// The dashboard shows no charge: they become `none`.
    NotCharged,
    /// Not known (the default): the evidence's charge stays.
    Unknown,
}

/// `POST /v1/tasks/{id}/resolve` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ResolveBody {
    pub outcome: ResolveAs,
    /// What the provider's dashboard shows about the charge; the task's `charge`, Spend and
    /// the CSV then follow this record and say it was recorded by hand.
    pub charge: Option<ResolveCharge>,
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
        return Err(ApiError::invalid(crate::domain::words::say_with(
            "say.error_note_long",
            &[("n", &MAX_NOTE_BYTES.to_string())],
        )));
    }
    let image = match (body.outcome, body.image_base64) {
        (ResolveAs::Succeeded, None) => {
            return Err(ApiError::invalid(say("say.error_resolve_needs_image")));
        }
        (ResolveAs::Failed, Some(_)) => {
            return Err(ApiError::invalid("an image only goes with outcome \"succeeded\""));
        }
        (ResolveAs::Failed, None) => None,
        (ResolveAs::Succeeded, Some(b64)) => {
            let bytes = BASE64_STANDARD
                .decode(b64.trim())
                .map_err(|e| ApiError::invalid(format!("image_base64 is not valid base64: {e}")))?;
            let media_type = sniff_image(&bytes).ok_or_else(|| ApiError::invalid(say("say.error_image_type")))?;
            Some(Image { bytes, media_type: media_type.into() })
        }
    };
    // Check first, for a clear answer before the image is verified and sent to the writer.
    let t = load(&state, &id).await?;
    if t.status != TaskStatus::Unknown {
        return Err(not_unknown(t.status));
    }
    let owner = match body.charge {
        None | Some(ResolveCharge::Unknown) => OwnerCharge::Unknown,
        Some(ResolveCharge::Charged) => OwnerCharge::Charged,
        Some(ResolveCharge::NotCharged) => OwnerCharge::NotCharged,
    };
    match state.engine().resolve(&id, image, owner, &note).await? {
        ResolveOutcome::Resolved => task_response(&state, StatusCode::OK, &id).await,
        ResolveOutcome::NotUnknown(s) => Err(not_unknown(s)),
        ResolveOutcome::NotFound => Err(ApiError::not_found("task")),
    }
}

fn not_unknown(s: TaskStatus) -> ApiError {
    ApiError::conflict(
        "not_unknown",
        crate::domain::words::say_with(
            "say.error_not_unknown",
            &[("status", &crate::domain::words::say(&format!("say.status_{}", s.as_str())))],
        ),
    )
}
