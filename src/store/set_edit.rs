//! Editing, duplicating and deleting an image set: the changes asked for, the outcomes, and
//! the plain words of a refusal. The operations, written once for both backends, are in
//! `store::ops::set_edit`.
//!
//! **The rules** (enforced in the operations' transactions, under the set's lock and the
//! locks of the tasks they change):
//! - A shot's prompt and role can be changed only while *every* task of that shot (each
//!   candidate, each retry) is `queued` or `waiting`, its envelope `pending` and not held, and
//!   no execution of it ever recorded `calling`: nothing was sent for it and no worker holds
//!   it. The set's product and style are written into every shot's request, so they can be
//!   changed only while that holds for every shot of the set.
//! - The reference photos are not written into any task: each claim reads them. So they can
//!   be changed while no task of the set ever recorded `calling`, none is `running` and none is
//!   held — a shot refused before sending (two photos on a one-photo model) or canceled does
//!   not hold them back, and its retry then sends the new photos.
//! - A duplicate is a new set with the same product, style, provider, reference photos and
//!   shots (each with as many candidates as it has now): new tasks, none scheduled — a copy to
//!   edit (`sets.started_at` NULL, status `draft`) that sends nothing until it is started
//!   (`ops::sets::start_set`: under the set's lock, re-checked, its first shot made due as a new
//!   set's is). Until then nothing else schedules its tasks: a settled or released shot
//!   (`ops::common::schedule_next_shot_of`) and a new candidate or retry (`ops::intake::submit`)
//!   both read `started_at` under the set's lock; the dispatcher takes only scheduled
//!   envelopes; recovery and a budget's release touch only envelopes that were handed out or
//!   held by a budget, which a copy's never were. (A held job of a copy restored from a backup
//!   taken before its start, whose request is then found at the provider, is adopted as any
//!   found job is, and marks its set started: a request of it did leave.)
//! - A set can be deleted only when every one of its tasks is `failed` or `canceled` (nothing
//!   queued, running, succeeded or `unknown`) and no delivery names it — or when it is a copy to
//!   edit never started, whose waiting tasks were never sent. A task whose request
//!   reached the provider (an execution recorded `calling`) is not deleted but kept as a job
//!   of its own, so Spend, the spend CSV and budgets still count what it may have cost.

use serde::Serialize;

/// A change to a set before anything was sent for it. `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct SetEdit {
    pub product: Option<String>,
    /// `Some(None)` (or an empty string) removes the style.
    pub style: Option<Option<String>>,
    /// Upload ids, in order: the set's new reference photos (an empty list removes them).
    pub references: Option<Vec<String>>,
    pub shots: Vec<ShotEdit>,
}

/// A change to one shot (every candidate of it).
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct ShotEdit {
    /// The shot's position in the set, from 0.
    pub position: i64,
    /// The shot's own words (the product and style are added as at creation).
    pub prompt: Option<String>,
    pub role: Option<String>,
}

impl SetEdit {
    /// Whether the change touches what every shot sends (product, style, references).
    pub fn whole_set(&self) -> bool {
        self.product.is_some() || self.style.is_some() || self.references.is_some()
    }
}

/// Why a set operation was refused, for the API's 409 and the CLI: a stable code and plain
/// words that say what blocks it and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct SetBlock {
    pub code: &'static str,
    pub message: String,
}

/// The outcome of an edit.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum EditOutcome {
    /// Committed; what changed, in plain words (empty: the set already was so).
    Edited(Vec<String>),
    NoSet,
    /// No shot at this position.
    NoShot(i64),
    /// A named reference photo does not exist.
    NoUpload(String),
    Blocked(SetBlock),
}

/// The outcome of a start of a copy to edit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum StartOutcome {
    /// Committed: the set is started, its first shot due.
    Started,
    /// It was started before: nothing changed.
    AlreadyStarted,
    /// It was canceled before it was started: nothing is sent.
    Canceled,
    /// It changed since it was priced (an edit came between): nothing is sent; price it again.
    Changed,
    NoSet,
}

/// The outcome of a delete.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum DeleteOutcome {
    /// The set is gone. `kept` are its tasks whose request reached the provider, now jobs of
    /// their own (Spend lists them); `deleted` counts the tasks deleted with it.
    Deleted {
        deleted: u64,
        kept: Vec<String>,
    },
    NoSet,
    Blocked(SetBlock),
}

/// The suffix a shot's task prompt carries after the shot's own words (see
/// `NewSet::shot_prompt`, which builds the same).
pub(in crate::store) fn prompt_suffix(product: &str, style: Option<&str>) -> String {
    let mut p = format!(" — product: {}", product.trim());
    if let Some(style) = style.filter(|s| !s.trim().is_empty()) {
        p.push_str(&format!("; style: {}", style.trim()));
    }
    p
}

/// A shot's own words from its task's prompt, given the set's product and style; `None` when
/// the prompt does not end as tally writes it.
pub(in crate::store) fn own_words<'a>(prompt: &'a str, product: &str, style: Option<&str>) -> Option<&'a str> {
    prompt.strip_suffix(&prompt_suffix(product, style))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewSet, NewShot};

    /// The suffix is the one `NewSet::shot_prompt` writes, so a shot's own words come back
    /// whole, with and without a style.
    #[test]
    fn own_words_undo_the_shot_prompt() {
        for style in [None, Some("bright, airy".to_string()), Some("  ".to_string())] {
            let set = NewSet {
                product: " teapot ".into(),
                style: style.clone(),
                provider: "p".into(),
                references: vec![],
                shots: vec![],
                idempotency_key: None,
            };
            let shot = NewShot {
                role: "main".into(),
                prompt: "on a table — with a dash".into(),
                params: serde_json::json!({}),
                candidates: 1,
                ..NewShot::default()
            };
            let full = set.shot_prompt(&shot);
            assert_eq!(own_words(&full, "teapot", style.as_deref()), Some("on a table — with a dash"), "{full}");
            assert_eq!(own_words(&full, "kettle", style.as_deref()), None);
        }
    }
}
