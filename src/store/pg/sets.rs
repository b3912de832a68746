//! Image sets and reference uploads on PostgreSQL, with the SQLite semantics of
//! `store::sets`. **One shot at a time per set** needs one more rule here: every decision
//! about a set's schedule (a shot's submit or retry, a settled shot's successor, cancel)
//! first locks the set row, so two nodes never both see "no live shot".

use postgres::Row;

use super::ops::{event, new_id, set_replay};
use super::{PgStore, Tx};
use crate::domain::{Actor, Millis};
use crate::store::{NewImage, NewSet, SetView, StoreError, SubmitOutcome, UploadView};

/// Lock a set's row (rule L for set operations: set before envelope).
pub(super) fn lock_set(tx: &mut Tx<'_, '_>, set: &str) -> Result<bool, StoreError> {
    Ok(tx.opt("SELECT 1 FROM sets WHERE id = $1 FOR UPDATE", &[&set])?.is_some())
}

/// Whether any shot of the set is scheduled or handed out.
pub(super) fn set_has_live_shot(tx: &mut Tx<'_, '_>, set: &str) -> Result<bool, StoreError> {
    Ok(tx
        .opt(
            "SELECT 1 FROM tasks t JOIN envelopes e ON e.task_id = t.id
             WHERE t.set_id = $1 AND (e.status = 'sent' OR (e.status = 'pending' AND e.due_at IS NOT NULL)) LIMIT 1",
            &[&set],
        )?
        .is_some())
}

/// After `task` settled: if it belongs to a set with no live shot, schedule the set's next
/// unscheduled shot now.
pub(super) fn schedule_next_shot(tx: &mut Tx<'_, '_>, task: &str, now: Millis) -> Result<(), StoreError> {
    let set: Option<String> = tx.opt("SELECT set_id FROM tasks WHERE id = $1", &[&task])?.and_then(|r| r.get(0));
    let Some(set) = set else { return Ok(()) };
    lock_set(tx, &set)?;
    if set_has_live_shot(tx, &set)? {
        return Ok(());
    }
    let next: Option<String> = tx
        .opt(
            "SELECT t.id FROM tasks t JOIN envelopes e ON e.task_id = t.id
             WHERE t.set_id = $1 AND e.status = 'pending' AND e.due_at IS NULL AND e.held_at IS NULL
             ORDER BY t.set_position, t.id LIMIT 1",
            &[&set],
        )?
        .map(|r| r.get(0));
    if let Some(next) = next {
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "UPDATE envelopes SET due_at = $2, pass = {} WHERE task_id = $1",
                super::ops::pass_sql(
                    "envelopes.provider",
                    "envelopes.lane",
                    "envelopes.fair_key",
                    "$2::bigint",
                    "$2::bigint"
                )
            )
        });
        tx.exec(SQL.as_str(), &[&next, &now])?;
        event(
            tx,
            &next,
            now,
            Actor::Dispatcher,
            "scheduled",
            "the previous shot of the set is settled; this one is next",
            None,
        )?;
    }
    Ok(())
}

fn upload_row(r: &Row) -> UploadView {
    UploadView { id: r.get(0), sha256: r.get(1), bytes: r.get(2), media_type: r.get(3), created_at: r.get(4) }
}

/// Record an uploaded image (its row and its bytes, in one transaction), or return the
/// existing upload with the same content (a concurrent insert of the same content on another
/// node makes this one retry and find it).
fn save_upload(tx: &mut Tx<'_, '_>, img: &NewImage, now: Millis) -> Result<UploadView, StoreError> {
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
    super::ops::insert_blob(tx, &u.id, img)?;
    tx.exec(
        "INSERT INTO uploads (id, sha256, bytes, media_type, created_at) VALUES ($1, $2, $3, $4, $5)",
        &[&u.id, &u.sha256, &u.bytes, &u.media_type, &u.created_at],
    )?;
    Ok(u)
}

