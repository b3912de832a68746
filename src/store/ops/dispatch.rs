//! Dispatch: who goes next, decided in the store.
//!
//! **One statement claims for free slots.** [`dispatch_due`] is the dispatcher's only write: in
//! one transaction it reads each provider's free slots (its `max_concurrency` minus the
//! envelopes claimed for it, counted from the `envelopes_in_flight` index), picks ready
//! envelopes only for those slots, and claims them — status `sent`, the lease (token,
//! deadline, process run), `send_count` + 1 — in one `UPDATE`, then opens (or, for a resumed
//! call, adopts) their executions and marks their tasks `running`. There is no separate
//! "handed off but not claimed" state: a claim lost with the process is a leased envelope
//! whose execution never reached `calling`, which recovery abandons (nothing was sent). A
//! saturated provider is not dispatched at all, so waiting for a slot writes nothing and never
//! moves a task backwards.
//!
//! **Order: lanes, then fairness keys, as index order.** A pending envelope is *waiting*
//! (`pass` NULL, in `envelopes_waiting` by due time) or *ready* (`pass` set, in
//! `envelopes_ready` by `(provider, lane, pass, id)`). It becomes ready when its due time has
//! come — at submit, at a requeue, or at the dispatcher's next wake-up ([`promote`]) — and gets
//! its place then ([`pass_sql`]): one [`STRIDE`] after the last ready envelope of its fairness
//! key, but never before the lane's current head, so a new key starts at the front and a key
//! with a 10,000-task backlog spreads its tasks far ahead (stride scheduling, as Temporal does).
//! Each provider's two lanes (fresh, recovery) are interleaved by weight with a second stride
//! per lane (`providers.fresh_pass`, `recovery_pass`); a lane that has nothing to offer keeps no
//! credit. The recovery lane may hold at most `max_concurrency − reserve` slots (at least one),
//! and after a circuit closes its share starts at one call and grows by one with each success,
//! halving on an overload answer ([`slow_start_feedback`]): 1, 2, 4, … calls per round. Every
//! read is an index range bounded by the number of free slots, so the cost of a dispatch does
//! not grow with the backlog (`dispatch_cost_is_flat_with_a_backlog` shows the plans).
//!
//! **Written once for both backends.** PostgreSQL runs dispatches of several nodes at once, and
//! differs in three named places only: [`lock_providers`] (the cluster-wide capacity lock: the
//! `providers` rows locked first, so nodes dispatching together count the same slots in use and
//! advance the same lane places one after the other), [`candidates_sql`] (PostgreSQL takes the
//! candidates `FOR UPDATE SKIP LOCKED`: a row another operation holds is skipped, never waited
//! for), and the claim's statements (`LEASE`, `ADOPT`, `OPEN`, `RUNNING`, `READ`: how a list of ids is
//! bound, the node a lease names, how an execution token is drawn). The decisions (`plan_provider`, `interleave`) are
//! pure functions, so both backends decide alike.

use std::collections::HashMap;

use rusqlite::Connection;
use serde_json::Value;

use super::common::{PerDialect, by_dialect, event};
use super::{Claim, DispatchBatch, Lane, SqliteStore};
use crate::domain::{Actor, Millis, Phase};
use crate::store::StoreError;
use crate::store::UploadView;
use crate::store::tx::{Dialect, Param, Row, Tx};

/// The distance between two consecutive ready envelopes of one fairness key.
pub(in crate::store) const STRIDE: i64 = 1000;

/// The lane stride: a lane of weight `w` advances by this ÷ `w` per dispatch.
const LANE_STRIDE: i64 = 1_000_000;

/// The fairness key of a task: its image set, else the submitter's group, else the shared key.
pub(in crate::store) fn fair_key(set_id: Option<&str>, group: Option<&str>) -> String {
    match (set_id, group) {
        (Some(set), _) => format!("set:{set}"),
        (None, Some(g)) => format!("group:{g}"),
        (None, None) => String::new(),
    }
}

