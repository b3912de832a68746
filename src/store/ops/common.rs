//! The small writes and reads every operation family shares, written once over [`Tx`]: the
//! timeline, a task's status, its envelope, an artifact with its bytes, the charge rule, the
//! fencing check, idempotent replays, and a set's schedule (one shot after another, the
//! candidates of a shot together).

use std::sync::OnceLock;

use crate::domain::{Actor, Charge, FailureKind, Millis, TaskStatus};
use crate::store::tx::{Dialect, Tx};
use crate::store::{ChargeSummary, NewArtifact, NewImage, ShotRef, StoreError, SubmitOutcome};

use super::{STRIDE, charge_words};

/// A new row id (UUIDv7: ordered by creation).
pub(in crate::store) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// One of two statements by dialect: for the few places where SQLite and PostgreSQL spell a
/// statement differently (see `store::tx`).
pub(in crate::store) fn by_dialect(tx: &dyn Tx, sqlite: &'static str, postgres: &'static str) -> &'static str {
    match tx.dialect() {
        Dialect::Sqlite => sqlite,
        Dialect::Postgres => postgres,
    }
}

/// Append a line to a task's timeline.
pub(in crate::store) fn event(
    tx: &mut dyn Tx,
    task: &str,
    now: Millis,
    actor: Actor,
    kind: &str,
    message: &str,
    exec: Option<&str>,
) -> Result<(), StoreError> {
    tx.exec(
        "INSERT INTO events (task_id, at, actor, kind, message, execution_token) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        &[&task, &now, &actor.as_str(), &kind, &message, &exec],
    )?;
    Ok(())
}

/// Set a task's status, its reason and its failure kind.
pub(in crate::store) fn set_task(
    tx: &mut dyn Tx,
    task: &str,
    status: TaskStatus,
    reason: Option<&str>,
    kind: Option<FailureKind>,
    now: Millis,
) -> Result<(), StoreError> {
    tx.exec(
        "UPDATE tasks SET status = ?2, reason = ?3, failure_kind = ?4, updated_at = ?5 WHERE id = ?1",
        &[&task, &status.as_str(), &reason, &kind.map(|k| k.as_str()), &now],
    )?;
    Ok(())
}

/// A task's status, if the task exists.
pub(in crate::store) fn task_status(tx: &mut dyn Tx, task: &str) -> Result<Option<TaskStatus>, StoreError> {
    let s: Option<String> =
        tx.opt("SELECT status FROM tasks WHERE id = ?1", &[&task])?.map(|r| r.get(0)).transpose()?;
    Ok(s.and_then(|s| TaskStatus::parse(&s)))
}

/// Take an envelope out of dispatch for good (`consumed` or `dead`), dropping its lease.
pub(in crate::store) fn consume_envelope(
    tx: &mut dyn Tx,
    task: &str,
    status: &str,
    error: Option<&str>,
) -> Result<(), StoreError> {
    tx.exec(
        "UPDATE envelopes SET status = ?2, lease_token = NULL, lease_expires_at = NULL, pass = NULL,
                last_error = coalesce(?3, last_error)
         WHERE task_id = ?1",
        &[&task, &status, &error],
    )?;
    Ok(())
}

