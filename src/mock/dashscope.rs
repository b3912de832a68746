//! The mock's DashScope (Alibaba Cloud Model Studio) image synthesis under `/dashscope`, so a
//! provider's `base_url` is `http://<addr>/dashscope` (the official SDK's
//! `base_http_api_url` is that plus `/api/v1`). Written from the documentation and the
//! official SDKs' types (dashscope 2.0.2 for Python, dashscope-sdk-java):
//!
//! - `POST /api/v1/services/aigc/{text2image|image2image}/image-synthesis` needs
//!   `X-DashScope-Async: enable` (else 403 `AccessDenied`, as the service refuses
//!   synchronous calls) and answers `{request_id, output: {task_id, task_status: PENDING}}`
//!   before any work. Editing models (`…i2i…`: `input.images`, 1 to 3; `…imageedit`:
//!   `input.base_image_url` and `input.function`) are served on `image2image` only, the
//!   others on `text2image` only. The create is recorded `charged` only when its task will
//!   succeed: DashScope bills successful images only (a task made to fail with `job_error`
//!   is not charged; a task canceled while `PENDING` is not billed by DashScope either, but
//!   its create line stays as recorded).
//! - `GET /api/v1/tasks/{task_id}`: `PENDING` (the first third of `job_duration_ms`),
//!   `RUNNING`, then `SUCCEEDED` with `output.results[]` (`url`, `orig_prompt`,
//!   `actual_prompt`), `task_metrics` and `usage.image_count`, or `FAILED` with
//!   `code`/`message` (`job_error`; a leading `Code: ` becomes the code), or `CANCELED`.
//!   Times are `YYYY-MM-DD hh:mm:ss.mmm` in China Standard Time. A task id that is not
//!   known, or whose data was deleted after the retention, answers `UNKNOWN`.
//! - `GET /api/v1/tasks`: the batch query, newest first, filtered by `start_time`/`end_time`
//!   (`YYYYMMDDhhmmss`, read in China Standard Time, on the task's creation), `model_name`
//!   and `status`, paged by `page_no` (from 1) and `page_size` (1 to 100, default 10):
//!   `{request_id, data: [{task_id, status, model_name, gmt_create, start_time, end_time, …}],
//!   total, total_page, page_no, page_size}` (times in milliseconds; no prompt).
//! - `POST /api/v1/tasks/{task_id}/cancel`: only a `PENDING` task; else 400
//!   `UnsupportedOperation`.
//! - Retention: 24 hours for task data and result images, unless `result_ttl_s` was set to
//!   something other than its default (then that). Rate limit: the task queries (by id and
//!   listing) answer 429 `Throttling` beyond 20 per second, the documented 20 QPS per account.
//! - Errors are `{request_id, code, message}`: `InvalidApiKey` (401), `InvalidParameter`
//!   (400), `Throttling.RateQuota` (429, `retry_after_s`), `InternalError` (`fail_status`),
//!   and any code given as `error_code` with `reject_status` (`Arrearage`,
//!   `DataInspectionFailed`, …).
//!
//! The compatible-mode chat completions the `dashscope_chat` kind drafts with are here too
//! ([`chat`]), so the mock describes the provider once. Past 600 lines: both APIs and their tests.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::serve::{ApiRequest, NewJob, new_job, serve};
use super::{Answer, Api, Behavior, Job, Jobs, Mock, Phase, Scope};

/// How long DashScope keeps a task and its result images.
const RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Task queries allowed per second (per account: the whole mock).
const QUERIES_PER_SECOND: usize = 20;

/// The most tasks one listing page holds.
const MAX_PAGE_SIZE: usize = 100;

/// China Standard Time, the zone of the service's time strings and listing filters.
const CST: Duration = Duration::from_secs(8 * 3600);

/// Model families the mock serves (anything else is `Model not exist.`).
const MODEL_PREFIXES: &[&str] = &["wan", "qwen-image", "flux", "stable-diffusion"];

/// The recent task queries, for the rate limit.
#[derive(Default)]
pub(super) struct Queries(VecDeque<Instant>);

