//! Subcommands that work on the database file directly, without the daemon: backup, check,
//! restore, token.

use std::path::Path;

use super::*;
use crate::config::Config;

/// Whether `path` (which need not exist yet) is the data directory or inside it.
fn inside_data_dir(cfg: &Config, path: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let data = canon(&cfg.storage.data_dir);
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(path)).unwrap_or_else(|_| path.to_path_buf())
    };
    // Resolve the deepest part that exists (symlinks included), then add the rest back.
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => break,
        }
    }
    let mut full = canon(existing);
    for name in rest.iter().rev() {
        full.push(name);
    }
    full.starts_with(&data)
}

/// `tally backup DEST`: one self-contained, checked copy of the database (images included),
/// made while the daemon may be running.
pub(super) fn backup(cfg: &Config, dest: &Path) -> Result<ExitCode, Failure> {
    if let crate::config::Backend::Postgres(pg) = &cfg.storage.backend {
        return Err(Failure::error(pg_backup_advice(&pg.url, dest)));
    }
    let src = cfg.db_path();
    if !src.is_file() {
        return Err(Failure::error(format!("there is no database at {}", src.display())));
    }
    let dest = if dest.is_dir() { dest.join("tally.db") } else { dest.to_path_buf() };
    if inside_data_dir(cfg, &dest) {
        return Err(Failure::error(format!(
            "{} is inside the data directory {}; put the backup somewhere else (a file there could replace the \
             live database, its WAL or the API token)",
            dest.display(),
            cfg.storage.data_dir.display()
        )));
    }
    if dest.parent().is_some_and(|p| !p.as_os_str().is_empty() && !p.is_dir()) {
        return Err(Failure::error(format!("the directory for {} does not exist", dest.display())));
    }
    let started = std::time::Instant::now();
    let r = crate::store::backup(&src, &dest).map_err(|e| Failure::error(format!("backup failed: {e}")))?;
    println!(
        "backed up {} to {} ({:.1} MB in {:.1} s): one file holding every task and image; checked: {}",
        src.display(),
        dest.display(),
        r.bytes as f64 / 1e6,
        started.elapsed().as_secs_f64(),
        r.check.summary()
    );
    if !r.check.unmoved.is_empty() {
        println!(
            "warning: {} image(s) are still files from an older version that start-up could not move in, so the \
             copy does not hold them; `tally check` lists them",
            r.check.unmoved.len()
        );
    }
    Ok(Exit::Ok.into())
}

/// What `tally backup` says on PostgreSQL: the database server makes consistent copies
/// itself, so use its tools (the URL is shown without its password).
fn pg_backup_advice(url: &str, dest: &Path) -> String {
    format!(
        "tally backup copies the SQLite file; this configuration keeps its data in PostgreSQL, \
         which makes consistent copies itself while tally runs. Use pg_dump, e.g.\n  \
         pg_dump --format=custom --file={} '{}'\n\
         and restore into an empty database with pg_restore --dbname=URL FILE (stop every tally node first). \
         For point-in-time recovery use PostgreSQL's continuous archiving (pg_basebackup plus WAL archiving).",
        dest.display(),
        crate::config::redact_url(url)
    )
}

