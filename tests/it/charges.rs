//! Charge evidence, retries and budgets through the store's public operations and an
//! in-process engine: one live retry per task and per shot, retry keys scoped to their
//! original, the needs-attention filter, a budget that concurrent `record_calling`s cannot
//! overshoot, a held task that resumes when its period turns over, and the v5 migration's
//! backfill.

use std::sync::Arc;
use std::time::Duration;

use tally::clock::{Clock, ManualClock, SystemClock};
use tally::config::{Durability, EngineConfig};
use tally::domain::{Charge, FailureKind, TaskStatus};
use tally::engine::{Engine, EngineParts, ProviderEntry, money::ProviderMoney};
use tally::metrics::Metrics;
use tally::providers::fake::{Fake, Step};
use tally::providers::{Capabilities, Provider};
use tally::store::spend::{Limit, Period};
use tally::store::{
    CallingFacts, CallingOutcome, Finish, NewSet, NewShot, NewTask, RetryAck, RetryOutcome, Store, TaskFilter,
};

use crate::engine::temp_dir;

fn task(prompt: &str) -> NewTask {
    NewTask { provider: "fake".into(), prompt: prompt.into(), params: serde_json::json!({}), ..NewTask::default() }
}

fn store() -> Store {
    Store::open(&temp_dir("charges").join("tally.db"), Durability::Normal).expect("open")
}

/// Dispatch (claim) `id`; returns (execution token, lease token).
async fn claim(store: &Store, id: &str) -> (String, String) {
    let slots = tally::store::ProviderSlots { reserve: 0, ..tally::store::ProviderSlots::new("fake", 1000) };
    store.configure_providers(vec![slots]).await.expect("configure");
    let batch = store.dispatch_due(SystemClock.now(), 1000, 30_000, "boot").await.expect("dispatch");
    let c = batch.claims.into_iter().find(|c| c.task_id == id).expect("claimed");
    (c.execution_token, c.lease_token)
}

/// Run `id` to a failure whose request reached the provider with `charge`.
async fn fail(store: &Store, id: &str, charge: Charge) {
    let (exec, lease) = claim(store, id).await;
    let out = store.record_calling(exec.clone(), lease.clone(), SystemClock.now(), CallingFacts::billed()).await;
    assert_eq!(out.expect("calling"), CallingOutcome::Calling);
    let f = Finish::Failed { kind: FailureKind::Rejected, reason: "no".into(), charge };
    store.finish(exec, lease, f, SystemClock.now()).await.expect("finish");
}

async fn unknown(store: &Store, id: &str) {
    let (exec, lease) = claim(store, id).await;
    store
        .record_calling(exec.clone(), lease.clone(), SystemClock.now(), CallingFacts::billed())
        .await
        .expect("calling");
    let f = Finish::Unknown { reason: "the answer was lost".into() };
    store.finish(exec, lease, f, SystemClock.now()).await.expect("finish");
}

fn acked(retried_as: Option<&str>) -> RetryAck {
    RetryAck { possible_charge: true, retried_as: retried_as.map(str::to_string) }
}

async fn retry(store: &Store, id: &str, ack: RetryAck, key: Option<&str>) -> RetryOutcome {
    store.retry(id.into(), ack, key.map(str::to_string), SystemClock.now()).await.expect("retry")
}

