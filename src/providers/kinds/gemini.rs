//! The `gemini` adapter: image generation with the Gemini API (e.g. `gemini-2.5-flash-image`),
//! the key in `x-goog-api-key`, JSON in the API's camelCase.
//!
//! Synchronous (the default): `POST {base_url}/v1beta/models/{model}:generateContent`; the
//! image comes back in `candidates[0].content.parts[].inlineData{mimeType,data}`. There is
//! no idempotency key and no job id, so a lost answer is `unknown`, as with OpenAI. Reference
//! photos are `inlineData` parts after the prompt's text part.
//!
//! A blocked prompt (`promptFeedback.blockReason`) or a candidate that ends without an image
//! (`finishReason` `SAFETY`, `IMAGE_SAFETY`, `PROHIBITED_CONTENT`, `NO_IMAGE`, …) is a
//! [`CallError::Blocked`]: a refusal in plain words, never retried. Google's billing FAQ says
//! only that requests failing with a 400 or 500 are not charged; a blocked answer is a 200,
//! and its prompt tokens may be billed, so tally calls it possibly charged.
//!
//! Batch (`batch = true`): the Batch API at half price for work that is not urgent.
//! `POST {base_url}/v1beta/models/{model}:batchGenerateContent` with one inlined request and
//! the `displayName` tally chooses (the execution's stable key, derived from the task and the
//! attempt) answers a named operation (`batches/…`) before any work; it is the job's handle,
//! persisted at `accepted`, and polled at `GET {base_url}/v1beta/{name}` until its
//! `metadata.state` is final, the result inline in `metadata.output.inlinedResponses`. A
//! create whose answer was lost is found by listing batches (`GET {base_url}/v1beta/batches`,
//! every page up to a bound) and matching the display name: exactly one match is the job,
//! anything else proves nothing. Gemini ends batches still pending or running after 48 hours
//! (`BATCH_STATE_EXPIRED`), so a batch is polled that long ([`Provider::job_deadline`]).
//! A held job (an older copy of the database, `store::held`) is looked for the same way: its
//! next attempts' keys are known to the copy, so exactly one batch named by one of them, in a
//! listing read to its end, is the job's request. `generateContent` (no batch) lists nothing.
//!
//! Drafting ([`draft`]) is `generateContent` with a response schema, in this file so the kind is
//! described once. Past 600 lines: one API's image, batch and drafting calls and their tests.

use std::time::Duration;

use base64::Engine as _;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::providers::ProviderConfig;
use crate::providers::dashboard::Dashboard;
use crate::providers::http::client::{AuthScheme, HttpClient, image_from_bytes};
use crate::providers::http::parse_size;
use crate::providers::{
    BoxFuture, CallError, CallRequest, Capabilities, HeldLookup, HeldQuery, Image, JobHandle, JobState, Provider,
    Submitted,
};

/// The aspect ratios Gemini's `imageConfig.aspectRatio` takes.
const ASPECT_RATIOS: &[&str] = &["1:1", "2:3", "3:2", "3:4", "4:3", "4:5", "5:4", "9:16", "16:9", "21:9"];

/// The task parameters sent to Gemini (`n` only as 1): `aspect_ratio` as
/// `imageConfig.aspectRatio`, the others into `generationConfig`.
const PARAMS: &[&str] = &["n", "aspect_ratio", "temperature", "seed", "top_p", "topP"];

/// How long a batch may stay pending or running before Gemini expires it.
const BATCH_LIFETIME: Duration = Duration::from_secs(48 * 3600);

/// Pages of the batch listing read to find a lost create (newest first).
const LIST_PAGES: usize = 20;

/// The Gemini API for one image model.
#[derive(Debug)]
pub struct Gemini {
    http: HttpClient,
    model: String,
    aspect_ratio: Option<String>,
    size: String,
    batch: bool,
    poll_interval: Duration,
    max_output_tokens: u32,
}

/// A `GenerateContentResponse`, as much of it as tally reads.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Response {
    #[serde(default)]
    candidates: Vec<Candidate>,
    prompt_feedback: Option<PromptFeedback>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    block_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    content: Option<Content>,
    finish_reason: Option<String>,
    finish_message: Option<String>,
}

