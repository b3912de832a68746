//! The `bfl` adapter: Black Forest Labs' FLUX API (`flux-pro-1.1`, `flux-kontext-pro`, …),
//! the key in `x-key`.
//!
//! `POST {base_url}/v1/{model}` answers `{id, polling_url}` before the work starts; both are
//! the job's handle, persisted at `accepted`, and the `polling_url` given is what is polled
//! (BFL: "you must use the polling_url returned") — when it is on `base_url`'s origin, the
//! only one the key is sent to; otherwise `{base_url}/v1/get_result?id=…` is polled instead.
//! Use a regional `base_url` (`https://api.eu.bfl.ai`, `https://api.us.bfl.ai`) whose
//! polling URLs stay on it. Statuses: `Pending`, `Ready` (`result.sample`, a URL signed for
//! 10 minutes: downloaded at once), `Error`/`Failed`, `Request Moderated`/`Content Moderated`
//! (BFL does not charge moderated requests), `Task not found`.
//!
//! A sample that cannot be downloaded is tried again on the next poll
//! ([`JobState::ResultUnavailable`]); "expired" is said only once 10 minutes have passed since
//! the result's `end_time` ([`SAMPLE_RETENTION`]); without an `end_time`, never. BFL
//! has no listing and no idempotency key, so a create whose answer was lost cannot be found:
//! the task is `unknown` ([`Provider::finds_lost_creates`] is false). A 429 means too many
//! active tasks (24; 6 for `flux-kontext-max`): "not now". A 402 means the account is out of
//! credits: a configuration problem, nothing charged.
//!
//! Reference photos: the Kontext models take `input_image` (and `input_image_2`…`_4`), the
//! FLUX.2 models up to 8, base64; other models take none, and a shot with references is
//! refused before anything is sent.

use std::time::Duration;

use base64::Engine as _;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::providers::ProviderConfig;
use crate::providers::dashboard::Dashboard;
use crate::providers::http::client::{AuthScheme, Download, HttpClient, Retention, now_ms};
use crate::providers::http::{api_root, check_output_format, merge_params, parse_size};
use crate::providers::{
    BoxFuture, CallError, CallRequest, Capabilities, HeldLookup, HeldQuery, JobHandle, JobState, Provider, Submitted,
};

/// How long BFL signs a result URL for, counted from the result's `end_time`.
pub const SAMPLE_RETENTION: Retention =
    Retention { keep: Duration::from_secs(600), words: "BFL signs a result's URL for 10 minutes" };

/// BFL's API for one model.
#[derive(Debug)]
pub struct Bfl {
    http: HttpClient,
    model: String,
    size: String,
    poll_interval: Duration,
}

#[derive(Deserialize)]
struct Created {
    #[serde(default)]
    id: String,
    polling_url: Option<String>,
}

#[derive(Deserialize)]
struct Polled {
    #[serde(default)]
    status: String,
    #[serde(default)]
    result: Value,
    #[serde(default)]
    details: Value,
}

