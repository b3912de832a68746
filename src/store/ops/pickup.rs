//! One commit to pickup (issue #28): a submit that, when its provider has a free slot and the
//! fair order would pick its task first anyway, also claims the task and records `calling` in
//! the submit's own transaction, so the request leaves after one durable commit instead of
//! three writer round trips (submit, dispatch, `calling`). Otherwise the plain submit, unchanged.
//!
//! Written once over [`Tx`] from the pieces the normal path uses, in the order it uses them:
//! `intake::submit` (the outbox write), `dispatch::dispatch_only` (the dispatcher's decision
//! and slot for this one envelope — on PostgreSQL the slot row taken `FOR UPDATE SKIP LOCKED`
//! as `slot_rows::take` does, so the provider's cap holds across nodes), `claim::claim_picked`
//! (lease and execution token, the task `running`), and `exec::record_calling` (`calling` with
//! its budget check, fenced on both tokens). The engine decides beforehand what only it can
//! know (an idle worker, the circuit closed, the key present, the adapter's preflight passing
//! without a network call; `engine::intake`).
//!
//! **What a crash leaves.** The whole operation commits at once (a durable commit), so a crash
//! leaves either nothing (the client's retry with its key submits again) or the task in
//! `calling` with nothing sent — also when the crash comes right after the submit was
//! answered. Recovery treats it like any crash after `calling` (DESIGN §6): replayed with the
//! same idempotency key where the provider honours one, looked up where it can be found,
//! otherwise `unknown`, never sent blindly again. This is the price of the fast path: on the
//! normal path such a crash leaves a queued task that simply runs after the restart.

use super::claim::{self, Lease};
use super::{CallingOutcome, NewTask, PickedUp, Pickup, SubmitOutcome, dispatch, exec, intake};
use crate::domain::{Millis, Phase};
use crate::store::StoreError;
use crate::store::tx::Tx;

/// Submit `t`; then, if the fast path applies (see the module docs), claim it and record
/// `calling` in the same transaction.
pub(in crate::store) fn submit_and_pick_up(
    tx: &mut dyn Tx,
    t: &NewTask,
    now: Millis,
    p: &Pickup,
) -> Result<(SubmitOutcome, PickedUp), StoreError> {
    let out = intake::submit(tx, t, now)?;
    // A shot of a set waits for its set's turn and carries reference images: normal path.
    let SubmitOutcome::Created(task) = &out else { return Ok((out, PickedUp::No)) };
    if t.shot.is_some() {
        return Ok((out, PickedUp::No));
    }
    let Some(picked) = dispatch::dispatch_only(tx, &t.provider, task, now)? else {
        return Ok((out, PickedUp::No));
    };
    let lease = Lease { ms: p.lease_ms, boot: &p.boot, node: p.node.as_deref() };
    let mut claim = claim::claim_picked(tx, &[picked], &[], now, &lease)?
        .pop()
        .ok_or_else(|| StoreError::Invalid(format!("the fast path's claim of task {task} read back nothing")))?;
    match exec::record_calling(tx, &claim.execution_token, &claim.lease_token, now, &p.facts)? {
        CallingOutcome::Calling => {
            claim.phase = Phase::Calling;
            claim.calling_at = Some(now);
            Ok((out, PickedUp::Calling(Box::new(claim))))
        }
        CallingOutcome::Held { due_at, reason } => Ok((out, PickedUp::Held { due_at, reason })),
    }
}
