//! Wiring for `tally serve`: configuration overrides, the data-directory lock, the API
//! token, the engine and its providers, the HTTP listener, logging, and clean shutdown
//! (stop accepting → engine shutdown → store close with a WAL checkpoint).
//! Past 600 lines because the wiring is one sequence, read top to bottom; split, its order
//! (which is what matters here) would be spread over files.

use std::io::{Seek, Write};
use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::api::{self, AppState, auth};
use crate::clock::OffsetClock;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::config::{Backend, PostgresConfig, Wakeups, redact_url};
use crate::engine::{Engine, EngineParts, ProviderEntry};
use crate::metrics::Metrics;
use crate::store::postgres::{PgOptions, PgStore};
use crate::store::{Severity, Store, UsedEvidence, open_for_serve};

/// The lock file inside the data dir (never the database file: closing any handle on the
/// database would drop SQLite's own locks).
pub const LOCK_FILE: &str = "tally.lock";

/// The file in the data dir where a running `tally serve` writes the address it listens on,
/// so that other commands with the same data directory find it (also after `--listen`).
/// Removed at a clean stop; a stale one after a crash names the last address, which the next
/// start overwrites.
pub const ADDRESS_FILE: &str = "serve.addr";

/// The address a running daemon of this data dir wrote into [`ADDRESS_FILE`], if any.
pub fn served_address(data_dir: &Path) -> Option<SocketAddr> {
    std::fs::read_to_string(data_dir.join(ADDRESS_FILE)).ok()?.trim().parse().ok()
}

fn write_address(data_dir: &Path, addr: SocketAddr) -> std::io::Result<()> {
    let tmp = data_dir.join(format!(".{ADDRESS_FILE}.tmp"));
    std::fs::write(&tmp, format!("{addr}\n"))?;
    std::fs::rename(&tmp, data_dir.join(ADDRESS_FILE))
}

/// How long a clean stop waits for open HTTP connections before going on without them.
const HTTP_DRAIN: Duration = Duration::from_secs(5);

/// Load the configuration: the file if one is named (flag, then `TALLY_CONFIG`), else the
/// defaults; then a data dir named by flag or `TALLY_DATA_DIR` replaces the file's.
pub fn load_config(config: Option<&Path>, data_dir: Option<&Path>) -> Result<Config, Failure> {
    let mut cfg = match config {
        Some(p) => Config::load(p).map_err(|e| Failure::error(e.to_string()))?,
        None => Config::defaults(),
    };
    if let Some(d) = data_dir {
        cfg.storage.data_dir = d.to_path_buf();
    }
    Ok(cfg)
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for machines.
    Json,
}

/// Start `tracing` output on stderr: level `info` unless `RUST_LOG` says otherwise.
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// The exclusive lock that makes one daemon per data dir. Held until dropped.
#[derive(Debug)]
pub struct DataDirLock {
    _file: std::fs::File,
}

/// Take the data dir's lock and write this process's pid into it; if another process holds
/// it, fail naming that process.
pub fn lock_data_dir(dir: &Path) -> Result<DataDirLock, Failure> {
    match try_lock_data_dir(dir)? {
        Some(lock) => Ok(lock),
        None => {
            let holder = std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap_or_default();
            let holder = holder.trim();
            let who = if holder.is_empty() { "another process".to_string() } else { format!("pid {holder}") };
            Err(Failure::error(format!(
                "another tally serve ({who}) is already using the data directory {}; stop it first",
                dir.display()
            )))
        }
    }
}

/// Take the data dir's lock if no other process holds it (`None`: a daemon is running there),
/// and write this process's pid into it.
pub fn try_lock_data_dir(dir: &Path) -> Result<Option<DataDirLock>, Failure> {
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Failure::error(format!("cannot open the lock file {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(Failure::error(format!("cannot lock {}: {e}", path.display())));
        }
    }
    let write = |file: &mut std::fs::File| -> std::io::Result<()> {
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        file.sync_all()
    };
    write(&mut file).map_err(|e| Failure::error(format!("cannot write the lock file {}: {e}", path.display())))?;
    Ok(Some(DataDirLock { _file: file }))
}

/// The base URL clients use for a listen address (an unspecified address means loopback).
pub fn base_url(listen: SocketAddr) -> String {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{addr}")
}