impl Bfl {
    /// Build the adapter; `model` is the endpoint after `/v1/` (`flux-pro-1.1`).
    pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
        let model = cfg.model.clone().unwrap_or_default().trim().trim_matches('/').to_string();
        if model.is_empty() || !model.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')) {
            return Err(format!("provider `{}`: model `{model}` is not a BFL endpoint such as flux-pro-1.1", cfg.name));
        }
        Ok(Bfl {
            http: HttpClient::new(&api_root(cfg), AuthScheme::Header("x-key"))?,
            model,
            size: cfg.size.clone(),
            poll_interval: cfg.poll_interval,
        })
    }

    /// How many reference photos the model takes (`input_image`, `input_image_2`, …).
    fn max_references(&self) -> usize {
        if self.model.starts_with("flux-kontext") {
            4
        } else if self.model.starts_with("flux-2") {
            8
        } else {
            0
        }
    }

    /// Kontext models take an aspect ratio; the others width and height.
    fn takes_aspect_ratio(&self) -> bool {
        self.model.starts_with("flux-kontext") || self.model.ends_with("-ultra")
    }

    fn check(&self, req: &CallRequest) -> Result<(), CallError> {
        self.http.check_key()?;
        check_output_format(&req.params, &["png", "jpeg"])?;
        let max = self.max_references();
        if req.references.len() > max {
            let message = if max == 0 {
                format!(
                    "this shot has {} reference photo(s), but BFL's {} takes no input image (the Kontext and FLUX.2 \
                     models do), so they would be dropped; nothing was sent",
                    req.references.len(),
                    self.model
                )
            } else {
                format!(
                    "this shot has {} reference photos, but BFL's {} takes at most {max}; nothing was sent",
                    req.references.len(),
                    self.model
                )
            };
            return Err(CallError::Rejected { message, config: max == 0 });
        }
        if let Some(n) = req.params.get("n").filter(|n| n.as_u64() != Some(1)) {
            return Err(CallError::Rejected {
                message: format!(
                    "params.n = {n}: a BFL request makes one image; make one task per image. Nothing was sent"
                ),
                config: false,
            });
        }
        Ok(())
    }

    fn body(&self, req: &CallRequest) -> Value {
        let mut body = Map::new();
        if let Some((w, h)) = parse_size(&self.size) {
            if self.takes_aspect_ratio() {
                let g = gcd(w, h).max(1);
                body.insert("aspect_ratio".into(), format!("{}:{}", w / g, h / g).into());
            } else {
                body.insert("width".into(), w.into());
                body.insert("height".into(), h.into());
            }
        }
        body.insert("output_format".into(), "png".into());
        let reserved: Vec<String> = ["prompt", "n", "input_image"]
            .iter()
            .map(|s| s.to_string())
            .chain((2..=8).map(|i| format!("input_image_{i}")))
            .chain(["webhook_url".into(), "webhook_secret".into()])
            .collect();
        let reserved: Vec<&str> = reserved.iter().map(String::as_str).collect();
        merge_params(&mut body, &req.params, &reserved);
        body.insert("prompt".into(), req.prompt.clone().into());
        for (i, r) in req.references.iter().enumerate() {
            let key = if i == 0 { "input_image".to_string() } else { format!("input_image_{}", i + 1) };
            body.insert(key, base64::engine::general_purpose::STANDARD.encode(&r.bytes).into());
        }
        Value::Object(body)
    }

    /// The URL to poll: the `polling_url` BFL gave, when the key may go there.
    fn polling_url(&self, job: &JobHandle) -> String {
        job.data
            .as_ref()
            .and_then(|d| d.get("polling_url"))
            .and_then(Value::as_str)
            .filter(|u| self.http.same_origin(u))
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}/v1/get_result?id={}", self.http.base_url(), job.id))
    }

    /// Download a `Ready` result's sample. A failure inside the signing window is asked again
    /// on the next poll; only one after it (from the result's `end_time`) is "expired".
    async fn fetch_sample(&self, id: &str, result: &Value) -> Result<JobState, CallError> {
        let Some(url) = result.get("sample").and_then(Value::as_str) else {
            return Err(CallError::Unusable(format!("task {id} is Ready without result.sample")));
        };
        let window_over = result
            .get("end_time")
            .and_then(Value::as_f64)
            .is_some_and(|end| SAMPLE_RETENTION.passed((end * 1000.0) as i64, now_ms()));
        let failed = match self.http.download(url).await {
            Ok(Download::Image(image)) => return Ok(JobState::Done(image)),
            Ok(Download::Gone) => "the result URL answered 404/410".to_string(),
            // A signed URL past its time usually answers 403.
            Err(CallError::Rejected { message, .. }) => message,
            Err(e @ CallError::Unusable(_)) => return Err(e),
            Err(e) => e.to_string(),
        };
        if window_over {
            return Ok(JobState::Expired);
        }
        Ok(JobState::ResultUnavailable(format!(
            "task {id} is Ready but its image did not download yet ({failed}); {}, so it is tried again",
            SAMPLE_RETENTION.words
        )))
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// BFL's "not now" in plain words (a 402, out of credits, is already a configuration
/// refusal: `client::is_out_of_credit`).
fn bfl_error(e: CallError) -> CallError {
    match e {
        CallError::RetryAfter { after, message } if message.starts_with("HTTP 429") => CallError::RetryAfter {
            after,
            message: format!("BFL has too many active tasks for this account (at most 24): {message}"),
        },
        other => other,
    }
}

/// Black Forest Labs' dashboard: credits and usage per project.
pub fn dashboard(cfg: &ProviderConfig) -> Dashboard {
    Dashboard {
        page: "bfl_dashboard".into(),
        url: Some("https://dashboard.bfl.ai/".into()),
        label: "the BFL dashboard".into(),
        how: "It shows the credits used per project over time, not single requests: look for credits used \
              at the time it was sent."
            .into(),
        lists_requests: false,
        model: cfg.model.clone(),
    }
}

impl Provider for Bfl {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: true }
    }

    fn finds_lost_creates(&self) -> bool {
        false
    }

    fn billing_note(&self) -> String {
        crate::domain::words::say("say.bills_bfl")
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn preflight<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move { self.check(req) })
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            self.check(req)?;
            let url = format!("{}/v1/{}", self.http.base_url(), self.model);
            let rb = self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&self.body(req));
            let created: Created = self.http.send_json(rb).await.map_err(bfl_error)?;
            if created.id.is_empty() || !created.id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(CallError::Unusable(format!(
                    "BFL accepted the request with an unusable id `{}`",
                    created.id
                )));
            }
            let data = json!({"polling_url": created.polling_url});
            Ok(Submitted::Accepted(JobHandle { id: created.id, data: Some(data) }))
        })
    }

    fn poll<'a>(&'a self, job: &'a JobHandle) -> BoxFuture<'a, Result<JobState, CallError>> {
        Box::pin(async move {
            let id = job.id.as_str();
            if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(CallError::Rejected { message: format!("`{id}` is not a task id"), config: false });
            }
            let rb = self.http.request(Method::GET, &self.polling_url(job), None)?;
            let p: Polled = self.http.send_json(rb).await.map_err(bfl_error)?;
            let details = match &p.details {
                Value::Null => String::new(),
                Value::String(s) => format!(": {s}"),
                other => format!(": {other}"),
            };
            match p.status.as_str() {
                "Pending" => Ok(JobState::Running),
                "Ready" => self.fetch_sample(id, &p.result).await,
                "Request Moderated" => Ok(JobState::Refused(self.http.redact(&format!(
                    "BFL's moderation flagged the prompt or the reference photo before generating{details}"
                )))),
                "Content Moderated" => Ok(JobState::Refused(self.http.redact(&format!(
                    "BFL's moderation flagged the generated image, so it is not delivered{details}"
                )))),
                "Error" | "Failed" => {
                    Ok(JobState::Failed(self.http.redact(&format!("BFL reports the generation {}{details}", p.status))))
                }
                "Task not found" => Err(CallError::Rejected {
                    message: format!("BFL says task {id} does not exist or has expired (Task not found)"),
                    config: false,
                }),
                other => Err(CallError::Ambiguous(format!("task {id} has unknown status `{other}`"))),
            }
        })
    }

    fn find<'a>(&'a self, _req: &'a CallRequest) -> BoxFuture<'a, Result<Option<JobHandle>, CallError>> {
        // No listing and no idempotency key: nothing can be proven.
        Box::pin(async { Ok(None) })
    }

    /// BFL lists nothing a held job could be found in: unsure.
    fn find_held<'a>(&'a self, _q: &'a HeldQuery) -> BoxFuture<'a, Result<HeldLookup, CallError>> {
        Box::pin(async {
            Ok(HeldLookup::Unsure(
                "BFL gives a task id only in its answer to the submit, and lists no tasks in which tally could find \
                 this job"
                    .into(),
            ))
        })
    }
}
