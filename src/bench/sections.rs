//! The measurements: each section builds its own database and engine under the output
//! directory, runs the real engine against the instant provider, and returns numbers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast::error::RecvError;

use super::provider::InstantProvider;
use super::sys::{cpu_snap, jitter, pct, thread_deltas, thread_switches};
use super::{E2e, Idle, Pickup, Recovery, Scale};
use crate::clock::{Clock, SystemClock};
use crate::config::{Durability, EngineConfig};
use crate::domain::TaskStatus;
use crate::engine::{Engine, EngineParts, ProviderEntry};
use crate::metrics::Metrics;
use crate::providers::Provider;
use crate::providers::fake::{Fake, Step};
use crate::store::{NewTask, Store, StoreError, SubmitOutcome};

/// The provider name every benchmark task uses.
pub const PROVIDER: &str = "bench";

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn durability_name(d: Durability) -> &'static str {
    match d {
        Durability::Full => "full",
        Durability::Normal => "normal",
    }
}

pub(super) fn task(i: u64, key: Option<String>) -> NewTask {
    NewTask {
        provider: PROVIDER.into(),
        prompt: format!("bench task {i}: a red sneaker on a white background"),
        params: serde_json::json!({}),
        idempotency_key: key,
        ..NewTask::default()
    }
}

/// A fresh, empty directory for one run. Runs leave their databases in place until the whole
/// benchmark ends, so that freeing one run's disk space is not charged to the next.
pub(super) fn fresh_dir(out: &Path, name: &str) -> Result<PathBuf, String> {
    let d = out.join(name);
    if d.exists() {
        return Err(format!("{} already exists; pass an empty --out directory", d.display()));
    }
    std::fs::create_dir_all(&d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    Ok(d)
}

async fn start(
    store: Store,
    dir: &Path,
    workers: usize,
    provider: Arc<dyn Provider>,
    max_concurrency: usize,
) -> Result<Engine, String> {
    Engine::start(EngineParts {
        store,
        config: EngineConfig { workers, fast_pickup: super::fast_pickup(), ..Default::default() },
        clock: Arc::new(SystemClock),
        providers: vec![ProviderEntry::new(PROVIDER, provider, max_concurrency)],
        data_dir: dir.to_path_buf(),
        metrics: Arc::new(Metrics::new()),
        limits: Vec::new(),
    })
    .await
    .map_err(|e| format!("engine start: {e}"))
}

async fn stop(engine: Engine) -> Result<(), String> {
    engine.shutdown().await;
    let store = engine.store().clone();
    drop(engine);
    store.close().map_err(s)
}

fn succeeded_of(counts: &[(TaskStatus, i64)]) -> i64 {
    counts.iter().filter(|(st, _)| *st == TaskStatus::Succeeded).map(|(_, n)| *n).sum()
}

/// Wait until `n` tasks succeeded. Status changes are the signal; because a receiver can lag
/// (capacity 4096) or subscribe after the first tasks finished, the count is confirmed from
/// the database once the provider has seen `n` calls or the channel lagged.
pub(super) async fn wait_succeeded(
    engine: &Engine,
    rx: &mut tokio::sync::broadcast::Receiver<crate::engine::TaskChange>,
    provider: &InstantProvider,
    n: u64,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen = 0u64;
    let mut lagged = false;
    loop {
        if tokio::time::Instant::now() >= deadline {
            let c = engine.status_counts().await.map_err(s)?;
            return Err(format!("timed out waiting for {n} tasks to succeed; counts: {c:?}"));
        }
        if lagged || provider.calls() >= n {
            let done = succeeded_of(&engine.status_counts().await.map_err(s)?) as u64;
            if done >= n {
                return Ok(());
            }
        }
        let wait = if lagged || provider.calls() >= n { Duration::from_millis(2) } else { Duration::from_millis(50) };
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Ok(ch)) => match ch.status {
                TaskStatus::Succeeded => {
                    seen += 1;
                    if seen >= n {
                        return Ok(());
                    }
                }
                TaskStatus::Failed | TaskStatus::Unknown | TaskStatus::Canceled => {
                    return Err(format!("task {} ended {:?} instead of succeeding", ch.task_id, ch.status));
                }
                _ => {}
            },
            Ok(Err(RecvError::Lagged(_))) | Ok(Err(RecvError::Closed)) => lagged = true,
            Err(_) => {}
        }
    }
}