#[derive(Deserialize)]
struct Content {
    #[serde(default)]
    parts: Vec<Part>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part {
    text: Option<String>,
    inline_data: Option<Blob>,
    #[serde(default)]
    thought: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Blob {
    #[serde(default)]
    mime_type: String,
    #[serde(default)]
    data: String,
}

/// A batch operation (`batches/…`) as create, get and list answer it.
#[derive(Deserialize)]
struct Operation {
    #[serde(default)]
    name: String,
    #[serde(default)]
    metadata: Value,
    error: Option<Status>,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BatchList {
    #[serde(default)]
    operations: Vec<Operation>,
    next_page_token: Option<String>,
}

/// What one `generateContent` answer holds for tally.
#[allow(missing_docs)]
pub enum Answer {
    Image(Image),
    /// Blocked or declined, in plain words.
    Blocked(String),
}

/// Plain words for a `finishReason` that ended a candidate without an image.
fn finish_words(reason: &str) -> String {
    let why = match reason {
        "SAFETY" | "IMAGE_SAFETY" => "its safety filter flagged the image",
        "PROHIBITED_CONTENT" | "IMAGE_PROHIBITED_CONTENT" => "it flagged prohibited content",
        "BLOCKLIST" => "the prompt contains a blocked term",
        "SPII" => "the prompt or image contains sensitive personal information",
        "RECITATION" | "IMAGE_RECITATION" => "the image would reproduce existing material",
        "NO_IMAGE" => "the model made no image for this prompt",
        "MAX_TOKENS" => "the answer hit its output limit before an image",
        _ => "the model stopped without an image",
    };
    format!("Gemini made no image: {why} (finishReason {reason})")
}

/// Read a `GenerateContentResponse`: the first image of the first candidate, or why there is
/// none. An answer with no candidates and no block reason, or an image that does not decode,
/// is `Unusable` (answered, probably charged).
pub fn read_answer(v: Value) -> Result<Answer, CallError> {
    let r: Response = serde_json::from_value(v)
        .map_err(|e| CallError::Unusable(format!("the provider's answer is not a GenerateContentResponse: {e}")))?;
    if let Some(reason) = r.prompt_feedback.as_ref().and_then(|f| f.block_reason.as_deref()) {
        return Ok(Answer::Blocked(format!("Gemini blocked the prompt (promptFeedback.blockReason {reason})")));
    }
    let Some(c) = r.candidates.into_iter().next() else {
        return Err(CallError::Unusable("the provider answered without a candidate or a block reason".into()));
    };
    let parts = c.content.map(|c| c.parts).unwrap_or_default();
    let mut said = String::new();
    for p in &parts {
        if let Some(blob) = p.inline_data.as_ref().filter(|b| b.mime_type.starts_with("image/") && !p.thought) {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(blob.data.trim())
                .map_err(|e| CallError::Unusable(format!("the image in the provider's answer is not base64: {e}")))?;
            return Ok(Answer::Image(image_from_bytes(bytes)?));
        }
        if let Some(t) = p.text.as_deref().filter(|_| !p.thought) {
            said.push_str(t);
        }
    }
    let reason = c.finish_reason.unwrap_or_else(|| "STOP".into());
    let mut words = finish_words(&reason);
    if let Some(m) = c.finish_message.filter(|m| !m.is_empty()) {
        words.push_str(&format!(": {m}"));
    }
    if !said.trim().is_empty() {
        let said: String = said.trim().chars().take(300).collect();
        words.push_str(&format!("; the model said: \u{201c}{said}\u{201d}"));
    }
    Ok(Answer::Blocked(words))
}

/// `WIDTHxHEIGHT` as the aspect ratio Gemini takes, if it is one.
fn aspect_ratio(size: &str) -> Option<String> {
    let (w, h) = parse_size(size)?;
    fn gcd(a: u32, b: u32) -> u32 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    let g = gcd(w, h).max(1);
    let ratio = format!("{}:{}", w / g, h / g);
    ASPECT_RATIOS.contains(&ratio.as_str()).then_some(ratio)
}

impl Gemini {
    /// Build the adapter; `model` is the model id (`gemini-2.5-flash-image`, with or without
    /// a leading `models/`).
    pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
        let model = cfg.model.clone().unwrap_or_default();
        let model = model.trim().trim_start_matches("models/").to_string();
        if model.is_empty() || !model.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')) {
            return Err(format!("provider `{}`: model `{model}` is not a Gemini model id", cfg.name));
        }
        let root = crate::providers::http::api_root(cfg);
        Ok(Gemini {
            http: HttpClient::new(&root, AuthScheme::Header("x-goog-api-key"))?,
            model,
            aspect_ratio: aspect_ratio(&cfg.size),
            size: cfg.size.clone(),
            batch: cfg.batch,
            poll_interval: cfg.poll_interval,
            max_output_tokens: cfg.max_output_tokens,
        })
    }

    /// Whether `req` is a drafting call.
    fn drafts(req: &CallRequest) -> bool {
        req.operation == crate::domain::operation::Operation::Draft
    }

    fn root(&self) -> String {
        let base = self.http.base_url();
        base.strip_suffix("/v1beta").unwrap_or(base).to_string()
    }

    /// Everything refused before anything is sent.
    fn check(&self, req: &CallRequest) -> Result<(), CallError> {
        self.http.check_key()?;
        let refuse = |message: String| Err(CallError::Rejected { message, config: false });
        // Every task parameter is sent or refused, never dropped silently.
        if let Some(k) =
            req.params.as_object().into_iter().flatten().map(|(k, _)| k).find(|k| !PARAMS.contains(&k.as_str()))
        {
            return refuse(format!(
                "params.{k} is not a Gemini parameter tally sends (it sends {}); nothing was sent",
                PARAMS.join(", ")
            ));
        }
        if let Some(n) = req.params.get("n").filter(|n| n.as_u64() != Some(1)) {
            return refuse(format!(
                "params.n = {n}: a Gemini request makes one image, and tally does not change a parameter silently; \
                 make one task per image. Nothing was sent"
            ));
        }
        if self.aspect_ratio.is_none() && req.params.get("aspect_ratio").is_none() {
            return Err(CallError::Rejected {
                message: format!(
                    "size {} is not an aspect ratio Gemini makes ({}); set size to one (e.g. 1024x1024) or \
                     params.aspect_ratio. Nothing was sent",
                    self.size,
                    ASPECT_RATIOS.join(", ")
                ),
                config: true,
            });
        }
        if let Some(r) = req.params.get("aspect_ratio")
            && !r.as_str().is_some_and(|r| ASPECT_RATIOS.contains(&r))
        {
            return refuse(format!(
                "params.aspect_ratio {r} is not one of {}; nothing was sent",
                ASPECT_RATIOS.join(", ")
            ));
        }
        Ok(())
    }

    /// The `GenerateContentRequest` for one image: the prompt, then the reference photos.
    fn content_request(&self, req: &CallRequest) -> Value {
        let mut parts = vec![json!({"text": req.prompt})];
        for r in &req.references {
            let data = base64::engine::general_purpose::STANDARD.encode(&r.bytes);
            parts.push(json!({"inlineData": {"mimeType": r.media_type, "data": data}}));
        }
        let ratio =
            req.params.get("aspect_ratio").and_then(Value::as_str).map(str::to_string).or(self.aspect_ratio.clone());
        let mut generation = Map::new();
        generation.insert("responseModalities".into(), json!(["TEXT", "IMAGE"]));
        if let Some(ratio) = ratio {
            generation.insert("imageConfig".into(), json!({"aspectRatio": ratio}));
        }
        for (k, v) in req.params.as_object().into_iter().flatten() {
            if let Some(key) = match k.as_str() {
                "temperature" => Some("temperature"),
                "seed" => Some("seed"),
                "top_p" | "topP" => Some("topP"),
                _ => None,
            } {
                generation.insert(key.into(), v.clone());
            }
        }
        json!({"contents": [{"role": "user", "parts": parts}], "generationConfig": generation})
    }

    async fn generate(&self, req: &CallRequest) -> Result<Submitted, CallError> {
        let url = format!("{}/v1beta/models/{}:generateContent", self.root(), self.model);
        let rb = self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&self.content_request(req));
        let answer: Value = self.http.send_json(rb).await?;
        match read_answer(answer)? {
            Answer::Image(img) => Ok(Submitted::Done(img)),
            Answer::Blocked(why) => Err(CallError::Blocked(why)),
        }
    }

