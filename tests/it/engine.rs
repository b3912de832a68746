//! Engine tests: every row of DESIGN §4 (busy / failed / unknown) and §6 (recovery), the
//! stale worker, duplicate delivery, cancel, retry, resolve, idle and bad input. Each test
//! asserts the task status, the timeline, **and** what the fake provider received: a system
//! can resend and still write a correct-looking status.
//!
//! Longer than 600 lines: one test per row of those tables, sharing the fixtures above them;
//! split by table only if it grows further.

use crate::common::En;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally::clock::{Clock, ManualClock, SystemClock};
use tally::config::{Durability, EngineConfig};
use tally::domain::TaskStatus;
use tally::engine::{Engine, EngineError, EngineParts, ProviderEntry};
use tally::metrics::Metrics;
use tally::providers::fake::{Counts, Fake, Step};
use tally::providers::{CallRequest, Capabilities, Image, Provider};
use tally::store::{
    CallingFacts, CancelOutcome, Claim, NewTask, OwnerCharge, ProviderSlots, ResolveOutcome, RetryAck, RetryOutcome,
    Store, StoreError, SubmitOutcome, TaskView,
};

const NONE: Capabilities = Capabilities { idempotent_create: false, lookup: false };
const IDEMPOTENT: Capabilities = Capabilities { idempotent_create: true, lookup: false };

/// A fresh data dir under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tally-test-{tag}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

fn config() -> EngineConfig {
    EngineConfig {
        workers: 4,
        lease: Duration::from_secs(30),
        heartbeat: Duration::from_secs(10),
        max_attempts: 3,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(50),
        ..EngineConfig::default()
    }
}

struct Harness {
    store: Store,
    fake: Arc<Fake>,
    engine: Engine,
}

impl Harness {
    async fn new(fake: Fake) -> Harness {
        Harness::with(fake, config(), Arc::new(SystemClock), 4).await
    }

    async fn with(fake: Fake, cfg: EngineConfig, clock: Arc<dyn Clock>, max_concurrency: usize) -> Harness {
        let dir = temp_dir("engine");
        let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("open store");
        let fake = Arc::new(fake);
        let engine = start(&store, &dir, &fake, cfg, clock, max_concurrency).await;
        Harness { store, fake, engine }
    }

    async fn submit(&self, prompt: &str) -> String {
        match self.engine.submit(task(prompt)).await.expect("submit") {
            SubmitOutcome::Created(id) => id,
            other => panic!("unexpected {other:?}"),
        }
    }

    async fn task(&self, id: &str) -> TaskView {
        self.store.get_task(id.into()).await.expect("read").expect("task exists")
    }

    async fn kinds(&self, id: &str) -> Vec<String> {
        self.store.events(id.into()).await.expect("events").into_iter().map(|e| e.kind).collect()
    }

    /// Wait (bounded) until the task reaches one of `want`.
    async fn wait(&self, id: &str, want: &[TaskStatus]) -> TaskView {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let t = self.task(id).await;
            if want.contains(&t.status) {
                return t;
            }
            assert!(Instant::now() < deadline, "task {id} stuck in {:?}: {:?}", t.status, t.reason);
            self.engine.poke();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn settle(&self, id: &str) -> TaskView {
        self.wait(id, &[TaskStatus::Succeeded, TaskStatus::Failed, TaskStatus::Unknown, TaskStatus::Canceled]).await
    }

    fn counts(&self) -> Counts {
        self.fake.counts()
    }
}

async fn start(
    store: &Store,
    dir: &Path,
    fake: &Arc<Fake>,
    cfg: EngineConfig,
    clock: Arc<dyn Clock>,
    max_concurrency: usize,
) -> Engine {
    let provider: Arc<dyn Provider> = fake.clone();
    Engine::start(EngineParts {
        store: store.clone(),
        config: cfg,
        clock,
        providers: vec![ProviderEntry::new("fake", provider, max_concurrency)],
        data_dir: dir.to_path_buf(),
        metrics: Arc::new(Metrics::new()),
        limits: Vec::new(),
    })
    .await
    .expect("engine starts")
}

fn task(prompt: &str) -> NewTask {
    NewTask { provider: "fake".into(), prompt: prompt.into(), params: serde_json::json!({}), ..NewTask::default() }
}

fn count(kinds: &[String], kind: &str) -> usize {
    kinds.iter().filter(|k| *k == kind).count()
}

/// The task has one artifact, and its bytes (read back from the database, not from what the
/// provider sent) are a PNG with the recorded size and sha256.
async fn assert_artifact_verifies(h: &Harness, t: &TaskView) {
    assert_eq!(t.artifacts.len(), 1, "exactly one artifact");
    let a = &t.artifacts[0];
    let (meta, bytes) = h.store.read_image_bytes(a.id.clone()).await.expect("read").expect("the image is stored");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    use sha2::Digest;
    assert_eq!(tally::domain::hex(&sha2::Sha256::digest(&bytes)), a.sha256);
    assert_eq!((bytes.len() as i64, meta.sha256.as_str()), (a.bytes, a.sha256.as_str()));
}

/// How many images the database holds (every one must belong to an artifact or an upload).
fn stored_images(dir: &Path) -> i64 {
    let c = rusqlite::Connection::open(dir.join("tally.db")).expect("open");
    c.query_row("SELECT count(*) FROM blobs", [], |r| r.get(0)).expect("count")
}

// ---- DESIGN §4: busy, failed and unknown are different ----

#[tokio::test]
async fn succeeded_saves_a_verified_artifact_and_calls_once() {
    let h = Harness::new(Fake::new(NONE)).await;
    let id = h.submit("red sneaker").await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Succeeded);
    assert_eq!(t.attempts, 1);
    assert_artifact_verifies(&h, &t).await;
    assert_eq!(h.counts(), Counts { received: 1, charged: 1, polls: 0, finds: 0 });
    assert_eq!(h.kinds(&id).await, ["submitted", "calling", "succeeded"]);
}

