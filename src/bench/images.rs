//! `tally bench --only images`: what keeping images in the database costs and gives
//! (bench-results/2026-12-01-s3-images-in-database.md):
//! - end-to-end throughput with the tiny bench PNG and with a realistic 1.5 MB PNG (16 workers,
//!   `durability = "full"`, both methods of section 1), beside the physical limit measured in
//!   the same run (issue #16: the large image written to a file of its own and fsynced, by as
//!   many threads in parallel as there are workers; measured before and after the large runs);
//! - the WAL's peak and final size while 1,000 (quick: 200) 1.5 MB images are stored, the
//!   database's size after them, and after pruning the older half (`Store::prune`, pages given
//!   back);
//! - downloads from a real `tally serve` on that data dir: MB/s with 8 clients fetching 1.5 MB
//!   artifacts, and the daemon's idle and peak RSS (`VmHWM`);
//! - `tally backup` (`store::backup`) of that database idle and while 2 clients submit.
//!
//! The large image is `render::photo_like_png` (896×896, noisy gradient, about 1.5 MB), or the
//! PNG file named by `TALLY_BENCH_IMAGE`, so that another build can be measured with the same
//! bytes. With `--http URL --token T [--http-pid PID]` only the download part runs, against
//! that daemon (for a before/after comparison with an older build).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::provider::InstantProvider;
use super::{E2e, sections};
use crate::config::Durability;
use crate::store::Store;

/// Everything the images section measured.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Images {
    /// Size of the large PNG, bytes.
    pub image_bytes: u64,
    /// Tiny and large image, 16 workers, durability full, sequential and concurrent.
    pub e2e: Vec<E2e>,
    /// The physical limit for the large image: files/s when 16 threads each write it to a new
    /// file and fsync it ([`physical_limit`]), measured just before and just after the
    /// large-image runs.
    pub physical_per_s: Vec<f64>,
    pub storage: Option<Storage>,
    pub download: Option<Download>,
    pub backup: Option<Backup>,
}

/// Database and WAL sizes around many large images and a prune.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Storage {
    pub images: u64,
    /// Largest WAL file seen while they were stored (sampled every 10 ms).
    pub wal_peak_mb: f64,
    /// The WAL file when the last one had succeeded (before the clean stop's checkpoint).
    pub wal_end_mb: f64,
    /// `tally.db` after the clean stop.
    pub db_mb: f64,
    /// Tasks the prune of the older half deleted.
    pub pruned: u64,
    pub prune_secs: f64,
    /// Bytes `incremental_vacuum` gave back, as reported by the prune.
    pub freed_mb: f64,
    /// The WAL file right after the prune, before the stop.
    pub wal_after_prune_mb: f64,
    /// `tally.db` after the prune and a clean stop.
    pub db_after_prune_mb: f64,
}

/// Artifact downloads from a real daemon.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Download {
    pub clients: usize,
    pub secs: f64,
    pub requests: u64,
    pub errors: u64,
    pub mb_per_s: f64,
    /// Average size of the images downloaded.
    pub image_mb: f64,
    pub idle_rss_mb: Option<f64>,
    /// The daemon's peak RSS (VmHWM) after the downloads, over its whole life.
    pub peak_rss_mb: Option<f64>,
    /// `tally serve` start until it listened (its start-up check reads the whole database).
    pub startup_secs: Option<f64>,
}

/// `tally backup` of the large database.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Backup {
    pub db_mb: f64,
    pub idle_secs: f64,
    pub under_load_secs: f64,
    /// Tasks the 2 clients submitted while the loaded backup ran.
    pub submitted_during: u64,
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// The large image: `TALLY_BENCH_IMAGE`, else the built-in 1.5 MB photo-like PNG.
fn large_image() -> Result<Vec<u8>, String> {
    match std::env::var_os("TALLY_BENCH_IMAGE") {
        Some(p) => std::fs::read(&p).map_err(|e| format!("TALLY_BENCH_IMAGE {}: {e}", Path::new(&p).display())),
        None => Ok(crate::render::photo_like_png(896, 896, 4, 7)),
    }
}

