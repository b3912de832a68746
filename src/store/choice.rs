//! Candidates per shot and the owner's choice: the outcomes, the pure decisions and the plain
//! words (the operations, written once for both backends, are in `store::ops::choice`).
//!
//! A shot (`tasks.set_position`) holds one or more **candidates** (`tasks.candidate`, from 0),
//! each its own task with the whole protocol (outbox, lease, fencing, `calling` before the
//! paid request, charge evidence, recovery). A retried candidate is replaced by its retry, as
//! a retried shot was. The candidates of a shot run together and the shots one after another
//! (`store::ops::common::schedule_next_shot_of`): a candidate added to the shot that is running
//! goes at once beside it; one added to another shot waits, and the lowest waiting shot goes
//! next, so a candidate added to shot 0 runs before the unscheduled tasks of later shots.
//!
//! The **choice** is one row per shot in `set_choices` naming a succeeded candidate's
//! artifact; every change is written to the set's own timeline (`set_events`) in the same
//! transaction.

use serde::Serialize;

use super::StoreError;
use super::ops::{NewTask, ShotRef};
use crate::domain::words::{say, say_with};
use crate::domain::{Millis, TaskStatus};

/// The most candidates `POST /v1/sets` makes per shot, and the most one request adds.
pub const MAX_CANDIDATES: u32 = 4;
/// The most candidates a shot may hold in all (each is a generation, maybe a paid one).
pub const MAX_SHOT_CANDIDATES: i64 = 16;

/// One entry of a set's own timeline.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct SetEventView {
    pub at: Millis,
    /// `created`, `candidates_added`, `chosen`, `choice_cleared`.
    pub kind: String,
    pub message: String,
}

/// What adding candidates to a shot did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum AddOutcome {
    /// The new candidates' task ids, in order.
    Added(Vec<String>),
    NoSet,
    NoShot,
    /// The set was canceled: nothing new is generated for it.
    Canceled,
    /// The shot would hold more than [`MAX_SHOT_CANDIDATES`].
    TooMany {
        has: i64,
    },
    /// The image an edit or cutout candidate works on is not an image of this shot.
    NotOfShot,
}

/// A candidate made from another candidate of the same shot (an edit or a cutout of its image)
/// instead of the shot's own request.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct CandidateOp {
    pub operation: crate::domain::operation::Operation,
    /// The image it works on: an artifact of a candidate of the same shot (checked in the
    /// transaction that adds it).
    pub artifact: String,
    /// The instruction (an edit), or empty (a cutout).
    pub prompt: String,
    /// The provider that does it (the set's by default).
    pub provider: String,
}

/// What choosing (or clearing) a shot's image did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ChoiceOutcome {
    /// Chosen (`previous`: the artifact chosen before, if another).
    Chosen {
        previous: Option<String>,
    },
    /// Cleared (`previous`: what was chosen; `None` when nothing was).
    Cleared {
        previous: Option<String>,
    },
    NoSet,
    NoShot,
    NoArtifact,
    /// The artifact is an image of another shot or set, or of no set.
    OtherShot,
    /// The candidate that made the artifact did not succeed (or was replaced).
    NotSucceeded(TaskStatus),
}

/// The plain-words name of a shot role, as the page and the `blocking` reasons say it.
pub fn role_label(role: Option<&str>) -> String {
    say(match role {
        Some("main") => "say.role_main",
        Some("main_white") => "say.role_main_white",
        Some("selling_point") => "say.role_selling_point",
        Some("detail") => "say.role_detail",
        Some("size") => "say.role_size",
        _ => "say.role_scene",
    })
}

/// A shot's name in a sentence: its role's label, with its number when the role repeats.
pub fn shot_label(roles: &[Option<String>], position: usize) -> String {
    let role = roles.get(position).and_then(|r| r.as_deref());
    let label = role_label(role);
    if roles.iter().filter(|r| r.as_deref() == role).count() > 1 {
        say_with("say.shot_label_n", &[("role", &label), ("n", &(position + 1).to_string())])
    } else {
        label
    }
}

/// Why a set cannot be delivered yet, in plain words (empty: it can). Today: shots with no
/// chosen image ("2 shots have no chosen image: Lifestyle scene, Selling point").
pub fn delivery_blocking(set: &super::SetView) -> Vec<String> {
    let roles: Vec<Option<String>> = set.shots.iter().map(|t| t.shot_role.clone()).collect();
    let missing: Vec<String> = (0..set.shots.len())
        .filter(|i| set.chosen.get(*i).is_none_or(Option::is_none))
        .map(|i| shot_label(&roles, i))
        .collect();
    let mut out = Vec::new();
    match missing.len() {
        0 => {}
        1 => out.push(say_with("say.no_chosen_one", &[("shot", &missing[0])])),
        n => {
            let shots = missing.iter().cloned().reduce(|a, b| say_with("say.join.comma", &[("a", &a), ("b", &b)]));
            out.push(say_with("say.no_chosen_many", &[("n", &n.to_string()), ("shots", &shots.unwrap_or_default())]))
        }
    }
    out
}

