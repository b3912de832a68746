//! Read queries on PostgreSQL: task views, timelines, artifacts, counts and the
//! reconciler's next deadline, each in one read-only snapshot. Same answers as `store::read`.

use postgres::Row;

use super::{PgStore, Tx};
use crate::domain::{Millis, TaskStatus};
use crate::store::{ArtifactView, BlobMeta, CHUNK, EventView, StoreError, TaskView};

fn task_row(r: &Row) -> TaskView {
    let status: String = r.get(1);
    let params: String = r.get(9);
    TaskView {
        id: r.get(0),
        status: TaskStatus::parse(&status).unwrap_or(TaskStatus::Failed),
        reason: r.get(2),
        failure_kind: r.get(3),
        attempts: r.get(4),
        // Derived from the executions by `with_artifacts` (column 5 is unused since schema 2).
        charge: crate::store::ChargeSummary::default(),
        retried_as: None,
        cancel_requested: r.get(6),
        provider: r.get(7),
        prompt: r.get(8),
        params: serde_json::from_str(&params).unwrap_or(serde_json::Value::Null),
        idempotency_key: r.get(10),
        retry_of: r.get(11),
        set_id: r.get(12),
        set_position: r.get(13),
        created_at: r.get(14),
        updated_at: r.get(15),
        shot_role: r.get(16),
        artifacts: Vec::new(),
        group: r.get(17),
        candidate: r.get(18),
        waiting_for: None,
        held: None,
    }
}

fn artifact_row(r: &Row) -> ArtifactView {
    ArtifactView {
        id: r.get(0),
        task_id: r.get(1),
        sha256: r.get(2),
        bytes: r.get(3),
        media_type: r.get(4),
        created_at: r.get(5),
    }
}

fn with_artifacts(tx: &mut Tx<'_, '_>, mut t: TaskView) -> Result<TaskView, StoreError> {
    t.artifacts = tx
        .rows(
            "SELECT id, task_id, sha256, bytes, media_type, created_at FROM artifacts WHERE task_id = $1 ORDER BY created_at",
            &[&t.id],
        )?
        .iter()
        .map(artifact_row)
        .collect();
    t.charge = charge_of(tx, &t.id)?;
    t.retried_as = crate::store::ops::latest_retry(tx, &t.id)?;
    Ok(t)
}

/// A task's charge, from its executions (as `store::read::charge_of`).
pub(super) fn charge_of(tx: &mut Tx<'_, '_>, task: &str) -> Result<crate::store::ChargeSummary, StoreError> {
    let rows = tx
        .rows(
            "SELECT charge, cost_micros, currency, charge_recorded_at IS NOT NULL FROM executions WHERE task_id = $1",
            &[&task],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    crate::store::read::summarize_charges(rows)
}

/// One task with its artifacts.
pub(super) fn get_task(tx: &mut Tx<'_, '_>, id: &str) -> Result<Option<TaskView>, StoreError> {
    let t = tx
        .opt(
            "SELECT id, status, reason, failure_kind, attempts, may_have_charged, cancel_requested, provider,
                    prompt, params, idempotency_key, retry_of, set_id, set_position, created_at, updated_at, shot_role, group_key, candidate
             FROM tasks WHERE id = $1",
            &[&id],
        )?
        .map(|r| task_row(&r));
    t.map(|t| with_artifacts(tx, t).and_then(|t| with_wait(tx, t))).transpose()
}

/// A queued or waiting task's reason says why it waits (as `store::read::with_wait`).
fn with_wait(tx: &mut Tx<'_, '_>, mut t: TaskView) -> Result<TaskView, StoreError> {
    if !matches!(t.status, TaskStatus::Queued | TaskStatus::Waiting) {
        return Ok(t);
    }
    if let Some(h) = super::held::held_of(tx, &t.id)? {
        t.reason = Some(h.reason.clone());
        t.waiting_for = Some(h.reason.clone());
        t.held = Some(h);
        return Ok(t);
    }
    static SQL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| crate::store::read::WAIT_FACTS.replace("?1", "$1"));
    if let Some(r) = tx.opt(SQL.as_str(), &[&t.id])? {
        let f = crate::store::read::WaitFacts {
            pass: r.get(0),
            due: r.get(1),
            lane: r.get(2),
            key: r.get(3),
            paused: r.get(4),
            max: r.get(5),
            reserve: r.get(6),
            busy: r.get(7),
            busy_recovery: r.get(8),
            ahead_key: r.get(9),
            ahead: r.get(10),
            earlier_shots: r.get(11),
        };
        if let Some(why) = crate::store::read::wait_words(&t.provider, &f) {
            t.reason = Some(why.clone());
            t.waiting_for = Some(why);
        }
    }
    Ok(t)
}

