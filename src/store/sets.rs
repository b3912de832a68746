//! Product image sets and reference uploads: the types, a set's hash and the tasks it starts
//! with, and its summary in plain words. The operations, written once for both backends, are
//! in `store::ops::sets`; the few SQLite-connection functions here forward to them.
//!
//! **One shot after another per set; the candidates of a shot together.** A set's live tasks
//! always belong to one shot position. A task's envelope is created unscheduled (`due_at
//! NULL`) while a task of another shot of its set is live; `ops::common::on_settled` runs
//! inside every transaction that settles a task (terminal or `unknown`) and, once nothing of
//! the set is live, makes every candidate of the next shot due, so the chain advances without
//! polling. The provider's slots (taken by the dispatcher) cap how many of them are in flight,
//! and tasks of other sets and single tasks interleave with them by the fair queue.

use rusqlite::Connection;
use serde::Serialize;
use serde_json::Value;

use super::StoreError;
use super::ops::{NewTask, ShotRef};
use super::read::TaskView;
use super::sqlite::tx::SqliteTx;
use crate::domain::words::say;
use crate::domain::{Millis, TaskStatus, request_hash};

/// The shot roles a set may list.
pub const SHOT_ROLES: &[&str] = &["main", "selling_point", "scene", "detail", "size", "main_white"];

/// An uploaded reference image (its bytes are the blob with the same id).
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct UploadView {
    pub id: String,
    pub sha256: String,
    pub bytes: i64,
    pub media_type: String,
    pub created_at: Millis,
}

/// One shot of a new set.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct NewShot {
    pub role: String,
    pub prompt: String,
    pub params: Value,
    /// How many candidate images to make (1 to [`super::choice::MAX_CANDIDATES`]).
    pub candidates: u32,
    /// A `main_white` shot's photo of the real product (issue #37): each candidate is a
    /// `cutout` of it (on [`Self::provider`]), composed on pure white when delivered.
    pub source: Option<crate::domain::operation::Source>,
    /// The provider that cuts `source` out, when it is not the set's (the engine picks one that
    /// offers `cutout`); `None` for a generated shot.
    pub provider: Option<String>,
    /// The owner's words tally draws on the shot's image when it is delivered.
    pub overlay: Option<crate::domain::overlay::Overlay>,
}

impl NewShot {
    /// The operation each candidate of this shot runs: a `cutout` of its photo, or a
    /// generation.
    pub fn operation(&self) -> crate::domain::operation::Operation {
        match self.source {
            Some(_) => crate::domain::operation::Operation::Cutout,
            None => crate::domain::operation::Operation::Generate,
        }
    }
}

/// A set to create.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct NewSet {
    pub product: String,
    pub style: Option<String>,
    pub provider: String,
    /// Upload ids, in order.
    pub references: Vec<String>,
    pub shots: Vec<NewShot>,
    pub idempotency_key: Option<String>,
}

impl NewSet {
    pub(in crate::store) fn hash(&self) -> String {
        let shots: Vec<Value> = self
            .shots
            .iter()
            .map(|s| {
                // A shot of one candidate hashes as before candidates existed (keys stay valid);
                // a photo to cut out and words to draw are added only where there are some.
                let mut v = if s.candidates == 1 {
                    serde_json::json!({"role": s.role, "prompt": s.prompt, "params": s.params})
                } else {
                    serde_json::json!({"role": s.role, "prompt": s.prompt, "params": s.params, "candidates": s.candidates})
                };
                if let Some(src) = &s.source {
                    v["source"] = src.to_json();
                    v["source_provider"] = serde_json::json!(s.provider);
                }
                if let Some(o) = &s.overlay {
                    v["overlay"] = serde_json::json!(o);
                }
                v
            })
            .collect();
        let extra = serde_json::json!({"style": self.style, "references": self.references, "shots": shots});
        request_hash(&self.provider, &self.product, &Value::Null, &extra.to_string())
    }

    /// The `sets.overlays` column: a JSON array by shot position (null where a shot has no
    /// words), or `None` when no shot has any.
    pub(in crate::store) fn overlays_json(&self) -> Option<String> {
        if self.shots.iter().all(|s| s.overlay.is_none()) {
            return None;
        }
        Some(serde_json::json!(self.shots.iter().map(|s| s.overlay.clone()).collect::<Vec<_>>()).to_string())
    }

    /// The first entry of a new set's timeline.
    pub(in crate::store) fn created_message(&self) -> String {
        let tasks: u32 = self.shots.iter().map(|s| s.candidates.max(1)).sum();
        crate::domain::words::say_with(
            "say.set_created",
            &[("shots", &self.shots.len().to_string()), ("images", &tasks.to_string())],
        )
    }

    /// The tasks a new set starts with, in order: every candidate of every shot (one task
    /// each, so each keeps the whole protocol). One list for both backends' `create_set`.
    pub fn shot_tasks(&self, set_id: &str) -> Vec<NewTask> {
        let mut out = Vec::new();
        for (i, shot) in self.shots.iter().enumerate() {
            for k in 0..shot.candidates.max(1) {
                out.push(NewTask {
                    provider: shot.provider.clone().unwrap_or_else(|| self.provider.clone()),
                    prompt: self.shot_prompt(shot),
                    params: shot.params.clone(),
                    operation: shot.operation(),
                    source: shot.source.clone(),
                    shot: Some(ShotRef {
                        set_id: set_id.to_string(),
                        position: i as i64,
                        role: shot.role.clone(),
                        candidate: i64::from(k),
                    }),
                    ..NewTask::default()
                });
            }
        }
        out
    }

