//! The `dashscope` adapter: Alibaba Cloud Model Studio (DashScope) image synthesis — Wan
//! (`wan2.2-t2i-flash`, `wan2.5-i2i-preview`, `wanx2.1-imageedit`) and Qwen-Image — as
//! asynchronous tasks.
//!
//! - Create: `POST {base_url}/api/v1/services/aigc/text2image/image-synthesis` (text-to-image
//!   models), or `…/image2image/image-synthesis` for the editing models (a name containing
//!   `i2i` or `imageedit`, as the official SDK decides), with `X-DashScope-Async: enable` and
//!   `Authorization: Bearer <key>`; body `{model, input: {prompt, …}, parameters: {size:
//!   "W*H", n: 1, …}}`. DashScope answers `output.task_id` with `task_status: PENDING`
//!   before any work; the id is the job handle, persisted at `accepted`.
//! - Poll: `GET {base_url}/api/v1/tasks/{task_id}`: `PENDING`/`RUNNING` (running),
//!   `SUCCEEDED` (`output.results[].url`, downloaded at once and retried within the 24 hours
//!   results and task data are kept: "expired" only after them), `FAILED`/`CANCELED`
//!   ([`JobState::FailedNotCharged`]: DashScope bills only successful images), `UNKNOWN`
//!   (the task id is not known, or its data was deleted after the 24 hours: nothing can be
//!   proven).
//! - Find a lost create: the documented batch task query `GET {base_url}/api/v1/tasks` with
//!   `start_time`/`end_time` (`YYYYMMDDhhmmss`), `model_name`, `page_no`, `page_size`. The
//!   listing shows no prompt, so a task is matched by model and creation time (`gmt_create`,
//!   milliseconds); each candidate is then read by id, and one whose results show another
//!   `orig_prompt` is excluded. Exactly one remaining candidate, finished, is the lost create;
//!   none, or several that show this prompt (or finished showing none), prove nothing
//!   (`unknown`); any other answer waits on candidates still pending or running (the prompt
//!   shows once a task succeeds) and says "look again later", within the 24-hour retention.
//!   The query's time zone is not documented in what we could read: the window sent covers
//!   both UTC and China Standard Time readings, and the exact window is applied to
//!   `gmt_create`.
//! - No idempotency key; errors are `{code, message}` JSON: `InvalidApiKey` (401),
//!   `DataInspectionFailed` (400, content inspection: a refusal), `Throttling*` (429: not
//!   now), `Arrearage` (the account is out of credit: a configuration problem, failed at
//!   once).
//! - Reference photos go to `input.images` (1 to 3, as data URIs) on `i2i` models, and to
//!   `input.base_image_url` (one photo, with `params.function`) on `imageedit` models; a
//!   text-to-image model refuses them before anything is sent. `params.n` other than 1 is
//!   refused before sending too (a task stores one image).
//!
//! Drafting on the `dashscope_chat` kind (Qwen-VL through the compatible-mode chat completions,
//! [`chat`]) is in this file too, so the provider is described once.
//! Past 600 lines: one API's request building, task polling, lost-create search, its drafting
//! calls and their tests.

use std::time::{Duration, UNIX_EPOCH};

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::providers::ProviderConfig;
use crate::providers::dashboard::Dashboard;
use crate::providers::http::client::{AuthScheme, HttpClient, ResultFetch, Retention, now_ms};
use crate::providers::http::{data_uri, parse_size};
use crate::providers::{
    BoxFuture, CallError, CallRequest, Capabilities, HeldLookup, HeldQuery, JobHandle, JobState, LostLookup, Provider,
    Submitted,
};

/// The international (Singapore) endpoint, the default `base_url`; the mainland one is
/// `https://dashscope.aliyuncs.com`.
/// DashScope's international (Singapore) endpoint, the default `base_url`; the mainland one
/// is `https://dashscope.aliyuncs.com`.
pub const DEFAULT_BASE_URL: &str = "https://dashscope-intl.aliyuncs.com";

