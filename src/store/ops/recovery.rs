//! The reconciler's reads and writes, written once for both backends: the leftovers past
//! their deadline (or held by a run that is gone), and the recovery decisions applied to them.
//!
//! **Invariant (recovery on current evidence).** Every recovery decision re-checks the
//! evidence it was made from, in the transaction that applies it ([`apply_recovery`], which
//! calls [`evidence_holds`] before each decision, under the envelope's row lock where
//! transactions run side by side). A leftover that changed since it was read is skipped, and
//! the next pass decides it again from what it has become. Together with `common::fence` (a
//! worker's write needs its execution `running` and its lease token still on the envelope), a
//! worker and the reconciler can never both act on the same lease: whichever commits first
//! wins, and the other's condition fails.
//!
//! Where the backends differ, a named hook says so: [`Liveness`] (which earlier leases are
//! known dead: another boot of the one SQLite process, or a PostgreSQL node whose advisory
//! lock nobody holds) and [`lock_envelopes`] (PostgreSQL locks every envelope it will decide
//! on, in id order, before it checks any evidence). The database clock (`db_clock`) comes in
//! through the `now` the seam passes ([`Tx::now`]).

use super::common::{consume_envelope, event, on_settled, requeue_envelope, set_task, settle_charge, task_status};
use super::{LeftoverRow, Recovery, with_money};
use crate::domain::words::{say, say_with};
use crate::domain::{Actor, Charge, FailureKind, Millis, Phase, TaskStatus};
use crate::store::StoreError;
use crate::store::tx::{Dialect, Row, Tx};

/// Which leases, besides those past their deadline, belong to a run that is gone — the hook
/// where the backends differ (node liveness).
#[derive(Debug, Clone, Copy)]
pub(in crate::store) enum Liveness<'a> {
    /// SQLite: one process owns the database (the data directory's lock), so a lease of any
    /// other `boot` is from an earlier run, which is gone.
    Process { boot: &'a str },
    /// PostgreSQL: a lease of an earlier run of this node (`boot` differs: this node's lock
    /// proves it is gone), or of another node whose advisory lock nobody holds (read from
    /// `pg_locks`, which takes no lock).
    Nodes { node: &'a str, boot: &'a str, lock_class: i32 },
}

/// Sent envelopes past their deadline, or leased by a run that is gone ([`Liveness`]).
pub(in crate::store) fn leftovers(
    tx: &mut dyn Tx,
    now: Millis,
    alive: Liveness<'_>,
) -> Result<Vec<LeftoverRow>, StoreError> {
    let rows = match (tx.dialect(), alive) {
        (Dialect::Sqlite, Liveness::Process { boot }) => tx.rows(
            "SELECT e.id, e.task_id, e.provider, e.send_count, e.lease_token, e.lease_expires_at, x.token, x.phase
             FROM envelopes e LEFT JOIN executions x ON x.task_id = e.task_id AND x.status = 'running'
             WHERE e.status = 'sent' AND (e.lease_expires_at <= ?1 OR e.lease_boot IS NOT ?2)",
            &[&now, &boot],
        )?,
        (Dialect::Postgres, Liveness::Nodes { node, boot, lock_class }) => tx.rows(
            "WITH live AS MATERIALIZED (
                SELECT CAST(objid AS BIGINT) AS key FROM pg_locks
                WHERE locktype = 'advisory' AND classid = CAST(CAST(?4 AS BIGINT) AS oid) AND objsubid = 2 AND granted
                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
             SELECT e.id, e.task_id, e.provider, e.send_count, e.lease_token, e.lease_expires_at, x.token, x.phase
             FROM envelopes e
             LEFT JOIN executions x ON x.task_id = e.task_id AND x.status = 'running'
             LEFT JOIN nodes n ON n.name = e.lease_node
             WHERE e.status = 'sent'
               AND (e.lease_expires_at <= ?1
                    OR (e.lease_node = ?2 AND e.lease_boot IS DISTINCT FROM ?3)
                    OR (e.lease_node IS DISTINCT FROM ?2
                        AND (n.lock_key IS NULL OR CAST(n.lock_key AS BIGINT) NOT IN (SELECT key FROM live))))
             ORDER BY e.lease_expires_at, e.id",
            &[&now, &node, &boot, &i64::from(lock_class)],
        )?,
        (d, a) => {
            return Err(StoreError::Invalid(format!("leftovers: {a:?} is not how the {d:?} backend tells live runs")));
        }
    };
    rows.iter().map(leftover_row).collect()
}

