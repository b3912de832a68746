//! The worker's operations on PostgreSQL, from claim to finish. The claim locks the
//! envelope row before its conditional update; everything after it starts with
//! [`fence`](super::fence).

use serde_json::Value;

use super::*;
use crate::domain::{Actor, Charge, Millis, Phase, TaskStatus};
use crate::store::ops::with_money;
use crate::store::pg::PgStore;
use crate::store::{CallingFacts, CallingOutcome, Claim, ClaimOutcome, Finish, Handoff, NewArtifact};

/// Claim a handed-off envelope: take its lease and open (or adopt) an execution.
fn claim(
    tx: &mut Tx<'_, '_>,
    h: &Handoff,
    lease: &str,
    node: &str,
    boot: &str,
    now: Millis,
    lease_ms: Millis,
) -> Result<ClaimOutcome, StoreError> {
    lock_task(tx, &h.task_id)?;
    let n = tx.exec(
        "UPDATE envelopes SET lease_token = $3, lease_expires_at = $4, lease_node = $5, lease_boot = $6
         WHERE id = $1 AND status = 'sent' AND lease_token IS NULL AND send_count = $2",
        &[&h.envelope_id, &h.send_count, &lease, &(now + lease_ms), &node, &boot],
    )?;
    if n == 0 {
        return Ok(ClaimOutcome::Lost);
    }
    let t = tx.one(
        "SELECT status, prompt, params, attempts, cancel_requested, created_at, set_id FROM tasks WHERE id = $1",
        &[&h.task_id],
    )?;
    let status = TaskStatus::parse(t.get(0)).unwrap_or(TaskStatus::Failed);
    if status.is_settled() {
        consume_envelope(tx, &h.task_id, "consumed", None)?;
        return Ok(ClaimOutcome::Lost);
    }
    let (prompt, params_text, attempts, cancel_requested, created_at, set_id): (
        String,
        String,
        i64,
        bool,
        Millis,
        Option<String>,
    ) = (t.get(1), t.get(2), t.get(3), t.get(4), t.get(5), t.get(6));
    let params: Value = serde_json::from_str(&params_text).unwrap_or(Value::Null);
    let references = match &set_id {
        Some(set) => crate::store::pg::sets::references_of_set(tx, set)?,
        None => Vec::new(),
    };
    let running = tx.opt(
        "SELECT token, phase, provider_job_id, idempotency_key, calling_at, attempt, provider_handle
         FROM executions WHERE task_id = $1 AND status = 'running'",
        &[&h.task_id],
    )?;
    let mut handle: Option<String> = None;
    let (execution_token, phase, job_id, idempotency_key, calling_at, attempt, resumed) = match running {
        Some(r) => {
            handle = r.get(6);
            let (token, phase, job_id, key, calling_at, attempt): (
                String,
                String,
                Option<String>,
                String,
                Option<Millis>,
                i64,
            ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
            tx.exec(
                "UPDATE executions SET node_id = $2, boot_id = $3, heartbeat_at = $4 WHERE token = $1",
                &[&token, &node, &boot, &now],
            )?;
            let phase = Phase::parse(&phase).unwrap_or(Phase::Calling);
            let how = match phase {
                Phase::Accepted => "polling the job the provider already accepted, instead of sending again",
                _ => "recovering the earlier call without blindly sending it again",
            };
            let msg = format!("attempt {attempt} resumed: {how}");
            event(tx, &h.task_id, now, Actor::Worker, "resumed", &msg, Some(&token))?;
            (token, phase, job_id, key, calling_at, attempt, true)
        }
        None => {
            let token = uuid::Uuid::new_v4().to_string();
            let attempt = attempts + 1;
            let key = crate::store::provider_key(&h.task_id, attempt);
            tx.exec(
                "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, node_id, boot_id, heartbeat_at, started_at)
                 VALUES ($1, $2, $3, 'running', 'claimed', $4, $5, $6, $7, $7)",
                &[&token, &h.task_id, &attempt, &key, &node, &boot, &now],
            )?;
            event(tx, &h.task_id, now, Actor::Worker, "claimed", &format!("attempt {attempt} started"), Some(&token))?;
            (token, Phase::Claimed, None, key, None, attempt, false)
        }
    };
    // The handle an adapter persisted with the job id (fal's status/response URLs), if any.
    let job_handle = if phase == Phase::Accepted { handle } else { None };
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
    set_task(tx, &h.task_id, TaskStatus::Running, None, None, now)?;
    Ok(ClaimOutcome::Claimed(Box::new(claim)))
}

/// Durably record "about to call the provider", with the request's price, model and whether
/// the provider bills (as `store::ops::exec::record_calling`). First, in the same
/// transaction and under the budget lock (`pg::spend`), the budget check: a call that would
/// take a period's spend over a limit is not recorded; the execution is abandoned, the
/// envelope waits until the period ends (its hand-off taken back, as a busy release does),
/// and the task is `waiting` with the reason. Nothing was sent and no attempt is counted.
fn record_calling(
    tx: &mut Tx<'_, '_>,
    exec: &str,
    lease: &str,
    now: Millis,
    facts: &CallingFacts,
) -> Result<CallingOutcome, StoreError> {
    let task = fence(tx, exec, lease, now)?;
    if let (true, Some(cost)) = (facts.billable, facts.cost_micros) {
        let provider: String = tx.one("SELECT provider FROM tasks WHERE id = $1", &[&task])?.get(0);
        if let Some((due_at, reason)) = crate::store::pg::spend::check(tx, &provider, cost, &facts.limits, now)? {
            tx.exec(
                "UPDATE executions SET status = 'abandoned', finished_at = $2, error = $3 WHERE token = $1 AND phase = 'claimed'",
                &[&exec, &now, &reason],
            )?;
            tx.exec(
                "UPDATE envelopes SET status = 'pending', due_at = $2, send_count = send_count - 1, lease_token = NULL,
                        lease_expires_at = NULL, lease_node = NULL, lease_boot = NULL, budget_hold = true,
                        last_error = 'budget'
                 WHERE task_id = $1",
                &[&task, &due_at],
            )?;
            set_task(tx, &task, TaskStatus::Waiting, Some(&reason), None, now)?;
            event(tx, &task, now, Actor::Worker, "budget", &reason, Some(exec))?;
            return Ok(CallingOutcome::Held { due_at, reason });
        }
    }
    let charge = if facts.billable { Charge::Possible } else { Charge::None };
    let n = tx.exec(
        "UPDATE executions SET phase = 'calling', calling_at = $2, charge = $3, billable = $4, cost_micros = $5,
                currency = $6, model = $7
         WHERE token = $1 AND phase = 'claimed'",
        &[&exec, &now, &charge.as_str(), &facts.billable, &facts.cost_micros, &facts.currency, &facts.model],
    )?;
    if n == 0 {
        return Err(StoreError::Fenced);
    }
    tx.exec("UPDATE envelopes SET budget_hold = false WHERE task_id = $1 AND budget_hold", &[&task])?;
    tx.exec("UPDATE tasks SET attempts = attempts + 1, updated_at = $2 WHERE id = $1", &[&task, &now])?;
    // The timeline says only what is true now: the request is leaving. What it cost is said
    // by the outcome's line, from the evidence.
    let price = match (facts.billable, facts.cost_micros, &facts.currency) {
        (false, _, _) => " (this provider never charges)".to_string(),
        (true, Some(m), Some(cur)) => format!(" (its price: about {})", crate::domain::money(m, cur)),
        _ => String::new(),
    };
    let msg = format!("sending the request to the provider{price}");
    event(tx, &task, now, Actor::Worker, "calling", &msg, Some(exec))?;
    Ok(CallingOutcome::Calling)
}

/// Persist the provider's job id the moment it arrives.
fn record_accepted(
    tx: &mut Tx<'_, '_>,
    exec: &str,
    lease: &str,
    job: &str,
    handle: Option<&str>,
    now: Millis,
) -> Result<(), StoreError> {
    let task = fence(tx, exec, lease, now)?;
    tx.exec(
        "UPDATE executions SET phase = 'accepted', provider_job_id = $2, provider_handle = $3 WHERE token = $1",
        &[&exec, &job, &handle],
    )?;
    event(tx, &task, now, Actor::Worker, "accepted", &format!("the provider accepted the job as {job}"), Some(exec))?;
    Ok(())
}

/// Extend the worker's lease.
fn heartbeat(tx: &mut Tx<'_, '_>, exec: &str, lease: &str, now: Millis, lease_ms: Millis) -> Result<(), StoreError> {
    let task = fence(tx, exec, lease, now)?;
    tx.exec("UPDATE envelopes SET lease_expires_at = $2 WHERE task_id = $1", &[&task, &(now + lease_ms)])?;
    Ok(())
}

/// End (or pause) an execution, fenced on both tokens, recording what its outcome proves
/// about money (as `store::ops::exec::finish`).
fn finish(tx: &mut Tx<'_, '_>, exec: &str, lease: &str, f: &Finish, now: Millis) -> Result<TaskStatus, StoreError> {
    let task = fence(tx, exec, lease, now)?;
    fn set_exec(
        tx: &mut Tx<'_, '_>,
        exec: &str,
        status: &str,
        now: Millis,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        tx.exec(
            "UPDATE executions SET status = $2, finished_at = $3, error = $4 WHERE token = $1",
            &[&exec, &status, &now, &error],
        )?;
        Ok(())
    }
    let ex = Some(exec);
    let (charge, words) = settle_charge(tx, exec, f.charge())?;
    let status = match f {
        Finish::Succeeded(a) => {
            set_exec(tx, exec, "succeeded", now, None)?;
            insert_artifact(tx, &task, exec, a, now)?;
            let canceled: bool = tx.one("SELECT cancel_requested FROM tasks WHERE id = $1", &[&task])?.get(0);
            let reason = match (canceled, charge) {
                (false, _) => None,
                (true, Charge::Charged) => Some(
                    "A cancel was requested after the request had been sent; the image was kept because the provider \
                     charges for it.",
                ),
                (true, _) => Some("A cancel was requested after the request had been sent; the image was kept."),
            };
            set_task(tx, &task, TaskStatus::Succeeded, reason, None, now)?;
            consume_envelope(tx, &task, "consumed", None)?;
            let saved = format!("image stored ({} bytes, sha256 {})", a.image.len(), a.image.sha256());
            event(tx, &task, now, Actor::Worker, "succeeded", &with_money(&saved, &words), ex)?;
            // Crash matrix: the image and `succeeded` are written but not committed.
            crate::failpoint::crash("before-finish-commit");
            TaskStatus::Succeeded
        }
        Finish::Failed { kind, reason, .. } => {
            set_exec(tx, exec, "failed", now, Some(reason))?;
            set_task(tx, &task, TaskStatus::Failed, Some(reason), Some(*kind), now)?;
            consume_envelope(tx, &task, "consumed", Some(reason))?;
            event(tx, &task, now, Actor::Worker, "failed", &with_money(reason, &words), ex)?;
            TaskStatus::Failed
        }
        Finish::Unknown { reason } => {
            set_exec(tx, exec, "unknown", now, Some(reason))?;
            set_task(tx, &task, TaskStatus::Unknown, Some(reason), None, now)?;
            consume_envelope(tx, &task, "consumed", Some(reason))?;
            let line = format!("{reason}; automatic retries stopped");
            event(tx, &task, now, Actor::Worker, "unknown", &with_money(&line, &words), ex)?;
            TaskStatus::Unknown
        }
        Finish::RetryLater { due_at, kind, reason, max_attempts, .. } => {
            set_exec(tx, exec, "failed", now, Some(reason))?;
            let attempts: i64 = tx.one("SELECT attempts FROM tasks WHERE id = $1", &[&task])?.get(0);
            if attempts >= *max_attempts {
                let why = format!("gave up after {attempts} attempts; the last one: {reason}");
                set_task(tx, &task, TaskStatus::Failed, Some(&why), Some(*kind), now)?;
                consume_envelope(tx, &task, "consumed", Some(reason))?;
                event(tx, &task, now, Actor::Worker, "failed", &with_money(&why, &words), ex)?;
                TaskStatus::Failed
            } else {
                let secs = (due_at - now).max(0) as f64 / 1000.0;
                let why = format!("attempt {attempts} did not go through ({reason}); trying again in {secs:.1} s");
                set_task(tx, &task, TaskStatus::Waiting, Some(&why), None, now)?;
                requeue_envelope(tx, &task, *due_at, Some(reason))?;
                event(tx, &task, now, Actor::Worker, "retry_scheduled", &with_money(&why, &words), ex)?;
                return Ok(TaskStatus::Waiting);
            }
        }
        Finish::CanceledBeforeCall => {
            set_exec(tx, exec, "abandoned", now, Some("canceled before the call"))?;
            set_task(tx, &task, TaskStatus::Canceled, Some("Nothing was sent to the provider."), None, now)?;
            consume_envelope(tx, &task, "consumed", None)?;
            event(tx, &task, now, Actor::Worker, "canceled", "canceled before anything was sent", ex)?;
            TaskStatus::Canceled
        }
    };
    on_settled(tx, &task, now)?;
    Ok(status)
}

/// A result that arrived after the task was marked `unknown`, from the same execution: it is
/// evidence, resolves the task, and proves the request was charged.
fn late_result(tx: &mut Tx<'_, '_>, exec: &str, a: &NewArtifact, now: Millis) -> Result<bool, StoreError> {
    let task: Option<String> = tx.opt("SELECT task_id FROM executions WHERE token = $1", &[&exec])?.map(|r| r.get(0));
    let Some(task) = task else { return Ok(false) };
    lock_task(tx, &task)?;
    let n = tx.exec(
        "UPDATE executions SET status = 'succeeded', finished_at = $2
         WHERE token = $1 AND status = 'unknown'
           AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = executions.task_id AND t.status = 'unknown')",
        &[&exec, &now],
    )?;
    if n == 0 {
        return Ok(false);
    }
    let (_, words) = settle_charge(tx, exec, Charge::Charged)?;
    insert_artifact(tx, &task, exec, a, now)?;
    set_task(
        tx,
        &task,
        TaskStatus::Succeeded,
        Some("The answer arrived late, after the outcome had been marked unknown."),
        None,
        now,
    )?;
    event(
        tx,
        &task,
        now,
        Actor::Worker,
        "late_result",
        &with_money("a late answer from the same execution resolved the unknown outcome", &words),
        Some(exec),
    )?;
    Ok(true)
}

