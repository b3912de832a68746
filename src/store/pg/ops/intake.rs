//! Submit and dispatch on PostgreSQL: the outbox write, the dispatcher's hand-off marks
//! (`FOR UPDATE SKIP LOCKED`, so two nodes dispatching at once hand out disjoint envelopes),
//! and the busy release.

use super::*;
use crate::domain::{Actor, Millis, TaskStatus};
use crate::store::pg::PgStore;
use crate::store::{DispatchBatch, Handoff, NewTask, SubmitOutcome, TaskView};

/// Insert a task and its envelope in one transaction (the outbox write).
pub(in crate::store::pg) fn submit(tx: &mut Tx<'_, '_>, t: &NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
    let hash = t.hash();
    if let Some(seen) = task_replay(tx, t.idempotency_key.as_deref(), &hash)? {
        return Ok(seen);
    }
    let id = new_id();
    let (set_id, position, role) = match &t.shot {
        Some(s) => (Some(s.set_id.as_str()), Some(s.position), Some(s.role.as_str())),
        None => (None, None, None),
    };
    tx.exec(
        "INSERT INTO tasks (id, idempotency_key, request_hash, provider, prompt, params, status, retry_of,
                            set_id, set_position, shot_role, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, 'queued', $7, $8, $9, $10, $11, $11)",
        &[
            &id,
            &t.idempotency_key,
            &hash,
            &t.provider,
            &t.prompt,
            &t.params.to_string(),
            &t.retry_of,
            &set_id,
            &position,
            &role,
            &now,
        ],
    )?;
    // A shot waits (due_at NULL) while another shot of its set is scheduled: one at a time.
    // The set row is locked first, so two nodes cannot both see "no live shot".
    let due = match set_id {
        Some(set) => {
            crate::store::pg::sets::lock_set(tx, set)?;
            if crate::store::pg::sets::set_has_live_shot(tx, set)? { None } else { Some(now) }
        }
        None => Some(now),
    };
    tx.exec(
        "INSERT INTO envelopes (id, task_id, provider, status, due_at) VALUES ($1, $2, $3, 'pending', $4)",
        &[&new_id(), &id, &t.provider, &due],
    )?;
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
    event(tx, &id, now, Actor::Api, "submitted", &msg, None)?;
    Ok(SubmitOutcome::Created(id))
}

/// Mark up to `limit` due envelopes `sent` (before they are handed to the transport) and
/// report when the next one falls due. Rows another node is dispatching right now are
/// skipped, never waited for.
fn dispatch_due(
    tx: &mut Tx<'_, '_>,
    now: Millis,
    limit: usize,
    grace_ms: Millis,
    node: &str,
    boot: &str,
    caps: &[(String, i64)],
) -> Result<DispatchBatch, StoreError> {
    if !caps.is_empty() {
        return dispatch_capped(tx, now, limit, grace_ms, node, boot, caps);
    }
    let mut batch = DispatchBatch::default();
    if limit > 0 {
        let rows = tx.rows(
            "WITH due AS MATERIALIZED (
                SELECT id FROM envelopes WHERE status = 'pending' AND due_at IS NOT NULL AND due_at <= $1
                ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED)
             UPDATE envelopes e SET status = 'sent', sent_at = $1, send_count = e.send_count + 1,
                    lease_expires_at = $1 + $3, lease_node = $4, lease_boot = $5
             FROM due WHERE e.id = due.id
             RETURNING e.id, e.task_id, e.provider, e.send_count, e.due_at",
            &[&now, &(limit as i64), &grace_ms, &node, &boot],
        )?;
        let mut handoffs: Vec<Handoff> = rows
            .iter()
            .map(|r| Handoff {
                envelope_id: r.get(0),
                task_id: r.get(1),
                provider: r.get(2),
                send_count: r.get(3),
                due_at: r.get(4),
            })
            .collect();
        handoffs.sort_by(|a, b| (a.due_at, &a.envelope_id).cmp(&(b.due_at, &b.envelope_id)));
        batch.handoffs = handoffs;
    }
    batch.next_due =
        tx.one("SELECT min(due_at) FROM envelopes WHERE status = 'pending' AND due_at IS NOT NULL", &[])?.get(0);
    Ok(batch)
}

fn handoffs(rows: &[postgres::Row]) -> Vec<Handoff> {
    let mut handoffs: Vec<Handoff> = rows
        .iter()
        .map(|r| Handoff {
            envelope_id: r.get(0),
            task_id: r.get(1),
            provider: r.get(2),
            send_count: r.get(3),
            due_at: r.get(4),
        })
        .collect();
    handoffs.sort_by(|a, b| (a.due_at, &a.envelope_id).cmp(&(b.due_at, &b.envelope_id)));
    handoffs
}

