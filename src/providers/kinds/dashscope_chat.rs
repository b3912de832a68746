//! The `dashscope_chat` adapter: drafting calls (`draft`) with Qwen-VL through Alibaba Cloud
//! Model Studio's OpenAI-compatible chat completions.
//!
//! `POST {base_url}/chat/completions` (`base_url` ends in `/compatible-mode/v1`, as DashScope
//! documents it for the OpenAI SDKs) with the drafting instructions and the photos as
//! `image_url` parts (data URIs), `response_format` a JSON schema
//! (`domain::draft::response_schema`) and `max_tokens` the provider's ceiling. Synchronous: the
//! answer is the completion, with `usage` (`prompt_tokens`, `completion_tokens`). Nothing can
//! be looked up afterwards — the compatible mode keeps no retrievable completions — so an
//! answer lost after sending is `unknown`, and never resent on its own.

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

    fn billing_note(&self) -> &str {
        "Alibaba Cloud Model Studio bills each chat completion by its input and output tokens."
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
