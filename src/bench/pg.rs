//! `tally bench --backend postgres`: the PostgreSQL backend measured beside SQLite in the same
//! run, on the same machine, with the same engine, instant provider and method.
//!
//! Sections (each PostgreSQL figure in a fresh schema of the `--postgres-url` database,
//! dropped afterwards; nodes are engines in this process, each with its own `PgStore`, node
//! name, node lock and LISTEN connection, as separate daemons would have):
//! - **e2e**: `n` tasks submitted by 16 concurrent submitters spread over the nodes, submit →
//!   `succeeded`, on SQLite (`durability = "full"`) and on PostgreSQL with 1 and 2 nodes (16
//!   workers per node, `max_concurrency` 16: one account, capped across the cluster).
//! - **pickup**: submit call start → provider call start on an idle engine, one task at a
//!   time: SQLite; PostgreSQL on the same node; PostgreSQL submitted on one node and picked
//!   up by another (the NOTIFY wake-up).
//! - **idle**: two nodes that ran a task, then two windows of nothing: the statements their
//!   stores ran in each (client side, exact) and the transactions PostgreSQL counted on the database
//!   (`pg_stat_database`, server side: other sessions on the same database count too, and
//!   this benchmark's own reading of the counter).
//!
//! Completion of an e2e run is polled every 10 ms (the nodes' status broadcasts are per
//! node), so a run's time is over-counted by at most that much.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::provider::InstantProvider;
use super::sections::{self, PROVIDER, fresh_dir, latency_samples, task};
use super::sys::pct;
use crate::clock::SystemClock;
use crate::config::{Durability, EngineConfig};
use crate::domain::TaskStatus;
use crate::engine::{Engine, EngineParts, ProviderEntry};
use crate::metrics::Metrics;
use crate::store::postgres::{PgOptions, PgStore};
use crate::store::{Store, SubmitOutcome};

/// Workers (and the account's `max_concurrency`) per node in the e2e runs.
const WORKERS: usize = 16;

/// What `--backend postgres` measured.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct PgBench {
    /// `SHOW server_version`.
    pub server_version: String,
    /// `SHOW fsync` and `SHOW synchronous_commit` (what a commit costs depends on them).
    pub fsync: String,
    pub synchronous_commit: String,
    pub e2e: Vec<PgE2e>,
    pub pickup: Vec<PgPickup>,
    pub idle: PgIdle,
}

/// One e2e run.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct PgE2e {
    /// `sqlite` or `postgres`.
    pub store: String,
    pub nodes: usize,
    pub workers_per_node: usize,
    pub tasks: u64,
    pub secs: f64,
    pub tasks_per_s: f64,
    /// Statements the stores ran per task (all nodes).
    pub statements_per_task: f64,
    /// Round trips to the server per task (all nodes; statements sent in one batch count
    /// once). `null` on SQLite.
    pub round_trips_per_task: Option<f64>,
    /// Provider calls per task (must be 1).
    pub calls_per_task: f64,
    /// Time the database's sessions spent waiting for a lock, per task, in milliseconds
    /// (sampled: every [`LOCK_SAMPLE_MS`] the sessions of this database waiting for a row or
    /// table lock — advisory locks aside, on which a node's watcher waits for its peer all
    /// along — are counted, and each counts for one interval). `null` on SQLite.
    pub lock_wait_ms_per_task: Option<f64>,
    /// Of the samples, the share in which some session waited for a lock (`null` on SQLite).
    pub lock_wait_share: Option<f64>,
    /// With `--profile`: where a task's time went, per stage (all nodes together).
    pub profile: Option<super::profile::Profile>,
    /// Wake-ups the nodes heard from each other, per task (all nodes; `null` on SQLite).
    pub hints_per_task: Option<HintsPerTask>,
}

/// Wake-ups heard from other nodes per task (`store::postgres::Heard`): each `due` makes a
/// node with a free worker run a dispatch, each `lease` a deadline read; `task` runs no SQL.
#[derive(Debug, Clone, Serialize)]
pub struct HintsPerTask {
    /// `tally_due` hints (a submit or a freed slot on another node).
    pub due: f64,
    /// `tally_lease` hints (a claim on another node).
    pub lease: f64,
    /// `tally_task` hints (a status change on another node).
    pub task: f64,
}

