//! Edit, duplicate and delete an image set, each written once over [`Tx`] (the types, the
//! rules and the prompt helpers are in `store::set_edit`).
//!
//! **Locks, and why the re-check is enough.** Each operation locks the set row first
//! ([`Tx::lock_set`], as cancel and the choice do), then every task it decides on, one by one
//! in id order ([`Tx::lock_task`]: the envelope row a claim leases), and only then reads what
//! it decides on. A claim (`ops::claim`) marks a task `running` in the same transaction that
//! leases its envelope, and reads the prompt and the set's reference photos there too; so an
//! edit either commits first (the claim, which skips locked envelopes on PostgreSQL, reads the
//! new request) or sees the task `running` and refuses — a worker's request never changes under
//! it. A retry or more candidates for the set wait for the set lock, so no task joins a shot
//! while it is being edited or deleted. Under SQLite's single writer the locks cost nothing.

use std::collections::BTreeMap;

use serde_json::Value;

use super::SubmitOutcome;
use super::choice::set_event;
use super::common::{by_dialect, event};
use super::sets::{create_set_as, set_started, start_set};
use crate::domain::operation::{Source, SourceKind};
use crate::domain::words::{say, say_with};
use crate::domain::{Actor, Millis, request_hash};
use crate::store::set_edit::{DeleteOutcome, EditOutcome, SetBlock, SetEdit, own_words, prompt_suffix};
use crate::store::tx::Tx;
use crate::store::{NewSet, NewShot};
use crate::store::{PruneReport, StoreError, role_label};

/// One task of a set as these operations see it.
struct SetTask {
    id: String,
    position: i64,
    role: Option<String>,
    status: String,
    prompt: String,
    params: String,
    group: Option<String>,
    envelope: String,
    held: bool,
    /// Executions of it that recorded `calling` (a request that may have left).
    called: i64,
}

/// A set row: product, style, provider, canceled.
type SetRow = (String, Option<String>, String, bool);

/// The set row.
fn set_row(tx: &mut dyn Tx, set: &str) -> Result<Option<SetRow>, StoreError> {
    tx.opt("SELECT product, style, provider, canceled FROM sets WHERE id = ?1", &[&set])?
        .map(|r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .transpose()
}

/// Every task of the set, in id order.
fn set_tasks(tx: &mut dyn Tx, set: &str) -> Result<Vec<SetTask>, StoreError> {
    tx.rows(
        "SELECT t.id, t.set_position, t.shot_role, t.status, t.prompt, t.params, t.group_key, e.status,
                e.held_at IS NOT NULL,
                (SELECT count(*) FROM executions x WHERE x.task_id = t.id AND x.calling_at IS NOT NULL)
         FROM tasks t JOIN envelopes e ON e.task_id = t.id WHERE t.set_id = ?1 ORDER BY t.id",
        &[&set],
    )?
    .iter()
    .map(|r| {
        Ok(SetTask {
            id: r.get(0)?,
            position: r.get::<Option<i64>>(1)?.unwrap_or(0),
            role: r.get(2)?,
            status: r.get(3)?,
            prompt: r.get(4)?,
            params: r.get(5)?,
            group: r.get(6)?,
            envelope: r.get(7)?,
            held: r.get(8)?,
            called: r.get(9)?,
        })
    })
    .collect()
}

/// "shot 2 (Main photo)".
/// `key` (a `shot {shot} ({role}) …` line) for the shot at `position`.
fn shot_said(key: &str, position: i64, role: Option<&str>) -> String {
    say_with(key, &[("shot", &position.saturating_add(1).to_string()), ("role", &role_label(role))])
}

/// Said lines folded into one through the joiner `key` (`say.join.*`).
fn join_said(key: &str, lines: &[String]) -> String {
    lines.iter().cloned().reduce(|a, b| say_with(key, &[("a", &a), ("b", &b)])).unwrap_or_default()
}

fn shot_name(position: i64, role: Option<&str>) -> String {
    say_with("say.shot_name", &[("n", &position.saturating_add(1).to_string()), ("role", &role_label(role))])
}

/// Why this task's shot can no longer be changed (the key of its words), or `None` when
/// nothing was sent for it and no worker holds it.
fn sent_or_held(t: &SetTask) -> Option<&'static str> {
    let unsent = matches!(t.status.as_str(), "queued" | "waiting") && t.envelope == "pending" && t.called == 0;
    if unsent && !t.held {
        None
    } else if t.held {
        Some("say.edit_held")
    } else if t.status == "running" {
        Some("say.edit_generating")
    } else if unsent {
        None
    } else if t.called == 0 && matches!(t.status.as_str(), "failed" | "canceled") {
        Some("say.edit_finished")
    } else {
        Some("say.edit_sent")
    }
}

