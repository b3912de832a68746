//! The mock's Gemini API under `/gemini` (so `base_url = "http://127.0.0.1:PORT/gemini"`),
//! written from the API reference (ai.google.dev/api/generate-content, /api/batch-api) and
//! held to the official `google-genai` client by `tests/sdk/contract.py`:
//!
//! Every route answers under both API versions, `v1beta` (the batch docs' and tally's) and
//! `v1` (google-genai 3.3.0's default); another version is 404.
//!
//! - `POST /gemini/v1beta/models/{model}:generateContent`: synchronous; the image in
//!   `candidates[0].content.parts[].inlineData{mimeType,data}`, with `usageMetadata`. With
//!   behaviour `moderation = "prompt"` the answer is a 200 with `promptFeedback.blockReason`
//!   and no candidates; with `"output"` a candidate with `finishReason: IMAGE_SAFETY` and no
//!   image. Both are charged in the ledger (Gemini bills an answered request's tokens).
//! - `POST /gemini/v1beta/models/{model}:batchGenerateContent`: a batch of inlined requests
//!   (`batch.displayName` required) answered with its operation (`batches/{id}`,
//!   `metadata.state` `BATCH_STATE_PENDING`) before any work; charged at create.
//! - `GET /gemini/v1beta/batches/{id}`: the operation, `PENDING` → `RUNNING` →
//!   `SUCCEEDED` with the answers inline in `metadata.output.inlinedResponses`; 404 once
//!   `result_ttl_s` has passed since it finished.
//! - `GET /gemini/v1beta/batches?pageSize=&pageToken=`: newest first, `nextPageToken`.
//!
//! Errors have Google's shape: `{"error": {"code", "message", "status"}}`. Unknown fields
//! are refused (400 `INVALID_ARGUMENT`) as the API's strict JSON parsing does; a model
//! without `image` in its id cannot answer with an image (400).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::serve::{ApiRequest, IMAGE_SIZE, NewJob, new_job, rfc3339, serve};
use super::{Answer, Api, Job, Mock, Phase, Scope};
use crate::render::placeholder_png;

/// Top-level fields of a `GenerateContentRequest`.
const REQUEST_FIELDS: &[&str] = &[
    "model",
    "contents",
    "generationConfig",
    "safetySettings",
    "systemInstruction",
    "tools",
    "toolConfig",
    "cachedContent",
];

/// Fields of `generationConfig` the mock knows.
const GENERATION_FIELDS: &[&str] = &[
    "responseModalities",
    "imageConfig",
    "temperature",
    "topP",
    "topK",
    "candidateCount",
    "seed",
    "maxOutputTokens",
    "stopSequences",
    "responseMimeType",
    "responseSchema",
    "responseJsonSchema",
    "thinkingConfig",
    "presencePenalty",
    "frequencyPenalty",
];

const ASPECT_RATIOS: &[&str] = &["1:1", "2:3", "3:2", "3:4", "4:3", "4:5", "5:4", "9:16", "16:9", "21:9"];

/// A Google-style error answer.
fn google_error(status: StatusCode, message: &str) -> Answer {
    let name = match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        _ => "INTERNAL",
    };
    Answer::ok(json!({"error": {"code": status.as_u16(), "message": message, "status": name}})).with_status(status)
}

fn invalid(message: String) -> Answer {
    google_error(StatusCode::BAD_REQUEST, &message)
}

/// The prompt (its text parts) and the number of images in a request's `contents`.
fn read_contents(req: &Value) -> Result<(String, usize), Answer> {
    let Some(contents) = req.get("contents").and_then(Value::as_array).filter(|c| !c.is_empty()) else {
        return Err(invalid("* GenerateContentRequest.contents: contents is not specified".into()));
    };
    let (mut text, mut images) = (String::new(), 0);
    for c in contents {
        let Some(parts) = c.get("parts").and_then(Value::as_array).filter(|p| !p.is_empty()) else {
            return Err(invalid(
                "* GenerateContentRequest.contents[0].parts: contents.parts must not be empty.".into(),
            ));
        };
        for p in parts {
            if let Some(t) = p.get("text").and_then(Value::as_str) {
                text.push_str(t);
            } else if let Some(blob) = p.get("inlineData") {
                let data = blob.get("data").and_then(Value::as_str).unwrap_or("");
                if base64::engine::general_purpose::STANDARD.decode(data).is_err() {
                    return Err(invalid(
                        "Invalid value at 'contents[0].parts[1].inline_data.data' (TYPE_BYTES), Base64 decoding failed"
                            .into(),
                    ));
                }
                images += 1;
            }
        }
    }
    if text.trim().is_empty() {
        return Err(invalid("* GenerateContentRequest.contents: a text part is required".into()));
    }
    Ok((text, images))
}

