//! Image-set routes: reference uploads (`/v1/uploads`) and sets of shots (`/v1/sets`). A
//! set's status, progress and message are derived from its shots; each shot is shown as a
//! task, so its fate is as honest as a single task's.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::openapi::{JsonRejected, NotFound, StoreFailure};
use super::tasks::{
    ArtifactJson, ChargeJson, DEFAULT_LIMIT, IdempotencyKey, TaskJson, idempotency_key, next_cursor, page_limit,
    task_json,
};
use super::{AppState, JsonBody, json_response};
use crate::clock::rfc3339;
use crate::domain::TaskStatus;
use crate::domain::words::{render, say};
use crate::store::{
    MAX_CANDIDATES, NewSet, NewShot, SHOT_ROLES, SetStatus, SetView, SubmitOutcome, TaskView, UploadView,
    delivery_blocking, set_summary,
};

/// The content types `POST /v1/uploads` accepts (the bytes are checked too).
pub const UPLOAD_TYPES: &[&str] = &["image/png", "image/jpeg", "image/webp", "application/octet-stream"];

/// An upload as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct UploadJson {
    pub id: String,
    pub sha256: String,
    pub bytes: i64,
    pub media_type: String,
    /// Where to download it: `/v1/uploads/{id}`.
    pub url: String,
    /// RFC 3339, UTC.
    pub created_at: String,
}

fn upload_json(u: &UploadView) -> UploadJson {
    UploadJson {
        id: u.id.clone(),
        sha256: u.sha256.clone(),
        bytes: u.bytes,
        media_type: u.media_type.clone(),
        url: format!("/v1/uploads/{}", u.id),
        created_at: rfc3339(u.created_at),
    }
}

/// A shot: its place in the set, its candidates, the chosen image, and (flattened, as before
/// candidates existed) its first candidate's task.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct ShotJson {
    pub position: i64,
    pub role: Option<String>,
    /// Every current candidate of the shot (a retried candidate replaced by its retry), in
    /// the order they were asked for.
    pub candidates: Vec<CandidateJson>,
    /// The chosen image's artifact id; null while none is chosen.
    pub chosen: Option<String>,
    /// A `main_white` shot's photo (`{"upload": ID}` or `{"artifact": ID}`): its candidates
    /// are cutouts of it. Null for a generated shot.
    #[schema(value_type = Option<Object>)]
    pub source: Option<crate::domain::operation::Source>,
    /// The words tally draws on the shot's image when it is delivered; null: none.
    pub overlay: Option<crate::domain::overlay::Overlay>,
    /// The chosen image as it is delivered — a white main image composed on pure white, the
    /// words drawn — with its own id and sha256 (the profile of `?profile=`, else an 800×800
    /// square): a new rendering, never the chosen image's stored bytes. Null without a chosen
    /// image, and for a shot that is neither `main_white` nor has words.
    pub rendering: Option<super::listing::RenderingJson>,
    #[serde(flatten)]
    pub task: TaskJson,
}

/// One candidate image of a shot: its task's id, status, image and charge.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct CandidateJson {
    /// Its number within the shot, from 0.
    pub candidate: i64,
    pub task_id: String,
    pub status: TaskStatus,
    /// Plain words for the status.
    pub message: String,
    /// Its image once it succeeded, else null.
    pub artifact: Option<ArtifactJson>,
    pub charge: ChargeJson,
    /// Whether this candidate's image is the shot's chosen one.
    pub chosen: bool,
    /// What made it: `generate` (the shot's request), or an `edit` or `cutout` of `image`,
    /// an image of another candidate of the shot.
    #[schema(value_type = String)]
    pub operation: crate::domain::operation::Operation,
    /// The image an edit or cutout candidate was made from.
    #[schema(value_type = Option<Object>)]
    pub image: Option<crate::domain::operation::Source>,
    /// True while a budget holds it back: raising the budget lets it go at once.
    pub held_by_budget: bool,
}

