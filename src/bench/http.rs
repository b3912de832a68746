//! HTTP submit throughput over loopback: `POST /v1/tasks` from 32 concurrent keep-alive
//! connections, each request with its own `Idempotency-Key`, for a fixed time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// What the HTTP section measured.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct HttpResult {
    pub connections: usize,
    pub secs: f64,
    /// Requests answered with a 2xx status.
    pub ok: u64,
    /// Requests answered otherwise, or failed.
    pub errors: u64,
    pub submits_per_s: f64,
    /// The first error seen, if any (status and a bit of the body, or the transport error).
    pub first_error: Option<String>,
}

/// Drive `POST {base_url}/v1/tasks` with `conns` concurrent keep-alive connections for
/// `secs` seconds, authenticating with `token` and submitting to `provider`.
pub async fn submit_throughput(
    base_url: &str,
    token: &str,
    provider: &str,
    conns: usize,
    secs: f64,
) -> Result<HttpResult, String> {
    // reqwest is built with `rustls-no-provider`: a crypto provider must be installed once
    // (an error only means one is installed already).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(conns)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    let url = format!("{}/v1/tasks", base_url.trim_end_matches('/'));
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let run = uuid::Uuid::new_v4().simple().to_string();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut set = tokio::task::JoinSet::new();
    for c in 0..conns {
        let (client, url, token, provider, run) =
            (client.clone(), url.clone(), token.to_string(), provider.to_string(), run.clone());
        let (ok, errors, first_error) = (ok.clone(), errors.clone(), first_error.clone());
        set.spawn(async move {
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let body = serde_json::json!({ "provider": provider, "prompt": format!("bench http {c}-{i}") });
                let res = client
                    .post(&url)
                    .bearer_auth(&token)
                    .header("Idempotency-Key", format!("bench-{run}-{c}-{i}"))
                    .json(&body)
                    .send()
                    .await;
                let failure = match res {
                    Ok(r) if r.status().is_success() => {
                        // Read the body so the connection goes back to the pool.
                        let _ = r.bytes().await;
                        ok.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                    Ok(r) => {
                        let status = r.status();
                        let text = r.text().await.unwrap_or_default();
                        Some(format!("{status}: {}", text.chars().take(200).collect::<String>()))
                    }
                    Err(e) => Some(e.to_string()),
                };
                if let Some(f) = failure {
                    errors.fetch_add(1, Ordering::Relaxed);
                    first_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(f);
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    let elapsed = start.elapsed().as_secs_f64();
    let ok = ok.load(Ordering::Relaxed);
    let first_error = first_error.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(HttpResult {
        connections: conns,
        secs: elapsed,
        ok,
        errors: errors.load(Ordering::Relaxed),
        submits_per_s: ok as f64 / elapsed,
        first_error,
    })
}

/// A real `tally serve` child process on a free loopback port, for the HTTP section.
#[allow(missing_docs)]
pub struct Daemon {
    child: std::process::Child,
    pid: u32,
    pub base_url: String,
    pub token: String,
}

impl Daemon {
    /// Start this executable as `tally serve` over a fresh data dir under `dir`, with one
    /// `demo` provider named `provider` whose single worker holds its first task (so the
    /// measurement is the submit path, not image rendering).
    pub fn start(dir: &std::path::Path, provider: &str) -> Result<Daemon, String> {
        let providers = format!(
            "[engine]\nworkers = 1\n\n[[providers]]\nname = \"{provider}\"\nkind = \"demo\"\nmax_concurrency = 1\n\
             delay_ms = 600000\n"
        );
        Daemon::spawn(dir, &dir.join("http-daemon"), &providers)
    }

    /// Start this executable as `tally serve` on the existing data dir `data` (config written
    /// under `dir`), with a quick `demo` provider (for downloads and a backup under load).
    pub fn start_on(dir: &std::path::Path, data: &std::path::Path) -> Result<Daemon, String> {
        let providers = "[engine]\nworkers = 4\n\n[[providers]]\nname = \"demo\"\nkind = \"demo\"\nmax_concurrency = 4\n\
                         delay_ms = 20\n";
        Daemon::spawn(dir, data, providers)
    }

    /// Start this executable as `tally serve` on the data dir `data` with `rest` appended to
    /// its config (written under `dir`); returns once it listens.
    pub(super) fn spawn(dir: &std::path::Path, data: &std::path::Path, rest: &str) -> Result<Daemon, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find the tally executable: {e}"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("no free port: {e}"))?;
        let config = dir.join(format!("daemon-{port}.toml"));
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[storage]\ndata_dir = \"{}\"\n\n{rest}",
            data.display()
        );
        std::fs::write(&config, text).map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        let child = std::process::Command::new(exe)
            .args(["serve", "--config"])
            .arg(&config)
            .env_remove("TALLY_CONFIG")
            .env_remove("TALLY_DATA_DIR")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start tally serve: {e}"))?;
        let pid = child.id();
        let mut d = Daemon { child, pid, base_url: format!("http://127.0.0.1:{port}"), token: String::new() };
        // Start-up checks the database (SQLite reads every page): allow for a large one.
        let deadline = Instant::now() + Duration::from_secs(300);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("tally serve did not listen within 300 s".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        d.token = std::fs::read_to_string(data.join("api-token"))
            .map_err(|e| format!("cannot read the daemon's token: {e}"))?
            .trim()
            .to_string();
        Ok(d)
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The daemon's resident set size in MB.
    pub fn rss_mb(&self) -> Option<f64> {
        super::sys::rss_mb_of(&format!("/proc/{}/status", self.pid))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
