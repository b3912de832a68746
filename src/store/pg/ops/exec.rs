//! The worker's operations on PostgreSQL, from claim to finish. The claim locks the
//! envelope row before its conditional update; everything after it starts with
//! [`fence`](super::fence).

use serde_json::Value;

use super::*;
use crate::domain::{Actor, Millis, Phase, TaskStatus};
use crate::store::pg::PgStore;
use crate::store::{Claim, ClaimOutcome, Finish, Handoff, NewArtifact};

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

/// Durably record "about to call the provider".
fn record_calling(tx: &mut Tx<'_, '_>, exec: &str, lease: &str, now: Millis) -> Result<(), StoreError> {
    let task = fence(tx, exec, lease, now)?;
    let n = tx.exec(
        "UPDATE executions SET phase = 'calling', calling_at = $2 WHERE token = $1 AND phase = 'claimed'",
        &[&exec, &now],
    )?;
    if n == 0 {
        return Err(StoreError::Fenced);
    }
    tx.exec(
        "UPDATE tasks SET attempts = attempts + 1, may_have_charged = true, updated_at = $2 WHERE id = $1",
        &[&task, &now],
    )?;
    event(
        tx,
        &task,
        now,
        Actor::Worker,
        "calling",
        "sending the request to the provider; from now on it may be charged",
        Some(exec),
    )?;
    Ok(())
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

/// End (or pause) an execution, fenced on both tokens.
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
    let status = match f {
        Finish::Succeeded(a) => {
            set_exec(tx, exec, "succeeded", now, None)?;
            insert_artifact(tx, &task, exec, a, now)?;
            let canceled: bool = tx.one("SELECT cancel_requested FROM tasks WHERE id = $1", &[&task])?.get(0);
            let reason = canceled.then_some(
                "A cancel was requested after the request had been sent; the image was kept because it may have been charged.",
            );
            set_task(tx, &task, TaskStatus::Succeeded, reason, None, now)?;
            consume_envelope(tx, &task, "consumed", None)?;
            event(
                tx,
                &task,
                now,
                Actor::Worker,
                "succeeded",
                &format!("image stored ({} bytes, sha256 {})", a.image.len(), a.image.sha256()),
                ex,
            )?;
            // Crash matrix: the image and `succeeded` are written but not committed.
            crate::failpoint::crash("before-finish-commit");
            TaskStatus::Succeeded
        }
        Finish::Failed { kind, reason, .. } => {
            set_exec(tx, exec, "failed", now, Some(reason))?;
            set_task(tx, &task, TaskStatus::Failed, Some(reason), Some(*kind), now)?;
            consume_envelope(tx, &task, "consumed", Some(reason))?;
            event(tx, &task, now, Actor::Worker, "failed", reason, ex)?;
            TaskStatus::Failed
        }
        Finish::Unknown { reason } => {
            set_exec(tx, exec, "unknown", now, Some(reason))?;
            set_task(tx, &task, TaskStatus::Unknown, Some(reason), None, now)?;
            consume_envelope(tx, &task, "consumed", Some(reason))?;
            event(tx, &task, now, Actor::Worker, "unknown", &format!("{reason}; automatic retries stopped"), ex)?;
            TaskStatus::Unknown
        }
        Finish::RetryLater { due_at, kind, reason, max_attempts, .. } => {
            set_exec(tx, exec, "failed", now, Some(reason))?;
            let attempts: i64 = tx.one("SELECT attempts FROM tasks WHERE id = $1", &[&task])?.get(0);
            if attempts >= *max_attempts {
                let why = format!("gave up after {attempts} attempts; the last one: {reason}");
                set_task(tx, &task, TaskStatus::Failed, Some(&why), Some(*kind), now)?;
                consume_envelope(tx, &task, "consumed", Some(reason))?;
                event(tx, &task, now, Actor::Worker, "failed", &why, ex)?;
                TaskStatus::Failed
            } else {
                let secs = (due_at - now).max(0) as f64 / 1000.0;
                let why = format!("attempt {attempts} did not go through ({reason}); trying again in {secs:.1} s");
                set_task(tx, &task, TaskStatus::Waiting, Some(&why), None, now)?;
                requeue_envelope(tx, &task, *due_at, Some(reason))?;
                event(tx, &task, now, Actor::Worker, "retry_scheduled", &why, ex)?;
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

/// A result that arrived after the task was marked `unknown`, from the same execution.
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
        "a late answer from the same execution resolved the unknown outcome",
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

    /// Durably record phase `calling`.
    /// Durably record phase `calling`. Not mirrored yet from the SQLite store: the money facts
    /// (`facts`: price, billable, budget limits) are ignored here, so this backend never holds
    /// a call back for a budget; it always answers `Calling`.
    pub async fn record_calling(
        &self,
        exec: String,
        lease: String,
        now: Millis,
        facts: crate::store::CallingFacts,
    ) -> Result<crate::store::CallingOutcome, StoreError> {
        let _ = facts;
        self.write(move |tx| {
            let now = tx.now(now)?;
            record_calling(tx, &exec, &lease, now)
        })
        .await
        .map(|()| crate::store::CallingOutcome::Calling)
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
