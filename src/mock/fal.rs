//! The mock's fal queue API under `/fal`: submit to `POST /fal/{app}` (the app id with its
//! subpath, e.g. `fal-ai/flux/dev`), then status, result and cancel under
//! `/fal/{owner}/{alias}/requests/{id}` — **without** the subpath, as fal's queue docs say
//! and both official clients do. A status or result path that keeps the subpath is 404.
//!
//! Status answers have what fal-client's `_parse_status` reads: `queue_position` while
//! `IN_QUEUE`, `logs` (null unless `?logs=1`) while `IN_PROGRESS` and `COMPLETED`, `metrics`,
//! and `error`/`error_type` on a request that finished failed.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::serve::{ApiRequest, IMAGE_SIZE, NewJob, missing_prompt, new_job, serve};
use super::{Answer, Api, Job, Mock, Phase, Scope, error};

/// App namespaces whose ids have three parts before the subpath (fal-client `APP_NAMESPACES`).
const NAMESPACES: &[&str] = &["workflows", "comfy"];

/// The `{namespace/}owner/alias` part of an app id (the queue's request prefix).
fn app_prefix(app: &str) -> Option<String> {
    let parts: Vec<&str> = app.split('/').filter(|p| !p.is_empty()).collect();
    let n = if parts.first().is_some_and(|p| NAMESPACES.contains(p)) { 3 } else { 2 };
    (parts.len() >= n).then(|| parts[..n].join("/"))
}

fn urls(base: &str, job: &Job) -> (String, String, String) {
    let prefix = app_prefix(&job.model).unwrap_or_else(|| job.model.clone());
    let url = format!("{base}/fal/{prefix}/requests/{}", job.id);
    (format!("{url}/status"), url.clone(), format!("{url}/cancel"))
}

fn status_body(job: &Job, base: &str, with_logs: bool) -> Value {
    let (status_url, response_url, cancel_url) = urls(base, job);
    let logs = if with_logs {
        json!([{"message": "generating", "level": "INFO", "source": "user", "timestamp": super::serve::rfc3339(job.created)}])
    } else {
        Value::Null
    };
    let mut body = json!({
        "request_id": job.id,
        "response_url": response_url,
        "status_url": status_url,
        "cancel_url": cancel_url,
    });
    let failure = match job.phase() {
        Phase::Canceled => Some(("request was cancelled".to_string(), "request_cancelled")),
        Phase::Done => job.error.clone().map(|e| (e, "internal_error")),
        _ => None,
    };
    match job.phase() {
        Phase::Queued => {
            body["status"] = "IN_QUEUE".into();
            body["queue_position"] = 0.into();
        }
        Phase::Running => {
            body["status"] = "IN_PROGRESS".into();
            body["logs"] = logs;
        }
        Phase::Done | Phase::Canceled => {
            body["status"] = "COMPLETED".into();
            body["logs"] = logs;
            body["metrics"] = json!({"inference_time": job.duration.as_secs_f64() * 2.0 / 3.0});
            if let Some((message, kind)) = failure {
                body["error"] = message.into();
                body["error_type"] = kind.into();
            }
        }
    }
    body
}

/// Reference images in a submit body (any image URL field), for the ledger.
fn count_images(input: &Value) -> usize {
    let is_image = |v: &Value| v.as_str().is_some_and(|s| s.starts_with("data:") || s.starts_with("http"));
    input.as_object().map_or(0, |o| {
        o.iter()
            .filter(|(k, _)| *k != "prompt")
            .map(|(_, v)| match v {
                Value::Array(a) => a.iter().filter(|x| is_image(x)).count(),
                v if is_image(v) => 1,
                _ => 0,
            })
            .sum()
    })
}

/// fal's validation answer (FastAPI's shape: 422 with `detail` a list of `{loc, msg, type}`)
/// for an input out of its documented range; `num_inference_steps` takes 1 to 50 on the
/// FLUX models. Not charged.
fn validation_error(input: &Value) -> Option<Answer> {
    let steps = input.get("num_inference_steps")?;
    if steps.as_u64().is_some_and(|n| (1..=50).contains(&n)) {
        return None;
    }
    let detail = json!([{
        "loc": ["body", "num_inference_steps"],
        "msg": "Input should be less than or equal to 50 and greater than or equal to 1",
        "type": "value_error",
        "input": steps,
    }]);
    Some(Answer::ok(json!({"detail": detail})).with_status(StatusCode::UNPROCESSABLE_ENTITY))
}

/// `POST /fal/{app}`: queue a request (charged).
pub(super) async fn submit(
    State(mock): State<Arc<Mock>>,
    Path(app): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let input: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut req = ApiRequest::new(Api::FalQueue, "POST /fal/{model}", Scope::Create, &headers);
    req.prompt = input.get("prompt").and_then(Value::as_str).map(str::to_string);
    req.reference_images = count_images(&input);
    if app_prefix(&app).is_none() || app.contains("/requests/") {
        return error(StatusCode::NOT_FOUND, "no such app", "not_found");
    }
    let prompt = req.prompt.clone();
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| {
            let Some(p) = prompt else { return missing_prompt() };
            if let Some(invalid) = validation_error(&input) {
                return invalid;
            }
            let stored = match input {
                Value::Object(mut o) => {
                    // Keep references as a count, not their (large) bytes.
                    o.retain(|_, v| count_images(&json!({"x": v})) == 0);
                    Value::Object(o)
                }
                other => other,
            };
            let id =
                new_job(jobs, NewJob { api: Api::FalQueue, model: &app, version: None, prompt: &p, input: stored }, b);
            match jobs.by_id.get(&id) {
                Some(job) => Answer::charged(status_body(job, base, false), id),
                None => Answer::error(StatusCode::INTERNAL_SERVER_ERROR, "lost the job", "internal"),
            }
        }),
    )
    .await
}

