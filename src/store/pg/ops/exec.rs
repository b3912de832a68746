//! The worker's operations on PostgreSQL, from `calling` to finish (the claim is the
//! dispatcher's, in `dispatch.rs`). Everything after the claim starts with
//! [`fence`](super::fence).

use super::*;
use crate::domain::{Actor, Millis, TaskStatus};
use crate::store::pg::PgStore;
use crate::store::{Finish, NewArtifact};

/// Durably record "about to call the provider".
fn record_calling(tx: &mut Tx<'_, '_>, exec: &str, lease: &str, now: Millis) -> Result<(), StoreError> {
    let task = fence(tx, exec, lease, now)?;
    let attempt: i64 = tx
        .opt(
            "UPDATE executions SET phase = 'calling', calling_at = $2 WHERE token = $1 AND phase = 'claimed'
             RETURNING attempt",
            &[&exec, &now],
        )?
        .map(|r| r.get(0))
        .ok_or(StoreError::Fenced)?;
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
        &format!("attempt {attempt}: sending the request to the provider; from now on it may be charged"),
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
                requeue_envelope(tx, &task, *due_at, Some(reason), now)?;
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
