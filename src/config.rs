//! Configuration in two steps: [`RawConfig`] is only parsed (TOML, unknown keys refused), then
//! [`Config`] has defaults applied and every value checked, with the file and key named in
//! each error. `config.example.toml` documents every key; keep the two in step.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use crate::store::DispatchOrder;

/// A configuration error: which file, which key, and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: key `{key}`: {reason}")]
    Invalid { path: String, key: String, reason: String },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    storage: RawStorage,
    #[serde(default)]
    node: RawNode,
    #[serde(default)]
    engine: RawEngine,
    #[serde(default)]
    retention: RawRetention,
    #[serde(default)]
    providers: Vec<RawProvider>,
    #[serde(default)]
    budget: RawBudget,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    daily: Option<f64>,
    monthly: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    allowed_hosts: Option<Vec<String>>,
    allow_non_loopback: Option<bool>,
    max_body_bytes: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorage {
    data_dir: Option<PathBuf>,
    durability: Option<String>,
    backend: Option<String>,
    postgres_url: Option<String>,
    postgres_url_env: Option<String>,
    postgres_connections: Option<i64>,
    postgres_wakeups: Option<String>,
    postgres_poll_ms: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEngine {
    workers: Option<i64>,
    lease_secs: Option<f64>,
    heartbeat_secs: Option<f64>,
    /// No longer has any effect (the dispatcher claims in the statement that hands out, so
    /// there is no hand-off left waiting for a claim); accepted with a warning.
    dispatch_grace_secs: Option<f64>,
    max_attempts: Option<i64>,
    backoff_base_ms: Option<i64>,
    backoff_max_ms: Option<i64>,
    max_sends: Option<i64>,
    /// No longer has any effect (a provider without a free slot is simply not dispatched to);
    /// accepted with a warning.
    busy_delay_ms: Option<i64>,
    dispatch_order: Option<String>,
    fresh_weight: Option<i64>,
    recovery_weight: Option<i64>,
    recovery_deadline_secs: Option<f64>,
    circuit_failures: Option<i64>,
    circuit_pause_secs: Option<f64>,
    /// No longer has any effect (images are stored in the database, so there are no orphan
    /// files to sweep); accepted so that an older configuration still starts, with a warning.
    orphan_grace_secs: Option<f64>,
    shutdown_deadline_secs: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    older_than: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    name: Option<String>,
    kind: Option<String>,
    max_concurrency: Option<i64>,
    reserve: Option<i64>,
    base_url: Option<String>,
    api_key_env: Option<String>,
    model: Option<String>,
    size: Option<String>,
    connect_timeout_ms: Option<i64>,
    request_timeout_ms: Option<i64>,
    poll_interval_ms: Option<i64>,
    idempotency_header: Option<String>,
    reference_input: Option<String>,
    max_response_bytes: Option<i64>,
    billing_note: Option<String>,
    delay_ms: Option<i64>,
    price_per_image: Option<f64>,
    price_per_size: Option<std::collections::BTreeMap<String, f64>>,
    currency: Option<String>,
    budget_daily: Option<f64>,
    budget_monthly: Option<f64>,
}

/// How durable each commit is (DESIGN §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL` for every transaction holding a durable operation (see
    /// `store::Commit`): the `calling` record is on disk before a paid request leaves.
    Full,
    /// `synchronous=NORMAL`: faster; a power loss (not a process crash) can lose the last
    /// commits, including a `calling` record, so a restart could resend a paid request.
    Normal,
}

/// Which database holds tally's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// One SQLite file in the data dir (the default): one daemon per data dir.
    Sqlite,
    /// A PostgreSQL database shared by several daemons (nodes).
    Postgres(PostgresConfig),
}

/// How a PostgreSQL node learns that something became due on another node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeups {
    /// LISTEN/NOTIFY on the node's own connection: idle nodes run no SQL.
    Notify,
    /// Poll every interval instead (for connection poolers in transaction mode, which
    /// cannot deliver notifications). Degraded: idle nodes run SQL on every tick.
    Poll(Duration),
}

/// `[storage] backend = "postgres"`: where the database is and how a node talks to it.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    /// The connection URL (`postgres://user:password@host:port/db?…`), credentials included:
    /// never logged or shown (see the `Debug` impl).
    pub url: String,
    /// Connections for store operations, besides the node's own lock-and-listen connection.
    pub connections: usize,
    pub wakeups: Wakeups,
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &redact_url(&self.url))
            .field("connections", &self.connections)
            .field("wakeups", &self.wakeups)
            .finish()
    }
}

/// A connection URL with its password replaced by `***`, for messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return "***".into() };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            let user = if userinfo.contains(':') { format!("{user}:***") } else { user.to_string() };
            format!("{scheme}://{user}@{host}{tail}")
        }
        None => url.to_string(),
    }
}

/// `[node]`: this daemon's identity among several sharing one PostgreSQL database.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Stable per machine: a restart under the same name recovers its own earlier run's
    /// work at once; two running daemons must never share a name.
    pub name: String,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Things in the file worth telling the user about that do not stop start-up (a key
    /// that no longer has any effect).
    pub warnings: Vec<String>,
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub node: NodeConfig,
    pub engine: EngineConfig,
    pub providers: Vec<ProviderConfig>,
    pub budget: BudgetConfig,
}

