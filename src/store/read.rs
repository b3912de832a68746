//! Read queries: task views, timelines, artifacts, counts, and the reconciler's deadlines,
//! written once over [`Tx`] for both backends (run by `Store::query`: a SQLite reader
//! connection, or one read-only PostgreSQL snapshot). They never write (but for the owner's
//! dismissal of a notice, kept beside the notices' read). Past 600 lines: the task view and
//! its wait reasons, the lists and counts, and start-up's notices are one family of reads.

use std::sync::OnceLock;

use rusqlite::Connection;
use serde::Serialize;

use super::StoreError;
use super::ops::common;
use super::sqlite::tx::SqliteTx;
use super::tx::{Dialect, Param, Row, Tx};
use super::types::{Pause, PauseReason};
use crate::domain::operation::{Operation, Source, SourceKind};
use crate::domain::words::{say, say_with};
use crate::domain::{Charge, Micros, Millis, TaskStatus};

/// A task as the API and CLI show it.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct TaskView {
    pub id: String,
    pub status: TaskStatus,
    pub reason: Option<String>,
    pub failure_kind: Option<String>,
    pub attempts: i64,
    /// What the evidence says about money, over all of the task's requests.
    pub charge: ChargeSummary,
    /// The task's latest retry (a new task with `retry_of` = this one) and its status.
    pub retried_as: Option<(String, TaskStatus)>,
    pub cancel_requested: bool,
    pub provider: String,
    pub prompt: String,
    pub params: serde_json::Value,
    pub idempotency_key: Option<String>,
    pub retry_of: Option<String>,
    pub set_id: Option<String>,
    pub set_position: Option<i64>,
    /// For a failed shot: how many reference photos its set has now (each claim sends the
    /// set's current ones, so a refusal over their number is judged against these); `None`
    /// for other tasks, which are not read for it.
    pub set_references: Option<u32>,
    pub shot_role: Option<String>,
    /// Which candidate of its shot this task is (0 for the first, and for a job of its own).
    pub candidate: i64,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub artifacts: Vec<ArtifactView>,
    /// The submitter's group (a fairness key), if one was given.
    pub group: Option<String>,
    /// For a task waiting to be dispatched: why, in plain words, from where it stands in the
    /// dispatch order (also put into `reason`); `None` otherwise.
    pub waiting_for: Option<String>,
    /// Held because the database turned out older than what was served (`store::held`):
    /// why, and since when. Released only by the owner.
    pub held: Option<crate::store::held::Held>,
    /// Waiting because a budget would be exceeded (`envelopes.budget_hold`): raising the budget
    /// lets it go.
    pub budget_hold: bool,
    /// What the call makes.
    pub operation: Operation,
    /// The stored image an `edit` or `cutout` works on.
    pub source: Option<Source>,
    /// The tasks made from this task's images (edits and cutouts of them), oldest first: its
    /// lineage forward, as (task id, operation, status).
    pub derived: Vec<(String, Operation, TaskStatus)>,
    /// The task that made the source image (an artifact's), if it is still stored: the
    /// lineage back.
    pub source_task: Option<String>,
}

/// What the evidence says about money for a task, derived from its executions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct ChargeSummary {
    /// The heaviest state of its requests (`none` when nothing reached the provider).
    pub state: Charge,
    /// Requests that reached (or may have reached) the provider: `refused`, `possible` or
    /// `charged` ones.
    pub requests: i64,
    /// The configured prices of its `possible` and `charged` requests, summed; `None` when
    /// none of them had a price.
    pub cost_micros: Option<Micros>,
    pub currency: Option<String>,
    /// The owner recorded the charge by hand (resolving an unknown with what the provider's
    /// dashboard showed), so `state` is their record, not tally's evidence.
    pub recorded_by_hand: bool,
}

/// A stored artifact.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct ArtifactView {
    pub id: String,
    pub task_id: String,
    pub sha256: String,
    pub bytes: i64,
    pub media_type: String,
    pub created_at: Millis,
}

/// One entry of a task's timeline.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct EventView {
    pub id: i64,
    pub at: Millis,
    pub actor: String,
    pub kind: String,
    pub message: String,
    pub execution_token: Option<String>,
}

