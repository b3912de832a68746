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

use super::blobs::{NewArtifact, insert_blob};
use super::{SqliteStore, StoreError};

pub(in crate::store) mod common;
pub mod deliveries;
mod dispatch;
mod exec;
pub(in crate::store) mod intake;
mod recovery;
mod slots;
pub(in crate::store) mod user;

use crate::domain::{Actor, Charge, FailureKind, Micros, Millis, Phase, TaskStatus, request_hash};
pub(in crate::store) use common::latest_retry;
#[cfg(test)]
use dispatch::{CANDIDATES, PROVIDERS_STATE};
pub(in crate::store) use dispatch::{Candidate, STRIDE, State, fair_key, interleave, pass_sql, plan_provider};
pub use exec::provider_key;
pub(in crate::store) use intake::submit;

/// A task to create.
#[derive(Debug, Clone, Default)]
pub struct NewTask {
    pub provider: String,
    pub prompt: String,
    pub params: Value,
    pub idempotency_key: Option<String>,
    pub retry_of: Option<String>,
    /// A retry's idempotency key, unique per original task (`retry_of`): the same key on
    /// another task's retry names a different operation.
    pub retry_key: Option<String>,
    /// Set when the task is a shot of an image set.
    pub shot: Option<ShotRef>,
    /// The submitter's group: tasks of one group share a fairness key (a set's shots use
    /// the set instead).
    pub group: Option<String>,
}

/// Where a task sits in an image set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShotRef {
    pub set_id: String,
    pub position: i64,
    pub role: String,
    /// Which candidate of the shot this task is (0 for the first).
    pub candidate: i64,
}

impl NewTask {
    pub(in crate::store) fn hash(&self) -> String {
        request_hash(&self.provider, &self.prompt, &self.params, self.group.as_deref().unwrap_or(""))
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

/// Which lane an envelope is dispatched from (see `store::ops::dispatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A task's first dispatch: what a person (or a client) just asked for.
    Fresh,
    /// What the system put back: recovery decisions, retries after errors, resumes, releases
    /// because a circuit was open, budget holds.
    Recovery,
}

impl Lane {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Fresh => "fresh",
            Lane::Recovery => "recovery",
        }
    }

    /// Parse a stored name (anything unknown is the recovery lane).
    pub fn parse(s: &str) -> Lane {
        if s == "fresh" { Lane::Fresh } else { Lane::Recovery }
    }
}

pub use crate::domain::DispatchOrder;

/// A provider as the dispatcher sees it (`providers` table): its slots and its lanes' weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSlots {
    pub name: String,
    /// Calls to this provider at the same time, across both lanes.
    pub max_concurrency: usize,
    /// Slots the recovery lane leaves free for fresh work (it always may use at least one).
    pub reserve: usize,
    pub fresh_weight: u32,
    pub recovery_weight: u32,
    pub order: DispatchOrder,
}

impl ProviderSlots {
    /// A provider with the default reserve (1) and weights (fresh 4 : recovery 1).
    pub fn new(name: impl Into<String>, max_concurrency: usize) -> Self {
        ProviderSlots {
            name: name.into(),
            max_concurrency: max_concurrency.max(1),
            reserve: 1,
            fresh_weight: 4,
            recovery_weight: 1,
            order: DispatchOrder::Fair,
        }
    }
}

/// What the dispatcher claimed, and when it should look again on its own.
#[derive(Debug, Clone, Default)]
pub struct DispatchBatch {
    pub claims: Vec<Claim>,
    /// The earliest time something not dispatchable now becomes dispatchable: a waiting
    /// envelope's due time, or the end of a provider's pause while ready work waits for it.
    /// `None`: nothing until something else happens (a submit, a finished call).
    pub next_due: Option<Millis>,
}

/// A claimed execution: everything a worker needs to run it. Made by the dispatcher's
/// statement ([`Store::dispatch_due`]), which takes the envelope's lease and opens (or, for
/// a resumed call, adopts) the execution in the same transaction.
#[derive(Debug, Clone)]
pub struct Claim {
    pub execution_token: String,
    pub lease_token: String,
    pub envelope_id: String,
    /// Which dispatch of the envelope this is.
    pub send_count: i64,
    pub lane: Lane,
    pub task_id: String,
    pub provider: String,
    pub prompt: String,
    pub params: Value,
    /// Which candidate of its shot the task is (0 for a task of its own).
    pub candidate: i64,
    pub attempt: i64,
    pub phase: Phase,
    pub job_id: Option<String>,
    /// The adapter's handle for polling the accepted job (JSON), if it persisted one.
    pub job_handle: Option<String>,
    pub idempotency_key: String,
    pub calling_at: Option<Millis>,
    /// True when this claim adopted an execution an earlier worker left in `calling` or
    /// `accepted` (after a crash or an expired lease).
    pub resumed: bool,
    pub cancel_requested: bool,
    /// When the task was submitted.
    pub created_at: Millis,
    /// When the envelope fell due (for the dispatch-delay metric).
    pub due_at: Millis,
    /// The provider's recovery lane was in its slow start when this was dispatched: the
    /// worker reports the call's outcome ([`Store::slow_start_feedback`]).
    pub slow_start: bool,
    /// Reference images to send (an image set's product photos).
    pub references: Vec<crate::store::UploadView>,
}

