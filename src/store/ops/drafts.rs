//! Drafts (issue #36), written once over [`Tx`]: a draft with its photos and its first
//! revision — the drafting task, submitted in the same transaction (the outbox write) —, the
//! owner's edits and redrafts as new revisions (a stale revision refused), and the
//! confirmation of one revision, which creates the whole image set in one transaction and
//! links the two. The store keeps rows; what a revision says (`domain::draft`) is read above.
//!
//! **One decision at a time per draft.** Every change first locks the draft's row (PostgreSQL
//! `FOR UPDATE`; SQLite's single writer needs none), so two edits of the same revision, or two
//! confirmations, are decided one after the other: the second sees the first.

use super::common::{Keyed, by_dialect, new_id, replay_of};
use super::{NewTask, SubmitOutcome, submit};
use crate::domain::{Millis, request_hash};
use crate::store::NewSet;
use crate::store::tx::{Row, Tx};
use crate::store::{StoreError, TaskView, UploadView};

/// A draft to create, with its first drafting task.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct NewDraft {
    pub product: String,
    /// Upload ids, in order.
    pub photos: Vec<String>,
    /// The owner's facts, in order.
    pub facts: Vec<(String, String)>,
    pub marketplace: Option<String>,
    pub language: String,
    pub provider: String,
    pub idempotency_key: Option<String>,
    /// The drafting call (operation `draft`).
    pub task: NewTask,
}

impl NewDraft {
    fn hash(&self) -> String {
        let extra = serde_json::json!({
            "photos": self.photos, "facts": self.facts, "marketplace": self.marketplace, "language": self.language
        });
        request_hash(&self.provider, &self.product, &serde_json::Value::Null, &extra.to_string())
    }
}

/// A stored answer to a drafting call.
#[derive(Debug, Clone)]
pub struct AnswerView {
    /// The model's text as received.
    pub body: String,
    /// JSON `{input_tokens, output_tokens}`.
    pub usage: String,
    /// Whether it matched tally's schema.
    pub valid: bool,
}

/// One revision of a draft: a model's (its task, and its answer once one came) or the
/// owner's (its body).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct RevisionView {
    pub revision: i64,
    pub task: Option<TaskView>,
    pub answer: Option<AnswerView>,
    /// The owner's revision: the whole draft as JSON.
    pub body: Option<String>,
    pub created_at: Millis,
}

/// A draft as stored, with every revision, oldest first.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct DraftView {
    pub id: String,
    pub product: String,
    pub photos: Vec<UploadView>,
    pub facts: Vec<(String, String)>,
    pub marketplace: Option<String>,
    pub language: String,
    pub provider: String,
    pub set_id: Option<String>,
    pub confirmed_revision: Option<i64>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub revisions: Vec<RevisionView>,
}

/// What a change to a draft did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum DraftChange {
    /// No such draft.
    NotFound,
    /// The revision named is not the latest (`latest` is).
    Stale { latest: i64 },
    /// The draft was confirmed already; nothing changes (its set).
    Confirmed(String),
    /// The new revision's number.
    Revised(i64),
}

/// What a confirmation did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ConfirmOutcome {
    NotFound,
    /// The revision named is not the latest (`latest` is).
    Stale {
        latest: i64,
    },
    /// The set this confirmation made (`created`), or the one an earlier one made.
    Set {
        id: String,
        created: bool,
    },
}

/// A drafting task's photos (what its claim sends), in order.
pub(in crate::store) fn photos_of_task(tx: &mut dyn Tx, task: &str) -> Result<Vec<UploadView>, StoreError> {
    tx.rows(
        "SELECT u.id, u.sha256, u.bytes, u.media_type, u.created_at
         FROM draft_revisions r JOIN draft_photos p ON p.draft_id = r.draft_id JOIN uploads u ON u.id = p.upload_id
         WHERE r.task_id = ?1 ORDER BY p.position",
        &[&task],
    )?
    .iter()
    .map(upload_row)
    .collect()
}

fn upload_row(r: &Row) -> Result<UploadView, StoreError> {
    Ok(UploadView { id: r.get(0)?, sha256: r.get(1)?, bytes: r.get(2)?, media_type: r.get(3)?, created_at: r.get(4)? })
}

