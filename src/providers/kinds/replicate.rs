//! The `replicate` adapter: read the model's input schema, submit a prediction, poll it by
//! id, and find one whose create answer was lost by listing recent predictions.
//!
//! - `model = "owner/name"` creates with `POST /v1/models/{owner}/{name}/predictions`
//!   (official models); `model = "owner/name:version"` with `POST /v1/predictions` and
//!   `version` (any model).
//! - Only inputs the model declares are sent. The schema (`openapi_schema` of the model's
//!   latest version, or of the given version) is read once and cached: `size` becomes
//!   `width`/`height` or the closest `aspect_ratio`, reference images go to the model's image
//!   input (`reference_input`, or the one image input the schema has), and a shot the model
//!   cannot take (reference photos on a model without an image input, an unknown parameter,
//!   an output format tally cannot store) is refused by [`Provider::preflight`] before
//!   anything is paid for.
//! - A lost create is found by listing `GET /v1/predictions` with `created_after` /
//!   `created_before` around the calling time and matching what can be matched: the model,
//!   every non-file input that was sent (including a seed tally derives from the execution
//!   when the model takes one), and the time window. Exactly one candidate is a match;
//!   none or several prove nothing. Replicate removes inputs after about an hour, so a lookup
//!   later than that cannot match (and the task stays `unknown`).
//! - A held job (an older copy of the database, `store::held`) is looked for by the same seed:
//!   tally's request keys are `tally-{task}-{attempt}`, so the keys of the job's next attempts,
//!   and their seeds, are known to the copy. The listing from the task's creation until now is
//!   read to its end; exactly one prediction with the job's prompt and one of those seeds is
//!   the job's request. None, with no prediction in the window showing the prompt or hiding
//!   its inputs, proves it did not reach this account. A model without an integer `seed`, or
//!   a job that sets its own, cannot be told apart (the job stays held).
//! - `succeeded` with `output: null` or `data_removed: true` is expired: generated and
//!   probably charged, but the image is gone. An output file that answers 404 or 5xx while
//!   Replicate's retention (an hour for predictions made through the API, from
//!   `completed_at`) has not passed is `ResultUnavailable`, polled again: never "expired".
//! - `canceled` is a cancel at Replicate (tally never cancels a prediction it started):
//!   Replicate bills the time a prediction ran, so it is reported in those words; a `failed`
//!   prediction whose `error` is null is explained by the last lines of its `logs`.
//!
//! Longer than 600 lines: the schema, the create, the poll and both listings (a lost create, a
//! held job) read the same prediction type and the same inputs, so they stay in one file.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::Digest;

use crate::providers::ProviderConfig;
use crate::providers::dashboard::Dashboard;
use crate::providers::http::client::{AuthScheme, HttpClient, ResultFetch, Retention, now_ms};
use crate::providers::http::{api_root, check_output_format, data_uri, parse_size};
use crate::providers::{
    BoxFuture, CallError, CallRequest, Capabilities, HeldLookup, HeldQuery, JobHandle, JobState, Provider, Submitted,
};

/// How many pages (100 predictions each) of the time-bounded listing `find` reads.
const FIND_MAX_PAGES: usize = 10;

/// How many pages (100 predictions each) `find_held` reads before it gives up proving
/// anything: its window runs from the task's creation until now.
const HELD_MAX_PAGES: usize = 50;

/// Tolerated clock difference between tally and the provider around the calling time.
const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// How long a read schema is reused (an official model's latest version can change).
const SCHEMA_TTL: Duration = Duration::from_secs(3600);

/// Replicate's documented retention of a prediction's output made through the API: an hour.
pub const REPLICATE_OUTPUTS: Retention = Retention {
    keep: Duration::from_secs(3600),
    words: "Replicate keeps the output of predictions made through the API for an hour",
};