/// Check a `GenerateContentRequest` as the API's strict parser does.
fn check_request(req: &Value) -> Result<(String, usize, bool), Answer> {
    let Some(obj) = req.as_object() else { return Err(invalid("Invalid JSON payload received.".into())) };
    if let Some(k) = obj.keys().find(|k| !REQUEST_FIELDS.contains(&k.as_str())) {
        return Err(invalid(format!("Invalid JSON payload received. Unknown name \"{k}\": Cannot find field.")));
    }
    let mut wants_image = true;
    if let Some(g) = obj.get("generationConfig") {
        let Some(g) = g.as_object() else { return Err(invalid("generationConfig must be an object".into())) };
        if let Some(k) = g.keys().find(|k| !GENERATION_FIELDS.contains(&k.as_str())) {
            return Err(invalid(format!(
                "Invalid JSON payload received. Unknown name \"{k}\" at 'generation_config': Cannot find field."
            )));
        }
        if let Some(m) = g.get("responseModalities") {
            let list: Vec<&str> =
                m.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
            if list.iter().any(|m| !["TEXT", "IMAGE"].contains(m)) {
                return Err(invalid(format!("Invalid value at 'generation_config.response_modalities': {m}")));
            }
            wants_image = list.contains(&"IMAGE");
        }
        if let Some(r) = g.get("imageConfig").and_then(|c| c.get("aspectRatio"))
            && !r.as_str().is_some_and(|r| ASPECT_RATIOS.contains(&r))
        {
            return Err(invalid(format!("Unsupported aspect ratio {r}")));
        }
    }
    let (prompt, images) = read_contents(req)?;
    Ok((prompt, images, wants_image))
}

/// A `GenerateContentResponse` for `prompt`, blocked as `moderation` says.
fn generate_response(model: &str, prompt: &str, wants_image: bool, moderation: Option<&str>) -> Value {
    let prompt_tokens = (prompt.split_whitespace().count() as u64).max(1);
    let id = uuid::Uuid::new_v4().simple().to_string();
    if moderation == Some("prompt") {
        return json!({
            "promptFeedback": {"blockReason": "SAFETY", "safetyRatings": [
                {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": true}
            ]},
            "usageMetadata": {"promptTokenCount": prompt_tokens, "totalTokenCount": prompt_tokens},
            "modelVersion": model,
            "responseId": id,
        });
    }
    if moderation == Some("output") {
        return json!({
            "candidates": [{"finishReason": "IMAGE_SAFETY", "index": 0}],
            "usageMetadata": {"promptTokenCount": prompt_tokens, "totalTokenCount": prompt_tokens},
            "modelVersion": model,
            "responseId": id,
        });
    }
    let mut parts = vec![json!({"text": "Here is the image you asked for."})];
    let mut image_tokens = 0;
    if wants_image {
        let data = base64::engine::general_purpose::STANDARD.encode(placeholder_png(prompt, IMAGE_SIZE));
        parts.push(json!({"inlineData": {"mimeType": "image/png", "data": data}}));
        image_tokens = 1290;
    }
    json!({
        "candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {
            "promptTokenCount": prompt_tokens,
            "candidatesTokenCount": image_tokens + 8,
            "totalTokenCount": prompt_tokens + image_tokens + 8,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt_tokens}],
            "candidatesTokensDetails": [{"modality": "IMAGE", "tokenCount": image_tokens}],
        },
        "modelVersion": model,
        "responseId": id,
    })
}

/// Whether `version` is an API version the Gemini API serves.
fn known_version(version: &str) -> bool {
    matches!(version, "v1beta" | "v1")
}

fn no_route() -> Response {
    google_error(StatusCode::NOT_FOUND, "Method not found.").into_response()
}