/// A provider with no free slot is not dispatched to at all: the waiting task stays queued with
/// its place (no hand-off that is only released again, no attempt, nothing written while it
/// waits), the API says why it waits, and it runs once a slot is free.
#[tokio::test]
async fn a_busy_provider_is_not_dispatched_to_and_the_task_says_why_it_waits() {
    let h = Harness::with(Fake::new(NONE), config(), Arc::new(SystemClock), 1).await;
    h.fake.script([Step::Hang]);
    let first = h.submit("first").await;
    h.fake.wait_received(1).await;
    let second = h.submit("second").await;
    let t = h.task(&second).await;
    assert_eq!((t.status, t.attempts), (TaskStatus::Queued, 0), "waiting for a slot is not failure");
    assert!(t.reason.en().contains("free slot at fake (all 1 of its slots are in use)"), "{:?}", t.reason);
    // Wake the dispatcher a few times: a saturated provider costs no commit and no event.
    let (commits, writes) = (h.store.commits(), h.store.writes());
    for _ in 0..5 {
        h.engine.poke();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(h.store.commits() > commits, "the dispatcher looked");
    assert_eq!(h.store.writes(), writes, "a dispatch that finds no free slot must not write");
    assert_eq!(h.counts().received, 1, "nothing was sent for the waiting task");
    assert_eq!(h.kinds(&second).await, ["submitted"]);
    h.fake.release();
    assert_eq!(h.settle(&first).await.status, TaskStatus::Succeeded);
    let t = h.settle(&second).await;
    assert_eq!((t.status, t.attempts), (TaskStatus::Succeeded, 1));
    assert_eq!(h.counts().charged, 2);
}

#[tokio::test]
async fn never_sent_is_retried_with_backoff_then_succeeds() {
    let h = Harness::new(Fake::new(NONE)).await;
    h.fake.script([Step::FailBeforeSending, Step::FailBeforeSending]);
    let id = h.submit("retry me").await;
    let t = h.settle(&id).await;
    assert_eq!((t.status, t.attempts), (TaskStatus::Succeeded, 3));
    assert_eq!(h.counts(), Counts { received: 1, charged: 1, polls: 0, finds: 0 });
    assert_eq!(count(&h.kinds(&id).await, "retry_scheduled"), 2);
}

#[tokio::test]
async fn never_sent_gives_up_after_max_attempts() {
    let h = Harness::new(Fake::new(NONE)).await;
    h.fake.script(std::iter::repeat_n(Step::FailBeforeSending, 3));
    let id = h.submit("nobody home").await;
    let t = h.settle(&id).await;
    assert_eq!((t.status, t.attempts), (TaskStatus::Failed, 3));
    assert_eq!(t.failure_kind.as_deref(), Some("not_sent"));
    assert_eq!(h.counts().received, 0, "nothing ever reached the provider");
    let kinds = h.kinds(&id).await;
    assert_eq!((count(&kinds, "retry_scheduled"), count(&kinds, "failed")), (2, 1));
}

#[tokio::test]
async fn rejected_fails_at_once_without_retry() {
    let h = Harness::new(Fake::new(NONE)).await;
    h.fake.script([Step::Reject]);
    let id = h.submit("not allowed").await;
    let t = h.settle(&id).await;
    assert_eq!((t.status, t.attempts), (TaskStatus::Failed, 1));
    assert_eq!(t.failure_kind.as_deref(), Some("rejected"));
    assert_eq!(h.counts().received, 1);
    assert_eq!(count(&h.kinds(&id).await, "retry_scheduled"), 0);
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let h = Harness::new(Fake::new(NONE)).await;
    h.fake.script([Step::RateLimit(Duration::from_millis(300))]);
    let started = Instant::now();
    let id = h.submit("slow down").await;
    let t = h.settle(&id).await;
    assert!(started.elapsed() >= Duration::from_millis(300), "retried before the hint");
    // A "not now" is not an attempt (issue 25): the success is attempt 1.
    assert_eq!((t.status, t.attempts), (TaskStatus::Succeeded, 1));
    assert_eq!(h.counts(), Counts { received: 2, charged: 1, polls: 0, finds: 0 });
    assert_eq!(count(&h.kinds(&id).await, "retry_scheduled"), 1);
}

#[tokio::test]
async fn ambiguous_without_capability_is_unknown_and_never_resent() {
    let h = Harness::new(Fake::new(NONE)).await;
    h.fake.script([Step::AcceptAndLose]);
    let id = h.submit("lost answer").await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Unknown);
    assert_eq!(t.charge.state, tally::domain::Charge::Possible);
    let msg = tally::domain::status_message(t.status, t.reason.as_deref(), false, t.charge.state);
    assert!(msg.contains("cannot be confirmed") && msg.contains("may be charged again"), "{msg}");
    // Give any (wrong) automatic retry a chance to happen before counting.
    h.engine.poke();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.counts(), Counts { received: 1, charged: 1, polls: 0, finds: 0 });
    assert_eq!(h.kinds(&id).await, ["submitted", "calling", "unknown"]);
}

