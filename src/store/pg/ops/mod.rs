//! The PostgreSQL write operations, one function each, with the same names and the same
//! semantics as the SQLite ones in `store::ops` (the conformance suite holds them to it).
//! What differs is how atomicity is had: each operation runs in its own READ COMMITTED
//! transaction and first locks the rows it decides on (rule L in `store::pg`).
//!
//! **Fencing invariant.** Every operation a worker performs after its claim starts with
//! [`fence`]: lock the task's envelope, then a conditional UPDATE of the execution row that
//! matches only if the execution token is still `running` *and* the envelope still carries
//! the worker's lease token. Zero rows means the worker lost its right; the operation
//! returns [`StoreError::Fenced`] and writes nothing.

mod dispatch;
mod exec;
mod recovery;

use super::Tx;
use crate::domain::{Actor, Charge, FailureKind, Millis, TaskStatus};
use crate::store::{NewArtifact, NewImage, StoreError};

/// Lock a task's envelope row (rule L): every operation on a task starts here, so two
/// operations on one task never interleave. Returns whether the task has an envelope.
pub(super) fn lock_task(tx: &mut Tx<'_, '_>, task: &str) -> Result<bool, StoreError> {
    Ok(tx.opt("SELECT 1 FROM envelopes WHERE task_id = $1 FOR UPDATE", &[&task])?.is_some())
}

pub(super) fn event(
    tx: &mut Tx<'_, '_>,
    task: &str,
    now: Millis,
    actor: Actor,
    kind: &str,
    message: &str,
    exec: Option<&str>,
) -> Result<(), StoreError> {
    tx.exec(
        "INSERT INTO events (task_id, at, actor, kind, message, execution_token) VALUES ($1, $2, $3, $4, $5, $6)",
        &[&task, &now, &actor.as_str(), &kind, &message, &exec],
    )?;
    Ok(())
}

pub(super) fn set_task(
    tx: &mut Tx<'_, '_>,
    task: &str,
    status: TaskStatus,
    reason: Option<&str>,
    kind: Option<FailureKind>,
    now: Millis,
) -> Result<(), StoreError> {
    tx.exec(
        "UPDATE tasks SET status = $2, reason = $3, failure_kind = $4, updated_at = $5 WHERE id = $1",
        &[&task, &status.as_str(), &reason, &kind.map(|k| k.as_str()), &now],
    )?;
    Ok(())
}

pub(super) fn task_status(tx: &mut Tx<'_, '_>, task: &str) -> Result<Option<TaskStatus>, StoreError> {
    let s: Option<String> = tx.opt("SELECT status FROM tasks WHERE id = $1", &[&task])?.map(|r| r.get(0));
    Ok(s.and_then(|s| TaskStatus::parse(&s)))
}

pub(super) fn consume_envelope(
    tx: &mut Tx<'_, '_>,
    task: &str,
    status: &str,
    error: Option<&str>,
) -> Result<(), StoreError> {
    tx.exec(
        "UPDATE envelopes SET status = $2, lease_token = NULL, lease_expires_at = NULL, pass = NULL,
                last_error = coalesce($3, last_error)
         WHERE task_id = $1",
        &[&task, &status, &error],
    )?;
    Ok(())
}

/// Put an envelope back for another dispatch, in the recovery lane: ready at once with its
/// place when `due_at` has come, else waiting (as `store::ops::requeue_envelope`).
pub(super) fn requeue_envelope(
    tx: &mut Tx<'_, '_>,
    task: &str,
    due_at: Millis,
    error: Option<&str>,
    now: Millis,
) -> Result<(), StoreError> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "UPDATE envelopes SET status = 'pending', due_at = $2, lease_token = NULL, lease_expires_at = NULL,
                    lease_node = NULL, lease_boot = NULL, last_error = $3, lane = 'recovery',
                    pass = {}
             WHERE task_id = $1",
            pass_sql("envelopes.provider", "'recovery'", "envelopes.fair_key", "$2::bigint", "$4::bigint")
        )
    });
    tx.exec(SQL.as_str(), &[&task, &due_at, &error, &now])?;
    Ok(())
}

