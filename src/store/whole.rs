//! The whole-file operations that work on a path rather than through the writer: `tally check`
//! (integrity, invariants, every image against its sha256), `tally backup` (one
//! self-contained copy, safe under load) and `tally restore`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::open::{APPLICATION_ID, SCHEMA_VERSION, StoreError, checkpoint_truncate, not_tally};

/// The invariants of tasks, envelopes and executions that `tally check` asks of every backend:
/// (what is wrong, a query listing the ids it is wrong for). The SQL is the same on SQLite and
/// PostgreSQL; each backend adds its own checks of stored images (and SQLite the charge rule
/// that PostgreSQL enforces with a `CHECK` constraint).
pub(crate) const TASK_INVARIANTS: &[(&str, &str)] = &[
    (
        "succeeded task without an artifact",
        "SELECT id FROM tasks t WHERE status = 'succeeded' AND NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.task_id = t.id)",
    ),
    // A running execution's envelope is leased, or waiting to be handed over again
    // (`pending`), or handed over and not yet claimed (`sent` without a lease: recovery
    // resumes it from the execution's phase). Anything else strands the execution.
    (
        "running execution whose envelope is not live",
        "SELECT x.token FROM executions x WHERE x.status = 'running' AND NOT EXISTS
           (SELECT 1 FROM envelopes e WHERE e.task_id = x.task_id AND e.status IN ('pending', 'sent'))",
    ),
    (
        "envelope consumed for a task that is still queued or waiting",
        "SELECT e.id FROM envelopes e JOIN tasks t ON t.id = e.task_id WHERE e.status = 'consumed' AND t.status IN ('queued', 'waiting', 'running')",
    ),
    (
        "settled task whose envelope is still live",
        "SELECT t.id FROM tasks t JOIN envelopes e ON e.task_id = t.id WHERE t.status IN ('succeeded', 'failed', 'unknown', 'canceled') AND e.status IN ('pending', 'sent')",
    ),
    (
        "task without an envelope",
        "SELECT id FROM tasks t WHERE NOT EXISTS (SELECT 1 FROM envelopes e WHERE e.task_id = t.id)",
    ),
    (
        "task with more than one running execution",
        "SELECT task_id FROM executions WHERE status = 'running' GROUP BY task_id HAVING count(*) > 1",
    ),
    (
        "unknown task without an unknown execution",
        "SELECT id FROM tasks t WHERE status = 'unknown' AND NOT EXISTS (SELECT 1 FROM executions x WHERE x.task_id = t.id AND x.status = 'unknown')",
    ),
];

/// What `tally check` found.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Everything that did not hold (empty when healthy).
    pub problems: Vec<String>,
    /// Images of an older data dir still in their files, waiting for the start-up migration
    /// to move them in (`store::migrate`): not damage, but the database does not hold them.
    pub unmoved: Vec<String>,
    /// Generated images verified against their sha256.
    pub artifacts: u64,
    /// Uploaded reference photos verified against their sha256.
    pub uploads: u64,
    pub tasks: u64,
}

impl CheckReport {
    /// One line for a person: what was verified.
    pub fn summary(&self) -> String {
        format!(
            "{} task(s); {} image(s) verified against their sha256 ({} generated, {} uploaded)",
            self.tasks,
            self.artifacts + self.uploads,
            self.artifacts,
            self.uploads
        )
    }
}

/// How deep [`check_with`] looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckDepth {
    /// `tally check` (and every backup): SQLite's `integrity_check`, tally's invariants, and
    /// every stored image hashed against its recorded size and sha256.
    Full,
    /// `tally serve`'s start-up guard: the same `integrity_check` and invariants, and that every
    /// image row has its bytes with the recorded size, sha256 and type — but the bytes are not
    /// hashed here. They are hashed as they are served instead (`blobs::BlobReader`: a damaged
    /// image never reaches a client whole). Measured on a 1.5 GB database of 1,000 images:
    /// `integrity_check` ~2.0 s, hashing every image another ~3.6 s, which start-up saves.
    Startup,
}

/// Verify a database: SQLite's `integrity_check`, tally's own invariants, and every stored
/// image against its recorded size and sha256. All in one read transaction (a consistent
/// view, also while the daemon writes).
pub fn check(db: &Path) -> Result<CheckReport, StoreError> {
    check_with(db, CheckDepth::Full)
}