/// The wake-ups `engines` heard so far: (due, lease, task).
fn heard(engines: &[Arc<Engine>]) -> [u64; 3] {
    let mut out = [0; 3];
    for e in engines {
        if let Some(pg) = e.store().postgres() {
            let h = &pg.signals().heard;
            for (o, c) in out.iter_mut().zip([&h.due, &h.lease, &h.task]) {
                *o += c.load(std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
    out
}

/// The round trips `engines`' PostgreSQL stores made so far.
fn round_trips(engines: &[Arc<Engine>]) -> u64 {
    engines.iter().filter_map(|e| e.store().postgres().map(|pg| pg.round_trips())).sum()
}

/// How often the lock sampler looks at `pg_locks` during an e2e run.
pub const LOCK_SAMPLE_MS: u64 = 5;

/// One pickup series.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct PgPickup {
    pub store: String,
    /// `same node` or `other node`.
    pub path: String,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub samples: usize,
}

/// Two idle nodes.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct PgIdle {
    pub nodes: usize,
    pub secs: f64,
    /// Statements both nodes' stores ran in the window.
    pub sql_statements: u64,
    /// The same over a second window right after (a deadline armed before the nodes went
    /// idle, such as a lease's expiry, fires once and finds nothing).
    pub second_window_sql_statements: u64,
    /// Transactions PostgreSQL counted on the database over both windows (`xact_commit +
    /// xact_rollback`, read 11 s after them, since the server reports an idle session's
    /// counts up to 10 s late), this benchmark's own reading of the counter included.
    pub server_transactions: i64,
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// A node of `schema`.
fn open(url: &str, schema: &str, node: &str) -> Result<PgStore, String> {
    let store = PgStore::open(PgOptions {
        url: url.into(),
        node: node.into(),
        connections: 4,
        durability: Durability::Full,
        schema: Some(schema.into()),
        db_clock: true,
        listen: true,
        poll: None,
        watch_peers: true,
        lease: EngineConfig::default().lease,
    })
    .map_err(|e| format!("cannot use PostgreSQL ({}): {e}", crate::config::redact_url(url)))?;
    Ok(store)
}

/// An engine on `store` with `workers` and `provider`.
async fn engine(store: PgStore, dir: &Path, workers: usize, provider: Arc<InstantProvider>) -> Result<Engine, String> {
    Engine::start(EngineParts {
        store: Store::Postgres(store),
        config: EngineConfig { workers, ..Default::default() },
        clock: Arc::new(SystemClock),
        providers: vec![ProviderEntry::new(PROVIDER, provider, WORKERS)],
        data_dir: dir.to_path_buf(),
        metrics: Arc::new(Metrics::new()),
        limits: Vec::new(),
    })
    .await
    .map_err(|e| format!("engine start: {e}"))
}

async fn stop(engines: Vec<Engine>) -> Result<(), String> {
    for e in engines {
        e.shutdown().await;
        let store = e.store().clone();
        drop(e);
        store.close().map_err(s)?;
    }
    Ok(())
}

/// Run a query on a connection of its own (off the async threads: the sync client runs a
/// runtime of its own).
async fn admin<T: Send + 'static>(
    url: &str,
    f: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error> + Send + 'static,
) -> Result<T, String> {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).map_err(s)?;
        f(&mut c).map_err(s)
    })
    .await
    .map_err(s)?
}

/// A fresh schema name; dropped by [`drop_schema`].
fn schema_name() -> String {
    format!("tally_bench_{}", uuid::Uuid::new_v4().simple())
}

async fn drop_schema(url: &str, schema: String) -> Result<(), String> {
    admin(url, move |c| c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))).await
}

