//! Group B on both backends: the scripted interleavings of the reconciler and a worker that
//! is still alive. Each reads a leftover as the reconciler would, lets the worker commit one
//! operation, then applies the decision: a decision made on evidence that changed is not
//! applied, and a worker whose lease was taken back is fenced. On SQLite, `tally check` runs on
//! the file where a state must be one recovery handles; on PostgreSQL the same scripts exercise
//! rule E (evidence re-checked under the envelope's row lock). `tests/it/races.rs` keeps what
//! only a SQLite file can show (a power loss made exact by copying the file).

use tally::domain::{Decision, FailureKind, Leftover, Millis, Phase, TaskStatus, decide};
use tally::providers::Capabilities;
use tally::store::*;

use super::both;
use super::fixtures::file_problems;
use super::single::task;

const LEASE: Millis = 30_000;
const T0: Millis = 1_000_000_000;
const BOOT: &str = "this-boot";

const NONE: Capabilities = Capabilities { idempotent_create: false, lookup: false };
const IDEM: Capabilities = Capabilities { idempotent_create: true, lookup: false };
const LOOKUP: Capabilities = Capabilities { idempotent_create: false, lookup: true };

struct Script {
    store: Store,
    task: String,
}

impl Script {
    async fn new(store: Store, tag: &str) -> Script {
        let task = store.submit(task(tag), T0).await.expect("submit").task_id().to_string();
        Script { store, task }
    }

    /// The dispatcher claims the task at `now` (None: not ready): a worker holding a lease.
    async fn dispatch(&self, now: Millis) -> Option<Claim> {
        let batch = self.store.dispatch_due(now, 10, LEASE, BOOT).await.expect("dispatch");
        batch.claims.into_iter().find(|c| c.task_id == self.task)
    }

    async fn worker(&self, now: Millis) -> Claim {
        self.dispatch(now).await.expect("claimed")
    }

    async fn leftover(&self, now: Millis) -> LeftoverRow {
        let rows = self.store.leftovers(now, BOOT).await.expect("leftovers");
        rows.into_iter().find(|r| r.task_id == self.task).expect("the task is a leftover")
    }

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
        self.store
            .record_calling(c.execution_token.clone(), c.lease_token.clone(), now, CallingFacts::billed())
            .await
            .map(|_| ())
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
    /// What `tally check` finds in the database file (SQLite; nothing on PostgreSQL).
    fn check(&self) -> Vec<String> {
        file_problems(&self.store)
    }
}

fn failed() -> Finish {
    Finish::Failed { kind: FailureKind::Rejected, reason: "no".into(), charge: tally::domain::Charge::Refused }
}

fn fenced<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) {
    assert!(matches!(r, Err(StoreError::Fenced)), "{what}: want Fenced, got {r:?}");
}

both!(
    abandon_on_stale_evidence_would_send_a_second_paid_request,
    abandon_after_a_heartbeat_is_not_applied,
    resume_after_a_heartbeat_is_not_applied,
    a_decision_is_not_applied_after_the_lease_was_renewed_even_if_it_ran_out_again,
    unknown_after_record_accepted_is_not_applied,
    unknown_after_finish_is_not_applied,
    give_up_after_calling_is_not_applied,
    a_claim_handed_back_and_an_abandon_exclude_each_other,
    after_abandon_the_old_worker_is_fenced,
    after_resume_the_old_worker_is_fenced,
    after_unknown_the_old_worker_is_fenced,
    a_lost_dispatch_of_a_resumed_execution_is_decided_from_its_phase,
);

async fn abandon_on_stale_evidence_would_send_a_second_paid_request(store: Store) {
    let s = Script::new(store, "abandon-vs-calling").await;
    let a = s.worker(T0).await;
    let late = T0 + LEASE;
    let row = s.leftover(late).await;
    assert!(matches!(row.execution, Some((_, Phase::Claimed))));
    assert!(matches!(Script::decision(&row, NONE), Recovery::Abandon));
    s.calling(&a, late + 1).await.expect("the worker's lease was not taken back yet");
    assert_eq!(s.apply(row, Recovery::Abandon, late + 2).await, 0, "abandoned a `calling` execution");
    assert!(s.dispatch(late + 3).await.is_none(), "the envelope was requeued: a second claim would call again");
    assert_eq!(s.attempts().await, 1);
    let row = s.leftover(late + 4).await;
    assert!(matches!(row.execution, Some((_, Phase::Calling))));
    assert!(matches!(Script::decision(&row, NONE), Recovery::Unknown));
    assert!(!s.kinds().await.contains(&"abandoned".to_string()));
}

async fn abandon_after_a_heartbeat_is_not_applied(store: Store) {
    let s = Script::new(store, "abandon-vs-heartbeat").await;
    let a = s.worker(T0).await;
    let late = T0 + LEASE;
    let row = s.leftover(late).await;
    s.heartbeat(&a, late + 1).await.expect("heartbeat");
    assert_eq!(s.apply(row, Recovery::Abandon, late + 2).await, 0, "abandoned a worker that heart-beat");
    s.calling(&a, late + 3).await.expect("the worker still holds its lease");
    assert_eq!(s.finish(&a, failed(), late + 4).await.expect("finish"), TaskStatus::Failed);
    assert!(s.check().is_empty(), "{:?}", s.check());
}

