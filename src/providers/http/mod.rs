//! HTTP provider adapters over reqwest: one file per kind, plus the shared [`client`].
//!
//! - [`openai_images`]: a synchronous OpenAI-compatible images endpoint (proves nothing after
//!   a lost answer, unless an idempotency header is configured).
//! - [`replicate`]: submit, poll by id, and find a lost create by listing recent predictions.
//! - [`fal_queue`]: fal's queue API: submit and poll by id (no listing to search).

pub mod client;
pub mod fal_queue;
pub mod openai_images;
pub mod replicate;

use base64::Engine as _;
use serde_json::{Map, Value};

use super::Image;

/// Encode an image as a `data:` URI, the form Replicate and fal accept for inline inputs.
pub fn data_uri(image: &Image) -> String {
    format!("data:{};base64,{}", image.media_type, base64::engine::general_purpose::STANDARD.encode(&image.bytes))
}

/// Parse a `WIDTHxHEIGHT` size such as `1024x1024`.
pub fn parse_size(size: &str) -> Option<(u32, u32)> {
    let (w, h) = size.split_once(['x', 'X'])?;
    Some((w.trim().parse().ok()?, h.trim().parse().ok()?))
}

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
