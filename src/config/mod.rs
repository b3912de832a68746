//! Configuration in two steps: [`RawConfig`] is only parsed (TOML, unknown keys refused), then
//! [`Config`] has defaults applied and every value checked, with the file and key named in
//! each error. `config.example.toml` documents every key; keep the two in step.
//! Past 600 lines because each section's raw form and its checks stand side by side; the
//! larger sections (providers, delivery, storage, page) have their own modules already.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use crate::domain::DispatchOrder;

mod delivery;
pub mod page;
mod provider;
mod storage;
#[cfg(test)]
pub(crate) mod tests;

pub use delivery::DeliveryConfig;
use delivery::{RawDelivery, resolve_delivery};
use provider::resolve_provider;
pub use provider::*;
use storage::resolve_backend;
pub use storage::*;

/// A configuration error: which file, which key, and why.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)]
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
    #[serde(default)]
    ui: RawUi,
    #[serde(default)]
    delivery: RawDelivery,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUi {
    language: Option<String>,
    time_zone: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    daily: Option<f64>,
    monthly: Option<f64>,
    currency: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    allowed_hosts: Option<Vec<String>>,
    allow_non_loopback: Option<bool>,
    max_body_bytes: Option<u64>,
    lan: Option<bool>,
    lan_address: Option<String>,
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
    fast_pickup: Option<bool>,
    image_memory_mb: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    older_than: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProvider {
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
    batch: Option<bool>,
    max_response_bytes: Option<i64>,
    billing_note: Option<String>,
    delay_ms: Option<i64>,
    price_per_image: Option<f64>,
    price_per_size: Option<std::collections::BTreeMap<String, f64>>,
    price_per_million_input_tokens: Option<f64>,
    price_per_million_output_tokens: Option<f64>,
    max_output_tokens: Option<i64>,
    currency: Option<String>,
    budget_daily: Option<f64>,
    budget_monthly: Option<f64>,
    operations: Option<Vec<String>>,
    dashboard_url: Option<String>,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
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
    pub ui: UiConfig,
    /// `[delivery]`: the profiles and targets a delivery may name (built-ins and `exports`
    /// included).
    pub delivery: DeliveryConfig,
}

/// `[ui]`: the web page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UiConfig {
    /// `language`: `en` or `zh-CN`; `None` (`auto`, the default) follows the browser's
    /// `Accept-Language`. The page's own switch wins over both.
    pub language: Option<crate::domain::Lang>,
}

/// `[budget]`: spending limits for the whole daemon, in one currency (amounts in
/// millionths, see [`crate::domain::Micros`]); they count only requests priced in it.
/// Per-provider limits live on each provider, in its currency.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct BudgetConfig {
    pub daily: Option<crate::domain::Micros>,
    pub monthly: Option<crate::domain::Micros>,
    /// The limits' currency: `[budget] currency`, else the priced providers' one currency
    /// (`None` when nothing has a price, or when they use several and none is named).
    pub currency: Option<String>,
}

/// `[server]`: where the HTTP API listens and which Host headers it answers.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Extra Host names (exact match, any port) accepted besides the loopback names.
    pub allowed_hosts: Vec<String>,
    /// Must be true to listen on a non-loopback address.
    pub allow_non_loopback: bool,
    pub max_body_bytes: u64,
    /// `server.lan` (or `tally serve --lan`): listen on this computer's address on the shop's
    /// network too, so that a paired phone reaches the page.
    pub lan: bool,
    /// `server.lan_address`: which of this computer's addresses `lan` uses (default: the one
    /// its default route leaves from).
    pub lan_address: Option<std::net::Ipv4Addr>,
}

/// `[storage]`: where the data lives and how durable commits are.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    pub durability: Durability,
    pub backend: Backend,
}

/// `[engine]`: workers, leases and retry policy.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
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
    /// `fast_pickup` (default true): a submit that finds an idle worker and a free slot claims
    /// its task and records `calling` in its own commit (`store::ops::pickup`); false keeps
    /// every task on the dispatcher's path (A/B runs, and the crash cells of that path).
    pub fast_pickup: bool,
    /// `image_memory_mb` (default 384): the daemon's one budget for image work, in MiB: the
    /// decoded pixels and scratch of every thumbnail, profile check, render, zip and delivery in
    /// flight together ([`crate::pixels`]); an image whose work alone needs more is refused
    /// with its size in words.
    pub image_memory: u64,
    /// `[ui] time_zone`: the shop's zone, whose local midnights begin budget days and months
    /// and whose dates the spend report groups by (default: the computer's, else UTC).
    pub time_zone: jiff::tz::TimeZone,
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
            fast_pickup: true,
            image_memory: crate::pixels::DEFAULT_BYTES,
            time_zone: jiff::tz::TimeZone::UTC,
        }
    }
}

