//! Write operations, one function each, named for what they do. Each runs on the writer
//! thread inside its own savepoint (see `store::mod`), so each is atomic on its own.
//!
//! **Fencing invariant.** Every operation a worker performs after its claim starts with
//! [`fence`]: a conditional UPDATE of the execution row that matches only if the execution
//! token is still `running` *and* the task's envelope still carries the worker's lease token.
//! Zero rows means the worker lost its right; the operation returns [`StoreError::Fenced`]
//! and writes nothing.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::{Store, StoreError};
use crate::domain::{Actor, FailureKind, Millis, Phase, TaskStatus, request_hash};

/// A task to create.
#[derive(Debug, Clone, Default)]
pub struct NewTask {
    pub provider: String,
    pub prompt: String,
    pub params: Value,
    pub idempotency_key: Option<String>,
    pub retry_of: Option<String>,
    /// Set when the task is a shot of an image set.
    pub shot: Option<ShotRef>,
}

/// Where a task sits in an image set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShotRef {
    pub set_id: String,
    pub position: i64,
    pub role: String,
}

impl NewTask {
    fn hash(&self) -> String {
        request_hash(&self.provider, &self.prompt, &self.params, "")
    }
}

/// The result of a submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// A new task (and its envelope) was committed.
    Created(String),
    /// The idempotency key names an existing task with the same request.
    Existing(String),
    /// The idempotency key names an existing task with a different request.
    Conflict(String),
}

impl SubmitOutcome {
    /// The task id in every case.
    pub fn task_id(&self) -> &str {
        match self {
            SubmitOutcome::Created(id) | SubmitOutcome::Existing(id) | SubmitOutcome::Conflict(id) => id,
        }
    }
}

/// An envelope handed to the in-process transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    pub envelope_id: String,
    pub task_id: String,
    pub provider: String,
    /// Which hand-off this is: a claim must name it, so a stale hand-off cannot claim.
    pub send_count: i64,
    /// When the envelope fell due (for the dispatch-delay metric).
    pub due_at: Millis,
}

/// What the dispatcher marked `sent`, and when the next pending envelope falls due.
#[derive(Debug, Clone, Default)]
pub struct DispatchBatch {
    pub handoffs: Vec<Handoff>,
    pub next_due: Option<Millis>,
}

/// A claimed execution: everything a worker needs to run it.
#[derive(Debug, Clone)]
pub struct Claim {
    pub execution_token: String,
    pub lease_token: String,
    pub task_id: String,
    pub provider: String,
    pub prompt: String,
    pub params: Value,
    pub attempt: i64,
    pub phase: Phase,
    pub job_id: Option<String>,
    pub idempotency_key: String,
    pub calling_at: Option<Millis>,
    /// True when this claim adopted an execution an earlier worker left in `calling` or
    /// `accepted` (after a crash or an expired lease).
    pub resumed: bool,
    pub cancel_requested: bool,
    /// When the task was submitted.
    pub created_at: Millis,
    /// Reference images to send (an image set's product photos).
    pub references: Vec<super::UploadView>,
}

/// The result of a claim.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    Claimed(Box<Claim>),
    /// Someone else owns the envelope, or the task no longer needs running.
    Lost,
}

/// An image file already written under the data dir, to be attached to a task.
#[derive(Debug, Clone)]
pub struct NewArtifact {
    pub id: String,
    /// Relative to the data dir.
    pub path: String,
    pub sha256: String,
    pub bytes: i64,
    pub media_type: String,
}

/// How an execution ends (or pauses).
#[derive(Debug, Clone)]
pub enum Finish {
    /// The image is saved and verified.
    Succeeded(NewArtifact),
    /// A definite failure: not retried.
    Failed { kind: FailureKind, reason: String },
    /// Nothing can prove what happened: automatic retries stop.
    Unknown { reason: String },
    /// Try again at `due_at`. When `counted` and the attempts are used up, the task fails
    /// with `kind` instead.
    RetryLater { due_at: Millis, kind: FailureKind, reason: String, max_attempts: i64 },
    /// A cancel arrived before anything was sent.
    CanceledBeforeCall,
}

