//! Submit and dispatch: the outbox write (a task and its envelope in one transaction), the
//! dispatcher's hand-off marks, and the busy release that puts a hand-off back untouched.

use rusqlite::{Connection, params};

use super::*;
use crate::domain::{Actor, Millis, TaskStatus};

/// Insert a task and its envelope in one transaction (the outbox write).
pub(in crate::store) fn submit(c: &Connection, t: &NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
    let hash = t.hash();
    if let Some(seen) = replay_of(c, "tasks", t.idempotency_key.as_deref(), &hash)? {
        return Ok(seen);
    }
    let id = new_id();
    let (set_id, position, role) = match &t.shot {
        Some(s) => (Some(s.set_id.as_str()), Some(s.position), Some(s.role.as_str())),
        None => (None, None, None),
    };
    c.prepare_cached(
        "INSERT INTO tasks (id, idempotency_key, request_hash, provider, prompt, params, status, retry_of,
                            set_id, set_position, shot_role, created_at, updated_at, retry_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'queued', ?7, ?8, ?9, ?10, ?11, ?11, ?12)",
    )?
    .execute(params![
        id,
        t.idempotency_key,
        hash,
        t.provider,
        t.prompt,
        t.params.to_string(),
        t.retry_of,
        set_id,
        position,
        role,
        now,
        t.retry_key
    ])?;
    // A shot waits (due_at NULL) while another shot of its set is scheduled: one at a time.
    let due = match set_id {
        Some(set) if crate::store::sets::set_has_live_shot(c, set)? => None,
        _ => Some(now),
    };
    c.prepare_cached(
        "INSERT INTO envelopes (id, task_id, provider, status, due_at) VALUES (?1, ?2, ?3, 'pending', ?4)",
    )?
    .execute(params![new_id(), id, t.provider, due])?;
    let mut msg = match &t.retry_of {
        Some(orig) => format!("submitted as a new operation retrying task {orig}"),
        None => "submitted".to_string(),
    };
    if let Some(s) = &t.shot {
        msg.push_str(&format!(" as shot {} ({}) of set {}", s.position + 1, s.role, s.set_id));
        if due.is_none() {
            msg.push_str("; it waits until the set's current shot is settled");
        }
    }
    event(c, &id, now, Actor::Api, "submitted", &msg, None)?;
    Ok(SubmitOutcome::Created(id))
}

/// The dispatcher's statement: mark up to ?2 envelopes due at ?1 `sent`.
pub(super) const DISPATCH_DUE: &str = "UPDATE envelopes SET status = 'sent', sent_at = ?1, send_count = send_count + 1,
        lease_expires_at = ?1 + ?3, lease_boot = ?4
 WHERE id IN (SELECT id FROM envelopes WHERE status = 'pending' AND due_at IS NOT NULL AND due_at <= ?1
              ORDER BY due_at LIMIT ?2)
 RETURNING id, task_id, provider, send_count, due_at";

/// Mark up to `limit` due envelopes `sent` (before they are handed to the transport) and
/// report when the next one falls due.
pub(in crate::store) fn dispatch_due(
    c: &Connection,
    now: Millis,
    limit: usize,
    grace_ms: Millis,
    boot: &str,
) -> Result<DispatchBatch, StoreError> {
    let mut batch = DispatchBatch::default();
    if limit > 0 {
        let mut stmt = c.prepare_cached(DISPATCH_DUE)?;
        let rows = stmt.query_map(params![now, limit as i64, grace_ms, boot], |r| {
            Ok(Handoff {
                envelope_id: r.get(0)?,
                task_id: r.get(1)?,
                provider: r.get(2)?,
                send_count: r.get(3)?,
                due_at: r.get(4)?,
            })
        })?;
        for h in rows {
            batch.handoffs.push(h?);
        }
    }
    batch.next_due = c
        .prepare_cached("SELECT min(due_at) FROM envelopes WHERE status = 'pending' AND due_at IS NOT NULL")?
        .query_row([], |r| r.get(0))?;
    Ok(batch)
}

/// The provider had no free slot: put the envelope back, due later. No attempt is counted,
/// nothing is recorded as a failure, and the hand-off is not counted as a send either
/// (`send_count` goes back down): `max_sends` limits hand-offs that were *lost*, and a task
/// that waits through many busy releases must not be failed as undeliverable by a crash
/// that catches its next hand-off. Reusing the number is safe: the releasing worker was its
/// only holder and is done with it; a release only undoes its own dispatch, and a requeue by
/// the reconciler keeps the count, so a stale holder's number is never handed out again.
pub(in crate::store) fn release_busy(
    c: &Connection,
    h: &Handoff,
    due_at: Millis,
    why: &str,
    now: Millis,
) -> Result<bool, StoreError> {
    let n = c
        .prepare_cached(
            "UPDATE envelopes SET status = 'pending', due_at = ?3, send_count = send_count - 1,
                    lease_expires_at = NULL, lease_boot = NULL
             WHERE id = ?1 AND status = 'sent' AND lease_token IS NULL AND send_count = ?2",
        )?
        .execute(params![h.envelope_id, h.send_count, due_at])?;
    if n == 0 {
        return Ok(false);
    }
    if task_status(c, &h.task_id)? != Some(TaskStatus::Waiting) {
        event(c, &h.task_id, now, Actor::Worker, "busy", why, None)?;
    }
    c.prepare_cached(
        "UPDATE tasks SET status = 'waiting', reason = ?2, updated_at = ?3 WHERE id = ?1 AND status IN ('queued', 'waiting')",
    )?
    .execute(params![h.task_id, why, now])?;
    Ok(true)
}

impl SqliteStore {
    /// Insert a task and its envelope in one transaction.
    pub async fn submit(&self, t: NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
        self.write(move |c| submit(c, &t, now)).await
    }

    /// Like [`SqliteStore::submit`], and also read the task back in the same operation (saves the
    /// API a separate read after each submit).
    pub async fn submit_and_get(
        &self,
        t: NewTask,
        now: Millis,
    ) -> Result<(SubmitOutcome, Option<crate::store::TaskView>), StoreError> {
        self.write(move |c| {
            let out = submit(c, &t, now)?;
            let view = crate::store::get_task(c, out.task_id())?;
            Ok((out, view))
        })
        .await
    }

    /// Mark due envelopes `sent` and return them with the next due time. An ordered commit
    /// ([`super::Commit::Ordered`]): if a power loss erases it, the envelopes are simply
    /// still `pending`.
    pub async fn dispatch_due(
        &self,
        now: Millis,
        limit: usize,
        grace_ms: Millis,
        boot: &str,
    ) -> Result<DispatchBatch, StoreError> {
        let boot = boot.to_string();
        self.write_ordered(move |c| dispatch_due(c, now, limit, grace_ms, &boot)).await
    }

    /// Put a handed-off envelope back because its provider had no free slot (ordered commit:
    /// if lost, the reconciler requeues the hand-off).
    pub async fn release_busy(&self, h: Handoff, due_at: Millis, why: String, now: Millis) -> Result<bool, StoreError> {
        self.write_ordered(move |c| release_busy(c, &h, due_at, &why, now)).await
    }
}
