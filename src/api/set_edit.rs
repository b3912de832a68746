//! Editing, duplicating and deleting a set: `PATCH /v1/sets/{id}` changes shots (prompt,
//! role), the product, style and reference photos before anything was sent for them;
//! `POST /v1/sets/{id}/duplicate` makes a copy to edit of the same shots, which sends nothing
//! until `POST /v1/sets/{id}/start` (with the same cost acknowledgement as more candidates when
//! the provider bills); `DELETE /v1/sets/{id}` deletes a set whose every shot failed or was
//! canceled, or a copy never started. A refusal is a 409 whose message
//! says what blocks it and what to do (`store::set_edit` states the rules).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::openapi::{JsonRejected, StoreFailure};
use super::sets::{SetId, SetJson, load, set_json};
use super::tasks::{IdempotencyKey, idempotency_key};
use super::{AppState, JsonBody, OptionalJsonBody, json_response};
use crate::domain::words::say;
use crate::domain::{from_micros, money};
use crate::store::{DeleteOutcome, EditOutcome, NewSet, SetBlock, SetEdit, ShotEdit, StartOutcome, SubmitOutcome};

/// `PATCH /v1/sets/{id}` body: only the fields sent change.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetEditBody {
    /// The product's new name (every shot's request names it).
    #[schema(min_length = 1)]
    pub product: Option<String>,
    /// New style notes; an empty string removes them.
    pub style: Option<String>,
    /// The set's reference photos, in order (upload ids from `POST /v1/uploads`); an empty list
    /// removes them. At most 8.
    #[schema(max_items = 8)]
    pub references: Option<Vec<String>>,
    /// Changes to single shots, applied in order: a shot named twice takes both entries (the
    /// last value given for a field wins).
    #[serde(default)]
    pub shots: Vec<ShotEditBody>,
}

/// A change to one shot (all of its candidates).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShotEditBody {
    /// The shot's position in the set's `shots` array, from 0.
    #[schema(minimum = 0)]
    #[serde(deserialize_with = "super::whole")]
    pub position: i64,
    /// The shot's own words (the product and style are added as at creation).
    #[schema(min_length = 1)]
    pub prompt: Option<String>,
    /// `main`, `selling_point`, `scene`, `detail` or `size`.
    #[schema(schema_with = super::sets::shot_role)]
    pub role: Option<String>,
    /// The words tally draws on the shot's image (`GET /v1/overlays`); `null` removes them.
    /// They are drawn when a file is made and never sent to a provider, so they can change
    /// whatever was sent; a delivery already asked for keeps its words.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<crate::domain::overlay::Overlay>, nullable)]
    pub overlay: Option<Option<crate::domain::overlay::Overlay>>,
}

/// A field that is present: `null` is `Some(None)` (remove), absent is `None` (unchanged).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A 409 from a refusal of the store.
fn blocked(b: SetBlock) -> ApiError {
    ApiError::conflict(b.code, b.message)
}

/// `PATCH /v1/sets/{id}`: change what was not sent yet.
#[utoipa::path(
    patch,
    path = "/sets/{id}",
    operation_id = "edit_set",
    tag = "sets",
    params(SetId),
    request_body = SetEditBody,
    responses(
        (status = 200, description = "The set as it is now (unchanged when it already was so).", body = SetJson),
        (status = 400, description = "A shot position below 0 (`bad_request`).", body = ErrorBody),
        (status = 404, description = "No such set, or no shot at a position (`not_found`).", body = ErrorBody),
        (status = 409, description = "Something the edit touches was already sent or is being generated \
            (`shot_already_sent`: the product and style are in every shot's request, so they change only while \
            nothing of the set was sent; the reference photos change while no request of the set left and no \
            shot is being generated), or the set was canceled (`set_canceled`). The message says what to do \
            instead (duplicate the set).", body = ErrorBody),
        (status = 422, description = "An empty product or prompt, an unknown role, too many reference photos, \
            or an upload id that does not exist (`invalid_request`).", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn edit(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<SetEditBody>,
) -> Result<Response, ApiError> {
    let mut shots = Vec::with_capacity(body.shots.len());
    let mut words = Vec::new();
    for s in body.shots {
        if s.position < 0 {
            return Err(ApiError::bad_request(format!("a shot position is a whole number from 0, not {}", s.position)));
        }
        if let Some(o) = s.overlay {
            words.push((s.position, o));
        }
        if s.prompt.is_some() || s.role.is_some() {
            shots.push(ShotEdit { position: s.position, prompt: s.prompt, role: s.role });
        }
    }
    let edit = SetEdit {
        product: body.product,
        style: body.style.map(|s| Some(s).filter(|s| !s.trim().is_empty())),
        references: body.references,
        shots,
    };
    let only_words = edit.shots.is_empty() && !edit.whole_set() && !words.is_empty();
    let outcome = if only_words { EditOutcome::Edited(Vec::new()) } else { state.engine().edit_set(&id, edit).await? };
    if matches!(outcome, EditOutcome::Edited(_)) {
        for (position, overlay) in words {
            if !state.engine().set_shot_overlay(&id, position, overlay).await? {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    crate::domain::words::say_with("say.error_no_shot", &[("p", &position.to_string())]),
                ));
            }
        }
    }
    match outcome {
        EditOutcome::Edited(_) => {}
        EditOutcome::NoSet => return Err(ApiError::not_found("set")),
        EditOutcome::NoShot(p) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                crate::domain::words::say_with("say.error_no_shot", &[("p", &p.to_string())]),
            ));
        }
        EditOutcome::NoUpload(u) => {
            return Err(ApiError::invalid(crate::domain::words::say_with("say.error_no_reference", &[("id", &u)])));
        }
        EditOutcome::Blocked(b) => return Err(blocked(b)),
    }
    let s = load(&state, &id).await?;
    Ok(json_response(StatusCode::OK, &set_json(&state, &s)))
}

