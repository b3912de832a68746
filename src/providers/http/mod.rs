//! What the HTTP provider adapters (`providers::kinds`) share: the reqwest [`client`] with its
//! readings of answers (`notnow`: "not now" and out of credit; `results`: paid-result
//! retention and retried downloads), and small helpers for request bodies.

pub mod client;
mod notnow;
mod results;

use base64::Engine as _;
use serde_json::{Map, Value};

use super::ProviderConfig;
use super::{CallError, Image};

/// The configuration with a trailing `/v1` removed from `base_url`: the adapters add the
/// `/v1/...` paths themselves, and the official SDKs (and most gateways) document base URLs
/// that already end in `/v1`, so both spellings work.
pub(crate) fn api_root(cfg: &ProviderConfig) -> ProviderConfig {
    let mut cfg = cfg.clone();
    if let Some(url) = cfg.base_url.as_mut() {
        let trimmed = url.trim_end_matches('/');
        *url = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
    }
    cfg
}

/// Refuse, before anything is sent, an `output_format` parameter naming a format tally could
/// not store (it would be charged and then refused as "not an image").
pub(crate) fn check_output_format(params: &Value, storable: &[&str]) -> Result<(), CallError> {
    match params.get("output_format") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(f)) if storable.contains(&f.to_ascii_lowercase().as_str()) => Ok(()),
        Some(other) => Err(CallError::Rejected {
            message: format!(
                "output_format {other} is not one tally can store (it keeps {}); nothing was sent",
                storable.join(", ")
            ),
            config: false,
        }),
    }
}

/// Encode an image as a `data:` URI, the form several APIs accept for inline inputs.
pub fn data_uri(image: &Image) -> String {
    format!("data:{};base64,{}", image.media_type, base64::engine::general_purpose::STANDARD.encode(&image.bytes))
}

pub use super::settings::parse_size;

/// Copy the task's free-form parameters into a request body, except keys the adapter owns
/// (the prompt, the marker, the reference images), so a task cannot forge them.
pub(crate) fn merge_params(body: &mut Map<String, Value>, params: &Value, reserved: &[&str]) {
    if let Value::Object(extra) = params {
        for (k, v) in extra {
            if !reserved.contains(&k.as_str()) {
                body.insert(k.clone(), v.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_with_or_without_v1() {
        for url in [
            "https://api.openai.com",
            "https://api.openai.com/",
            "https://api.openai.com/v1",
            "https://api.openai.com/v1/",
        ] {
            let cfg = ProviderConfig { base_url: Some(url.into()), ..ProviderConfig::demo() };
            assert_eq!(api_root(&cfg).base_url.as_deref(), Some("https://api.openai.com"), "{url}");
        }
    }

    #[test]
    fn unstorable_output_formats_are_refused_before_the_call() {
        let ok = ["png", "jpeg", "webp"];
        assert!(check_output_format(&serde_json::json!({}), &ok).is_ok());
        assert!(check_output_format(&serde_json::json!({"output_format": "WEBP"}), &ok).is_ok());
        for bad in [serde_json::json!({"output_format": "gif"}), serde_json::json!({"output_format": "svg"})] {
            assert!(matches!(check_output_format(&bad, &ok), Err(CallError::Rejected { config: false, .. })));
        }
    }

    #[test]
    fn sizes_and_params() {
        assert_eq!(parse_size("1024x768"), Some((1024, 768)));
        assert_eq!(parse_size("big"), None);
        let mut body = Map::new();
        body.insert("prompt".into(), "p".into());
        merge_params(&mut body, &serde_json::json!({"prompt": "forged", "steps": 4}), &["prompt"]);
        assert_eq!(body["prompt"], "p");
        assert_eq!(body["steps"], 4);
    }
}
