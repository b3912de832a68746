//! The mock's Replicate API: creates by model (`POST /v1/models/{owner}/{name}/predictions`)
//! and by version (`POST /v1/predictions` with `version`), get, cancel, the listing (100 per
//! page, `created_after`/`created_before`), and the model and version GETs that carry the
//! `openapi_schema`.
//!
//! Predictions have the fields of replicate-python's `Prediction` (`version` is a version id
//! or `"hidden"`, never null; `urls.get/cancel/web`, `logs`, `metrics`, `data_removed`,
//! `started_at`, `completed_at`, `source`). After the retention time a prediction keeps its
//! status but `input` and `output` are removed (`output: null`, `data_removed: true`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::serve::{ApiRequest, NewJob, new_job, not_found, rfc3339, serve};
use super::{Answer, Api, Job, Jobs, Mock, Phase, Scope};
use models::Model;

/// Predictions per page of `GET /v1/predictions` (Replicate's page size).
const PAGE_SIZE: usize = 100;

fn prediction(job: &Job, base: &str) -> Value {
    let get = format!("{base}/v1/predictions/{}", job.id);
    let (owner, name) = job.model.split_once('/').unwrap_or((&job.model, ""));
    let phase = job.phase();
    let status = match phase {
        Phase::Queued => "starting",
        Phase::Running => "processing",
        Phase::Canceled => "canceled",
        Phase::Done if job.error.is_some() || job.failure_logs.is_some() => "failed",
        Phase::Done => "succeeded",
    };
    let removed = phase == Phase::Done && job.expired();
    let output = if status == "succeeded" && !removed {
        Model::get(owner, name).output(job.file_url(base))
    } else {
        Value::Null
    };
    let predict_time = job.completed_at().zip(job.started_at()).and_then(|(c, s)| c.duration_since(s).ok());
    json!({
        "id": job.id,
        "model": job.model,
        "version": job.version.clone().unwrap_or_else(|| "hidden".into()),
        "input": if removed { json!({}) } else { job.input.clone() },
        "logs": match (&job.failure_logs, removed || phase == Phase::Queued) {
            (_, true) => String::new(),
            (Some(logs), false) if status == "failed" => format!("Using seed: 42\n{logs}"),
            _ => "Using seed: 42\n".to_string(),
        },
        "output": output,
        "data_removed": removed,
        "error": if status == "failed" { job.error.clone().map(Value::String).unwrap_or(Value::Null) } else { Value::Null },
        "status": status,
        "source": "api",
        "created_at": rfc3339(job.created),
        "started_at": job.started_at().map(rfc3339),
        "completed_at": job.completed_at().map(rfc3339),
        "urls": {"get": get, "cancel": format!("{get}/cancel"), "web": format!("https://replicate.com/p/{}", job.id)},
        "metrics": match predict_time { Some(d) => json!({"predict_time": d.as_secs_f64()}), None => json!({}) },
    })
}

/// Check the input against the model's schema and charge a new prediction.
fn create(
    jobs: &mut Jobs,
    b: &super::Behavior,
    base: &str,
    model: Model,
    version: Option<String>,
    input: &Value,
) -> Answer {
    let (stored, _) = match model.check_input(input, b.unknown_inputs == "strip", base) {
        Ok(checked) => checked,
        Err(body) => return Answer::ok(body).with_status(StatusCode::UNPROCESSABLE_ENTITY),
    };
    let prompt = input.get("prompt").and_then(Value::as_str).unwrap_or_default().to_string();
    let full = model.full_name();
    let new = NewJob { api: Api::Replicate, model: &full, version, prompt: &prompt, input: stored };
    let id = new_job(jobs, new, b);
    match jobs.by_id.get(&id) {
        Some(job) => Answer::charged(prediction(job, base), id).with_status(StatusCode::CREATED),
        None => not_found("prediction"),
    }
}

fn body_json(body: &Bytes) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

/// Reference images in a create body, for the ledger.
fn count_images(input: &Value) -> usize {
    let is_data = |v: &Value| v.as_str().is_some_and(|s| s.starts_with("data:") || s.starts_with("http"));
    input.as_object().map_or(0, |o| {
        o.iter()
            .filter(|(k, _)| *k != "prompt")
            .map(|(_, v)| match v {
                Value::Array(a) => a.iter().filter(|x| is_data(x)).count(),
                v if is_data(v) => 1,
                _ => 0,
            })
            .sum()
    })
}

