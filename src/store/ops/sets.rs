//! Image sets and reference uploads, written once over [`Tx`] (the types, the set's hash and
//! its summary are in `store::sets`).
//!
//! **One shot after another per set, the candidates of a shot together.** A set's live tasks
//! always belong to one shot position. Every decision about a set's schedule (a task's submit
//! or retry, what a settled task lets go, a cancel) first locks the set row ([`Tx::lock_set`]),
//! so two PostgreSQL nodes never both see "nothing live" and start two shots; under SQLite's
//! single writer the lock costs nothing.

use super::common::{Keyed, by_dialect, insert_blob, new_id, replay_of};
use super::user::cancel;
use super::{CancelOutcome, SubmitOutcome, submit};
use crate::domain::Millis;
use crate::store::tx::{Row, Tx};
use crate::store::{NewImage, NewSet, SetView, StartOutcome, StoreError, UploadView};

fn upload_row(r: &Row) -> Result<UploadView, StoreError> {
    Ok(UploadView { id: r.get(0)?, sha256: r.get(1)?, bytes: r.get(2)?, media_type: r.get(3)?, created_at: r.get(4)? })
}

/// Record an uploaded image (its row and its bytes, in one transaction), or return the
/// existing upload with the same content (then nothing is stored). On PostgreSQL a concurrent
/// insert of the same content on another node fails this insert on the unique `sha256`; the
/// retry then finds it here.
pub(in crate::store) fn save_upload(tx: &mut dyn Tx, img: &NewImage, now: Millis) -> Result<UploadView, StoreError> {
    if let Some(existing) = upload_by_hash(tx, img.sha256())? {
        return Ok(existing);
    }
    let u = UploadView {
        id: new_id(),
        sha256: img.sha256().to_string(),
        bytes: img.len(),
        media_type: img.media_type().to_string(),
        created_at: now,
    };
    insert_blob(tx, &u.id, img)?;
    tx.exec(
        "INSERT INTO uploads (id, sha256, bytes, media_type, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
        &[&u.id, &u.sha256, &u.bytes, &u.media_type, &u.created_at],
    )?;
    Ok(u)
}

/// An upload by content hash.
pub(in crate::store) fn upload_by_hash(tx: &mut dyn Tx, sha256: &str) -> Result<Option<UploadView>, StoreError> {
    tx.opt("SELECT id, sha256, bytes, media_type, created_at FROM uploads WHERE sha256 = ?1", &[&sha256])?
        .as_ref()
        .map(upload_row)
        .transpose()
}

/// An upload by id.
pub(in crate::store) fn upload(tx: &mut dyn Tx, id: &str) -> Result<Option<UploadView>, StoreError> {
    tx.opt("SELECT id, sha256, bytes, media_type, created_at FROM uploads WHERE id = ?1", &[&id])?
        .as_ref()
        .map(upload_row)
        .transpose()
}

/// An upload with the product of the first set that uses it (what its download is named
/// after).
pub(in crate::store) fn upload_for_download(
    tx: &mut dyn Tx,
    id: &str,
) -> Result<Option<(UploadView, Option<String>)>, StoreError> {
    let Some(u) = upload(tx, id)? else { return Ok(None) };
    let product = tx
        .opt(
            "SELECT s.product FROM set_references r JOIN sets s ON s.id = r.set_id WHERE r.upload_id = ?1
             ORDER BY s.id LIMIT 1",
            &[&id],
        )?
        .map(|r| r.get(0))
        .transpose()?;
    Ok(Some((u, product)))
}

/// The reference images of a set (sent with each of its shots), in order.
pub(in crate::store) fn references_of_set(tx: &mut dyn Tx, set: &str) -> Result<Vec<UploadView>, StoreError> {
    tx.rows(
        "SELECT u.id, u.sha256, u.bytes, u.media_type, u.created_at
         FROM set_references r JOIN uploads u ON u.id = r.upload_id WHERE r.set_id = ?1 ORDER BY r.position",
        &[&set],
    )?
    .iter()
    .map(upload_row)
    .collect()
}

/// Create a set: the set row, its references, and one task (with its envelope) per candidate
/// of each shot, every candidate of the first shot due now and the rest unscheduled — all in
/// one transaction.
pub(in crate::store) fn create_set(tx: &mut dyn Tx, s: &NewSet, now: Millis) -> Result<SubmitOutcome, StoreError> {
    create_set_as(tx, s, true, now)
}

