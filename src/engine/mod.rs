//! The engine: turns submitted tasks into provider calls and settled results, and recovers
//! from crashes from evidence only.
//!
//! The background services share one [`Shared`] state:
//! - the dispatcher (`dispatcher.rs`) claims ready envelopes for free provider slots in the
//!   store and hands each claim to a worker;
//! - workers (`worker.rs`) record phases, call providers and finish, fenced;
//! - the reconciler (`reconciler.rs`) acts on leases that ran out (DESIGN §6);
//! - with `[retention]`, the retention timer (`retention.rs`) prunes settled work once it is
//!   old enough;
//! - once at start-up, the look at the providers (`lookup.rs`) for jobs an older copy of the
//!   database holds.
//!
//! None of them polls on a fixed interval: each sleeps until the next time something can
//! happen (a due time, a lease deadline) or until another service wakes it.
//!
//! Longer than 600 lines on purpose: the `Engine` handle and the state its services share
//! (slots, breakers, the budget in force, the change feed) are one piece; each service lives in
//! its own file.

pub mod budget;
pub mod db_check;
pub mod deliver;
mod dispatcher;
pub mod drafts;
mod intake;
pub mod lookup;
pub mod money;
mod nodes;
pub mod readiness;
mod reconciler;
mod retention;
mod set_edit;
mod trouble;
mod worker;
pub mod zone;

use crate::domain::operation::Operation;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, broadcast, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::clock::Clock;
use crate::config::EngineConfig;
use crate::domain::{Millis, TaskStatus};
use crate::metrics::Metrics;
use crate::providers::{Image, Provider};
use crate::store::spend::Limit;
use crate::store::{
    CancelOutcome, NewArtifact, NewImage, OwnerCharge, PauseReason, ProviderSlots, PruneReport, Resolution,
    ResolveOutcome, RetryAck, RetryOutcome, Store, StoreError,
};
use money::ProviderMoney;

pub use intake::{
    MAX_GROUP_BYTES, MAX_KEY_CHARS, MAX_PARAMS_BYTES, MAX_PROMPT_BYTES, MAX_REFERENCES, MAX_SHOTS, MAX_UPLOAD_BYTES,
};

/// Errors the engine returns to its callers (the API and CLI).
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)]
pub enum EngineError {
    /// The request is malformed or names something that does not exist.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid(m) => EngineError::Invalid(m),
            e => EngineError::Store(e),
        }
    }
}

/// A change of a task's status, broadcast to subscribers (live views, `--wait`, benchmarks).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct TaskChange {
    pub task_id: String,
    pub status: TaskStatus,
}

/// A configured provider: the adapter, its slots (counted in the store, see
/// `store::ops::dispatch`) and its circuit breaker.
#[allow(missing_docs)]
pub struct ProviderEntry {
    pub name: String,
    pub provider: Arc<dyn Provider>,
    /// The adapter kind as configured (`providers::kinds`), for display.
    kind: String,
    /// Whether it bills, its prices, and what must hold before a request may leave.
    money: ProviderMoney,
    max_concurrency: usize,
    reserve: usize,
    breaker: Mutex<Breaker>,
    /// The operations it offers (its kind's, narrowed by its `operations` key).
    operations: Vec<Operation>,
    /// The largest source image it takes, in bytes (its kind's declaration).
    max_image_bytes: usize,
    /// Its checked configuration, when it came from one (not for test adapters).
    config: Option<crate::config::ProviderConfig>,
}

impl ProviderEntry {
    /// How long one call may take at most (the configured `request_timeout_ms`); `None` for an
    /// adapter built without a configuration (tests).
    pub fn request_timeout(&self) -> Option<std::time::Duration> {
        self.config.as_ref().map(|c| c.request_timeout)
    }

    /// Wrap an adapter with `max_concurrency` slots (and the default reserve of one slot that
    /// the recovery lane leaves to fresh work).
    pub fn new(name: impl Into<String>, provider: Arc<dyn Provider>, max_concurrency: usize) -> Self {
        ProviderEntry {
            name: name.into(),
            provider,
            kind: "custom".into(),
            money: ProviderMoney::default(),
            max_concurrency: max_concurrency.max(1),
            reserve: 1,
            breaker: Mutex::new(Breaker::default()),
            operations: vec![Operation::Generate],
            max_image_bytes: crate::engine::intake::MAX_UPLOAD_BYTES,
            config: None,
        }
    }