/// How long DashScope keeps a task's data and its result images.
pub const RETENTION: Retention = Retention {
    keep: Duration::from_secs(24 * 3600),
    words: "DashScope keeps a task and its result images for 24 hours",
};

/// How long one poll keeps trying to download a succeeded task's image before it reports
/// `ResultUnavailable` (the worker then polls again, with backoff).
const DOWNLOAD_BUDGET: Duration = Duration::from_secs(8);

/// Tolerated clock difference between tally and the provider around the calling time.
const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Tasks per page of the listing (the most the Model Studio listings document).
const PAGE_SIZE: u64 = 100;

/// How many pages of the listing `find` reads.
const FIND_MAX_PAGES: u64 = 10;

/// How many candidates `find` reads by id to tell them apart.
const FIND_MAX_CANDIDATES: usize = 20;

/// China Standard Time, the zone of DashScope's `submit_time`/`end_time` strings.
const CST: Duration = Duration::from_secs(8 * 3600);

/// Keys of `params` the adapter owns (the prompt and the reference images come from the task).
const RESERVED: &[&str] = &["prompt", "images", "base_image_url", "mask_image_url", "ref_img", "sketch_image_url"];

/// Keys of `params` that belong in `input` rather than `parameters`.
const INPUT_KEYS: &[&str] = &["negative_prompt", "function"];

/// What a model does with reference photos.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Text to image: no reference photos.
    Text,
    /// `…-i2i-…` (wan2.5-i2i-preview): `input.images`, 1 to 3.
    Images,
    /// `…imageedit` (wanx2.1-imageedit): one `input.base_image_url` and an `input.function`.
    Edit,
}

impl Mode {
    fn of(model: &str) -> Mode {
        if model.contains("imageedit") {
            Mode::Edit
        } else if model.contains("i2i") {
            Mode::Images
        } else {
            Mode::Text
        }
    }

    fn task(self) -> &'static str {
        match self {
            Mode::Text => "text2image",
            Mode::Images | Mode::Edit => "image2image",
        }
    }
}

/// DashScope image synthesis for one model.
#[derive(Debug)]
pub struct Dashscope {
    http: HttpClient,
    model: String,
    mode: Mode,
    size: String,
    request_timeout: Duration,
    poll_interval: Duration,
}

#[derive(Deserialize, Default)]
struct TaskAnswer {
    #[serde(default)]
    output: TaskOutput,
    #[serde(default)]
    usage: Value,
}

#[derive(Deserialize, Default)]
struct TaskOutput {
    #[serde(default)]
    task_id: String,
    #[serde(default)]
    task_status: String,
    code: Option<String>,
    message: Option<String>,
    #[serde(default)]
    results: Vec<TaskResult>,
    end_time: Option<String>,
}

#[derive(Deserialize)]
struct TaskResult {
    url: Option<String>,
    code: Option<String>,
    message: Option<String>,
    orig_prompt: Option<String>,
}

#[derive(Deserialize)]
struct TaskPage {
    #[serde(default)]
    data: Vec<ListedTask>,
    total_page: Option<Value>,
}

#[derive(Deserialize)]
struct ListedTask {
    #[serde(default)]
    task_id: String,
    model_name: Option<String>,
    gmt_create: Option<Value>,
    start_time: Option<Value>,
}

fn rejected(message: String) -> CallError {
    CallError::Rejected { message: format!("{message}; nothing was sent"), config: false }
}

/// `YYYYMMDDhhmmss` of `ms` (since the epoch) in the zone `offset` east of UTC.
pub fn query_time(ms: i64, offset: Duration) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64) + offset;
    humantime::format_rfc3339_seconds(t).to_string().chars().filter(char::is_ascii_digit).collect()
}

/// Milliseconds since the epoch of a `2025-01-08 16:04:10.123` time in China Standard Time.
fn cst_ms(text: &str) -> Option<i64> {
    let head = text.trim().split('.').next()?.replace(' ', "T");
    let t = humantime::parse_rfc3339_weak(&head).ok()?;
    let ms = t.duration_since(UNIX_EPOCH).ok()?.as_millis() as i64;
    Some(ms - CST.as_millis() as i64)
}