/// Create the data directory (mode 0700) if it does not exist.
pub fn create_data_dir(dir: &Path) -> Result<(), Failure> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Failure::error(format!("cannot create the data directory {}: {e}", dir.display())))
}

/// SIGINT and SIGTERM, caught from the moment this is made: a signal that arrives while the
/// daemon is still starting (opening and checking the database) is kept, and the daemon then
/// stops cleanly as soon as it is up, instead of dying from the signal's default action.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> Result<StopSignals, Failure> {
        use tokio::signal::unix::{SignalKind, signal};
        let term =
            signal(SignalKind::terminate()).map_err(|e| Failure::error(format!("cannot listen for SIGTERM: {e}")))?;
        let int =
            signal(SignalKind::interrupt()).map_err(|e| Failure::error(format!("cannot listen for SIGINT: {e}")))?;
        Ok(StopSignals { term, int })
    }

    /// Wait for SIGINT or SIGTERM.
    async fn recv(mut self) -> Result<(), Failure> {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = self.int.recv() => tracing::info!("SIGINT: stopping"),
        }
        Ok(())
    }
}

/// Re-read the budget limits from `path` on every SIGHUP: a raised limit lets held tasks go
/// at once, without a restart. Only `[budget]` and the providers' `budget_daily` /
/// `budget_monthly` are taken; other changes need a restart (said in the log). A budget set
/// at run time (`PUT /v1/budget`) stays in force over the file's; it is re-read too.
async fn reload_budgets_on_sighup(engine: Arc<Engine>, path: PathBuf) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; budget changes need a restart");
        return;
    };
    while hup.recv().await.is_some() {
        match Config::load(&path) {
            Ok(cfg) => {
                let limits = crate::engine::money::limits(&cfg);
                let n = limits.len();
                match engine.reload_config_limits(limits).await {
                    Ok(held) => tracing::info!(
                        limits = n,
                        held_tasks_checking_again = held,
                        "SIGHUP: budget limits re-read from {} (other settings need a restart)",
                        path.display()
                    ),
                    Err(e) => tracing::error!(error = %e, "SIGHUP: could not apply the budget limits"),
                }
            }
            Err(e) => tracing::error!("SIGHUP: the configuration has an error, budgets unchanged: {e}"),
        }
    }
}