/// The columns of a task row, in the order [`task_row`] reads them.
macro_rules! task_columns {
    () => {
        "id, status, reason, failure_kind, attempts, cancel_requested, provider, prompt, params, idempotency_key, \
         retry_of, set_id, set_position, created_at, updated_at, shot_role, group_key, candidate, operation, \
         source_kind, source_id"
    };
}

/// The columns of an artifact row, in the order [`artifact_row`] reads them.
macro_rules! artifact_columns {
    () => {
        "id, task_id, sha256, bytes, media_type, created_at"
    };
}

fn task_row(r: &Row) -> Result<TaskView, StoreError> {
    let status: String = r.get(1)?;
    let params: String = r.get(8)?;
    Ok(TaskView {
        id: r.get(0)?,
        status: TaskStatus::parse(&status).unwrap_or(TaskStatus::Failed),
        reason: r.get(2)?,
        failure_kind: r.get(3)?,
        attempts: r.get(4)?,
        charge: ChargeSummary::default(),
        retried_as: None,
        cancel_requested: r.get(5)?,
        provider: r.get(6)?,
        prompt: r.get(7)?,
        params: serde_json::from_str(&params).unwrap_or(serde_json::Value::Null),
        idempotency_key: r.get(9)?,
        retry_of: r.get(10)?,
        set_id: r.get(11)?,
        set_position: r.get(12)?,
        set_references: None,
        created_at: r.get(13)?,
        updated_at: r.get(14)?,
        shot_role: r.get(15)?,
        artifacts: Vec::new(),
        group: r.get(16)?,
        candidate: r.get(17)?,
        waiting_for: None,
        held: None,
        budget_hold: false,
        operation: Operation::parse(&r.get::<String>(18)?).unwrap_or_default(),
        source: source_of(r.get(19)?, r.get(20)?),
        derived: Vec::new(),
        source_task: None,
    })
}

/// A task's source image from its two columns (both set or both NULL, by the schema's CHECK).
pub(in crate::store) fn source_of(kind: Option<String>, id: Option<String>) -> Option<Source> {
    Some(Source { kind: SourceKind::parse(&kind?)?, id: id? })
}

fn artifact_row(r: &Row) -> Result<ArtifactView, StoreError> {
    Ok(ArtifactView {
        id: r.get(0)?,
        task_id: r.get(1)?,
        sha256: r.get(2)?,
        bytes: r.get(3)?,
        media_type: r.get(4)?,
        created_at: r.get(5)?,
    })
}

/// A task row made whole: its artifacts, its charge, its latest retry, why it waits, and for a
/// failed shot how many reference photos its set has now.
fn complete(tx: &mut dyn Tx, mut t: TaskView) -> Result<TaskView, StoreError> {
    t.artifacts = tx
        .rows(
            concat!("SELECT ", artifact_columns!(), " FROM artifacts WHERE task_id = ?1 ORDER BY created_at"),
            &[&t.id],
        )?
        .iter()
        .map(artifact_row)
        .collect::<Result<_, _>>()?;
    t.charge = common::charge_of(tx, &t.id)?;
    t.retried_as = super::ops::latest_retry(tx, &t.id)?;
    if let Some(Source { kind: SourceKind::Artifact, id }) = &t.source {
        t.source_task = tx.opt("SELECT task_id FROM artifacts WHERE id = ?1", &[id])?.map(|r| r.get(0)).transpose()?;
    }
    if !t.artifacts.is_empty() {
        t.derived = tx
            .rows(
                "SELECT d.id, d.operation, d.status FROM tasks d
                 WHERE d.source_id IN (SELECT a.id FROM artifacts a WHERE a.task_id = ?1) ORDER BY d.id",
                &[&t.id],
            )?
            .iter()
            .map(|r| {
                Ok((
                    r.get::<String>(0)?,
                    Operation::parse(&r.get::<String>(1)?).unwrap_or_default(),
                    TaskStatus::parse(&r.get::<String>(2)?).unwrap_or(TaskStatus::Failed),
                ))
            })
            .collect::<Result<_, StoreError>>()?;
    }
    if t.status == TaskStatus::Failed
        && let Some(set) = &t.set_id
    {
        let n: i64 = tx
            .opt("SELECT count(*) FROM set_references WHERE set_id = ?1", &[set])?
            .map(|r| r.get(0))
            .transpose()?
            .unwrap_or(0);
        t.set_references = u32::try_from(n).ok();
    }
    with_wait(tx, t)
}