    async fn create_batch(&self, req: &CallRequest) -> Result<Submitted, CallError> {
        let url = format!("{}/v1beta/models/{}:batchGenerateContent", self.root(), self.model);
        let body = json!({"batch": {
            "displayName": req.idempotency_key,
            "inputConfig": {"requests": {"requests": [
                {"request": self.content_request(req), "metadata": {"key": req.idempotency_key}}
            ]}},
        }});
        let rb = self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&body);
        let op: Operation = self.http.send_json(rb).await?;
        if !valid_batch_name(&op.name) {
            return Err(CallError::Unusable(format!(
                "the provider answered a batch without a usable name (`{}`)",
                op.name
            )));
        }
        Ok(Submitted::Accepted(JobHandle::id(op.name)))
    }

    async fn poll_batch(&self, job: &JobHandle) -> Result<JobState, CallError> {
        if !valid_batch_name(&job.id) {
            return Err(CallError::Rejected { message: format!("`{}` is not a batch name", job.id), config: false });
        }
        let url = format!("{}/v1beta/{}", self.root(), job.id);
        let op: Operation = self.http.send_json(self.http.request(Method::GET, &url, None)?).await?;
        let m = &op.metadata;
        let state = m.get("state").and_then(Value::as_str).unwrap_or("");
        match state {
            "BATCH_STATE_PENDING" | "BATCH_STATE_RUNNING" => return Ok(JobState::Running),
            "BATCH_STATE_SUCCEEDED" => {}
            "BATCH_STATE_FAILED" => {
                let why =
                    op.error.map(|e| e.message).filter(|m| !m.is_empty()).unwrap_or_else(|| "no reason given".into());
                return Ok(JobState::Failed(self.http.redact(&format!("the batch failed: {why}"))));
            }
            "BATCH_STATE_CANCELLED" => return Ok(JobState::Failed("the batch was cancelled".into())),
            "BATCH_STATE_EXPIRED" => {
                return Ok(JobState::Failed(
                    "the batch expired: Gemini did not run it within 48 hours, so it made no image".into(),
                ));
            }
            other => return Err(CallError::Ambiguous(format!("batch {} has unknown state `{other}`", job.id))),
        }
        let first = m.pointer("/output/inlinedResponses/inlinedResponses/0").cloned();
        let Some(first) = first else {
            return Err(CallError::Unusable(format!("batch {} succeeded without an inlined response", job.id)));
        };
        if let Some(err) = first.get("error") {
            let why = err.get("message").and_then(Value::as_str).unwrap_or("no reason given");
            return Ok(JobState::Failed(self.http.redact(&format!("its request failed: {why}"))));
        }
        match read_answer(first.get("response").cloned().unwrap_or(Value::Null))? {
            Answer::Image(img) => Ok(JobState::Done(img)),
            Answer::Blocked(why) => Err(CallError::Blocked(why)),
        }
    }

    /// List batches (newest first, page by page) for the one whose display name is this
    /// execution's key.
    async fn find_batch(&self, req: &CallRequest) -> Result<Option<JobHandle>, CallError> {
        let mut found: Vec<String> = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..LIST_PAGES {
            let mut url = format!("{}/v1beta/batches?pageSize=100", self.root());
            if let Some(t) = &token {
                url.push_str("&pageToken=");
                url.push_str(&urlencoding(t));
            }
            let page: BatchList = self.http.send_json(self.http.request(Method::GET, &url, None)?).await?;
            for op in page.operations {
                let name = op.metadata.get("displayName").and_then(Value::as_str);
                if name == Some(req.idempotency_key.as_str()) && valid_batch_name(&op.name) {
                    found.push(op.name);
                }
            }
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        found.dedup();
        Ok(match found.as_slice() {
            [one] => Some(JobHandle::id(one.clone())),
            _ => None,
        })
    }
}

