//! The `openai_responses` adapter: drafting calls (`draft`) through OpenAI's Responses API
//! with image inputs and structured output.
//!
//! `POST {base_url}/v1/responses` with the drafting instructions and the photos as
//! `input_image` parts (data URIs), `text.format` a strict JSON schema
//! (`domain::draft::response_schema`), `max_output_tokens` the provider's ceiling, and
//! **`background: true` with `store: true`**: the create answers at once with the response's
//! `id` (`status: queued`), which the engine persists (`accepted`) before it waits. The answer
//! is then polled with `GET /v1/responses/{id}` — free, and safe to repeat: a lost poll answer
//! is asked again, never a new paid call. A create whose answer (and so its id) was lost
//! cannot be found (the API offers no listing of responses by a marker), so it is `unknown`
//! and never resent on its own.
//!
//! A completed response's text (`output[].content[].output_text`) and its `usage` go to the
//! worker as a `domain::draft::Answer`; the worker validates the text against the schema. A
//! response that ends `incomplete` (the token ceiling reached) was billed: its partial text goes
//! to the same validation, which fails it, charged, with the text kept.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::domain::draft::{Answer, Usage, response_schema};
use crate::domain::operation::Operation;
use crate::providers::dashboard::Dashboard;
use crate::providers::http::client::{AuthScheme, HttpClient};
use crate::providers::http::{api_root, data_uri};
use crate::providers::{
    BoxFuture, CallError, CallRequest, Capabilities, JobHandle, JobState, Provider, ProviderConfig, Submitted,
    answer_image,
};

/// OpenAI's Responses API, for drafting.
#[derive(Debug)]
pub struct OpenaiResponses {
    http: HttpClient,
    model: String,
    max_output_tokens: u32,
    poll_interval: Duration,
}

impl OpenaiResponses {
    /// Build the adapter from its configuration.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, String> {
        Ok(OpenaiResponses {
            http: HttpClient::new(&api_root(cfg), AuthScheme::Bearer)?,
            model: cfg.model.clone().unwrap_or_else(|| "gpt-5-mini".into()),
            max_output_tokens: cfg.max_output_tokens,
            poll_interval: cfg.poll_interval,
        })
    }

    /// The create's body.
    fn body(&self, req: &CallRequest) -> Value {
        let mut content = vec![json!({"type": "input_text", "text": req.prompt})];
        for image in &req.references {
            content.push(json!({"type": "input_image", "image_url": data_uri(image), "detail": "auto"}));
        }
        json!({
            "model": self.model,
            "input": [{"role": "user", "content": content}],
            "text": {"format": {"type": "json_schema", "name": "tally_draft", "schema": response_schema(), "strict": true}},
            "max_output_tokens": self.max_output_tokens,
            "background": true,
            "store": true,
        })
    }
}

/// What a response object says: still running, or its answer, or its failure.
pub(crate) fn read_response(v: &Value) -> Result<JobState, CallError> {
    let status = v.get("status").and_then(Value::as_str).unwrap_or("");
    match status {
        "queued" | "in_progress" => Ok(JobState::Running),
        "completed" | "incomplete" => {
            let text: String = v
                .get("output")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|o| o.get("content").and_then(Value::as_array))
                .flatten()
                .filter(|c| c.get("type").and_then(Value::as_str) == Some("output_text"))
                .filter_map(|c| c.get("text").and_then(Value::as_str))
                .collect();
            let n = |k: &str| v.pointer(&format!("/usage/{k}")).and_then(Value::as_u64).unwrap_or(0);
            let usage = Usage { input_tokens: n("input_tokens"), output_tokens: n("output_tokens") };
            Ok(JobState::Done(answer_image(&Answer { text, usage })))
        }
        "failed" => Ok(JobState::Failed(
            v.pointer("/error/message").and_then(Value::as_str).unwrap_or("the response failed").to_string(),
        )),
        "cancelled" => Ok(JobState::Canceled("the response was cancelled at the provider".into())),
        other => Err(CallError::Unusable(format!("the provider answered with a response in status `{other}`"))),
    }
}

/// OpenAI's logs page lists stored responses (`store: true`) by id.
pub fn dashboard(cfg: &ProviderConfig) -> Dashboard {
    let own = cfg.base_url.as_deref().is_some_and(|u| u.contains("api.openai.com"));
    if !own {
        return Dashboard::gateway().with_model(cfg.model.as_deref());
    }
    Dashboard {
        page: "openai_logs".into(),
        url: Some("https://platform.openai.com/logs?api=responses".into()),
        label: "OpenAI's logs of stored responses".into(),
        how: "Responses sent with store: true are listed there by time and id; a request whose id tally never \
              received may still be there, at the time it was sent."
            .into(),
        lists_requests: true,
        model: cfg.model.clone(),
    }
}

impl Provider for OpenaiResponses {
    fn capabilities(&self) -> Capabilities {
        // A response's id, once it arrived and was persisted (`accepted`), is fetched again by
        // id — also after a restart (`lookup`). The create is not idempotent and cannot be
        // searched for ([`Provider::finds_lost_creates`] is false): a lost create is unknown.
        Capabilities { idempotent_create: self.http.sends_idempotency_key(), lookup: true }
    }

    fn finds_lost_creates(&self) -> bool {
        false
    }

    fn billing_note(&self) -> String {
        crate::domain::words::say("say.bills_openai_responses")
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn rate_limit_hold(&self) -> Option<Duration> {
        self.http.rate_limit_hold()
    }

    fn preflight<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            self.http.check_key()?;
            if req.operation != Operation::Draft {
                return Err(CallError::Rejected {
                    message: "an openai_responses provider only drafts; nothing was sent".into(),
                    config: true,
                });
            }
            Ok(())
        })
    }

    /// `GET /v1/models`: free.
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
            let url = format!("{}/v1/responses", self.http.base_url());
            let rb = self.http.request(Method::POST, &url, Some(&req.idempotency_key))?.json(&self.body(req));
            let answer: Value = self.http.send_json(rb).await?;
            match read_response(&answer)? {
                JobState::Done(img) => Ok(Submitted::Done(img)),
                _ => match answer.get("id").and_then(Value::as_str) {
                    Some(id) => Ok(Submitted::Accepted(JobHandle::id(id))),
                    None => Err(CallError::Ambiguous("the provider accepted the request without a response id".into())),
                },
            }
        })
    }

    fn poll<'a>(&'a self, job: &'a JobHandle) -> BoxFuture<'a, Result<JobState, CallError>> {
        Box::pin(async move {
            let url = format!("{}/v1/responses/{}", self.http.base_url(), job.id);
            match self.http.send_json_or_gone::<Value>(self.http.request(Method::GET, &url, None)?).await? {
                Some(v) => read_response(&v),
                None => Ok(JobState::Expired),
            }
        })
    }
}