#[tokio::test]
async fn ambiguous_with_idempotent_create_replays_with_the_same_key() {
    let h = Harness::new(Fake::new(IDEMPOTENT)).await;
    h.fake.script([Step::AcceptAndLose]);
    let id = h.submit("replay me").await;
    let t = h.settle(&id).await;
    assert_eq!((t.status, t.attempts), (TaskStatus::Succeeded, 1), "a replay spends no attempt");
    assert_eq!(h.counts(), Counts { received: 2, charged: 1, polls: 0, finds: 0 });
}

#[tokio::test]
async fn ambiguous_with_lookup_finds_the_job_and_polls_it() {
    let h = Harness::new(Fake::asynchronous(2)).await;
    h.fake.script([Step::AcceptAndLose]);
    let id = h.submit("find me").await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Succeeded);
    let c = h.counts();
    assert_eq!((c.received, c.charged), (1, 1));
    assert!(c.finds >= 1 && c.polls >= 3, "{c:?}");
    assert!(h.kinds(&id).await.contains(&"accepted".to_string()));
}

#[tokio::test]
async fn async_job_id_is_persisted_then_polled() {
    let h = Harness::new(Fake::asynchronous(3)).await;
    let id = h.submit("async").await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Succeeded);
    assert_artifact_verifies(&h, &t).await;
    let c = h.counts();
    assert_eq!((c.received, c.charged, c.polls), (1, 1, 4));
    assert_eq!(h.kinds(&id).await, ["submitted", "calling", "accepted", "succeeded"]);
}

#[tokio::test]
async fn circuit_opens_after_repeated_failures_and_pauses_new_calls() {
    let cfg =
        EngineConfig { circuit_failures: 2, circuit_pause: Duration::from_secs(60), max_attempts: 10, ..config() };
    let h = Harness::with(Fake::new(NONE), cfg, Arc::new(SystemClock), 4).await;
    h.fake.script([Step::FailBeforeSending, Step::FailBeforeSending]);
    let id = h.submit("outage").await;
    // After two failures the circuit is open: the next delivery is paused, not called.
    let deadline = Instant::now() + Duration::from_secs(10);
    let t = loop {
        let t = h.task(&id).await;
        if t.reason.en().contains("paused") {
            break t;
        }
        assert!(Instant::now() < deadline, "circuit never paused: {:?}", t.reason);
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!((t.status, t.attempts), (TaskStatus::Waiting, 2), "a paused delivery counts no attempt");
    assert_eq!(h.counts().received, 0);
    // The pause says what failed.
    let why = t.reason.en();
    assert!(
        why.contains("failed several times in a row (the last time: ") && why.contains("connection refused"),
        "{why}"
    );
}

// ---- DESIGN §6: recovery from evidence ----

/// Dispatch (claim) a task as an earlier process run would have, and return the claim.
async fn dispatched(store: &Store, id: &str) -> Claim {
    store.configure_providers(vec![ProviderSlots::new("fake", 4)]).await.expect("configure");
    let batch = store.dispatch_due(SystemClock.now(), 100, 30_000, "earlier-boot").await.expect("dispatch");
    batch.claims.into_iter().find(|c| c.task_id == id).expect("claimed")
}

/// Claim as an earlier run would have; returns (execution token, lease token, provider key).
async fn claimed(store: &Store, id: &str) -> (String, String, String) {
    let c = dispatched(store, id).await;
    (c.execution_token, c.lease_token, c.idempotency_key)
}

/// A store with one submitted task and no engine running yet.
async fn store_with_task(prompt: &str) -> (PathBuf, Store, String) {
    let dir = temp_dir("recovery");
    let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("open");
    let id = store.submit(task(prompt), SystemClock.now()).await.expect("submit").task_id().to_string();
    (dir, store, id)
}

async fn engine_on(dir: &Path, store: &Store, fake: Fake, cfg: EngineConfig) -> Harness {
    let fake = Arc::new(fake);
    let engine = start(store, dir, &fake, cfg, Arc::new(SystemClock), 4).await;
    Harness { store: store.clone(), fake, engine }
}

/// An older version left an envelope `sent` without a claim (its dispatcher marked before it
/// claimed): recovery still puts it back, and it runs once.
#[tokio::test]
async fn recovery_requeues_an_older_versions_unclaimed_hand_off() {
    let (dir, store, id) = store_with_task("lost hand-off").await;
    let task = id.clone();
    store
        .write(move |c| {
            c.execute(
                "UPDATE envelopes SET status = 'sent', send_count = 1, pass = NULL, lease_expires_at = 1, lease_boot = 'old'
                 WHERE task_id = ?1",
                [&task],
            )?;
            Ok(())
        })
        .await
        .expect("an old hand-off");
    let h = engine_on(&dir, &store, Fake::new(NONE), config()).await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Succeeded);
    assert_eq!(h.counts().received, 1);
    assert!(h.kinds(&id).await.contains(&"requeued".to_string()));
}