/// Whether a set can be delivered, and if not, why in plain words.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct DeliveryJson {
    pub ready: bool,
    /// E.g. "2 shots have no chosen image: Lifestyle scene, Selling point"; with a profile
    /// also "the Main photo's chosen image is 256 px wide; amazon asks for at least 1000 px".
    pub blocking: Vec<String>,
    /// The profile `blocking` was checked against (`?profile=`); absent: only the choice was
    /// checked. Reasons that need the file made (too many bytes at any quality, transparency
    /// `original` keeps) are not checked here: a delivery's 409 lists them. Absent without
    /// `?profile=`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// One entry of a set's own timeline.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct SetEventJson {
    /// RFC 3339, UTC.
    pub at: String,
    /// `created`, `candidates_added`, `chosen`, `choice_cleared`, `edited`, `duplicated`,
    /// `duplicated_from` or `started`.
    pub kind: String,
    pub message: String,
}

/// A set as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct SetJson {
    pub id: String,
    pub product: String,
    pub style: Option<String>,
    pub provider: String,
    pub status: SetStatus,
    /// E.g. "3 of 7 done, 1 unknown".
    pub progress: String,
    pub message: String,
    pub canceled: bool,
    pub created_at: String,
    pub updated_at: String,
    pub references: Vec<UploadJson>,
    pub shots: Vec<ShotJson>,
    /// How many shots have a chosen image.
    pub shots_chosen: usize,
    pub delivery: DeliveryJson,
    /// Tasks of retried shots and candidates, replaced by their retries.
    pub replaced: Vec<String>,
    /// The set's own timeline (created, candidates added, choices, edits, duplicates), oldest
    /// first; its messages in the answer's language (recorded in English).
    pub timeline: Vec<SetEventJson>,
}

/// A shot's task as a set shows it: in a copy to edit (`draft`) a task no worker will take
/// before the start says so, rather than that it is queued.
fn shown_task(state: &AppState, t: &TaskView, draft: bool) -> TaskJson {
    let mut j = task_json(state.engine(), t);
    if draft && matches!(t.status, TaskStatus::Queued | TaskStatus::Waiting) {
        j.message = render(super::lang::request_lang(), &say("say.waits_for_start"));
    }
    j
}

fn candidate_json(state: &AppState, t: &TaskView, chosen: Option<&str>, draft: bool) -> CandidateJson {
    let j = shown_task(state, t, draft);
    let artifact = if t.status == TaskStatus::Succeeded { j.artifacts.into_iter().next() } else { None };
    CandidateJson {
        candidate: t.candidate,
        task_id: j.id,
        status: j.status,
        message: j.message,
        chosen: artifact.as_ref().is_some_and(|a| Some(a.id.as_str()) == chosen),
        artifact,
        charge: j.charge,
        operation: t.operation,
        image: t.source.clone(),
        held_by_budget: j.held_by_budget,
    }
}

/// The API's view of a set.
pub fn set_json(state: &AppState, s: &SetView) -> SetJson {
    let (status, progress, message) = set_summary(s);
    let draft = status == SetStatus::Draft;
    // Its words in the answer's language (`api::lang`); made in English by the store.
    let lang = super::lang::request_lang();
    let (progress, message) = (render(lang, &progress), render(lang, &message));
    SetJson {
        id: s.id.clone(),
        product: s.product.clone(),
        style: s.style.clone(),
        provider: s.provider.clone(),
        status,
        progress,
        message,
        canceled: s.canceled,
        created_at: rfc3339(s.created_at),
        updated_at: rfc3339(s.updated_at),
        references: s.references.iter().map(upload_json).collect(),
        shots: s
            .shots
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let chosen = s.chosen.get(i).cloned().flatten();
                let position = t.set_position.unwrap_or(i as i64);
                let overlay = s.overlays.get(i).cloned().flatten();
                let white = t.shot_role.as_deref() == Some("main_white");
                let source =
                    t.source.clone().filter(|_| white && t.operation == crate::domain::operation::Operation::Cutout);
                let rendering = match (&chosen, overlay.is_some() || white) {
                    (Some(a), true) => Some(super::listing::rendering_json(
                        &s.id,
                        position,
                        a,
                        overlay.as_ref(),
                        super::listing::PREVIEW_PROFILE,
                    )),
                    _ => None,
                };
                ShotJson {
                    position,
                    role: t.shot_role.clone(),
                    source,
                    overlay,
                    rendering,
                    candidates: s
                        .candidates
                        .get(i)
                        .into_iter()
                        .flatten()
                        .map(|c| candidate_json(state, c, chosen.as_deref(), draft))
                        .collect(),
                    chosen,
                    task: shown_task(state, t, draft),
                }
            })
            .collect(),
        shots_chosen: s.chosen.iter().filter(|c| c.is_some()).count(),
        delivery: {
            let blocking = delivery_blocking(s);
            DeliveryJson {
                ready: blocking.is_empty(),
                blocking: super::deliveries::shown_reasons(blocking),
                profile: None,
            }
        },
        replaced: s.replaced.clone(),
        timeline: s
            .timeline
            .iter()
            .map(|e| SetEventJson { at: rfc3339(e.at), kind: e.kind.clone(), message: render(lang, &e.message) })
            .collect(),
    }
}

