//! Scripted interleavings of the reconciler and a worker that is still alive, through the
//! public store API with explicit times: no engine, no clock, no sleeps. Each test reads a
//! leftover as the reconciler would, lets the worker commit one operation, and only then
//! applies the decision, then checks both sides: a decision made on evidence that changed is
//! not applied, and a worker whose lease was taken back is fenced. The reverse orders (the
//! reconciler first) are here too.

use std::path::PathBuf;

use tally::config::Durability;
use tally::domain::{Decision, FailureKind, Leftover, Millis, Phase, TaskStatus, decide};
use tally::providers::Capabilities;
use tally::store::{Claim, Finish, LeftoverRow, NewTask, ProviderSlots, Recovery, Store, StoreError, provider_key};

/// The lease and hand-off grace the scripts use.
const LEASE: Millis = 30_000;
/// The time the scripts start at.
const T0: Millis = 1_000_000_000;
const BOOT: &str = "this-boot";

const NONE: Capabilities = Capabilities { idempotent_create: false, lookup: false };
const IDEM: Capabilities = Capabilities { idempotent_create: true, lookup: false };
const LOOKUP: Capabilities = Capabilities { idempotent_create: false, lookup: true };

struct Script {
    dir: PathBuf,
    store: Store,
    task: String,
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.store.close();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Script {
    async fn new(tag: &str) -> Script {
        let dir = crate::engine::temp_dir(&format!("race-{tag}"));
        let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("open");
        store.configure_providers(vec![ProviderSlots::new("p", 4)]).await.expect("configure");
        let t = NewTask { provider: "p".into(), prompt: tag.into(), ..NewTask::default() };
        let task = store.submit(t, T0).await.expect("submit").task_id().to_string();
        Script { dir, store, task }
    }

    /// The dispatcher claims the envelope at `now` (None: nothing was due): a worker holding
    /// a fresh lease.
    async fn dispatch(&self, now: Millis) -> Option<Claim> {
        let batch = self.store.dispatch_due(now, 10, LEASE, BOOT).await.expect("dispatch");
        batch.claims.into_iter().find(|c| c.task_id == self.task)
    }

    /// Dispatch at `now`: a worker holding a fresh lease.
    async fn worker(&self, now: Millis) -> Claim {
        self.dispatch(now).await.expect("claimed")
    }

    /// The reconciler's read at `now`: this task's leftover (it must be one).
    async fn leftover(&self, now: Millis) -> LeftoverRow {
        let rows = self.store.leftovers(now, BOOT).await.expect("leftovers");
        rows.into_iter().find(|r| r.task_id == self.task).expect("the task is a leftover")
    }

    /// What `domain::decide` makes of a leftover, as the reconciler maps it.
    fn decision(row: &LeftoverRow, caps: Capabilities) -> Recovery {
        let left = Leftover::of(row.execution.as_ref().map(|(_, p)| *p), row.send_count as u32);
        match decide(&left, Some(caps), 10) {
            Decision::Requeue => Recovery::Requeue,
            Decision::GiveUp => Recovery::GiveUp,
            Decision::Abandon => Recovery::Abandon,
            Decision::Resume => Recovery::Resume,
            Decision::Unknown => Recovery::Unknown,
        }
    }

    /// Apply one decision; returns how many were applied.
    async fn apply(&self, row: LeftoverRow, r: Recovery, now: Millis) -> usize {
        self.store.apply_recovery(vec![(row, r)], now).await.expect("apply").len()
    }

    async fn status(&self) -> TaskStatus {
        self.store.get_task(self.task.clone()).await.expect("read").expect("task").status
    }

    async fn attempts(&self) -> i64 {
        self.store.get_task(self.task.clone()).await.expect("read").expect("task").attempts
    }

    async fn kinds(&self) -> Vec<String> {
        self.store.events(self.task.clone()).await.expect("events").into_iter().map(|e| e.kind).collect()
    }

    async fn calling(&self, c: &Claim, now: Millis) -> Result<(), StoreError> {
        let facts = tally::store::CallingFacts::billed();
        self.store.record_calling(c.execution_token.clone(), c.lease_token.clone(), now, facts).await.map(|_| ())
    }

    async fn heartbeat(&self, c: &Claim, now: Millis) -> Result<(), StoreError> {
        self.store.heartbeat(c.execution_token.clone(), c.lease_token.clone(), now, LEASE).await
    }

    async fn accepted(&self, c: &Claim, now: Millis) -> Result<(), StoreError> {
        self.store.record_accepted(c.execution_token.clone(), c.lease_token.clone(), "job-1".into(), now).await
    }

    async fn finish(&self, c: &Claim, f: Finish, now: Millis) -> Result<TaskStatus, StoreError> {
        self.store.finish(c.execution_token.clone(), c.lease_token.clone(), f, now).await
    }

    fn check(&self) -> Vec<String> {
        tally::store::check(&self.dir.join("tally.db")).expect("check runs").problems
    }
}

fn failed() -> Finish {
    Finish::Failed { kind: FailureKind::Rejected, reason: "no".into(), charge: tally::domain::Charge::Refused }
}

fn fenced<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) {
    assert!(matches!(r, Err(StoreError::Fenced)), "{what}: want Fenced, got {r:?}");
}

