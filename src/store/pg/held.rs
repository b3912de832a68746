//! Held jobs on PostgreSQL, with the meaning of `store::held`. A PostgreSQL database is not
//! copied as a file, so nothing here decides that it is older (there is no lineage); but the
//! held state, its release and its list exist on both backends. Holding takes only *pending*
//! envelopes here: a claimed one may belong to a live node. Each task's envelope is locked
//! first (rule L).

use super::ops::{event, lock_task, requeue_envelope, set_task};
use super::{PgStore, Tx};
use crate::domain::{Actor, Millis, TaskStatus};
use crate::store::held::{Release, ReleaseReport};
use crate::store::{StoreError, TaskView};

/// Hold every pending job without an execution that recorded `calling`, with `reason`.
fn hold_unsettled(tx: &mut Tx<'_, '_>, reason: &str, now: Millis) -> Result<Vec<String>, StoreError> {
    let ids: Vec<String> = tx
        .rows(
            "SELECT e.task_id FROM envelopes e
             WHERE e.status = 'pending' AND e.held_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM executions x WHERE x.task_id = e.task_id AND x.status = 'running'
                                 AND x.phase IN ('calling', 'accepted'))
             ORDER BY e.task_id FOR UPDATE OF e",
            &[],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for task in &ids {
        tx.exec(
            "UPDATE envelopes SET due_at = NULL, pass = NULL, budget_hold = false, held_at = $2, held_reason = $3
             WHERE task_id = $1 AND status = 'pending'",
            &[task, &now, &reason],
        )?;
        set_task(tx, task, TaskStatus::Waiting, Some(reason), None, now)?;
        event(tx, task, now, Actor::Reconciler, "held", reason, None)?;
    }
    Ok(ids)
}

/// Release held jobs (as `store::held::release_held`).
fn release_held(tx: &mut Tx<'_, '_>, which: &Release, now: Millis) -> Result<ReleaseReport, StoreError> {
    let ids: Vec<String> = match which {
        Release::All => tx
            .rows(
                "SELECT task_id FROM envelopes WHERE status = 'pending' AND held_at IS NOT NULL ORDER BY task_id",
                &[],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect(),
        Release::Ids(ids) => ids.clone(),
    };
    let mut report = ReleaseReport::default();
    for task in ids {
        lock_task(tx, &task)?;
        let row = tx.opt(
            "SELECT t.set_id FROM envelopes e JOIN tasks t ON t.id = e.task_id
             WHERE e.task_id = $1 AND e.status = 'pending' AND e.held_at IS NOT NULL",
            &[&task],
        )?;
        let Some(row) = row else {
            if !report.not_held.contains(&task) {
                report.not_held.push(task);
            }
            continue;
        };
        let set: Option<String> = row.get(0);
        tx.exec("UPDATE envelopes SET held_at = NULL, held_reason = NULL WHERE task_id = $1", &[&task])?;
        let words = "Released by the owner: queued to be sent again (it may be charged again).";
        set_task(tx, &task, TaskStatus::Waiting, Some(words), None, now)?;
        match set {
            // Schedules the set's next unheld shot when none of its shots is live.
            Some(_) => super::sets::schedule_next_shot(tx, &task, now)?,
            None => requeue_envelope(tx, &task, now, None, now)?,
        }
        event(
            tx,
            &task,
            now,
            Actor::Operator,
            "released",
            "the owner released the held job: it is sent again, which may be charged again",
            None,
        )?;
        report.released.push(task);
    }
    Ok(report)
}

fn held_tasks(tx: &mut Tx<'_, '_>, limit: usize) -> Result<(i64, Vec<TaskView>), StoreError> {
    let total: i64 =
        tx.one("SELECT count(*) FROM envelopes WHERE status = 'pending' AND held_at IS NOT NULL", &[])?.get(0);
    let ids: Vec<String> = tx
        .rows(
            "SELECT task_id FROM envelopes WHERE status = 'pending' AND held_at IS NOT NULL ORDER BY task_id LIMIT $1",
            &[&(limit as i64)],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(t) = crate::store::read::task(tx, &id)? {
            out.push(t);
        }
    }
    Ok((total, out))
}

impl PgStore {
    /// Hold every pending job that did not leave (tests and tools; nothing decides on
    /// PostgreSQL that a database is older).
    pub async fn hold_unsettled(&self, reason: String, now: Millis) -> Result<Vec<String>, StoreError> {
        self.write(move |tx| hold_unsettled(tx, &reason, now)).await
    }

    /// Release held jobs.
    pub async fn release_held(&self, which: Release, now: Millis) -> Result<ReleaseReport, StoreError> {
        self.write(move |tx| release_held(tx, &which, now)).await
    }

    /// Held jobs, and how many there are.
    pub async fn held_tasks(&self, limit: usize) -> Result<(i64, Vec<TaskView>), StoreError> {
        self.read(move |tx| held_tasks(tx, limit)).await
    }
}
