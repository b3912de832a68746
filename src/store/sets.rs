//! Product image sets and reference uploads.
//!
//! **One shot at a time per set.** A shot's envelope is created unscheduled (`due_at NULL`)
//! while another shot of its set is scheduled; [`schedule_next_shot`] runs inside every
//! transaction that settles a task (terminal or `unknown`) and makes the next unscheduled
//! shot due, so the chain advances without polling and shots of other sets and single tasks
//! interleave between shots.

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde_json::Value;

use super::blobs::{NewImage, insert_blob};
use super::ops::{NewTask, ShotRef, SubmitOutcome, event, new_id, replay_of, submit};
use super::read::{TaskView, get_task};
use super::{SqliteStore, StoreError};
use crate::domain::{Actor, Millis, TaskStatus, request_hash};

/// The shot roles a set may list.
pub const SHOT_ROLES: &[&str] = &["main", "selling_point", "scene"];

/// An uploaded reference image (its bytes are the blob with the same id).
#[derive(Debug, Clone, Serialize)]
pub struct UploadView {
    pub id: String,
    pub sha256: String,
    pub bytes: i64,
    pub media_type: String,
    pub created_at: Millis,
}

/// One shot of a new set.
#[derive(Debug, Clone)]
pub struct NewShot {
    pub role: String,
    pub prompt: String,
    pub params: Value,
    /// How many candidate images to make (1 to [`super::choice::MAX_CANDIDATES`]).
    pub candidates: u32,
}

