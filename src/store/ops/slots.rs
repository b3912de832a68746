//! The providers' side of dispatch: what the dispatcher knows about each provider (written at
//! engine start), the circuit breaker's pause, the slow start after it, and the hand-back of a
//! claim whose provider paused before it could call. See `store::ops::dispatch` for how these
//! shape who goes next. Written once for both backends. On PostgreSQL a dispatch that may change
//! a provider's pause or slow start locks its row first (`ops::dispatch::lock_provider`), so
//! such a change and that dispatch never interleave; writing a provider's `max_concurrency`
//! sizes its `provider_slots` rows (a trigger, `ops::slot_rows`).

use super::common::{PerDialect, event, fence, requeue_envelope, set_task};
use super::dispatch::greatest;
use super::{DispatchOrder, Pause, ProviderSlots};
use crate::domain::{Actor, Millis, TaskStatus};
use crate::store::StoreError;
use crate::store::tx::{Dialect, Tx};

/// Write the configured providers for the dispatcher (at engine start): their slots, reserve,
/// weights and order. Providers that live tasks still name but that are no longer configured
/// stay dispatchable (`configured` false), so that a worker can settle those tasks honestly. A
/// start forgets any pause and slow start (the circuit breaker is per process run).
pub(in crate::store) fn configure_providers(tx: &mut dyn Tx, list: &[ProviderSlots]) -> Result<(), StoreError> {
    tx.exec("UPDATE providers SET configured = false, paused_until = NULL, recovery_limit = NULL", &[])?;
    for p in list {
        tx.exec(
            "INSERT INTO providers (name, max_concurrency, reserve, fresh_weight, recovery_weight, fifo, configured)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, true)
             ON CONFLICT (name) DO UPDATE SET max_concurrency = excluded.max_concurrency, reserve = excluded.reserve,
                fresh_weight = excluded.fresh_weight, recovery_weight = excluded.recovery_weight,
                fifo = excluded.fifo, configured = true",
            &[
                &p.name,
                &(p.max_concurrency.max(1) as i64),
                &(p.reserve as i64),
                &i64::from(p.fresh_weight.max(1)),
                &i64::from(p.recovery_weight.max(1)),
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

static PAUSE: PerDialect = PerDialect::new(pause_sql);

fn pause_sql(d: Dialect) -> String {
    // SET reads the row as it was: the reason, start and words follow whichever pause ends later.
    format!(
        "UPDATE providers SET paused_reason = CASE WHEN ?2 >= coalesce(paused_until, 0) THEN ?3 ELSE paused_reason END,
                              paused_at = CASE WHEN ?2 >= coalesce(paused_until, 0) THEN ?4 ELSE paused_at END,
                              paused_why = CASE WHEN ?2 >= coalesce(paused_until, 0) THEN ?5 ELSE paused_why END,
                              paused_until = {}(coalesce(paused_until, 0), ?2)
         WHERE name = ?1",
        greatest(d)
    )
}

/// The circuit breaker opened, or the provider asked tally to wait (`reason`): dispatch
/// nothing to `provider` before `until` (a pause already longer is kept, with its reason).
/// `at` is when the pause began; `why`, for an opened circuit, the last failure in words.
pub(in crate::store) fn pause_provider(tx: &mut dyn Tx, provider: &str, pause: &Pause) -> Result<(), StoreError> {
    let sql = PAUSE.get(tx);
    tx.exec(sql, &[&provider, &pause.until, &pause.reason.as_str(), &pause.at, &pause.why])?;
    Ok(())
}

static SLOW_START: PerDialect = PerDialect::new(slow_start_sql);

fn slow_start_sql(d: Dialect) -> String {
    format!(
        "UPDATE providers SET recovery_limit = CASE
            WHEN ?2 AND recovery_limit + 1 >= {g}(1, max_concurrency - reserve) THEN NULL
            WHEN ?2 THEN recovery_limit + 1
            ELSE {g}(1, recovery_limit / 2) END
         WHERE name = ?1 AND recovery_limit IS NOT NULL",
        g = greatest(d)
    )
}

/// A call's outcome during a slow start: a success lets the recovery lane hold one more slot
/// (ending the slow start once it reaches its cap); an overload answer (429, 5xx) halves it.
pub(in crate::store) fn slow_start_feedback(tx: &mut dyn Tx, provider: &str, ok: bool) -> Result<(), StoreError> {
    let sql = SLOW_START.get(tx);
    tx.exec(sql, &[&provider, &ok])?;
    Ok(())
}

/// A claim that must not call now (its provider's circuit opened after the dispatch): hand it
/// back before anything was sent, fenced on both tokens. The execution is abandoned (no
/// attempt counted), the envelope waits in the recovery lane until `due_at`, and the dispatch
/// is not counted as a lost one (`send_count` − 1).
pub(in crate::store) fn release_claim(
    tx: &mut dyn Tx,
    exec: &str,
    lease: &str,
    due_at: Millis,
    why: &str,
    now: Millis,
) -> Result<(), StoreError> {
    let task = fence(tx, exec, lease, now)?;
    let n = tx.exec(
        "UPDATE executions SET status = 'abandoned', finished_at = ?2, error = ?3
         WHERE token = ?1 AND status = 'running' AND phase = 'claimed'",
        &[&exec, &now, &why],
    )?;
    if n == 0 {
        // A call already under way is not handed back; the fence's write is undone with the
        // rest of this operation.
        return Err(StoreError::Fenced);
    }
    requeue_envelope(tx, &task, due_at, Some(why), now)?;
    tx.exec("UPDATE envelopes SET send_count = send_count - 1 WHERE task_id = ?1", &[&task])?;
    set_task(tx, &task, TaskStatus::Waiting, Some(why), None, now)?;
    event(tx, &task, now, Actor::Worker, "paused", why, Some(exec))?;
    Ok(())
}
