//! Dispatch on PostgreSQL, with the semantics of `store::ops::dispatch` (the conformance suite
//! holds them to it): one operation claims ready envelopes for free provider slots, in lane and
//! fairness order, with their leases and executions. What differs is how several nodes agree:
//! a dispatch first locks the `providers` rows (so nodes dispatching at once count the same
//! slots in use and advance the same lane places, one after the other), then takes the
//! candidate envelopes `FOR UPDATE SKIP LOCKED` (rule L: a row another operation holds is
//! skipped, never waited for). The choice among candidates is the SQLite backend's own code
//! (`plan_provider`, `interleave`), so both backends decide alike.

use super::*;
use crate::domain::{Actor, Millis, Phase};
use crate::store::ops::{Candidate, STRIDE, State, interleave, plan_provider};
use crate::store::pg::PgStore;
use crate::store::{Claim, DispatchBatch, DispatchOrder, Lane, ProviderSlots};

/// Each provider's dispatch state, and (on every row) the earliest waiting due time.
const PROVIDERS_STATE: &str = "SELECT p.name, p.max_concurrency, p.reserve, p.fresh_weight, p.recovery_weight,
        p.fifo, p.paused_until, p.recovery_limit, p.fresh_pass, p.recovery_pass,
        (SELECT count(*) FROM envelopes e WHERE e.status = 'sent' AND e.provider = p.name AND e.lane = 'fresh'),
        (SELECT count(*) FROM envelopes e WHERE e.status = 'sent' AND e.provider = p.name AND e.lane = 'recovery'),
        EXISTS (SELECT 1 FROM envelopes e WHERE e.status = 'pending' AND e.pass IS NOT NULL AND e.provider = p.name),
        (SELECT min(w.due_at) FROM envelopes w WHERE w.status = 'pending' AND w.pass IS NULL AND w.due_at IS NOT NULL)
 FROM providers p ORDER BY p.name";

/// The first ready envelopes of each lane of one provider, locked (skipping rows another
/// operation holds).
const CANDIDATES: &str = "WITH f AS MATERIALIZED (
        SELECT id, task_id, lane, pass, due_at FROM envelopes
        WHERE status = 'pending' AND pass IS NOT NULL AND provider = $1 AND lane = 'fresh'
        ORDER BY pass, id LIMIT $2 FOR UPDATE SKIP LOCKED),
     r AS MATERIALIZED (
        SELECT id, task_id, lane, pass, due_at FROM envelopes
        WHERE status = 'pending' AND pass IS NOT NULL AND provider = $1 AND lane = 'recovery'
        ORDER BY pass, id LIMIT $3 FOR UPDATE SKIP LOCKED)
 SELECT c.id, c.task_id, c.lane, c.pass, c.due_at,
        EXISTS (SELECT 1 FROM executions x WHERE x.task_id = c.task_id AND x.status = 'running')
 FROM (SELECT * FROM f UNION ALL SELECT * FROM r) c";

/// Give due waiting envelopes their places (as SQLite's `PROMOTE`).
static PROMOTE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE envelopes e SET pass = w.pass FROM (
           SELECT id, CASE WHEN fifo THEN due_at
                           ELSE greatest(base, coalesce(keymax + {STRIDE}, base)) + {STRIDE} * (rn - 1) END AS pass
           FROM (SELECT e2.id, e2.due_at,
                        coalesce((SELECT p.fifo FROM providers p WHERE p.name = e2.provider), false) AS fifo,
                        coalesce((SELECT min(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                                  AND r.provider = e2.provider AND r.lane = e2.lane), 0) AS base,
                        (SELECT max(r.pass) FROM envelopes r WHERE r.status = 'pending' AND r.pass IS NOT NULL
                         AND r.provider = e2.provider AND r.lane = e2.lane AND r.fair_key = e2.fair_key) AS keymax,
                        row_number() OVER (PARTITION BY e2.provider, e2.lane, e2.fair_key ORDER BY e2.due_at, e2.id) AS rn
                 FROM envelopes e2
                 WHERE e2.status = 'pending' AND e2.pass IS NULL AND e2.due_at IS NOT NULL AND e2.due_at <= $1) x) w
         WHERE e.id = w.id AND e.status = 'pending' AND e.pass IS NULL"
    )
});