impl Queries {
    /// Count one query; `false` when it is over the rate limit.
    fn allow(&mut self) -> bool {
        let now = Instant::now();
        while self.0.front().is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1)) {
            self.0.pop_front();
        }
        if self.0.len() >= QUERIES_PER_SECOND {
            return false;
        }
        self.0.push_back(now);
        true
    }
}

/// The routes under `/dashscope`.
pub(super) fn routes() -> Router<Arc<Mock>> {
    Router::new()
        .route("/api/v1/services/aigc/{group}/{function}", post(create))
        .route("/api/v1/tasks", get(list))
        .route("/api/v1/tasks/{id}", get(task))
        .route("/api/v1/tasks/{id}/cancel", post(cancel))
        .route("/compatible-mode/v1/chat/completions", post(chat::completions))
}

fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn ds_error(status: StatusCode, code: &str, message: &str) -> Answer {
    Answer::ok(json!({"request_id": request_id(), "code": code, "message": message})).with_status(status)
}

fn invalid(message: &str) -> Answer {
    ds_error(StatusCode::BAD_REQUEST, "InvalidParameter", message)
}

/// The shared path's errors (credentials, `reject_status`, `retry_after_s`, `fail_status`)
/// in DashScope's shape and codes.
pub(super) fn error(status: StatusCode, message: &str, code: &str) -> Answer {
    let (code, message) = match code {
        "invalid_api_key" => ("InvalidApiKey", "Invalid API-key provided."),
        "rate_limit_exceeded" => ("Throttling.RateQuota", "Requests rate limit exceeded, please try again later."),
        "server_error" => ("InternalError", "An internal error has occured, please try again later."),
        "rejected" => match status.as_u16() {
            401 => ("InvalidApiKey", "Invalid API-key provided."),
            403 => ("AccessDenied", "Access denied."),
            404 => ("ModelNotFound", "Model not found."),
            429 => ("Throttling", "Requests throttling triggered."),
            _ => ("InvalidParameter", message),
        },
        "Arrearage" => ("Arrearage", "Access denied, please make sure your account is in good standing."),
        "DataInspectionFailed" => ("DataInspectionFailed", "Input data may contain inappropriate content."),
        other => (other, message),
    };
    ds_error(status, code, message)
}

/// `YYYY-MM-DD hh:mm:ss.mmm` in China Standard Time.
fn cst_text(t: SystemTime) -> String {
    let s = humantime::format_rfc3339_millis(t + CST).to_string();
    s.trim_end_matches('Z').replacen('T', " ", 1)
}

fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A `YYYYMMDDhhmmss` filter (China Standard Time) as a time.
fn parse_filter(text: &str) -> Option<SystemTime> {
    if text.len() != 14 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let iso =
        format!("{}-{}-{}T{}:{}:{}Z", &text[..4], &text[4..6], &text[6..8], &text[8..10], &text[10..12], &text[12..]);
    humantime::parse_rfc3339(&iso).ok().map(|t| t - CST)
}

/// Whether a task's data is gone (its retention passed).
fn gone(job: &Job) -> bool {
    job.expired() && matches!(job.phase(), Phase::Done | Phase::Canceled)
}

fn status(job: &Job) -> &'static str {
    match job.phase() {
        Phase::Queued => "PENDING",
        Phase::Running => "RUNNING",
        Phase::Canceled => "CANCELED",
        Phase::Done if job.error.is_some() => "FAILED",
        Phase::Done => "SUCCEEDED",
    }
}

/// How many images a task makes (`parameters.n`).
fn count(job: &Job) -> u64 {
    job.input.pointer("/parameters/n").and_then(Value::as_u64).unwrap_or(1)
}

/// The `Code: message` split of a `job_error`.
fn failure(text: &str) -> (String, String) {
    match text.split_once(": ") {
        Some((c, m)) if !c.is_empty() && c.chars().all(|c| c.is_ascii_alphanumeric() || c == '.') => {
            (c.to_string(), m.to_string())
        }
        _ => ("InternalError".into(), text.to_string()),
    }
}

