//! `POST /v1/prune`: retention through the running daemon (what `tally prune` uses while
//! `tally serve` holds the data directory). Deletes settled work older than `older_than`, with
//! its images, or with `dry_run` only says what would go; see `store::prune` for what is kept.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::openapi::{JsonRejected, StoreFailure};
use super::{AppState, JsonBody, json_response};
use crate::clock::rfc3339;
use crate::store::PruneReport;

/// `POST /v1/prune` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct PruneBody {
    /// An age such as `90d`, `12h` or `0s`: settled work last changed longer ago goes.
    /// The document's pattern is one number and a unit (s, m, h, d, w); the server also takes
    /// what `humantime` reads (`1h 30m`).
    #[schema(example = "90d", pattern = r"^[0-9]{1,5}(s|m|h|d|w)$")]
    pub older_than: String,
    #[serde(default)]
    pub dry_run: bool,
}

/// What a prune did, as the API and `tally prune --json` show it. Each field once: the
/// store's [`PruneReport`] has its own `dry_run` and `cutoff` (in milliseconds), so it is
/// copied field by field rather than flattened into this object.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct PruneJson {
    pub dry_run: bool,
    pub older_than: String,
    /// Settled before this moment (RFC 3339).
    pub cutoff: String,
    /// Tasks deleted, shots of deleted sets included.
    pub tasks: u64,
    pub sets: u64,
    /// Generated images deleted with their tasks.
    pub images: u64,
    /// Reference photos deleted (no kept set uses them).
    pub uploads: u64,
    /// Bytes of images and reference photos deleted.
    pub image_bytes: i64,
    /// Old enough, but `unknown`: kept until someone resolves them.
    pub kept_unknown: u64,
    /// Old enough, but a shot of a set that is still in progress or has an unresolved
    /// `unknown` shot.
    pub kept_in_sets: u64,
    /// Old enough, but a kept task is a retry of it.
    pub kept_retried: u64,
    /// Bytes the database file gave back (0 for a dry run).
    pub freed_bytes: i64,
}

impl PruneJson {
    /// The JSON of `report`, made for an `older_than` of `age`.
    pub fn new(age: &str, r: PruneReport) -> Self {
        PruneJson {
            dry_run: r.dry_run,
            older_than: age.to_string(),
            cutoff: rfc3339(r.cutoff),
            tasks: r.tasks,
            sets: r.sets,
            images: r.images,
            uploads: r.uploads,
            image_bytes: r.image_bytes,
            kept_unknown: r.kept_unknown,
            kept_in_sets: r.kept_in_sets,
            kept_retried: r.kept_retried,
            freed_bytes: r.freed_bytes,
        }
    }
}

/// Parse a prune age: humantime units (`90d`, `12h`, `30m`, `0s`).
pub fn parse_age(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("`{text}` is not an age like 90d, 12h or 0s ({e})"))
}

/// `POST /v1/prune`: 200 with what was (or would be) deleted.
#[utoipa::path(
    post,
    path = "/prune",
    operation_id = "prune",
    tag = "retention",
    request_body = PruneBody,
    responses(
        (status = 200, description = "What was deleted (or, with `dry_run`, would be).", body = PruneJson),
        JsonRejected,
        StoreFailure,
    )
)]
pub async fn prune(State(state): State<AppState>, JsonBody(body): JsonBody<PruneBody>) -> Result<Response, ApiError> {
    let age = parse_age(&body.older_than).map_err(ApiError::invalid)?;
    let report = state.engine().prune(age, body.dry_run).await?;
    Ok(json_response(StatusCode::OK, &PruneJson::new(body.older_than.trim(), report)))
}