/// Tasks newest first, optionally of one status, after the cursor `before` (a task id).
fn list_tasks(
    tx: &mut Tx<'_, '_>,
    filter: &crate::store::TaskFilter,
    before: Option<&str>,
    limit: usize,
) -> Result<Vec<TaskView>, StoreError> {
    let before = before.unwrap_or("\u{10ffff}");
    if filter.needs_attention && filter.status.is_some_and(|s| !matches!(s, TaskStatus::Unknown | TaskStatus::Waiting))
    {
        return Ok(Vec::new());
    }
    let status = filter.status;
    // One statement for every filter: an absent filter is a NULL that matches everything.
    let rows = tx.rows(
        "SELECT id, status, reason, failure_kind, attempts, may_have_charged, cancel_requested, provider,
                prompt, params, idempotency_key, retry_of, set_id, set_position, created_at, updated_at, shot_role, group_key, candidate
         FROM tasks WHERE id < $1
           AND ($3::text IS NULL OR status = $3)
           AND (NOT $4 OR id IN (SELECT u.id FROM tasks u WHERE u.status = 'unknown'
                                   AND NOT EXISTS (SELECT 1 FROM tasks r WHERE r.retry_of = u.id)
                                 UNION ALL
                                 SELECT h.task_id FROM envelopes h WHERE h.status = 'pending' AND h.held_at IS NOT NULL))
           AND ($5::text IS NULL OR strpos(lower(prompt), lower($5)) > 0
                OR set_id IN (SELECT id FROM sets WHERE strpos(lower(product), lower($5)) > 0))
         ORDER BY id DESC LIMIT $2",
        &[&before, &(limit as i64), &status.map(|s| s.as_str()), &filter.needs_attention, &filter.search],
    )?;
    rows.iter().map(|r| with_artifacts(tx, task_row(r)).and_then(|t| with_wait(tx, t))).collect()
}

/// A task's timeline, oldest first.
fn events(tx: &mut Tx<'_, '_>, task: &str) -> Result<Vec<EventView>, StoreError> {
    Ok(tx
        .rows(
            "SELECT id, at, actor, kind, message, execution_token FROM events WHERE task_id = $1 ORDER BY id",
            &[&task],
        )?
        .iter()
        .map(|r| EventView {
            id: r.get(0),
            at: r.get(1),
            actor: r.get(2),
            kind: r.get(3),
            message: r.get(4),
            execution_token: r.get(5),
        })
        .collect())
}

fn artifact(tx: &mut Tx<'_, '_>, id: &str) -> Result<Option<ArtifactView>, StoreError> {
    Ok(tx
        .opt("SELECT id, task_id, sha256, bytes, media_type, created_at FROM artifacts WHERE id = $1", &[&id])?
        .map(|r| artifact_row(&r)))
}

fn next_sent_deadline(tx: &mut Tx<'_, '_>) -> Result<Option<Millis>, StoreError> {
    Ok(tx.one("SELECT min(lease_expires_at) FROM envelopes WHERE status = 'sent'", &[])?.get(0))
}

fn status_counts(tx: &mut Tx<'_, '_>) -> Result<Vec<(TaskStatus, i64)>, StoreError> {
    let mut out = Vec::new();
    for r in tx.rows("SELECT status, count(*) FROM tasks GROUP BY status", &[])? {
        if let Some(s) = TaskStatus::parse(r.get(0)) {
            out.push((s, r.get(1)));
        }
    }
    Ok(out)
}

impl PgStore {
    /// One task with its artifacts.
    pub async fn get_task(&self, id: String) -> Result<Option<TaskView>, StoreError> {
        self.read(move |tx| get_task(tx, &id)).await
    }

    /// Tasks newest first.
    pub async fn list_tasks(
        &self,
        filter: crate::store::TaskFilter,
        before: Option<String>,
        limit: usize,
    ) -> Result<Vec<TaskView>, StoreError> {
        self.read(move |tx| list_tasks(tx, &filter, before.as_deref(), limit)).await
    }

    /// A task's timeline.
    pub async fn events(&self, task: String) -> Result<Vec<EventView>, StoreError> {
        self.read(move |tx| events(tx, &task)).await
    }

    /// One artifact.
    pub async fn artifact(&self, id: String) -> Result<Option<ArtifactView>, StoreError> {
        self.read(move |tx| artifact(tx, &id)).await
    }

    /// Number of tasks per status.
    pub async fn status_counts(&self) -> Result<Vec<(TaskStatus, i64)>, StoreError> {
        self.read(status_counts).await
    }