impl Gemini {
    /// Look for a held job's batch: one named by one of `q.keys` (see the module docs).
    async fn held_batch(&self, q: &HeldQuery) -> Result<HeldLookup, CallError> {
        if !self.batch {
            return Ok(HeldLookup::Unsure(
                "Gemini's generateContent answers at once and keeps no list of requests".into(),
            ));
        }
        let mut found: Vec<(String, String)> = Vec::new();
        let mut token: Option<String> = None;
        let mut complete = false;
        for _ in 0..LIST_PAGES {
            let mut url = format!("{}/v1beta/batches?pageSize=100", self.root());
            if let Some(t) = &token {
                url.push_str("&pageToken=");
                url.push_str(&urlencoding(t));
            }
            let page: BatchList = self.http.send_json(self.http.request(Method::GET, &url, None)?).await?;
            for op in page.operations {
                let name = op.metadata.get("displayName").and_then(Value::as_str).unwrap_or_default();
                if let Some(key) = q.keys.iter().find(|k| k.as_str() == name)
                    && valid_batch_name(&op.name)
                {
                    found.push((op.name, key.clone()));
                }
            }
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => {
                    complete = true;
                    break;
                }
            }
        }
        found.sort();
        found.dedup();
        Ok(match (found.as_slice(), complete) {
            ([(name, key)], true) => HeldLookup::Found { job: JobHandle::id(name.clone()), key: key.clone() },
            ([], true) => HeldLookup::Absent(
                "Gemini's list of this key's batches (read to its end) shows none named for this job".into(),
            ),
            (_, false) => HeldLookup::Unsure(format!(
                "Gemini lists more than {} batches, more than tally reads to be sure",
                LIST_PAGES * 100
            )),
            (many, true) => HeldLookup::Unsure(format!(
                "Gemini shows {} batches named for this job, so tally cannot tell which one counts",
                many.len()
            )),
        })
    }
}