/// `n` tasks on `nodes` nodes of a fresh schema.
async fn e2e_pg(url: &str, out: &Path, n: u64, nodes: usize) -> Result<PgE2e, String> {
    let schema = schema_name();
    let mut engines = Vec::new();
    let mut providers = Vec::new();
    for k in 0..nodes {
        let dir = fresh_dir(out, &format!("pg-e2e-{nodes}-{k}"))?;
        let provider = Arc::new(InstantProvider::new(false));
        let store = open(url, &schema, &format!("bench-{k}"))?;
        engines.push(Arc::new(engine(store, &dir, WORKERS, provider.clone()).await?));
        providers.push(provider);
    }
    let stmts0: u64 = engines.iter().map(|e| e.store().statements()).sum();
    let trips0 = round_trips(&engines);
    let heard0 = heard(&engines);
    let sampler = LockSampler::start(url)?;
    super::profile::begin();
    let t0 = Instant::now();
    let submitters = 16u64;
    let mut set = tokio::task::JoinSet::new();
    for k in 0..submitters {
        let e = engines[k as usize % nodes].clone();
        set.spawn(async move {
            let mut i = k;
            while i < n {
                e.submit(task(i, None)).await.map_err(s)?;
                i += submitters;
            }
            Ok::<_, String>(())
        });
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let calls: u64 = providers.iter().map(|p| p.calls()).sum();
        if calls >= n {
            let counts = engines[0].status_counts().await.map_err(s)?;
            let done: i64 = counts.iter().filter(|(st, _)| *st == TaskStatus::Succeeded).map(|(_, c)| *c).sum();
            if done as u64 >= n {
                break;
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("postgres e2e ({nodes} nodes): {calls} of {n} calls after 600 s"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let profile = super::profile::end(n);
    let (samples, waiting, some_waiting) = sampler.stop().await?;
    while let Some(r) = set.join_next().await {
        r.map_err(s)??;
    }
    let stmts: u64 = engines.iter().map(|e| e.store().statements()).sum::<u64>() - stmts0;
    let trips = round_trips(&engines) - trips0;
    let hints = heard(&engines);
    let per_task = |i: usize| (hints[i] - heard0[i]) as f64 / n as f64;
    let hints_per_task = HintsPerTask { due: per_task(0), lease: per_task(1), task: per_task(2) };
    let calls: u64 = providers.iter().map(|p| p.calls()).sum();
    let engines: Vec<Engine> = engines
        .into_iter()
        .map(|e| Arc::try_unwrap(e).map_err(|_| "engine still shared".to_string()))
        .collect::<Result<_, _>>()?;
    stop(engines).await?;
    drop_schema(url, schema).await?;
    Ok(PgE2e {
        store: "postgres".into(),
        nodes,
        workers_per_node: WORKERS,
        tasks: n,
        secs,
        tasks_per_s: n as f64 / secs,
        statements_per_task: stmts as f64 / n as f64,
        round_trips_per_task: Some(trips as f64 / n as f64),
        calls_per_task: calls as f64 / n as f64,
        lock_wait_ms_per_task: Some(waiting as f64 * LOCK_SAMPLE_MS as f64 / n as f64),
        lock_wait_share: Some(if samples == 0 { 0.0 } else { some_waiting as f64 / samples as f64 }),
        profile,
        hints_per_task: Some(hints_per_task),
    })
}

/// Counts, on a connection of its own, the sessions of the database waiting for a lock,
/// every [`LOCK_SAMPLE_MS`], until stopped.
struct LockSampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: tokio::task::JoinHandle<Result<(u64, u64, u64), String>>,
}

/// Sessions of this database waiting for a lock that is not advisory (row locks show as waits
/// for the holder's transaction id, which names no database: hence the join).
const LOCK_WAITERS: &str = "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE NOT l.granted AND l.locktype <> 'advisory' AND a.datname = current_database()";

impl LockSampler {
    fn start(url: &str) -> Result<LockSampler, String> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (url, flag) = (url.to_string(), stop.clone());
        let handle = tokio::task::spawn_blocking(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).map_err(s)?;
            let st = c.prepare(LOCK_WAITERS).map_err(s)?;
            let (mut samples, mut waiting, mut some) = (0u64, 0u64, 0u64);
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let k: i64 = c.query_one(&st, &[]).map_err(s)?.get(0);
                samples += 1;
                waiting += k.max(0) as u64;
                some += u64::from(k > 0);
                // A sampling interval, not a wait for anything.
                std::thread::sleep(Duration::from_millis(LOCK_SAMPLE_MS));
            }
            Ok((samples, waiting, some))
        });
        Ok(LockSampler { stop, handle })
    }

    /// Stop; (samples, waiting sessions summed over the samples, samples with a waiter).
    async fn stop(self) -> Result<(u64, u64, u64), String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.await.map_err(s)?
    }
}

fn series(store: &str, path: &str, sorted: &[f64]) -> PgPickup {
    PgPickup {
        store: store.into(),
        path: path.into(),
        p50: pct(sorted, 0.5),
        p99: pct(sorted, 0.99),
        max: pct(sorted, 1.0),
        samples: sorted.len(),
    }
}

