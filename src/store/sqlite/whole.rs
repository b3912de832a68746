//! The whole-file operations that work on a path rather than through the writer: `tally check`
//! (integrity, invariants, every image against its sha256), `tally backup` (one
//! self-contained copy, safe under load; one per destination at a time, and no temporary file
//! left on any failure) and `tally restore` (which keeps every database it replaces under a
//! name of its own).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::copy::{Phases, Rest, check_and_sync, copy_snapshot, cut_short};
use super::open::{APPLICATION_ID, SCHEMA_VERSION, checkpoint_truncate, not_tally};
use crate::store::StoreError;
use crate::store::check::{CheckReport, TASK_INVARIANTS};

/// How deep [`check_with`] looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckDepth {
    /// `tally check` (and every backup): SQLite's `integrity_check`, tally's invariants, and
    /// every stored image hashed against its recorded size and sha256.
    Full,
    /// The check `tally serve` runs in the background once it serves (`app::serve`; its
    /// result in `/healthz` and the page, and a failure stops the daemon as any damaged
    /// database does): the whole `integrity_check` and invariants, and that every image row
    /// has its bytes with the recorded size, sha256 and type — but the bytes are not hashed
    /// here. They are hashed as they are served instead (`blobs::BlobReader`: a damaged image
    /// never reaches a client whole).
    Background,
    /// `tally serve`'s guard before it serves anything, whose cost does not grow with the
    /// images stored (issue #41: it read the whole file, 36 s on 19 GB): the file is as long
    /// as its header says (a copy cut short is refused), every table but `blobs` passes
    /// `integrity_check` with its indexes (everything the engine decides from: tasks,
    /// envelopes, executions, events, sets, spend), and tally's invariants hold. The image
    /// table's pages are left to [`CheckDepth::Background`] and to hashing as served.
    Serve,
}

/// The table whose pages hold the images' bytes: what [`CheckDepth::Serve`] leaves out.
const IMAGE_TABLE: &str = "blobs";

/// Verify a database: SQLite's `integrity_check`, tally's own invariants, and every stored
/// image against its recorded size and sha256. All in one read transaction (a consistent
/// view, also while the daemon writes).
pub fn check(db: &Path) -> Result<CheckReport, StoreError> {
    check_with(db, CheckDepth::Full)
}

/// [`check`] at the given depth. At [`CheckDepth::Full`] the images are hashed on a second
/// read-only connection and thread while the first runs SQLite's integrity check and the
/// invariants (issue #41: the two took the sum of their times, 2.1× reading the file; two
/// cores make it the slower of the two). Each connection reads one consistent snapshot; under
/// a running daemon the two snapshots may be a commit apart, and each finding is true of its own.
pub fn check_with(db: &Path, depth: CheckDepth) -> Result<CheckReport, StoreError> {
    if depth != CheckDepth::Full {
        return check_one(db, depth);
    }
    // As many hashing threads as cores (at least one, at most four), beside the integrity check.
    let parts = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4) as i64;
    let (report, hashed) = std::thread::scope(|s| {
        let hashing: Vec<_> = (0..parts)
            .map(|part| {
                std::thread::Builder::new()
                    .name("tally-check-hash".into())
                    .spawn_scoped(s, move || hash_images(db, part, parts))
                    .map_err(|_| part)
            })
            .collect();
        let report = check_one(db, CheckDepth::Background);
        let hashed: Vec<_> = hashing
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(StoreError::Fatal("an image hashing thread panicked".into()))),
                // No thread for this part: hash it here, after the rest.
                Err(part) => hash_images(db, part, parts),
            })
            .collect();
        (report, hashed)
    });
    let mut report = report?;
    for part in hashed {
        let part = part?;
        // (An image still in its file has no row to hash: it is reported once, as unmoved.)
        report.problems.extend(part.problems);
        report.artifacts += part.artifacts;
        report.uploads += part.uploads;
    }
    Ok(report)
}

/// Every stored image hashed against its recorded size and sha256, in one read transaction
/// of a connection of its own (nothing when the schema predates images in the database).
fn hash_images(db: &Path, part: i64, parts: i64) -> Result<crate::store::blobs::BlobCheck, StoreError> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(|e| not_tally(db, e))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(|e| not_tally(db, e))?;
    if version != SCHEMA_VERSION {
        return Ok(Default::default());
    }
    conn.execute_batch("BEGIN")?;
    let hashed = crate::store::blobs::hash_all(&conn, part, parts)?;
    conn.execute_batch("COMMIT")?;
    Ok(hashed)
}

