//! A worker: runs one claim from the dispatcher to a settled (or rescheduled) task.
//!
//! The order is the protocol (DESIGN §3): the dispatcher's claim (lease + execution token, for
//! a free provider slot) → the local checks (references readable, the adapter's preflight) →
//! durably record `calling` → call the provider outside any transaction while heartbeating →
//! persist a job id the moment it arrives → verify the image (type and sha256, before the
//! writer sees it) → finish in one transaction fenced on both tokens, which also stores the
//! image's bytes. After an ambiguous outcome it calls again only if the provider can prove that
//! is safe (same idempotency key, or lookup by id); otherwise the task becomes `unknown`.
//!
//! Longer than 600 lines on purpose: `Run` is the protocol above, one step per method in the
//! order they happen, and reads best as one file; the helpers around it are small.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::{ProviderEntry, Shared};
use crate::domain::operation::{ResultKind, png_has_alpha};
use crate::domain::words::{say, say_with};
use crate::domain::{Charge, FailureKind, Millis, Phase, backoff};
use crate::failpoint::crash;
use crate::providers::{CallError, CallRequest, Image, JobHandle, JobState, LostLookup, Submitted};
use crate::store::{CallingOutcome, Claim, Finish, NewArtifact, NewImage, Severity, StoreError};

/// The wait before storing an image again after the store failed. Short and flat: when the
/// disk has room again the worker should store its image before the reconciler (backing off
/// up to 30 s) decides the lease that ran out meanwhile. If the reconciler still wins, its
/// `unknown` is resolved by the worker's late result of the same execution.
const STORE_RETRY: Duration = Duration::from_millis(250);

/// The longest wait between two looks for a lost create (`Next::LookAgain`).
const LOOK_AGAIN_MAX: Millis = 3_600_000;

/// Run a claim on its own task, holding a worker permit until done.
pub(super) fn spawn(shared: Arc<Shared>, claim: Claim, permit: OwnedSemaphorePermit, fence: u64) {
    spawn_run(shared, claim, permit, fence, false)
}

/// Run a claim a submit's fast path made (`store::ops::pickup`: claimed, `calling` recorded,
/// nothing sent): its request leaves at once, with no further store round trip before it.
pub(super) fn spawn_picked_up(shared: Arc<Shared>, claim: Claim, permit: OwnedSemaphorePermit, fence: u64) {
    spawn_run(shared, claim, permit, fence, true)
}

fn spawn_run(shared: Arc<Shared>, claim: Claim, permit: OwnedSemaphorePermit, fence: u64, picked_up: bool) {
    let mut running = shared.running.lock().unwrap_or_else(|e| e.into_inner());
    // Reap finished workers so the set only holds live ones.
    while running.try_join_next().is_some() {}
    let task_shared = shared.clone();
    let live = Live::new(&shared, &claim.execution_token);
    running.spawn(async move {
        deliver(&task_shared, claim, fence, picked_up).await;
        drop(live);
        drop(permit);
        task_shared.wake_dispatcher.notify_one();
        // The last busy worker is done: the reconciler's timer may be set for a lease that
        // no longer exists; let it re-read the deadlines so an idle engine sleeps untimed.
        // (Counted by the live workers, not the free permits: a dispatch holds those while it
        // runs, `dispatcher`.)
        if task_shared.live.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            task_shared.wake_reconciler.notify_one();
        }
    });
}

async fn deliver(shared: &Arc<Shared>, claim: Claim, fence: u64, picked_up: bool) {
    let now = shared.now();
    let Some(entry) = shared.providers.get(&claim.provider) else {
        return settle_for_missing_provider(shared, claim).await;
    };
    // The dispatcher does not claim for a paused provider; a claim made just before the
    // circuit opened is handed back untouched (nothing sent, no attempt counted).
    if claim.phase == Phase::Claimed
        && let Some(pause) = shared.breaker_open_until(&entry, now)
    {
        let why = crate::store::pause_words(&entry.name, &pause);
        let until = pause.until;
        // Spread the claims handed back so they do not all return at the same instant.
        let until = until + Shared::ms(crate::providers::http::client::jittered(Duration::ZERO, Shared::jitter()));
        let c = &claim;
        match shared.store.release_claim(c.execution_token.clone(), c.lease_token.clone(), until, why, now).await {
            Ok(()) => {
                shared.changed(&c.task_id, crate::domain::TaskStatus::Waiting);
                shared.wake_dispatcher.notify_one();
            }
            Err(e) => tracing::error!(error = %e, "handing a claim back failed"),
        }
        return;
    }
    let span = tracing::info_span!("execution", task = %claim.task_id, execution = %claim.execution_token, attempt = claim.attempt);
    let lost = Arc::new(AtomicBool::new(false));
    // Aborted when this worker ends in any way, including being aborted itself (a kill).
    let _beat = AbortOnDrop(tokio::spawn(heartbeat(
        shared.clone(),
        claim.execution_token.clone(),
        claim.lease_token.clone(),
        lost.clone(),
    )));
    let run = Run { shared, entry: &entry, claim: &claim, lost: &lost, fence, picked_up };
    if let Err(e) = tracing::Instrument::instrument(run.drive(), span).await {
        match e {
            StoreError::Fenced => tracing::info!("lost the lease; stopping without writing"),
            e => {
                tracing::error!(error = %e, "execution stopped on a store error");
                // Only SQLite's own verdict (read-only, corrupt) stops the daemon; a file that
                // could not be saved is not a broken database.
                if e.code().is_some() && e.is_fatal() {
                    shared.give_up(e.to_string());
                }
            }
        }
    }
}

