//! The SQLite backend: one database file, one writer thread with group commit, pooled readers.
//!
//! Invariants enforced here:
//! - **One writer.** Only the writer thread holds a write connection. Callers send it
//!   operations; it groups all operations waiting at that moment into one transaction (group
//!   commit), runs them one after the other, commits once, and only then answers each caller.
//!   An operation that fails undoes its own writes and nothing else: one that failed before
//!   changing a row has nothing to undo (a failed statement undoes itself), and if one fails
//!   after changing rows the batch is rolled back and run again with a savepoint per
//!   operation. (Savepoints on every batch cost two statements per operation.)
//! - **Fsync what a promise depends on, pipelined.** Every transaction commits with
//!   `synchronous = NORMAL` (its WAL frames written, not fsynced: it survives a crash of the
//!   process) and the writer goes on with the next batch. With `durability = "full"`, the
//!   flusher thread fdatasyncs the WAL (the writer itself after a lone operation with nothing
//!   queued behind it) and [`Commit::Durable`] operations are answered only
//!   after an fsync that started after their commit; reads are handed back only once every
//!   durable commit they could see is on disk; a failed fsync stops the store for good
//!   (`store::sqlite::flush`). [`Commit::Ordered`] operations are not fsynced on their own
//!   (answered once the durable commits before theirs are on disk), and the
//!   next fsync covers their WAL frames too (one file, written in order), so nothing durable
//!   can ever depend on an ordered write that a power loss erased. With `"normal"` nothing is
//!   fsynced per commit and nothing waits.
//! - **Pragmas are set and then read back**, and opening fails if SQLite did not take them.
//! - **No transaction spans a network call**: operations are synchronous closures run on the
//!   writer thread; they cannot await anything.
//! - Readers use their own connections and never write.
//! - **Images live in the database** (`blobs`, see `store::blobs`): written only by the writer,
//!   in the transaction of the row they belong to; read in chunks, each its own short read
//!   transaction.
//!
//! **Checkpoint policy** (the WAL must not grow without bound under large images). SQLite's
//! automatic checkpoint, at [`open::AUTOCHECKPOINT_PAGES`] (SQLite's 1000 pages,
//! about 4 MiB, set and read back; a larger threshold was faster with large images but needs
//! that much more free disk, see there), is run by the writer itself (a WAL hook counts the
//! frames; SQLite's own hook drops a checkpoint's errors, and a failed fsync in one must stop
//! the store): after a commit leaves the WAL above that, the writer thread runs a PASSIVE
//! checkpoint, which fsyncs the WAL first (at `synchronous = NORMAL`) and copies
//! what no reader still needs into the database file and never waits for readers. The WAL file is reused from its start once a checkpoint has
//! copied everything and no reader still reads from it, and `journal_size_limit`
//! ([`open::WAL_SIZE_LIMIT`], 64 MiB) truncates it back after such a reset. What keeps that
//! reset possible is that no reader holds a snapshot for long: downloads read an image one
//! chunk per read transaction (`store::blobs`), so a slow client never pins the WAL. One commit
//! carries at most about `writer::MAX_BATCH_BYTES` (32 MiB) of images (a larger single image commits
//! alone), which bounds what one group commit adds to the WAL; `tally backup` (`VACUUM INTO`)
//! holds one snapshot for its length.
//! A clean stop checkpoints with TRUNCATE (an empty WAL). Measured in `tally bench`
//! (`bench-results/2026-12-01-s3-images-in-database.md`).

mod copy;
mod flush;
pub mod lineage;
mod migrate;
pub(crate) mod open;
pub(crate) mod startup;
pub(crate) mod tx;
pub(crate) mod whole;
mod writer;

#[cfg(test)]
mod flush_tests;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::config::Durability;
use crate::store::{Commit, StoreError};
use writer::{Job, JobOf, Op, Writer};

/// A handle to tally's database. Cheap to clone.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<Op>>>,
    writer_thread: Mutex<Option<thread::JoinHandle<()>>>,
    readers: Mutex<Vec<Connection>>,
    statements: Arc<AtomicU64>,
    commits: AtomicU64,
    /// Commits that changed at least one row.
    writes: AtomicU64,
    /// fdatasyncs of the WAL by the flusher, and the durable operations answered after them.
    fsyncs: AtomicU64,
    durable_waits: AtomicU64,
    /// What opening did to an older database, in plain words.
    migration: Vec<String>,
    /// Set while `tally serve` serves the database: the data directory's sidecar, noted after
    /// every durable commit (`store::sqlite::lineage`).
    tracker: std::sync::OnceLock<lineage::Tracker>,
    /// The flush horizon (`store::sqlite::flush`): durable answers and reads wait on it; a
    /// failed fsync poisons it.
    flush: Arc<flush::Flush>,
    /// The inode of the WAL file the flusher fsyncs (`None` with `durability = "normal"`;
    /// read by tests).
    #[cfg_attr(not(test), allow(dead_code))]
    wal_inode: Option<u64>,
}