fn states(tx: &mut Tx<'_, '_>) -> Result<(Vec<State>, Option<Millis>), StoreError> {
    let mut next_waiting = None;
    let mut out = Vec::new();
    for r in tx.rows(PROVIDERS_STATE, &[])? {
        next_waiting = r.get(13);
        out.push(State {
            name: r.get(0),
            max: r.get(1),
            reserve: r.get(2),
            fresh_weight: r.get::<_, i64>(3).max(1),
            recovery_weight: r.get::<_, i64>(4).max(1),
            fifo: r.get(5),
            paused_until: r.get(6),
            recovery_limit: r.get(7),
            fresh_pass: r.get(8),
            recovery_pass: r.get(9),
            in_fresh: r.get(10),
            in_recovery: r.get(11),
            ready: r.get(12),
        });
    }
    Ok((out, next_waiting))
}

/// Claim ready envelopes for free provider slots (see the module docs).
fn dispatch_due(
    tx: &mut Tx<'_, '_>,
    now: Millis,
    limit: usize,
    lease_ms: Millis,
    node: &str,
    boot: &str,
) -> Result<DispatchBatch, StoreError> {
    tx.rows("SELECT name FROM providers ORDER BY name FOR UPDATE", &[])?;
    let (mut provs, mut next_waiting) = states(tx)?;
    if next_waiting.is_some_and(|d| d <= now) {
        tx.exec(PROMOTE.as_str(), &[&now])?;
        (provs, next_waiting) = states(tx)?;
    }
    let mut next_due = next_waiting;
    let mut left = limit;
    let mut picked: Vec<Candidate> = Vec::new();
    let mut slow_start: Vec<String> = Vec::new();
    for mut s in provs {
        let before = (s.paused_until, s.recovery_limit, s.fresh_pass, s.recovery_pass);
        if let Some((n, rec_room)) = plan_provider(&mut s, now, left, &mut next_due) {
            let rows = tx.rows(CANDIDATES, &[&s.name, &n, &rec_room])?;
            let (fresh, recovery): (Vec<_>, Vec<_>) = rows
                .iter()
                .map(|r| Candidate {
                    id: r.get(0),
                    task_id: r.get(1),
                    lane: Lane::parse(r.get(2)),
                    pass: r.get(3),
                    due_at: r.get::<_, Option<Millis>>(4).unwrap_or(0),
                    resumed: r.get(5),
                })
                .partition(|x| x.lane == Lane::Fresh);
            let chosen = interleave(&mut s, fresh, recovery, n as usize);
            left -= chosen.len();
            if s.recovery_limit.is_some() && !chosen.is_empty() {
                slow_start.push(s.name.clone());
            }
            picked.extend(chosen);
        }
        if (s.paused_until, s.recovery_limit, s.fresh_pass, s.recovery_pass) != before {
            tx.exec(
                "UPDATE providers SET paused_until = $2, recovery_limit = $3, fresh_pass = $4, recovery_pass = $5
                 WHERE name = $1",
                &[&s.name, &s.paused_until, &s.recovery_limit, &s.fresh_pass, &s.recovery_pass],
            )?;
        }
    }
    if picked.is_empty() {
        return Ok(DispatchBatch { claims: Vec::new(), next_due });
    }
    let claims = claim_picked(tx, &picked, &slow_start, now, lease_ms, node, boot)?;
    Ok(DispatchBatch { claims, next_due })
}