/// `POST /v1/sets/{id}/duplicate` body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DuplicateBody {
    /// Start the copy at once (as `POST /v1/sets/{id}/start` would) instead of leaving it a
    /// copy to edit. Default false.
    #[serde(default)]
    pub start: bool,
    /// With `start`, required (true) when the set's provider bills: every image of the copy is
    /// a new generation that is charged (the 409 says about how much). Without `start` it is
    /// accepted and changes nothing: a copy to edit sends nothing.
    #[serde(default)]
    pub acknowledge_possible_charge: bool,
    /// Makes resending this request safe (1 to 256 bytes; or the `Idempotency-Key` header).
    #[schema(min_length = 1)]
    pub idempotency_key: Option<String>,
}

/// The 409 `cost_acknowledgement_required` (with `estimated_cost`) for sending every image of
/// `set` — a copy's start, a duplicate started at once — when its provider bills and `ack` is
/// false; `Ok` otherwise.
fn ask_for_charge(state: &AppState, set: &NewSet, ack: bool) -> Result<(), ApiError> {
    let engine = state.engine();
    if ack || !engine.provider_bills(&set.provider) {
        return Ok(());
    }
    let images: u32 = set.shots.iter().map(|s| s.candidates.max(1)).sum();
    let mut total: Option<(i64, String)> = Some((0, String::new()));
    for s in &set.shots {
        total = match (total, engine.price_of(&set.provider, &s.params)) {
            (Some((sum, _)), Some((m, c))) => Some((sum + m * i64::from(s.candidates.max(1)), c)),
            _ => None,
        };
    }
    let total = total.filter(|(_, c)| !c.is_empty());
    let about = match &total {
        Some((m, c)) => format!(" (about {} in all)", money(*m, c)),
        None => String::new(),
    };
    let mut e = ApiError::conflict(
        "cost_acknowledgement_required",
        format!(
            "provider `{}` charges for each image: starting this set sends {images} new generation(s) that will be \
             charged{about}; send {{\"acknowledge_possible_charge\": true}} to go ahead.",
            set.provider
        ),
    );
    e.estimated_cost = Some(json!({
        "amount": total.as_ref().map(|(m, _)| from_micros(*m)),
        "currency": total.map(|(_, c)| c),
        "images": images,
    }));
    Err(e)
}

/// `POST /v1/sets/{id}/duplicate`: a new set with the same product, style, provider,
/// reference photos and shots (each with as many candidates as it has now) — a copy to edit
/// (`status` `draft`) that sends nothing until `POST /v1/sets/{id}/start`, or started at once
/// with `"start": true`.
#[utoipa::path(
    post,
    path = "/sets/{id}/duplicate",
    operation_id = "duplicate_set",
    tag = "sets",
    params(SetId, IdempotencyKey),
    request_body(content = Option<DuplicateBody>, description = "No body: a copy to edit, no key."),
    responses(
        (status = 201, description = "The new set: a copy to edit (`draft`, nothing sent), or with `start` its \
            first image queued.", body = SetJson),
        (status = 200, description = "The set this idempotency key made, for the same request.", body = SetJson),
        (status = 404, description = "No such set (`not_found`).", body = ErrorBody),
        (status = 409, description = "With `start`: the provider bills and the body does not acknowledge it \
            (`cost_acknowledgement_required`, with `estimated_cost`); or the idempotency key was used for \
            another set (`idempotency_conflict`).", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn duplicate(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    OptionalJsonBody(body): OptionalJsonBody<DuplicateBody>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers, body.idempotency_key)?;
    let engine = state.engine();
    if body.start {
        let Some(new) = engine.set_as_new(&id).await? else { return Err(ApiError::not_found("set")) };
        ask_for_charge(&state, &new, body.acknowledge_possible_charge)?;
    }
    let (status, copy) = match engine.duplicate_set(&id, key, body.start).await? {
        None => return Err(ApiError::not_found("set")),
        Some(SubmitOutcome::Created(c)) => (StatusCode::CREATED, c),
        Some(SubmitOutcome::Existing(c)) => (StatusCode::OK, c),
        Some(SubmitOutcome::Conflict(c)) => {
            return Err(ApiError::conflict(
                "idempotency_conflict",
                crate::domain::words::say_with("say.error_idem_set", &[("id", &c)]),
            ));
        }
    };
    let s = load(&state, &copy).await?;
    Ok(json_response(status, &set_json(&state, &s)))
}

/// `POST /v1/sets/{id}/start` body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    /// Required (true) when the set's provider bills: every image of the copy is a new
    /// generation that is charged (the 409 says about how much).
    #[serde(default)]
    pub acknowledge_possible_charge: bool,
    /// Accepted for a client that sends one with every request: a start is idempotent by
    /// itself (a set is started once), so the key changes nothing.
    #[schema(min_length = 1)]
    pub idempotency_key: Option<String>,
}