/// How an execution ends (or pauses). Each outcome carries what it proves about money; the
/// store records it on the execution, except that an execution that never recorded
/// `calling`, or whose provider never bills, is always [`Charge::None`] (enforced in
/// `finish`, not trusted from the caller).
#[derive(Debug, Clone)]
pub enum Finish {
    /// The provider answered with this verified image: its bytes commit with the finish;
    /// charged.
    Succeeded(NewArtifact),
    /// A definite failure: not retried.
    Failed { kind: FailureKind, reason: String, charge: Charge },
    /// Nothing can prove what happened: automatic retries stop; possibly charged.
    Unknown { reason: String },
    /// Try again at `due_at`; when the attempts are used up, the task fails with `kind`
    /// instead. With `counted: false` (the provider said "not now": it refused the request)
    /// the attempt is not counted — the task's `attempts` and the envelope's `send_count` go
    /// back by one, so the next execution has the same attempt number and idempotency key —
    /// and `max_attempts` does not apply.
    RetryLater { due_at: Millis, kind: FailureKind, reason: String, max_attempts: i64, charge: Charge, counted: bool },
    /// A cancel arrived before anything was sent.
    CanceledBeforeCall,
}

impl Finish {
    /// What this outcome proves about money, before the store's own rule (see [`Finish`]).
    pub fn charge(&self) -> Charge {
        match self {
            Finish::Succeeded(_) => Charge::Charged,
            Finish::Failed { charge, .. } | Finish::RetryLater { charge, .. } => *charge,
            Finish::Unknown { .. } => Charge::Possible,
            Finish::CanceledBeforeCall => Charge::None,
        }
    }
}

/// What `record_calling` needs besides the tokens: the money facts recorded with the call,
/// and the limits the call must fit in.
#[derive(Debug, Clone, Default)]
pub struct CallingFacts {
    /// False for a provider that never bills (`demo`): its requests are always
    /// [`Charge::None`].
    pub billable: bool,
    /// The configured price of this request, if the provider has one.
    pub cost_micros: Option<Micros>,
    pub currency: Option<String>,
    /// The model the request names (for the spend report).
    pub model: Option<String>,
    /// Budgets this call must fit in; checked in the same transaction that records
    /// `calling`, so concurrent workers cannot together overshoot one.
    pub limits: Vec<crate::store::spend::Limit>,
}

impl CallingFacts {
    /// A billed request with no price and no limits (tests, scriptable providers).
    pub fn billed() -> Self {
        CallingFacts { billable: true, ..CallingFacts::default() }
    }
}

/// The result of `record_calling`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallingOutcome {
    /// `calling` is recorded: the request may leave now.
    Calling,
    /// A budget would be exceeded: nothing was recorded as sent, the execution is
    /// abandoned, and the task waits (no attempt counted) until `due_at`, the start of the
    /// next period, or until the limit is raised.
    Held { due_at: Millis, reason: String },
}

/// What the reconciler does with one leftover, as applied to the database.
#[derive(Debug, Clone)]
pub enum Recovery {
    Requeue,
    GiveUp,
    Abandon,
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
    /// The deadline as read: part of the evidence (a heartbeat moves it).
    pub lease_expires_at: Option<Millis>,
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
    /// The idempotency key names a retry of this same task already made.
    Existing(String),
    /// The original may have been charged: the caller must acknowledge possible extra cost.
    NeedsAcknowledgement,
    /// A retry of this task (or another task for the same shot of its set) is still live:
    /// a task and a shot have at most one live retry.
    RetryInProgress {
        id: String,
        status: TaskStatus,
    },
    /// This task was already retried as `id` (settled): another retry needs its own
    /// acknowledgement naming `id`.
    AlreadyRetried {
        id: String,
        status: TaskStatus,
    },
    /// The task is not in a state that can be retried.
    NotRetryable(TaskStatus),
    NotFound,
}

/// What a user retry acknowledges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryAck {
    /// That generating again may be charged again (needed when a request of the original
    /// may have been, or was, charged).
    pub possible_charge: bool,
    /// The id of the task's latest retry, when retrying it again (needed once it has one).
    pub retried_as: Option<String>,
}

