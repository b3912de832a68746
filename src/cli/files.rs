//! Subcommands that work on the data directory's files directly, without the daemon:
//! backup, check, token.

use std::path::Path;

use super::*;
use crate::config::Config;

/// `tally backup DEST`: a consistent copy of this data directory's database.
pub(super) fn backup(cfg: &Config, dest: &Path) -> Result<ExitCode, Failure> {
    if let crate::config::Backend::Postgres(pg) = &cfg.storage.backend {
        return Err(Failure::error(pg_backup_advice(&pg.url, dest)));
    }
    let src = cfg.db_path();
    if !src.is_file() {
        return Err(Failure::error(format!("there is no database at {}", src.display())));
    }
    let dest = if dest.is_dir() { dest.join("tally.db") } else { dest.to_path_buf() };
    if app::same_file(&src, &dest) {
        return Err(Failure::error("the backup destination is the database itself"));
    }
    crate::store::backup(&src, &dest).map_err(|e| Failure::error(format!("backup failed: {e}")))?;
    println!("backed up {} to {}", src.display(), dest.display());
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

/// `tally check [DB]`: verify a database; artifact files too when they are beside it.
pub(super) fn check(cfg: &Config, db: Option<&Path>) -> Result<ExitCode, Failure> {
    let own = cfg.db_path();
    let db = db.map(Path::to_path_buf).unwrap_or_else(|| own.clone());
    if !db.is_file() {
        return Err(Failure::error(format!("there is no database at {}", db.display())));
    }
    let data_dir = if app::same_file(&db, &own) {
        Some(cfg.storage.data_dir.clone())
    } else {
        db.parent().filter(|p| p.join("artifacts").is_dir()).map(Path::to_path_buf)
    };
    let problems = crate::store::check(&db, data_dir.as_deref())
        .map_err(|e| Failure::error(format!("cannot check {}: {e}", db.display())))?;
    if problems.is_empty() {
        let files = if data_dir.is_some() { " (artifact files verified)" } else { "" };
        println!("ok: {} passed every check{files}", db.display());
        return Ok(Exit::Ok.into());
    }
    for p in &problems {
        println!("problem: {p}");
    }
    Err(Failure { exit: Exit::Problems, message: format!("{} problem(s) found in {}", problems.len(), db.display()) })
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
