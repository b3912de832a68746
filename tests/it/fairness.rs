//! Fair after an outage (issue #18), deterministically: the real store and engine on a manual
//! clock, against a scripted provider with 8 slots whose calls take S ± 50 % of *virtual* time.
//! A crash leaves 10,000 claims behind (the recovered backlog); the provider is down at first,
//! its circuit opens, and when it closes the recovery lane slow-starts; fresh tasks arrive at
//! 0.2/s (Poisson), and a big batch in one group arrives halfway.
//!
//! The driver only moves time when the engine has nothing left to do at the current instant:
//! every claimed task is blocked in the provider, and no envelope could be dispatched now (no
//! free slot, or nothing ready the lanes may take). It then advances the clock to the next
//! event — a call's end, an arrival, a retry's due time, the end of a pause — and wakes the
//! engine. So the figures are a function of the seed, not of the machine's speed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tally::clock::{Clock, ManualClock};
use tally::config::{Durability, EngineConfig};
use tally::domain::Millis;
use tally::engine::{Engine, EngineParts, ProviderEntry};
use tally::metrics::Metrics;
use tally::providers::{BoxFuture, CallError, CallRequest, Capabilities, Image, Provider, Submitted};
use tally::store::{DispatchOrder, NewTask, ProviderSlots, Store};

/// The mean service time (virtual ms).
const S: Millis = 10_000;
const SLOTS: usize = 8;
const BACKLOG: usize = 10_000;
/// Fresh arrivals per second of virtual time.
const RATE: f64 = 0.2;
const BATCH: usize = 200;
const T0: Millis = 1_700_000_000_000;
const PROVIDER: &str = "v";

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The scripted provider: each call blocks until the driver releases it at its virtual end.
struct Virtual {
    clock: Arc<ManualClock>,
    rng: Mutex<Rng>,
    /// While true every call fails at once as never sent (the outage).
    down: AtomicBool,
    seq: AtomicU64,
    /// Blocked calls by (end, seq): the driver releases them.
    blocked: Mutex<BTreeMap<(Millis, u64), tokio::sync::oneshot::Sender<()>>>,
    /// (task id, virtual start) of every call that went through.
    starts: Mutex<Vec<(String, Millis)>>,
    /// Notified when a call blocks (the driver waits for the engine with it).
    arrived: tokio::sync::Notify,
    png: Vec<u8>,
}

impl Virtual {
    fn new(clock: Arc<ManualClock>, seed: u64) -> Virtual {
        Virtual {
            clock,
            rng: Mutex::new(Rng(seed)),
            down: AtomicBool::new(true),
            seq: AtomicU64::new(0),
            blocked: Mutex::new(BTreeMap::new()),
            starts: Mutex::new(Vec::new()),
            arrived: tokio::sync::Notify::new(),
            png: tally::render::placeholder_png("fair", 8),
        }
    }

    fn blocked(&self) -> usize {
        self.blocked.lock().expect("lock").len()
    }

    fn next_end(&self) -> Option<Millis> {
        self.blocked.lock().expect("lock").keys().next().map(|k| k.0)
    }

    /// Let every call that ends by `now` answer.
    fn release_until(&self, now: Millis) {
        let mut b = self.blocked.lock().expect("lock");
        while let Some(entry) = b.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let _ = entry.remove().send(());
        }
    }
}

impl Provider for Virtual {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        Box::pin(async move {
            if self.down.load(Ordering::SeqCst) {
                return Err(CallError::NotSent("connection refused".into()));
            }
            let start = self.clock.now();
            let service = (S as f64 * (0.5 + self.rng.lock().expect("lock").next())) as Millis;
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.starts.lock().expect("lock").push((req.task_id.clone(), start));
            let seq = self.seq.fetch_add(1, Ordering::SeqCst);
            self.blocked.lock().expect("lock").insert((start + service, seq), tx);
            self.arrived.notify_one();
            let _ = rx.await;
            Ok(Submitted::Done(Image { bytes: self.png.clone(), media_type: "image/png".into() }))
        })
    }
}

