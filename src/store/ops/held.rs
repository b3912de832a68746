//! Held jobs, written once over [`Tx`] (what holding means, and the types, are in
//! `store::held`): hold what an older copy of the database would send again, release it on
//! the owner's word, list it.
//!
//! **Where the backends differ** (one named hook, [`holds_claims`]): SQLite holds only at the
//! start-up of an older database file, while no daemon serves it, so a claimed execution there
//! is a leftover of an earlier run and is held too (abandoned, as recovery would). A
//! PostgreSQL database is never copied as a file, and a claimed envelope may belong to a live
//! node: there only *pending* envelopes are held, each locked (`FOR UPDATE`) as it is chosen.

use super::common::{PerDialect, event, requeue_envelope, schedule_next_shot_of, set_task};
use crate::domain::Charge;
use crate::domain::words::{said_param, say, say_with};
use crate::domain::{Actor, Millis, TaskStatus};
use crate::store::held::{Held, HeldLook, HeldSettle, LOOK_NOTE, Release, ReleaseReport, Settled};
use crate::store::tx::{Dialect, Tx};
use crate::store::{StoreError, TaskView};

/// Envelopes whose job [`hold_unsettled`] holds on SQLite: live, not held yet, and without an
/// execution that recorded `calling` (those go through recovery). Shared with the start-up
/// forecast's count (`store::held::count_holdable`).
pub(in crate::store) const HOLDABLE: &str = "SELECT e.task_id FROM envelopes e
     WHERE e.status IN ('pending', 'sent') AND e.held_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM executions x WHERE x.task_id = e.task_id AND x.status = 'running'
                         AND x.phase IN ('calling', 'accepted'))
     ORDER BY e.task_id";

/// The same on PostgreSQL: pending envelopes only, each locked as it is chosen.
const HOLDABLE_PENDING: &str = "SELECT e.task_id FROM envelopes e
     WHERE e.status = 'pending' AND e.held_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM executions x WHERE x.task_id = e.task_id AND x.status = 'running'
                         AND x.phase IN ('calling', 'accepted'))
     ORDER BY e.task_id FOR UPDATE OF e";

/// Whether holding takes claimed (sent) envelopes too: only on SQLite, where it runs while no
/// daemon serves the database (see the module docs).
fn holds_claims(d: Dialect) -> bool {
    d == Dialect::Sqlite
}

/// Hold every job that was not settled and whose request did not leave (see the module docs
/// and `store::held`), with `reason`. Returns the held task ids.
pub(in crate::store) fn hold_unsettled(tx: &mut dyn Tx, reason: &str, now: Millis) -> Result<Vec<String>, StoreError> {
    let claims = holds_claims(tx.dialect());
    let ids = tx
        .rows(if claims { HOLDABLE } else { HOLDABLE_PENDING }, &[])?
        .iter()
        .map(|r| r.get::<String>(0))
        .collect::<Result<Vec<_>, _>>()?;
    for task in &ids {
        let abandoned: Option<String> = if claims {
            tx.opt(
                "UPDATE executions SET status = 'abandoned', finished_at = ?2, error = ?3
                 WHERE task_id = ?1 AND status = 'running' AND phase = 'claimed' RETURNING token",
                &[task, &now, &"held: the database is older than what was served"],
            )?
            .map(|r| r.get(0))
            .transpose()?
        } else {
            None
        };
        // A pending envelope has no lease, so clearing it changes nothing there; a claimed one
        // (SQLite only, above) goes back to pending without its lease.
        tx.exec(
            "UPDATE envelopes SET status = 'pending', due_at = NULL, pass = NULL, budget_hold = false,
                    lease_token = NULL, lease_expires_at = NULL, lease_boot = NULL,
                    held_at = ?2, held_reason = ?3
             WHERE task_id = ?1",
            &[task, &now, &reason],
        )?;
        set_task(tx, task, TaskStatus::Waiting, Some(reason), None, now)?;
        event(tx, task, now, Actor::Reconciler, "held", reason, abandoned.as_deref())?;
    }
    Ok(ids)
}

