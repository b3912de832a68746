//! The mock's OpenAI images API: `POST /v1/images/generations` (JSON) and
//! `POST /v1/images/edits` (multipart, `image` or `image[]` parts).
//!
//! Answers have the shape of the current SDK's `ImagesResponse` (`created`, `data`,
//! `background`, `output_format`, `quality`, `size`, `usage`). Refused as the real API
//! refuses them: a missing or retired model (404 `model_not_found`), an unknown parameter,
//! `response_format` for a GPT image model, DALL·E qualities.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Multipart, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::serve::{ApiRequest, IMAGE_SIZE, NewJob, missing_prompt, new_job, serve};
use super::{Answer, Api, Behavior, Jobs, Mock, Scope, error};
use crate::render::placeholder_png;

/// Body parameters `images.generate` takes (openai 3.57.0 `image_generate_params.py`).
const GENERATE_PARAMS: &[&str] = &[
    "prompt",
    "model",
    "n",
    "size",
    "quality",
    "background",
    "moderation",
    "output_compression",
    "output_format",
    "partial_images",
    "stream",
    "user",
    "response_format",
    "style",
    "complexity",
    "frame_delay_ms",
];

/// Extra multipart fields `images.edit` takes.
const EDIT_PARAMS: &[&str] = &["image", "image[]", "mask", "input_fidelity"];

/// Check the parameters the real API checks; `Err` is the refusal.
fn check(params: &Map<String, Value>, b: &Behavior, allowed: &[&[&str]]) -> Result<(), Answer> {
    let bad = |message: String, code: &str| Err(Answer::error(StatusCode::BAD_REQUEST, &message, code));
    if let Some(k) = params.keys().find(|k| !allowed.iter().any(|list| list.contains(&k.as_str()))) {
        return bad(format!("Unknown parameter: '{k}'."), "unknown_parameter");
    }
    let text = |k: &str| params.get(k).and_then(Value::as_str);
    let Some(model) = text("model") else {
        return bad("you must provide a model parameter".into(), "missing_model");
    };
    if b.retired_models.iter().any(|m| m == model) {
        return Err(Answer::error(
            StatusCode::NOT_FOUND,
            &format!("The model `{model}` has been shut down and does not exist any more."),
            "model_not_found",
        ));
    }
    if params.contains_key("response_format") {
        return bad(
            "Unknown parameter: 'response_format' (unsupported for GPT image models).".into(),
            "unknown_parameter",
        );
    }
    if let Some(q) = text("quality").filter(|q| !["low", "medium", "high", "xhigh", "max", "auto"].contains(q)) {
        return bad(
            format!("Invalid value: '{q}'. Supported values are: 'low', 'medium', 'high' and 'auto'."),
            "invalid_value",
        );
    }
    if let Some(f) = text("output_format").filter(|f| !["png", "jpeg", "webp", "gif", "svg"].contains(f)) {
        return bad(format!("Invalid value: '{f}'."), "invalid_value");
    }
    match text("size") {
        None | Some("auto") => {}
        Some(s) => {
            let ok = s.split_once('x').and_then(|(w, h)| Some((w.parse::<u32>().ok()?, h.parse::<u32>().ok()?)));
            if !ok.is_some_and(|(w, h)| (256..=3840).contains(&w) && (256..=3840).contains(&h)) {
                return bad(format!("Invalid value: '{s}'. The size must be WIDTHxHEIGHT or 'auto'."), "invalid_value");
            }
        }
    }
    Ok(())
}