/// [`create_set`], or with `started` false a copy to edit: its row's `started_at` NULL and
/// every task unscheduled (`intake::submit` schedules no task of a set not started), until
/// [`start_set`] starts it.
pub(in crate::store) fn create_set_as(
    tx: &mut dyn Tx,
    s: &NewSet,
    started: bool,
    now: Millis,
) -> Result<SubmitOutcome, StoreError> {
    let hash = s.hash();
    if let Some(seen) = replay_of(tx, Keyed::Sets, s.idempotency_key.as_deref(), &hash)? {
        return Ok(seen);
    }
    // Where transactions run side by side (PostgreSQL), each named photo is locked (`FOR KEY
    // SHARE`, which only a delete conflicts with) before it is checked: a prune deleting it
    // either finished first (then it is gone, said plainly) or waits until this set, which
    // keeps it, is committed (`store::prune`). SQLite's single writer needs no lock.
    let photo =
        by_dialect(tx, "SELECT 1 FROM uploads WHERE id = ?1", "SELECT 1 FROM uploads WHERE id = ?1 FOR KEY SHARE");
    for r in &s.references {
        if tx.opt(photo, &[r])?.is_none() {
            return Err(StoreError::Invalid(format!("no upload with id {r}")));
        }
    }
    let id = new_id();
    let overlays = s.overlays_json();
    tx.exec(
        "INSERT INTO sets (id, idempotency_key, request_hash, product, style, provider, created_at, updated_at,
                           started_at, overlays)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8, ?9)",
        &[&id, &s.idempotency_key, &hash, &s.product, &s.style, &s.provider, &now, &started.then_some(now), &overlays],
    )?;
    for (i, r) in s.references.iter().enumerate() {
        tx.exec(
            "INSERT INTO set_references (set_id, position, upload_id) VALUES (?1, ?2, ?3)",
            &[&id, &(i as i64), r],
        )?;
    }
    for t in s.shot_tasks(&id) {
        submit(tx, &t, now)?;
    }
    super::choice::set_event(tx, &id, now, "created", &s.created_message())?;
    Ok(SubmitOutcome::Created(id))
}

/// Whether set `set` was started (a set that does not exist counts as started: nothing holds
/// its tasks back).
pub(in crate::store) fn set_started(tx: &mut dyn Tx, set: &str) -> Result<bool, StoreError> {
    Ok(tx
        .opt("SELECT started_at IS NOT NULL FROM sets WHERE id = ?1", &[&set])?
        .map(|r| r.get::<bool>(0))
        .transpose()?
        .unwrap_or(true))
}

/// Start a copy to edit: in one transaction, under the set's lock, re-check that it is still
/// not started (and not canceled), mark it started, and make every candidate of its first
/// unscheduled shot due exactly as a new set's first shot is (`common::schedule_first_shot_of`), with a line on its
/// timeline. Starting a set already started changes nothing.
pub(in crate::store) fn start_set(tx: &mut dyn Tx, set: &str, now: Millis) -> Result<StartOutcome, StoreError> {
    tx.lock_set(set)?;
    let Some(r) = tx.opt("SELECT canceled, started_at IS NOT NULL FROM sets WHERE id = ?1", &[&set])? else {
        return Ok(StartOutcome::NoSet);
    };
    let (canceled, started): (bool, bool) = (r.get(0)?, r.get(1)?);
    if started {
        return Ok(StartOutcome::AlreadyStarted);
    }
    if canceled {
        return Ok(StartOutcome::Canceled);
    }
    tx.exec("UPDATE sets SET started_at = ?2, updated_at = ?2 WHERE id = ?1", &[&set, &now])?;
    super::common::schedule_first_shot_of(tx, set, now)?;
    super::choice::set_event(tx, set, now, "started", &crate::domain::words::say("say.set_started_line"))?;
    Ok(StartOutcome::Started)
}

/// Start set `set` only if what it would send is still what was priced (`priced`: the hash of
/// [`super::set_edit::as_new_set`] when the owner was asked), checked under the set's lock in
/// the transaction that starts it: an edit between the price and the start gives `Changed`.
pub(in crate::store) fn start_priced_set(
    tx: &mut dyn Tx,
    set: &str,
    priced: &str,
    now: Millis,
) -> Result<StartOutcome, StoreError> {
    tx.lock_set(set)?;
    match super::set_edit::as_new_set(tx, set, None)? {
        None => Ok(StartOutcome::NoSet),
        Some(now_as_new) if now_as_new.hash() != priced => Ok(StartOutcome::Changed),
        Some(_) => start_set(tx, set, now),
    }
}