/// A claim lost before anything was sent, `max_sends` times (here once): the task is failed as
/// undeliverable instead of being dispatched into the same crash for ever.
#[tokio::test]
async fn recovery_gives_up_after_too_many_lost_dispatches() {
    let (dir, store, id) = store_with_task("undeliverable").await;
    dispatched(&store, &id).await;
    let h = engine_on(&dir, &store, Fake::new(NONE), EngineConfig { max_sends: 1, ..config() }).await;
    let t = h.settle(&id).await;
    assert_eq!((t.status, t.failure_kind.as_deref()), (TaskStatus::Failed, Some("undeliverable")));
    assert_eq!(h.counts().received, 0);
}

/// Waiting for a slot is not a lost dispatch: however often the dispatcher looks while the
/// provider is saturated, the waiting envelope is never claimed, so its dispatch count stays 0
/// and a crash then cannot fail it as undeliverable.
#[tokio::test]
async fn waiting_for_a_slot_does_not_count_as_a_lost_dispatch() {
    let (dir, store, first) = store_with_task("holds the slot").await;
    let second = store.submit(task("patient"), SystemClock.now()).await.expect("submit").task_id().to_string();
    store.configure_providers(vec![ProviderSlots::new("fake", 1)]).await.expect("configure");
    let cfg = EngineConfig { max_sends: 1, ..config() };
    let mut claimed = Vec::new();
    for _ in 0..cfg.max_sends + 3 {
        let batch = store.dispatch_due(SystemClock.now(), 100, 30_000, "earlier-boot").await.expect("dispatch");
        claimed.extend(batch.claims.into_iter().map(|c| c.task_id));
    }
    assert_eq!(claimed, std::slice::from_ref(&first), "only the first task had a slot");
    let waiting = second.clone();
    let sends: i64 = store
        .read(
            move |c| Ok(c.query_row("SELECT send_count FROM envelopes WHERE task_id = ?1", [&waiting], |r| r.get(0))?),
        )
        .await
        .expect("read");
    assert_eq!(sends, 0);
    // The process dies here; the first task's claim is lost (max_sends 1: undeliverable), and
    // the second, never dispatched, runs once.
    let h = engine_on(&dir, &store, Fake::new(NONE), cfg).await;
    let t = h.settle(&second).await;
    assert_eq!((t.status, t.reason.as_deref()), (TaskStatus::Succeeded, None), "{t:?}");
    assert_eq!(h.counts(), Counts { received: 1, charged: 1, polls: 0, finds: 0 });
}

#[tokio::test]
async fn recovery_abandons_an_execution_that_never_called() {
    let (dir, store, id) = store_with_task("claimed only").await;
    claimed(&store, &id).await;
    let h = engine_on(&dir, &store, Fake::new(NONE), config()).await;
    let t = h.settle(&id).await;
    assert_eq!((t.status, t.attempts), (TaskStatus::Succeeded, 1));
    assert_eq!(h.counts().received, 1);
    assert!(h.kinds(&id).await.contains(&"abandoned".to_string()));
}

#[tokio::test]
async fn recovery_after_calling_without_capability_is_unknown() {
    let (dir, store, id) = store_with_task("mid-call crash").await;
    let (exec, lease, _) = claimed(&store, &id).await;
    store.record_calling(exec, lease, SystemClock.now(), CallingFacts::billed()).await.expect("calling");
    let h = engine_on(&dir, &store, Fake::new(NONE), config()).await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Unknown);
    h.engine.poke();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.counts().received, 0, "no blind resend");
    let kinds = h.kinds(&id).await;
    assert_eq!(kinds.last().map(String::as_str), Some("unknown"), "{kinds:?}");
}

/// The request of an execution as the provider would have received it.
fn request(prompt: &str, key: &str) -> CallRequest {
    CallRequest {
        task_id: String::new(),
        prompt: prompt.into(),
        params: serde_json::json!({}),
        idempotency_key: key.into(),
        references: vec![],
        calling_at_ms: 0,
        candidate: 0,
        deadline_ms: 0,
        operation: Default::default(),
    }
}