/// What the store says about the dispatch state at an instant.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    sent: i64,
    sent_recovery: i64,
    fresh_ready: bool,
    recovery_ready: bool,
    paused_until: Option<Millis>,
    recovery_limit: Option<i64>,
    next_waiting: Option<Millis>,
    live: bool,
}

async fn snapshot(store: &Store, now: Millis) -> Snapshot {
    store
        .read(move |c| {
            Ok(c.query_row(
                "SELECT (SELECT count(*) FROM envelopes WHERE status = 'sent' AND provider = 'v' AND lane = 'fresh')
                        + (SELECT count(*) FROM envelopes WHERE status = 'sent' AND provider = 'v' AND lane = 'recovery'),
                        (SELECT count(*) FROM envelopes WHERE status = 'sent' AND provider = 'v' AND lane = 'recovery'),
                        EXISTS (SELECT 1 FROM envelopes WHERE status = 'pending' AND pass IS NOT NULL
                                AND provider = 'v' AND lane = 'fresh')
                        OR EXISTS (SELECT 1 FROM envelopes WHERE status = 'pending' AND pass IS NULL
                                   AND due_at IS NOT NULL AND due_at <= ?1 AND lane = 'fresh'),
                        EXISTS (SELECT 1 FROM envelopes WHERE status = 'pending' AND pass IS NOT NULL
                                AND provider = 'v' AND lane = 'recovery')
                        OR EXISTS (SELECT 1 FROM envelopes WHERE status = 'pending' AND pass IS NULL
                                   AND due_at IS NOT NULL AND due_at <= ?1 AND lane = 'recovery'),
                        (SELECT paused_until FROM providers WHERE name = 'v'),
                        (SELECT recovery_limit FROM providers WHERE name = 'v'),
                        (SELECT min(due_at) FROM envelopes WHERE status = 'pending' AND pass IS NULL AND due_at > ?1),
                        EXISTS (SELECT 1 FROM envelopes WHERE status = 'sent')
                        OR EXISTS (SELECT 1 FROM envelopes WHERE status = 'pending' AND pass IS NOT NULL AND provider = 'v')
                        OR EXISTS (SELECT 1 FROM envelopes WHERE status = 'pending' AND pass IS NULL AND due_at IS NOT NULL)",
                [now],
                |r| {
                    Ok(Snapshot {
                        sent: r.get(0)?,
                        sent_recovery: r.get(1)?,
                        fresh_ready: r.get(2)?,
                        recovery_ready: r.get(3)?,
                        paused_until: r.get(4)?,
                        recovery_limit: r.get(5)?,
                        next_waiting: r.get(6)?,
                        live: r.get(7)?,
                    })
                },
            )?)
        })
        .await
        .expect("snapshot")
}

/// Could the dispatcher claim something at `now`?
fn dispatchable(s: &Snapshot, now: Millis, order: DispatchOrder) -> bool {
    if s.paused_until.is_some_and(|p| p > now) {
        return false;
    }
    let free = SLOTS as i64 - s.sent;
    let cap = match (order, s.recovery_limit) {
        (DispatchOrder::Fifo, _) => SLOTS as i64,
        (_, Some(l)) if s.paused_until.is_none() => l.min(SLOTS as i64 - 1),
        // A pause that has just ended: the dispatch that closes it starts the slow start.
        (_, _) if s.paused_until.is_some() => 1,
        _ => SLOTS as i64 - 1,
    };
    free > 0 && (s.fresh_ready || (s.recovery_ready && s.sent_recovery < cap))
}

/// The figures of one run.
#[derive(Debug)]
struct Figures {
    fresh_pickup: Vec<Millis>,
    /// Dispatches made while both lanes had work waiting, and how many went to recovery.
    both_busy: usize,
    both_busy_recovery: usize,
    /// (successes since the circuit closed, recovery calls in flight), at every step until
    /// the slow start ended.
    slow_start: Vec<(usize, i64)>,
    /// The biggest batch task's wait (virtual ms) and the steady arrivals during the batch.
    during_batch: Vec<Millis>,
    drained_at: Millis,
    fresh_redispatched: usize,
    paused_events_after_close: usize,
}