/// What the reconciler does with one leftover, as applied to the database.
#[derive(Debug, Clone)]
pub enum Recovery {
    Requeue,
    GiveUp,
    Abandon,
    FinishFromFile(NewArtifact),
    Resume,
    Unknown,
}

/// A sent envelope whose deadline passed, with the execution it leaves behind (if any).
#[derive(Debug, Clone)]
pub struct LeftoverRow {
    pub envelope_id: String,
    pub task_id: String,
    pub provider: String,
    pub send_count: i64,
    pub lease_token: Option<String>,
    /// (token, phase) of the task's running execution.
    pub execution: Option<(String, Phase)>,
}

/// The result of a cancel request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Nothing had been sent: canceled at once.
    Canceled,
    /// Running: marked cancel-requested; a result that arrives is kept.
    Requested,
    /// Already settled with this status.
    Settled(TaskStatus),
    NotFound,
}

/// The result of a user retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryOutcome {
    Created(String),
    /// The idempotency key names a retry already made.
    Existing(String),
    /// The original may have been charged: the caller must acknowledge possible extra cost.
    NeedsAcknowledgement,
    /// The task is not in a state that can be retried.
    NotRetryable(TaskStatus),
    NotFound,
}

/// An operator's resolution of an `unknown` task.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// Found the image (e.g. in the provider's dashboard) and attached it.
    Succeeded(NewArtifact),
    /// Confirmed that it failed.
    Failed,
}

/// The result of an operator resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveOutcome {
    Resolved,
    NotUnknown(TaskStatus),
    NotFound,
}

pub(super) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

pub(super) fn event(
    c: &Connection,
    task: &str,
    now: Millis,
    actor: Actor,
    kind: &str,
    message: &str,
    exec: Option<&str>,
) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO events (task_id, at, actor, kind, message, execution_token) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![task, now, actor.as_str(), kind, message, exec])?;
    Ok(())
}

pub(super) fn set_task(
    c: &Connection,
    task: &str,
    status: TaskStatus,
    reason: Option<&str>,
    kind: Option<FailureKind>,
    now: Millis,
) -> Result<(), StoreError> {
    c.prepare_cached("UPDATE tasks SET status = ?2, reason = ?3, failure_kind = ?4, updated_at = ?5 WHERE id = ?1")?
        .execute(params![task, status.as_str(), reason, kind.map(|k| k.as_str()), now])?;
    Ok(())
}

fn task_status(c: &Connection, task: &str) -> Result<Option<TaskStatus>, StoreError> {
    let s: Option<String> =
        c.prepare_cached("SELECT status FROM tasks WHERE id = ?1")?.query_row([task], |r| r.get(0)).optional()?;
    Ok(s.and_then(|s| TaskStatus::parse(&s)))
}

fn consume_envelope(c: &Connection, task: &str, status: &str, error: Option<&str>) -> Result<(), StoreError> {
    c.prepare_cached(
        "UPDATE envelopes SET status = ?2, lease_token = NULL, lease_expires_at = NULL, last_error = coalesce(?3, last_error)
         WHERE task_id = ?1",
    )?
    .execute(params![task, status, error])?;
    Ok(())
}

fn requeue_envelope(c: &Connection, task: &str, due_at: Millis, error: Option<&str>) -> Result<(), StoreError> {
    c.prepare_cached(
        "UPDATE envelopes SET status = 'pending', due_at = ?2, lease_token = NULL, lease_expires_at = NULL,
                lease_boot = NULL, last_error = ?3
         WHERE task_id = ?1",
    )?
    .execute(params![task, due_at, error])?;
    Ok(())
}

fn insert_artifact(c: &Connection, task: &str, exec: &str, a: &NewArtifact, now: Millis) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO artifacts (id, task_id, execution_token, path, sha256, bytes, media_type, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![a.id, task, exec, a.path, a.sha256, a.bytes, a.media_type, now])?;
    Ok(())
}