/// Issue #15 item 7: ten concurrent acknowledged retries of one failed shot made ten paid
/// tasks. A shot position has at most one live retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_acknowledged_retries_of_one_failed_shot_make_one_task() {
    let store = store();
    let set = NewSet {
        product: "red sneaker".into(),
        style: None,
        provider: "fake".into(),
        references: Vec::new(),
        shots: vec![NewShot {
            role: "main".into(),
            prompt: "on white".into(),
            params: serde_json::json!({}),
            candidates: 1,
        }],
        idempotency_key: None,
    };
    let set_id = store.create_set(set, SystemClock.now()).await.expect("set").task_id().to_string();
    let shot = store.get_set(set_id.clone()).await.expect("read").expect("set").shots[0].id.clone();
    fail(&store, &shot, Charge::Possible).await;

    let outcomes = futures_util::future::join_all((0..10).map(|_| retry(&store, &shot, acked(None), None))).await;
    let created: Vec<&String> =
        outcomes.iter().filter_map(|o| if let RetryOutcome::Created(id) = o { Some(id) } else { None }).collect();
    assert_eq!(created.len(), 1, "{outcomes:?}");
    for o in &outcomes {
        match o {
            RetryOutcome::Created(_) => {}
            RetryOutcome::RetryInProgress { id, .. } => assert_eq!(id, created[0]),
            other => panic!("unexpected {other:?}"),
        }
    }
    let at_position = store
        .read(move |c| {
            Ok(c.query_row("SELECT count(*) FROM tasks WHERE set_id = ?1 AND set_position = 0", [&set_id], |r| {
                r.get::<_, i64>(0)
            })?)
        })
        .await
        .expect("count");
    assert_eq!(at_position, 2, "the failed shot and its one retry");
}

/// Issue #15 item 9: a retry idempotency key could return another task's retry.
#[tokio::test]
async fn a_retry_key_is_scoped_to_its_original_task() {
    let store = store();
    let a = store.submit(task("a"), SystemClock.now()).await.expect("a").task_id().to_string();
    fail(&store, &a, Charge::Refused).await;
    let b = store.submit(task("b"), SystemClock.now()).await.expect("b").task_id().to_string();
    fail(&store, &b, Charge::Refused).await;
    let RetryOutcome::Created(ra) = retry(&store, &a, RetryAck::default(), Some("k")).await else { panic!("a") };
    let RetryOutcome::Created(rb) = retry(&store, &b, RetryAck::default(), Some("k")).await else {
        panic!("the same key on another task must make that task's own retry")
    };
    assert_ne!(ra, rb);
    assert_eq!(store.get_task(rb.clone()).await.expect("read").expect("rb").retry_of.as_deref(), Some(b.as_str()));
    assert_eq!(retry(&store, &a, RetryAck::default(), Some("k")).await, RetryOutcome::Existing(ra));
    // A retry key never collides with a submit key.
    let mut t = task("c");
    t.idempotency_key = Some("k".into());
    assert!(matches!(
        store.submit(t, SystemClock.now()).await.expect("submit"),
        tally::store::SubmitOutcome::Created(_)
    ));
}

#[tokio::test]
async fn a_second_retry_needs_the_first_settled_and_named() {
    let store = store();
    let a = store.submit(task("twice"), SystemClock.now()).await.expect("a").task_id().to_string();
    unknown(&store, &a).await;
    let attention = |store: Store| async move {
        let f = TaskFilter { needs_attention: true, ..TaskFilter::default() };
        store.list_tasks(f, None, 50).await.expect("list").into_iter().map(|t| t.id).collect::<Vec<_>>()
    };
    assert_eq!(attention(store.clone()).await, vec![a.clone()]);
    assert_eq!(retry(&store, &a, RetryAck::default(), None).await, RetryOutcome::NeedsAcknowledgement);

    let RetryOutcome::Created(first) = retry(&store, &a, acked(None), None).await else { panic!("first retry") };
    assert!(attention(store.clone()).await.is_empty(), "a retried unknown task leaves the to-do list");
    let t = store.get_task(a.clone()).await.expect("read").expect("a");
    assert_eq!(t.retried_as, Some((first.clone(), TaskStatus::Queued)));
    assert_eq!(
        retry(&store, &a, acked(Some(&first)), None).await,
        RetryOutcome::RetryInProgress { id: first.clone(), status: TaskStatus::Queued },
        "not while the first retry is live, even when named"
    );
    fail(&store, &first, Charge::Refused).await;
    assert_eq!(
        retry(&store, &a, acked(None), None).await,
        RetryOutcome::AlreadyRetried { id: first.clone(), status: TaskStatus::Failed }
    );
    assert_eq!(
        retry(&store, &a, acked(Some("some-other-task")), None).await,
        RetryOutcome::AlreadyRetried { id: first.clone(), status: TaskStatus::Failed }
    );
    let RetryOutcome::Created(second) = retry(&store, &a, acked(Some(&first)), None).await else { panic!("second") };
    let t = store.get_task(a).await.expect("read").expect("a");
    assert_eq!(t.retried_as.map(|r| r.0), Some(second));
}