#[tokio::test]
async fn recovery_after_calling_with_idempotent_create_replays_uncharged() {
    let (dir, store, id) = store_with_task("idempotent crash").await;
    let (exec, lease, key) = claimed(&store, &id).await;
    store.record_calling(exec, lease, SystemClock.now(), CallingFacts::billed()).await.expect("calling");
    let fake = Fake::new(IDEMPOTENT);
    fake.script([Step::AcceptAndLose]);
    // The earlier run's request reached the provider and was charged; then the run died.
    assert!(fake.submit(&request("idempotent crash", &key)).await.is_err());
    let h = engine_on(&dir, &store, fake, config()).await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Succeeded);
    assert_eq!(h.counts(), Counts { received: 2, charged: 1, polls: 0, finds: 0 });
    let kinds = h.kinds(&id).await;
    assert!(kinds.contains(&"recovering".to_string()) && kinds.contains(&"resumed".to_string()), "{kinds:?}");
}

#[tokio::test]
async fn recovery_after_calling_with_lookup_finds_the_job() {
    let (dir, store, id) = store_with_task("lookup crash").await;
    let (exec, lease, key) = claimed(&store, &id).await;
    store.record_calling(exec, lease, SystemClock.now(), CallingFacts::billed()).await.expect("calling");
    let fake = Fake::asynchronous(1);
    fake.script([Step::AcceptAndLose]);
    assert!(fake.submit(&request("lookup crash", &key)).await.is_err());
    let h = engine_on(&dir, &store, fake, config()).await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Succeeded);
    let c = h.counts();
    assert_eq!((c.received, c.charged), (1, 1), "found and polled, never resubmitted");
    assert!(c.finds >= 1);
}

#[tokio::test]
async fn recovery_of_an_accepted_job_polls_it() {
    let (dir, store, id) = store_with_task("accepted crash").await;
    let (exec, lease, key) = claimed(&store, &id).await;
    store
        .record_calling(exec.clone(), lease.clone(), SystemClock.now(), CallingFacts::billed())
        .await
        .expect("calling");
    let fake = Fake::asynchronous(1);
    let job = match fake.submit(&request("accepted crash", &key)).await {
        Ok(tally::providers::Submitted::Accepted(job)) => job,
        other => panic!("{other:?}"),
    };
    store.record_accepted(exec, lease, job.id, SystemClock.now()).await.expect("accepted");
    let h = engine_on(&dir, &store, fake, config()).await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Succeeded);
    let c = h.counts();
    assert_eq!((c.received, c.charged, c.finds), (1, 1, 0));
    assert!(c.polls >= 2);
}

/// The state a crash leaves when the provider's answer (an image) had arrived but the finish
/// had not committed: `calling` and nothing else, because the bytes commit only with the
/// finish. With a provider that can prove nothing, recovery says `unknown` and nothing is
/// stored (no half-saved image to trust or to sweep up).
#[tokio::test]
async fn a_crash_before_the_finish_commit_stores_nothing_and_ends_unknown() {
    let (dir, store, id) = store_with_task("answered, not committed").await;
    let (exec, lease, _) = claimed(&store, &id).await;
    store.record_calling(exec, lease, SystemClock.now(), CallingFacts::billed()).await.expect("calling");
    let h = engine_on(&dir, &store, Fake::new(NONE), config()).await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Unknown);
    assert!(t.artifacts.is_empty());
    assert_eq!(stored_images(&dir), 0, "no image without its row");
    assert_eq!(h.counts().received, 0, "nothing sent again");
}

/// The same crash with a provider that dedupes by idempotency key: the replay returns the
/// image, which then commits with the finish (one charge).
#[tokio::test]
async fn a_crash_before_the_finish_commit_is_recovered_by_a_replay_that_stores_the_image() {
    let (dir, store, id) = store_with_task("answered, replayed").await;
    let (exec, lease, key) = claimed(&store, &id).await;
    store.record_calling(exec, lease, SystemClock.now(), CallingFacts::billed()).await.expect("calling");
    let fake = Fake::new(IDEMPOTENT);
    assert!(fake.submit(&request("answered, replayed", &key)).await.is_ok(), "the first call was charged");
    let h = engine_on(&dir, &store, fake, config()).await;
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Succeeded);
    assert_artifact_verifies(&h, &t).await;
    assert_eq!(stored_images(&dir), 1);
    assert_eq!((h.counts().received, h.counts().charged), (2, 1), "replayed with the same key, charged once");
}

// ---- Fencing: a worker that lost its lease ----

#[tokio::test]
async fn stale_worker_is_fenced_and_calls_nothing_again() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let cfg = EngineConfig {
        lease: Duration::from_secs(7200),
        heartbeat: Duration::from_secs(3600),
        recovery_deadline: Duration::from_secs(36_000),
        ..config()
    };
    let h = Harness::with(Fake::new(IDEMPOTENT), cfg, clock.clone(), 4).await;
    h.fake.script([Step::Hang]);
    let id = h.submit("stale").await;
    h.fake.wait_received(1).await;
    // Worker A hangs in the call; its lease runs out.
    clock.advance(Duration::from_secs(3 * 3600));
    assert_eq!(h.engine.reconcile_now().await.expect("reconcile"), 1);
    // Worker B adopts the execution and replays with the same key: not charged again.
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Succeeded);
    assert_eq!(h.counts(), Counts { received: 2, charged: 1, polls: 0, finds: 0 });
    let before = h.kinds(&id).await;
    // A comes back with its result: its fenced write changes nothing.
    h.fake.release();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = h.task(&id).await;
    assert_eq!(after.status, TaskStatus::Succeeded);
    assert_eq!(after.artifacts.len(), 1);
    assert_eq!(after.artifacts[0].id, t.artifacts[0].id, "A overwrote nothing");
    assert_eq!(h.kinds(&id).await, before, "A wrote nothing to the timeline");
    assert_eq!(h.counts().received, 2, "A called nothing again");
}

