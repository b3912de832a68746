//! A shot's overlay as data: the owner's words and the template tally draws them with
//! (`delivery::overlay` draws them). Here so that a draft's shot, a set's shot and a delivery
//! item can carry one without knowing how it is drawn.
//!
//! Invariant: the words are the owner's (typed, or taken from the copy the owner confirmed);
//! a model's answer never carries an overlay (`domain::draft::parse_answer` refuses one).

use serde::{Deserialize, Serialize};

/// One overlay as a shot carries it: a template's name (`GET /v1/overlays`) and the lines of
/// words, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    /// The template's name (`headline_band`, `side_panel`, `badge`).
    pub template: String,
    /// The lines, as the owner wrote them (tally wraps a line that is too long).
    pub lines: Vec<String>,
}