/// `tally check [DB]`: verify a database, every stored image against its sha256 included.
pub(super) fn check(cfg: &Config, db: Option<&Path>) -> Result<ExitCode, Failure> {
    if let (crate::config::Backend::Postgres(pg), None) = (&cfg.storage.backend, db) {
        let name = crate::config::redact_url(&pg.url);
        let report = crate::store::postgres::check(&pg.url, None)
            .map_err(|e| Failure::error(format!("cannot check {name}: {e}")))?;
        if report.problems.is_empty() {
            println!("ok: the PostgreSQL database {name} passed every check: {}", report.summary());
            return Ok(Exit::Ok.into());
        }
        for p in &report.problems {
            println!("problem: {p}");
        }
        let n = report.problems.len();
        return Err(Failure { exit: Exit::Problems, message: format!("{n} problem(s) found in {name}") });
    }
    let db = db.map(Path::to_path_buf).unwrap_or_else(|| cfg.db_path());
    if !db.is_file() {
        return Err(Failure::error(format!("there is no database at {}", db.display())));
    }
    let report = crate::store::check(&db).map_err(|e| Failure::error(format!("cannot check {}: {e}", db.display())))?;
    let forecast = held_forecast(cfg, &db);
    if report.problems.is_empty() && report.unmoved.is_empty() {
        println!("ok: {} passed every check: {}", db.display(), report.summary());
        println!("{forecast}");
        return Ok(Exit::Ok.into());
    }
    println!("{forecast}");
    for p in report.problems.iter().chain(&report.unmoved) {
        println!("problem: {p}");
    }
    let n = report.problems.len() + report.unmoved.len();
    Err(Failure { exit: Exit::Problems, message: format!("{n} problem(s) found in {}", db.display()) })
}

/// `tally restore SRC`: make the backup SRC this data directory's database. Refused while a
/// daemon uses the data directory (its lock is held for the whole restore, so none can start
/// meanwhile); SRC must pass `tally check` first.
pub(super) fn restore(cfg: &Config, src: &Path) -> Result<ExitCode, Failure> {
    if let crate::config::Backend::Postgres(pg) = &cfg.storage.backend {
        return Err(Failure::error(format!(
            "tally restore replaces the SQLite file; this configuration keeps its data in PostgreSQL. Stop every \
             tally node, then restore a pg_dump copy into an empty database with\n  pg_restore --dbname='{}' {}",
            crate::config::redact_url(&pg.url),
            src.display()
        )));
    }
    if !src.is_file() {
        return Err(Failure::error(format!("there is no file at {}", src.display())));
    }
    let db = cfg.db_path();
    if app::same_file(src, &db) {
        return Err(Failure::error(format!("{} is already this data directory's database", src.display())));
    }
    let dir = &cfg.storage.data_dir;
    app::create_data_dir(dir)?;
    let _lock = app::lock_data_dir(dir)?;
    // Judged against what this data directory has seen, before the restore replaces anything.
    let forecast = held_forecast(cfg, src);
    let report = crate::store::restore(src, &db).map_err(|e| Failure::error(format!("restore failed: {e}")))?;
    println!("restored {} as {}: {}", src.display(), db.display(), report.check.summary());
    if let Some(kept) = &report.kept {
        println!(
            "the database it replaced was kept as {} (every restore keeps its own; delete them when no longer needed)",
            kept.display()
        );
    }
    println!("{forecast}");
    println!("start `tally serve` to use it");
    Ok(Exit::Ok.into())
}

/// What serving the database file `db` in this data directory would hold (`store::sqlite::lineage`),
/// in one or two lines for `tally check` and `tally restore`.
fn held_forecast(cfg: &Config, db: &Path) -> String {
    let f = match crate::store::sqlite::lineage::forecast(db, &cfg.db_path()) {
        Ok(f) => f,
        Err(e) => return format!("held: cannot tell whether serving it would hold jobs: {e}"),
    };
    let mut out = match &f.older {
        None => format!(
            "held: serving it in {} holds nothing new: it is not older than what this data directory has seen",
            cfg.storage.data_dir.display()
        ),
        Some(o) => format!(
            "held: serving it in {} would hold {} job(s) instead of sending them, because {}. Queued jobs, and jobs \
             claimed but not yet sent, wait for you (`tally held list`, `tally held release`); jobs whose request \
             had left go through the usual recovery (looked up or replayed with the same key where the provider \
             can, else unknown), never sent blind",
            cfg.storage.data_dir.display(),
            f.would_hold,
            o.explain()
        ),
    };
    if f.held > 0 {
        out.push_str(&format!("\nheld: {} job(s) in it are held already", f.held));
    }
    if let Some(p) = f.sidecar_problem {
        out.push_str(&format!("\nwarning: {p}; judged by the database's own marks only"));
    }
    out
}

