//! Image sets at the engine level: one shot at a time per set (checked against the times the
//! provider saw each call), interleaving between sets, unknown shots not blocking the rest,
//! cancel, retry of a shot, resume after a crash, and the schema migration that added sets.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tally::clock::{Clock, SystemClock};
use tally::config::{Durability, EngineConfig};
use tally::domain::TaskStatus;
use tally::engine::{Engine, EngineParts, ProviderEntry};
use tally::metrics::Metrics;
use tally::providers::{BoxFuture, CallError, CallRequest, Capabilities, Image, Provider, Submitted};
use tally::store::{NewSet, NewShot, NewTask, SetStatus, SetView, Store, SubmitOutcome, set_summary};

use crate::engine::temp_dir;

/// One provider call as the provider saw it.
#[derive(Debug, Clone)]
struct Call {
    prompt: String,
    start: Instant,
    end: Instant,
    references: usize,
}

/// A provider that takes `latency` per call, records every call, and loses the answer of
/// prompts containing "LOSE" (ambiguous) or holds prompts containing "HOLD" until released.
struct Recorder {
    latency: Duration,
    calls: Mutex<Vec<Call>>,
    hold: tokio::sync::Semaphore,
}

impl Recorder {
    fn new(latency: Duration) -> Arc<Self> {
        Arc::new(Recorder { latency, calls: Mutex::new(Vec::new()), hold: tokio::sync::Semaphore::new(0) })
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("lock").clone()
    }

    fn calls_for(&self, tag: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.prompt.contains(tag)).collect()
    }
}

impl Provider for Recorder {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            let start = Instant::now();
            if req.prompt.contains("HOLD") {
                let _ = self.hold.acquire().await.map(|p| p.forget());
            }
            tokio::time::sleep(self.latency).await;
            let call =
                Call { prompt: req.prompt.clone(), start, end: Instant::now(), references: req.references.len() };
            self.calls.lock().expect("lock").push(call);
            if req.prompt.contains("LOSE") {
                return Err(CallError::Ambiguous("connection reset".into()));
            }
            Ok(Submitted::Done(Image {
                bytes: tally::render::placeholder_png(&req.prompt, 8),
                media_type: "image/png".into(),
            }))
        })
    }
}

struct Setup {
    store: Store,
    engine: Engine,
    rec: Arc<Recorder>,
}

async fn setup(dir: &Path, store: Store, rec: Arc<Recorder>) -> Setup {
    let provider: Arc<dyn Provider> = rec.clone();
    let engine = Engine::start(EngineParts {
        store: store.clone(),
        config: EngineConfig { workers: 4, backoff_base: Duration::from_millis(5), ..EngineConfig::default() },
        clock: Arc::new(SystemClock),
        providers: vec![ProviderEntry::new("rec", provider, 8)],
        data_dir: dir.to_path_buf(),
        metrics: Arc::new(Metrics::new()),
        limits: Vec::new(),
    })
    .await
    .expect("engine");
    Setup { store, engine, rec }
}

async fn fresh(latency: Duration) -> (std::path::PathBuf, Setup) {
    let dir = temp_dir("sets");
    let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("open");
    let s = setup(&dir, store, Recorder::new(latency)).await;
    (dir, s)
}

fn shots(tag: &str, roles: &[&str]) -> Vec<NewShot> {
    roles
        .iter()
        .enumerate()
        .map(|(i, r)| NewShot {
            role: r.to_string(),
            prompt: format!("{r} {i} {tag}"),
            params: serde_json::json!({}),
            candidates: 1,
        })
        .collect()
}

fn new_set(tag: &str, roles: &[&str], references: Vec<String>) -> NewSet {
    NewSet {
        product: "red sneaker".into(),
        style: Some("studio light".into()),
        provider: "rec".into(),
        references,
        shots: shots(tag, roles),
        idempotency_key: None,
    }
}

const FIVE: &[&str] = &["main", "selling_point", "selling_point", "scene", "scene"];

async fn create(s: &Setup, set: NewSet) -> String {
    match s.engine.create_set(set).await.expect("create set") {
        SubmitOutcome::Created(id) => id,
        other => panic!("{other:?}"),
    }
}