/// [`check_with`] on one connection, hashing nothing.
fn check_one(db: &Path, depth: CheckDepth) -> Result<CheckReport, StoreError> {
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
    // `Full` and `Background` run SQLite's whole `integrity_check` (every page, the pointer
    // map that prune's incremental vacuum relies on, every index against its table: a broken
    // index would hide due work from the dispatcher); `Serve` runs it table by table for every
    // table but the images', after checking the file's length.
    let pragmas: Vec<String> = match depth {
        CheckDepth::Full | CheckDepth::Background => vec!["PRAGMA integrity_check".into()],
        CheckDepth::Serve => {
            report.problems.extend(cut_short(db));
            let mut stmt = conn.prepare(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name <> ?1 AND name NOT LIKE 'sqlite_%' ORDER BY name",
            )?;
            let tables = stmt.query_map([IMAGE_TABLE], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>()?;
            tables.iter().map(|t| format!("PRAGMA integrity_check(\"{}\")", t.replace('"', "\"\""))).collect()
        }
    };
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
    if depth == CheckDepth::Serve {
        conn.execute_batch("COMMIT")?;
        return Ok(report);
    }
    let blobs = crate::store::blobs::verify_all(&conn, false)?;
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
#[allow(missing_docs)]
pub struct BackupReport {
    pub bytes: u64,
    pub check: CheckReport,
    /// Seconds per step, for `tally bench`'s profile: `copy`, `mark`, `check` (while the copy
    /// is written out), `fsync` (what was left to write after the check), `rename`.
    pub phases: Vec<(&'static str, f64)>,
}

/// Copy the database at `src` (images included) into one self-contained file at `dest`, while
/// the daemon may be writing: one consistent snapshot (`copy::copy_snapshot`: the file itself
/// when a read transaction proves it is the snapshot and at rest, else SQLite's online backup
/// API in one step, one read transaction for the whole copy, which never starts over when the
/// daemon commits); the writer is not blocked. The copy goes to a temporary name beside `dest`,
/// is checked ([`check`]: every page, every image against its sha256) while the kernel writes
/// it to disk, fsynced, and only then renamed into place (and the directory fsynced), so
/// `dest` is always either the old file or a complete, checked copy. (Until issue #41 the copy
/// was `VACUUM INTO`, which rebuilds every b-tree: 3× a plain copy of the file.)
///
/// One backup to a destination at a time: an exclusive lock on `.<name>.backup-lock` beside
/// `dest` (held for the whole backup, removed after) refuses a second one at once with
/// "another backup to DEST is running". The temporary name is unique to the run
/// (`.<name>.partial-<pid>-<random>`), and on every failure it is removed together with the
/// `-journal`, `-wal` and `-shm` SQLite may have made beside it; temporary files a killed
/// earlier backup left are removed under the lock (no other backup can be using them).
pub fn backup(src: &Path, dest: &Path) -> Result<BackupReport, StoreError> {
    let _lock = BackupLock::take(dest)?;
    remove_stale_partials(dest);
    let from = Connection::open_with_flags(src, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(|e| not_tally(src, e))?;
    from.busy_timeout(Duration::from_secs(5))?;
    let tmp = partial_name(dest);
    let copied = (|| -> Result<BackupReport, StoreError> {
        let mut phases = Phases::start();
        let how = copy_snapshot(src, &from, &tmp, Rest::Checkpoint)?;
        phases.mark(how);
        {
            // The copy is a self-contained rollback-journal file: no -wal to carry around.
            let to = Connection::open(&tmp)?;
            // No fsync of its own: the one after the check, overlapping it, covers all.
            to.execute_batch("PRAGMA synchronous = OFF")?;
            let mode: String = to.query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))?;
            if mode != "delete" {
                return Err(StoreError::Fatal(format!("the copy kept journal mode {mode}")));
            }
            // Served later, it holds what it would send again (`store::sqlite::lineage`).
            super::lineage::mark_backup(&to, crate::clock::Clock::now(&crate::clock::SystemClock))?;
        }
        phases.mark("mark");
        let (check, bytes) = check_and_sync(&tmp, &mut phases)?;
        if !check.problems.is_empty() {
            return Err(StoreError::Fatal(format!(
                "the copy failed its check ({} problem(s); first: {})",
                check.problems.len(),
                check.problems[0]
            )));
        }
        crate::failpoint::pause("backup-before-rename");
        std::fs::rename(&tmp, dest).map_err(|e| io_fatal("cannot rename the copy into place", e))?;
        phases.mark("rename");
        Ok(BackupReport { bytes, check, phases: phases.done })
    })();
    drop(from);
    // Whatever happened, nothing of this run's temporary copy stays (after a rename `tmp`
    // is gone, and SQLite's files beside it are stray either way).
    remove_with_sqlite_files(&tmp, copied.is_err());
    let report = copied?;
    sync_dir_of(dest)?;
    Ok(report)
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// The check of the restored copy.
    pub check: CheckReport,
    /// Where the database it replaced was kept (`None`: there was none).
    pub kept: Option<PathBuf>,
    /// Seconds per step, as [`BackupReport::phases`] (`copy`, `check`, `fsync`, `replace`).
    pub phases: Vec<(&'static str, f64)>,
}

/// Put the database file `src` (a backup) in place as `db`, whose daemon is stopped (the
/// caller holds the data directory's lock). The copy is made as a backup's is
/// (`copy::copy_snapshot`: a `-wal` beside `src` is included, and the result is one file)
/// under a temporary name beside `db`, and checked there ([`check`]: the same pages `src`
/// holds, so a damaged backup is refused and nothing is changed) while the kernel writes it
/// to disk, then fsynced; then a database already at `db` is made
/// self-contained (its WAL checkpointed into it) and kept as
/// `<db>.before-restore-<UTC time>` ([`kept_name`]: never an existing name, so every restore
/// keeps what it replaced), the stale `-wal` and `-shm` of `db` are removed (SQLite would
/// otherwise apply an old WAL to the new file), and the copy is renamed into place.
pub fn restore(src: &Path, db: &Path) -> Result<RestoreReport, StoreError> {
    // What is not a tally database is said as such before anything is written.
    check_one(src, CheckDepth::Serve).map(|_| ())?;
    remove_stale_partials(db);
    let tmp = partial_name(db);
    let mut phases = Phases::start();
    let made = (|| -> Result<CheckReport, StoreError> {
        let from = Connection::open_with_flags(src, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(|e| not_tally(src, e))?;
        from.busy_timeout(Duration::from_secs(5))?;
        let how = copy_snapshot(src, &from, &tmp, Rest::AsIs)?;
        drop(from);
        let to = Connection::open(&tmp)?;
        // No fsync of its own: the one after the check, overlapping it, covers all.
        to.execute_batch("PRAGMA synchronous = OFF")?;
        let _: String = to.query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))?;
        drop(to);
        phases.mark(how);
        let (report, _) = check_and_sync(&tmp, &mut phases)?;
        let problems: Vec<&String> = report.problems.iter().chain(&report.unmoved).collect();
        if let Some(first) = problems.first() {
            return Err(StoreError::Invalid(format!(
                "{} did not pass `tally check` ({} problem(s); first: {first}); nothing was changed",
                src.display(),
                problems.len()
            )));
        }
        Ok(report)
    })();
    let report = match made {
        Ok(r) => r,
        Err(e) => {
            remove_with_sqlite_files(&tmp, true);
            return Err(e);
        }
    };
    remove_with_sqlite_files(&tmp, false);
    let mut kept = None;
    if db.exists() {
        let name = kept_name(db, crate::clock::Clock::now(&crate::clock::SystemClock));
        // Make the old database self-contained before keeping it: its WAL (the newest work)
        // goes into the file. When that cannot be done (the file is damaged, which may be why
        // it is being replaced), its WAL is kept beside it under the matching name instead, so
        // opening the kept file still sees that work.
        let folded = checkpoint_truncate(db).is_ok();
        if folded {
            // And in rollback-journal mode, so opening the kept file (`tally check`, `sqlite3`)
            // makes no -wal and -shm beside it; `tally serve` turns WAL on again if it is ever
            // restored. Best effort: a kept file in WAL mode is just as complete.
            let _ = Connection::open(db)
                .and_then(|c| c.query_row("PRAGMA journal_mode = DELETE", [], |r| r.get::<_, String>(0)));
        }
        let keep = || -> std::io::Result<()> {
            std::fs::rename(db, &name)?;
            let wal = db.with_file_name(format!("{}-wal", file_name(db)));
            if !folded && wal.exists() {
                std::fs::rename(&wal, name.with_file_name(format!("{}-wal", file_name(&name))))?;
            }
            Ok(())
        };
        if let Err(e) = keep() {
            remove_with_sqlite_files(&tmp, true);
            return Err(io_fatal("cannot keep the database being replaced", e));
        }
        kept = Some(name);
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
    phases.mark("replace");
    Ok(RestoreReport { check: report, kept, phases: phases.done })
}

/// The name a restore keeps the replaced database `db` under:
/// `<db>.before-restore-<YYYYMMDDTHHMMSSZ>` (UTC, so names sort by time), with `-2`, `-3`, …
/// added when that name exists already. Only restores make these names, and a restore holds
/// the data directory's lock, so the name found free is still free at the rename.
pub fn kept_name(db: &Path, now: crate::domain::Millis) -> PathBuf {
    let stamp = crate::clock::rfc3339(now.div_euclid(1000) * 1000);
    // 2026-12-01T22:45:12.000Z → 20261201T224512Z
    let stamp: String = stamp.split('.').next().unwrap_or(&stamp).chars().filter(|c| *c != '-' && *c != ':').collect();
    let base = format!("{}.before-restore-{stamp}Z", file_name(db));
    let mut name = db.with_file_name(&base);
    let mut n = 2;
    while name.symlink_metadata().is_ok() {
        name = db.with_file_name(format!("{base}-{n}"));
        n += 1;
    }
    name
}

/// An exclusive lock on one backup destination, held for the whole backup; the lock file is
/// removed when it is dropped.
struct BackupLock {
    path: PathBuf,
    file: std::fs::File,
}

impl BackupLock {
    /// Take the lock of backups to `dest`, or fail at once naming the running one.
    fn take(dest: &Path) -> Result<BackupLock, StoreError> {
        use std::io::{Seek, Write};
        let path = dest.with_file_name(format!(".{}.backup-lock", file_name(dest)));
        loop {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| io_fatal(&format!("cannot open the backup lock {}", path.display()), e))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    let who = match holder.trim() {
                        "" => String::new(),
                        pid => format!(" (pid {pid})"),
                    };
                    return Err(StoreError::Invalid(format!(
                        "another backup to {} is running{who}; wait for it to finish, or choose another destination",
                        dest.display()
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(io_fatal(&format!("cannot lock {}", path.display()), e));
                }
            }
            // The holder before us may have removed the file between our open and our lock:
            // then we hold a lock on a file nobody else will find. Take the one at the path.
            if !same_inode(&file, &path) {
                continue;
            }
            let _ = file.set_len(0).and_then(|_| file.rewind()).and_then(|_| writeln!(file, "{}", std::process::id()));
            return Ok(BackupLock { path, file });
        }
    }
}

impl Drop for BackupLock {
    fn drop(&mut self) {
        // Remove while still holding the lock (see the inode check in `take`).
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

/// Whether the open `file` is the file at `path` now.
fn same_inode(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Remove `path`'s SQLite companions (`-journal`, `-wal`, `-shm`), and `path` itself when
/// `also_file` (best effort: this runs on the way out of a failure).
fn remove_with_sqlite_files(path: &Path, also_file: bool) {
    let name = file_name(path);
    let mut doomed: Vec<PathBuf> =
        ["-journal", "-wal", "-shm"].iter().map(|s| path.with_file_name(format!("{name}{s}"))).collect();
    if also_file {
        doomed.push(path.to_path_buf());
    }
    for p in doomed {
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(file = %p.display(), error = %e, "could not remove a temporary file"),
        }
    }
}

/// Remove the temporary copies (and their SQLite files) an earlier, killed backup or restore
/// to `dest` left beside it. Called only with that destination's lock held (a backup's own,
/// or the data directory's for a restore), so none of them is in use.
fn remove_stale_partials(dest: &Path) {
    let prefix = format!(".{}.partial", file_name(dest));
    let dir = dest.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| "tally.db".into())
}

/// A temporary name beside `dest` (same directory, so the final rename is atomic), unique to
/// this run: `.<name>.partial-<pid>-<random>`.
fn partial_name(dest: &Path) -> PathBuf {
    let random = uuid::Uuid::new_v4().simple().to_string();
    dest.with_file_name(format!(".{}.partial-{}-{}", file_name(dest), std::process::id(), &random[..8]))
}

pub(super) fn io_fatal(what: &str, e: std::io::Error) -> StoreError {
    StoreError::Fatal(format!("{what}: {e}"))
}

/// Fsync the directory holding `path`, so a rename into it is durable.
fn sync_dir_of(path: &Path) -> Result<(), StoreError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_fatal("cannot fsync the directory", e))
}
