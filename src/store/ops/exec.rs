//! The worker's operations, from `calling` to finish (the claim itself is the dispatcher's, in
//! `store::ops::dispatch`). Every write after the claim is fenced on both tokens: it applies
//! only while the execution is `running` with the worker's token and the envelope still carries
//! the worker's lease token — by [`fence`](super::fence), or by the same predicate inside the
//! operation's first statement (`record_calling`, `finish`), with zero rows meaning
//! [`StoreError::Fenced`] and nothing written.

use rusqlite::{Connection, OptionalExtension, params};

use super::*;
use crate::domain::{Actor, Charge, Millis, TaskStatus};

/// The idempotency key sent to the provider for `attempt` of `task`: derived from the task
/// and the attempt, never from the execution row's random token. `attempts` counts the
/// executions that recorded `calling`, in the same transaction as that record; so if a power
/// loss erases a `calling` record (possible with `durability = "normal"`), the task's attempt
/// count goes back with it, the next execution gets the same attempt number, and its request
/// carries the same key as the one that may have left: a provider that honours the key
/// answers it without a second charge. An execution abandoned before calling sent nothing,
/// so its successor reusing the key is harmless.
pub fn provider_key(task: &str, attempt: i64) -> String {
    format!("tally-{task}-{attempt}")
}

/// Durably record "about to call the provider", with the request's price, model and
/// whether the provider bills. From here on, no automatic path calls the provider again for
/// this task unless the adapter can prove it is safe.
///
/// First, in the same operation, the budget check (see `store::spend`): a call that would
/// take a period's spend over a limit is not recorded; the execution is abandoned, the
/// envelope waits in the recovery lane until the period ends (its dispatch not counted as a
/// lost one), and the task is `waiting` with the reason. Nothing was sent and no attempt is
/// counted. Both outcomes are fenced on both tokens in their first write (module docs).
pub(in crate::store) fn record_calling(
    c: &Connection,
    exec: &str,
    lease: &str,
    now: Millis,
    facts: &CallingFacts,
) -> Result<CallingOutcome, StoreError> {
    if let (true, Some(cost), false) = (facts.billable, facts.cost_micros, facts.limits.is_empty()) {
        let provider: Option<String> = c
            .prepare_cached("SELECT t.provider FROM executions x JOIN tasks t ON t.id = x.task_id WHERE x.token = ?1")?
            .query_row([exec], |r| r.get(0))
            .optional()?;
        let Some(provider) = provider else { return Err(StoreError::Fenced) };
        if let Some((due_at, reason)) = crate::store::spend::over_limit(c, &provider, cost, &facts.limits, now)? {
            let task: String = c
                .prepare_cached(
                    "UPDATE executions SET status = 'abandoned', finished_at = ?3, error = ?4
                     WHERE token = ?1 AND status = 'running' AND phase = 'claimed'
                       AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = executions.task_id
                                   AND e.status = 'sent' AND e.lease_token = ?2)
                     RETURNING task_id",
                )?
                .query_row(params![exec, lease, now, reason], |r| r.get(0))
                .optional()?
                .ok_or(StoreError::Fenced)?;
            requeue_envelope(c, &task, due_at, Some("budget"), now)?;
            c.prepare_cached("UPDATE envelopes SET send_count = send_count - 1, budget_hold = 1 WHERE task_id = ?1")?
                .execute([&task])?;
            set_task(c, &task, TaskStatus::Waiting, Some(&reason), None, now)?;
            event(c, &task, now, Actor::Worker, "budget", &reason, Some(exec))?;
            return Ok(CallingOutcome::Held { due_at, reason });
        }
    }
    let charge = if facts.billable { Charge::Possible } else { Charge::None };
    // The fence and the phase change in one statement: only a `claimed` execution that still
    // holds both tokens moves to `calling`.
    let (task, attempt): (String, i64) = c
        .prepare_cached(
            "UPDATE executions SET phase = 'calling', calling_at = ?3, heartbeat_at = ?3, charge = ?4, billable = ?5,
                    cost_micros = ?6, currency = ?7, model = ?8
             WHERE token = ?1 AND status = 'running' AND phase = 'claimed'
               AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = executions.task_id
                           AND e.status = 'sent' AND e.lease_token = ?2)
             RETURNING task_id, attempt",
        )?
        .query_row(
            params![exec, lease, now, charge.as_str(), facts.billable, facts.cost_micros, facts.currency, facts.model],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?
        .ok_or(StoreError::Fenced)?;
    c.prepare_cached("UPDATE tasks SET attempts = attempts + 1, updated_at = ?2 WHERE id = ?1")?
        .execute(params![task, now])?;
    // The timeline says only what is true now: the request is leaving. What it cost is
    // said by the outcome's line, from the evidence.
    let price = match (facts.billable, facts.cost_micros, &facts.currency) {
        (false, _, _) => " (this provider never charges)".to_string(),
        (true, Some(m), Some(cur)) => format!(" (its price: about {})", crate::domain::money(m, cur)),
        _ => String::new(),
    };
    let msg = format!("attempt {attempt}: sending the request to the provider{price}");
    event(c, &task, now, Actor::Worker, "calling", &msg, Some(exec))?;
    Ok(CallingOutcome::Calling)
}