/// `GET /api/v1/tasks/{id}`'s answer for a task.
fn task_json(job: &Job, base: &str) -> Value {
    let status = status(job);
    let mut output = json!({"task_id": job.id, "task_status": status, "submit_time": cst_text(job.created)});
    if let Some(t) = job.started_at() {
        output["scheduled_time"] = cst_text(t).into();
    }
    if let Some(t) = job.completed_at() {
        output["end_time"] = cst_text(t).into();
    }
    let n = count(job);
    let mut body = json!({"request_id": request_id(), "output": output});
    match status {
        "SUCCEEDED" => {
            let extend = job.input.pointer("/parameters/prompt_extend").and_then(Value::as_bool) != Some(false);
            let results: Vec<Value> = (0..n)
                .map(|i| {
                    let mut r = json!({"url": format!("{}?index={i}", job.file_url(base)), "orig_prompt": job.prompt});
                    if extend {
                        r["actual_prompt"] = format!("{}, high detail, studio lighting", job.prompt).into();
                    }
                    r
                })
                .collect();
            body["output"]["results"] = results.into();
            body["output"]["task_metrics"] = json!({"TOTAL": n, "SUCCEEDED": n, "FAILED": 0});
            body["usage"] = json!({"image_count": n});
        }
        "FAILED" => {
            let (code, message) = failure(job.error.as_deref().unwrap_or("failed"));
            body["output"]["code"] = code.into();
            body["output"]["message"] = message.into();
            body["output"]["task_metrics"] = json!({"TOTAL": n, "SUCCEEDED": 0, "FAILED": n});
        }
        _ => {}
    }
    body
}

/// One task as the batch query lists it.
fn listed(job: &Job) -> Value {
    let group = job.version.as_deref().unwrap_or("text2image");
    json!({
        "api_key_id": "mock-api-key-id",
        "caller_parent_id": "mock-account",
        "caller_uid": "mock-account",
        "end_time": job.completed_at().map(ms),
        "gmt_create": ms(job.created),
        "model_name": job.model,
        "region": "ap-southeast-1",
        "request_id": request_id(),
        "start_time": job.started_at().map(ms),
        "status": status(job),
        "task_id": job.id,
        "user_api_unique_key": format!("apikey:v1:aigc:{group}:image-synthesis:{}", job.model),
    })
}

/// Check a create against what the model takes; `Err` is the refusal.
fn check_create(group: &str, body: &Value) -> Result<(String, String, usize), Answer> {
    let model = body.get("model").and_then(Value::as_str).unwrap_or_default().to_string();
    if model.is_empty() {
        return Err(invalid("Model not exist."));
    }
    if !MODEL_PREFIXES.iter().any(|p| model.starts_with(p)) {
        return Err(invalid("Model not exist."));
    }
    let edits = model.contains("i2i") || model.contains("imageedit");
    let wanted = if edits { "image2image" } else { "text2image" };
    if group != wanted {
        return Err(invalid(&format!("Model {model} is not supported by the {group} service; use {wanted}.")));
    }
    let input = body.get("input").cloned().unwrap_or(Value::Null);
    let prompt = input.get("prompt").and_then(Value::as_str).unwrap_or_default().to_string();
    if prompt.trim().is_empty() {
        return Err(invalid("Field required: input.prompt"));
    }
    let images = if model.contains("imageedit") {
        if input.get("function").and_then(Value::as_str).is_none_or(str::is_empty) {
            return Err(invalid("Field required: input.function"));
        }
        match input.get("base_image_url").and_then(Value::as_str) {
            Some(u) if !u.is_empty() => 1,
            _ => return Err(invalid("Field required: input.base_image_url")),
        }
    } else if edits {
        match input.get("images").and_then(Value::as_array) {
            Some(a) if (1..=3).contains(&a.len()) && a.iter().all(|v| v.as_str().is_some_and(|s| !s.is_empty())) => {
                a.len()
            }
            _ => return Err(invalid("input.images must hold 1 to 3 image URLs or Base64 data")),
        }
    } else {
        0
    };
    let parameters = body.get("parameters").cloned().unwrap_or(json!({}));
    if let Some(n) = parameters.get("n")
        && !n.as_u64().is_some_and(|n| (1..=4).contains(&n))
    {
        return Err(invalid("parameters.n must be an integer from 1 to 4"));
    }
    if let Some(size) = parameters.get("size") {
        let ok = size.as_str().and_then(|s| s.split_once('*')).is_some_and(|(w, h)| {
            w.parse::<u32>().is_ok_and(|w| (256..=4096).contains(&w))
                && h.parse::<u32>().is_ok_and(|h| (256..=4096).contains(&h))
        });
        if !ok {
            return Err(invalid("parameters.size must be width*height, e.g. 1024*1024"));
        }
    }
    Ok((model, prompt, images))
}