impl PgStore {
    /// Claim a handed-off envelope (ordered commit, as on SQLite).
    pub async fn claim(
        &self,
        h: Handoff,
        lease: String,
        boot: String,
        now: Millis,
        lease_ms: Millis,
    ) -> Result<ClaimOutcome, StoreError> {
        let node = self.node().to_string();
        self.write_ordered(move |tx| {
            let now = tx.now(now)?;
            claim(tx, &h, &lease, &node, &boot, now, lease_ms)
        })
        .await
    }

    /// Check the budgets and durably record phase `calling` (see [`record_calling`]).
    pub async fn record_calling(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        facts: CallingFacts,
    ) -> Result<CallingOutcome, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            record_calling(tx, &exec, &lease, now, &facts)
        })
        .await
    }

    /// Persist an accepted job id.
    pub async fn record_accepted(
        &self,
        exec: String,
        lease: String,
        job: String,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            record_accepted(tx, &exec, &lease, &job, None, now)
        })
        .await
    }

    /// Like [`PgStore::record_accepted`], with the adapter's handle for polling the job.
    pub async fn record_accepted_with(
        &self,
        exec: String,
        lease: String,
        job: String,
        handle: Option<String>,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            record_accepted(tx, &exec, &lease, &job, handle.as_deref(), now)
        })
        .await
    }

    /// Extend a lease (ordered commit).
    pub async fn heartbeat(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        lease_ms: Millis,
    ) -> Result<(), StoreError> {
        self.write_ordered(move |tx| {
            let now = tx.now(now)?;
            heartbeat(tx, &exec, &lease, now, lease_ms)
        })
        .await
    }

    /// End or pause an execution.
    pub async fn finish(&self, exec: String, lease: String, f: Finish, now: Millis) -> Result<TaskStatus, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            finish(tx, &exec, &lease, &f, now)
        })
        .await
    }

    /// Attach a late result to an `unknown` execution.
    pub async fn late_result(&self, exec: String, a: NewArtifact, now: Millis) -> Result<bool, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            late_result(tx, &exec, &a, now)
        })
        .await
    }
}