#[tokio::test]
async fn late_result_of_the_same_execution_resolves_unknown() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let cfg = EngineConfig { lease: Duration::from_secs(7200), heartbeat: Duration::from_secs(3600), ..config() };
    let h = Harness::with(Fake::new(NONE), cfg, clock.clone(), 4).await;
    h.fake.script([Step::Hang]);
    let id = h.submit("late").await;
    h.fake.wait_received(1).await;
    clock.advance(Duration::from_secs(3 * 3600));
    h.engine.reconcile_now().await.expect("reconcile");
    assert_eq!(h.task(&id).await.status, TaskStatus::Unknown);
    h.fake.release();
    let t = h.wait(&id, &[TaskStatus::Succeeded]).await;
    assert_artifact_verifies(&h, &t).await;
    assert!(h.kinds(&id).await.contains(&"late_result".to_string()));
    assert_eq!(h.counts().received, 1);
}

/// Concurrent dispatches claim an envelope once: the claim is a conditional update of a
/// `pending` envelope, and only one dispatch can find it so.
#[tokio::test]
async fn concurrent_dispatches_claim_a_task_exactly_once() {
    let (dir, store, id) = store_with_task("duplicate").await;
    store.configure_providers(vec![ProviderSlots::new("fake", 4)]).await.expect("configure");
    let mut runs = Vec::new();
    for _ in 0..8 {
        let s = store.clone();
        runs.push(tokio::spawn(async move { s.dispatch_due(SystemClock.now(), 10, 30_000, "earlier-boot").await }));
    }
    let mut won = 0;
    for r in runs {
        won += r.await.expect("join").expect("dispatch").claims.iter().filter(|c| c.task_id == id).count();
    }
    assert_eq!(won, 1);
    // The winner's run died before calling: recovery runs the task once.
    let h = engine_on(&dir, &store, Fake::new(NONE), config()).await;
    assert_eq!(h.settle(&id).await.status, TaskStatus::Succeeded);
    assert_eq!(h.counts().received, 1);
    assert_eq!(count(&h.kinds(&id).await, "abandoned"), 1, "the lost claim, abandoned once");
}

// ---- Cancel, retry, resolve ----

#[tokio::test]
async fn cancel_of_a_queued_task_is_immediate_and_nothing_is_sent() {
    let h = Harness::with(Fake::new(NONE), EngineConfig { workers: 1, ..config() }, Arc::new(SystemClock), 1).await;
    h.fake.script([Step::Hang]);
    let first = h.submit("occupies the worker").await;
    h.fake.wait_received(1).await;
    let second = h.submit("to cancel").await;
    assert_eq!(h.engine.cancel(&second).await.expect("cancel"), CancelOutcome::Canceled);
    h.fake.release();
    assert_eq!(h.settle(&first).await.status, TaskStatus::Succeeded);
    assert_eq!(h.task(&second).await.status, TaskStatus::Canceled);
    h.engine.poke();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.counts().received, 1, "the canceled task was never sent");
}

#[tokio::test]
async fn cancel_of_a_running_task_keeps_the_paid_result() {
    let h = Harness::new(Fake::new(NONE)).await;
    h.fake.script([Step::Hang]);
    let id = h.submit("running").await;
    h.fake.wait_received(1).await;
    assert_eq!(h.engine.cancel(&id).await.expect("cancel"), CancelOutcome::Requested);
    h.fake.release();
    let t = h.settle(&id).await;
    assert_eq!(t.status, TaskStatus::Succeeded);
    assert!(t.reason.en().contains("the provider charges for it"), "{:?}", t.reason);
    assert_eq!(t.charge.state, tally::domain::Charge::Charged);
    assert!(h.kinds(&id).await.contains(&"cancel_requested".to_string()));
}

#[tokio::test]
async fn retry_after_unknown_needs_acknowledgement_and_makes_a_new_task() {
    let h = Harness::new(Fake::new(NONE)).await;
    h.fake.script([Step::AcceptAndLose]);
    let id = h.submit("retry").await;
    assert_eq!(h.settle(&id).await.status, TaskStatus::Unknown);
    assert_eq!(
        h.engine.retry(&id, RetryAck::default(), None).await.expect("retry"),
        RetryOutcome::NeedsAcknowledgement
    );
    let RetryOutcome::Created(new) =
        h.engine.retry(&id, RetryAck { possible_charge: true, retried_as: None }, None).await.expect("retry")
    else {
        panic!("no retry")
    };
    assert_ne!(new, id);
    let t = h.settle(&new).await;
    assert_eq!((t.status, t.retry_of.as_deref()), (TaskStatus::Succeeded, Some(id.as_str())));
    assert_eq!(h.task(&id).await.status, TaskStatus::Unknown, "the original stays unknown");
    assert_eq!(h.counts().charged, 2, "the acknowledged retry is a second paid call");
}

