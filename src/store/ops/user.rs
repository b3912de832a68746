//! What a person does to a task: cancel it, retry it as a new task, resolve an `unknown` one.
//! Each locks the task first ([`Tx::lock_task`]), so a person's action and a worker's never
//! interleave on one task.

use serde_json::Value;

use super::common::{
    charge_of, consume_envelope, event, insert_artifact, latest_retry, on_settled, set_task, settle_charge, shot_of,
    task_status,
};
use super::intake::submit;
use super::{
    CancelOutcome, NewTask, OwnerCharge, Resolution, ResolveOutcome, RetryAck, RetryOutcome, SubmitOutcome, with_money,
};
use crate::domain::words::{say, say_with};
use crate::domain::{Actor, Charge, FailureKind, Millis, TaskStatus};
use crate::store::StoreError;
use crate::store::tx::Tx;

/// Cancel a task: at once if nothing was sent, else mark it cancel-requested.
pub(in crate::store) fn cancel(tx: &mut dyn Tx, task: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
    tx.lock_task(task)?;
    let Some(status) = task_status(tx, task)? else { return Ok(CancelOutcome::NotFound) };
    match status {
        TaskStatus::Queued | TaskStatus::Waiting => {
            set_task(tx, task, TaskStatus::Canceled, Some(&say("say.nothing_sent")), None, now)?;
            consume_envelope(tx, task, "consumed", Some("canceled"))?;
            event(tx, task, now, Actor::Api, "canceled", "canceled before anything was sent", None)?;
            on_settled(tx, task, now)?;
            Ok(CancelOutcome::Canceled)
        }
        TaskStatus::Running => {
            tx.exec("UPDATE tasks SET cancel_requested = true, updated_at = ?2 WHERE id = ?1", &[&task, &now])?;
            event(tx, task, now, Actor::Api, "cancel_requested", &say("say.cancel_while_running"), None)?;
            Ok(CancelOutcome::Requested)
        }
        settled => Ok(CancelOutcome::Settled(settled)),
    }
}

/// A user-initiated retry: a **new** task linked by `retry_of`.
///
/// Rules, checked in this one operation (so concurrent retries are decided one by one: the
/// original is locked first, and a shot's set row too, so retries of two different tasks of
/// one shot position — the shot and its earlier retry — are ordered as well):
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
    tx: &mut dyn Tx,
    task: &str,
    ack: &RetryAck,
    key: Option<&str>,
    now: Millis,
) -> Result<RetryOutcome, StoreError> {
    tx.lock_task(task)?;
    let row = tx.opt(
        "SELECT status, provider, prompt, params, group_key, operation, source_kind, source_id FROM tasks WHERE id = ?1",
        &[&task],
    )?;
    let Some(row) = row else { return Ok(RetryOutcome::NotFound) };
    let (status, provider, prompt, params_text, group): (String, String, String, String, Option<String>) =
        (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?);
    // A retry is the same operation on the same image.
    let operation = crate::domain::operation::Operation::parse(&row.get::<String>(5)?).unwrap_or_default();
    let source = crate::store::read::source_of(row.get(6)?, row.get(7)?);
    let shot = shot_of(tx, task)?;
    if let Some(s) = &shot {
        tx.lock_set(&s.set_id)?;
    }
    if let Some(k) = key {
        let made: Option<String> = tx
            .opt("SELECT id FROM tasks WHERE retry_of = ?1 AND retry_key = ?2", &[&task, &k])?
            .map(|r| r.get(0))
            .transpose()?;
        if let Some(id) = made {
            return Ok(RetryOutcome::Existing(id));
        }
    }
    let status = TaskStatus::parse(&status).unwrap_or(TaskStatus::Failed);
    if !matches!(status, TaskStatus::Failed | TaskStatus::Unknown | TaskStatus::Canceled) {
        return Ok(RetryOutcome::NotRetryable(status));
    }
    if let Some(s) = &shot {
        let live = tx.opt(
            "SELECT id, status FROM tasks WHERE set_id = ?1 AND set_position = ?2 AND candidate = ?4 AND id <> ?3
               AND status IN ('queued', 'waiting', 'running')
             ORDER BY id DESC LIMIT 1",
            &[&s.set_id, &s.position, &task, &s.candidate],
        )?;
        if let Some(r) = live {
            return Ok(RetryOutcome::RetryInProgress {
                id: r.get(0)?,
                status: TaskStatus::parse(&r.get::<String>(1)?).unwrap_or(TaskStatus::Queued),
            });
        }
    }
    if let Some((id, st)) = latest_retry(tx, task)? {
        if !st.is_settled() {
            return Ok(RetryOutcome::RetryInProgress { id, status: st });
        }
        if ack.retried_as.as_deref() != Some(id.as_str()) {
            return Ok(RetryOutcome::AlreadyRetried { id, status: st });
        }
    }
    let charge = charge_of(tx, task)?.state;
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
        operation,
        source,
    };
    Ok(match submit(tx, &new, now)? {
        SubmitOutcome::Created(id) => {
            let key = if charge.may_cost() { "say.retried_ack" } else { "say.retried" };
            let msg = say_with(key, &[("id", &id)]);
            event(tx, task, now, Actor::Api, "retried", &msg, None)?;
            RetryOutcome::Created(id)
        }
        SubmitOutcome::Existing(id) => RetryOutcome::Existing(id),
        SubmitOutcome::Conflict(_) => RetryOutcome::NotRetryable(status),
    })
}