/// `tally token`: print the API token.
pub(super) fn token(cfg: &Config) -> Result<ExitCode, Failure> {
    let path = cfg.token_path();
    let t = crate::api::auth::read_token(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Failure::error(format!("no API token at {} yet; start `tally serve` once to create it", path.display()))
        } else {
            Failure::error(format!("cannot read the API token {}: {e}", path.display()))
        }
    })?;
    println!("{t}");
    Ok(Exit::Ok.into())
}

/// `tally prune --older-than AGE [--dry-run]`: delete settled work last changed more than AGE
/// ago, with its images (never an `unknown` job nobody has resolved, never a shot of a set
/// still in progress). Through the daemon's API while `tally serve` holds the data directory;
/// on the file directly (holding the lock meanwhile) when it does not. On PostgreSQL the same:
/// through this machine's daemon, else on the shared database as this node (other nodes may
/// run meanwhile: each delete re-checks under its locks, `store::prune`).
pub(super) fn prune(cfg: &Config, older_than: &str, dry_run: bool, json: bool) -> Result<ExitCode, Failure> {
    let age = crate::api::prune::parse_age(older_than)
        .map_err(|e| Failure { exit: Exit::Usage, message: format!("--older-than: {e}") })?;
    let db = cfg.db_path();
    let pg = match &cfg.storage.backend {
        crate::config::Backend::Postgres(pg) => Some(pg),
        crate::config::Backend::Sqlite => None,
    };
    if pg.is_none() && !db.is_file() {
        return Err(Failure::error(format!("there is no database at {}", db.display())));
    }
    let report: Value = match app::try_lock_data_dir(&cfg.storage.data_dir)? {
        None => super::runtime()?.block_on(async {
            let client = crate::cli::client::Client::new(cfg)?;
            let body = serde_json::json!({ "older_than": older_than.trim(), "dry_run": dry_run });
            client.post("/v1/prune", &body).await?.into_ok()
        })?,
        Some(_lock) => {
            let store = match pg {
                Some(pg) => crate::store::Store::Postgres(app::open_postgres(cfg, pg)?),
                None => crate::store::Store::open(&db, cfg.storage.durability)
                    .map_err(|e| Failure::error(format!("cannot open the database {}: {e}", db.display())))?,
            };
            let cutoff = crate::clock::Clock::now(&crate::clock::SystemClock) - age.as_millis() as i64;
            let done = super::runtime()?.block_on(store.prune(cutoff, dry_run));
            let closed = store.close();
            let r = done.map_err(|e| Failure::error(format!("prune failed: {e}")))?;
            closed.map_err(|e| Failure::error(format!("the database did not close cleanly: {e}")))?;
            serde_json::to_value(crate::api::prune::PruneJson::new(older_than.trim(), r))
                .map_err(|e| Failure::error(format!("cannot show the result: {e}")))?
        }
    };
    if json {
        print_json(&report);
        return Ok(Exit::Ok.into());
    }
    let n = |k: &str| report.get(k).and_then(Value::as_i64).unwrap_or(0);
    let verb = if dry_run { "would delete" } else { "deleted" };
    println!(
        "{verb} {} job(s) (with {} whole set(s)), {} image(s) and {} reference photo(s), {:.1} MB, all settled before {}",
        n("tasks"),
        n("sets"),
        n("images"),
        n("uploads"),
        n("image_bytes") as f64 / 1e6,
        report.get("cutoff").and_then(Value::as_str).unwrap_or("?")
    );
    let kept = [
        (n("kept_unknown"), "unknown job(s) nobody has resolved"),
        (n("kept_in_sets"), "shot(s) of sets not finished or not old enough"),
        (n("kept_retried"), "job(s) a kept job is a retry of"),
    ];
    for (k, what) in kept {
        if k > 0 {
            println!("kept {k} {what}");
        }
    }
    if !dry_run {
        println!("the database gave back {:.1} MB", n("freed_bytes") as f64 / 1e6);
    }
    Ok(Exit::Ok.into())
}