/// `[ui] time_zone`: the zone an IANA name names, or (unset) the computer's (`TZ`, else
/// `/etc/localtime`), else UTC. An unknown name is an error in plain words.
pub fn time_zone(name: Option<&str>) -> Result<jiff::tz::TimeZone, String> {
    match name.map(str::trim).filter(|n| !n.is_empty()) {
        None => Ok(jiff::tz::TimeZone::try_system().unwrap_or(jiff::tz::TimeZone::UTC)),
        Some(n) => jiff::tz::TimeZone::get(n).map_err(|_| {
            format!("`{n}` is not a time zone tally knows: use an IANA name such as \"Asia/Shanghai\" or \"UTC\"")
        }),
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

/// The default data directory: the platform's data dir for tally, or `./tally-data`.
pub fn default_data_dir() -> PathBuf {
    directories::ProjectDirs::from("", "", "tally")
        .map(|d| d.data_dir().to_path_buf())
        .unwrap_or_else(|| PathBuf::from("tally-data"))
}

pub use crate::domain::DEFAULT_CURRENCY;

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

    /// Every delivery target, resolved against the data dir (`exports` included); see
    /// [`DeliveryConfig::targets`].
    pub fn delivery_targets(&self) -> Vec<crate::delivery::target::TargetConfig> {
        self.delivery.targets(&self.storage.data_dir)
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
    let lan_address = match raw.server.lan_address.as_deref() {
        None => None,
        Some(text) => match text.trim().parse::<std::net::Ipv4Addr>() {
            Ok(a) if a.is_loopback() || a.is_unspecified() || a.is_multicast() || a.is_broadcast() => {
                return Err(bad(
                    "server.lan_address",
                    format!(
                        "`{text}` is not an address other devices can reach; name this computer's address on the shop's network, e.g. 192.168.1.20"
                    ),
                ));
            }
            Ok(a) => Some(a),
            Err(_) => {
                return Err(bad(
                    "server.lan_address",
                    format!(
                        "`{text}` is not an IPv4 address; name this computer's address on the shop's network, e.g. 192.168.1.20"
                    ),
                ));
            }
        },
    };
    let lan = raw.server.lan.unwrap_or(false) || lan_address.is_some();

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
        fast_pickup: e.fast_pickup.unwrap_or(d.fast_pickup),
        image_memory: count("engine.image_memory_mb", e.image_memory_mb, d.image_memory >> 20, 64, 65_536)? << 20,
        time_zone: time_zone(raw.ui.time_zone.as_deref()).map_err(|e| bad("ui.time_zone", e))?,
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
    let ui = UiConfig {
        language: match raw.ui.language.as_deref().map(str::trim) {
            None | Some("auto") | Some("") => None,
            Some(l) => Some(crate::domain::Lang::parse(l).ok_or_else(|| ConfigError::Invalid {
                path: origin.into(),
                key: "ui.language".into(),
                reason: format!("`{l}` is not one the page has: use \"en\", \"zh-CN\" or \"auto\""),
            })?),
        },
    };
    let delivery = resolve_delivery(raw.delivery, origin)?;
    Ok(Config {
        warnings,
        server: ServerConfig { listen, allowed_hosts, allow_non_loopback, max_body_bytes, lan, lan_address },
        storage: StorageConfig { data_dir, durability, backend },
        node,
        engine,
        providers,
        budget,
        ui,
        delivery,
    })
}

/// `[budget]` and the currency rule: tally never converts currencies, so a limit for the
/// whole daemon is in one currency (`[budget] currency`, needed when the priced providers use
/// several) and counts only requests priced in it; a limit needs something priced to count.
fn resolve_budget(raw: RawBudget, providers: &[ProviderConfig], origin: &str) -> Result<BudgetConfig, ConfigError> {
    let bad = |key: &str, reason: String| ConfigError::Invalid { path: origin.into(), key: key.into(), reason };
    let mut priced: Vec<&str> =
        providers.iter().filter(|p| p.pricing.is_priced()).map(|p| p.pricing.currency.as_str()).collect();
    priced.sort_unstable();
    priced.dedup();
    let named = raw.currency.as_deref().map(str::trim).filter(|c| !c.is_empty()).map(str::to_uppercase);
    if let Some(c) = &named
        && !priced.contains(&c.as_str())
    {
        return Err(bad(
            "budget.currency",
            format!(
                "no priced provider uses `{c}` (they use {}): the budget would count nothing; tally does not convert \
                 currencies",
                if priced.is_empty() { "none".to_string() } else { priced.join(", ") }
            ),
        ));
    }
    let currency = named.or_else(|| match priced.as_slice() {
        [one] => Some(one.to_string()),
        _ => None,
    });
    let limit = |key: &str, v: Option<f64>| -> Result<Option<crate::domain::Micros>, ConfigError> {
        match v {
            None => Ok(None),
            Some(x) if x.is_finite() && (0.0..1e12).contains(&x) => Ok(Some(crate::domain::to_micros(x))),
            Some(x) => Err(bad(key, format!("{x} must be an amount of money, 0 or more"))),
        }
    };
    let daily = limit("budget.daily", raw.daily)?;
    let monthly = limit("budget.monthly", raw.monthly)?;
    if (daily.is_some() || monthly.is_some()) && priced.is_empty() {
        return Err(bad("budget", crate::domain::words::t(crate::domain::Lang::En, "say.budget_needs_prices")));
    }
    if (daily.is_some() || monthly.is_some()) && currency.is_none() {
        return Err(bad(
            "budget",
            format!(
                "the priced providers use several currencies ({}) and tally does not convert between them: name the \
                 one this budget is in with `currency = \"{}\"` under [budget], or set budget_daily / budget_monthly \
                 on each provider instead",
                priced.join(", "),
                priced.first().copied().unwrap_or("USD")
            ),
        ));
    }
    Ok(BudgetConfig { daily, monthly, currency })
}
