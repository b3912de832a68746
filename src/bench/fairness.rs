//! `tally bench --only fairness`: fresh tasks against a recovered backlog, on real time.
//!
//! An earlier run "crashed" with `backlog` tasks claimed (the start-up reconcile abandons them
//! into the recovery lane); the engine then serves them with one provider of 8 slots whose
//! calls take S ± 50 % (S = 50 ms, in-process, no network), while fresh tasks arrive as a
//! Poisson stream worth two slots of demand (40 per second at S = 50 ms, the model's 0.2/s at
//! S = 10 s scaled). Reported: the fresh tasks' pickup (submit call start → provider call
//! start), the recovery lane's share of the dispatches made while both lanes had work
//! waiting, and how long the backlog took to drain. The same run with
//! `engine.dispatch_order = "fifo"` gives the baseline.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::sys::pct;
use crate::clock::{Clock, SystemClock};
use crate::config::{Durability, EngineConfig};
use crate::domain::TaskStatus;
use crate::engine::{Engine, EngineParts, ProviderEntry};
use crate::metrics::Metrics;
use crate::providers::{BoxFuture, CallError, CallRequest, Capabilities, Image, Provider, Submitted};
use crate::store::{DispatchOrder, NewTask, ProviderSlots, Store};

/// The service time S (ms) and the provider's slots.
pub const SERVICE_MS: u64 = 50;
/// The provider's slots (its concurrency).
pub const SLOTS: usize = 8;

/// Percentiles of a pickup distribution, in milliseconds.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Pickups {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub samples: usize,
}

/// The section's result (`fairness` in the JSON).
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Fairness {
    pub backlog: usize,
    pub slots: usize,
    pub service_ms: u64,
    /// Fresh arrivals per second.
    pub fresh_per_s: f64,
    pub fresh_pickup_ms: Pickups,
    pub fifo_fresh_pickup_ms: Pickups,
    /// Recovery dispatches ÷ all dispatches made while both lanes had work waiting.
    pub recovery_share: f64,
    pub fifo_recovery_share: f64,
    /// Engine start → the last recovered task succeeded.
    pub drain_ms: f64,
    pub fifo_drain_ms: f64,
}

/// Who waits, updated as tasks are submitted and calls start (told apart by their prompts).
#[derive(Default)]
struct Lanes {
    /// Recovered tasks not started yet.
    backlog: usize,
    /// Fresh tasks submitted (or being submitted) and not started yet.
    fresh_waiting: usize,
    both_busy: u64,
    both_busy_recovery: u64,
    /// (task id, call start) of fresh tasks.
    starts: Vec<(String, Instant)>,
}

/// A provider whose calls take S ± 50 %.
struct Timed {
    lanes: Mutex<Lanes>,
    rng: Mutex<u64>,
    png: Vec<u8>,
}

impl Provider for Timed {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        let now = Instant::now();
        Box::pin(async move {
            {
                let mut l = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
                let recovered = req.prompt.starts_with("recovered ");
                if l.backlog > 0 && l.fresh_waiting > 0 {
                    l.both_busy += 1;
                    l.both_busy_recovery += u64::from(recovered);
                }
                if recovered {
                    l.backlog = l.backlog.saturating_sub(1);
                } else {
                    l.fresh_waiting = l.fresh_waiting.saturating_sub(1);
                    l.starts.push((req.task_id.clone(), now));
                }
            }
            let r = {
                let mut s = self.rng.lock().unwrap_or_else(|e| e.into_inner());
                super::sys::jitter(&mut s, 1_000_000) as f64 / 1e6
            };
            tokio::time::sleep(Duration::from_secs_f64(SERVICE_MS as f64 / 1e3 * (0.5 + r))).await;
            Ok(Submitted::Done(Image { bytes: self.png.clone(), media_type: "image/png".into() }))
        })
    }
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn pickups(mut v: Vec<f64>) -> Pickups {
    v.sort_by(f64::total_cmp);
    Pickups { p50: pct(&v, 0.5), p95: pct(&v, 0.95), p99: pct(&v, 0.99), samples: v.len() }
}