/// [`check`] at the given depth.
pub fn check_with(db: &Path, depth: CheckDepth) -> Result<CheckReport, StoreError> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(|e| not_tally(db, e))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let app_id: i64 = conn.pragma_query_value(None, "application_id", |r| r.get(0)).map_err(|e| not_tally(db, e))?;
    if app_id != APPLICATION_ID {
        return Err(StoreError::NotTally { path: db.into(), reason: "its application id is not tally's".into() });
    }
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::TooNew { path: db.into(), found: version, supported: SCHEMA_VERSION });
    }
    conn.execute_batch("BEGIN")?;
    let mut report = CheckReport::default();
    // Both depths run SQLite's whole `integrity_check` (every page, the pointer map that
    // prune's incremental vacuum relies on, every index against its table: a broken index
    // would hide due work from the dispatcher). What start-up skips is hashing the images.
    let pragmas = ["PRAGMA integrity_check"];
    for pragma in &pragmas {
        let mut stmt = conn.prepare(pragma)?;
        for row in stmt.query_map([], |r| r.get::<_, String>(0))? {
            let row = row?;
            if row != "ok" {
                report.problems.push(format!("integrity: {row}"));
            }
        }
    }
    if version < SCHEMA_VERSION {
        report.problems.push(format!(
            "schema version {version} is older than this build's ({SCHEMA_VERSION}): its images are files beside it, \
             which this file alone does not hold; `tally serve` on its data directory migrates it"
        ));
        return Ok(report);
    }
    report.tasks = conn.query_row("SELECT count(*) FROM tasks", [], |r| r.get::<_, i64>(0))?.max(0) as u64;
    let sqlite_only: &[(&str, &str)] = &[(
        "execution with a charge but no recorded call",
        "SELECT token FROM executions WHERE charge <> 'none' AND (calling_at IS NULL OR billable = 0)",
    )];
    for (what, sql) in TASK_INVARIANTS.iter().chain(sqlite_only) {
        let mut stmt = conn.prepare(sql)?;
        for id in stmt.query_map([], |r| r.get::<_, String>(0))? {
            report.problems.push(format!("{what}: {}", id?));
        }
    }
    let mut unmoved_ids = std::collections::HashSet::new();
    if super::migrate::in_progress(&conn)? {
        let mut stmt = conn.prepare("SELECT id, path FROM legacy_files WHERE moved = 0 ORDER BY path")?;
        for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
            let (id, path) = row?;
            report.unmoved.push(format!(
                "image {id} is still the file {path} beside the database: start `tally serve` to move it in"
            ));
            unmoved_ids.insert(id);
        }
    }
    let blobs = super::blobs::verify_all(&conn, depth == CheckDepth::Full)?;
    // An image still in its file is reported once, as unmoved, not also as missing.
    report.problems.extend(
        blobs.problems.into_iter().filter(|p| !p.rsplit(": ").next().is_some_and(|id| unmoved_ids.contains(id))),
    );
    report.artifacts = blobs.artifacts;
    report.uploads = blobs.uploads;
    conn.execute_batch("COMMIT")?;
    Ok(report)
}

/// What a backup wrote.
#[derive(Debug, Clone)]
pub struct BackupReport {
    pub bytes: u64,
    pub check: CheckReport,
}