/// Lease the picked envelopes, adopt or open their executions, mark the tasks `running`, and
/// read the claims back (as SQLite's `claim_picked`).
fn claim_picked(
    tx: &mut Tx<'_, '_>,
    picked: &[Candidate],
    slow_start: &[String],
    now: Millis,
    lease_ms: Millis,
    node: &str,
    boot: &str,
) -> Result<Vec<Claim>, StoreError> {
    let lease = uuid::Uuid::new_v4().to_string();
    let envelopes: Vec<String> = picked.iter().map(|p| p.id.clone()).collect();
    let tasks: Vec<String> = picked.iter().map(|p| p.task_id.clone()).collect();
    tx.exec(
        "UPDATE envelopes SET status = 'sent', sent_at = $1, send_count = send_count + 1, lease_token = $2,
                lease_expires_at = $1::bigint + $3::bigint, lease_node = $4, lease_boot = $5, pass = NULL,
                budget_hold = false
         WHERE id = ANY($6) AND status = 'pending'",
        &[&now, &lease, &lease_ms, &node, &boot, &envelopes],
    )?;
    let resumed: Vec<String> = picked.iter().filter(|p| p.resumed).map(|p| p.task_id.clone()).collect();
    if !resumed.is_empty() {
        tx.exec(
            "UPDATE executions SET node_id = $2, boot_id = $3, heartbeat_at = $1
             WHERE status = 'running' AND task_id = ANY($4)",
            &[&now, &node, &boot, &resumed],
        )?;
    }
    let fresh: Vec<String> = picked.iter().filter(|p| !p.resumed).map(|p| p.task_id.clone()).collect();
    if !fresh.is_empty() {
        // The provider key is `store::provider_key(task, attempt)`, written in SQL.
        tx.exec(
            "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, node_id, boot_id,
                                     heartbeat_at, started_at)
             SELECT gen_random_uuid()::text, t.id, t.attempts + 1, 'running', 'claimed',
                    'tally-' || t.id || '-' || (t.attempts + 1), $2, $3, $1, $1
             FROM tasks t WHERE t.id = ANY($4)",
            &[&now, &node, &boot, &fresh],
        )?;
    }
    tx.exec(
        "UPDATE tasks SET status = 'running', reason = NULL, failure_kind = NULL, updated_at = $1 WHERE id = ANY($2)",
        &[&now, &tasks],
    )?;
    let rows = tx.rows(
        "SELECT e.id, e.task_id, e.provider, e.send_count, e.lane, t.prompt, t.params, t.cancel_requested, t.created_at,
                t.set_id, x.token, x.phase, x.provider_job_id, x.provider_handle, x.idempotency_key, x.calling_at,
                x.attempt, t.candidate
         FROM envelopes e JOIN tasks t ON t.id = e.task_id
              JOIN executions x ON x.task_id = e.task_id AND x.status = 'running'
         WHERE e.id = ANY($1) AND e.lease_token = $2",
        &[&envelopes, &lease],
    )?;
    let mut by_task = std::collections::HashMap::new();
    for r in rows {
        let phase = Phase::parse(r.get(11)).unwrap_or(Phase::Calling);
        let provider: String = r.get(2);
        let task_id: String = r.get(1);
        let set_id: Option<String> = r.get(9);
        let params: String = r.get(6);
        let references = match &set_id {
            Some(set) => crate::store::pg::sets::references_of_set(tx, set)?,
            None => Vec::new(),
        };
        let claim = Claim {
            execution_token: r.get(10),
            lease_token: lease.clone(),
            envelope_id: r.get(0),
            send_count: r.get(3),
            lane: Lane::parse(r.get(4)),
            slow_start: slow_start.contains(&provider),
            task_id: task_id.clone(),
            provider,
            prompt: r.get(5),
            params: serde_json::from_str(&params).unwrap_or(serde_json::Value::Null),
            candidate: r.get(17),
            attempt: r.get(16),
            phase,
            job_id: r.get(12),
            job_handle: if phase == Phase::Accepted { r.get(13) } else { None },
            idempotency_key: r.get(14),
            calling_at: r.get(15),
            resumed: phase != Phase::Claimed,
            cancel_requested: r.get(7),
            created_at: r.get(8),
            due_at: 0,
            references,
        };
        by_task.insert(task_id, claim);
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
            event(tx, &claim.task_id, now, Actor::Worker, "resumed", &msg, Some(&claim.execution_token))?;
        }
        out.push(claim);
    }
    Ok(out)
}