/// Section 1: end-to-end throughput, one (method, workers, durability) combination.
pub async fn e2e(out: &Path, n: u64, workers: usize, durability: Durability, concurrent: bool) -> Result<E2e, String> {
    let method = if concurrent { "concurrent" } else { "sequential" };
    let dir = fresh_dir(out, &format!("e2e-{method}-{workers}-{}", durability_name(durability)))?;
    let provider = Arc::new(InstantProvider::new(false));
    Ok(e2e_in(&dir, n, workers, durability, concurrent, provider).await?.0)
}

/// [`e2e`] in `dir` (which keeps the database, closed) with `provider`; also returns the size
/// of the WAL file just before the store closed.
pub(super) async fn e2e_in(
    dir: &Path,
    n: u64,
    workers: usize,
    durability: Durability,
    concurrent: bool,
    provider: Arc<InstantProvider>,
) -> Result<(E2e, u64), String> {
    let method = if concurrent { "concurrent" } else { "sequential" };
    let dir = dir.to_path_buf();
    let store = Store::open(&dir.join("tally.db"), durability).map_err(s)?;
    let clock = SystemClock;
    let (commits0, stmts0, fsyncs0, waits0) =
        (store.commits(), store.statements(), store.fsyncs(), store.durable_waits());
    let timeout = Duration::from_secs(600);
    let (secs, enqueue_secs, drain_secs, engine);
    super::profile::begin();
    if concurrent {
        let e = Arc::new(start(store, &dir, workers, provider.clone(), workers).await?);
        let mut rx = e.subscribe();
        let t0 = Instant::now();
        let submitters = 16u64;
        let mut set = tokio::task::JoinSet::new();
        for k in 0..submitters {
            let e = e.clone();
            set.spawn(async move {
                let mut i = k;
                while i < n {
                    e.submit(task(i, None)).await.map_err(s)?;
                    i += submitters;
                }
                Ok::<_, String>(Instant::now())
            });
        }
        let waited = wait_succeeded(&e, &mut rx, &provider, n, timeout).await;
        secs = t0.elapsed().as_secs_f64();
        let mut last_submit = t0;
        while let Some(r) = set.join_next().await {
            last_submit = last_submit.max(r.map_err(s)??);
        }
        waited?;
        enqueue_secs = (last_submit - t0).as_secs_f64();
        drain_secs = f64::NAN;
        engine = Arc::try_unwrap(e).map_err(|_| "engine still shared".to_string())?;
    } else {
        // The peers' method: enqueue everything with no worker running, then drain. tally has
        // no "engine without workers", so the enqueue commits the very transaction
        // `Engine::submit` commits (task + envelope + event) through `Store::submit`, before
        // the engine starts; the drain includes `Engine::start`.
        let t0 = Instant::now();
        for i in 0..n {
            store.submit(task(i, None), clock.now()).await.map_err(s)?;
        }
        enqueue_secs = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let e = start(store, &dir, workers, provider.clone(), workers).await?;
        let mut rx = e.subscribe();
        wait_succeeded(&e, &mut rx, &provider, n, timeout).await?;
        drain_secs = t1.elapsed().as_secs_f64();
        secs = enqueue_secs + drain_secs;
        engine = e;
    }
    let profile = super::profile::end(n);
    let store = engine.store().clone();
    let (commits, stmts) = (store.commits() - commits0, store.statements() - stmts0);
    let (fsyncs, waits) = (store.fsyncs() - fsyncs0, store.durable_waits() - waits0);
    let calls = provider.calls();
    let wal = std::fs::metadata(dir.join("tally.db-wal")).map(|m| m.len()).unwrap_or(0);
    stop(engine).await?;
    let e2e = E2e {
        workers,
        durability: durability_name(durability).into(),
        tasks: n,
        tasks_per_s: n as f64 / secs,
        method: method.into(),
        secs,
        enqueue_per_s: n as f64 / enqueue_secs,
        drain_per_s: if drain_secs.is_nan() { None } else { Some(n as f64 / drain_secs) },
        commits_per_task: commits as f64 / n as f64,
        statements_per_task: stmts as f64 / n as f64,
        calls_per_task: calls as f64 / n as f64,
        per_task: super::PerTask {
            statements: stmts as f64 / n as f64,
            commits: commits as f64 / n as f64,
            // Each task's submit is one durable operation (the client's fsync wait); the rest
            // of the durable operations are on the task's path after it (calling, finish).
            fsync_waits: (waits as f64 - if durability == Durability::Full { n as f64 } else { 0.0 }).max(0.0)
                / n as f64,
            submit_fsync_waits: if durability == Durability::Full { 1.0 } else { 0.0 },
            fsyncs: fsyncs as f64 / n as f64,
        },
        profile,
    };
    Ok((e2e, wal))
}

