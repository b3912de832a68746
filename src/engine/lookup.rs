//! Held jobs looked up at their provider (issue #24): an older copy of the database holds what
//! it would send again (`store::held`), and where the provider can show the requests it got,
//! this decides from what it shows instead of asking the owner.
//!
//! It runs once when the engine starts (after start-up recovery, beside the services) and on
//! [`Engine::look_up_held`]. For each held job it asks the adapter ([`Provider::find_held`]) —
//! a network call, with no transaction open — and then applies one decision through
//! `Store::settle_held`, which re-checks in its own transaction that the job is still held as
//! it was read:
//!
//! - **exactly one request of the job found**: it becomes the job's execution in phase
//!   `accepted`; recovery hands it to a worker that polls it, so a success stores its image
//!   with the provider's record as charge evidence, and a failure at the provider fails the
//!   job with that evidence (a retry is the owner's, as for any failure). Nothing is sent.
//! - **found, but a task of another shot of its image set is live** (a set's shots go one
//!   after another; the candidates of one shot run together): it
//!   stays held, saying so, and the start-up look runs again each time a job settles, until
//!   no found shot waits;
//! - **anything else** — several found, none found, a provider that cannot be searched, a look
//!   that failed — the job stays held and its reason says what the look found, naming the
//!   provider. Even a listing that proves no request arrived does not release the job by
//!   itself: it proves the past only, and the daemon the copy came from may still run and send
//!   the job later (a copy served in another directory), which tally cannot see. The owner
//!   decides, told what the provider showed.
//!
//! Which adapters can look is each adapter's own answer (`Provider::find_held`, in
//! `providers::kinds`): those whose listing shows a mark derived from the job's attempt keys
//! (a seed, a batch's display name) can; the others answer why not (a request id learnt only
//! after `calling`, a listing without prompts, no listing at all), and the job's reason says
//! it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Engine, EngineError, ProviderEntry, Shared};
use crate::domain::TaskStatus;
use crate::domain::words::say_with;
use crate::providers::{CallRequest, HeldLookup, HeldQuery};
use crate::store::TaskView;
use crate::store::held::{HeldLook, HeldSettle, Settled};

/// The most held jobs one look takes (the rest wait for the next).
const MAX_JOBS: usize = 500;

/// How long one job's look at its provider may take.
const LOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// How many attempts beyond those recorded a request sent since the copy can be: the engine's
/// `max_attempts` plus this margin.
const ATTEMPTS_MARGIN: i64 = 3;

/// What one look did, in counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LookReport {
    /// Held jobs looked at.
    pub looked: usize,
    /// Found at the provider: their result is fetched, nothing is sent.
    pub found: usize,
    /// Still held, their reason saying what the look found (those waiting for another shot of
    /// their set included).
    pub kept: usize,
    /// Found, but waiting until no other shot of their set is live.
    pub set_busy: usize,
}