/// [`dispatch_due`] with provider capacity held across every node: each capped provider gets
/// at most `cap − (its envelopes already sent anywhere)` new hand-offs, and `next_due` leaves
/// out providers that are full (a slot freeing on any node sends a `tally_due` hint, so the
/// dispatcher is woken then instead of spinning). Dispatches of all nodes are serialized by a
/// transaction-level advisory lock so that two of them never both count the same free slot.
/// Each provider's due envelopes are picked in a lateral subquery of their own, so a full
/// provider at the head of the queue never blocks the others (the pg-boss#756 trap).
fn dispatch_capped(
    tx: &mut Tx<'_, '_>,
    now: Millis,
    limit: usize,
    grace_ms: Millis,
    node: &str,
    boot: &str,
    caps: &[(String, i64)],
) -> Result<DispatchBatch, StoreError> {
    let names: Vec<&str> = caps.iter().map(|(p, _)| p.as_str()).collect();
    let cap: Vec<i64> = caps.iter().map(|(_, n)| *n).collect();
    tx.exec("SELECT pg_advisory_xact_lock($1, 1)", &[&crate::store::pg::LOCK_CLASS])?;
    let mut batch = DispatchBatch::default();
    if limit > 0 {
        let rows = tx.rows(
            "WITH lim AS (SELECT * FROM unnest($6::text[], $7::bigint[]) AS l(provider, cap)),
             busy AS (SELECT provider, count(*) AS n FROM envelopes WHERE status = 'sent' GROUP BY provider),
             provs AS (SELECT DISTINCT provider FROM envelopes
                       WHERE status = 'pending' AND due_at IS NOT NULL AND due_at <= $1),
             room AS (SELECT p.provider, CASE WHEN l.cap IS NULL THEN $2
                                              ELSE greatest(l.cap - coalesce(b.n, 0), 0) END AS n
                      FROM provs p LEFT JOIN lim l USING (provider) LEFT JOIN busy b USING (provider)),
             cand AS MATERIALIZED (
                SELECT x.id, x.due_at FROM room r CROSS JOIN LATERAL (
                    SELECT id, due_at FROM envelopes e
                    WHERE e.status = 'pending' AND e.due_at IS NOT NULL AND e.due_at <= $1 AND e.provider = r.provider
                    ORDER BY e.due_at LIMIT least(r.n, $2) FOR UPDATE SKIP LOCKED) x
                WHERE r.n > 0),
             picked AS (SELECT id FROM cand ORDER BY due_at, id LIMIT $2)
             UPDATE envelopes e SET status = 'sent', sent_at = $1, send_count = e.send_count + 1,
                    lease_expires_at = $1 + $3, lease_node = $4, lease_boot = $5
             FROM picked WHERE e.id = picked.id AND e.status = 'pending'
             RETURNING e.id, e.task_id, e.provider, e.send_count, e.due_at",
            &[&now, &(limit as i64), &grace_ms, &node, &boot, &names, &cap],
        )?;
        batch.handoffs = handoffs(&rows);
    }
    batch.next_due = tx
        .one(
            "WITH lim AS (SELECT * FROM unnest($1::text[], $2::bigint[]) AS l(provider, cap)),
             full_ AS (SELECT l.provider FROM lim l
                       WHERE l.cap <= (SELECT count(*) FROM envelopes s WHERE s.status = 'sent' AND s.provider = l.provider))
             SELECT min(due_at) FROM envelopes
             WHERE status = 'pending' AND due_at IS NOT NULL AND provider NOT IN (SELECT provider FROM full_)",
            &[&names, &cap],
        )?
        .get(0);
    Ok(batch)
}

/// The provider had no free slot: put the envelope back, due later, taking the hand-off
/// back (`send_count − 1`), exactly as on SQLite (see `store::ops::intake::release_busy`).
fn release_busy(tx: &mut Tx<'_, '_>, h: &Handoff, due_at: Millis, why: &str, now: Millis) -> Result<bool, StoreError> {
    lock_task(tx, &h.task_id)?;
    let n = tx.exec(
        "UPDATE envelopes SET status = 'pending', due_at = $3, send_count = send_count - 1,
                lease_expires_at = NULL, lease_node = NULL, lease_boot = NULL
         WHERE id = $1 AND status = 'sent' AND lease_token IS NULL AND send_count = $2",
        &[&h.envelope_id, &h.send_count, &due_at],
    )?;
    if n == 0 {
        return Ok(false);
    }
    if task_status(tx, &h.task_id)? != Some(TaskStatus::Waiting) {
        event(tx, &h.task_id, now, Actor::Worker, "busy", why, None)?;
    }
    tx.exec(
        "UPDATE tasks SET status = 'waiting', reason = $2, updated_at = $3 WHERE id = $1 AND status IN ('queued', 'waiting')",
        &[&h.task_id, &why, &now],
    )?;
    Ok(true)
}

impl PgStore {
    /// Insert a task and its envelope in one transaction.
    pub async fn submit(&self, t: NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            submit(tx, &t, now)
        })
        .await
    }

    /// Like [`PgStore::submit`], and also read the task back in the same operation.
    pub async fn submit_and_get(
        &self,
        t: NewTask,
        now: Millis,
    ) -> Result<(SubmitOutcome, Option<TaskView>), StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            let out = submit(tx, &t, now)?;
            let view = crate::store::pg::read::get_task(tx, out.task_id())?;
            Ok((out, view))
        })
        .await
    }

    /// Mark due envelopes `sent` and return them with the next due time (ordered commit).
    pub async fn dispatch_due(
        &self,
        now: Millis,
        limit: usize,
        grace_ms: Millis,
        boot: &str,
    ) -> Result<DispatchBatch, StoreError> {
        let (boot, node, caps) = (boot.to_string(), self.node().to_string(), self.provider_limits());
        self.write_ordered(move |tx| {
            let now = tx.now(now)?;
            dispatch_due(tx, now, limit, grace_ms, &node, &boot, &caps)
        })
        .await
    }

    /// Put a handed-off envelope back because its provider had no free slot (ordered commit).
    pub async fn release_busy(&self, h: Handoff, due_at: Millis, why: String, now: Millis) -> Result<bool, StoreError> {
        self.write_ordered(move |tx| {
            let now = tx.now(now)?;
            release_busy(tx, &h, due_at, &why, now)
        })
        .await
    }
}