fn temp_dir() -> PathBuf {
    crate::engine::temp_dir("fairness")
}

async fn run(order: DispatchOrder, seed: u64) -> Figures {
    let dir = temp_dir();
    let store = Store::open(&dir.join("tally.db"), Durability::Normal).expect("open");
    // The crash: an earlier run claimed 10,000 tasks and died before calling any of them.
    store.configure_providers(vec![ProviderSlots::new(PROVIDER, BACKLOG)]).await.expect("configure");
    let mut backlog = HashSet::new();
    for i in 0..BACKLOG {
        let t = NewTask { provider: PROVIDER.into(), prompt: format!("recovered {i}"), ..NewTask::default() };
        backlog.insert(store.submit(t, T0 - 60_000).await.expect("submit").task_id().to_string());
    }
    let b = store.dispatch_due(T0 - 60_000, BACKLOG, 60_000, "crashed-run").await.expect("dispatch");
    assert_eq!(b.claims.len(), BACKLOG);

    let clock = Arc::new(ManualClock::new(T0));
    let provider = Arc::new(Virtual::new(clock.clone(), seed));
    let cfg = EngineConfig {
        workers: 64,
        lease: Duration::from_secs(100 * 86_400),
        heartbeat: Duration::from_secs(50 * 86_400),
        max_attempts: 1000,
        backoff_base: Duration::from_secs(1),
        backoff_max: Duration::from_secs(10),
        circuit_failures: 5,
        circuit_pause: Duration::from_secs(60),
        dispatch_order: order,
        ..EngineConfig::default()
    };
    let dyn_provider: Arc<dyn Provider> = provider.clone();
    let engine = Engine::start(EngineParts {
        store: store.clone(),
        config: cfg,
        clock: clock.clone(),
        providers: vec![ProviderEntry::new(PROVIDER, dyn_provider, SLOTS)],
        data_dir: dir.clone(),
        metrics: Arc::new(Metrics::new()),
        limits: Vec::new(),
    })
    .await
    .expect("engine");

    let mut rng = Rng(seed ^ 0x9E37_79B9_7F4A_7C15);
    let exp = |r: &mut Rng| (-(1.0 - r.next()).ln() / RATE * 1000.0) as Millis;
    let mut next_arrival: Option<Millis> = None;
    let mut submitted: HashMap<String, Millis> = HashMap::new();
    let mut batch: HashSet<String> = HashSet::new();
    let mut batch_at: Option<Millis> = None;
    let mut started: HashSet<String> = HashSet::new();
    let mut seen_starts = 0;
    let (mut both_busy, mut both_busy_recovery) = (0, 0);
    let mut closed_at: Option<Millis> = None;
    let mut successes_since_close = 0usize;
    let mut slow_start = Vec::new();
    let drained_at: Millis;
    let (mut backlog_left, mut fresh_left) = (BACKLOG, 0usize);
    let mut changes = engine.subscribe();
    let wall = Instant::now();
    loop {
        // Wait until the engine has done everything it can at this instant.
        let now = clock.now();
        let deadline = Instant::now() + Duration::from_secs(30);
        let snap = loop {
            let s = snapshot(&store, now).await;
            if s.sent == provider.blocked() as i64 && !dispatchable(&s, now, order) {
                break s;
            }
            assert!(Instant::now() < deadline, "the engine did not settle at {now}: {s:?}");
            // Each step of the engine shows: a claim or a finish on the change feed, a call in
            // the provider. (The timeout only makes a missed wake-up cost a few ms.)
            tokio::select! {
                _ = provider.arrived.notified() => {}
                _ = changes.recv() => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        };
        assert!(wall.elapsed() < Duration::from_secs(600), "the run takes too long");
        // Account for the calls that started in this step.
        let (fresh_waiting, recovery_waiting) = (fresh_left > 0, backlog_left > 0);
        let new_starts: Vec<String> =
            provider.starts.lock().expect("lock")[seen_starts..].iter().map(|(id, _)| id.clone()).collect();
        seen_starts += new_starts.len();
        for id in new_starts {
            if fresh_waiting && recovery_waiting {
                both_busy += 1;
                if backlog.contains(&id) {
                    both_busy_recovery += 1;
                }
            }
            if started.insert(id.clone()) {
                if backlog.contains(&id) {
                    backlog_left -= 1;
                } else if submitted.contains_key(&id) || batch.contains(&id) {
                    fresh_left -= 1;
                }
            }
        }
        if closed_at.is_some() && snap.recovery_limit.is_some() {
            slow_start.push((successes_since_close, snap.sent_recovery));
        }
        if !snap.live && backlog_left == 0 {
            drained_at = now;
            break;
        }
        // The outage: once the circuit opened, the provider comes back; fresh arrivals start
        // when the circuit has closed.
        if provider.down.load(Ordering::SeqCst) && snap.paused_until.is_some() {
            provider.down.store(false, Ordering::SeqCst);
        }
        if closed_at.is_none() && !provider.down.load(Ordering::SeqCst) && snap.paused_until.is_none() {
            closed_at = Some(now);
            next_arrival = Some(now + exp(&mut rng));
        }
        let events = [provider.next_end(), next_arrival, snap.next_waiting, snap.paused_until.filter(|p| *p > now)];
        let Some(next) = events.into_iter().flatten().min() else {
            panic!("nothing left to happen at {now} but the backlog is not drained: {snap:?}")
        };
        clock.advance(Duration::from_millis((next - now).max(0) as u64));
        let now = clock.now();
        let ending = provider.blocked.lock().expect("lock").range(..(now + 1, 0)).count();
        if closed_at.is_some() {
            successes_since_close += ending;
        }
        provider.release_until(now);
        while let Some(at) = next_arrival.filter(|a| *a <= now) {
            if backlog_left == 0 {
                next_arrival = None;
                break;
            }
            let i = submitted.len();
            let t = NewTask { provider: PROVIDER.into(), prompt: format!("fresh {i}"), ..NewTask::default() };
            let id = engine.submit(t).await.expect("submit").task_id().to_string();
            submitted.insert(id, at);
            fresh_left += 1;
            next_arrival = Some(at + exp(&mut rng));
            // Halfway through the backlog, one client submits a big batch in its own group.
            if batch_at.is_none() && backlog_left < BACKLOG / 2 {
                batch_at = Some(now);
                for j in 0..BATCH {
                    let t = NewTask {
                        provider: PROVIDER.into(),
                        prompt: format!("batch {j}"),
                        group: Some("catalogue".into()),
                        ..NewTask::default()
                    };
                    batch.insert(engine.submit(t).await.expect("submit").task_id().to_string());
                    fresh_left += 1;
                }
            }
        }
        engine.poke();
    }
    let starts: HashMap<String, Millis> = provider.starts.lock().expect("lock").iter().cloned().collect();
    let mut fresh_pickup: Vec<Millis> =
        submitted.iter().filter_map(|(id, at)| starts.get(id).map(|s| s - at)).collect();
    fresh_pickup.sort();
    let batch_end = batch.iter().filter_map(|id| starts.get(id)).max().copied().unwrap_or(0);
    let mut during_batch: Vec<Millis> = submitted
        .iter()
        .filter(|(_, at)| batch_at.is_some_and(|b| **at >= b && **at <= batch_end))
        .filter_map(|(id, at)| starts.get(id).map(|s| s - at))
        .collect();
    during_batch.sort();
    let fresh_ids: Vec<String> = submitted.keys().cloned().collect();
    let closed = closed_at.unwrap_or(T0);
    let (fresh_redispatched, paused_events_after_close) = store
        .read(move |c| {
            let mut redispatched = 0;
            for id in &fresh_ids {
                let n: i64 = c.query_row("SELECT send_count FROM envelopes WHERE task_id = ?1", [id], |r| r.get(0))?;
                redispatched += usize::from(n != 1);
            }
            let paused: i64 = c.query_row(
                "SELECT count(*) FROM events WHERE kind IN ('paused', 'busy') AND at > ?1",
                [closed],
                |r| r.get(0),
            )?;
            Ok((redispatched, paused as usize))
        })
        .await
        .expect("read");
    engine.kill();
    let _ = store.close();
    let _ = std::fs::remove_dir_all(dir);
    Figures {
        fresh_pickup,
        both_busy,
        both_busy_recovery,
        slow_start,
        during_batch,
        drained_at: drained_at - T0,
        fresh_redispatched,
        paused_events_after_close,
    }
}

fn pct(v: &[Millis], p: f64) -> Millis {
    if v.is_empty() {
        return 0;
    }
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

fn report(what: &str, f: &Figures) {
    eprintln!(
        "{what}: fresh pickup p50 {:.2} s, p95 {:.2} s, p99 {:.2} s ({} tasks, S = {} s); steady arrivals during the \
         batch p95 {:.2} s; recovery share while both lanes waited {}/{} = {:.2}; backlog drained at {:.0} s",
        pct(&f.fresh_pickup, 0.5) as f64 / 1e3,
        pct(&f.fresh_pickup, 0.95) as f64 / 1e3,
        pct(&f.fresh_pickup, 0.99) as f64 / 1e3,
        f.fresh_pickup.len(),
        S / 1000,
        pct(&f.during_batch, 0.95) as f64 / 1e3,
        f.both_busy_recovery,
        f.both_busy,
        f.both_busy_recovery as f64 / f.both_busy.max(1) as f64,
        f.drained_at as f64 / 1e3,
    );
}

/// The figure: with a 10,000-task recovered backlog, fresh tasks are picked up within a
/// slot's turn (p95 ≤ S, p99 ≤ 1.5 S), the recovery lane keeps at least 20 % of the dispatches
/// while both lanes have work, nothing waits by being handed out and back, and after the outage
/// the recovery lane grows one call per success (1, 2, 4, … per round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_backlog_does_not_starve_fresh_tasks() {
    let f = run(DispatchOrder::Fair, 7).await;
    report("fair", &f);
    assert!(f.fresh_pickup.len() > 1_000, "{} fresh tasks", f.fresh_pickup.len());
    assert!(pct(&f.fresh_pickup, 0.95) <= S, "p95 {} ms > S", pct(&f.fresh_pickup, 0.95));
    assert!(pct(&f.fresh_pickup, 0.99) <= S * 3 / 2, "p99 {} ms > 1.5 S", pct(&f.fresh_pickup, 0.99));
    assert!(
        pct(&f.during_batch, 0.95) <= S,
        "a single task behind another client's batch waited {} ms (p95)",
        pct(&f.during_batch, 0.95)
    );
    assert!(f.both_busy >= 100, "the batch kept both lanes busy for {} dispatches", f.both_busy);
    assert!(
        f.both_busy_recovery * 5 >= f.both_busy,
        "recovery got {} of {} dispatches while both lanes had work",
        f.both_busy_recovery,
        f.both_busy
    );
    assert_eq!(f.fresh_redispatched, 0, "a fresh task was dispatched more than once");
    assert_eq!(f.paused_events_after_close, 0, "a claim was handed back after the circuit closed");
    // Slow start: never more recovery calls in flight than 1 + the successes since the close,
    // and it reaches the lane's cap (8 − reserve 1).
    assert!(!f.slow_start.is_empty(), "the circuit never closed into a slow start");
    for (ok, in_flight) in &f.slow_start {
        assert!(*in_flight <= 1 + *ok as i64, "{in_flight} recovery calls in flight after {ok} successes");
    }
    assert_eq!(f.slow_start.first().map(|s| s.1), Some(1), "the slow start begins with one call");
    assert!(f.slow_start.iter().any(|(_, n)| *n >= 4), "the slow start never grew: {:?}", f.slow_start);
}

/// The FIFO baseline of the same run (its figures in bench-results/2026-12-01-s4-lean-path-fairness.md,
/// not asserted): by due time alone, a fresh task waits behind the whole backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a baseline for BENCHMARKS.md: cargo test --test it fairness -- --ignored --nocapture"]
async fn fifo_baseline_of_the_same_run() {
    let f = run(DispatchOrder::Fifo, 7).await;
    report("fifo", &f);
}