/// How long one poll keeps trying to download a succeeded prediction's output before it
/// reports `ResultUnavailable` (the worker then polls again, with backoff).
const DOWNLOAD_BUDGET: Duration = Duration::from_secs(8);

/// The most log lines shown for a prediction that failed without an error message.
const LOG_LINES: usize = 5;

/// Output formats tally can store, as Replicate models name them.
const STORABLE_FORMATS: &[&str] = &["png", "jpg", "jpeg", "webp"];

/// The Replicate predictions API for one model.
#[derive(Debug)]
pub struct Replicate {
    http: HttpClient,
    owner: String,
    name: String,
    /// Set for `owner/name:version`.
    version: Option<String>,
    size: String,
    reference_input: Option<String>,
    request_timeout: Duration,
    poll_interval: Duration,
    schema: Mutex<Option<(Instant, Schema)>>,
}

/// What tally needs from a model version's `openapi_schema`.
#[derive(Debug, Clone)]
struct Schema {
    /// Input name → its property schema (with `allOf` enum references resolved to `enum`).
    inputs: HashMap<String, Value>,
}

impl Schema {
    fn from_openapi(openapi: &Value) -> Option<Schema> {
        let schemas = openapi.pointer("/components/schemas")?;
        let props = schemas.pointer("/Input/properties")?.as_object()?;
        let mut inputs = HashMap::new();
        for (name, p) in props {
            let mut p = p.clone();
            let target = p.pointer("/allOf/0/$ref").and_then(Value::as_str).and_then(|r| r.rsplit('/').next());
            if let Some(values) = target.and_then(|t| schemas.get(t)).and_then(|s| s.get("enum")).cloned() {
                p["enum"] = values;
            }
            inputs.insert(name.clone(), p);
        }
        Some(Schema { inputs })
    }

    fn kind(&self, name: &str) -> Option<&str> {
        self.inputs.get(name).map(|p| p.get("type").and_then(Value::as_str).unwrap_or("string"))
    }

    /// Whether an input takes files (a URI, or a list of them).
    fn is_file(&self, name: &str) -> bool {
        let Some(p) = self.inputs.get(name) else { return false };
        p.get("format").and_then(Value::as_str) == Some("uri")
            || p.pointer("/items/format").and_then(Value::as_str) == Some("uri")
    }

    /// The image inputs that could take reference photos (masks excluded).
    fn image_inputs(&self) -> Vec<&str> {
        let mut v: Vec<&str> =
            self.inputs.keys().map(String::as_str).filter(|n| self.is_file(n) && !n.contains("mask")).collect();
        v.sort_unstable();
        v
    }

    fn enum_values(&self, name: &str) -> Vec<&str> {
        self.inputs
            .get(name)
            .and_then(|p| p.get("enum"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }
}

#[derive(Debug, Deserialize)]
struct Prediction {
    id: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    output: Value,
    #[serde(default)]
    error: Value,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    data_removed: bool,
    created_at: Option<String>,
    completed_at: Option<String>,
    #[serde(default)]
    logs: Option<String>,
}

/// The last few non-empty lines of a prediction's logs, for a failure without an error.
fn logs_tail(logs: &str) -> Option<String> {
    let lines: Vec<&str> = logs.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let tail = &lines[lines.len().saturating_sub(LOG_LINES)..];
    let text: String = tail.join(" / ").chars().take(600).collect();
    (!text.is_empty()).then_some(text)
}

#[derive(Deserialize)]
struct PredictionPage {
    #[serde(default)]
    results: Vec<Prediction>,
    next: Option<String>,
}

fn rejected(message: String) -> CallError {
    CallError::Rejected { message: format!("{message}; nothing was sent"), config: false }
}

/// The closest `a:b` value of `ratios` to `w`×`h` (by log ratio).
fn closest_ratio<'a>(ratios: &[&'a str], w: u32, h: u32) -> Option<&'a str> {
    let want = (w as f64 / h.max(1) as f64).ln();
    ratios
        .iter()
        .filter_map(|r| {
            let (a, b) = r.split_once(':')?;
            let (a, b) = (a.parse::<f64>().ok()?, b.parse::<f64>().ok()?);
            (a > 0.0 && b > 0.0).then(|| (*r, ((a / b).ln() - want).abs()))
        })
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .map(|(r, _)| r)
}

