//! Listing images (issue #37): `GET /v1/overlays` (the templates tally draws the owner's words
//! with) and `GET /v1/sets/{id}/shots/{index}/preview?profile=` (a shot's chosen image made
//! into the file a delivery with that profile writes: composed on pure white for a
//! `main_white` shot, with the shot's words drawn, every rule of the profile checked).
//!
//! Invariant: the preview is the delivered file. Both come from
//! [`crate::delivery::render::check_listing`] with the same profile, the same chosen image and
//! the same words, and rendering is deterministic, so their sha256s are equal (a browser test
//! compares them).

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::openapi::{NotFound, StoreFailure};
use super::{AppState, json_response};
use crate::delivery::overlay::{TemplateInfo, templates};
use crate::delivery::render::{self, Listing, Rendered};
use crate::store::{SetView, StoreError, shot_label};

/// The header that carries a preview's sha256 (lowercase hex).
pub const SHA256_HEADER: &str = "tally-sha256";

/// `GET /v1/overlays` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct OverlayList {
    /// Every template a shot's `overlay` may name.
    pub templates: Vec<TemplateInfo>,
}

/// `GET /v1/overlays`: the templates tally draws a shot's words with.
#[utoipa::path(
    get,
    path = "/overlays",
    operation_id = "list_overlays",
    tag = "sets",
    responses((status = 200, description = "The overlay templates.", body = OverlayList))
)]
pub async fn overlays() -> Response {
    json_response(StatusCode::OK, &OverlayList { templates: templates() })
}

/// `…/preview` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PreviewQuery {
    /// The delivery profile to make the file with (an 800×800 square, `taobao_main`, when
    /// absent).
    #[param(schema_with = super::openapi::profile_names)]
    pub profile: Option<String>,
}

/// `GET /v1/sets/{id}/shots/{index}/preview?profile=`: the file a delivery of this shot
/// with `profile` writes, byte for byte (its sha256 in `Tally-Sha256`).
#[utoipa::path(
    get,
    path = "/sets/{id}/shots/{index}/preview",
    operation_id = "preview_shot",
    tag = "sets",
    params(super::choice::ShotPath, PreviewQuery),
    responses(
        (status = 200, description = "The file, as a delivery with the profile writes it.",
            content(("image/jpeg"), ("image/png"), ("image/webp"))),
        (status = 400, description = "A bad query string (`bad_request`).", body = ErrorBody),
        NotFound,
        (status = 409, description = "The shot has no chosen image (`not_chosen`), or its file breaks a rule of \
            the profile (`not_ready`, the reasons in the message).", body = ErrorBody),
        (status = 422, description = "No delivery profile of that name (`invalid_request`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn preview(
    State(state): State<AppState>,
    Path((id, index)): Path<(String, String)>,
    query: Result<Query<PreviewQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let position = super::choice::index_of(&index)?;
    let Query(q) = query?;
    let name = q.profile.filter(|p| !p.trim().is_empty()).unwrap_or_else(|| PREVIEW_PROFILE.into());
    let set = super::sets::load(&state, &id).await?;
    let file = match shot_file(&state, &set, position, &name).await? {
        ShotFile::Made(f) => f,
        ShotFile::NoShot => return Err(ApiError::not_found("shot")),
        ShotFile::NotChosen => {
            return Err(ApiError::conflict("not_chosen", "this shot has no chosen image yet; choose one first"));
        }
        ShotFile::Refused(why) => {
            let lang = super::lang::request_lang();
            let why: Vec<String> = why.iter().map(|w| crate::domain::words::render(lang, w)).collect();
            return Err(ApiError::conflict("not_ready", why.join("; ")));
        }
        ShotFile::UnknownProfile(names) => {
            return Err(ApiError::invalid(format!(
                "there is no delivery profile `{name}`; the profiles are: {}",
                names.join(", ")
            )));
        }
    };
    let mut resp = Body::from(file.bytes).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(file.media_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(&file.sha256) {
        h.insert(SHA256_HEADER, v);
    }
    Ok(resp)
}

/// A listing shot's rendering: the chosen image as delivered (composed on white, the owner's
/// words drawn by tally).
#[derive(Debug, Serialize, ToSchema)]
pub struct RenderingJson {
    /// A stable id of this rendering (of the chosen image, the words and the profile).
    pub id: String,
    /// Where to fetch it: `/v1/sets/{id}/shots/{index}/preview?profile=P`.
    pub url: String,
    /// The profile it is rendered with (the page's preview; a delivery renders the same bytes
    /// with the same profile).
    pub profile: String,
    /// The sha256 of its bytes (`GET /v1/sets/{id}` only; null in lists, and while it cannot
    /// be made: the reason is in `delivery.blocking` with `?profile=`).
    pub sha256: Option<String>,
}

/// The profile a shot's preview is rendered with when none is asked for: an 800×800 square.
pub const PREVIEW_PROFILE: &str = "taobao_main";

/// The rendering of shot `position` of set `set` (its chosen image `artifact` with `overlay`)
/// with `profile`, without its sha256.
pub(crate) fn rendering_json(
    set: &str,
    position: i64,
    artifact: &str,
    overlay: Option<&crate::domain::overlay::Overlay>,
    profile: &str,
) -> RenderingJson {
    let seed = format!("{artifact}\n{}\n{profile}", serde_json::json!(overlay));
    let id = crate::delivery::render::sha256_hex(seed.as_bytes())[..32].to_string();
    RenderingJson {
        id,
        url: format!("/v1/sets/{set}/shots/{position}/preview?profile={profile}"),
        profile: profile.to_string(),
        sha256: None,
    }
}

/// What shot `position`'s file with a profile is.
pub(crate) enum ShotFile {
    Made(Rendered),
    NoShot,
    NotChosen,
    /// It cannot be made, or breaks a rule of the profile: the reasons, in English.
    Refused(Vec<String>),
    UnknownProfile(Vec<String>),
}

/// Make shot `position`'s file with `profile` as a delivery would (on a blocking thread).
pub(crate) async fn shot_file(
    state: &AppState,
    set: &SetView,
    position: i64,
    profile: &str,
) -> Result<ShotFile, ApiError> {
    let profiles = state.delivery_profiles();
    let Some(profile) = profiles.iter().find(|p| p.name == profile).cloned() else {
        return Ok(ShotFile::UnknownProfile(profiles.into_iter().map(|p| p.name).collect()));
    };
    let Ok(i) = usize::try_from(position) else { return Ok(ShotFile::NoShot) };
    let Some(shot) = set.shots.get(i) else { return Ok(ShotFile::NoShot) };
    let Some(Some(artifact)) = set.chosen.get(i).cloned() else { return Ok(ShotFile::NotChosen) };
    let bytes = match state.engine().store().read_image_bytes(artifact.clone()).await {
        Ok(Some((_, b))) => b,
        Ok(None) => {
            return Ok(ShotFile::Refused(vec![crate::domain::words::say_with(
                "say.delivery_image_gone",
                &[("id", &artifact)],
            )]));
        }
        Err(StoreError::Damaged { why, .. }) => return Ok(ShotFile::Refused(vec![why])),
        Err(e) => return Err(e.into()),
    };
    let roles: Vec<Option<String>> = set.shots.iter().map(|t| t.shot_role.clone()).collect();
    let subject = crate::domain::words::say_with("say.chosen_image_of", &[("shot", &shot_label(&roles, i))]);
    let white = shot.shot_role.as_deref() == Some("main_white");
    let overlay = set.overlays.get(i).cloned().flatten();
    let made = tokio::task::spawn_blocking(move || {
        let listing = Listing { white, overlay: overlay.as_ref() };
        render::check_listing(&profile, &bytes, &listing, &subject)
    })
    .await
    .map_err(|e| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("making the preview stopped: {e}"))
    })?;
    Ok(match made {
        (problems, Some(f)) if problems.is_empty() => ShotFile::Made(f),
        (problems, _) => ShotFile::Refused(problems.into_iter().map(|p| p.message).collect()),
    })
}

