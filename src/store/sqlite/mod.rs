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
//!   flusher thread fdatasyncs the WAL and [`Commit::Durable`] operations are answered only
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
//! carries at most about [`MAX_BATCH_BYTES`] (32 MiB) of images (a larger single image commits
//! alone), which bounds what one group commit adds to the WAL; `tally backup` (`VACUUM INTO`)
//! holds one snapshot for its length.
//! A clean stop checkpoints with TRUNCATE (an empty WAL). Measured in `tally bench`
//! (`BENCHMARKS.md`, "images in the database").

mod flush;
pub mod lineage;
mod migrate;
pub(crate) mod open;
pub(crate) mod startup;
pub(crate) mod tx;
pub(crate) mod whole;

#[cfg(test)]
mod flush_tests;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;

use rusqlite::{Connection, OptionalExtension};
use tokio::sync::oneshot;

use crate::config::Durability;
use crate::stages::{self, Stage};
use crate::store::{Commit, StoreError};

/// At most this many operations share one commit.
const MAX_BATCH: usize = 256;
/// At most about this many bytes of images share one commit (an operation larger than this
/// commits alone): a burst of large images reaches the WAL in bounded commits.
const MAX_BATCH_BYTES: usize = 32 << 20;

/// The work of an operation: run on the write connection (possibly twice: see the writer's
/// batches), keeping its latest result, and answered once the batch's commit finished.
trait Job: Send {
    /// Run (again) on the write connection; true if the operation succeeded.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answer the caller: the latest result, or `Some(error)` if the commit failed.
    fn answer(self: Box<Self>, commit_error: Option<&StoreError>);
}

struct JobOf<R, F> {
    f: F,
    result: Option<Result<R, StoreError>>,
    tx: oneshot::Sender<Result<R, StoreError>>,
}

impl<R: Send, F: FnMut(&Connection) -> Result<R, StoreError> + Send> Job for JobOf<R, F> {
    fn run(&mut self, conn: &Connection) -> bool {
        let r = (self.f)(conn);
        let ok = r.is_ok();
        self.result = Some(r);
        ok
    }

    fn answer(self: Box<Self>, commit_error: Option<&StoreError>) {
        let result = match (commit_error, self.result) {
            (Some(e), _) => Err(e.as_commit_failure()),
            (None, Some(r)) => r,
            (None, None) => Err(StoreError::Closed),
        };
        let _ = self.tx.send(result);
    }
}