/// `POST /v1/models/{owner}/{name}/predictions`: official models answer `"version": "hidden"`.
pub(super) async fn create_official(
    State(mock): State<Arc<Mock>>,
    Path((owner, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let input = body_json(&body).get("input").cloned().unwrap_or(Value::Null);
    let mut req =
        ApiRequest::new(Api::Replicate, "POST /v1/models/{owner}/{name}/predictions", Scope::Create, &headers);
    req.prompt = input.get("prompt").and_then(Value::as_str).map(str::to_string);
    req.reference_images = count_images(&input);
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| {
            let model = Model::get(&owner, &name);
            let version = (!model.official).then(|| model.version.clone());
            jobs.remember(owner, name);
            create(jobs, b, base, model, version, &input)
        }),
    )
    .await
}

/// `POST /v1/predictions` with `version` (a version id).
pub(super) async fn create_version(State(mock): State<Arc<Mock>>, headers: HeaderMap, body: Bytes) -> Response {
    let body = body_json(&body);
    let input = body.get("input").cloned().unwrap_or(Value::Null);
    let version = body.get("version").and_then(Value::as_str).unwrap_or_default().to_string();
    let mut req = ApiRequest::new(Api::Replicate, "POST /v1/predictions", Scope::Create, &headers);
    req.prompt = input.get("prompt").and_then(Value::as_str).map(str::to_string);
    req.reference_images = count_images(&input);
    serve(
        mock,
        req,
        Box::new(move |jobs, b, base| match Model::by_version(&version, &jobs.known_models) {
            Some(model) => create(jobs, b, base, model, Some(version), &input),
            None => Answer::ok(
                json!({"title": "Invalid version", "detail": "Invalid version or not permitted", "status": 422}),
            )
            .with_status(StatusCode::UNPROCESSABLE_ENTITY),
        }),
    )
    .await
}

/// `GET /v1/predictions/{id}`.
pub(super) async fn get(State(mock): State<Arc<Mock>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let mut req = ApiRequest::new(Api::Replicate, "GET /v1/predictions/{id}", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| match jobs.by_id.get(&id).filter(|j| j.api == Api::Replicate) {
            Some(job) => Answer::ok(prediction(job, base)),
            None => not_found("prediction"),
        }),
    )
    .await
}

/// `POST /v1/predictions/{id}/cancel`: a prediction not finished yet becomes `canceled`.
pub(super) async fn cancel(State(mock): State<Arc<Mock>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let mut req = ApiRequest::new(Api::Replicate, "POST /v1/predictions/{id}/cancel", Scope::Poll, &headers);
    req.job_id = Some(id.clone());
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| match jobs.by_id.get_mut(&id).filter(|j| j.api == Api::Replicate) {
            Some(job) => {
                if !job.finished() && job.canceled.is_none() {
                    job.canceled = Some(job.started.elapsed());
                }
                Answer::ok(prediction(job, base))
            }
            None => not_found("prediction"),
        }),
    )
    .await
}

/// The query of `GET /v1/predictions`.
#[derive(Deserialize)]
pub(super) struct ListQuery {
    cursor: Option<String>,
    created_after: Option<String>,
    created_before: Option<String>,
    source: Option<String>,
}

/// `GET /v1/predictions`: newest first, [`PAGE_SIZE`] per page, `next` while more remain,
/// filtered by `created_after`/`created_before` (RFC 3339) and `source`.
pub(super) async fn list(State(mock): State<Arc<Mock>>, Query(q): Query<ListQuery>, headers: HeaderMap) -> Response {
    let req = ApiRequest::new(Api::Replicate, "GET /v1/predictions", Scope::List, &headers);
    serve(
        mock,
        req,
        Box::new(move |jobs, _, base| {
            let time = |t: &Option<String>| t.as_deref().map(humantime::parse_rfc3339_weak);
            let (after, before) = match (time(&q.created_after), time(&q.created_before)) {
                (Some(Err(_)), _) | (_, Some(Err(_))) => {
                    return Answer::error(
                        StatusCode::BAD_REQUEST,
                        "created_after/created_before must be RFC 3339",
                        "invalid",
                    );
                }
                (a, b) => (a.and_then(Result::ok), b.and_then(Result::ok)),
            };
            let start = q.cursor.as_deref().map_or(Ok(0), str::parse::<usize>);
            let Ok(start) = start else {
                return Answer::error(StatusCode::BAD_REQUEST, "invalid cursor", "invalid_cursor");
            };
            let all: Vec<&Job> = jobs
                .order
                .iter()
                .rev()
                .filter_map(|id| jobs.by_id.get(id))
                .filter(|j| j.api == Api::Replicate)
                .filter(|_| q.source.as_deref().is_none_or(|s| s == "api"))
                .filter(|j| after.is_none_or(|t| j.created > t) && before.is_none_or(|t| j.created < t))
                .collect();
            let results: Vec<Value> = all.iter().skip(start).take(PAGE_SIZE).map(|j| prediction(j, base)).collect();
            let mut next_query = vec![format!("cursor={}", start + PAGE_SIZE)];
            for (k, v) in [("created_after", &q.created_after), ("created_before", &q.created_before)] {
                if let Some(v) = v {
                    next_query.push(format!("{k}={}", v.replace(':', "%3A").replace('+', "%2B")));
                }
            }
            let next =
                (start + PAGE_SIZE < all.len()).then(|| format!("{base}/v1/predictions?{}", next_query.join("&")));
            Answer::ok(json!({"previous": null, "next": next, "results": results}))
        }),
    )
    .await
}