/// `POST /api/v1/services/aigc/{group}/image-synthesis`: create a task (charged if it will
/// succeed).
async fn create(
    State(mock): State<Arc<Mock>>,
    Path((group, function)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut req = ApiRequest::new(
        Api::DashScope,
        "POST /dashscope/api/v1/services/aigc/{task}/image-synthesis",
        Scope::Create,
        &headers,
    );
    req.prompt = parsed.pointer("/input/prompt").and_then(Value::as_str).map(str::to_string);
    req.reference_images = parsed
        .pointer("/input/images")
        .and_then(Value::as_array)
        .map(Vec::len)
        .unwrap_or_else(|| usize::from(parsed.pointer("/input/base_image_url").is_some()));
    let asynchronous = headers.get("x-dashscope-async").and_then(|v| v.to_str().ok()) == Some("enable");
    serve(
        mock,
        req,
        Box::new(move |jobs, b, _| {
            if !matches!(group.as_str(), "text2image" | "image2image") || function != "image-synthesis" {
                return ds_error(StatusCode::NOT_FOUND, "NotFound", "Not Found");
            }
            if !asynchronous {
                return ds_error(
                    StatusCode::FORBIDDEN,
                    "AccessDenied",
                    "current user api does not support synchronous calls",
                );
            }
            let (model, prompt, _) = match check_create(&group, &parsed) {
                Ok(ok) => ok,
                Err(refused) => return refused,
            };
            let stored = json!({
                "input": {"prompt": prompt, "negative_prompt": parsed.pointer("/input/negative_prompt")},
                "parameters": parsed.get("parameters").cloned().unwrap_or(json!({})),
            });
            let new = NewJob {
                api: Api::DashScope,
                model: &model,
                version: Some(group.clone()),
                prompt: &prompt,
                input: stored,
            };
            let id = new_job(jobs, new, b);
            let Some(job) = jobs.by_id.get_mut(&id) else {
                return ds_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "lost the task");
            };
            if b.result_ttl_s == Behavior::default().result_ttl_s {
                job.ttl = RETENTION;
            }
            let will_succeed = job.error.is_none();
            let body = json!({"request_id": request_id(), "output": {"task_id": id, "task_status": "PENDING"}});
            Answer { charged: will_succeed, job_id: Some(id), ..Answer::ok(body) }
        }),
    )
    .await
}

/// The documented task-query rate limit, counted for every task query.
fn throttled(jobs: &mut Jobs) -> Option<Answer> {
    (!jobs.dashscope_queries.allow())
        .then(|| ds_error(StatusCode::TOO_MANY_REQUESTS, "Throttling", "Requests throttling triggered."))
}

/// `GET /api/v1/tasks/{id}`.
async fn task(State(mock): State<Arc<Mock>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let mut req = ApiRequest::new(Api::DashScope, "GET /dashscope/api/v1/tasks/{task_id}", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| {
            if let Some(t) = throttled(jobs) {
                return t;
            }
            match jobs.by_id.get(&id).filter(|j| j.api == Api::DashScope && !gone(j)) {
                Some(job) => Answer::ok(task_json(job, base)),
                None => {
                    Answer::ok(json!({"request_id": request_id(), "output": {"task_id": id, "task_status": "UNKNOWN"}}))
                }
            }
        }),
    )
    .await
}

