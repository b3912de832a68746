//! The mock's Replicate API: creates by model (`POST /v1/models/{owner}/{name}/predictions`)
//! and by version (`POST /v1/predictions` with `version`), get, cancel, the listing (100 per
//! page, `created_after`/`created_before`), and the model and version GETs that carry the
//! `openapi_schema`.
//!
//! Predictions have the fields of replicate-python's `Prediction` (`version` is a version id
//! or `"hidden"`, never null; `urls.get/cancel/web`, `logs`, `metrics`, `data_removed`,
//! `started_at`, `completed_at`, `source`). After the retention time a prediction keeps its
//! status but `input` and `output` are removed (`output: null`, `data_removed: true`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::models::Model;
use super::serve::{ApiRequest, NewJob, new_job, not_found, rfc3339, serve};
use super::{Answer, Api, Job, Jobs, Mock, Phase, Scope};

/// Predictions per page of `GET /v1/predictions` (Replicate's page size).
const PAGE_SIZE: usize = 100;

fn prediction(job: &Job, base: &str) -> Value {
    let get = format!("{base}/v1/predictions/{}", job.id);
    let (owner, name) = job.model.split_once('/').unwrap_or((&job.model, ""));
    let phase = job.phase();
    let status = match phase {
        Phase::Queued => "starting",
        Phase::Running => "processing",
        Phase::Canceled => "canceled",
        Phase::Done if job.error.is_some() || job.failure_logs.is_some() => "failed",
        Phase::Done => "succeeded",
    };
    let removed = phase == Phase::Done && job.expired();
    let output = if status == "succeeded" && !removed {
        Model::get(owner, name).output(job.file_url(base))
    } else {
        Value::Null
    };
    let predict_time = job.completed_at().zip(job.started_at()).and_then(|(c, s)| c.duration_since(s).ok());
    json!({
        "id": job.id,
        "model": job.model,
        "version": job.version.clone().unwrap_or_else(|| "hidden".into()),
        "input": if removed { json!({}) } else { job.input.clone() },
        "logs": match (&job.failure_logs, removed || phase == Phase::Queued) {
            (_, true) => String::new(),
            (Some(logs), false) if status == "failed" => format!("Using seed: 42\n{logs}"),
            _ => "Using seed: 42\n".to_string(),
        },
        "output": output,
        "data_removed": removed,
        "error": if status == "failed" { job.error.clone().map(Value::String).unwrap_or(Value::Null) } else { Value::Null },
        "status": status,
        "source": "api",
        "created_at": rfc3339(job.created),
        "started_at": job.started_at().map(rfc3339),
        "completed_at": job.completed_at().map(rfc3339),
        "urls": {"get": get, "cancel": format!("{get}/cancel"), "web": format!("https://replicate.com/p/{}", job.id)},
        "metrics": match predict_time { Some(d) => json!({"predict_time": d.as_secs_f64()}), None => json!({}) },
    })
}

/// Check the input against the model's schema and charge a new prediction.
fn create(
    jobs: &mut Jobs,
    b: &super::Behavior,
    base: &str,
    model: Model,
    version: Option<String>,
    input: &Value,
) -> Answer {
    let (stored, _) = match model.check_input(input, b.unknown_inputs == "strip", base) {
        Ok(checked) => checked,
        Err(body) => return Answer::ok(body).with_status(StatusCode::UNPROCESSABLE_ENTITY),
    };
    let prompt = input.get("prompt").and_then(Value::as_str).unwrap_or_default().to_string();
    let full = model.full_name();
    let new = NewJob { api: Api::Replicate, model: &full, version, prompt: &prompt, input: stored };
    let id = new_job(jobs, new, b);
    match jobs.by_id.get(&id) {
        Some(job) => Answer::charged(prediction(job, base), id).with_status(StatusCode::CREATED),
        None => not_found("prediction"),
    }
}

fn body_json(body: &Bytes) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

/// Reference images in a create body, for the ledger.
fn count_images(input: &Value) -> usize {
    let is_data = |v: &Value| v.as_str().is_some_and(|s| s.starts_with("data:") || s.starts_with("http"));
    input.as_object().map_or(0, |o| {
        o.iter()
            .filter(|(k, _)| *k != "prompt")
            .map(|(_, v)| match v {
                Value::Array(a) => a.iter().filter(|x| is_data(x)).count(),
                v if is_data(v) => 1,
                _ => 0,
            })
            .sum()
    })
}

/// `POST /v1/models/{owner}/{name}/predictions`: official models answer `"version": "hidden"`.
pub(super) async fn create_official(
    State(mock): State<Arc<Mock>>,
    Path((owner, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let input = body_json(&body).get("input").cloned().unwrap_or(Value::Null);
    let mut req =
        ApiRequest::new(Api::Replicate, "POST /v1/models/{owner}/{name}/predictions", Scope::Create, &headers);
    req.prompt = input.get("prompt").and_then(Value::as_str).map(str::to_string);
    req.reference_images = count_images(&input);
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| {
            let model = Model::get(&owner, &name);
            let version = (!model.official).then(|| model.version.clone());
            jobs.remember(owner, name);
            create(jobs, b, base, model, version, &input)
        }),
    )
    .await
}

