//! The mock's Black Forest Labs FLUX API under `/bfl` (so `base_url =
//! "http://127.0.0.1:PORT/bfl"`), written from docs.bfl.ai (getting started, errors,
//! integration guidelines); BFL publishes no official client, so `tests/sdk/contract.py`
//! checks these shapes over plain HTTP:
//!
//! - `POST /bfl/v1/{model}` (key in `x-key`): `{id, polling_url, cost, input_mp, output_mp}`
//!   before the work, the `polling_url` pointing back at this mock. An unknown model is 404;
//!   a missing prompt or a bad width/height 422 (a `detail` list, as FastAPI answers); more
//!   active tasks than BFL allows (24, 6 for `flux-kontext-max`) 429, not charged.
//! - `GET /bfl/v1/get_result?id=`: `Pending` while the job runs, then `Ready` with
//!   `result.sample` (a delivery URL signed for 10 minutes), `start_time`, `end_time`;
//!   `Error` with `details` (behaviour `job_error`); `Request Moderated` / `Content
//!   Moderated` (behaviour `moderation`, not charged: BFL charges only `Ready`
//!   generations); `Task not found` for an unknown id or once `result_ttl_s` has passed.
//! - `GET /bfl/delivery/{id}.png`: the image, no key needed; 403 once the 10 minutes of its
//!   signature are over (or `result_ttl_s`, if shorter); `result_fetch_failures` blips it.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::serve::{ApiRequest, IMAGE_SIZE, NewJob, new_job, serve};
use super::{Answer, Api, Job, Mock, Phase, Scope, error, lock};
use crate::render::placeholder_png;

/// The endpoints the mock serves (BFL's documented image models).
const MODELS: &[&str] = &[
    "flux-pro-1.1",
    "flux-pro-1.1-ultra",
    "flux-pro",
    "flux-dev",
    "flux-kontext-pro",
    "flux-kontext-max",
    "flux-pro-1.0-fill",
    "flux-2-pro",
    "flux-2-max",
    "flux-2-flex",
    "flux-2-klein-4b",
    "flux-2-klein-9b",
];

/// How long BFL signs a delivery URL for.
const SIGNED_FOR: Duration = Duration::from_secs(600);

fn detail(status: StatusCode, detail: Value) -> Answer {
    Answer::ok(json!({"detail": detail})).with_status(status)
}

fn unix(t: std::time::SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// How many `input_image*` fields a create carries.
fn count_images(input: &Value) -> usize {
    input.as_object().map_or(0, |o| {
        o.iter().filter(|(k, v)| k.starts_with("input_image") && v.as_str().is_some_and(|s| !s.is_empty())).count()
    })
}

/// Width/height checks of the models that take them (multiples of 32, 256–1440).
fn check_dimensions(input: &Value) -> Result<(), Answer> {
    for key in ["width", "height"] {
        if let Some(v) = input.get(key) {
            let ok = v.as_u64().is_some_and(|n| (256..=1440).contains(&n) && n % 32 == 0);
            if !ok {
                return Err(detail(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!([{"loc": ["body", key], "msg": "Input should be a multiple of 32 between 256 and 1440", "type": "value_error", "input": v}]),
                ));
            }
        }
    }
    Ok(())
}

/// `POST /bfl/v1/{model}`: start a generation (charged unless moderated).
pub(super) async fn create(
    State(mock): State<Arc<Mock>>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let input: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut req = ApiRequest::new(Api::Bfl, "POST /bfl/v1/{model}", Scope::Create, &headers);
    req.prompt = input.get("prompt").and_then(Value::as_str).map(str::to_string);
    req.reference_images = count_images(&input);
    if !MODELS.contains(&model.as_str()) {
        return error(StatusCode::NOT_FOUND, "Not Found", "not_found");
    }
    let prompt = req.prompt.clone();
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| {
            let Some(p) = prompt.filter(|p| !p.is_empty()) else {
                return detail(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!([{"loc": ["body", "prompt"], "msg": "Field required", "type": "missing"}]),
                );
            };
            if let Err(a) = check_dimensions(&input) {
                return a;
            }
            let limit = if model == "flux-kontext-max" { 6 } else { 24 };
            let active = jobs.by_id.values().filter(|j| j.api == Api::Bfl && !j.finished()).count();
            if active >= limit {
                return detail(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("You have reached the maximum of {limit} active tasks. Wait until one finishes.").into(),
                );
            }
            let stored = json!({"moderation": b.moderation, "input_images": count_images(&input)});
            let id =
                new_job(jobs, NewJob { api: Api::Bfl, model: &model, version: None, prompt: &p, input: stored }, b);
            let body = json!({
                "id": id,
                "polling_url": format!("{base}/bfl/v1/get_result?id={id}"),
                "cost": 4.0,
                "input_mp": 0.0,
                "output_mp": 1.05,
            });
            // BFL charges only generations that end Ready; a moderated one costs nothing.
            if b.moderation.is_some() {
                Answer { job_id: Some(id), ..Answer::ok(body) }
            } else {
                Answer::charged(body, id)
            }
        }),
    )
    .await
}

