//! The mock's API handlers for the three styles, and the one path every API request takes:
//! check credentials and the configured failures, do the work, write the ledger line, wait
//! the configured latency, then answer (or drop the connection).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::ledger::Entry;
use super::{Answer, Api, Behavior, Job, Jobs, Mock, Scope, error, lock};
use crate::render::placeholder_png;

/// Side of the square PNG the mock renders.
const IMAGE_SIZE: u32 = 64;

/// Predictions per page of `GET /v1/predictions`.
const PAGE_SIZE: usize = 10;

/// What the shared path needs to know about one API request.
struct ApiRequest {
    api: Api,
    endpoint: &'static str,
    scope: Scope,
    /// Creates only.
    prompt: Option<String>,
    idempotency_key: Option<String>,
    /// The job a poll asks about.
    job_id: Option<String>,
    reference_images: usize,
    authorized: bool,
    /// `http://<Host>`, to build URLs in answers.
    base: String,
}

impl ApiRequest {
    fn new(api: Api, endpoint: &'static str, scope: Scope, headers: &HeaderMap) -> Self {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        ApiRequest {
            api,
            endpoint,
            scope,
            prompt: None,
            idempotency_key: text("idempotency-key"),
            job_id: None,
            reference_images: 0,
            authorized: text("authorization").is_some_and(|a| !a.trim().is_empty()),
            base: format!("http://{}", text("host").unwrap_or_else(|| "127.0.0.1".into())),
        }
    }
}

/// The work of one request once credentials and failures are checked: may create jobs.
type Work = Box<dyn FnOnce(&mut Jobs, &Behavior, &str) -> Answer + Send>;

/// Answer one API request (see the module doc for the order of steps).
async fn serve(mock: Arc<Mock>, req: ApiRequest, work: Work) -> Response {
    let behavior = mock.behavior();
    let scope = req.scope;
    // The work and the ledger line run in their own task, so a client that gives up does
    // not stop a generation that has started — as with a real provider.
    let task = {
        let (mock, behavior) = (mock.clone(), behavior.clone());
        tokio::spawn(async move {
            let answer = decide(&mock, &req, &behavior, work);
            let entry = Entry {
                ts: Entry::now(),
                api: req.api.as_str(),
                endpoint: req.endpoint,
                prompt: req.prompt.as_deref().filter(|_| req.scope == Scope::Create),
                idempotency_key: req.idempotency_key.as_deref(),
                job_id: answer.job_id.as_deref().or(req.job_id.as_deref()),
                charged: answer.charged,
                reference_images: req.reference_images,
            };
            if let Err(e) = mock.ledger.append(&entry).await {
                tracing::error!(error = %e, "mock provider cannot write its ledger");
                return Answer::error(StatusCode::INTERNAL_SERVER_ERROR, "ledger write failed", "ledger");
            }
            answer
        })
    };
    let answer = task
        .await
        .unwrap_or_else(|_| Answer::error(StatusCode::INTERNAL_SERVER_ERROR, "mock handler failed", "internal"));
    if behavior.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(behavior.latency_ms)).await;
    }
    if behavior.drops(scope) {
        // Close the connection without an answer: unwinding ends this connection's task
        // (hyper drops the socket) without running the panic hook, so nothing is printed.
        std::panic::resume_unwind(Box::new(()));
    }
    answer.into_response()
}

/// Credentials, configured failures, idempotent replays, then the work itself.
fn decide(mock: &Mock, req: &ApiRequest, b: &Behavior, work: Work) -> Answer {
    if !req.authorized {
        return Answer::error(StatusCode::UNAUTHORIZED, "missing Authorization header", "invalid_api_key");
    }
    let create = req.scope == Scope::Create;
    if create {
        if let Some(s) = b.reject_status {
            let status = StatusCode::from_u16(s).unwrap_or(StatusCode::BAD_REQUEST);
            return Answer::error(status, "the mock rejects this request (reject_status)", "rejected");
        }
        if let Some(after) = b.retry_after_s {
            let mut a = Answer::error(StatusCode::TOO_MANY_REQUESTS, "rate limited by the mock", "rate_limit_exceeded");
            a.retry_after = Some(after);
            return a;
        }
        if let Some(s) = b.fail_status {
            let status = StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return Answer::error(status, "the mock failed (fail_status)", "server_error");
        }
    }
    let mut jobs = lock(&mock.jobs);
    let replay_key = req.idempotency_key.clone().filter(|_| create).map(|k| (req.api.as_str(), k));
    if let Some(original) = replay_key.as_ref().and_then(|key| jobs.replays.get(key)) {
        return Answer { charged: false, ..original.clone() };
    }
    let answer = work(&mut jobs, b, &req.base);
    if let Some(key) = replay_key.filter(|_| answer.charged) {
        jobs.replays.insert(key, answer.clone());
    }
    answer
}

