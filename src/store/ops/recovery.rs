//! The reconciler's reads and writes: leftovers past their deadline, and the recovery
//! decisions applied to them.

use rusqlite::{Connection, OptionalExtension, params};

use super::*;
use crate::domain::{Actor, Charge, FailureKind, Millis, Phase, TaskStatus};

/// Sent envelopes past their deadline, or leased by an earlier run of the process.
pub(in crate::store) fn leftovers(c: &Connection, now: Millis, boot: &str) -> Result<Vec<LeftoverRow>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT e.id, e.task_id, e.provider, e.send_count, e.lease_token, e.lease_expires_at, x.token, x.phase
         FROM envelopes e LEFT JOIN executions x ON x.task_id = e.task_id AND x.status = 'running'
         WHERE e.status = 'sent' AND (e.lease_expires_at <= ?1 OR e.lease_boot IS NOT ?2)",
    )?;
    let rows = stmt.query_map(params![now, boot], |r| {
        let token: Option<String> = r.get(6)?;
        let phase: Option<String> = r.get(7)?;
        Ok(LeftoverRow {
            envelope_id: r.get(0)?,
            task_id: r.get(1)?,
            provider: r.get(2)?,
            send_count: r.get(3)?,
            lease_token: r.get(4)?,
            lease_expires_at: r.get(5)?,
            execution: token.zip(phase.and_then(|p| Phase::parse(&p))),
        })
    })?;
    rows.map(|r| r.map_err(StoreError::from)).collect()
}

/// Is the evidence a decision was made from still exactly what the database says, in the
/// transaction that is about to apply it? The envelope must be the same hand-off (status
/// `sent`, `send_count`) with the same lease (token *and* deadline: a heartbeat moves the
/// deadline, so a worker that came back to life invalidates the decision), and the task's
/// running execution must be the same one in the same phase (a `record_calling` or
/// `record_accepted` that slipped in between changes the phase), or still be absent.
///
/// **Invariant (recovery on current evidence).** No recovery decision is applied unless this
/// holds; a changed leftover is skipped, and the next pass decides it again from what it has
/// become. Together with [`fence`] (a worker's write needs its execution `running` and its
/// lease token still on the envelope), a worker and the reconciler can never both act on the
/// same lease: whichever commits first wins, and the other's condition fails.
fn evidence_holds(c: &Connection, row: &LeftoverRow) -> Result<bool, StoreError> {
    let envelope = c
        .prepare_cached(
            "SELECT 1 FROM envelopes WHERE id = ?1 AND status = 'sent' AND send_count = ?2
                 AND lease_token IS ?3 AND lease_expires_at IS ?4",
        )?
        .query_row(params![row.envelope_id, row.send_count, row.lease_token, row.lease_expires_at], |_| Ok(()))
        .optional()?
        .is_some();
    if !envelope {
        return Ok(false);
    }
    let running: Option<(String, String)> = c
        .prepare_cached("SELECT token, phase FROM executions WHERE task_id = ?1 AND status = 'running'")?
        .query_row([&row.task_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(match (&row.execution, running) {
        (None, None) => true,
        (Some((token, phase)), Some((t, p))) => *token == t && phase.as_str() == p,
        _ => false,
    })
}

/// Apply the reconciler's decisions, each only while [`evidence_holds`]; a leftover that
/// changed since it was read is skipped (the next pass decides it again).
pub(in crate::store) fn apply_recovery(
    c: &Connection,
    items: &[(LeftoverRow, Recovery)],
    now: Millis,
) -> Result<Vec<(String, TaskStatus)>, StoreError> {
    let mut applied = Vec::new();
    for (row, decision) in items {
        if !evidence_holds(c, row)? {
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
        let set_exec = |status: &str, error: &str| -> Result<(), StoreError> {
            if let Some(token) = exec {
                c.prepare_cached("UPDATE executions SET status = ?2, finished_at = ?3, error = ?4 WHERE token = ?1")?
                    .execute(params![token, status, now, error])?;
            }
            Ok(())
        };
        let r = Actor::Reconciler;
        match decision {
            Recovery::Requeue => {
                requeue_envelope(c, task, now, Some("handed off but never claimed"), now)?;
                event(
                    c,
                    task,
                    now,
                    r,
                    "requeued",
                    "handed to a worker that never started it; queued again (nothing was sent)",
                    None,
                )?;
                applied.push((row.task_id.clone(), task_status(c, task)?.unwrap_or(TaskStatus::Queued)));
            }
            Recovery::GiveUp => {
                let why = format!(
                    "could not be delivered to a worker after {} dispatches (each one lost before anything was sent)",
                    row.send_count
                );
                set_exec("abandoned", &why)?;
                consume_envelope(c, task, "dead", Some(&why))?;
                set_task(c, task, TaskStatus::Failed, Some(&why), Some(FailureKind::Undeliverable), now)?;
                event(c, task, now, r, "failed", &why, None)?;
                on_settled(c, task, now)?;
                applied.push((row.task_id.clone(), TaskStatus::Failed));
            }
            Recovery::Abandon => {
                set_exec("abandoned", "the worker stopped before calling the provider")?;
                requeue_envelope(c, task, now, Some("worker lost before calling"), now)?;
                set_task(
                    c,
                    task,
                    TaskStatus::Waiting,
                    Some("The worker stopped before anything was sent; queued again."),
                    None,
                    now,
                )?;
                event(
                    c,
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
                // resumed that no worker claimed (a crash between dispatch and claim): hand
                // the same execution over again, uncounted as a lost delivery.
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
                requeue_envelope(c, task, now, Some(error), now)?;
                set_task(
                    c,
                    task,
                    TaskStatus::Waiting,
                    Some("Interrupted while the provider was working; recovering without sending again."),
                    None,
                    now,
                )?;
                event(c, task, now, r, "recovering", how, exec)?;
                applied.push((row.task_id.clone(), TaskStatus::Waiting));
            }
            Recovery::Unknown => {
                let why = "tally was interrupted after the request may have left, and this provider cannot prove \
                           whether it ran";
                set_exec("unknown", why)?;
                let words = match exec {
                    Some(token) => settle_charge(c, token, Charge::Possible)?.1,
                    None => String::new(),
                };
                consume_envelope(c, task, "consumed", Some(why))?;
                set_task(c, task, TaskStatus::Unknown, Some(why), None, now)?;
                event(
                    c,
                    task,
                    now,
                    r,
                    "unknown",
                    &with_money(&format!("{why}; automatic retries stopped"), &words),
                    exec,
                )?;
                on_settled(c, task, now)?;
                applied.push((row.task_id.clone(), TaskStatus::Unknown));
            }
        }
    }
    Ok(applied)
}

impl SqliteStore {
    /// Leftovers for the reconciler (read through the writer so it sees every commit; writes
    /// nothing, so it does not ask for an fsync).
    pub async fn leftovers(&self, now: Millis, boot: &str) -> Result<Vec<LeftoverRow>, StoreError> {
        let boot = boot.to_string();
        self.write_ordered(move |c| leftovers(c, now, &boot)).await
    }

    /// Apply reconciler decisions.
    pub async fn apply_recovery(
        &self,
        items: Vec<(LeftoverRow, Recovery)>,
        now: Millis,
    ) -> Result<Vec<(String, TaskStatus)>, StoreError> {
        self.write(move |c| apply_recovery(c, &items, now)).await
    }
}