// ---- recovery decided, then the worker commits, then recovery applies (stale evidence) ----

/// The audit's reproduction: the reconciler reads a `claimed` execution whose lease ran out,
/// the still-live worker records `calling` (its request leaves), and the `Abandon` decided
/// from the old phase must not be applied, or the next claim would call a second time.
#[tokio::test]
async fn abandon_on_stale_evidence_would_send_a_second_paid_request() {
    let s = Script::new("abandon-vs-calling").await;
    let a = s.worker(T0).await;
    let late = T0 + LEASE;
    let row = s.leftover(late).await;
    assert!(matches!(row.execution, Some((_, Phase::Claimed))));
    assert!(matches!(Script::decision(&row, NONE), Recovery::Abandon));
    s.calling(&a, late + 1).await.expect("the worker's lease was not taken back yet");
    assert_eq!(s.apply(row, Recovery::Abandon, late + 2).await, 0, "abandoned a `calling` execution");
    assert!(s.dispatch(late + 3).await.is_none(), "the envelope was requeued: a second claim would call again");
    assert_eq!(s.attempts().await, 1);
    // Re-read, the leftover is decided from what it is now: a call that may have left.
    let row = s.leftover(late + 4).await;
    assert!(matches!(row.execution, Some((_, Phase::Calling))));
    assert!(matches!(Script::decision(&row, NONE), Recovery::Unknown));
    assert!(!s.kinds().await.contains(&"abandoned".to_string()));
}

/// A heartbeat after the reconciler's read proves the worker alive: no abandon.
#[tokio::test]
async fn abandon_after_a_heartbeat_is_not_applied() {
    let s = Script::new("abandon-vs-heartbeat").await;
    let a = s.worker(T0).await;
    let late = T0 + LEASE;
    let row = s.leftover(late).await;
    s.heartbeat(&a, late + 1).await.expect("heartbeat");
    assert_eq!(s.apply(row, Recovery::Abandon, late + 2).await, 0, "abandoned a worker that heart-beat");
    s.calling(&a, late + 3).await.expect("the worker still holds its lease");
    assert_eq!(s.finish(&a, failed(), late + 4).await.expect("finish"), TaskStatus::Failed);
    assert!(s.check().is_empty(), "{:?}", s.check());
}

/// A heartbeat after the read of a `calling` leftover: the worker keeps its lease; resuming
/// would hand a second worker the same call.
#[tokio::test]
async fn resume_after_a_heartbeat_is_not_applied() {
    let s = Script::new("resume-vs-heartbeat").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    assert!(matches!(Script::decision(&row, IDEM), Recovery::Resume));
    s.heartbeat(&a, late + 1).await.expect("heartbeat");
    assert_eq!(s.apply(row, Recovery::Resume, late + 2).await, 0, "resumed a worker that heart-beat");
    assert!(s.dispatch(late + 3).await.is_none(), "no second worker gets the execution");
    s.heartbeat(&a, late + 4).await.expect("the worker still holds its lease");
}

/// A heartbeat, then the lease runs out *again* before the decision is applied: the deadline
/// the decision was made from is gone, so it is still not applied (the next pass re-reads).
#[tokio::test]
async fn a_decision_is_not_applied_after_the_lease_was_renewed_even_if_it_ran_out_again() {
    let s = Script::new("renewed-and-expired").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    s.heartbeat(&a, late + 1).await.expect("heartbeat");
    assert_eq!(s.apply(row, Recovery::Unknown, late + 2 + LEASE).await, 0);
    assert_eq!(s.status().await, TaskStatus::Running);
}

/// `record_accepted` after the read of a `calling` leftover: the job id is evidence the
/// `unknown` decision did not have.
#[tokio::test]
async fn unknown_after_record_accepted_is_not_applied() {
    let s = Script::new("unknown-vs-accepted").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    assert!(matches!(Script::decision(&row, NONE), Recovery::Unknown));
    s.accepted(&a, late + 1).await.expect("accepted");
    assert_eq!(s.apply(row, Recovery::Unknown, late + 2).await, 0, "marked an accepted job unknown");
    assert_eq!(s.status().await, TaskStatus::Running);
    // Decided again: an accepted job on a provider that can look it up is polled.
    let row = s.leftover(late + 3).await;
    assert!(matches!(row.execution, Some((_, Phase::Accepted))));
    assert!(matches!(Script::decision(&row, LOOKUP), Recovery::Resume));
}

