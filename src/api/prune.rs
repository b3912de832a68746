//! `POST /v1/prune`: retention through the running daemon (what `tally prune` uses while
//! `tally serve` holds the data directory). Deletes settled work older than `older_than`, with
//! its images, or with `dry_run` only says what would go; see `store::prune` for what is kept.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::{AppState, JsonBody, json_response};
use crate::clock::rfc3339;
use crate::store::PruneReport;

/// `POST /v1/prune` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneBody {
    /// An age such as `90d`, `12h` or `0s`: settled work last changed longer ago goes.
    pub older_than: String,
    #[serde(default)]
    pub dry_run: bool,
}

/// What a prune did, as the API and `tally prune --json` show it.
#[derive(Debug, Serialize)]
pub struct PruneJson {
    pub dry_run: bool,
    pub older_than: String,
    /// Settled before this moment (RFC 3339).
    pub cutoff: String,
    #[serde(flatten)]
    pub report: PruneReport,
}

impl PruneJson {
    /// The JSON of `report`, made for an `older_than` of `age`.
    pub fn new(age: &str, report: PruneReport) -> Self {
        PruneJson { dry_run: report.dry_run, older_than: age.to_string(), cutoff: rfc3339(report.cutoff), report }
    }
}

/// Parse a prune age: humantime units (`90d`, `12h`, `30m`, `0s`).
pub fn parse_age(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("`{text}` is not an age like 90d, 12h or 0s ({e})"))
}

/// `POST /v1/prune`: 200 with what was (or would be) deleted.
pub async fn prune(State(state): State<AppState>, JsonBody(body): JsonBody<PruneBody>) -> Result<Response, ApiError> {
    let age = parse_age(&body.older_than).map_err(ApiError::invalid)?;
    let report = state.engine().prune(age, body.dry_run).await?;
    Ok(json_response(StatusCode::OK, &PruneJson::new(body.older_than.trim(), report)))
}