/// Pickup on one node, then submitted on a bare node (a store with no engine, as another
/// daemon's API would) and picked up by the other through its wake-up.
async fn pickup_pg(url: &str, out: &Path, samples: usize) -> Result<Vec<PgPickup>, String> {
    let schema = schema_name();
    let dir = fresh_dir(out, "pg-pickup")?;
    let provider = Arc::new(InstantProvider::new(true));
    let worker = engine(open(url, &schema, "bench-worker")?, &dir, 1, provider.clone()).await?;
    let (_, same) = latency_samples(&worker, &provider, samples, 5, "pg-same").await?;
    let submitter = Store::from(open(url, &schema, "bench-submitter")?);
    let mut rx = worker.subscribe();
    let mut other = Vec::with_capacity(samples);
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..samples + 5 {
        let t0 = Instant::now();
        let out = submitter.submit(task(i as u64, Some(format!("bench-pg-other-{i}"))), 0).await.map_err(s)?;
        let SubmitOutcome::Created(id) = out else { return Err(format!("submit was not created: {out:?}")) };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => return Err(format!("task {id} submitted on another node did not succeed within 30 s")),
                Ok(Ok(ch)) if ch.task_id == id && ch.status == TaskStatus::Succeeded => break,
                Ok(Ok(ch)) if ch.task_id == id && ch.status.is_settled() => {
                    return Err(format!("task {id} ended {:?}", ch.status));
                }
                Ok(Ok(_)) => {}
                Ok(Err(_)) => rx = worker.subscribe(),
            }
        }
        let started = provider.started(&id).ok_or_else(|| format!("the provider never saw task {id}"))?;
        if i >= 5 {
            other.push(started.saturating_duration_since(t0).as_secs_f64() * 1e3);
        }
        tokio::time::sleep(Duration::from_millis(5 + super::sys::jitter(&mut rng, 100))).await;
    }
    other.sort_by(f64::total_cmp);
    submitter.close().map_err(s)?;
    stop(vec![worker]).await?;
    drop_schema(url, schema).await?;
    Ok(vec![series("postgres", "same node", &same), series("postgres", "other node", &other)])
}

/// Transactions PostgreSQL has counted on the database so far.
async fn server_transactions(url: &str) -> Result<i64, String> {
    admin(url, |c| {
        Ok(c.query_one(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )?
        .get::<_, i64>(0))
    })
    .await
}