/// An upload with the product of the first set that uses it (what its download is named
/// after).
fn upload_for_download(tx: &mut Tx<'_, '_>, id: &str) -> Result<Option<(UploadView, Option<String>)>, StoreError> {
    let Some(u) = upload(tx, id)? else { return Ok(None) };
    let product = tx
        .opt(
            "SELECT s.product FROM set_references r JOIN sets s ON s.id = r.set_id WHERE r.upload_id = $1
             ORDER BY s.id LIMIT 1",
            &[&id],
        )?
        .map(|r| r.get(0));
    Ok(Some((u, product)))
}

fn upload_by_hash(tx: &mut Tx<'_, '_>, sha256: &str) -> Result<Option<UploadView>, StoreError> {
    Ok(tx
        .opt("SELECT id, sha256, bytes, media_type, created_at FROM uploads WHERE sha256 = $1", &[&sha256])?
        .map(|r| upload_row(&r)))
}

fn upload(tx: &mut Tx<'_, '_>, id: &str) -> Result<Option<UploadView>, StoreError> {
    Ok(tx
        .opt("SELECT id, sha256, bytes, media_type, created_at FROM uploads WHERE id = $1", &[&id])?
        .map(|r| upload_row(&r)))
}

/// The reference images of a set (sent with each of its shots), in order.
pub(super) fn references_of_set(tx: &mut Tx<'_, '_>, set: &str) -> Result<Vec<UploadView>, StoreError> {
    Ok(tx
        .rows(
            "SELECT u.id, u.sha256, u.bytes, u.media_type, u.created_at
             FROM set_references r JOIN uploads u ON u.id = r.upload_id WHERE r.set_id = $1 ORDER BY r.position",
            &[&set],
        )?
        .iter()
        .map(upload_row)
        .collect())
}

/// Create a set: the set row, its references, and one task (with its envelope) per shot,
/// the first due now and the rest unscheduled, all in one transaction.
fn create_set(tx: &mut Tx<'_, '_>, s: &NewSet, now: Millis) -> Result<SubmitOutcome, StoreError> {
    let hash = s.hash();
    if let Some(seen) = set_replay(tx, s.idempotency_key.as_deref(), &hash)? {
        return Ok(seen);
    }
    // Each named photo is locked (`FOR KEY SHARE`, which only a delete conflicts with) before
    // it is checked: a prune deleting it either finished first (then it is gone, said
    // plainly) or waits until this set, which keeps it, is committed (`pg::prune`).
    for r in &s.references {
        if tx.opt("SELECT 1 FROM uploads WHERE id = $1 FOR KEY SHARE", &[r])?.is_none() {
            return Err(StoreError::Invalid(format!("no upload with id {r}")));
        }
    }
    let id = new_id();
    tx.exec(
        "INSERT INTO sets (id, idempotency_key, request_hash, product, style, provider, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $7)",
        &[&id, &s.idempotency_key, &hash, &s.product, &s.style, &s.provider, &now],
    )?;
    for (i, r) in s.references.iter().enumerate() {
        tx.exec(
            "INSERT INTO set_references (set_id, position, upload_id) VALUES ($1, $2, $3)",
            &[&id, &(i as i64), r],
        )?;
    }
    for t in s.shot_tasks(&id) {
        crate::store::ops::submit(tx, &t, now)?;
    }
    super::choice::set_event(tx, &id, now, "created", &s.created_message())?;
    Ok(SubmitOutcome::Created(id))
}