/// An operation for the writer.
struct Op {
    commit: Commit,
    /// When it was sent, while stages are timed (`tally bench --profile`).
    queued: Option<std::time::Instant>,
    /// Image bytes the operation writes (for [`MAX_BATCH_BYTES`]).
    weight: usize,
    job: Box<dyn Job>,
}

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
            Some(f) => Some(f.try_clone().map_err(|e| StoreError::Fatal(format!("cannot open the WAL twice: {e}")))?),
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
        let result = f(&conn);
        {
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

/// The writer thread's state.
struct Writer {
    conn: Connection,
    /// Frames in the WAL after the last commit that wrote (SQLite's WAL hook); swapped to 0
    /// when read.
    frames: Arc<AtomicI32>,
    inner: std::sync::Weak<Inner>,
    flush: Arc<flush::Flush>,
    flusher: Option<thread::JoinHandle<()>>,
    /// The WAL, for the fsyncs the writer runs itself when its queue is empty (`full` only).
    wal: Option<std::fs::File>,
    path: PathBuf,
}

impl Writer {
    /// Take every operation waiting, run them in one transaction, commit, answer (durable
    /// operations once the flusher says their commit is on disk). Ends when every sender is
    /// gone, after the flusher flushed what was still wanted.
    fn run(mut self, rx: mpsc::Receiver<Op>) {
        // Commits that failed in a row.
        let mut failing: u64 = 0;
        // An operation taken from the channel that did not fit the last batch's byte budget.
        let mut carried: Option<Op> = None;
        loop {
            let first = match carried.take() {
                Some(op) => op,
                None => match rx.recv() {
                    Ok(op) => op,
                    Err(_) => break,
                },
            };
            let mut weight = first.weight;
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(op) if weight + op.weight > MAX_BATCH_BYTES => {
                        carried = Some(op);
                        break;
                    }
                    Ok(op) => {
                        weight += op.weight;
                        batch.push(op);
                    }
                    Err(_) => break,
                }
            }
            // A poisoned store runs nothing more (`store::sqlite::flush`).
            if let Some(p) = self.flush.poisoned() {
                let e = p.error();
                for op in batch {
                    op.job.answer(Some(&e));
                }
                continue;
            }
            let lone = batch.len() == 1;
            self.one_batch(batch, &mut failing);
            // Nothing else to do: fsync here rather than wake the flusher and wait for it.
            if let Some(wal) = &self.wal {
                if carried.is_none() {
                    carried = rx.try_recv().ok();
                }
                if carried.is_some() || !lone {
                    self.flush.hand_off();
                } else {
                    let what = flush::wal_path(&self.path).display().to_string();
                    let inner = &self.inner;
                    self.flush.sync_inline(wal, &what, |seq, answered| flush::flushed(inner, seq, answered));
                }
            }
        }
        self.flush.stop();
        if let Some(h) = self.flusher.take() {
            let _ = h.join();
        }
        if self.flush.poisoned().is_some() {
            // Closing the last connection would checkpoint what a failed fsync may have lost
            // into the database file; the next start recovers from the disk instead.
            let _ = self.conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true);
        }
    }

    /// Run one batch in one transaction, commit it, and answer (or hand its durable
    /// operations to the flusher).
    fn one_batch(&mut self, mut batch: Vec<Op>, failing: &mut u64) {
        let conn = &self.conn;
        for op in &batch {
            stages::record(Stage::StoreQueue, op.queued);
        }
        let changes_before = conn.total_changes();
        let durable = batch.iter().filter(|op| op.commit == Commit::Durable).count();
        // The batch's generation and the one its durable answers need flushed, once its
        // COMMIT began.
        let mut begun: Option<(u64, u64, u64)> = None;
        let commit = (|| -> Result<Option<i64>, StoreError> {
            conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
            // Optimistically without savepoints: an operation that fails having changed no row
            // leaves nothing to undo (a failed statement undoes itself). Only if one fails
            // after it changed rows is the batch rolled back and run again, each operation in
            // its own savepoint, so that only the failing one's writes are undone.
            let mut clean = true;
            for op in batch.iter_mut() {
                let before = conn.total_changes();
                let run = stages::start();
                let ok = op.job.run(conn);
                stages::record(Stage::StoreRun, run);
                if conn.is_autocommit() {
                    return Err(StoreError::Fatal("the write transaction ended inside an operation".into()));
                }
                if !ok && conn.total_changes() != before {
                    clean = false;
                    break;
                }
            }
            if !clean {
                conn.prepare_cached("ROLLBACK")?.execute([])?;
                conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
                for op in batch.iter_mut() {
                    conn.prepare_cached("SAVEPOINT op")?.execute([])?;
                    if !op.job.run(conn) {
                        conn.prepare_cached("ROLLBACK TO op")?.execute([])?;
                    }
                    conn.prepare_cached("RELEASE op")?.execute([])?;
                }
            }
            let wrote = conn.total_changes() > changes_before;
            // One statement per batch that holds a durable operation and wrote something: the
            // database's commit sequence (`store::sqlite::lineage`), noted in the sidecar once
            // the commit is on disk.
            let seq = if durable > 0 && wrote {
                conn.prepare_cached("UPDATE lineage SET seq = seq + 1 RETURNING seq")?
                    .query_row([], |r| r.get::<_, i64>(0))
                    .optional()?
            } else {
                None
            };
            let _t = stages::span(Stage::Commit);
            begun = Some(self.flush.begin(wrote, durable > 0));
            conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(seq)
        })();
        if let Some((generation, _, _)) = begun {
            self.flush.ended(generation);
        }
        if commit.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        let wrote = conn.total_changes() > changes_before;
        let (seq, mut err) = match commit {
            Ok(seq) => (seq, None),
            Err(e) => (None, Some(e)),
        };
        if err.is_none() && wrote {
            self.checkpoint_if_due();
        }
        if let Some(e) = &err
            && flush::is_fsync_error(e)
        {
            // SQLite syncs the WAL's header inside a COMMIT that restarts the WAL.
            self.flush.poison(&format!("{} (at a commit)", flush::wal_path(&self.path).display()), &e.to_string());
        }
        if let Some(p) = self.flush.poisoned() {
            err = Some(p.error());
        }
        let inner = self.inner.upgrade();
        if let Some(inner) = &inner {
            inner.commits.fetch_add(1, Ordering::Relaxed);
            if err.is_none() && wrote {
                inner.writes.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Logged when commits start failing and when one that wrote something works again,
        // not on every failure: a full disk must not turn the log into a flood (the callers
        // say what they do about it). A transaction that only read commits even then.
        match &err {
            Some(e) if *failing == 0 => tracing::error!(error = %e, "a write transaction failed to commit"),
            Some(e) => tracing::debug!(error = %e, failing, "a write transaction failed to commit again"),
            None if *failing > 0 && wrote => tracing::info!(failed = *failing, "write transactions commit again"),
            None => {}
        }
        if err.is_some() {
            *failing += 1;
        } else if wrote {
            *failing = 0;
        }
        // Operations that never ran (the batch failed before them) are answered with the
        // commit's error. Otherwise once what they may show is on disk: durable ones once their
        // commit is, ordered ones once every durable commit begun before theirs is.
        let (mut durable_jobs, mut ordered_jobs) = (Vec::new(), Vec::new());
        for op in batch {
            match (&err, op.commit) {
                (Some(_), _) => op.job.answer(err.as_ref()),
                (None, Commit::Durable) => durable_jobs.push(op.job),
                (None, Commit::Ordered) => ordered_jobs.push(op.job),
            }
        }
        // (Only a batch whose COMMIT succeeded has jobs here, and it has a generation.)
        let (need, need_ordered) = begun.map_or((0, 0), |(_, d, o)| (d, o));
        let note = |seq: i64| {
            if let Some(t) = inner.as_ref().and_then(|i| i.tracker.get()) {
                t.note(seq);
            }
        };
        self.flush.answer_when_flushed(need_ordered, None, ordered_jobs, false, note);
        self.flush.answer_when_flushed(need, seq, durable_jobs, true, note);
    }

    /// SQLite's automatic checkpoint, run here so that its errors are seen: the default WAL
    /// hook drops them (`sqlite3WalDefaultHook`), and a failed fsync in a checkpoint (of the
    /// WAL before copying, or of the database file after) must stop the store. Once the WAL
    /// holds [`open::AUTOCHECKPOINT_PAGES`] frames, a PASSIVE checkpoint, as SQLite's own. At
    /// `synchronous = NORMAL` it fsyncs the WAL before it copies anything into the database
    /// file (`walCheckpoint`), so a checkpoint never runs ahead of the flush.
    fn checkpoint_if_due(&self) {
        if i64::from(self.frames.swap(0, Ordering::Relaxed)) < open::AUTOCHECKPOINT_PAGES {
            return;
        }
        let _t = stages::span(Stage::Commit);
        if let Err(e) = self.conn.wal_checkpoint_v2(Some(rusqlite::MAIN_DB), rusqlite::wal::CheckpointMode::PASSIVE) {
            let e = StoreError::Sqlite(e);
            if flush::is_fsync_error(&e) {
                self.flush.poison(&format!("{} or its WAL (in a checkpoint)", self.path.display()), &e.to_string());
            } else {
                tracing::debug!(error = %e, "a checkpoint did not finish");
            }
        }
    }
}

#[cfg(test)]
mod tests;