/// Record a new charged generation.
fn new_job(
    jobs: &mut Jobs,
    api: Api,
    model: &str,
    prompt: &str,
    input: Value,
    duration: Duration,
    b: &Behavior,
) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let job = Job {
        id: id.clone(),
        api,
        model: model.to_string(),
        prompt: prompt.to_string(),
        input,
        created: SystemTime::now(),
        started: Instant::now(),
        duration,
        ttl: Duration::from_secs(b.result_ttl_s),
    };
    jobs.by_id.insert(id.clone(), job);
    jobs.order.push(id.clone());
    id
}

fn missing_prompt() -> Answer {
    Answer::error(StatusCode::BAD_REQUEST, "`prompt` is required", "invalid_prompt")
}

fn not_found(what: &str) -> Answer {
    Answer::error(StatusCode::NOT_FOUND, &format!("{what} not found"), "not_found")
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

// ----- OpenAI images -----

fn openai_answer(jobs: &mut Jobs, b: &Behavior, base: &str, prompt: &str, as_url: bool) -> Answer {
    let id = new_job(jobs, Api::OpenaiImages, "", prompt, Value::Null, Duration::ZERO, b);
    let item = if as_url {
        json!({"url": format!("{base}/files/{id}.png")})
    } else {
        json!({"b64_json": base64::engine::general_purpose::STANDARD.encode(placeholder_png(prompt, IMAGE_SIZE))})
    };
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    Answer::charged(json!({"created": created, "data": [item]}), id)
}

/// `POST /v1/images/generations`.
pub(super) async fn openai_generations(State(mock): State<Arc<Mock>>, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut req = ApiRequest::new(Api::OpenaiImages, "POST /v1/images/generations", Scope::Create, &headers);
    req.prompt = body.get("prompt").and_then(Value::as_str).map(str::to_string);
    let prompt = req.prompt.clone();
    let as_url = body.get("response_format").and_then(Value::as_str) == Some("url");
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| match prompt {
            Some(p) => openai_answer(jobs, b, base, &p, as_url),
            None => missing_prompt(),
        }),
    )
    .await
}

/// `POST /v1/images/edits` (multipart: `prompt`, one `image[]` part per reference).
pub(super) async fn openai_edits(State(mock): State<Arc<Mock>>, headers: HeaderMap, mut form: Multipart) -> Response {
    let mut req = ApiRequest::new(Api::OpenaiImages, "POST /v1/images/edits", Scope::Create, &headers);
    let mut as_url = false;
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("malformed multipart body: {e}"), "invalid_body"),
        };
        let name = field.name().unwrap_or_default().to_string();
        let Ok(data) = field.bytes().await else {
            return error(StatusCode::BAD_REQUEST, "malformed multipart field", "invalid_body");
        };
        match name.as_str() {
            "prompt" => req.prompt = Some(String::from_utf8_lossy(&data).into_owned()),
            "image" | "image[]" => req.reference_images += 1,
            "response_format" => as_url = &data[..] == b"url",
            _ => {}
        }
    }
    let (prompt, references) = (req.prompt.clone(), req.reference_images);
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| match prompt {
            Some(_) if references == 0 => {
                Answer::error(StatusCode::BAD_REQUEST, "at least one `image[]` is required", "invalid_image")
            }
            Some(p) => openai_answer(jobs, b, base, &p, as_url),
            None => missing_prompt(),
        }),
    )
    .await
}

// ----- Replicate -----

fn prediction(job: &Job, base: &str, status: Option<&str>) -> Value {
    let done = job.finished();
    let status = status.unwrap_or(if done { "succeeded" } else { "processing" });
    let get = format!("{base}/v1/predictions/{}", job.id);
    json!({
        "id": job.id,
        "model": job.model,
        "version": null,
        "input": job.input,
        "status": status,
        "output": if status == "succeeded" { json!([job.file_url(base)]) } else { Value::Null },
        "error": null,
        "created_at": rfc3339(job.created),
        "urls": {"get": get, "cancel": format!("{get}/cancel")},
    })
}

/// `POST /v1/models/{owner}/{name}/predictions`.
pub(super) async fn replicate_create(
    State(mock): State<Arc<Mock>>,
    Path((owner, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut input = body.get("input").cloned().unwrap_or(Value::Null);
    let mut req =
        ApiRequest::new(Api::Replicate, "POST /v1/models/{owner}/{name}/predictions", Scope::Create, &headers);
    req.prompt = input.get("prompt").and_then(Value::as_str).map(str::to_string);
    if let Some(obj) = input.as_object_mut() {
        // Echo the input without the (large) images, as a count.
        if let Some(images) = obj.remove("input_images") {
            req.reference_images = images.as_array().map_or(0, Vec::len);
            obj.insert("input_images_count".into(), req.reference_images.into());
        }
    }
    let prompt = req.prompt.clone();
    let model = format!("{owner}/{name}");
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| {
            let Some(p) = prompt else { return missing_prompt() };
            let duration = Duration::from_millis(b.job_duration_ms);
            let id = new_job(jobs, Api::Replicate, &model, &p, input, duration, b);
            match jobs.by_id.get(&id) {
                Some(job) => {
                    Answer::charged(prediction(job, base, Some("starting")), id).with_status(StatusCode::CREATED)
                }
                None => not_found("prediction"),
            }
        }),
    )
    .await
}