/// SQL for the place (`pass`) of an envelope of `provider` in `lane` with fairness key `key`
/// that is due at `due`, at `now` (each argument an SQL expression): NULL while it waits (no
/// due time, or one still to come); with a `fifo` provider its due time; otherwise one stride
/// after the key's last ready envelope and not before the lane's head. The subqueries read the
/// first and last entries of `envelopes_ready` and `envelopes_ready_key`.
pub(in crate::store) fn pass_sql(provider: &str, lane: &str, key: &str, due: &str, now: &str) -> String {
    format!(
        "CASE WHEN {due} IS NULL OR {due} > {now} THEN NULL
              WHEN coalesce((SELECT pp.fifo FROM providers pp WHERE pp.name = {provider}), 0) = 1 THEN {due}
              ELSE max(coalesce((SELECT min(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                                 AND r.provider = {provider} AND r.lane = {lane}), 0),
                       coalesce((SELECT max(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                                 AND r.provider = {provider} AND r.lane = {lane} AND r.fair_key = {key}) + {STRIDE}, 0))
         END"
    )
}

/// Each provider's dispatch state in one statement: its configuration, its lanes' places, its
/// claimed envelopes per lane, whether ready work waits for it, and (the same on every row)
/// the earliest waiting due time.
pub(super) const PROVIDERS_STATE: &str =
    "SELECT p.name, p.max_concurrency, p.reserve, p.fresh_weight, p.recovery_weight,
        p.fifo, p.paused_until, p.recovery_limit, p.fresh_pass, p.recovery_pass,
        (SELECT count(*) FROM envelopes e WHERE e.status = 'sent' AND e.provider = p.name AND e.lane = 'fresh'),
        (SELECT count(*) FROM envelopes e WHERE e.status = 'sent' AND e.provider = p.name AND e.lane = 'recovery'),
        EXISTS (SELECT 1 FROM envelopes e WHERE e.status = 'pending' AND e.pass IS NOT NULL AND e.provider = p.name),
        (SELECT min(w.due_at) FROM envelopes w WHERE w.status = 'pending' AND w.pass IS NULL AND w.due_at IS NOT NULL)
 FROM providers p ORDER BY p.name";

/// The first ready envelopes of each lane of one provider, in lane order.
pub(super) const CANDIDATES: &str = "SELECT id, task_id, lane, pass, due_at,
        EXISTS (SELECT 1 FROM executions x WHERE x.task_id = c.task_id AND x.status = 'running')
 FROM (SELECT * FROM (SELECT id, task_id, lane, pass, due_at FROM envelopes
                      WHERE status = 'pending' AND pass IS NOT NULL AND provider = ?1 AND lane = 'fresh'
                      ORDER BY pass, id LIMIT ?2)
       UNION ALL
       SELECT * FROM (SELECT id, task_id, lane, pass, due_at FROM envelopes
                      WHERE status = 'pending' AND pass IS NOT NULL AND provider = ?1 AND lane = 'recovery'
                      ORDER BY pass, id LIMIT ?3)) c";

/// The first ready envelopes of each lane of one provider, on PostgreSQL: the same rows as
/// [`CANDIDATES`], locked, skipping rows another operation holds (`FOR UPDATE SKIP LOCKED`,
/// which needs each lane's scan materialized on its own).
const PG_CANDIDATES: &str = "WITH f AS MATERIALIZED (
        SELECT id, task_id, lane, pass, due_at FROM envelopes
        WHERE status = 'pending' AND pass IS NOT NULL AND provider = ?1 AND lane = 'fresh'
        ORDER BY pass, id LIMIT ?2 FOR UPDATE SKIP LOCKED),
     r AS MATERIALIZED (
        SELECT id, task_id, lane, pass, due_at FROM envelopes
        WHERE status = 'pending' AND pass IS NOT NULL AND provider = ?1 AND lane = 'recovery'
        ORDER BY pass, id LIMIT ?3 FOR UPDATE SKIP LOCKED)
 SELECT c.id, c.task_id, c.lane, c.pass, c.due_at,
        EXISTS (SELECT 1 FROM executions x WHERE x.task_id = c.task_id AND x.status = 'running')
 FROM (SELECT * FROM f UNION ALL SELECT * FROM r) c";

/// Give waiting envelopes whose due time has come their place, all at once: each fairness
/// key's promoted envelopes one stride apart (by due time), after the key's last ready one and
/// not before the lane's head.
static PROMOTE: PerDialect = PerDialect::new(promote_sql);

fn promote_sql(d: Dialect) -> String {
    format!(
        "UPDATE envelopes SET pass = w.pass FROM (
   SELECT id, CASE WHEN fifo THEN due_at
                   ELSE {greatest}(base, coalesce(keymax + {STRIDE}, base)) + {STRIDE} * (rn - 1) END AS pass
   FROM (SELECT e.id, e.due_at,
                coalesce((SELECT p.fifo FROM providers p WHERE p.name = e.provider), false) AS fifo,
                coalesce((SELECT min(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                          AND r.provider = e.provider AND r.lane = e.lane), 0) AS base,
                (SELECT max(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                 AND r.provider = e.provider AND r.lane = e.lane AND r.fair_key = e.fair_key) AS keymax,
                row_number() OVER (PARTITION BY e.provider, e.lane, e.fair_key ORDER BY e.due_at, e.id) AS rn
         FROM envelopes e
         WHERE e.status = 'pending' AND e.pass IS NULL AND e.due_at IS NOT NULL AND e.due_at <= ?1) x) w
 WHERE envelopes.id = w.id AND envelopes.status = 'pending' AND envelopes.pass IS NULL",
        greatest = greatest(d)
    )
}

/// SQLite's two-argument `max()` is PostgreSQL's `greatest()`.
pub(super) fn greatest(d: Dialect) -> &'static str {
    match d {
        Dialect::Sqlite => "max",
        Dialect::Postgres => "greatest",
    }
}

/// One provider's dispatch state (a row of [`PROVIDERS_STATE`]; the PostgreSQL backend reads
/// the same). The decisions on it ([`plan_provider`]) are shared by both backends.
#[derive(Debug, Clone)]
pub(in crate::store) struct State {
    pub name: String,
    pub max: i64,
    pub reserve: i64,
    pub fresh_weight: i64,
    pub recovery_weight: i64,
    pub fifo: bool,
    pub paused_until: Option<Millis>,
    pub recovery_limit: Option<i64>,
    pub fresh_pass: i64,
    pub recovery_pass: i64,
    pub in_fresh: i64,
    pub in_recovery: i64,
    pub ready: bool,
}

/// A ready envelope offered to the lane interleave.
#[derive(Debug, Clone)]
pub(in crate::store) struct Candidate {
    pub id: String,
    pub task_id: String,
    pub lane: Lane,
    pub pass: i64,
    pub due_at: Millis,
    pub resumed: bool,
}

/// What one provider may be given now: how many ready envelopes to ask for from each lane
/// (`None`: nothing — paused, saturated or nothing ready), after applying a circuit that
/// closed (the slow start begins). Extends `next_due` with the end of a pause that holds ready
/// work back.
pub(in crate::store) fn plan_provider(
    s: &mut State,
    now: Millis,
    left: usize,
    next_due: &mut Option<Millis>,
) -> Option<(i64, i64)> {
    match s.paused_until {
        Some(until) if until > now => {
            if s.ready {
                *next_due = Some(next_due.map_or(until, |d| d.min(until)));
            }
            return None;
        }
        // The circuit closed: the recovery lane starts again at one call.
        Some(_) => {
            s.paused_until = None;
            s.recovery_limit = Some(1);
        }
        None => {}
    }
    let free = s.max - s.in_fresh - s.in_recovery;
    if !s.ready || free <= 0 || left == 0 {
        return None;
    }
    let n = free.min(left as i64);
    let rec_room = if s.fifo { n } else { (recovery_cap(s) - s.in_recovery).clamp(0, n) };
    Some((n, rec_room))
}

/// The most slots the recovery lane may hold: all but the reserve (always at least one),
/// and during a slow start no more than its current limit.
pub(in crate::store) fn recovery_cap(s: &State) -> i64 {
    let cap = (s.max - s.reserve).max(1);
    match s.recovery_limit {
        Some(l) => cap.min(l.max(1)),
        None => cap,
    }
}

/// Pick up to `n` of the candidates (each lane's first ready envelopes, asked for `n` of each
/// and given fewer when that lane has no more, or is at its cap): by due time for a FIFO
/// provider; otherwise the lane whose place is lower goes next and advances by its stride. On a
/// tie the recovery lane goes first: a lane that had nothing more to offer keeps no credit (its
/// place moves up to the other lane's), so a task arriving in an empty fresh lane ties, waits
/// for one recovery dispatch at most, and from then on the lanes share 4 : 1 — the recovery
/// lane gets its share at every moment both lanes have work, not only under a sustained burst.
/// Updates the places.
pub(in crate::store) fn interleave(
    s: &mut State,
    fresh: Vec<Candidate>,
    recovery: Vec<Candidate>,
    n: usize,
) -> Vec<Candidate> {
    if s.fifo {
        let mut all: Vec<Candidate> = fresh.into_iter().chain(recovery).collect();
        all.sort_by(|a, b| (a.pass, &a.id).cmp(&(b.pass, &b.id)));
        all.truncate(n);
        return all;
    }
    // A lane given fewer than asked for has no more (or is capped) beyond these.
    let (fresh_more, recovery_more) = (fresh.len() >= n, recovery.len() >= n);
    let (inc_f, inc_r) = (LANE_STRIDE / s.fresh_weight, LANE_STRIDE / s.recovery_weight);
    let (mut f, mut r) = (fresh.into_iter().peekable(), recovery.into_iter().peekable());
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let take_fresh = match (f.peek().is_some(), r.peek().is_some()) {
            (false, false) => break,
            (true, false) => true,
            (false, true) => false,
            (true, true) => s.fresh_pass < s.recovery_pass,
        };
        if take_fresh {
            out.extend(f.next());
            s.fresh_pass += inc_f;
        } else {
            out.extend(r.next());
            s.recovery_pass += inc_r;
        }
    }
    if f.peek().is_none() && !fresh_more {
        s.fresh_pass = s.fresh_pass.max(s.recovery_pass);
    }
    if r.peek().is_none() && !recovery_more {
        s.recovery_pass = s.recovery_pass.max(s.fresh_pass);
    }
    let low = s.fresh_pass.min(s.recovery_pass);
    s.fresh_pass -= low;
    s.recovery_pass -= low;
    out
}