/// Why the set's reference photos can no longer change because of this task (the key of its
/// words), or `None`: no
/// request of it ever left and no worker holds it. Unlike its words, a task that settled
/// without sending anything (refused before sending, canceled) does not hold the photos back:
/// they are read by each claim, so a retry of it sends the new ones, and its own record keeps
/// what happened.
fn photos_sent(t: &SetTask) -> Option<&'static str> {
    if t.held {
        Some("say.edit_held")
    } else if t.status == "running" {
        Some("say.edit_generating")
    } else if t.called > 0 {
        Some("say.edit_sent_photos")
    } else {
        None
    }
}

/// Edit a set before anything was sent for what the edit touches (rules: `store::set_edit`).
/// One transaction: the set row, the prompt and role of every task of each changed shot (with
/// their request hash), the reference photos, a line on each changed task's timeline and one
/// on the set's.
pub(in crate::store) fn edit_set(
    tx: &mut dyn Tx,
    set: &str,
    edit: &SetEdit,
    now: Millis,
) -> Result<EditOutcome, StoreError> {
    tx.lock_set(set)?;
    let Some((product, style, provider, canceled)) = set_row(tx, set)? else { return Ok(EditOutcome::NoSet) };
    if canceled {
        return Ok(EditOutcome::Blocked(SetBlock { code: "set_canceled", message: say("say.edit_canceled") }));
    }
    let listed = set_tasks(tx, set)?;
    let mut positions: BTreeMap<i64, Vec<&SetTask>> = BTreeMap::new();
    for t in &listed {
        positions.entry(t.position).or_default().push(t);
    }
    for s in &edit.shots {
        if !positions.contains_key(&s.position) {
            return Ok(EditOutcome::NoShot(s.position));
        }
    }
    let new_product = edit.product.as_deref().map(str::trim).unwrap_or(product.as_str()).to_string();
    let new_style = match &edit.style {
        Some(s) => s.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_string),
        None => style.clone(),
    };
    let old_refs: Vec<String> = tx
        .rows("SELECT upload_id FROM set_references WHERE set_id = ?1 ORDER BY position", &[&set])?
        .iter()
        .map(|r| r.get(0))
        .collect::<Result<_, _>>()?;
    let refs_change = edit.references.as_ref().filter(|r| **r != old_refs);
    // A change of the product or style rewrites every shot's request; one of the references
    // changes what every later claim of the set sends, but no stored request.
    let whole = new_product != product || new_style != style;
    // The shots whose request changes, with their new own words and role.
    let mut changes: BTreeMap<i64, (String, Option<String>)> = BTreeMap::new();
    for (pos, tasks) in &positions {
        let Some(first) = tasks.first() else { continue };
        let asked = edit.shots.iter().rev().find(|s| s.position == *pos);
        let own = match asked.and_then(|s| s.prompt.as_deref()) {
            Some(p) => p.trim().to_string(),
            None => match own_words(&first.prompt, &product, style.as_deref()) {
                Some(w) => w.to_string(),
                // A shot cut out of a photo (`main_white`) sends no prompt, so neither the
                // product nor the style is in its request: a change of them leaves it alone.
                None if first.prompt.is_empty() && asked.is_none() => continue,
                None if whole || asked.is_some() => {
                    return Err(StoreError::Invalid(format!(
                        "{}'s prompt does not end with the product and style as tally writes them; \
                         give its prompt in full to edit it",
                        shot_name(*pos, first.role.as_deref())
                    )));
                }
                None => continue,
            },
        };
        let role = asked.and_then(|s| s.role.clone()).or_else(|| first.role.clone());
        let prompt_now = own_words(&first.prompt, &product, style.as_deref());
        if whole || prompt_now != Some(own.as_str()) || role != first.role {
            changes.insert(*pos, (own, role));
        }
    }
    if changes.is_empty() && !whole && refs_change.is_none() {
        return Ok(EditOutcome::Edited(Vec::new()));
    }
    // Lock every task the edit decides on (all of the set's for a change of the product, style
    // or references), in id order, then decide on what is there now.
    let all = whole || refs_change.is_some();
    let ids: Vec<&str> =
        listed.iter().filter(|t| all || changes.contains_key(&t.position)).map(|t| t.id.as_str()).collect();
    for id in &ids {
        tx.lock_task(id)?;
    }
    let current = set_tasks(tx, set)?;
    // `why` and `what`: the keys of the words.
    let refused = |t: &SetTask, why: &str, what: &str| {
        let shot = shot_name(t.position, t.role.as_deref());
        Ok(EditOutcome::Blocked(SetBlock {
            code: "shot_already_sent",
            message: say_with("say.edit_refused", &[("shot", &shot), ("why", &say(why)), ("what", &say(what))]),
        }))
    };
    for t in current.iter().filter(|t| whole || changes.contains_key(&t.position)) {
        if let Some(why) = sent_or_held(t) {
            let what = if whole { "say.edit_whole" } else { "say.edit_words" };
            return refused(t, why, what);
        }
    }
    if refs_change.is_some() {
        for t in &current {
            if let Some(why) = photos_sent(t) {
                return refused(t, why, "say.edit_photos");
            }
        }
    }
    // References first: a missing photo refuses the whole edit before anything is written.
    let mut said = Vec::new();
    if let Some(refs) = refs_change {
        let photo =
            by_dialect(tx, "SELECT 1 FROM uploads WHERE id = ?1", "SELECT 1 FROM uploads WHERE id = ?1 FOR KEY SHARE");
        for r in refs {
            if tx.opt(photo, &[r])?.is_none() {
                return Ok(EditOutcome::NoUpload(r.clone()));
            }
        }
        tx.exec("DELETE FROM set_references WHERE set_id = ?1", &[&set])?;
        for (i, r) in refs.iter().enumerate() {
            tx.exec(
                "INSERT INTO set_references (set_id, position, upload_id) VALUES (?1, ?2, ?3)",
                &[&set, &(i as i64), r],
            )?;
        }
        said.push(say_with("say.set_edited_refs", &[("n", &refs.len().to_string())]));
    }
    if new_product != product {
        said.push(say_with("say.set_edited_product", &[("product", &new_product)]));
    }
    if new_style != style {
        said.push(match &new_style {
            Some(s) => say_with("say.set_edited_style", &[("style", s)]),
            None => say("say.set_edited_style_removed"),
        });
    }
    tx.exec(
        "UPDATE sets SET product = ?2, style = ?3, updated_at = ?4 WHERE id = ?1",
        &[&set, &new_product, &new_style, &now],
    )?;
    let suffix = prompt_suffix(&new_product, new_style.as_deref());
    for t in &current {
        let Some((own, role)) = changes.get(&t.position) else { continue };
        let prompt = format!("{own}{suffix}");
        let params: Value = serde_json::from_str(&t.params).unwrap_or(Value::Null);
        let hash = request_hash(&provider, &prompt, &params, t.group.as_deref().unwrap_or(""));
        tx.exec(
            "UPDATE tasks SET prompt = ?2, shot_role = ?3, request_hash = ?4, updated_at = ?5 WHERE id = ?1",
            &[&t.id, &prompt, role, &hash, &now],
        )?;
        let mut what = Vec::new();
        if own_words(&t.prompt, &product, style.as_deref()) != Some(own.as_str()) {
            what.push(say("say.edited_prompt"));
        }
        if *role != t.role {
            what.push(say("say.edited_role"));
        }
        if whole {
            what.push(say("say.edited_set_words"));
        }
        let msg = say_with("say.task_edited", &[("what", &join_said("say.join.comma", &what))]);
        event(tx, &t.id, now, Actor::Api, "edited", &msg, None)?;
    }
    for (pos, (own, role)) in &changes {
        let before = positions.get(pos).and_then(|ts| ts.first()).map(|t| (t.prompt.as_str(), t.role.clone()));
        if let Some((prompt, old_role)) = before {
            if own_words(prompt, &product, style.as_deref()) != Some(own.as_str()) {
                said.push(shot_said("say.set_edited_prompt", *pos, role.as_deref()));
            }
            if *role != old_role {
                said.push(shot_said("say.set_edited_role", *pos, role.as_deref()));
            }
        }
    }
    let message = say_with("say.set_edited", &[("what", &join_said("say.join.semicolon", &said))]);
    set_event(tx, set, now, "edited", &message)?;
    Ok(EditOutcome::Edited(said))
}