/// `POST /v1/predictions` with `version` (a version id).
pub(super) async fn create_version(State(mock): State<Arc<Mock>>, headers: HeaderMap, body: Bytes) -> Response {
    let body = body_json(&body);
    let input = body.get("input").cloned().unwrap_or(Value::Null);
    let version = body.get("version").and_then(Value::as_str).unwrap_or_default().to_string();
    let mut req = ApiRequest::new(Api::Replicate, "POST /v1/predictions", Scope::Create, &headers);
    req.prompt = input.get("prompt").and_then(Value::as_str).map(str::to_string);
    req.reference_images = count_images(&input);
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| match Model::by_version(&version, &jobs.known_models) {
            Some(model) => create(jobs, b, base, model, Some(version), &input),
            None => Answer::ok(
                json!({"title": "Invalid version", "detail": "Invalid version or not permitted", "status": 422}),
            )
            .with_status(StatusCode::UNPROCESSABLE_ENTITY),
        }),
    )
    .await
}

/// `GET /v1/predictions/{id}`.
pub(super) async fn get(State(mock): State<Arc<Mock>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let mut req = ApiRequest::new(Api::Replicate, "GET /v1/predictions/{id}", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| match jobs.by_id.get(&id).filter(|j| j.api == Api::Replicate) {
            Some(job) => Answer::ok(prediction(job, base)),
            None => not_found("prediction"),
        }),
    )
    .await
}

/// `POST /v1/predictions/{id}/cancel`: a prediction not finished yet becomes `canceled`.
pub(super) async fn cancel(State(mock): State<Arc<Mock>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let mut req = ApiRequest::new(Api::Replicate, "POST /v1/predictions/{id}/cancel", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| match jobs.by_id.get_mut(&id).filter(|j| j.api == Api::Replicate) {
            Some(job) => {
                if !job.finished() && job.canceled.is_none() {
                    job.canceled = Some(job.started.elapsed());
                }
                Answer::ok(prediction(job, base))
            }
            None => not_found("prediction"),
        }),
    )
    .await
}

/// The query of `GET /v1/predictions`.
#[derive(Deserialize)]
pub(super) struct ListQuery {
    cursor: Option<String>,
    created_after: Option<String>,
    created_before: Option<String>,
    source: Option<String>,
}

/// `GET /v1/predictions`: newest first, [`PAGE_SIZE`] per page, `next` while more remain,
/// filtered by `created_after`/`created_before` (RFC 3339) and `source`.
pub(super) async fn list(State(mock): State<Arc<Mock>>, Query(q): Query<ListQuery>, headers: HeaderMap) -> Response {
    let req = ApiRequest::new(Api::Replicate, "GET /v1/predictions", Scope::List, &headers);
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| {
            let time = |t: &Option<String>| t.as_deref().map(humantime::parse_rfc3339_weak);
            let (after, before) = match (time(&q.created_after), time(&q.created_before)) {
                (Some(Err(_)), _) | (_, Some(Err(_))) => {
                    return Answer::error(
                        StatusCode::BAD_REQUEST,
                        "created_after/created_before must be RFC 3339",
                        "invalid",
                    );
                }
                (a, b) => (a.and_then(Result::ok), b.and_then(Result::ok)),
            };
            let start = q.cursor.as_deref().map_or(Ok(0), str::parse::<usize>);
            let Ok(start) = start else {
                return Answer::error(StatusCode::BAD_REQUEST, "invalid cursor", "invalid_cursor");
            };
            let all: Vec<&Job> = jobs
                .order
                .iter()
                .rev()
                .filter_map(|id| jobs.by_id.get(id))
                .filter(|j| j.api == Api::Replicate)
                .filter(|_| q.source.as_deref().is_none_or(|s| s == "api"))
                .filter(|j| after.is_none_or(|t| j.created > t) && before.is_none_or(|t| j.created < t))
                .collect();
            let results: Vec<Value> = all.iter().skip(start).take(PAGE_SIZE).map(|j| prediction(j, base)).collect();
            let mut next_query = vec![format!("cursor={}", start + PAGE_SIZE)];
            for (k, v) in [("created_after", &q.created_after), ("created_before", &q.created_before)] {
                if let Some(v) = v {
                    next_query.push(format!("{k}={}", v.replace(':', "%3A").replace('+', "%2B")));
                }
            }
            let next =
                (start + PAGE_SIZE < all.len()).then(|| format!("{base}/v1/predictions?{}", next_query.join("&")));
            Answer::ok(json!({"previous": null, "next": next, "results": results}))
        }),
    )
    .await
}

/// `GET /v1/models/{owner}/{name}`: the model with its latest version and schema.
pub(super) async fn get_model(
    State(mock): State<Arc<Mock>>,
    Path((owner, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let req = ApiRequest::new(Api::Replicate, "GET /v1/models/{owner}/{name}", Scope::Meta, &headers);
    serve(
        mock,
        req,
        Box::new(move |jobs, _, _| {
            let model = Model::get(&owner, &name);
            let runs = jobs.by_id.values().filter(|j| j.model == model.full_name()).count();
            jobs.remember(owner, name);
            Answer::ok(model.model_json(runs))
        }),
    )
    .await
}

/// `GET /v1/models/{owner}/{name}/versions/{id}`.
pub(super) async fn get_version(
    State(mock): State<Arc<Mock>>,
    Path((owner, name, version)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let req = ApiRequest::new(Api::Replicate, "GET /v1/models/{owner}/{name}/versions/{id}", Scope::Meta, &headers);
    serve(
        mock,
        req,
        Box::new(move |jobs, _, _| {
            let model = Model::get(&owner, &name);
            if model.version != version {
                return not_found("version");
            }
            jobs.remember(owner, name);
            Answer::ok(model.version_json())
        }),
    )
    .await
}