/// Cancel a set: every shot not yet called is canceled; a running shot finishes honestly.
/// Returns how many shots were canceled, or `None` if there is no such set. The set row is
/// locked first, then each shot's task one by one (`user::cancel`): a shot that started
/// meanwhile on another node is left to finish.
pub(in crate::store) fn cancel_set(tx: &mut dyn Tx, set: &str, now: Millis) -> Result<Option<usize>, StoreError> {
    tx.lock_set(set)?;
    if tx.exec("UPDATE sets SET canceled = true, updated_at = ?2 WHERE id = ?1", &[&set, &now])? == 0 {
        return Ok(None);
    }
    let waiting = tx
        .rows(
            "SELECT id FROM tasks WHERE set_id = ?1 AND status IN ('queued', 'waiting') ORDER BY set_position",
            &[&set],
        )?
        .iter()
        .map(|r| r.get::<String>(0))
        .collect::<Result<Vec<_>, _>>()?;
    let mut canceled = 0;
    for t in &waiting {
        if cancel(tx, t, now)? == CancelOutcome::Canceled {
            canceled += 1;
        }
    }
    Ok(Some(canceled))
}

/// A set with its current shots.
pub(in crate::store) fn get_set(tx: &mut dyn Tx, id: &str) -> Result<Option<SetView>, StoreError> {
    let row = tx.opt(
        "SELECT id, product, style, provider, canceled, created_at, updated_at, started_at IS NOT NULL, overlays
             FROM sets WHERE id = ?1",
        &[&id],
    )?;
    let Some(r) = row else { return Ok(None) };
    let mut set = SetView {
        id: r.get(0)?,
        product: r.get(1)?,
        style: r.get(2)?,
        provider: r.get(3)?,
        canceled: r.get(4)?,
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
        started: r.get(7)?,
        references: Vec::new(),
        shots: Vec::new(),
        candidates: Vec::new(),
        chosen: Vec::new(),
        replaced: Vec::new(),
        timeline: Vec::new(),
        overlays: crate::store::sets::parse_overlays(r.get::<Option<String>>(8)?.as_deref()),
    };
    set.references = references_of_set(tx, id)?;
    let rows = tx
        .rows(
            "SELECT id, set_position, candidate FROM tasks WHERE set_id = ?1 ORDER BY set_position, candidate, id",
            &[&id],
        )?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .collect::<Result<Vec<(String, i64, i64)>, StoreError>>()?;
    let choices = super::choice::choices(tx, id)?;
    set.fill(&rows, &choices, |t| crate::store::read::task(tx, t))?;
    set.timeline = super::choice::set_events(tx, id)?;
    Ok(Some(set))
}

/// Sets newest first, after the cursor `before` (a set id).
pub(in crate::store) fn list_sets(
    tx: &mut dyn Tx,
    before: Option<&str>,
    limit: usize,
) -> Result<Vec<SetView>, StoreError> {
    let ids = tx
        .rows(
            "SELECT id FROM sets WHERE id < ?1 ORDER BY id DESC LIMIT ?2",
            &[&before.unwrap_or("\u{10ffff}"), &(limit as i64)],
        )?
        .iter()
        .map(|r| r.get::<String>(0))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(s) = get_set(tx, &id)? {
            out.push(s);
        }
    }
    Ok(out)
}

/// Set or remove (`None`) the words drawn on shot `position`'s image, under the set's lock,
/// with a line on its timeline. The words are drawn when a file is made and never sent to a
/// provider, so they may change whatever was sent; a delivery already asked for keeps the words
/// it was asked with (`delivery_items.overlay`). `Ok(false)`: no such set or shot.
pub(in crate::store) fn set_overlay(
    tx: &mut dyn Tx,
    set: &str,
    position: i64,
    overlay: Option<&crate::domain::overlay::Overlay>,
    now: Millis,
) -> Result<bool, StoreError> {
    tx.lock_set(set)?;
    let Some(r) = tx.opt("SELECT overlays FROM sets WHERE id = ?1", &[&set])? else { return Ok(false) };
    let shots: i64 = tx
        .opt("SELECT count(DISTINCT set_position) FROM tasks WHERE set_id = ?1", &[&set])?
        .map(|r| r.get(0))
        .transpose()?
        .unwrap_or(0);
    let Ok(at) = usize::try_from(position) else { return Ok(false) };
    if position >= shots {
        return Ok(false);
    }
    let mut all = crate::store::sets::parse_overlays(r.get::<Option<String>>(0)?.as_deref());
    if all.len() <= at {
        all.resize(at + 1, None);
    }
    all[at] = overlay.cloned();
    let text = all.iter().any(Option::is_some).then(|| serde_json::json!(all).to_string());
    tx.exec("UPDATE sets SET overlays = ?2, updated_at = ?3 WHERE id = ?1", &[&set, &text, &now])?;
    let n = (position + 1).to_string();
    let line = match overlay {
        Some(o) => {
            crate::domain::words::say_with("say.set_words_changed", &[("n", &n), ("lines", &o.lines.join(" / "))])
        }
        None => crate::domain::words::say_with("say.set_words_removed", &[("n", &n)]),
    };
    super::choice::set_event(tx, set, now, "edited", &line)?;
    Ok(true)
}