/// A task's charge, from its executions (the only record of what reached the provider), on a
/// SQLite connection.
pub fn charge_of(c: &Connection, task: &str) -> Result<ChargeSummary, StoreError> {
    common::charge_of(&mut SqliteTx::new(c), task)
}

/// A task's [`ChargeSummary`] from its executions' (charge, cost, currency), on either backend.
pub(in crate::store) fn summarize_charges(
    rows: Vec<(String, Option<Micros>, Option<String>, bool)>,
) -> Result<ChargeSummary, StoreError> {
    let mut sum = ChargeSummary::default();
    for (charge, cost, currency, by_hand) in rows {
        sum.recorded_by_hand |= by_hand;
        let charge = Charge::parse(&charge).unwrap_or(Charge::Possible);
        if charge == Charge::None {
            continue;
        }
        sum.requests += 1;
        sum.state = sum.state.max(charge);
        if charge.may_cost()
            && let Some(m) = cost
        {
            sum.cost_micros = Some(sum.cost_micros.unwrap_or(0) + m);
            sum.currency = sum.currency.or(currency);
        }
    }
    Ok(sum)
}

/// Which tasks a list shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Only tasks with this status.
    pub status: Option<TaskStatus>,
    /// Only tasks that need the owner: `unknown` and neither resolved nor retried yet, or held
    /// (`store::held`).
    pub needs_attention: bool,
    /// Only tasks whose prompt, or whose image set's product, contains this text (case does
    /// not matter for ASCII letters). A scan of the newest tasks until a page is full, not an
    /// index: fine for a shop's history, and `limit` bounds what one page returns.
    pub search: Option<String>,
}

/// One task with its artifacts, on a SQLite connection (tools and tests; the store's own
/// operations use [`task`]).
pub fn get_task(c: &Connection, id: &str) -> Result<Option<TaskView>, StoreError> {
    task(&mut SqliteTx::new(c), id)
}

/// One task with its artifacts, its charge, its latest retry and why it waits.
pub(in crate::store) fn task(tx: &mut dyn Tx, id: &str) -> Result<Option<TaskView>, StoreError> {
    match tx.opt(concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = ?1"), &[&id])? {
        Some(r) => complete(tx, task_row(&r)?).map(Some),
        None => Ok(None),
    }
}

/// For a task that waits to be dispatched (`queued` or `waiting`), say why in plain words, from
/// where it stands now: its provider paused, no free slot, the recovery lane's share used up,
/// earlier tasks of its set or group ahead of it. This replaces the stored reason only when the
/// dispatch order explains the wait; a retry's "trying again in …" stays while its time has not
/// come. (A wait is a place in the dispatch order, not a state written per task: nothing is
/// written while a task waits.)
fn with_wait(tx: &mut dyn Tx, mut t: TaskView) -> Result<TaskView, StoreError> {
    if !matches!(t.status, TaskStatus::Queued | TaskStatus::Waiting) {
        return Ok(t);
    }
    if let Some(h) = crate::store::held::held_of(tx, &t.id)? {
        t.reason = Some(h.reason.clone());
        t.waiting_for = Some(h.reason.clone());
        t.held = Some(h);
        return Ok(t);
    }
    let (why, budget_hold) = wait_reason(tx, &t)?;
    t.budget_hold = budget_hold;
    if let Some(why) = why {
        t.reason = Some(why.clone());
        t.waiting_for = Some(why);
    }
    Ok(t)
}

/// Where a pending envelope stands: what [`wait_words`] explains a wait from (both backends
/// read the same facts).
#[derive(Debug, Clone, Default)]
pub(in crate::store) struct WaitFacts {
    pub pass: Option<i64>,
    pub due: Option<Millis>,
    pub lane: String,
    pub key: String,
    pub paused: Option<Millis>,
    pub max: Option<i64>,
    pub reserve: Option<i64>,
    /// Envelopes claimed for the provider, all lanes / the recovery lane.
    pub busy: i64,
    pub busy_recovery: i64,
    /// Ready envelopes ahead of this one in its lane: of its fairness key / of any key.
    pub ahead_key: i64,
    pub ahead: i64,
    /// Earlier shots of its set with a task not settled (for a task not scheduled yet): shot
    /// positions, not tasks (a shot's candidates are one shot).
    pub earlier_shots: i64,
    /// The pause is a rate-limit hold (the provider said "not now"), not an opened circuit.
    pub rate_limited: bool,
    /// When the pause began (unknown for a pause recorded before schema 17).
    pub paused_at: Option<Millis>,
    /// For an opened circuit, the last failure in words.
    pub paused_why: Option<String>,
    /// Its set is a copy to edit not started yet: it waits for the set's start.
    pub unstarted: bool,
}

