//! The `fal_queue` adapter: fal's queue API. Submit to `{base_url}/{model}` (the whole app
//! id, subpath included, e.g. `fal-ai/flux/dev`); fal answers a `request_id` with the
//! `status_url`, `response_url` and `cancel_url` to use, which are persisted with the id (the
//! job's handle) and polled as given. fal's docs say the subpath is used for the submit but
//! **not** for status or results; with only an id (or a URL on another origin), the adapter
//! builds `{base_url}/{namespace/}{owner}/{alias}/requests/{id}` as both official clients do.
//!
//! A `COMPLETED` status that carries `error`/`error_type` is a failed request. fal offers no
//! listing this adapter can search for a create whose answer was lost
//! ([`Provider::finds_lost_creates`] is false): only a create whose answer arrived (and whose
//! handle was persisted) can be recovered; otherwise the task is `unknown` and says why.
//!
//! A paid result is never called expired before fal's documented media retention (at least 7
//! days, counted from the accepted create, whose time is kept in the job's handle): a result
//! fetch or image download that answers 404 or 5xx within it is `ResultUnavailable`, polled
//! again. A result fetch answering a 5xx marked `X-Fal-Retryable: false` is a failed request
//! fal does not bill (its docs: server errors are not charged).
//!
//! Reference images go to the input named by `reference_input` (models differ: `image_urls`,
//! `image_url`, …); without it, a shot with reference photos is refused before any call.

use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::providers::ProviderConfig;
use crate::providers::dashboard::Dashboard;
use crate::providers::http::client::{AuthScheme, HttpClient, ResultFetch, Retention, marked_not_retryable, now_ms};
use crate::providers::http::{check_output_format, data_uri, merge_params, parse_size};
use crate::providers::{
    BoxFuture, CallError, CallRequest, Capabilities, HeldLookup, HeldQuery, JobHandle, JobState, Provider, Submitted,
};

/// App namespaces whose ids have three parts before the subpath (as fal-client's `AppId`).
const NAMESPACES: &[&str] = &["workflows", "comfy"];

/// fal's documented retention of generated media (its CDN files): at least 7 days.
pub const FAL_MEDIA: Retention =
    Retention { keep: Duration::from_secs(7 * 24 * 3600), words: "fal keeps generated media for at least 7 days" };

/// How long one poll keeps trying to download a finished request's image before it reports
/// `ResultUnavailable` (the worker then polls again, with backoff, until its deadline).
const DOWNLOAD_BUDGET: Duration = Duration::from_secs(8);

/// Output formats tally can store, as fal models name them.
const STORABLE_FORMATS: &[&str] = &["png", "jpeg", "jpg", "webp"];

/// fal's queue API for one model (e.g. `fal-ai/flux/dev`).
#[derive(Debug)]
pub struct FalQueue {
    http: HttpClient,
    model: String,
    /// `{namespace/}owner/alias`: the model without its subpath.
    app: String,
    size: String,
    reference_input: Option<String>,
    poll_interval: Duration,
}

#[derive(Deserialize)]
struct Queued {
    #[serde(default)]
    request_id: String,
    status_url: Option<String>,
    response_url: Option<String>,
    cancel_url: Option<String>,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    status: String,
    error: Option<String>,
    error_type: Option<String>,
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

/// `{namespace/}owner/alias` of an app id, or `None` if it has fewer parts.
pub fn app_prefix(model: &str) -> Option<String> {
    let parts: Vec<&str> = model.split('/').filter(|p| !p.is_empty()).collect();
    let n = if parts.first().is_some_and(|p| NAMESPACES.contains(p)) { 3 } else { 2 };
    (parts.len() >= n).then(|| parts[..n].join("/"))
}

impl FalQueue {
    /// Build the adapter; `model` is the app id after `base_url` (`owner/alias[/subpath]`).
    pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
        let model = cfg.model.clone().unwrap_or_default().trim_matches('/').to_string();
        let app = app_prefix(&model).ok_or_else(|| {
            format!("provider `{}`: model `{model}` must be a fal app id like `fal-ai/flux/dev`", cfg.name)
        })?;
        Ok(FalQueue {
            http: HttpClient::new(cfg, AuthScheme::Key)?,
            model,
            app,
            size: cfg.size.clone(),
            reference_input: cfg.reference_input.clone(),
            poll_interval: cfg.poll_interval,
        })
    }

