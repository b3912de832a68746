//! Candidates per shot and the owner's choice, written once over [`Tx`] (the outcomes, the
//! pure decisions and the plain words are in `store::choice`). Both decisions lock the set row
//! first ([`Tx::lock_set`]: set before envelope), so two PostgreSQL nodes adding candidates or
//! choosing for one set are decided one after the other; the set's timeline (`set_events`) is
//! written in the same transaction as the change it tells.

use super::{SubmitOutcome, submit};
use crate::domain::words::say_with;
use crate::domain::{Millis, TaskStatus};
use crate::store::choice::{CandidateOp, ShotRequest, candidate_tasks, candidates_added_message};
use crate::store::tx::Tx;
use crate::store::{AddOutcome, ChoiceOutcome, MAX_SHOT_CANDIDATES, SetEventView, StoreError, role_label};

/// Append an entry to a set's timeline.
pub(in crate::store) fn set_event(
    tx: &mut dyn Tx,
    set: &str,
    now: Millis,
    kind: &str,
    message: &str,
) -> Result<(), StoreError> {
    tx.exec(
        "INSERT INTO set_events (set_id, at, kind, message) VALUES (?1, ?2, ?3, ?4)",
        &[&set, &now, &kind, &message],
    )?;
    Ok(())
}

/// A set's timeline, oldest first.
pub(in crate::store) fn set_events(tx: &mut dyn Tx, set: &str) -> Result<Vec<SetEventView>, StoreError> {
    tx.rows("SELECT at, kind, message FROM set_events WHERE set_id = ?1 ORDER BY id", &[&set])?
        .iter()
        .map(|r| Ok(SetEventView { at: r.get(0)?, kind: r.get(1)?, message: r.get(2)? }))
        .collect()
}

/// The chosen artifact of each chosen shot: (position, artifact id).
pub(in crate::store) fn choices(tx: &mut dyn Tx, set: &str) -> Result<Vec<(i64, String)>, StoreError> {
    tx.rows("SELECT position, artifact_id FROM set_choices WHERE set_id = ?1", &[&set])?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?)))
        .collect()
}

/// Add `count` candidates to shot `position` of `set`: new tasks with the prompt, parameters
/// and role of the shot's first candidate (or, with `op`, edits or cutouts of the image of
/// one of its candidates), scheduled like shots. One transaction, under the set's lock.
pub(in crate::store) fn add_candidates(
    tx: &mut dyn Tx,
    set: &str,
    position: i64,
    count: u32,
    op: Option<&CandidateOp>,
    now: Millis,
) -> Result<AddOutcome, StoreError> {
    tx.lock_set(set)?;
    let Some(r) = tx.opt("SELECT canceled, provider FROM sets WHERE id = ?1", &[&set])? else {
        return Ok(AddOutcome::NoSet);
    };
    let (canceled, provider): (bool, String) = (r.get(0)?, r.get(1)?);
    if canceled {
        return Ok(AddOutcome::Canceled);
    }
    // The shot's first candidate's newest task carries the shot's request.
    let Some(first) = tx.opt(
        "SELECT prompt, params, shot_role, group_key FROM tasks WHERE set_id = ?1 AND set_position = ?2
         ORDER BY candidate, id DESC LIMIT 1",
        &[&set, &position],
    )?
    else {
        return Ok(AddOutcome::NoShot);
    };
    let req = ShotRequest { prompt: first.get(0)?, params: first.get(1)?, role: first.get(2)?, group: first.get(3)? };
    let r = tx.one(
        "SELECT COUNT(DISTINCT candidate), COALESCE(MAX(candidate), -1) + 1 FROM tasks
         WHERE set_id = ?1 AND set_position = ?2",
        &[&set, &position],
    )?;
    let (has, next): (i64, i64) = (r.get(0)?, r.get(1)?);
    if has + i64::from(count) > MAX_SHOT_CANDIDATES {
        return Ok(AddOutcome::TooMany { has });
    }
    // An edit or cutout works on an image of this very shot (checked here, under the lock).
    if let Some(op) = op
        && tx
            .opt(
                "SELECT 1 FROM artifacts a JOIN tasks t ON t.id = a.task_id
                 WHERE a.id = ?1 AND t.set_id = ?2 AND t.set_position = ?3",
                &[&op.artifact, &set, &position],
            )?
            .is_none()
    {
        return Ok(AddOutcome::NotOfShot);
    }
    let (role, tasks) = candidate_tasks(&provider, set, position, req, next, count, op)?;
    let mut ids = Vec::new();
    for t in tasks {
        if let SubmitOutcome::Created(id) = submit(tx, &t, now)? {
            ids.push(id);
        }
    }
    set_event(tx, set, now, "candidates_added", &candidates_added_message(&ids, position, &role))?;
    tx.exec("UPDATE sets SET updated_at = ?2 WHERE id = ?1", &[&set, &now])?;
    Ok(AddOutcome::Added(ids))
}