/// Called in every transaction that settles a task (terminal or unknown): schedules what
/// was waiting for it (the next shot of its image set), in the same transaction.
pub(super) fn on_settled(c: &Connection, task: &str, now: Millis) -> Result<(), StoreError> {
    super::sets::schedule_next_shot(c, task, now)
}

/// The fencing check (see module docs): mark the execution's row as still ours, or fail.
/// Returns the task id.
fn fence(c: &Connection, exec: &str, lease: &str, now: Millis) -> Result<String, StoreError> {
    c.prepare_cached(
        "UPDATE executions SET heartbeat_at = ?3
         WHERE token = ?1 AND status = 'running'
           AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = executions.task_id
                       AND e.status = 'sent' AND e.lease_token = ?2)
         RETURNING task_id",
    )?
    .query_row(params![exec, lease, now], |r| r.get(0))
    .optional()?
    .ok_or(StoreError::Fenced)
}

/// If `key` was already used in `table` (`tasks` or `sets`): the same request (`Existing`) or
/// a different one (`Conflict`).
pub(super) fn replay_of(
    c: &Connection,
    table: &str,
    key: Option<&str>,
    hash: &str,
) -> Result<Option<SubmitOutcome>, StoreError> {
    let Some(key) = key else { return Ok(None) };
    let existing: Option<(String, String)> = c
        .prepare_cached(&format!("SELECT id, request_hash FROM {table} WHERE idempotency_key = ?1"))?
        .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(existing.map(|(id, h)| if h == hash { SubmitOutcome::Existing(id) } else { SubmitOutcome::Conflict(id) }))
}

/// Insert a task and its envelope in one transaction (the outbox write).
pub(super) fn submit(c: &Connection, t: &NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
    let hash = t.hash();
    if let Some(seen) = replay_of(c, "tasks", t.idempotency_key.as_deref(), &hash)? {
        return Ok(seen);
    }
    let id = new_id();
    let (set_id, position, role) = match &t.shot {
        Some(s) => (Some(s.set_id.as_str()), Some(s.position), Some(s.role.as_str())),
        None => (None, None, None),
    };
    c.prepare_cached(
        "INSERT INTO tasks (id, idempotency_key, request_hash, provider, prompt, params, status, retry_of,
                            set_id, set_position, shot_role, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'queued', ?7, ?8, ?9, ?10, ?11, ?11)",
    )?
    .execute(params![
        id,
        t.idempotency_key,
        hash,
        t.provider,
        t.prompt,
        t.params.to_string(),
        t.retry_of,
        set_id,
        position,
        role,
        now
    ])?;
    // A shot waits (due_at NULL) while another shot of its set is scheduled: one at a time.
    let due = match set_id {
        Some(set) if super::sets::set_has_live_shot(c, set)? => None,
        _ => Some(now),
    };
    c.prepare_cached(
        "INSERT INTO envelopes (id, task_id, provider, status, due_at) VALUES (?1, ?2, ?3, 'pending', ?4)",
    )?
    .execute(params![new_id(), id, t.provider, due])?;
    let mut msg = match &t.retry_of {
        Some(orig) => format!("submitted as a new operation retrying task {orig}"),
        None => "submitted".to_string(),
    };
    if let Some(s) = &t.shot {
        msg.push_str(&format!(" as shot {} ({}) of set {}", s.position + 1, s.role, s.set_id));
        if due.is_none() {
            msg.push_str("; it waits until the set's current shot is settled");
        }
    }
    event(c, &id, now, Actor::Api, "submitted", &msg, None)?;
    Ok(SubmitOutcome::Created(id))
}

/// The dispatcher's statement: mark up to ?2 envelopes due at ?1 `sent`.
const DISPATCH_DUE: &str = "UPDATE envelopes SET status = 'sent', sent_at = ?1, send_count = send_count + 1,
        lease_expires_at = ?1 + ?3, lease_boot = ?4
 WHERE id IN (SELECT id FROM envelopes WHERE status = 'pending' AND due_at IS NOT NULL AND due_at <= ?1
              ORDER BY due_at LIMIT ?2)
 RETURNING id, task_id, provider, send_count, due_at";