    /// Offer these operations (tests: a scriptable provider that edits).
    pub fn with_operations(mut self, ops: &[Operation]) -> Self {
        self.operations = ops.to_vec();
        self
    }

    /// Name the adapter kind shown by `GET /v1/providers` (default `custom`).
    pub fn with_kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = kind.into();
        self
    }

    /// Set the slots the recovery lane leaves free (0: purely work-conserving).
    pub fn with_reserve(mut self, reserve: usize) -> Self {
        self.reserve = reserve;
        self
    }

    /// The provider's row for the dispatcher.
    fn slots(&self, cfg: &EngineConfig) -> ProviderSlots {
        ProviderSlots {
            name: self.name.clone(),
            max_concurrency: self.max_concurrency,
            reserve: self.reserve,
            fresh_weight: cfg.fresh_weight,
            recovery_weight: cfg.recovery_weight,
            order: cfg.dispatch_order,
        }
    }

    /// Take the kind and the money facts (billing, prices, API key variable, model, size)
    /// from the provider's configuration.
    pub fn with_config(mut self, cfg: &crate::config::ProviderConfig) -> Self {
        self.kind = cfg.kind.as_str().into();
        self.money = ProviderMoney::of(cfg);
        self.reserve = cfg.reserve;
        self.operations = cfg.operations.clone();
        self.max_image_bytes = cfg.kind.spec().max_image_bytes;
        self.max_concurrency = cfg.max_concurrency.max(1);
        self.config = Some(cfg.clone());
        self
    }

    /// Set the money facts directly (tests: a scriptable provider with a price).
    pub fn with_money(mut self, money: ProviderMoney) -> Self {
        self.money = money;
        self
    }
}

/// The providers in force, by name. Changed at run time by the owner (`Engine::put_provider`,
/// `Engine::remove_provider`); a worker holds the entry it claimed with (an `Arc`), so a task
/// already sent keeps the settings it was sent with.
pub(crate) struct Registry(RwLock<HashMap<String, Arc<ProviderEntry>>>);

impl Registry {
    fn new(entries: Vec<ProviderEntry>) -> Registry {
        Registry(RwLock::new(entries.into_iter().map(|p| (p.name.clone(), Arc::new(p))).collect()))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<ProviderEntry>>> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The provider named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<ProviderEntry>> {
        self.read().get(name).cloned()
    }

    pub(crate) fn contains_key(&self, name: &str) -> bool {
        self.read().contains_key(name)
    }

    /// Every provider (in no particular order).
    pub(crate) fn values(&self) -> Vec<Arc<ProviderEntry>> {
        self.read().values().cloned().collect()
    }

    pub(crate) fn keys(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    fn insert(&self, entry: ProviderEntry) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).insert(entry.name.clone(), Arc::new(entry));
    }

    fn remove(&self, name: &str) -> Option<Arc<ProviderEntry>> {
        self.0.write().unwrap_or_else(|e| e.into_inner()).remove(name)
    }
}

/// A configured provider as surfaces show it (`GET /v1/providers`).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct ProviderInfo {
    /// The configured name (what a submit names).
    pub name: String,
    /// The adapter kind (one of `providers::kinds::KINDS`' names, or `custom`).
    pub kind: String,
    pub capabilities: CapabilitiesInfo,
    /// How this provider bills, in plain words.
    pub billing_note: String,
    /// Whether it bills, and its configured prices.
    #[serde(flatten)]
    pub price: money::PriceInfo,
    /// The operations it offers (`generate`, `edit`, `cutout`).
    #[schema(value_type = Vec<String>)]
    pub operations: Vec<Operation>,
    /// Where it was defined: `config` (tally.toml: read-only in the page) or `page`.
    #[schema(value_type = String)]
    pub defined_in: crate::providers::settings::DefinedIn,
    /// The last four characters of the key saved in the page (never the key); null for a
    /// provider whose key is read from `api_key_env`.
    pub api_key_hint: Option<String>,
    /// The environment variable its key is read from (config-defined providers).
    pub api_key_env: Option<String>,
    /// The console the owner set for requests tally cannot prove (`dashboard_url`).
    pub dashboard_url: Option<String>,
    pub model: Option<String>,
    pub base_url: Option<String>,
    pub max_concurrency: usize,
    /// For a provider that drafts: the most tokens a drafting call's answer may use
    /// (`max_output_tokens`), which with the prices per million tokens bounds a draft's price
    /// (the page shows it before drafting). Null for a provider that does not draft.
    pub max_output_tokens: Option<u32>,
}

