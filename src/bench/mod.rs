//! `tally bench`: measures the real engine end to end against an instant in-process provider
//! and prints a table (and, with `--json`, one JSON object on stdout).
//!
//! Sections: end-to-end throughput (two methods), pickup latency on an idle engine, idle
//! cost, latency with a large finished history, restart recovery, HTTP submit throughput
//! (when a server is given), idle RSS, and images in the database (`images`: large images end
//! to end, WAL and database size, prune, downloads, backup). With `--backend postgres`, the
//! PostgreSQL backend beside SQLite instead (`pg.rs`). See BENCHMARKS.md for results and
//! method.

pub mod fairness;
pub mod http;
pub mod images;
pub mod listing;
pub mod pg;
pub mod populate;
pub mod profile;
pub mod provider;
mod render;
pub mod rendering;
pub mod scale_file;
mod sections;
pub mod set_wall;
pub mod sys;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::config::Durability;
use render::render_table;

/// Command-line arguments of `tally bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Smaller counts and windows: every section in about a minute.
    #[arg(long)]
    pub quick: bool,
    /// Print the results as one JSON object on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Where to put the temporary databases (default: a fresh directory under the system
    /// temporary directory, removed afterwards).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Base URL of a running tally daemon, to measure HTTP submit throughput against it.
    #[arg(long, value_name = "URL")]
    pub http: Option<String>,
    /// API token for `--http`.
    #[arg(long, env = "TALLY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Provider name to submit to over `--http`.
    #[arg(long, default_value = "demo")]
    pub http_provider: String,
    /// The process id of the `--http` daemon, to report its RSS (with `--only images`, which
    /// then measures only downloads from that daemon).
    #[arg(long, value_name = "PID")]
    pub http_pid: Option<u32>,
    /// Run only these sections (comma-separated); the others are reported as null.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Section>,
    /// `postgres`: measure the PostgreSQL backend (e2e with 1 and 2 nodes, pickup on one node
    /// and across nodes, two idle nodes) beside SQLite in the same run, instead of the
    /// sections above. Needs --postgres-url.
    #[arg(long, value_enum, default_value = "sqlite")]
    pub backend: BenchBackend,
    /// The PostgreSQL database for `--backend postgres` (each run makes and drops its own
    /// schema there; the user needs CREATE on the database).
    #[arg(long, value_name = "URL", env = "TALLY_BENCH_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// Time each stage of a task's path (store calls, the hand-off to the store's thread, SQL,
    /// commits, lock statements, the image check and blob) in every end-to-end and pickup run,
    /// and print the profile per task (`profile` in the JSON). Off, the stages cost one atomic
    /// load each.
    #[arg(long)]
    pub profile: bool,
    /// `--fast-pickup false`: run the SQLite sections' engines with `[engine] fast_pickup =
    /// false` (every task on the dispatcher's path), for an A/B of the one-commit pickup with
    /// one binary.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub fast_pickup: bool,
    /// The scale section's file: build a database of this many GB (images in sets, through
    /// the engine) and measure start-up, backup, restore, check, memory, rendering and a
    /// set's wall time on it. Default 3 (1 with --quick).
    #[arg(long, value_name = "GB")]
    pub size_gb: Option<f64>,
    /// Timed rounds of each paired figure in the scale section's file part (median reported).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub rounds: usize,
}

/// `--fast-pickup` of this run (read by the engines the SQLite sections start).
static FAST_PICKUP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether this run's engines take the one-commit pickup (`--fast-pickup`).
fn fast_pickup() -> bool {
    FAST_PICKUP.load(std::sync::atomic::Ordering::Relaxed)
}

/// The store `tally bench` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[allow(missing_docs)]
pub enum BenchBackend {
    Sqlite,
    Postgres,
}

/// A benchmark section, for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[allow(missing_docs)]
pub enum Section {
    Idle,
    E2e,
    Pickup,
    Scale,
    Recovery,
    Http,
    Images,
    Fairness,
    Listing,
}

/// The machine the numbers come from.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Machine {
    pub nproc: usize,
    pub cpu: String,
    pub kernel: String,
    /// Device and filesystem type holding the benchmark databases.
    pub fs: String,
}