/// A seed derived from the execution's key: a declared input that makes this execution's
/// prediction distinguishable in the listing from others with the same prompt.
fn seed_for(key: &str) -> i64 {
    let d = sha2::Sha256::digest(key.as_bytes());
    (u32::from_be_bytes([d[0], d[1], d[2], d[3]]) & 0x7fff_ffff) as i64
}

fn parse_time_ms(t: &str) -> Option<i64> {
    humantime::parse_rfc3339_weak(t.trim_end_matches('Z').split('.').next().unwrap_or(t))
        .ok()
        .or_else(|| humantime::parse_rfc3339(t).ok())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
}

fn rfc3339_ms(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

impl Replicate {
    /// Build the adapter; `model` must be `owner/name` or `owner/name:version`.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
        let model = cfg.model.clone().unwrap_or_default();
        let (path, version) = match model.split_once(':') {
            Some((p, v)) => (p, Some(v.to_string())),
            None => (model.as_str(), None),
        };
        let bad = || format!("provider `{}`: model `{model}` must be `owner/name` or `owner/name:version`", cfg.name);
        let (owner, name) = path.split_once('/').ok_or_else(bad)?;
        let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !ok(owner) || !ok(name) || version.as_deref().is_some_and(|v| !ok(v)) {
            return Err(bad());
        }
        Ok(Replicate {
            http: HttpClient::new(&api_root(cfg), AuthScheme::Bearer)?,
            owner: owner.into(),
            name: name.into(),
            version,
            size: cfg.size.clone(),
            reference_input: cfg.reference_input.clone(),
            request_timeout: cfg.request_timeout,
            poll_interval: cfg.poll_interval,
            schema: Mutex::new(None),
        })
    }

    fn model_name(&self) -> String {
        format!("{}/{}", self.owner, self.name)
    }

    /// The model's input schema: cached, else read from the model (latest version) or the
    /// configured version. Free metadata reads, never a paid call.
    async fn schema(&self) -> Result<Schema, CallError> {
        if let Some((at, s)) = self.schema.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
            && at.elapsed() < SCHEMA_TTL
        {
            return Ok(s.clone());
        }
        let base = self.http.base_url();
        let (url, pointer) = match &self.version {
            Some(v) => (format!("{base}/v1/models/{}/versions/{v}", self.model_name()), "/openapi_schema"),
            None => (format!("{base}/v1/models/{}", self.model_name()), "/latest_version/openapi_schema"),
        };
        let body: Value = match self.http.send_json(self.http.request(Method::GET, &url, None)?).await {
            Ok(b) => b,
            Err(CallError::Rejected { message, config }) => {
                return Err(CallError::Rejected {
                    message: format!(
                        "cannot read the input schema of `{}`: {message}; nothing was sent",
                        self.model_name()
                    ),
                    config,
                });
            }
            Err(e) => return Err(e),
        };
        let schema = body.pointer(pointer).and_then(Schema::from_openapi).ok_or_else(|| {
            rejected(format!("the model `{}` publishes no input schema tally can read", self.model_name()))
        })?;
        *self.schema.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), schema.clone()));
        Ok(schema)
    }

    /// The `input` of a create, built from what the model declares; `Rejected` (before
    /// anything is sent) for what it cannot take.
    fn build_input(&self, req: &CallRequest, schema: &Schema) -> Result<Map<String, Value>, CallError> {
        let model = self.model_name();
        if schema.kind("prompt").is_none() {
            return Err(rejected(format!("the model `{model}` takes no `prompt` input")));
        }
        check_output_format(&req.params, STORABLE_FORMATS)?;
        let mut input = Map::new();
        if let Some((w, h)) = parse_size(&self.size) {
            if schema.kind("width").is_some() && schema.kind("height").is_some() {
                input.insert("width".into(), w.into());
                input.insert("height".into(), h.into());
            } else if let Some(r) = closest_ratio(&schema.enum_values("aspect_ratio"), w, h) {
                input.insert("aspect_ratio".into(), r.into());
            }
        }
        let reference = match (&self.reference_input, req.references.is_empty()) {
            (_, true) => None,
            (Some(name), false) if schema.is_file(name) => Some(name.clone()),
            (Some(name), false) => {
                return Err(rejected(format!("the model `{model}` has no image input `{name}` (reference_input)")));
            }
            (None, false) => match schema.image_inputs().as_slice() {
                [] => {
                    return Err(rejected(format!(
                        "the model `{model}` takes no reference images, so this shot's {} photo(s) would be dropped",
                        req.references.len()
                    )));
                }
                [one] => Some(one.to_string()),
                many => {
                    return Err(rejected(format!(
                        "the model `{model}` has several image inputs ({}); set reference_input to the one for reference photos",
                        many.join(", ")
                    )));
                }
            },
        };
        if let Value::Object(params) = &req.params {
            for (k, v) in params {
                if k == "prompt" || Some(k) == reference.as_ref() {
                    continue;
                }
                if !schema.inputs.contains_key(k) {
                    let mut known: Vec<&str> = schema.inputs.keys().map(String::as_str).collect();
                    known.sort_unstable();
                    return Err(rejected(format!(
                        "the model `{model}` has no input `{k}` (it takes {})",
                        known.join(", ")
                    )));
                }
                input.insert(k.clone(), v.clone());
            }
        }
        if schema.kind("seed") == Some("integer") && !input.contains_key("seed") {
            input.insert("seed".into(), seed_for(&req.idempotency_key).into());
        }
        input.insert("prompt".into(), req.prompt.clone().into());
        if let Some(name) = reference {
            let uris: Vec<Value> = req.references.iter().map(|r| data_uri(r).into()).collect();
            if schema.kind(&name) == Some("array") {
                input.insert(name, uris.into());
            } else if let [one] = uris.as_slice() {
                input.insert(name, one.clone());
            } else {
                return Err(rejected(format!(
                    "the model `{model}` takes one reference image (`{name}`); this shot has {}",
                    req.references.len()
                )));
            }
        }
        Ok(input)
    }

    /// Whether a listed prediction is the one this execution created: the same model (and
    /// version), every non-file input equal, created inside the call's time window.
    fn matches(&self, p: &Prediction, sent: &Map<String, Value>, schema: &Schema, window: (i64, i64)) -> bool {
        if p.model.as_deref().is_some_and(|m| m != self.model_name()) {
            return false;
        }
        if let (Some(want), Some(got)) = (&self.version, &p.version)
            && want != got
        {
            return false;
        }
        let Some(created) = p.created_at.as_deref().and_then(parse_time_ms) else { return false };
        if created < window.0 || created > window.1 {
            return false;
        }
        let Some(stored) = p.input.as_object() else { return false };
        sent.iter().filter(|(k, _)| !schema.is_file(k)).all(|(k, v)| stored.get(k) == Some(v))
    }

    /// Look for the requests of a held job (see [`Provider::find_held`] and the module docs):
    /// the listing from the task's creation until now, read to its end, where a prediction
    /// is this job's when it shows the job's prompt and a seed derived from one of its keys.
    async fn held(&self, q: &HeldQuery) -> Result<HeldLookup, CallError> {
        let schema = self.schema().await?;
        let params_seed = q.request.params.get("seed").is_some();
        if schema.kind("seed") != Some("integer") || params_seed {
            let why = if params_seed {
                "the job sets its own `seed`, which is where tally puts the mark that ties a prediction to its job"
            } else {
                "the model takes no integer `seed`, which is where tally puts the mark that ties a prediction to its job"
            };
            return Ok(HeldLookup::Unsure(format!("Replicate cannot tell this job's predictions apart: {why}")));
        }
        let seeds: HashMap<i64, &str> = q.keys.iter().map(|k| (seed_for(k), k.as_str())).collect();
        let skew = CLOCK_SKEW.as_millis() as i64;
        let window = (q.since_ms - skew, now_ms() + skew);
        let query = format!("created_after={}&created_before={}", rfc3339_ms(window.0), rfc3339_ms(window.1));
        let mut url = format!("{}/v1/predictions?{}", self.http.base_url(), query.replace(':', "%3A"));
        let (mut found, mut same_prompt, mut unreadable, mut complete) = (Vec::new(), 0usize, 0usize, false);
        for _ in 0..HELD_MAX_PAGES {
            let page: PredictionPage = self.http.send_json(self.http.request(Method::GET, &url, None)?).await?;
            for p in &page.results {
                let created = p.created_at.as_deref().and_then(parse_time_ms);
                if created.is_some_and(|c| c < window.0 || c > window.1) {
                    continue;
                }
                let input = p.input.as_object().filter(|i| !p.data_removed && !i.is_empty());
                let Some(input) = input else {
                    unreadable += 1;
                    continue;
                };
                if input.get("prompt").and_then(Value::as_str) != Some(q.request.prompt.as_str()) {
                    continue;
                }
                same_prompt += 1;
                if let Some(key) = input.get("seed").and_then(Value::as_i64).and_then(|s| seeds.get(&s)) {
                    found.push((p.id.clone(), key.to_string()));
                }
            }
            match page.next {
                Some(next) if self.http.same_origin(&next) => url = next,
                Some(_) => break,
                None => {
                    complete = true;
                    break;
                }
            }
        }
        let since = rfc3339_ms(q.since_ms);
        if !complete {
            return Ok(HeldLookup::Unsure(format!(
                "Replicate lists more than {} predictions since {since}, more than tally reads to be sure",
                HELD_MAX_PAGES * 100
            )));
        }
        found.sort();
        found.dedup();
        Ok(match (found.as_slice(), same_prompt, unreadable) {
            ([(id, key)], _, _) => HeldLookup::Found { job: JobHandle::id(id.clone()), key: key.clone() },
            ([_, _, ..], _, _) => HeldLookup::Unsure(format!(
                "Replicate shows {} predictions carrying this job's mark, so tally cannot tell which one counts",
                found.len()
            )),
            ([], 0, 0) => HeldLookup::Absent(format!(
                "Replicate's list of this account's predictions since {since} (read to its end) shows none with this \
                 job's prompt"
            )),
            ([], 0, n) => HeldLookup::Unsure(format!(
                "{n} of Replicate's predictions since {since} no longer show their inputs (Replicate removes them \
                 after about an hour), so one of them may be this job's"
            )),
            ([], n, _) => HeldLookup::Unsure(format!(
                "Replicate shows {n} prediction(s) since {since} with this job's prompt but without its mark (another \
                 job with the same prompt, or a model version that did not take tally's seed)"
            )),
        })
    }

    /// Turn a prediction into a job state, downloading its first output.
    async fn state(&self, p: Prediction) -> Result<JobState, CallError> {
        match p.status.as_str() {
            "starting" | "processing" => Ok(JobState::Running),
            "succeeded" => {
                let url = match &p.output {
                    Value::String(u) => Some(u.as_str()),
                    Value::Array(items) => items.iter().find_map(Value::as_str),
                    _ => None,
                };
                let completed = p.completed_at.as_deref().and_then(parse_time_ms);
                let retention_passed = completed.is_some_and(|at| REPLICATE_OUTPUTS.passed(at, now_ms()));
                let Some(url) = url.filter(|_| !p.data_removed) else {
                    // Replicate removes outputs after its retention time (`output: null`,
                    // `data_removed: true`): generated, probably charged, gone. Without that
                    // word, and within the retention, an empty output is not an expiry.
                    if p.data_removed || retention_passed || completed.is_none() {
                        return Ok(JobState::Expired);
                    }
                    return Ok(JobState::ResultUnavailable(format!(
                        "prediction {} succeeded without an output yet; {}, so tally asks again",
                        p.id, REPLICATE_OUTPUTS.words
                    )));
                };
                match self.http.download_retrying(url, DOWNLOAD_BUDGET).await {
                    ResultFetch::Image(image) => Ok(JobState::Done(image)),
                    ResultFetch::NotYet { tries, last, .. } => {
                        if retention_passed {
                            return Ok(JobState::Expired);
                        }
                        Ok(JobState::ResultUnavailable(format!(
                            "prediction {} succeeded, but its output could not be downloaded yet ({tries} tries; the \
                             last: {last}); {}, so tally tries again",
                            p.id, REPLICATE_OUTPUTS.words
                        )))
                    }
                    ResultFetch::Failed(CallError::Rejected { message, .. }) => Err(CallError::Unusable(format!(
                        "prediction {} succeeded (probably charged) but its output could not be downloaded: {message}",
                        p.id
                    ))),
                    ResultFetch::Failed(e) => Err(e),
                }
            }
            "canceled" => {
                let logs = p.logs.as_deref().and_then(logs_tail).map(|t| format!("; its last log lines: {t}"));
                Ok(JobState::Canceled(self.http.redact(&format!(
                    "prediction {} was canceled at Replicate (by someone with access to the account, or because it \
                     passed its deadline), not by tally; Replicate bills the compute time a prediction used before it \
                     was canceled{}",
                    p.id,
                    logs.unwrap_or_default()
                ))))
            }
            "failed" | "aborted" => {
                let why =
                    match (p.error.as_str().filter(|e| !e.trim().is_empty()), p.logs.as_deref().and_then(logs_tail)) {
                        (Some(e), _) => e.to_string(),
                        (None, Some(tail)) => {
                            format!(
                                "prediction {} {} without an error message; its last log lines: {tail}",
                                p.id, p.status
                            )
                        }
                        (None, None) => format!("prediction {} {} without an error message or logs", p.id, p.status),
                    };
                Ok(JobState::Failed(self.http.redact(&why)))
            }
            other => Err(CallError::Ambiguous(format!("prediction {} has unknown status `{other}`", p.id))),
        }
    }
}