/// A list of ids as one JSON array (bound as one parameter; see [`in_ids`]).
fn json_ids<'a>(ids: impl Iterator<Item = &'a str>) -> String {
    Value::Array(ids.map(|s| Value::String(s.to_string())).collect()).to_string()
}

/// PostgreSQL's cluster-wide capacity lock (a hook; nothing under SQLite's single writer):
/// every `providers` row, locked in name order before the slots in use are counted, so nodes
/// dispatching at once count the same slots and advance the same lane places one after the
/// other. Held to the end of the dispatch's transaction.
fn lock_providers(tx: &mut dyn Tx) -> Result<(), StoreError> {
    if tx.locking() {
        tx.rows("SELECT name FROM providers ORDER BY name FOR UPDATE", &[])?;
    }
    Ok(())
}

/// The candidates statement of the dialect (a hook): [`CANDIDATES`] under SQLite's single
/// writer; [`PG_CANDIDATES`] on PostgreSQL, whose rows are locked and skipped when another
/// operation holds them, so no envelope is claimed twice and no dispatch waits on a row.
fn candidates_sql(tx: &dyn Tx) -> &'static str {
    by_dialect(tx, CANDIDATES, PG_CANDIDATES)
}

/// Every provider's dispatch state (rows of [`PROVIDERS_STATE`]) and the earliest waiting due
/// time.
fn states(tx: &mut dyn Tx) -> Result<(Vec<State>, Option<Millis>), StoreError> {
    let mut next_waiting = None;
    let mut out = Vec::new();
    for r in tx.rows(PROVIDERS_STATE, &[])? {
        next_waiting = r.get(13)?;
        out.push(State {
            name: r.get(0)?,
            max: r.get(1)?,
            reserve: r.get(2)?,
            fresh_weight: r.get::<i64>(3)?.max(1),
            recovery_weight: r.get::<i64>(4)?.max(1),
            fifo: r.get(5)?,
            paused_until: r.get(6)?,
            recovery_limit: r.get(7)?,
            fresh_pass: r.get(8)?,
            recovery_pass: r.get(9)?,
            in_fresh: r.get(10)?,
            in_recovery: r.get(11)?,
            ready: r.get(12)?,
        });
    }
    Ok((out, next_waiting))
}

