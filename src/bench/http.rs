//! HTTP submit throughput over loopback: `POST /v1/tasks` from 32 concurrent keep-alive
//! connections, each request with its own `Idempotency-Key`, for a fixed time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// What the HTTP section measured.
#[derive(Debug, Clone, Serialize)]
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