/// Duplicate a set: a new set with the same product, style, provider, reference photos and
/// shots (each with as many candidates as it has now), in one transaction with a line on both
/// sets' timelines. The copy is a copy to edit: not started, none of its tasks scheduled, so
/// nothing of it is sent until [`start_set`] — or, with `start`, it is started in the same
/// transaction (a copy made before with the same key is started then too). `None`: no such
/// set. `key` makes resending the duplicate safe, as a create's key does.
pub(in crate::store) fn duplicate_set(
    tx: &mut dyn Tx,
    set: &str,
    key: Option<&str>,
    start: bool,
    now: Millis,
) -> Result<Option<SubmitOutcome>, StoreError> {
    tx.lock_set(set)?;
    let Some(new) = as_new_set(tx, set, key)? else { return Ok(None) };
    let out = create_set_as(tx, &new, false, now)?;
    if let SubmitOutcome::Created(id) = &out {
        set_event(tx, set, now, "duplicated", &say_with("say.set_copied_to_edit", &[("id", id)]))?;
        set_event(tx, id, now, "duplicated_from", &say_with("say.set_copy_to_edit", &[("id", set)]))?;
    }
    if start && let SubmitOutcome::Created(id) | SubmitOutcome::Existing(id) = &out {
        start_set(tx, id, now)?;
    }
    Ok(Some(out))
}