/// A listing time: milliseconds as a number or a numeric string.
fn listed_ms(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

/// The DashScope error code in a classified message (`HTTP 400: Arrearage: …`).
fn error_code(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("HTTP ")?.split_once(": ")?.1;
    let (code, _) = rest.split_once(':')?;
    (!code.is_empty() && code.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_')).then_some(code)
}

/// Re-read a classified error by DashScope's documented codes: content inspection is a
/// refusal of the request, a bad key or an unknown model is tally's configuration.
fn reclassify(e: CallError) -> CallError {
    let code = match &e {
        CallError::Rejected { message, .. } | CallError::RetryAfter { message, .. } => error_code(message),
        _ => None,
    };
    let Some(code) = code.map(str::to_string) else { return e };
    let message = match &e {
        CallError::Rejected { message, .. } | CallError::RetryAfter { message, .. } => message.clone(),
        _ => return e,
    };
    // `Arrearage` (out of credit) is read by the shared classification (`is_out_of_credit`).
    if code == "DataInspectionFailed" || code.starts_with("DataInspection") {
        return CallError::Rejected {
            message: format!("{message} (DashScope's content inspection refused the prompt or an input image)"),
            config: false,
        };
    }
    if matches!(code.as_str(), "InvalidApiKey" | "ModelNotFound" | "Model.AccessDenied")
        || code.starts_with("AccessDenied")
    {
        return match e {
            CallError::Rejected { message, .. } => CallError::Rejected { message, config: true },
            other => other,
        };
    }
    e
}

impl Dashscope {
    /// Build the adapter; `model` is a DashScope model name (`wan2.2-t2i-flash`, `qwen-image`).
    pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
        let model = cfg.model.clone().unwrap_or_default();
        if model.is_empty() || !model.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(format!(
                "provider `{}`: model `{model}` must be a DashScope model name like wan2.2-t2i-flash",
                cfg.name
            ));
        }
        let mut cfg = cfg.clone();
        // The official SDK's base URL ends in `/api/v1`; both spellings work.
        if let Some(url) = cfg.base_url.as_mut() {
            let trimmed = url.trim_end_matches('/');
            *url = trimmed.strip_suffix("/api/v1").unwrap_or(trimmed).to_string();
        }
        Ok(Dashscope {
            http: HttpClient::new(&cfg, AuthScheme::Bearer)?,
            mode: Mode::of(&model),
            model,
            size: cfg.size.clone(),
            request_timeout: cfg.request_timeout,
            poll_interval: cfg.poll_interval,
        })
    }

    fn api(&self, path: &str) -> String {
        format!("{}/api/v1/{path}", self.http.base_url())
    }

    /// The create body; `Rejected` (before anything is sent) for what the model cannot take.
    fn body(&self, req: &CallRequest) -> Result<Value, CallError> {
        let model = &self.model;
        let mut input = Map::new();
        let mut parameters = Map::new();
        if let Some((w, h)) = parse_size(&self.size) {
            parameters.insert("size".into(), format!("{w}*{h}").into());
        }
        parameters.insert("n".into(), 1.into());
        if let Value::Object(params) = &req.params {
            for (k, v) in params {
                match k.as_str() {
                    k if RESERVED.contains(&k) => {
                        return Err(rejected(format!(
                            "`{k}` is set by tally from the task (its prompt and reference photos), not by params"
                        )));
                    }
                    "n" if v.as_u64() == Some(1) => {}
                    "n" => {
                        return Err(rejected(format!(
                            "params.n = {v}: a tally task stores one image, so n must be 1 (submit one task per image)"
                        )));
                    }
                    "size" => {
                        let text = v.as_str().unwrap_or_default();
                        let size = match parse_size(text) {
                            Some((w, h)) => format!("{w}*{h}"),
                            None if text.contains('*') => text.to_string(),
                            None => return Err(rejected(format!("params.size {v} is not a size like 1024*1024"))),
                        };
                        parameters.insert("size".into(), size.into());
                    }
                    k if INPUT_KEYS.contains(&k) => {
                        input.insert(k.to_string(), v.clone());
                    }
                    _ => {
                        parameters.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        input.insert("prompt".into(), req.prompt.clone().into());
        let photos = req.references.len();
        match self.mode {
            Mode::Text if photos > 0 => {
                return Err(rejected(format!(
                    "the model `{model}` is a text-to-image model and takes no reference photos, so this shot's \
                     {photos} photo(s) would be dropped; use an image-editing model such as wan2.5-i2i-preview"
                )));
            }
            Mode::Text => {}
            Mode::Images => {
                if !(1..=3).contains(&photos) {
                    return Err(rejected(format!(
                        "the model `{model}` edits 1 to 3 reference photos; this shot has {photos}"
                    )));
                }
                let uris: Vec<Value> = req.references.iter().map(|r| data_uri(r).into()).collect();
                input.insert("images".into(), uris.into());
            }
            Mode::Edit => {
                if photos != 1 {
                    return Err(rejected(format!(
                        "the model `{model}` edits exactly one reference photo; this shot has {photos}"
                    )));
                }
                if !input.contains_key("function") {
                    return Err(rejected(format!(
                        "the model `{model}` needs params.function (for example description_edit)"
                    )));
                }
                input.insert("base_image_url".into(), data_uri(&req.references[0]).into());
            }
        }
        Ok(json!({"model": model, "input": input, "parameters": parameters}))
    }

    /// Read one task by id.
    async fn task(&self, id: &str) -> Result<TaskAnswer, CallError> {
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(CallError::Rejected { message: format!("`{id}` is not a DashScope task id"), config: false });
        }
        let rb = self.http.request(Method::GET, &self.api(&format!("tasks/{id}")), None)?;
        self.http.send_json(rb).await.map_err(reclassify)
    }

    /// Download a succeeded task's image, retried within the 24-hour retention; only after it
    /// is a missing image expired.
    async fn download(&self, id: &str, url: &str, end_ms: Option<i64>) -> Result<JobState, CallError> {
        let past_retention = end_ms.is_some_and(|t| RETENTION.passed(t, now_ms()));
        match self.http.download_retrying(url, DOWNLOAD_BUDGET).await {
            ResultFetch::Image(image) => Ok(JobState::Done(image)),
            ResultFetch::NotYet { .. } if past_retention => Ok(JobState::Expired),
            ResultFetch::NotYet { tries, last, .. } => Ok(JobState::ResultUnavailable(format!(
                "task {id} succeeded, but its image could not be downloaded yet ({tries} tries; the last: {last}); {}, \
                 so tally tries again",
                RETENTION.words
            ))),
            // An expired signed result URL answers 403 at Alibaba Cloud OSS.
            ResultFetch::Failed(CallError::Rejected { .. }) if past_retention => Ok(JobState::Expired),
            ResultFetch::Failed(CallError::Rejected { message, .. }) => Err(CallError::Unusable(format!(
                "task {id} succeeded (charged) but its image could not be downloaded: {message}"
            ))),
            ResultFetch::Failed(e) => Err(e),
        }
    }

    /// Read the listing pages around the calling time: the candidates' task ids.
    async fn candidates(&self, req: &CallRequest) -> Result<Vec<String>, CallError> {
        let skew = CLOCK_SKEW.as_millis() as i64;
        let window = (req.calling_at_ms - skew, req.calling_at_ms + self.request_timeout.as_millis() as i64 + skew);
        let upper = window.1.min(now_ms() + skew).max(window.0 + 1000);
        // The earlier reading of the start (UTC) and the later reading of the end (CST): the
        // query covers the window whichever zone the service reads them in.
        let (start, end) = (query_time(window.0, Duration::ZERO), query_time(upper, CST));
        let mut found = Vec::new();
        for page_no in 1..=FIND_MAX_PAGES {
            let url = format!(
                "{}?start_time={start}&end_time={end}&model_name={}&page_no={page_no}&page_size={PAGE_SIZE}",
                self.api("tasks"),
                self.model
            );
            let rb = self.http.request(Method::GET, &url, None)?;
            let page: TaskPage = self.http.send_json(rb).await.map_err(reclassify)?;
            let last = page.data.len() < PAGE_SIZE as usize;
            for t in page.data {
                if t.task_id.is_empty() || t.model_name.as_deref().is_some_and(|m| m != self.model) {
                    continue;
                }
                let created =
                    t.gmt_create.as_ref().and_then(listed_ms).or_else(|| t.start_time.as_ref().and_then(listed_ms));
                // A task with no time in the listing cannot be excluded.
                if created.is_none_or(|c| (window.0..=window.1).contains(&c)) && !found.contains(&t.task_id) {
                    found.push(t.task_id);
                }
            }
            let pages = page.total_page.as_ref().and_then(listed_ms).unwrap_or(0);
            if last || page_no as i64 >= pages {
                break;
            }
        }
        Ok(found)
    }
}

/// Decide among the candidates left after reading each: `settled` can no longer be excluded
/// (they show this prompt, or finished without showing any), `unsettled` still may (pending or
/// running: their prompt shows when they succeed). One settled and nothing else is the lost
/// create; two settled prove nothing for good; otherwise a later look may tell them apart
/// (even a lone unsettled one: another create of the window may still land), while DashScope
/// keeps the tasks (24 hours from the call).
fn sort_out(settled: Vec<String>, unsettled: Vec<String>, calling_at_ms: i64) -> LostLookup {
    match (settled.as_slice(), unsettled.len()) {
        ([], 0) => LostLookup::Unproven("DashScope lists no task of this model around the calling time".into()),
        ([one], 0) => LostLookup::Found(JobHandle::id(one.clone())),
        (settled, _) if settled.len() >= 2 => {
            tracing::info!(
                candidates = settled.len(),
                "several DashScope tasks match the lost create; proving nothing"
            );
            LostLookup::Unproven(format!(
                "{} DashScope tasks of this model around the calling time show this prompt (or finished without \
                 showing one), so none can be told to be this request",
                settled.len()
            ))
        }
        (settled, unsettled) => LostLookup::LookAgain {
            why: format!(
                "{} DashScope task(s) of this model were created around the calling time and {unsettled} of them \
                 have not shown their prompt yet (it shows when a task finishes)",
                settled.len() + unsettled
            ),
            until_ms: calling_at_ms.saturating_add(RETENTION.keep.as_millis() as i64),
        },
    }
}

/// Alibaba Cloud Model Studio (DashScope): the international console for the `-intl`
/// endpoint, the mainland one otherwise.
pub fn dashboard(cfg: &ProviderConfig) -> Dashboard {
    let intl = cfg.base_url.as_deref().is_some_and(|u| u.contains("dashscope-intl"));
    Dashboard {
        page: "model_studio".into(),
        url: Some(if intl {
            "https://modelstudio.console.alibabacloud.com/".into()
        } else {
            "https://bailian.console.aliyun.com/".into()
        }),
        label: "Alibaba Cloud Model Studio console".into(),
        how: "Model Telemetry (模型观测) lists the calls per model with their time and status; bills show what \
              was charged. Match the task id below, or the model and the time it was sent."
            .into(),
        lists_requests: true,
        model: cfg.model.clone(),
    }
}

impl Provider for Dashscope {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: true }
    }

    fn billing_note(&self) -> String {
        crate::domain::words::say("say.bills_dashscope")
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn preflight<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            self.http.check_key()?;
            self.body(req).map(|_| ())
        })
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            let body = self.body(req)?;
            let url = self.api(&format!("services/aigc/{}/image-synthesis", self.mode.task()));
            let rb = self
                .http
                .request(Method::POST, &url, Some(&req.idempotency_key))?
                .header("X-DashScope-Async", "enable")
                .json(&body);
            let answer: TaskAnswer = self.http.send_json(rb).await.map_err(reclassify)?;
            if answer.output.task_id.is_empty() {
                return Err(CallError::Ambiguous("DashScope accepted the request without a task_id".into()));
            }
            Ok(Submitted::Accepted(JobHandle::id(answer.output.task_id)))
        })
    }

    fn poll<'a>(&'a self, job: &'a JobHandle) -> BoxFuture<'a, Result<JobState, CallError>> {
        Box::pin(async move {
            let id = job.id.as_str();
            let answer = self.task(id).await?;
            let out = answer.output;
            let why = |code: &Option<String>, message: &Option<String>| match (code, message) {
                (Some(c), Some(m)) => format!("{c}: {m}"),
                (Some(c), None) => c.clone(),
                (None, Some(m)) => m.clone(),
                (None, None) => String::new(),
            };
            match out.task_status.as_str() {
                "PENDING" | "RUNNING" => Ok(JobState::Running),
                "SUCCEEDED" => {
                    let end_ms = out.end_time.as_deref().and_then(cst_ms);
                    if let Some(url) = out.results.iter().find_map(|r| r.url.as_deref()) {
                        return self.download(id, url, end_ms).await;
                    }
                    // Succeeded without one image: nothing was generated, so nothing billed.
                    let first = out.results.first();
                    let detail = first.map(|r| why(&r.code, &r.message)).filter(|d| !d.is_empty());
                    let count = answer.usage.get("image_count").and_then(Value::as_u64).unwrap_or(0);
                    Ok(JobState::FailedNotCharged(self.http.redact(&format!(
                        "task {id} finished without an image ({}; {count} image(s) billed)",
                        detail.unwrap_or_else(|| "no result URL".into())
                    ))))
                }
                "FAILED" => {
                    let detail = why(&out.code, &out.message);
                    Ok(JobState::FailedNotCharged(self.http.redact(&format!(
                        "{} (DashScope bills only successful images)",
                        if detail.is_empty() { "task failed".into() } else { detail }
                    ))))
                }
                // DashScope cancels only tasks still PENDING: nothing ran, nothing is billed.
                "CANCELED" => Ok(JobState::FailedNotCharged(format!(
                    "task {id} was canceled at the provider (not by tally) before it ran"
                ))),
                "UNKNOWN" => Err(CallError::Rejected {
                    message: format!(
                        "DashScope reports task {id} as UNKNOWN: it does not know the id, or deleted the task's data \
                         after its 24-hour retention"
                    ),
                    config: false,
                }),
                other => Err(CallError::Ambiguous(format!("task {id} has unknown status `{other}`"))),
            }
        })
    }

    fn find<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Option<JobHandle>, CallError>> {
        Box::pin(async move {
            Ok(match self.find_lost(req).await? {
                LostLookup::Found(job) => Some(job),
                LostLookup::Unproven(_) | LostLookup::LookAgain { .. } => None,
            })
        })
    }

    fn find_lost<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<LostLookup, CallError>> {
        Box::pin(async move {
            // What this execution would have sent; a request it could not have sent was not.
            if self.body(req).is_err() {
                return Ok(LostLookup::Unproven("this request could not have been sent".into()));
            }
            let candidates = self.candidates(req).await?;
            if candidates.len() > FIND_MAX_CANDIDATES {
                tracing::info!(candidates = candidates.len(), "too many DashScope tasks match the lost create");
                return Ok(LostLookup::Unproven(format!(
                    "DashScope lists {} tasks of this model around the calling time, too many to tell apart",
                    candidates.len()
                )));
            }
            // The listing shows no prompt: read each candidate and drop those whose results
            // name another prompt. One that shows no prompt stays: settled (failed, canceled),
            // it never will; still pending or running, it may later.
            let mut settled = Vec::new();
            let mut unsettled = Vec::new();
            for id in candidates {
                let task = self.task(&id).await?;
                let prompts: Vec<&str> = task.output.results.iter().filter_map(|r| r.orig_prompt.as_deref()).collect();
                if prompts.contains(&req.prompt.as_str()) {
                    settled.push(id);
                } else if prompts.is_empty() {
                    match task.output.task_status.as_str() {
                        "PENDING" | "RUNNING" => unsettled.push(id),
                        _ => settled.push(id),
                    }
                }
            }
            Ok(sort_out(settled, unsettled, req.calling_at_ms))
        })
    }

    /// DashScope's listing carries no mark of the task (see the module docs): unsure.
    fn find_held<'a>(&'a self, _q: &'a HeldQuery) -> BoxFuture<'a, Result<HeldLookup, CallError>> {
        Box::pin(async {
            Ok(HeldLookup::Unsure(
                "DashScope's task list shows no prompt and no mark of tally's, so a task there is told apart only \
                 by model and time, which every job of this model sent since shares"
                    .into(),
            ))
        })
    }
}

