//! The wall time of an image set (part of `tally bench --only scale`): a set of 3 shots × 4
//! candidates against an in-process provider of 4 slots whose every image takes a fixed time,
//! created through the engine's set intake (as `POST /v1/sets` is) and timed from its creation
//! until every task of it settled. The shots of a set go one after another and the candidates
//! of a shot together, within the provider's slots, so the ideal is Σ over shots ⌈candidates ÷
//! slots⌉ × the image time; the ratio says how close the engine comes. While the set runs, one
//! plain job is submitted (once the set holds every slot) and its pickup (submit → its call's
//! start) recorded: the fair queue gives it the first slot freed, ahead of the set's next shot,
//! so it waits at most about one image's time. Its own call is answered at once, so it costs
//! the set only milliseconds.

// Called by the scale section of `tally bench` and by its test below.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::sys::pct;
use crate::clock::SystemClock;
use crate::config::{Durability, EngineConfig};
use crate::engine::{Engine, EngineParts, ProviderEntry};
use crate::metrics::Metrics;
use crate::providers::{BoxFuture, CallError, CallRequest, Capabilities, Image, Provider, Submitted};
use crate::store::{NewSet, NewShot, NewTask, SetStatus, Store, SubmitOutcome, set_summary};

const PROVIDER: &str = "bench-set";
const SHOTS: u32 = 3;
const CANDIDATES: u32 = 4;
/// The provider's slots (its concurrency).
const SLOTS: u32 = 4;
/// How long the provider takes per image of the set (its service time).
const PER_IMAGE: Duration = Duration::from_millis(400);
/// The prompt that marks the plain job (answered at once).
const PLAIN: &str = "plain job";
/// How long one round may take before it is called stuck.
const ROUND_LIMIT: Duration = Duration::from_secs(60);

/// The result (`set_wall` in the scale section's JSON).
#[derive(Debug, Clone, Serialize)]
pub struct SetWall {
    /// Shots of the set.
    pub shots: u32,
    /// Candidates per shot.
    pub candidates: u32,
    /// The provider's slots.
    pub slots: u32,
    /// The provider's time per image of the set, in milliseconds.
    pub per_image_ms: f64,
    /// Per round: the set's creation → every task of it settled, in seconds.
    pub wall_s: Vec<f64>,
    /// Σ over shots ⌈candidates ÷ slots⌉ × the image time, in seconds.
    pub ideal_s: f64,
    /// The median over rounds of wall ÷ ideal.
    pub ratio: f64,
    /// The most calls the provider had in flight at once (never more than `slots`).
    pub max_in_flight: u32,
    /// The median pickup of the plain job submitted while the set ran (submit → its call's
    /// start), in milliseconds.
    pub fresh_pickup_ms_p50: f64,
}

/// A provider that answers each image of the set after [`PER_IMAGE`] (its service time, not
/// synchronisation) and the plain job at once, counting the calls in flight.
struct Slow {
    in_flight: AtomicU32,
    max_in_flight: AtomicU32,
    /// When the plain job's call started.
    plain_start: Mutex<Option<Instant>>,
    png: Vec<u8>,
}