/// An operator's resolution of an `unknown` task.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// Found the image (e.g. in the provider's dashboard) and attached it.
    Succeeded(NewArtifact),
    /// Confirmed that it failed.
    Failed,
}

/// What the owner found about the charge when resolving an `unknown` task by hand (in the
/// provider's dashboard or invoice): it replaces the `possible` the evidence left, and the
/// request is marked as recorded by hand (`executions.charge_recorded_at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OwnerCharge {
    /// Not known (the default): the evidence's charge stays.
    #[default]
    Unknown,
    /// The dashboard shows a charge.
    Charged,
    /// The dashboard shows no charge.
    NotCharged,
}

impl OwnerCharge {
    /// `charged`, `not_charged` or `unknown`.
    pub fn parse(s: &str) -> Option<OwnerCharge> {
        match s {
            "charged" => Some(OwnerCharge::Charged),
            "not_charged" => Some(OwnerCharge::NotCharged),
            "unknown" => Some(OwnerCharge::Unknown),
            _ => None,
        }
    }

    /// The charge the owner's record gives the task's unproven requests, if any.
    pub fn recorded(self) -> Option<Charge> {
        match self {
            OwnerCharge::Unknown => None,
            OwnerCharge::Charged => Some(Charge::Charged),
            OwnerCharge::NotCharged => Some(Charge::None),
        }
    }

    /// The history's words about money after a resolution (`succeeded`: an image was found).
    pub fn words(self, succeeded: bool) -> &'static str {
        match (self, succeeded) {
            (OwnerCharge::Charged, _) => " — you recorded that the provider's dashboard shows a charge",
            (OwnerCharge::NotCharged, _) => {
                " — you recorded that the provider's dashboard shows no charge, so it no longer counts as possibly \
                 charged"
            }
            (OwnerCharge::Unknown, true) => "",
            (OwnerCharge::Unknown, false) => {
                " — the request still counts as possibly charged, since nothing proves the provider did not bill it"
            }
        }
    }
}

/// The result of an operator resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveOutcome {
    Resolved,
    NotUnknown(TaskStatus),
    NotFound,
}

pub(in crate::store) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

pub(in crate::store) fn event(
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

pub(in crate::store) fn set_task(
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

pub(super) fn task_status(c: &Connection, task: &str) -> Result<Option<TaskStatus>, StoreError> {
    let s: Option<String> =
        c.prepare_cached("SELECT status FROM tasks WHERE id = ?1")?.query_row([task], |r| r.get(0)).optional()?;
    Ok(s.and_then(|s| TaskStatus::parse(&s)))
}

pub(super) fn consume_envelope(
    c: &Connection,
    task: &str,
    status: &str,
    error: Option<&str>,
) -> Result<(), StoreError> {
    c.prepare_cached(
        "UPDATE envelopes SET status = ?2, lease_token = NULL, lease_expires_at = NULL, pass = NULL,
                last_error = coalesce(?3, last_error)
         WHERE task_id = ?1",
    )?
    .execute(params![task, status, error])?;
    Ok(())
}

/// Put an envelope back for another dispatch, in the recovery lane (what the system puts back
/// never jumps ahead of fresh work by its due time alone): ready at once with its place in the
/// lane when `due_at` has come, else waiting until then (the dispatcher promotes it).
pub(super) fn requeue_envelope(
    c: &Connection,
    task: &str,
    due_at: Millis,
    error: Option<&str>,
    now: Millis,
) -> Result<(), StoreError> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "UPDATE envelopes SET status = 'pending', due_at = ?2, lease_token = NULL, lease_expires_at = NULL,
                    lease_boot = NULL, last_error = ?3, lane = 'recovery',
                    pass = {}
             WHERE task_id = ?1",
            pass_sql("envelopes.provider", "'recovery'", "envelopes.fair_key", "?2", "?4")
        )
    });
    c.prepare_cached(&SQL)?.execute(params![task, due_at, error, now])?;
    Ok(())
}