/// Retention must not delete requests that budgets and this month's spend still count, or a
/// short `older_than` would free budget room that was really spent.
#[tokio::test]
async fn prune_keeps_tasks_whose_requests_count_toward_this_months_spend() {
    let store = store();
    let paid = store.submit(task("paid"), SystemClock.now()).await.expect("paid").task_id().to_string();
    fail(&store, &paid, Charge::Charged).await;
    let refused = store.submit(task("refused"), SystemClock.now()).await.expect("refused").task_id().to_string();
    fail(&store, &refused, Charge::Refused).await;
    let cutoff = SystemClock.now() + 1;
    let report = store.prune(cutoff, false).await.expect("prune");
    assert_eq!((report.tasks, report.kept_for_spend), (1, 1), "{report:?}");
    assert!(store.get_task(paid).await.expect("read").is_some(), "the charged task is kept");
    assert!(store.get_task(refused).await.expect("read").is_none(), "the refused one is not spend");
}

fn limit(micros: i64) -> Limit {
    Limit { period: Period::Day, provider: None, micros, currency: "USD".into() }
}

fn priced(cost: i64, limits: Vec<Limit>) -> CallingFacts {
    CallingFacts { billable: true, cost_micros: Some(cost), currency: Some("USD".into()), model: None, limits }
}