/// `POST /api/v1/tasks/{id}/cancel`: a `PENDING` task becomes `CANCELED`.
async fn cancel(State(mock): State<Arc<Mock>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let mut req =
        ApiRequest::new(Api::DashScope, "POST /dashscope/api/v1/tasks/{task_id}/cancel", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, _| match jobs.by_id.get_mut(&id).filter(|j| j.api == Api::DashScope) {
            Some(job) if job.phase() == Phase::Queued && job.canceled.is_none() => {
                job.canceled = Some(job.started.elapsed());
                Answer::ok(json!({"request_id": request_id()}))
            }
            _ => ds_error(
                StatusCode::BAD_REQUEST,
                "UnsupportedOperation",
                "Failed to cancel the task, please confirm if the task is in PENDING status.",
            ),
        }),
    )
    .await
}

/// The query of `GET /api/v1/tasks`.
#[derive(Deserialize)]
struct ListQuery {
    start_time: Option<String>,
    end_time: Option<String>,
    model_name: Option<String>,
    status: Option<String>,
    page_no: Option<String>,
    page_size: Option<String>,
}

/// `GET /api/v1/tasks`: the batch task query.
async fn list(State(mock): State<Arc<Mock>>, Query(q): Query<ListQuery>, headers: HeaderMap) -> Response {
    let req = ApiRequest::new(Api::DashScope, "GET /dashscope/api/v1/tasks", Scope::List, &headers);
    serve(
        mock,
        req,
        Box::new(move |jobs, _, _| {
            if let Some(t) = throttled(jobs) {
                return t;
            }
            let time = |t: &Option<String>| t.as_deref().map(parse_filter);
            let (start, end) = match (time(&q.start_time), time(&q.end_time)) {
                (Some(None), _) | (_, Some(None)) => {
                    return invalid("start_time and end_time must be yyyyMMddHHmmss");
                }
                (s, e) => (s.flatten(), e.flatten().map(|e| e + Duration::from_millis(999))),
            };
            let number = |v: &Option<String>, default: usize| v.as_deref().map_or(Some(default), |s| s.parse().ok());
            let (Some(page_no), Some(page_size)) = (number(&q.page_no, 1), number(&q.page_size, 10)) else {
                return invalid("page_no and page_size must be integers");
            };
            if page_no == 0 || !(1..=MAX_PAGE_SIZE).contains(&page_size) {
                return invalid("page_no must be at least 1 and page_size from 1 to 100");
            }
            const STATUSES: &[&str] = &["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELED"];
            if let Some(s) = q.status.as_deref().filter(|s| !STATUSES.contains(s)) {
                return invalid(&format!("status {s} is not one of PENDING, RUNNING, SUCCEEDED, FAILED, CANCELED"));
            }
            let all: Vec<&Job> = jobs
                .order
                .iter()
                .rev()
                .filter_map(|id| jobs.by_id.get(id))
                .filter(|j| j.api == Api::DashScope && !gone(j))
                .filter(|j| start.is_none_or(|t| j.created >= t) && end.is_none_or(|t| j.created <= t))
                .filter(|j| q.model_name.as_deref().is_none_or(|m| m == j.model))
                .filter(|j| q.status.as_deref().is_none_or(|s| s == status(j)))
                .collect();
            let data: Vec<Value> =
                all.iter().skip((page_no - 1) * page_size).take(page_size).map(|j| listed(j)).collect();
            Answer::ok(json!({
                "request_id": request_id(),
                "data": data,
                "total": all.len(),
                "total_page": all.len().div_ceil(page_size),
                "page_no": page_no,
                "page_size": page_size,
            }))
        }),
    )
    .await
}