/// `POST /gemini/{version}/models/{model}:{generateContent|batchGenerateContent}`.
pub(super) async fn models(
    State(mock): State<Arc<Mock>>,
    Path((version, spec)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !known_version(&version) {
        return no_route();
    }
    let Some((model, action)) = spec.split_once(':') else { return no_route() };
    let model = model.to_string();
    let batch = match action {
        "generateContent" => false,
        "batchGenerateContent" => true,
        _ => return no_route(),
    };
    let input: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (api, endpoint) = if batch {
        (Api::GeminiBatch, "POST /gemini/{version}/models/{model}:batchGenerateContent")
    } else {
        (Api::Gemini, "POST /gemini/{version}/models/{model}:generateContent")
    };
    let mut req = ApiRequest::new(api, endpoint, Scope::Create, &headers);
    // For the ledger: the (first) request's prompt and its images.
    let first = if batch {
        input.pointer("/batch/inputConfig/requests/requests/0/request").cloned()
    } else {
        Some(input.clone())
    };
    if let Some(Ok((prompt, images))) = first.as_ref().map(read_contents) {
        req.prompt = Some(prompt);
        req.reference_images = images;
    }
    serve(
        mock,
        req,
        Box::new(move |jobs, b, _base| {
            let json_out = input.pointer("/generationConfig/responseMimeType").and_then(Value::as_str)
                == Some("application/json");
            if json_out && !batch {
                // Structured output (a draft): the text of a JSON answer, with its usage.
                let (prompt, images, _) = match check_request(&input) {
                    Ok(r) => r,
                    Err(a) => return a,
                };
                let text = b.draft_answer.clone().unwrap_or_else(|| super::responses::draft_text(&prompt));
                let (p, c) = super::responses::usage_of(&prompt, images, &text);
                let id = new_job(
                    jobs,
                    NewJob { api: Api::Gemini, model: &model, version: None, prompt: &prompt, input: Value::Null },
                    b,
                );
                let body = json!({
                    "candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "finishReason": "STOP", "index": 0}],
                    "usageMetadata": {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c},
                    "modelVersion": model, "responseId": uuid::Uuid::new_v4().simple().to_string(),
                });
                return Answer::charged(body, id);
            }
            if !model.contains("image") {
                return if model.starts_with("gemini-") {
                    invalid("Model does not support the requested response modalities: image".into())
                } else {
                    google_error(StatusCode::NOT_FOUND, &format!("models/{model} is not found for API version v1beta"))
                };
            }
            if !batch {
                let (prompt, _, wants_image) = match check_request(&input) {
                    Ok(r) => r,
                    Err(a) => return a,
                };
                let id = new_job(
                    jobs,
                    NewJob { api: Api::Gemini, model: &model, version: None, prompt: &prompt, input: Value::Null },
                    b,
                );
                return Answer::charged(generate_response(&model, &prompt, wants_image, b.moderation.as_deref()), id);
            }
            let Some(batch) = input.get("batch").and_then(Value::as_object) else {
                return invalid("* BatchGenerateContentRequest.batch: batch is required".into());
            };
            let Some(display) = batch.get("displayName").and_then(Value::as_str).filter(|d| !d.is_empty()) else {
                return invalid("* GenerateContentBatch.display_name: display_name is required".into());
            };
            let Some(requests) =
                batch.get("inputConfig").and_then(|c| c.pointer("/requests/requests")).and_then(Value::as_array)
            else {
                return invalid("* GenerateContentBatch.input_config: requests or file_name is required".into());
            };
            if requests.is_empty() {
                return invalid(
                    "* GenerateContentBatch.input_config.requests: at least one request is required".into(),
                );
            }
            let mut stored = Vec::new();
            let mut prompt = String::new();
            for r in requests {
                let inner = r.get("request").cloned().unwrap_or(Value::Null);
                match check_request(&inner) {
                    Ok((p, _, wants_image)) => {
                        if prompt.is_empty() {
                            prompt = p.clone();
                        }
                        stored.push(json!({"prompt": p, "wants_image": wants_image, "metadata": r.get("metadata")}));
                    }
                    Err(a) => return a,
                }
            }
            let input = json!({"displayName": display, "requests": stored, "moderation": b.moderation});
            let id = new_job(
                jobs,
                NewJob { api: Api::GeminiBatch, model: &model, version: None, prompt: &prompt, input },
                b,
            );
            match jobs.by_id.get(&id) {
                Some(job) => Answer::charged(operation(job), id),
                None => google_error(StatusCode::INTERNAL_SERVER_ERROR, "lost the batch"),
            }
        }),
    )
    .await
}

/// A batch's operation, as create, get and list answer it.
fn operation(job: &Job) -> Value {
    let name = format!("batches/{}", job.id);
    let requests = job.input.get("requests").and_then(Value::as_array).cloned().unwrap_or_default();
    let n = requests.len();
    let state = match job.phase() {
        Phase::Queued => "BATCH_STATE_PENDING",
        Phase::Running => "BATCH_STATE_RUNNING",
        Phase::Done => "BATCH_STATE_SUCCEEDED",
        Phase::Canceled => "BATCH_STATE_CANCELLED",
    };
    let updated = job.completed_at().or(job.started_at()).unwrap_or(job.created);
    let mut metadata = json!({
        "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
        "model": format!("models/{}", job.model),
        "displayName": job.input.get("displayName"),
        "createTime": rfc3339(job.created),
        "updateTime": rfc3339(updated),
        "batchStats": {"requestCount": n.to_string(), "pendingRequestCount": n.to_string()},
        "state": state,
        "name": name,
    });
    let mut op = json!({"name": name, "metadata": metadata.clone()});
    if job.phase() == Phase::Done {
        let moderation = job.input.get("moderation").and_then(Value::as_str);
        let answers: Vec<Value> = requests
            .iter()
            .map(|r| {
                let mut a = match &job.error {
                    Some(e) => json!({"error": {"code": 13, "message": e, "status": "INTERNAL"}}),
                    None => json!({"response": generate_response(
                        &job.model,
                        r.get("prompt").and_then(Value::as_str).unwrap_or(""),
                        r.get("wants_image").and_then(Value::as_bool).unwrap_or(true),
                        moderation,
                    )}),
                };
                if let Some(m) = r.get("metadata").filter(|m| !m.is_null()) {
                    a["metadata"] = m.clone();
                }
                a
            })
            .collect();
        let (ok, failed) = if job.error.is_some() { (0, n) } else { (n, 0) };
        let output = json!({"inlinedResponses": {"inlinedResponses": answers}});
        metadata["endTime"] = rfc3339(updated).into();
        metadata["batchStats"] = json!({"requestCount": n.to_string(), "successfulRequestCount": ok.to_string(), "failedRequestCount": failed.to_string()});
        metadata["output"] = output.clone();
        let mut response = output;
        response["@type"] = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput".into();
        op = json!({"name": name, "metadata": metadata, "done": true, "response": response});
    }
    op
}

/// `GET /gemini/{version}/batches/{id}`.
pub(super) async fn get(
    State(mock): State<Arc<Mock>>,
    Path((version, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if !known_version(&version) {
        return no_route();
    }
    let mut req = ApiRequest::new(Api::GeminiBatch, "GET /gemini/{version}/batches/{id}", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, _| match jobs.by_id.get(&id).filter(|j| j.api == Api::GeminiBatch) {
            Some(job) if !(job.finished() && job.expired()) => Answer::ok(operation(job)),
            _ => google_error(StatusCode::NOT_FOUND, &format!("Batch batches/{id} not found.")),
        }),
    )
    .await
}

/// The paging parameters of a batch listing.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListQuery {
    page_size: Option<usize>,
    page_token: Option<String>,
}

/// `GET /gemini/{version}/batches`: newest first, `pageSize` (default 50, at most 1000) per page.
pub(super) async fn list(
    State(mock): State<Arc<Mock>>,
    Path(version): Path<String>,
    Query(q): Query<ListQuery>,
    headers: HeaderMap,
) -> Response {
    if !known_version(&version) {
        return no_route();
    }
    let req = ApiRequest::new(Api::GeminiBatch, "GET /gemini/{version}/batches", Scope::List, &headers);
    serve(
        mock,
        req,
        Box::new(move |jobs, _, _| {
            let size = q.page_size.unwrap_or(50).clamp(1, 1000);
            let start = match q.page_token.as_deref().filter(|t| !t.is_empty()) {
                None => 0,
                Some(t) => match t.strip_prefix("p").and_then(|n| n.parse::<usize>().ok()) {
                    Some(n) => n,
                    None => return invalid("Invalid page token.".into()),
                },
            };
            let all: Vec<&Job> = jobs
                .order
                .iter()
                .rev()
                .filter_map(|id| jobs.by_id.get(id))
                .filter(|j| j.api == Api::GeminiBatch && !(j.finished() && j.expired()))
                .collect();
            let page: Vec<Value> = all.iter().skip(start).take(size).map(|j| operation(j)).collect();
            let mut body = Map::new();
            body.insert("operations".into(), Value::Array(page));
            if start + size < all.len() {
                body.insert("nextPageToken".into(), format!("p{}", start + size).into());
            }
            Answer::ok(Value::Object(body))
        }),
    )
    .await
}
