//! `[storage]` and `[node]`: which database holds the records, how durable commits are, and a
//! PostgreSQL node's name and connection.

use std::time::Duration;

use super::{ConfigError, RawStorage};

/// How durable each commit is (DESIGN §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Every durable operation (see `store::Commit`) is answered, and readable, only once it is
    /// on disk (SQLite: after the flusher's fsync of the WAL that started after its commit,
    /// `store::sqlite::flush`): the `calling` record is on disk before a paid request leaves.
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
    /// LISTEN/NOTIFY on the node's own connection: idle nodes run no SQL statements (the
    /// lock connection's empty liveness query aside, `store::postgres::timeouts`).
    Notify,
    /// Poll every interval instead (for connection poolers in transaction mode, which
    /// cannot deliver notifications). Degraded: idle nodes run SQL on every tick.
    Poll(Duration),
}

/// `[storage] backend = "postgres"`: where the database is and how a node talks to it.
#[derive(Clone, PartialEq, Eq)]
#[allow(missing_docs)]
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

/// The `[storage]` backend keys: `backend`, and for PostgreSQL where the database is.
pub(super) fn resolve_backend(
    s: &RawStorage,
    bad: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Backend, ConfigError> {
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
pub(super) fn check_node_name(n: &str) -> Result<(), String> {
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