/// The PostgreSQL spelling of `store::ops::pass_sql`: the place of an envelope that becomes
/// ready, NULL while it waits.
pub(super) fn pass_sql(provider: &str, lane: &str, key: &str, due: &str, now: &str) -> String {
    let stride = crate::store::ops::STRIDE;
    format!(
        "CASE WHEN {due} IS NULL OR {due} > {now} THEN NULL
              WHEN coalesce((SELECT pp.fifo FROM providers pp WHERE pp.name = {provider}), false) THEN {due}
              ELSE greatest(coalesce((SELECT min(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                                      AND r.provider = {provider} AND r.lane = {lane}), 0),
                            coalesce((SELECT max(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                                      AND r.provider = {provider} AND r.lane = {lane} AND r.fair_key = {key}) + {stride}, 0))
         END"
    )
}

/// Store an image's bytes under `id`, inside the operation that commits the row they belong
/// to (the SQLite twin is `store::blobs::insert_blob`).
pub(super) fn insert_blob(tx: &mut Tx<'_, '_>, id: &str, img: &NewImage) -> Result<(), StoreError> {
    tx.exec(
        "INSERT INTO blobs (id, sha256, bytes, media_type, data) VALUES ($1, $2, $3, $4, $5)",
        &[&id, &img.sha256(), &img.len(), &img.media_type(), &img.bytes()],
    )?;
    Ok(())
}

/// Attach a verified image to a task: its bytes and its artifact row, in the caller's
/// transaction.
pub(super) fn insert_artifact(
    tx: &mut Tx<'_, '_>,
    task: &str,
    exec: &str,
    a: &NewArtifact,
    now: Millis,
) -> Result<(), StoreError> {
    insert_blob(tx, &a.id, &a.image)?;
    tx.exec(
        "INSERT INTO artifacts (id, task_id, execution_token, sha256, bytes, media_type, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[&a.id, &task, &exec, &a.image.sha256(), &a.image.len(), &a.image.media_type(), &now],
    )?;
    Ok(())
}

/// Record what an outcome proves about money on an execution, under the store's rule (as
/// `store::ops::settle_charge`): an execution that never recorded `calling`, or whose provider
/// never bills, is [`Charge::None`] whatever the caller says. Returns the charge recorded and
/// the words for the timeline (empty when nothing was sent).
pub(super) fn settle_charge(tx: &mut Tx<'_, '_>, exec: &str, charge: Charge) -> Result<(Charge, String), StoreError> {
    let row = tx.opt(
        "UPDATE executions SET charge = CASE WHEN calling_at IS NULL OR NOT billable THEN 'none' ELSE $2 END
         WHERE token = $1 RETURNING charge, calling_at IS NOT NULL, cost_micros, currency",
        &[&exec, &charge.as_str()],
    )?;
    let Some(r) = row else { return Ok((Charge::None, String::new())) };
    let stored = Charge::parse(r.get(0)).unwrap_or(Charge::Possible);
    let (called, cost, currency): (bool, Option<i64>, Option<String>) = (r.get(1), r.get(2), r.get(3));
    Ok((stored, crate::store::ops::charge_words(called, stored, charge, cost, currency.as_deref())))
}

/// Called in every transaction that settles a task (terminal or unknown): schedules what
/// was waiting for it (the next shot of its image set), in the same transaction.
pub(super) fn on_settled(tx: &mut Tx<'_, '_>, task: &str, now: Millis) -> Result<(), StoreError> {
    super::sets::schedule_next_shot(tx, task, now)
}

/// The fencing check (see module docs): lock the envelope, then mark the execution's row as
/// still ours, or fail. Returns the task id.
pub(super) fn fence(tx: &mut Tx<'_, '_>, exec: &str, lease: &str, now: Millis) -> Result<String, StoreError> {
    let task: Option<String> = tx.opt("SELECT task_id FROM executions WHERE token = $1", &[&exec])?.map(|r| r.get(0));
    let Some(task) = task else { return Err(StoreError::Fenced) };
    lock_task(tx, &task)?;
    tx.opt(
        "UPDATE executions SET heartbeat_at = $3
         WHERE token = $1 AND status = 'running'
           AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = executions.task_id
                       AND e.status = 'sent' AND e.lease_token = $2)
         RETURNING task_id",
        &[&exec, &lease, &now],
    )?
    .map(|r| r.get(0))
    .ok_or(StoreError::Fenced)
}
