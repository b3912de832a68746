//! The reconciler's read and writes on PostgreSQL: leftovers past their deadline (or held by
//! a run of a node that is gone), and the recovery decisions applied to them, each re-checked
//! under the envelope's row lock.

use super::*;
use crate::domain::{Actor, Charge, FailureKind, Millis, Phase, TaskStatus};
use crate::store::pg::{LOCK_CLASS, PgStore};
use crate::store::{LeftoverRow, Recovery};

/// Sent envelopes past their deadline, or leased by a run of a node that no longer holds its
/// lock: an earlier run of this node (`boot` differs — this node's lock proves it is gone), or
/// another node whose advisory lock nobody holds (read from `pg_locks`, which takes no lock).
fn leftovers(tx: &mut Tx<'_, '_>, now: Millis, node: &str, boot: &str) -> Result<Vec<LeftoverRow>, StoreError> {
    let rows = tx.rows(
        "WITH live AS MATERIALIZED (
            SELECT objid::bigint AS key FROM pg_locks
            WHERE locktype = 'advisory' AND classid = $4::bigint::oid AND objsubid = 2 AND granted
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
         SELECT e.id, e.task_id, e.provider, e.send_count, e.lease_token, e.lease_expires_at, x.token, x.phase
         FROM envelopes e
         LEFT JOIN executions x ON x.task_id = e.task_id AND x.status = 'running'
         LEFT JOIN nodes n ON n.name = e.lease_node
         WHERE e.status = 'sent'
           AND (e.lease_expires_at <= $1
                OR (e.lease_node = $2 AND e.lease_boot IS DISTINCT FROM $3)
                OR (e.lease_node IS DISTINCT FROM $2
                    AND (n.lock_key IS NULL OR n.lock_key::bigint NOT IN (SELECT key FROM live))))
         ORDER BY e.lease_expires_at, e.id",
        &[&now, &node, &boot, &i64::from(LOCK_CLASS)],
    )?;
    Ok(rows
        .iter()
        .map(|r| {
            let token: Option<String> = r.get(6);
            let phase: Option<String> = r.get(7);
            LeftoverRow {
                envelope_id: r.get(0),
                task_id: r.get(1),
                provider: r.get(2),
                send_count: r.get(3),
                lease_token: r.get(4),
                lease_expires_at: r.get(5),
                execution: token.zip(phase.and_then(|p| Phase::parse(&p))),
            }
        })
        .collect())
}

/// Is the evidence a decision was made from still exactly what the database says? Checked
/// after the envelope's row lock is held, so nothing can change it before this transaction
/// commits: the same hand-off (`sent`, `send_count`) with the same lease (token and
/// deadline: a heartbeat moves the deadline) and the same running execution in the same
/// phase (or still none). The SQLite twin is `store::ops::recovery::evidence_holds`.
fn evidence_holds(tx: &mut Tx<'_, '_>, row: &LeftoverRow) -> Result<bool, StoreError> {
    let envelope = tx
        .opt(
            "SELECT 1 FROM envelopes WHERE id = $1 AND status = 'sent' AND send_count = $2
                 AND lease_token IS NOT DISTINCT FROM $3 AND lease_expires_at IS NOT DISTINCT FROM $4",
            &[&row.envelope_id, &row.send_count, &row.lease_token, &row.lease_expires_at],
        )?
        .is_some();
    if !envelope {
        return Ok(false);
    }
    let running =
        tx.opt("SELECT token, phase FROM executions WHERE task_id = $1 AND status = 'running'", &[&row.task_id])?;
    Ok(match (&row.execution, running) {
        (None, None) => true,
        (Some((token, phase)), Some(r)) => *token == r.get::<_, String>(0) && phase.as_str() == r.get::<_, String>(1),
        _ => false,
    })
}

