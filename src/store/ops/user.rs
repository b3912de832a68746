//! What a person does to a task: cancel it, retry it as a new task, resolve an `unknown` one.

use rusqlite::{Connection, OptionalExtension, params};

use super::*;
use crate::domain::{Actor, FailureKind, Millis, TaskStatus};

/// Cancel a task: at once if nothing was sent, else mark it cancel-requested.
pub(in crate::store) fn cancel(c: &Connection, task: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
    let Some(status) = task_status(c, task)? else { return Ok(CancelOutcome::NotFound) };
    match status {
        TaskStatus::Queued | TaskStatus::Waiting => {
            set_task(c, task, TaskStatus::Canceled, Some("Nothing was sent to the provider."), None, now)?;
            consume_envelope(c, task, "consumed", Some("canceled"))?;
            event(c, task, now, Actor::Api, "canceled", "canceled before anything was sent", None)?;
            on_settled(c, task, now)?;
            Ok(CancelOutcome::Canceled)
        }
        TaskStatus::Running => {
            c.prepare_cached("UPDATE tasks SET cancel_requested = 1, updated_at = ?2 WHERE id = ?1")?
                .execute(params![task, now])?;
            event(
                c,
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

/// A user-initiated retry: a **new** task linked by `retry_of`. When the original may have
/// been charged, refused unless `acknowledged`.
pub(in crate::store) fn retry(
    c: &Connection,
    task: &str,
    acknowledged: bool,
    key: Option<&str>,
    now: Millis,
) -> Result<RetryOutcome, StoreError> {
    let row: Option<(String, String, String, String, bool, Option<String>)> = c
        .prepare_cached(
            "SELECT status, provider, prompt, params, may_have_charged, group_key FROM tasks WHERE id = ?1",
        )?
        .query_row([task], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))
        .optional()?;
    let Some((status, provider, prompt, params_text, charged, group)) = row else { return Ok(RetryOutcome::NotFound) };
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
        shot: crate::store::sets::shot_of(c, task)?,
        group,
    };
    Ok(match submit(c, &new, now)? {
        SubmitOutcome::Created(id) => {
            let msg = if charged {
                format!("retried as task {id}; the user acknowledged that it may be charged again")
            } else {
                format!("retried as task {id}")
            };
            event(c, task, now, Actor::Api, "retried", &msg, None)?;
            RetryOutcome::Created(id)
        }
        SubmitOutcome::Existing(id) => RetryOutcome::Existing(id),
        SubmitOutcome::Conflict(_) => RetryOutcome::NotRetryable(status),
    })
}

/// An operator resolves an `unknown` task by hand.
pub(in crate::store) fn resolve(
    c: &Connection,
    task: &str,
    r: &Resolution,
    note: &str,
    now: Millis,
) -> Result<ResolveOutcome, StoreError> {
    let Some(status) = task_status(c, task)? else { return Ok(ResolveOutcome::NotFound) };
    if status != TaskStatus::Unknown {
        return Ok(ResolveOutcome::NotUnknown(status));
    }
    let exec: String = c
        .prepare_cached(
            "SELECT token FROM executions WHERE task_id = ?1 AND status = 'unknown' ORDER BY started_at DESC LIMIT 1",
        )?
        .query_row([task], |r| r.get(0))?;
    let note_text = if note.is_empty() { String::new() } else { format!(": {note}") };
    match r {
        Resolution::Succeeded(a) => {
            c.prepare_cached("UPDATE executions SET status = 'succeeded', finished_at = ?2 WHERE token = ?1")?
                .execute(params![exec, now])?;
            insert_artifact(c, task, &exec, a, now)?;
            let why = format!("Resolved by an operator{note_text}");
            set_task(c, task, TaskStatus::Succeeded, Some(&why), None, now)?;
            event(
                c,
                task,
                now,
                Actor::Operator,
                "resolved",
                &format!("resolved as succeeded with an image{note_text}"),
                Some(&exec),
            )?;
        }
        Resolution::Failed => {
            c.prepare_cached("UPDATE executions SET status = 'failed', finished_at = ?2 WHERE token = ?1")?
                .execute(params![exec, now])?;
            let why = format!("an operator confirmed it failed{note_text}");
            set_task(c, task, TaskStatus::Failed, Some(&why), Some(FailureKind::Operator), now)?;
            event(c, task, now, Actor::Operator, "resolved", &format!("resolved as failed{note_text}"), Some(&exec))?;
        }
    }
    Ok(ResolveOutcome::Resolved)
}

impl Store {
    /// Cancel a task.
    pub async fn cancel(&self, task: String, now: Millis) -> Result<CancelOutcome, StoreError> {
        self.write(move |c| cancel(c, &task, now)).await
    }

    /// Retry a task as a new one.
    pub async fn retry(
        &self,
        task: String,
        acknowledged: bool,
        key: Option<String>,
        now: Millis,
    ) -> Result<RetryOutcome, StoreError> {
        self.write(move |c| retry(c, &task, acknowledged, key.as_deref(), now)).await
    }

    /// Resolve an `unknown` task by hand (an image's bytes commit with the resolution).
    pub async fn resolve(
        &self,
        task: String,
        r: Resolution,
        note: String,
        now: Millis,
    ) -> Result<ResolveOutcome, StoreError> {
        let bytes = match &r {
            Resolution::Succeeded(a) => a.image.len() as usize,
            Resolution::Failed => 0,
        };
        self.write_images(bytes, move |c| resolve(c, &task, &r, &note, now)).await
    }
}