impl Provider for Slow {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn submit<'a>(&'a self, req: &'a CallRequest) -> BoxFuture<'a, Result<Submitted, CallError>> {
        let now = Instant::now();
        Box::pin(async move {
            let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(n, Ordering::SeqCst);
            if req.prompt.starts_with(PLAIN) {
                *self.plain_start.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
            } else {
                tokio::time::sleep(PER_IMAGE).await;
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(Submitted::Done(Image { bytes: self.png.clone(), media_type: "image/png".into() }))
        })
    }
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// The set every round creates.
fn new_set(round: usize) -> NewSet {
    let roles = ["main", "selling_point", "scene"];
    NewSet {
        product: "red sneaker".into(),
        style: Some("studio light".into()),
        provider: PROVIDER.into(),
        references: Vec::new(),
        shots: (0..SHOTS as usize)
            .map(|i| NewShot {
                role: roles[i % roles.len()].into(),
                prompt: format!("shot {i} of round {round}"),
                params: serde_json::json!({}),
                candidates: CANDIDATES,
                ..NewShot::default()
            })
            .collect(),
        idempotency_key: None,
    }
}

/// One round on its own database and engine: (wall seconds, plain job's pickup ms, max calls
/// in flight).
async fn round(out: &Path, round_no: usize) -> Result<(f64, f64, u32), String> {
    let dir = super::sections::fresh_dir(out, &format!("set-wall-{round_no}"))?;
    let store = Store::open(&dir.join("tally.db"), Durability::Full).map_err(s)?;
    let provider = Arc::new(Slow {
        in_flight: AtomicU32::new(0),
        max_in_flight: AtomicU32::new(0),
        plain_start: Mutex::new(None),
        png: crate::render::placeholder_png("set wall", 8),
    });
    let dyn_provider: Arc<dyn Provider> = provider.clone();
    let engine = Engine::start(EngineParts {
        store: store.clone(),
        config: EngineConfig { workers: 8, ..EngineConfig::default() },
        clock: Arc::new(SystemClock),
        providers: vec![ProviderEntry::new(PROVIDER, dyn_provider, SLOTS as usize)],
        data_dir: dir.clone(),
        metrics: Arc::new(Metrics::new()),
        limits: Vec::new(),
    })
    .await
    .map_err(|e| format!("engine start: {e}"))?;
    let t0 = Instant::now();
    let id = match engine.create_set(new_set(round_no)).await.map_err(s)? {
        SubmitOutcome::Created(id) => id,
        other => return Err(format!("the set was not created: {other:?}")),
    };
    let mut plain: Option<Instant> = None;
    let wall = loop {
        if t0.elapsed() > ROUND_LIMIT {
            return Err(format!("the set did not settle within {} s", ROUND_LIMIT.as_secs()));
        }
        // The plain job arrives once the set holds every slot.
        if plain.is_none() && provider.in_flight.load(Ordering::SeqCst) >= SLOTS {
            let t = NewTask { provider: PROVIDER.into(), prompt: format!("{PLAIN} {round_no}"), ..NewTask::default() };
            let at = Instant::now();
            engine.submit(t).await.map_err(s)?;
            plain = Some(at);
        }
        let set = store.get_set(id.clone()).await.map_err(s)?.ok_or("the set is gone")?;
        if set_summary(&set).0 != SetStatus::Running {
            break t0.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    // The plain job may still be waiting if the set never held every slot: wait for its call.
    let pickup = loop {
        let started = *provider.plain_start.lock().unwrap_or_else(|e| e.into_inner());
        match (plain, started) {
            (Some(at), Some(st)) => break st.saturating_duration_since(at).as_secs_f64() * 1e3,
            (None, _) => break f64::NAN,
            _ if t0.elapsed() > ROUND_LIMIT => return Err("the plain job was never sent".into()),
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    };
    engine.shutdown().await;
    let max = provider.max_in_flight.load(Ordering::SeqCst);
    drop(engine);
    store.close().map_err(s)?;
    Ok((wall.as_secs_f64(), pickup, max))
}

/// Run `rounds` rounds (at least one), each on a fresh database under `out`.
pub(super) async fn set_wall(out: &Path, rounds: usize) -> Result<SetWall, String> {
    let per_image = PER_IMAGE.as_secs_f64();
    let ideal = f64::from(SHOTS * CANDIDATES.div_ceil(SLOTS)) * per_image;
    let (mut walls, mut ratios, mut pickups, mut max) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for r in 0..rounds.max(1) {
        let (wall, pickup, m) = round(out, r).await?;
        walls.push(wall);
        ratios.push(wall / ideal);
        if pickup.is_finite() {
            pickups.push(pickup);
        }
        max = max.max(m);
    }
    ratios.sort_by(f64::total_cmp);
    pickups.sort_by(f64::total_cmp);
    Ok(SetWall {
        shots: SHOTS,
        candidates: CANDIDATES,
        slots: SLOTS,
        per_image_ms: per_image * 1e3,
        wall_s: walls,
        ideal_s: ideal,
        ratio: pct(&ratios, 0.5),
        max_in_flight: max,
        fresh_pickup_ms_p50: pct(&pickups, 0.5),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A benchmark test (a few seconds): the candidates of a shot share the provider's slots,
    /// so the set takes about its ideal time, never more calls in flight than the slots, and the
    /// plain job is not queued behind the set's later shots.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_set_takes_about_its_ideal_time_within_the_providers_slots() {
        let out = std::env::temp_dir().join(format!("tally-set-wall-{}", uuid::Uuid::new_v4()));
        let r = set_wall(&out, 1).await.expect("set wall");
        let _ = std::fs::remove_dir_all(&out);
        assert!(r.ratio <= 1.2, "wall {:?} s against the ideal {} s: {r:?}", r.wall_s, r.ideal_s);
        assert!(r.max_in_flight <= r.slots, "{r:?}");
        assert_eq!(r.max_in_flight, r.slots, "a shot's candidates ran together: {r:?}");
        assert!(r.fresh_pickup_ms_p50 < r.per_image_ms * 1.5, "the plain job waited behind the set: {r:?}");
    }
}