fn answer(jobs: &mut Jobs, b: &Behavior, base: &str, params: &Map<String, Value>) -> Answer {
    let prompt = params.get("prompt").and_then(Value::as_str).unwrap_or_default();
    let model = params.get("model").and_then(Value::as_str).unwrap_or_default();
    let new = NewJob { api: Api::OpenaiImages, model, version: None, prompt, input: Value::Null };
    let id = new_job(jobs, new, b);
    let item = if b.openai_url_answers {
        json!({"url": format!("{base}/files/{id}.png")})
    } else if let Some(side) = b.giant_image_side {
        json!({"b64_json": base64::engine::general_purpose::STANDARD.encode(crate::render::flat_png(side))})
    } else {
        json!({"b64_json": base64::engine::general_purpose::STANDARD.encode(placeholder_png(prompt, IMAGE_SIZE))})
    };
    let text = |k: &str, d: &str| params.get(k).and_then(Value::as_str).unwrap_or(d).to_string();
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let tokens = prompt.split_whitespace().count() as u64 + 1;
    let body = json!({
        "created": created,
        "background": "opaque",
        "data": [item],
        "output_format": text("output_format", "png"),
        "quality": text("quality", "medium"),
        "size": text("size", "1024x1024"),
        "usage": {
            "input_tokens": tokens,
            "input_tokens_details": {"image_tokens": 0, "text_tokens": tokens},
            "output_tokens": 1056,
            "output_tokens_details": {"image_tokens": 1056, "text_tokens": 0},
            "total_tokens": tokens + 1056,
        },
    });
    Answer::charged(body, id)
}

/// `GET /v1/models`: the models list (free, never charged), as `models.list` reads it; a
/// request without a key is a 401 like any other.
pub(super) async fn models(State(mock): State<Arc<Mock>>, headers: HeaderMap) -> Response {
    let req = ApiRequest::new(Api::OpenaiImages, "GET /v1/models", Scope::Meta, &headers);
    serve(
        mock,
        req,
        Box::new(|_, b, _| {
            let data: Vec<Value> = ["gpt-image-2.5-flare", "gpt-image-1"]
                .iter()
                .filter(|m| !b.retired_models.iter().any(|r| r == *m))
                .map(|m| json!({"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "system"}))
                .collect();
            Answer::ok(json!({"object": "list", "data": data}))
        }),
    )
    .await
}

/// `POST /v1/images/generations`.
pub(super) async fn generations(State(mock): State<Arc<Mock>>, headers: HeaderMap, body: Bytes) -> Response {
    let params = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(m)) => m,
        _ => return error(StatusCode::BAD_REQUEST, "the body must be a JSON object", "invalid_json"),
    };
    let mut req = ApiRequest::new(Api::OpenaiImages, "POST /v1/images/generations", Scope::Create, &headers);
    req.prompt = params.get("prompt").and_then(Value::as_str).map(str::to_string);
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| {
            if !params.contains_key("prompt") {
                return missing_prompt();
            }
            match check(&params, b, &[GENERATE_PARAMS]) {
                Ok(()) => answer(jobs, b, base, &params),
                Err(refusal) => refusal,
            }
        }),
    )
    .await
}

/// `POST /v1/images/edits` (multipart: `prompt`, `model`, one `image` or `image[]` part per
/// image; other fields as text).
pub(super) async fn edits(State(mock): State<Arc<Mock>>, headers: HeaderMap, mut form: Multipart) -> Response {
    let mut req = ApiRequest::new(Api::OpenaiImages, "POST /v1/images/edits", Scope::Create, &headers);
    let mut params = Map::new();
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("malformed multipart body: {e}"), "invalid_body"),
        };
        let name = field.name().unwrap_or_default().to_string();
        let Ok(data) = field.bytes().await else {
            return error(StatusCode::BAD_REQUEST, "malformed multipart field", "invalid_body");
        };
        match name.as_str() {
            "image" | "image[]" => req.reference_images += 1,
            "mask" => {}
            _ => {
                params.insert(name, String::from_utf8_lossy(&data).into_owned().into());
            }
        }
    }
    req.prompt = params.get("prompt").and_then(Value::as_str).map(str::to_string);
    let references = req.reference_images;
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| {
            if !params.contains_key("prompt") {
                return missing_prompt();
            }
            if references == 0 {
                return Answer::error(StatusCode::BAD_REQUEST, "at least one `image[]` is required", "invalid_image");
            }
            match check(&params, b, &[GENERATE_PARAMS, EDIT_PARAMS]) {
                Ok(()) => answer(jobs, b, base, &params),
                Err(refusal) => refusal,
            }
        }),
    )
    .await
}
