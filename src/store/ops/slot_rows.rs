//! PostgreSQL's provider slot rows: the cluster-wide capacity rule without a cluster-wide lock
//! (issue #28). Nothing here runs on SQLite, whose single writer counts the slots in use.
//!
//! **The rule: at most `max_concurrency` envelopes of a provider are `sent` at once, across
//! every node.** Each provider has one `provider_slots` row per slot; a `sent` envelope holds
//! exactly one (`envelope_id`, unique). A dispatch takes free rows `FOR UPDATE SKIP LOCKED`
//! ([`take`]) — rows another node's dispatch is taking are skipped, never waited for, and a
//! row is free again only once the envelope holding it committed leaving `sent` — and claims
//! at most as many envelopes as it got rows, writing which envelope holds which row in the
//! claim's transaction ([`fill`]). So two nodes dispatching at once can never both count the
//! same free slot, and neither waits for the other.
//!
//! Kept by the schema (`schema-pg.sql`, migration 7 → 8), not by each operation that ends a
//! call: the trigger `provider_slots_free` frees the row of an envelope that leaves `sent` (or
//! is deleted) in that very transaction, whichever operation did it (finish, requeue, a
//! hand-back, recovery, a user's cancel); `provider_slots_size` gives a provider
//! `max_concurrency` rows when it is written (engine start) and, for a migrated database, a row
//! to each envelope already `sent` without one. After `max_concurrency` is lowered below the
//! calls already out, there are no free rows, and each finishing call deletes its row until
//! only `max_concurrency` are left (those deletes take the provider's row lock, so two
//! finishing calls do not both see one row too many): the new cap holds from the first
//! dispatch after it, without a wait for the old calls.
//!
//! **A call that may still be out keeps its row until its deadline.** When recovery takes over
//! a `sent` envelope whose run is gone or fenced while its call may be at the provider (phase
//! `calling`), the fenced node lets that call finish (its answer is kept as a late result), so
//! the provider still has it in flight. Before the envelope leaves `sent`, [`hold`] moves its
//! row to a hold, `envelope_id = 'held:<deadline>:<envelope>'`, where the deadline is the
//! provider's request timeout from now (no call can be out longer); the trigger then finds no
//! row of the envelope to free. [`take`] frees holds whose deadline has passed before it takes
//! rows, and [`next_release`] tells the dispatcher when the next one will (one wake-up per hold,
//! no polling). So a fenced node's calls and the other nodes' together stay within the cap.
//!
//! A dispatch that finds the free rows taken by another node's dispatch at that moment claims
//! fewer (or nothing) and does not wait; the other dispatch holds those rows because it has
//! the candidates for them (it takes rows before candidates), and any row it leaves unused is
//! free when it commits. What is left ready then is dispatched at the next wake-up — the next
//! submit, or the next call ending (a freed slot notifies every node) — not by a timer.

use super::dispatch::Candidate;

use crate::domain::Millis;
use crate::store::StoreError;
use crate::store::tx::Tx;

/// Free slot rows of a provider, skipping rows other dispatches are taking (`?1` the provider,
/// `?2` how many at most).
const TAKE: &str = "SELECT slot FROM provider_slots WHERE provider = ?1 AND envelope_id IS NULL
 ORDER BY slot LIMIT ?2 FOR UPDATE SKIP LOCKED";

/// Record which envelope holds which of the rows taken (`?1` the provider, `?2` a JSON array
/// of envelope ids, `?3` a JSON array of slots, paired by position).
const FILL: &str = "UPDATE provider_slots s SET envelope_id = x.e
 FROM (SELECT e.value AS e, CAST(k.value AS bigint) AS slot
       FROM jsonb_array_elements_text(CAST(CAST(?2 AS TEXT) AS jsonb)) WITH ORDINALITY e(value, i)
       JOIN jsonb_array_elements_text(CAST(CAST(?3 AS TEXT) AS jsonb)) WITH ORDINALITY k(value, i) ON k.i = e.i) x
 WHERE s.provider = ?1 AND s.slot = x.slot AND s.envelope_id IS NULL";