/// Mark up to `limit` due envelopes `sent` (before they are handed to the transport) and
/// report when the next one falls due.
pub(super) fn dispatch_due(
    c: &Connection,
    now: Millis,
    limit: usize,
    grace_ms: Millis,
    boot: &str,
) -> Result<DispatchBatch, StoreError> {
    let mut batch = DispatchBatch::default();
    if limit > 0 {
        let mut stmt = c.prepare_cached(DISPATCH_DUE)?;
        let rows = stmt.query_map(params![now, limit as i64, grace_ms, boot], |r| {
            Ok(Handoff {
                envelope_id: r.get(0)?,
                task_id: r.get(1)?,
                provider: r.get(2)?,
                send_count: r.get(3)?,
                due_at: r.get(4)?,
            })
        })?;
        for h in rows {
            batch.handoffs.push(h?);
        }
    }
    batch.next_due = c
        .prepare_cached("SELECT min(due_at) FROM envelopes WHERE status = 'pending' AND due_at IS NOT NULL")?
        .query_row([], |r| r.get(0))?;
    Ok(batch)
}

/// The provider had no free slot: put the envelope back, due later. No attempt is counted,
/// nothing is recorded as a failure, and the hand-off is not counted as a send either
/// (`send_count` goes back down): `max_sends` limits hand-offs that were *lost*, and a task
/// that waits through many busy releases must not be failed as undeliverable by a crash
/// that catches its next hand-off. Reusing the number is safe: the releasing worker was its
/// only holder and is done with it; a release only undoes its own dispatch, and a requeue by
/// the reconciler keeps the count, so a stale holder's number is never handed out again.
pub(super) fn release_busy(
    c: &Connection,
    h: &Handoff,
    due_at: Millis,
    why: &str,
    now: Millis,
) -> Result<bool, StoreError> {
    let n = c
        .prepare_cached(
            "UPDATE envelopes SET status = 'pending', due_at = ?3, send_count = send_count - 1,
                    lease_expires_at = NULL, lease_boot = NULL
             WHERE id = ?1 AND status = 'sent' AND lease_token IS NULL AND send_count = ?2",
        )?
        .execute(params![h.envelope_id, h.send_count, due_at])?;
    if n == 0 {
        return Ok(false);
    }
    if task_status(c, &h.task_id)? != Some(TaskStatus::Waiting) {
        event(c, &h.task_id, now, Actor::Worker, "busy", why, None)?;
    }
    c.prepare_cached(
        "UPDATE tasks SET status = 'waiting', reason = ?2, updated_at = ?3 WHERE id = ?1 AND status IN ('queued', 'waiting')",
    )?
    .execute(params![h.task_id, why, now])?;
    Ok(true)
}

/// What a claim reads of its task: (status, prompt, params, attempts, cancel_requested,
/// created_at, set_id).
type TaskRow = (String, String, String, i64, bool, Millis, Option<String>);

/// A running execution's (token, phase, job id, idempotency key, calling_at, attempt).
type RunningRow = (String, String, Option<String>, String, Option<Millis>, i64);