/// The `dashscope_chat` adapter: drafting calls (`draft`) with Qwen-VL through Alibaba Cloud
/// Model Studio's OpenAI-compatible chat completions.
///
/// `POST {base_url}/chat/completions` (`base_url` ends in `/compatible-mode/v1`, as DashScope
/// documents it for the OpenAI SDKs) with the drafting instructions and the photos as
/// `image_url` parts (data URIs), `response_format` a JSON schema
/// (`domain::draft::response_schema`) and `max_tokens` the provider's ceiling. Synchronous: the
/// answer is the completion, with `usage` (`prompt_tokens`, `completion_tokens`). Nothing can
/// be looked up afterwards — the compatible mode keeps no retrievable completions — so an
/// answer lost after sending is `unknown`, and never resent on its own.
pub mod chat {
    use std::time::Duration;

    use reqwest::Method;
    use serde_json::{Value, json};

    use crate::domain::draft::{Answer, Usage, response_schema};
    use crate::domain::operation::Operation;
    use crate::providers::http::client::{AuthScheme, HttpClient};
    use crate::providers::http::data_uri;
    use crate::providers::{
        BoxFuture, CallError, CallRequest, Capabilities, Provider, ProviderConfig, Submitted, answer_image,
    };

    /// DashScope's OpenAI-compatible endpoint (international).
    pub const DEFAULT_BASE_URL: &str = "https://dashscope-intl.aliyuncs.com/compatible-mode/v1";