/// Release held jobs: each is queued to be sent again (in the recovery lane); a task of an
/// image set goes by its set's schedule (`common::schedule_next_shot_of`): at once when it is
/// of the set's current shot (or nothing of the set is live and its shot is the lowest
/// waiting), else when the shots before it are settled. Each task is locked before it is
/// looked at.
pub(in crate::store) fn release_held(
    tx: &mut dyn Tx,
    which: &Release,
    now: Millis,
) -> Result<ReleaseReport, StoreError> {
    let ids: Vec<String> = match which {
        Release::All => tx
            .rows(
                "SELECT task_id FROM envelopes WHERE status = 'pending' AND held_at IS NOT NULL ORDER BY task_id",
                &[],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect::<Result<_, _>>()?,
        Release::Ids(ids) => ids.clone(),
    };
    let mut report = ReleaseReport::default();
    for task in ids {
        tx.lock_task(&task)?;
        let row = tx.opt(
            "SELECT t.set_id FROM envelopes e JOIN tasks t ON t.id = e.task_id
             WHERE e.task_id = ?1 AND e.status = 'pending' AND e.held_at IS NOT NULL",
            &[&task],
        )?;
        let Some(row) = row else {
            if !report.not_held.contains(&task) {
                report.not_held.push(task);
            }
            continue;
        };
        let set: Option<String> = row.get(0)?;
        tx.exec("UPDATE envelopes SET held_at = NULL, held_reason = NULL WHERE task_id = ?1", &[&task])?;
        let words = say("say.released");
        set_task(tx, &task, TaskStatus::Waiting, Some(&words), None, now)?;
        match &set {
            // Schedules the unheld waiting tasks of the set's current shot (the live one, or
            // the lowest waiting when nothing of the set is live).
            Some(set) => schedule_next_shot_of(tx, set, now)?,
            None => requeue_envelope(tx, &task, now, None, now)?,
        }
        event(tx, &task, now, Actor::Operator, "released", &say("say.released_line"), None)?;
        report.released.push(task);
    }
    Ok(report)
}

/// Apply what a look at the provider decided about a held job (`store::held`), only while the
/// job is still held as the look read it: the same hold (`since`), and no attempt since
/// (`attempts`); else [`Settled::Changed`] and nothing is written. The task is locked first.
///
/// [`HeldSettle::Adopt`] writes the found request as the job's execution — `running`, phase
/// `accepted` with the provider's job id, `calling` now with the request's price (charge
/// `possible` until the poll proves more) — and its envelope `sent` on a lease that has run
/// out and names no live run (`lease_boot` [`ADOPTED_BOOT`]), so recovery resumes it at once
/// and a worker polls it: its image and charge evidence land through the fenced finish, and
/// nothing is sent. `node` is the PostgreSQL node adopting it (its executions name one).
pub(in crate::store) fn settle_held(
    tx: &mut dyn Tx,
    look: &HeldLook,
    node: Option<&str>,
    now: Millis,
) -> Result<Settled, StoreError> {
    let task = look.task.as_str();
    tx.lock_task(task)?;
    let Some(row) = tx.opt(
        "SELECT e.held_at, e.held_reason, t.attempts, t.set_id FROM envelopes e JOIN tasks t ON t.id = e.task_id
         WHERE e.task_id = ?1 AND e.status = 'pending' AND e.held_at IS NOT NULL",
        &[&task],
    )?
    else {
        return Ok(Settled::Changed);
    };
    let (since, reason, attempts, set): (Millis, Option<String>, i64, Option<String>) =
        (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
    if since != look.since || attempts != look.attempts {
        return Ok(Settled::Changed);
    }
    match &look.settle {
        HeldSettle::Keep { found } => {
            // The reason as it was before any look (a later look replaces the earlier one's).
            let reason_text = reason.as_deref().unwrap_or_default();
            let base = said_param(reason_text, "say.held_looked", "base")
                .unwrap_or_else(|| reason_text.split(LOOK_NOTE).next().unwrap_or(reason_text).to_string());
            let words = say_with("say.held_looked", &[("base", &base), ("found", found)]);
            if reason.as_deref() == Some(words.as_str()) {
                return Ok(Settled::Kept);
            }
            tx.exec("UPDATE envelopes SET held_reason = ?2 WHERE task_id = ?1", &[&task, &words])?;
            set_task(tx, task, TaskStatus::Waiting, Some(&words), None, now)?;
            let line = say_with("say.looked_up", &[("found", found)]);
            event(tx, task, now, Actor::Reconciler, "looked_up", &line, None)?;
            Ok(Settled::Kept)
        }
        HeldSettle::Adopt { job_id, key, attempt, facts } => {
            if *attempt <= attempts {
                return Err(StoreError::Invalid(format!(
                    "task {task}: a request found at the provider must be a later attempt than the {attempts} recorded"
                )));
            }
            if let Some(set) = &set {
                tx.lock_set(set)?;
                // A set's live tasks belong to one position: a task of another shot is live,
                // so this one waits for it (a candidate of the live shot goes beside it).
                let position: Option<i64> = tx.one("SELECT set_position FROM tasks WHERE id = ?1", &[&task])?.get(0)?;
                let admitted = match position {
                    Some(p) => crate::store::ops::common::set_admits(tx, set, p)?,
                    None => false,
                };
                if !admitted {
                    return Ok(Settled::SetBusy);
                }
                // A request of it reached the provider, so its set was started (a copy to edit
                // restored from a backup taken before its start): it no longer shows as one.
                tx.exec("UPDATE sets SET started_at = ?2 WHERE id = ?1 AND started_at IS NULL", &[set, &now])?;
            }
            let token = uuid::Uuid::new_v4().to_string();
            let lease = uuid::Uuid::new_v4().to_string();
            let charge = if facts.billable { Charge::Possible } else { Charge::None }.as_str();
            let pg = tx.dialect() == Dialect::Postgres;
            let node = node.unwrap_or_default().to_string();
            let mut params: Vec<&dyn crate::store::tx::Param> = vec![
                &token,
                &task,
                attempt,
                key,
                job_id,
                &ADOPTED_BOOT,
                &now,
                &charge,
                &facts.billable,
                &facts.cost_micros,
                &facts.currency,
                &facts.model,
            ];
            if pg {
                params.push(&node);
            }
            tx.exec(ADOPT_EXECUTION.get(tx), &params)?;
            tx.exec("UPDATE tasks SET attempts = ?2 WHERE id = ?1", &[&task, attempt])?;
            let mut params: Vec<&dyn crate::store::tx::Param> = vec![&task, &lease, &now, &ADOPTED_BOOT];
            if pg {
                params.push(&node);
            }
            tx.exec(ADOPT_ENVELOPE.get(tx), &params)?;
            let words = format!(
                "Found at the provider as job {job_id}: the daemon this copy came from had sent it. tally asks the \
                 provider for its result; nothing is sent again."
            );
            set_task(tx, task, TaskStatus::Running, Some(&words), None, now)?;
            let line = format!(
                "the provider shows this job's request (attempt {attempt}) as job {job_id}, sent by the daemon the \
                 copy came from: its result is fetched, nothing is sent again"
            );
            event(tx, task, now, Actor::Reconciler, "found_at_provider", &line, Some(&token))?;
            Ok(Settled::Adopted)
        }
    }
}

/// The execution of a held job's request found at the provider (`settle_held`): `?1` token,
/// `?2` task, `?3` attempt, `?4` key, `?5` job id, `?6` run, `?7` now, `?8` charge, `?9`
/// billable, `?10`..`?12` cost, currency, model (PostgreSQL: `?13` the node).
static ADOPT_EXECUTION: PerDialect = PerDialect::new(adopt_execution_sql);

fn adopt_execution_sql(d: Dialect) -> String {
    let (column, value) = match d {
        Dialect::Sqlite => ("", ""),
        Dialect::Postgres => (", node_id", ", ?13"),
    };
    format!(
        "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, provider_job_id, boot_id,
            heartbeat_at, started_at, calling_at, charge, billable, cost_micros, currency, model{column})
         VALUES (?1, ?2, ?3, 'running', 'accepted', ?4, ?5, ?6, ?7, ?7, ?7, ?8, ?9, ?10, ?11, ?12{value})"
    )
}

/// Its envelope, `sent` on a lease that ran out at once: `?1` task, `?2` lease token, `?3`
/// now, `?4` the run (PostgreSQL: `?5` the node).
static ADOPT_ENVELOPE: PerDialect = PerDialect::new(adopt_envelope_sql);

fn adopt_envelope_sql(d: Dialect) -> String {
    let node = match d {
        Dialect::Sqlite => "",
        Dialect::Postgres => ", lease_node = ?5",
    };
    format!(
        "UPDATE envelopes SET status = 'sent', sent_at = ?3, send_count = send_count + 1, lease_token = ?2,
            lease_expires_at = ?3, lease_boot = ?4, due_at = NULL, pass = NULL, budget_hold = false, held_at = NULL,
            held_reason = NULL{node}
         WHERE task_id = ?1"
    )
}

/// The run named by the lease of a held job found at the provider: no process ever runs as
/// it, so recovery takes the lease over at once.
pub(in crate::store) const ADOPTED_BOOT: &str = "held-lookup";

/// The hold of one task, if it is held.
pub(crate) fn held_of(tx: &mut dyn Tx, task: &str) -> Result<Option<Held>, StoreError> {
    let Some(r) = tx.opt(
        "SELECT held_reason, held_at FROM envelopes WHERE task_id = ?1 AND status = 'pending' AND held_at IS NOT NULL",
        &[&task],
    )?
    else {
        return Ok(None);
    };
    Ok(Some(Held { reason: r.get::<Option<String>>(0)?.unwrap_or_default(), since: r.get(1)? }))
}

/// How many jobs are held.
pub(in crate::store) fn count_held(tx: &mut dyn Tx) -> Result<i64, StoreError> {
    tx.one("SELECT count(*) FROM envelopes WHERE status = 'pending' AND held_at IS NOT NULL", &[])?.get(0)
}

/// Held jobs, oldest task first, at most `limit` of them, and how many there are.
pub(in crate::store) fn held_tasks(tx: &mut dyn Tx, limit: usize) -> Result<(i64, Vec<TaskView>), StoreError> {
    let total = count_held(tx)?;
    let ids = tx
        .rows(
            "SELECT task_id FROM envelopes WHERE status = 'pending' AND held_at IS NOT NULL ORDER BY task_id LIMIT ?1",
            &[&(limit as i64)],
        )?
        .iter()
        .map(|r| r.get::<String>(0))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(t) = crate::store::read::task(tx, &id)? {
            out.push(t);
        }
    }
    Ok((total, out))
}

/// Dismiss notice `id` (the owner has read it and looked); `false` when there is none to dismiss.
pub(in crate::store) fn dismiss_notice(tx: &mut dyn Tx, id: i64, now: Millis) -> Result<bool, StoreError> {
    Ok(tx.exec("UPDATE notices SET dismissed_at = ?2 WHERE id = ?1 AND dismissed_at IS NULL", &[&id, &now])? > 0)
}
