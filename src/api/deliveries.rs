//! Deliveries (issue #26): `POST /v1/sets/{id}/deliveries` makes one (the set's chosen images
//! with a profile to a target; 409 with the `blocking` reasons while it cannot be made),
//! `GET /v1/deliveries/{id}` and `GET /v1/sets/{id}/deliveries` show them with every item,
//! `POST /v1/deliveries/{id}/retry` sends again what was not delivered. `GET
//! /v1/delivery/profiles` and `GET /v1/delivery/targets` list what a delivery may name (the
//! page's "Deliver" control reads them), and a set's `delivery` checked against a profile
//! (`GET /v1/sets/{id}?profile=`) is made here. The engine's delivery
//! runner does the writing (`engine::deliver`); nothing here writes a file.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::openapi::{JsonRejected, StoreFailure};
use super::{AppState, JsonBody, json_response};
use crate::delivery::profile::Fit;
use crate::delivery::target::TargetKind;
use crate::domain::words::{render, say, say_with};
use crate::engine::deliver::DeliverOutcome;
use crate::engine::readiness::Readiness;
use crate::store::{DeliveryView, RetryDeliveryOutcome};

/// A delivery as the answer shows it: each file's `why` in the request's language
/// (`api::lang`; stored in English, translated by the catalogue's `say.*` templates).
fn shown(mut d: DeliveryView) -> DeliveryView {
    let lang = super::lang::request_lang();
    for item in &mut d.items {
        if let Some(why) = &item.why {
            item.why = Some(render(lang, why));
        }
    }
    d
}

/// Reasons a set cannot be delivered, in the request's language (made in English).
pub(super) fn shown_reasons(reasons: Vec<String>) -> Vec<String> {
    let lang = super::lang::request_lang();
    reasons.iter().map(|r| render(lang, r)).collect()
}

/// `POST /v1/sets/{id}/deliveries` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliverBody {
    /// A profile's name: a built-in (`amazon`, `taobao_main`, `pinduoduo_carousel`, … `original`) or one
    /// of `[[delivery.profiles]]`.
    pub profile: String,
    /// A target's name from `[[delivery.targets]]`, or `exports` (a folder in the data
    /// directory, there with no configuration).
    pub target: String,
    /// Deliver although a chosen image does not meet the profile (a shot with no chosen image
    /// is never delivered).
    #[serde(default)]
    pub force: bool,
    /// For a `shopify` target: the product the files are attached to, a
    /// `gid://shopify/Product/…` id or the product's handle (required there, refused elsewhere).
    #[serde(default)]
    pub shopify_product: Option<String>,
    /// A profile per shot role beside `profile` (`{"main_white": "amazon_main"}`): a
    /// marketplace's rules differ between its main image and the others.
    #[serde(default)]
    pub profiles: std::collections::BTreeMap<String, String>,
}

/// A 409 refusal with its reasons.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct BlockedBody {
    pub error: super::error::ErrorDetail,
    /// Why the set cannot be delivered now, in plain words ("2 shots have no chosen image:
    /// Lifestyle scene, Selling point").
    pub blocking: Vec<String>,
}

/// A set's deliveries.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryList {
    /// Oldest first.
    pub deliveries: Vec<DeliveryView>,
}