/// `tally serve`: run the daemon until SIGINT/SIGTERM, then stop cleanly. `config_path` is
/// the file `cfg` came from (re-read for budget limits on SIGHUP).
pub async fn serve(cfg: Config, config_path: Option<PathBuf>, open_browser: bool) -> Result<(), Failure> {
    let signals = StopSignals::install()?;
    // Before any image work: the daemon's one budget for it (`[engine] image_memory_mb`).
    crate::pixels::configure(cfg.engine.image_memory);
    // Said at start-up, not discovered at the first task: a provider whose key is missing
    // fails every task (before sending anything).
    for w in crate::engine::money::warnings(&cfg) {
        tracing::warn!("{w}");
    }
    let dir = cfg.storage.data_dir.clone();
    create_data_dir(&dir)?;
    let _lock = lock_data_dir(&dir)?;
    // Providers added in the page (`config::page`): after the file's, which win on a name.
    let page = crate::config::page::PageProviders::new(&dir).load().map_err(|e| Failure::error(e.to_string()))?;
    let mut cfg = cfg;
    for p in page {
        if cfg.providers.iter().any(|c| c.name == p.name) {
            tracing::warn!(provider = %p.name, "a provider added in the page has the name of one in the config file; the file's is used");
        } else {
            cfg.providers.push(p);
        }
    }
    let mut entries = Vec::new();
    for p in &cfg.providers {
        let provider = crate::providers::build(p).map_err(|e| Failure::error(format!("provider `{}`: {e}", p.name)))?;
        entries.push(ProviderEntry::new(p.name.clone(), provider, p.max_concurrency).with_config(p));
    }
    let default_provider = cfg.providers.first().map(|p| p.name.clone()).unwrap_or_else(|| "demo".into());

    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    // The database first: the API token is evidence that the data dir was used, so it must
    // not exist before the database does (a first start that stops early must not make the
    // next one look like a lost database).
    let db = cfg.db_path();
    let token_path = cfg.token_path();
    // An older version kept images as files in these directories (before the migration).
    let evidence = UsedEvidence { token: token_path.clone(), dirs: vec![dir.join("artifacts"), dir.join("uploads")] };
    let (store, clock) = match &cfg.storage.backend {
        Backend::Sqlite => {
            let store = open_for_serve(&db, cfg.storage.durability, &evidence)
                .map_err(|e| Failure::error(format!("cannot open the database {}: {e}", db.display())))?;
            // Before start-up recovery: an older copy of the database holds what it would send
            // again (`store::sqlite::lineage`, `store::held`).
            let start = match store.begin_serving(crate::clock::Clock::now(&SystemClock)).await {
                Ok(s) => s,
                Err(e) => {
                    let _ = store.close();
                    return Err(Failure::error(format!("cannot start serving {}: {e}", db.display())));
                }
            };
            say_held(&start);
            (Store::Sqlite(store), crate::clock::system_or_test_start())
        }
        Backend::Postgres(pg) => {
            let store = open_postgres(&cfg, pg)?;
            tracing::info!(node = %cfg.node.name, database = %redact_url(&pg.url), "running as a node on PostgreSQL");
            let clock = Arc::new(OffsetClock::new(store.clock_offset_ms())) as Arc<dyn crate::clock::Clock>;
            (Store::Postgres(store), clock)
        }
    };
    if !store.migration_notes().is_empty() {
        let mut out = std::io::stdout().lock();
        for note in store.migration_notes() {
            let _ = writeln!(out, "upgrade: {note}");
        }
        let _ = out.flush();
    }
    let before_engine = |e: Failure| {
        let _ = store.close();
        e
    };
    let token = auth::load_or_create_token(&token_path)
        .map_err(|e| Failure::error(format!("cannot create or read the API token {}: {e}", token_path.display())))
        .map_err(before_engine)?;
    let listener = crate::server::listen(cfg.server.listen)
        .map_err(|e| Failure::error(format!("cannot listen on {}: {e}", cfg.server.listen)))
        .map_err(before_engine)?;
    let local = listener
        .local_addr()
        .map_err(|e| Failure::error(format!("cannot read the listen address: {e}")))
        .map_err(before_engine)?;
    // `--lan`: the shop's network too, on the same port; without an address tally says why
    // and stays on loopback (the Host check then names the address, and pairing links use it).
    let mut lan = None;
    if cfg.server.lan {
        match crate::server::open_lan(cfg.server.lan_address, local) {
            Ok(l) => {
                cfg.server.allowed_hosts.push(l.1.ip().to_string());
                lan = Some(l);
            }
            Err(why) => println!("--lan: {why}; tally stays on loopback ({local}) and a phone cannot reach it"),
        }
    }
    if let Err(e) = write_address(&dir, local) {
        tracing::warn!(error = %e, "cannot write {ADDRESS_FILE}; other commands will look for the daemon at server.listen");
    }
    let engine = match Engine::start(EngineParts {
        store: store.clone(),
        config: cfg.engine.clone(),
        clock,
        providers: entries,
        data_dir: dir.clone(),
        metrics: Arc::new(Metrics::new()),
        limits: crate::engine::money::limits(&cfg),
    })
    .await
    {
        Ok(e) => Arc::new(e),
        Err(e) => {
            let _ = store.close();
            return Err(Failure::error(format!("cannot start the engine: {e}")));
        }
    };

    let base = base_url(local);
    engine.start_deliveries(cfg.delivery.clone());
    matches!(cfg.storage.backend, Backend::Sqlite).then(|| engine.spawn_db_check(db.clone()));
    tracing::info!(
        listen = %local,
        data_dir = %dir.display(),
        providers = ?engine.provider_names(),
        time_zone = %crate::domain::zone::name(&engine.time_zone()),
        "tally is running"
    );
    let state = AppState::new(engine.clone(), token, &cfg.server, default_provider);
    if let Some(lang) = cfg.ui.language {
        state.set_ui_language(lang);
    }
    state.set_delivery_profiles(cfg.delivery.profiles.clone());
    let mut listeners = vec![listener];
    if let Some((lan_listener, addr)) = lan {
        state.set_lan_base(format!("http://{addr}"));
        tracing::info!(lan = %addr, "tally listens on the shop's network too");
        listeners.extend(lan_listener);
    }
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "tally is listening on {base}");
        if let Some(lan) = state.lan_base() {
            let _ = writeln!(
                out,
                "on the shop's network: {lan} (to use it from a phone, pair it: `tally sign-in --qr`, or \"Use it on your phone\" in the page)"
            );
        }
        let _ = writeln!(out, "API token: {} (`tally token` prints it)", token_path.display());
        let _ = writeln!(out, "{}", crate::web::sign_in_line(&base, &state));
        let _ = out.flush();
    }
    if open_browser && has_desktop() {
        // A second one-time link, for the browser this opens (the printed one stays usable).
        let url = crate::api::session::login_url(&base, &state.sessions().new_code(None));
        open_in_browser(&url);
    }

    let _reload = config_path.map(|p| AbortOnDrop(tokio::spawn(reload_budgets_on_sighup(engine.clone(), p))));
    let signal_result = Arc::new(std::sync::Mutex::new(None));
    let shutdown = {
        let (signal_result, state) = (signal_result.clone(), state.clone());
        let failed = engine.clone();
        async move {
            // A signal, or the engine gave up on its database (read-only, corrupt): either way
            // stop the same clean way; the second ends with exit code 1 and says why.
            let r = tokio::select! {
                r = signals.recv() => r,
                why = failed.failure() => {
                    tracing::error!(reason = %why, "stopping: the database cannot be used any more");
                    Err(Failure::error(format!("tally stopped because its database cannot be used any more: {why}")))
                }
            };
            if let Err(e) = r {
                *signal_result.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            }
            // Open event streams would otherwise keep their connections (and the stop) waiting.
            state.close_streams();
        }
    };
    crate::server::serve(
        listeners,
        api::app(state, crate::web::routes()),
        crate::server::Limits::for_this_process(),
        shutdown,
        HTTP_DRAIN,
    )
    .await;

    // Stop the engine and checkpoint the database whatever happened to the HTTP server.
    engine.shutdown().await;
    let closed = engine.store().close();
    let _ = std::fs::remove_file(dir.join(ADDRESS_FILE));
    tracing::info!("stopped");
    if let Some(e) = signal_result.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(e);
    }
    match closed {
        Ok(()) => Ok(()),
        // A full or failing disk can refuse the final checkpoint. Nothing is lost: the WAL
        // beside the database holds the last commits and is applied at the next start. The
        // stop itself was clean, so the exit code is 0; the log says what is different.
        Err(e) if e.severity() == Severity::Resource => {
            tracing::warn!(
                error = %e,
                "the final WAL checkpoint failed (disk full?); nothing is lost: keep the -wal file beside the database, \
                 it is applied at the next start (copy the database with `tally backup`, not by hand)"
            );
            Ok(())
        }
        Err(e) => Err(Failure::error(format!("the database did not close cleanly: {e}"))),
    }
}

