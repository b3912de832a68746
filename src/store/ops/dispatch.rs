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
//! come — at submit, at a requeue, or at the dispatcher's next wake-up ([`PROMOTE`]) — and gets
//! its place then ([`pass_sql`]): one [`STRIDE`] after the last ready envelope of its fairness
//! key, but never before the lane's current head, so a new key starts at the front and a key
//! with a 10,000-task backlog spreads its tasks far ahead (stride scheduling, as Temporal does).
//! Each provider's two lanes (fresh, recovery) are interleaved by weight with a second stride
//! per lane (`providers.fresh_pass`, `recovery_pass`); a lane that has nothing to offer keeps no
//! credit. The recovery lane may hold at most `max_concurrency − reserve` slots (at least one),
//! and after a circuit closes its share starts at one call and grows by one with each success,
//! halving on an overload answer (`ops::slots::slow_start_feedback`): 1, 2, 4, … calls per round. Every
//! read is an index range bounded by the number of free slots, so the cost of a dispatch does
//! not grow with the backlog (`dispatch_cost_is_flat_with_a_backlog` shows the plans).
//!
//! **Written once for both backends.** PostgreSQL runs dispatches of several nodes at once, and
//! differs in four named places only: the slot rows (`store::ops::slot_rows`: a dispatch takes
//! free `provider_slots` rows `FOR UPDATE SKIP LOCKED` and claims no more envelopes than it got
//! rows, so the capacity rule holds across nodes with no lock shared by all dispatches),
//! [`lock_provider`] (one provider's row, locked only when this dispatch may change what the
//! row holds — its lane places, pause or slow start — or take from its recovery lane, whose cap
//! is counted: see [`needs_provider_lock`]), [`candidates_sql`] (PostgreSQL takes the
//! candidates `FOR UPDATE SKIP LOCKED`: a row another operation holds is skipped, never waited
//! for), and the claim's statements (`store::ops::claim`: how a list of ids is bound, the node
//! a lease names, how an execution token is drawn). The decisions ([`plan_provider`],
//! [`interleave`]) are pure functions, so both backends decide alike.
//!
//! **The one-commit pickup's decision** ([`dispatch_only`], for `ops::pickup`): the same
//! state, plan, slot and lane places for the one envelope a submit just wrote, taken only when
//! the fair order would pick it first now.
//!
//! A little over 600 lines on purpose: the decisions, their statements in both dialects and
//! the tests that pin their plans are read together; the slot rows live in `ops::slot_rows`.

use rusqlite::Connection;

use super::claim::{self, Lease};
use super::common::{PerDialect, by_dialect};
use super::slot_rows;
use super::{DispatchBatch, Lane, SqliteStore};
use crate::domain::Millis;
use crate::store::StoreError;
use crate::store::tx::{Dialect, Tx};

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
        (SELECT min(w.due_at) FROM envelopes w WHERE w.status = 'pending' AND w.pass IS NULL AND w.due_at IS NOT NULL),
        EXISTS (SELECT 1 FROM envelopes e WHERE e.status = 'pending' AND e.pass IS NOT NULL AND e.provider = p.name
                AND e.lane = 'recovery')
 FROM providers p ORDER BY p.name";

/// One provider's row of [`PROVIDERS_STATE`] (`?1` its name), read again after
/// [`lock_provider`] on PostgreSQL.
static PROVIDER_STATE: PerDialect = PerDialect::new(provider_state_sql);

fn provider_state_sql(_: Dialect) -> String {
    PROVIDERS_STATE.replace("FROM providers p ORDER BY p.name", "FROM providers p WHERE p.name = ?1")
}

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
/// not before the lane's head. On PostgreSQL only the rows no other node's dispatch is
/// promoting (`FOR UPDATE SKIP LOCKED`): two dispatches promoting at once never wait for each
/// other.
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
 WHERE envelopes.id = w.id AND envelopes.status = 'pending' AND envelopes.pass IS NULL{skip}",
        greatest = greatest(d),
        skip = match d {
            Dialect::Sqlite => "",
            Dialect::Postgres => {
                " AND envelopes.id IN (SELECT s.id FROM envelopes s WHERE s.status = 'pending' AND s.pass IS NULL
                    AND s.due_at IS NOT NULL AND s.due_at <= ?1 FOR UPDATE SKIP LOCKED)"
            }
        }
    )
}

