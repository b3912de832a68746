//! The worker's operations, from claim to finish. Everything after the claim starts with
//! [`fence`](super::fence): a write is applied only while the worker still holds both tokens.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::*;
use crate::domain::{Actor, Charge, Millis, Phase, TaskStatus};

/// What a claim reads of its task: (status, prompt, params, attempts, cancel_requested,
/// created_at, set_id).
type TaskRow = (String, String, String, i64, bool, Millis, Option<String>);

/// A running execution's (token, phase, job id, idempotency key, calling_at, attempt).
type RunningRow = (String, String, Option<String>, String, Option<Millis>, i64);

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

/// Claim a handed-off envelope: take its lease and open (or adopt) an execution.
pub(in crate::store) fn claim(
    c: &Connection,
    h: &Handoff,
    lease: &str,
    boot: &str,
    now: Millis,
    lease_ms: Millis,
) -> Result<ClaimOutcome, StoreError> {
    let n = c
        .prepare_cached(
            "UPDATE envelopes SET lease_token = ?3, lease_expires_at = ?4, lease_boot = ?5
             WHERE id = ?1 AND status = 'sent' AND lease_token IS NULL AND send_count = ?2",
        )?
        .execute(params![h.envelope_id, h.send_count, lease, now + lease_ms, boot])?;
    if n == 0 {
        return Ok(ClaimOutcome::Lost);
    }
    let (status, prompt, params_text, attempts, cancel_requested, created_at, set_id): TaskRow = c
        .prepare_cached(
            "SELECT status, prompt, params, attempts, cancel_requested, created_at, set_id FROM tasks WHERE id = ?1",
        )?
        .query_row([&h.task_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
        })?;
    let status = TaskStatus::parse(&status).unwrap_or(TaskStatus::Failed);
    if status.is_settled() {
        consume_envelope(c, &h.task_id, "consumed", None)?;
        return Ok(ClaimOutcome::Lost);
    }
    let params: Value = serde_json::from_str(&params_text).unwrap_or(Value::Null);
    let references = match &set_id {
        Some(set) => crate::store::sets::references_of_set(c, set)?,
        None => Vec::new(),
    };
    let running: Option<RunningRow> = c
        .prepare_cached(
            "SELECT token, phase, provider_job_id, idempotency_key, calling_at, attempt
             FROM executions WHERE task_id = ?1 AND status = 'running'",
        )?
        .query_row([&h.task_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))
        .optional()?;
    let (execution_token, phase, job_id, idempotency_key, calling_at, attempt, resumed) = match running {
        Some((token, phase, job_id, key, calling_at, attempt)) => {
            c.prepare_cached("UPDATE executions SET boot_id = ?2, heartbeat_at = ?3 WHERE token = ?1")?
                .execute(params![token, boot, now])?;
            let phase = Phase::parse(&phase).unwrap_or(Phase::Calling);
            let how = match phase {
                Phase::Accepted => "polling the job the provider already accepted, instead of sending again",
                _ => "recovering the earlier call without blindly sending it again",
            };
            let msg = format!("attempt {attempt} resumed: {how}");
            event(c, &h.task_id, now, Actor::Worker, "resumed", &msg, Some(&token))?;
            (token, phase, job_id, key, calling_at, attempt, true)
        }
        None => {
            let token = uuid::Uuid::new_v4().to_string();
            let attempt = attempts + 1;
            let key = provider_key(&h.task_id, attempt);
            c.prepare_cached(
                "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, boot_id, heartbeat_at, started_at)
                 VALUES (?1, ?2, ?3, 'running', 'claimed', ?4, ?5, ?6, ?6)",
            )?
            .execute(params![token, h.task_id, attempt, key, boot, now])?;
            event(c, &h.task_id, now, Actor::Worker, "claimed", &format!("attempt {attempt} started"), Some(&token))?;
            (token, Phase::Claimed, None, key, None, attempt, false)
        }
    };
    // The handle an adapter persisted with the job id (fal's status/response URLs), if any.
    let job_handle: Option<String> = match phase {
        Phase::Accepted => c
            .prepare_cached("SELECT provider_handle FROM executions WHERE token = ?1")?
            .query_row([&execution_token], |r| r.get(0))?,
        _ => None,
    };
    let claim = Claim {
        job_handle,
        execution_token,
        lease_token: lease.into(),
        task_id: h.task_id.clone(),
        provider: h.provider.clone(),
        prompt,
        params,
        attempt,
        phase,
        job_id,
        idempotency_key,
        calling_at,
        resumed,
        cancel_requested,
        created_at,
        references,
    };
    set_task(c, &h.task_id, TaskStatus::Running, None, None, now)?;
    Ok(ClaimOutcome::Claimed(Box::new(claim)))
}