/// Submit one task at a time on an idle engine, with random 5–105 ms gaps; returns the
/// samples (submit call ms, submit call start → provider call start ms). `warmup` extra
/// tasks run first and are not counted.
pub(super) async fn latency_samples(
    engine: &Engine,
    provider: &InstantProvider,
    samples: usize,
    warmup: usize,
    tag: &str,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut rx = engine.subscribe();
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let (mut submit, mut pickup) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    tokio::time::sleep(Duration::from_millis(300)).await; // let the engine go idle
    for i in 0..samples + warmup {
        let t0 = Instant::now();
        let out = engine.submit(task(i as u64, Some(format!("bench-{tag}-{i}")))).await.map_err(s)?;
        let t_submit = t0.elapsed();
        let SubmitOutcome::Created(id) = out else { return Err(format!("submit was not created: {out:?}")) };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => return Err(format!("task {id} did not succeed within 30 s")),
                Ok(Ok(ch)) if ch.task_id == id && ch.status == TaskStatus::Succeeded => break,
                Ok(Ok(ch)) if ch.task_id == id && ch.status.is_settled() => {
                    return Err(format!("task {id} ended {:?}", ch.status));
                }
                Ok(Ok(_)) => {}
                Ok(Err(_)) => {
                    // Lagged (cannot happen with one task at a time, but be safe): read it.
                    let t = engine.store().get_task(id.clone()).await.map_err(s)?;
                    if t.is_some_and(|t| t.status == TaskStatus::Succeeded) {
                        break;
                    }
                    rx = engine.subscribe();
                }
            }
        }
        let started = provider.started(&id).ok_or_else(|| format!("the provider never saw task {id}"))?;
        if i >= warmup {
            submit.push(t_submit.as_secs_f64() * 1e3);
            pickup.push(started.saturating_duration_since(t0).as_secs_f64() * 1e3);
        }
        tokio::time::sleep(Duration::from_millis(5 + jitter(&mut rng, 100))).await;
    }
    submit.sort_by(f64::total_cmp);
    pickup.sort_by(f64::total_cmp);
    Ok((submit, pickup))
}