/// `GET /v1/models/{owner}/{name}`: the model with its latest version and schema.
pub(super) async fn get_model(
    State(mock): State<Arc<Mock>>,
    Path((owner, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let req = ApiRequest::new(Api::Replicate, "GET /v1/models/{owner}/{name}", Scope::Meta, &headers);
    serve(
        mock,
        req,
        Box::new(move |jobs, _, _| {
            let model = Model::get(&owner, &name);
            let runs = jobs.by_id.values().filter(|j| j.model == model.full_name()).count();
            jobs.remember(owner, name);
            Answer::ok(model.model_json(runs))
        }),
    )
    .await
}

/// `GET /v1/models/{owner}/{name}/versions/{id}`.
pub(super) async fn get_version(
    State(mock): State<Arc<Mock>>,
    Path((owner, name, version)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let req = ApiRequest::new(Api::Replicate, "GET /v1/models/{owner}/{name}/versions/{id}", Scope::Meta, &headers);
    serve(
        mock,
        req,
        Box::new(move |jobs, _, _| {
            let model = Model::get(&owner, &name);
            if model.version != version {
                return not_found("version");
            }
            jobs.remember(owner, name);
            Answer::ok(model.version_json())
        }),
    )
    .await
}

/// The Replicate models the mock knows, with Cog-style `openapi_schema`s, and the input
/// checks a create goes through (Cog's: unknown inputs stripped or refused, enums and types
/// checked, `prompt` required).
///
/// The FLUX schemas follow `replicate/cog-flux` (`predict.py`): `flux-schnell` takes
/// `aspect_ratio` and no image; `flux-dev` takes one `image` (image-to-image);
/// `flux-kontext-pro` takes one `input_image` and answers a single URL. Any other model gets
/// a generic community schema (`width`/`height`, an `input_images` array).
mod models {
    use serde_json::{Map, Value, json};
    use sha2::Digest;

    /// One model and its latest version.
    pub(super) struct Model {
        pub owner: String,
        pub name: String,
        pub version: String,
        /// Official models answer creates with `"version": "hidden"`.
        pub official: bool,
        /// `components.schemas.Input.properties`.
        properties: Value,
        /// Named enum schemas referenced from properties.
        enums: Vec<(&'static str, Value)>,
        /// Whether the output is a list of URLs (else one URL).
        output_list: bool,
    }

    const RATIOS: &[&str] = &["1:1", "16:9", "21:9", "3:2", "2:3", "4:5", "5:4", "3:4", "4:3", "9:16", "9:21"];

    fn kontext_ratios() -> Vec<&'static str> {
        let mut v = RATIOS.to_vec();
        v.push("match_input_image");
        v
    }

    fn prop(kind: &str, order: u32) -> Value {
        json!({"type": kind, "x-order": order})
    }

    fn uri(order: u32) -> Value {
        json!({"type": "string", "format": "uri", "x-order": order})
    }

    fn enum_ref(name: &str, default: &str, order: u32) -> Value {
        json!({"allOf": [{"$ref": format!("#/components/schemas/{name}")}], "default": default, "x-order": order})
    }

    fn version_id(model: &str) -> String {
        crate::domain::hex(&sha2::Sha256::digest(format!("mock-version {model}").as_bytes()))
    }

    impl Model {
        /// The model `owner/name` (a catalogue entry or the generic community schema).
        pub fn get(owner: &str, name: &str) -> Model {
            let full = format!("{owner}/{name}");
            let with = |official, properties, enums, output_list| Model {
                owner: owner.into(),
                name: name.into(),
                version: version_id(&full),
                official,
                properties,
                enums,
                output_list,
            };
            let ratio = || ("aspect_ratio", json!({"type": "string", "enum": RATIOS}));
            let formats = || ("output_format", json!({"type": "string", "enum": ["webp", "jpg", "png"]}));
            match full.as_str() {
                "black-forest-labs/flux-schnell" => with(
                    true,
                    json!({
                        "prompt": prop("string", 0),
                        "aspect_ratio": enum_ref("aspect_ratio", "1:1", 1),
                        "num_outputs": prop("integer", 2),
                        "num_inference_steps": prop("integer", 3),
                        "seed": prop("integer", 4),
                        "output_format": enum_ref("output_format", "webp", 5),
                        "output_quality": prop("integer", 6),
                        "disable_safety_checker": prop("boolean", 7),
                        "go_fast": prop("boolean", 8),
                        "megapixels": enum_ref("megapixels", "1", 9),
                    }),
                    vec![ratio(), formats(), ("megapixels", json!({"type": "string", "enum": ["1", "0.25"]}))],
                    true,
                ),
                "black-forest-labs/flux-dev" => with(
                    true,
                    json!({
                        "prompt": prop("string", 0),
                        "aspect_ratio": enum_ref("aspect_ratio", "1:1", 1),
                        "image": uri(2),
                        "prompt_strength": prop("number", 3),
                        "num_outputs": prop("integer", 4),
                        "num_inference_steps": prop("integer", 5),
                        "guidance": prop("number", 6),
                        "seed": prop("integer", 7),
                        "output_format": enum_ref("output_format", "webp", 8),
                        "output_quality": prop("integer", 9),
                        "disable_safety_checker": prop("boolean", 10),
                        "go_fast": prop("boolean", 11),
                    }),
                    vec![ratio(), formats()],
                    true,
                ),
                "black-forest-labs/flux-kontext-pro" => with(
                    true,
                    json!({
                        "prompt": prop("string", 0),
                        "input_image": uri(1),
                        "aspect_ratio": enum_ref("aspect_ratio", "match_input_image", 2),
                        "seed": prop("integer", 3),
                        "output_format": enum_ref("output_format", "png", 4),
                        "safety_tolerance": prop("integer", 5),
                        "prompt_upsampling": prop("boolean", 6),
                    }),
                    vec![
                        ("aspect_ratio", json!({"type": "string", "enum": kontext_ratios()})),
                        ("output_format", json!({"type": "string", "enum": ["jpg", "png"]})),
                    ],
                    false,
                ),
                _ => with(
                    false,
                    json!({
                        "prompt": prop("string", 0),
                        "width": prop("integer", 1),
                        "height": prop("integer", 2),
                        "num_outputs": prop("integer", 3),
                        "seed": prop("integer", 4),
                        "output_format": enum_ref("output_format", "png", 5),
                        "input_images": {"type": "array", "items": {"type": "string", "format": "uri"}, "x-order": 6},
                    }),
                    vec![formats()],
                    true,
                ),
            }
        }

        /// The catalogue model whose version id this is (community models: once looked up).
        pub fn by_version(version: &str, known: &[(String, String)]) -> Option<Model> {
            let catalogue = ["flux-schnell", "flux-dev", "flux-kontext-pro"]
                .map(|n| ("black-forest-labs".to_string(), n.to_string()));
            catalogue.iter().chain(known).map(|(o, n)| Model::get(o, n)).find(|m| m.version == version)
        }

        pub fn full_name(&self) -> String {
            format!("{}/{}", self.owner, self.name)
        }

        /// The version object (`GET /v1/models/{owner}/{name}/versions/{id}`).
        pub fn version_json(&self) -> Value {
            let mut schemas = Map::new();
            schemas.insert(
                "Input".into(),
                json!({"type": "object", "title": "Input", "required": ["prompt"], "properties": self.properties}),
            );
            let output = if self.output_list {
                json!({"type": "array", "items": {"type": "string", "format": "uri"}, "title": "Output"})
            } else {
                json!({"type": "string", "format": "uri", "title": "Output"})
            };
            schemas.insert("Output".into(), output);
            for (name, schema) in &self.enums {
                let mut s = schema.clone();
                s["title"] = (*name).into();
                schemas.insert((*name).into(), s);
            }
            json!({
                "id": self.version,
                "created_at": "2026-08-01T12:00:00.000000Z",
                "cog_version": "0.16.9",
                "openapi_schema": {
                    "openapi": "3.0.2",
                    "info": {"title": "Cog", "version": "0.1.0"},
                    "components": {"schemas": schemas},
                },
            })
        }

        /// The model object (`GET /v1/models/{owner}/{name}`).
        pub fn model_json(&self, run_count: usize) -> Value {
            json!({
                "url": format!("https://replicate.com/{}", self.full_name()),
                "owner": self.owner,
                "name": self.name,
                "description": format!("{} (tally mock)", self.full_name()),
                "visibility": "public",
                "github_url": null,
                "paper_url": null,
                "license_url": null,
                "run_count": run_count,
                "cover_image_url": null,
                "default_example": null,
                "latest_version": self.version_json(),
            })
        }

        pub fn output(&self, url: String) -> Value {
            if self.output_list { json!([url]) } else { Value::String(url) }
        }

        /// Check a create's `input` as Cog does. `Ok` holds the input as stored (unknown inputs
        /// removed when `strip`, file inputs replaced by delivery URLs) and the number of image
        /// inputs; `Err` holds the 422 body.
        pub fn check_input(&self, input: &Value, strip: bool, base: &str) -> Result<(Value, usize), Value> {
            let invalid = |field: &str, kind: &str, description: String| {
                json!({
                    "title": "Input validation failed",
                    "status": 422,
                    "detail": format!("- {field}: {description}"),
                    "invalid_fields": [{"type": kind, "field": field, "description": description}],
                })
            };
            let Some(obj) = input.as_object() else {
                return Err(invalid("input", "type", "input must be an object".into()));
            };
            if !obj.get("prompt").is_some_and(Value::is_string) {
                return Err(invalid("input.prompt", "required", "prompt is required".into()));
            }
            let mut stored = Map::new();
            let mut images = 0;
            for (k, v) in obj {
                let field = format!("input.{k}");
                let Some(p) = self.properties.get(k) else {
                    if strip {
                        continue;
                    }
                    return Err(invalid(
                        &field,
                        "additional_property_not_allowed",
                        "Additional property is not allowed".into(),
                    ));
                };
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("string");
                let enum_name = p.pointer("/allOf/0/$ref").and_then(Value::as_str).and_then(|r| r.rsplit('/').next());
                if let Some(name) = enum_name {
                    let allowed = self.enums.iter().find(|(n, _)| *n == name).and_then(|(_, s)| s.get("enum"));
                    if !allowed.and_then(Value::as_array).is_some_and(|a| a.contains(v)) {
                        return Err(invalid(
                            &field,
                            "enum",
                            format!("{k} must be one of the following: {}", allowed.cloned().unwrap_or_default()),
                        ));
                    }
                    stored.insert(k.clone(), v.clone());
                    continue;
                }
                let is_uri = |v: &Value| {
                    v.as_str().is_some_and(|s| {
                        s.starts_with("https://") || s.starts_with("http://") || s.starts_with("data:")
                    })
                };
                // Inline `data:` files are stored as delivery URLs (pessimistic: what the API stores is
                // not what was sent, so nothing may be matched on it); URLs stay as given.
                let delivered = |v: &Value| match v.as_str() {
                    Some(s) if s.starts_with("data:") => {
                        Value::String(format!("{base}/files/input-{}.png", uuid::Uuid::new_v4().simple()))
                    }
                    _ => v.clone(),
                };
                let ok = match kind {
                    "integer" => v.is_i64() || v.is_u64(),
                    "number" => v.is_number(),
                    "boolean" => v.is_boolean(),
                    "array" => v.as_array().is_some_and(|a| a.iter().all(is_uri)),
                    _ if p.get("format").and_then(Value::as_str) == Some("uri") => is_uri(v),
                    _ => v.is_string(),
                };
                if !ok {
                    return Err(invalid(&field, "type", format!("{k} must be of type {kind}")));
                }
                let value = match (kind, p.get("format").and_then(Value::as_str)) {
                    ("array", _) => {
                        let a = v.as_array().map(Vec::as_slice).unwrap_or_default();
                        images += a.len();
                        Value::Array(a.iter().map(delivered).collect())
                    }
                    (_, Some("uri")) => {
                        images += 1;
                        delivered(v)
                    }
                    _ => v.clone(),
                };
                stored.insert(k.clone(), value);
            }
            Ok((Value::Object(stored), images))
        }
    }
}
