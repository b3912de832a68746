//! The `replicate` adapter: submit a prediction, poll it by id, and find one whose create
//! answer was lost by listing recent predictions.
//!
//! Each create carries `input.tally_marker = <idempotency key>`; `find` lists
//! `GET /v1/predictions` (a few pages at most) and matches that marker, so a create whose
//! answer was lost can still be polled instead of resent.

use std::time::{Duration, UNIX_EPOCH};

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::client::{AuthScheme, Download, HttpClient};
use super::{data_uri, merge_params, parse_size};
use crate::config::ProviderConfig;
use crate::providers::{BoxFuture, CallError, CallRequest, Capabilities, JobState, Provider, Submitted};

/// How many pages of `GET /v1/predictions` `find` reads before giving up.
const FIND_MAX_PAGES: usize = 3;

/// Tolerated clock difference between tally and the provider when matching `created_at`.
const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// The Replicate predictions API.
#[derive(Debug)]
pub struct Replicate {
    http: HttpClient,
    model: String,
    size: String,
    poll_interval: Duration,
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
    created_at: Option<String>,
}

#[derive(Deserialize)]
struct PredictionPage {
    #[serde(default)]
    results: Vec<Prediction>,
    next: Option<String>,
}

impl Replicate {
    /// Build the adapter; `model` must be `owner/name`.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
        let model = cfg.model.clone().unwrap_or_default();
        match model.split_once('/') {
            Some((owner, name)) if !owner.is_empty() && !name.is_empty() && !name.contains('/') => {}
            _ => return Err(format!("provider `{}`: model `{model}` must be `owner/name`", cfg.name)),
        }
        Ok(Replicate {
            http: HttpClient::new(cfg, AuthScheme::Bearer)?,
            model,
            size: cfg.size.clone(),
            poll_interval: cfg.poll_interval,
        })
    }

    fn create_body(&self, req: &CallRequest) -> Value {
        let mut input = Map::new();
        if let Some((w, h)) = parse_size(&self.size) {
            input.insert("width".into(), w.into());
            input.insert("height".into(), h.into());
        }
        merge_params(&mut input, &req.params, &["prompt", "tally_marker", "input_images"]);
        input.insert("prompt".into(), req.prompt.clone().into());
        input.insert("tally_marker".into(), req.idempotency_key.clone().into());
        if !req.references.is_empty() {
            input.insert("input_images".into(), req.references.iter().map(data_uri).collect::<Vec<_>>().into());
        }
        serde_json::json!({ "input": input })
    }

    /// Turn a finished prediction into a job state, downloading its first output.
    async fn finished(&self, p: Prediction) -> Result<JobState, CallError> {
        match p.status.as_str() {
            "starting" | "processing" => Ok(JobState::Running),
            "succeeded" => {
                let url = match &p.output {
                    Value::String(u) => Some(u.as_str()),
                    Value::Array(items) => items.iter().find_map(Value::as_str),
                    _ => None,
                };
                let Some(url) = url else {
                    return Err(CallError::Rejected {
                        message: format!("prediction {} succeeded without an output URL", p.id),
                        config: false,
                    });
                };
                match self.http.download(url).await? {
                    Download::Image(image) => Ok(JobState::Done(image)),
                    Download::Gone => Ok(JobState::Expired),
                }
            }
            "failed" | "canceled" | "aborted" => {
                let why = p.error.as_str().map(str::to_string).unwrap_or_else(|| format!("prediction {}", p.status));
                Ok(JobState::Failed(why))
            }
            other => Err(CallError::Ambiguous(format!("prediction {} has unknown status `{other}`", p.id))),
        }
    }
}

/// Whether a listed prediction was created by this execution.
fn matches(p: &Prediction, req: &CallRequest) -> bool {
    if p.input.get("tally_marker").and_then(Value::as_str) != Some(req.idempotency_key.as_str()) {
        return false;
    }
    let created_ms = p
        .created_at
        .as_deref()
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_millis() as i64));
    match created_ms {
        Some(ms) => ms + CLOCK_SKEW.as_millis() as i64 >= req.calling_at_ms,
        None => true,
    }
}

impl Provider for Replicate {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: true }
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            let url = format!("{}/v1/models/{}/predictions", self.http.base_url(), self.model);
            let rb = self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&self.create_body(req));
            let p: Prediction = self.http.send_json(rb).await?;
            if p.id.is_empty() {
                return Err(CallError::Ambiguous("the provider accepted the prediction without an id".into()));
            }
            Ok(Submitted::Accepted(p.id))
        })
    }

    fn poll<'a>(&'a self, job_id: &'a str) -> BoxFuture<'a, Result<JobState, CallError>> {
        Box::pin(async move {
            if job_id.is_empty() || !job_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(CallError::Rejected {
                    message: format!("`{job_id}` is not a prediction id"),
                    config: false,
                });
            }
            let url = format!("{}/v1/predictions/{job_id}", self.http.base_url());
            let p: Prediction = self.http.send_json(self.http.request(Method::GET, &url, None)?).await?;
            self.finished(p).await
        })
    }

    fn find<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Option<String>, CallError>> {
        Box::pin(async move {
            let mut url = format!("{}/v1/predictions", self.http.base_url());
            for _ in 0..FIND_MAX_PAGES {
                let page: PredictionPage = self.http.send_json(self.http.request(Method::GET, &url, None)?).await?;
                if let Some(p) = page.results.iter().find(|p| matches(p, req)) {
                    return Ok(Some(p.id.clone()));
                }
                // Follow `next` only on the provider's own host: it carries our credentials.
                match page.next {
                    Some(next) if next.starts_with(self.http.base_url()) => url = next,
                    _ => break,
                }
            }
            Ok(None)
        })
    }
}
