//! The Replicate models the mock knows, with Cog-style `openapi_schema`s, and the input
//! checks a create goes through (Cog's: unknown inputs stripped or refused, enums and types
//! checked, `prompt` required).
//!
//! The FLUX schemas follow `replicate/cog-flux` (`predict.py`): `flux-schnell` takes
//! `aspect_ratio` and no image; `flux-dev` takes one `image` (image-to-image);
//! `flux-kontext-pro` takes one `input_image` and answers a single URL. Any other model gets
//! a generic community schema (`width`/`height`, an `input_images` array).

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
        let catalogue =
            ["flux-schnell", "flux-dev", "flux-kontext-pro"].map(|n| ("black-forest-labs".to_string(), n.to_string()));
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
                v.as_str()
                    .is_some_and(|s| s.starts_with("https://") || s.starts_with("http://") || s.starts_with("data:"))
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
