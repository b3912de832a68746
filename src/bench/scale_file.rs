//! `tally bench --only scale --size-gb N` (issue #41): a shop's year in one file. Builds a
//! database of the requested size through tally itself (the engine, with a provider that
//! answers photo-sized PNGs: image sets of 3 shots × 4 candidates, each with its reference
//! photo), then measures what an owner feels as the file grows, each beside its physical
//! reference in the same run, with a cold page cache before every timed step:
//!
//! | figure | tally | reference |
//! |---|---|---|
//! | start-up | `tally serve` until `/healthz` answers | reading the whole file (`cat`), reported only |
//! | backup | `tally backup`'s copy (`store::sqlite::whole::backup`) | copy + fsync of the file |
//! | restore | `whole::restore` of that backup | copy + fsync of the backup |
//! | check | `whole::check` (every page, every image hashed) | `openssl sha256` of the file |
//! | memory | the daemon's RSS after paging the whole history and opening 50 sets | — |
//!
//! Each ratio is the median of the per-round ratios (tally and its reference alternate in
//! every round, so a change of the machine's pace touches both).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::provider::InstantProvider;
use super::sections::{PROVIDER, fresh_dir};
use super::sys::pct;
use crate::clock::SystemClock;
use crate::config::{Durability, EngineConfig};
use crate::engine::{Engine, EngineParts, ProviderEntry};
use crate::metrics::Metrics;
use crate::store::{NewSet, NewShot, Store};

/// Shots per generated set, and candidates per shot.
const SHOTS: u32 = 3;
const CANDIDATES: u32 = 4;
/// Distinct images the populate provider answers in turn (photo-like PNGs of about 1.5 MB).
const POOL: usize = 8;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// One figure measured beside its reference, per round.
#[derive(Debug, Clone, Default, Serialize)]
#[allow(missing_docs)]
pub struct Paired {
    /// What the reference is (e.g. `cp + fsync`, `openssl sha256`).
    pub reference: String,
    pub tally_s: Vec<f64>,
    pub reference_s: Vec<f64>,
    /// The median of `tally_s[i] / reference_s[i]`.
    pub ratio: f64,
    /// tally's own steps per round, in seconds (the profile: where the time went).
    pub phases: Vec<Vec<(&'static str, f64)>>,
    /// Backup only, first round: the copy step it used before issue #41 (`VACUUM INTO` and an
    /// fsync), for the before and after in one sitting.
    pub before_copy_s: Option<f64>,
}

impl Paired {
    fn new(reference: &str) -> Self {
        Paired { reference: reference.into(), ..Default::default() }
    }