/// Free every hold whose deadline has passed (`?1` now); rows another dispatch is freeing or
/// taking are skipped.
const RELEASE: &str = "UPDATE provider_slots SET envelope_id = NULL
 WHERE (provider, slot) IN (
   SELECT provider, slot FROM provider_slots WHERE envelope_id LIKE 'held:%'
     AND CAST(split_part(envelope_id, ':', 2) AS bigint) <= ?1
   FOR UPDATE SKIP LOCKED)";

/// Free the holds whose deadline has passed by `now` (every provider's; at the start of each
/// dispatch). Nothing under SQLite.
pub(super) fn release_ended(tx: &mut dyn Tx, now: Millis) -> Result<(), StoreError> {
    if tx.locking() {
        tx.exec(RELEASE, &[&now])?;
    }
    Ok(())
}

/// Keep the slot row of `envelope` (about to leave `sent` while its call may be out) taken
/// until `until` (see the module docs). Nothing under SQLite, whose writer counts `sent`
/// envelopes (one process: its own workers' calls end with it).
pub(super) fn hold(tx: &mut dyn Tx, envelope: &str, until: Millis) -> Result<(), StoreError> {
    if !tx.locking() {
        return Ok(());
    }
    tx.exec(
        "UPDATE provider_slots SET envelope_id = 'held:' || CAST(CAST(?2 AS bigint) AS text) || ':' || envelope_id WHERE envelope_id = ?1",
        &[&envelope, &until],
    )?;
    Ok(())
}

/// When the next hold after `now` ends, if any is held (the dispatcher's next wake-up).
/// `None` on SQLite.
pub(super) fn next_release(tx: &mut dyn Tx, now: Millis) -> Result<Option<Millis>, StoreError> {
    if !tx.locking() {
        return Ok(None);
    }
    let row = tx.one(
        "SELECT min(CAST(split_part(envelope_id, ':', 2) AS bigint)) FROM provider_slots
         WHERE envelope_id LIKE 'held:%' AND CAST(split_part(envelope_id, ':', 2) AS bigint) > ?1",
        &[&now],
    )?;
    row.get(0)
}

/// Take up to `n` free slot rows of `provider` for this dispatch (locked to its end; rows other
/// dispatches hold are skipped). Under SQLite's single writer there are no slot rows: the
/// `n` the counts allowed is taken as it is (`None`).
pub(super) fn take(tx: &mut dyn Tx, provider: &str, n: i64) -> Result<Option<Vec<i64>>, StoreError> {
    if !tx.locking() || n <= 0 {
        return Ok(None);
    }
    let rows = tx.rows(TAKE, &[&provider, &n])?;
    Ok(Some(rows.iter().map(|r| r.get::<i64>(0)).collect::<Result<_, _>>()?))
}

/// Give each chosen envelope one of the rows [`take`] returned (as many rows as envelopes at
/// least, by construction). Nothing under SQLite.
pub(super) fn fill(
    tx: &mut dyn Tx,
    provider: &str,
    slots: Option<&[i64]>,
    chosen: &[Candidate],
) -> Result<(), StoreError> {
    let Some(slots) = slots else { return Ok(()) };
    if chosen.is_empty() {
        return Ok(());
    }
    if chosen.len() > slots.len() {
        return Err(StoreError::Fatal(format!(
            "a dispatch chose {} envelopes of {provider} for {} free slots",
            chosen.len(),
            slots.len()
        )));
    }
    let envelopes = serde_json::to_string(&chosen.iter().map(|c| c.id.as_str()).collect::<Vec<_>>())
        .map_err(|e| StoreError::Fatal(e.to_string()))?;
    let rows = serde_json::to_string(&slots[..chosen.len()]).map_err(|e| StoreError::Fatal(e.to_string()))?;
    let n = tx.exec(FILL, &[&provider, &envelopes, &rows])?;
    if n as usize != chosen.len() {
        return Err(StoreError::Fatal(format!(
            "{n} of {} slot rows of {provider} taken by a dispatch were recorded",
            chosen.len()
        )));
    }
    Ok(())
}