/// Tell the owner what start-up noticed about an older database (stdout and the log).
fn say_held(start: &crate::store::sqlite::lineage::ServeStart) {
    if let Some(p) = &start.sidecar_problem {
        tracing::warn!("{p}; judging the database by its own marks only");
    }
    let Some(older) = &start.older else { return };
    let text = format!(
        "{}. So that nothing is paid for twice, {} job(s) that were not settled in it are held, not sent: each may \
         have been sent since by the daemon this copy came from. See them with `tally held list` (or under \
         \"Needs your attention\" in the web page) and send them again with `tally held release`.",
        older.explain(),
        start.held
    );
    tracing::warn!("{text}");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "older database: {text}");
    let _ = out.flush();
}

/// Connect to PostgreSQL as this node (`[node] name`): the schema is created or migrated,
/// and the node's lock is taken (refused while another live process holds it).
pub fn open_postgres(cfg: &Config, pg: &PostgresConfig) -> Result<PgStore, Failure> {
    let opts = PgOptions {
        url: pg.url.clone(),
        node: cfg.node.name.clone(),
        connections: pg.connections,
        durability: cfg.storage.durability,
        schema: None,
        db_clock: true,
        listen: pg.wakeups == Wakeups::Notify,
        poll: match pg.wakeups {
            Wakeups::Poll(every) => Some(every),
            Wakeups::Notify => None,
        },
        watch_peers: true,
        lease: cfg.engine.lease,
    };
    PgStore::open(opts)
        .map_err(|e| Failure::error(format!("cannot use the PostgreSQL database {}: {e}", redact_url(&pg.url))))
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The database a `check` or `backup` path names, made absolute for comparison.
pub fn same_file(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| -> PathBuf { std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()) };
    canon(a) == canon(b)
}

