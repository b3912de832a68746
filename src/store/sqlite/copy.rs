//! The page copy under `tally backup` and `tally restore` (SQLite's backup API in one step,
//! with the kernel's writeback started as it goes), the check of a copy while it is written
//! out, and the file-length check of `tally serve`'s start-up guard (issue #41).

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::whole::{check, io_fatal};
use crate::store::StoreError;
use crate::store::check::CheckReport;

/// Seconds per step of a whole-file operation.
pub(super) struct Phases {
    at: std::time::Instant,
    pub(super) done: Vec<(&'static str, f64)>,
}

impl Phases {
    pub(super) fn start() -> Self {
        Phases { at: std::time::Instant::now(), done: Vec::new() }
    }

    /// The step `name` ended now.
    pub(super) fn mark(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.done.push((name, (now - self.at).as_secs_f64()));
        self.at = now;
    }
}

/// How [`copy_snapshot`] may bring the source to rest before copying its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rest {
    /// `tally backup`: the daemon's database. A `TRUNCATE` checkpoint folds the WAL into the
    /// file and empties it, if it can within [`CHECKPOINT_WAIT`] (it holds the daemon's next
    /// commit at most that long).
    Checkpoint,
    /// `tally restore`: a backup, never written to.
    AsIs,
}

/// How long a backup's checkpoint may wait for the daemon's readers and writer.
const CHECKPOINT_WAIT: Duration = Duration::from_millis(200);

/// Copy one consistent snapshot of the database at `src` (read by `from`) into a new file at
/// `to`: the file itself, by the kernel, when it is at rest ([`file_copy_at_rest`]), else
/// page by page ([`page_copy`]). Returns which, for the profile.
pub(super) fn copy_snapshot(src: &Path, from: &Connection, to: &Path, rest: Rest) -> Result<&'static str, StoreError> {
    if file_copy_at_rest(src, to, rest)? {
        return Ok("copy (the file at rest)");
    }
    let _ = std::fs::remove_file(to);
    page_copy(from, to)?;
    Ok("copy (page by page)")
}

/// Copy the database file `src` itself into `to` (`copy_file_range` through `std::io::copy`:
/// no page passes through SQLite or this process) when a read transaction can prove the file
/// alone is its snapshot and that nothing writes into it until the copy ends; `false` (nothing
/// copied) otherwise. The proof: with the WAL empty (0 bytes or absent) after the read
/// transaction began, the reader reads the file alone, holding the WAL's read slot 0 (or, in
/// rollback-journal mode, a SHARED lock that keeps every writer out), and SQLite's checkpoint
/// writes into the file only under an exclusive lock on that slot (`walCheckpoint`), so
/// commits meanwhile stay in the WAL. The WAL could not have been emptied after the reader
/// began either: emptying it waits for every reader of it. A hot `-journal` beside `src`, a
/// WAL that is not empty, or a file shorter than the snapshot's pages leaves it to the page copy.
fn file_copy_at_rest(src: &Path, to: &Path, rest: Rest) -> Result<bool, StoreError> {
    let name = src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let side = |suffix: &str| std::fs::metadata(src.with_file_name(format!("{name}{suffix}"))).map_or(0, |m| m.len());
    if side("-journal") > 0 {
        return Ok(false);
    }
    if rest == Rest::Checkpoint {
        let folded = (|| -> rusqlite::Result<bool> {
            let w = Connection::open_with_flags(src, rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE)?;
            w.busy_timeout(CHECKPOINT_WAIT)?;
            Ok(w.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0))? == 0)
        })();
        if !folded.unwrap_or(false) {
            return Ok(false);
        }
    }
    let r = Connection::open_with_flags(src, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    r.busy_timeout(Duration::from_secs(5))?;
    r.execute_batch("BEGIN")?;
    // The first read begins the snapshot.
    r.query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get::<_, i64>(0))?;
    let pages: i64 = r.pragma_query_value(None, "page_count", |row| row.get(0))?;
    let page_size: i64 = r.pragma_query_value(None, "page_size", |row| row.get(0))?;
    let len = u64::try_from(pages.max(0) * page_size.max(0)).unwrap_or(0);
    let at_rest = side("-wal") == 0 && std::fs::metadata(src).map_or(0, |m| m.len()) >= len && len > 0;
    if at_rest {
        use std::io::Read;
        let copied = std::fs::File::open(src).and_then(|f| {
            let mut out = std::fs::File::create(to)?;
            std::io::copy(&mut f.take(len), &mut out)
        });
        let copied = copied.map_err(|e| io_fatal("cannot copy the database file", e))?;
        if copied != len {
            return Err(StoreError::Fatal(format!("the file copy stopped at {copied} of {len} bytes")));
        }
    }
    r.execute_batch("COMMIT")?;
    Ok(at_rest)
}