/// `POST /v1/uploads`: the raw image bytes (PNG, JPEG or WebP, checked from the bytes).
#[utoipa::path(
    post,
    path = "/uploads",
    operation_id = "upload_reference",
    tag = "sets",
    request_body(
        description = "The image's bytes (PNG, JPEG or WebP; checked from the bytes, not the declared type).",
        content(("image/png"), ("image/jpeg"), ("image/webp"), ("application/octet-stream"))
    ),
    responses(
        (status = 201, description = "The stored reference photo (the same one again for the same bytes).",
            body = UploadJson),
        (status = 400, description = "An empty body (`bad_request`).", body = ErrorBody),
        (status = 422, description = "Not a PNG, JPEG or WebP image, or too large (`invalid_request`).",
            body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn upload(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(say("say.error_upload_empty")));
    }
    let u = state.engine().upload(body.to_vec()).await?;
    Ok(json_response(StatusCode::CREATED, &upload_json(&u)))
}

/// One shot of `POST /v1/sets`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ShotBody {
    #[schema(schema_with = shot_role)]
    pub role: String,
    /// What the image should show (required, except for a `main_white` shot, which is cut
    /// out of its `source` and sends no prompt).
    #[serde(default)]
    pub prompt: String,
    /// A `main_white` shot's photo of the real product: `{"upload": ID}` or `{"artifact": ID}`.
    /// Each candidate is a `cutout` of it (on the set's provider when it offers `cutout`, else
    /// on one that does), composed on pure white when delivered.
    pub source: Option<crate::domain::draft::ShotSource>,
    /// Words tally draws on the shot's image when it is delivered (templates:
    /// `GET /v1/overlays`); never on a `main_white` shot.
    pub overlay: Option<crate::domain::overlay::Overlay>,
    /// Provider parameters for this shot.
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
    /// How many candidate images to make for this shot, 1 to 4 (default 1); each is its own
    /// task, generated (and, by a billing provider, charged) separately.
    #[schema(minimum = 1, maximum = 4)]
    #[serde(default, deserialize_with = "super::whole_number")]
    pub candidates: Option<i64>,
}

/// The schema of a shot's role: one of [`SHOT_ROLES`].
pub(crate) fn shot_role() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(SHOT_ROLES.iter().copied()))
        .build()
}

/// `POST /v1/sets` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct SetBody {
    /// The product's name (not blank).
    #[schema(min_length = 1)]
    pub product: String,
    /// Upload ids (`POST /v1/uploads`), at most 8.
    #[serde(default)]
    #[schema(max_items = 8)]
    pub references: Vec<String>,
    pub style: Option<String>,
    /// A configured provider's name; the default one when absent.
    pub provider: Option<String>,
    /// One task per candidate of each shot; the shots run one after another, the candidates
    /// of a shot together (within the provider's slots); at most 50.
    #[schema(min_items = 1, max_items = 50)]
    pub shots: Vec<ShotBody>,
    /// Makes resending this request safe (1 to 256 bytes; or the `Idempotency-Key` header).
    #[schema(min_length = 1)]
    pub idempotency_key: Option<String>,
}