    /// `(status_url, response_url)` for a job: the URLs fal returned when they are on
    /// `base_url`'s origin (the only one the key goes to), else the ones built from the id.
    fn urls(&self, job: &JobHandle) -> (String, String) {
        let built = format!("{}/{}/requests/{}", self.http.base_url(), self.app, job.id);
        let given = |k: &str| {
            job.data
                .as_ref()
                .and_then(|d| d.get(k))
                .and_then(Value::as_str)
                .filter(|u| self.http.same_origin(u))
                .map(str::to_string)
        };
        (given("status_url").unwrap_or_else(|| format!("{built}/status")), given("response_url").unwrap_or(built))
    }

    fn check(&self, req: &CallRequest) -> Result<(), CallError> {
        self.http.check_key()?;
        check_output_format(&req.params, STORABLE_FORMATS)?;
        if !req.references.is_empty() && self.reference_input.is_none() {
            return Err(CallError::Rejected {
                message: format!(
                    "this shot has {} reference photo(s), but provider model `{}` has no reference_input configured \
                     (the name of the model's image input, e.g. image_urls), so they would be dropped; nothing was sent",
                    req.references.len(),
                    self.model
                ),
                config: true,
            });
        }
        Ok(())
    }
}

/// fal's request history.
pub fn dashboard(cfg: &ProviderConfig) -> Dashboard {
    Dashboard {
        page: "fal_requests".into(),
        url: Some("https://fal.ai/dashboard/requests".into()),
        label: "fal's request history".into(),
        how: "Requests are listed by endpoint and time with their status; find the one with the request id \
              below, or the one sent at this time."
            .into(),
        lists_requests: true,
        model: cfg.model.clone(),
    }
}