    fn push(&mut self, tally: f64, reference: f64) {
        self.tally_s.push(tally);
        self.reference_s.push(reference);
        let mut ratios: Vec<f64> = self.tally_s.iter().zip(&self.reference_s).map(|(t, r)| t / r.max(1e-9)).collect();
        ratios.sort_by(f64::total_cmp);
        self.ratio = pct(&ratios, 0.5);
    }
}

/// What the file-size part of the scale section measured.
#[derive(Debug, Clone, Default, Serialize)]
#[allow(missing_docs)]
pub struct FileScale {
    /// The database file's size after populating (bytes, the WAL checkpointed into it).
    pub db_bytes: u64,
    /// Images stored (candidates and reference photos).
    pub images: u64,
    pub sets: u64,
    pub tasks: u64,
    pub populate_s: f64,
    /// How the page cache was emptied before each timed step.
    pub cold_cache: String,
    /// Median of `startup_runs_s`: `tally serve` until `/healthz` answers 200, cold cache.
    pub startup_s: f64,
    pub startup_runs_s: Vec<f64>,
    /// The same on an empty data directory.
    pub startup_empty_s: f64,
    /// Reading the whole file once, cold (the issue's `cat` reference for start-up).
    pub read_file_s: f64,
    /// The start-up guard's database check alone, cold: the whole-file check it ran before
    /// issue #41 (`CheckDepth::Background`, now run after serving starts) and the one it runs
    /// now (`CheckDepth::Serve`).
    pub serve_check_before_s: f64,
    pub serve_check_s: f64,
    pub backup: Paired,
    pub restore: Paired,
    pub check: Paired,
    /// The daemon's RSS right after start-up, and after paging through the whole history and
    /// opening 50 sets (each set's JSON and the thumbnails of its images).
    pub rss_idle_mb: f64,
    pub rss_mb: f64,
    pub history_pages: u64,
    pub sets_opened: u64,
    pub thumbnails: u64,
}

/// Build the file and measure it; `rounds` timed rounds of each paired figure.
pub(super) async fn run(out: &Path, size_gb: f64, rounds: usize) -> Result<(FileScale, Vec<Vec<u8>>), String> {
    // reqwest is built with `rustls-no-provider` (an error only means one is installed).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = fresh_dir(out, "scale-file")?;
    let data = dir.join("data");
    std::fs::create_dir_all(&data).map_err(s)?;
    let db = data.join("tally.db");
    let target = (size_gb * 1e9) as u64;
    super::progress(&format!("scale: populating {} to {:.1} GB through the engine", db.display(), size_gb));
    let t0 = Instant::now();
    let (images, sets, tasks, pool) = populate(&data, target).await?;
    let populate_s = t0.elapsed().as_secs_f64();
    let db_bytes = std::fs::metadata(&db).map(|m| m.len()).map_err(s)?;
    super::progress(&format!("scale: {db_bytes} bytes, {images} images, {sets} sets in {populate_s:.0} s"));

    let cold_cache = cold(&[&db]);
    let t = Instant::now();
    read_whole(&db)?;
    let read_file_s = t.elapsed().as_secs_f64();

    // The start-up guard's check before and after issue #41, cold: what `tally serve` read
    // before serving (the whole file) and what it reads now.
    let timed_check = |depth| -> Result<f64, String> {
        cold(&[&db]);
        let t = Instant::now();
        crate::store::check_with(&db, depth).map_err(s)?;
        Ok(t.elapsed().as_secs_f64())
    };
    let serve_check_before_s = timed_check(crate::store::CheckDepth::Background)?;
    let serve_check_s = timed_check(crate::store::CheckDepth::Serve)?;
    super::progress(&format!(
        "scale: start-up guard's check {serve_check_s:.2} s (the whole-file check it replaced: {serve_check_before_s:.2} s)"
    ));

    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).map_err(s)?;
    let (startup_empty_s, d) = serve(&dir, &empty).await?;
    drop(d);
    let mut startup_runs_s = Vec::new();
    for _ in 0..rounds {
        cold(&[&db]);
        let (secs, d) = serve(&dir, &data).await?;
        startup_runs_s.push(secs);
        drop(d);
    }
    let mut sorted = startup_runs_s.clone();
    sorted.sort_by(f64::total_cmp);
    super::progress(&format!("scale: start-up {startup_runs_s:?} s (empty {startup_empty_s:.2} s)"));

    let (_, daemon) = serve(&dir, &data).await?;
    let rss_idle_mb = daemon.rss_mb().unwrap_or(0.0);
    let (history_pages, sets_opened, thumbnails) = browse(&daemon, 50).await?;
    let rss_mb = daemon.rss_mb().unwrap_or(0.0);
    drop(daemon);
    super::progress(&format!("scale: RSS {rss_idle_mb:.0} MB idle, {rss_mb:.0} MB after browsing"));

    let (backup, restore, check) = whole_file(&dir, &db, rounds)?;
    Ok((
        FileScale {
            db_bytes,
            images,
            sets,
            tasks,
            populate_s,
            cold_cache,
            startup_s: pct(&sorted, 0.5),
            startup_runs_s,
            startup_empty_s,
            read_file_s,
            serve_check_before_s,
            serve_check_s,
            backup,
            restore,
            check,
            rss_idle_mb,
            rss_mb,
            history_pages,
            sets_opened,
            thumbnails,
        },
        pool,
    ))
}