/// A worker's entry in `Shared::live`, removed when the worker ends in any way.
struct Live(Arc<Shared>, String);

impl Live {
    fn new(shared: &Arc<Shared>, token: &str) -> Live {
        shared.live.lock().unwrap_or_else(|e| e.into_inner()).insert(token.to_string());
        Live(shared.clone(), token.to_string())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.live.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.1);
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The task names a provider that is no longer configured: settle it honestly.
async fn settle_for_missing_provider(shared: &Arc<Shared>, c: Claim) {
    let provider = c.provider.clone();
    let finish = if c.phase == Phase::Claimed {
        Finish::Failed {
            kind: FailureKind::Configuration,
            reason: say_with("say.not_configured_unsent", &[("provider", &provider)]),
            charge: Charge::None,
        }
    } else {
        Finish::Unknown { reason: say_with("say.not_configured_unchecked", &[("provider", &provider)]) }
    };
    if let Ok(status) = shared.store.finish(c.execution_token, c.lease_token, finish, shared.now()).await {
        shared.changed(&c.task_id, status);
    }
}

/// Extend the lease every heartbeat interval; on a fenced heartbeat, mark the run lost. The
/// heartbeat is fenced on both tokens: after a self-fence it extends the lease only while
/// nobody took it over, so a call still in flight keeps it while the node holds its lock
/// again.
async fn heartbeat(shared: Arc<Shared>, exec: String, lease: String, lost: Arc<AtomicBool>) {
    let lease_ms = Shared::ms(shared.cfg.lease);
    // Failed heartbeats in a row: the first is logged, the rest only at debug level (a full
    // disk fails every one of them; the reconciler deals with the lease if it runs out).
    let mut failing = 0u32;
    loop {
        tokio::time::sleep(shared.cfg.heartbeat).await;
        match shared.store.heartbeat(exec.clone(), lease.clone(), shared.now(), lease_ms).await {
            Ok(()) => failing = 0,
            Err(StoreError::Fenced) => {
                lost.store(true, Ordering::SeqCst);
                return;
            }
            Err(e) if failing == 0 => {
                failing += 1;
                tracing::warn!(error = %e, "heartbeat failed")
            }
            Err(e) => {
                failing += 1;
                tracing::debug!(error = %e, failing, "heartbeat failed again")
            }
        }
    }
}

/// Where an execution goes next.
enum Next {
    /// The provider answered with an image: save it and finish.
    Image(Image),
    /// The provider accepted a job: persist its handle (if new) and poll it.
    Job(JobHandle),
    /// Settle or reschedule the task.
    Settle(Finish),
    /// A lost create's candidates cannot be told apart yet: the execution stays in `calling`
    /// and its task waits until `due_at` for the next look (never after `until_ms`).
    LookAgain { due_at: Millis, until_ms: Millis, why: String },
    /// The lease was lost or the engine is stopping: write nothing more (what happened so
    /// far is recorded, and recovery resumes from it).
    Stop,
}

/// Why a preflight stopped a claim before anything was sent.
enum Stop {
    /// Settle the task so (a refusal; a preflight that could not reach the provider).
    Finish(Finish),
    /// The provider said "not now": the claim was handed back, due after the wait.
    HandedBack,
}

struct Run<'a> {
    shared: &'a Arc<Shared>,
    entry: &'a ProviderEntry,
    claim: &'a Claim,
    lost: &'a AtomicBool,
    /// `Shared::fences` when the claim was made: a different count means this node fenced
    /// itself since, so this run starts no new call.
    fence: u64,
    /// The claim came from a submit's fast path: `calling` is recorded and nothing was sent.
    picked_up: bool,
}