/// The mock's DashScope OpenAI-compatible chat completions (the `dashscope_chat` kind's
/// drafting calls with Qwen-VL), under `/dashscope/compatible-mode/v1/chat/completions`, from
/// Alibaba Cloud Model Studio's "OpenAI compatible" pages and openai-python's
/// `chat.completions` types: `model` and `messages` required, unknown parameters refused,
/// `response_format` of type `json_schema` needs `json_schema.name` and `json_schema.schema`.
/// Synchronous and charged: the answer is the completion (`choices[0].message.content`, a
/// draft made like the Responses mock's) with `usage` (`prompt_tokens`, `completion_tokens`).
/// There is nothing to look a completion up by.
mod chat {
    use std::sync::Arc;
    use std::time::{SystemTime, UNIX_EPOCH};

    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::Response;
    use serde_json::{Value, json};

    use super::super::responses::{draft_text, read_input, usage_of};
    use super::super::serve::{ApiRequest, NewJob, new_job, serve};
    use super::super::{Answer, Api, Mock, Scope};

    /// Body parameters the compatible mode takes for chat (a subset of OpenAI's).
    const PARAMS: &[&str] = &[
        "model",
        "messages",
        "response_format",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stream",
        "stream_options",
        "seed",
        "stop",
        "tools",
        "tool_choice",
        "n",
        "presence_penalty",
        "enable_thinking",
        "vl_high_resolution_images",
    ];

    fn bad(message: &str) -> Answer {
        Answer::error(StatusCode::BAD_REQUEST, message, "invalid_parameter_error")
    }

    /// `POST /dashscope/compatible-mode/v1/chat/completions` (charged).
    pub(super) async fn completions(State(mock): State<Arc<Mock>>, headers: HeaderMap, body: Bytes) -> Response {
        let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut req =
            ApiRequest::new(Api::DashscopeChat, "POST /compatible-mode/v1/chat/completions", Scope::Create, &headers);
        let (prompt, images) = read_input(parsed.get("messages").unwrap_or(&Value::Null));
        req.prompt = Some(prompt.clone());
        req.reference_images = images;
        serve(
            mock,
            req,
            Box::new(move |jobs, b, _| {
                let Value::Object(body) = parsed else { return bad("The request body is not valid JSON.") };
                if let Some(k) = body.keys().find(|k| !PARAMS.contains(&k.as_str())) {
                    return bad(&format!("Unrecognized request argument supplied: {k}"));
                }
                let Some(model) = body.get("model").and_then(Value::as_str).map(str::to_string) else {
                    return bad("Missing required parameter: 'model'.");
                };
                if !body.get("messages").is_some_and(Value::is_array) {
                    return bad("Missing required parameter: 'messages'.");
                }
                if let Some(f) = body.get("response_format")
                    && f.get("type").and_then(Value::as_str) == Some("json_schema")
                    && (f.pointer("/json_schema/name").and_then(Value::as_str).is_none()
                        || !f.pointer("/json_schema/schema").is_some_and(Value::is_object))
                {
                    return bad("response_format.json_schema needs a name and a schema.");
                }
                let key = new_job(
                    jobs,
                    NewJob { api: Api::DashscopeChat, model: &model, version: None, prompt: &prompt, input: json!({}) },
                    b,
                );
                let text = b.draft_answer.clone().unwrap_or_else(|| draft_text(&prompt));
                let (prompt_tokens, completion_tokens) = usage_of(&prompt, images, &text);
                let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
                let answer = json!({
                    "id": format!("chatcmpl-{key}"), "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                              "total_tokens": prompt_tokens + completion_tokens},
                    "system_fingerprint": null,
                });
                Answer::charged(answer, key)
            }),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_read_china_standard_time() {
        let t = parse_filter("20261201180000").unwrap();
        assert_eq!(ms(t), 1_796_119_200_000);
        assert!(parse_filter("2026-12-01").is_none());
        assert_eq!(cst_text(t), "2026-12-01 18:00:00.000");
    }

    #[test]
    fn job_errors_carry_their_code() {
        assert_eq!(failure("DataInspectionFailed: nope"), ("DataInspectionFailed".into(), "nope".into()));
        assert_eq!(failure("model crashed"), ("InternalError".into(), "model crashed".into()));
    }

    #[test]
    fn task_queries_are_limited_per_second() {
        let mut q = Queries::default();
        assert!((0..QUERIES_PER_SECOND).all(|_| q.allow()));
        assert!(!q.allow());
    }
}
