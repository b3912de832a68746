//! Held jobs: what an older copy of the database would otherwise send again
//! (`store::lineage` decides when a database is older).
//!
//! A held job's envelope is `pending` with `due_at` and `pass` NULL and `held_at` /
//! `held_reason` set; its task is `waiting` with the reason. The dispatcher only claims ready
//! envelopes (`pass` set) and only promotes waiting ones with a due time, and the next shot of
//! a set is only scheduled from unheld envelopes (`sets::schedule_next_shot_of`), so nothing
//! dispatches a held envelope and nothing polls for it: it moves only when the owner releases
//! it ([`release_held`]) or cancels it.
//!
//! What is held: every job that was not settled in the database and whose request did not
//! leave in it — queued and waiting ones, and claimed executions that had not recorded
//! `calling` (abandoned here, as recovery would). A job whose execution recorded `calling` or
//! `accepted` is left to start-up recovery, which never sends it blind (a replay with the same
//! key, a lookup, or `unknown`).

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use super::ops::{event, requeue_envelope, set_task};
use super::{SqliteStore, StoreError, TaskView};
use crate::domain::{Actor, Millis, TaskStatus};

/// Why a task is held, and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Held {
    pub reason: String,
    pub since: Millis,
}

/// Which held jobs to release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    All,
    Ids(Vec<String>),
}

/// What a release did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReleaseReport {
    /// Released, and queued to be sent again.
    pub released: Vec<String>,
    /// Named, but not held (unknown ids, or jobs released or canceled already).
    pub not_held: Vec<String>,
}

/// Envelopes whose job [`hold_unsettled`] holds: live, not held yet, and without an execution
/// that recorded `calling` (those go through recovery). Shared with the forecast's count.
const HOLDABLE: &str = "SELECT e.task_id FROM envelopes e
     WHERE e.status IN ('pending', 'sent') AND e.held_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM executions x WHERE x.task_id = e.task_id AND x.status = 'running'
                         AND x.phase IN ('calling', 'accepted'))
     ORDER BY e.task_id";

/// How many jobs [`hold_unsettled`] would hold.
pub(crate) fn count_holdable(c: &Connection) -> Result<i64, StoreError> {
    Ok(c.query_row(&format!("SELECT count(*) FROM ({HOLDABLE})"), [], |r| r.get(0))?)
}

/// How many jobs are held.
pub(crate) fn count_held(c: &Connection) -> Result<i64, StoreError> {
    Ok(c.query_row("SELECT count(*) FROM envelopes WHERE status = 'pending' AND held_at IS NOT NULL", [], |r| {
        r.get(0)
    })?)
}

/// Hold every job that was not settled and whose request did not leave (see the module
/// docs), with `reason`. Only while no daemon serves the database (start-up): a claimed
/// execution here is a leftover of an earlier run. Returns the held task ids.
pub(crate) fn hold_unsettled(c: &Connection, reason: &str, now: Millis) -> Result<Vec<String>, StoreError> {
    let ids: Vec<String> =
        c.prepare(HOLDABLE)?.query_map([], |r| r.get(0))?.collect::<Result<_, _>>().map_err(StoreError::from)?;
    for task in &ids {
        let abandoned: Option<String> = c
            .prepare_cached(
                "UPDATE executions SET status = 'abandoned', finished_at = ?2, error = ?3
                 WHERE task_id = ?1 AND status = 'running' AND phase = 'claimed' RETURNING token",
            )?
            .query_row(params![task, now, "held: the database is older than what was served"], |r| r.get(0))
            .optional()?;
        c.prepare_cached(
            "UPDATE envelopes SET status = 'pending', due_at = NULL, pass = NULL, budget_hold = 0,
                    lease_token = NULL, lease_expires_at = NULL, lease_boot = NULL,
                    held_at = ?2, held_reason = ?3
             WHERE task_id = ?1",
        )?
        .execute(params![task, now, reason])?;
        set_task(c, task, TaskStatus::Waiting, Some(reason), None, now)?;
        event(c, task, now, Actor::Reconciler, "held", reason, abandoned.as_deref())?;
    }
    Ok(ids)
}

/// Release held jobs: each is queued to be sent again (in the recovery lane); a shot of an
/// image set goes when no other shot of its set is live (a set runs one shot at a time).
pub(crate) fn release_held(c: &Connection, which: &Release, now: Millis) -> Result<ReleaseReport, StoreError> {
    let ids: Vec<String> = match which {
        Release::All => c
            .prepare_cached(
                "SELECT task_id FROM envelopes WHERE status = 'pending' AND held_at IS NOT NULL ORDER BY task_id",
            )?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?,
        Release::Ids(ids) => ids.clone(),
    };
    let mut report = ReleaseReport::default();
    for task in ids {
        let set: Option<Option<String>> = c
            .prepare_cached(
                "SELECT t.set_id FROM envelopes e JOIN tasks t ON t.id = e.task_id
                 WHERE e.task_id = ?1 AND e.status = 'pending' AND e.held_at IS NOT NULL",
            )?
            .query_row([&task], |r| r.get(0))
            .optional()?;
        let Some(set) = set else {
            if !report.not_held.contains(&task) {
                report.not_held.push(task);
            }
            continue;
        };
        c.prepare_cached("UPDATE envelopes SET held_at = NULL, held_reason = NULL WHERE task_id = ?1")?
            .execute([&task])?;
        let words = "Released by the owner: queued to be sent again (it may be charged again).";
        set_task(c, &task, TaskStatus::Waiting, Some(words), None, now)?;
        match &set {
            Some(set) => super::sets::schedule_next_shot_of(c, set, now)?,
            None => requeue_envelope(c, &task, now, None, now)?,
        }
        event(
            c,
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

/// The hold of one task, if it is held (either backend: the task views of `store::read`).
pub(crate) fn held_of(tx: &mut dyn super::tx::Tx, task: &str) -> Result<Option<Held>, StoreError> {
    let sql =
        "SELECT held_reason, held_at FROM envelopes WHERE task_id = ?1 AND status = 'pending' AND held_at IS NOT NULL";
    match tx.opt(sql, &[&task])? {
        Some(r) => Ok(Some(Held { reason: r.get::<Option<String>>(0)?.unwrap_or_default(), since: r.get(1)? })),
        None => Ok(None),
    }
}

/// Held jobs, oldest task first, at most `limit` of them, and how many there are.
pub(crate) fn held_tasks(c: &Connection, limit: usize) -> Result<(i64, Vec<TaskView>), StoreError> {
    let total = count_held(c)?;
    let ids: Vec<String> = c
        .prepare_cached(
            "SELECT task_id FROM envelopes WHERE status = 'pending' AND held_at IS NOT NULL ORDER BY task_id LIMIT ?1",
        )?
        .query_map([limit as i64], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(t) = super::read::get_task(c, &id)? {
            out.push(t);
        }
    }
    Ok((total, out))
}

impl SqliteStore {
    /// Hold every unsettled job that did not leave (start-up of an older database; tests).
    pub async fn hold_unsettled(&self, reason: String, now: Millis) -> Result<Vec<String>, StoreError> {
        self.write(move |c| hold_unsettled(c, &reason, now)).await
    }

    /// Release held jobs (the owner's "send it again").
    pub async fn release_held(&self, which: Release, now: Millis) -> Result<ReleaseReport, StoreError> {
        self.write(move |c| release_held(c, &which, now)).await
    }

    /// Held jobs, and how many there are.
    pub async fn held_tasks(&self, limit: usize) -> Result<(i64, Vec<TaskView>), StoreError> {
        self.read(move |c| held_tasks(c, limit)).await
    }
}