/// Replicate's list of the account's predictions.
pub fn dashboard(cfg: &ProviderConfig) -> Dashboard {
    Dashboard {
        page: "replicate_predictions".into(),
        url: Some("https://replicate.com/predictions".into()),
        label: "Replicate's list of predictions".into(),
        how: "Every prediction of the account is listed with its model, time and status; open the one sent \
              at this time with this prompt (or with the prediction id below) to see whether it succeeded."
            .into(),
        lists_requests: true,
        model: cfg.model.as_deref().map(|m| m.split(':').next().unwrap_or(m).to_string()),
    }
}

impl Provider for Replicate {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: true }
    }

    fn rate_limit_hold(&self) -> Option<Duration> {
        self.http.rate_limit_hold()
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn preflight<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            self.http.check_key()?;
            let schema = self.schema().await?;
            self.build_input(req, &schema).map(|_| ())
        })
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            let schema = self.schema().await?;
            let input = Value::Object(self.build_input(req, &schema)?);
            let base = self.http.base_url();
            let (url, body) = match &self.version {
                Some(v) => (format!("{base}/v1/predictions"), serde_json::json!({"version": v, "input": input})),
                None => {
                    (format!("{base}/v1/models/{}/predictions", self.model_name()), serde_json::json!({"input": input}))
                }
            };
            let rb = self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&body);
            let p: Prediction = self.http.send_json(rb).await?;
            if p.id.is_empty() {
                return Err(CallError::Ambiguous("the provider accepted the prediction without an id".into()));
            }
            Ok(Submitted::Accepted(JobHandle::id(p.id)))
        })
    }

    fn poll<'a>(&'a self, job: &'a JobHandle) -> BoxFuture<'a, Result<JobState, CallError>> {
        Box::pin(async move {
            let id = job.id.as_str();
            if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(CallError::Rejected { message: format!("`{id}` is not a prediction id"), config: false });
            }
            let url = format!("{}/v1/predictions/{id}", self.http.base_url());
            let p: Prediction = self.http.send_json(self.http.request(Method::GET, &url, None)?).await?;
            self.state(p).await
        })
    }

    fn find_held<'a>(&'a self, q: &'a HeldQuery) -> BoxFuture<'a, Result<HeldLookup, CallError>> {
        Box::pin(self.held(q))
    }

    fn find<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Option<JobHandle>, CallError>> {
        Box::pin(async move {
            let schema = self.schema().await?;
            let Ok(sent) = self.build_input(req, &schema) else { return Ok(None) };
            let skew = CLOCK_SKEW.as_millis() as i64;
            let window = (req.calling_at_ms - skew, req.calling_at_ms + self.request_timeout.as_millis() as i64 + skew);
            let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
            let query = format!(
                "created_after={}&created_before={}",
                rfc3339_ms(window.0),
                rfc3339_ms(window.1.min(now_ms + skew).max(window.0 + 1000))
            );
            let mut url = format!("{}/v1/predictions?{}", self.http.base_url(), query.replace(':', "%3A"));
            let mut found: Vec<String> = Vec::new();
            for _ in 0..FIND_MAX_PAGES {
                let page: PredictionPage = self.http.send_json(self.http.request(Method::GET, &url, None)?).await?;
                found.extend(
                    page.results.iter().filter(|p| self.matches(p, &sent, &schema, window)).map(|p| p.id.clone()),
                );
                // Follow `next` only on base_url's origin: the request carries the API key.
                match page.next {
                    Some(next) if self.http.same_origin(&next) => url = next,
                    Some(next) => {
                        tracing::warn!(next = %next.split('?').next().unwrap_or(""), "not following a listing link to another origin");
                        break;
                    }
                    None => break,
                }
            }
            found.dedup();
            match found.as_slice() {
                [one] => Ok(Some(JobHandle::id(one.clone()))),
                [] => Ok(None),
                many => {
                    tracing::info!(
                        candidates = many.len(),
                        "several predictions match the lost create; proving nothing"
                    );
                    Ok(None)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_map_to_the_closest_aspect_ratio() {
        let r = ["1:1", "16:9", "21:9", "3:2", "2:3", "4:5", "5:4", "3:4", "4:3", "9:16", "9:21", "custom"];
        assert_eq!(closest_ratio(&r, 1024, 1024), Some("1:1"));
        assert_eq!(closest_ratio(&r, 1536, 1024), Some("3:2"));
        assert_eq!(closest_ratio(&r, 1024, 1792), Some("9:16"));
        assert_eq!(closest_ratio(&[], 1024, 1024), None);
    }

    #[test]
    fn seeds_are_stable_per_execution() {
        assert_eq!(seed_for("tally-a"), seed_for("tally-a"));
        assert_ne!(seed_for("tally-a"), seed_for("tally-b"));
        assert!(seed_for("x") >= 0);
    }

    #[test]
    fn listing_times_parse_with_or_without_fractions() {
        let a = parse_time_ms("2026-12-01T10:00:00.123456Z").unwrap();
        let b = parse_time_ms("2026-12-01T10:00:00Z").unwrap();
        assert!((a - b).abs() < 1000, "{a} {b}");
    }
}
