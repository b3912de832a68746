//! The `openai_images` adapter: OpenAI-compatible synchronous image generation.
//!
//! `POST {base_url}/v1/images/generations` (JSON) or, with reference images,
//! `POST {base_url}/v1/images/edits` (multipart, one `image[]` part per reference, as
//! openai-python sends arrays). `base_url` may end in `/v1` (as the SDKs take it) or not. The
//! image comes back in the answer (`data[0].b64_json`, or `data[0].url` to download, as many
//! compatible gateways answer). There is no job id and no listing, so a lost answer stays
//! unknown — unless the endpoint honours the configured idempotency header (never
//! api.openai.com: refused at start-up), in which case a resend with the same key is safe.
//!
//! An image answered by URL is downloaded with retries (a 404 or 5xx from the file host is a
//! blip) for as long as OpenAI documents that such URLs stay valid: 60 minutes from the answer
//! (less what has passed since the call); only after that is it called expired.
//!
//! Anything that goes wrong after the create's answer arrived (a result URL that cannot be
//! downloaded, bytes that are not an image) is [`CallError::Unusable`]: the request was
//! accepted and probably charged, so it is never "not sent" and never sent again.

use std::time::Duration;

use base64::Engine as _;
use reqwest::Method;
use reqwest::multipart::{Form, Part};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::providers::ProviderConfig;
use crate::providers::dashboard::Dashboard;
use crate::providers::http::client::{AuthScheme, HttpClient, ResultFetch, Retention, image_from_bytes, now_ms};
use crate::providers::http::{api_root, check_output_format, merge_params};
use crate::providers::{BoxFuture, CallError, CallRequest, Capabilities, Image, Provider, Submitted, extension};

/// Output formats tally can store, as OpenAI names them (`output_format`).
const STORABLE_FORMATS: &[&str] = &["png", "jpeg", "webp"];

/// OpenAI's documented validity of an image URL answer: 60 minutes.
pub const OPENAI_URLS: Retention =
    Retention { keep: Duration::from_secs(3600), words: "OpenAI image URLs are valid for 60 minutes" };

/// An OpenAI-compatible synchronous images endpoint.
#[derive(Debug)]
pub struct OpenaiImages {
    http: HttpClient,
    model: Option<String>,
    size: String,
    poll_interval: Duration,
}

#[derive(Deserialize)]
struct ImagesResponse {
    #[serde(default)]
    data: Vec<ImageData>,
}

#[derive(Deserialize)]
struct ImageData {
    b64_json: Option<String>,
    url: Option<String>,
}

