//! The dispatcher: claims ready envelopes for free provider slots and hands each claim to a
//! free worker.
//!
//! Who goes next is decided by the store (`Store::dispatch_due`: free slots per provider,
//! lanes, fairness keys, reserve, slow start), which claims — lease and execution — in the same
//! committed transaction *before* the dispatcher spawns a worker for it, and never more than
//! there are free workers (their permits held across the dispatch, so a submit's fast path,
//! `intake`, which also takes a worker, never takes one counted on). It sleeps until the earliest due time (or the end of a provider's
//! pause) or until woken (a submit, a finished worker, a rescheduled envelope); it never polls
//! on a fixed interval, so an idle engine does no database work. A failing database makes it
//! wait and try again (`trouble`), never exit while the daemon serves.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::trouble::{Next, Trouble};
use super::{Shared, worker};
use crate::clock::sleep_until;
use crate::domain::Millis;

/// Run until shutdown.
pub(super) async fn run(shared: Arc<Shared>) {
    let mut stop = shared.shutdown.subscribe();
    let mut trouble = Trouble::new("dispatcher");
    loop {
        if shared.stopping() {
            return;
        }
        let free = shared.workers.available_permits();
        let mut next_due: Option<Millis> = None;
        // The free workers' permits are held from before the dispatch until its claims are
        // handed out: a submit's fast path (`intake`) takes a permit too, and must never take
        // one a claim of this dispatch was counted on. The ones no claim used go back below.
        let held = match shared.workers.clone().try_acquire_many_owned(free as u32) {
            Ok(p) if free > 0 => Some(p),
            Ok(_) => None,
            // A fast path took one since `free` was read: count again.
            Err(tokio::sync::TryAcquireError::NoPermits) => continue,
            Err(tokio::sync::TryAcquireError::Closed) => return,
        };
        if let Some(mut held) = held {
            let now = shared.now();
            let lease = Shared::ms(shared.cfg.lease);
            // Read before claiming: a fence after this point fences these claims' workers.
            let fence = shared.fence();
            let timed = crate::stages::start();
            let dispatched = shared.store.dispatch_due(now, free, lease, &shared.boot()).await;
            crate::stages::record(crate::stages::Stage::Dispatch, timed);
            match dispatched {
                Ok(batch) => {
                    trouble.ok();
                    if !batch.claims.is_empty() {
                        crate::failpoint::crash("after-sent");
                        // The reconciler must watch these leases' deadlines.
                        if shared.reconciler_at.load(Ordering::Relaxed) > now + lease {
                            shared.wake_reconciler.notify_one();
                        }
                    }
                    let full = batch.claims.len() == free;
                    for claim in batch.claims {
                        shared.metrics.dispatched((now - claim.due_at).max(0) as f64 / 1000.0);
                        shared.changed(&claim.task_id, crate::domain::TaskStatus::Running);
                        match held.split(1) {
                            Some(permit) => worker::spawn(shared.clone(), claim, permit, fence),
                            // A permit was held for each claim the dispatch could make; if
                            // not, the reconciler recovers the claim (nothing was sent).
                            None => break,
                        }
                    }
                    if full {
                        // More may be due: look again as soon as a worker is free.
                        continue;
                    }
                    next_due = batch.next_due;
                }
                Err(e) => {
                    // No claims: the free workers' permits go back before the wait.
                    drop(held);
                    match trouble.failed(&shared, &e) {
                        Next::Stop => return,
                        Next::Wait(wait) => {
                            // Woken early by a submit (the database took a write, so it may
                            // work again) or the stop.
                            tokio::select! {
                                _ = tokio::time::sleep(wait) => {}
                                _ = shared.wake_dispatcher.notified() => {}
                                _ = stop.changed() => {}
                            }
                            continue;
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = shared.wake_dispatcher.notified() => {}
            _ = sleep_until(shared.clock.as_ref(), next_due.unwrap_or(Millis::MAX)), if next_due.is_some() => {}
            _ = stop.changed() => {}
        }
    }
}