/// One end-to-end throughput run.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct E2e {
    pub workers: usize,
    /// `full` or `normal` (SQLite `synchronous`).
    pub durability: String,
    pub tasks: u64,
    /// Tasks per second, submit → `succeeded`.
    pub tasks_per_s: f64,
    /// `sequential`: awaited one-at-a-time enqueue, then drain (the peers' method,
    /// e2e = N / (enqueue + drain)). `concurrent`: 16 submitters while the workers drain.
    pub method: String,
    pub secs: f64,
    pub enqueue_per_s: f64,
    /// Drain rate (sequential method only).
    pub drain_per_s: Option<f64>,
    /// Write transactions committed per task (group commit shows as < 1 per write).
    pub commits_per_task: f64,
    pub statements_per_task: f64,
    /// Provider calls per task (must be 1).
    pub calls_per_task: f64,
    /// The task's own path, per task: SQL statements, commits, and the fsynced commits a task
    /// waits for after its submit is answered (`calling`, the finish; a submit's own fsync is
    /// the client's wait, `submit_fsync_waits`). `fsyncs` is the commits actually fsynced per
    /// task (group commit shares one among many operations).
    pub per_task: PerTask,
    /// With `--profile`: where a task's time went, per stage (`null` otherwise).
    pub profile: Option<profile::Profile>,
}

/// Per-task costs of an e2e run.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct PerTask {
    pub statements: f64,
    pub commits: f64,
    pub fsync_waits: f64,
    pub submit_fsync_waits: f64,
    pub fsyncs: f64,
}

/// Pickup latency: submit call start → provider call start, on an idle engine.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Pickup {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub samples: usize,
    /// Duration of the submit call itself.
    pub submit_ms_p50: f64,
    pub submit_ms_p99: f64,
    /// Diagnostics on the same idle engine: an empty write operation (writer round trip, no
    /// fsync) and a one-row UPDATE (one fsynced commit), p50.
    pub store_noop_write_ms_p50: f64,
    pub store_one_row_commit_ms_p50: f64,
    /// With `--profile`: where a pickup's time went, per stage and per task (`null` otherwise).
    pub profile: Option<profile::Profile>,
}

/// Idle cost of an engine that ran one task and then had nothing to do.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Idle {
    pub secs: f64,
    /// Process CPU time in the window (user + system).
    pub cpu_ms: f64,
    /// Context switches in the window minus the baseline window (runtime only, no engine).
    pub wakeups: f64,
    /// SQL statements executed by the store in the window.
    pub sql_statements: u64,
    pub raw_wakeups: f64,
    pub baseline_wakeups: f64,
    pub baseline_cpu_ms: f64,
    /// Threads whose context switches changed in the window ("name(tid)=+n" or "exited").
    pub threads: Vec<String>,
    /// The same measures over a second window of the same length right after the first.
    pub second_window_cpu_ms: f64,
    pub second_window_wakeups: f64,
    pub second_window_sql_statements: u64,
}

/// Latency with a large finished history against an empty database.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Scale {
    pub finished_rows: u64,
    pub submit_ms_p50: f64,
    pub pickup_ms_p50: f64,
    pub empty_submit_ms_p50: f64,
    pub empty_pickup_ms_p50: f64,
    pub pickup_ms_p99: f64,
    pub samples: usize,
    pub populate_secs: f64,
    /// Rows written by the populate step, all tables.
    pub rows_written: u64,
    pub db_mb: f64,
    /// `Engine::start` (start-up reconcile) on the populated database.
    pub engine_start_ms: f64,
    /// EXPLAIN QUERY PLAN of the hot queries on the populated database.
    pub plans: Vec<String>,
    /// The file part (issue #41): the size of the file built (bytes).
    pub db_bytes: u64,
    /// `tally serve` until `/healthz` answers, cold cache (median, seconds).
    pub startup_s: f64,
    /// `tally backup` ÷ copy + fsync of the same file (median of the per-round ratios).
    pub backup_ratio: f64,
    /// `tally restore` ÷ copy + fsync of the backup.
    pub restore_ratio: f64,
    /// `tally check` ÷ `openssl sha256` of the file.
    pub check_ratio: f64,
    /// A profile's render ÷ a plain decode, resize, pad and encode of the same images (the
    /// worst profile).
    pub render_ratio: f64,
    /// The daemon's RSS after paging through the whole history and opening 50 sets (MB).
    pub rss_mb: f64,
    /// A set's wall time ÷ the ideal for its provider's concurrency.
    pub set_wall_ratio: f64,
    /// Every figure of the file part, per round.
    pub file: scale_file::FileScale,
    /// The set's wall time, per round (`set_wall_ratio`'s detail).
    pub set_wall: Option<set_wall::SetWall>,
    /// Rendering per profile (`render_ratio`'s detail).
    pub render: Option<rendering::RenderBench>,
}