/// The first `fresh` ready envelopes of `provider`'s fresh lane and `recovery` of its recovery
/// lane (locked on PostgreSQL), split by lane.
fn candidates(
    tx: &mut dyn Tx,
    provider: &str,
    fresh: i64,
    recovery: i64,
) -> Result<(Vec<Candidate>, Vec<Candidate>), StoreError> {
    let sql = candidates_sql(tx);
    let mut out = (Vec::new(), Vec::new());
    for r in tx.rows(sql, &[&provider, &fresh, &recovery])? {
        let c = Candidate {
            id: r.get(0)?,
            task_id: r.get(1)?,
            lane: Lane::parse(&r.get::<String>(2)?),
            pass: r.get(3)?,
            due_at: r.get::<Option<Millis>>(4)?.unwrap_or(0),
            resumed: r.get(5)?,
        };
        match c.lane {
            Lane::Fresh => out.0.push(c),
            Lane::Recovery => out.1.push(c),
        }
    }
    Ok(out)
}

/// The dispatcher's operation (see the module docs): claim up to `limit` ready envelopes for
/// free provider slots, each with a lease of `lease_ms` for process run `boot` of `node` (the
/// PostgreSQL node taking the leases; `None` on SQLite, whose leases name only the run), and
/// say when to look again.
pub(in crate::store) fn dispatch_due(
    tx: &mut dyn Tx,
    now: Millis,
    limit: usize,
    lease_ms: Millis,
    boot: &str,
    node: Option<&str>,
) -> Result<DispatchBatch, StoreError> {
    lock_providers(tx)?;
    let (mut provs, mut next_waiting) = states(tx)?;
    if next_waiting.is_some_and(|d| d <= now) {
        let sql = PROMOTE.get(tx);
        tx.exec(sql, &[&now])?;
        (provs, next_waiting) = states(tx)?;
    }
    let mut next_due = next_waiting;
    let mut left = limit;
    let mut picked: Vec<Candidate> = Vec::new();
    let mut slow_start: Vec<String> = Vec::new();
    for mut s in provs {
        let before = (s.paused_until, s.recovery_limit, s.fresh_pass, s.recovery_pass);
        if let Some((n, rec_room)) = plan_provider(&mut s, now, left, &mut next_due) {
            let (fresh, recovery) = candidates(tx, &s.name, n, rec_room)?;
            let chosen = interleave(&mut s, fresh, recovery, n as usize);
            left -= chosen.len();
            if s.recovery_limit.is_some() && !chosen.is_empty() {
                slow_start.push(s.name.clone());
            }
            picked.extend(chosen);
        }
        if (s.paused_until, s.recovery_limit, s.fresh_pass, s.recovery_pass) != before {
            tx.exec(
                "UPDATE providers SET paused_until = ?2, recovery_limit = ?3, fresh_pass = ?4, recovery_pass = ?5
                 WHERE name = ?1",
                &[&s.name, &s.paused_until, &s.recovery_limit, &s.fresh_pass, &s.recovery_pass],
            )?;
        }
    }
    if picked.is_empty() {
        return Ok(DispatchBatch { claims: Vec::new(), next_due });
    }
    let claims = claim_picked(tx, &picked, &slow_start, now, &Lease { ms: lease_ms, boot, node })?;
    Ok(DispatchBatch { claims, next_due })
}