/// A set to create.
#[derive(Debug, Clone)]
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
                // A shot of one candidate hashes as before candidates existed (keys stay valid).
                if s.candidates == 1 {
                    serde_json::json!({"role": s.role, "prompt": s.prompt, "params": s.params})
                } else {
                    serde_json::json!({"role": s.role, "prompt": s.prompt, "params": s.params, "candidates": s.candidates})
                }
            })
            .collect();
        let extra = serde_json::json!({"style": self.style, "references": self.references, "shots": shots});
        request_hash(&self.provider, &self.product, &Value::Null, &extra.to_string())
    }

    /// The first entry of a new set's timeline.
    pub(in crate::store) fn created_message(&self) -> String {
        let tasks: u32 = self.shots.iter().map(|s| s.candidates.max(1)).sum();
        format!("set created with {} shot(s), {tasks} image(s) to generate", self.shots.len())
    }

    /// The tasks a new set starts with, in order: every candidate of every shot (one task
    /// each, so each keeps the whole protocol). One list for both backends' `create_set`.
    pub(in crate::store) fn shot_tasks(&self, set_id: &str) -> Vec<NewTask> {
        let mut out = Vec::new();
        for (i, shot) in self.shots.iter().enumerate() {
            for k in 0..shot.candidates.max(1) {
                out.push(NewTask {
                    provider: self.provider.clone(),
                    prompt: self.shot_prompt(shot),
                    params: shot.params.clone(),
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

    /// The prompt a shot's task sends: the shot's own words plus the product and style.
    pub fn shot_prompt(&self, shot: &NewShot) -> String {
        let mut p = format!("{} — product: {}", shot.prompt.trim(), self.product.trim());
        if let Some(style) = self.style.as_deref().filter(|s| !s.trim().is_empty()) {
            p.push_str(&format!("; style: {}", style.trim()));
        }
        p
    }
}

/// A set as the API shows it: its current shots (a retried shot replaced by its retry) and
/// the ids of the tasks they replaced. `shots[i]` is shot i's first candidate (what a shot
/// was before candidates); `candidates[i]` all of its current candidates, the first included;
/// `chosen[i]` the artifact chosen for it.
#[derive(Debug, Clone, Serialize)]
pub struct SetView {
    pub id: String,
    pub product: String,
    pub style: Option<String>,
    pub provider: String,
    pub canceled: bool,
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

/// Whether any shot of the set is scheduled or handed out.
pub(super) fn set_has_live_shot(c: &Connection, set: &str) -> Result<bool, StoreError> {
    Ok(c.prepare_cached(
        "SELECT 1 FROM tasks t JOIN envelopes e ON e.task_id = t.id
         WHERE t.set_id = ?1 AND (e.status = 'sent' OR (e.status = 'pending' AND e.due_at IS NOT NULL)) LIMIT 1",
    )?
    .query_row([set], |_| Ok(()))
    .optional()?
    .is_some())
}

/// After `task` settled: if it belongs to a set with no live shot, schedule the set's next
/// unscheduled shot now.
pub(super) fn schedule_next_shot(c: &Connection, task: &str, now: Millis) -> Result<(), StoreError> {
    let set: Option<String> = c
        .prepare_cached("SELECT set_id FROM tasks WHERE id = ?1")?
        .query_row([task], |r| r.get(0))
        .optional()?
        .flatten();
    match set {
        Some(set) => schedule_next_shot_of(c, &set, now),
        None => Ok(()),
    }
}

/// After a shot of `set` settled: if no shot of it is live, schedule the next unscheduled one
/// now (ready at once, with its place in the fresh lane).
pub(super) fn schedule_next_shot_of(c: &Connection, set: &str, now: Millis) -> Result<(), StoreError> {
    if set_has_live_shot(c, set)? {
        return Ok(());
    }
    let next: Option<String> = c
        .prepare_cached(
            "SELECT t.id FROM tasks t JOIN envelopes e ON e.task_id = t.id
             WHERE t.set_id = ?1 AND e.status = 'pending' AND e.due_at IS NULL AND e.held_at IS NULL
             ORDER BY t.set_position, t.id LIMIT 1",
        )?
        .query_row([set], |r| r.get(0))
        .optional()?;
    if let Some(next) = next {
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "UPDATE envelopes SET due_at = ?2, pass = {} WHERE task_id = ?1",
                crate::store::ops::pass_sql("envelopes.provider", "envelopes.lane", "envelopes.fair_key", "?2", "?2")
            )
        });
        c.prepare_cached(&SQL)?.execute(params![next, now])?;
        event(
            c,
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

/// Record an uploaded image (its row and its bytes, in one transaction), or return the
/// existing upload with the same content (then nothing is stored).
pub(super) fn save_upload(c: &Connection, img: &NewImage, now: Millis) -> Result<UploadView, StoreError> {
    if let Some(existing) = upload_by_hash(c, img.sha256())? {
        return Ok(existing);
    }
    let u = UploadView {
        id: new_id(),
        sha256: img.sha256().to_string(),
        bytes: img.len(),
        media_type: img.media_type().to_string(),
        created_at: now,
    };
    insert_blob(c, &u.id, img)?;
    c.prepare_cached("INSERT INTO uploads (id, sha256, bytes, media_type, created_at) VALUES (?1, ?2, ?3, ?4, ?5)")?
        .execute(params![u.id, u.sha256, u.bytes, u.media_type, u.created_at])?;
    Ok(u)
}

const UPLOAD_COLUMNS: &str = "id, sha256, bytes, media_type, created_at";

fn upload_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<UploadView> {
    Ok(UploadView { id: r.get(0)?, sha256: r.get(1)?, bytes: r.get(2)?, media_type: r.get(3)?, created_at: r.get(4)? })
}

/// An upload by content hash.
pub fn upload_by_hash(c: &Connection, sha256: &str) -> Result<Option<UploadView>, StoreError> {
    Ok(c.prepare_cached(&format!("SELECT {UPLOAD_COLUMNS} FROM uploads WHERE sha256 = ?1"))?
        .query_row([sha256], upload_row)
        .optional()?)
}

/// An upload by id.
pub fn upload(c: &Connection, id: &str) -> Result<Option<UploadView>, StoreError> {
    Ok(c.prepare_cached(&format!("SELECT {UPLOAD_COLUMNS} FROM uploads WHERE id = ?1"))?
        .query_row([id], upload_row)
        .optional()?)
}

/// An upload with the product of the first set that uses it (what its download is named
/// after).
pub fn upload_for_download(c: &Connection, id: &str) -> Result<Option<(UploadView, Option<String>)>, StoreError> {
    let Some(u) = upload(c, id)? else { return Ok(None) };
    let product = c
        .prepare_cached(
            "SELECT s.product FROM set_references r JOIN sets s ON s.id = r.set_id WHERE r.upload_id = ?1
             ORDER BY s.id LIMIT 1",
        )?
        .query_row([id], |r| r.get(0))
        .optional()?;
    Ok(Some((u, product)))
}

/// The reference images of a set (sent with each of its shots), in order.
pub fn references_of_set(c: &Connection, set: &str) -> Result<Vec<UploadView>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT u.id, u.sha256, u.bytes, u.media_type, u.created_at
         FROM set_references r JOIN uploads u ON u.id = r.upload_id WHERE r.set_id = ?1 ORDER BY r.position",
    )?;
    Ok(stmt.query_map([set], upload_row)?.collect::<Result<_, _>>()?)
}

/// Create a set: the set row, its references, and one task (with its envelope) per shot,
/// the first due now and the rest unscheduled — all in one transaction.
pub(super) fn create_set(c: &Connection, s: &NewSet, now: Millis) -> Result<SubmitOutcome, StoreError> {
    let hash = s.hash();
    if let Some(seen) = replay_of(c, "sets", s.idempotency_key.as_deref(), &hash)? {
        return Ok(seen);
    }
    for r in &s.references {
        if upload(c, r)?.is_none() {
            return Err(StoreError::Invalid(format!("no upload with id {r}")));
        }
    }
    let id = new_id();
    c.prepare_cached(
        "INSERT INTO sets (id, idempotency_key, request_hash, product, style, provider, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
    )?
    .execute(params![id, s.idempotency_key, hash, s.product, s.style, s.provider, now])?;
    for (i, r) in s.references.iter().enumerate() {
        c.prepare_cached("INSERT INTO set_references (set_id, position, upload_id) VALUES (?1, ?2, ?3)")?
            .execute(params![id, i as i64, r])?;
    }
    for t in s.shot_tasks(&id) {
        submit(&mut crate::store::sqlite_tx::SqliteTx::new(c), &t, now)?;
    }
    super::choice::set_event(c, &id, now, "created", &s.created_message())?;
    Ok(SubmitOutcome::Created(id))
}

/// Cancel a set: every shot not yet called is canceled; a running shot finishes honestly.
/// Returns how many shots were canceled, or `None` if there is no such set.
pub(super) fn cancel_set(c: &Connection, set: &str, now: Millis) -> Result<Option<usize>, StoreError> {
    let n =
        c.prepare_cached("UPDATE sets SET canceled = 1, updated_at = ?2 WHERE id = ?1")?.execute(params![set, now])?;
    if n == 0 {
        return Ok(None);
    }
    let waiting: Vec<String> = c
        .prepare_cached(
            "SELECT id FROM tasks WHERE set_id = ?1 AND status IN ('queued', 'waiting') ORDER BY set_position",
        )?
        .query_map([set], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for t in &waiting {
        super::ops::user::cancel(&mut crate::store::sqlite_tx::SqliteTx::new(c), t, now)?;
    }
    Ok(Some(waiting.len()))
}

/// A set with its current shots.
pub fn get_set(c: &Connection, id: &str) -> Result<Option<SetView>, StoreError> {
    let row = c
        .prepare_cached(
            "SELECT id, product, style, provider, canceled, created_at, updated_at FROM sets WHERE id = ?1",
        )?
        .query_row([id], |r| {
            Ok(SetView {
                id: r.get(0)?,
                product: r.get(1)?,
                style: r.get(2)?,
                provider: r.get(3)?,
                canceled: r.get(4)?,
                created_at: r.get(5)?,
                updated_at: r.get(6)?,
                references: Vec::new(),
                shots: Vec::new(),
                candidates: Vec::new(),
                chosen: Vec::new(),
                replaced: Vec::new(),
                timeline: Vec::new(),
            })
        })
        .optional()?;
    let Some(mut set) = row else { return Ok(None) };
    set.references = references_of_set(c, id)?;
    let rows: Vec<(String, i64, i64)> = c
        .prepare_cached(
            "SELECT id, set_position, candidate FROM tasks WHERE set_id = ?1 ORDER BY set_position, candidate, id",
        )?
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let choices = super::choice::choices(c, id)?;
    set.fill(&rows, &choices, |t| get_task(c, t))?;
    set.timeline = super::choice::set_events(c, id)?;
    Ok(Some(set))
}

/// Sets newest first, after the cursor `before` (a set id).
pub fn list_sets(c: &Connection, before: Option<&str>, limit: usize) -> Result<Vec<SetView>, StoreError> {
    let ids: Vec<String> = c
        .prepare_cached("SELECT id FROM sets WHERE id < ?1 ORDER BY id DESC LIMIT ?2")?
        .query_map(params![before.unwrap_or("\u{10ffff}"), limit as i64], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(s) = get_set(c, &id)? {
            out.push(s);
        }
    }
    Ok(out)
}

/// A set's status, derived from its current shots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SetStatus {
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
    let mut progress = format!("{done} of {n} done");
    for (k, label) in [(unknown, "unknown"), (failed, "failed"), (canceled, "canceled")] {
        if k > 0 {
            progress.push_str(&format!(", {k} {label}"));
        }
    }
    let status = if settled < n {
        SetStatus::Running
    } else if set.canceled {
        SetStatus::Canceled
    } else if done == n {
        SetStatus::Done
    } else {
        SetStatus::DoneWithProblems
    };
    let message = match status {
        SetStatus::Running if set.canceled => {
            "Canceling: shots not yet sent were canceled; the one already at the provider will finish and be kept.".into()
        }
        SetStatus::Running => "Generating one image at a time.".into(),
        SetStatus::Done => "All images are ready.".into(),
        SetStatus::Canceled => "Canceled. Images already generated are kept.".into(),
        SetStatus::DoneWithProblems if unknown > 0 => "Finished, but some results cannot be confirmed (unknown) \
             or failed; tally will not regenerate them on its own. Retrying a shot is a new operation that may be charged."
            .into(),
        SetStatus::DoneWithProblems => "Finished, but some shots did not produce an image.".into(),
    };
    (status, progress, message)
}

impl SqliteStore {
    /// Store an uploaded image (deduplicated by content): its row and bytes in one commit.
    pub async fn save_upload(&self, img: NewImage, now: Millis) -> Result<UploadView, StoreError> {
        self.write_images(img.len() as usize, move |c| save_upload(c, &img, now)).await
    }

    /// Create a set with its shots.
    pub async fn create_set(&self, s: NewSet, now: Millis) -> Result<SubmitOutcome, StoreError> {
        self.write(move |c| create_set(c, &s, now)).await
    }

    /// Cancel a set's unsent shots.
    pub async fn cancel_set(&self, id: String, now: Millis) -> Result<Option<usize>, StoreError> {
        self.write(move |c| cancel_set(c, &id, now)).await
    }

    /// A set with its current shots.
    pub async fn get_set(&self, id: String) -> Result<Option<SetView>, StoreError> {
        self.read(move |c| get_set(c, &id)).await
    }

    /// Sets newest first.
    pub async fn list_sets(&self, before: Option<String>, limit: usize) -> Result<Vec<SetView>, StoreError> {
        self.read(move |c| list_sets(c, before.as_deref(), limit)).await
    }

    /// An upload by id.
    pub async fn upload(&self, id: String) -> Result<Option<UploadView>, StoreError> {
        self.read(move |c| upload(c, &id)).await
    }

    /// An upload with the product its download is named after.
    pub async fn upload_for_download(&self, id: String) -> Result<Option<(UploadView, Option<String>)>, StoreError> {
        self.read(move |c| upload_for_download(c, &id)).await
    }
}