/// At most this many earlier tasks are counted for a wait reason ("Queued behind 100 or more
/// earlier tasks."): counting walks the index one entry per task, and this read runs for every
/// queued task shown (each submit's answer, every listed job), so an uncapped count made each
/// of them cost as much as the queue is long. Must match the `LIMIT`s in [`WAIT_FACTS`].
pub(in crate::store) const WAIT_COUNT_CAP: i64 = 100;

/// The facts for one task, in one statement (0 rows: its envelope is not pending). The counts
/// of earlier tasks stop at [`WAIT_COUNT_CAP`].
pub(in crate::store) const WAIT_FACTS: &str =
    "SELECT e.pass, e.due_at, e.lane, e.fair_key, p.paused_until, p.max_concurrency, p.reserve,
        (SELECT count(*) FROM envelopes s WHERE s.status = 'sent' AND s.provider = e.provider),
        (SELECT count(*) FROM envelopes s WHERE s.status = 'sent' AND s.provider = e.provider AND s.lane = 'recovery'),
        CASE WHEN e.pass IS NULL THEN 0 ELSE (SELECT count(*) FROM (SELECT 1 FROM envelopes r
            WHERE r.status = 'pending' AND r.pass IS NOT NULL AND r.provider = e.provider AND r.lane = e.lane
              AND r.fair_key = e.fair_key AND (r.pass, r.id) < (e.pass, e.id) LIMIT 100) k) END,
        CASE WHEN e.pass IS NULL THEN 0 ELSE (SELECT count(*) FROM (SELECT 1 FROM envelopes r
            WHERE r.status = 'pending' AND r.pass IS NOT NULL AND r.provider = e.provider AND r.lane = e.lane
              AND (r.pass, r.id) < (e.pass, e.id) LIMIT 100) a) END,
        CASE WHEN t.set_id IS NULL OR e.due_at IS NOT NULL THEN 0 ELSE (SELECT count(DISTINCT s.set_position) FROM tasks s
            WHERE s.set_id = t.set_id AND s.set_position < t.set_position
              AND s.status IN ('queued', 'waiting', 'running')) END,
        p.paused_reason,
        CASE WHEN t.set_id IS NULL OR e.due_at IS NOT NULL THEN 0
             ELSE (SELECT count(*) FROM sets u WHERE u.id = t.set_id AND u.started_at IS NULL) END,
        e.budget_hold, p.paused_at, p.paused_why
 FROM envelopes e JOIN tasks t ON t.id = e.task_id LEFT JOIN providers p ON p.name = e.provider
 WHERE e.task_id = ?1 AND e.status = 'pending'";

/// Why `t` waits (see [`wait_words`]), and whether a budget holds it back.
fn wait_reason(tx: &mut dyn Tx, t: &TaskView) -> Result<(Option<String>, bool), StoreError> {
    let Some(r) = tx.opt(WAIT_FACTS, &[&t.id])? else { return Ok((None, false)) };
    let f = WaitFacts {
        pass: r.get(0)?,
        due: r.get(1)?,
        lane: r.get(2)?,
        key: r.get(3)?,
        paused: r.get(4)?,
        max: r.get(5)?,
        reserve: r.get(6)?,
        busy: r.get(7)?,
        busy_recovery: r.get(8)?,
        ahead_key: r.get(9)?,
        ahead: r.get(10)?,
        earlier_shots: r.get(11)?,
        rate_limited: r.get::<Option<String>>(12)?.as_deref() == Some("rate_limit"),
        unstarted: r.get::<i64>(13)? > 0,
        paused_at: r.get(15)?,
        paused_why: r.get(16)?,
    };
    Ok((wait_words(&t.provider, &f), r.get::<bool>(14)?))
}

