//! The `openai_images` adapter: OpenAI-compatible synchronous image generation.
//!
//! `POST {base_url}/v1/images/generations` (JSON) or, with reference images,
//! `POST {base_url}/v1/images/edits` (multipart, one `image[]` part per reference). The image
//! comes back in the answer (`data[0].b64_json`, or `data[0].url` to download). There is no
//! job id and no listing, so a lost answer stays unknown — unless the endpoint honours the
//! configured idempotency header, in which case a resend with the same key is safe.

use std::time::Duration;

use base64::Engine as _;
use reqwest::Method;
use reqwest::multipart::{Form, Part};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::client::{AuthScheme, Download, HttpClient, image_from_bytes};
use super::merge_params;
use crate::config::ProviderConfig;
use crate::providers::{BoxFuture, CallError, CallRequest, Capabilities, Provider, Submitted, extension};

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
            http: HttpClient::new(cfg, AuthScheme::Bearer)?,
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
}

impl Provider for OpenaiImages {
    fn capabilities(&self) -> Capabilities {
        Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: false }
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            let rb = if req.references.is_empty() { self.generations(req)? } else { self.edits(req)? };
            let answer: ImagesResponse = self.http.send_json(rb).await?;
            let first = answer.data.into_iter().next().ok_or_else(|| CallError::Rejected {
                message: "the provider answered without an image (empty `data`)".into(),
                config: false,
            })?;
            let image = if let Some(b64) = first.b64_json {
                let bytes =
                    base64::engine::general_purpose::STANDARD.decode(b64.trim()).map_err(|e| CallError::Rejected {
                        message: format!("the provider's b64_json is not base64: {e}"),
                        config: false,
                    })?;
                image_from_bytes(bytes)?
            } else if let Some(url) = first.url {
                match self.http.download(&url).await? {
                    Download::Image(image) => image,
                    Download::Gone => {
                        return Err(CallError::Rejected {
                            message: "the provider's result URL was already gone (404/410)".into(),
                            config: false,
                        });
                    }
                }
            } else {
                return Err(CallError::Rejected {
                    message: "the provider's answer has neither b64_json nor url".into(),
                    config: false,
                });
            };
            Ok(Submitted::Done(image))
        })
    }
}
