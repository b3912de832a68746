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

/// `tally check [DB]`: verify a database, every stored image against its sha256 included.
pub(super) fn check(cfg: &Config, db: Option<&Path>) -> Result<ExitCode, Failure> {
    let db = db.map(Path::to_path_buf).unwrap_or_else(|| cfg.db_path());
    if !db.is_file() {
        return Err(Failure::error(format!("there is no database at {}", db.display())));
    }
    let report = crate::store::check(&db).map_err(|e| Failure::error(format!("cannot check {}: {e}", db.display())))?;
    if report.problems.is_empty() && report.unmoved.is_empty() {
        println!("ok: {} passed every check: {}", db.display(), report.summary());
        return Ok(Exit::Ok.into());
    }
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
    let replacing = db.exists();
    let report = crate::store::restore(src, &db).map_err(|e| Failure::error(format!("restore failed: {e}")))?;
    println!("restored {} as {}: {}", src.display(), db.display(), report.summary());
    if replacing {
        println!("the database it replaced was kept as {}.before-restore", db.display());
    }
    println!("start `tally serve` to use it");
    Ok(Exit::Ok.into())
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