/// What a provider can prove after an ambiguous outcome.
#[derive(Debug, Clone, Copy, serde::Serialize, utoipa::ToSchema)]
pub struct CapabilitiesInfo {
    /// Resending with the same key returns the original result and charges once.
    pub idempotent_create: bool,
    /// A job whose answer was lost can be found and polled.
    pub lookup: bool,
    /// A create whose answer was lost can be searched for in the provider's listing (false
    /// for fal: accepted jobs are polled by id, but a lost create cannot be found).
    pub finds_lost_creates: bool,
}

/// A per-provider circuit: after `circuit_failures` failed calls in a row, new calls pause
/// for `circuit_pause`, so retries do not prolong a provider's outage.
#[derive(Debug, Default)]
struct Breaker {
    failures: u32,
    open_until: Millis,
    /// The pause is a rate-limit hold (the provider said "not now"), not an opened circuit.
    rate_limited: bool,
    /// When the pause in force began.
    since: Millis,
    /// The last failure counted, in words: what an opened circuit says failed.
    last_failure: Option<String>,
}

/// State shared by the dispatcher, workers and reconciler.
pub(crate) struct Shared {
    store: Store,
    cfg: EngineConfig,
    clock: Arc<dyn Clock>,
    providers: Registry,
    data_dir: PathBuf,
    /// The id of this run of the engine: leases of other runs are expired at start-up. A new
    /// one replaces it when a PostgreSQL node fenced itself and restarted its services
    /// (`engine::nodes`).
    boot: Mutex<String>,
    /// Reconcile at the next wake-up even if no deadline passed: a peer node's lock freed, so
    /// its leases are leftovers now (`engine::nodes`).
    force_reconcile: std::sync::atomic::AtomicBool,
    /// PostgreSQL: how many times this node fenced itself (lost its node lock). A worker
    /// whose claim was made before the latest fence starts no new paid call; a call already
    /// sent still finishes and lands fenced (`engine::nodes`).
    fences: std::sync::atomic::AtomicU64,
    /// Execution tokens of the workers running in this process. After a self-fence the new
    /// run's recovery leaves their leases alone while those have not run out: the calls are
    /// alive here, not interrupted (`reconciler::run_once`).
    live: Mutex<std::collections::HashSet<String>>,
    /// Worker capacity: a permit per free worker.
    workers: Arc<Semaphore>,
    wake_dispatcher: Notify,
    wake_reconciler: Notify,
    /// Counts settles (only with retention on): the retention timer waits for a change when
    /// nothing is due.
    settles: watch::Sender<u64>,
    /// When the reconciler will next wake on its own (`Millis::MAX`: not until woken).
    reconciler_at: AtomicI64,
    shutdown: watch::Sender<bool>,
    /// Set (once) when a service found the database unusable: the daemon must stop.
    fatal: watch::Sender<Option<String>>,
    /// The background database check's state (`engine::db_check`).
    db_check: Mutex<db_check::DbCheck>,
    metrics: Arc<Metrics>,
    /// Running workers, so that `kill` can stop them as a crash would.
    running: Mutex<JoinSet<()>>,
    changes: broadcast::Sender<TaskChange>,
    /// The budget limits `record_calling` checks; replaced by [`Engine::set_limits`].
    limits: RwLock<Vec<Limit>>,
    /// The configuration's limits (the default when no budget is set at run time).
    config_limits: RwLock<Vec<Limit>>,
    /// Where `limits` come from (`engine::budget`).
    budget_source: RwLock<budget::BudgetSource>,
    /// Budget changes one at a time (each reads, changes and stores the whole budget), and
    /// time zone changes with them (a zone change re-zones every limit).
    budget_lock: tokio::sync::Mutex<()>,
    /// The shop's zone in force and where it comes from (`engine::zone`).
    zone: RwLock<(jiff::tz::TimeZone, zone::ZoneSource)>,
    /// The delivery profiles and targets, once [`Engine::start_deliveries`] gave them.
    delivery: std::sync::OnceLock<deliver::Setup>,
    /// Wakes the delivery runner (a delivery was made or retried).
    wake_deliveries: Notify,
}