/// The physical limit of storing `image` durably `n` times with `threads` in parallel: each
/// thread writes it to a new file of its own and fsyncs it (no directory fsync, no database),
/// files/s. The files are removed afterwards.
async fn physical_limit(out: &Path, image: &[u8], n: u64, threads: usize) -> Result<f64, String> {
    let dir = sections::fresh_dir(out, "images-physical")?;
    let image = Arc::new(image.to_vec());
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (dir, image, next) = (dir.clone(), image.clone(), next.clone());
            std::thread::spawn(move || -> std::io::Result<()> {
                use std::io::Write as _;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok(());
                    }
                    let mut f = std::fs::File::create(dir.join(format!("{i}.png")))?;
                    f.write_all(&image)?;
                    f.sync_all()?;
                }
            })
        })
        .collect();
    let joined: std::io::Result<()> = tokio::task::spawn_blocking(move || {
        handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("panicked"))))
    })
    .await
    .map_err(|e| e.to_string())?;
    let secs = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    joined.map_err(|e| format!("physical limit: {e}"))?;
    let per_s = n as f64 / secs;
    super::progress(&format!(
        "images: physical limit, {threads} threads writing and fsyncing the image: {per_s:.0} files/s"
    ));
    Ok(per_s)
}

/// Run the section; `quick` uses 200 large images instead of 1,000.
pub async fn run(out: &Path, quick: bool) -> Result<Images, String> {
    let big = large_image()?;
    let (n_tiny, n_big) = if quick { (1_000, 200) } else { (5_000, 1_000) };
    let mut e2e = Vec::new();
    for concurrent in [false, true] {
        let method = if concurrent { "concurrent" } else { "sequential" };
        let dir = sections::fresh_dir(out, &format!("images-tiny-{method}"))?;
        let (r, _) =
            sections::e2e_in(&dir, n_tiny, 16, Durability::Full, concurrent, Arc::new(InstantProvider::new(false)))
                .await?;
        super::progress(&format!("images: tiny PNG, {method}, 16 workers, full: {:.0} tasks/s", r.tasks_per_s));
        e2e.push(r);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let mut physical_per_s = vec![physical_limit(out, &big, n_big, 16).await?];
    let mut storage_dir = None;
    let mut storage = None;
    for concurrent in [false, true] {
        let method = if concurrent { "concurrent" } else { "sequential" };
        let dir = sections::fresh_dir(out, &format!("images-large-{method}"))?;
        let peak = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (peak, done, wal) = (peak.clone(), done.clone(), dir.join("tally.db-wal"));
            tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    peak.fetch_max(size(&wal), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        let provider = Arc::new(InstantProvider::with_image(big.clone()));
        let result = sections::e2e_in(&dir, n_big, 16, Durability::Full, concurrent, provider).await;
        done.store(true, Ordering::Relaxed);
        let _ = sampler.await;
        let (r, wal_end) = result?;
        super::progress(&format!(
            "images: {:.1} MB PNG, {method}, 16 workers, full: {:.0} tasks/s, WAL peak {:.1} MB",
            mb(big.len() as u64),
            r.tasks_per_s,
            mb(peak.load(Ordering::Relaxed))
        ));
        e2e.push(r);
        if concurrent {
            storage = Some((peak.load(Ordering::Relaxed), wal_end, size(&dir.join("tally.db"))));
            storage_dir = Some(dir);
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    physical_per_s.push(physical_limit(out, &big, n_big, 16).await?);
    let (dir, (wal_peak, wal_end, db)) = match (storage_dir, storage) {
        (Some(d), Some(s)) => (d, s),
        _ => return Err("the large-image run left no database".into()),
    };
    let storage = prune_half(&dir, n_big, wal_peak, wal_end, db).await?;
    super::progress(&format!(
        "images: {} images: db {:.0} MB; pruned {} in {:.1} s, gave back {:.0} MB: db {:.0} MB",
        storage.images, storage.db_mb, storage.pruned, storage.prune_secs, storage.freed_mb, storage.db_after_prune_mb
    ));
    let started = Instant::now();
    let daemon = super::http::Daemon::start_on(out, &dir)?;
    let startup_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss = daemon.rss_mb();
    let mut download =
        download(&daemon.base_url, &daemon.token, Some(daemon.pid()), 8, if quick { 3.0 } else { 10.0 }, idle_rss)
            .await?;
    download.startup_secs = Some(startup_secs);
    super::progress(&format!(
        "images: downloads, 8 clients: {:.0} MB/s; daemon RSS idle {:.1} MB, peak {:.1} MB",
        download.mb_per_s,
        download.idle_rss_mb.unwrap_or(f64::NAN),
        download.peak_rss_mb.unwrap_or(f64::NAN)
    ));
    let backup = backup(out, &dir, &daemon).await?;
    super::progress(&format!(
        "images: backup of {:.0} MB: {:.2} s idle, {:.2} s while 2 clients submitted ({} tasks)",
        backup.db_mb, backup.idle_secs, backup.under_load_secs, backup.submitted_during
    ));
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Images {
        physical_per_s,
        image_bytes: big.len() as u64,
        e2e,
        storage: Some(storage),
        download: Some(download),
        backup: Some(backup),
    })
}

/// Prune the older half of the tasks in `dir` (moved two months back first) and measure the
/// files around it.
async fn prune_half(dir: &Path, n: u64, wal_peak: u64, wal_end: u64, db: u64) -> Result<Storage, String> {
    let e = |e: crate::store::StoreError| e.to_string();
    let store = Store::open(&dir.join("tally.db"), Durability::Full).map_err(e)?;
    let cutoff: i64 = store
        .read(move |c| {
            Ok(c.query_row(
                "SELECT updated_at FROM tasks ORDER BY updated_at LIMIT 1 OFFSET ?1",
                [n as i64 / 2],
                |r| r.get(0),
            )?)
        })
        .await
        .map_err(e)?;
    // Retention keeps every request of the cutoff's calendar month (it counts toward the
    // month's spend and budgets), and these were all just made: move the older half 62 days
    // back, so the prune measures images going, not that rule.
    const SHIFT: i64 = 62 * 86_400_000;
    store
        .write(move |c| {
            c.execute(
                "UPDATE executions SET started_at = started_at - ?2, heartbeat_at = heartbeat_at - ?2,
                    calling_at = calling_at - ?2, finished_at = finished_at - ?2
                 WHERE task_id IN (SELECT id FROM tasks WHERE updated_at < ?1)",
                [cutoff, SHIFT],
            )?;
            c.execute(
                "UPDATE tasks SET created_at = created_at - ?2, updated_at = updated_at - ?2 WHERE updated_at < ?1",
                [cutoff, SHIFT],
            )?;
            Ok(())
        })
        .await
        .map_err(e)?;
    let t0 = Instant::now();
    let report = store.prune(cutoff, false).await.map_err(e)?;
    let prune_secs = t0.elapsed().as_secs_f64();
    let wal_after = size(&dir.join("tally.db-wal"));
    store.close().map_err(e)?;
    Ok(Storage {
        images: n,
        wal_peak_mb: mb(wal_peak),
        wal_end_mb: mb(wal_end),
        db_mb: mb(db),
        pruned: report.tasks,
        prune_secs,
        freed_mb: mb(report.freed_bytes.max(0) as u64),
        wal_after_prune_mb: mb(wal_after),
        db_after_prune_mb: mb(size(&dir.join("tally.db"))),
    })
}

fn client(conns: usize) -> Result<reqwest::Client, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .pool_max_idle_per_host(conns)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| format!("http client: {e}"))
}

/// `clients` concurrent clients download the daemon's artifacts (round-robin over what
/// `GET /v1/tasks` lists) for `secs` seconds; each answer must be as long as it says.
pub async fn download(
    base: &str,
    token: &str,
    pid: Option<u32>,
    clients: usize,
    secs: f64,
    idle_rss_mb: Option<f64>,
) -> Result<Download, String> {
    let http = client(clients)?;
    let base = base.trim_end_matches('/').to_string();
    let list: serde_json::Value = http
        .get(format!("{base}/v1/tasks?limit=500&status=succeeded"))
        .bearer_auth(token)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| format!("listing tasks: {e}"))?
        .json()
        .await
        .map_err(|e| format!("listing tasks: {e}"))?;
    let urls: Vec<String> = list["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["artifacts"][0]["url"].as_str().map(|u| format!("{base}{u}")))
        .collect();
    if urls.is_empty() {
        return Err("the daemon lists no artifacts to download".into());
    }
    let urls = Arc::new(urls);
    let (bytes, requests, errors) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut set = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (http, urls, token) = (http.clone(), urls.clone(), token.to_string());
        let (bytes, requests, errors) = (bytes.clone(), requests.clone(), errors.clone());
        set.spawn(async move {
            let mut i = c;
            while Instant::now() < deadline {
                let url = &urls[i % urls.len()];
                i += clients;
                let got = async {
                    let r = http.get(url).bearer_auth(&token).send().await?.error_for_status()?;
                    let want = r.content_length();
                    let body = r.bytes().await?;
                    Ok::<_, reqwest::Error>((want, body.len() as u64))
                }
                .await;
                match got {
                    Ok((Some(want), n)) if want == n => {
                        bytes.fetch_add(n, Ordering::Relaxed);
                        requests.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    let elapsed = start.elapsed().as_secs_f64();
    let (total, n) = (bytes.load(Ordering::Relaxed), requests.load(Ordering::Relaxed));
    Ok(Download {
        clients,
        secs: elapsed,
        requests: n,
        errors: errors.load(Ordering::Relaxed),
        mb_per_s: mb(total) / elapsed,
        image_mb: if n > 0 { mb(total) / n as f64 } else { 0.0 },
        idle_rss_mb,
        peak_rss_mb: pid.and_then(|p| super::sys::peak_rss_mb_of(&format!("/proc/{p}/status"))),
        startup_secs: None,
    })
}

/// Back the daemon's database up idle, then while 2 clients submit tasks to it.
async fn backup(out: &Path, dir: &Path, daemon: &super::http::Daemon) -> Result<Backup, String> {
    let db = dir.join("tally.db");
    let dest = out.join("images-backup.db");
    let t0 = Instant::now();
    crate::store::backup(&db, &dest).map_err(|e| format!("backup: {e}"))?;
    let idle_secs = t0.elapsed().as_secs_f64();
    let db_mb = mb(size(&dest));
    let _ = std::fs::remove_file(&dest);
    let http = client(2)?;
    let stop = Arc::new(AtomicBool::new(false));
    let submitted = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for c in 0..2 {
        let (http, stop, submitted) = (http.clone(), stop.clone(), submitted.clone());
        let (url, token) = (format!("{}/v1/tasks", daemon.base_url), daemon.token.clone());
        set.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let body = serde_json::json!({ "prompt": format!("during the backup {c}-{i}") });
                if let Ok(r) = http.post(&url).bearer_auth(&token).json(&body).send().await
                    && r.status().is_success()
                {
                    submitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = submitted.load(Ordering::Relaxed);
    let (db2, dest2) = (db.clone(), dest.clone());
    let t1 = Instant::now();
    let done = tokio::task::spawn_blocking(move || crate::store::backup(&db2, &dest2)).await;
    let under_load_secs = t1.elapsed().as_secs_f64();
    let during = submitted.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    while set.join_next().await.is_some() {}
    let _ = std::fs::remove_file(&dest);
    done.map_err(|e| format!("backup task: {e}"))?.map_err(|e| format!("backup under load: {e}"))?;
    Ok(Backup { db_mb, idle_secs, under_load_secs, submitted_during: during })
}