fn leftover_row(r: &Row) -> Result<LeftoverRow, StoreError> {
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
        call_window: None,
    })
}

/// What the database says now about a leftover, read in the transaction that would apply a
/// decision on it.
#[derive(Debug, Clone, PartialEq, Default)]
struct Evidence {
    /// The envelope, if it still exists: status, send count, lease token, lease deadline.
    envelope: Option<(String, i64, Option<String>, Option<Millis>)>,
    /// The task's running execution, if any: token and phase as stored.
    running: Option<(String, String)>,
}

/// Is the evidence a decision was made from (`row`) still exactly what the database says
/// (`now`)? The envelope must be the same hand-off (status `sent`, `send_count`) with the same
/// lease (token *and* deadline: a heartbeat moves the deadline, so a worker that came back to
/// life invalidates the decision), and the task's running execution must be the same one in
/// the same phase (a `record_calling` or `record_accepted` that slipped in between changes the
/// phase), or still be absent. Pure: the rule of the module's invariant.
fn evidence_holds(row: &LeftoverRow, now: &Evidence) -> bool {
    let envelope = now.envelope.as_ref().is_some_and(|(status, sends, token, deadline)| {
        status == "sent" && *sends == row.send_count && *token == row.lease_token && *deadline == row.lease_expires_at
    });
    envelope
        && match (&row.execution, &now.running) {
            (None, None) => true,
            (Some((token, phase)), Some((t, p))) => token == t && phase.as_str() == p,
            _ => false,
        }
}

/// Read the [`Evidence`] about `row` (under its envelope's lock on PostgreSQL, see
/// [`lock_envelopes`]).
fn evidence_of(tx: &mut dyn Tx, row: &LeftoverRow) -> Result<Evidence, StoreError> {
    let envelope = match tx.opt(
        "SELECT status, send_count, lease_token, lease_expires_at FROM envelopes WHERE id = ?1",
        &[&row.envelope_id],
    )? {
        Some(r) => Some((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        None => None,
    };
    let running = match tx
        .opt("SELECT token, phase FROM executions WHERE task_id = ?1 AND status = 'running'", &[&row.task_id])?
    {
        Some(r) => Some((r.get(0)?, r.get(1)?)),
        None => None,
    };
    Ok(Evidence { envelope, running })
}

/// May `decision` be applied to a leftover of this shape? A call that may have left is
/// decided from its phase, never as an undelivered dispatch (`domain::Leftover::of`): a
/// requeue needs no execution at all, and giving up needs one that sent nothing (`claimed`).
/// Pure; the error names the task.
fn check_decision(row: &LeftoverRow, decision: &Recovery) -> Result<(), StoreError> {
    let sent_nothing = matches!(row.execution, None | Some((_, Phase::Claimed)));
    let undelivered = match decision {
        Recovery::Requeue => row.execution.is_none(),
        Recovery::GiveUp => sent_nothing,
        Recovery::Abandon | Recovery::Resume | Recovery::Unknown => true,
    };
    if undelivered {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "task {}: a dispatch whose execution may have called cannot be requeued or given up as undelivered",
            row.task_id
        )))
    }
}

