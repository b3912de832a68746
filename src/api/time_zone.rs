//! `GET /v1/time-zone` (the shop's zone in force and where it comes from), `PUT /v1/time-zone`
//! (set it from the page: stored in the database, replacing `[ui] time_zone`) and
//! `DELETE /v1/time-zone` (back to the configuration's). See `engine::zone`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use utoipa::ToSchema;

use super::openapi::{JsonRejected, StoreFailure};
use super::{AppState, JsonBody, json_response};
use crate::api::error::ApiError;
use crate::engine::zone::ZoneView;

/// `PUT /v1/time-zone` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeZoneBody {
    /// An IANA zone name, such as "Asia/Shanghai", "Europe/Berlin" or "UTC".
    #[schema(min_length = 1, max_length = 64)]
    pub time_zone: String,
}

/// `GET /v1/time-zone`: the zone in force.
#[utoipa::path(
    get,
    path = "/time-zone",
    operation_id = "get_time_zone",
    tag = "spend",
    responses((status = 200, description = "The shop's zone in force and where it comes from.", body = ZoneView))
)]
pub async fn get_time_zone(State(state): State<AppState>) -> Response {
    json_response(StatusCode::OK, &state.engine().zone_view())
}

/// `PUT /v1/time-zone`: set the shop's zone. Budget days and months begin at its local
/// midnight from now on (tasks held by a budget check it again at once), the spend report
/// groups by its dates, and the page shows its times. An unknown name is refused (422) and
/// nothing changes.
#[utoipa::path(
    put,
    path = "/time-zone",
    operation_id = "set_time_zone",
    tag = "spend",
    request_body = TimeZoneBody,
    responses(
        (status = 200, description = "The zone now in force.", body = ZoneView),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn set_time_zone(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<TimeZoneBody>,
) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &state.engine().set_time_zone(Some(&body.time_zone)).await?))
}

/// `DELETE /v1/time-zone`: forget the zone set at run time; `[ui] time_zone` (or the
/// computer's zone) applies again.
#[utoipa::path(
    delete,
    path = "/time-zone",
    operation_id = "reset_time_zone",
    tag = "spend",
    responses(
        (status = 200, description = "The configuration's zone, now in force again.", body = ZoneView),
        StoreFailure,
    )
)]
pub async fn reset_time_zone(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &state.engine().set_time_zone(None).await?))
}