/// Persist the provider's job id (and the adapter's handle for polling it, JSON) the moment
/// it arrives.
pub(in crate::store) fn record_accepted(
    c: &Connection,
    exec: &str,
    lease: &str,
    job: &str,
    handle: Option<&str>,
    now: Millis,
) -> Result<(), StoreError> {
    let task = fence(c, exec, lease, now)?;
    c.prepare_cached(
        "UPDATE executions SET phase = 'accepted', provider_job_id = ?2, provider_handle = ?3 WHERE token = ?1",
    )?
    .execute(params![exec, job, handle])?;
    event(c, &task, now, Actor::Worker, "accepted", &format!("the provider accepted the job as {job}"), Some(exec))?;
    Ok(())
}

/// Extend the worker's lease.
pub(in crate::store) fn heartbeat(
    c: &Connection,
    exec: &str,
    lease: &str,
    now: Millis,
    lease_ms: Millis,
) -> Result<(), StoreError> {
    let task = fence(c, exec, lease, now)?;
    c.prepare_cached("UPDATE envelopes SET lease_expires_at = ?2 WHERE task_id = ?1")?
        .execute(params![task, now + lease_ms])?;
    Ok(())
}

/// End (or pause) an execution, fenced on both tokens.
pub(in crate::store) fn finish(
    c: &Connection,
    exec: &str,
    lease: &str,
    f: &Finish,
    now: Millis,
) -> Result<TaskStatus, StoreError> {
    let (exec_status, error) = match f {
        Finish::Succeeded(_) => ("succeeded", None),
        Finish::Failed { reason, .. } | Finish::RetryLater { reason, .. } => ("failed", Some(reason.as_str())),
        Finish::Unknown { reason } => ("unknown", Some(reason.as_str())),
        Finish::CanceledBeforeCall => ("abandoned", Some("canceled before the call")),
    };
    // The fence, the execution's end and its charge evidence (see `settle_charge`) in one
    // statement.
    let wanted = f.charge();
    let (task, stored, called, cost, currency): (String, String, bool, Option<crate::domain::Micros>, Option<String>) =
        c.prepare_cached(
            "UPDATE executions SET status = ?3, finished_at = ?4, heartbeat_at = ?4, error = ?5,
                    charge = CASE WHEN calling_at IS NULL OR billable = 0 THEN 'none' ELSE ?6 END
             WHERE token = ?1 AND status = 'running'
               AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = executions.task_id
                           AND e.status = 'sent' AND e.lease_token = ?2)
             RETURNING task_id, charge, calling_at IS NOT NULL, cost_micros, currency",
        )?
        .query_row(params![exec, lease, exec_status, now, error, wanted.as_str()], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .optional()?
        .ok_or(StoreError::Fenced)?;
    let charge = Charge::parse(&stored).unwrap_or(Charge::Possible);
    let words = charge_words(called, charge, wanted, cost, currency.as_deref());
    let ex = Some(exec);
    let (status, set) = match f {
        Finish::Succeeded(a) => {
            insert_artifact(c, &task, exec, a, now)?;
            let reason = match charge {
                Charge::Charged => {
                    "A cancel was requested after the request had been sent; the image was kept because the provider \
                     charges for it."
                }
                _ => "A cancel was requested after the request had been sent; the image was kept.",
            };
            let set: Option<String> = c
                .prepare_cached(
                    "UPDATE tasks SET status = 'succeeded', failure_kind = NULL, updated_at = ?2,
                            reason = CASE WHEN cancel_requested = 1 THEN ?3 END
                     WHERE id = ?1 RETURNING set_id",
                )?
                .query_row(params![task, now, reason], |r| r.get(0))?;
            consume_envelope(c, &task, "consumed", None)?;
            let saved = format!("image stored ({} bytes, sha256 {})", a.image.len(), a.image.sha256());
            event(c, &task, now, Actor::Worker, "succeeded", &with_money(&saved, &words), ex)?;
            // Crash matrix: the image and `succeeded` are written but not committed.
            crate::failpoint::crash("before-finish-commit");
            (TaskStatus::Succeeded, set)
        }
        Finish::Failed { kind, reason, .. } => {
            set_task(c, &task, TaskStatus::Failed, Some(reason), Some(*kind), now)?;
            consume_envelope(c, &task, "consumed", Some(reason))?;
            event(c, &task, now, Actor::Worker, "failed", &with_money(reason, &words), ex)?;
            (TaskStatus::Failed, set_of(c, &task)?)
        }
        Finish::Unknown { reason } => {
            set_task(c, &task, TaskStatus::Unknown, Some(reason), None, now)?;
            consume_envelope(c, &task, "consumed", Some(reason))?;
            let line = format!("{reason}; automatic retries stopped");
            event(c, &task, now, Actor::Worker, "unknown", &with_money(&line, &words), ex)?;
            (TaskStatus::Unknown, set_of(c, &task)?)
        }
        Finish::RetryLater { due_at, kind, reason, max_attempts, counted, .. } => {
            if !*counted {
                // A "not now": the provider refused this request, so it is not an attempt.
                c.prepare_cached("UPDATE tasks SET attempts = max(0, attempts - 1) WHERE id = ?1")?.execute([&task])?;
                c.prepare_cached("UPDATE envelopes SET send_count = max(0, send_count - 1) WHERE task_id = ?1")?
                    .execute([&task])?;
            }
            let attempts: i64 =
                c.prepare_cached("SELECT attempts FROM tasks WHERE id = ?1")?.query_row([&task], |r| r.get(0))?;
            if *counted && attempts >= *max_attempts {
                let why = format!("gave up after {attempts} attempts; the last one: {reason}");
                set_task(c, &task, TaskStatus::Failed, Some(&why), Some(*kind), now)?;
                consume_envelope(c, &task, "consumed", Some(reason))?;
                event(c, &task, now, Actor::Worker, "failed", &with_money(&why, &words), ex)?;
                (TaskStatus::Failed, set_of(c, &task)?)
            } else {
                let secs = (due_at - now).max(0) as f64 / 1000.0;
                let why = if *counted {
                    format!("attempt {attempts} did not go through ({reason}); trying again in {secs:.1} s")
                } else {
                    format!("the provider did not take the request yet ({reason}); trying again in {secs:.1} s")
                };
                set_task(c, &task, TaskStatus::Waiting, Some(&why), None, now)?;
                requeue_envelope(c, &task, *due_at, Some(reason), now)?;
                event(c, &task, now, Actor::Worker, "retry_scheduled", &with_money(&why, &words), ex)?;
                return Ok(TaskStatus::Waiting);
            }
        }
        Finish::CanceledBeforeCall => {
            set_task(c, &task, TaskStatus::Canceled, Some("Nothing was sent to the provider."), None, now)?;
            consume_envelope(c, &task, "consumed", None)?;
            event(c, &task, now, Actor::Worker, "canceled", "canceled before anything was sent", ex)?;
            (TaskStatus::Canceled, set_of(c, &task)?)
        }
    };
    if let Some(set) = set {
        crate::store::sets::schedule_next_shot_of(c, &set, now)?;
    }
    Ok(status)
}