/// Which of a set's tasks are current. `rows` are (task id, position, candidate) ordered by
/// position, candidate, id; the newest task of a (position, candidate) is the candidate and
/// older ones were retried. Returns, per position in order, its current candidates' ids, and
/// the replaced ids.
pub(crate) fn current_candidates(rows: &[(String, i64, i64)]) -> (Vec<(i64, Vec<String>)>, Vec<String>) {
    let mut shots: Vec<(i64, Vec<String>)> = Vec::new();
    let mut replaced = Vec::new();
    for (i, (task, pos, cand)) in rows.iter().enumerate() {
        if rows.get(i + 1).is_some_and(|(_, p, c)| p == pos && c == cand) {
            replaced.push(task.clone());
            continue;
        }
        match shots.last_mut() {
            Some((p, ids)) if p == pos => ids.push(task.clone()),
            _ => shots.push((*pos, vec![task.clone()])),
        }
    }
    (shots, replaced)
}

/// What a shot's first candidate asked for (its newest task), read by both backends'
/// `add_candidates`: the prompt, the stored parameters (JSON text), the role and the group.
pub(crate) struct ShotRequest {
    pub prompt: String,
    pub params: String,
    pub role: Option<String>,
    pub group: Option<String>,
}

/// The tasks that add candidates `next .. next + count` to shot `position` of `set`, each
/// with the shot's request, or made from another candidate's image by `op` (one decision for
/// both backends), and the shot's role. Parameters
/// that are not JSON any more (a damaged database) are an error, never silently dropped.
pub(crate) fn candidate_tasks(
    provider: &str,
    set: &str,
    position: i64,
    req: ShotRequest,
    next: i64,
    count: u32,
    op: Option<&CandidateOp>,
) -> Result<(String, Vec<NewTask>), StoreError> {
    let role = req.role.unwrap_or_else(|| "scene".into());
    let params: serde_json::Value = serde_json::from_str(&req.params).map_err(|e| {
        StoreError::Fatal(format!(
            "the stored parameters of shot {} of set {set} are not JSON ({e}); run `tally check`",
            position + 1
        ))
    })?;
    let tasks = (0..i64::from(count))
        .map(|k| {
            let shot = Some(ShotRef { set_id: set.to_string(), position, role: role.clone(), candidate: next + k });
            match op {
                None => NewTask {
                    provider: provider.to_string(),
                    prompt: req.prompt.clone(),
                    params: params.clone(),
                    shot,
                    group: req.group.clone(),
                    ..NewTask::default()
                },
                Some(op) => NewTask {
                    provider: op.provider.clone(),
                    prompt: op.prompt.clone(),
                    params: serde_json::json!({}),
                    shot,
                    group: req.group.clone(),
                    operation: op.operation,
                    source: Some(crate::domain::operation::Source {
                        kind: crate::domain::operation::SourceKind::Artifact,
                        id: op.artifact.clone(),
                    }),
                    ..NewTask::default()
                },
            }
        })
        .collect();
    Ok((role, tasks))
}

/// The set timeline's line for candidates added to shot `position` (from 0).
pub(crate) fn candidates_added_message(ids: &[String], position: i64, role: &str) -> String {
    let label = role_label(Some(role));
    let (n, shot, ids) = (ids.len().to_string(), (position + 1).to_string(), ids.join(", "));
    say_with("say.set_candidates_added", &[("n", &n), ("shot", &shot), ("role", &label), ("ids", &ids)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_candidates_carry_the_shot_request_and_refuse_damaged_parameters() {
        let req = |params: &str| ShotRequest {
            prompt: "mug".into(),
            params: params.into(),
            role: None,
            group: Some("g".into()),
        };
        let (role, tasks) =
            candidate_tasks("demo", "s1", 2, req(r#"{"size":"1024x1024"}"#), 3, 2, None).expect("valid");
        assert_eq!(role, "scene");
        let shots: Vec<_> = tasks.iter().map(|t| t.shot.as_ref().map(|s| (s.position, s.candidate))).collect();
        assert_eq!(shots, vec![Some((2, 3)), Some((2, 4))]);
        assert!(tasks.iter().all(|t| t.params["size"] == "1024x1024" && t.group.as_deref() == Some("g")));
        let Err(err) = candidate_tasks("demo", "s1", 2, req("{not json"), 3, 1, None) else {
            panic!("damaged parameters were accepted")
        };
        assert!(err.to_string().contains("shot 3 of set s1"), "{err}");
    }

    #[test]
    fn the_newest_task_of_each_candidate_is_current() {
        let row = |id: &str, p: i64, c: i64| (id.to_string(), p, c);
        let rows = [row("a", 0, 0), row("b", 0, 0), row("c", 0, 1), row("d", 1, 0)];
        let (shots, replaced) = current_candidates(&rows);
        assert_eq!(shots, vec![(0, vec!["b".to_string(), "c".to_string()]), (1, vec!["d".to_string()])]);
        assert_eq!(replaced, vec!["a".to_string()]);
    }

    #[test]
    fn a_repeated_role_is_named_with_its_number() {
        let roles = [Some("main".to_string()), Some("scene".to_string()), Some("scene".to_string())];
        let en = |i| crate::domain::words::english(&shot_label(&roles, i));
        assert_eq!(en(0), "Main photo");
        assert_eq!(en(2), "Lifestyle scene (shot 3)");
    }
}