/// `GET /v1/predictions/{id}`.
pub(super) async fn replicate_get(
    State(mock): State<Arc<Mock>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let mut req = ApiRequest::new(Api::Replicate, "GET /v1/predictions/{id}", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| match jobs.by_id.get(&id).filter(|j| j.api == Api::Replicate) {
            Some(job) => Answer::ok(prediction(job, base, None)),
            None => not_found("prediction"),
        }),
    )
    .await
}

/// The `cursor` of `GET /v1/predictions`.
#[derive(Deserialize)]
pub(super) struct ListQuery {
    cursor: Option<usize>,
}

/// `GET /v1/predictions`: newest first, [`PAGE_SIZE`] per page, `next` while more remain.
pub(super) async fn replicate_list(
    State(mock): State<Arc<Mock>>,
    Query(q): Query<ListQuery>,
    headers: HeaderMap,
) -> Response {
    let req = ApiRequest::new(Api::Replicate, "GET /v1/predictions", Scope::List, &headers);
    let start = q.cursor.unwrap_or(0);
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| {
            let all: Vec<&Job> = jobs
                .order
                .iter()
                .rev()
                .filter_map(|id| jobs.by_id.get(id))
                .filter(|j| j.api == Api::Replicate)
                .collect();
            let results: Vec<Value> =
                all.iter().skip(start).take(PAGE_SIZE).map(|j| prediction(j, base, None)).collect();
            let next =
                (start + PAGE_SIZE < all.len()).then(|| format!("{base}/v1/predictions?cursor={}", start + PAGE_SIZE));
            Answer::ok(json!({"previous": null, "next": next, "results": results}))
        }),
    )
    .await
}

// ----- fal queue -----

/// `POST /fal/{model}`.
pub(super) async fn fal_create(
    State(mock): State<Arc<Mock>>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut input: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut req = ApiRequest::new(Api::FalQueue, "POST /fal/{model}", Scope::Create, &headers);
    req.prompt = input.get("prompt").and_then(Value::as_str).map(str::to_string);
    if let Some(images) = input.as_object_mut().and_then(|obj| obj.remove("image_urls")) {
        req.reference_images = images.as_array().map_or(0, Vec::len);
    }
    let prompt = req.prompt.clone();
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| {
            let Some(p) = prompt else { return missing_prompt() };
            let duration = Duration::from_millis(b.job_duration_ms);
            let id = new_job(jobs, Api::FalQueue, &model, &p, input, duration, b);
            let url = format!("{base}/fal/{model}/requests/{id}");
            let body = json!({
                "request_id": id,
                "status_url": format!("{url}/status"),
                "response_url": url,
                "cancel_url": format!("{url}/cancel"),
            });
            Answer::charged(body, id)
        }),
    )
    .await
}

/// `GET /fal/{model}/requests/{id}/status` and `GET /fal/{model}/requests/{id}`.
pub(super) async fn fal_get(State(mock): State<Arc<Mock>>, Path(path): Path<String>, headers: HeaderMap) -> Response {
    let Some((_model, rest)) = path.rsplit_once("/requests/") else {
        return error(StatusCode::NOT_FOUND, "no such route", "not_found");
    };
    let (id, status) = match rest.strip_suffix("/status") {
        Some(id) => (id.to_string(), true),
        None => (rest.to_string(), false),
    };
    let endpoint = if status { "GET /fal/{model}/requests/{id}/status" } else { "GET /fal/{model}/requests/{id}" };
    let mut req = ApiRequest::new(Api::FalQueue, endpoint, Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| {
            let Some(job) = jobs.by_id.get(&id).filter(|j| j.api == Api::FalQueue) else {
                return not_found("request");
            };
            let url = format!("{base}/fal/{}/requests/{id}", job.model);
            match (status, job.finished()) {
                (true, done) => Answer::ok(json!({
                    "status": if done { "COMPLETED" } else { "IN_PROGRESS" },
                    "request_id": id,
                    "response_url": url,
                })),
                (false, false) => Answer::error(StatusCode::BAD_REQUEST, "request is still in progress", "in_progress"),
                (false, true) => Answer::ok(json!({
                    "images": [{"url": job.file_url(base), "content_type": "image/png", "width": IMAGE_SIZE, "height": IMAGE_SIZE}],
                    "prompt": job.prompt,
                })),
            }
        }),
    )
    .await
}

// ----- result files -----

/// `GET /files/{id}.png`: 404 until the job finishes, 410 once its result expired.
pub(super) async fn download(State(mock): State<Arc<Mock>>, Path(file): Path<String>) -> Response {
    let id = file.strip_suffix(".png").unwrap_or(&file);
    let prompt = {
        let jobs = lock(&mock.jobs);
        match jobs.by_id.get(id) {
            Some(job) if job.expired() => return error(StatusCode::GONE, "this result has expired", "expired"),
            Some(job) if job.finished() => job.prompt.clone(),
            _ => return error(StatusCode::NOT_FOUND, "no such file", "not_found"),
        }
    };
    ([(header::CONTENT_TYPE, "image/png")], placeholder_png(&prompt, IMAGE_SIZE)).into_response()
}