async fn resume_after_a_heartbeat_is_not_applied(store: Store) {
    let s = Script::new(store, "resume-vs-heartbeat").await;
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

async fn a_decision_is_not_applied_after_the_lease_was_renewed_even_if_it_ran_out_again(store: Store) {
    let s = Script::new(store, "renewed-and-expired").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    s.heartbeat(&a, late + 1).await.expect("heartbeat");
    assert_eq!(s.apply(row, Recovery::Unknown, late + 2 + LEASE).await, 0);
    assert_eq!(s.status().await, TaskStatus::Running);
}

async fn unknown_after_record_accepted_is_not_applied(store: Store) {
    let s = Script::new(store, "unknown-vs-accepted").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    assert!(matches!(Script::decision(&row, NONE), Recovery::Unknown));
    s.accepted(&a, late + 1).await.expect("accepted");
    assert_eq!(s.apply(row, Recovery::Unknown, late + 2).await, 0, "marked an accepted job unknown");
    assert_eq!(s.status().await, TaskStatus::Running);
    let row = s.leftover(late + 3).await;
    assert!(matches!(row.execution, Some((_, Phase::Accepted))));
    assert!(matches!(Script::decision(&row, LOOKUP), Recovery::Resume));
}

async fn unknown_after_finish_is_not_applied(store: Store) {
    let s = Script::new(store, "unknown-vs-finish").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    assert_eq!(s.finish(&a, failed(), late + 1).await.expect("finish"), TaskStatus::Failed);
    assert_eq!(s.apply(row, Recovery::Unknown, late + 2).await, 0);
    assert_eq!(s.status().await, TaskStatus::Failed);
    assert!(s.check().is_empty(), "{:?}", s.check());
}

async fn after_abandon_the_old_worker_is_fenced(store: Store) {
    let s = Script::new(store, "abandon-then-worker").await;
    let a = s.worker(T0).await;
    let late = T0 + LEASE;
    let row = s.leftover(late).await;
    assert_eq!(s.apply(row, Recovery::Abandon, late).await, 1);
    fenced(s.calling(&a, late + 1).await, "record_calling");
    fenced(s.heartbeat(&a, late + 1).await, "heartbeat");
    fenced(s.finish(&a, failed(), late + 1).await, "finish");
    let b = s.worker(late + 2).await;
    assert_eq!((b.attempt, b.resumed), (1, false));
    assert_eq!(b.idempotency_key, a.idempotency_key);
    s.calling(&b, late + 3).await.expect("the new worker calls");
    fenced(s.calling(&a, late + 4).await, "record_calling after the new claim");
}

async fn after_resume_the_old_worker_is_fenced(store: Store) {
    let s = Script::new(store, "resume-then-worker").await;
    let a = s.worker(T0).await;
    s.calling(&a, T0 + 1).await.expect("calling");
    let late = T0 + 1 + LEASE;
    let row = s.leftover(late).await;
    assert_eq!(s.apply(row, Recovery::Resume, late).await, 1);
    fenced(s.heartbeat(&a, late + 1).await, "heartbeat");
    let b = s.worker(late + 2).await;
    assert!(b.resumed && b.execution_token == a.execution_token && b.phase == Phase::Calling);
    fenced(s.heartbeat(&a, late + 3).await, "heartbeat");
    fenced(s.accepted(&a, late + 3).await, "record_accepted");
    fenced(s.finish(&a, failed(), late + 3).await, "finish");
    s.accepted(&b, late + 4).await.expect("the adopting worker holds the lease");
    assert_eq!(s.finish(&b, failed(), late + 5).await.expect("finish"), TaskStatus::Failed);
}

async fn after_unknown_the_old_worker_is_fenced(store: Store) {
    let s = Script::new(store, "unknown-then-worker").await;
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

async fn a_lost_dispatch_of_a_resumed_execution_is_decided_from_its_phase(store: Store) {
    let s = Script::new(store, "resumed-hand-off").await;
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

/// A claim lost before calling past `max_sends` is decided `GiveUp`; the still-live worker
/// records `calling` first: the task must not be failed as undeliverable (its request left).
async fn give_up_after_calling_is_not_applied(store: Store) {
    let s = Script::new(store, "give-up-vs-calling").await;
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
async fn a_claim_handed_back_and_an_abandon_exclude_each_other(store: Store) {
    // The worker hands back first: the abandon decided before is not applied.
    let s = Script::new(store.clone(), "release-then-abandon").await;
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
    let s = Script::new(store, "abandon-then-release").await;
    let b = s.worker(T0).await;
    let row = s.leftover(late).await;
    assert_eq!(s.apply(row, Recovery::Abandon, late).await, 1);
    fenced(
        s.store.release_claim(b.execution_token.clone(), b.lease_token.clone(), late + 10, why, late + 1).await,
        "release_claim",
    );
    assert_eq!(s.status().await, TaskStatus::Waiting);
}