/// Who takes the leases of one dispatch.
struct Lease<'a> {
    /// How long a lease lasts.
    ms: Millis,
    /// The process run taking them.
    boot: &'a str,
    /// The PostgreSQL node taking them (`None` on SQLite).
    node: Option<&'a str>,
}

// The claim's statements, built once per dialect. Where the two differ (a hook each): a list
// of ids is bound as one JSON array, which SQLite reads with `json_each` and PostgreSQL turns
// into an array for `= ANY` ([`in_ids`]); PostgreSQL's leases and executions also name the node
// holding them (`lease_node`, `node_id`: bound as the last parameter, on PostgreSQL only —
// [`node_sql`], [`with_node`]); and an execution token is drawn by each database's own random
// function.

/// Lease the picked envelopes: `?1` now, `?2` the lease token, `?3` its length, `?4` the run,
/// `?5` the envelope ids (`?6` the node).
static LEASE: PerDialect = PerDialect::new(lease_sql);

fn lease_sql(d: Dialect) -> String {
    format!(
        "UPDATE envelopes SET status = 'sent', sent_at = ?1, send_count = send_count + 1, lease_token = ?2,
                lease_expires_at = CAST(?1 AS BIGINT) + CAST(?3 AS BIGINT), lease_boot = ?4, pass = NULL,
                budget_hold = false{node}
         WHERE id {ids} AND status = 'pending'",
        ids = in_ids(d, "?5"),
        node = node_sql(d, ", lease_node = ?6"),
    )
}

/// Adopt the running executions of resumed calls: `?1` now, `?2` the run, `?3` the task ids
/// (`?4` the node).
static ADOPT: PerDialect = PerDialect::new(adopt_sql);

fn adopt_sql(d: Dialect) -> String {
    format!(
        "UPDATE executions SET boot_id = ?2, heartbeat_at = ?1{node}
         WHERE status = 'running' AND task_id {ids}",
        ids = in_ids(d, "?3"),
        node = node_sql(d, ", node_id = ?4"),
    )
}

