//! What a person does to a task: cancel it, retry it as a new task, resolve an `unknown` one.

use rusqlite::{Connection, OptionalExtension, params};

use super::*;
use crate::domain::{Actor, Charge, FailureKind, Millis, TaskStatus};

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

/// A user-initiated retry: a **new** task linked by `retry_of`.
///
/// Rules, checked in this one operation (so concurrent retries are decided one by one):
/// - the same `key` on the same original returns the retry it made (`Existing`); a key is
///   scoped to its original, so another task's retry with that key is a different one;
/// - a task, and a shot position of a set, has at most one live retry: while one is queued,
///   waiting or running, another is refused (`RetryInProgress`);
/// - once a task was retried, retrying it again needs an acknowledgement that names its
///   latest retry (`AlreadyRetried` otherwise), so a double click or a second terminal cannot
///   make a second paid task by accident;
/// - when a request of the original may have been, or was, charged, the caller must
///   acknowledge that generating again may be charged again (`NeedsAcknowledgement`).
pub(in crate::store) fn retry(
    c: &Connection,
    task: &str,
    ack: &RetryAck,
    key: Option<&str>,
    now: Millis,
) -> Result<RetryOutcome, StoreError> {
    let row: Option<(String, String, String, String, Option<String>)> = c
        .prepare_cached("SELECT status, provider, prompt, params, group_key FROM tasks WHERE id = ?1")?
        .query_row([task], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .optional()?;
    let Some((status, provider, prompt, params_text, group)) = row else { return Ok(RetryOutcome::NotFound) };
    if let Some(k) = key {
        let made: Option<String> = c
            .prepare_cached("SELECT id FROM tasks WHERE retry_of = ?1 AND retry_key = ?2")?
            .query_row(params![task, k], |r| r.get(0))
            .optional()?;
        if let Some(id) = made {
            return Ok(RetryOutcome::Existing(id));
        }
    }
    let status = TaskStatus::parse(&status).unwrap_or(TaskStatus::Failed);
    if !matches!(status, TaskStatus::Failed | TaskStatus::Unknown | TaskStatus::Canceled) {
        return Ok(RetryOutcome::NotRetryable(status));
    }
    let shot = crate::store::sets::shot_of(c, task)?;
    if let Some(s) = &shot {
        let live: Option<(String, String)> = c
            .prepare_cached(
                "SELECT id, status FROM tasks WHERE set_id = ?1 AND set_position = ?2 AND candidate = ?4 AND id <> ?3
                   AND status IN ('queued', 'waiting', 'running')
                 ORDER BY id DESC LIMIT 1",
            )?
            .query_row(params![s.set_id, s.position, task, s.candidate], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((id, st)) = live {
            return Ok(RetryOutcome::RetryInProgress {
                id,
                status: TaskStatus::parse(&st).unwrap_or(TaskStatus::Queued),
            });
        }
    }
    if let Some((id, st)) = latest_retry(c, task)? {
        if !st.is_settled() {
            return Ok(RetryOutcome::RetryInProgress { id, status: st });
        }
        if ack.retried_as.as_deref() != Some(id.as_str()) {
            return Ok(RetryOutcome::AlreadyRetried { id, status: st });
        }
    }
    let charge = crate::store::charge_of(c, task)?.state;
    if charge.may_cost() && !ack.possible_charge {
        return Ok(RetryOutcome::NeedsAcknowledgement);
    }
    let new = NewTask {
        provider,
        prompt,
        params: serde_json::from_str(&params_text).unwrap_or(Value::Null),
        idempotency_key: None,
        retry_of: Some(task.to_string()),
        retry_key: key.map(str::to_string),
        shot,
        group,
    };
    Ok(match submit(c, &new, now)? {
        SubmitOutcome::Created(id) => {
            let msg = if charge.may_cost() {
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

/// The newest retry of `task` and its status.
pub(in crate::store) fn latest_retry(c: &Connection, task: &str) -> Result<Option<(String, TaskStatus)>, StoreError> {
    let row: Option<(String, String)> = c
        .prepare_cached("SELECT id, status FROM tasks WHERE retry_of = ?1 ORDER BY id DESC LIMIT 1")?
        .query_row([task], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(row.map(|(id, s)| (id, TaskStatus::parse(&s).unwrap_or(TaskStatus::Failed))))
}

/// An operator resolves an `unknown` task by hand.
pub(in crate::store) fn resolve(
    c: &Connection,
    task: &str,
    r: &Resolution,
    owner: OwnerCharge,
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
            // The operator found the image: the request delivered, so it was charged.
            let (_, words) = settle_charge(c, &exec, Charge::Charged)?;
            insert_artifact(c, task, &exec, a, now)?;
            let why = format!("Resolved by an operator{note_text}");
            set_task(c, task, TaskStatus::Succeeded, Some(&why), None, now)?;
            event(
                c,
                task,
                now,
                Actor::Operator,
                "resolved",
                &format!(
                    "{}{}",
                    with_money(&format!("resolved as succeeded with an image{note_text}"), &words),
                    owner.words(true)
                ),
                Some(&exec),
            )?;
        }
        Resolution::Failed => {
            c.prepare_cached("UPDATE executions SET status = 'failed', finished_at = ?2 WHERE token = ?1")?
                .execute(params![exec, now])?;
            let why = format!("an operator confirmed it failed{note_text}");
            set_task(c, task, TaskStatus::Failed, Some(&why), Some(FailureKind::Operator), now)?;
            // "It failed" is the operator's word about the image, not about the bill: unless
            // the owner also records what the dashboard shows, the charge stays `possible`.
            let line = format!("resolved as failed{note_text}{}", owner.words(false));
            event(c, task, now, Actor::Operator, "resolved", &line, Some(&exec))?;
        }
    }
    // The owner's record of the charge: the task's unproven requests (and the one resolved)
    // take it, marked as recorded by hand.
    if let Some(charge) = owner.recorded() {
        c.prepare_cached(
            "UPDATE executions SET charge = ?3, charge_recorded_at = ?4
             WHERE task_id = ?1 AND billable = 1 AND calling_at IS NOT NULL AND (charge = 'possible' OR token = ?2)",
        )?
        .execute(params![task, exec, charge.as_str(), now])?;
    }
    Ok(ResolveOutcome::Resolved)
}

impl SqliteStore {
    /// Cancel a task.
    pub async fn cancel(&self, task: String, now: Millis) -> Result<CancelOutcome, StoreError> {
        self.write(move |c| cancel(c, &task, now)).await
    }

    /// Retry a task as a new one.
    pub async fn retry(
        &self,
        task: String,
        ack: RetryAck,
        key: Option<String>,
        now: Millis,
    ) -> Result<RetryOutcome, StoreError> {
        self.write(move |c| retry(c, &task, &ack, key.as_deref(), now)).await
    }

    /// Resolve an `unknown` task by hand (an image's bytes commit with the resolution).
    pub async fn resolve(
        &self,
        task: String,
        r: Resolution,
        owner: OwnerCharge,
        note: String,
        now: Millis,
    ) -> Result<ResolveOutcome, StoreError> {
        let bytes = match &r {
            Resolution::Succeeded(a) => a.image.len() as usize,
            Resolution::Failed => 0,
        };
        self.write_images(bytes, move |c| resolve(c, &task, &r, owner, &note, now)).await
    }
}
