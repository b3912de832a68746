//! The mock's DashScope OpenAI-compatible chat completions (the `dashscope_chat` kind's
//! drafting calls with Qwen-VL), under `/dashscope/compatible-mode/v1/chat/completions`, from
//! Alibaba Cloud Model Studio's "OpenAI compatible" pages and openai-python's
//! `chat.completions` types: `model` and `messages` required, unknown parameters refused,
//! `response_format` of type `json_schema` needs `json_schema.name` and `json_schema.schema`.
//! Synchronous and charged: the answer is the completion (`choices[0].message.content`, a
//! draft made like the Responses mock's) with `usage` (`prompt_tokens`, `completion_tokens`).
//! There is nothing to look a completion up by.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::responses::{draft_text, read_input, usage_of};
use super::serve::{ApiRequest, NewJob, new_job, serve};
use super::{Answer, Api, Mock, Scope};

/// Body parameters the compatible mode takes for chat (a subset of OpenAI's).
const PARAMS: &[&str] = &[
    "model",
    "messages",
    "response_format",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stream",
    "stream_options",
    "seed",
    "stop",
    "tools",
    "tool_choice",
    "n",
    "presence_penalty",
    "enable_thinking",
    "vl_high_resolution_images",
];

fn bad(message: &str) -> Answer {
    Answer::error(StatusCode::BAD_REQUEST, message, "invalid_parameter_error")
}

/// `POST /dashscope/compatible-mode/v1/chat/completions` (charged).
pub(super) async fn completions(State(mock): State<Arc<Mock>>, headers: HeaderMap, body: Bytes) -> Response {
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut req =
        ApiRequest::new(Api::DashscopeChat, "POST /compatible-mode/v1/chat/completions", Scope::Create, &headers);
    let (prompt, images) = read_input(parsed.get("messages").unwrap_or(&Value::Null));
    req.prompt = Some(prompt.clone());
    req.reference_images = images;
    serve(
        mock,
        req,
        Box::new(move |jobs, b, _| {
            let Value::Object(body) = parsed else { return bad("The request body is not valid JSON.") };
            if let Some(k) = body.keys().find(|k| !PARAMS.contains(&k.as_str())) {
                return bad(&format!("Unrecognized request argument supplied: {k}"));
            }
            let Some(model) = body.get("model").and_then(Value::as_str).map(str::to_string) else {
                return bad("Missing required parameter: 'model'.");
            };
            if !body.get("messages").is_some_and(Value::is_array) {
                return bad("Missing required parameter: 'messages'.");
            }
            if let Some(f) = body.get("response_format")
                && f.get("type").and_then(Value::as_str) == Some("json_schema")
                && (f.pointer("/json_schema/name").and_then(Value::as_str).is_none()
                    || !f.pointer("/json_schema/schema").is_some_and(Value::is_object))
            {
                return bad("response_format.json_schema needs a name and a schema.");
            }
            let key = new_job(
                jobs,
                NewJob { api: Api::DashscopeChat, model: &model, version: None, prompt: &prompt, input: json!({}) },
                b,
            );
            let text = b.draft_answer.clone().unwrap_or_else(|| draft_text(&prompt));
            let (prompt_tokens, completion_tokens) = usage_of(&prompt, images, &text);
            let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let answer = json!({
                "id": format!("chatcmpl-{key}"), "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens},
                "system_fingerprint": null,
            });
            Answer::charged(answer, key)
        }),
    )
    .await
}