/// Choose `artifact` for shot `position` of `set`, or clear the choice (`None`). Checked in
/// the transaction that writes it, under the set's lock: the artifact must be the image of a
/// succeeded, current candidate of that very shot.
pub(in crate::store) fn choose(
    tx: &mut dyn Tx,
    set: &str,
    position: i64,
    artifact: Option<&str>,
    now: Millis,
) -> Result<ChoiceOutcome, StoreError> {
    tx.lock_set(set)?;
    if tx.opt("SELECT 1 FROM sets WHERE id = ?1", &[&set])?.is_none() {
        return Ok(ChoiceOutcome::NoSet);
    }
    let Some(r) =
        tx.opt("SELECT shot_role FROM tasks WHERE set_id = ?1 AND set_position = ?2 LIMIT 1", &[&set, &position])?
    else {
        return Ok(ChoiceOutcome::NoShot);
    };
    let role: Option<String> = r.get(0)?;
    let previous: Option<String> = tx
        .opt("SELECT artifact_id FROM set_choices WHERE set_id = ?1 AND position = ?2", &[&set, &position])?
        .map(|r| r.get(0))
        .transpose()?;
    let (shot, role) = ((position + 1).to_string(), role_label(role.as_deref()));
    let Some(artifact) = artifact else {
        if previous.is_some() {
            tx.exec("DELETE FROM set_choices WHERE set_id = ?1 AND position = ?2", &[&set, &position])?;
            let image = previous.as_deref().unwrap_or("");
            let msg = say_with("say.set_choice_cleared", &[("shot", &shot), ("role", &role), ("image", image)]);
            set_event(tx, set, now, "choice_cleared", &msg)?;
        }
        return Ok(ChoiceOutcome::Cleared { previous });
    };
    let Some(o) = tx.opt(
        "SELECT t.id, t.set_id, t.set_position, t.candidate, t.status FROM artifacts a JOIN tasks t ON t.id = a.task_id
         WHERE a.id = ?1",
        &[&artifact],
    )?
    else {
        return Ok(ChoiceOutcome::NoArtifact);
    };
    let (task, owner_set, owner_pos, cand, status): (String, Option<String>, Option<i64>, i64, String) =
        (o.get(0)?, o.get(1)?, o.get(2)?, o.get(3)?, o.get(4)?);
    if owner_set.as_deref() != Some(set) || owner_pos != Some(position) {
        return Ok(ChoiceOutcome::OtherShot);
    }
    let status = TaskStatus::parse(&status).unwrap_or(TaskStatus::Failed);
    if status != TaskStatus::Succeeded {
        return Ok(ChoiceOutcome::NotSucceeded(status));
    }
    if previous.as_deref() == Some(artifact) {
        return Ok(ChoiceOutcome::Chosen { previous: None });
    }
    tx.exec(
        "INSERT INTO set_choices (set_id, position, artifact_id, chosen_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (set_id, position) DO UPDATE SET artifact_id = excluded.artifact_id, chosen_at = excluded.chosen_at",
        &[&set, &position, &artifact, &now],
    )?;
    let candidate = (cand + 1).to_string();
    let said = [("image", artifact), ("candidate", &candidate), ("task", &task), ("shot", &shot), ("role", &role)];
    let msg = match &previous {
        Some(p) => say_with("say.set_chosen_instead", &[&said[..], &[("previous", p.as_str())]].concat()),
        None => say_with("say.set_chosen", &said),
    };
    set_event(tx, set, now, "chosen", &msg)?;
    tx.exec("UPDATE sets SET updated_at = ?2 WHERE id = ?1", &[&set, &now])?;
    Ok(ChoiceOutcome::Chosen { previous })
}
