//! The mock's OpenAI Responses API (the `openai_responses` kind's drafting calls), from
//! platform.openai.com/docs/api-reference/responses and openai-python's `responses` types:
//!
//! - `POST /v1/responses`: `model` and `input` required; unknown body parameters refused
//!   (400 `unknown_parameter`); `background: true` needs `store: true` (400, as the API
//!   answers); `text.format` of type `json_schema` needs a `name` and a `schema`. Charged. With
//!   `background: true` the answer is the response object at once (`status: queued`, its
//!   `id`), and the work finishes after `job_duration_ms`; without, the completed response.
//! - `GET /v1/responses/{id}`: the stored response (`queued`, `in_progress`, `completed`
//!   with `output[].content[].output_text` and `usage`); 404 for an unknown id. Free.
//!
//! The answer's text is a draft: the demo's plan (`providers::demo_draft`) for the `INPUT =`
//! data in the prompt (so a drafted plan depends on what was sent); behaviour `job_error`
//! makes a background response end `failed`.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::serve::{ApiRequest, NewJob, new_job, not_found, serve};
use super::{Answer, Api, Job, Mock, Phase, Scope};
use crate::domain::draft::DraftInput;

/// Body parameters `responses.create` takes (openai-python `response_create_params.py`).
const PARAMS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "background",
    "store",
    "text",
    "max_output_tokens",
    "metadata",
    "previous_response_id",
    "reasoning",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "truncation",
    "user",
    "stream",
    "include",
    "parallel_tool_calls",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "conversation",
    "max_tool_calls",
    "prompt",
    "top_logprobs",
];

fn bad(message: &str, code: &str) -> Answer {
    Answer::error(StatusCode::BAD_REQUEST, message, code)
}