/// `POST /v1/sets`: 201 when new, 200 for a replay of the same key and body, 409 for the
/// same key with a different body.
#[utoipa::path(
    post,
    path = "/sets",
    operation_id = "create_set",
    tag = "sets",
    params(IdempotencyKey),
    request_body = SetBody,
    responses(
        (status = 201, description = "A new set; its first shot is queued.", body = SetJson),
        (status = 200, description = "The set this idempotency key made, for the same request.", body = SetJson),
        (status = 409, description = "The idempotency key was used for a different set \
            (`idempotency_conflict`).", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<SetBody>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers, body.idempotency_key)?;
    let mut counts = Vec::with_capacity(body.shots.len());
    for (i, s) in body.shots.iter().enumerate() {
        match s.candidates {
            None => counts.push(1),
            Some(n) if (1..=i64::from(MAX_CANDIDATES)).contains(&n) => counts.push(n as u32),
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "shot {}: candidates must be 1 to {MAX_CANDIDATES}, not {n}",
                    i + 1
                )));
            }
        }
    }
    let set = NewSet {
        product: body.product,
        style: body.style,
        provider: body.provider.unwrap_or_else(|| state.default_provider().to_string()),
        references: body.references,
        shots: body
            .shots
            .into_iter()
            .zip(counts)
            .enumerate()
            .map(|(i, (s, candidates))| {
                let source = match &s.source {
                    None => None,
                    Some(src) => Some(src.to_source().map_err(|e| ApiError::invalid(format!("shot {}: {e}", i + 1)))?),
                };
                Ok(NewShot {
                    role: s.role,
                    prompt: s.prompt,
                    params: s.params.unwrap_or_else(|| json!({})),
                    candidates,
                    source,
                    provider: None,
                    overlay: s.overlay,
                })
            })
            .collect::<Result<_, ApiError>>()?,
        idempotency_key: key,
    };
    let (status, id) = match state.engine().create_set(set).await? {
        SubmitOutcome::Created(id) => (StatusCode::CREATED, id),
        SubmitOutcome::Existing(id) => (StatusCode::OK, id),
        SubmitOutcome::Conflict(id) => {
            return Err(ApiError::conflict(
                "idempotency_conflict",
                crate::domain::words::say_with("say.error_idem_set", &[("id", &id)]),
            ));
        }
    };
    let s = load(&state, &id).await?;
    Ok(json_response(status, &set_json(&state, &s)))
}

pub(super) async fn load(state: &AppState, id: &str) -> Result<SetView, ApiError> {
    state.engine().store().get_set(id.to_string()).await?.ok_or_else(|| ApiError::not_found("set"))
}

/// The `{id}` of a set in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SetId {
    /// A set's id (from `POST /v1/sets` or `GET /v1/sets`).
    #[allow(dead_code)]
    id: String,
}

/// `GET /v1/sets/{id}` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SetQuery {
    /// A delivery profile's name: `delivery.blocking` then also says which chosen images will
    /// not meet it by their pixel size (and `original` by its byte limit). Without it, only
    /// shots with no chosen image are reported (no profile is the default).
    #[param(schema_with = super::openapi::profile_names)]
    pub profile: Option<String>,
}