#[tokio::test]
async fn operator_resolves_unknown_as_failed_or_with_an_image() {
    let h = Harness::new(Fake::new(NONE)).await;
    h.fake.script([Step::AcceptAndLose, Step::AcceptAndLose]);
    let a = h.submit("resolve a").await;
    let b = h.submit("resolve b").await;
    h.settle(&a).await;
    h.settle(&b).await;
    assert_eq!(
        h.engine.resolve(&a, None, OwnerCharge::Unknown, "provider dashboard shows an error").await.expect("resolve"),
        ResolveOutcome::Resolved
    );
    let img = Image { bytes: tally::render::placeholder_png("found", 8), media_type: "image/png".into() };
    assert_eq!(
        h.engine.resolve(&b, Some(img), OwnerCharge::Unknown, "found it").await.expect("resolve"),
        ResolveOutcome::Resolved
    );
    let (ta, tb) = (h.task(&a).await, h.task(&b).await);
    assert_eq!((ta.status, ta.failure_kind.as_deref()), (TaskStatus::Failed, Some("operator")));
    assert_eq!(tb.status, TaskStatus::Succeeded);
    assert_artifact_verifies(&h, &tb).await;
    assert!(h.kinds(&a).await.contains(&"resolved".to_string()));
    let not_image = Image { bytes: b"hello".to_vec(), media_type: "image/png".into() };
    assert!(h.engine.resolve(&a, Some(not_image), OwnerCharge::Unknown, "").await.is_err());
    assert_eq!(h.counts().received, 2);
}

// ---- Submit, idle, bad input ----

#[tokio::test]
async fn idempotency_key_returns_the_same_task_or_a_conflict() {
    let h = Harness::new(Fake::new(NONE)).await;
    let with_key = |p: &str| NewTask { idempotency_key: Some("k-1".into()), ..task(p) };
    let SubmitOutcome::Created(id) = h.engine.submit(with_key("one")).await.expect("submit") else { panic!() };
    assert_eq!(h.engine.submit(with_key("one")).await.expect("again"), SubmitOutcome::Existing(id.clone()));
    assert_eq!(h.engine.submit(with_key("two")).await.expect("other"), SubmitOutcome::Conflict(id.clone()));
    h.settle(&id).await;
    assert_eq!(h.counts().received, 1);
}

#[tokio::test]
async fn an_idle_engine_runs_no_sql() {
    // A short lease: a timer left armed for the finished task's lease would fire inside the
    // window below and show up as statements.
    let cfg = EngineConfig { lease: Duration::from_millis(800), heartbeat: Duration::from_millis(300), ..config() };
    let h = Harness::with(Fake::new(NONE), cfg, Arc::new(SystemClock), 4).await;
    let id = h.submit("warm up").await;
    h.settle(&id).await;
    // Let in-flight follow-ups (the dispatcher's last look, the reconciler's re-read) finish.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = h.store.statements();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.store.statements(), before, "an idle engine executed SQL");
}

#[tokio::test]
async fn concurrent_writes_share_commits() {
    let h = Harness::new(Fake::new(NONE)).await;
    h.fake.script(std::iter::repeat_n(Step::Hang, 4));
    let before = h.store.commits();
    let mut joins = Vec::new();
    for i in 0..200 {
        let s = h.store.clone();
        joins.push(tokio::spawn(async move { s.submit(task(&format!("batch {i}")), SystemClock.now()).await }));
    }
    for j in joins {
        j.await.expect("join").expect("submit");
    }
    let commits = h.store.commits() - before;
    assert!(commits < 150, "200 concurrent submits took {commits} commits: no group commit");
    h.fake.release();
}

#[tokio::test]
async fn bad_input_is_refused_and_stores_nothing() {
    let h = Harness::new(Fake::new(NONE)).await;
    let cases = [
        NewTask { provider: "nope".into(), ..task("x") },
        task("   "),
        NewTask { params: serde_json::json!({"big": "x".repeat(100_000)}), ..task("x") },
        NewTask { params: serde_json::json!([1, 2]), ..task("x") },
        task(&"p".repeat(100_000)),
    ];
    for t in cases {
        assert!(matches!(h.engine.submit(t).await, Err(EngineError::Invalid(_))));
    }
    assert!(h.store.list_tasks(Default::default(), None, 10).await.expect("list").is_empty());
}

#[test]
fn a_file_that_is_not_a_tally_database_is_refused_and_left_alone() {
    let dir = temp_dir("not-tally");
    let junk = dir.join("junk.db");
    std::fs::write(&junk, b"this is not sqlite at all, just some bytes".repeat(200)).expect("write");
    let before = std::fs::read(&junk).expect("read");
    assert!(matches!(Store::open(&junk, Durability::Full), Err(StoreError::NotTally { .. })));
    assert_eq!(std::fs::read(&junk).expect("read"), before, "the file was changed");

    let other = dir.join("other.db");
    rusqlite::Connection::open(&other).and_then(|c| c.execute_batch("CREATE TABLE notes (x)")).expect("sqlite");
    assert!(matches!(Store::open(&other, Durability::Full), Err(StoreError::NotTally { .. })));

    let newer = dir.join("newer.db");
    Store::open(&newer, Durability::Full).and_then(|s| s.close()).expect("create");
    rusqlite::Connection::open(&newer).and_then(|c| c.execute_batch("PRAGMA user_version = 999")).expect("bump");
    assert!(matches!(Store::open(&newer, Durability::Full), Err(StoreError::TooNew { found: 999, .. })));
}

