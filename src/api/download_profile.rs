//! `GET /v1/sets/{id}/download?profile=NAME`: the set zip with each image made listing-ready
//! by a delivery profile ([`crate::delivery::render`]), named by the profile's `file_name`
//! pattern ([`crate::delivery::names::file_names`]), with `manifest.csv` and `manifest.json`
//! ([`crate::delivery::manifest`]) at the end.
//!
//! Unlike the plain set zip this one is made whole in memory on a blocking thread before the
//! answer starts (the files must be rendered, and their sizes and sha256s go into the
//! manifests): a set is a handful of images of a few MB each. Each source image is read whole
//! and checked against its sha256 (`Store::read_image_bytes`); a damaged one, or one the
//! profile cannot be made from (too many bytes at any quality, unreadable), is left out and
//! named in `NOT-INCLUDED.txt` with why, and `Tally-Images-Left-Out` counts them.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::download::{LEFT_OUT_HEADER, LEFT_OUT_NOTE, ZipEntry, content_disposition, stored_zip, zip_name};
use super::error::ApiError;
use crate::delivery::manifest::{self, ManifestRow};
use crate::delivery::names::{NameParts, file_names};
use crate::delivery::profile::Profile;
use crate::delivery::render::{Listing, Rendered, render_listing};
use crate::store::{ArtifactView, SetView, StoreError, TaskView};

/// One image picked for the zip, with what it was made into (or why not).
struct Made {
    shot: usize,
    task: TaskView,
    artifact: ArtifactView,
    result: Result<Rendered, String>,
}

/// The zip of `files` (picked by `which`) made with `profile`; see the module doc.
pub(super) async fn profile_zip(
    state: &AppState,
    set: &SetView,
    files: Vec<(ArtifactView, String)>,
    profile: &Profile,
) -> Result<Response, ApiError> {
    let store = state.engine().store().clone();
    // Read every source first (async), then render them all on one blocking thread.
    let mut sources = Vec::with_capacity(files.len());
    for (artifact, _) in files {
        let Some((shot, task)) = set
            .candidates
            .iter()
            .enumerate()
            .find_map(|(i, c)| c.iter().find(|t| t.id == artifact.task_id).map(|t| (i, t.clone())))
        else {
            continue;
        };
        let bytes = match store.read_image_bytes(artifact.id.clone()).await {
            Ok(Some((_, bytes))) => Ok(bytes),
            Ok(None) => Err("its image is not stored".to_string()),
            Err(StoreError::Damaged { why, .. }) => Err(why),
            Err(e) => return Err(e.into()),
        };
        sources.push((shot, task, artifact, bytes));
    }
    let profile_for_render = profile.clone();
    // Each shot's image is made as its delivery makes it: a white main image composed on white,
    // the shot's words drawn.
    let listing: Vec<(bool, Option<crate::domain::overlay::Overlay>)> = (0..set.shots.len())
        .map(|i| {
            let white = set.shots[i].shot_role.as_deref() == Some("main_white");
            (white, set.overlays.get(i).cloned().flatten())
        })
        .collect();
    let made: Vec<Made> = tokio::task::spawn_blocking(move || {
        sources
            .into_iter()
            .map(|(shot, task, artifact, bytes)| {
                let (white, overlay) = listing.get(shot).cloned().unwrap_or_default();
                let how = Listing { white, overlay: overlay.as_ref() };
                let result =
                    bytes.and_then(|b| render_listing(&profile_for_render, &b, &how).map_err(|e| e.to_string()));
                Made { shot, task, artifact, result }
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::unavailable(&e))?;
    let (good, bad): (Vec<&Made>, Vec<&Made>) = made.iter().partition(|m| m.result.is_ok());
    if good.is_empty() {
        let why: Vec<String> = bad
            .iter()
            .map(|m| {
                let what = m.result.as_ref().err().cloned().unwrap_or_default();
                crate::domain::words::say_with("say.error_shot", &[("n", &(m.shot + 1).to_string()), ("what", &what)])
            })
            .collect();
        return Err(ApiError::conflict(
            "cannot_make",
            crate::domain::words::say_with("say.none_made", &[("profile", &profile.name), ("why", &why.join("; "))]),
        ));
    }
    let roles: Vec<Option<String>> = set.shots.iter().map(|t| t.shot_role.clone()).collect();
    let parts: Vec<NameParts<'_>> = good
        .iter()
        .filter_map(|m| {
            let r = m.result.as_ref().ok()?;
            Some(NameParts {
                product: &set.product,
                role: roles.get(m.shot).and_then(|r| r.as_deref()),
                index: m.shot + 1,
                profile: &profile.name,
                ext: r.ext,
            })
        })
        .collect();
    let names = file_names(&profile.file_name, &parts);
    let mut rows = Vec::with_capacity(good.len());
    let mut entries: Vec<(String, &[u8], crate::domain::Millis)> = Vec::new();
    for (m, name) in good.iter().zip(&names) {
        let Ok(r) = &m.result else { continue };
        rows.push(ManifestRow {
            product: set.product.clone(),
            shot_role: roles.get(m.shot).cloned().flatten().unwrap_or_default(),
            profile: profile.name.clone(),
            file_name: name.clone(),
            sha256: r.sha256.clone(),
            width: r.width,
            height: r.height,
            bytes: r.bytes.len() as u64,
            source_task_id: m.task.id.clone(),
            source_artifact_id: m.artifact.id.clone(),
            charge: m.task.charge.state.as_str().to_string(),
            cost_micros: m.task.charge.cost_micros,
            currency: m.task.charge.currency.clone(),
            remote_id: None,
        });
        entries.push((name.clone(), &r.bytes, m.artifact.created_at));
    }
    let csv = manifest::csv(&rows);
    let json = manifest::json(&rows);
    let note = (!bad.is_empty()).then(|| {
        let mut t = format!(
            "{} image(s) of this set are NOT in this zip: they could not be made with profile `{}`.\n\n",
            bad.len(),
            profile.name
        );
        for m in &bad {
            let why = m.result.as_ref().err().cloned().unwrap_or_default();
            t.push_str(&format!("shot {} (artifact {}): {why}\n", m.shot + 1, m.artifact.id));
        }
        t
    });
    let zip = write(&entries, &csv, &json, note.as_deref()).map_err(|e| ApiError::unavailable(&e))?;
    let mut r = (StatusCode::OK, Body::from(zip)).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/zip"));
    h.insert(header::CONTENT_DISPOSITION, content_disposition("attachment", &zip_name(set, Some(&profile.name))));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if !bad.is_empty() {
        h.insert(LEFT_OUT_HEADER, HeaderValue::from(bad.len()));
    }
    Ok(r)
}

/// The zip: one stored entry per file, then the manifests, then the note (if any).
fn write(
    entries: &[(String, &[u8], crate::domain::Millis)],
    csv: &[u8],
    json: &[u8],
    note: Option<&str>,
) -> zip::result::ZipResult<Vec<u8>> {
    let mut all: Vec<ZipEntry> = entries.iter().map(|(n, b, at)| (n.as_str(), *b, Some(*at))).collect();
    all.push((manifest::CSV_NAME, csv, None));
    all.push((manifest::JSON_NAME, json, None));
    if let Some(note) = note {
        all.push((LEFT_OUT_NOTE, note.as_bytes(), None));
    }
    stored_zip(&all)
}
