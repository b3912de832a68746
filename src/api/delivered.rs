//! Taking the delivered files away (a phone saving them to its album, or a shop owner far from
//! the computer the folder is on): `GET /v1/deliveries/{id}/files/{position}` is one delivered
//! file, `GET /v1/deliveries/{id}/download` all of them in a zip, under the names they were
//! delivered with.
//!
//! tally keeps the chosen images, not the files it made from them: each file is made again
//! from its item's image with the delivery's profile, and answered only when its sha256 is the
//! one recorded when it was delivered — so a download is byte for byte the delivered file, or
//! a 409 saying why not (the image is gone, or the profile changed since), never a lookalike.

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::download::{ZipEntry, content_disposition, stored_zip};
use super::error::{ApiError, ErrorBody};
use crate::delivery::profile::Profile;
use crate::delivery::render::{Rendered, render};
use crate::store::{DeliveryItemView, DeliveryView, ItemState, Store};

/// The delivered file of one item, made again and checked against its recorded sha256.
fn remake(store: &Store, profile: &Profile, item: &DeliveryItemView) -> Result<Rendered, ApiError> {
    let not_the_same = |why: String| ApiError::conflict("file_not_reproducible", why);
    let Some(recorded) = item.sha256.as_deref() else {
        return Err(not_the_same(format!("{} has no recorded file", item.file_name)));
    };
    let Some((_, bytes)) = store.read_image_bytes_blocking(&item.artifact_id)? else {
        return Err(not_the_same(format!(
            "the image {} was made from is no longer stored (pruned or deleted); the delivered file is only at the \
             target now",
            item.file_name
        )));
    };
    let made =
        render(profile, &bytes).map_err(|e| not_the_same(format!("{} cannot be made again: {e}", item.file_name)))?;
    if made.sha256 != recorded {
        return Err(not_the_same(format!(
            "{} made again today differs from the delivered file (sha256 {} instead of {recorded}): the profile \
             `{}` changed since it was delivered; deliver the set again to download its new files",
            item.file_name, made.sha256, profile.name
        )));
    }
    Ok(made)
}

/// A delivery and its profile, or the error a request about it gets.
async fn delivery_and_profile(state: &AppState, id: String) -> Result<(DeliveryView, Profile), ApiError> {
    let Some(d) = state.engine().store().delivery(id).await? else { return Err(ApiError::not_found("delivery")) };
    let Some(p) = state.delivery_profiles().into_iter().find(|p| p.name == d.profile) else {
        return Err(ApiError::conflict(
            "file_not_reproducible",
            format!("the profile `{}` this delivery used is no longer configured", d.profile),
        ));
    };
    Ok((d, p))
}

/// `GET /v1/deliveries/{id}/files/{position}`: the delivered file of the shot at `position`.
#[utoipa::path(
    get,
    path = "/deliveries/{id}/files/{position}",
    operation_id = "get_delivered_file",
    tag = "deliveries",
    params(
        ("id" = String, Path, description = "A delivery's id."),
        ("position" = i64, Path, description = "The shot's position in the set, from 0."),
    ),
    responses(
        (status = 200, description = "The delivered file, byte for byte (its sha256 is the item's), as an \
            attachment named as delivered.",
            content(("image/png"), ("image/jpeg"), ("image/webp"))),
        (status = 400, description = "The position is not a whole number from 0 (`bad_request`).", body = ErrorBody),
        (status = 404, description = "No such delivery, or no item at that position (`not_found`).", body = ErrorBody),
        (status = 409, description = "The item is not delivered (`not_delivered`), or its file cannot be made \
            again byte for byte: its image is gone or its profile changed (`file_not_reproducible`).", body = ErrorBody),
        crate::api::openapi::StoreFailure,
    )
)]
pub async fn file(
    State(state): State<AppState>,
    Path((id, position)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let position = super::choice::index_of(&position)?;
    let (d, profile) = delivery_and_profile(&state, id).await?;
    let Some(item) = d.items.into_iter().find(|i| i.position == position) else {
        return Err(ApiError::not_found("delivered file"));
    };
    if item.state != ItemState::Delivered {
        return Err(ApiError::conflict(
            "not_delivered",
            format!(
                "{} is not delivered ({}): there is no delivered file to download",
                item.file_name,
                item.state.as_str()
            ),
        ));
    }
    let store = state.engine().store().clone();
    let name = item.file_name.clone();
    let made = tokio::task::spawn_blocking(move || remake(&store, &profile, &item))
        .await
        .map_err(|e| ApiError::unavailable(&e))??;
    let mut r = (StatusCode::OK, made.bytes).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(made.media_type));
    h.insert(header::CONTENT_DISPOSITION, content_disposition("attachment", &name));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

/// `GET /v1/deliveries/{id}/download`: every delivered file of the delivery in one zip.
#[utoipa::path(
    get,
    path = "/deliveries/{id}/download",
    operation_id = "download_delivery",
    tag = "deliveries",
    params(("id" = String, Path, description = "A delivery's id.")),
    responses(
        (status = 200, description = "A zip of the delivered files, each byte for byte as delivered and named \
            as delivered.", content(("application/zip"))),
        (status = 404, description = "No such delivery (`not_found`).", body = ErrorBody),
        (status = 409, description = "Nothing of it is delivered (`not_delivered`), or a file cannot be made \
            again byte for byte (`file_not_reproducible`, naming it).", body = ErrorBody),
        crate::api::openapi::StoreFailure,
    )
)]
pub async fn zip(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let (d, profile) = delivery_and_profile(&state, id).await?;
    let items: Vec<DeliveryItemView> = d.items.into_iter().filter(|i| i.state == ItemState::Delivered).collect();
    if items.is_empty() {
        return Err(ApiError::conflict(
            "not_delivered",
            "nothing of this delivery is delivered yet: no file to download",
        ));
    }
    let store = state.engine().store().clone();
    let at = d.updated_at;
    let made = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, ApiError> {
        let files = items.iter().map(|i| remake(&store, &profile, i)).collect::<Result<Vec<_>, _>>()?;
        let entries: Vec<ZipEntry> =
            items.iter().zip(&files).map(|(i, f)| (i.file_name.as_str(), f.bytes.as_slice(), Some(at))).collect();
        stored_zip(&entries).map_err(|e| ApiError::unavailable(&e))
    })
    .await
    .map_err(|e| ApiError::unavailable(&e))??;
    let name = format!("{}-{}.zip", d.profile, &d.id[..d.id.len().min(8)]);
    let mut r = (StatusCode::OK, made).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/zip"));
    h.insert(header::CONTENT_DISPOSITION, content_disposition("attachment", &name));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}