/// Apply the reconciler's decisions, each only while [`evidence_holds`] under the envelope's
/// row lock; a leftover that changed since it was read is skipped (the next pass decides it
/// again). The envelopes are locked in id order up front, so two nodes applying overlapping
/// decisions cannot deadlock.
fn apply_recovery(
    tx: &mut Tx<'_, '_>,
    items: &[(LeftoverRow, Recovery)],
    now: Millis,
) -> Result<Vec<(String, TaskStatus)>, StoreError> {
    let mut ids: Vec<&str> = items.iter().map(|(r, _)| r.envelope_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    tx.rows("SELECT id FROM envelopes WHERE id = ANY($1) ORDER BY id FOR UPDATE", &[&ids])?;
    let mut applied = Vec::new();
    for (row, decision) in items {
        if !evidence_holds(tx, row)? {
            continue;
        }
        let sent_nothing = matches!(row.execution, None | Some((_, Phase::Claimed)));
        let undelivered = match decision {
            Recovery::Requeue => row.execution.is_none(),
            Recovery::GiveUp => sent_nothing,
            _ => true,
        };
        if !undelivered {
            // A call that may have left is decided from its phase, never as an undelivered
            // dispatch (`domain::Leftover::of`); refuse a caller that says otherwise.
            return Err(StoreError::Invalid(format!(
                "task {}: a dispatch whose execution may have called cannot be requeued or given up as undelivered",
                row.task_id
            )));
        }
        let task = row.task_id.as_str();
        let exec = row.execution.as_ref().map(|(t, _)| t.as_str());
        let set_exec = |tx: &mut Tx<'_, '_>, status: &str, error: &str| -> Result<(), StoreError> {
            if let Some(token) = exec {
                tx.exec(
                    "UPDATE executions SET status = $2, finished_at = $3, error = $4 WHERE token = $1",
                    &[&token, &status, &now, &error],
                )?;
            }
            Ok(())
        };
        let r = Actor::Reconciler;
        match decision {
            Recovery::Requeue => {
                requeue_envelope(tx, task, now, Some("handed off but never claimed"), now)?;
                event(
                    tx,
                    task,
                    now,
                    r,
                    "requeued",
                    "handed to a worker that never started it; queued again (nothing was sent)",
                    None,
                )?;
                applied.push((row.task_id.clone(), task_status(tx, task)?.unwrap_or(TaskStatus::Queued)));
            }
            Recovery::GiveUp => {
                let why = format!(
                    "could not be delivered to a worker after {} dispatches (each one lost before anything was sent)",
                    row.send_count
                );
                set_exec(tx, "abandoned", &why)?;
                consume_envelope(tx, task, "dead", Some(&why))?;
                set_task(tx, task, TaskStatus::Failed, Some(&why), Some(FailureKind::Undeliverable), now)?;
                event(tx, task, now, r, "failed", &why, None)?;
                on_settled(tx, task, now)?;
                applied.push((row.task_id.clone(), TaskStatus::Failed));
            }
            Recovery::Abandon => {
                set_exec(tx, "abandoned", "the worker stopped before calling the provider")?;
                requeue_envelope(tx, task, now, Some("worker lost before calling"), now)?;
                set_task(
                    tx,
                    task,
                    TaskStatus::Waiting,
                    Some("The worker stopped before anything was sent; queued again."),
                    None,
                    now,
                )?;
                event(
                    tx,
                    task,
                    now,
                    r,
                    "abandoned",
                    "the worker stopped before calling the provider; nothing was sent; queued again",
                    exec,
                )?;
                applied.push((row.task_id.clone(), TaskStatus::Waiting));
            }
            Recovery::Resume => {
                // Without a lease, this was the hand-off of an execution already being
                // resumed that no worker claimed: hand the same execution over again.
                let (error, how) = match row.lease_token {
                    Some(_) => (
                        "lease expired during the provider call",
                        "the worker's lease expired during the provider call; handing the same execution to a worker to look up or replay, not to resend",
                    ),
                    None => (
                        "the hand-off of a resumed execution was never claimed",
                        "the execution being recovered was handed to a worker that never started; handing it over again to look up or replay, not to resend",
                    ),
                };
                requeue_envelope(tx, task, now, Some(error), now)?;
                set_task(
                    tx,
                    task,
                    TaskStatus::Waiting,
                    Some("Interrupted while the provider was working; recovering without sending again."),
                    None,
                    now,
                )?;
                event(tx, task, now, r, "recovering", how, exec)?;
                applied.push((row.task_id.clone(), TaskStatus::Waiting));
            }
            Recovery::Unknown => {
                let why = "tally was interrupted after the request may have left, and this provider cannot prove \
                           whether it ran";
                set_exec(tx, "unknown", why)?;
                let words = match exec {
                    Some(token) => settle_charge(tx, token, Charge::Possible)?.1,
                    None => String::new(),
                };
                consume_envelope(tx, task, "consumed", Some(why))?;
                set_task(tx, task, TaskStatus::Unknown, Some(why), None, now)?;
                let line = crate::store::ops::with_money(&format!("{why}; automatic retries stopped"), &words);
                event(tx, task, now, r, "unknown", &line, exec)?;
                on_settled(tx, task, now)?;
                applied.push((row.task_id.clone(), TaskStatus::Unknown));
            }
        }
    }
    Ok(applied)
}

impl PgStore {
    /// Leftovers for the reconciler (a read; writes nothing).
    pub async fn leftovers(&self, now: Millis, boot: &str) -> Result<Vec<LeftoverRow>, StoreError> {
        let (boot, node) = (boot.to_string(), self.node().to_string());
        self.read(move |tx| {
            let now = tx.now(now)?;
            leftovers(tx, now, &node, &boot)
        })
        .await
    }

    /// Apply reconciler decisions.
    pub async fn apply_recovery(
        &self,
        items: Vec<(LeftoverRow, Recovery)>,
        now: Millis,
    ) -> Result<Vec<(String, TaskStatus)>, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            apply_recovery(tx, &items, now)
        })
        .await
    }
}