/// Copy the database at `src` (images included) into one self-contained file at `dest`, while
/// the daemon may be writing: `VACUUM INTO` from a read transaction on a connection of its
/// own. It reads one consistent snapshot and never restarts when the daemon commits (SQLite's
/// online backup API starts over on every commit by another connection, so under steady
/// writes it may never finish); the writer is not blocked. The copy goes to a temporary name
/// beside `dest`, is checked ([`check`]: every image against its sha256), fsynced, and only
/// then renamed into place (and the directory fsynced), so `dest` is always either the old
/// file or a complete, checked copy.
pub fn backup(src: &Path, dest: &Path) -> Result<BackupReport, StoreError> {
    let from = Connection::open_with_flags(src, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(|e| not_tally(src, e))?;
    from.busy_timeout(Duration::from_secs(5))?;
    let tmp = partial_name(dest);
    let _ = std::fs::remove_file(&tmp);
    let tmp_text =
        tmp.to_str().ok_or_else(|| StoreError::Invalid(format!("{} is not a UTF-8 path", tmp.display())))?.to_string();
    let copied = (|| -> Result<BackupReport, StoreError> {
        from.execute("VACUUM INTO ?1", [&tmp_text])?;
        {
            // The copy is a self-contained rollback-journal file: no -wal to carry around.
            let to = Connection::open(&tmp)?;
            let mode: String = to.query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))?;
            if mode != "delete" {
                return Err(StoreError::Fatal(format!("the copy kept journal mode {mode}")));
            }
            // Served later, it holds what it would send again (`store::lineage`).
            super::lineage::mark_backup(&to, crate::clock::Clock::now(&crate::clock::SystemClock))?;
        }
        let check = check(&tmp)?;
        if !check.problems.is_empty() {
            return Err(StoreError::Fatal(format!(
                "the copy failed its check ({} problem(s); first: {})",
                check.problems.len(),
                check.problems[0]
            )));
        }
        let file = std::fs::File::open(&tmp).map_err(|e| io_fatal("cannot reopen the copy", e))?;
        file.sync_all().map_err(|e| io_fatal("cannot fsync the copy", e))?;
        let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(BackupReport { bytes, check })
    })();
    let report = match copied {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, dest).map_err(|e| io_fatal("cannot rename the copy into place", e))?;
    sync_dir_of(dest)?;
    Ok(report)
}

/// Put the database file `src` (a backup) in place as `db`, whose daemon is stopped (the
/// caller holds the data directory's lock). `src` is checked first ([`check`]); the copy is
/// made with `VACUUM INTO` (so a `-wal` beside `src` is included, and the result is one
/// file), fsynced under a temporary name; then a database already at `db` is kept as
/// `<db>.before-restore`, the stale `-wal` and `-shm` of `db` are removed (SQLite would
/// otherwise apply an old WAL to the new file), and the copy is renamed into place.
pub fn restore(src: &Path, db: &Path) -> Result<CheckReport, StoreError> {
    let report = check(src)?;
    let problems: Vec<&String> = report.problems.iter().chain(&report.unmoved).collect();
    if let Some(first) = problems.first() {
        return Err(StoreError::Invalid(format!(
            "{} did not pass `tally check` ({} problem(s); first: {first}); nothing was changed",
            src.display(),
            problems.len()
        )));
    }
    let tmp = partial_name(db);
    let _ = std::fs::remove_file(&tmp);
    let tmp_text =
        tmp.to_str().ok_or_else(|| StoreError::Invalid(format!("{} is not a UTF-8 path", tmp.display())))?.to_string();
    let made = (|| -> Result<(), StoreError> {
        let from = Connection::open_with_flags(src, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        from.execute("VACUUM INTO ?1", [&tmp_text])?;
        drop(from);
        let to = Connection::open(&tmp)?;
        let _: String = to.query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))?;
        drop(to);
        std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| io_fatal("cannot fsync the copy", e))
    })();
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if db.exists() {
        // Make the old database self-contained before keeping it.
        let _ = checkpoint_truncate(db);
        let kept = db.with_file_name(format!("{}.before-restore", file_name(db)));
        std::fs::rename(db, &kept).map_err(|e| io_fatal("cannot keep the database being replaced", e))?;
    }
    for suffix in ["-wal", "-shm"] {
        let stale = db.with_file_name(format!("{}{suffix}", file_name(db)));
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_fatal(&format!("cannot remove the stale {}", stale.display()), e)),
        }
    }
    std::fs::rename(&tmp, db).map_err(|e| io_fatal("cannot rename the restored database into place", e))?;
    sync_dir_of(db)?;
    Ok(report)
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| "tally.db".into())
}

/// A temporary name beside `dest` (same directory, so the final rename is atomic).
fn partial_name(dest: &Path) -> PathBuf {
    dest.with_file_name(format!(".{}.partial", file_name(dest)))
}

fn io_fatal(what: &str, e: std::io::Error) -> StoreError {
    StoreError::Fatal(format!("{what}: {e}"))
}

/// Fsync the directory holding `path`, so a rename into it is durable.
fn sync_dir_of(path: &Path) -> Result<(), StoreError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_fatal("cannot fsync the directory", e))
}
