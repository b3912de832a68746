//! The `fal_queue` adapter: fal's queue API. Submit returns a request id; poll its status,
//! then fetch the result and download the image.
//!
//! fal offers no listing of recent requests, so `find` proves nothing (`Ok(None)`): only a
//! create whose answer arrived (and whose id was persisted) can be recovered.

use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::client::{AuthScheme, Download, HttpClient};
use super::{data_uri, merge_params, parse_size};
use crate::config::ProviderConfig;
use crate::providers::{BoxFuture, CallError, CallRequest, Capabilities, JobState, Provider, Submitted};

/// fal's queue API for one model (e.g. `fal-ai/flux/dev`).
#[derive(Debug)]
pub struct FalQueue {
    http: HttpClient,
    model: String,
    size: String,
    poll_interval: Duration,
}

#[derive(Deserialize)]
struct Queued {
    #[serde(default)]
    request_id: String,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    status: String,
}

#[derive(Deserialize)]
struct FalResult {
    #[serde(default)]
    images: Vec<FalImage>,
}

#[derive(Deserialize)]
struct FalImage {
    url: String,
}

impl FalQueue {
    /// Build the adapter; `model` is the path after `base_url`.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
        let model = cfg.model.clone().unwrap_or_default().trim_matches('/').to_string();
        if model.is_empty() {
            return Err(format!("provider `{}`: model is required for kind fal_queue", cfg.name));
        }
        Ok(FalQueue {
            http: HttpClient::new(cfg, AuthScheme::Key)?,
            model,
            size: cfg.size.clone(),
            poll_interval: cfg.poll_interval,
        })
    }

    fn request_url(&self, id: &str) -> String {
        format!("{}/{}/requests/{id}", self.http.base_url(), self.model)
    }
}

impl Provider for FalQueue {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: true }
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            let mut body = Map::new();
            if let Some((w, h)) = parse_size(&self.size) {
                body.insert("image_size".into(), serde_json::json!({"width": w, "height": h}));
            }
            merge_params(&mut body, &req.params, &["prompt", "image_urls"]);
            body.insert("prompt".into(), req.prompt.clone().into());
            if !req.references.is_empty() {
                body.insert("image_urls".into(), req.references.iter().map(data_uri).collect::<Vec<_>>().into());
            }
            let url = format!("{}/{}", self.http.base_url(), self.model);
            let rb = self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&Value::Object(body));
            let queued: Queued = self.http.send_json(rb).await?;
            if queued.request_id.is_empty() {
                return Err(CallError::Ambiguous("the provider queued the request without a request_id".into()));
            }
            Ok(Submitted::Accepted(queued.request_id))
        })
    }

    fn poll<'a>(&'a self, job_id: &'a str) -> BoxFuture<'a, Result<JobState, CallError>> {
        Box::pin(async move {
            if job_id.is_empty() || !job_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(CallError::Rejected { message: format!("`{job_id}` is not a request id"), config: false });
            }
            let status_url = format!("{}/status", self.request_url(job_id));
            let status: Status = self.http.send_json(self.http.request(Method::GET, &status_url, None)?).await?;
            match status.status.as_str() {
                "IN_QUEUE" | "IN_PROGRESS" => return Ok(JobState::Running),
                "COMPLETED" => {}
                other => return Err(CallError::Ambiguous(format!("request {job_id} has unknown status `{other}`"))),
            }
            // A completed request whose result is gone has expired; one whose result fetch is
            // refused failed at the provider.
            let rb = self.http.request(Method::GET, &self.request_url(job_id), None)?;
            let result: FalResult = match self.http.send_json_or_gone(rb).await {
                Ok(Some(result)) => result,
                Ok(None) => return Ok(JobState::Expired),
                Err(CallError::Rejected { message, config: false }) => return Ok(JobState::Failed(message)),
                Err(e) => return Err(e),
            };
            let Some(first) = result.images.first() else {
                return Ok(JobState::Failed(format!("request {job_id} completed without images")));
            };
            match self.http.download(&first.url).await? {
                Download::Image(image) => Ok(JobState::Done(image)),
                Download::Gone => Ok(JobState::Expired),
            }
        })
    }

    fn find<'a>(&'a self, _req: &'a CallRequest) -> BoxFuture<'a, Result<Option<String>, CallError>> {
        // fal has no listing of recent requests: nothing can be proven.
        Box::pin(async { Ok(None) })
    }
}