/// Restart recovery of in-flight tasks left in phase `calling`.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Recovery {
    pub in_flight: u64,
    pub recovery_ms: f64,
    pub requeued: u64,
    /// Time to get every task into phase `calling` before the kill.
    pub setup_secs: f64,
    /// Statements executed by the restarted store (the start-up reconcile).
    pub statements: u64,
}

/// Everything `tally bench` measured.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct Results {
    pub version: String,
    pub quick: bool,
    pub machine: Machine,
    pub e2e: Vec<E2e>,
    pub pickup_ms: Option<Pickup>,
    /// The same pickup section with `durability = "normal"` (no fsync per commit).
    pub pickup_normal_ms: Option<Pickup>,
    pub idle: Option<Idle>,
    pub scale: Option<Scale>,
    pub recovery_ms: Option<f64>,
    pub recovery: Option<Recovery>,
    /// `null` until the HTTP API is wired into the benchmark (or `--http` is given).
    pub http_submit_per_s: Option<f64>,
    pub http: Option<http::HttpResult>,
    /// VmRSS after the idle section (which runs first, in a fresh process).
    pub idle_rss_mb: Option<f64>,
    /// Images in the database (section 7, `--only images`): large images end to end, WAL and
    /// database size, prune, downloads, backup.
    pub images: Option<images::Images>,
    /// Fresh tasks against a recovered backlog (issue #18), with the FIFO baseline.
    pub fairness: Option<fairness::Fairness>,
    /// Listing images from 4096 px sources against a plain resize (issue #37, `--only listing`).
    pub listing: Option<rendering::RenderBench>,
    /// `--backend postgres`: the PostgreSQL backend beside SQLite (`null` otherwise).
    pub postgres: Option<pg::PgBench>,
    pub total_secs: f64,
}

/// Counts and windows of one run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    e2e_tasks: u64,
    pickup_samples: usize,
    idle_secs: f64,
    scale_rows: u64,
    recovery_tasks: u64,
    http_secs: f64,
    fairness_backlog: usize,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Sizes {
                e2e_tasks: 2_000,
                pickup_samples: 100,
                idle_secs: 5.0,
                scale_rows: 100_000,
                recovery_tasks: 1_000,
                http_secs: 2.0,
                fairness_backlog: 2_000,
            }
        } else {
            Sizes {
                e2e_tasks: 20_000,
                pickup_samples: 500,
                idle_secs: 30.0,
                scale_rows: 1_000_000,
                recovery_tasks: 10_000,
                http_secs: 5.0,
                fairness_backlog: 10_000,
            }
        }
    }
}

/// Run the benchmark (builds its own multi-thread tokio runtime).
pub fn run(args: BenchArgs) -> Result<(), String> {
    crate::stages::enable(args.profile);
    FAST_PICKUP.store(args.fast_pickup, std::sync::atomic::Ordering::Relaxed);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let (out, remove) = match &args.out {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("tally-bench-{}", uuid::Uuid::new_v4().simple())), true),
    };
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let result = rt.block_on(run_all(&args, &out));
    if remove {
        let _ = std::fs::remove_dir_all(&out);
    }
    let results = result?;
    let table = render_table(&results);
    if args.json {
        eprint!("{table}");
        let json = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
        println!("{json}");
    } else {
        print!("{table}");
    }
    Ok(())
}

fn progress(msg: &str) {
    eprintln!("[bench] {msg}");
    let _ = std::io::stderr().flush();
}