/// One run: (fresh pickups in ms, recovery share, drain ms).
async fn run(dir: &Path, backlog: usize, order: DispatchOrder) -> Result<(Vec<f64>, f64, f64), String> {
    const PROVIDER: &str = "bench";
    let store = Store::open(&dir.join("tally.db"), Durability::Full).map_err(s)?;
    store.configure_providers(vec![ProviderSlots::new(PROVIDER, backlog)]).await.map_err(s)?;
    let mut set = tokio::task::JoinSet::new();
    for k in 0..16 {
        let store = store.clone();
        set.spawn(async move {
            let mut ids = Vec::new();
            let mut i = k;
            while i < backlog {
                let t = NewTask { provider: PROVIDER.into(), prompt: format!("recovered {i}"), ..NewTask::default() };
                ids.push(store.submit(t, SystemClock.now()).await.map_err(s)?.task_id().to_string());
                i += 16;
            }
            Ok::<_, String>(ids)
        });
    }
    let mut ids = 0;
    while let Some(r) = set.join_next().await {
        ids += r.map_err(s)??.len();
    }
    // The crash: an earlier run claimed everything and died before calling.
    let claimed = store.dispatch_due(SystemClock.now(), backlog, 60_000, "crashed").await.map_err(s)?.claims.len();
    if claimed != backlog {
        return Err(format!("claimed {claimed} of {backlog}"));
    }
    let provider = Arc::new(Timed {
        lanes: Mutex::new(Lanes { backlog: ids, ..Lanes::default() }),
        rng: Mutex::new(0x9E37_79B9_7F4A_7C15),
        png: crate::render::placeholder_png("fair", 8),
    });
    let dyn_provider: Arc<dyn Provider> = provider.clone();
    let t0 = Instant::now();
    let engine = Arc::new(
        Engine::start(EngineParts {
            store: store.clone(),
            config: EngineConfig { workers: 16, dispatch_order: order, ..Default::default() },
            clock: Arc::new(SystemClock),
            providers: vec![ProviderEntry::new(PROVIDER, dyn_provider, SLOTS)],
            data_dir: dir.to_path_buf(),
            metrics: Arc::new(Metrics::new()),
            limits: Vec::new(),
        })
        .await
        .map_err(|e| format!("engine start: {e}"))?,
    );
    // Fresh arrivals, Poisson, worth two slots, until the backlog has drained.
    let rate = 2.0 * 1000.0 / SERVICE_MS as f64;
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
    let mut submitted: Vec<(String, Instant)> = Vec::new();
    let mut next = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(600);
    let drained = loop {
        let left = engine.store().status_counts().await.map_err(s)?;
        let done = left.iter().filter(|(st, _)| *st == TaskStatus::Succeeded).map(|(_, n)| *n).sum::<i64>();
        let backlog_left = provider.lanes.lock().unwrap_or_else(|e| e.into_inner()).backlog;
        if backlog_left == 0 && done as usize >= backlog + submitted.len() {
            break t0.elapsed();
        }
        if Instant::now() > deadline {
            return Err(format!("the backlog did not drain within 600 s ({backlog_left} not started)"));
        }
        let u = (super::sys::jitter(&mut rng, 1_000_000) as f64 + 1.0) / 1e6;
        next += Duration::from_secs_f64(-u.ln() / rate);
        tokio::time::sleep_until(tokio::time::Instant::from_std(next)).await;
        if backlog_left > 0 {
            let t = NewTask {
                provider: PROVIDER.into(),
                prompt: format!("fresh {}", submitted.len()),
                ..NewTask::default()
            };
            // Counted as waiting before the submit, so a call that starts at once is seen.
            provider.lanes.lock().unwrap_or_else(|e| e.into_inner()).fresh_waiting += 1;
            let at = Instant::now();
            let id = engine.submit(t).await.map_err(s)?.task_id().to_string();
            submitted.push((id, at));
        }
    };
    let lanes = provider.lanes.lock().unwrap_or_else(|e| e.into_inner()).starts.clone();
    let starts: std::collections::HashMap<String, Instant> = lanes.into_iter().collect();
    let pick: Vec<f64> = submitted
        .iter()
        .filter_map(|(id, at)| starts.get(id).map(|st| st.saturating_duration_since(*at).as_secs_f64() * 1e3))
        .collect();
    let share = {
        let l = provider.lanes.lock().unwrap_or_else(|e| e.into_inner());
        l.both_busy_recovery as f64 / l.both_busy.max(1) as f64
    };
    engine.shutdown().await;
    let store = engine.store().clone();
    drop(engine);
    store.close().map_err(s)?;
    Ok((pick, share, drained.as_secs_f64() * 1e3))
}

/// The section: a fair run and its FIFO baseline.
pub async fn fairness(out: &Path, backlog: usize) -> Result<Fairness, String> {
    let fair_dir = super::sections::fresh_dir(out, "fairness")?;
    let fifo_dir = super::sections::fresh_dir(out, "fairness-fifo")?;
    let (fair, share, drain) = run(&fair_dir, backlog, DispatchOrder::Fair).await?;
    let (fifo, fifo_share, fifo_drain) = run(&fifo_dir, backlog, DispatchOrder::Fifo).await?;
    Ok(Fairness {
        backlog,
        slots: SLOTS,
        service_ms: SERVICE_MS,
        fresh_per_s: 2.0 * 1000.0 / SERVICE_MS as f64,
        fresh_pickup_ms: pickups(fair),
        fifo_fresh_pickup_ms: pickups(fifo),
        recovery_share: share,
        fifo_recovery_share: fifo_share,
        drain_ms: drain,
        fifo_drain_ms: fifo_drain,
    })
}