/// Fill `data/tally.db` through the engine until it holds `target` bytes: sets of
/// [`SHOTS`] × [`CANDIDATES`], eight at a time, each with one reference photo, every image a
/// photo-like PNG from a pool of [`POOL`]. Returns (images, sets, tasks, the pool).
async fn populate(data: &Path, target: u64) -> Result<(u64, u64, u64, Vec<Vec<u8>>), String> {
    let pool: Vec<Vec<u8>> = (0..POOL).map(|i| crate::render::photo_like_png(896, 896, 4, 0x5eed + i as u64)).collect();
    let db = data.join("tally.db");
    let store = Store::open(&db, Durability::Normal).map_err(s)?;
    let provider = Arc::new(InstantProvider::with_images(pool.clone()));
    let engine = Engine::start(EngineParts {
        store,
        config: EngineConfig { workers: 4, fast_pickup: super::fast_pickup(), ..Default::default() },
        clock: Arc::new(SystemClock),
        providers: vec![ProviderEntry::new(PROVIDER, provider.clone(), 4)],
        data_dir: data.to_path_buf(),
        metrics: Arc::new(Metrics::new()),
        limits: Vec::new(),
    })
    .await
    .map_err(|e| format!("engine start: {e}"))?;
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    let (mut images, mut sets, mut tasks) = (0u64, 0u64, 0u64);
    let mut rx = engine.subscribe();
    while size(&db) + size(&wal) < target {
        for _ in 0..8 {
            let photo = pool[(sets as usize) % POOL].clone();
            let upload = engine.upload(photo).await.map_err(s)?;
            let shots = (0..SHOTS)
                .map(|k| NewShot {
                    role: if k == 0 { "main".into() } else { "scene".into() },
                    prompt: format!("product {sets} shot {k}: a red sneaker, soft light"),
                    params: serde_json::json!({}),
                    candidates: CANDIDATES,
                    ..NewShot::default()
                })
                .collect();
            let set = NewSet {
                product: format!("bench product {sets}"),
                style: None,
                provider: PROVIDER.into(),
                references: vec![upload.id],
                shots,
                idempotency_key: None,
            };
            let id = match engine.create_set(set).await.map_err(s)? {
                crate::store::SubmitOutcome::Created(id) | crate::store::SubmitOutcome::Existing(id) => id,
                crate::store::SubmitOutcome::Conflict(id) => return Err(format!("set key conflict: {id}")),
            };
            let _ = id;
            sets += 1;
            images += 1 + u64::from(SHOTS * CANDIDATES);
            tasks += u64::from(SHOTS * CANDIDATES);
        }
        super::sections::wait_succeeded(&engine, &mut rx, &provider, tasks, Duration::from_secs(600)).await?;
    }
    engine.shutdown().await;
    let store = engine.store().clone();
    drop(engine);
    store.close().map_err(s)?;
    // The daemon's store (FULL) is what is measured; the file is left checkpointed.
    crate::store::sqlite::open::checkpoint_truncate(&db).map_err(s)?;
    Ok((images, sets, tasks, pool))
}

/// Empty the page cache of `files` (fsynced first, so their pages are clean): the whole
/// cache through `/proc/sys/vm/drop_caches` where this process may write it, and always
/// `posix_fadvise(DONTNEED)` on each file. Returns how.
pub(super) fn cold(files: &[&Path]) -> String {
    let mut how = Vec::new();
    for f in files {
        if let Ok(file) = std::fs::File::open(f) {
            let _ = file.sync_all();
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open descriptor; the call only advises the kernel.
            let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            if rc == 0 && how.is_empty() {
                how.push("posix_fadvise(DONTNEED) on each file");
            }
        }
    }
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    if std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok() {
        how.push("drop_caches");
    }
    how.join(" + ")
}

/// Read `path` once from start to end (the `cat` reference).
fn read_whole(path: &Path) -> Result<u64, String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(s)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(s)?;
        if k == 0 {
            return Ok(n);
        }
        n += k as u64;
    }
}

