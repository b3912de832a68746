//! Past 600 lines: the API styles' shared vocabulary (`Api`, `Job`, `Answer`) is kept together
//! here, one variant per style; each style's routes are in its own file.
//!
//! The mock provider server (`tally mock-provider`): speaks the OpenAI images, Replicate,
//! fal queue, Gemini and BFL API styles on loopback, and appends every API request it receives to a ledger
//! file (one fsync'd JSON line each) so tests and users can count what was charged.
//!
//! It is held to the official clients, not to tally: every answer has the schema the real API
//! documents (checked by running the pinned official Python SDKs against it, `tests/sdk/`),
//! and it refuses what the real API refuses (a fal status path under a model subpath, a
//! retired OpenAI model, an unknown Replicate version). Where the real behaviour is not
//! documented, the default is the pessimistic one (unknown Replicate inputs are stripped from
//! what the API stores; `Idempotency-Key` is ignored unless told otherwise).
//!
//! Routes: `/v1/images/{generations,edits}`, `/v1/responses[/{id}]` (OpenAI); `/v1/models/{owner}/{name}[/predictions
//! |/versions/{id}]`, `/v1/predictions[/{id}[/cancel]]` (Replicate); `/fal/{app}` (submit) and
//! `/fal/{owner}/{alias}/requests/{id}[/status|/cancel]` (fal);
//! `/dashscope/api/v1/services/aigc/{text2image|image2image}/image-synthesis`,
//! `/dashscope/api/v1/tasks[/{id}[/cancel]]` (DashScope);
//! `/gemini/{v1beta|v1}/models/{model}:{generateContent|batchGenerateContent}` and
//! `/gemini/{v1beta|v1}/batches[/{id}]` (Gemini, key in `x-goog-api-key`); `/bfl/v1/{model}`,
//! `/bfl/v1/get_result?id=` and `/bfl/delivery/{id}.png` (BFL, key in `x-key`; delivery
//! URLs are signed for 10 minutes); `/files/{id}.png` (result downloads); and the control routes `/_mock/behavior` (GET, PUT) and `/_mock/ledger` (GET).
//! Control routes and downloads are not in the ledger and need no `Authorization` header; every API route does.

pub mod behavior;
mod bfl;
mod dashscope;
mod fal;
mod gemini;
mod ledger;
mod openai;
mod photoroom;
mod replicate;
mod responses;
mod serve;
mod shopify;
mod shopify_gql;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

pub use behavior::Behavior;
use behavior::Scope;
use ledger::Ledger;

/// Command-line arguments of `tally mock-provider`.
#[derive(Debug, Clone, clap::Args)]
pub struct MockArgs {
    /// Address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:7800")]
    pub listen: SocketAddr,
    /// File the request ledger is appended to (one JSON line per API request).
    #[arg(long)]
    pub ledger: PathBuf,
    /// Delay before every API answer, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// How long an asynchronous job takes to finish, in milliseconds (its first third queued).
    #[arg(long, default_value_t = 300)]
    pub job_duration_ms: u64,
    /// How long a finished result stays available, in seconds (then Replicate-style
    /// `output: null`, `data_removed: true`, and result files answer 410).
    #[arg(long, default_value_t = 3600)]
    pub result_ttl_s: u64,
    /// Answer creates with this 5xx status (not charged).
    #[arg(long)]
    pub fail_status: Option<u16>,
    /// Answer creates with this 4xx status (not charged).
    #[arg(long)]
    pub reject_status: Option<u16>,
    /// Answer creates with 429 and this `Retry-After` (not charged).
    #[arg(long)]
    pub retry_after_s: Option<u64>,
    /// Do the work, charge, then close the connection without answering.
    #[arg(long)]
    pub drop_response: bool,
    /// Narrow --drop-response to "create", "poll" or "list" requests.
    #[arg(long)]
    pub drop_on: Option<String>,
    /// Replay the answer of an earlier create with the same `Idempotency-Key` without charging,
    /// as a gateway that honours the header would. Off by default: OpenAI, Replicate and fal
    /// honour no such header.
    #[arg(long, alias = "honour-idempotency-key")]
    pub honor_idempotency_key: bool,
    /// What a Replicate create does with inputs the model does not declare: "strip" (current
    /// Cog) or "reject" (422, as Cog 0.17.x did).
    #[arg(long, default_value = "strip")]
    pub unknown_inputs: String,
    /// OpenAI models answered with 404 `model_not_found` (comma-separated; empty for none).
    /// Default: dall-e-2,dall-e-3 (retired). The official SDK also marks gpt-image-1 as shut
    /// down: add it to refuse it too.
    #[arg(long, value_delimiter = ',')]
    pub retired_models: Option<Vec<String>>,
    /// Asynchronous jobs finish failed with this error message.
    #[arg(long)]
    pub job_error: Option<String>,
    /// OpenAI-style answers carry `data[0].url` (as many compatible gateways answer) instead
    /// of `b64_json`.
    #[arg(long)]
    pub openai_url_answers: bool,
    /// The error code refusals (--reject-status) carry, e.g. DashScope's `Arrearage`.
    #[arg(long)]
    pub error_code: Option<String>,
    /// Gemini and BFL moderation: "prompt" blocks every prompt (Gemini `promptFeedback`,
    /// BFL `Request Moderated`), "output" every image (Gemini `IMAGE_SAFETY`, BFL `Content
    /// Moderated`).
    #[arg(long)]
    pub moderation: Option<String>,
}

