//! Candidates and the owner's choice per shot: `POST /v1/sets/{id}/shots/{index}/candidates`
//! adds candidate images to one shot (with the same cost acknowledgement as a retry when the
//! provider bills), `PUT`/`DELETE /v1/sets/{id}/shots/{index}/choice` chooses or clears the
//! shot's image. `{index}` is the shot's position in the set's `shots` array, from 0.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::openapi::{JsonRejected, StoreFailure};
use super::sets::{SetJson, load, set_json};
use super::source::ImageRef;
use super::{AppState, JsonBody, OptionalJsonBody, json_response};
use crate::domain::operation::{Operation, SourceKind};
use crate::domain::words::say;
use crate::domain::{from_micros, money};
use crate::store::{AddOutcome, CandidateOp, ChoiceOutcome, MAX_CANDIDATES, MAX_SHOT_CANDIDATES};

/// The `{id}` and `{index}` of a shot in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ShotPath {
    /// A set's id.
    #[allow(dead_code)]
    id: String,
    /// The shot's position in the set's `shots` array, from 0.
    #[allow(dead_code)]
    #[param(minimum = 0)]
    index: i64,
}

/// The shot position from the path: a whole number from 0.
pub(super) fn index_of(raw: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .ok()
        .filter(|i| *i >= 0)
        .ok_or_else(|| ApiError::bad_request(format!("the shot index must be a whole number from 0, not `{raw}`")))
}

/// `POST /v1/sets/{id}/shots/{index}/candidates` body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoreBody {
    /// How many candidates to add, 1 to 4 (default 1).
    #[schema(minimum = 1, maximum = 4)]
    #[serde(default, deserialize_with = "super::whole_number")]
    pub count: Option<i64>,
    /// Required (true) when the provider bills: each new candidate is a new request that is
    /// charged (the 409 says about how much). Not asked for in a copy to edit (`draft`): its
    /// start asks for the price of every image.
    #[serde(default)]
    pub acknowledge_possible_charge: bool,
    /// Make the new candidate from another candidate of this shot instead of the shot's
    /// request: `edit` (with `prompt`, the instruction) or `cutout`, of `image` (an image of
    /// this shot: `{"artifact": ID}`). Choosing works the same on it.
    pub operation: Option<Operation>,
    /// The image the operation works on: an image of one of this shot's candidates.
    pub image: Option<ImageRef>,
    /// The instruction of an edit.
    pub prompt: Option<String>,
    /// The provider that does the operation (default: the set's).
    pub provider: Option<String>,
}