/// The `id` query of `get_result`.
#[derive(Deserialize)]
pub(super) struct ResultQuery {
    id: Option<String>,
}

fn result_body(job: &Job, base: &str) -> Value {
    let moderation = job.input.get("moderation").and_then(Value::as_str);
    let mut body =
        json!({"id": job.id, "status": "Pending", "result": null, "progress": null, "details": null, "preview": null});
    match job.phase() {
        Phase::Queued => {}
        Phase::Running if moderation == Some("prompt") => body["status"] = "Request Moderated".into(),
        Phase::Running => body["progress"] = 0.5.into(),
        Phase::Done | Phase::Canceled => match (moderation, &job.error) {
            (Some("prompt"), _) => {
                body["status"] = "Request Moderated".into();
                body["details"] = json!({"Moderation Reasons": ["Derivative Works"]});
            }
            (Some(_), _) => {
                body["status"] = "Content Moderated".into();
                body["details"] = json!({"Moderation Reasons": ["NSFW"]});
            }
            (None, Some(e)) => {
                body["status"] = "Error".into();
                body["details"] = e.clone().into();
            }
            (None, None) => {
                let end = job.completed_at().unwrap_or(job.created);
                let expires = unix(end) + SIGNED_FOR.as_secs_f64();
                body["status"] = "Ready".into();
                body["result"] = json!({
                    "sample": format!("{base}/bfl/delivery/{}.png?se={expires:.0}&sig=mock", job.id),
                    "prompt": job.prompt,
                    "seed": 42,
                    "start_time": job.started_at().map(unix),
                    "end_time": unix(end),
                    "duration": job.duration.as_secs_f64(),
                });
                body["progress"] = 1.0.into();
            }
        },
    }
    body
}

/// `GET /bfl/v1/get_result?id=`.
pub(super) async fn get_result(
    State(mock): State<Arc<Mock>>,
    Query(q): Query<ResultQuery>,
    headers: HeaderMap,
) -> Response {
    let id = q.id.unwrap_or_default();
    let mut req = ApiRequest::new(Api::Bfl, "GET /bfl/v1/get_result", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| match jobs.by_id.get(&id).filter(|j| j.api == Api::Bfl) {
            Some(job) if !(job.finished() && job.expired()) => Answer::ok(result_body(job, base)),
            _ => Answer::ok(json!({"id": id, "status": "Task not found", "result": null, "progress": null, "details": null, "preview": null})),
        }),
    )
    .await
}

/// `GET /bfl/delivery/{id}.png`: the signed result URL (no key), 403 once its signature ran out.
pub(super) async fn delivery(State(mock): State<Arc<Mock>>, Path(file): Path<String>) -> Response {
    let id = file.strip_suffix(".png").unwrap_or(&file);
    // A delivery blip (behaviour `result_fetch_failures`), as for `/files`.
    let blip = {
        let mut b = lock(&mock.behavior);
        (b.result_fetch_failures > 0).then(|| {
            b.result_fetch_failures -= 1;
            b.result_fetch_status
        })
    };
    if let Some(status) = blip {
        return (
            StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND),
            "the delivery host could not serve this file right now",
        )
            .into_response();
    }
    let prompt = {
        let jobs = lock(&mock.jobs);
        match jobs.by_id.get(id).filter(|j| j.api == Api::Bfl) {
            Some(job) if job.has_result() && job.input.get("moderation").is_none_or(Value::is_null) => {
                let signed = SIGNED_FOR.min(job.ttl);
                if job.started.elapsed() >= job.duration + signed {
                    return (StatusCode::FORBIDDEN, "AuthenticationFailed: Signed expiry time has passed")
                        .into_response();
                }
                job.prompt.clone()
            }
            _ => return (StatusCode::NOT_FOUND, "BlobNotFound").into_response(),
        }
    };
    ([(header::CONTENT_TYPE, "image/png")], placeholder_png(&prompt, IMAGE_SIZE)).into_response()
}