/// The set as a [`NewSet`]: what a duplicate of it creates (`None`: no such set). A duplicate
/// reads it under the set's lock, so no candidate joins a shot meanwhile.
pub(in crate::store) fn as_new_set(
    tx: &mut dyn Tx,
    set: &str,
    key: Option<&str>,
) -> Result<Option<NewSet>, StoreError> {
    let Some((product, style, provider, _)) = set_row(tx, set)? else { return Ok(None) };
    let references: Vec<String> = tx
        .rows("SELECT upload_id FROM set_references WHERE set_id = ?1 ORDER BY position", &[&set])?
        .iter()
        .map(|r| r.get(0))
        .collect::<Result<_, _>>()?;
    // Per shot: its first candidate's newest task (the shot's request, as more candidates
    // take it) and how many candidates it has.
    let rows = tx.rows(
        "SELECT t.set_position, t.prompt, t.params, t.shot_role,
                (SELECT count(DISTINCT c.candidate) FROM tasks c WHERE c.set_id = t.set_id AND c.set_position = t.set_position),
                t.operation, t.source_kind, t.source_id, t.provider
         FROM tasks t WHERE t.set_id = ?1
           AND t.id = (SELECT f.id FROM tasks f WHERE f.set_id = t.set_id AND f.set_position = t.set_position
                       ORDER BY f.candidate, f.id DESC LIMIT 1)
         ORDER BY t.set_position",
        &[&set],
    )?;
    let overlays = crate::store::sets::parse_overlays(
        tx.opt("SELECT overlays FROM sets WHERE id = ?1", &[&set])?
            .map(|r| r.get::<Option<String>>(0))
            .transpose()?
            .flatten()
            .as_deref(),
    );
    let mut shots = Vec::with_capacity(rows.len());
    for r in &rows {
        let (pos, prompt, params, role, count): (i64, String, String, Option<String>, i64) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
        let (operation, kind, source_id, task_provider): (String, Option<String>, Option<String>, String) =
            (r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?);
        // A cutout shot (a `main_white` shot's photo) is copied as one: the same photo, cut out
        // on the same provider.
        let source = match (operation.as_str(), kind.as_deref().and_then(SourceKind::parse), source_id) {
            ("cutout", Some(kind), Some(id)) => Some(Source { kind, id }),
            _ => None,
        };
        let own = if source.is_some() { Some("") } else { own_words(&prompt, &product, style.as_deref()) };
        let own = own.ok_or_else(|| {
            StoreError::Invalid(format!(
                "{}'s prompt does not end with the product and style as tally writes them, so it cannot be copied",
                shot_name(pos, role.as_deref())
            ))
        })?;
        shots.push(NewShot {
            role: role.unwrap_or_else(|| "scene".into()),
            prompt: own.to_string(),
            params: serde_json::from_str(&params).unwrap_or_else(|_| serde_json::json!({})),
            candidates: u32::try_from(count.max(1)).unwrap_or(1),
            provider: (source.is_some() && task_provider != provider).then_some(task_provider),
            source,
            overlay: usize::try_from(pos).ok().and_then(|p| overlays.get(p).cloned().flatten()),
        });
    }
    Ok(Some(NewSet { product, style, provider, references, shots, idempotency_key: key.map(str::to_string) }))
}

