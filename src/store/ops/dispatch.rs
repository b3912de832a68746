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

use rusqlite::{Connection, params};
use serde_json::Value;

use super::*;
use crate::domain::{Actor, Millis, Phase};

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

/// Give waiting envelopes whose due time has come their place, all at once: each fairness
/// key's promoted envelopes one stride apart (by due time), after the key's last ready one and
/// not before the lane's head.
static PROMOTE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE envelopes SET pass = w.pass FROM (
   SELECT id, CASE WHEN fifo = 1 THEN due_at
                   ELSE max(base, coalesce(keymax + {STRIDE}, base)) + {STRIDE} * (rn - 1) END AS pass
   FROM (SELECT e.id, e.due_at,
                coalesce((SELECT p.fifo FROM providers p WHERE p.name = e.provider), 0) AS fifo,
                coalesce((SELECT min(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                          AND r.provider = e.provider AND r.lane = e.lane), 0) AS base,
                (SELECT max(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                 AND r.provider = e.provider AND r.lane = e.lane AND r.fair_key = e.fair_key) AS keymax,
                row_number() OVER (PARTITION BY e.provider, e.lane, e.fair_key ORDER BY e.due_at, e.id) AS rn
         FROM envelopes e
         WHERE e.status = 'pending' AND e.pass IS NULL AND e.due_at IS NOT NULL AND e.due_at <= ?1)) w
 WHERE envelopes.id = w.id"
    )
});

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