impl OpenaiImages {
    /// Build the adapter from its configuration.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
        Ok(OpenaiImages {
            http: HttpClient::new(&api_root(cfg), AuthScheme::Bearer)?,
            model: cfg.model.clone(),
            size: cfg.size.clone(),
            poll_interval: cfg.poll_interval,
        })
    }

    fn generations(&self, req: &CallRequest) -> Result<reqwest::RequestBuilder, CallError> {
        let mut body = Map::new();
        if let Some(model) = &self.model {
            body.insert("model".into(), model.clone().into());
        }
        body.insert("size".into(), self.size.clone().into());
        merge_params(&mut body, &req.params, &["prompt", "n"]);
        body.insert("prompt".into(), req.prompt.clone().into());
        body.insert("n".into(), 1.into());
        let url = format!("{}/v1/images/generations", self.http.base_url());
        Ok(self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&Value::Object(body)))
    }

    fn edits(&self, req: &CallRequest) -> Result<reqwest::RequestBuilder, CallError> {
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let mut fields = Map::new();
        if let Some(model) = &self.model {
            fields.insert("model".into(), model.clone().into());
        }
        fields.insert("size".into(), self.size.clone().into());
        merge_params(&mut fields, &req.params, &["prompt", "n", "image", "image[]"]);
        let mut form = Form::new().text("prompt", req.prompt.clone()).text("n", "1");
        for (k, v) in &fields {
            form = form.text(k.clone(), text(v));
        }
        for (i, image) in req.references.iter().enumerate() {
            let part = Part::bytes(image.bytes.clone())
                .file_name(format!("reference-{i}.{}", extension(&image.media_type)))
                .mime_str(&image.media_type)
                .map_err(|e| CallError::NotSent(format!("reference image {i}: {e}")))?;
            form = form.part("image[]", part);
        }
        let url = format!("{}/v1/images/edits", self.http.base_url());
        Ok(self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.multipart(form))
    }

    /// Download the image the provider answered with by URL, retrying within the URL's
    /// documented validity (counted from `calling_at_ms`, before the answer) and until the
    /// engine's deadline for the call, whichever comes first. The create was answered, so
    /// every failure here is `Unusable` (probably charged), never `NotSent`.
    async fn fetch_result(&self, url: &str, req: &CallRequest) -> Result<Image, CallError> {
        let calling_at_ms = req.calling_at_ms;
        let elapsed = Duration::from_millis(now_ms().saturating_sub(calling_at_ms).max(0) as u64);
        let until_deadline = Duration::from_millis(req.deadline_ms.saturating_sub(now_ms()).max(0) as u64);
        let budget = OPENAI_URLS.keep.saturating_sub(elapsed).min(until_deadline);
        let what = match self.http.download_retrying(url, budget).await {
            ResultFetch::Image(image) => return Ok(image),
            ResultFetch::NotYet { tries, last, gone } if gone && OPENAI_URLS.passed(calling_at_ms, now_ms()) => {
                format!("it expired ({}; {tries} tries, the last: {last})", OPENAI_URLS.words)
            }
            ResultFetch::NotYet { tries, last, .. } => format!("{tries} tries; the last: {last}"),
            ResultFetch::Failed(e) => e.to_string(),
        };
        Err(CallError::Unusable(format!(
            "the provider generated the image (probably charged) but its result URL could not be downloaded: {what}"
        )))
    }
}

/// OpenAI's usage page: images per model and time (UTC), not single requests. An
/// OpenAI-compatible gateway (another host) gets no OpenAI link: its account is not OpenAI's.
pub fn dashboard(cfg: &ProviderConfig) -> Dashboard {
    let host = cfg
        .base_url
        .as_deref()
        .and_then(|u| reqwest::Url::parse(u).ok())
        .and_then(|u| u.host_str().map(str::to_string));
    if host.as_deref() != Some("api.openai.com") {
        return Dashboard::gateway().with_model(cfg.model.as_deref());
    }
    Dashboard {
        page: "openai_usage".into(),
        url: Some("https://platform.openai.com/usage".into()),
        label: "OpenAI's usage page".into(),
        how: "It counts images per model and time (in UTC), not single requests: look for an image of this \
              model at the time it was sent. Only the organization's owners (or people given usage access) \
              can see it."
            .into(),
        lists_requests: false,
        model: Some(cfg.model.clone().unwrap_or_else(|| "gpt-image-1".into())),
    }
}

impl Provider for OpenaiImages {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: false }
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
            check_output_format(&req.params, STORABLE_FORMATS)
        })
    }

    /// `GET /v1/models`: free, and answers 401 for a key the API does not take.
    fn check_access(&self) -> BoxFuture<'_, Result<String, CallError>> {
        Box::pin(async move {
            self.http.check_key()?;
            let url = format!("{}/v1/models", self.http.base_url());
            let answer: Value = self.http.send_json(self.http.request(Method::GET, &url, None)?).await?;
            let n = answer.get("data").and_then(Value::as_array).map_or(0, Vec::len);
            Ok(format!("the key works: the provider listed {n} model(s), and nothing was charged"))
        })
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            let rb = if req.references.is_empty() { self.generations(req)? } else { self.edits(req)? };
            let answer: ImagesResponse = self.http.send_json(rb).await?;
            let first = answer.data.into_iter().next().ok_or_else(|| {
                CallError::Unusable("the provider answered 2xx without an image (empty `data`)".into())
            })?;
            let image = if let Some(b64) = first.b64_json {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| CallError::Unusable(format!("the provider's b64_json is not base64: {e}")))?;
                image_from_bytes(bytes)?
            } else if let Some(url) = first.url {
                self.fetch_result(&url, req).await?
            } else {
                return Err(CallError::Unusable("the provider's answer has neither b64_json nor url".into()));
            };
            Ok(Submitted::Done(image))
        })
    }
}