    /// The reconciler's next deadline (the earliest of every node's sent envelopes).
    pub async fn next_sent_deadline(&self) -> Result<Option<Millis>, StoreError> {
        self.read(next_sent_deadline).await
    }
}

/// What is recorded about the image stored under `id`.
fn blob_meta(tx: &mut Tx<'_, '_>, id: &str) -> Result<Option<BlobMeta>, StoreError> {
    Ok(tx.opt("SELECT id, sha256, bytes, media_type FROM blobs WHERE id = $1", &[&id])?.map(|r| BlobMeta {
        id: r.get(0),
        sha256: r.get(1),
        bytes: r.get(2),
        media_type: r.get(3),
    }))
}

impl PgStore {
    /// What is recorded about the image stored under `id` (an artifact's or an upload's id).
    pub async fn blob_meta(&self, id: String) -> Result<Option<BlobMeta>, StoreError> {
        self.read(move |tx| blob_meta(tx, &id)).await
    }

    /// Up to `len` bytes of image `id` from offset `pos`, in one short read transaction
    /// (`None`: no such image any more). Streaming readers call it chunk by chunk, so no
    /// request holds a whole image or a long transaction.
    pub async fn read_blob_chunk(&self, id: String, pos: usize, len: usize) -> Result<Option<Vec<u8>>, StoreError> {
        let (from, n) = (pos as i64 + 1, len.min(CHUNK) as i64);
        self.read(move |tx| {
            Ok(tx
                .opt(
                    "SELECT substring(data FROM $2::bigint::int FOR $3::bigint::int) FROM blobs WHERE id = $1",
                    &[&id, &from, &n],
                )?
                .map(|r| r.get(0)))
        })
        .await
    }

    /// [`PgStore::blob_meta`] on the current thread (off the async threads).
    pub fn blob_meta_blocking(&self, id: &str) -> Result<Option<BlobMeta>, StoreError> {
        let id = id.to_string();
        self.read_blocking(move |tx| blob_meta(tx, &id))
    }

    /// [`PgStore::read_blob_chunk`] on the current thread (off the async threads).
    pub fn read_blob_chunk_blocking(&self, id: &str, pos: usize, len: usize) -> Result<Option<Vec<u8>>, StoreError> {
        let (id, from, n) = (id.to_string(), pos as i64 + 1, len.min(CHUNK) as i64);
        self.read_blocking(move |tx| {
            Ok(tx
                .opt(
                    "SELECT substring(data FROM $2::bigint::int FOR $3::bigint::int) FROM blobs WHERE id = $1",
                    &[&id, &from, &n],
                )?
                .map(|r| r.get(0)))
        })
    }

    /// The whole image stored under `id`, for small uses that need all of it at once
    /// (references sent to a provider, thumbnails).
    pub async fn read_image_bytes(&self, id: String) -> Result<Option<(BlobMeta, Vec<u8>)>, StoreError> {
        let Some(meta) = self.blob_meta(id.clone()).await? else { return Ok(None) };
        let mut out = Vec::with_capacity(meta.bytes.max(0) as usize);
        while (out.len() as i64) < meta.bytes {
            match self.read_blob_chunk(id.clone(), out.len(), CHUNK).await? {
                Some(chunk) if !chunk.is_empty() => out.extend_from_slice(&chunk),
                Some(_) => {
                    let why =
                        format!("it is shorter ({} bytes) than its recorded size ({} bytes)", out.len(), meta.bytes);
                    return Err(StoreError::Damaged { id, why });
                }
                None => return Err(StoreError::Invalid(format!("image {id} is no longer stored"))),
            }
        }
        // As `BlobReader` does on SQLite: damaged bytes never leave the store as an image
        // (thumbnails, reference photos sent to a provider).
        out.truncate(meta.bytes.max(0) as usize);
        let sha = meta.sha256.clone();
        let (out, intact) = tokio::task::spawn_blocking(move || {
            let intact = crate::domain::hex(&<sha2::Sha256 as sha2::Digest>::digest(&out)) == sha;
            (out, intact)
        })
        .await
        .map_err(|e| StoreError::Fatal(format!("hashing task failed: {e}")))?;
        if !intact {
            return Err(StoreError::Damaged { id, why: "its bytes do not match their recorded sha256".into() });
        }
        Ok(Some((meta, out)))
    }
}

impl PgStore {
    /// Submit (`store::ops::submit`) and read the task back in the same operation.
    pub(crate) async fn submit_and_get(
        &self,
        t: crate::store::NewTask,
        now: crate::domain::Millis,
    ) -> Result<(crate::store::SubmitOutcome, Option<TaskView>), StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            let out = crate::store::ops::submit(tx, &t, now)?;
            let view = get_task(tx, out.task_id())?;
            Ok((out, view))
        })
        .await
    }
}