/// Claim a handed-off envelope: take its lease and open (or adopt) an execution.
pub(super) fn claim(
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
        Some(set) => super::sets::references_of_set(c, set)?,
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
            let key = format!("tally-{token}");
            let attempt = attempts + 1;
            c.prepare_cached(
                "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, boot_id, heartbeat_at, started_at)
                 VALUES (?1, ?2, ?3, 'running', 'claimed', ?4, ?5, ?6, ?6)",
            )?
            .execute(params![token, h.task_id, attempt, key, boot, now])?;
            event(c, &h.task_id, now, Actor::Worker, "claimed", &format!("attempt {attempt} started"), Some(&token))?;
            (token, Phase::Claimed, None, key, None, attempt, false)
        }
    };
    let claim = Claim {
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

/// Durably record "about to call the provider". From here on, no automatic path calls the
/// provider again for this task unless the adapter can prove it is safe.
pub(super) fn record_calling(c: &Connection, exec: &str, lease: &str, now: Millis) -> Result<(), StoreError> {
    let task = fence(c, exec, lease, now)?;
    let n = c
        .prepare_cached(
            "UPDATE executions SET phase = 'calling', calling_at = ?2 WHERE token = ?1 AND phase = 'claimed'",
        )?
        .execute(params![exec, now])?;
    if n == 0 {
        return Err(StoreError::Fenced);
    }
    c.prepare_cached("UPDATE tasks SET attempts = attempts + 1, may_have_charged = 1, updated_at = ?2 WHERE id = ?1")?
        .execute(params![task, now])?;
    event(
        c,
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
pub(super) fn record_accepted(
    c: &Connection,
    exec: &str,
    lease: &str,
    job: &str,
    now: Millis,
) -> Result<(), StoreError> {
    let task = fence(c, exec, lease, now)?;
    c.prepare_cached("UPDATE executions SET phase = 'accepted', provider_job_id = ?2 WHERE token = ?1")?
        .execute(params![exec, job])?;
    event(c, &task, now, Actor::Worker, "accepted", &format!("the provider accepted the job as {job}"), Some(exec))?;
    Ok(())
}

/// Extend the worker's lease.
pub(super) fn heartbeat(
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
pub(super) fn finish(
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
    let status = match f {
        Finish::Succeeded(a) => {
            set_exec("succeeded", None)?;
            insert_artifact(c, &task, exec, a, now)?;
            let canceled: bool = c
                .prepare_cached("SELECT cancel_requested FROM tasks WHERE id = ?1")?
                .query_row([&task], |r| r.get(0))?;
            let reason = canceled.then_some(
                "A cancel was requested after the request had been sent; the image was kept because it may have been charged.",
            );
            set_task(c, &task, TaskStatus::Succeeded, reason, None, now)?;
            consume_envelope(c, &task, "consumed", None)?;
            event(
                c,
                &task,
                now,
                Actor::Worker,
                "succeeded",
                &format!("image saved ({} bytes, sha256 {})", a.bytes, a.sha256),
                ex,
            )?;
            TaskStatus::Succeeded
        }
        Finish::Failed { kind, reason } => {
            set_exec("failed", Some(reason))?;
            set_task(c, &task, TaskStatus::Failed, Some(reason), Some(*kind), now)?;
            consume_envelope(c, &task, "consumed", Some(reason))?;
            event(c, &task, now, Actor::Worker, "failed", reason, ex)?;
            TaskStatus::Failed
        }
        Finish::Unknown { reason } => {
            set_exec("unknown", Some(reason))?;
            set_task(c, &task, TaskStatus::Unknown, Some(reason), None, now)?;
            consume_envelope(c, &task, "consumed", Some(reason))?;
            event(c, &task, now, Actor::Worker, "unknown", &format!("{reason}; automatic retries stopped"), ex)?;
            TaskStatus::Unknown
        }
        Finish::RetryLater { due_at, kind, reason, max_attempts } => {
            set_exec("failed", Some(reason))?;
            let attempts: i64 =
                c.prepare_cached("SELECT attempts FROM tasks WHERE id = ?1")?.query_row([&task], |r| r.get(0))?;
            if attempts >= *max_attempts {
                let why = format!("gave up after {attempts} attempts; the last one: {reason}");
                set_task(c, &task, TaskStatus::Failed, Some(&why), Some(*kind), now)?;
                consume_envelope(c, &task, "consumed", Some(reason))?;
                event(c, &task, now, Actor::Worker, "failed", &why, ex)?;
                TaskStatus::Failed
            } else {
                let secs = (due_at - now).max(0) as f64 / 1000.0;
                let why = format!("attempt {attempts} did not go through ({reason}); trying again in {secs:.1} s");
                set_task(c, &task, TaskStatus::Waiting, Some(&why), None, now)?;
                requeue_envelope(c, &task, *due_at, Some(reason))?;
                event(c, &task, now, Actor::Worker, "retry_scheduled", &why, ex)?;
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
/// the result is not attached, and its file is left for the orphan sweep).
pub(super) fn late_result(c: &Connection, exec: &str, a: &NewArtifact, now: Millis) -> Result<bool, StoreError> {
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
        "a late answer from the same execution resolved the unknown outcome",
        Some(exec),
    )?;
    Ok(true)
}

/// Cancel a task: at once if nothing was sent, else mark it cancel-requested.
pub(super) fn cancel(c: &Connection, task: &str, now: Millis) -> Result<CancelOutcome, StoreError> {
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
pub(super) fn retry(
    c: &Connection,
    task: &str,
    acknowledged: bool,
    key: Option<&str>,
    now: Millis,
) -> Result<RetryOutcome, StoreError> {
    let row: Option<(String, String, String, String, bool)> = c
        .prepare_cached("SELECT status, provider, prompt, params, may_have_charged FROM tasks WHERE id = ?1")?
        .query_row([task], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .optional()?;
    let Some((status, provider, prompt, params_text, charged)) = row else { return Ok(RetryOutcome::NotFound) };
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
        shot: super::sets::shot_of(c, task)?,
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
pub(super) fn resolve(
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

/// Sent envelopes past their deadline, or leased by an earlier run of the process.
pub(super) fn leftovers(c: &Connection, now: Millis, boot: &str) -> Result<Vec<LeftoverRow>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT e.id, e.task_id, e.provider, e.send_count, e.lease_token, x.token, x.phase
         FROM envelopes e LEFT JOIN executions x ON x.task_id = e.task_id AND x.status = 'running'
         WHERE e.status = 'sent' AND (e.lease_expires_at <= ?1 OR e.lease_boot IS NOT ?2)",
    )?;
    let rows = stmt.query_map(params![now, boot], |r| {
        let token: Option<String> = r.get(5)?;
        let phase: Option<String> = r.get(6)?;
        Ok(LeftoverRow {
            envelope_id: r.get(0)?,
            task_id: r.get(1)?,
            provider: r.get(2)?,
            send_count: r.get(3)?,
            lease_token: r.get(4)?,
            execution: token.zip(phase.and_then(|p| Phase::parse(&p))),
        })
    })?;
    rows.map(|r| r.map_err(StoreError::from)).collect()
}

/// Apply the reconciler's decisions. Each is fenced on the envelope still being exactly as
/// the reconciler saw it (same hand-off, same lease); a changed one is skipped.
pub(super) fn apply_recovery(
    c: &Connection,
    items: &[(LeftoverRow, Recovery)],
    now: Millis,
) -> Result<Vec<(String, TaskStatus)>, StoreError> {
    let mut applied = Vec::new();
    for (row, decision) in items {
        let still = c
            .prepare_cached(
                "SELECT 1 FROM envelopes WHERE id = ?1 AND status = 'sent' AND send_count = ?2 AND lease_token IS ?3",
            )?
            .query_row(params![row.envelope_id, row.send_count, row.lease_token], |_| Ok(()))
            .optional()?;
        if still.is_none() {
            continue;
        }
        let task = row.task_id.as_str();
        let exec = row.execution.as_ref().map(|(t, _)| t.as_str());
        let set_exec = |status: &str, error: &str| -> Result<(), StoreError> {
            if let Some(token) = exec {
                c.prepare_cached("UPDATE executions SET status = ?2, finished_at = ?3, error = ?4 WHERE token = ?1")?
                    .execute(params![token, status, now, error])?;
            }
            Ok(())
        };
        let r = Actor::Reconciler;
        match decision {
            Recovery::Requeue => {
                requeue_envelope(c, task, now, Some("handed off but never claimed"))?;
                event(
                    c,
                    task,
                    now,
                    r,
                    "requeued",
                    "handed to a worker that never started it; queued again (nothing was sent)",
                    None,
                )?;
                applied.push((row.task_id.clone(), task_status(c, task)?.unwrap_or(TaskStatus::Queued)));
            }
            Recovery::GiveUp => {
                let why = format!("could not be delivered to a worker after {} hand-offs", row.send_count);
                consume_envelope(c, task, "dead", Some(&why))?;
                set_task(c, task, TaskStatus::Failed, Some(&why), Some(FailureKind::Undeliverable), now)?;
                event(c, task, now, r, "failed", &why, None)?;
                on_settled(c, task, now)?;
                applied.push((row.task_id.clone(), TaskStatus::Failed));
            }
            Recovery::Abandon => {
                set_exec("abandoned", "the worker stopped before calling the provider")?;
                requeue_envelope(c, task, now, Some("worker lost before calling"))?;
                set_task(
                    c,
                    task,
                    TaskStatus::Waiting,
                    Some("The worker stopped before anything was sent; queued again."),
                    None,
                    now,
                )?;
                event(
                    c,
                    task,
                    now,
                    r,
                    "abandoned",
                    "the worker stopped before calling the provider; nothing was sent; queued again",
                    exec,
                )?;
                applied.push((row.task_id.clone(), TaskStatus::Waiting));
            }
            Recovery::FinishFromFile(a) => {
                set_exec("succeeded", "")?;
                if let Some(token) = exec {
                    insert_artifact(c, task, token, a, now)?;
                }
                set_task(
                    c,
                    task,
                    TaskStatus::Succeeded,
                    Some("Recovered the saved image after an interruption."),
                    None,
                    now,
                )?;
                consume_envelope(c, task, "consumed", None)?;
                event(
                    c,
                    task,
                    now,
                    r,
                    "recovered",
                    "found the saved image on disk, verified its hash and finished the task",
                    exec,
                )?;
                on_settled(c, task, now)?;
                applied.push((row.task_id.clone(), TaskStatus::Succeeded));
            }
            Recovery::Resume => {
                requeue_envelope(c, task, now, Some("lease expired during the provider call"))?;
                set_task(
                    c,
                    task,
                    TaskStatus::Waiting,
                    Some("Interrupted while the provider was working; recovering without sending again."),
                    None,
                    now,
                )?;
                event(
                    c,
                    task,
                    now,
                    r,
                    "recovering",
                    "the worker's lease expired during the provider call; handing the same execution to a worker to look up or replay, not to resend",
                    exec,
                )?;
                applied.push((row.task_id.clone(), TaskStatus::Waiting));
            }
            Recovery::Unknown => {
                let why = "interrupted after the request may have left, and this provider cannot prove what happened";
                set_exec("unknown", why)?;
                consume_envelope(c, task, "consumed", Some(why))?;
                set_task(c, task, TaskStatus::Unknown, Some(why), None, now)?;
                event(c, task, now, r, "unknown", &format!("{why}; automatic retries stopped"), exec)?;
                on_settled(c, task, now)?;
                applied.push((row.task_id.clone(), TaskStatus::Unknown));
            }
        }
    }
    Ok(applied)
}

impl Store {
    /// Insert a task and its envelope in one transaction.
    pub async fn submit(&self, t: NewTask, now: Millis) -> Result<SubmitOutcome, StoreError> {
        self.write(move |c| submit(c, &t, now)).await
    }

    /// Like [`Store::submit`], and also read the task back in the same operation (saves the
    /// API a separate read after each submit).
    pub async fn submit_and_get(
        &self,
        t: NewTask,
        now: Millis,
    ) -> Result<(SubmitOutcome, Option<super::TaskView>), StoreError> {
        self.write(move |c| {
            let out = submit(c, &t, now)?;
            let view = super::get_task(c, out.task_id())?;
            Ok((out, view))
        })
        .await
    }

    /// Mark due envelopes `sent` and return them with the next due time. An ordered commit
    /// ([`super::Commit::Ordered`]): if a power loss erases it, the envelopes are simply
    /// still `pending`.
    pub async fn dispatch_due(
        &self,
        now: Millis,
        limit: usize,
        grace_ms: Millis,
        boot: &str,
    ) -> Result<DispatchBatch, StoreError> {
        let boot = boot.to_string();
        self.write_ordered(move |c| dispatch_due(c, now, limit, grace_ms, &boot)).await
    }

    /// Put a handed-off envelope back because its provider had no free slot (ordered commit:
    /// if lost, the reconciler requeues the hand-off).
    pub async fn release_busy(&self, h: Handoff, due_at: Millis, why: String, now: Millis) -> Result<bool, StoreError> {
        self.write_ordered(move |c| release_busy(c, &h, due_at, &why, now)).await
    }

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

    /// Durably record phase `calling`.
    pub async fn record_calling(&self, exec: String, lease: String, now: Millis) -> Result<(), StoreError> {
        self.write(move |c| record_calling(c, &exec, &lease, now)).await
    }

    /// Persist an accepted job id.
    pub async fn record_accepted(
        &self,
        exec: String,
        lease: String,
        job: String,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.write(move |c| record_accepted(c, &exec, &lease, &job, now)).await
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
    pub async fn finish(&self, exec: String, lease: String, f: Finish, now: Millis) -> Result<TaskStatus, StoreError> {
        self.write(move |c| finish(c, &exec, &lease, &f, now)).await
    }

    /// Attach a late result to an `unknown` execution.
    pub async fn late_result(&self, exec: String, a: NewArtifact, now: Millis) -> Result<bool, StoreError> {
        self.write(move |c| late_result(c, &exec, &a, now)).await
    }

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

    /// Resolve an `unknown` task by hand.
    pub async fn resolve(
        &self,
        task: String,
        r: Resolution,
        note: String,
        now: Millis,
    ) -> Result<ResolveOutcome, StoreError> {
        self.write(move |c| resolve(c, &task, &r, &note, now)).await
    }

    /// Leftovers for the reconciler (read through the writer so it sees every commit; writes
    /// nothing, so it does not ask for an fsync).
    pub async fn leftovers(&self, now: Millis, boot: &str) -> Result<Vec<LeftoverRow>, StoreError> {
        let boot = boot.to_string();
        self.write_ordered(move |c| leftovers(c, now, &boot)).await
    }

    /// Apply reconciler decisions.
    pub async fn apply_recovery(
        &self,
        items: Vec<(LeftoverRow, Recovery)>,
        now: Millis,
    ) -> Result<Vec<(String, TaskStatus)>, StoreError> {
        self.write(move |c| apply_recovery(c, &items, now)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store turns on SQLite's query-planner stability guarantee: without it the
    /// dispatcher's statement (a `LIMIT ?` and a `due_at <= ?` beside a partial index) is
    /// re-prepared on every run with new values, which tripled its cost.
    #[tokio::test]
    async fn hot_statements_are_prepared_once() {
        let dir = std::env::temp_dir().join(format!("tally-qpsg-{}", uuid::Uuid::new_v4()));
        let store = Store::open(&dir.join("tally.db"), crate::config::Durability::Normal).expect("open");
        for i in 0..3i64 {
            let t = NewTask { provider: "p".into(), prompt: format!("t{i}"), ..NewTask::default() };
            store.submit(t, 1_000 + i).await.expect("submit");
            let batch = store.dispatch_due(1_000 + i, 1 + i as usize, 50, "boot").await.expect("dispatch");
            assert_eq!(batch.handoffs.len(), 1, "run {i} hands off the task just submitted");
        }
        let (runs, reprepares) = store
            .write(|c| {
                let st = c.prepare_cached(DISPATCH_DUE)?;
                Ok((st.get_status(rusqlite::StatementStatus::Run), st.get_status(rusqlite::StatementStatus::RePrepare)))
            })
            .await
            .expect("status");
        assert_eq!(runs, 3, "the cached statement is the one the dispatcher ran");
        assert_eq!(reprepares, 0, "new bound values must not re-prepare the statement");
        store.close().expect("close");
        let _ = std::fs::remove_dir_all(dir);
    }
}