    /// The prompt a shot's task sends: the shot's own words plus the product and style (a
    /// shot cut out of a photo sends none: `cutout` takes no prompt).
    pub fn shot_prompt(&self, shot: &NewShot) -> String {
        if shot.source.is_some() {
            return String::new();
        }
        let mut p = format!("{} — product: {}", shot.prompt.trim(), self.product.trim());
        if let Some(style) = self.style.as_deref().filter(|s| !s.trim().is_empty()) {
            p.push_str(&format!("; style: {}", style.trim()));
        }
        p
    }
}

/// The `sets.overlays` column read back: per shot position, its words. A value this build
/// cannot read (written by a newer one) reads as no words rather than failing the set.
pub fn parse_overlays(text: Option<&str>) -> Vec<Option<crate::domain::overlay::Overlay>> {
    text.and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default()
}

/// A set as the API shows it: its current shots (a retried shot replaced by its retry) and
/// the ids of the tasks they replaced. `shots[i]` is shot i's first candidate (what a shot
/// was before candidates); `candidates[i]` all of its current candidates, the first included;
/// `chosen[i]` the artifact chosen for it.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct SetView {
    pub id: String,
    pub product: String,
    pub style: Option<String>,
    pub provider: String,
    pub canceled: bool,
    /// `false`: a copy to edit, not started (nothing of it is scheduled; status `draft`).
    pub started: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub references: Vec<UploadView>,
    pub shots: Vec<TaskView>,
    /// Per shot, its current candidates (the first is `shots[i]`).
    pub candidates: Vec<Vec<TaskView>>,
    /// Per shot, the chosen artifact's id.
    pub chosen: Vec<Option<String>>,
    /// Earlier tasks of retried shots and candidates, oldest first.
    pub replaced: Vec<String>,
    /// The set's own timeline (choices, candidates added), oldest first.
    pub timeline: Vec<super::choice::SetEventView>,
    /// Per shot position, the words tally draws on its image (shorter than `shots`, or empty,
    /// where the rest have none).
    pub overlays: Vec<Option<crate::domain::overlay::Overlay>>,
}

impl SetView {
    /// Every current task of the set: each shot's candidates, in shot order.
    pub fn tasks(&self) -> impl Iterator<Item = &TaskView> {
        self.candidates.iter().flatten()
    }

    /// Fill `shots`, `candidates`, `chosen` and `replaced` from the current candidates' ids
    /// (`store::choice::current_candidates`), loading each task with `load`.
    pub(crate) fn fill<E>(
        &mut self,
        rows: &[(String, i64, i64)],
        choices: &[(i64, String)],
        mut load: impl FnMut(&str) -> Result<Option<TaskView>, E>,
    ) -> Result<(), E> {
        let (shots, replaced) = super::choice::current_candidates(rows);
        self.replaced = replaced;
        for (pos, ids) in shots {
            let mut cands = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(t) = load(&id)? {
                    cands.push(t);
                }
            }
            let Some(first) = cands.first() else { continue };
            self.shots.push(first.clone());
            self.candidates.push(cands);
            self.chosen.push(choices.iter().find(|(p, _)| *p == pos).map(|(_, a)| a.clone()));
        }
        Ok(())
    }
}

/// The reference images of a set (sent with each of its shots), in order, on a SQLite
/// connection (`ops::sets::references_of_set` is the one logic).
pub fn references_of_set(c: &Connection, set: &str) -> Result<Vec<UploadView>, StoreError> {
    super::ops::sets::references_of_set(&mut SqliteTx::new(c), set)
}

/// Sets newest first, after the cursor `before` (a set id), on a SQLite connection
/// (`ops::sets::list_sets` is the one logic).
pub fn list_sets(c: &Connection, before: Option<&str>, limit: usize) -> Result<Vec<SetView>, StoreError> {
    super::ops::sets::list_sets(&mut SqliteTx::new(c), before, limit)
}

/// A set's status, derived from its current shots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum SetStatus {
    /// A copy to edit, not started: nothing of it is sent until it is started.
    Draft,
    Running,
    Done,
    DoneWithProblems,
    Canceled,
}

/// Derive a set's status, progress line and plain-words message from its shots.
pub fn set_summary(set: &SetView) -> (SetStatus, String, String) {
    let n = set.tasks().count();
    let count = |s: TaskStatus| set.tasks().filter(|t| t.status == s).count();
    let (done, unknown, failed, canceled) = (
        count(TaskStatus::Succeeded),
        count(TaskStatus::Unknown),
        count(TaskStatus::Failed),
        count(TaskStatus::Canceled),
    );
    let settled = done + unknown + failed + canceled;
    use crate::domain::words::say_with;
    let mut progress = say_with("say.set_progress", &[("done", &done.to_string()), ("n", &n.to_string())]);
    for (k, key) in [
        (unknown, "say.set_progress_unknown"),
        (failed, "say.set_progress_failed"),
        (canceled, "say.set_progress_canceled"),
    ] {
        if k > 0 {
            progress = say_with(key, &[("head", &progress), ("k", &k.to_string())]);
        }
    }
    let status = if !set.started && !set.canceled {
        SetStatus::Draft
    } else if settled < n {
        SetStatus::Running
    } else if set.canceled {
        SetStatus::Canceled
    } else if done == n {
        SetStatus::Done
    } else {
        SetStatus::DoneWithProblems
    };
    let message = say(match status {
        SetStatus::Draft => "say.set_draft",
        SetStatus::Running if set.canceled => "say.set_canceling",
        SetStatus::Running => "say.set_running",
        SetStatus::Done => "say.set_done",
        SetStatus::Canceled => "say.set_canceled",
        SetStatus::DoneWithProblems if unknown > 0 => "say.set_unknown",
        SetStatus::DoneWithProblems => "say.set_problems",
    });
    (status, progress, message)
}