/// Start `tally serve` on `data` and time it until `/healthz` answers 200.
async fn serve(dir: &Path, data: &Path) -> Result<(f64, super::http::Daemon), String> {
    let rest = format!(
        "[engine]\nworkers = 1\n\n[[providers]]\nname = \"{PROVIDER}\"\nkind = \"demo\"\nmax_concurrency = 4\n\
         delay_ms = 20\n"
    );
    let t = Instant::now();
    let daemon = super::http::Daemon::spawn(dir, data, &rest)?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().map_err(s)?;
    let url = format!("{}/healthz", daemon.base_url);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Ok(r) = client.get(&url).send().await
            && r.status().is_success()
        {
            return Ok((t.elapsed().as_secs_f64(), daemon));
        }
        if Instant::now() > deadline {
            return Err("tally serve did not answer /healthz within 600 s".into());
        }
        // Polling another process's readiness: nothing else tells this one.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Page through the whole history (`GET /v1/tasks`, 500 a page), then open `sets` sets as the
/// page does (the set's JSON and the thumbnail of every image it shows). Returns (pages, sets,
/// thumbnails).
async fn browse(d: &super::http::Daemon, sets: usize) -> Result<(u64, u64, u64), String> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().map_err(s)?;
    let get = |path: String| {
        let req = client.get(format!("{}{path}", d.base_url)).bearer_auth(&d.token);
        async move {
            let r = req.send().await.map_err(s)?;
            if !r.status().is_success() {
                return Err(format!("GET {path}: {}", r.status()));
            }
            r.bytes().await.map_err(s)
        }
    };
    let mut pages = 0u64;
    let mut before: Option<String> = None;
    loop {
        let q = before.as_ref().map(|b| format!("&before={b}")).unwrap_or_default();
        let body: serde_json::Value =
            serde_json::from_slice(&get(format!("/v1/tasks?limit=500{q}")).await?).map_err(s)?;
        pages += 1;
        match body.get("next").and_then(|n| n.as_str()) {
            Some(n) => before = Some(n.to_string()),
            None => break,
        }
    }
    let list: serde_json::Value = serde_json::from_slice(&get(format!("/v1/sets?limit={sets}")).await?).map_err(s)?;
    let ids: Vec<String> = list
        .get("sets")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|s| s.get("id").and_then(|i| i.as_str()).map(String::from)).collect())
        .unwrap_or_default();
    let mut thumbs = 0u64;
    for id in &ids {
        let set: serde_json::Value = serde_json::from_slice(&get(format!("/v1/sets/{id}")).await?).map_err(s)?;
        let mut urls = Vec::new();
        image_urls(&set, &mut urls);
        urls.sort();
        urls.dedup();
        for u in urls {
            get(format!("{u}/thumbnail")).await?;
            thumbs += 1;
        }
    }
    Ok((pages, ids.len() as u64, thumbs))
}

/// Every `url` of an artifact or upload in a JSON value.
fn image_urls(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x.as_str()) {
                    ("url", Some(u)) if u.starts_with("/v1/artifacts/") || u.starts_with("/v1/uploads/") => {
                        out.push(u.to_string())
                    }
                    _ => image_urls(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| image_urls(x, out)),
        _ => {}
    }
}