/// Attach a verified image to a task: its bytes and its artifact row, in the caller's
/// transaction (so they commit with the status change that needs them).
pub(super) fn insert_artifact(
    c: &Connection,
    task: &str,
    exec: &str,
    a: &NewArtifact,
    now: Millis,
) -> Result<(), StoreError> {
    insert_blob(c, &a.id, &a.image)?;
    c.prepare_cached(
        "INSERT INTO artifacts (id, task_id, execution_token, sha256, bytes, media_type, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![a.id, task, exec, a.image.sha256(), a.image.len(), a.image.media_type(), now])?;
    Ok(())
}

/// Record what an outcome proves about money on an execution, under the store's rule: an
/// execution that never recorded `calling` (`calling_at` NULL), or whose provider never
/// bills, is [`Charge::None`] whatever the caller says. Returns the charge recorded and the
/// words for the timeline (empty when nothing was sent).
pub(in crate::store) fn settle_charge(
    c: &Connection,
    exec: &str,
    charge: Charge,
) -> Result<(Charge, String), StoreError> {
    let row: Option<(String, bool, Option<Micros>, Option<String>)> = c
        .prepare_cached(
            "UPDATE executions SET charge = CASE WHEN calling_at IS NULL OR billable = 0 THEN 'none' ELSE ?2 END
             WHERE token = ?1 RETURNING charge, calling_at IS NOT NULL, cost_micros, currency",
        )?
        .query_row(params![exec, charge.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    let Some((stored, called, cost, currency)) = row else { return Ok((Charge::None, String::new())) };
    let stored = Charge::parse(&stored).unwrap_or(Charge::Possible);
    Ok((stored, charge_words(called, stored, charge, cost, currency.as_deref())))
}

/// The timeline's words about money for a settled charge (both backends): `stored` as the
/// store recorded it, `asked` as the outcome claimed it, `called` whether `calling` had been
/// recorded. Empty when nothing was sent.
pub(in crate::store) fn charge_words(
    called: bool,
    stored: Charge,
    asked: Charge,
    cost: Option<Micros>,
    currency: Option<&str>,
) -> String {
    let about = match (cost, currency) {
        (Some(m), Some(cur)) => format!(" (about {})", crate::domain::money(m, cur)),
        _ => String::new(),
    };
    match (called, stored) {
        (false, _) => String::new(),
        (true, Charge::None) if asked == Charge::None => "nothing reached the provider, so nothing was charged".into(),
        (true, Charge::None) => "this provider never charges".into(),
        (true, Charge::Refused) => "a definite refusal, which the provider does not charge for".into(),
        (true, Charge::Possible) => format!("it may have been charged{about}"),
        (true, Charge::Charged) => format!("charged{about}"),
    }
}

/// `text`, then `words` after a dash when there are any.
pub(in crate::store) fn with_money(text: &str, words: &str) -> String {
    if words.is_empty() { text.to_string() } else { format!("{text} — {words}") }
}

/// Called in every transaction that settles a task (terminal or unknown): schedules what
/// was waiting for it (the next shot of its image set), in the same transaction.
pub(in crate::store) fn on_settled(c: &Connection, task: &str, now: Millis) -> Result<(), StoreError> {
    crate::store::sets::schedule_next_shot(c, task, now)
}

/// The fencing check (see module docs): mark the execution's row as still ours, or fail.
/// Returns the task id.
pub(super) fn fence(c: &Connection, exec: &str, lease: &str, now: Millis) -> Result<String, StoreError> {
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
pub(in crate::store) fn replay_of(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The store turns on SQLite's query-planner stability guarantee: without it a statement
    /// with a `LIMIT ?` or a `due_at <= ?` beside a partial index (the dispatcher's) is
    /// re-prepared on every run with new values, which tripled its cost.
    #[tokio::test]
    async fn hot_statements_are_prepared_once() {
        let dir = std::env::temp_dir().join(format!("tally-qpsg-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("tally.db"), crate::config::Durability::Normal).expect("open");
        store.configure_providers(vec![ProviderSlots::new("p", 8)]).await.expect("configure");
        for i in 0..3i64 {
            let t = NewTask { provider: "p".into(), prompt: format!("t{i}"), ..NewTask::default() };
            store
                .write(move |c| submit(&mut crate::store::sqlite_tx::SqliteTx::new(c), &t, 1_000 + i))
                .await
                .expect("submit");
            let batch = store.dispatch_due(1_000 + i, 1 + i as usize, 50, "boot").await.expect("dispatch");
            assert_eq!(batch.claims.len(), 1, "run {i} claims the task just submitted");
        }
        let stats = store
            .write(|c| {
                let mut out = Vec::new();
                for sql in [PROVIDERS_STATE, CANDIDATES] {
                    let st = c.prepare_cached(sql)?;
                    out.push((
                        st.get_status(rusqlite::StatementStatus::Run),
                        st.get_status(rusqlite::StatementStatus::RePrepare),
                    ));
                }
                Ok(out)
            })
            .await
            .expect("status");
        for (runs, reprepares) in stats {
            assert_eq!(runs, 3, "the cached statement is the one the dispatcher ran");
            assert_eq!(reprepares, 0, "new bound values must not re-prepare the statement");
        }
        store.close().expect("close");
        let _ = std::fs::remove_dir_all(dir);
    }
}