/// Section 2: pickup latency on an idle engine (1 worker, like the peers), empty database,
/// with `durability`.
pub async fn pickup(out: &Path, samples: usize, durability: Durability) -> Result<Pickup, String> {
    let name = if durability == Durability::Full { "pickup" } else { "pickup-normal" };
    let dir = fresh_dir(out, name)?;
    let store = Store::open(&dir.join("tally.db"), durability).map_err(s)?;
    let provider = Arc::new(InstantProvider::new(true));
    let engine = start(store, &dir, 1, provider.clone(), 1).await?;
    super::profile::begin();
    let (submit, pickup) = latency_samples(&engine, &provider, samples, 5, "pickup").await?;
    // (The warm-up tasks are in it too: per task is over all of them.)
    let profile = super::profile::end(samples as u64 + 5);
    let (noop, one_row) = store_probe(engine.store(), 200).await?;
    stop(engine).await?;
    Ok(Pickup {
        store_noop_write_ms_p50: pct(&noop, 0.5),
        store_one_row_commit_ms_p50: pct(&one_row, 0.5),
        p50: pct(&pickup, 0.5),
        p99: pct(&pickup, 0.99),
        max: pct(&pickup, 1.0),
        samples,
        submit_ms_p50: pct(&submit, 0.5),
        submit_ms_p99: pct(&submit, 0.99),
        profile,
    })
}

/// Diagnose the cost of one write through the store on an idle engine: an empty operation
/// (writer thread round trip, BEGIN/SAVEPOINT/RELEASE/COMMIT, nothing written so no fsync)
/// and a one-row UPDATE (one fsynced WAL commit). Returns sorted samples in ms.
async fn store_probe(store: &Store, n: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
    let (mut noop, mut one_row) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        tokio::time::sleep(Duration::from_millis(1 + jitter(&mut rng, 5))).await;
        let t0 = Instant::now();
        store.write(|_| Ok(())).await.map_err(s)?;
        noop.push(t0.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(1 + jitter(&mut rng, 5))).await;
        let t0 = Instant::now();
        store
            .write(move |c| {
                c.execute("UPDATE tasks SET updated_at = ?1 WHERE id = (SELECT max(id) FROM tasks)", [i as i64])?;
                Ok(())
            })
            .await
            .map_err(s)?;
        one_row.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    noop.sort_by(f64::total_cmp);
    one_row.sort_by(f64::total_cmp);
    Ok((noop, one_row))
}

/// Section 3: idle cost. First a baseline window with the runtime alone, then an engine
/// (default configuration) runs one task and idles for the same window.
pub async fn idle(out: &Path, secs: f64) -> Result<Idle, String> {
    let window = Duration::from_secs_f64(secs);
    let b0 = cpu_snap();
    tokio::time::sleep(window).await;
    let b1 = cpu_snap();

    let dir = fresh_dir(out, "idle")?;
    let store = Store::open(&dir.join("tally.db"), Durability::Full).map_err(s)?;
    let provider = Arc::new(InstantProvider::new(false));
    let engine = start(store, &dir, EngineConfig::default().workers, provider.clone(), 4).await?;
    let mut rx = engine.subscribe();
    engine.submit(task(0, None)).await.map_err(s)?;
    wait_succeeded(&engine, &mut rx, &provider, 1, Duration::from_secs(30)).await?;
    drop(rx);
    tokio::time::sleep(Duration::from_secs(1)).await; // let the last hand-offs settle
    let (st0, th0, a0) = (engine.store().statements(), thread_switches(), cpu_snap());
    tokio::time::sleep(window).await;
    let (a1, th1, st1) = (cpu_snap(), thread_switches(), engine.store().statements());
    // A second window right after: what idling costs once the one-off work that follows
    // activity (timers armed by the last task, blocking-pool threads timing out) is over.
    tokio::time::sleep(window).await;
    let (a2, st2) = (cpu_snap(), engine.store().statements());
    stop(engine).await?;
    let base_wakeups = b1.ctxsw - b0.ctxsw;
    let raw_wakeups = a1.ctxsw - a0.ctxsw;
    Ok(Idle {
        secs: (a1.at - a0.at).as_secs_f64(),
        cpu_ms: (a1.cpu_us - a0.cpu_us) / 1e3,
        wakeups: (raw_wakeups - base_wakeups).max(0.0),
        sql_statements: st1 - st0,
        raw_wakeups,
        baseline_wakeups: base_wakeups,
        baseline_cpu_ms: (b1.cpu_us - b0.cpu_us) / 1e3,
        threads: thread_deltas(&th0, &th1),
        second_window_cpu_ms: (a2.cpu_us - a1.cpu_us) / 1e3,
        second_window_wakeups: (a2.ctxsw - a1.ctxsw - base_wakeups).max(0.0),
        second_window_sql_statements: st2 - st1,
    })
}