async fn run_all(args: &BenchArgs, out: &Path) -> Result<Results, String> {
    let sizes = Sizes::new(args.quick);
    let t0 = Instant::now();
    let machine = sys::machine(out);

    let on = |x: Section| args.only.is_empty() || args.only.contains(&x);

    // Against another daemon (`--http`), the images section measures only its downloads.
    if let (Some(url), Some(token), true) = (&args.http, &args.token, args.only.contains(&Section::Images)) {
        progress(&format!("images: downloads from {url}"));
        let rss = args.http_pid.and_then(|p| sys::rss_mb_of(&format!("/proc/{p}/status")));
        let d = images::download(url, token, args.http_pid, 8, if args.quick { 3.0 } else { 10.0 }, rss).await?;
        progress(&format!("images: {:.0} MB/s, peak RSS {:?} MB", d.mb_per_s, d.peak_rss_mb));
        return Ok(Results {
            version: env!("CARGO_PKG_VERSION").into(),
            quick: args.quick,
            machine,
            e2e: Vec::new(),
            pickup_ms: None,
            pickup_normal_ms: None,
            idle: None,
            scale: None,
            recovery_ms: None,
            recovery: None,
            http_submit_per_s: None,
            http: None,
            idle_rss_mb: None,
            images: Some(images::Images {
                image_bytes: 0,
                e2e: Vec::new(),
                physical_per_s: Vec::new(),
                storage: None,
                download: Some(d),
                backup: None,
            }),
            fairness: None,
            listing: None,
            postgres: None,
            total_secs: t0.elapsed().as_secs_f64(),
        });
    }

    if args.backend == BenchBackend::Postgres {
        let url = args.postgres_url.as_deref().ok_or("--backend postgres needs --postgres-url URL")?;
        let pg = pg::run(url, out, args.quick).await?;
        return Ok(Results {
            version: env!("CARGO_PKG_VERSION").into(),
            quick: args.quick,
            machine,
            e2e: Vec::new(),
            pickup_ms: None,
            pickup_normal_ms: None,
            idle: None,
            scale: None,
            recovery_ms: None,
            recovery: None,
            http_submit_per_s: None,
            http: None,
            idle_rss_mb: None,
            images: None,
            fairness: None,
            listing: None,
            postgres: Some(pg),
            total_secs: t0.elapsed().as_secs_f64(),
        });
    }

    // Idle first: a fresh process, so its RSS reflects an idle engine, not the history of the
    // other sections (freed memory is not always returned to the OS).
    let (mut idle, mut idle_rss_mb) = (None, None);
    if on(Section::Idle) {
        progress(&format!("idle: baseline {0} s, then an idle engine 2 × {0} s", sizes.idle_secs));
        idle = Some(sections::idle(out, sizes.idle_secs).await?);
        idle_rss_mb = sys::rss_mb();
    }

    let mut e2e = Vec::new();
    if on(Section::E2e) {
        for durability in [Durability::Full, Durability::Normal] {
            for concurrent in [false, true] {
                for workers in [1, 4, 16] {
                    let r = sections::e2e(out, sizes.e2e_tasks, workers, durability, concurrent).await?;
                    progress(&format!(
                        "e2e {} workers={} durability={}: {:.0} tasks/s",
                        r.method, r.workers, r.durability, r.tasks_per_s
                    ));
                    e2e.push(r);
                }
            }
        }
    }

    let mut pickup = None;
    if on(Section::Pickup) || on(Section::Scale) {
        progress(&format!("pickup latency: {} tasks", sizes.pickup_samples));
        pickup = Some(sections::pickup(out, sizes.pickup_samples, Durability::Full).await?);
    }
    let mut pickup_normal = None;
    if on(Section::Pickup) {
        progress(&format!("pickup latency, durability normal: {} tasks", sizes.pickup_samples));
        pickup_normal = Some(sections::pickup(out, sizes.pickup_samples, Durability::Normal).await?);
    }

    let mut scale = None;
    if let (true, Some(p)) = (on(Section::Scale), &pickup) {
        progress(&format!("scale: {} finished tasks", sizes.scale_rows));
        let mut rows = sections::scale(out, sizes.scale_rows, sizes.pickup_samples, p).await?;
        let gb = args.size_gb.unwrap_or(if args.quick { 1.0 } else { 3.0 });
        let (file, _pool) = scale_file::run(out, gb, args.rounds.max(1)).await?;
        rows.db_bytes = file.db_bytes;
        rows.startup_s = file.startup_s;
        rows.backup_ratio = file.backup.ratio;
        rows.restore_ratio = file.restore.ratio;
        rows.check_ratio = file.check.ratio;
        rows.rss_mb = file.rss_mb;
        rows.file = file;
        progress("scale: a set's wall time (3 shots × 4 candidates, 4 slots)");
        let rounds = args.rounds.max(1);
        let wall = set_wall::set_wall(out, rounds).await?;
        rows.set_wall_ratio = wall.ratio;
        rows.set_wall = Some(wall);
        progress("scale: rendering amazon and taobao against a plain pipeline (8 photo-like PNGs of 1536 px)");
        let sources = rendering::sample_images(8, 1536);
        let render =
            tokio::task::spawn_blocking(move || rendering::render_ratio(&sources, &["amazon", "taobao"], rounds))
                .await
                .map_err(|e| e.to_string())??;
        rows.render_ratio = render.ratio;
        rows.render = Some(render);
        scale = Some(rows);
    }

    let mut recovery = None;
    if on(Section::Recovery) {
        progress(&format!("recovery: {} in-flight tasks", sizes.recovery_tasks));
        recovery = Some(sections::recovery(out, sizes.recovery_tasks).await?);
    }

    let mut fair = None;
    if on(Section::Fairness) {
        progress(&format!(
            "fairness: {} recovered tasks, {} slots, S = {} ms, fresh at {:.0}/s; fair, then FIFO",
            sizes.fairness_backlog,
            fairness::SLOTS,
            fairness::SERVICE_MS,
            2000.0 / fairness::SERVICE_MS as f64
        ));
        fair = Some(fairness::fairness(out, sizes.fairness_backlog).await?);
    }

    // HTTP: against `--http` if given, else against a real `tally serve` started here. The
    // daemon's own RSS, measured idle before the load, is the idle RSS reported.
    let http = match (&args.http, &args.token) {
        (Some(url), Some(token)) if on(Section::Http) => {
            progress(&format!("http: {url} for {} s", sizes.http_secs));
            Some(http::submit_throughput(url, token, &args.http_provider, 32, sizes.http_secs).await?)
        }
        (Some(_), None) => return Err("--http needs --token (or TALLY_TOKEN)".into()),
        (None, _) if on(Section::Http) => {
            let daemon = http::Daemon::start(out, "bench")?;
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            if let Some(rss) = daemon.rss_mb() {
                progress(&format!("tally serve idle RSS: {rss:.1} MB"));
                idle_rss_mb = Some(rss);
            }
            progress(&format!("http: tally serve at {} for {} s", daemon.base_url, sizes.http_secs));
            Some(http::submit_throughput(&daemon.base_url, &daemon.token, "bench", 32, sizes.http_secs).await?)
        }
        _ => None,
    };

    let mut listing = None;
    if on(Section::Listing) {
        progress("listing: a 4096 px cutout on white for amazon_main, words on a 4096 px photo for taobao_main");
        let rounds = args.rounds.max(3);
        listing = Some(
            tokio::task::spawn_blocking(move || listing::listing_ratio(rounds)).await.map_err(|e| e.to_string())??,
        );
    }

    let mut images = None;
    if on(Section::Images) {
        progress("images: large images end to end, storage, prune, downloads, backup");
        images = Some(images::run(out, args.quick).await?);
    }

    Ok(Results {
        version: env!("CARGO_PKG_VERSION").into(),
        quick: args.quick,
        machine,
        e2e,
        pickup_ms: pickup,
        pickup_normal_ms: pickup_normal,
        idle,
        recovery_ms: recovery.as_ref().map(|r| r.recovery_ms),
        recovery,
        scale,
        http_submit_per_s: http.as_ref().map(|h| h.submits_per_s),
        http,
        idle_rss_mb,
        images,
        fairness: fair,
        listing,
        postgres: None,
        total_secs: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests;