/// Open an execution for each of the other tasks: `?1` now, `?2` the run, `?3` the task ids
/// (`?4` the node). The provider key is `store::provider_key(task, attempt)`, written in SQL.
static OPEN: PerDialect = PerDialect::new(open_sql);

fn open_sql(d: Dialect) -> String {
    format!(
        "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, boot_id, heartbeat_at,
                                 started_at{node_column})
         SELECT {token}, t.id, t.attempts + 1, 'running', 'claimed',
                'tally-' || t.id || '-' || (t.attempts + 1), ?2, ?1, ?1{node}
         FROM tasks t WHERE t.id {ids}",
        token = match d {
            Dialect::Sqlite => "lower(hex(randomblob(16)))",
            Dialect::Postgres => "CAST(gen_random_uuid() AS TEXT)",
        },
        ids = in_ids(d, "?3"),
        node_column = node_sql(d, ", node_id"),
        node = node_sql(d, ", ?4"),
    )
}

/// Mark the tasks `running`: `?1` now, `?2` the task ids.
static RUNNING: PerDialect = PerDialect::new(running_sql);

fn running_sql(d: Dialect) -> String {
    format!(
        "UPDATE tasks SET status = 'running', reason = NULL, failure_kind = NULL, updated_at = ?1 WHERE id {ids}",
        ids = in_ids(d, "?2")
    )
}

/// Everything a worker needs, per claimed envelope: `?1` the envelope ids, `?2` the lease token.
static READ: PerDialect = PerDialect::new(read_sql);

fn read_sql(d: Dialect) -> String {
    format!(
        "SELECT e.id, e.task_id, e.provider, e.send_count, e.lane, t.prompt, t.params, t.cancel_requested,
                t.created_at, t.set_id, x.token, x.phase, x.provider_job_id, x.provider_handle, x.idempotency_key,
                x.calling_at, x.attempt, t.candidate
         FROM envelopes e JOIN tasks t ON t.id = e.task_id
              JOIN executions x ON x.task_id = e.task_id AND x.status = 'running'
         WHERE e.id {ids} AND e.lease_token = ?2",
        ids = in_ids(d, "?1")
    )
}

/// `IN` a JSON array of ids bound as parameter `p`, in the dialect.
fn in_ids(d: Dialect, p: &str) -> String {
    match d {
        Dialect::Sqlite => format!("IN (SELECT value FROM json_each({p}))"),
        Dialect::Postgres => {
            format!("= ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(CAST({p} AS TEXT) AS jsonb))))")
        }
    }
}

/// `sql` on PostgreSQL (whose leases and executions name the node), nothing on SQLite.
fn node_sql(d: Dialect, sql: &str) -> &str {
    match d {
        Dialect::Sqlite => "",
        Dialect::Postgres => sql,
    }
}

/// A statement's parameters, with the node last on PostgreSQL (whose leases name it).
fn with_node<'a>(tx: &dyn Tx, p: &[&'a dyn Param], node: &'a Option<&'a str>) -> Vec<&'a dyn Param> {
    let mut out = p.to_vec();
    if tx.dialect() == Dialect::Postgres {
        out.push(node);
    }
    out
}

/// Claim the picked envelopes (a few statements for the whole batch, however many it holds):
/// take their leases and executions ([`lease_and_open`]), read back what their workers need
/// ([`read_claims`]), and hand them out in the order they were picked, each resumed call noted
/// on its task's timeline.
fn claim_picked(
    tx: &mut dyn Tx,
    picked: &[Candidate],
    slow_start: &[String],
    now: Millis,
    lease: &Lease<'_>,
) -> Result<Vec<Claim>, StoreError> {
    let token = uuid::Uuid::new_v4().to_string();
    let envelopes = json_ids(picked.iter().map(|p| p.id.as_str()));
    lease_and_open(tx, picked, &envelopes, &token, now, lease)?;
    let mut by_task = read_claims(tx, &envelopes, &token, slow_start)?;
    let mut out = Vec::with_capacity(picked.len());
    for p in picked {
        let Some(mut claim) = by_task.remove(&p.task_id) else { continue };
        claim.due_at = p.due_at;
        if claim.resumed {
            let msg = resumed_message(claim.attempt, claim.phase);
            event(tx, &claim.task_id, now, Actor::Worker, "resumed", &msg, Some(&claim.execution_token))?;
        }
        out.push(claim);
    }
    Ok(out)
}