/// The image set a task belongs to, if any.
fn set_of(c: &Connection, task: &str) -> Result<Option<String>, StoreError> {
    Ok(c.prepare_cached("SELECT set_id FROM tasks WHERE id = ?1")?
        .query_row([task], |r| r.get(0))
        .optional()?
        .flatten())
}

/// A result that arrived after the task was marked `unknown`, from the same execution: it is
/// evidence, and resolves the task. Returns false if the execution is not `unknown` (then
/// nothing is stored: the image bytes are dropped with the operation).
pub(in crate::store) fn late_result(
    c: &Connection,
    exec: &str,
    a: &NewArtifact,
    now: Millis,
) -> Result<bool, StoreError> {
    let task: Option<String> = c
        .prepare_cached(
            "UPDATE executions SET status = 'succeeded', finished_at = ?2
             WHERE token = ?1 AND status = 'unknown'
               AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = executions.task_id AND t.status = 'unknown')
             RETURNING task_id",
        )?
        .query_row(params![exec, now], |r| r.get(0))
        .optional()?;
    let Some(task) = task else { return Ok(false) };
    let (_, words) = settle_charge(c, exec, Charge::Charged)?;
    insert_artifact(c, &task, exec, a, now)?;
    set_task(
        c,
        &task,
        TaskStatus::Succeeded,
        Some("The answer arrived late, after the outcome had been marked unknown."),
        None,
        now,
    )?;
    event(
        c,
        &task,
        now,
        Actor::Worker,
        "late_result",
        &with_money("a late answer from the same execution resolved the unknown outcome", &words),
        Some(exec),
    )?;
    Ok(true)
}