impl Provider for FalQueue {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: true }
    }

    fn finds_lost_creates(&self) -> bool {
        false
    }

    fn rate_limit_hold(&self) -> Option<Duration> {
        self.http.rate_limit_hold()
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
            let mut body = Map::new();
            if let Some((w, h)) = parse_size(&self.size) {
                body.insert("image_size".into(), serde_json::json!({"width": w, "height": h}));
            }
            let reference = self.reference_input.as_deref().filter(|_| !req.references.is_empty());
            merge_params(&mut body, &req.params, &["prompt", reference.unwrap_or("prompt")]);
            body.insert("prompt".into(), req.prompt.clone().into());
            if let Some(name) = reference {
                let uris: Vec<Value> = req.references.iter().map(|r| data_uri(r).into()).collect();
                // A singular input name (`image_url`) takes one image; a plural one a list.
                let value = if name.ends_with('s') || uris.len() != 1 { uris.into() } else { uris[0].clone() };
                body.insert(name.to_string(), value);
            }
            let url = format!("{}/{}", self.http.base_url(), self.model);
            let rb = self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&Value::Object(body));
            let q: Queued = self.http.send_json(rb).await?;
            if q.request_id.is_empty() {
                return Err(CallError::Ambiguous("the provider queued the request without a request_id".into()));
            }
            let data = serde_json::json!({
                "status_url": q.status_url,
                "response_url": q.response_url,
                "cancel_url": q.cancel_url,
                // When fal accepted it: its media retention is counted from here (at most
                // the run time later than fal's own clock, so never too early).
                "accepted_at_ms": now_ms(),
            });
            Ok(Submitted::Accepted(JobHandle { id: q.request_id, data: Some(data) }))
        })
    }

    fn poll<'a>(&'a self, job: &'a JobHandle) -> BoxFuture<'a, Result<JobState, CallError>> {
        Box::pin(async move {
            let id = job.id.as_str();
            if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(CallError::Rejected { message: format!("`{id}` is not a request id"), config: false });
            }
            let (status_url, response_url) = self.urls(job);
            let status: Status = self.http.send_json(self.http.request(Method::GET, &status_url, None)?).await?;
            match status.status.as_str() {
                "IN_QUEUE" | "IN_PROGRESS" => return Ok(JobState::Running),
                "COMPLETED" => {}
                other => return Err(CallError::Ambiguous(format!("request {id} has unknown status `{other}`"))),
            }
            if let Some(error) = status.error {
                let kind = status.error_type.map(|t| format!(" ({t})")).unwrap_or_default();
                return Ok(JobState::Failed(self.http.redact(&format!("{error}{kind}"))));
            }
            // Completed without an error. The result and its image are kept for fal's media
            // retention: until it passed, a 404 or 5xx is a blip to poll again, not an expiry.
            let accepted_at = job.data.as_ref().and_then(|d| d.get("accepted_at_ms")).and_then(Value::as_i64);
            let expired = || accepted_at.is_some_and(|at| FAL_MEDIA.passed(at, now_ms()));
            let not_yet = |what: &str| {
                if expired() {
                    JobState::Expired
                } else {
                    JobState::ResultUnavailable(format!(
                        "request {id} completed, but {what}; {}, so tally tries again",
                        FAL_MEDIA.words
                    ))
                }
            };
            let resp = self.http.send_unchecked(self.http.request(Method::GET, &response_url, None)?).await?;
            let status = resp.status();
            let final_error = status.is_server_error() && marked_not_retryable(resp.headers());
            let result: FalResult = match self.http.json_of(resp).await {
                Ok(result) => result,
                // fal marked the server error final: the request failed, and fal does not
                // bill requests that fail with a server error.
                Err(CallError::Rejected { message, .. }) if final_error => {
                    return Ok(JobState::FailedNotCharged(message));
                }
                Err(_) if status == reqwest::StatusCode::NOT_FOUND || status == reqwest::StatusCode::GONE => {
                    return Ok(not_yet(&format!("its result answered HTTP {}", status.as_u16())));
                }
                Err(CallError::Rejected { message, config: false }) => return Ok(JobState::Failed(message)),
                Err(CallError::Ambiguous(m)) => return Ok(not_yet(&format!("its result could not be read ({m})"))),
                Err(e) => return Err(e),
            };
            let Some(first) = result.images.first() else {
                return Ok(JobState::Failed(format!("request {id} completed without images")));
            };
            match self.http.download_retrying(&first.url, DOWNLOAD_BUDGET).await {
                ResultFetch::Image(image) => Ok(JobState::Done(image)),
                ResultFetch::NotYet { tries, last, .. } => {
                    Ok(not_yet(&format!("its image could not be downloaded yet ({tries} tries; the last: {last})")))
                }
                ResultFetch::Failed(CallError::Rejected { message, .. }) => Err(CallError::Unusable(format!(
                    "request {id} completed (probably charged) but its image could not be downloaded: {message}"
                ))),
                ResultFetch::Failed(e) => Err(e),
            }
        })
    }

    fn find<'a>(&'a self, _req: &'a CallRequest) -> BoxFuture<'a, Result<Option<JobHandle>, CallError>> {
        // No listing this adapter can search: nothing can be proven.
        Box::pin(async { Ok(None) })
    }

    /// A held job has no request id (fal answers it only to the submit) and no listing is read: unsure.
    fn find_held<'a>(&'a self, _q: &'a HeldQuery) -> BoxFuture<'a, Result<HeldLookup, CallError>> {
        Box::pin(async {
            Ok(HeldLookup::Unsure(
                "fal gives a request id only in its answer to the submit, which tally records after sending, so a copy \
                 taken before that answer has no id to ask about; and tally reads no list of fal's requests (its \
                 Platform API lists them by endpoint, but not documented to show queued ones or tally's inputs)"
                    .into(),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_prefixes_drop_the_subpath_as_fal_client_does() {
        assert_eq!(app_prefix("fal-ai/flux/dev").as_deref(), Some("fal-ai/flux"));
        assert_eq!(app_prefix("fal-ai/flux-pro/v1.1-ultra").as_deref(), Some("fal-ai/flux-pro"));
        assert_eq!(app_prefix("fal-ai/recraft-v3").as_deref(), Some("fal-ai/recraft-v3"));
        assert_eq!(app_prefix("workflows/me/wf/run").as_deref(), Some("workflows/me/wf"));
        assert_eq!(app_prefix("flux"), None);
    }
}
