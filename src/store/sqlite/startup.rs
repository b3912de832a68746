//! The guards `tally serve` passes before it serves a database: it never starts a new, empty
//! shop over a data directory that was used before (a lost or truncated `tally.db` would
//! otherwise be re-created silently, every task forgotten and the start-up sweep deleting the
//! images), and it never serves a file that `tally check` rejects. Each refusal says what to
//! do: restore the database from a backup.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use super::SqliteStore;
use super::whole::{CheckDepth, check_with};
use crate::config::Durability;
use crate::store::StoreError;

/// What shows that a data directory was used before: the files to look for besides the
/// database. A first start creates none of them before the database exists.
#[derive(Debug, Clone)]
pub struct UsedEvidence {
    /// The API token file (created on the first start, after the database).
    pub token: PathBuf,
    /// Directories that hold the shop's files (images, uploads); any file in them counts.
    pub dirs: Vec<PathBuf>,
}

impl UsedEvidence {
    /// What of it exists, in words (empty: the directory looks unused).
    fn found(&self) -> Vec<String> {
        let mut found = Vec::new();
        if self.token.exists() {
            found.push(format!("the API token {}", self.token.display()));
        }
        for dir in &self.dirs {
            let n = std::fs::read_dir(dir).map(|d| d.filter_map(Result::ok).count()).unwrap_or(0);
            if n > 0 {
                found.push(format!("{n} files in {}", dir.display()));
            }
        }
        found
    }
}

/// Why the database at `db` holds no shop, or `None` if it does (or is not SQLite at all,
/// which opening reports on its own).
fn emptiness(db: &Path) -> Result<Option<String>, StoreError> {
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    match len(db) {
        None => return Ok(Some("is missing".into())),
        Some(0) if len(&wal).unwrap_or(0) == 0 => return Ok(Some("is empty (0 bytes)".into())),
        _ => {}
    }
    // Never create: only look. A read-write open (without CREATE) also reads a WAL that
    // holds what the main file does not have yet.
    let conn = match Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_WRITE) {
        Ok(c) => c,
        Err(_) => return Ok(None),
    };
    match conn.query_row("SELECT count(*) FROM sqlite_schema WHERE type = 'table'", [], |r| r.get::<_, i64>(0)) {
        Ok(0) => Ok(Some("holds no tables".into())),
        _ => Ok(None),
    }
}

/// Open the database for `tally serve`: refuse one that holds no shop where `evidence` shows
/// the data directory was used, refuse one that cannot be written, and refuse one that fails
/// `tally check` at [`CheckDepth::Serve`] (the file's length, SQLite's integrity check of every
/// table but the images', tally's invariants: a cost that does not grow with the images
/// stored), each with what to do. The rest — the images' pages and rows — is checked in the
/// background once serving ([`CheckDepth::Background`], started by `app::serve`), and each
/// image's bytes are hashed as they are served. Images an interrupted migration has not moved in yet are not a
/// reason to refuse: start-up has said which files they are.
pub fn open_for_serve(db: &Path, durability: Durability, evidence: &UsedEvidence) -> Result<SqliteStore, StoreError> {
    let restore = format!(
        "Restore it from a backup (a copy made by `tally backup`): stop tally, copy the backup to {}, delete any {}-wal \
         and {}-shm beside it, and start again",
        db.display(),
        db.display(),
        db.display()
    );
    if let Some(what) = emptiness(db)? {
        let found = evidence.found();
        if !found.is_empty() {
            return Err(StoreError::Unusable {
                path: db.into(),
                reason: format!(
                    "the database {what}, but this data directory was used before ({}). Starting would open a new, empty \
                     shop and forget every task, so tally refuses. {restore}. To really start over, move the data \
                     directory aside first.",
                    found.join(", ")
                ),
            });
        }
    }
    // Before SQLite reads it: a file shorter than its header says is a copy cut short.
    if let Some(why) = super::copy::cut_short(db) {
        return Err(StoreError::Unusable { path: db.into(), reason: format!("{why}. {restore}.") });
    }
    let store = SqliteStore::open(db, durability).map_err(|e| match e.code() {
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
            StoreError::Unusable { path: db.into(), reason: format!("the database is damaged ({e}). {restore}.") }
        }
        _ => e,
    })?;
    let problems = match check_with(db, CheckDepth::Serve) {
        Ok(report) => report.problems,
        Err(e) => vec![e.to_string()],
    };
    if !problems.is_empty() {
        let _ = store.close();
        let shown: Vec<&str> = problems.iter().take(5).map(String::as_str).collect();
        let more = problems.len().saturating_sub(shown.len());
        let more = if more > 0 { format!(" (and {more} more; `tally check` lists them all)") } else { String::new() };
        return Err(StoreError::Unusable {
            path: db.into(),
            reason: format!(
                "the database fails its check, so tally will not serve it: {}{more}. {restore}.",
                shown.join("; ")
            ),
        });
    }
    Ok(store)
}