impl SqliteStore {
    /// Open (creating or migrating) the database at `path` and start the writer thread.
    pub fn open(path: &Path, durability: Durability) -> Result<SqliteStore, StoreError> {
        let statements = Arc::new(AtomicU64::new(0));
        let (mut conn, migration) = open::open_write(path, durability)?;
        for note in &migration {
            tracing::info!("{note}");
        }
        open::count_statements(&mut conn, statements.clone())?;
        // Every batch commits without an fsync of its own; with `durability = "full"` the
        // flusher fsyncs the WAL through its own fd (`store::sqlite::flush`).
        open::set_and_check(&conn, "synchronous", "NORMAL", "1")?;
        let frames = Arc::new(AtomicI32::new(0));
        let seen = frames.clone();
        conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
            seen.store(pages, Ordering::Relaxed);
            Ok(())
        }))?;
        let wal = match durability {
            Durability::Full => {
                let wal_path = flush::wal_path(path);
                let file = std::fs::File::open(&wal_path).map_err(|e| {
                    StoreError::Fatal(format!("cannot open the WAL {} to fsync it: {e}", wal_path.display()))
                })?;
                Some(file)
            }
            Durability::Normal => None,
        };
        let wal_inode = match &wal {
            Some(f) => Some(std::os::unix::fs::MetadataExt::ino(
                &f.metadata().map_err(|e| StoreError::Fatal(format!("cannot read the WAL file's metadata: {e}")))?,
            )),
            None => None,
        };
        let flush = Arc::new(flush::Flush::new(wal.is_some()));
        let (tx, rx) = mpsc::channel::<Op>();
        let inner = Arc::new(Inner {
            path: path.to_path_buf(),
            writer: Mutex::new(Some(tx)),
            writer_thread: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
            statements,
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            durable_waits: AtomicU64::new(0),
            migration,
            tracker: std::sync::OnceLock::new(),
            flush: flush.clone(),
            wal_inode,
        });
        let weak = Arc::downgrade(&inner);
        // The writer's own fd on the same open file, for the fsyncs it runs itself
        // (`flush::Flush::sync_inline`).
        let own_wal = match &wal {
            Some(f) => Some((
                f.try_clone().map_err(|e| StoreError::Fatal(format!("cannot open the WAL twice: {e}")))?,
                flush::wal_path(path).display().to_string(),
            )),
            None => None,
        };
        let flusher = match wal {
            Some(file) => {
                let (flush, weak, what) = (flush.clone(), weak.clone(), flush::wal_path(path).display().to_string());
                Some(
                    thread::Builder::new()
                        .name("tally-flusher".into())
                        .spawn(move || flush.run(file, &what, |seq, answered| flush::flushed(&weak, seq, answered)))
                        .map_err(|e| StoreError::Fatal(format!("cannot start the flusher thread: {e}")))?,
                )
            }
            None => None,
        };
        let writer = Writer { conn, frames, inner: weak, flush, flusher, wal: own_wal, path: path.to_path_buf() };
        let handle = thread::Builder::new()
            .name("tally-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError::Fatal(format!("cannot start the writer thread: {e}")))?;
        *lock(&inner.writer_thread) = Some(handle);
        Ok(SqliteStore { inner })
    }

    /// What opening did to an older database (schema migration, image files moved in), in
    /// plain words; empty when the database was current.
    pub fn migration_notes(&self) -> &[String] {
        &self.inner.migration
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// SQL statements executed so far on every connection of this store (for idle checks
    /// and benchmarks).
    pub fn statements(&self) -> u64 {
        self.inner.statements.load(Ordering::Relaxed)
    }

    /// Transactions committed by the writer so far.
    pub fn commits(&self) -> u64 {
        self.inner.commits.load(Ordering::Relaxed)
    }

    /// Transactions committed by the writer so far that changed at least one row (a
    /// transaction that only read — a dispatch that found nothing to claim — writes nothing to
    /// the WAL and is not counted).
    pub fn writes(&self) -> u64 {
        self.inner.writes.load(Ordering::Relaxed)
    }

    /// While served: the lineage `seq` last noted in the data directory's sidecar, and (with
    /// `durability = "normal"`) the one its own fsync made durable (`store::sqlite::lineage`).
    pub fn sidecar_seqs(&self) -> Option<(i64, Option<i64>)> {
        self.inner.tracker.get().map(lineage::Tracker::seqs)
    }

    /// fsyncs of the WAL so far (`durability = "full"`: the flusher's, each covering every
    /// commit before it).
    pub fn fsyncs(&self) -> u64 {
        self.inner.fsyncs.load(Ordering::Relaxed)
    }

    /// Durable operations answered after an fsync so far: each one an fsync its caller waited
    /// for (shared with every other operation that fsync covered).
    pub fn durable_waits(&self) -> u64 {
        self.inner.durable_waits.load(Ordering::Relaxed)
    }

    /// Run a write operation on the writer thread, grouped with whatever else is waiting,
    /// and return its result once its transaction is durably committed (with
    /// `durability = "full"`: once an fsync of the WAL that started after its commit succeeded).
    pub async fn write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        self.send(Commit::Durable, 0, f)?.await.map_err(|_| StoreError::Closed)?
    }

    /// [`SqliteStore::write`] for bookkeeping that needs no fsync of its own ([`Commit::Ordered`]).
    pub async fn write_ordered<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        self.send(Commit::Ordered, 0, f)?.await.map_err(|_| StoreError::Closed)?
    }

    /// Queue an operation for the writer now; the receiver yields its result after the commit.
    /// The operation may run twice (the second time after its batch was rolled back, see
    /// `writer_loop`): it must be a function of the database alone, as every store operation is.
    pub(in crate::store) fn send<R, F>(
        &self,
        commit: Commit,
        weight: usize,
        f: F,
    ) -> Result<oneshot::Receiver<Result<R, StoreError>>, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        if let Some(p) = self.inner.flush.poisoned() {
            return Err(p.error());
        }
        let (tx, rx) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(JobOf { f, result: None, tx });
        let sender = lock(&self.inner.writer).clone().ok_or(StoreError::Closed)?;
        let queued = crate::stages::start();
        sender.send(Op { commit, weight, queued, job }).map_err(|_| StoreError::Closed)?;
        Ok(rx)
    }

    /// Run a read on a reader connection (off the async threads).
    pub async fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.read_blocking(f))
            .await
            .map_err(|e| StoreError::Fatal(format!("reader task failed: {e}")))?
    }

    /// Run a read on the current thread (for CLI tools and tests outside a runtime). Every read
    /// of the store comes through here, and its result is handed back only once every durable
    /// write it could have seen is on disk (`store::sqlite::flush`; free when none is pending).
    pub fn read_blocking<R>(&self, f: impl FnOnce(&Connection) -> Result<R, StoreError>) -> Result<R, StoreError> {
        let conn = lock(&self.inner.readers).pop();
        let conn = match conn {
            Some(c) => c,
            None => {
                let mut c = open::open_read(&self.inner.path)?;
                open::count_statements(&mut c, self.inner.statements.clone())?;
                c
            }
        };
        // One snapshot for the whole read. Without a transaction each statement sees the newest
        // commit, so a read of several statements could see half of what a write committed
        // between them (a drafting task `succeeded` and, read a moment earlier, no answer yet:
        // a draft shown `failed`). A deferred read transaction takes its snapshot at the first
        // statement and holds it to the end; it never blocks the writer (WAL).
        let began = conn.prepare_cached("BEGIN").and_then(|mut s| s.execute([])).is_ok();
        let result = f(&conn);
        // Ending a read transaction can only fail if the connection is broken; then it is not
        // put back for the next read (the read still waits for its writes below).
        let open = began && !conn.is_autocommit();
        let ended = !open || conn.prepare_cached("COMMIT").and_then(|mut s| s.execute([])).is_ok();
        if ended {
            let mut pool = lock(&self.inner.readers);
            if pool.len() < 8 {
                pool.push(conn);
            }
        }
        self.inner.flush.wait_readable()?;
        result
    }

    /// Resolves with the reason once a failed fsync stopped the store (never otherwise): the
    /// daemon then stops, as for any database it cannot use.
    pub async fn failed(&self) -> String {
        self.inner.flush.failed().await
    }

    /// Why the store stopped, if a failed fsync stopped it.
    pub fn failure(&self) -> Option<String> {
        self.inner.flush.poisoned().map(|p| p.error().to_string())
    }

    /// Tests (`--features failpoints`): stop the store as a failed fsync does.
    #[cfg(feature = "failpoints")]
    #[doc(hidden)]
    pub fn poison_for_tests(&self) {
        self.inner.flush.poison("a test's file", "injected by the test");
    }

    /// The inode of the WAL file the flusher fsyncs (tests: it must stay the WAL's).
    #[cfg(test)]
    fn flushed_inode(&self) -> Option<u64> {
        self.inner.wal_inode
    }

    /// Stop the writer after the operations already sent, checkpoint the WAL into the
    /// database file and truncate it, so the file alone is a complete copy.
    pub fn close(&self) -> Result<(), StoreError> {
        lock(&self.inner.writer).take();
        if let Some(h) = lock(&self.inner.writer_thread).take() {
            let _ = h.join();
        }
        lock(&self.inner.readers).clear();
        // After a failed fsync nothing more is written or checkpointed: the next start
        // recovers from what reached the disk (`store::sqlite::flush`).
        if let Some(p) = self.inner.flush.poisoned() {
            return Err(p.error());
        }
        // A served database: `running` cleared (fsynced) before the checkpoint, the sidecar
        // saved durably after it (`store::sqlite::lineage`).
        let ended = self.inner.tracker.get().map(|t| lineage::end_serving(&self.inner.path, t));
        let checkpoint = open::checkpoint_truncate(&self.inner.path);
        if let Some(Err(e)) = ended {
            tracing::warn!(error = %e, "cannot record the clean stop in the database and its sidecar");
        }
        checkpoint
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
