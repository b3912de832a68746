//! The mock's Photoroom remove-background API: `POST /v1/segment`, a multipart form whose
//! `image_file` part is the image, the key in `x-api-key`; the answer is the cut-out as
//! `image/png` bytes (a PNG with alpha whose background — the colour of the image's corner —
//! is made transparent). As the published API reference documents: a missing `image_file`
//! is a 400 and is not billed, an image that cannot be read is a 400, a call without a key
//! a 401 (checked on the shared path); every call answered with an image is billed once. The
//! ledger line's `prompt` is `image <sha256>` of the image sent (a cutout has no prompt).

use std::sync::Arc;

use axum::extract::{Multipart, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;

use super::serve::{ApiRequest, NewJob, new_job, serve};
use super::{Answer, Api, Mock, Scope, error};

/// `POST /v1/segment`.
pub(super) async fn segment(State(mock): State<Arc<Mock>>, headers: HeaderMap, mut form: Multipart) -> Response {
    let mut req = ApiRequest::new(Api::Photoroom, "POST /v1/segment", Scope::Create, &headers);
    let mut image = None;
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
            "image_file" => image = Some(data.to_vec()),
            // Documented options of the Basic plan's endpoint: accepted, not acted on.
            "format" | "channels" | "bg_color" | "size" | "crop" | "despill" => {}
            other => {
                return error(StatusCode::BAD_REQUEST, &format!("unknown field `{other}`"), "invalid_field");
            }
        }
    }
    req.reference_images = usize::from(image.is_some());
    // A cutout has no prompt: its ledger line names the image it was asked for, by sha256, so
    // a second charge for the same image shows as a repeated "prompt".
    req.prompt = image.as_ref().map(|b| {
        use sha2::Digest;
        format!("image {}", crate::domain::hex(&sha2::Sha256::digest(b)))
    });
    serve(
        mock,
        req,
        Box::new(move |jobs, b, _base| {
            let Some(bytes) = image else {
                return Answer::error(StatusCode::BAD_REQUEST, "image_file is required", "missing_image_file");
            };
            let Ok(img) = image::load_from_memory(&bytes) else {
                return Answer::error(StatusCode::BAD_REQUEST, "the image could not be read", "invalid_image");
            };
            let mut img = img.to_rgba8();
            let corner = img.get_pixel(0, 0).0;
            for p in img.pixels_mut() {
                if (0..3).all(|c| p.0[c].abs_diff(corner[c]) <= 24) {
                    p.0[3] = 0;
                }
            }
            let mut out = std::io::Cursor::new(Vec::new());
            if img.write_to(&mut out, image::ImageFormat::Png).is_err() {
                return Answer::error(StatusCode::INTERNAL_SERVER_ERROR, "could not encode the result", "internal");
            }
            let new = NewJob { api: Api::Photoroom, model: "segment", version: None, prompt: "", input: Value::Null };
            let id = new_job(jobs, new, b);
            Answer::charged(Value::Null, id).with_bytes("image/png", out.into_inner())
        }),
    )
    .await
}