/// Two nodes that ran one task each, then left alone.
async fn idle_pg(url: &str, out: &Path, secs: f64) -> Result<PgIdle, String> {
    let schema = schema_name();
    let (mut engines, mut providers) = (Vec::new(), Vec::new());
    for k in 0..2 {
        let dir = fresh_dir(out, &format!("pg-idle-{k}"))?;
        let provider = Arc::new(InstantProvider::new(false));
        let e = engine(open(url, &schema, &format!("bench-idle-{k}"))?, &dir, 4, provider.clone()).await?;
        e.submit(task(k, None)).await.map_err(s)?;
        engines.push(e);
        providers.push(provider);
    }
    // Either node may run either task; wait until both have succeeded.
    let deadline = Instant::now() + Duration::from_secs(30);
    let succeeded = |counts: Vec<(TaskStatus, i64)>| {
        counts.iter().filter(|(st, _)| *st == TaskStatus::Succeeded).map(|(_, c)| *c).sum::<i64>()
    };
    while providers.iter().map(|p| p.calls()).sum::<u64>() < 2
        || succeeded(engines[0].status_counts().await.map_err(s)?) < 2
    {
        if Instant::now() >= deadline {
            return Err("idle: the first tasks were never called".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let the last hand-offs settle, and the server's statistics: a session reports its
    // counts when it goes idle, but an idle session's last counts up to 10 s later
    // (PostgreSQL 15's `PGSTAT_IDLE_INTERVAL`), so 12 s.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let statements = |engines: &[Engine]| engines.iter().map(|e| e.store().statements()).sum::<u64>();
    let st0 = statements(&engines);
    let x0 = server_transactions(url).await?;
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let st1 = statements(&engines);
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let st2 = statements(&engines);
    // The same 10 s delay for whatever the windows did, so the counter is read 11 s later.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let x1 = server_transactions(url).await?;
    stop(engines).await?;
    drop_schema(url, schema).await?;
    Ok(PgIdle {
        nodes: 2,
        secs,
        sql_statements: st1 - st0,
        second_window_sql_statements: st2 - st1,
        server_transactions: x1 - x0,
    })
}

/// Run every `--backend postgres` section against `url`.
pub async fn run(url: &str, out: &Path, quick: bool) -> Result<PgBench, String> {
    let (n, samples, idle_secs) = if quick { (1_000, 50, 5.0) } else { (5_000, 200, 30.0) };
    let (server_version, fsync, synchronous_commit) = admin(url, |c| {
        let show = |c: &mut postgres::Client, what: &str| -> Result<String, postgres::Error> {
            Ok(c.query_one(&format!("SHOW {what}"), &[])?.get(0))
        };
        Ok((show(c, "server_version")?, show(c, "fsync")?, show(c, "synchronous_commit")?))
    })
    .await?;
    super::progress(&format!("postgres {server_version} (fsync {fsync}, synchronous_commit {synchronous_commit})"));

    let mut e2e = Vec::new();
    let sqlite = sections::e2e(out, n, WORKERS, Durability::Full, true).await?;
    super::progress(&format!("postgres e2e: SQLite baseline {:.0} tasks/s", sqlite.tasks_per_s));
    e2e.push(PgE2e {
        store: "sqlite".into(),
        nodes: 1,
        workers_per_node: WORKERS,
        tasks: n,
        secs: sqlite.secs,
        tasks_per_s: sqlite.tasks_per_s,
        statements_per_task: sqlite.statements_per_task,
        round_trips_per_task: None,
        calls_per_task: sqlite.calls_per_task,
        lock_wait_ms_per_task: None,
        lock_wait_share: None,
        profile: sqlite.profile.clone(),
        hints_per_task: None,
    });
    for nodes in [1, 2] {
        let r = e2e_pg(url, out, n, nodes).await?;
        super::progress(&format!("postgres e2e, {nodes} node(s): {:.0} tasks/s", r.tasks_per_s));
        e2e.push(r);
    }

    let base = sections::pickup(out, samples, Durability::Full).await?;
    let mut pickup = vec![PgPickup {
        store: "sqlite".into(),
        path: "same node".into(),
        p50: base.p50,
        p99: base.p99,
        max: base.max,
        samples: base.samples,
    }];
    pickup.extend(pickup_pg(url, out, samples).await?);
    for p in &pickup {
        super::progress(&format!("pickup {} {}: p50 {:.2} ms, p99 {:.2} ms", p.store, p.path, p.p50, p.p99));
    }

    super::progress(&format!("postgres idle: two nodes, 2 × {idle_secs} s"));
    let idle = idle_pg(url, out, idle_secs).await?;
    Ok(PgBench { server_version, fsync, synchronous_commit, e2e, pickup, idle })
}

/// The table of a [`PgBench`].
pub fn render(t: &mut String, r: &PgBench) {
    use std::fmt::Write as _;
    let _ = writeln!(
        t,
        "\nPostgreSQL {} (fsync {}, synchronous_commit {}) beside SQLite, same run",
        r.server_version, r.fsync, r.synchronous_commit
    );
    let _ = writeln!(
        t,
        "{:<9} {:>5} {:>8} {:>7} {:>8} {:>9} {:>8} {:>7} {:>12} {:>10}",
        "store", "nodes", "workers", "tasks", "secs", "tasks/s", "stmts/t", "calls/t", "lockwait ms/t", "lock share"
    );
    for e in &r.e2e {
        let opt = |v: Option<f64>, d: usize| v.map(|v| format!("{v:.d$}")).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            t,
            "{:<9} {:>5} {:>8} {:>7} {:>8.2} {:>9.0} {:>8.1} {:>7.2} {:>12} {:>10}",
            e.store,
            e.nodes,
            e.workers_per_node,
            e.tasks,
            e.secs,
            e.tasks_per_s,
            e.statements_per_task,
            e.calls_per_task,
            opt(e.lock_wait_ms_per_task, 3),
            opt(e.lock_wait_share, 3)
        );
    }
    let _ = writeln!(
        t,
        "   lock waits: sessions of the database waiting for a row or table lock, sampled every {LOCK_SAMPLE_MS} ms"
    );
    for e in &r.e2e {
        if let Some(rt) = e.round_trips_per_task {
            let _ = writeln!(t, "   {} node(s): round trips to the server per task: {rt:.1}", e.nodes);
        }
    }
    for e in &r.e2e {
        if let Some(h) = &e.hints_per_task {
            let _ = writeln!(
                t,
                "   {} node(s): wake-ups heard from other nodes per task: due {:.2}, lease {:.2}, task {:.2}",
                e.nodes, h.due, h.lease, h.task
            );
        }
    }
    for e in &r.e2e {
        if let Some(p) = &e.profile {
            super::profile::render(t, &format!("{} {} node(s)", e.store, e.nodes), p);
        }
    }
    let _ = writeln!(t, "pickup (submit → provider call, idle engine), ms:");
    for p in &r.pickup {
        let _ = writeln!(
            t,
            "  {:<9} {:<11} p50 {:>7.2}  p99 {:>7.2}  max {:>7.2}  ({} samples)",
            p.store, p.path, p.p50, p.p99, p.max, p.samples
        );
    }
    let _ = writeln!(
        t,
        "idle: {} nodes, 2 windows of {} s: {} and {} statements from the nodes, {} transactions counted by the server",
        r.idle.nodes,
        r.idle.secs,
        r.idle.sql_statements,
        r.idle.second_window_sql_statements,
        r.idle.server_transactions
    );
}