/// The writes of a claim: lease the envelopes (token `token`), adopt the running executions of
/// resumed calls, open new executions for the rest, and mark the tasks `running` — one
/// statement each.
fn lease_and_open(
    tx: &mut dyn Tx,
    picked: &[Candidate],
    envelopes: &str,
    token: &str,
    now: Millis,
    lease: &Lease<'_>,
) -> Result<(), StoreError> {
    let (boot, node) = (lease.boot, &lease.node);
    let sql = LEASE.get(tx);
    let p = with_node(tx, &[&now, &token, &lease.ms, &boot, &envelopes], node);
    tx.exec(sql, &p)?;
    let (resumed, fresh): (Vec<&Candidate>, Vec<&Candidate>) = picked.iter().partition(|p| p.resumed);
    for (group, statement) in [(&resumed, &ADOPT), (&fresh, &OPEN)] {
        if !group.is_empty() {
            let ids = json_ids(group.iter().map(|p| p.task_id.as_str()));
            let sql = statement.get(tx);
            let p = with_node(tx, &[&now, &boot, &ids], node);
            tx.exec(sql, &p)?;
        }
    }
    let tasks = json_ids(picked.iter().map(|p| p.task_id.as_str()));
    let sql = RUNNING.get(tx);
    tx.exec(sql, &[&now, &tasks])?;
    Ok(())
}

/// The claims leased with `token`, by task (`due_at` not yet set), with their set's reference
/// images.
fn read_claims(
    tx: &mut dyn Tx,
    envelopes: &str,
    token: &str,
    slow_start: &[String],
) -> Result<HashMap<String, Claim>, StoreError> {
    let sql = READ.get(tx);
    let mut by_task = HashMap::new();
    for r in tx.rows(sql, &[&envelopes, &token])? {
        let mut claim = claim_of(&r, token, slow_start)?;
        if let Some(set) = r.get::<Option<String>>(9)? {
            claim.references = references_of_set(tx, &set)?;
        }
        by_task.insert(claim.task_id.clone(), claim);
    }
    Ok(by_task)
}

/// A claim from a row of [`READ`] (its references and due time left empty).
fn claim_of(r: &Row, token: &str, slow_start: &[String]) -> Result<Claim, StoreError> {
    let phase = Phase::parse(&r.get::<String>(11)?).unwrap_or(Phase::Calling);
    let provider: String = r.get(2)?;
    Ok(Claim {
        execution_token: r.get(10)?,
        lease_token: token.to_string(),
        envelope_id: r.get(0)?,
        send_count: r.get(3)?,
        lane: Lane::parse(&r.get::<String>(4)?),
        slow_start: slow_start.contains(&provider),
        task_id: r.get(1)?,
        provider,
        prompt: r.get(5)?,
        params: serde_json::from_str(&r.get::<String>(6)?).unwrap_or(Value::Null),
        candidate: r.get(17)?,
        attempt: r.get(16)?,
        phase,
        job_id: r.get(12)?,
        job_handle: if phase == Phase::Accepted { r.get(13)? } else { None },
        idempotency_key: r.get(14)?,
        calling_at: r.get(15)?,
        resumed: phase != Phase::Claimed,
        cancel_requested: r.get(7)?,
        created_at: r.get(8)?,
        due_at: 0,
        references: Vec::new(),
    })
}

/// The timeline line of a claim that adopted an earlier worker's call of `attempt` in `phase`.
fn resumed_message(attempt: i64, phase: Phase) -> String {
    let how = match phase {
        Phase::Accepted => "polling the job the provider already accepted, instead of sending again",
        _ => "recovering the earlier call without blindly sending it again",
    };
    format!("attempt {attempt} resumed: {how}")
}

/// An image set's reference images, in order (what a claim of one of its shots sends). A local
/// copy of `store::sets::references_of_set` over [`Tx`], until the sets family is ported.
fn references_of_set(tx: &mut dyn Tx, set: &str) -> Result<Vec<UploadView>, StoreError> {
    tx.rows(
        "SELECT u.id, u.sha256, u.bytes, u.media_type, u.created_at
         FROM set_references r JOIN uploads u ON u.id = r.upload_id WHERE r.set_id = ?1 ORDER BY r.position",
        &[&set],
    )?
    .iter()
    .map(|r| {
        Ok(UploadView {
            id: r.get(0)?,
            sha256: r.get(1)?,
            bytes: r.get(2)?,
            media_type: r.get(3)?,
            created_at: r.get(4)?,
        })
    })
    .collect()
}