/// Section 4: submit and pickup latency with `rows` finished tasks in the database, and
/// the same on an empty database (`empty`, from section 2's procedure).
pub async fn scale(out: &Path, rows: u64, samples: usize, empty: &Pickup) -> Result<Scale, String> {
    let dir = fresh_dir(out, "scale")?;
    let db = dir.join("tally.db");
    // Create the schema (and user_version/application_id) through the store, then fill it.
    Store::open(&db, Durability::Full).map_err(s)?.close().map_err(s)?;
    let t0 = Instant::now();
    let db2 = db.clone();
    let now = SystemClock.now();
    let written = tokio::task::spawn_blocking(move || super::populate::finished_tasks(&db2, rows, now, PROVIDER))
        .await
        .map_err(s)??;
    let populate_secs = t0.elapsed().as_secs_f64();
    let db_mb = std::fs::metadata(&db).map(|m| m.len() as f64 / 1048576.0).unwrap_or(0.0);
    let store = Store::open(&db, Durability::Full).map_err(s)?;
    let mut plans = query_plans(&store).await.unwrap_or_else(|e| vec![format!("EXPLAIN failed: {e}")]);
    plans.extend(store.dispatch_plans().await.unwrap_or_else(|e| vec![format!("EXPLAIN failed: {e}")]));
    let provider = Arc::new(InstantProvider::new(true));
    let t1 = Instant::now();
    let engine = start(store, &dir, 1, provider.clone(), 1).await?;
    let start_ms = t1.elapsed().as_secs_f64() * 1e3;
    let (submit, pickup) = latency_samples(&engine, &provider, samples, 5, "scale").await?;
    stop(engine).await?;
    Ok(Scale {
        finished_rows: rows,
        submit_ms_p50: pct(&submit, 0.5),
        pickup_ms_p50: pct(&pickup, 0.5),
        empty_submit_ms_p50: empty.submit_ms_p50,
        empty_pickup_ms_p50: empty.p50,
        pickup_ms_p99: pct(&pickup, 0.99),
        samples,
        populate_secs,
        rows_written: written,
        db_mb,
        engine_start_ms: start_ms,
        plans,
        db_bytes: 0,
        startup_s: 0.0,
        backup_ratio: 0.0,
        restore_ratio: 0.0,
        check_ratio: 0.0,
        render_ratio: 0.0,
        rss_mb: 0.0,
        set_wall_ratio: 0.0,
        file: Default::default(),
        set_wall: None,
        render: None,
    })
}

/// EXPLAIN QUERY PLAN of the engine's hot queries, for the report.
async fn query_plans(store: &Store) -> Result<Vec<String>, StoreError> {
    const QUERIES: &[(&str, &str)] = &[
        ("submit: key lookup", "SELECT id, request_hash FROM tasks WHERE idempotency_key = 'x'"),
        (
            "dispatch: ready, one lane",
            "SELECT id FROM envelopes WHERE status = 'pending' AND pass IS NOT NULL AND provider = 'bench'
             AND lane = 'fresh' ORDER BY pass, id LIMIT 8",
        ),
        (
            "dispatch: slots in use",
            "SELECT count(*) FROM envelopes WHERE status = 'sent' AND provider = 'bench' AND lane = 'recovery'",
        ),
        (
            "dispatch: next waiting due",
            "SELECT min(due_at) FROM envelopes WHERE status = 'pending' AND pass IS NULL AND due_at IS NOT NULL",
        ),
        (
            "submit: a key's last place",
            "SELECT max(pass) FROM envelopes WHERE status = 'pending' AND pass IS NOT NULL AND provider = 'bench'
             AND lane = 'fresh' AND fair_key = ''",
        ),
        ("reconciler: next deadline", "SELECT min(lease_expires_at) FROM envelopes WHERE status = 'sent'"),
        (
            "reconciler: leftovers",
            "SELECT e.id FROM envelopes e LEFT JOIN executions x ON x.task_id = e.task_id AND x.status = 'running'
             WHERE e.status = 'sent' AND (e.lease_expires_at <= 1 OR e.lease_boot IS NOT 'b')",
        ),
        ("claim: running execution", "SELECT token FROM executions WHERE task_id = 'x' AND status = 'running'"),
    ];
    store
        .read(|c| {
            let mut out = Vec::new();
            for (name, q) in QUERIES {
                let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {q}"))?;
                let rows = stmt.query_map([], |r| r.get::<_, String>(3))?;
                let detail = rows.collect::<Result<Vec<_>, _>>()?.join("; ");
                out.push(format!("{name}: {detail}"));
            }
            Ok(out)
        })
        .await
}