/// Delete a set whose every task failed or was canceled (rules: `store::set_edit`). A task
/// whose request reached the provider is kept as a job of its own (its charge stays in Spend),
/// with a line on its timeline saying why; the others go with their executions, events and
/// envelopes, and so do the set's references, choices and timeline. One transaction.
pub(in crate::store) fn delete_set(tx: &mut dyn Tx, set: &str, now: Millis) -> Result<DeleteOutcome, StoreError> {
    tx.lock_set(set)?;
    let Some((product, ..)) = set_row(tx, set)? else { return Ok(DeleteOutcome::NoSet) };
    let listed: Vec<String> = set_tasks(tx, set)?.into_iter().map(|t| t.id).collect();
    for id in &listed {
        tx.lock_task(id)?;
    }
    let tasks = set_tasks(tx, set)?;
    // A copy to edit never started: nothing of it was scheduled, so its waiting tasks go too.
    let unstarted = !set_started(tx, set)?;
    // Current shots only decide the message; every task, replaced ones included, must be done.
    for t in &tasks {
        let name = shot_name(t.position, t.role.as_deref());
        let never_sent = t.envelope == "pending" && t.called == 0;
        let block = match t.status.as_str() {
            "failed" | "canceled" => continue,
            "queued" | "waiting" if unstarted && never_sent => continue,
            "succeeded" => SetBlock {
                code: "set_has_images",
                message: format!(
                    "{name} has an image; tally deletes only a set whose every shot failed or was canceled, \
                     so no image is lost"
                ),
            },
            "unknown" => SetBlock {
                code: "set_has_unknown",
                message: format!(
                    "{name}'s outcome is unknown (it may have been made, and charged); record what happened \
                     first (`tally resolve`, or \"Record what happened\" in the page), then delete the set"
                ),
            },
            _ => SetBlock {
                code: "set_not_finished",
                message: format!(
                    "{name} is {} — cancel the set first; tally deletes a set only when every shot failed or was \
                     canceled",
                    t.status
                ),
            },
        };
        return Ok(DeleteOutcome::Blocked(block));
    }
    if tx.opt("SELECT 1 FROM deliveries WHERE set_id = ?1", &[&set])?.is_some() {
        return Ok(DeleteOutcome::Blocked(SetBlock {
            code: "set_has_deliveries",
            message: say("say.delete_delivered"),
        }));
    }
    // Links into the set (retries of its shots) go first, as in a prune.
    tx.exec("UPDATE tasks SET retry_of = NULL WHERE retry_of IN (SELECT id FROM tasks WHERE set_id = ?1)", &[&set])?;
    tx.exec("DELETE FROM set_choices WHERE set_id = ?1", &[&set])?;
    let mut report = PruneReport::default();
    let mut kept = Vec::new();
    for t in &tasks {
        if t.called > 0 {
            tx.exec(
                "UPDATE tasks SET set_id = NULL, set_position = NULL, candidate = 0, updated_at = ?2 WHERE id = ?1",
                &[&t.id, &now],
            )?;
            let msg = format!(
                "its set \"{product}\" was deleted; this job is kept because its request reached the provider, so \
                 Spend still lists what it may have cost"
            );
            event(tx, &t.id, now, Actor::Api, "set_deleted", &msg, None)?;
            kept.push(t.id.clone());
        } else {
            crate::store::prune::delete_task(tx, &t.id, &mut report)?;
        }
    }
    tx.exec("DELETE FROM set_references WHERE set_id = ?1", &[&set])?;
    tx.exec("DELETE FROM set_events WHERE set_id = ?1", &[&set])?;
    // A draft confirmed into this set is confirmed no more: it can make a set again.
    tx.exec("UPDATE drafts SET set_id = NULL, confirmed_revision = NULL WHERE set_id = ?1", &[&set])?;
    tx.exec("DELETE FROM sets WHERE id = ?1", &[&set])?;
    Ok(DeleteOutcome::Deleted { deleted: report.tasks, kept })
}