impl Run<'_> {
    fn now(&self) -> Millis {
        self.shared.now()
    }

    fn request(&self, calling_at: Millis, references: &[Image]) -> CallRequest {
        CallRequest {
            task_id: self.claim.task_id.clone(),
            prompt: self.claim.prompt.clone(),
            params: self.claim.params.clone(),
            idempotency_key: self.claim.idempotency_key.clone(),
            references: references.to_vec(),
            calling_at_ms: calling_at,
            candidate: self.claim.candidate,
            deadline_ms: self.deadline(calling_at),
            operation: self.claim.operation,
        }
    }

    /// Read the images the call sends from the database (before any write or call): for an
    /// `edit` or `cutout`, its source image alone (the first reference: where every adapter
    /// sends the image a model works on); for a generation, its set's reference photos.
    async fn references(&self) -> Result<Vec<Image>, String> {
        if let Some(src) = &self.claim.source {
            let (meta, bytes) = self
                .shared
                .store
                .read_image_bytes(src.id.clone())
                .await
                .map_err(|e| {
                    let why = e.to_string();
                    say_with("say.cannot_read_source", &[("kind", src.kind.as_str()), ("id", &src.id), ("why", &why)])
                })?
                .ok_or_else(|| say_with("say.source_gone", &[("kind", src.kind.as_str()), ("id", &src.id)]))?;
            return Ok(vec![Image { bytes, media_type: meta.media_type }]);
        }
        let mut out = Vec::with_capacity(self.claim.references.len());
        for u in &self.claim.references {
            let (meta, bytes) = self
                .shared
                .store
                .read_image_bytes(u.id.clone())
                .await
                .map_err(|e| say_with("say.cannot_read_reference", &[("id", &u.id), ("why", &e.to_string())]))?
                .ok_or_else(|| say_with("say.reference_gone", &[("id", &u.id)]))?;
            out.push(Image { bytes, media_type: meta.media_type });
        }
        Ok(out)
    }

    async fn finish(&self, f: Finish) -> Result<(), StoreError> {
        let c = self.claim;
        let timed = crate::stages::start();
        let status = self.shared.store.finish(c.execution_token.clone(), c.lease_token.clone(), f, self.now()).await;
        crate::stages::record(crate::stages::Stage::Finish, timed);
        let status = status?;
        tracing::info!(%status, "execution finished");
        self.shared.changed(&c.task_id, status);
        Ok(())
    }

    fn deadline(&self, calling_at: Millis) -> Millis {
        calling_at + Shared::ms(self.shared.cfg.recovery_deadline)
    }

    fn retry_delay(&self, attempt: u32) -> Duration {
        backoff(attempt, self.shared.cfg.backoff_base, self.shared.cfg.backoff_max, Shared::jitter())
    }

    /// Stop if the lease was lost or the engine is stopping (state is recorded; recovery
    /// resumes it).
    fn should_stop(&self) -> bool {
        self.lost.load(Ordering::SeqCst) || self.shared.stopping()
    }

    /// This node fenced itself (lost its node lock) after the claim was made: start no new
    /// call (a first request, or a replay). Polling a job and looking a request up send
    /// nothing that costs, and go on.
    fn fenced(&self) -> bool {
        self.shared.fence() != self.fence
    }

    /// Stop a fenced run without calling: recovery (this node's own once it holds its lock
    /// again, or a peer's) decides from what is recorded, as soon as it runs.
    fn stop_fenced(&self) -> Next {
        tracing::info!("this node fenced itself: no new call for this execution; recovery takes it over");
        self.shared.force_reconcile.store(true, Ordering::Relaxed);
        self.shared.wake_reconciler.notify_one();
        Next::Stop
    }

    async fn drive(self) -> Result<(), StoreError> {
        let c = self.claim;
        let store = &self.shared.store;
        let name = &self.entry.name;
        let mut calling_at = c.calling_at.unwrap_or_else(|| self.now());
        // Polling an accepted job sends nothing, so it needs no references.
        let references = match c.phase {
            Phase::Accepted => Vec::new(),
            _ => match self.references().await {
                Ok(r) => r,
                Err(e) if c.phase == Phase::Claimed => {
                    let reason = say_with("say.preflight_unsent", &[("message", &e.to_string())]);
                    return self
                        .finish(Finish::Failed { kind: FailureKind::NotSent, reason, charge: Charge::None })
                        .await;
                }
                // A resumed call is not failed for this (the first request may have left);
                // lookups need no references.
                Err(_) => Vec::new(),
            },
        };
        let next = match c.phase {
            Phase::Claimed => {
                crash("after-claim");
                if c.cancel_requested {
                    return self.finish(Finish::CanceledBeforeCall).await;
                }
                // Every local check passes before `calling` is recorded: a request that cannot
                // leave must never look as if it may have been charged.
                if let Err(reason) = self.entry.money.preflight(name, &c.params) {
                    let kind = FailureKind::Configuration;
                    return self.finish(Finish::Failed { kind, reason, charge: Charge::None }).await;
                }
                match self.preflight(&references).await? {
                    None => {}
                    Some(Stop::Finish(refused)) => return self.finish(refused).await,
                    Some(Stop::HandedBack) => return Ok(()),
                }
                // The last moment to stop sending: once `calling` is durable the request
                // leaves, and lands fenced whatever happens to this node meanwhile.
                if self.fenced() {
                    let why = say("say.lost_lock");
                    tracing::info!("this node fenced itself before the call: handing the claim back, nothing was sent");
                    let (e, l) = (c.execution_token.clone(), c.lease_token.clone());
                    // Fenced on both tokens: it lands only while the claim is still this one.
                    // If it cannot, recovery requeues the claim (nothing was sent either way).
                    match store.release_claim(e, l, self.now(), why, self.now()).await {
                        Ok(()) => {
                            self.shared.changed(&c.task_id, crate::domain::TaskStatus::Waiting);
                            self.shared.wake_dispatcher.notify_one();
                        }
                        Err(_) => {
                            let _ = self.stop_fenced();
                        }
                    }
                    return Ok(());
                }
                calling_at = self.now();
                let facts = self.entry.money.facts(&c.params, self.shared.limits());
                let timed = crate::stages::start();
                let recorded =
                    store.record_calling(c.execution_token.clone(), c.lease_token.clone(), calling_at, facts).await?;
                crate::stages::record(crate::stages::Stage::Calling, timed);
                if let CallingOutcome::Held { due_at, reason } = recorded {
                    tracing::info!(until = %crate::clock::rfc3339(due_at), "held back by a budget: {}", crate::domain::words::english(&reason));
                    self.shared.changed(&c.task_id, crate::domain::TaskStatus::Waiting);
                    // The dispatcher re-reads the earliest due time (the period's end).
                    self.shared.wake_dispatcher.notify_one();
                    return Ok(());
                }
                crash("after-calling");
                self.call(calling_at, &references).await?
            }
            // A submit's fast path claimed this task and recorded `calling` in its own commit
            // (`store::ops::pickup`); the engine checked everything the claimed arm above
            // checks before that commit. Nothing has left yet.
            Phase::Calling if self.picked_up => {
                if self.fenced() {
                    // `calling` is durable, so recovery decides (as after any crash there).
                    let _ = self.stop_fenced();
                    return Ok(());
                }
                crash("before-pickup-call");
                self.call(calling_at, &references).await?
            }
            Phase::Calling => {
                tracing::info!("resuming an execution whose call may have reached the provider");
                self.recover_call(calling_at, &references, say("say.interrupted_call")).await
            }
            Phase::Accepted => match &c.job_id {
                Some(job) => Next::Job(JobHandle {
                    id: job.clone(),
                    data: c.job_handle.as_deref().and_then(|h| serde_json::from_str(h).ok()),
                }),
                None => Next::Settle(Finish::Unknown { reason: say("say.no_job_id") }),
            },
        };
        let next = match next {
            Next::Job(job) => {
                if c.phase != Phase::Accepted {
                    let handle = job.data.as_ref().map(|d| d.to_string());
                    store
                        .record_accepted_with(
                            c.execution_token.clone(),
                            c.lease_token.clone(),
                            job.id.clone(),
                            handle,
                            self.now(),
                        )
                        .await?;
                    crash("after-accepted");
                }
                self.poll(&job, calling_at).await
            }
            other => other,
        };
        match next {
            Next::Image(img) => self.save_and_finish(img).await,
            Next::Settle(f) => self.finish(f).await,
            Next::LookAgain { due_at, until_ms, why } => self.look_again(due_at, until_ms, why).await,
            Next::Job(_) | Next::Stop => Ok(()),
        }
    }

    /// Hand the execution back to wait for its next look (still `calling`: nothing is sent
    /// again); if the store finds the provider's retention passed meanwhile, `unknown`.
    async fn look_again(&self, due_at: Millis, until_ms: Millis, why: String) -> Result<(), StoreError> {
        let c = self.claim;
        let (exec, lease) = (c.execution_token.clone(), c.lease_token.clone());
        let now = self.now();
        let when = crate::clock::rfc3339(due_at);
        let reason = say_with("say.look_again", &[("why", &why), ("when", &when)]);
        tracing::info!(until = %when, "the lost create cannot be told apart yet; looking again later");
        if self.shared.store.look_again(exec, lease, due_at, until_ms, reason, now).await? {
            self.shared.changed(&c.task_id, crate::domain::TaskStatus::Waiting);
            self.shared.wake_dispatcher.notify_one();
            return Ok(());
        }
        let reason = say_with("say.jobs_not_kept", &[("why", &why)]);
        self.finish(Finish::Unknown { reason }).await
    }

    /// Send the first request of this execution (`calling` is durable) and classify its answer.
    async fn call(&self, calling_at: Millis, references: &[Image]) -> Result<Next, StoreError> {
        let c = self.claim;
        let name = &self.entry.name;
        self.shared.metrics.picked_up((calling_at - c.created_at).max(0) as f64 / 1000.0);
        let timed = crate::stages::start();
        let result = self.entry.provider.submit(&self.request(calling_at, references)).await;
        crate::stages::record(crate::stages::Stage::ProviderCall, timed);
        self.after_call(&result).await;
        Ok(match result {
            Ok(Submitted::Done(img)) => {
                self.shared.metrics.provider_call(name, "answered");
                Next::Image(img)
            }
            Ok(Submitted::Accepted(job)) => {
                self.shared.metrics.provider_call(name, "accepted");
                Next::Job(job)
            }
            Err(e) => {
                self.shared.metrics.provider_call(name, outcome_label(&e));
                self.on_error(e, calling_at, references).await?
            }
        })
    }

    /// After a first call: count it for the circuit breaker (record the pause in the store
    /// when it opens), and during a slow start tell the store how the provider answered.
    async fn after_call(&self, result: &Result<Submitted, CallError>) {
        // The provider's rate-limit headers say a quota is used up: hold its dispatch until the
        // reset, so the next request is not a certain 429.
        if let Some(hold) = self.entry.provider.rate_limit_hold() {
            let until = self.now() + Shared::ms(hold);
            let pause = self.shared.hold_provider(self.entry, until);
            if let Err(e) = self.shared.store.pause_provider(self.entry.name.clone(), pause).await {
                tracing::warn!(error = %e, "recording the provider's rate-limit hold failed");
            }
        }
        // A refusal or a "not now" (paced by its own hold) is not an outage.
        let failure = match result {
            Err(e)
                if !matches!(e, CallError::Rejected { .. } | CallError::RetryAfter { .. } | CallError::Blocked(_)) =>
            {
                Some(failure_words(e))
            }
            _ => None,
        };
        let store = &self.shared.store;
        if let Some(pause) = self.shared.breaker_record(self.entry, failure)
            && let Err(e) = store.pause_provider(self.entry.name.clone(), pause).await
        {
            tracing::warn!(error = %e, "recording the provider's pause failed");
        }
        if self.claim.slow_start {
            let verdict = match result {
                Ok(_) => Some(true),
                Err(CallError::RetryAfter { .. }) => Some(false),
                Err(CallError::Ambiguous(m)) if m.starts_with("HTTP 5") => Some(false),
                Err(_) => None,
            };
            if let Some(ok) = verdict
                && let Err(e) = store.slow_start_feedback(self.entry.name.clone(), ok).await
            {
                tracing::warn!(error = %e, "recording the slow start's progress failed");
            }
        }
    }

    /// Check the request before anything paid leaves (the adapter's `preflight`: inputs the
    /// model takes, a storable output format). `Some` is the finish for a request that must
    /// not be sent; nothing was sent and nothing charged, so no attempt is counted. A
    /// preflight that cannot reach the provider (its schema read failed) is tried a few
    /// times here, then the task fails as "not sent".
    async fn preflight(&self, references: &[Image]) -> Result<Option<Stop>, StoreError> {
        let req = self.request(self.now(), references);
        let mut last = String::new();
        for n in 0..3 {
            if n > 0 {
                tokio::time::sleep(self.retry_delay(n)).await;
            }
            match self.entry.provider.preflight(&req).await {
                Ok(()) => return Ok(None),
                Err(CallError::Rejected { message, config }) => {
                    return Ok(Some(Stop::Finish(Finish::Failed {
                        kind: if config { FailureKind::Configuration } else { FailureKind::Rejected },
                        reason: say_with("say.refused_before", &[("message", &message)]),
                        charge: Charge::None,
                    })));
                }
                // "Not now" on a free metadata read (a schema): hold the provider and hand the
                // claim back untouched, due after the wait (nothing sent, no attempt).
                Err(CallError::RetryAfter { after, message }) => {
                    let c = self.claim;
                    let now = self.now();
                    let until = now + Shared::ms(after);
                    let pause = self.shared.hold_provider(self.entry, until);
                    if let Err(e) = self.shared.store.pause_provider(self.entry.name.clone(), pause).await {
                        tracing::warn!(error = %e, "recording the provider's rate-limit hold failed");
                    }
                    let due = now + Shared::ms(crate::providers::http::client::jittered(after, Shared::jitter()));
                    let secs = format!("{:.1}", after.as_secs_f64());
                    let why = say_with(
                        "say.rate_limited_handback",
                        &[("provider", &self.entry.name), ("secs", &secs), ("message", &message)],
                    );
                    let (exec, lease) = (c.execution_token.clone(), c.lease_token.clone());
                    self.shared.store.release_claim(exec, lease, due, why, now).await?;
                    self.shared.changed(&c.task_id, crate::domain::TaskStatus::Waiting);
                    self.shared.wake_dispatcher.notify_one();
                    return Ok(Some(Stop::HandedBack));
                }
                Err(e) => last = e.to_string(),
            }
        }
        Ok(Some(Stop::Finish(Finish::Failed {
            kind: FailureKind::NotSent,
            reason: say_with("say.could_not_check", &[("message", &last)]),
            charge: Charge::None,
        })))
    }

    /// Classify a failed first call (DESIGN §4).
    async fn on_error(&self, e: CallError, calling_at: Millis, references: &[Image]) -> Result<Next, StoreError> {
        let attempt = self.claim.attempt as u32;
        let max_attempts = self.shared.cfg.max_attempts as i64;
        Ok(match e {
            CallError::NotSent(m) => Next::Settle(Finish::RetryLater {
                due_at: self.now() + Shared::ms(self.retry_delay(attempt)),
                kind: FailureKind::NotSent,
                reason: say_with("say.never_reached", &[("message", &m)]),
                max_attempts,
                charge: Charge::None,
                counted: true,
            }),
            CallError::RetryAfter { after, message } => {
                // "Not now": the provider did not take the request. Hold the whole provider
                // until the wait is over (the dispatcher claims nothing for it meanwhile, and a
                // claim made just before is handed back untouched), and come back after it with
                // jitter, so jobs told the same wait do not return at the same instant. Not an
                // attempt: the next one reuses this attempt's idempotency key, which is right,
                // since the provider refused this request.
                let until = self.now() + Shared::ms(after);
                let pause = self.shared.hold_provider(self.entry, until);
                if let Err(e) = self.shared.store.pause_provider(self.entry.name.clone(), pause).await {
                    tracing::warn!(error = %e, "recording the provider's rate-limit hold failed");
                }
                let wait = crate::providers::http::client::jittered(after, Shared::jitter());
                Next::Settle(Finish::RetryLater {
                    due_at: self.now() + Shared::ms(wait),
                    kind: FailureKind::RateLimited,
                    reason: say_with(
                        "say.asked_to_wait",
                        &[("secs", &format!("{:.1}", after.as_secs_f64())), ("message", &message)],
                    ),
                    max_attempts,
                    charge: Charge::Refused,
                    counted: false,
                })
            }
            CallError::Rejected { message, config } => Next::Settle(Finish::Failed {
                kind: if config { FailureKind::Configuration } else { FailureKind::Rejected },
                reason: if config {
                    say_with("say.refused_setup", &[("message", &message)])
                } else {
                    say_with("say.rejected", &[("message", &message)])
                },
                charge: Charge::Refused,
            }),
            CallError::Ambiguous(m) => self.recover_call(calling_at, references, ambiguous_cause(&m)).await,
            // The provider answered 2xx but tally cannot use the answer. An asynchronous
            // create's unusable answer is a lost job id: search for the job as for a lost
            // answer. Otherwise the image was made and probably charged, and is not usable.
            CallError::Unusable(m) if self.entry.provider.finds_lost_creates() => {
                self.recover_call(calling_at, references, say_with("say.unusable_answer", &[("message", &m)])).await
            }
            CallError::Unusable(m) => Next::Settle(unusable(&m)),
            CallError::Blocked(m) => Next::Settle(blocked(&m)),
        })
    }

    /// The call may have reached the provider and its answer is missing: call again only
    /// if the provider can prove that is safe — `idempotent_create` (a replay with the same
    /// key), or `lookup` with `finds_lost_creates` (exactly one listed job matching what was
    /// sent, then polled); otherwise `unknown`. No blind resend (ARCHITECTURE.md, invariants;
    /// the reconciler applies the same table, `domain::decide`, after a crash).
    async fn recover_call(&self, calling_at: Millis, references: &[Image], why: String) -> Next {
        let caps = self.entry.provider.capabilities();
        let req = self.request(calling_at, references);
        let deadline = self.deadline(calling_at);
        let unknown = |detail: &str| {
            Next::Settle(Finish::Unknown { reason: say_with("say.why_then", &[("why", &why), ("detail", detail)]) })
        };
        // An ending whose whole line is a `say.` template with the reason `{why}` in it.
        let unknown_said = |key: &str| Next::Settle(Finish::Unknown { reason: say_with(key, &[("why", &why)]) });
        if caps.idempotent_create {
            // The provider dedupes by our key: replaying cannot start a second paid job.
            // At least one replay even when the deadline already passed (a long outage).
            for n in 1.. {
                if self.should_stop() {
                    return Next::Stop;
                }
                tokio::time::sleep(self.retry_delay(n)).await;
                if self.fenced() {
                    return self.stop_fenced();
                }
                match self.entry.provider.submit(&req).await {
                    Ok(Submitted::Done(img)) => return Next::Image(img),
                    Ok(Submitted::Accepted(job)) => return Next::Job(job),
                    Err(CallError::Rejected { message, .. }) => {
                        // The replay was refused, but the first request's outcome is still
                        // unproven: it may have run.
                        return Next::Settle(Finish::Failed {
                            kind: FailureKind::Rejected,
                            reason: say_with("say.replay_rejected", &[("message", &message)]),
                            charge: Charge::Possible,
                        });
                    }
                    Err(CallError::Unusable(m)) => return Next::Settle(unusable(&m)),
                    Err(CallError::Blocked(m)) => return Next::Settle(blocked(&m)),
                    Err(e) => tracing::info!(error = %e, "replay with the same idempotency key did not answer yet"),
                }
                if self.now() >= deadline {
                    break;
                }
            }
            return unknown_said("say.replays_no_answer");
        }
        if caps.lookup && !self.entry.provider.finds_lost_creates() {
            return unknown(&say("say.no_listing"));
        }
        if caps.lookup {
            // Look for the job by what was sent and when; a listing that does not show exactly
            // one match proves nothing, so after a few looks the outcome stays unknown — unless
            // the last look says a later one may tell the candidates apart: then the execution
            // waits for its next look (`Next::LookAgain`), while the provider keeps its jobs.
            //
            // A look the provider throttled (429 with a wait) is no look at all: it waits as
            // asked and does not count among the four, up to the recovery deadline — a listing
            // shared by several workers can be rate-limited (some allow 20 queries a second).
            let mut last = None;
            let mut n = 1;
            while n <= 4 {
                if self.should_stop() {
                    return Next::Stop;
                }
                let mut wait = self.retry_delay(n);
                match self.entry.provider.find_lost(&req).await {
                    Ok(LostLookup::Found(job)) => return Next::Job(job),
                    Ok(other) => last = Some(other),
                    Err(CallError::RetryAfter { after, message }) if self.now() < deadline => {
                        tracing::info!(%message, "the provider throttled a lookup; it waits and looks again");
                        wait = wait.max(after);
                        n -= 1;
                    }
                    Err(e) => tracing::info!(error = %e, "looking the job up failed"),
                }
                n += 1;
                tokio::time::sleep(wait).await;
            }
            return match last {
                Some(LostLookup::LookAgain { why: seen, until_ms }) if self.now() < until_ms => {
                    // Back off with the time since the call: each look half as far again.
                    let now = self.now();
                    let wait = Shared::ms(self.shared.cfg.backoff_max).max((now - calling_at) / 2).min(LOOK_AGAIN_MAX);
                    let why = say_with("say.why_then", &[("why", &why), ("detail", &seen)]);
                    Next::LookAgain { due_at: (now + wait).min(until_ms), until_ms, why }
                }
                Some(LostLookup::LookAgain { why: seen, .. }) => {
                    unknown(&say_with("say.jobs_not_kept", &[("why", &seen)]))
                }
                Some(LostLookup::Unproven(seen)) => unknown(&say_with("say.proves_nothing", &[("seen", &seen)])),
                _ => unknown(&say("say.job_list_unreadable")),
            };
        }
        unknown_said("say.cannot_prove")
    }

    /// Poll an accepted job until it settles, the recovery deadline passes, or the run stops.
    /// A finished job whose result cannot be fetched yet (`ResultUnavailable`: its file host
    /// answered 404 or 5xx within the provider's retention) is polled again with backoff, the
    /// worker holding no transaction meanwhile (its heartbeat keeps the lease); at the deadline
    /// it fails as "could not be downloaded", never as "expired".
    async fn poll(&self, handle: &JobHandle, calling_at: Millis) -> Next {
        let job = handle.id.as_str();
        // A provider whose jobs may take longer than the recovery deadline (a batch API's)
        // says so; it is polled that long.
        let deadline = match self.entry.provider.job_deadline() {
            Some(d) => self.deadline(calling_at).max(calling_at + Shared::ms(d)),
            None => self.deadline(calling_at),
        };
        let interval = self.entry.provider.poll_interval();
        let mut unavailable: Option<String> = None;
        let mut misses = 0u32;
        let mut not_now = Duration::ZERO;
        loop {
            if self.should_stop() {
                return Next::Stop;
            }
            match self.entry.provider.poll(handle).await {
                Ok(JobState::Running) => {}
                Ok(JobState::Done(img)) => return Next::Image(img),
                Ok(JobState::Failed(m)) => {
                    // The provider accepted the job and worked on it: whether a failed job is
                    // billed is the provider's rule, which tally cannot see.
                    return Next::Settle(Finish::Failed {
                        kind: FailureKind::Rejected,
                        reason: say_with("say.job_failed", &[("job", job), ("message", &m)]),
                        charge: Charge::Possible,
                    });
                }
                Ok(JobState::Refused(m)) => {
                    return Next::Settle(Finish::Failed {
                        kind: FailureKind::Rejected,
                        reason: say_with("say.job_refused", &[("job", job), ("message", &m)]),
                        charge: Charge::Refused,
                    });
                }
                Ok(JobState::FailedNotCharged(m)) => {
                    return Next::Settle(Finish::Failed {
                        kind: FailureKind::Rejected,
                        // A failure its provider documents as not billed (the adapter says
                        // which, `JobState::FailedNotCharged`).
                        reason: say_with("say.job_failed_free", &[("job", job), ("message", &m)]),
                        charge: Charge::Refused,
                    });
                }
                Ok(JobState::Canceled(m)) => {
                    // Not a tally cancel: the request left and ran for a while; a provider that
                    // bills by run time bills that time.
                    return Next::Settle(Finish::Failed {
                        kind: FailureKind::Rejected,
                        reason: say_with("say.job_canceled_there", &[("job", job), ("message", &m)]),
                        charge: Charge::Possible,
                    });
                }
                Ok(JobState::ResultUnavailable(m)) => {
                    misses += 1;
                    tracing::info!(misses, "the job is done but its result could not be fetched yet: {m}");
                    unavailable = Some(m);
                }
                Ok(JobState::Expired) => {
                    return Next::Settle(Finish::Failed {
                        kind: FailureKind::Expired,
                        reason: say("say.expired"),
                        charge: Charge::Charged,
                    });
                }
                Err(CallError::Rejected { message, .. }) => {
                    return Next::Settle(Finish::Unknown {
                        reason: say_with("say.no_longer_answers", &[("job", job), ("message", &message)]),
                    });
                }
                Err(CallError::Unusable(m)) => return Next::Settle(unusable(&m)),
                Err(CallError::Blocked(m)) => return Next::Settle(blocked(&m)),
                Err(CallError::RetryAfter { after, message }) => {
                    tracing::info!(wait = ?after, "the provider asked to wait before polling again: {message}");
                    not_now = after;
                }
                Err(e) => tracing::info!(error = %e, "poll did not answer; polling again"),
            }
            if self.now() >= deadline {
                return Next::Settle(match unavailable {
                    Some(m) => Finish::Failed {
                        kind: FailureKind::InvalidResult,
                        reason: say_with("say.not_downloaded", &[("message", &m)]),
                        charge: Charge::Charged,
                    },
                    None => Finish::Unknown { reason: say_with("say.not_finished_deadline", &[("job", job)]) },
                });
            }
            let wait = if misses > 0 { self.retry_delay(misses).max(interval) } else { interval };
            tokio::time::sleep(wait.max(std::mem::take(&mut not_now))).await;
        }
    }

    /// Verify the image (its type and sha256, off the writer), then finish fenced: the bytes
    /// commit with `succeeded`. If the lease was lost meanwhile, the result is still evidence:
    /// it resolves the task if the task was marked `unknown`.
    async fn save_and_finish(&self, img: Image) -> Result<(), StoreError> {
        let c = self.claim;
        crash("after-answer");
        let timed = crate::stages::start();
        // The operation's result rule (domain::operation::ResultKind): a cutout's answer must
        // carry transparency, checked before the image is verified and stored; a draft's is
        // JSON checked against the draft schema.
        let alpha = match c.operation.spec().result {
            ResultKind::Image { alpha } => alpha,
            ResultKind::Json => return self.save_answer(img).await,
        };
        if alpha && !png_has_alpha(&img.bytes) {
            return self
                .finish(Finish::Failed {
                    kind: FailureKind::InvalidResult,
                    reason: say("say.cutout_no_alpha"),
                    charge: Charge::Charged,
                })
                .await;
        }
        let verified = NewImage::verify_async(img.bytes).await;
        crate::stages::record(crate::stages::Stage::VerifyImage, timed);
        let art = match verified {
            Ok(image) => NewArtifact::new(image),
            Err(e) => {
                return self
                    .finish(Finish::Failed {
                        kind: FailureKind::InvalidResult,
                        reason: say_with("say.not_an_image", &[("message", &e.to_string())]),
                        // It answered with a result: by its rules, delivered and billed.
                        charge: Charge::Charged,
                    })
                    .await;
            }
        };
        // The image is in hand and probably paid for: a failure to *store* it (a full or
        // failing disk, a busy database) is retried, never turned into `unknown`, for as long
        // as the engine runs (a stop waits `shutdown_deadline` for this, then recovery decides
        // from the recorded phase). Only a fence ends it: then the result is still evidence.
        match self.until_stored(|| self.finish(Finish::Succeeded(art.clone()))).await {
            Err(StoreError::Fenced) => {
                let late = || self.shared.store.late_result(c.execution_token.clone(), art.clone(), self.now());
                if self.until_stored(late).await? {
                    tracing::info!("a late result resolved the unknown outcome");
                    self.shared.changed(&c.task_id, crate::domain::TaskStatus::Succeeded);
                }
                Ok(())
            }
            Ok(()) => {
                crash("after-finish");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// A JSON answer (a draft's): read the adapter's [`Answer`](crate::domain::draft::Answer),
    /// check the model's text against the draft schema, price it from its usage, and finish
    /// fenced with the answer stored — valid or not (an invalid answer fails the task, charged,
    /// and is kept; it is never fixed or sent again). Stored like an image: retried while the
    /// disk or database is busy; after a fence it is dropped (recovery decides).
    async fn save_answer(&self, img: Image) -> Result<(), StoreError> {
        use crate::domain::draft::{ANSWER_MEDIA_TYPE, Answer, parse_answer};
        let answer =
            (img.media_type == ANSWER_MEDIA_TYPE).then(|| serde_json::from_slice::<Answer>(&img.bytes).ok()).flatten();
        let Some(answer) = answer else {
            return self.finish(unusable("the provider answered a drafting call with something other than text")).await;
        };
        let language = self.claim.params.pointer("/draft/language").and_then(|v| v.as_str()).unwrap_or("en");
        let invalid = parse_answer(&answer.text, language).err();
        let u = answer.usage;
        let new = crate::store::NewAnswer {
            usage: serde_json::json!({"input_tokens": u.input_tokens, "output_tokens": u.output_tokens}),
            cost_micros: self.entry.money.pricing.price_tokens(u.input_tokens, u.output_tokens),
            body: answer.text,
            invalid,
        };
        match self.until_stored(|| self.finish(Finish::Answered(new.clone()))).await {
            Err(StoreError::Fenced) => {
                tracing::info!("the answer arrived after the lease was lost; recovery decides from what is recorded");
                Ok(())
            }
            Ok(()) => {
                crash("after-finish");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Run `store`, a write of an image tally holds (the fenced finish, or a late result after
    /// a fence), again and again while it fails for a full or failing disk or a busy database:
    /// the bytes are in hand and probably paid for, so such a failure is waited out, never
    /// turned into `unknown`. Any other answer (success, a fence, a fatal error) ends it.
    async fn until_stored<T, F, Fut>(&self, mut store: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut failures = 0u32;
        loop {
            match store().await {
                Err(e)
                    if !matches!(e, StoreError::Fenced)
                        && matches!(e.severity(), Severity::Resource | Severity::Transient) =>
                {
                    failures += 1;
                    let wait = STORE_RETRY;
                    if failures == 1 {
                        tracing::error!(error = %e, retry_in = ?wait, "storing the image failed; keeping it and trying again");
                    } else {
                        tracing::debug!(error = %e, failures, "storing the image failed again");
                    }
                    tokio::time::sleep(wait).await;
                }
                other => {
                    if failures > 0 && other.is_ok() {
                        tracing::info!(failures, "the image was stored after all");
                    }
                    return other;
                }
            }
        }
    }
}

/// Plain words for an ambiguous outcome, from what the adapter saw: an HTTP error status
/// (the adapters' messages start with `HTTP <code>`) means the provider answered with an
/// error and cannot say whether it ran; anything else means the answer never arrived.
pub(super) fn ambiguous_cause(message: &str) -> String {
    if message.starts_with("HTTP ") {
        say_with("say.answered_error", &[("message", message)])
    } else {
        say_with("say.answer_lost", &[("message", message)])
    }
}

/// The finish for an answer the provider gave (and probably charged for) that tally cannot
/// use: failed, never "rejected" and never "not sent".
fn unusable(message: &str) -> Finish {
    Finish::Failed {
        kind: FailureKind::InvalidResult,
        reason: say_with("say.unusable", &[("message", message)]),
        // It answered with a result (2xx): by its rules, delivered and billed.
        charge: Charge::Charged,
    }
}

/// The provider answered but its safety filter declined to make the image: a definite
/// refusal, not retried, which the provider may still bill (see [`CallError::Blocked`]).
fn blocked(message: &str) -> Finish {
    Finish::Failed {
        kind: FailureKind::Rejected,
        reason: say_with("say.declined", &[("message", message)]),
        charge: Charge::Possible,
    }
}

fn outcome_label(e: &CallError) -> &'static str {
    match e {
        CallError::Blocked(_) => "blocked",
        CallError::Unusable(_) => "unusable",
        CallError::NotSent(_) => "not_sent",
        CallError::Rejected { .. } => "rejected",
        CallError::RetryAfter { .. } => "retry_after",
        CallError::Ambiguous(_) => "ambiguous",
    }
}

/// What a failed call says went wrong, short enough for a line (an opened circuit names it).
fn failure_words(e: &CallError) -> String {
    let text = e.to_string();
    match text.char_indices().nth(160) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wording depends on the adapters' message format; pin it to the classifier.
    #[test]
    fn an_error_answer_is_not_described_as_a_lost_one() {
        let status = reqwest::StatusCode::INTERNAL_SERVER_ERROR;
        let CallError::Ambiguous(m) = crate::providers::http::client::classify_status(status, None, "boom") else {
            panic!("a 500 is ambiguous");
        };
        let en = |m: &str| crate::domain::words::english(&ambiguous_cause(m));
        let words = en(&m);
        assert!(words.contains("answered with an error") && words.contains("HTTP 500"), "{words}");
        assert!(!words.contains("lost"), "{words}");
        assert!(en("timed out after sending: x").contains("answer was lost"));
    }
}