async fn count(store: &Store, sql: &'static str) -> Result<i64, String> {
    store.read(move |c| Ok(c.query_row(sql, [], |r| r.get::<_, i64>(0))?)).await.map_err(s)
}

/// Section 5: restart recovery of `n` tasks left in phase `calling` by a killed engine.
pub async fn recovery(out: &Path, n: u64) -> Result<Recovery, String> {
    let dir = fresh_dir(out, "recovery")?;
    let db = dir.join("tally.db");
    let store = Store::open(&db, Durability::Full).map_err(s)?;
    // A provider that can look jobs up (so recovery resumes instead of marking `unknown`)
    // and hangs on every call.
    let fake = Arc::new(Fake::asynchronous(u32::MAX));
    fake.script(std::iter::repeat_n(Step::Hang, n as usize));
    let engine = Arc::new(start(store, &dir, n as usize, fake.clone(), n as usize).await?);
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for k in 0..16u64 {
        let e = engine.clone();
        set.spawn(async move {
            let mut i = k;
            while i < n {
                e.submit(task(i, None)).await.map_err(s)?;
                i += 16;
            }
            Ok::<_, String>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(s)??;
    }
    tokio::time::timeout(Duration::from_secs(300), fake.wait_received(n as u32))
        .await
        .map_err(|_| format!("only {} of {n} calls started within 300 s", fake.counts().received))?;
    let setup_secs = t0.elapsed().as_secs_f64();
    let calling =
        count(engine.store(), "SELECT count(*) FROM executions WHERE status = 'running' AND phase = 'calling'").await?;
    if calling != n as i64 {
        return Err(format!("expected {n} executions in phase calling, found {calling}"));
    }
    engine.kill();
    drop(engine);
    tokio::time::sleep(Duration::from_millis(200)).await; // let the aborted tasks drop
    // Restart on the same database. No workers, so nothing is dispatched after recovery and
    // the counts below show exactly what the start-up reconcile did.
    let store = Store::open(&db, Durability::Full).map_err(s)?;
    let provider: Arc<dyn Provider> = Arc::new(Fake::asynchronous(u32::MAX));
    let t1 = Instant::now();
    let engine = start(store, &dir, 0, provider, 1).await?;
    let recovery_ms = t1.elapsed().as_secs_f64() * 1e3;
    let still_sent = count(engine.store(), "SELECT count(*) FROM envelopes WHERE status = 'sent'").await?;
    let requeued = count(engine.store(), "SELECT count(*) FROM envelopes WHERE status = 'pending'").await?;
    let statements = engine.store().statements();
    stop(engine).await?;
    if still_sent != 0 || requeued != n as i64 {
        return Err(format!("after recovery: {still_sent} envelopes still sent, {requeued} pending (want 0 and {n})"));
    }
    Ok(Recovery { in_flight: n, recovery_ms, requeued: requeued as u64, setup_secs, statements })
}