#[test]
fn check_passes_on_a_healthy_database_and_reports_a_broken_one() {
    let dir = temp_dir("check");
    let db = dir.join("tally.db");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let store = Store::open(&db, Durability::Full).expect("open");
    rt.block_on(store.submit(task("check me"), 1)).expect("submit");
    store.close().expect("close");
    assert_eq!(tally::store::check(&db).expect("check").problems, Vec::<String>::new());
    rusqlite::Connection::open(&db)
        .and_then(|c| c.execute_batch("UPDATE tasks SET status = 'succeeded'"))
        .expect("break it");
    let problems = tally::store::check(&db).expect("check").problems;
    assert!(problems.iter().any(|p| p.contains("without an artifact")), "{problems:?}");
}

/// The one-commit pickup (`store::ops::pickup`): on an idle engine a submit claims its task and
/// records `calling` in its own durable commit, so a task costs two fsynced commits (the
/// submit with `calling`, the finish) instead of three; with `fast_pickup = false` it is three
/// again (submit, `calling`, finish: the dispatch's commit is ordered, not fsynced).
#[tokio::test]
async fn an_idle_engine_takes_a_submit_to_calling_in_one_durable_commit() {
    for (fast, fsyncs) in [(true, 2), (false, 3)] {
        let cfg = EngineConfig { fast_pickup: fast, ..config() };
        let h = Harness::with(Fake::new(NONE), cfg, Arc::new(SystemClock), 4).await;
        let before = h.store.fsyncs();
        let id = h.submit("one commit").await;
        let t = h.settle(&id).await;
        assert_eq!((t.status, t.attempts), (TaskStatus::Succeeded, 1), "fast_pickup = {fast}");
        assert_eq!(h.store.fsyncs() - before, fsyncs, "fast_pickup = {fast}: fsynced commits per task");
        assert_eq!(h.counts(), Counts { received: 1, charged: 1, polls: 0, finds: 0 });
        assert_eq!(h.kinds(&id).await, ["submitted", "calling", "succeeded"]);
        assert_artifact_verifies(&h, &t).await;
    }
}

/// A provider adapter that counts the requests it is working on at once (each takes a few
/// milliseconds of "work"), around the fake.
struct InFlight {
    inner: Arc<Fake>,
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
}

impl Provider for InFlight {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn submit<'a>(
        &'a self,
        req: &'a CallRequest,
    ) -> tally::providers::BoxFuture<'a, Result<tally::providers::Submitted, tally::providers::CallError>> {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            let n = self.now.fetch_add(1, SeqCst) + 1;
            self.max.fetch_max(n, SeqCst);
            tokio::time::sleep(Duration::from_millis(3)).await;
            let out = self.inner.submit(req).await;
            self.now.fetch_sub(1, SeqCst);
            out
        })
    }
}

/// Submits arriving together on the fast path and the dispatcher's path never put more calls
/// at a provider than its `max_concurrency`, and every task runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fast_submits_never_exceed_the_providers_slots() {
    let dir = temp_dir("engine-cap");
    let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("open store");
    let fake = Arc::new(Fake::new(NONE));
    let counting = Arc::new(InFlight { inner: fake.clone(), now: Default::default(), max: Default::default() });
    let provider: Arc<dyn Provider> = counting.clone();
    let engine = Engine::start(EngineParts {
        store: store.clone(),
        config: EngineConfig { workers: 8, ..config() },
        clock: Arc::new(SystemClock),
        providers: vec![ProviderEntry::new("fake", provider, 2)],
        data_dir: dir.clone(),
        metrics: Arc::new(Metrics::new()),
        limits: Vec::new(),
    })
    .await
    .expect("engine starts");
    let engine = Arc::new(engine);
    let mut ids = Vec::new();
    for round in 0..4 {
        let submits: Vec<_> = (0..8)
            .map(|i| {
                let engine = engine.clone();
                tokio::spawn(async move { engine.submit(task(&format!("cap {round} {i}"))).await })
            })
            .collect();
        for s in submits {
            ids.push(s.await.expect("join").expect("submit").task_id().to_string());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for id in &ids {
        loop {
            let t = store.get_task(id.clone()).await.expect("read").expect("task");
            if t.status == TaskStatus::Succeeded {
                break;
            }
            assert!(Instant::now() < deadline, "task {id} stuck in {:?}: {:?}", t.status, t.reason);
            engine.poke();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert_eq!(fake.counts().charged, 32, "every task called once");
    assert_eq!(counting.max.load(std::sync::atomic::Ordering::SeqCst), 2, "never more than the provider's 2 slots");
}