impl SqliteStore {
    /// Check the budgets and durably record phase `calling` (see [`record_calling`]).
    pub async fn record_calling(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        facts: CallingFacts,
    ) -> Result<CallingOutcome, StoreError> {
        self.write(move |c| record_calling(c, &exec, &lease, now, &facts)).await
    }

    /// Persist an accepted job id.
    pub async fn record_accepted(
        &self,
        exec: String,
        lease: String,
        job: String,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.write(move |c| record_accepted(c, &exec, &lease, &job, None, now)).await
    }

    /// Like [`SqliteStore::record_accepted`], with the adapter's handle for polling the job
    /// (`executions.provider_handle`, JSON).
    pub async fn record_accepted_with(
        &self,
        exec: String,
        lease: String,
        job: String,
        handle: Option<String>,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.write(move |c| record_accepted(c, &exec, &lease, &job, handle.as_deref(), now)).await
    }

    /// Extend a lease (ordered commit: after a power loss every lease counts as expired).
    pub async fn heartbeat(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        lease_ms: Millis,
    ) -> Result<(), StoreError> {
        self.write_ordered(move |c| heartbeat(c, &exec, &lease, now, lease_ms)).await
    }

    /// End or pause an execution.
    /// A `Succeeded` finish stores the image's bytes in the same transaction.
    pub async fn finish(&self, exec: String, lease: String, f: Finish, now: Millis) -> Result<TaskStatus, StoreError> {
        let bytes = match &f {
            Finish::Succeeded(a) => a.image.len() as usize,
            _ => 0,
        };
        self.write_images(bytes, move |c| finish(c, &exec, &lease, &f, now)).await
    }

    /// Attach a late result (its bytes in the same transaction) to an `unknown` execution.
    pub async fn late_result(&self, exec: String, a: NewArtifact, now: Millis) -> Result<bool, StoreError> {
        self.write_images(a.image.len() as usize, move |c| late_result(c, &exec, &a, now)).await
    }
}