impl MockArgs {
    /// Defaults on `127.0.0.1:0` (any free port) with the given ledger file: for tests.
    pub fn loopback(ledger: PathBuf) -> Self {
        let d = Behavior::default();
        MockArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ledger,
            latency_ms: d.latency_ms,
            job_duration_ms: d.job_duration_ms,
            result_ttl_s: d.result_ttl_s,
            fail_status: None,
            reject_status: None,
            retry_after_s: None,
            drop_response: false,
            drop_on: None,
            honor_idempotency_key: false,
            unknown_inputs: d.unknown_inputs,
            retired_models: None,
            job_error: None,
            openai_url_answers: false,
            error_code: None,
            moderation: None,
        }
    }

    fn behavior(&self) -> Behavior {
        let d = Behavior::default();
        Behavior {
            latency_ms: self.latency_ms,
            fail_status: self.fail_status,
            reject_status: self.reject_status,
            retry_after_s: self.retry_after_s,
            drop_response: self.drop_response,
            drop_on: self.drop_on.clone(),
            job_duration_ms: self.job_duration_ms,
            result_ttl_s: self.result_ttl_s,
            honor_idempotency_key: self.honor_idempotency_key,
            unknown_inputs: self.unknown_inputs.clone(),
            retired_models: match &self.retired_models {
                Some(list) => list.iter().map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect(),
                None => d.retired_models,
            },
            job_error: self.job_error.clone(),
            error_echoes_key: false,
            openai_url_answers: self.openai_url_answers,
            moderation: self.moderation.clone(),
            draft_answer: d.draft_answer,
            retry_after_ms: d.retry_after_ms,
            retry_after_form: d.retry_after_form,
            ratelimit_headers: d.ratelimit_headers,
            rate_limit_times: d.rate_limit_times,
            rate_limit_meta: d.rate_limit_meta,
            out_of_credit: d.out_of_credit,
            result_fetch_failures: d.result_fetch_failures,
            result_fetch_status: d.result_fetch_status,
            fal_result_not_retryable: d.fal_result_not_retryable,
            job_canceled: d.job_canceled,
            job_failure_logs: d.job_failure_logs,
            error_code: self.error_code.clone(),
            ratelimit_exhausted_ms: d.ratelimit_exhausted_ms,
            giant_image_side: d.giant_image_side,
        }
    }
}

/// A mock server running inside this process; stopped when dropped.
#[derive(Debug)]
pub struct MockServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MockServer {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`: the `base_url` for `openai_images` and `replicate` providers.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://<addr>/fal`: the `base_url` for `fal_queue` providers.
    pub fn fal_url(&self) -> String {
        format!("http://{}/fal", self.addr)
    }

    /// `http://<addr>/dashscope`: the `base_url` for `dashscope` providers.
    pub fn dashscope_url(&self) -> String {
        format!("http://{}/dashscope", self.addr)
    }

    /// `http://<addr>/gemini`: the `base_url` for `gemini` providers.
    pub fn gemini_url(&self) -> String {
        format!("http://{}/gemini", self.addr)
    }

    /// `http://<addr>/bfl`: the `base_url` for `bfl` providers.
    pub fn bfl_url(&self) -> String {
        format!("http://{}/bfl", self.addr)
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Start the mock on `args.listen` (port 0 picks a free port) in a background task.
pub async fn spawn(args: MockArgs) -> std::io::Result<MockServer> {
    let (listener, router) = prepare(&args).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "mock provider stopped");
        }
    });
    Ok(MockServer { addr, task })
}

