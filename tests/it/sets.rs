//! Image sets at the engine level: the shots of a set one after another and the candidates of
//! a shot together, within the provider's slots (checked against the calls the provider saw),
//! interleaving between sets, unknown shots not blocking the rest, cancel, retry of a shot,
//! resume after a crash, and the schema migration that added sets.

use crate::common::En;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
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
/// prompts containing "LOSE" (ambiguous) or holds prompts containing "HOLD" until released. It
/// counts its calls in flight (the most at once too) and keeps the prompts of those in flight.
struct Recorder {
    latency: Duration,
    calls: Mutex<Vec<Call>>,
    hold: tokio::sync::Semaphore,
    in_flight: Mutex<Vec<String>>,
    max_in_flight: AtomicUsize,
}

impl Recorder {
    fn new(latency: Duration) -> Arc<Self> {
        Arc::new(Recorder {
            latency,
            calls: Mutex::new(Vec::new()),
            hold: tokio::sync::Semaphore::new(0),
            in_flight: Mutex::new(Vec::new()),
            max_in_flight: AtomicUsize::new(0),
        })
    }

    /// The prompts of the calls in flight now.
    fn in_flight(&self) -> Vec<String> {
        self.in_flight.lock().expect("lock").clone()
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
            let now = {
                let mut f = self.in_flight.lock().expect("lock");
                f.push(req.prompt.clone());
                f.len()
            };
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            if req.prompt.contains("HOLD") {
                let _ = self.hold.acquire().await.map(|p| p.forget());
            }
            tokio::time::sleep(self.latency).await;
            let call =
                Call { prompt: req.prompt.clone(), start, end: Instant::now(), references: req.references.len() };
            self.calls.lock().expect("lock").push(call);
            {
                let mut f = self.in_flight.lock().expect("lock");
                if let Some(i) = f.iter().position(|p| *p == req.prompt) {
                    f.remove(i);
                }
            }
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
    setup_with_slots(dir, store, rec, 8).await
}

/// [`setup`] with a provider of `slots` slots (its concurrency, taken by the dispatcher).
async fn setup_with_slots(dir: &Path, store: Store, rec: Arc<Recorder>, slots: usize) -> Setup {
    let provider: Arc<dyn Provider> = rec.clone();
    let engine = Engine::start(EngineParts {
        store: store.clone(),
        config: EngineConfig { workers: 4, backoff_base: Duration::from_millis(5), ..EngineConfig::default() },
        clock: Arc::new(SystemClock),
        providers: vec![ProviderEntry::new("rec", provider, slots)],
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
            ..NewShot::default()
        })
        .collect()
}

/// The shot index a call was for (its prompt starts "{role} {index} ").
fn shot_of(c: &Call) -> usize {
    c.prompt.split_whitespace().nth(1).and_then(|i| i.parse().ok()).expect("a shot's prompt")
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

/// The calls of one set, shot by shot: every call of a shot started after every call of the
/// shots before it ended (the candidates of one shot may overlap).
fn assert_shots_one_after_another(calls: &[Call]) {
    for a in calls {
        for b in calls.iter().filter(|b| shot_of(b) > shot_of(a)) {
            assert!(b.start >= a.end, "shots overlapped: {:?} and {:?}", a.prompt, b.prompt);
        }
    }
}

#[tokio::test]
async fn a_set_runs_its_shots_one_after_another_with_its_references() {
    let (_dir, s) = fresh(Duration::from_millis(30)).await;
    let a = s.engine.upload(tally::render::placeholder_png("photo a", 16)).await.expect("upload a");
    let b = s.engine.upload(tally::render::placeholder_png("photo b", 16)).await.expect("upload b");
    let again = s.engine.upload(tally::render::placeholder_png("photo a", 16)).await.expect("upload a again");
    assert_eq!(again.id, a.id, "uploads are deduplicated by content");
    assert!(s.engine.upload(b"not an image".to_vec()).await.is_err());

    let id = create(&s, new_set("T1", FIVE, vec![a.id.clone(), b.id.clone()])).await;
    let set = wait_settled(&s, &id).await;
    let (status, progress, _) = set_summary(&set);
    assert_eq!((status, progress.en().as_str()), (SetStatus::Done, "5 of 5 done"));
    assert!(set.shots.iter().all(|t| t.artifacts.len() == 1));
    let calls = s.rec.calls_for("T1");
    assert_eq!(calls.len(), 5, "each shot sent exactly once");
    assert!(calls.iter().all(|c| c.references == 2), "every shot carries both references");
    assert_shots_one_after_another(&calls);
}

/// Wait until `n` calls whose prompt starts with `prefix` are in flight at the provider at once;
/// the prompts in flight then.
async fn wait_in_flight(s: &Setup, prefix: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = s.rec.in_flight();
        if now.iter().filter(|p| p.starts_with(prefix)).count() >= n {
            return now;
        }
        assert!(Instant::now() < deadline, "never {n} calls of {prefix:?} in flight at once: {now:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Issue #41: a set of 2 shots × 3 candidates on a provider of 3 slots. The 3 candidates of the
/// first shot are in flight together (the provider holds them unanswered and sees all three),
/// the second shot's are sent only once the first shot settled, and never more calls are in
/// flight than the provider's slots.
#[tokio::test]
async fn the_candidates_of_a_shot_run_together_and_the_next_shot_after_it() {
    let dir = temp_dir("sets-together");
    let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("open");
    let s = setup_with_slots(&dir, store, Recorder::new(Duration::from_millis(5)), 3).await;
    let mut set = new_set("TOG", &["main", "scene"], vec![]);
    for shot in &mut set.shots {
        shot.candidates = 3;
        shot.prompt.push_str(" HOLD");
    }
    let id = create(&s, set).await;
    let in_flight = wait_in_flight(&s, "main 0", 3).await;
    assert_eq!(in_flight.len(), 3, "only the first shot's candidates: {in_flight:?}");
    let view = s.store.get_set(id.clone()).await.expect("read").expect("set");
    assert!(view.candidates[0].iter().all(|t| t.status == TaskStatus::Running));
    assert!(view.candidates[1].iter().all(|t| t.status == TaskStatus::Queued), "the second shot waits");
    s.rec.hold.add_permits(3);
    let in_flight = wait_in_flight(&s, "scene 1", 3).await;
    assert_eq!(in_flight.len(), 3, "only the second shot's candidates: {in_flight:?}");
    let view = s.store.get_set(id.clone()).await.expect("read").expect("set");
    assert!(view.candidates[0].iter().all(|t| t.status == TaskStatus::Succeeded), "the first shot settled before");
    s.rec.hold.add_permits(3);
    let set = wait_settled(&s, &id).await;
    let (status, progress, _) = set_summary(&set);
    assert_eq!((status, progress.en().as_str()), (SetStatus::Done, "6 of 6 done"));
    let calls = s.rec.calls_for("TOG");
    assert_eq!(calls.len(), 6, "each candidate sent exactly once");
    assert_shots_one_after_another(&calls);
    assert_eq!(s.rec.max_in_flight.load(Ordering::SeqCst), 3, "never more than the provider's 3 slots");
}

/// A shot of more candidates than the provider has slots: never more calls in flight than the
/// slots, and the shots still go one after another.
#[tokio::test]
async fn a_shot_never_takes_more_than_the_providers_slots() {
    let dir = temp_dir("sets-slots");
    let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("open");
    let s = setup_with_slots(&dir, store, Recorder::new(Duration::from_millis(20)), 2).await;
    let mut set = new_set("SL", &["main", "scene"], vec![]);
    for shot in &mut set.shots {
        shot.candidates = 3;
    }
    let id = create(&s, set).await;
    let set = wait_settled(&s, &id).await;
    assert_eq!(set_summary(&set).0, SetStatus::Done);
    let calls = s.rec.calls_for("SL");
    assert_eq!(calls.len(), 6);
    assert_shots_one_after_another(&calls);
    let max = s.rec.max_in_flight.load(Ordering::SeqCst);
    assert!((1..=2).contains(&max), "at most the provider's 2 slots: {max}");
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
    assert_shots_one_after_another(&ca);
    assert_shots_one_after_another(&cb);
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
    assert_eq!((status, progress.en().as_str()), (SetStatus::DoneWithProblems, "2 of 3 done, 1 unknown"));
    assert!(message.en().contains("cannot be confirmed"), "{message}");
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
    assert_eq!((status, progress.en().as_str()), (SetStatus::Canceled, "1 of 5 done, 4 canceled"));
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
    assert_shots_one_after_another(&calls);
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
