//! The providers' side of dispatch: what the dispatcher knows about each provider (written at
//! engine start), the circuit breaker's pause, the slow start after it, and the hand-back of a
//! claim whose provider paused before it could call. See `store::ops::dispatch` for how these
//! shape who goes next.

use rusqlite::{Connection, OptionalExtension, params};

use super::*;
use crate::domain::{Actor, Millis};

/// Write the configured providers for the dispatcher (at engine start): their slots, reserve,
/// weights and order. Providers that live tasks still name but that are no longer configured
/// stay dispatchable (`configured` 0), so that a worker can settle those tasks honestly. A
/// start forgets any pause and slow start (the circuit breaker is per process run).
pub(in crate::store) fn configure_providers(c: &Connection, list: &[ProviderSlots]) -> Result<(), StoreError> {
    c.prepare_cached("UPDATE providers SET configured = 0, paused_until = NULL, recovery_limit = NULL")?.execute([])?;
    for p in list {
        c.prepare_cached(
            "INSERT INTO providers (name, max_concurrency, reserve, fresh_weight, recovery_weight, fifo, configured)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1)
             ON CONFLICT (name) DO UPDATE SET max_concurrency = excluded.max_concurrency, reserve = excluded.reserve,
                fresh_weight = excluded.fresh_weight, recovery_weight = excluded.recovery_weight,
                fifo = excluded.fifo, configured = 1",
        )?
        .execute(params![
            p.name,
            p.max_concurrency.max(1) as i64,
            p.reserve as i64,
            p.fresh_weight.max(1),
            p.recovery_weight.max(1),
            p.order == DispatchOrder::Fifo
        ])?;
    }
    c.prepare_cached(
        "INSERT INTO providers (name, max_concurrency, configured)
         SELECT DISTINCT provider, 16, 0 FROM envelopes WHERE status IN ('pending', 'sent')
         ON CONFLICT (name) DO NOTHING",
    )?
    .execute([])?;
    Ok(())
}

/// The circuit breaker opened: dispatch nothing to `provider` before `until`.
pub(in crate::store) fn pause_provider(c: &Connection, provider: &str, until: Millis) -> Result<(), StoreError> {
    c.prepare_cached("UPDATE providers SET paused_until = max(coalesce(paused_until, 0), ?2) WHERE name = ?1")?
        .execute(params![provider, until])?;
    Ok(())
}

/// A call's outcome during a slow start: a success lets the recovery lane hold one more slot
/// (ending the slow start once it reaches its cap); an overload answer (429, 5xx) halves it.
pub(in crate::store) fn slow_start_feedback(c: &Connection, provider: &str, ok: bool) -> Result<(), StoreError> {
    c.prepare_cached(
        "UPDATE providers SET recovery_limit = CASE
            WHEN ?2 AND recovery_limit + 1 >= max(1, max_concurrency - reserve) THEN NULL
            WHEN ?2 THEN recovery_limit + 1
            ELSE max(1, recovery_limit / 2) END
         WHERE name = ?1 AND recovery_limit IS NOT NULL",
    )?
    .execute(params![provider, ok])?;
    Ok(())
}

/// A claim that must not call now (its provider's circuit opened after the dispatch): hand it
/// back before anything was sent, fenced on both tokens. The execution is abandoned (no
/// attempt counted), the envelope waits in the recovery lane until `due_at`, and the dispatch
/// is not counted as a lost one (`send_count` − 1).
pub(in crate::store) fn release_claim(
    c: &Connection,
    exec: &str,
    lease: &str,
    due_at: Millis,
    why: &str,
    now: Millis,
) -> Result<(), StoreError> {
    let task: String = c
        .prepare_cached(
            "UPDATE executions SET status = 'abandoned', finished_at = ?3, error = ?4
             WHERE token = ?1 AND status = 'running' AND phase = 'claimed'
               AND EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = executions.task_id
                           AND e.status = 'sent' AND e.lease_token = ?2)
             RETURNING task_id",
        )?
        .query_row(params![exec, lease, now, why], |r| r.get(0))
        .optional()?
        .ok_or(StoreError::Fenced)?;
    requeue_envelope(c, &task, due_at, Some(why), now)?;
    c.prepare_cached("UPDATE envelopes SET send_count = send_count - 1 WHERE task_id = ?1")?.execute([&task])?;
    set_task(c, &task, crate::domain::TaskStatus::Waiting, Some(why), None, now)?;
    event(c, &task, now, Actor::Worker, "paused", why, Some(exec))?;
    Ok(())
}

impl SqliteStore {
    /// Write the configured providers (engine start).
    pub async fn configure_providers(&self, list: Vec<ProviderSlots>) -> Result<(), StoreError> {
        self.write(move |c| configure_providers(c, &list)).await
    }

    /// Pause dispatching to a provider until `until` (its circuit opened). Ordered: if a power
    /// loss erases it, the provider is simply not paused.
    pub async fn pause_provider(&self, provider: String, until: Millis) -> Result<(), StoreError> {
        self.write_ordered(move |c| pause_provider(c, &provider, until)).await
    }

    /// Report a call's outcome while the provider's recovery lane is in its slow start.
    pub async fn slow_start_feedback(&self, provider: String, ok: bool) -> Result<(), StoreError> {
        self.write_ordered(move |c| slow_start_feedback(c, &provider, ok)).await
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
        self.write(move |c| release_claim(c, &exec, &lease, due_at, &why, now)).await
    }
}