/// `GET /v1/sets/{id}?profile=`.
#[utoipa::path(
    get,
    path = "/sets/{id}",
    operation_id = "get_set",
    tag = "sets",
    params(SetId, SetQuery),
    responses(
        (status = 200, description = "The set and its shots.", body = SetJson),
        (status = 400, description = "A bad query string (`bad_request`).", body = ErrorBody),
        NotFound,
        (status = 422, description = "No delivery profile of that name (`invalid_request`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn get_one(
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<SetQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let s = load(&state, &id).await?;
    let mut json = set_json(&state, &s);
    let profile = q.profile.filter(|p| !p.trim().is_empty());
    if let Some(profile) = &profile {
        json.delivery = super::deliveries::readiness(&state, &s, profile).await?;
    }
    // With a profile, every shot whose file only a render can judge (a white main image, words
    // drawn, or a profile with rules measured on the file) is made as a delivery makes it, and
    // what it breaks joins `blocking` (in the answer's language).
    if let Some(p) = &profile {
        let rules = state
            .delivery_profiles()
            .into_iter()
            .find(|x| &x.name == p)
            .is_some_and(|x| x.background_rule.is_some() || x.fill.is_some());
        for (i, shot) in json.shots.iter().enumerate() {
            let listing = shot.role.as_deref() == Some("main_white") || shot.overlay.is_some();
            if shot.chosen.is_none() || !(rules || listing) {
                continue;
            }
            if let Some(super::listing::Judged::Refused(why)) = super::listing::judge(&state, &s, i as i64, p).await? {
                for w in super::deliveries::shown_reasons(why) {
                    if !json.delivery.blocking.contains(&w) {
                        json.delivery.blocking.push(w);
                    }
                }
            }
        }
        json.delivery.ready = json.delivery.blocking.is_empty();
    }
    // An overlaid shot's rendering, made as a delivery makes it (with `?profile=` when given).
    for shot in &mut json.shots {
        let (Some(r), Some(a)) = (&mut shot.rendering, &shot.chosen) else { continue };
        if let Some(p) = &profile {
            *r = super::listing::rendering_json(&s.id, shot.position, a, shot.overlay.as_ref(), p);
        }
        if let Some(super::listing::Judged::Sha256(sha)) =
            super::listing::judge(&state, &s, shot.position, &r.profile).await?
        {
            r.sha256 = Some(sha);
        }
    }
    Ok(json_response(StatusCode::OK, &json))
}

/// `GET /v1/sets` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// A set id (a page's `next`): list sets created before it.
    pub before: Option<String>,
    /// The page size: 1 to 500 (larger values give 500); 20 when absent.
    #[param(minimum = 1, value_type = Option<u64>)]
    #[serde(default, deserialize_with = "crate::api::any_count")]
    pub limit: Option<usize>,
}

/// One page of `GET /v1/sets`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SetList {
    /// Newest first.
    pub sets: Vec<SetJson>,
    /// The `before` of the next page; null on the last page.
    pub next: Option<String>,
}

/// `GET /v1/sets?before=&limit=`: newest first, with a `next` cursor.
#[utoipa::path(
    get,
    path = "/sets",
    operation_id = "list_sets",
    tag = "sets",
    params(ListQuery),
    responses(
        (status = 200, description = "One page of sets, newest first.", body = SetList),
        (status = 400, description = "A bad query string: a limit of 0 or not a number (`bad_request`).",
            body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let limit = page_limit(q.limit, DEFAULT_LIMIT.min(20))?;
    let mut rows = state.engine().store().list_sets(q.before.filter(|b| !b.is_empty()), limit + 1).await?;
    let next = next_cursor(&mut rows, limit, |s| &s.id);
    let sets: Vec<SetJson> = rows.iter().map(|s| set_json(&state, s)).collect();
    Ok(json_response(StatusCode::OK, &SetList { sets, next }))
}

/// `POST /v1/sets/{id}/cancel`: cancels shots not yet sent; a running shot finishes honestly.
#[utoipa::path(
    post,
    path = "/sets/{id}/cancel",
    operation_id = "cancel_set",
    tag = "sets",
    params(SetId),
    responses(
        (status = 200, description = "The set, its unsent shots canceled.", body = SetJson),
        NotFound,
        StoreFailure,
    )
)]
pub async fn cancel(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    state.engine().cancel_set(&id).await?.ok_or_else(|| ApiError::not_found("set"))?;
    let s = load(&state, &id).await?;
    Ok(json_response(StatusCode::OK, &set_json(&state, &s)))
}