/// Copy every page of the database `from` reads into a new file at `to` with SQLite's online
/// backup API, in one step: one read transaction on `from` for the whole copy, so the copy is
/// one consistent snapshot (a WAL's committed frames included), page for page — the page
/// size and `auto_vacuum` of the source kept, nothing rebuilt. The copy is written without a
/// journal or fsyncs of its own: it is a temporary file until its caller has checked and
/// fsynced it ([`check_and_sync`]), and is removed on any failure.
fn page_copy(from: &Connection, to: &Path) -> Result<(), StoreError> {
    let mut dest = Connection::open(to)?;
    dest.execute_batch("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")?;
    let backup = rusqlite::backup::Backup::new(from, &mut dest)?;
    let _writeback = Writeback::start(to);
    match backup.step(-1)? {
        rusqlite::backup::StepResult::Done => Ok(()),
        other => Err(StoreError::Fatal(format!("the page copy stopped before its end ({other:?})"))),
    }
}

/// While a copy is written, asks the kernel every [`Writeback::EVERY`] to start writing what
/// is already in the file (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`: it starts the
/// writes and waits for none), so the disk works while SQLite copies instead of all at the
/// final fsync — as `cp` then `sync` overlap by the kernel's own writeback. Only a head start:
/// durability still comes from the fsync after the check. Stops when dropped.
struct Writeback {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writeback {
    const EVERY: Duration = Duration::from_millis(100);

