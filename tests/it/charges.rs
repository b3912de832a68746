//! Budgets through an in-process engine and the v5 migration's backfill of charges: a task
//! held by the budget resumes when its period turns over. The store-level money rules (one
//! live retry per task and per shot, retry keys scoped to their original, the needs-attention
//! filter, a budget that concurrent `record_calling`s cannot overshoot, prune keeping this
//! month's spend) are tested on both backends in `conformance::money` and `conformance::prune`.

use crate::common::En;
use std::sync::Arc;
use std::time::Duration;

use tally::clock::{Clock, ManualClock, SystemClock};
use tally::config::{Durability, EngineConfig};
use tally::domain::{Charge, TaskStatus};
use tally::engine::{Engine, EngineParts, ProviderEntry, money::ProviderMoney};
use tally::metrics::Metrics;
use tally::providers::fake::{Fake, Step};
use tally::providers::{Capabilities, Provider};
use tally::store::spend::{Limit, Period};
use tally::store::{NewTask, Store};

use crate::engine::temp_dir;

fn task(prompt: &str) -> NewTask {
    NewTask { provider: "fake".into(), prompt: prompt.into(), params: serde_json::json!({}), ..NewTask::default() }
}

fn limit(micros: i64) -> Limit {
    Limit { period: Period::Day, provider: None, micros, currency: "USD".into(), zone: jiff::tz::TimeZone::UTC }
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
    wait(|| async { status(second.clone()).await.reason.en().contains("budget") }).await;
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