/// The budget check and the `calling` record are one writer operation: twenty workers
/// asking at once for room that only five requests fit in get five.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_never_overshoot_a_budget() {
    let store = store();
    let mut claims = Vec::new();
    for i in 0..20 {
        let id = store.submit(task(&format!("budget {i}")), SystemClock.now()).await.expect("submit");
        let id = id.task_id().to_string();
        let (exec, lease) = claim(&store, &id).await;
        claims.push((id, exec, lease));
    }
    let now = SystemClock.now();
    let outcomes = futures_util::future::join_all(claims.iter().map(|(_, exec, lease)| {
        store.record_calling(exec.clone(), lease.clone(), now, priced(40_000, vec![limit(5 * 40_000 + 39_999)]))
    }))
    .await;
    let calling = outcomes.iter().filter(|o| matches!(o, Ok(CallingOutcome::Calling))).count();
    assert_eq!(calling, 5, "{outcomes:?}");
    let tomorrow = (now / 86_400_000 + 1) * 86_400_000;
    for ((id, _, _), out) in claims.iter().zip(&outcomes) {
        let t = store.get_task(id.clone()).await.expect("read").expect("task");
        match out {
            Ok(CallingOutcome::Calling) => assert_eq!((t.attempts, t.charge.state), (1, Charge::Possible)),
            Ok(CallingOutcome::Held { due_at, reason }) => {
                assert_eq!(*due_at, tomorrow, "it waits for the next day");
                assert!(reason.contains("Held: today's budget of $0.239999 is spent"), "{reason}");
                assert_eq!((t.status, t.attempts, t.charge.state), (TaskStatus::Waiting, 0, Charge::None));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// A held task resumes on its own when the period turns over: the dispatcher's due time is
/// the period's end (no polling), and the check then finds room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_held_by_the_budget_resumes_when_the_day_turns_over() {
    let dir = temp_dir("budget-day");
    let store = Store::open(&dir.join("tally.db"), Durability::Normal).expect("open");
    // 23:00 UTC on some day.
    let start = (SystemClock.now() / 86_400_000) * 86_400_000 + 23 * 3_600_000;
    let clock = Arc::new(ManualClock::new(start));
    let fake = Arc::new(Fake::new(Capabilities::default()));
    fake.script([Step::Succeed, Step::Succeed]);
    let provider: Arc<dyn Provider> = fake.clone();
    let mut money = ProviderMoney::default();
    money.pricing.per_image = Some(40_000);
    let engine = Engine::start(EngineParts {
        store: store.clone(),
        config: EngineConfig { workers: 2, ..EngineConfig::default() },
        clock: clock.clone(),
        providers: vec![ProviderEntry::new("fake", provider, 2).with_money(money)],
        data_dir: dir.clone(),
        metrics: Arc::new(Metrics::new()),
        limits: vec![limit(50_000)],
    })
    .await
    .expect("engine");
    let first = engine.submit(task("first")).await.expect("submit").task_id().to_string();
    let status = |id: String| {
        let store = store.clone();
        async move { store.get_task(id).await.expect("read").expect("task") }
    };
    wait(|| async { status(first.clone()).await.status == TaskStatus::Succeeded }).await;
    let second = engine.submit(task("second")).await.expect("submit").task_id().to_string();
    wait(|| async { status(second.clone()).await.reason.unwrap_or_default().contains("budget") }).await;
    assert_eq!(fake.counts().received, 1, "the second request was not sent");
    let due: i64 = store
        .read({
            let id = second.clone();
            move |c| Ok(c.query_row("SELECT due_at FROM envelopes WHERE task_id = ?1", [&id], |r| r.get(0))?)
        })
        .await
        .expect("due");
    assert_eq!(due, start + 3_600_000, "due at midnight UTC");

    clock.advance(Duration::from_secs(3600));
    engine.poke();
    wait(|| async { status(second.clone()).await.status == TaskStatus::Succeeded }).await;
    assert_eq!(fake.counts().received, 2);
    let t = status(second).await;
    assert_eq!((t.attempts, t.charge.state, t.charge.cost_micros), (1, Charge::Charged, Some(40_000)));
    engine.shutdown().await;
    store.close().expect("close");
}

async fn wait<F: std::future::Future<Output = bool>>(mut f: impl FnMut() -> F) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while !f().await {
        assert!(std::time::Instant::now() < end, "condition not reached in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A version 2 database's executions get their charge from what tally knew then: a request
/// that never recorded `calling` is `none`, a success `charged`, anything else after
/// `calling` `possible` (never guessed to be `refused`).
#[test]
fn the_v5_migration_backfills_charges_from_the_old_evidence() {
    let dir = temp_dir("migrate-v5");
    let db = dir.join("tally.db");
    {
        let c = rusqlite::Connection::open(&db).expect("open");
        c.execute_batch(include_str!("../fixtures/schema-v1.sql")).expect("v1 schema");
        c.execute_batch(
            "PRAGMA application_id = 1952541817; PRAGMA user_version = 1;
             INSERT INTO tasks (id, request_hash, provider, prompt, status, created_at, updated_at, may_have_charged)
             VALUES ('ok', 'h', 'p', 'ok', 'succeeded', 1, 1, 1), ('no', 'h2', 'p', 'no', 'failed', 1, 1, 1),
                    ('never', 'h3', 'p', 'never', 'failed', 1, 1, 0);
             INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, boot_id, heartbeat_at,
                                     started_at, calling_at)
             VALUES ('x1', 'ok', 1, 'succeeded', 'calling', 'k1', 'b', 1, 1, 1),
                    ('x2', 'no', 1, 'failed', 'calling', 'k2', 'b', 1, 1, 1),
                    ('x3', 'never', 1, 'failed', 'claimed', 'k3', 'b', 1, 1, NULL);",
        )
        .expect("v1 data");
    }
    let store = Store::open(&db, Durability::Full).expect("migrates");
    let state = |id: &str| store.read_blocking(|c| tally::store::charge_of(c, id)).expect("read").state;
    assert_eq!((state("ok"), state("no"), state("never")), (Charge::Charged, Charge::Possible, Charge::None));
    store.close().expect("close");
    // (The fixture has no envelopes; only the charge rule is checked here.)
    let problems = tally::store::check(&db).expect("check").problems;
    assert!(!problems.iter().any(|p| p.contains("charge")), "{problems:?}");
}