/// The dispatch statements' query plans (`EXPLAIN QUERY PLAN`), for the benchmark report and
/// the tests that pin them: each must search an index, never scan `envelopes`.
pub fn dispatch_plans(c: &Connection) -> Result<Vec<String>, StoreError> {
    let waiting = pass_sql("'p'", "'fresh'", "''", "1", "1");
    let queries: Vec<(&str, String)> = vec![
        ("providers and slots in use", PROVIDERS_STATE.to_string()),
        ("ready envelopes of both lanes", CANDIDATES.replace("?1", "'p'").replace("?2", "8").replace("?3", "8")),
        ("a ready envelope's place", format!("SELECT {waiting}")),
        ("promotion of due waiting envelopes", promote_sql(Dialect::Sqlite).replace("?1", "1")),
    ];
    let mut out = Vec::new();
    for (name, q) in queries {
        let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {q}"))?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(3))?;
        let detail = rows.collect::<Result<Vec<_>, _>>()?.join("; ");
        out.push(format!("{name}: {detail}"));
    }
    Ok(out)
}

impl SqliteStore {
    /// [`dispatch_plans`] on a reader connection.
    pub async fn dispatch_plans(&self) -> Result<Vec<String>, StoreError> {
        self.read(dispatch_plans).await
    }
}

#[cfg(test)]
mod tests {
    use super::super::{NewTask, ProviderSlots};
    use super::*;

    async fn store_with(backlog: usize) -> (SqliteStore, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("tally-dispatch-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("tally.db"), crate::config::Durability::Normal).expect("open");
        crate::store::Store::from(store.clone())
            .configure_providers(vec![ProviderSlots::new("p", 8)])
            .await
            .expect("configure");
        store
            .write(move |c| {
                for i in 0..backlog {
                    let t = NewTask { provider: "p".into(), prompt: format!("r{i}"), ..NewTask::default() };
                    super::super::submit(&mut crate::store::sqlite_tx::SqliteTx::new(c), &t, 1_000)?;
                }
                c.execute("UPDATE envelopes SET lane = 'recovery'", [])?;
                Ok(())
            })
            .await
            .expect("backlog");
        (store, dir)
    }

    /// The VM steps a dispatch of one claim takes, summed over its statements.
    async fn steps_of_one_dispatch(store: &SqliteStore, now: Millis) -> i64 {
        let t = NewTask { provider: "p".into(), prompt: format!("fresh {now}"), ..NewTask::default() };
        store
            .write(move |c| super::super::submit(&mut crate::store::sqlite_tx::SqliteTx::new(c), &t, now))
            .await
            .expect("submit");
        store
            .write(move |c| {
                for sql in [PROVIDERS_STATE, CANDIDATES] {
                    c.prepare_cached(sql)?.reset_status(rusqlite::StatementStatus::VmStep);
                }
                let batch = dispatch_due(&mut crate::store::sqlite_tx::SqliteTx::new(c), now, 1, 60_000, "b", None)?;
                assert_eq!(batch.claims.len(), 1);
                let mut steps = 0;
                for sql in [PROVIDERS_STATE, CANDIDATES] {
                    steps += c.prepare_cached(sql)?.get_status(rusqlite::StatementStatus::VmStep);
                }
                Ok(steps as i64)
            })
            .await
            .expect("dispatch")
    }

    /// Fairness is an index order, not a scan: choosing who goes next costs the same with a
    /// 10,000-task backlog as with 10 (the VM steps of the reads, within a small margin).
    #[tokio::test]
    async fn dispatch_cost_is_flat_with_a_backlog() {
        let (small, d1) = store_with(10).await;
        let (large, d2) = store_with(10_000).await;
        let (a, b) = (steps_of_one_dispatch(&small, 2_000).await, steps_of_one_dispatch(&large, 2_000).await);
        assert!(b <= a + a / 2, "a dispatch took {b} VM steps with 10,000 waiting, {a} with 10");
        for plan in large.dispatch_plans().await.expect("plans") {
            assert!(!plan.contains("SCAN e ") && !plan.contains("SCAN envelopes"), "a dispatch read scans: {plan}");
        }
        for (s, d) in [(small, d1), (large, d2)] {
            s.close().expect("close");
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