/// An operator resolves an `unknown` task by hand.
pub(in crate::store) fn resolve(
    tx: &mut dyn Tx,
    task: &str,
    r: &Resolution,
    owner: OwnerCharge,
    note: &str,
    now: Millis,
) -> Result<ResolveOutcome, StoreError> {
    tx.lock_task(task)?;
    let Some(status) = task_status(tx, task)? else { return Ok(ResolveOutcome::NotFound) };
    if status != TaskStatus::Unknown {
        return Ok(ResolveOutcome::NotUnknown(status));
    }
    let exec: String = tx
        .one(
            "SELECT token FROM executions WHERE task_id = ?1 AND status = 'unknown' ORDER BY started_at DESC LIMIT 1",
            &[&task],
        )?
        .get(0)?;
    // A line said with the note when there is one (`KEY_note`), without it otherwise.
    let noted = |key: &str| {
        if note.is_empty() { say(key) } else { say_with(&format!("{key}_note"), &[("note", note)]) }
    };
    match r {
        Resolution::Succeeded(a) => {
            tx.exec("UPDATE executions SET status = 'succeeded', finished_at = ?2 WHERE token = ?1", &[&exec, &now])?;
            // The operator found the image: the request delivered, so it was charged.
            let (_, words) = settle_charge(tx, &exec, Charge::Charged)?;
            insert_artifact(tx, task, &exec, a, now)?;
            let why = noted("say.resolved_by_operator");
            set_task(tx, task, TaskStatus::Succeeded, Some(&why), None, now)?;
            event(
                tx,
                task,
                now,
                Actor::Operator,
                "resolved",
                &owner.words(true, &with_money(&noted("say.resolved_succeeded"), &words)),
                Some(&exec),
            )?;
        }
        Resolution::Failed => {
            tx.exec("UPDATE executions SET status = 'failed', finished_at = ?2 WHERE token = ?1", &[&exec, &now])?;
            let why = noted("say.operator_failed");
            set_task(tx, task, TaskStatus::Failed, Some(&why), Some(FailureKind::Operator), now)?;
            // "It failed" is the operator's word about the image, not about the bill: unless
            // the owner also records what the dashboard shows, the charge stays `possible`.
            let line = owner.words(false, &noted("say.resolved_failed"));
            event(tx, task, now, Actor::Operator, "resolved", &line, Some(&exec))?;
        }
    }
    // The owner's record of the charge: the task's unproven requests (and the one resolved)
    // take it, marked as recorded by hand.
    if let Some(charge) = owner.recorded() {
        tx.exec(
            "UPDATE executions SET charge = ?3, charge_recorded_at = ?4
             WHERE task_id = ?1 AND billable AND calling_at IS NOT NULL AND (charge = 'possible' OR token = ?2)",
            &[&task, &exec, &charge.as_str(), &now],
        )?;
    }
    Ok(ResolveOutcome::Resolved)
}