impl Shared {
    /// The budget limits in force now.
    fn limits(&self) -> Vec<Limit> {
        self.limits.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn now(&self) -> Millis {
        self.clock.now()
    }

    /// How many times this node fenced itself so far (see `fences`).
    fn fence(&self) -> u64 {
        self.fences.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The id of the current run of this engine.
    fn boot(&self) -> String {
        self.boot.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn ms(d: Duration) -> Millis {
        d.as_millis() as Millis
    }

    /// Tell subscribers that a task's status changed (nobody listening is fine).
    fn changed(&self, task_id: &str, status: TaskStatus) {
        if status.is_settled() && self.cfg.retention.is_some() {
            self.settles.send_modify(|n| *n += 1);
        }
        if self.changes.receiver_count() > 0 {
            let _ = self.changes.send(TaskChange { task_id: task_id.to_string(), status });
        }
    }

    fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// The database cannot be used any more (read-only, corrupt): ask the daemon to stop
    /// ([`Engine::failure`]). The first reason is kept.
    fn give_up(&self, why: String) {
        self.fatal.send_if_modified(|f| {
            if f.is_none() {
                *f = Some(why);
                true
            } else {
                false
            }
        });
    }

    /// A jitter value in [0, 1) from the OS random source.
    fn jitter() -> f64 {
        (uuid::Uuid::new_v4().as_u128() as u64 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Until when new calls to `p` are held back, and whether by a rate limit (else by an
    /// opened circuit); `None` when calls may go.
    fn breaker_open_until(&self, p: &ProviderEntry, now: Millis) -> Option<crate::store::Pause> {
        let b = p.breaker.lock().unwrap_or_else(|e| e.into_inner());
        (b.open_until > now).then(|| crate::store::Pause {
            until: b.open_until,
            reason: if b.rate_limited { PauseReason::RateLimit } else { PauseReason::Circuit },
            at: b.since,
            why: if b.rate_limited { None } else { b.last_failure.clone() },
        })
    }

    /// The provider said "not now" until `until` (its `Retry-After`, or the reset of a
    /// used-up rate-limit quota): hold every new call to it until then. The caller also
    /// records the hold in the store (`pause_provider`), where the dispatcher reads it; this
    /// copy hands back claims made just before.
    /// Returns the pause to record.
    fn hold_provider(&self, p: &ProviderEntry, until: Millis) -> crate::store::Pause {
        let now = self.now();
        let mut b = p.breaker.lock().unwrap_or_else(|e| e.into_inner());
        if until > b.open_until {
            b.open_until = until;
            b.rate_limited = true;
            b.since = now;
        }
        crate::store::Pause { until, reason: PauseReason::RateLimit, at: now, why: None }
    }

    /// Count a call's outcome (`failure`: what failed, in words; `None`: it went well); when
    /// the circuit opens, returns the pause (the caller records it in the store, where the
    /// dispatcher reads it), naming the last failure.
    fn breaker_record(&self, p: &ProviderEntry, failure: Option<String>) -> Option<crate::store::Pause> {
        let mut b = p.breaker.lock().unwrap_or_else(|e| e.into_inner());
        let Some(failure) = failure else {
            b.failures = 0;
            return None;
        };
        b.failures += 1;
        b.last_failure = Some(failure);
        if b.failures >= self.cfg.circuit_failures {
            let now = self.now();
            b.open_until = now + Self::ms(self.cfg.circuit_pause);
            b.rate_limited = false;
            b.failures = 0;
            b.since = now;
            tracing::warn!(provider = %p.name, pause = ?self.cfg.circuit_pause, "provider circuit opened after repeated failures");
            return Some(crate::store::Pause {
                until: b.open_until,
                reason: PauseReason::Circuit,
                at: now,
                why: b.last_failure.clone(),
            });
        }
        None
    }
}

/// Everything needed to start an engine.
#[allow(missing_docs)]
pub struct EngineParts {
    pub store: Store,
    pub config: EngineConfig,
    pub clock: Arc<dyn Clock>,
    pub providers: Vec<ProviderEntry>,
    /// The data directory (the database holds the images; this is for display and tools).
    pub data_dir: PathBuf,
    pub metrics: Arc<Metrics>,
    /// Budget limits (see [`money::limits`]); empty for none.
    pub limits: Vec<Limit>,
}

/// A running engine. Dropping it does not stop the background services; call
/// [`Engine::shutdown`] (clean) or [`Engine::kill`] (tests: as if the process died).
pub struct Engine {
    shared: Arc<Shared>,
    /// The dispatcher, reconciler and retention timer (replaced after a self-fence).
    services: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// PostgreSQL only: the wake-up bridge and the node-lock guard (`engine::nodes`).
    node_tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// Start the dispatcher, the reconciler and (if configured) the retention timer.
fn spawn_services(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    let mut services =
        vec![tokio::spawn(dispatcher::run(shared.clone())), tokio::spawn(reconciler::run(shared.clone()))];
    if let Some(age) = shared.cfg.retention {
        services.push(tokio::spawn(retention::run(shared.clone(), age)));
    }
    if shared.delivery.get().is_some() {
        services.push(tokio::spawn(deliver::run(shared.clone())));
    }
    services
}

impl Engine {
    /// Recover leftovers of earlier runs, then start the dispatcher and reconciler.
    pub async fn start(parts: EngineParts) -> Result<Engine, EngineError> {
        let providers = Registry::new(parts.providers);
        let cfg_zone = parts.config.time_zone.clone();
        let shared = Arc::new(Shared {
            store: parts.store,
            workers: Arc::new(Semaphore::new(parts.config.workers)),
            cfg: parts.config,
            clock: parts.clock,
            providers,
            data_dir: parts.data_dir,
            boot: Mutex::new(uuid::Uuid::new_v4().to_string()),
            force_reconcile: std::sync::atomic::AtomicBool::new(false),
            fences: std::sync::atomic::AtomicU64::new(0),
            live: Mutex::new(std::collections::HashSet::new()),
            wake_dispatcher: Notify::new(),
            wake_reconciler: Notify::new(),
            settles: watch::channel(0).0,
            reconciler_at: AtomicI64::new(Millis::MAX),
            shutdown: watch::channel(false).0,
            fatal: watch::channel(None).0,
            db_check: Mutex::new(db_check::DbCheck::default()),
            metrics: parts.metrics,
            running: Mutex::new(JoinSet::new()),
            changes: broadcast::channel(4096).0,
            config_limits: RwLock::new(parts.limits.clone()),
            budget_source: RwLock::new(budget::BudgetSource::Config),
            budget_lock: tokio::sync::Mutex::new(()),
            zone: RwLock::new((cfg_zone, zone::ZoneSource::Config)),
            limits: RwLock::new(parts.limits),
            delivery: std::sync::OnceLock::new(),
            wake_deliveries: Notify::new(),
        });
        // A zone and a budget set at run time replace the config's, before anything is dispatched.
        if let Some(z) = zone::stored(&shared.store).await? {
            shared.apply_zone(z, zone::ZoneSource::Set);
        }
        if let Some(stored) = Engine::stored_limits(&shared.store, &shared.zone()).await? {
            *shared.limits.write().unwrap_or_else(|e| e.into_inner()) = stored;
            *shared.budget_source.write().unwrap_or_else(|e| e.into_inner()) = budget::BudgetSource::Set;
        }
        // On PostgreSQL, other nodes' wake-ups feed this engine's services (before the
        // start-up recovery, so nothing that happens meanwhile is missed).
        let bridge = nodes::bridge(&shared);
        // The dispatcher's view of the providers, then start-up recovery, both before anything
        // new is dispatched.
        let slots = shared.providers.values().iter().map(|p| p.slots(&shared.cfg)).collect();
        shared.store.configure_providers(slots).await?;
        reconciler::run_once(&shared).await?;
        // Limits may have changed while tally was stopped: tasks held by a budget check it
        // again now (and wait again if it still holds them back).
        shared.store.release_budget_holds(shared.now()).await?;
        let mut started = spawn_services(&shared);
        // Held jobs (an older copy of the database) are looked up at their providers once,
        // beside the services: a look waits on the network, never on the start.
        started.push(tokio::spawn(lookup::run(shared.clone())));
        let services = Arc::new(Mutex::new(started));
        let guard = nodes::guard(&shared, &services);
        let node_tasks = Mutex::new(bridge.into_iter().chain(guard).collect());
        Ok(Engine { shared, services, node_tasks })
    }

    /// The store this engine writes through.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// The engine's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// Subscribe to task status changes. A receiver that falls behind gets `Lagged` and
    /// should re-read what it shows.
    pub fn subscribe(&self) -> broadcast::Receiver<TaskChange> {
        self.shared.changes.subscribe()
    }

    /// The data directory (the database, the API token and the lock live in it).
    pub fn data_dir(&self) -> &Path {
        &self.shared.data_dir
    }

    /// The configured provider names.
    pub fn provider_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.shared.providers.keys();
        v.sort();
        v
    }

    /// Add or replace a provider at run time (defined in the page): its adapter is built, the
    /// dispatcher's view of the providers updated, and new claims use it at once. A task
    /// already sent keeps the entry it was claimed with. Refused, with nothing changed, when
    /// its adapter cannot be built, or when its currency differs from that of a budget for the
    /// whole daemon in force (that budget would not count it; currencies are never converted).
    pub async fn put_provider(&self, cfg: crate::config::ProviderConfig) -> Result<(), EngineError> {
        if cfg.pricing.is_priced()
            && let Some(l) =
                self.limits().into_iter().find(|l| l.provider.is_none() && l.currency != cfg.pricing.currency)
        {
            return Err(EngineError::Invalid(format!(
                "currency {} differs from the {} budget's {}: that budget would not count this provider's requests, \
                 since tally converts no currencies; give it a budget of its own in the configuration or remove the \
                 whole daemon's budget first",
                cfg.pricing.currency,
                l.period.adjective(),
                l.currency
            )));
        }
        let adapter = crate::providers::build(&cfg).map_err(EngineError::Invalid)?;
        let entry = ProviderEntry::new(cfg.name.clone(), adapter, cfg.max_concurrency).with_config(&cfg);
        self.shared.providers.insert(entry);
        self.reconfigure_providers().await
    }

    /// Remove a provider defined at run time. Refused while it has jobs queued, waiting or
    /// running (they would have no provider to go to); `Ok(false)` when there is none by
    /// that name.
    pub async fn remove_provider(&self, name: &str) -> Result<bool, EngineError> {
        if !self.shared.providers.contains_key(name) {
            return Ok(false);
        }
        let live = self.shared.store.live_tasks_of(name.to_string()).await?;
        if live > 0 {
            return Err(EngineError::Invalid(format!(
                "provider `{name}` has {live} job(s) queued, waiting or running; wait until they end (or cancel them) \
                 before removing it"
            )));
        }
        self.shared.providers.remove(name);
        self.reconfigure_providers().await?;
        Ok(true)
    }

    /// Tell the store (and so the dispatcher) the providers in force now.
    async fn reconfigure_providers(&self) -> Result<(), EngineError> {
        let slots = self.shared.providers.values().iter().map(|p| p.slots(&self.shared.cfg)).collect();
        self.shared.store.configure_providers(slots).await?;
        self.shared.wake_dispatcher.notify_one();
        Ok(())
    }

    /// A provider's checked configuration (for the page's settings and its test).
    pub fn provider_config(&self, name: &str) -> Option<crate::config::ProviderConfig> {
        self.shared.providers.get(name).and_then(|p| p.config.clone())
    }

    /// Check a provider's key with a free call (never a paid request): what its adapter
    /// answers, in plain words.
    pub async fn test_provider(&self, name: &str) -> Option<Result<String, String>> {
        let p = self.shared.providers.get(name)?;
        Some(p.provider.check_access().await.map_err(|e| e.to_string()))
    }

    /// The billing note of a provider, for `unknown` explanations.
    pub fn billing_note(&self, provider: &str) -> Option<String> {
        self.shared.providers.get(provider).map(|p| p.provider.billing_note())
    }

    /// Where to look for `provider`'s requests (its dashboard page, or that it has none).
    pub fn dashboard(&self, provider: &str) -> Option<crate::providers::dashboard::Dashboard> {
        self.shared.providers.get(provider).map(|p| p.provider.dashboard())
    }

    /// The configured providers, sorted by name, with their capabilities and billing notes
    /// (for the web page's provider choice; read-only).
    pub fn provider_list(&self) -> Vec<ProviderInfo> {
        let mut v: Vec<ProviderInfo> = self
            .shared
            .providers
            .values()
            .into_iter()
            .map(|p| {
                let caps = p.provider.capabilities();
                ProviderInfo {
                    name: p.name.clone(),
                    kind: p.kind.clone(),
                    capabilities: CapabilitiesInfo {
                        idempotent_create: caps.idempotent_create,
                        lookup: caps.lookup,
                        finds_lost_creates: caps.lookup && p.provider.finds_lost_creates(),
                    },
                    billing_note: p.provider.billing_note(),
                    price: p.money.info(),
                    operations: p.operations.clone(),
                    defined_in: p.config.as_ref().map(|c| c.defined_in).unwrap_or_default(),
                    api_key_hint: p.config.as_ref().and_then(|c| c.api_key.as_ref()).map(|k| k.hint()),
                    api_key_env: p.config.as_ref().and_then(|c| c.api_key_env.clone()),
                    dashboard_url: p.config.as_ref().and_then(|c| c.dashboard_url.clone()),
                    model: p.config.as_ref().and_then(|c| c.model.clone()),
                    base_url: p.config.as_ref().and_then(|c| c.base_url.clone()),
                    max_concurrency: p.max_concurrency,
                    max_output_tokens: p.operations.contains(&Operation::Draft).then(|| {
                        p.config
                            .as_ref()
                            .map(|c| c.max_output_tokens)
                            .unwrap_or(crate::providers::settings::DEFAULT_MAX_OUTPUT_TOKENS)
                    }),
                }
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// What one more request of `provider` with `params` is estimated to cost: (amount,
    /// currency), `None` when the provider has no price or never bills.
    pub fn price_of(&self, provider: &str, params: &serde_json::Value) -> Option<(crate::domain::Micros, String)> {
        let p = self.shared.providers.get(provider)?;
        p.money.price(params).map(|m| (m, p.money.pricing.currency.clone()))
    }

    /// Whether `provider` bills for requests (false for `demo`, and for unknown names).
    pub fn provider_bills(&self, provider: &str) -> bool {
        self.shared.providers.get(provider).is_some_and(|p| p.money.billable)
    }

    /// The budget limits in force.
    pub fn limits(&self) -> Vec<Limit> {
        self.shared.limits()
    }

    /// The current time by the engine's clock.
    pub fn now(&self) -> Millis {
        self.shared.now()
    }

    /// Replace the budget limits (a raised limit takes effect at once): tasks held by a
    /// budget are due again now, and check it again before anything is sent.
    pub async fn set_limits(&self, limits: Vec<Limit>) -> Result<usize, EngineError> {
        *self.shared.limits.write().unwrap_or_else(|e| e.into_inner()) = limits;
        let n = self.shared.store.release_budget_holds(self.shared.now()).await?;
        self.shared.wake_dispatcher.notify_one();
        Ok(n)
    }

    /// Cancel a set's shots that were not sent yet; a running shot finishes honestly.
    /// `None` if there is no such set.
    pub async fn cancel_set(&self, id: &str) -> Result<Option<usize>, EngineError> {
        let out = self.shared.store.cancel_set(id.into(), self.shared.now()).await?;
        self.shared.wake_dispatcher.notify_one();
        // Its canceled shots are settled (the retention timer may be waiting for one).
        if self.shared.cfg.retention.is_some() {
            self.shared.settles.send_modify(|n| *n += 1);
        }
        Ok(out)
    }

    /// Cancel a task (at once if nothing was sent; otherwise cancel-requested).
    pub async fn cancel(&self, task: &str) -> Result<CancelOutcome, EngineError> {
        let out = self.shared.store.cancel(task.into(), self.shared.now()).await?;
        // A canceled shot lets the next shot of its set run.
        self.shared.wake_dispatcher.notify_one();
        match out {
            CancelOutcome::Canceled => self.shared.changed(task, TaskStatus::Canceled),
            CancelOutcome::Requested => self.shared.changed(task, TaskStatus::Running),
            _ => {}
        }
        Ok(out)
    }

    /// Retry a task as a new one (see [`RetryOutcome`]).
    pub async fn retry(&self, task: &str, ack: RetryAck, key: Option<String>) -> Result<RetryOutcome, EngineError> {
        let out = self.shared.store.retry(task.into(), ack, key, self.shared.now()).await?;
        if let RetryOutcome::Created(id) = &out {
            self.shared.changed(id, TaskStatus::Queued);
            self.shared.wake_dispatcher.notify_one();
        }
        Ok(out)
    }

    /// An operator resolves an `unknown` task: as failed, or as succeeded with the image
    /// they found (its bytes are verified, and stored in the transaction of the resolution),
    /// and with what the provider's dashboard shows about the charge (`owner`).
    pub async fn resolve(
        &self,
        task: &str,
        image: Option<Image>,
        owner: OwnerCharge,
        note: &str,
    ) -> Result<ResolveOutcome, EngineError> {
        let resolution = match image {
            None => Resolution::Failed,
            Some(img) => {
                let img = NewImage::verify_async(img.bytes)
                    .await
                    .map_err(|e| EngineError::Invalid(format!("the image: {e}")))?;
                Resolution::Succeeded(NewArtifact::new(img))
            }
        };
        let succeeded = matches!(resolution, Resolution::Succeeded(_));
        let out = self.shared.store.resolve(task.into(), resolution, owner, note.into(), self.shared.now()).await?;
        if out == ResolveOutcome::Resolved {
            self.shared.changed(task, if succeeded { TaskStatus::Succeeded } else { TaskStatus::Failed });
        }
        Ok(out)
    }

    /// Release held jobs (`store::held`): each is queued to be sent again, which may be
    /// charged again (the owner asked for it).
    pub async fn release_held(
        &self,
        which: crate::store::held::Release,
    ) -> Result<crate::store::held::ReleaseReport, EngineError> {
        let out = self.shared.store.release_held(which, self.shared.now()).await?;
        for id in &out.released {
            self.shared.changed(id, TaskStatus::Waiting);
        }
        if !out.released.is_empty() {
            self.shared.wake_dispatcher.notify_one();
        }
        Ok(out)
    }

    /// Resolves when a service found the database unusable (read-only, corrupt), or the store
    /// stopped itself after a failed fsync, with the reason; the daemon should then stop
    /// cleanly. Never resolves otherwise.
    pub async fn failure(&self) -> String {
        let given_up = async {
            let mut rx = self.shared.fatal.subscribe();
            loop {
                if let Some(why) = rx.borrow_and_update().clone() {
                    return why;
                }
                if rx.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        };
        tokio::select! {
            why = given_up => why,
            why = self.shared.store.failed() => why,
        }
    }

    /// Why the daemon is stopping because of its database, if it is ([`Engine::failure`]).
    pub fn failure_now(&self) -> Option<String> {
        self.shared.fatal.borrow().clone().or_else(|| self.shared.store.failure())
    }

    /// Wake every service (tests use this after moving a manual clock).
    pub fn poke(&self) {
        self.shared.wake_dispatcher.notify_one();
        self.shared.wake_reconciler.notify_one();
        self.shared.wake_deliveries.notify_one();
    }

    /// Run the reconciler once now and return how many leftovers it acted on.
    pub async fn reconcile_now(&self) -> Result<usize, EngineError> {
        reconciler::run_once(&self.shared).await
    }

    /// Clean shutdown: stop dispatching, wait up to the shutdown deadline for in-flight
    /// calls to reach a recorded phase, then stop the services. The caller closes the store.
    pub async fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
        self.shared.wake_dispatcher.notify_one();
        self.shared.wake_reconciler.notify_one();
        self.shared.wake_deliveries.notify_one();
        let all = self.shared.cfg.workers as u32;
        let drained =
            tokio::time::timeout(self.shared.cfg.shutdown_deadline, self.shared.workers.acquire_many(all)).await;
        if drained.is_err() {
            tracing::warn!("shutdown deadline passed with calls in flight; they will be recovered at the next start");
        }
        self.kill();
    }

    /// Stop every background service at once, as if the process had died (tests).
    pub fn kill(&self) {
        self.shared.shutdown.send_replace(true);
        for h in self.node_tasks.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            h.abort();
        }
        for h in self.services.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            h.abort();
        }
        self.shared.workers.close();
        self.shared.running.lock().unwrap_or_else(|e| e.into_inner()).abort_all();
    }

    /// Delete settled work last changed more than `older_than` ago, with its images (never
    /// an `unknown` task, never a shot of a set still in progress; see `Store::prune`), or
    /// with `dry_run` only say what would go.
    pub async fn prune(&self, older_than: Duration, dry_run: bool) -> Result<PruneReport, EngineError> {
        let cutoff = self.shared.now() - Shared::ms(older_than);
        Ok(self.shared.store.prune(cutoff, dry_run).await?)
    }

    /// A read-only view of the current tasks count by status (metrics).
    pub async fn status_counts(&self) -> Result<Vec<(TaskStatus, i64)>, EngineError> {
        Ok(self.shared.store.status_counts().await?)
    }
}