fn states(c: &Connection) -> Result<(Vec<State>, Option<Millis>), StoreError> {
    let mut next_waiting = None;
    let mut out = Vec::new();
    let mut stmt = c.prepare_cached(PROVIDERS_STATE)?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        next_waiting = r.get(13)?;
        out.push(State {
            name: r.get(0)?,
            max: r.get(1)?,
            reserve: r.get(2)?,
            fresh_weight: r.get::<_, i64>(3)?.max(1),
            recovery_weight: r.get::<_, i64>(4)?.max(1),
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

fn candidates(c: &Connection, provider: &str, fresh: i64, recovery: i64) -> Result<Vec<Candidate>, StoreError> {
    let mut stmt = c.prepare_cached(CANDIDATES)?;
    let rows = stmt.query_map(params![provider, fresh, recovery], |r| {
        Ok(Candidate {
            id: r.get(0)?,
            task_id: r.get(1)?,
            lane: Lane::parse(&r.get::<_, String>(2)?),
            pass: r.get(3)?,
            due_at: r.get::<_, Option<Millis>>(4)?.unwrap_or(0),
            resumed: r.get(5)?,
        })
    })?;
    rows.map(|r| r.map_err(StoreError::from)).collect()
}

pub(in crate::store) fn json_ids<'a>(ids: impl Iterator<Item = &'a str>) -> String {
    Value::Array(ids.map(|s| Value::String(s.to_string())).collect()).to_string()
}

/// The dispatcher's operation (see the module docs): claim up to `limit` ready envelopes for
/// free provider slots, each with a lease of `lease_ms` for process run `boot`, and say when to
/// look again.
pub(in crate::store) fn dispatch_due(
    c: &Connection,
    now: Millis,
    limit: usize,
    lease_ms: Millis,
    boot: &str,
) -> Result<DispatchBatch, StoreError> {
    let (mut provs, mut next_waiting) = states(c)?;
    if next_waiting.is_some_and(|d| d <= now) {
        c.prepare_cached(&PROMOTE)?.execute([now])?;
        (provs, next_waiting) = states(c)?;
    }
    let mut next_due = next_waiting;
    let mut left = limit;
    let mut picked: Vec<Candidate> = Vec::new();
    let mut slow_start: Vec<String> = Vec::new();
    for mut s in provs {
        let before = (s.paused_until, s.recovery_limit, s.fresh_pass, s.recovery_pass);
        if let Some((n, rec_room)) = plan_provider(&mut s, now, left, &mut next_due) {
            let (fresh, recovery): (Vec<_>, Vec<_>) =
                candidates(c, &s.name, n, rec_room)?.into_iter().partition(|x| x.lane == Lane::Fresh);
            let chosen = interleave(&mut s, fresh, recovery, n as usize);
            left -= chosen.len();
            if s.recovery_limit.is_some() && !chosen.is_empty() {
                slow_start.push(s.name.clone());
            }
            picked.extend(chosen);
        }
        if (s.paused_until, s.recovery_limit, s.fresh_pass, s.recovery_pass) != before {
            c.prepare_cached(
                "UPDATE providers SET paused_until = ?2, recovery_limit = ?3, fresh_pass = ?4, recovery_pass = ?5
                 WHERE name = ?1",
            )?
            .execute(params![s.name, s.paused_until, s.recovery_limit, s.fresh_pass, s.recovery_pass])?;
        }
    }
    if picked.is_empty() {
        return Ok(DispatchBatch { claims: Vec::new(), next_due });
    }
    claim_picked(c, &picked, &slow_start, now, lease_ms, boot).map(|claims| DispatchBatch { claims, next_due })
}

/// What a claim reads back per envelope.
type ClaimRow = (String, String, String, i64, String, String, String, bool, Millis, Option<String>);

/// Claim the picked envelopes: lease them (one statement), adopt the running executions of
/// resumed calls, open new executions for the rest (one statement), mark the tasks `running`
/// (one statement), and read everything a worker needs back (one statement).
fn claim_picked(
    c: &Connection,
    picked: &[Candidate],
    slow_start: &[String],
    now: Millis,
    lease_ms: Millis,
    boot: &str,
) -> Result<Vec<Claim>, StoreError> {
    let lease = uuid::Uuid::new_v4().to_string();
    let envelopes = json_ids(picked.iter().map(|p| p.id.as_str()));
    let tasks = json_ids(picked.iter().map(|p| p.task_id.as_str()));
    c.prepare_cached(
        "UPDATE envelopes SET status = 'sent', sent_at = ?1, send_count = send_count + 1, lease_token = ?2,
                lease_expires_at = ?1 + ?3, lease_boot = ?4, pass = NULL, budget_hold = 0
         WHERE id IN (SELECT value FROM json_each(?5)) AND status = 'pending'",
    )?
    .execute(params![now, lease, lease_ms, boot, envelopes])?;
    let resumed: Vec<&Candidate> = picked.iter().filter(|p| p.resumed).collect();
    if !resumed.is_empty() {
        let ids = json_ids(resumed.iter().map(|p| p.task_id.as_str()));
        c.prepare_cached(
            "UPDATE executions SET boot_id = ?2, heartbeat_at = ?1
             WHERE status = 'running' AND task_id IN (SELECT value FROM json_each(?3))",
        )?
        .execute(params![now, boot, ids])?;
    }
    if resumed.len() < picked.len() {
        let ids = json_ids(picked.iter().filter(|p| !p.resumed).map(|p| p.task_id.as_str()));
        // The provider key is `store::provider_key(task, attempt)`, written in SQL.
        c.prepare_cached(
            "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, boot_id, heartbeat_at, started_at)
             SELECT lower(hex(randomblob(16))), t.id, t.attempts + 1, 'running', 'claimed',
                    'tally-' || t.id || '-' || (t.attempts + 1), ?2, ?1, ?1
             FROM tasks t WHERE t.id IN (SELECT value FROM json_each(?3))",
        )?
        .execute(params![now, boot, ids])?;
    }
    c.prepare_cached(
        "UPDATE tasks SET status = 'running', reason = NULL, failure_kind = NULL, updated_at = ?1
         WHERE id IN (SELECT value FROM json_each(?2))",
    )?
    .execute(params![now, tasks])?;
    let mut by_task: std::collections::HashMap<String, Claim> = std::collections::HashMap::new();
    {
        let mut stmt = c.prepare_cached(
            "SELECT e.id, e.task_id, e.provider, e.send_count, e.lane, t.prompt, t.params, t.cancel_requested, t.created_at,
                    t.set_id, x.token, x.phase, x.provider_job_id, x.provider_handle, x.idempotency_key, x.calling_at,
                    x.attempt, t.candidate
             FROM envelopes e JOIN tasks t ON t.id = e.task_id
                  JOIN executions x ON x.task_id = e.task_id AND x.status = 'running'
             WHERE e.id IN (SELECT value FROM json_each(?1)) AND e.lease_token = ?2",
        )?;
        let mut rows = stmt.query(params![envelopes, lease])?;
        while let Some(r) = rows.next()? {
            let head: ClaimRow = (
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
                r.get(9)?,
            );
            let (envelope_id, task_id, provider, send_count, lane, prompt, params_text, cancel, created_at, set_id) =
                head;
            let phase = Phase::parse(&r.get::<_, String>(11)?).unwrap_or(Phase::Calling);
            let claim = Claim {
                execution_token: r.get(10)?,
                lease_token: lease.clone(),
                envelope_id,
                send_count,
                lane: Lane::parse(&lane),
                slow_start: slow_start.contains(&provider),
                task_id: task_id.clone(),
                provider,
                prompt,
                params: serde_json::from_str(&params_text).unwrap_or(Value::Null),
                candidate: r.get(17)?,
                attempt: r.get(16)?,
                phase,
                job_id: r.get(12)?,
                job_handle: if phase == Phase::Accepted { r.get(13)? } else { None },
                idempotency_key: r.get(14)?,
                calling_at: r.get(15)?,
                resumed: phase != Phase::Claimed,
                cancel_requested: cancel,
                created_at,
                due_at: 0,
                references: Vec::new(),
            };
            let claim = match set_id {
                Some(set) => Claim { references: crate::store::sets::references_of_set(c, &set)?, ..claim },
                None => claim,
            };
            by_task.insert(task_id, claim);
        }
    }
    let mut out = Vec::with_capacity(picked.len());
    for p in picked {
        let Some(mut claim) = by_task.remove(&p.task_id) else { continue };
        claim.due_at = p.due_at;
        if claim.resumed {
            let how = match claim.phase {
                Phase::Accepted => "polling the job the provider already accepted, instead of sending again",
                _ => "recovering the earlier call without blindly sending it again",
            };
            let msg = format!("attempt {} resumed: {how}", claim.attempt);
            event(c, &claim.task_id, now, Actor::Worker, "resumed", &msg, Some(&claim.execution_token))?;
        }
        out.push(claim);
    }
    Ok(out)
}

impl SqliteStore {
    /// Claim ready envelopes for free provider slots (see the module docs). An ordered commit
    /// ([`super::Commit::Ordered`]): nothing leaves for a provider before the next durable one
    /// (`record_calling`, whose fsync covers the claim too); if a power loss erases it, the
    /// envelopes are simply still `pending`.
    pub async fn dispatch_due(
        &self,
        now: Millis,
        limit: usize,
        lease_ms: Millis,
        boot: &str,
    ) -> Result<DispatchBatch, StoreError> {
        let boot = boot.to_string();
        self.write_ordered(move |c| dispatch_due(c, now, limit, lease_ms, &boot)).await
    }
}

/// The dispatch statements' query plans (`EXPLAIN QUERY PLAN`), for the benchmark report and
/// the tests that pin them: each must search an index, never scan `envelopes`.
pub fn dispatch_plans(c: &Connection) -> Result<Vec<String>, StoreError> {
    let waiting = pass_sql("'p'", "'fresh'", "''", "1", "1");
    let queries: Vec<(&str, String)> = vec![
        ("providers and slots in use", PROVIDERS_STATE.to_string()),
        ("ready envelopes of both lanes", CANDIDATES.replace("?1", "'p'").replace("?2", "8").replace("?3", "8")),
        ("a ready envelope's place", format!("SELECT {waiting}")),
        ("promotion of due waiting envelopes", PROMOTE.replace("?1", "1")),
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
    use super::*;

    async fn store_with(backlog: usize) -> (SqliteStore, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("tally-dispatch-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("tally.db"), crate::config::Durability::Normal).expect("open");
        store.configure_providers(vec![ProviderSlots::new("p", 8)]).await.expect("configure");
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
                let batch = dispatch_due(c, now, 1, 60_000, "b")?;
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