/// SQLite's two-argument `max()` is PostgreSQL's `greatest()`.
pub(super) fn greatest(d: Dialect) -> &'static str {
    match d {
        Dialect::Sqlite => "max",
        Dialect::Postgres => "greatest",
    }
}

/// One provider's dispatch state (a row of [`PROVIDERS_STATE`]). The decisions on it
/// ([`plan_provider`], [`interleave`]) are pure functions.
#[derive(Debug, Clone)]
struct State {
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
    /// Whether its recovery lane has ready envelopes.
    pub recovery_ready: bool,
}

/// A ready envelope offered to the lane interleave.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
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
fn plan_provider(s: &mut State, now: Millis, left: usize, next_due: &mut Option<Millis>) -> Option<(i64, i64)> {
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
fn recovery_cap(s: &State) -> i64 {
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
fn interleave(s: &mut State, fresh: Vec<Candidate>, recovery: Vec<Candidate>, n: usize) -> Vec<Candidate> {
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

/// Whether a PostgreSQL dispatch at `now` must hold `s`'s row (see [`lock_provider`]): when
/// what the row holds may change — a pause that ended, a slow start under way, lane places not
/// level (both lanes had work) — or when it may take from the recovery lane, whose cap is a count of the
/// recovery envelopes in flight that only dispatches holding the row change. Otherwise (the
/// common case: fresh work only, places level) the dispatch takes fresh envelopes only and
/// leaves the row as it is, so nodes dispatching at once share no lock; the capacity rule is
/// kept by the slot rows either way.
fn needs_provider_lock(s: &State, now: Millis) -> bool {
    match s.paused_until {
        // Still paused: nothing is dispatched to it and its row is left as it is.
        Some(until) if until > now => false,
        Some(_) => true,
        None => s.recovery_limit.is_some() || s.fresh_pass != s.recovery_pass || s.recovery_ready,
    }
}

/// PostgreSQL's per-provider lock (a hook; nothing under SQLite's single writer): `provider`'s
/// row, locked to the end of the dispatch's transaction, then its state read again (after
/// every earlier holder committed), so dispatches that change the row or count the recovery
/// lane's slots do so one after the other. Only one provider's row, and only when
/// [`needs_provider_lock`] says so.
fn lock_provider(tx: &mut dyn Tx, provider: &str) -> Result<Option<State>, StoreError> {
    {
        let _t = crate::stages::span(crate::stages::Stage::LockStatement);
        tx.rows("SELECT name FROM providers WHERE name = ?1 FOR UPDATE", &[&provider])?;
    }
    let sql = PROVIDER_STATE.get(tx);
    match tx.rows(sql, &[&provider])?.first() {
        Some(r) => Ok(Some(state_of(r)?)),
        None => Ok(None),
    }
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
        out.push(state_of(&r)?);
    }
    Ok((out, next_waiting))
}

/// A row of [`PROVIDERS_STATE`].
fn state_of(r: &crate::store::tx::Row) -> Result<State, StoreError> {
    Ok(State {
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
        recovery_ready: r.get(14)?,
    })
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
    // Slots held for fenced calls whose deadline passed are free again (`ops::slot_rows`).
    slot_rows::release_ended(tx, now)?;
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
        // PostgreSQL: hold the provider's row only when this dispatch may change it or count
        // its recovery lane; otherwise fresh envelopes only, and no shared lock.
        let locked = tx.locking() && needs_provider_lock(&s, now);
        if locked {
            match lock_provider(tx, &s.name)? {
                Some(again) => s = again,
                None => continue,
            }
        }
        let before = (s.paused_until, s.recovery_limit, s.fresh_pass, s.recovery_pass);
        if let Some((n, rec_room)) = plan_provider(&mut s, now, left, &mut next_due) {
            // The slot rows bound what the (possibly stale) counts allowed, exactly.
            let slots = slot_rows::take(tx, &s.name, n)?;
            let n = slots.as_ref().map_or(n, |got| n.min(got.len() as i64));
            let rec_room = if tx.locking() && !locked { 0 } else { rec_room.min(n) };
            let (fresh, recovery) = if n > 0 { candidates(tx, &s.name, n, rec_room)? } else { Default::default() };
            let chosen = interleave(&mut s, fresh, recovery, n as usize);
            slot_rows::fill(tx, &s.name, slots.as_deref(), &chosen)?;
            left -= chosen.len();
            if s.recovery_limit.is_some() && !chosen.is_empty() {
                slow_start.push(s.name.clone());
            }
            picked.extend(chosen);
        }
        save_places(tx, &s, before)?;
    }
    // A slot held for a fenced call frees at its deadline: wake then (`ops::slot_rows::hold`).
    if let Some(t) = slot_rows::next_release(tx, now)? {
        next_due = Some(next_due.map_or(t, |d| d.min(t)));
    }
    if picked.is_empty() {
        return Ok(DispatchBatch { claims: Vec::new(), next_due });
    }
    let claims = claim::claim_picked(tx, &picked, &slow_start, now, &Lease { ms: lease_ms, boot, node })?;
    Ok(DispatchBatch { claims, next_due })
}

/// What [`save_places`] compares: a provider's pause, slow start and lane places.
type Places = (Option<Millis>, Option<i64>, i64, i64);

/// Write a provider's pause, slow start and lane places if a dispatch changed them from
/// `before`.
fn save_places(tx: &mut dyn Tx, s: &State, before: Places) -> Result<(), StoreError> {
    if (s.paused_until, s.recovery_limit, s.fresh_pass, s.recovery_pass) != before {
        tx.exec(
            "UPDATE providers SET paused_until = ?2, recovery_limit = ?3, fresh_pass = ?4, recovery_pass = ?5
             WHERE name = ?1",
            &[&s.name, &s.paused_until, &s.recovery_limit, &s.fresh_pass, &s.recovery_pass],
        )?;
    }
    Ok(())
}

/// The fast path's dispatch (`ops::pickup`): take a free slot of `provider` for the envelope of
/// `task` — just submitted in this transaction — exactly as [`dispatch_due`] would (the same
/// state, plan, slot row and lane places), but only when the fair order would pick it first
/// now. `None`, having written nothing but a slot row lock, when anything else could come
/// first or the provider is not plainly open: a pause (ended or not), a slow start, lane places
/// not level, a recovery lane with ready work (the cases [`needs_provider_lock`] names), waiting
/// envelopes due for promotion, no free slot, or another ready envelope ahead of this one.
pub(super) fn dispatch_only(
    tx: &mut dyn Tx,
    provider: &str,
    task: &str,
    now: Millis,
) -> Result<Option<Candidate>, StoreError> {
    let sql = PROVIDER_STATE.get(tx);
    let Some(row) = tx.rows(sql, &[&provider])?.into_iter().next() else { return Ok(None) };
    let mut s = state_of(&row)?;
    let next_waiting: Option<Millis> = row.get(13)?;
    if s.paused_until.is_some() || needs_provider_lock(&s, now) || next_waiting.is_some_and(|d| d <= now) {
        return Ok(None);
    }
    let before = (s.paused_until, s.recovery_limit, s.fresh_pass, s.recovery_pass);
    let mut next_due = None;
    let Some((n, _)) = plan_provider(&mut s, now, 1, &mut next_due) else { return Ok(None) };
    // The slot row first, as a dispatch takes it (PostgreSQL; SQLite counted the slots above).
    let slots = slot_rows::take(tx, &s.name, n)?;
    if slots.as_ref().is_some_and(Vec::is_empty) {
        return Ok(None);
    }
    let (fresh, _) = candidates(tx, &s.name, 1, 0)?;
    if fresh.first().is_none_or(|c| c.task_id != task) {
        return Ok(None);
    }
    let chosen = interleave(&mut s, fresh, Vec::new(), 1);
    slot_rows::fill(tx, &s.name, slots.as_deref(), &chosen)?;
    save_places(tx, &s, before)?;
    Ok(chosen.into_iter().next())
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
#[path = "dispatch_tests.rs"]
mod tests;