/// `POST /v1/sets/{id}/start`: "Start generating" a copy to edit — its first shot's candidates
/// are queued, as a new set's, and the other shots follow one after another. Starting a set that is already
/// started is not an error and changes nothing: 200 with the set as it is (so a start resent
/// after a lost answer is safe, and never sends anything twice).
#[utoipa::path(
    post,
    path = "/sets/{id}/start",
    operation_id = "start_set",
    tag = "sets",
    params(SetId, IdempotencyKey),
    request_body(content = Option<StartBody>, description = "No body: no acknowledgement."),
    responses(
        (status = 200, description = "The set: started now (its first image queued), or already started before \
            (unchanged).", body = SetJson),
        (status = 404, description = "No such set (`not_found`).", body = ErrorBody),
        (status = 409, description = "The provider bills and the body does not acknowledge it \
            (`cost_acknowledgement_required`, with `estimated_cost`; nothing is sent), the copy was canceled \
            before it was started (`set_canceled`), or it was edited while it was being started \
            (`set_changed`: nothing is sent; look at its price again).", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn start(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    OptionalJsonBody(body): OptionalJsonBody<StartBody>,
) -> Result<Response, ApiError> {
    let engine = state.engine();
    engine.check_start_key(idempotency_key(&headers, body.idempotency_key)?.as_deref())?;
    let set = load(&state, &id).await?;
    if !set.started {
        let Some(new) = engine.set_as_new(&id).await? else { return Err(ApiError::not_found("set")) };
        ask_for_charge(&state, &new, body.acknowledge_possible_charge)?;
        // The start re-checks, in its own transaction, that the copy still sends what was priced.
        match engine.start_set(&id, new).await? {
            StartOutcome::Started | StartOutcome::AlreadyStarted => {}
            StartOutcome::NoSet => return Err(ApiError::not_found("set")),
            StartOutcome::Canceled => return Err(ApiError::conflict("set_canceled", say("say.error_set_canceled"))),
            StartOutcome::Changed => return Err(ApiError::conflict("set_changed", say("say.error_set_changed"))),
        }
    }
    let s = load(&state, &id).await?;
    Ok(json_response(StatusCode::OK, &set_json(&state, &s)))
}

/// What `DELETE /v1/sets/{id}` did.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedJson {
    /// The deleted set's id.
    pub deleted: String,
    /// How many of its tasks were deleted with it (nothing was sent for them).
    pub tasks_deleted: u64,
    /// Its tasks whose request reached the provider: kept as jobs of their own, so Spend
    /// still lists what they may have cost.
    pub tasks_kept: Vec<String>,
    /// Plain words.
    pub message: String,
}

/// `DELETE /v1/sets/{id}`: delete a set whose every shot failed or was canceled.
#[utoipa::path(
    delete,
    path = "/sets/{id}",
    operation_id = "delete_set",
    tag = "sets",
    params(SetId),
    responses(
        (status = 200, description = "The set is deleted.", body = DeletedJson),
        (status = 404, description = "No such set (`not_found`).", body = ErrorBody),
        (status = 409, description = "A shot is not finished (`set_not_finished`: cancel the set first), has an \
            image (`set_has_images`), or its outcome is unknown (`set_has_unknown`: record what happened first); \
            or a delivery names the set (`set_has_deliveries`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let (tasks_deleted, tasks_kept) = match state.engine().delete_set(&id).await? {
        DeleteOutcome::Deleted { deleted, kept } => (deleted, kept),
        DeleteOutcome::NoSet => return Err(ApiError::not_found("set")),
        DeleteOutcome::Blocked(b) => return Err(blocked(b)),
    };
    let message = match tasks_kept.len() {
        0 => "The set is deleted.".to_string(),
        n => format!(
            "The set is deleted. {n} job(s) of it reached the provider and are kept as jobs of their own, so Spend \
             still lists what they may have cost."
        ),
    };
    Ok(json_response(StatusCode::OK, &DeletedJson { deleted: id, tasks_deleted, tasks_kept, message }))
}