/// Create a draft: its row, its photos, its drafting task (with its envelope) and revision 1
/// naming that task, in one transaction. The same key with the same request answers the
/// draft it made (`Existing`), with another request `Conflict`.
pub(in crate::store) fn create_draft(tx: &mut dyn Tx, d: &NewDraft, now: Millis) -> Result<SubmitOutcome, StoreError> {
    let hash = d.hash();
    if let Some(seen) = replay_of(tx, Keyed::Drafts, d.idempotency_key.as_deref(), &hash)? {
        return Ok(seen);
    }
    let photo =
        by_dialect(tx, "SELECT 1 FROM uploads WHERE id = ?1", "SELECT 1 FROM uploads WHERE id = ?1 FOR KEY SHARE");
    for p in &d.photos {
        if tx.opt(photo, &[p])?.is_none() {
            return Err(StoreError::Invalid(format!("no upload with id {p}")));
        }
    }
    let id = new_id();
    let facts = serde_json::to_string(&d.facts).unwrap_or_else(|_| "[]".into());
    tx.exec(
        "INSERT INTO drafts (id, idempotency_key, request_hash, product, facts, marketplace, language, provider,
                             created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)",
        &[&id, &d.idempotency_key, &hash, &d.product, &facts, &d.marketplace, &d.language, &d.provider, &now],
    )?;
    for (i, p) in d.photos.iter().enumerate() {
        tx.exec(
            "INSERT INTO draft_photos (draft_id, position, upload_id) VALUES (?1, ?2, ?3)",
            &[&id, &(i as i64), p],
        )?;
    }
    let task = submit(tx, &d.task, now)?;
    tx.exec(
        "INSERT INTO draft_revisions (draft_id, revision, task_id, created_at) VALUES (?1, 1, ?2, ?3)",
        &[&id, &task.task_id(), &now],
    )?;
    Ok(SubmitOutcome::Created(id))
}

/// Lock a draft's row (PostgreSQL) and read its latest revision and its set; `None`: no such
/// draft.
fn lock(tx: &mut dyn Tx, id: &str) -> Result<Option<(i64, Option<String>)>, StoreError> {
    let sql =
        by_dialect(tx, "SELECT set_id FROM drafts WHERE id = ?1", "SELECT set_id FROM drafts WHERE id = ?1 FOR UPDATE");
    let Some(r) = tx.opt(sql, &[&id])? else { return Ok(None) };
    let set: Option<String> = r.get(0)?;
    let latest: i64 =
        tx.one("SELECT COALESCE(MAX(revision), 0) FROM draft_revisions WHERE draft_id = ?1", &[&id])?.get(0)?;
    Ok(Some((latest, set)))
}

/// A new revision after `base` (which must be the latest): the owner's `body`, or a redraft's
/// `task` (submitted in the same transaction).
pub(in crate::store) fn revise(
    tx: &mut dyn Tx,
    id: &str,
    base: i64,
    body: Option<&str>,
    task: Option<&NewTask>,
    now: Millis,
) -> Result<DraftChange, StoreError> {
    let Some((latest, set)) = lock(tx, id)? else { return Ok(DraftChange::NotFound) };
    if let Some(set) = set {
        return Ok(DraftChange::Confirmed(set));
    }
    if base != latest {
        return Ok(DraftChange::Stale { latest });
    }
    let task_id = match task {
        Some(t) => Some(submit(tx, t, now)?.task_id().to_string()),
        None => None,
    };
    let next = latest + 1;
    tx.exec(
        "INSERT INTO draft_revisions (draft_id, revision, task_id, body, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
        &[&id, &next, &task_id, &body, &now],
    )?;
    tx.exec("UPDATE drafts SET updated_at = ?2 WHERE id = ?1", &[&id, &now])?;
    Ok(DraftChange::Revised(next))
}