/// Split `{prefix}/requests/{id}[/{action}]`; `None` unless `prefix` is a bare app prefix.
fn request_path(path: &str) -> Option<(String, String, Option<String>)> {
    let (prefix, rest) = path.split_once("/requests/")?;
    if app_prefix(prefix).as_deref() != Some(prefix.trim_matches('/')) {
        return None; // a model subpath before `/requests/`: fal says not to use it
    }
    let (id, action) = match rest.split_once('/') {
        Some((id, action)) => (id, Some(action.to_string())),
        None => (rest, None),
    };
    Some((prefix.trim_matches('/').to_string(), id.to_string(), action))
}

/// The `logs` query flag of a status request.
#[derive(Deserialize)]
pub(super) struct StatusQuery {
    logs: Option<String>,
}

fn not_found_route() -> Response {
    error(StatusCode::NOT_FOUND, "Not Found", "not_found")
}

/// `GET /fal/{owner}/{alias}/requests/{id}/status` and `GET …/requests/{id}` (the result).
pub(super) async fn get(
    State(mock): State<Arc<Mock>>,
    Path(path): Path<String>,
    Query(q): Query<StatusQuery>,
    headers: HeaderMap,
) -> Response {
    let Some((prefix, id, action)) = request_path(&path) else { return not_found_route() };
    let status = match action.as_deref() {
        Some("status") => true,
        None => false,
        Some(_) => return not_found_route(),
    };
    let with_logs = q.logs.as_deref().is_some_and(|l| l == "1" || l.eq_ignore_ascii_case("true"));
    let endpoint = if status { "GET /fal/{app}/requests/{id}/status" } else { "GET /fal/{app}/requests/{id}" };
    let mut req = ApiRequest::new(Api::FalQueue, endpoint, Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| {
            let found = jobs.by_id.get(&id).filter(|j| j.api == Api::FalQueue && app_prefix(&j.model) == Some(prefix.clone()));
            let Some(job) = found else {
                return Answer::ok(json!({"detail": "Request not found"})).with_status(StatusCode::NOT_FOUND);
            };
            if status {
                return Answer::ok(status_body(job, base, with_logs));
            }
            match job.phase() {
                Phase::Queued | Phase::Running => {
                    Answer::ok(json!({"detail": "Request is still in progress"})).with_status(StatusCode::BAD_REQUEST)
                }
                Phase::Canceled => Answer::ok(json!({"detail": "Request was cancelled", "error_type": "request_cancelled"}))
                    .with_status(StatusCode::BAD_REQUEST),
                Phase::Done => match &job.error {
                    Some(e) => Answer::ok(json!({"detail": e, "error_type": "internal_error"}))
                        .with_status(StatusCode::INTERNAL_SERVER_ERROR),
                    None if b.fal_result_not_retryable => {
                        let mut a = Answer::ok(json!({"detail": "Internal server error", "error_type": "internal_server_error"}))
                            .with_status(StatusCode::INTERNAL_SERVER_ERROR);
                        a.headers.push(("x-fal-retryable", "false".into()));
                        a
                    }
                    None if job.expired() => {
                        Answer::ok(json!({"detail": "Request result expired"})).with_status(StatusCode::NOT_FOUND)
                    }
                    None => Answer::ok(json!({
                        "images": [{"url": job.file_url(base), "content_type": "image/png", "width": IMAGE_SIZE, "height": IMAGE_SIZE}],
                        "timings": {"inference": job.duration.as_secs_f64() * 2.0 / 3.0},
                        "seed": 42,
                        "has_nsfw_concepts": [false],
                        "prompt": job.prompt,
                    })),
                },
            }
        }),
    )
    .await
}

/// `PUT /fal/{owner}/{alias}/requests/{id}/cancel`: 202 while not finished, else 400.
pub(super) async fn cancel(State(mock): State<Arc<Mock>>, Path(path): Path<String>, headers: HeaderMap) -> Response {
    let Some((prefix, id, Some(action))) = request_path(&path) else { return not_found_route() };
    if action != "cancel" {
        return not_found_route();
    }
    let mut req = ApiRequest::new(Api::FalQueue, "PUT /fal/{app}/requests/{id}/cancel", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, _| {
            let found = jobs
                .by_id
                .get_mut(&id)
                .filter(|j| j.api == Api::FalQueue && app_prefix(&j.model) == Some(prefix.clone()));
            let Some(job) = found else {
                return Answer::ok(json!({"detail": "Request not found"})).with_status(StatusCode::NOT_FOUND);
            };
            if job.finished() || job.canceled.is_some() {
                return Answer::ok(json!({"status": "ALREADY_COMPLETED"})).with_status(StatusCode::BAD_REQUEST);
            }
            job.canceled = Some(job.started.elapsed());
            Answer::ok(json!({"status": "CANCELLATION_REQUESTED"})).with_status(StatusCode::ACCEPTED)
        }),
    )
    .await
}