/// What a provider's pause means for the tasks it holds, in plain words: a rate-limit hold says
/// how long the provider asked tally to wait, an opened circuit what failed last; both until
/// when. (A pause recorded before either was kept says neither.)
pub fn pause_words(provider: &str, p: &Pause) -> String {
    let until = crate::clock::rfc3339(p.until);
    match p.reason {
        PauseReason::RateLimit if p.until > p.at => {
            let secs = ((p.until - p.at) + 999) / 1000;
            say_with(
                "say.held_provider_rate_limited_for",
                &[("provider", provider), ("secs", &secs.to_string()), ("until", &until)],
            )
        }
        PauseReason::RateLimit => {
            say_with("say.held_provider_rate_limited", &[("provider", provider), ("until", &until)])
        }
        PauseReason::Circuit => match p.why.as_deref() {
            Some(why) => {
                say_with("say.paused_provider_after", &[("provider", provider), ("why", why), ("until", &until)])
            }
            None => say_with("say.paused_provider", &[("provider", provider), ("until", &until)]),
        },
    }
}

/// Why a pending task waits, in plain words, or `None` when the dispatch order does not
/// explain it (it waits for its due time, whose reason is stored, or it is next).
pub(in crate::store) fn wait_words(provider: &str, f: &WaitFacts) -> Option<String> {
    if f.due.is_none() && f.unstarted {
        // A copy to edit: nothing of it goes before its start, whatever the provider does.
        return Some(say("say.waits_for_start"));
    }
    if let Some(until) = f.paused {
        let reason = if f.rate_limited { PauseReason::RateLimit } else { PauseReason::Circuit };
        let pause = Pause { until, reason, at: f.paused_at.unwrap_or(until), why: f.paused_why.clone() };
        return Some(pause_words(provider, &pause));
    }
    if f.due.is_none() {
        return Some(match f.earlier_shots {
            0 => say("say.waits_for_shot"),
            1 => say_with("say.behind_shot", &[("n", "1")]),
            n => say_with("say.behind_shots", &[("n", &n.to_string())]),
        });
    }
    f.pass?; // waiting for its due time: the stored reason says until when
    let whose = if f.key.starts_with("set:") {
        "say.behind_in_set"
    } else if f.key.starts_with("group:") {
        "say.behind_in_group"
    } else {
        "say.behind"
    };
    let count = |n: i64| match n {
        n if n >= WAIT_COUNT_CAP => say_with("say.earlier_tasks_many", &[("n", &WAIT_COUNT_CAP.to_string())]),
        1 => say_with("say.earlier_task", &[("n", "1")]),
        n => say_with("say.earlier_tasks", &[("n", &n.to_string())]),
    };
    let queue = match (f.ahead_key, f.ahead) {
        (0, 0) => None,
        (0, n) => Some(say_with("say.behind", &[("count", &count(n))])),
        (k, _) => Some(say_with(whose, &[("count", &count(k))])),
    };
    let max = f.max.unwrap_or(1);
    let cap = (max - f.reserve.unwrap_or(1)).max(1);
    let (max_s, cap_s) = (max.to_string(), cap.to_string());
    let slot = if f.busy >= max {
        Some("say.slot_full")
    } else if f.lane == "recovery" && f.busy_recovery >= cap {
        Some("say.slot_recovery")
    } else {
        None
    };
    let params = [("provider", provider), ("max", max_s.as_str()), ("cap", cap_s.as_str())];
    match (slot, queue) {
        (Some(key), Some(q)) => {
            Some(say_with(&format!("{key}_queue"), &[&params[..], &[("queue", q.as_str())]].concat()))
        }
        (Some(key), None) => Some(say_with(key, &params)),
        (None, q) => q,
    }
}