/// `batches/{id}` with an id of URL-safe characters only (it becomes part of a path).
fn valid_batch_name(name: &str) -> bool {
    name.strip_prefix("batches/")
        .is_some_and(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
}

/// Percent-encode a page token for a query string.
fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Google AI Studio: usage per model, and the logs of a project that turned them on.
pub fn dashboard(cfg: &ProviderConfig) -> Dashboard {
    let batch = cfg.batch;
    Dashboard {
        page: if batch { "ai_studio_batch" } else { "ai_studio" }.into(),
        url: Some("https://aistudio.google.com/usage".into()),
        label: "Google AI Studio's usage page".into(),
        how: if batch {
            "It shows requests per model and day; tally sent this one as a batch job, whose name is below. \
             A blocked or failed request can still be charged for its prompt."
        } else {
            "It shows requests per model and day; single requests appear under Logs only when logging is \
             turned on for the project. A blocked request can still be charged for its prompt."
        }
        .into(),
        lists_requests: batch,
        model: cfg.model.clone(),
    }
}

impl Provider for Gemini {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: self.batch }
    }

    fn billing_note(&self) -> String {
        if self.batch {
            crate::domain::words::say("say.bills_gemini_batch")
        } else {
            crate::domain::words::say("say.bills_gemini")
        }
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn job_deadline(&self) -> Option<Duration> {
        self.batch.then_some(BATCH_LIFETIME)
    }

    fn preflight<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move { if Self::drafts(req) { self.http.check_key() } else { self.check(req) } })
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            if Self::drafts(req) {
                // Drafting (`gemini_draft`): JSON with `responseSchema`, never through a batch.
                return draft::draft(&self.http, &self.root(), &self.model, self.max_output_tokens, req).await;
            }
            self.check(req)?;
            if self.batch { self.create_batch(req).await } else { self.generate(req).await }
        })
    }

    fn poll<'a>(&'a self, job: &'a JobHandle) -> BoxFuture<'a, Result<JobState, CallError>> {
        Box::pin(async move {
            if !self.batch {
                return Err(CallError::Rejected {
                    message: "a synchronous Gemini provider has no jobs to poll".into(),
                    config: true,
                });
            }
            self.poll_batch(job).await
        })
    }

    fn find<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Option<JobHandle>, CallError>> {
        Box::pin(async move { if self.batch { self.find_batch(req).await } else { Ok(None) } })
    }

    fn find_held<'a>(&'a self, q: &'a HeldQuery) -> BoxFuture<'a, Result<HeldLookup, CallError>> {
        Box::pin(self.held_batch(q))
    }
}

