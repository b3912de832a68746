//! What a person does to a task, on PostgreSQL: cancel, retry as a new task, resolve an
//! `unknown` one. Each locks the task's envelope first.

use serde_json::Value;

use super::*;
use crate::domain::{Actor, FailureKind, Millis, TaskStatus};
use crate::store::pg::PgStore;
use crate::store::{CancelOutcome, NewTask, Resolution, ResolveOutcome, RetryOutcome};

/// Cancel a task: at once if nothing was sent, else mark it cancel-requested.
pub(in crate::store::pg) fn cancel(tx: &mut Tx<'_, '_>, task: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
    lock_task(tx, task)?;
    let Some(status) = task_status(tx, task)? else { return Ok(CancelOutcome::NotFound) };
    match status {
        TaskStatus::Queued | TaskStatus::Waiting => {
            set_task(tx, task, TaskStatus::Canceled, Some("Nothing was sent to the provider."), None, now)?;
            consume_envelope(tx, task, "consumed", Some("canceled"))?;
            event(tx, task, now, Actor::Api, "canceled", "canceled before anything was sent", None)?;
            on_settled(tx, task, now)?;
            Ok(CancelOutcome::Canceled)
        }
        TaskStatus::Running => {
            tx.exec("UPDATE tasks SET cancel_requested = true, updated_at = $2 WHERE id = $1", &[&task, &now])?;
            event(
                tx,
                task,
                now,
                Actor::Api,
                "cancel_requested",
                "cancel requested while running; a result that arrives will be kept",
                None,
            )?;
            Ok(CancelOutcome::Requested)
        }
        settled => Ok(CancelOutcome::Settled(settled)),
    }
}

/// A user-initiated retry: a **new** task linked by `retry_of`.
fn retry(
    tx: &mut Tx<'_, '_>,
    task: &str,
    acknowledged: bool,
    key: Option<&str>,
    now: Millis,
) -> Result<RetryOutcome, StoreError> {
    lock_task(tx, task)?;
    let row = tx.opt(
        "SELECT status, provider, prompt, params, may_have_charged, group_key FROM tasks WHERE id = $1",
        &[&task],
    )?;
    let Some(row) = row else { return Ok(RetryOutcome::NotFound) };
    let (status, provider, prompt, params_text, charged, group): (
        String,
        String,
        String,
        String,
        bool,
        Option<String>,
    ) = (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4), row.get(5));
    let status = TaskStatus::parse(&status).unwrap_or(TaskStatus::Failed);
    if !matches!(status, TaskStatus::Failed | TaskStatus::Unknown | TaskStatus::Canceled) {
        return Ok(RetryOutcome::NotRetryable(status));
    }
    if charged && !acknowledged {
        return Ok(RetryOutcome::NeedsAcknowledgement);
    }
    let new = NewTask {
        provider,
        prompt,
        params: serde_json::from_str(&params_text).unwrap_or(Value::Null),
        idempotency_key: key.map(str::to_string),
        retry_of: Some(task.to_string()),
        retry_key: None,
        shot: crate::store::pg::sets::shot_of(tx, task)?,
        group,
    };
    Ok(match submit(tx, &new, now)? {
        SubmitOutcome::Created(id) => {
            let msg = if charged {
                format!("retried as task {id}; the user acknowledged that it may be charged again")
            } else {
                format!("retried as task {id}")
            };
            event(tx, task, now, Actor::Api, "retried", &msg, None)?;
            RetryOutcome::Created(id)
        }
        SubmitOutcome::Existing(id) => RetryOutcome::Existing(id),
        SubmitOutcome::Conflict(_) => RetryOutcome::NotRetryable(status),
    })
}

/// An operator resolves an `unknown` task by hand.
fn resolve(
    tx: &mut Tx<'_, '_>,
    task: &str,
    r: &Resolution,
    note: &str,
    now: Millis,
) -> Result<ResolveOutcome, StoreError> {
    lock_task(tx, task)?;
    let Some(status) = task_status(tx, task)? else { return Ok(ResolveOutcome::NotFound) };
    if status != TaskStatus::Unknown {
        return Ok(ResolveOutcome::NotUnknown(status));
    }
    let exec: String = tx
        .one(
            "SELECT token FROM executions WHERE task_id = $1 AND status = 'unknown' ORDER BY started_at DESC LIMIT 1",
            &[&task],
        )?
        .get(0);
    let note_text = if note.is_empty() { String::new() } else { format!(": {note}") };
    match r {
        Resolution::Succeeded(a) => {
            tx.exec("UPDATE executions SET status = 'succeeded', finished_at = $2 WHERE token = $1", &[&exec, &now])?;
            insert_artifact(tx, task, &exec, a, now)?;
            let why = format!("Resolved by an operator{note_text}");
            set_task(tx, task, TaskStatus::Succeeded, Some(&why), None, now)?;
            event(
                tx,
                task,
                now,
                Actor::Operator,
                "resolved",
                &format!("resolved as succeeded with an image{note_text}"),
                Some(&exec),
            )?;
        }
        Resolution::Failed => {
            tx.exec("UPDATE executions SET status = 'failed', finished_at = $2 WHERE token = $1", &[&exec, &now])?;
            let why = format!("an operator confirmed it failed{note_text}");
            set_task(tx, task, TaskStatus::Failed, Some(&why), Some(FailureKind::Operator), now)?;
            event(tx, task, now, Actor::Operator, "resolved", &format!("resolved as failed{note_text}"), Some(&exec))?;
        }
    }
    Ok(ResolveOutcome::Resolved)
}

impl PgStore {
    /// Cancel a task.
    pub async fn cancel(&self, task: String, now: Millis) -> Result<CancelOutcome, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            cancel(tx, &task, now)
        })
        .await
    }

    /// Retry a task as a new one.
    /// A user retry. Not mirrored yet from the SQLite store: only `ack.possible_charge` is
    /// checked (no one-live-retry rule, no naming of an earlier retry, key not scoped).
    pub async fn retry(
        &self,
        task: String,
        ack: crate::store::RetryAck,
        key: Option<String>,
        now: Millis,
    ) -> Result<RetryOutcome, StoreError> {
        let acknowledged = ack.possible_charge;
        self.write(move |tx| {
            let now = tx.now(now)?;
            retry(tx, &task, acknowledged, key.as_deref(), now)
        })
        .await
    }

    /// Resolve an `unknown` task by hand.
    pub async fn resolve(
        &self,
        task: String,
        r: Resolution,
        note: String,
        now: Millis,
    ) -> Result<ResolveOutcome, StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            resolve(tx, &task, &r, &note, now)
        })
        .await
    }
}