/// The statement of a task list: one per combination of filters and dialect, built at first
/// use. Parameters: `?1` the cursor, `?2` the limit, then the status (if filtered by it), then
/// the search text (if searching), numbered without gaps (both drivers count parameters by
/// the highest number).
fn list_sql(tx: &dyn Tx, status: bool, attention: bool, search: bool) -> &'static str {
    static BUILT: [OnceLock<String>; 16] = [const { OnceLock::new() }; 16];
    let dialect = tx.dialect();
    let i = usize::from(status)
        | usize::from(attention) << 1
        | usize::from(search) << 2
        | usize::from(dialect == Dialect::Postgres) << 3;
    BUILT[i].get_or_init(|| {
        let mut sql = concat!("SELECT ", task_columns!(), " FROM tasks WHERE id < ?1").to_string();
        let mut next = 3;
        if status {
            sql.push_str(&format!(" AND status = ?{next}"));
            next += 1;
        }
        if attention {
            // `unknown` and not retried (by the status index), or held (by the held index).
            sql.push_str(
                " AND id IN (SELECT u.id FROM tasks u WHERE u.status = 'unknown'
                               AND NOT EXISTS (SELECT 1 FROM tasks r WHERE r.retry_of = u.id)
                             UNION ALL
                             SELECT h.task_id FROM envelopes h WHERE h.status = 'pending' AND h.held_at IS NOT NULL)",
            );
        }
        if search {
            // Where the text is found: SQLite's `instr`, PostgreSQL's `strpos` (1-based, 0 if not).
            let find = match dialect {
                Dialect::Sqlite => "instr",
                Dialect::Postgres => "strpos",
            };
            sql.push_str(&format!(
                " AND ({find}(lower(prompt), lower(CAST(?{next} AS TEXT))) > 0
                       OR set_id IN (SELECT id FROM sets WHERE {find}(lower(product), lower(CAST(?{next} AS TEXT))) > 0))"
            ));
        }
        sql.push_str(" ORDER BY id DESC LIMIT ?2");
        sql
    })
}

/// Tasks newest first, filtered, after the cursor `before` (a task id).
pub(in crate::store) fn list_tasks(
    tx: &mut dyn Tx,
    filter: &TaskFilter,
    before: Option<&str>,
    limit: usize,
) -> Result<Vec<TaskView>, StoreError> {
    let before = before.unwrap_or("\u{10ffff}");
    if filter.needs_attention && filter.status.is_some_and(|s| !matches!(s, TaskStatus::Unknown | TaskStatus::Waiting))
    {
        return Ok(Vec::new());
    }
    let sql = list_sql(tx, filter.status.is_some(), filter.needs_attention, filter.search.is_some());
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let status = filter.status.map(|s| s.as_str());
    let mut params: Vec<&dyn Param> = vec![&before, &limit];
    if let Some(s) = &status {
        params.push(s);
    }
    if let Some(s) = &filter.search {
        params.push(s);
    }
    let rows = tx.rows(sql, &params)?;
    rows.iter().map(|r| complete(tx, task_row(r)?)).collect()
}

/// A task's timeline, oldest first.
pub(in crate::store) fn events(tx: &mut dyn Tx, task: &str) -> Result<Vec<EventView>, StoreError> {
    tx.rows(
        "SELECT id, at, actor, kind, message, execution_token FROM events WHERE task_id = ?1 ORDER BY id",
        &[&task],
    )?
    .iter()
    .map(|r| {
        Ok(EventView {
            id: r.get(0)?,
            at: r.get(1)?,
            actor: r.get(2)?,
            kind: r.get(3)?,
            message: r.get(4)?,
            execution_token: r.get(5)?,
        })
    })
    .collect()
}

/// One artifact.
pub(in crate::store) fn artifact(tx: &mut dyn Tx, id: &str) -> Result<Option<ArtifactView>, StoreError> {
    tx.opt(concat!("SELECT ", artifact_columns!(), " FROM artifacts WHERE id = ?1"), &[&id])?
        .map(|r| artifact_row(&r))
        .transpose()
}

/// The earliest deadline of a sent envelope (every node's, on PostgreSQL): when the reconciler
/// next has something to check.
pub(in crate::store) fn next_sent_deadline(tx: &mut dyn Tx) -> Result<Option<Millis>, StoreError> {
    tx.one("SELECT min(lease_expires_at) FROM envelopes WHERE status = 'sent'", &[])?.get(0)
}

/// Number of tasks per status.
/// What start-up noticed and the owner has not dismissed (a lost tail of commits), oldest
/// first: (id, kind, when, its facts).
pub(in crate::store) fn notices(tx: &mut dyn Tx) -> Result<Vec<(i64, String, Millis, serde_json::Value)>, StoreError> {
    tx.rows("SELECT id, kind, at, data FROM notices WHERE dismissed_at IS NULL ORDER BY id", &[])?
        .iter()
        .map(|r| {
            let data: String = r.get(3)?;
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, serde_json::from_str(&data).unwrap_or(serde_json::Value::Null)))
        })
        .collect()
}