/// The PostgreSQL hook of [`apply_recovery`]: lock every envelope the batch decides on, in id
/// order, before any evidence is read, so nothing can change it before this transaction
/// commits and two nodes applying overlapping batches cannot deadlock. Nothing on SQLite (the
/// writer is alone). The ids travel as one JSON array (any text survives it).
fn lock_envelopes(tx: &mut dyn Tx, items: &[(LeftoverRow, Recovery)]) -> Result<(), StoreError> {
    if !tx.locking() || items.is_empty() {
        return Ok(());
    }
    let mut ids: Vec<&str> = items.iter().map(|(r, _)| r.envelope_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let ids = serde_json::to_string(&ids).map_err(|e| StoreError::Invalid(format!("envelope ids: {e}")))?;
    tx.rows(
        "SELECT id FROM envelopes
         WHERE id IN (SELECT jsonb_array_elements_text(CAST(CAST(?1 AS TEXT) AS jsonb))) ORDER BY id FOR UPDATE",
        &[&ids],
    )?;
    Ok(())
}

/// Apply the reconciler's decisions, each only while [`evidence_holds`] (the module's
/// invariant); a leftover that changed since it was read is skipped (the next pass decides it
/// again). A decision [`check_decision`] refuses fails the whole batch, having written nothing.
/// Returns each applied task with the status it now has.
pub(in crate::store) fn apply_recovery(
    tx: &mut dyn Tx,
    items: &[(LeftoverRow, Recovery)],
    now: Millis,
) -> Result<Vec<(String, TaskStatus)>, StoreError> {
    lock_envelopes(tx, items)?;
    let mut applied = Vec::new();
    for (row, decision) in items {
        let current = evidence_of(tx, row)?;
        if !evidence_holds(row, &current) {
            continue;
        }
        check_decision(row, decision)?;
        // A call that may still be at the provider (a gone or fenced run's `calling`) keeps its
        // slot until its deadline, so the cap counts it while other nodes dispatch (issue #43).
        if let (Some((_, Phase::Calling)), Some(window)) = (&row.execution, row.call_window) {
            super::slot_rows::hold(tx, &row.envelope_id, now.saturating_add(window))?;
        }
        let status = match decision {
            Recovery::Requeue => requeue(tx, row, now)?,
            Recovery::GiveUp => give_up(tx, row, now)?,
            Recovery::Abandon => abandon(tx, row, now)?,
            Recovery::Resume => resume(tx, row, now)?,
            Recovery::Unknown => unknown(tx, row, now)?,
        };
        applied.push((row.task_id.clone(), status));
    }
    Ok(applied)
}

/// The token of the leftover's running execution, if it has one.
fn exec_of(row: &LeftoverRow) -> Option<&str> {
    row.execution.as_ref().map(|(t, _)| t.as_str())
}

/// End the leftover's running execution (if any) with `status` and `error`.
fn end_execution(tx: &mut dyn Tx, row: &LeftoverRow, status: &str, error: &str, now: Millis) -> Result<(), StoreError> {
    if let Some(token) = exec_of(row) {
        tx.exec(
            "UPDATE executions SET status = ?2, finished_at = ?3, error = ?4 WHERE token = ?1",
            &[&token, &status, &now, &error],
        )?;
    }
    Ok(())
}

/// [`Recovery::Requeue`]: a hand-off no worker claimed; queued again (nothing was sent).
fn requeue(tx: &mut dyn Tx, row: &LeftoverRow, now: Millis) -> Result<TaskStatus, StoreError> {
    let task = row.task_id.as_str();
    requeue_envelope(tx, task, now, Some("handed off but never claimed"), now)?;
    event(tx, task, now, Actor::Reconciler, "requeued", &say("say.handed_never_started"), None)?;
    Ok(task_status(tx, task)?.unwrap_or(TaskStatus::Queued))
}

/// Why a task whose every dispatch was lost before anything was sent failed.
fn give_up_reason(send_count: i64) -> String {
    crate::domain::words::say_with("say.undeliverable", &[("n", &send_count.to_string())])
}

/// [`Recovery::GiveUp`]: too many dispatches lost before anything was sent; the envelope is
/// `dead`, the task `failed` (undeliverable) and settled.
fn give_up(tx: &mut dyn Tx, row: &LeftoverRow, now: Millis) -> Result<TaskStatus, StoreError> {
    let task = row.task_id.as_str();
    let why = give_up_reason(row.send_count);
    end_execution(tx, row, "abandoned", &why, now)?;
    consume_envelope(tx, task, "dead", Some(&why))?;
    set_task(tx, task, TaskStatus::Failed, Some(&why), Some(FailureKind::Undeliverable), now)?;
    event(tx, task, now, Actor::Reconciler, "failed", &why, None)?;
    on_settled(tx, task, now)?;
    Ok(TaskStatus::Failed)
}

/// [`Recovery::Abandon`]: the worker stopped before calling; its execution is abandoned and
/// the task queued again (nothing was sent).
fn abandon(tx: &mut dyn Tx, row: &LeftoverRow, now: Millis) -> Result<TaskStatus, StoreError> {
    let task = row.task_id.as_str();
    end_execution(tx, row, "abandoned", &say("say.worker_stopped_short"), now)?;
    requeue_envelope(tx, task, now, Some("worker lost before calling"), now)?;
    set_task(tx, task, TaskStatus::Waiting, Some(&say("say.worker_stopped")), None, now)?;
    event(tx, task, now, Actor::Reconciler, "abandoned", &say("say.worker_stopped_line"), exec_of(row))?;
    Ok(TaskStatus::Waiting)
}

/// The envelope's error and the timeline line of a resume: a lease that expired during the
/// call, or (no lease) the hand-off of an execution already being resumed that no worker
/// claimed — a crash between dispatch and claim, handed over again uncounted as a lost
/// delivery.
fn resume_words(leased: bool) -> (String, String) {
    if leased {
        (say("say.lease_expired_short"), say("say.lease_expired"))
    } else {
        ("the hand-off of a resumed execution was never claimed".to_string(), say("say.resumed_handoff_lost"))
    }
}

/// [`Recovery::Resume`]: hand the same execution to a worker again, to look the job up or
/// replay it, never to send it anew.
fn resume(tx: &mut dyn Tx, row: &LeftoverRow, now: Millis) -> Result<TaskStatus, StoreError> {
    let task = row.task_id.as_str();
    let (error, how) = resume_words(row.lease_token.is_some());
    requeue_envelope(tx, task, now, Some(&error), now)?;
    set_task(tx, task, TaskStatus::Waiting, Some(&say("say.interrupted_recovering")), None, now)?;
    event(tx, task, now, Actor::Reconciler, "recovering", &how, exec_of(row))?;
    Ok(TaskStatus::Waiting)
}

/// [`Recovery::Unknown`]: nothing can prove what happened; the execution and the task are
/// `unknown`, its charge `possible`, automatic retries stop, and the task is settled.
fn unknown(tx: &mut dyn Tx, row: &LeftoverRow, now: Millis) -> Result<TaskStatus, StoreError> {
    let task = row.task_id.as_str();
    let exec = exec_of(row);
    // Why the task became `unknown`.
    let why = say("say.interrupted_cannot_prove");
    end_execution(tx, row, "unknown", &why, now)?;
    let words = match exec {
        Some(token) => settle_charge(tx, token, Charge::Possible)?.1,
        None => String::new(),
    };
    consume_envelope(tx, task, "consumed", Some(&why))?;
    set_task(tx, task, TaskStatus::Unknown, Some(&why), None, now)?;
    let line = with_money(&say_with("say.retries_stopped", &[("reason", &why)]), &words);
    event(tx, task, now, Actor::Reconciler, "unknown", &line, exec)?;
    on_settled(tx, task, now)?;
    Ok(TaskStatus::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(execution: Option<Phase>) -> LeftoverRow {
        LeftoverRow {
            envelope_id: "env".into(),
            task_id: "task".into(),
            provider: "p".into(),
            send_count: 2,
            lease_token: Some("lease".into()),
            lease_expires_at: Some(1_000),
            execution: execution.map(|p| ("exec".to_string(), p)),
            call_window: None,
        }
    }

    fn as_read(r: &LeftoverRow) -> Evidence {
        Evidence {
            envelope: Some(("sent".into(), r.send_count, r.lease_token.clone(), r.lease_expires_at)),
            running: r.execution.as_ref().map(|(t, p)| (t.clone(), p.as_str().to_string())),
        }
    }

    #[test]
    fn evidence_holds_only_while_nothing_changed() {
        for r in [row(None), row(Some(Phase::Claimed)), row(Some(Phase::Calling))] {
            assert!(evidence_holds(&r, &as_read(&r)), "unchanged: {r:?}");
        }
        let r = row(Some(Phase::Claimed));
        let changed = |f: fn(&mut Evidence)| {
            let mut e = as_read(&r);
            f(&mut e);
            evidence_holds(&r, &e)
        };
        assert!(!changed(|e| e.envelope = None), "envelope gone");
        assert!(!changed(|e| e.envelope.as_mut().unwrap().0 = "pending".into()), "no longer sent");
        assert!(!changed(|e| e.envelope.as_mut().unwrap().1 = 3), "dispatched again");
        assert!(!changed(|e| e.envelope.as_mut().unwrap().2 = Some("other".into())), "another lease");
        assert!(!changed(|e| e.envelope.as_mut().unwrap().2 = None), "lease dropped");
        assert!(!changed(|e| e.envelope.as_mut().unwrap().3 = Some(2_000)), "a heartbeat moved the deadline");
        assert!(!changed(|e| e.running = Some(("exec".into(), "calling".into()))), "record_calling slipped in");
        assert!(!changed(|e| e.running = Some(("exec-2".into(), "claimed".into()))), "another execution");
        assert!(!changed(|e| e.running = None), "the execution ended");
        let none = row(None);
        let mut e = as_read(&none);
        e.running = Some(("exec".into(), "claimed".into()));
        assert!(!evidence_holds(&none, &e), "claimed since it was read");
    }

    #[test]
    fn a_call_that_may_have_left_is_never_undelivered() {
        let ok = |r: &LeftoverRow, d: Recovery| check_decision(r, &d).is_ok();
        assert!(ok(&row(None), Recovery::Requeue));
        assert!(!ok(&row(Some(Phase::Claimed)), Recovery::Requeue), "requeue needs no execution");
        assert!(ok(&row(None), Recovery::GiveUp));
        assert!(ok(&row(Some(Phase::Claimed)), Recovery::GiveUp));
        for p in [Phase::Calling, Phase::Accepted] {
            assert!(!ok(&row(Some(p)), Recovery::GiveUp), "{p:?} may have called");
            assert!(!ok(&row(Some(p)), Recovery::Requeue), "{p:?} may have called");
            for d in [Recovery::Abandon, Recovery::Resume, Recovery::Unknown] {
                assert!(ok(&row(Some(p)), d));
            }
        }
        let err = check_decision(&row(Some(Phase::Calling)), &Recovery::GiveUp).unwrap_err().to_string();
        assert!(err.contains("task task"), "the error names the task: {err}");
    }

    #[test]
    fn the_words_say_what_happened() {
        let en = crate::domain::words::english;
        let resume_words = |b| {
            let (a, c) = super::resume_words(b);
            (en(&a), en(&c))
        };
        assert_eq!(
            en(&give_up_reason(5)),
            "could not be delivered to a worker after 5 dispatches (each one lost before anything was sent)"
        );
        assert!(resume_words(true).0.contains("lease expired"));
        assert!(resume_words(false).0.contains("never claimed"));
        assert!(resume_words(true).1.contains("not to resend") && resume_words(false).1.contains("not to resend"));
    }
}