/// The start-up look: log what it did, and a failure (the jobs stay held either way). While a
/// found shot waits for another shot of its set, it looks again each time a job settles.
pub(super) async fn run(shared: Arc<Shared>) {
    let mut changes = shared.changes.subscribe();
    loop {
        let r = match look_up(&shared).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "looking held jobs up failed; they stay held");
                return;
            }
        };
        if r.looked > 0 {
            tracing::info!(looked = r.looked, found = r.found, kept = r.kept, "held jobs looked up at their providers");
        }
        if r.set_busy == 0 {
            return;
        }
        // A found shot waits for its set: look again once some job has settled.
        loop {
            if shared.stopping() {
                return;
            }
            match changes.recv().await {
                Ok(c) if c.status.is_settled() => break,
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

/// Look every held job up (at most [`MAX_JOBS`]) and apply what each look proves.
pub(super) async fn look_up(shared: &Shared) -> Result<LookReport, EngineError> {
    let (_, held) = shared.store.held_tasks(MAX_JOBS).await?;
    let mut report = LookReport::default();
    for t in held {
        if shared.stopping() {
            break;
        }
        let Some(h) = &t.held else { continue };
        let settle = match shared.providers.get(&t.provider) {
            Some(entry) => decide(shared, &entry, &t).await,
            None => HeldSettle::Keep { found: say_with("say.look_not_configured", &[("provider", &t.provider)]) },
        };
        report.looked += 1;
        let look = HeldLook { task: t.id.clone(), since: h.since, attempts: t.attempts, settle };
        match shared.store.settle_held(look, shared.now()).await? {
            Settled::Adopted => {
                report.found += 1;
                shared.changed(&t.id, TaskStatus::Running);
                // Recovery takes the adopted execution over at once (its lease has run out).
                shared.force_reconcile.store(true, Ordering::Relaxed);
                shared.wake_reconciler.notify_one();
            }
            Settled::Kept => {
                report.kept += 1;
                shared.changed(&t.id, TaskStatus::Waiting);
            }
            Settled::SetBusy => {
                report.set_busy += 1;
                report.kept += 1;
                let found = "it was found at the provider, sent by the daemon this copy came from; another shot of \
                             its image set is being fetched first (a set goes one shot after another), then tally \
                             fetches this one."
                    .to_string();
                let keep = HeldLook {
                    task: t.id.clone(),
                    since: h.since,
                    attempts: t.attempts,
                    settle: HeldSettle::Keep { found },
                };
                shared.store.settle_held(keep, shared.now()).await?;
                shared.changed(&t.id, TaskStatus::Waiting);
            }
            Settled::Changed => {}
        }
    }
    Ok(report)
}

/// Ask `entry`'s adapter about held job `t`, and turn the answer into a decision.
async fn decide(shared: &Shared, entry: &ProviderEntry, t: &TaskView) -> HeldSettle {
    let first = t.attempts + 1;
    let last = t.attempts + shared.cfg.max_attempts as i64 + ATTEMPTS_MARGIN;
    let keys: Vec<String> = (first..=last).map(|k| crate::store::provider_key(&t.id, k)).collect();
    let now = shared.now();
    let q = HeldQuery {
        request: CallRequest {
            task_id: t.id.clone(),
            prompt: t.prompt.clone(),
            params: t.params.clone(),
            idempotency_key: crate::store::provider_key(&t.id, first),
            references: Vec::new(),
            calling_at_ms: now,
            candidate: t.candidate,
            deadline_ms: now,
            operation: t.operation,
        },
        keys: keys.clone(),
        since_ms: t.created_at,
    };
    let name = &entry.name;
    let keep = |found: String| HeldSettle::Keep { found };
    match tokio::time::timeout(LOOK_TIMEOUT, entry.provider.find_held(&q)).await {
        Err(_) => {
            keep(say_with("say.look_timeout", &[("provider", name), ("secs", &LOOK_TIMEOUT.as_secs().to_string())]))
        }
        Ok(Err(e)) => keep(say_with("say.look_failed", &[("provider", name), ("why", &e.to_string())])),
        Ok(Ok(HeldLookup::Found { job, key })) => match keys.iter().position(|k| *k == key) {
            Some(i) => HeldSettle::Adopt {
                job_id: job.id,
                key,
                attempt: first + i as i64,
                facts: entry.money.facts(&t.params, Vec::new()),
            },
            None => keep(say_with("say.look_untied", &[("provider", name)])),
        },
        Ok(Ok(HeldLookup::Absent(why))) => keep(say_with("say.look_absent", &[("why", &why)])),
        Ok(Ok(HeldLookup::Unsure(why))) => keep(say_with("say.look_unsure", &[("provider", name), ("why", &why)])),
    }
}

impl Engine {
    /// Look every held job up at its provider now (`tally held check`): a job found there is
    /// settled from what the provider shows, nothing is sent; the others stay held with what
    /// the look found (see the module docs). The look runs on a task of its own, so a caller
    /// that stops waiting (an HTTP request that timed out) does not cut it short; each job's
    /// decision is its own transaction either way.
    pub async fn look_up_held(&self) -> Result<LookReport, EngineError> {
        let shared = self.shared.clone();
        match tokio::spawn(async move { look_up(&shared).await }).await {
            Ok(r) => r,
            // Only a panic or the runtime shutting down ends the task early.
            Err(_) => Err(EngineError::Store(crate::store::StoreError::Closed)),
        }
    }
}