/// `POST /v1/sets/{id}/deliveries`: 201 with the delivery, queued for the runner.
#[utoipa::path(
    post,
    path = "/sets/{id}/deliveries",
    operation_id = "create_delivery",
    tag = "deliveries",
    params(("id" = String, Path, description = "A set's id.")),
    request_body = DeliverBody,
    responses(
        (status = 201, description = "The delivery, queued: one item per shot.", body = DeliveryView),
        (status = 404, description = "No such set (`not_found`).", body = ErrorBody),
        (status = 409, description = "A shot has no chosen image, or (without `force`) a chosen image does not \
            meet the profile (`not_ready`, with `blocking`).", body = BlockedBody),
        (status = 422, description = "No profile or target of that name (`invalid_request`).", body = ErrorBody),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn create(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<DeliverBody>,
) -> Result<Response, ApiError> {
    let req = crate::engine::deliver::DeliverRequest {
        profile: &body.profile,
        target: &body.target,
        force: body.force,
        shopify_product: body.shopify_product.as_deref(),
        profiles: &body.profiles,
    };
    let out = state.engine().deliver_with(&id, &req).await?;
    match out {
        DeliverOutcome::Created(d) => Ok(json_response(StatusCode::CREATED, &shown(d))),
        DeliverOutcome::NoSet => Err(ApiError::not_found("set")),
        DeliverOutcome::UnknownProfile(names) => Err(ApiError::invalid(say_with(
            "say.no_profile",
            &[("profile", &body.profile), ("names", &names.join(", "))],
        ))),
        DeliverOutcome::UnknownTarget(names) => {
            Err(ApiError::invalid(say_with("say.no_target", &[("target", &body.target), ("names", &names.join(", "))])))
        }
        DeliverOutcome::Blocked(blocking) => {
            let reasons =
                blocking.iter().cloned().reduce(|a, b| say_with("say.join.semicolon", &[("a", &a), ("b", &b)]));
            let message = say_with("say.delivery_not_ready", &[("reasons", &reasons.unwrap_or_default())]);
            let body = BlockedBody {
                error: super::error::ErrorDetail {
                    code: "not_ready".into(),
                    message: render(super::lang::request_lang(), &message),
                    retried_as: None,
                    estimated_cost: None,
                },
                blocking: shown_reasons(blocking),
            };
            Ok(json_response(StatusCode::CONFLICT, &body))
        }
    }
}

/// `GET /v1/sets/{id}/deliveries`: the set's deliveries, oldest first, with their items.
#[utoipa::path(
    get,
    path = "/sets/{id}/deliveries",
    operation_id = "list_set_deliveries",
    tag = "deliveries",
    params(("id" = String, Path, description = "A set's id.")),
    responses(
        (status = 200, description = "The set's deliveries.", body = DeliveryList),
        (status = 404, description = "No such set (`not_found`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn list(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let store = state.engine().store();
    if store.get_set(id.clone()).await?.is_none() {
        return Err(ApiError::not_found("set"));
    }
    let deliveries = store.set_deliveries(id).await?.into_iter().map(shown).collect();
    Ok(json_response(StatusCode::OK, &DeliveryList { deliveries }))
}

/// `GET /v1/deliveries/{id}`: a delivery's state and every item (state, file name, bytes,
/// sha256, pixel size and, when it did not succeed, why).
#[utoipa::path(
    get,
    path = "/deliveries/{id}",
    operation_id = "get_delivery",
    tag = "deliveries",
    params(("id" = String, Path, description = "A delivery's id.")),
    responses(
        (status = 200, description = "The delivery.", body = DeliveryView),
        (status = 404, description = "No such delivery (`not_found`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn get_one(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    match state.engine().store().delivery(id).await? {
        Some(d) => Ok(json_response(StatusCode::OK, &shown(d))),
        None => Err(ApiError::not_found("delivery")),
    }
}

/// `POST /v1/deliveries/{id}/retry`: send again every item that is not `delivered` (each is
/// looked for at the target first when it was written before).
#[utoipa::path(
    post,
    path = "/deliveries/{id}/retry",
    operation_id = "retry_delivery",
    tag = "deliveries",
    params(("id" = String, Path, description = "A delivery's id.")),
    responses(
        (status = 200, description = "The delivery, queued again.", body = DeliveryView),
        (status = 404, description = "No such delivery (`not_found`).", body = ErrorBody),
        (status = 409, description = "It is still queued or being delivered (`delivery_in_progress`), or every \
            item is delivered (`nothing_to_retry`).", body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn retry(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    match state.engine().retry_delivery(&id).await? {
        RetryDeliveryOutcome::Requeued(d, _) => Ok(json_response(StatusCode::OK, &shown(d))),
        RetryDeliveryOutcome::NoDelivery => Err(ApiError::not_found("delivery")),
        RetryDeliveryOutcome::Busy(s) => {
            Err(ApiError::conflict("delivery_in_progress", say(&format!("say.delivery_busy_{}", s.as_str()))))
        }
        RetryDeliveryOutcome::NothingToRetry => {
            Err(ApiError::conflict("nothing_to_retry", say("say.delivery_nothing_to_retry")))
        }
    }
}

/// A set's `delivery` checked against `profile` (`GET /v1/sets/{id}?profile=`): 422 for a
/// profile that does not exist.
pub(super) async fn readiness(
    state: &AppState,
    set: &crate::store::SetView,
    profile: &str,
) -> Result<super::sets::DeliveryJson, ApiError> {
    match state.engine().delivery_readiness(set, profile).await? {
        Readiness::Checked(blocking) => Ok(super::sets::DeliveryJson {
            ready: blocking.is_empty(),
            blocking: shown_reasons(blocking),
            profile: Some(profile.to_string()),
        }),
        Readiness::UnknownProfile(names) => Err(ApiError::invalid(format!(
            "there is no delivery profile `{profile}`; the profiles are: {}",
            names.join(", ")
        ))),
    }
}

/// A delivery profile as `GET /v1/delivery/profiles` lists it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct ProfileJson {
    /// What a delivery names (`"profile": "amazon"`).
    pub name: String,
    /// True for a built-in profile (`amazon`, `taobao_main`, … `original`).
    pub builtin: bool,
    /// The output's pixel size; null for `original` (the image as generated).
    pub width: Option<u32>,
    pub height: Option<u32>,
    /// `pad` or `crop`; null for `original`.
    pub fit: Option<String>,
    /// `#rrggbb`; null for `original`.
    pub background: Option<String>,
    /// `jpeg`, `png` or `webp`; null for `original` (the generated format).
    pub format: Option<String>,
    /// The largest file, in bytes; null: no limit.
    pub max_bytes: Option<u64>,
    /// The smallest source side that meets the profile, in pixels; null: any.
    pub min_source: Option<u32>,
    /// The file-name pattern.
    pub file_name: String,
    /// `pure_white`: every pixel around the product is RGB 255,255,255 in the file made;
    /// null: no rule.
    pub background_rule: Option<String>,
    /// The share of the frame the product's box must cover (0.5–1.0); null: no rule.
    pub fill: Option<f64>,
    /// True: the file made has no alpha channel.
    pub no_alpha: bool,
}

/// `GET /v1/delivery/profiles` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProfileList {
    /// Built-ins first, then `[[delivery.profiles]]` in the config's order.
    pub profiles: Vec<ProfileJson>,
}

/// `GET /v1/delivery/profiles`: every profile a delivery may name.
#[utoipa::path(
    get,
    path = "/delivery/profiles",
    operation_id = "list_delivery_profiles",
    tag = "deliveries",
    responses((status = 200, description = "The delivery profiles.", body = ProfileList))
)]
pub async fn profiles(State(state): State<AppState>) -> Response {
    let builtins: Vec<String> = crate::delivery::profile::builtins().into_iter().map(|p| p.name).collect();
    let profiles = state
        .engine()
        .delivery_profiles()
        .into_iter()
        .map(|p| ProfileJson {
            builtin: builtins.contains(&p.name),
            width: p.render.map(|r| r.width),
            height: p.render.map(|r| r.height),
            fit: p.render.map(|r| match r.fit {
                Fit::Pad => "pad".to_string(),
                Fit::Crop => "crop".to_string(),
            }),
            background: p.render.map(|r| r.background.to_string()),
            format: p.render.map(|r| r.format.as_str().to_string()),
            max_bytes: p.max_bytes,
            min_source: p.min_source,
            file_name: p.file_name,
            background_rule: p.background_rule.map(|r| r.as_str().to_string()),
            fill: p.fill.map(|f| f64::from(f) / 1000.0),
            no_alpha: p.no_alpha,
            name: p.name,
        })
        .collect();
    json_response(StatusCode::OK, &ProfileList { profiles })
}