/// How many of `provider`'s tasks are not settled (queued, waiting or running): a provider
/// with such tasks is not removed.
pub(in crate::store) fn live_tasks_of(tx: &mut dyn Tx, provider: &str) -> Result<i64, StoreError> {
    tx.one(
        "SELECT count(*) FROM tasks WHERE provider = ?1 AND status IN ('queued', 'waiting', 'running')",
        &[&provider],
    )?
    .get(0)
}

pub(in crate::store) fn status_counts(tx: &mut dyn Tx) -> Result<Vec<(TaskStatus, i64)>, StoreError> {
    let mut out = Vec::new();
    for r in tx.rows("SELECT status, count(*) FROM tasks GROUP BY status", &[])? {
        if let Some(s) = TaskStatus::parse(&r.get::<String>(0)?) {
            out.push((s, r.get(1)?));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_counts_of_earlier_tasks_stop_at_the_cap() {
        assert_eq!(WAIT_FACTS.matches(&format!("LIMIT {WAIT_COUNT_CAP})")).count(), 2);
    }

    #[test]
    fn a_wait_is_explained_from_where_the_task_stands() {
        let ready = WaitFacts {
            pass: Some(7),
            due: Some(0),
            lane: "new".into(),
            key: "set:s1".into(),
            max: Some(2),
            reserve: Some(1),
            ..WaitFacts::default()
        };
        // The said lines in English, as the test reads them.
        let wait_words = |p: &str, f: &WaitFacts| super::wait_words(p, f).map(|w| crate::domain::words::english(&w));
        assert_eq!(wait_words("p", &ready), None, "next in line, a slot free: nothing to explain");
        let paused = WaitFacts { paused: Some(0), ..ready.clone() };
        assert_eq!(
            wait_words("p", &paused).as_deref(),
            Some("p failed several times in a row; tally has paused new calls to it until 1970-01-01T00:00:00.000Z.")
        );
        // A pause recorded with its start and what failed says how long, and what.
        let held = WaitFacts { paused: Some(30_000), paused_at: Some(1), rate_limited: true, ..ready.clone() };
        assert_eq!(
            wait_words("p", &held).as_deref(),
            Some("p asked tally to wait 30 s (a rate limit); new calls to it are held until 1970-01-01T00:00:30.000Z.")
        );
        let opened = WaitFacts { paused: Some(0), paused_why: Some("HTTP 503: overloaded".into()), ..ready.clone() };
        assert_eq!(
            wait_words("p", &opened).as_deref(),
            Some(
                "p failed several times in a row (the last time: HTTP 503: overloaded); tally has paused new calls to \
                 it until 1970-01-01T00:00:00.000Z."
            )
        );
        let unscheduled = WaitFacts { due: None, earlier_shots: 2, ..ready.clone() };
        assert_eq!(
            wait_words("p", &unscheduled).as_deref(),
            Some("Queued behind 2 earlier shots of this set (a set's shots go one after another).")
        );
        let draft = WaitFacts { due: None, earlier_shots: 2, unstarted: true, ..paused.clone() };
        assert_eq!(
            wait_words("p", &draft),
            Some(crate::domain::words::english(&say("say.waits_for_start"))),
            "a copy waits for its start"
        );
        let behind = WaitFacts { busy: 2, ahead_key: 1, ahead: 5, ..ready.clone() };
        assert_eq!(
            wait_words("p", &behind).as_deref(),
            Some(
                "Waiting for a free slot at p (all 2 of its slots are in use). Queued behind 1 earlier task of this set."
            )
        );
        let many = WaitFacts { key: "k".into(), ahead: WAIT_COUNT_CAP, ..ready.clone() };
        assert_eq!(wait_words("p", &many).as_deref(), Some("Queued behind 100 or more earlier tasks."));
        let recovery = WaitFacts { lane: "recovery".into(), busy: 1, busy_recovery: 1, ..ready.clone() };
        assert!(wait_words("p", &recovery).is_some_and(|w| w.contains("may use 1 of its 2 slots")));
        let later = WaitFacts { pass: None, ..ready };
        assert_eq!(wait_words("p", &later), None, "waiting for its due time: the stored reason says until when");
    }
}