/// Every exit code tally uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Everything worked (and a waited-for task succeeded).
    Ok = 0,
    /// An error: bad input, unreachable daemon, refused request, locked data dir, …
    Error = 1,
    /// The command line could not be parsed.
    Usage = 2,
    /// A waited-for task failed or was canceled.
    NotSucceeded = 3,
    /// A waited-for task ended `unknown`: its outcome cannot be confirmed.
    Unknown = 4,
    /// `check` found problems.
    Problems = 5,
    /// `--wait` was stopped with Ctrl-C; the job or set keeps running in the daemon.
    Interrupted = 130,
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> std::process::ExitCode {
        std::process::ExitCode::from(e as u8)
    }
}

/// A command that did not succeed: what to print and which exit code to use.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    /// A plain error (exit code 1).
    pub fn error(message: impl Into<String>) -> Self {
        Failure { exit: Exit::Error, message: message.into() }
    }
}

/// Whether `tally serve` runs in a desktop session a browser can open in: not as a service
/// (`TALLY_SERVICE`, set by `tally service install`), and on Linux only with a display.
fn has_desktop() -> bool {
    if std::env::var_os("TALLY_SERVICE").is_some() {
        return false;
    }
    if cfg!(any(target_os = "macos", windows)) {
        return true;
    }
    ["DISPLAY", "WAYLAND_DISPLAY"].iter().any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
}

/// Open `url` in the default browser (`xdg-open`, `open`, `start`), without waiting for it;
/// a failure is logged, never fatal (the link is printed too).
fn open_in_browser(url: &str) {
    let mut cmd = if cfg!(target_os = "macos") {
        std::process::Command::new("open")
    } else if cfg!(windows) {
        let mut c = std::process::Command::new("cmd");
        c.args(["/C", "start", ""]);
        c
    } else {
        std::process::Command::new("xdg-open")
    };
    cmd.arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    match cmd.spawn() {
        Ok(_) => tracing::info!("opened the sign-in link in the default browser (`--no-browser` stops this)"),
        Err(e) => tracing::warn!(error = %e, "could not open a browser; use the sign-in link printed above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let cfg = Config::from_toml(include_str!("../config.example.toml"), "config.example.toml");
        assert!(cfg.is_ok(), "{:?}", cfg.err());
    }

    /// The documented `[ui] time_zone` example is a key the config takes.
    #[test]
    fn example_config_time_zone_parses_when_uncommented() {
        let text = include_str!("../config.example.toml").replace("# time_zone = ", "time_zone = ");
        let cfg = Config::from_toml(&text, "config.example.toml").expect("parses");
        assert_eq!(cfg.engine.time_zone.iana_name(), Some("Asia/Shanghai"));
    }

    /// Regression (issue 24, finding 7): the example said `tally serve` refuses
    /// `backend = "postgres"`; it runs on it (`app::serve`, `open_postgres`).
    #[test]
    fn example_config_does_not_say_serve_refuses_postgres() {
        let text = include_str!("../config.example.toml");
        let storage = text.split("[node]").next().unwrap_or(text);
        for stale in ["does not run on it yet", "refuses this setting"] {
            assert!(!storage.contains(stale), "config.example.toml still says `{stale}`");
        }
        assert!(storage.contains("tally serve"), "the backend text says what `tally serve` does with it");
    }

    #[test]
    fn second_lock_names_the_holder() {
        let dir = std::env::temp_dir().join(format!("tally-lock-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = lock_data_dir(&dir).unwrap();
        let err = lock_data_dir(&dir).unwrap_err();
        assert!(err.message.contains(&std::process::id().to_string()), "{}", err.message);
        drop(first);
        assert!(lock_data_dir(&dir).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn base_url_for_unspecified_is_loopback() {
        assert_eq!(base_url("0.0.0.0:7700".parse().unwrap()), "http://127.0.0.1:7700");
        assert_eq!(base_url("[::]:7700".parse().unwrap()), "http://[::1]:7700");
    }
}