/// `[budget]`: spending limits for the whole daemon, in the providers' currency (amounts in
/// millionths, see [`crate::domain::Micros`]). Per-provider limits live on each provider.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetConfig {
    pub daily: Option<crate::domain::Micros>,
    pub monthly: Option<crate::domain::Micros>,
    /// The one currency every price and limit is in (`None` when nothing has a price).
    pub currency: Option<String>,
}

/// A provider's prices (millionths of `currency`): `per_size` first, then `per_image`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pricing {
    pub per_image: Option<crate::domain::Micros>,
    pub per_size: std::collections::BTreeMap<String, crate::domain::Micros>,
    pub currency: String,
}

impl Pricing {
    /// The price of one image of `size`, if one is configured.
    pub fn price(&self, size: &str) -> Option<crate::domain::Micros> {
        self.per_size.get(size).copied().or(self.per_image)
    }

    /// Whether any price is configured.
    pub fn is_priced(&self) -> bool {
        self.per_image.is_some() || !self.per_size.is_empty()
    }
}

/// `[server]`: where the HTTP API listens and which Host headers it answers.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Extra Host names (exact match, any port) accepted besides the loopback names.
    pub allowed_hosts: Vec<String>,
    /// Must be true to listen on a non-loopback address.
    pub allow_non_loopback: bool,
    pub max_body_bytes: u64,
}

/// `[storage]`: where the data lives and how durable commits are.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    pub durability: Durability,
    pub backend: Backend,
}

/// `[engine]`: workers, leases and retry policy.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub workers: usize,
    pub lease: Duration,
    pub heartbeat: Duration,
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Dispatches of one envelope lost before anything was sent (the process died each time
    /// between the claim and `calling`) before it is declared undeliverable.
    pub max_sends: u32,
    /// How long replays, lookups and polls may go on for one execution before `unknown`.
    pub recovery_deadline: Duration,
    /// Consecutive failed calls that open a provider's circuit.
    pub circuit_failures: u32,
    pub circuit_pause: Duration,
    /// How long a clean shutdown waits for in-flight calls.
    pub shutdown_deadline: Duration,
    /// Fair (lanes by weight, fairness keys, reserve, slow start) or FIFO by due time.
    pub dispatch_order: DispatchOrder,
    /// Weights of the fresh and the recovery lane (default 4 : 1).
    pub fresh_weight: u32,
    pub recovery_weight: u32,
    /// `[retention] older_than`: settled work older than this is pruned on a timer (`None`:
    /// only by `tally prune`).
    pub retention: Option<Duration>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: 8,
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(10),
            max_attempts: 3,
            backoff_base: Duration::from_millis(1000),
            backoff_max: Duration::from_millis(60_000),
            max_sends: 10,
            recovery_deadline: Duration::from_secs(3600),
            circuit_failures: 5,
            circuit_pause: Duration::from_secs(30),
            shutdown_deadline: Duration::from_secs(10),
            dispatch_order: DispatchOrder::Fair,
            fresh_weight: 4,
            recovery_weight: 1,
            retention: None,
        }
    }
}

/// A retention age such as `90d`, `12h` or `30m` (humantime's units), at least one second.
pub fn retention_age(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("`{text}` is not an age like 90d, 12h or 30m ({e})"))?;
    if d < Duration::from_secs(1) {
        return Err(format!("`{text}` is shorter than one second"));
    }
    Ok(d)
}

/// The kinds of provider adapters tally ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    Demo,
    OpenaiImages,
    Replicate,
    FalQueue,
}

impl ProviderKind {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "demo" => ProviderKind::Demo,
            "openai_images" => ProviderKind::OpenaiImages,
            "replicate" => ProviderKind::Replicate,
            "fal_queue" => ProviderKind::FalQueue,
            _ => return None,
        })
    }

    /// The name used in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Demo => "demo",
            ProviderKind::OpenaiImages => "openai_images",
            ProviderKind::Replicate => "replicate",
            ProviderKind::FalQueue => "fal_queue",
        }
    }
}

/// One `[[providers]]` entry. The API key itself is never stored here, only the name of the
/// environment variable that holds it.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub name: String,
    pub kind: ProviderKind,
    pub max_concurrency: usize,
    /// Slots the recovery lane leaves free for fresh work (default 1; it may always use one).
    pub reserve: usize,
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    pub model: Option<String>,
    pub size: String,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub poll_interval: Duration,
    pub idempotency_header: Option<String>,
    /// The model input that takes the reference images (Replicate: found in the model's
    /// schema when not set; fal: required for shots with reference images).
    pub reference_input: Option<String>,
    pub max_response_bytes: usize,
    pub billing_note: Option<String>,
    /// Demo only: how long a render takes.
    pub delay: Duration,
    pub pricing: Pricing,
    /// This provider's own limits (millionths of its currency).
    pub budget_daily: Option<crate::domain::Micros>,
    pub budget_monthly: Option<crate::domain::Micros>,
}