/// The worker finishes between the read and the apply: the settled outcome stands.
#[tokio::test]
async fn unknown_after_finish_is_not_applied() {
    let s = Script::new("unknown-vs-finish").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    assert_eq!(s.finish(&a, failed(), late + 1).await.expect("finish"), TaskStatus::Failed);
    assert_eq!(s.apply(row, Recovery::Unknown, late + 2).await, 0);
    assert_eq!(s.status().await, TaskStatus::Failed);
    assert!(s.check().is_empty(), "{:?}", s.check());
}

/// A claim lost before calling past `max_sends` is decided `GiveUp`; the still-live worker
/// records `calling` first: the task must not be failed as undeliverable (its request left).
#[tokio::test]
async fn give_up_after_calling_is_not_applied() {
    let s = Script::new("give-up-vs-calling").await;
    let a = s.worker(T0).await;
    let late = T0 + LEASE;
    let row = s.leftover(late).await;
    let left = Leftover::of(row.execution.as_ref().map(|(_, p)| *p), row.send_count as u32);
    assert_eq!(decide(&left, Some(NONE), 1), Decision::GiveUp, "one dispatch lost, max_sends 1");
    s.calling(&a, late + 1).await.expect("the worker's lease was not taken back yet");
    assert_eq!(s.apply(row, Recovery::GiveUp, late + 2).await, 0, "gave up a call that left");
    assert_eq!(s.status().await, TaskStatus::Running);
}

/// A claim handed back (its provider paused) and the reconciler's abandon of the same claim:
/// whichever commits first wins, the other changes nothing.
#[tokio::test]
async fn a_claim_handed_back_and_an_abandon_exclude_each_other() {
    // The worker hands back first: the abandon decided before is not applied.
    let s = Script::new("release-then-abandon").await;
    let a = s.worker(T0).await;
    let late = T0 + LEASE;
    let row = s.leftover(late).await;
    let why = "Provider `p` paused.".to_string();
    s.store
        .release_claim(a.execution_token.clone(), a.lease_token.clone(), late + 10, why.clone(), late + 1)
        .await
        .expect("hand back");
    assert_eq!(s.apply(row, Recovery::Abandon, late + 2).await, 0, "abandoned a claim already handed back");
    assert_eq!(s.kinds().await.iter().filter(|k| *k == "abandoned").count(), 0);
    // The reconciler first: the hand-back is fenced.
    let s = Script::new("abandon-then-release").await;
    let b = s.worker(T0).await;
    let row = s.leftover(late).await;
    assert_eq!(s.apply(row, Recovery::Abandon, late).await, 1);
    fenced(
        s.store.release_claim(b.execution_token.clone(), b.lease_token.clone(), late + 10, why, late + 1).await,
        "release_claim",
    );
    assert_eq!(s.status().await, TaskStatus::Waiting);
}

// ---- recovery applies first: the worker's lease is taken back and every write is fenced ----

#[tokio::test]
async fn after_abandon_the_old_worker_is_fenced() {
    let s = Script::new("abandon-then-worker").await;
    let a = s.worker(T0).await;
    let late = T0 + LEASE;
    let row = s.leftover(late).await;
    assert_eq!(s.apply(row, Recovery::Abandon, late).await, 1);
    fenced(s.calling(&a, late + 1).await, "record_calling");
    fenced(s.heartbeat(&a, late + 1).await, "heartbeat");
    fenced(s.finish(&a, failed(), late + 1).await, "finish");
    // The next worker starts attempt 1 again (nothing was sent), with the same provider key.
    let b = s.worker(late + 2).await;
    assert_eq!((b.attempt, b.resumed), (1, false));
    assert_eq!(b.idempotency_key, a.idempotency_key);
    s.calling(&b, late + 3).await.expect("the new worker calls");
    fenced(s.calling(&a, late + 4).await, "record_calling after the new claim");
}

#[tokio::test]
async fn after_resume_the_old_worker_is_fenced() {
    let s = Script::new("resume-then-worker").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    assert_eq!(s.apply(row, Recovery::Resume, late).await, 1);
    // Taken back before anyone claimed it, and after: the old lease grants nothing.
    fenced(s.heartbeat(&a, late + 1).await, "heartbeat");
    let b = s.worker(late + 2).await;
    assert!(b.resumed && b.execution_token == a.execution_token && b.phase == Phase::Calling);
    fenced(s.heartbeat(&a, late + 3).await, "heartbeat");
    fenced(s.accepted(&a, late + 3).await, "record_accepted");
    fenced(s.finish(&a, failed(), late + 3).await, "finish");
    s.accepted(&b, late + 4).await.expect("the adopting worker holds the lease");
    assert_eq!(s.finish(&b, failed(), late + 5).await.expect("finish"), TaskStatus::Failed);
}

