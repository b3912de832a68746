//! Drafting (`draft`) on a `gemini` provider: `POST {base_url}/v1beta/models/{model}:generateContent`
//! with the drafting instructions and the photos as `inlineData` parts, and
//! `generationConfig.responseMimeType: application/json` with `responseSchema`
//! (`domain::draft::gemini_schema`) and `maxOutputTokens`. Synchronous, no idempotency key, no
//! job id: a lost answer is `unknown`, as for a Gemini image. The answer's text parts and its
//! `usageMetadata` (`promptTokenCount`, `candidatesTokenCount`) go to the worker as a
//! `domain::draft::Answer`; a blocked prompt is a refusal, as for an image.

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

use crate::domain::draft::{Answer, Usage, gemini_schema};
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
            "responseSchema": gemini_schema(),
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