    /// DashScope's chat completions, for drafting.
    #[derive(Debug)]
    pub struct DashscopeChat {
        http: HttpClient,
        model: String,
        max_output_tokens: u32,
    }

    impl DashscopeChat {
        /// Build the adapter from its configuration.
        pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
            Ok(DashscopeChat {
                http: HttpClient::new(cfg, AuthScheme::Bearer)?,
                model: cfg.model.clone().unwrap_or_else(|| "qwen-vl-max".into()),
                max_output_tokens: cfg.max_output_tokens,
            })
        }

        fn body(&self, req: &CallRequest) -> Value {
            let mut content = vec![json!({"type": "text", "text": req.prompt})];
            for image in &req.references {
                content.push(json!({"type": "image_url", "image_url": {"url": data_uri(image)}}));
            }
            json!({
                "model": self.model,
                "messages": [{"role": "user", "content": content}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "tally_draft", "schema": response_schema(), "strict": true}},
                "max_tokens": self.max_output_tokens,
            })
        }
    }

    /// The answer of a chat completion: its first choice's text and its usage.
    pub(crate) fn read_completion(v: &Value) -> Answer {
        let text = v.pointer("/choices/0/message/content").and_then(Value::as_str).unwrap_or("").to_string();
        let n = |k: &str| v.pointer(&format!("/usage/{k}")).and_then(Value::as_u64).unwrap_or(0);
        Answer { text, usage: Usage { input_tokens: n("prompt_tokens"), output_tokens: n("completion_tokens") } }
    }

    impl Provider for DashscopeChat {
        fn capabilities(&self) -> Capabilities {
            Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: false }
        }

        fn billing_note(&self) -> String {
            crate::domain::words::say("say.bills_dashscope_chat")
        }

        fn rate_limit_hold(&self) -> Option<Duration> {
            self.http.rate_limit_hold()
        }

        fn preflight<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<(), CallError>> {
            Box::pin(async move {
                self.http.check_key()?;
                if req.operation != Operation::Draft {
                    return Err(CallError::Rejected {
                        message: "a dashscope_chat provider only drafts; nothing was sent".into(),
                        config: true,
                    });
                }
                Ok(())
            })
        }

        fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
            Box::pin(async move {
                let url = format!("{}/chat/completions", self.http.base_url());
                let rb = self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&self.body(req));
                let answer: Value = self.http.send_json(rb).await?;
                Ok(Submitted::Done(answer_image(&read_completion(&answer))))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_pick_their_path() {
        assert_eq!(Mode::of("wan2.2-t2i-flash"), Mode::Text);
        assert_eq!(Mode::of("qwen-image"), Mode::Text);
        assert_eq!(Mode::of("wan2.5-i2i-preview"), Mode::Images);
        assert_eq!(Mode::of("wanx2.1-imageedit"), Mode::Edit);
        assert_eq!(Mode::Images.task(), "image2image");
    }

    #[test]
    fn query_times_and_provider_times() {
        // 2026-12-01T10:00:00Z
        let ms = 1_796_119_200_000;
        assert_eq!(query_time(ms, Duration::ZERO), "20261201100000");
        assert_eq!(query_time(ms, CST), "20261201180000");
        assert_eq!(cst_ms("2026-12-01 18:00:00.123"), Some(ms));
        assert_eq!(listed_ms(&json!(5)), Some(5));
        assert_eq!(listed_ms(&json!("6")), Some(6));
    }

    #[test]
    fn candidates_are_sorted_out_by_what_can_still_change() {
        let ids = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let day = 24 * 3600 * 1000;
        assert_eq!(sort_out(ids(&["a"]), ids(&[]), 0), LostLookup::Found(JobHandle::id("a".to_string())));
        assert!(matches!(sort_out(ids(&[]), ids(&[]), 0), LostLookup::Unproven(_)));
        assert!(matches!(sort_out(ids(&["a", "b"]), ids(&["c"]), 0), LostLookup::Unproven(_)), "two settled");
        for (settled, unsettled) in [(ids(&[]), ids(&["a"])), (ids(&["a"]), ids(&["b"])), (ids(&[]), ids(&["a", "b"]))]
        {
            match sort_out(settled, unsettled, 5) {
                LostLookup::LookAgain { until_ms, .. } => assert_eq!(until_ms, 5 + day),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn documented_codes_are_classified() {
        // The shared classification of an answer with DashScope's `{code, message}` body.
        let r = |status: u16, m: &str| {
            let (code, message) = m.split_once(": ").unwrap();
            let body = json!({"request_id": "r", "code": code, "message": message}).to_string();
            crate::providers::http::client::classify_answer(
                reqwest::StatusCode::from_u16(status).unwrap(),
                &reqwest::header::HeaderMap::new(),
                body.as_bytes(),
                m,
                std::time::SystemTime::now(),
            )
        };
        assert_eq!(error_code("HTTP 400: Arrearage: Access denied"), Some("Arrearage"));
        assert_eq!(error_code("HTTP 400"), None);
        assert!(matches!(
            reclassify(r(400, "Arrearage: Access denied")),
            CallError::Rejected { config: true, message } if message.contains("out of credit")
        ));
        assert!(matches!(
            reclassify(r(400, "DataInspectionFailed: Input data may contain inappropriate content.")),
            CallError::Rejected { config: false, message } if message.contains("content inspection")
        ));
        assert!(matches!(reclassify(r(429, "Throttling.RateQuota: slow down")), CallError::RetryAfter { .. }));
        assert!(matches!(reclassify(r(404, "ModelNotFound: no")), CallError::Rejected { config: true, .. }));
        assert!(matches!(reclassify(r(400, "InvalidParameter: bad size")), CallError::Rejected { config: false, .. }));
    }
}