/// Durably record "about to call the provider", with the request's price, model and
/// whether the provider bills. From here on, no automatic path calls the provider again for
/// this task unless the adapter can prove it is safe.
///
/// First, in the same operation, the budget check (see `store::spend`): a call that would
/// take a period's spend over a limit is not recorded; the execution is abandoned, the
/// envelope waits until the period ends (its hand-off taken back, as a busy release does),
/// and the task is `waiting` with the reason. Nothing was sent and no attempt is counted.
pub(in crate::store) fn record_calling(
    c: &Connection,
    exec: &str,
    lease: &str,
    now: Millis,
    facts: &CallingFacts,
) -> Result<CallingOutcome, StoreError> {
    let task = fence(c, exec, lease, now)?;
    if let (true, Some(cost), false) = (facts.billable, facts.cost_micros, facts.limits.is_empty()) {
        let provider: String =
            c.prepare_cached("SELECT provider FROM tasks WHERE id = ?1")?.query_row([&task], |r| r.get(0))?;
        if let Some((due_at, reason)) = crate::store::spend::over_limit(c, &provider, cost, &facts.limits, now)? {
            c.prepare_cached(
                "UPDATE executions SET status = 'abandoned', finished_at = ?2, error = ?3 WHERE token = ?1 AND phase = 'claimed'",
            )?
            .execute(params![exec, now, reason])?;
            c.prepare_cached(
                "UPDATE envelopes SET status = 'pending', due_at = ?2, send_count = send_count - 1, lease_token = NULL,
                        lease_expires_at = NULL, lease_boot = NULL, budget_hold = 1, last_error = 'budget'
                 WHERE task_id = ?1",
            )?
            .execute(params![task, due_at])?;
            set_task(c, &task, TaskStatus::Waiting, Some(&reason), None, now)?;
            event(c, &task, now, Actor::Worker, "budget", &reason, Some(exec))?;
            return Ok(CallingOutcome::Held { due_at, reason });
        }
    }
    let charge = if facts.billable { Charge::Possible } else { Charge::None };
    let n = c
        .prepare_cached(
            "UPDATE executions SET phase = 'calling', calling_at = ?2, charge = ?3, billable = ?4, cost_micros = ?5,
                    currency = ?6, model = ?7
             WHERE token = ?1 AND phase = 'claimed'",
        )?
        .execute(params![exec, now, charge.as_str(), facts.billable, facts.cost_micros, facts.currency, facts.model])?;
    if n == 0 {
        return Err(StoreError::Fenced);
    }
    c.prepare_cached("UPDATE envelopes SET budget_hold = 0 WHERE task_id = ?1 AND budget_hold = 1")?
        .execute([&task])?;
    c.prepare_cached("UPDATE tasks SET attempts = attempts + 1, updated_at = ?2 WHERE id = ?1")?
        .execute(params![task, now])?;
    // The timeline says only what is true now: the request is leaving. What it cost is
    // said by the outcome's line, from the evidence.
    let price = match (facts.billable, facts.cost_micros, &facts.currency) {
        (false, _, _) => " (this provider never charges)".to_string(),
        (true, Some(m), Some(cur)) => format!(" (its price: about {})", crate::domain::money(m, cur)),
        _ => String::new(),
    };
    event(c, &task, now, Actor::Worker, "calling", &format!("sending the request to the provider{price}"), Some(exec))?;
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
    let task = fence(c, exec, lease, now)?;
    let set_exec = |status: &str, error: Option<&str>| -> Result<(), StoreError> {
        c.prepare_cached("UPDATE executions SET status = ?2, finished_at = ?3, error = ?4 WHERE token = ?1")?
            .execute(params![exec, status, now, error])?;
        Ok(())
    };
    let ex = Some(exec);
    let (charge, words) = settle_charge(c, exec, f.charge())?;
    let status = match f {
        Finish::Succeeded(a) => {
            set_exec("succeeded", None)?;
            insert_artifact(c, &task, exec, a, now)?;
            let canceled: bool = c
                .prepare_cached("SELECT cancel_requested FROM tasks WHERE id = ?1")?
                .query_row([&task], |r| r.get(0))?;
            let reason = match (canceled, charge) {
                (false, _) => None,
                (true, Charge::Charged) => Some(
                    "A cancel was requested after the request had been sent; the image was kept because the provider \
                     charges for it.",
                ),
                (true, _) => Some("A cancel was requested after the request had been sent; the image was kept."),
            };
            set_task(c, &task, TaskStatus::Succeeded, reason, None, now)?;
            consume_envelope(c, &task, "consumed", None)?;
            let saved = format!("image stored ({} bytes, sha256 {})", a.image.len(), a.image.sha256());
            event(c, &task, now, Actor::Worker, "succeeded", &with_money(&saved, &words), ex)?;
            // Crash matrix: the image and `succeeded` are written but not committed.
            crate::failpoint::crash("before-finish-commit");
            TaskStatus::Succeeded
        }
        Finish::Failed { kind, reason, .. } => {
            set_exec("failed", Some(reason))?;
            set_task(c, &task, TaskStatus::Failed, Some(reason), Some(*kind), now)?;
            consume_envelope(c, &task, "consumed", Some(reason))?;
            event(c, &task, now, Actor::Worker, "failed", &with_money(reason, &words), ex)?;
            TaskStatus::Failed
        }
        Finish::Unknown { reason } => {
            set_exec("unknown", Some(reason))?;
            set_task(c, &task, TaskStatus::Unknown, Some(reason), None, now)?;
            consume_envelope(c, &task, "consumed", Some(reason))?;
            let line = format!("{reason}; automatic retries stopped");
            event(c, &task, now, Actor::Worker, "unknown", &with_money(&line, &words), ex)?;
            TaskStatus::Unknown
        }
        Finish::RetryLater { due_at, kind, reason, max_attempts, .. } => {
            set_exec("failed", Some(reason))?;
            let attempts: i64 =
                c.prepare_cached("SELECT attempts FROM tasks WHERE id = ?1")?.query_row([&task], |r| r.get(0))?;
            if attempts >= *max_attempts {
                let why = format!("gave up after {attempts} attempts; the last one: {reason}");
                set_task(c, &task, TaskStatus::Failed, Some(&why), Some(*kind), now)?;
                consume_envelope(c, &task, "consumed", Some(reason))?;
                event(c, &task, now, Actor::Worker, "failed", &with_money(&why, &words), ex)?;
                TaskStatus::Failed
            } else {
                let secs = (due_at - now).max(0) as f64 / 1000.0;
                let why = format!("attempt {attempts} did not go through ({reason}); trying again in {secs:.1} s");
                set_task(c, &task, TaskStatus::Waiting, Some(&why), None, now)?;
                requeue_envelope(c, &task, *due_at, Some(reason))?;
                event(c, &task, now, Actor::Worker, "retry_scheduled", &with_money(&why, &words), ex)?;
                return Ok(TaskStatus::Waiting);
            }
        }
        Finish::CanceledBeforeCall => {
            set_exec("abandoned", Some("canceled before the call"))?;
            set_task(c, &task, TaskStatus::Canceled, Some("Nothing was sent to the provider."), None, now)?;
            consume_envelope(c, &task, "consumed", None)?;
            event(c, &task, now, Actor::Worker, "canceled", "canceled before anything was sent", ex)?;
            TaskStatus::Canceled
        }
    };
    on_settled(c, &task, now)?;
    Ok(status)
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
    /// Claim a handed-off envelope. An ordered commit: nothing leaves for the provider before
    /// the next durable one (`record_calling`, whose fsync covers the claim as well); a resumed
    /// execution's `calling` or `accepted` record is already durable.
    pub async fn claim(
        &self,
        h: Handoff,
        lease: String,
        boot: String,
        now: Millis,
        lease_ms: Millis,
    ) -> Result<ClaimOutcome, StoreError> {
        self.write_ordered(move |c| claim(c, &h, &lease, &boot, now, lease_ms)).await
    }

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