/// The text parts and image count of a Responses `input` (a string, or messages whose
/// `content` holds `input_text` and `input_image` parts).
pub(super) fn read_input(input: &Value) -> (String, usize) {
    match input {
        Value::String(s) => (s.clone(), 0),
        Value::Array(items) => {
            let mut text = String::new();
            let mut images = 0;
            for item in items {
                // Responses `input` items and chat `messages` alike.
                match item.get("content") {
                    Some(Value::String(s)) => text.push_str(s),
                    Some(Value::Array(parts)) => {
                        for p in parts {
                            match p.get("type").and_then(Value::as_str) {
                                Some("input_text") | Some("text") => {
                                    text.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                                }
                                Some("input_image") | Some("image_url") => images += 1,
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
            (text, images)
        }
        _ => (String::new(), 0),
    }
}

/// The draft a model would answer for `prompt`: the demo's plan for its `INPUT =` data, or a
/// plan for an unnamed product in English when there is none.
pub(super) fn draft_text(prompt: &str) -> String {
    let input = prompt
        .split_once("INPUT = ")
        .and_then(|(_, data)| serde_json::from_str::<Value>(data.trim()).ok())
        .map(|v| DraftInput {
            product: v.get("product").and_then(Value::as_str).unwrap_or("product").to_string(),
            facts: v
                .get("facts")
                .and_then(Value::as_array)
                .map(|fs| {
                    fs.iter()
                        .filter_map(|f| {
                            Some((f.get("key")?.as_str()?.to_string(), f.get("value")?.as_str()?.to_string()))
                        })
                        .collect()
                })
                .unwrap_or_default(),
            marketplace: v.get("marketplace").and_then(Value::as_str).map(str::to_string),
            language: v.get("language").and_then(Value::as_str).unwrap_or("en").to_string(),
            answers: Vec::new(),
        })
        .unwrap_or(DraftInput {
            product: "product".into(),
            facts: Vec::new(),
            marketplace: None,
            language: "en".into(),
            answers: Vec::new(),
        });
    crate::providers::demo_draft::answer(&input).text
}

/// Token counts the mock reports: a token per 4 bytes of text, 765 per image (OpenAI's high
/// detail 512×512), and the answer's bytes over 4.
pub(super) fn usage_of(prompt: &str, images: usize, answer: &str) -> (u64, u64) {
    ((prompt.len() as u64).div_ceil(4) + 765 * images as u64, (answer.len() as u64).div_ceil(4))
}

/// The response object of job `j` as the API shows it now.
fn response(j: &Job) -> Value {
    let created = j.created.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let background = j.input.get("background").and_then(Value::as_bool).unwrap_or(false);
    let base = json!({
        "id": format!("resp_{}", j.id), "object": "response", "created_at": created, "model": j.model,
        "background": background, "store": true, "error": null, "incomplete_details": null,
        "instructions": null, "max_output_tokens": j.input.get("max_output_tokens"),
        "metadata": {}, "parallel_tool_calls": true, "temperature": 1.0, "top_p": 1.0,
        "tool_choice": "auto", "tools": [], "text": j.input.get("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
        "output": [], "usage": null,
    });
    let mut v = base;
    match j.phase() {
        Phase::Queued => v["status"] = json!("queued"),
        Phase::Running => v["status"] = json!("in_progress"),
        Phase::Canceled => v["status"] = json!("cancelled"),
        Phase::Done => match &j.error {
            Some(e) => {
                v["status"] = json!("failed");
                v["error"] = json!({"code": "server_error", "message": e});
            }
            None => {
                let text = match j.input.get("answer").and_then(Value::as_str) {
                    Some(fixed) => fixed.to_string(),
                    None => draft_text(&j.prompt),
                };
                let images = j.input.get("images").and_then(Value::as_u64).unwrap_or(0) as usize;
                let (input_tokens, output_tokens) = usage_of(&j.prompt, images, &text);
                v["status"] = json!("completed");
                v["output"] = json!([{
                    "type": "message", "id": format!("msg_{}", j.id), "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
                }]);
                v["usage"] = json!({
                    "input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": input_tokens + output_tokens
                });
            }
        },
    }
    v
}

/// Check a create's body as the API does; `Err` is the refusal.
fn check(body: &Map<String, Value>) -> Result<(), Answer> {
    if let Some(k) = body.keys().find(|k| !PARAMS.contains(&k.as_str())) {
        return Err(bad(&format!("Unknown parameter: '{k}'."), "unknown_parameter"));
    }
    if body.get("model").and_then(Value::as_str).is_none() {
        return Err(bad("Missing required parameter: 'model'.", "missing_required_parameter"));
    }
    if body.get("input").is_none() {
        return Err(bad("Missing required parameter: 'input'.", "missing_required_parameter"));
    }
    let flag = |k: &str| body.get(k).and_then(Value::as_bool);
    if flag("background") == Some(true) && flag("store") == Some(false) {
        return Err(bad("Background mode requires store=true.", "invalid_value"));
    }
    if let Some(f) = body.get("text").and_then(|t| t.get("format"))
        && f.get("type").and_then(Value::as_str) == Some("json_schema")
        && (f.get("name").and_then(Value::as_str).is_none() || !f.get("schema").is_some_and(Value::is_object))
    {
        return Err(bad(
            "Missing required parameter: 'text.format.name' or 'text.format.schema'.",
            "missing_required_parameter",
        ));
    }
    Ok(())
}

/// `POST /v1/responses`: create a response (charged).
pub(super) async fn create(State(mock): State<Arc<Mock>>, headers: HeaderMap, body: Bytes) -> Response {
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut req = ApiRequest::new(Api::OpenaiResponses, "POST /v1/responses", Scope::Create, &headers);
    let (prompt, images) = read_input(parsed.get("input").unwrap_or(&Value::Null));
    req.prompt = Some(prompt.clone());
    req.reference_images = images;
    serve(
        mock,
        req,
        Box::new(move |jobs, b, _| {
            let Value::Object(body) = parsed else {
                return bad("We could not parse the JSON body of your request.", "invalid_json");
            };
            if let Err(a) = check(&body) {
                return a;
            }
            let model = body.get("model").and_then(Value::as_str).unwrap_or("").to_string();
            let background = body.get("background").and_then(Value::as_bool).unwrap_or(false);
            let stored = json!({
                "background": background, "text": body.get("text"), "images": images,
                "max_output_tokens": body.get("max_output_tokens"), "answer": b.draft_answer,
            });
            let api = if background { Api::OpenaiResponses } else { Api::OpenaiResponsesSync };
            let key = new_job(jobs, NewJob { api, model: &model, version: None, prompt: &prompt, input: stored }, b);
            let answer = jobs.by_id.get(&key).map(response).unwrap_or(Value::Null);
            let id = format!("resp_{key}");
            Answer::charged(answer, id)
        }),
    )
    .await
}

/// `GET /v1/responses/{id}`: the stored response (free).
pub(super) async fn get(State(mock): State<Arc<Mock>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let mut req = ApiRequest::new(Api::OpenaiResponses, "GET /v1/responses/{id}", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, _| {
            match jobs.by_id.get(id.trim_start_matches("resp_")).filter(|j| j.api.responses()) {
                Some(j) => Answer::ok(response(j)),
                None => not_found(&format!("Response with id '{id}'")),
            }
        }),
    )
    .await
}
