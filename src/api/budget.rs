//! `GET /v1/budget` (the limits in force, where they come from, and today's and this month's
//! spend), `PUT /v1/budget` (set, raise or remove limits: stored in the database, so they
//! survive a restart and replace the config's `[budget]`) and `DELETE /v1/budget` (back to the
//! config's). See `engine::budget`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Deserializer};
use utoipa::ToSchema;

use super::openapi::{JsonRejected, StoreFailure};
use super::{AppState, JsonBody, json_response};
use crate::api::error::ApiError;
use crate::engine::budget::{BudgetChange, BudgetView, Change};

/// A field that may be absent (leave it), `null` (remove it) or an amount.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Change, D::Error> {
    Option::<f64>::deserialize(d).map(Some)
}

/// One provider's limits in `PUT /v1/budget`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderLimitsBody {
    /// The provider's daily limit; `null` removes it; absent leaves it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<f64>, minimum = 0, exclusive_maximum = 1e12)]
    pub daily: Change,
    /// The provider's monthly limit; `null` removes it; absent leaves it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<f64>, minimum = 0, exclusive_maximum = 1e12)]
    pub monthly: Change,
}

/// `PUT /v1/budget` body: only the limits named change.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetBody {
    /// The whole daemon's daily limit (days of `[ui] time_zone`); `null` removes it; absent leaves it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<f64>, minimum = 0, exclusive_maximum = 1e12)]
    pub daily: Change,
    /// The whole daemon's monthly limit (months of `[ui] time_zone`); `null` removes it; absent leaves it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<f64>, minimum = 0, exclusive_maximum = 1e12)]
    pub monthly: Change,
    /// Limits of single providers, by name.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderLimitsBody>,
}

/// `GET /v1/budget`: the limits in force and what they have used.
#[utoipa::path(
    get,
    path = "/budget",
    operation_id = "get_budget",
    tag = "spend",
    responses(
        (status = 200, description = "The budget in force, where it comes from, and the spend it counts.",
            body = BudgetView),
        StoreFailure,
    )
)]
pub async fn get_budget(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &state.engine().budget().await?))
}

/// `PUT /v1/budget`: set, raise or remove limits. Applies at once (tasks held by a budget
/// check it again) and is stored, replacing the config's budget until `DELETE /v1/budget`.
/// A provider's limit is in its currency; the whole daemon's in the currency of the one in
/// force (`[budget] currency`), and when the priced providers use several currencies and none
/// is in force, setting one is refused (422): tally never converts currencies.
#[utoipa::path(
    put,
    path = "/budget",
    operation_id = "set_budget",
    tag = "spend",
    request_body = BudgetBody,
    responses(
        (status = 200, description = "The budget now in force.", body = BudgetView),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn set_budget(
    State(state): State<AppState>,
    JsonBody(raw): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    // Objects only: serde would also read a struct from an array (`[0.4, null]`).
    let objects = raw.as_object().is_some_and(|o| {
        o.get("providers").is_none_or(|p| p.as_object().is_some_and(|m| m.values().all(serde_json::Value::is_object)))
    });
    if !objects {
        return Err(ApiError::invalid(crate::domain::words::say("say.budget_body")));
    }
    let body: BudgetBody = serde_json::from_value(raw).map_err(|e| ApiError::invalid(format!("{e}")))?;
    let change = BudgetChange {
        daily: body.daily,
        monthly: body.monthly,
        providers: body.providers.into_iter().map(|(k, v)| (k, (v.daily, v.monthly))).collect(),
    };
    state.engine().change_budget(change).await?;
    Ok(json_response(StatusCode::OK, &state.engine().budget().await?))
}

/// `DELETE /v1/budget`: forget the budget set at run time; the config's applies again.
#[utoipa::path(
    delete,
    path = "/budget",
    operation_id = "reset_budget",
    tag = "spend",
    responses(
        (status = 200, description = "The configuration's budget, now in force again.", body = BudgetView),
        StoreFailure,
    )
)]
pub async fn reset_budget(State(state): State<AppState>) -> Result<Response, ApiError> {
    state.engine().reset_budget().await?;
    Ok(json_response(StatusCode::OK, &state.engine().budget().await?))
}