/// What a shot's file with a profile came to, remembered: its sha256, or why it cannot be made.
#[derive(Debug, Clone)]
pub(crate) enum Judged {
    Sha256(String),
    Refused(Vec<String>),
}

/// How many judged files [`judge`] remembers (a line each; all forgotten when full).
const JUDGED: usize = 512;

/// [`shot_file`] reduced to its sha256 or its reasons, remembered per chosen image, words,
/// role and profile: a set's page asks on every change, and a chosen image's bytes never change
/// (an artifact id names fixed bytes), so a file once judged is not made again. What it says
/// is only shown (a JSON sha256, reasons in `blocking`): the preview route and a delivery make
/// the file again from the stored image, so an image pruned since is found gone there. `None`:
/// no such shot, no chosen image, or no such profile.
pub(crate) async fn judge(
    state: &AppState,
    set: &SetView,
    position: i64,
    profile: &str,
) -> Result<Option<Judged>, ApiError> {
    static SEEN: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, Judged>>> =
        std::sync::OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    let Some(i) = usize::try_from(position).ok() else { return Ok(None) };
    let (Some(shot), Some(Some(artifact))) = (set.shots.get(i), set.chosen.get(i)) else { return Ok(None) };
    let Some(p) = state.delivery_profiles().into_iter().find(|p| p.name == profile) else { return Ok(None) };
    let roles: Vec<Option<String>> = set.shots.iter().map(|t| t.shot_role.clone()).collect();
    let key = format!(
        "{artifact}\n{:?}\n{}\n{p:?}\n{}",
        shot.shot_role,
        serde_json::json!(set.overlays.get(i).cloned().flatten()),
        shot_label(&roles, i)
    );
    if let Some(j) = seen.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(Some(j.clone()));
    }
    let judged = match shot_file(state, set, position, profile).await? {
        ShotFile::Made(f) => Judged::Sha256(f.sha256),
        ShotFile::Refused(why) => Judged::Refused(why),
        ShotFile::NoShot | ShotFile::NotChosen | ShotFile::UnknownProfile(_) => return Ok(None),
    };
    let mut m = seen.lock().unwrap_or_else(|e| e.into_inner());
    if m.len() >= JUDGED {
        m.clear();
    }
    m.insert(key, judged.clone());
    Ok(Some(judged))
}