/// Run the mock on `args.listen` until the process is killed.
pub async fn run(args: MockArgs) -> std::io::Result<()> {
    let (listener, router) = prepare(&args).await?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, ledger = %args.ledger.display(), "mock provider listening");
    eprintln!(
        "tally mock provider on http://{addr} (fal, gemini, bfl and DashScope styles under http://{addr}/fal, \
         /gemini, /bfl, /dashscope), ledger {}",
        args.ledger.display()
    );
    axum::serve(listener, router).await
}

async fn prepare(args: &MockArgs) -> std::io::Result<(tokio::net::TcpListener, Router)> {
    let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
    if !args.listen.ip().is_loopback() {
        return Err(invalid(format!("the mock provider listens on loopback only, not {}", args.listen)));
    }
    let start = args.behavior();
    start.validate().map_err(invalid)?;
    let ledger = Ledger::open(&args.ledger).await?;
    let state =
        Arc::new(Mock { start: start.clone(), behavior: Mutex::new(start), ledger, jobs: Mutex::new(Jobs::default()) });
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    Ok((listener, router(state)))
}

fn router(state: Arc<Mock>) -> Router {
    Router::new()
        .route("/v1/images/generations", post(openai::generations))
        .route("/v1/images/edits", post(openai::edits))
        .route("/v1/models", get(openai::models))
        .route("/v1/segment", post(photoroom::segment))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::get))
        .route("/v1/models/{owner}/{name}", get(replicate::get_model))
        .route("/v1/models/{owner}/{name}/versions/{version}", get(replicate::get_version))
        .route("/v1/models/{owner}/{name}/predictions", post(replicate::create_official))
        .route("/v1/predictions", get(replicate::list).post(replicate::create_version))
        .route("/v1/predictions/{id}", get(replicate::get))
        .route("/v1/predictions/{id}/cancel", post(replicate::cancel))
        .route("/fal/{*path}", post(fal::submit).get(fal::get).put(fal::cancel))
        .nest("/dashscope", dashscope::routes())
        .route("/gemini/{version}/models/{spec}", post(gemini::models))
        .route("/gemini/{version}/batches", get(gemini::list))
        .route("/gemini/{version}/batches/{id}", get(gemini::get))
        .route("/bfl/v1/get_result", get(bfl::get_result))
        .route("/bfl/v1/{model}", post(bfl::create))
        .route("/bfl/delivery/{file}", get(bfl::delivery))
        .route("/files/{file}", get(serve::download))
        .nest_service("/admin", shopify::routes())
        .route("/_mock/behavior", get(get_behavior).put(put_behavior))
        .route("/_mock/ledger", get(get_ledger))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such route", "not_found") })
        .layer(DefaultBodyLimit::max(64 << 20))
        .with_state(state)
}

/// The shared state of one mock server.
struct Mock {
    /// The behaviour given at start; `null` in a patch restores these values.
    start: Behavior,
    behavior: Mutex<Behavior>,
    ledger: Ledger,
    jobs: Mutex<Jobs>,
}

impl Mock {
    fn behavior(&self) -> Behavior {
        lock(&self.behavior).clone()
    }
}

/// Lock a mutex, recovering the data if a panicking holder poisoned it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Which API style a request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    OpenaiImages,
    Replicate,
    FalQueue,
    DashScope,
    /// Gemini's synchronous `generateContent`.
    Gemini,
    /// Gemini's Batch API (`batchGenerateContent`): an asynchronous job.
    GeminiBatch,
    Bfl,
    /// Photoroom's remove-background API (synchronous, the PNG in the answer).
    Photoroom,
    /// OpenAI's Responses API in background mode (an id at once, the answer later), and without.
    OpenaiResponses,
    OpenaiResponsesSync,
    /// DashScope's OpenAI-compatible chat completions (synchronous).
    DashscopeChat,
}