/// Drafting (`draft`) on a `gemini` provider: `POST {base_url}/v1beta/models/{model}:generateContent`
/// with the drafting instructions and the photos as `inlineData` parts, and
/// `generationConfig.responseMimeType: application/json` with `responseSchema`
/// (`domain::draft::openapi_subset_schema`) and `maxOutputTokens`. Synchronous, no idempotency key, no
/// job id: a lost answer is `unknown`, as for a Gemini image. The answer's text parts and its
/// `usageMetadata` (`promptTokenCount`, `candidatesTokenCount`) go to the worker as a
/// `domain::draft::Answer`; a blocked prompt is a refusal, as for an image.
pub(super) mod draft {
    use base64::Engine as _;
    use reqwest::Method;
    use serde_json::{Value, json};

    use crate::domain::draft::{Answer, Usage, openapi_subset_schema};
    use crate::providers::http::client::HttpClient;
    use crate::providers::{CallError, CallRequest, Submitted, answer_image};

    /// The request body of a drafting call.
    fn body(req: &CallRequest, max_output_tokens: u32) -> Value {
        let mut parts = vec![json!({"text": req.prompt})];
        for r in &req.references {
            let data = base64::engine::general_purpose::STANDARD.encode(&r.bytes);
            parts.push(json!({"inlineData": {"mimeType": r.media_type, "data": data}}));
        }
        json!({
            "contents": [{"role": "user", "parts": parts}],
            "generationConfig": {
                "responseMimeType": "application/json",
                "responseSchema": openapi_subset_schema(),
                "maxOutputTokens": max_output_tokens,
            },
        })
    }

    /// Send one drafting call to `root` (the API root, without `/v1beta`).
    pub(super) async fn draft(
        http: &HttpClient,
        root: &str,
        model: &str,
        max_output_tokens: u32,
        req: &CallRequest,
    ) -> Result<Submitted, CallError> {
        let url = format!("{root}/v1beta/models/{model}:generateContent");
        let rb = http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&body(req, max_output_tokens));
        let v: Value = http.send_json(rb).await?;
        if let Some(reason) = v.pointer("/promptFeedback/blockReason").and_then(Value::as_str) {
            return Err(CallError::Blocked(format!("Gemini blocked the prompt ({reason})")));
        }
        let text: String = v
            .pointer("/candidates/0/content/parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        let n = |k: &str| v.pointer(&format!("/usageMetadata/{k}")).and_then(Value::as_u64).unwrap_or(0);
        let usage = Usage { input_tokens: n("promptTokenCount"), output_tokens: n("candidatesTokenCount") };
        Ok(Submitted::Done(answer_image(&Answer { text, usage })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_become_aspect_ratios() {
        assert_eq!(aspect_ratio("1024x1024").as_deref(), Some("1:1"));
        assert_eq!(aspect_ratio("1536x1024").as_deref(), Some("3:2"));
        assert_eq!(aspect_ratio("1920x1080").as_deref(), Some("16:9"));
        assert_eq!(aspect_ratio("1000x700"), None);
    }

    #[test]
    fn answers_are_read_as_the_api_documents_them() {
        let png = base64::engine::general_purpose::STANDARD.encode(crate::render::placeholder_png("x", 8));
        let ok = json!({"candidates": [{"content": {"parts": [{"text": "here"}, {"inlineData": {"mimeType": "image/png", "data": png}}]}, "finishReason": "STOP"}]});
        assert!(matches!(read_answer(ok), Ok(Answer::Image(_))));
        let blocked = json!({"promptFeedback": {"blockReason": "SAFETY"}});
        assert!(matches!(read_answer(blocked), Ok(Answer::Blocked(w)) if w.contains("blocked the prompt")));
        let unsafe_image = json!({"candidates": [{"finishReason": "IMAGE_SAFETY"}]});
        assert!(matches!(read_answer(unsafe_image), Ok(Answer::Blocked(w)) if w.contains("IMAGE_SAFETY")));
        let text_only =
            json!({"candidates": [{"content": {"parts": [{"text": "I can't draw that"}]}, "finishReason": "STOP"}]});
        assert!(matches!(read_answer(text_only), Ok(Answer::Blocked(w)) if w.contains("I can't draw that")));
        assert!(matches!(read_answer(json!({})), Err(CallError::Unusable(_))));
    }

    #[test]
    fn batch_names_are_checked() {
        assert!(valid_batch_name("batches/abc-123"));
        assert!(!valid_batch_name("batches/../x"));
        assert!(!valid_batch_name("operations/x"));
        assert!(!valid_batch_name("batches/"));
    }
}