/// Confirm revision `revision` (the latest): create `set` — its shots, candidates and
/// references — and link it both ways, in one transaction. A draft confirmed before answers
/// its set, whatever revision is named.
pub(in crate::store) fn confirm(
    tx: &mut dyn Tx,
    id: &str,
    revision: i64,
    set: &NewSet,
    now: Millis,
) -> Result<ConfirmOutcome, StoreError> {
    let Some((latest, existing)) = lock(tx, id)? else { return Ok(ConfirmOutcome::NotFound) };
    if let Some(set) = existing {
        return Ok(ConfirmOutcome::Set { id: set, created: false });
    }
    if revision != latest {
        return Ok(ConfirmOutcome::Stale { latest });
    }
    let set_id = match super::sets::create_set(tx, set, now)? {
        SubmitOutcome::Created(s) | SubmitOutcome::Existing(s) | SubmitOutcome::Conflict(s) => s,
    };
    // Crash matrix: the set and its tasks are written, the link not yet; nothing is committed.
    crate::failpoint::crash("confirm-before-link");
    tx.exec("UPDATE sets SET draft_id = ?2, draft_revision = ?3 WHERE id = ?1", &[&set_id, &id, &revision])?;
    tx.exec(
        "UPDATE drafts SET set_id = ?2, confirmed_revision = ?3, updated_at = ?4 WHERE id = ?1",
        &[&id, &set_id, &revision, &now],
    )?;
    Ok(ConfirmOutcome::Set { id: set_id, created: true })
}

/// A draft with its photos and revisions.
pub(in crate::store) fn get_draft(tx: &mut dyn Tx, id: &str) -> Result<Option<DraftView>, StoreError> {
    let row = tx.opt(
        "SELECT id, product, facts, marketplace, language, provider, set_id, confirmed_revision, created_at, updated_at
         FROM drafts WHERE id = ?1",
        &[&id],
    )?;
    let Some(r) = row else { return Ok(None) };
    let facts: String = r.get(2)?;
    let mut d = DraftView {
        id: r.get(0)?,
        product: r.get(1)?,
        photos: Vec::new(),
        facts: serde_json::from_str(&facts).unwrap_or_default(),
        marketplace: r.get(3)?,
        language: r.get(4)?,
        provider: r.get(5)?,
        set_id: r.get(6)?,
        confirmed_revision: r.get(7)?,
        created_at: r.get(8)?,
        updated_at: r.get(9)?,
        revisions: Vec::new(),
    };
    d.photos = tx
        .rows(
            "SELECT u.id, u.sha256, u.bytes, u.media_type, u.created_at
             FROM draft_photos p JOIN uploads u ON u.id = p.upload_id WHERE p.draft_id = ?1 ORDER BY p.position",
            &[&id],
        )?
        .iter()
        .map(upload_row)
        .collect::<Result<_, _>>()?;
    let revs = tx
        .rows(
            "SELECT r.revision, r.task_id, r.body, r.created_at, a.body, a.usage, a.valid
             FROM draft_revisions r LEFT JOIN answers a ON a.task_id = r.task_id
             WHERE r.draft_id = ?1 ORDER BY r.revision",
            &[&id],
        )?
        .iter()
        .map(|r| {
            let answer = match r.get::<Option<String>>(4)? {
                Some(body) => Some(AnswerView { body, usage: r.get(5)?, valid: r.get(6)? }),
                None => None,
            };
            Ok((
                r.get::<i64>(0)?,
                r.get::<Option<String>>(1)?,
                r.get::<Option<String>>(2)?,
                r.get::<Millis>(3)?,
                answer,
            ))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    for (revision, task, body, created_at, answer) in revs {
        let task = match task {
            Some(t) => crate::store::read::task(tx, &t)?,
            None => None,
        };
        d.revisions.push(RevisionView { revision, task, answer, body, created_at });
    }
    Ok(Some(d))
}

/// Drafts newest first, after the cursor `before` (a draft id).
pub(in crate::store) fn list_drafts(
    tx: &mut dyn Tx,
    before: Option<&str>,
    limit: usize,
) -> Result<Vec<DraftView>, StoreError> {
    let ids = tx
        .rows(
            "SELECT id FROM drafts WHERE id < ?1 ORDER BY id DESC LIMIT ?2",
            &[&before.unwrap_or("\u{10ffff}"), &(limit as i64)],
        )?
        .iter()
        .map(|r| r.get::<String>(0))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(d) = get_draft(tx, &id)? {
            out.push(d);
        }
    }
    Ok(out)
}