/// Backup, restore and check, each beside its reference, `rounds` times, cold each time.
fn whole_file(dir: &Path, db: &Path, rounds: usize) -> Result<(Paired, Paired, Paired), String> {
    use crate::store::sqlite::whole;
    let copy = dir.join("reference-copy.db");
    let backup_file = dir.join("backup.db");
    let restored_dir = dir.join("restored");
    std::fs::create_dir_all(&restored_dir).map_err(s)?;
    let restored = restored_dir.join("tally.db");
    let mut backup = Paired::new("copy + fsync of the file");
    let mut restore = Paired::new("copy + fsync of the backup");
    let mut check = Paired::new(if openssl() { "openssl sha256 of the file" } else { "sha256 of the file (sha2)" });
    for round in 0..rounds {
        super::progress(&format!("scale: backup, restore and check, round {} of {rounds}", round + 1));
        let _ = std::fs::remove_file(&backup_file);
        // Read once, untimed: on a virtual machine the host caches the disk, and whichever side
        // read a file first would pay for both. Both sides then start from the same host cache
        // and an empty page cache here.
        read_whole(db)?;
        cold(&[db]);
        let t = Instant::now();
        let report = whole::backup(db, &backup_file).map_err(s)?;
        let tb = t.elapsed().as_secs_f64();
        backup.phases.push(report.phases);
        cold(&[db]);
        let r = copy_sync(db, &copy)?;
        backup.push(tb, r);
        if round == 0 {
            // The copy step `tally backup` used before issue #41, on the same file, once.
            let _ = std::fs::remove_file(&copy);
            cold(&[db]);
            let t = Instant::now();
            let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(s)?;
            c.execute("VACUUM INTO ?1", [copy.to_string_lossy()]).map_err(s)?;
            drop(c);
            std::fs::File::open(&copy).and_then(|f| f.sync_all()).map_err(s)?;
            backup.before_copy_s = Some(t.elapsed().as_secs_f64());
        }
        // At most the database, the backup and one more copy on disk at once (a 15 GB run).
        let _ = std::fs::remove_file(&copy);

        clear_dir(&restored_dir)?;
        read_whole(&backup_file)?;
        cold(&[&backup_file]);
        let t = Instant::now();
        let report = whole::restore(&backup_file, &restored).map_err(s)?;
        let tr = t.elapsed().as_secs_f64();
        restore.phases.push(report.phases);
        clear_dir(&restored_dir)?;
        cold(&[&backup_file]);
        let r = copy_sync(&backup_file, &copy)?;
        restore.push(tr, r);
        let _ = std::fs::remove_file(&copy);

        cold(&[db]);
        let t = Instant::now();
        let report = whole::check(db).map_err(s)?;
        let tc = t.elapsed().as_secs_f64();
        if !report.problems.is_empty() {
            return Err(format!("the populated database failed its check: {}", report.problems[0]));
        }
        cold(&[db]);
        let r = sha256_file(db)?;
        check.push(tc, r);
    }
    let _ = std::fs::remove_file(&copy);
    let _ = std::fs::remove_file(&backup_file);
    clear_dir(&restored_dir)?;
    Ok((backup, restore, check))
}

fn clear_dir(d: &Path) -> Result<(), String> {
    std::fs::remove_dir_all(d).map_err(s)?;
    std::fs::create_dir_all(d).map_err(s)
}

/// `cp` + `sync` of `from` to `to`: seconds.
fn copy_sync(from: &Path, to: &Path) -> Result<f64, String> {
    let _ = std::fs::remove_file(to);
    let t = Instant::now();
    std::fs::copy(from, to).map_err(s)?;
    std::fs::File::open(to).and_then(|f| f.sync_all()).map_err(s)?;
    Ok(t.elapsed().as_secs_f64())
}

fn openssl() -> bool {
    std::process::Command::new("openssl").arg("version").output().is_ok_and(|o| o.status.success())
}

/// `openssl sha256 FILE` (or the same digest in-process where openssl is missing): seconds.
fn sha256_file(path: &Path) -> Result<f64, String> {
    let t = Instant::now();
    if openssl() {
        let o = std::process::Command::new("openssl").arg("sha256").arg(path).output().map_err(s)?;
        if !o.status.success() {
            return Err(format!("openssl sha256 failed: {}", String::from_utf8_lossy(&o.stderr)));
        }
    } else {
        use sha2::Digest;
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(s)?;
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let k = f.read(&mut buf).map_err(s)?;
            if k == 0 {
                break;
            }
            h.update(&buf[..k]);
        }
        let _ = h.finalize();
    }
    Ok(t.elapsed().as_secs_f64())
}