/// SQL for the place (`pass`) of an envelope of `provider` in `lane` with fairness key `key`
/// that is due at `due`, at `now` (each argument an SQL expression of the dialect): NULL while
/// it waits (no due time, or one still to come); with a `fifo` provider its due time;
/// otherwise one stride after the key's last ready envelope and not before the lane's head.
/// The subqueries read the first and last entries of `envelopes_ready` and
/// `envelopes_ready_key`.
pub(in crate::store) fn pass_sql(
    dialect: Dialect,
    provider: &str,
    lane: &str,
    key: &str,
    due: &str,
    now: &str,
) -> String {
    // SQLite's two-argument max() is PostgreSQL's greatest().
    let greatest = match dialect {
        Dialect::Sqlite => "max",
        Dialect::Postgres => "greatest",
    };
    format!(
        "CASE WHEN {due} IS NULL OR {due} > {now} THEN NULL
              WHEN coalesce((SELECT pp.fifo FROM providers pp WHERE pp.name = {provider}), false) THEN {due}
              ELSE {greatest}(coalesce((SELECT min(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                                 AND r.provider = {provider} AND r.lane = {lane}), 0),
                       coalesce((SELECT max(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                                 AND r.provider = {provider} AND r.lane = {lane} AND r.fair_key = {key}) + {STRIDE}, 0))
         END"
    )
}

/// A statement built once per dialect at first use (for SQL that embeds [`pass_sql`]).
pub(in crate::store) struct PerDialect {
    build: fn(Dialect) -> String,
    sqlite: OnceLock<String>,
    postgres: OnceLock<String>,
}

impl PerDialect {
    /// A statement made by `build(dialect)`, for each dialect when first used.
    pub(in crate::store) const fn new(build: fn(Dialect) -> String) -> Self {
        PerDialect { build, sqlite: OnceLock::new(), postgres: OnceLock::new() }
    }

    /// The statement for `tx`'s dialect.
    pub(in crate::store) fn get(&'static self, tx: &dyn Tx) -> &'static str {
        let d = tx.dialect();
        let cell = match d {
            Dialect::Sqlite => &self.sqlite,
            Dialect::Postgres => &self.postgres,
        };
        cell.get_or_init(|| (self.build)(d))
    }
}

static REQUEUE: PerDialect = PerDialect::new(requeue_sql);

fn requeue_sql(d: Dialect) -> String {
    format!(
        "UPDATE envelopes SET status = 'pending', due_at = ?2, lease_token = NULL, lease_expires_at = NULL,
                lease_boot = NULL, last_error = ?3, lane = 'recovery',{node}
                pass = {}
         WHERE task_id = ?1",
        pass_sql(
            d,
            "envelopes.provider",
            "'recovery'",
            "envelopes.fair_key",
            "CAST(?2 AS BIGINT)",
            "CAST(?4 AS BIGINT)"
        ),
        // Only PostgreSQL's envelopes carry the node that holds the lease.
        node = if d == Dialect::Postgres { " lease_node = NULL," } else { "" },
    )
}

/// Put an envelope back for another dispatch, in the recovery lane (what the system puts back
/// never jumps ahead of fresh work by its due time alone): ready at once with its place in the
/// lane when `due_at` has come, else waiting until then (the dispatcher promotes it).
pub(in crate::store) fn requeue_envelope(
    tx: &mut dyn Tx,
    task: &str,
    due_at: Millis,
    error: Option<&str>,
    now: Millis,
) -> Result<(), StoreError> {
    let sql = REQUEUE.get(tx);
    tx.exec(sql, &[&task, &due_at, &error, &now])?;
    Ok(())
}

/// Store an image's bytes under `id`, inside the operation that commits the row they belong to.
pub(in crate::store) fn insert_blob(tx: &mut dyn Tx, id: &str, img: &NewImage) -> Result<(), StoreError> {
    let _t = crate::stages::span(crate::stages::Stage::BlobWrite);
    tx.exec(
        "INSERT INTO blobs (id, sha256, bytes, media_type, data) VALUES (?1, ?2, ?3, ?4, ?5)",
        &[&id, &img.sha256(), &img.len(), &img.media_type(), &img.bytes()],
    )?;
    Ok(())
}

/// Attach a verified image to a task: its bytes and its artifact row, in the caller's
/// transaction (so they commit with the status change that needs them). The worker checked
/// and hashed the bytes before (`NewImage::verify`; the writer never hashes), so there is no
/// image without its row, no row without its image, and nothing on disk for recovery to find.
pub(in crate::store) fn insert_artifact(
    tx: &mut dyn Tx,
    task: &str,
    exec: &str,
    a: &NewArtifact,
    now: Millis,
) -> Result<(), StoreError> {
    insert_blob(tx, &a.id, &a.image)?;
    tx.exec(
        "INSERT INTO artifacts (id, task_id, execution_token, sha256, bytes, media_type, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        &[&a.id, &task, &exec, &a.image.sha256(), &a.image.len(), &a.image.media_type(), &now],
    )?;
    Ok(())
}

/// Record what an outcome proves about money on an execution, under the store's rule (kept
/// here, and by the table's CHECK): an execution that never recorded `calling` (`calling_at`
/// NULL), or whose provider never bills, is [`Charge::None`] whatever the caller says. Returns
/// the charge recorded and the words for the timeline (empty when nothing was sent).
pub(in crate::store) fn settle_charge(
    tx: &mut dyn Tx,
    exec: &str,
    charge: Charge,
) -> Result<(Charge, String), StoreError> {
    let row = tx.opt(
        "UPDATE executions SET charge = CASE WHEN calling_at IS NULL OR NOT billable THEN 'none' ELSE ?2 END
         WHERE token = ?1 RETURNING charge, calling_at IS NOT NULL, cost_micros, currency",
        &[&exec, &charge.as_str()],
    )?;
    let Some(r) = row else { return Ok((Charge::None, String::new())) };
    let stored = Charge::parse(&r.get::<String>(0)?).unwrap_or(Charge::Possible);
    let (called, cost, currency): (bool, Option<i64>, Option<String>) = (r.get(1)?, r.get(2)?, r.get(3)?);
    Ok((stored, charge_words(called, stored, charge, cost, currency.as_deref())))
}

/// A task's charge, from its executions (the only record of what reached the provider).
pub(in crate::store) fn charge_of(tx: &mut dyn Tx, task: &str) -> Result<ChargeSummary, StoreError> {
    let rows = tx
        .rows(
            "SELECT charge, cost_micros, currency, charge_recorded_at IS NOT NULL FROM executions WHERE task_id = ?1",
            &[&task],
        )?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    crate::store::read::summarize_charges(rows)
}

/// The fencing check, at the start of every write a worker makes after its claim: mark the
/// execution's row as still ours — it is still `running` *and* the envelope still carries the
/// worker's lease token — or fail with [`StoreError::Fenced`] having written nothing. Where
/// transactions run side by side (PostgreSQL) the task's envelope is locked first. Returns the
/// task id.
pub(in crate::store) fn fence(tx: &mut dyn Tx, exec: &str, lease: &str, now: Millis) -> Result<String, StoreError> {
    if !tx.lock_task_of_execution(exec)? {
        return Err(StoreError::Fenced);
    }
    tx.opt(
        "UPDATE executions SET heartbeat_at = ?3
         WHERE token = ?1 AND status = 'running'
           AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = executions.task_id
                       AND e.status = 'sent' AND e.lease_token = ?2)
         RETURNING task_id",
        &[&exec, &lease, &now],
    )?
    .map(|r| r.get(0))
    .transpose()?
    .ok_or(StoreError::Fenced)
}

/// Which table an idempotency key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) enum Keyed {
    Tasks,
    Sets,
    Drafts,
}

/// If `key` was already used for a task (or a set): the same request (`Existing`) or a
/// different one (`Conflict`). (A task's submit asks only after its insert did nothing,
/// `ops::intake`.) On PostgreSQL a concurrent insert of a set's key on another node fails this
/// transaction's insert with a unique violation; the retry then finds it here.
pub(in crate::store) fn replay_of(
    tx: &mut dyn Tx,
    table: Keyed,
    key: Option<&str>,
    hash: &str,
) -> Result<Option<SubmitOutcome>, StoreError> {
    let Some(key) = key else { return Ok(None) };
    let sql = match table {
        Keyed::Tasks => "SELECT id, request_hash FROM tasks WHERE idempotency_key = ?1",
        Keyed::Sets => "SELECT id, request_hash FROM sets WHERE idempotency_key = ?1",
        Keyed::Drafts => "SELECT id, request_hash FROM drafts WHERE idempotency_key = ?1",
    };
    let Some(r) = tx.opt(sql, &[&key])? else { return Ok(None) };
    let (id, h): (String, String) = (r.get(0)?, r.get(1)?);
    Ok(Some(if h == hash { SubmitOutcome::Existing(id) } else { SubmitOutcome::Conflict(id) }))
}

/// The newest retry of `task` and its status.
pub(in crate::store) fn latest_retry(tx: &mut dyn Tx, task: &str) -> Result<Option<(String, TaskStatus)>, StoreError> {
    let Some(r) = tx.opt("SELECT id, status FROM tasks WHERE retry_of = ?1 ORDER BY id DESC LIMIT 1", &[&task])? else {
        return Ok(None);
    };
    let (id, status): (String, String) = (r.get(0)?, r.get(1)?);
    Ok(Some((id, TaskStatus::parse(&status).unwrap_or(TaskStatus::Failed))))
}

/// Called in every transaction that settles a task (terminal or unknown): schedules what was
/// waiting for it (the next shot of its image set), in the same transaction.
pub(in crate::store) fn on_settled(tx: &mut dyn Tx, task: &str, now: Millis) -> Result<(), StoreError> {
    let set: Option<String> =
        tx.opt("SELECT set_id FROM tasks WHERE id = ?1", &[&task])?.map(|r| r.get(0)).transpose()?.flatten();
    match set {
        Some(set) => schedule_next_shot_of(tx, &set, now),
        None => Ok(()),
    }
}

/// The set position whose tasks are live — a task is live when its envelope is handed out
/// (`sent`) or scheduled (`pending` with a due time) — or `None` when nothing of the set is.
/// A set's live tasks always belong to one position: its schedule ([`schedule_next`]) and
/// `ops::intake::submit` keep it so, each under the set's lock ([`Tx::lock_set`]).
fn live_position(tx: &mut dyn Tx, set: &str) -> Result<Option<i64>, StoreError> {
    tx.opt(
        "SELECT t.set_position FROM tasks t JOIN envelopes e ON e.task_id = t.id
             WHERE t.set_id = ?1 AND (e.status = 'sent' OR (e.status = 'pending' AND e.due_at IS NOT NULL))
             ORDER BY t.set_position LIMIT 1",
        &[&set],
    )?
    .map(|r| r.get(0))
    .transpose()
}

/// Whether a task of the set at `position` may be live now: nothing of the set is live, or
/// every live task of it is of `position` (the candidates of one shot run together; the shots
/// go one after another). The caller holds the set's lock ([`Tx::lock_set`]).
pub(in crate::store) fn set_admits(tx: &mut dyn Tx, set: &str, position: i64) -> Result<bool, StoreError> {
    Ok(tx
        .opt(
            "SELECT 1 FROM tasks t JOIN envelopes e ON e.task_id = t.id
             WHERE t.set_id = ?1 AND t.set_position <> ?2
               AND (e.status = 'sent' OR (e.status = 'pending' AND e.due_at IS NOT NULL)) LIMIT 1",
            &[&set, &position],
        )?
        .is_none())
}

/// The set position of a task, for a retry that takes its place.
pub(in crate::store) fn shot_of(tx: &mut dyn Tx, task: &str) -> Result<Option<ShotRef>, StoreError> {
    let Some(r) = tx.opt("SELECT set_id, set_position, shot_role, candidate FROM tasks WHERE id = ?1", &[&task])?
    else {
        return Ok(None);
    };
    let (set_id, position, role): (Option<String>, Option<i64>, Option<String>) = (r.get(0)?, r.get(1)?, r.get(2)?);
    Ok(match (set_id, position) {
        (Some(set_id), Some(position)) => {
            Some(ShotRef { set_id, position, role: role.unwrap_or_else(|| "scene".into()), candidate: r.get(3)? })
        }
        _ => None,
    })
}

static SCHEDULE: PerDialect = PerDialect::new(schedule_sql);

fn schedule_sql(d: Dialect) -> String {
    format!(
        "UPDATE envelopes SET due_at = ?2, pass = {} WHERE task_id = ?1",
        pass_sql(
            d,
            "envelopes.provider",
            "envelopes.lane",
            "envelopes.fair_key",
            "CAST(?2 AS BIGINT)",
            "CAST(?2 AS BIGINT)"
        )
    )
}

/// After a task of `set` settled (or was released): schedule now (ready at once, with its place
/// in its lane) every waiting task — pending, no due time, not held — of the set's current
/// shot: the position whose tasks are live, or, when nothing of the set is live, the lowest
/// position with a waiting task. So the candidates of one shot run together (the provider's
/// slots, taken by the dispatcher, cap how many are in flight) and the shots go one after
/// another: **a set's live tasks always belong to one position**. The set row is locked first
/// ([`Tx::lock_set`]), so two PostgreSQL nodes never both see "nothing live" and schedule two
/// positions. A copy to edit that was not started (`sets.started_at` NULL) is never scheduled
/// here: whatever settles or is released, only its start (`sets::start_set`) makes a shot of
/// it due.
pub(in crate::store) fn schedule_next_shot_of(tx: &mut dyn Tx, set: &str, now: Millis) -> Result<(), StoreError> {
    schedule_next(tx, set, now, "the previous shot of the set is settled; this one is next")
}

/// A set's start: every candidate of its first unscheduled shot made due now, as
/// [`schedule_next_shot_of`] does (the caller, `sets::start_set`, marked the set started under
/// its lock).
pub(in crate::store) fn schedule_first_shot_of(tx: &mut dyn Tx, set: &str, now: Millis) -> Result<(), StoreError> {
    schedule_next(tx, set, now, "the set was started; this is its first shot")
}

fn schedule_next(tx: &mut dyn Tx, set: &str, now: Millis, line: &str) -> Result<(), StoreError> {
    tx.lock_set(set)?;
    if !super::sets::set_started(tx, set)? {
        return Ok(());
    }
    let live = live_position(tx, set)?;
    let position: Option<i64> = match live {
        Some(p) => Some(p),
        None => tx
            .opt(
                "SELECT min(t.set_position) FROM tasks t JOIN envelopes e ON e.task_id = t.id
                 WHERE t.set_id = ?1 AND e.status = 'pending' AND e.due_at IS NULL AND e.held_at IS NULL",
                &[&set],
            )?
            .map(|r| r.get::<Option<i64>>(0))
            .transpose()?
            .flatten(),
    };
    let Some(position) = position else { return Ok(()) };
    let waiting = tx
        .rows(
            "SELECT t.id FROM tasks t JOIN envelopes e ON e.task_id = t.id
             WHERE t.set_id = ?1 AND t.set_position = ?2
               AND e.status = 'pending' AND e.due_at IS NULL AND e.held_at IS NULL
             ORDER BY t.id",
            &[&set, &position],
        )?
        .iter()
        .map(|r| r.get::<String>(0))
        .collect::<Result<Vec<_>, _>>()?;
    // One statement per task: each takes its place (`pass`) one stride after the one before.
    let sql = SCHEDULE.get(tx);
    for next in &waiting {
        tx.exec(sql, &[next, &now])?;
        event(tx, next, now, Actor::Dispatcher, "scheduled", if live.is_some() { LIVE_LINE } else { line }, None)?;
    }
    Ok(())
}

/// The timeline line of a task scheduled beside the live candidates of its shot.
const LIVE_LINE: &str = "the set's current shot is running; this candidate of it goes along";