/// A delivery target as `GET /v1/delivery/targets` lists it: where its files go, never its
/// credentials.
#[derive(Debug, Serialize, ToSchema)]
pub struct TargetJson {
    /// What a delivery names (`"target": "exports"`).
    pub name: String,
    /// `folder` or `s3`.
    pub kind: String,
    /// Where the files go, in words: the folder's absolute path, or `s3://bucket/prefix`
    /// (with the endpoint when not AWS itself).
    pub location: String,
    /// How long one file's write may take, in milliseconds.
    pub timeout_ms: u64,
}

/// `GET /v1/delivery/targets` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct TargetList {
    /// `[[delivery.targets]]` in the config's order, and `exports` (a folder in the data
    /// directory) unless configured.
    pub targets: Vec<TargetJson>,
}

/// `GET /v1/delivery/targets`: every target a delivery may name and where its files go.
#[utoipa::path(
    get,
    path = "/delivery/targets",
    operation_id = "list_delivery_targets",
    tag = "deliveries",
    responses((status = 200, description = "The delivery targets.", body = TargetList))
)]
pub async fn targets(State(state): State<AppState>) -> Response {
    let targets = state
        .engine()
        .delivery_targets()
        .into_iter()
        .map(|t| {
            let (kind, location) = match &t.kind {
                TargetKind::Folder { path } => ("folder", path.display().to_string()),
                TargetKind::S3(s3) => {
                    let at = format!("s3://{}/{}", s3.bucket, s3.prefix);
                    let location = match &s3.endpoint {
                        Some(e) => format!("{at} at {e}"),
                        None => format!("{at} (AWS, {})", s3.region),
                    };
                    ("s3", location)
                }
                TargetKind::Shopify(sh) => ("shopify", format!("{} (API {})", sh.shop, sh.api_version)),
            };
            TargetJson { name: t.name, kind: kind.into(), location, timeout_ms: t.timeout_ms }
        })
        .collect();
    json_response(StatusCode::OK, &TargetList { targets })
}