impl ProviderConfig {
    /// The built-in demo provider used when no provider is configured.
    pub fn demo() -> Self {
        ProviderConfig {
            name: "demo".into(),
            kind: ProviderKind::Demo,
            max_concurrency: 4,
            reserve: 1,
            base_url: None,
            api_key_env: None,
            model: None,
            size: "1024x1024".into(),
            connect_timeout: Duration::from_millis(5_000),
            request_timeout: Duration::from_millis(120_000),
            poll_interval: Duration::from_millis(1_000),
            idempotency_header: None,
            reference_input: None,
            max_response_bytes: 64 << 20,
            billing_note: None,
            delay: Duration::from_millis(300),
            pricing: Pricing { currency: DEFAULT_CURRENCY.into(), ..Pricing::default() },
            budget_daily: None,
            budget_monthly: None,
        }
    }
}

/// The default data directory: the platform's data dir for tally, or `./tally-data`.
pub fn default_data_dir() -> PathBuf {
    directories::ProjectDirs::from("", "", "tally")
        .map(|d| d.data_dir().to_path_buf())
        .unwrap_or_else(|| PathBuf::from("tally-data"))
}

/// The currency of prices and budgets when none is configured.
pub const DEFAULT_CURRENCY: &str = "USD";

/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7700";

/// Parse a listen address (`server.listen` or `tally serve --listen`): an IP and a port, on
/// loopback unless `allow_non_loopback` (`server.allow_non_loopback`) is true.
pub fn listen_address(text: &str, allow_non_loopback: bool) -> Result<SocketAddr, String> {
    let listen: SocketAddr =
        text.trim().parse().map_err(|_| format!("`{text}` is not an address like 127.0.0.1:7700"))?;
    if !listen.ip().is_loopback() && !allow_non_loopback {
        return Err(format!(
            "{listen} is not a loopback address; set server.allow_non_loopback = true to expose tally on the network"
        ));
    }
    Ok(listen)
}

impl Config {
    /// Defaults for everything: the demo provider, loopback, the platform data dir.
    pub fn defaults() -> Self {
        Config::from_toml("", "<defaults>").unwrap_or_else(|_| unreachable!("empty config is valid"))
    }

    /// Read and resolve a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        Config::from_toml(&text, &path.display().to_string())
    }

    /// Parse and resolve config text; `origin` names the file in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse { path: origin.into(), message: e.to_string() })?;
        resolve(raw, origin)
    }

    /// The SQLite database file inside the data dir.
    pub fn db_path(&self) -> PathBuf {
        self.storage.data_dir.join("tally.db")
    }

    /// The API token file inside the data dir.
    pub fn token_path(&self) -> PathBuf {
        self.storage.data_dir.join("api-token")
    }
}

