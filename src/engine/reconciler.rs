//! The reconciler: acts on sent envelopes whose deadline passed (DESIGN §6), from evidence
//! only. It runs at start-up — where every lease of an earlier run of the process counts as
//! expired at once, because the data-directory lock proves that run is gone — and then sleeps
//! until the next deadline can pass, or until the dispatcher wakes it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::trouble::{Next, Trouble};
use super::{EngineError, Shared};
use crate::clock::sleep_until;
use crate::domain::{Decision, Leftover, Millis, decide};
use crate::store::{LeftoverRow, Recovery, StoreError};

/// Run until shutdown. Each round reads the earliest deadline (one read statement); only
/// when it has passed does a reconciliation pass run through the writer.
pub(super) async fn run(shared: Arc<Shared>) {
    let mut stop = shared.shutdown.subscribe();
    let mut trouble = Trouble::new("reconciler");
    loop {
        if shared.stopping() {
            return;
        }
        let result = match shared.store.next_sent_deadline().await {
            Ok(next)
                if next.is_some_and(|t| t <= shared.now()) || shared.force_reconcile.swap(false, Ordering::Relaxed) =>
            {
                run_once(&shared).await.map(|_| None)
            }
            Ok(next) => Ok(Some(next)),
            Err(e) => Err(e.into()),
        };
        let next = match result {
            Ok(Some(next)) => {
                trouble.ok();
                next
            }
            // Reconciled: look again at once (more may be due).
            Ok(None) => {
                trouble.ok();
                continue;
            }
            Err(e) => {
                let e = match e {
                    EngineError::Store(e) => e,
                    EngineError::Invalid(m) => StoreError::Invalid(m),
                };
                match trouble.failed(&shared, &e) {
                    Next::Stop => return,
                    Next::Wait(wait) => {
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = stop.changed() => return,
                        }
                        continue;
                    }
                }
            }
        };
        shared.reconciler_at.store(next.unwrap_or(Millis::MAX), Ordering::Relaxed);
        tokio::select! {
            _ = shared.wake_reconciler.notified() => {}
            _ = sleep_until(shared.clock.as_ref(), next.unwrap_or(Millis::MAX)), if next.is_some() => {}
            _ = stop.changed() => return,
        }
    }
}

/// One pass: find leftovers, decide each from evidence, apply the decisions fenced.
pub(super) async fn run_once(shared: &Arc<Shared>) -> Result<usize, EngineError> {
    let now = shared.now();
    let mut rows = shared.store.leftovers(now, &shared.boot()).await?;
    // After a self-fence (PostgreSQL), this node's earlier run counts as gone; but its
    // workers that still run here are not interrupted: while their leases run, they finish
    // (fenced) themselves. Everything else of that run — and any lease that ran out — is
    // recovered as usual (a later answer still lands as a late result).
    {
        let live = shared.live.lock().unwrap_or_else(|e| e.into_inner());
        if !live.is_empty() {
            rows.retain(|r| {
                let running_here = r.execution.as_ref().is_some_and(|(token, _)| live.contains(token));
                !(running_here && r.lease_expires_at.is_some_and(|t| t > now))
            });
        }
    }
    if rows.is_empty() {
        return Ok(0);
    }
    let items: Vec<_> = rows
        .into_iter()
        .map(|mut row| {
            let decision = decide_row(shared, &row);
            // How long this provider's call may still be out: its slot is held that long.
            row.call_window =
                shared.providers.get(&row.provider).and_then(|p| p.request_timeout()).map(|t| t.as_millis() as Millis);
            (row, decision)
        })
        .collect();
    for (_, d) in &items {
        shared.metrics.recovery(kind(d));
    }
    let applied = shared.store.apply_recovery(items, shared.now()).await?;
    let n = applied.len();
    if n > 0 {
        tracing::info!(leftovers = n, "reconciled leftovers");
    }
    for (task, status) in applied {
        shared.changed(&task, status);
    }
    if n > 0 {
        // Requeued envelopes, and next shots of sets whose shot was settled, are due now.
        shared.wake_dispatcher.notify_one();
    }
    Ok(n)
}

fn decide_row(shared: &Shared, row: &LeftoverRow) -> Recovery {
    let leftover = Leftover::of(row.execution.as_ref().map(|(_, p)| *p), row.send_count as u32);
    let caps = shared.providers.get(&row.provider).map(|p| p.provider.capabilities());
    match decide(&leftover, caps, shared.cfg.max_sends) {
        Decision::Requeue => Recovery::Requeue,
        Decision::GiveUp => Recovery::GiveUp,
        Decision::Abandon => Recovery::Abandon,
        Decision::Resume => Recovery::Resume,
        Decision::Unknown => Recovery::Unknown,
    }
}

fn kind(r: &Recovery) -> &'static str {
    match r {
        Recovery::Requeue => "requeue",
        Recovery::GiveUp => "give_up",
        Recovery::Abandon => "abandon",
        Recovery::Resume => "resume",
        Recovery::Unknown => "unknown",
    }
}