/// Write the configured providers (as `store::ops::slots::configure_providers`).
fn configure_providers(tx: &mut Tx<'_, '_>, list: &[ProviderSlots]) -> Result<(), StoreError> {
    tx.exec("UPDATE providers SET configured = false, paused_until = NULL, recovery_limit = NULL", &[])?;
    for p in list {
        tx.exec(
            "INSERT INTO providers (name, max_concurrency, reserve, fresh_weight, recovery_weight, fifo, configured)
             VALUES ($1, $2, $3, $4, $5, $6, true)
             ON CONFLICT (name) DO UPDATE SET max_concurrency = excluded.max_concurrency, reserve = excluded.reserve,
                fresh_weight = excluded.fresh_weight, recovery_weight = excluded.recovery_weight,
                fifo = excluded.fifo, configured = true",
            &[
                &p.name,
                &(p.max_concurrency.max(1) as i64),
                &(p.reserve as i64),
                &(p.fresh_weight.max(1) as i64),
                &(p.recovery_weight.max(1) as i64),
                &(p.order == DispatchOrder::Fifo),
            ],
        )?;
    }
    tx.exec(
        "INSERT INTO providers (name, max_concurrency, configured)
         SELECT DISTINCT provider, 16, false FROM envelopes WHERE status IN ('pending', 'sent')
         ON CONFLICT (name) DO NOTHING",
        &[],
    )?;
    Ok(())
}

/// A claim handed back before anything was sent (as `store::ops::slots::release_claim`).
fn release_claim(
    tx: &mut Tx<'_, '_>,
    exec: &str,
    lease: &str,
    due_at: Millis,
    why: &str,
    now: Millis,
) -> Result<(), StoreError> {
    let task = fence(tx, exec, lease, now)?;
    let n = tx.exec(
        "UPDATE executions SET status = 'abandoned', finished_at = $2, error = $3
         WHERE token = $1 AND status = 'running' AND phase = 'claimed'",
        &[&exec, &now, &why],
    )?;
    if n == 0 {
        return Err(StoreError::Fenced);
    }
    requeue_envelope(tx, &task, due_at, Some(why), now)?;
    tx.exec("UPDATE envelopes SET send_count = send_count - 1 WHERE task_id = $1", &[&task])?;
    set_task(tx, &task, crate::domain::TaskStatus::Waiting, Some(why), None, now)?;
    event(tx, &task, now, Actor::Worker, "paused", why, Some(exec))?;
    Ok(())
}

impl PgStore {
    /// Claim ready envelopes for free provider slots (ordered commit).
    pub async fn dispatch_due(
        &self,
        now: Millis,
        limit: usize,
        lease_ms: Millis,
        boot: &str,
    ) -> Result<DispatchBatch, StoreError> {
        let (boot, node) = (boot.to_string(), self.node().to_string());
        self.write_ordered(move |tx| {
            let now = tx.now(now)?;
            dispatch_due(tx, now, limit, lease_ms, &node, &boot)
        })
        .await
    }

    /// Write the configured providers (engine start).
    pub async fn configure_providers(&self, list: Vec<ProviderSlots>) -> Result<(), StoreError> {
        self.write(move |tx| configure_providers(tx, &list)).await
    }

    /// Pause dispatching to a provider until `until` (ordered commit).
    pub async fn pause_provider(&self, provider: String, until: Millis) -> Result<(), StoreError> {
        self.write_ordered(move |tx| {
            tx.exec(
                "UPDATE providers SET paused_until = greatest(coalesce(paused_until, 0), $2) WHERE name = $1",
                &[&provider, &until],
            )?;
            Ok(())
        })
        .await
    }

    /// Report a call's outcome during a slow start (ordered commit).
    pub async fn slow_start_feedback(&self, provider: String, ok: bool) -> Result<(), StoreError> {
        self.write_ordered(move |tx| {
            tx.exec(
                "UPDATE providers SET recovery_limit = CASE
                    WHEN $2 AND recovery_limit + 1 >= greatest(1, max_concurrency - reserve) THEN NULL
                    WHEN $2 THEN recovery_limit + 1
                    ELSE greatest(1, recovery_limit / 2) END
                 WHERE name = $1 AND recovery_limit IS NOT NULL",
                &[&provider, &ok],
            )?;
            Ok(())
        })
        .await
    }

    /// Hand a claim back before anything was sent (its provider's circuit is open).
    pub async fn release_claim(
        &self,
        exec: String,
        lease: String,
        due_at: Millis,
        why: String,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            release_claim(tx, &exec, &lease, due_at, &why, now)
        })
        .await
    }
}