fn resolve(raw: RawConfig, origin: &str) -> Result<Config, ConfigError> {
    let bad = |key: &str, reason: String| ConfigError::Invalid { path: origin.into(), key: key.into(), reason };

    let listen_text = raw.server.listen.unwrap_or_else(|| DEFAULT_LISTEN.into());
    let allow_non_loopback = raw.server.allow_non_loopback.unwrap_or(false);
    let listen = listen_address(&listen_text, allow_non_loopback).map_err(|e| bad("server.listen", e))?;
    let allowed_hosts = raw.server.allowed_hosts.unwrap_or_default();
    for h in &allowed_hosts {
        if h.is_empty() || h.contains('*') || h.contains('/') {
            return Err(bad("server.allowed_hosts", format!("`{h}` must be an exact host name (no wildcards)")));
        }
    }
    let max_body_bytes = raw.server.max_body_bytes.unwrap_or(16 << 20);

    let durability = match raw.storage.durability.as_deref().unwrap_or("full") {
        "full" => Durability::Full,
        "normal" => Durability::Normal,
        other => return Err(bad("storage.durability", format!("`{other}` must be \"full\" or \"normal\""))),
    };
    let backend = resolve_backend(&raw.storage, &bad)?;
    let data_dir = raw.storage.data_dir.unwrap_or_else(default_data_dir);
    let node = NodeConfig {
        name: match raw.node.name {
            Some(n) => {
                check_node_name(&n).map_err(|r| bad("node.name", r))?;
                n
            }
            None => default_node_name(),
        },
    };

    let d = EngineConfig::default();
    let e = raw.engine;
    let secs = |key: &str, v: Option<f64>, default: Duration| -> Result<Duration, ConfigError> {
        match v {
            None => Ok(default),
            Some(s) if s.is_finite() && s > 0.0 && s < 1e7 => Ok(Duration::from_secs_f64(s)),
            Some(s) => Err(bad(key, format!("{s} must be a positive number of seconds"))),
        }
    };
    let count = |key: &str, v: Option<i64>, default: u64, min: i64, max: i64| -> Result<u64, ConfigError> {
        match v {
            None => Ok(default),
            Some(n) if n >= min && n <= max => Ok(n as u64),
            Some(n) => Err(bad(key, format!("{n} must be between {min} and {max}"))),
        }
    };
    let ms = |key: &str, v: Option<i64>, default: Duration| -> Result<Duration, ConfigError> {
        count(key, v, default.as_millis() as u64, 1, 86_400_000).map(Duration::from_millis)
    };
    let engine = EngineConfig {
        workers: count("engine.workers", e.workers, d.workers as u64, 1, 1024)? as usize,
        lease: secs("engine.lease_secs", e.lease_secs, d.lease)?,
        heartbeat: secs("engine.heartbeat_secs", e.heartbeat_secs, d.heartbeat)?,
        max_attempts: count("engine.max_attempts", e.max_attempts, d.max_attempts as u64, 1, 100)? as u32,
        backoff_base: ms("engine.backoff_base_ms", e.backoff_base_ms, d.backoff_base)?,
        backoff_max: ms("engine.backoff_max_ms", e.backoff_max_ms, d.backoff_max)?,
        max_sends: count("engine.max_sends", e.max_sends, d.max_sends as u64, 1, 1000)? as u32,
        recovery_deadline: secs("engine.recovery_deadline_secs", e.recovery_deadline_secs, d.recovery_deadline)?,
        circuit_failures: count("engine.circuit_failures", e.circuit_failures, d.circuit_failures as u64, 1, 1000)?
            as u32,
        circuit_pause: secs("engine.circuit_pause_secs", e.circuit_pause_secs, d.circuit_pause)?,
        shutdown_deadline: secs("engine.shutdown_deadline_secs", e.shutdown_deadline_secs, d.shutdown_deadline)?,
        dispatch_order: match e.dispatch_order.as_deref() {
            None | Some("fair") => DispatchOrder::Fair,
            Some("fifo") => DispatchOrder::Fifo,
            Some(o) => return Err(bad("engine.dispatch_order", format!("`{o}` is not one of fair, fifo"))),
        },
        fresh_weight: count("engine.fresh_weight", e.fresh_weight, d.fresh_weight as u64, 1, 1000)? as u32,
        recovery_weight: count("engine.recovery_weight", e.recovery_weight, d.recovery_weight as u64, 1, 1000)? as u32,
        retention: match raw.retention.older_than.as_deref() {
            None => None,
            Some(t) => Some(retention_age(t).map_err(|e| bad("retention.older_than", e))?),
        },
    };
    if engine.heartbeat >= engine.lease {
        return Err(bad("engine.heartbeat_secs", "must be shorter than engine.lease_secs".into()));
    }
    if engine.backoff_base > engine.backoff_max {
        return Err(bad("engine.backoff_base_ms", "must not exceed engine.backoff_max_ms".into()));
    }

    let mut providers = Vec::new();
    for (i, p) in raw.providers.into_iter().enumerate() {
        providers.push(resolve_provider(p, i, origin)?);
    }
    if providers.is_empty() {
        providers.push(ProviderConfig::demo());
    }
    for (i, p) in providers.iter().enumerate() {
        if providers[..i].iter().any(|q| q.name == p.name) {
            return Err(bad(&format!("providers[{i}].name"), format!("`{}` is configured twice", p.name)));
        }
    }
    let budget = resolve_budget(raw.budget, &providers, origin)?;
    let mut warnings = Vec::new();
    for (key, set) in
        [("dispatch_grace_secs", e.dispatch_grace_secs.is_some()), ("busy_delay_ms", e.busy_delay_ms.is_some())]
    {
        if set {
            warnings.push(format!(
                "{origin}: key `engine.{key}` no longer has any effect (the dispatcher claims work only for free \
                 provider slots, in the same statement that hands it out); remove it"
            ));
        }
    }
    if e.orphan_grace_secs.is_some() {
        warnings.push(format!(
            "{origin}: key `engine.orphan_grace_secs` no longer has any effect (images are stored in the database); \
             remove it"
        ));
    }
    Ok(Config {
        warnings,
        server: ServerConfig { listen, allowed_hosts, allow_non_loopback, max_body_bytes },
        storage: StorageConfig { data_dir, durability, backend },
        node,
        engine,
        providers,
        budget,
    })
}