impl Api {
    fn as_str(self) -> &'static str {
        match self {
            Api::OpenaiImages => "openai_images",
            Api::Replicate => "replicate",
            Api::FalQueue => "fal_queue",
            Api::Gemini | Api::GeminiBatch => "gemini",
            Api::Bfl => "bfl",
            Api::DashScope => "dashscope",
            Api::Photoroom => "photoroom",
            Api::OpenaiResponses | Api::OpenaiResponsesSync => "openai_responses",
            Api::DashscopeChat => "dashscope_chat",
        }
    }

    /// Whether it is the Responses API (either mode).
    fn responses(self) -> bool {
        matches!(self, Api::OpenaiResponses | Api::OpenaiResponsesSync)
    }

    /// An account out of credit, as each API documents it (not charged).
    fn out_of_credit(self) -> Answer {
        match self {
            Api::OpenaiImages | Api::OpenaiResponses | Api::OpenaiResponsesSync => Answer::ok(serde_json::json!({"error": {
                "message": "You exceeded your current quota, please check your plan and billing details.",
                "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}))
            .with_status(StatusCode::TOO_MANY_REQUESTS),
            Api::FalQueue => Answer::ok(serde_json::json!({
                "detail": "User is locked. Reason: Exhausted balance. Top up your balance at fal.ai/dashboard/billing."}))
            .with_status(StatusCode::FORBIDDEN),
            // DashScope: 400 `Arrearage` (the account is overdue).
            Api::DashScope => self.error(StatusCode::BAD_REQUEST, "", "Arrearage"),
            // BFL: 402 when the account is out of credits (docs.bfl.ai, "Errors").
            Api::Bfl => Answer::ok(serde_json::json!({
                "detail": "Insufficient credits. Add credits at https://dashboard.bfl.ai to continue using the API."}))
            .with_status(StatusCode::PAYMENT_REQUIRED),
            // Replicate (and, by default, any other style): 402 Payment Required.
            _ => Answer::ok(serde_json::json!({"title": "Insufficient credit", "status": 402,
                "detail": "You have insufficient credit to run this model. Go to https://replicate.com/account/billing to purchase credit."}))
            .with_status(StatusCode::PAYMENT_REQUIRED),
        }
    }

    /// Whether the API answers a create with its result (no job to poll).
    fn synchronous(self) -> bool {
        matches!(self, Api::OpenaiImages | Api::Gemini | Api::Photoroom | Api::OpenaiResponsesSync | Api::DashscopeChat)
    }

    /// An error answer in this style's documented shape (`code` is the shared path's
    /// generic code, or the one `error_code` names).
    fn error(self, status: StatusCode, message: &str, code: &str) -> Answer {
        match self {
            Api::DashScope => dashscope::error(status, message, code),
            _ => Answer::error(status, message, code),
        }
    }
}

/// Every generation the mock charged for, and the answers kept for idempotency keys.
#[derive(Default)]
struct Jobs {
    by_id: HashMap<String, Job>,
    /// Newest last.
    order: Vec<String>,
    replays: HashMap<(&'static str, String), Answer>,
    /// Replicate models looked up or run so far (so their version ids are known).
    known_models: Vec<(String, String)>,
    /// DashScope task queries in the last second (its documented rate limit).
    dashscope_queries: dashscope::Queries,
}

impl Jobs {
    /// Remember a Replicate model, so a create by its version id finds it.
    fn remember(&mut self, owner: String, name: String) {
        if !self.known_models.iter().any(|(o, n)| *o == owner && *n == name) {
            self.known_models.push((owner, name));
        }
    }
}

/// Where a job is in its life (by time since it was created, unless canceled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Running,
    Done,
    Canceled,
}

/// One charged generation.
struct Job {
    id: String,
    api: Api,
    /// OpenAI model, Replicate `owner/name`, fal app id (`fal-ai/flux/dev`), or DashScope model.
    model: String,
    /// Replicate: the version id, or `"hidden"` for an official model's create. DashScope:
    /// the service the task was created on (`text2image` or `image2image`).
    version: Option<String>,
    prompt: String,
    /// The create's input as the API stores it (unknown inputs stripped, reference images
    /// kept by count only for fal).
    input: Value,
    created: SystemTime,
    started: Instant,
    duration: Duration,
    ttl: Duration,
    /// The job finishes failed with this error (behaviour `job_error` at create time).
    error: Option<String>,
    /// When a cancel arrived before the job finished.
    canceled: Option<Duration>,
    /// Replicate: the job fails with `error: null` and these logs (`job_failure_logs`).
    failure_logs: Option<String>,
}

impl Job {
    fn phase(&self) -> Phase {
        let t = self.started.elapsed();
        if let Some(at) = self.canceled {
            return if at < self.duration { Phase::Canceled } else { Phase::Done };
        }
        if t >= self.duration {
            Phase::Done
        } else if t < self.duration / 3 {
            Phase::Queued
        } else {
            Phase::Running
        }
    }

    fn finished(&self) -> bool {
        self.phase() == Phase::Done
    }

    /// Succeeded, and its result still downloadable.
    fn has_result(&self) -> bool {
        self.finished() && self.error.is_none() && self.failure_logs.is_none() && !self.expired()
    }

    fn expired(&self) -> bool {
        self.started.elapsed() >= self.duration + self.ttl
    }

    fn file_url(&self, base: &str) -> String {
        format!("{base}/files/{}.png", self.id)
    }

    /// When the job started running and finished (provider time), once it did.
    fn started_at(&self) -> Option<SystemTime> {
        (self.phase() != Phase::Queued).then(|| self.created + self.duration / 3)
    }

    fn completed_at(&self) -> Option<SystemTime> {
        match self.phase() {
            Phase::Done => Some(self.created + self.duration),
            Phase::Canceled => self.canceled.map(|d| self.created + d),
            _ => None,
        }
    }
}

/// What the mock answers to one API request, and what the ledger records about it.
#[derive(Debug, Clone)]
struct Answer {
    status: StatusCode,
    body: Value,
    retry_after: Option<u64>,
    /// Further headers (rate-limit headers, another form of `Retry-After`, `X-Fal-Retryable`).
    headers: Vec<(&'static str, String)>,
    charged: bool,
    job_id: Option<String>,
    /// An answer that is a file, not JSON: its content type and bytes (boxed: most answers
    /// are JSON, and refusals travel in `Result`s).
    bytes: Option<Box<(&'static str, Vec<u8>)>>,
}

impl Answer {
    /// Answer with a file instead of a JSON body.
    fn with_bytes(mut self, content_type: &'static str, bytes: Vec<u8>) -> Self {
        self.bytes = Some(Box::new((content_type, bytes)));
        self
    }

    fn ok(body: Value) -> Self {
        Answer {
            status: StatusCode::OK,
            body,
            retry_after: None,
            headers: Vec::new(),
            charged: false,
            job_id: None,
            bytes: None,
        }
    }

    fn charged(body: Value, job_id: String) -> Self {
        Answer {
            status: StatusCode::OK,
            body,
            retry_after: None,
            headers: Vec::new(),
            charged: true,
            job_id: Some(job_id),
            bytes: None,
        }
    }

    fn error(status: StatusCode, message: &str, code: &str) -> Self {
        Answer::ok(error_body(message, code)).with_status(status)
    }

    fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    fn into_response(self) -> Response {
        let mut resp = match self.bytes.map(|b| *b) {
            Some((content_type, bytes)) => {
                (self.status, [(axum::http::header::CONTENT_TYPE, content_type)], bytes).into_response()
            }
            None => (self.status, axum::Json(self.body)).into_response(),
        };
        if let Some(s) = self.retry_after {
            resp.headers_mut().insert(axum::http::header::RETRY_AFTER, s.into());
        }
        for (name, value) in self.headers {
            if let Ok(v) = axum::http::HeaderValue::from_str(&value) {
                resp.headers_mut().insert(name, v);
            }
        }
        resp
    }
}

/// An OpenAI-style error body (with `detail` too, as Replicate and fal use it).
fn error_body(message: &str, code: &str) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "code": code}, "detail": message})
}

fn error(status: StatusCode, message: &str, code: &str) -> Response {
    (status, axum::Json(error_body(message, code))).into_response()
}

async fn get_behavior(State(mock): State<Arc<Mock>>) -> Response {
    axum::Json(mock.behavior()).into_response()
}

async fn put_behavior(State(mock): State<Arc<Mock>>, body: axum::body::Bytes) -> Response {
    let patch = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(m)) => m,
        _ => return error(StatusCode::BAD_REQUEST, "the body must be a JSON object", "invalid_json"),
    };
    let answer = {
        let mut b = lock(&mock.behavior);
        b.patch(&patch, &mock.start).map(|()| b.clone())
    };
    match answer {
        Ok(b) => {
            // The giant image is made now, once, so answers that carry it are as quick as others.
            if let Some(side) = b.giant_image_side {
                let _ = tokio::task::spawn_blocking(move || crate::render::flat_png(side)).await;
            }
            axum::Json(b).into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, &e, "invalid_behavior"),
    }
}

async fn get_ledger(State(mock): State<Arc<Mock>>) -> Response {
    match mock.ledger.read_all().await {
        Ok(lines) => axum::Json(Value::Array(lines)).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("cannot read the ledger: {e}"), "ledger"),
    }
}