#[tokio::test]
async fn after_unknown_the_old_worker_is_fenced() {
    let s = Script::new("unknown-then-worker").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    assert_eq!(s.apply(row, Recovery::Unknown, late).await, 1);
    fenced(s.heartbeat(&a, late + 1).await, "heartbeat");
    fenced(s.accepted(&a, late + 1).await, "record_accepted");
    fenced(s.finish(&a, failed(), late + 1).await, "finish");
    assert_eq!(s.status().await, TaskStatus::Unknown);
    assert!(s.dispatch(late + 2).await.is_none(), "an unknown task is never sent again");
}

// ---- a resumed hand-off lost between its dispatch and its claim ----

/// A crash right after a resumed execution was dispatched again leaves a `sent` envelope whose
/// lease ran out and a `calling` execution. It is decided from the phase (resumed, or
/// `unknown`), never as a dispatch that "sent nothing", and `tally check` accepts the state.
#[tokio::test]
async fn a_lost_dispatch_of_a_resumed_execution_is_decided_from_its_phase() {
    let s = Script::new("resumed-hand-off").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    assert_eq!(s.apply(row, Recovery::Resume, late).await, 1);
    let again = s.dispatch(late + 1).await.expect("dispatched again"); // … and the process dies here
    assert!(again.resumed && again.execution_token == a.execution_token);
    assert!(s.check().is_empty(), "tally check flags a state recovery handles: {:?}", s.check());
    let row = s.leftover(late + 1 + LEASE).await;
    assert_eq!(row.lease_token.as_deref(), Some(again.lease_token.as_str()));
    assert!(matches!(row.execution, Some((_, Phase::Calling))));
    // Past max_sends too: never "undeliverable" for a call that may have been charged.
    let left = Leftover::of(Some(Phase::Calling), 99);
    assert_eq!(decide(&left, Some(IDEM), 2), Decision::Resume);
    assert_eq!(decide(&left, Some(NONE), 2), Decision::Unknown);
    assert!(matches!(Script::decision(&row, IDEM), Recovery::Resume));
    // The store refuses to count it as undelivered.
    let refused = s.store.apply_recovery(vec![(row.clone(), Recovery::GiveUp)], late + 2 + LEASE).await;
    assert!(refused.is_err(), "gave up a running execution as undeliverable");
    assert_eq!(s.apply(row, Recovery::Resume, late + 2 + LEASE).await, 1);
    let b = s.worker(late + 3 + LEASE).await;
    assert!(b.resumed && b.execution_token == a.execution_token);
    let kinds = s.kinds().await;
    assert!(!kinds.iter().any(|k| k == "requeued" || k == "failed"), "{kinds:?}");
}

// ---- the provider key ----

/// With `durability = "normal"` a power loss can erase the `calling` record of a request that
/// left. Here the loss is made exact: the database is copied as it was before `calling`, then
/// the copy is recovered as a restart would. The resend must carry the key the lost request
/// carried, so an idempotent provider answers it without a second charge.
#[tokio::test]
async fn a_lost_calling_record_resends_with_a_new_idempotency_key() {
    let s = Script::new("lost-calling").await;
    let a = s.worker(T0).await;
    assert_eq!(a.idempotency_key, provider_key(&s.task, 1));
    // The disk as a power cut right after the claim leaves it (the claim is in the WAL).
    let lost = crate::engine::temp_dir("race-lost-calling-copy");
    for f in ["tally.db", "tally.db-wal"] {
        if s.dir.join(f).exists() {
            std::fs::copy(s.dir.join(f), lost.join(f)).expect("copy");
        }
    }
    s.calling(&a, T0 + 1).await.expect("calling"); // the request leaves with a.idempotency_key
    let store = Store::open(&lost.join("tally.db"), Durability::Normal).expect("open the copy");
    let rows = store.leftovers(T0 + 2, "after-power-loss").await.expect("leftovers");
    assert_eq!(rows.len(), 1);
    assert!(matches!(rows[0].execution, Some((_, Phase::Claimed))), "the copy lost `calling`");
    let row = rows[0].clone();
    assert!(matches!(Script::decision(&row, IDEM), Recovery::Abandon));
    assert_eq!(store.apply_recovery(vec![(row, Recovery::Abandon)], T0 + 2).await.expect("apply").len(), 1);
    let b = store.dispatch_due(T0 + 3, 10, LEASE, "after-power-loss").await.expect("dispatch").claims.remove(0);
    assert_eq!(b.attempt, 1);
    assert_eq!(b.idempotency_key, a.idempotency_key, "the resend carries a new key: a second charge");
    let _ = store.close();
    let _ = std::fs::remove_dir_all(lost);
}