    fn start(path: &Path) -> Writeback {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let file = std::fs::OpenOptions::new().write(true).open(path);
        let thread = file.ok().and_then(|file| {
            std::thread::Builder::new()
                .name("tally-writeback".into())
                .spawn(move || {
                    // The channel is the stop signal and the pace: a message or a hang-up ends it.
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(Self::EVERY) {
                        start_writeback(&file);
                    }
                })
                .ok()
        });
        Writeback { stop: Some(stop), thread }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Start writing `file`'s dirty pages to disk without waiting (a hint; errors are left to the
/// fsync that follows).
#[cfg(target_os = "linux")]
fn start_writeback(file: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call only starts write-out of its pages.
    unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &std::fs::File) {}

/// [`check`] the file at `path` while the kernel writes it to disk (an fsync on a thread of
/// its own: the check reads the just-written pages from the page cache, so the two overlap),
/// then fsync it once more to be sure of the whole. Returns the report and the file's size.
pub(super) fn check_and_sync(path: &Path, phases: &mut Phases) -> Result<(CheckReport, u64), StoreError> {
    let file = std::fs::File::open(path).map_err(|e| io_fatal("cannot reopen the copy", e))?;
    let (report, flushed) = std::thread::scope(|s| {
        let flushing = s.spawn(|| file.sync_all());
        let report = check(path);
        phases.mark("check");
        (report, flushing.join())
    });
    let report = report?;
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(io_fatal("cannot fsync the copy", e)),
        Err(_) => return Err(StoreError::Fatal("the fsync thread panicked".into())),
    }
    file.sync_all().map_err(|e| io_fatal("cannot fsync the copy", e))?;
    phases.mark("fsync");
    let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok((report, bytes))
}

/// Whether the database file is shorter than its header says it is: a copy cut short. The
/// header's page count (bytes 28–31) is trusted only when SQLite marked it valid (bytes 92–95
/// equal the change counter, bytes 24–27), as SQLite itself does; pages a WAL adds beyond it
/// are in the WAL, not in this file. `None` when the file is long enough or the count is not
/// valid (SQLite then takes the file's length as the truth).
pub(super) fn cut_short(db: &Path) -> Option<String> {
    use std::io::Read;
    let mut header = [0u8; 100];
    let mut f = std::fs::File::open(db).ok()?;
    f.read_exact(&mut header).ok()?;
    let len = f.metadata().ok()?.len();
    let be = |at: usize| u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536u64,
        n => u64::from(n),
    };
    let pages = u64::from(be(28));
    if be(92) != be(24) || pages == 0 || len >= pages * page_size {
        return None;
    }
    Some(format!(
        "the file is {len} bytes, but its header says {} ({pages} pages of {page_size}): it was cut short",
        pages * page_size
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Copies taken while another connection commits all the time are each one consistent
    /// snapshot (every commit adds a row to `t` and one to `s.total`, so the two agree), by
    /// both ways of copying: the file at rest, whenever the checkpoint finds a moment between
    /// commits, and page by page otherwise. It cannot force the one race the file copy's proof
    /// is about (a checkpoint writing into the file while it is copied); that rests on
    /// SQLite's locking as `file_copy_at_rest` cites it.
    #[test]
    fn copies_under_steady_commits_are_each_one_snapshot() {
        let dir = std::env::temp_dir().join(format!("tally-copy-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        let db = dir.join("src.db");
        let c = Connection::open(&db).expect("open");
        c.execute_batch(
            "PRAGMA journal_mode = WAL; CREATE TABLE t (a INTEGER PRIMARY KEY, v BLOB);
             CREATE TABLE s (total INTEGER); INSERT INTO s VALUES (8000);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 8000)
             INSERT INTO t (v) SELECT zeroblob(6000) FROM n;",
        )
        .expect("schema");
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (db, stop) = (db.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut w = Connection::open(&db).expect("writer");
                w.busy_timeout(Duration::from_secs(5)).expect("busy");
                // A checkpoint after every commit: it writes into the file whenever a copy
                // lets it, so a copy of the file that did not hold it off would be torn.
                w.execute_batch("PRAGMA wal_autocheckpoint = 1").expect("autocheckpoint");
                let mut commits = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let tx = w.transaction().expect("tx");
                    tx.execute("INSERT INTO t (v) VALUES (zeroblob(6000))", []).expect("insert");
                    tx.execute("UPDATE s SET total = total + 1", []).expect("update");
                    tx.commit().expect("commit");
                    commits += 1;
                    // Load, not synchronisation: leave the checkpoint a moment between commits.
                    std::thread::sleep(Duration::from_millis(1));
                }
                commits
            })
        };
        let mut ways = std::collections::BTreeMap::new();
        for i in 0..20 {
            let to = dir.join(format!("copy-{i}.db"));
            let from = Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).expect("from");
            let how = copy_snapshot(&db, &from, &to, Rest::Checkpoint).expect("copy");
            *ways.entry(how).or_insert(0) += 1;
            let copy = Connection::open(&to).expect("copy opens");
            let ok: String = copy.query_row("PRAGMA integrity_check", [], |r| r.get(0)).expect("integrity");
            assert_eq!(ok, "ok", "copy {i} ({how})");
            let rows: i64 = copy.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).expect("rows");
            let total: i64 = copy.query_row("SELECT total FROM s", [], |r| r.get(0)).expect("total");
            assert_eq!(rows, total, "copy {i} ({how}) is not one snapshot");
        }
        stop.store(true, Ordering::Relaxed);
        let commits = writer.join().expect("writer");
        assert!(commits > 20, "the writer committed only {commits} times");
        eprintln!("copies by way: {ways:?}, {commits} commits meanwhile");
        assert!(ways.contains_key("copy (the file at rest)"), "no copy of the file at rest: {ways:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
