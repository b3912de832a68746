//! What the engine does only when it is one node of several on PostgreSQL (nothing at all on
//! SQLite):
//!
//! - **The bridge** turns other nodes' hints into this engine's wake-ups: an envelope became
//!   due (or a provider slot freed) → the dispatcher looks; an envelope was handed out
//!   somewhere → the reconciler re-reads its next deadline; a peer's lock freed → the
//!   reconciler runs now (that peer's leases are leftovers at once); a task changed on another
//!   node → subscribers (the web page's event stream) hear of it. Hints carry no data: each
//!   only makes a service re-read the database. In poll mode (`postgres_wakeups = "poll"`)
//!   a timer stands in for the hints, and idle nodes then run SQL on every tick.
//! - **The guard** is the self-fence. When this node's lock connection ends (or its liveness
//!   check goes unanswered: `store::postgres::node`), another node may recover this node's work at
//!   once; so before anything else the guard counts a fence (`Shared::fences`) and stops every
//!   service: nothing is claimed or reconciled by this node until it holds its lock again.
//!   Workers are not aborted: a worker whose call already left lets it finish, because the
//!   provider makes and charges the image either way, and lands its answer through the fenced
//!   finish — or, when a peer's recovery already marked the task `unknown`, through the late
//!   result of the same execution, exactly as a node paused past its lease does. A fenced
//!   worker starts no new paid call: it hands its claim back before recording `calling`, and
//!   stops before any replay. Every write it still makes (heartbeats included) is fenced on
//!   its execution token and lease in the transaction, so it lands only while nobody took the
//!   task over. Then the guard takes the lock again, starts a new run (a new boot id, so this
//!   node's own earlier leases count as expired — except those of workers still running here
//!   whose leases have not run out: `Shared::live`), recovers, and restarts the services. A
//!   request already sent is covered by its durable `calling` record, exactly as after a
//!   crash.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::{Shared, TaskChange, reconciler, spawn_services};
use crate::domain::TaskStatus;
use crate::store::postgres::NodeState;

/// Start the bridge when the store is PostgreSQL.
pub(super) fn bridge(shared: &Arc<Shared>) -> Option<JoinHandle<()>> {
    let pg = shared.store.postgres()?.clone();
    let signals = pg.signals().clone();
    let (tx, mut tasks) = tokio::sync::broadcast::channel::<(String, String)>(1024);
    *signals.tasks.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    let poll = pg.poll_interval();
    let shared = shared.clone();
    Some(tokio::spawn(async move {
        let mut tick = poll.map(tokio::time::interval);
        /// The poll timer's next tick, or never without one.
        async fn next_tick(t: &mut Option<tokio::time::Interval>) {
            match t {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending().await,
            }
        }
        loop {
            tokio::select! {
                _ = signals.due.notified() => shared.wake_dispatcher.notify_one(),
                _ = signals.lease.notified() => shared.wake_reconciler.notify_one(),
                _ = signals.peer_gone.notified() => {
                    shared.force_reconcile.store(true, std::sync::atomic::Ordering::Relaxed);
                    shared.wake_reconciler.notify_one();
                }
                change = tasks.recv() => match change {
                    Ok((task, status)) => {
                        if let Some(status) = TaskStatus::parse(&status)
                            && shared.changes.receiver_count() > 0
                        {
                            let _ = shared.changes.send(TaskChange { task_id: task, status });
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                _ = next_tick(&mut tick) => {
                    shared.wake_dispatcher.notify_one();
                    shared.wake_reconciler.notify_one();
                }
            }
        }
    }))
}

/// Start the guard when the store is PostgreSQL.
pub(super) fn guard(shared: &Arc<Shared>, services: &Arc<Mutex<Vec<JoinHandle<()>>>>) -> Option<JoinHandle<()>> {
    let pg = shared.store.postgres()?.clone();
    let (shared, services) = (shared.clone(), services.clone());
    Some(tokio::spawn(async move {
        loop {
            let Some(mut state) = pg.node_state() else { return };
            let lost =
                state.wait_for(|s| matches!(s, NodeState::Lost(_) | NodeState::Released)).await.map(|s| s.clone());
            if !matches!(lost, Ok(NodeState::Lost(_))) || shared.stopping() {
                return;
            }
            // First: no worker of a claim made before now starts a paid call from here on.
            shared.fences.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tracing::error!(
                node = %pg.node(),
                "lost the node lock (self-fence): claiming nothing and starting no new call; calls already sent finish and land fenced"
            );
            for h in services.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                h.abort();
            }
            loop {
                if shared.stopping() {
                    return;
                }
                let p = pg.clone();
                match tokio::task::spawn_blocking(move || p.relock()).await {
                    Ok(Ok(())) => break,
                    Ok(Err(e)) => tracing::warn!(error = %e, "cannot take the node lock again yet"),
                    Err(e) => tracing::warn!(error = %e, "relock task failed"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            *shared.boot.lock().unwrap_or_else(|e| e.into_inner()) = uuid::Uuid::new_v4().to_string();
            if let Err(e) = reconciler::run_once(&shared).await {
                tracing::error!(error = %e, "recovery after the self-fence failed; the reconciler retries");
            }
            *services.lock().unwrap_or_else(|e| e.into_inner()) = spawn_services(&shared);
            tracing::info!(node = %pg.node(), "took the node lock again; running under a new boot");
        }
    }))
}