/// `[budget]` and the currency rule: tally adds spend up without converting currencies, so
/// every priced provider must use one currency; a limit needs something priced to count.
fn resolve_budget(raw: RawBudget, providers: &[ProviderConfig], origin: &str) -> Result<BudgetConfig, ConfigError> {
    let bad = |key: &str, reason: String| ConfigError::Invalid { path: origin.into(), key: key.into(), reason };
    let mut currency: Option<(usize, &str)> = None;
    for (i, p) in providers.iter().enumerate() {
        if !p.pricing.is_priced() {
            continue;
        }
        match currency {
            None => currency = Some((i, &p.pricing.currency)),
            Some((j, c)) if c != p.pricing.currency => {
                return Err(bad(
                    &format!("providers[{i}].currency"),
                    format!(
                        "`{}` differs from providers[{j}].currency `{c}`; tally adds spend up in one currency and \
                         does not convert",
                        p.pricing.currency
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    let limit = |key: &str, v: Option<f64>| -> Result<Option<crate::domain::Micros>, ConfigError> {
        match v {
            None => Ok(None),
            Some(x) if x.is_finite() && (0.0..1e12).contains(&x) => Ok(Some(crate::domain::to_micros(x))),
            Some(x) => Err(bad(key, format!("{x} must be an amount of money, 0 or more"))),
        }
    };
    let daily = limit("budget.daily", raw.daily)?;
    let monthly = limit("budget.monthly", raw.monthly)?;
    if (daily.is_some() || monthly.is_some()) && currency.is_none() {
        return Err(bad(
            "budget",
            "a budget needs prices to count: set price_per_image (or price_per_size) on the paid providers".into(),
        ));
    }
    Ok(BudgetConfig { daily, monthly, currency: currency.map(|(_, c)| c.to_string()) })
}

/// The `[storage]` backend keys: `backend`, and for PostgreSQL where the database is.
fn resolve_backend(s: &RawStorage, bad: &dyn Fn(&str, String) -> ConfigError) -> Result<Backend, ConfigError> {
    let pg_only = [
        ("storage.postgres_url", s.postgres_url.is_some()),
        ("storage.postgres_url_env", s.postgres_url_env.is_some()),
        ("storage.postgres_connections", s.postgres_connections.is_some()),
        ("storage.postgres_wakeups", s.postgres_wakeups.is_some()),
        ("storage.postgres_poll_ms", s.postgres_poll_ms.is_some()),
    ];
    match s.backend.as_deref().unwrap_or("sqlite") {
        "sqlite" => {
            if let Some((key, _)) = pg_only.iter().find(|(_, set)| *set) {
                return Err(bad(key, "is only used with storage.backend = \"postgres\"".into()));
            }
            Ok(Backend::Sqlite)
        }
        "postgres" => {
            let url = match (&s.postgres_url, &s.postgres_url_env) {
                (Some(_), Some(_)) => {
                    return Err(bad(
                        "storage.postgres_url_env",
                        "give either postgres_url or postgres_url_env, not both".into(),
                    ));
                }
                (Some(u), None) => u.clone(),
                (None, Some(var)) => {
                    if var.is_empty() || var.contains('=') {
                        return Err(bad("storage.postgres_url_env", "must name an environment variable".into()));
                    }
                    std::env::var(var).map_err(|_| {
                        bad("storage.postgres_url_env", format!("the environment variable {var} is not set"))
                    })?
                }
                (None, None) => {
                    return Err(bad(
                        "storage.postgres_url",
                        "is required with storage.backend = \"postgres\" (or name an environment variable in postgres_url_env)".into(),
                    ));
                }
            };
            let key = if s.postgres_url.is_some() { "storage.postgres_url" } else { "storage.postgres_url_env" };
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(bad(key, format!("`{}` must start with postgres:// or postgresql://", redact_url(&url))));
            }
            if let Err(e) = url.parse::<postgres::Config>() {
                return Err(bad(key, format!("`{}` is not a PostgreSQL connection URL: {e}", redact_url(&url))));
            }
            let connections = match s.postgres_connections {
                None => 4,
                Some(n) if (1..=64).contains(&n) => n as usize,
                Some(n) => return Err(bad("storage.postgres_connections", format!("{n} must be between 1 and 64"))),
            };
            let wakeups = match (s.postgres_wakeups.as_deref().unwrap_or("notify"), s.postgres_poll_ms) {
                ("notify", None) => Wakeups::Notify,
                ("notify", Some(_)) => {
                    return Err(bad(
                        "storage.postgres_poll_ms",
                        "is only used with postgres_wakeups = \"poll\"".into(),
                    ));
                }
                ("poll", ms) => match ms.unwrap_or(1000) {
                    n @ 10..=60_000 => Wakeups::Poll(Duration::from_millis(n as u64)),
                    n => return Err(bad("storage.postgres_poll_ms", format!("{n} must be between 10 and 60000"))),
                },
                (other, _) => {
                    return Err(bad("storage.postgres_wakeups", format!("`{other}` must be \"notify\" or \"poll\"")));
                }
            };
            Ok(Backend::Postgres(PostgresConfig { url, connections, wakeups }))
        }
        other => Err(bad("storage.backend", format!("`{other}` must be \"sqlite\" or \"postgres\""))),
    }
}

/// A node name: 1 to 64 letters, digits, '-', '_' or '.'.
fn check_node_name(n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > 64 || !n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return Err(format!("`{n}` must be 1 to 64 letters, digits, '-', '_' or '.'"));
    }
    Ok(())
}

/// The default node name: this machine's host name (cleaned to a valid name), or `tally`.
pub fn default_node_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let clean: String = host
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' })
        .take(64)
        .collect();
    if clean.is_empty() { "tally".into() } else { clean }
}

/// Hosts of image APIs that document no idempotency header (OpenAI, Replicate, fal and fal's
/// backup domains): `idempotency_header` is refused for them, because a blind resend there
/// is a second charge.
pub const HOSTS_WITHOUT_IDEMPOTENCY: &[&str] = &[
    "api.openai.com",
    "api.replicate.com",
    "queue.fal.run",
    "fal.run",
    "queue.falrun.com",
    "falrun.com",
    "api.fal.ai",
];

/// The documented host `base_url` points at, if it is one of [`HOSTS_WITHOUT_IDEMPOTENCY`].
fn documented_without_idempotency(base_url: &str) -> Option<&'static str> {
    let rest = base_url.split_once("://").map_or(base_url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let host = authority.rsplit('@').next().unwrap_or(authority);
    let host = host.split(':').next().unwrap_or(host).trim_end_matches('.').to_ascii_lowercase();
    HOSTS_WITHOUT_IDEMPOTENCY.iter().copied().find(|h| host == *h)
}

/// The default total request timeout per kind. An `openai_images` generation is answered
/// only when the image is done, which can take minutes; a timeout after sending is an
/// `unknown` (the request may still be generated and charged), so the default matches the
/// official SDK's 600 s instead of manufacturing unknowns. The asynchronous kinds' requests
/// (submit, poll, list) answer quickly.
pub fn default_request_timeout(kind: ProviderKind) -> Duration {
    match kind {
        ProviderKind::OpenaiImages => Duration::from_secs(600),
        _ => Duration::from_secs(120),
    }
}

fn resolve_provider(p: RawProvider, i: usize, origin: &str) -> Result<ProviderConfig, ConfigError> {
    let key = |k: &str| format!("providers[{i}].{k}");
    let bad = |k: &str, reason: String| ConfigError::Invalid { path: origin.into(), key: key(k), reason };
    let name = p.name.ok_or_else(|| bad("name", "is required".into()))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(bad("name", format!("`{name}` must be letters, digits, '-' or '_'")));
    }
    let kind_text = p.kind.ok_or_else(|| bad("kind", "is required".into()))?;
    let kind = ProviderKind::parse(&kind_text)
        .ok_or_else(|| bad("kind", format!("`{kind_text}` is not one of demo, openai_images, replicate, fal_queue")))?;
    let demo = ProviderConfig::demo();
    let ms = |k: &str, v: Option<i64>, default: Duration| -> Result<Duration, ConfigError> {
        match v {
            None => Ok(default),
            Some(n) if (1..=86_400_000).contains(&n) => Ok(Duration::from_millis(n as u64)),
            Some(n) => Err(bad(k, format!("{n} must be between 1 and 86400000"))),
        }
    };
    let max_concurrency = match p.max_concurrency {
        None => 4,
        Some(n) if (1..=1024).contains(&n) => n as usize,
        Some(n) => return Err(bad("max_concurrency", format!("{n} must be between 1 and 1024"))),
    };
    let reserve = match p.reserve {
        None => 1,
        Some(n) if (0..=1024).contains(&n) => n as usize,
        Some(n) => return Err(bad("reserve", format!("{n} must be between 0 and 1024"))),
    };
    if kind != ProviderKind::Demo {
        let url = p.base_url.as_deref().ok_or_else(|| bad("base_url", format!("is required for kind {kind_text}")))?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(bad("base_url", format!("`{url}` must start with http:// or https://")));
        }
        if kind != ProviderKind::OpenaiImages && p.model.is_none() {
            return Err(bad("model", format!("is required for kind {kind_text}")));
        }
    }
    if let Some(env) = &p.api_key_env
        && (env.is_empty() || env.contains('='))
    {
        return Err(bad("api_key_env", "must name an environment variable".into()));
    }
    if let Some(h) = &p.idempotency_header
        && (h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return Err(bad("idempotency_header", format!("`{h}` is not a valid header name")));
    }
    if p.idempotency_header.is_some()
        && let Some(host) = p.base_url.as_deref().and_then(documented_without_idempotency)
    {
        return Err(bad(
            "idempotency_header",
            format!(
                "{host} documents no idempotency header, so it would not deduplicate anything: tally would \
                 treat a resend as free and could be charged twice. Remove idempotency_header for this provider \
                 (it is only for gateways that honour one)"
            ),
        ));
    }
    if let Some(r) = &p.reference_input
        && (r.is_empty() || !r.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(bad("reference_input", format!("`{r}` is not an input name (letters, digits, '_')")));
    }
    let max_response_bytes = match p.max_response_bytes {
        None => demo.max_response_bytes,
        Some(n) if (1024..=1 << 30).contains(&n) => n as usize,
        Some(n) => return Err(bad("max_response_bytes", format!("{n} must be between 1024 and 1073741824"))),
    };
    let money = |k: &str, v: f64| -> Result<crate::domain::Micros, ConfigError> {
        if v.is_finite() && (0.0..1e9).contains(&v) {
            Ok(crate::domain::to_micros(v))
        } else {
            Err(bad(k, format!("{v} must be an amount of money, 0 or more")))
        }
    };
    let per_image = p.price_per_image.map(|v| money("price_per_image", v)).transpose()?;
    let mut per_size = std::collections::BTreeMap::new();
    for (size, v) in p.price_per_size.unwrap_or_default() {
        if crate::providers::http::parse_size(&size).is_none() {
            return Err(bad("price_per_size", format!("`{size}` is not a size like 1024x1024")));
        }
        per_size.insert(size, money("price_per_size", v)?);
    }
    let currency = p.currency.unwrap_or_else(|| DEFAULT_CURRENCY.into());
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(bad("currency", format!("`{currency}` must be a three-letter code such as USD or EUR")));
    }
    let pricing = Pricing { per_image, per_size, currency };
    if kind == ProviderKind::Demo && pricing.is_priced() {
        return Err(bad("price_per_image", "the demo provider never charges, so it takes no price".into()));
    }
    let budget_daily = p.budget_daily.map(|v| money("budget_daily", v)).transpose()?;
    let budget_monthly = p.budget_monthly.map(|v| money("budget_monthly", v)).transpose()?;
    if (budget_daily.is_some() || budget_monthly.is_some()) && !pricing.is_priced() {
        return Err(bad(
            if budget_daily.is_some() { "budget_daily" } else { "budget_monthly" },
            "a budget needs a price to count: set price_per_image (or price_per_size)".into(),
        ));
    }
    Ok(ProviderConfig {
        pricing,
        budget_daily,
        budget_monthly,
        name,
        kind,
        max_concurrency,
        reserve,
        base_url: p.base_url.map(|u| u.trim_end_matches('/').to_string()),
        api_key_env: p.api_key_env,
        model: p.model,
        size: p.size.unwrap_or(demo.size),
        connect_timeout: ms("connect_timeout_ms", p.connect_timeout_ms, demo.connect_timeout)?,
        request_timeout: ms("request_timeout_ms", p.request_timeout_ms, default_request_timeout(kind))?,
        poll_interval: ms("poll_interval_ms", p.poll_interval_ms, demo.poll_interval)?,
        idempotency_header: p.idempotency_header,
        reference_input: p.reference_input,
        max_response_bytes,
        billing_note: p.billing_note,
        delay: match p.delay_ms {
            None => demo.delay,
            Some(n) if (0..=600_000).contains(&n) => Duration::from_millis(n as u64),
            Some(n) => return Err(bad("delay_ms", format!("{n} must be between 0 and 600000"))),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_gives_demo_on_loopback() {
        let c = Config::from_toml("", "t.toml").unwrap();
        assert_eq!(c.server.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.providers.len(), 1);
        assert_eq!(c.providers[0].kind, ProviderKind::Demo);
        assert_eq!(c.storage.durability, Durability::Full);
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let e = Config::from_toml("[engine]\nworkerz = 3\n", "my.toml").unwrap_err().to_string();
        assert!(e.contains("my.toml") && e.contains("workerz"), "{e}");
    }

    #[test]
    fn bad_value_names_key_and_reason() {
        let e = Config::from_toml("[storage]\ndurability = \"off\"\n", "my.toml").unwrap_err().to_string();
        assert!(e.contains("storage.durability") && e.contains("off"), "{e}");
        let e =
            Config::from_toml("[[providers]]\nname = \"x\"\nkind = \"dalle\"\n", "my.toml").unwrap_err().to_string();
        assert!(e.contains("providers[0].kind"), "{e}");
    }

    #[test]
    fn prices_and_budgets_are_checked() {
        let paid = "[[providers]]\nname = \"a\"\nkind = \"openai_images\"\nbase_url = \"http://x\"\n";
        let c = Config::from_toml(
            &format!(
                "[budget]\ndaily = 5\n{paid}price_per_image = 0.04\nprice_per_size = {{ \"1536x1024\" = 0.06 }}\n"
            ),
            "t",
        )
        .unwrap();
        let p = &c.providers[0].pricing;
        assert_eq!((p.price("1024x1024"), p.price("1536x1024")), (Some(40_000), Some(60_000)));
        assert_eq!((c.budget.daily, c.budget.currency.as_deref()), (Some(5_000_000), Some("USD")));
        let e = Config::from_toml(&format!("[budget]\ndaily = 5\n{paid}"), "t").unwrap_err().to_string();
        assert!(e.contains("budget") && e.contains("price_per_image"), "{e}");
        let e = Config::from_toml(&format!("{paid}price_per_image = -1\n"), "t").unwrap_err().to_string();
        assert!(e.contains("providers[0].price_per_image"), "{e}");
        let two = format!(
            "{paid}price_per_image = 1\n[[providers]]\nname = \"b\"\nkind = \"openai_images\"\nbase_url = \"http://y\"\nprice_per_image = 1\ncurrency = \"EUR\"\n"
        );
        let e = Config::from_toml(&two, "t").unwrap_err().to_string();
        assert!(e.contains("providers[1].currency"), "{e}");
        let e = Config::from_toml("[[providers]]\nname = \"d\"\nkind = \"demo\"\nprice_per_image = 1\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("never charges"), "{e}");
    }

    #[test]
    fn backend_defaults_to_sqlite_and_node_to_the_host_name() {
        let c = Config::from_toml("", "t").unwrap();
        assert_eq!(c.storage.backend, Backend::Sqlite);
        assert_eq!(c.node.name, default_node_name());
        assert!(check_node_name(&c.node.name).is_ok(), "{}", c.node.name);
    }

    #[test]
    fn postgres_backend_keys_are_validated() {
        let pg = "[storage]\nbackend = \"postgres\"\npostgres_url = \"postgres://u:secret@db:5432/tally\"\n[node]\nname = \"shop-1\"\n";
        let c = Config::from_toml(pg, "t").unwrap();
        let Backend::Postgres(p) = &c.storage.backend else { panic!("not postgres: {:?}", c.storage.backend) };
        assert_eq!((p.connections, p.wakeups), (4, Wakeups::Notify));
        assert_eq!(c.node.name, "shop-1");
        assert!(!format!("{c:?}").contains("secret"), "the password must not appear in Debug output");
        for (text, key) in [
            ("[storage]\nbackend = \"mysql\"\n", "storage.backend"),
            ("[storage]\nbackend = \"postgres\"\n", "storage.postgres_url"),
            ("[storage]\npostgres_url = \"postgres://x/y\"\n", "storage.postgres_url"),
            ("[storage]\nbackend = \"postgres\"\npostgres_url = \"mysql://x/y\"\n", "storage.postgres_url"),
            (
                "[storage]\nbackend = \"postgres\"\npostgres_url_env = \"TALLY_TEST_SURELY_UNSET_VAR\"\n",
                "storage.postgres_url_env",
            ),
            (
                "[storage]\nbackend = \"postgres\"\npostgres_url = \"postgres://x/y\"\npostgres_wakeups = \"sometimes\"\n",
                "storage.postgres_wakeups",
            ),
            (
                "[storage]\nbackend = \"postgres\"\npostgres_url = \"postgres://x/y\"\npostgres_poll_ms = 100\n",
                "storage.postgres_poll_ms",
            ),
            ("[node]\nname = \"two words\"\n", "node.name"),
        ] {
            let e = Config::from_toml(text, "t").unwrap_err().to_string();
            assert!(e.contains(key), "{text:?} should name {key}: {e}");
        }
        let poll = format!("{pg}postgres_wakeups = \"poll\"\npostgres_poll_ms = 250\n")
            .replace("[node]\nname = \"shop-1\"\n", "");
        let Backend::Postgres(p) = Config::from_toml(&poll, "t").unwrap().storage.backend else { panic!() };
        assert_eq!(p.wakeups, Wakeups::Poll(Duration::from_millis(250)));
    }

    #[test]
    fn a_url_password_is_redacted() {
        assert_eq!(redact_url("postgres://u:pw@h:5/db?x=1"), "postgres://u:***@h:5/db?x=1");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
    }

    #[test]
    fn idempotency_header_is_refused_for_apis_that_document_none() {
        for url in
            ["https://api.openai.com/v1", "https://API.Replicate.com", "https://queue.fal.run", "https://fal.run:443"]
        {
            let text = format!(
                "[[providers]]\nname = \"p\"\nkind = \"openai_images\"\nbase_url = \"{url}\"\nidempotency_header = \"Idempotency-Key\"\n"
            );
            let e = Config::from_toml(&text, "t.toml").unwrap_err().to_string();
            assert!(e.contains("idempotency_header") && e.contains("charged twice"), "{url}: {e}");
        }
        let gateway = "[[providers]]\nname = \"g\"\nkind = \"openai_images\"\nbase_url = \"https://my-gateway.example\"\nidempotency_header = \"Idempotency-Key\"\n";
        assert!(Config::from_toml(gateway, "t").is_ok(), "other gateways: the user's assertion");
        let lookalike = gateway.replace("my-gateway.example", "api.openai.com.my-gateway.example");
        assert!(Config::from_toml(&lookalike, "t").is_ok());
    }

    #[test]
    fn the_readme_provider_example_is_a_valid_config() {
        let readme = include_str!("../README.md");
        let start = readme.find("```toml\n[[providers]]").expect("README has a provider example") + 8;
        let end = start + readme[start..].find("```").expect("closed");
        let c = Config::from_toml(&readme[start..end], "README.md").unwrap();
        let models: Vec<_> = c.providers.iter().filter_map(|p| p.model.as_deref()).collect();
        assert!(
            models.contains(&"fal-ai/flux/dev") && models.contains(&"black-forest-labs/flux-schnell"),
            "{models:?}"
        );
        for p in &c.providers {
            let m = p.model.as_deref().unwrap_or("");
            assert!(!crate::mock::behavior::RETIRED_OPENAI_MODELS.contains(&m), "README names retired model {m}");
        }
    }

    #[test]
    fn openai_images_waits_as_long_as_the_official_sdk_by_default() {
        let text = "[[providers]]\nname = \"o\"\nkind = \"openai_images\"\nbase_url = \"https://api.openai.com/v1\"\n";
        let c = Config::from_toml(text, "t").unwrap();
        assert!(c.providers[0].request_timeout >= Duration::from_secs(600));
    }

    #[test]
    fn non_loopback_listen_needs_confirmation() {
        assert!(Config::from_toml("[server]\nlisten = \"0.0.0.0:7700\"\n", "t").is_err());
        let ok = "[server]\nlisten = \"0.0.0.0:7700\"\nallow_non_loopback = true\n";
        assert!(Config::from_toml(ok, "t").is_ok());
    }
}