/// `POST /v1/sets/{id}/shots/{index}/candidates`: 201 with the set, its new candidates queued
/// (at once beside the shot's other candidates while that shot runs; else after the set's
/// current shot: a set's shots go one after another).
#[utoipa::path(
    post,
    path = "/sets/{id}/shots/{index}/candidates",
    operation_id = "add_candidates",
    tag = "sets",
    params(ShotPath),
    request_body(content = Option<MoreBody>, description = "`{\"count\": k}`; no body means one."),
    responses(
        (status = 201, description = "The set with the new candidates.", body = SetJson),
        (status = 400, description = "A count outside 1 to 4, or a bad index (`bad_request`).", body = ErrorBody),
        (status = 404, description = "No such set, or no such shot in it (`not_found`).", body = ErrorBody),
        (status = 409, description = "The provider bills and the body does not acknowledge it \
            (`cost_acknowledgement_required`, with `estimated_cost`); the set was canceled (`set_canceled`); \
            or the shot would hold more than 16 candidates (`too_many_candidates`).", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn add(
    State(state): State<AppState>,
    Path((id, index)): Path<(String, String)>,
    OptionalJsonBody(body): OptionalJsonBody<MoreBody>,
) -> Result<Response, ApiError> {
    let index = index_of(&index)?;
    let count = match body.count {
        None => 1,
        Some(n) if (1..=i64::from(MAX_CANDIDATES)).contains(&n) => n as u32,
        Some(n) => return Err(ApiError::bad_request(format!("count must be 1 to {MAX_CANDIDATES}, not {n}"))),
    };
    let set = load(&state, &id).await?;
    let Some(shot) = set.shots.get(index as usize) else { return Err(ApiError::not_found("shot")) };
    let engine = state.engine();
    let op = match (body.operation, body.image) {
        (None | Some(Operation::Generate), None) => {
            // A generated candidate is the set's provider's: a different one named would be
            // ignored, so it is refused rather than taken silently.
            if let Some(p) = body.provider.as_deref().filter(|p| *p != set.provider) {
                return Err(ApiError::invalid(format!(
                    "a new candidate of a shot is generated by the set's provider (`{}`), not `{p}`; `provider` is \
                     for an `edit` or `cutout` candidate",
                    set.provider
                )));
            }
            None
        }
        (Some(Operation::Generate), Some(_)) | (None, Some(_)) => {
            return Err(ApiError::invalid("`image` is for an `edit` or `cutout` candidate; send `operation` with it"));
        }
        (Some(operation), image) => {
            let image = image.ok_or_else(|| {
                ApiError::invalid(format!(
                    "`{}` needs the image of one of this shot's candidates: \"image\": {{\"artifact\": ID}}",
                    operation.as_str()
                ))
            })?;
            let src = super::source::resolve_image(&state, image).await?;
            if src.kind != SourceKind::Artifact {
                return Err(ApiError::invalid("a candidate is made from the image of another candidate of this shot"));
            }
            Some(CandidateOp {
                operation,
                artifact: src.id,
                prompt: body.prompt.clone().unwrap_or_default(),
                provider: body.provider.clone().unwrap_or_else(|| set.provider.clone()),
            })
        }
    };
    let provider = op.as_ref().map_or(set.provider.as_str(), |o| o.provider.as_str()).to_string();
    // A copy to edit sends nothing until its start, which asks for the whole copy's price.
    if set.started && engine.provider_bills(&provider) && !body.acknowledge_possible_charge {
        let price = engine.price_of(&provider, &shot.params);
        let about = match &price {
            Some((m, c)) => format!(" (about {} in all)", money(*m * i64::from(count), c)),
            None => String::new(),
        };
        let mut e = ApiError::conflict(
            "cost_acknowledgement_required",
            format!(
                "provider `{}` charges for each image: {count} more candidate(s) are {count} new request(s) that \
                 will be charged{about}; send {{\"acknowledge_possible_charge\": true}} to go ahead.",
                provider
            ),
        );
        e.estimated_cost = Some(json!({
            "amount": price.as_ref().map(|(m, _)| from_micros(*m * i64::from(count))),
            "currency": price.map(|(_, c)| c),
            "images": count,
        }));
        return Err(e);
    }
    match engine.add_candidates(&id, index, count, op).await? {
        AddOutcome::Added(_) => {}
        AddOutcome::NoSet => return Err(ApiError::not_found("set")),
        AddOutcome::NoShot => return Err(ApiError::not_found("shot")),
        AddOutcome::Canceled => {
            return Err(ApiError::conflict("set_canceled", say("say.error_set_canceled")));
        }
        AddOutcome::NotOfShot => {
            return Err(ApiError::invalid(
                "that image is not an image of this shot's candidates; a candidate is made from one of its own shot",
            ));
        }
        AddOutcome::TooMany { has } => {
            return Err(ApiError::conflict(
                "too_many_candidates",
                crate::domain::words::say_with(
                    "say.error_shot_full",
                    &[("has", &has.to_string()), ("max", &MAX_SHOT_CANDIDATES.to_string())],
                ),
            ));
        }
    }
    let s = load(&state, &id).await?;
    Ok(json_response(StatusCode::CREATED, &set_json(&state, &s)))
}

/// `PUT /v1/sets/{id}/shots/{index}/choice` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChoiceBody {
    /// The artifact id of a succeeded candidate of this shot.
    #[schema(min_length = 1)]
    pub artifact_id: String,
}

/// `PUT /v1/sets/{id}/shots/{index}/choice`: choose one candidate's image for the shot.
#[utoipa::path(
    put,
    path = "/sets/{id}/shots/{index}/choice",
    operation_id = "choose_image",
    tag = "sets",
    params(ShotPath),
    request_body = ChoiceBody,
    responses(
        (status = 200, description = "The set, the image chosen (recorded in its timeline).", body = SetJson),
        (status = 400, description = "A bad index (`bad_request`).", body = ErrorBody),
        (status = 404, description = "No such set, shot or artifact (`not_found`).", body = ErrorBody),
        (status = 409, description = "The image is not a candidate of this shot (`not_a_candidate`), or its \
            candidate did not succeed (`candidate_not_succeeded`).", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn choose(
    State(state): State<AppState>,
    Path((id, index)): Path<(String, String)>,
    JsonBody(body): JsonBody<ChoiceBody>,
) -> Result<Response, ApiError> {
    let index = index_of(&index)?;
    let out = state.engine().choose(&id, index, Some(body.artifact_id.clone())).await?;
    answer(&state, &id, index, &body.artifact_id, out).await
}

/// `DELETE /v1/sets/{id}/shots/{index}/choice`: clear the shot's choice (no image chosen).
#[utoipa::path(
    delete,
    path = "/sets/{id}/shots/{index}/choice",
    operation_id = "clear_choice",
    tag = "sets",
    params(ShotPath),
    responses(
        (status = 200, description = "The set, the shot's choice cleared (recorded in its timeline when there \
            was one).", body = SetJson),
        (status = 400, description = "A bad index (`bad_request`).", body = ErrorBody),
        (status = 404, description = "No such set or shot (`not_found`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn clear(
    State(state): State<AppState>,
    Path((id, index)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let index = index_of(&index)?;
    let out = state.engine().choose(&id, index, None).await?;
    answer(&state, &id, index, "", out).await
}

async fn answer(
    state: &AppState,
    id: &str,
    index: i64,
    artifact: &str,
    out: ChoiceOutcome,
) -> Result<Response, ApiError> {
    match out {
        ChoiceOutcome::Chosen { .. } | ChoiceOutcome::Cleared { .. } => {}
        ChoiceOutcome::NoSet => return Err(ApiError::not_found("set")),
        ChoiceOutcome::NoShot => return Err(ApiError::not_found("shot")),
        ChoiceOutcome::NoArtifact => return Err(ApiError::not_found("artifact")),
        ChoiceOutcome::OtherShot => {
            return Err(ApiError::conflict(
                "not_a_candidate",
                crate::domain::words::say_with(
                    "say.error_not_candidate",
                    &[("artifact", artifact), ("index", &index.to_string())],
                ),
            ));
        }
        ChoiceOutcome::NotSucceeded(s) => {
            return Err(ApiError::conflict(
                "candidate_not_succeeded",
                crate::domain::words::say_with(
                    "say.error_candidate_not_ready",
                    &[
                        ("artifact", artifact),
                        ("status", &crate::domain::words::say(&format!("say.status_{}", s.as_str()))),
                    ],
                ),
            ));
        }
    }
    let s = load(state, id).await?;
    Ok(json_response(StatusCode::OK, &set_json(state, &s)))
}