/// Cancel a set: every shot not yet called is canceled; a running shot finishes honestly.
/// Returns how many shots were canceled, or `None` if there is no such set.
fn cancel_set(tx: &mut Tx<'_, '_>, set: &str, now: Millis) -> Result<Option<usize>, StoreError> {
    if !lock_set(tx, set)? {
        return Ok(None);
    }
    tx.exec("UPDATE sets SET canceled = true, updated_at = $2 WHERE id = $1", &[&set, &now])?;
    let waiting: Vec<String> = tx
        .rows(
            "SELECT id FROM tasks WHERE set_id = $1 AND status IN ('queued', 'waiting') ORDER BY set_position",
            &[&set],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut canceled = 0;
    for t in &waiting {
        // Locked one by one: a shot that started meanwhile is left to finish honestly.
        if crate::store::ops::user::cancel(tx, t, now)? == crate::store::CancelOutcome::Canceled {
            canceled += 1;
        }
    }
    Ok(Some(canceled))
}

/// A set with its current shots.
pub(super) fn get_set(tx: &mut Tx<'_, '_>, id: &str) -> Result<Option<SetView>, StoreError> {
    let row = tx
        .opt("SELECT id, product, style, provider, canceled, created_at, updated_at FROM sets WHERE id = $1", &[&id])?;
    let Some(r) = row else { return Ok(None) };
    let mut set = SetView {
        id: r.get(0),
        product: r.get(1),
        style: r.get(2),
        provider: r.get(3),
        canceled: r.get(4),
        created_at: r.get(5),
        updated_at: r.get(6),
        references: Vec::new(),
        shots: Vec::new(),
        candidates: Vec::new(),
        chosen: Vec::new(),
        replaced: Vec::new(),
        timeline: Vec::new(),
    };
    set.references = references_of_set(tx, id)?;
    let rows: Vec<(String, i64, i64)> = tx
        .rows(
            "SELECT id, set_position, candidate FROM tasks WHERE set_id = $1 ORDER BY set_position, candidate, id",
            &[&id],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let choices = super::choice::choices(tx, id)?;
    set.fill(&rows, &choices, |t| crate::store::read::task(tx, t))?;
    set.timeline = super::choice::set_events(tx, id)?;
    Ok(Some(set))
}

/// Sets newest first, after the cursor `before` (a set id).
fn list_sets(tx: &mut Tx<'_, '_>, before: Option<&str>, limit: usize) -> Result<Vec<SetView>, StoreError> {
    let ids: Vec<String> = tx
        .rows(
            "SELECT id FROM sets WHERE id < $1 ORDER BY id DESC LIMIT $2",
            &[&before.unwrap_or("\u{10ffff}"), &(limit as i64)],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(s) = get_set(tx, &id)? {
            out.push(s);
        }
    }
    Ok(out)
}

impl PgStore {
    /// Store an uploaded image (deduplicated by content): its row and bytes in one commit.
    pub async fn save_upload(&self, img: NewImage, now: Millis) -> Result<UploadView, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            save_upload(tx, &img, now)
        })
        .await
    }

    /// An upload with the product its download is named after.
    pub async fn upload_for_download(&self, id: String) -> Result<Option<(UploadView, Option<String>)>, StoreError> {
        self.read(move |tx| upload_for_download(tx, &id)).await
    }

    /// Create a set with its shots.
    pub async fn create_set(&self, s: NewSet, now: Millis) -> Result<SubmitOutcome, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            create_set(tx, &s, now)
        })
        .await
    }

    /// Cancel a set's unsent shots.
    pub async fn cancel_set(&self, id: String, now: Millis) -> Result<Option<usize>, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            cancel_set(tx, &id, now)
        })
        .await
    }

    /// A set with its current shots.
    pub async fn get_set(&self, id: String) -> Result<Option<SetView>, StoreError> {
        self.read(move |tx| get_set(tx, &id)).await
    }

    /// Sets newest first.
    pub async fn list_sets(&self, before: Option<String>, limit: usize) -> Result<Vec<SetView>, StoreError> {
        self.read(move |tx| list_sets(tx, before.as_deref(), limit)).await
    }

    /// An upload by id.
    pub async fn upload(&self, id: String) -> Result<Option<UploadView>, StoreError> {
        self.read(move |tx| upload(tx, &id)).await
    }
}