async fn wait_settled(s: &Setup, id: &str) -> SetView {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let set = s.store.get_set(id.into()).await.expect("read").expect("set exists");
        if set_summary(&set).0 != SetStatus::Running {
            return set;
        }
        assert!(Instant::now() < deadline, "set {id} never settled: {}", set_summary(&set).1);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_one_at_a_time(calls: &[Call]) {
    let mut calls = calls.to_vec();
    calls.sort_by_key(|c| c.start);
    for pair in calls.windows(2) {
        assert!(pair[1].start >= pair[0].end, "shots overlapped: {:?} and {:?}", pair[0].prompt, pair[1].prompt);
    }
}

#[tokio::test]
async fn a_set_runs_one_shot_at_a_time_with_its_references() {
    let (_dir, s) = fresh(Duration::from_millis(30)).await;
    let a = s.engine.upload(tally::render::placeholder_png("photo a", 16)).await.expect("upload a");
    let b = s.engine.upload(tally::render::placeholder_png("photo b", 16)).await.expect("upload b");
    let again = s.engine.upload(tally::render::placeholder_png("photo a", 16)).await.expect("upload a again");
    assert_eq!(again.id, a.id, "uploads are deduplicated by content");
    assert!(s.engine.upload(b"not an image".to_vec()).await.is_err());

    let id = create(&s, new_set("T1", FIVE, vec![a.id.clone(), b.id.clone()])).await;
    let set = wait_settled(&s, &id).await;
    let (status, progress, _) = set_summary(&set);
    assert_eq!((status, progress.as_str()), (SetStatus::Done, "5 of 5 done"));
    assert!(set.shots.iter().all(|t| t.artifacts.len() == 1));
    let calls = s.rec.calls_for("T1");
    assert_eq!(calls.len(), 5, "each shot sent exactly once");
    assert!(calls.iter().all(|c| c.references == 2), "every shot carries both references");
    assert_one_at_a_time(&calls);
}

#[tokio::test]
async fn sets_and_single_tasks_interleave() {
    let (_dir, s) = fresh(Duration::from_millis(20)).await;
    let a = create(&s, new_set("SA", FIVE, vec![])).await;
    let b = create(&s, new_set("SB", FIVE, vec![])).await;
    let single = s.engine.submit(NewTask { provider: "rec".into(), prompt: "single".into(), ..NewTask::default() });
    single.await.expect("single");
    wait_settled(&s, &a).await;
    wait_settled(&s, &b).await;
    let (ca, cb) = (s.rec.calls_for("SA"), s.rec.calls_for("SB"));
    assert_one_at_a_time(&ca);
    assert_one_at_a_time(&cb);
    let first = |c: &[Call]| c.iter().map(|x| x.start).min().expect("calls");
    let last = |c: &[Call]| c.iter().map(|x| x.start).max().expect("calls");
    assert!(first(&cb) < last(&ca) && first(&ca) < last(&cb), "one set ran all its shots before the other started");
}

#[tokio::test]
async fn an_unknown_shot_does_not_stop_the_next() {
    let (_dir, s) = fresh(Duration::from_millis(5)).await;
    let mut set = new_set("U1", &["main", "scene", "scene"], vec![]);
    set.shots[1].prompt.push_str(" LOSE");
    let id = create(&s, set).await;
    let set = wait_settled(&s, &id).await;
    let (status, progress, message) = set_summary(&set);
    assert_eq!((status, progress.as_str()), (SetStatus::DoneWithProblems, "2 of 3 done, 1 unknown"));
    assert!(message.contains("cannot be confirmed"));
    assert_eq!(set.shots[1].status, TaskStatus::Unknown);
    assert_eq!(s.rec.calls_for("U1").len(), 3, "no shot was sent twice");
}

#[tokio::test]
async fn cancel_mid_set_lets_the_running_shot_finish_and_sends_nothing_more() {
    let (_dir, s) = fresh(Duration::from_millis(5)).await;
    let mut set = new_set("C1", FIVE, vec![]);
    set.shots[0].prompt.push_str(" HOLD");
    let id = create(&s, set).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.store.get_set(id.clone()).await.expect("read").expect("set").shots[0].status != TaskStatus::Running {
        assert!(Instant::now() < deadline, "first shot never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(s.engine.cancel_set(&id).await.expect("cancel"), Some(4));
    s.rec.hold.add_permits(1);
    let set = wait_settled(&s, &id).await;
    let (status, progress, _) = set_summary(&set);
    assert_eq!((status, progress.as_str()), (SetStatus::Canceled, "1 of 5 done, 4 canceled"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(s.rec.calls_for("C1").len(), 1, "no later shot was ever sent");
}

#[tokio::test]
async fn a_retried_shot_takes_the_old_ones_place() {
    let (_dir, s) = fresh(Duration::from_millis(5)).await;
    let mut set = new_set("R1", &["main", "scene"], vec![]);
    set.shots[0].prompt.push_str(" LOSE");
    let id = create(&s, set).await;
    let set = wait_settled(&s, &id).await;
    let old = set.shots[0].id.clone();
    let tally::store::RetryOutcome::Created(new) = s
        .engine
        .retry(&old, tally::store::RetryAck { possible_charge: true, retried_as: None }, None)
        .await
        .expect("retry")
    else {
        panic!("retry refused")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let set = s.store.get_set(id.clone()).await.expect("read").expect("set");
        if set.shots[0].id == new && set.shots[0].status.is_settled() {
            assert_eq!(set.replaced, vec![old.clone()]);
            break;
        }
        assert!(Instant::now() < deadline, "retry never settled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The retry repeats the lost prompt, so it is lost again: but it ran as a new operation.
    assert_eq!(s.rec.calls_for("R1").len(), 3);
}

#[tokio::test]
async fn a_set_resumes_after_a_crash_without_charging_a_shot_twice() {
    let dir = temp_dir("sets-crash");
    let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("open");
    let id = match store.create_set(new_set("K1", FIVE, vec![]), SystemClock.now()).await.expect("create") {
        SubmitOutcome::Created(id) => id,
        other => panic!("{other:?}"),
    };
    // An earlier run handed out and claimed the first shot, then died before calling.
    store.configure_providers(vec![tally::store::ProviderSlots::new("rec", 8)]).await.expect("configure");
    let batch = store.dispatch_due(SystemClock.now(), 10, 30_000, "earlier").await.expect("dispatch");
    assert_eq!(batch.claims.len(), 1, "only the first shot is due");
    let s = setup(&dir, store, Recorder::new(Duration::from_millis(5))).await;
    let set = wait_settled(&s, &id).await;
    assert_eq!(set_summary(&set).0, SetStatus::Done);
    let calls = s.rec.calls_for("K1");
    assert_eq!(calls.len(), 5, "each shot charged once");
    assert_one_at_a_time(&calls);
}

#[test]
fn a_version_1_database_is_migrated() {
    let dir = temp_dir("migrate");
    let db = dir.join("tally.db");
    {
        let c = rusqlite::Connection::open(&db).expect("open");
        c.execute_batch(include_str!("../fixtures/schema-v1.sql")).expect("v1 schema");
        c.execute_batch(
            "PRAGMA application_id = 1952541817; PRAGMA user_version = 1;
             INSERT INTO tasks (id, request_hash, provider, prompt, status, created_at, updated_at)
             VALUES ('t1', 'h', 'demo', 'old task', 'succeeded', 1, 1);",
        )
        .expect("v1 data");
    }
    let store = Store::open(&db, Durability::Full).expect("migrates");
    let t = store.read_blocking(|c| tally::store::get_task(c, "t1")).expect("read").expect("task kept");
    assert_eq!(t.prompt, "old task");
    assert!(store.read_blocking(|c| tally::store::list_sets(c, None, 10)).expect("sets table").is_empty());
    store.close().expect("close");
    let version: i64 = rusqlite::Connection::open(&db)
        .and_then(|c| c.query_row("PRAGMA user_version", [], |r| r.get(0)))
        .expect("version");
    assert_eq!(version, tally::store::SCHEMA_VERSION);
}

/// A set's idempotency key was stored whatever its length (an empty or 10 kB key made a set);
/// it is checked like a task's: 1 to 256 bytes, and a refused set stores nothing.
#[tokio::test]
async fn set_idempotency_keys_were_not_validated_like_task_keys() {
    let (_dir, s) = fresh(Duration::from_millis(5)).await;
    for bad in [String::new(), "k".repeat(257)] {
        let mut set = new_set("K1", &["main"], vec![]);
        set.idempotency_key = Some(bad.clone());
        let err = s.engine.create_set(set).await.expect_err("a bad key is refused");
        assert!(err.to_string().contains("idempotency key"), "{err}");
        let task =
            NewTask { provider: "rec".into(), prompt: "k".into(), idempotency_key: Some(bad), ..NewTask::default() };
        assert!(s.engine.submit(task).await.is_err(), "tasks refuse the same key");
    }
    assert!(s.store.list_sets(None, 10).await.expect("list").is_empty(), "a refused set was stored");
    let mut ok = new_set("K2", &["main"], vec![]);
    ok.idempotency_key = Some("k".repeat(256));
    create(&s, ok).await;
}
