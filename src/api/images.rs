//! Image downloads: `GET /v1/artifacts/{id}` (a generated image) and `GET /v1/uploads/{id}`
//! (a reference photo). The bytes come from the database ([`crate::store::BlobReader`]) one
//! chunk at a time, each read in its own short read transaction on a blocking thread, so a
//! slow client never holds a snapshot open. Images up to [`VERIFY_FIRST_BYTES`] are read whole
//! and checked against their sha256 before the answer starts (a damaged one is 500
//! `image_damaged`); larger ones stream, so no request holds a large image in memory, and a
//! damaged one ends its transfer incomplete. `Content-Length` comes from the recorded size, `ETag` from the recorded sha256, and
//! `Content-Disposition` gives a name a person recognises: the product and role of a set's
//! shot, or the job's prompt ([`super::download::artifact_file_name`]), then a short id, e.g.
//! `red-sneaker_main_5c1d9e2f.png`.
//!
//! Other routes that stream one stored image can use [`image_response`]; thumbnails
//! (`api::thumbnail`) read the whole image with `Store::read_image_bytes`, since decoding needs
//! all of it.

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream;

use super::AppState;
use super::download::{artifact_file_name, content_disposition, slug, with_short_id};
use super::error::ApiError;
use super::openapi::{ImageDamaged, NotFound, StoreFailure};
use crate::store::{BlobReader, CHUNK, Store};

/// The `{id}` of an artifact in a path.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ArtifactId {
    /// An artifact's id (a task's `artifacts[].id`).
    #[allow(dead_code)]
    id: String,
}

/// The `{id}` of an upload in a path.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct UploadId {
    /// An upload's id (from `POST /v1/uploads`, or a set's `references[].id`).
    #[allow(dead_code)]
    id: String,
}

/// `GET /v1/artifacts/{id}`: the image, named after its set's product and the shot's role (or
/// the job's prompt), and a short id.
#[utoipa::path(
    get,
    path = "/artifacts/{id}",
    operation_id = "get_artifact",
    tag = "images",
    params(ArtifactId),
    responses(
        (status = 200, description = "The image's bytes, as stored (sha256 in `ETag`).",
            content(("image/png"), ("image/jpeg"), ("image/webp")),
            headers(
                ("Content-Disposition" = String, description = "`inline; filename=\"<product>_<role>_<short id>.png\"`"),
                ("ETag" = String, description = "The image's sha256, quoted"),
            )),
        NotFound,
        ImageDamaged,
        StoreFailure,
    )
)]
pub async fn artifact(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let store = state.engine().store();
    let a = store.artifact(id).await?.ok_or_else(|| ApiError::not_found("artifact"))?;
    let task = store.get_task(a.task_id.clone()).await?;
    let set = match task.as_ref().and_then(|t| t.set_id.clone()) {
        Some(set_id) => store.get_set(set_id).await?,
        None => None,
    };
    let name = match &task {
        Some(t) => artifact_file_name(t, set.as_ref(), &a),
        None => format!("image.{}", crate::providers::extension(&a.media_type)),
    };
    image_response(store, &a.id, &with_short_id(&name, &a.id)).await
}

/// `GET /v1/uploads/{id}`: the reference photo, named after the product of the first set that
/// uses it: `red-sneaker_reference_5c1d9e2f.png` (else `reference-photo_…`).
#[utoipa::path(
    get,
    path = "/uploads/{id}",
    operation_id = "get_upload",
    tag = "images",
    params(UploadId),
    responses(
        (status = 200, description = "The reference photo's bytes, as uploaded (sha256 in `ETag`).",
            content(("image/png"), ("image/jpeg"), ("image/webp")),
            headers(
                ("Content-Disposition" = String, description = "`inline; filename=\"<product>_reference_<short id>.png\"`"),
                ("ETag" = String, description = "The image's sha256, quoted"),
            )),
        NotFound,
        ImageDamaged,
        StoreFailure,
    )
)]
pub async fn upload(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let store = state.engine().store();
    let (u, product) = store.upload_for_download(id).await?.ok_or_else(|| ApiError::not_found("upload"))?;
    let stem = match product.as_deref().and_then(|p| slug(p, 48)) {
        Some(p) => format!("{p}_reference"),
        None => "reference-photo".into(),
    };
    let name = format!("{stem}.{}", crate::providers::extension(&u.media_type));
    image_response(store, &u.id, &with_short_id(&name, &u.id)).await
}

/// Images up to this size are read whole and checked against their sha256 before the first
/// byte is sent, so a damaged one is answered `image_damaged` instead of a started transfer
/// (a few milliseconds and at most this much memory per download). Larger ones stream, and
/// a damaged one ends its transfer short of its `Content-Length` (see [`chunks`]).
pub const VERIFY_FIRST_BYTES: i64 = 4 << 20;

/// A 200 response with the image stored under `id`, offered (inline) as `filename`. 404 if
/// nothing is stored there; 500 `image_damaged` if its bytes are damaged and it is small
/// enough to check first ([`VERIFY_FIRST_BYTES`]).
pub async fn image_response(store: &Store, id: &str, filename: &str) -> Result<Response, ApiError> {
    let opening = store.clone();
    let key = id.to_string();
    let (meta, body) = tokio::task::spawn_blocking(move || -> Result<_, crate::store::StoreError> {
        let Some(mut reader) = opening.open_blob(&key)? else { return Ok(None) };
        let meta = reader.meta().clone();
        if meta.bytes <= VERIFY_FIRST_BYTES {
            let whole = reader.read_all()?;
            return Ok(Some((meta, Body::from(whole))));
        }
        Ok(Some((meta, Body::from_stream(chunks(reader)))))
    })
    .await
    .map_err(|e| ApiError::unavailable(&e))??
    .ok_or_else(|| ApiError::not_found("image"))?;
    let disposition = content_disposition("inline", filename);
    let etag = HeaderValue::from_str(&format!("\"{}\"", meta.sha256)).ok();
    let mut response = body.into_response();
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&meta.media_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(meta.bytes.max(0) as u64));
    h.insert(header::CONTENT_DISPOSITION, disposition);
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=31536000, immutable"));
    if let Some(etag) = etag {
        h.insert(header::ETAG, etag);
    }
    Ok(response)
}

/// The image as a stream of chunks, each read on a blocking thread. An error (damaged bytes,
/// whose last chunk [`BlobReader`] withholds; the image pruned mid-download; the database
/// failed) ends the body with an error: hyper then closes the connection without the rest,
/// so the client sees a transfer shorter than its `Content-Length` (an incomplete download,
/// which curl, browsers and HTTP libraries report as an error), never other bytes and never a
/// complete-looking file.
fn chunks(reader: BlobReader) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    stream::unfold(Some(reader), |state| async move {
        let mut reader = state?;
        let read = tokio::task::spawn_blocking(move || {
            let chunk = reader.next_chunk(CHUNK);
            (reader, chunk)
        })
        .await;
        match read {
            Ok((reader, Ok(Some(chunk)))) => Some((Ok(Bytes::from(chunk)), Some(reader))),
            Ok((_, Ok(None))) => None,
            Ok((reader, Err(e))) => {
                tracing::warn!(image = %reader.meta().id, error = %e, "an image download ended early");
                Some((Err(std::io::Error::other(e)), None))
            }
            Err(e) => Some((Err(std::io::Error::other(e)), None)),
        }
    })
}
