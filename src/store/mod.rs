//! The store: every SQL statement of tally lives below this module.
//!
//! Invariants enforced here:
//! - **One writer.** Only the writer thread holds a write connection. Callers send it
//!   operations; it groups all operations waiting at that moment into one transaction (group
//!   commit), runs each inside its own savepoint (one alone needs none), commits once, and only
//!   then answers each caller. An operation that fails rolls back its own savepoint and nothing
//!   else.
//! - **Pragmas are set and then read back**, and opening fails if SQLite did not take them.
//! - **No transaction spans a network call**: operations are synchronous closures run on the
//!   writer thread; they cannot await anything.
//! - Readers use their own connections and never write.

mod open;
mod ops;
mod read;
mod sets;

pub use open::{SCHEMA_VERSION, StoreError, backup, check};
pub use ops::*;
pub use read::*;
pub use sets::*;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::config::Durability;

/// At most this many operations share one commit.
const MAX_BATCH: usize = 256;

/// A reply to send once the batch's commit finished; `Some(error)` if the commit failed.
type Reply = Box<dyn FnOnce(Option<&StoreError>) + Send>;
/// An operation for the writer: runs on the write connection inside a savepoint and says
/// whether it succeeded (so its savepoint is kept) plus how to answer its caller.
type Op = Box<dyn FnOnce(&Connection) -> (bool, Reply) + Send>;

/// A handle to tally's database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<Op>>>,
    writer_thread: Mutex<Option<thread::JoinHandle<()>>>,
    readers: Mutex<Vec<Connection>>,
    statements: Arc<AtomicU64>,
    commits: AtomicU64,
}

impl Store {
    /// Open (creating or migrating) the database at `path` and start the writer thread.
    pub fn open(path: &Path, durability: Durability) -> Result<Store, StoreError> {
        let statements = Arc::new(AtomicU64::new(0));
        let mut conn = open::open_write(path, durability)?;
        open::count_statements(&mut conn, statements.clone())?;
        let (tx, rx) = mpsc::channel::<Op>();
        let inner = Arc::new(Inner {
            path: path.to_path_buf(),
            writer: Mutex::new(Some(tx)),
            writer_thread: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
            statements,
            commits: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&inner);
        let handle = thread::Builder::new()
            .name("tally-writer".into())
            .spawn(move || writer_loop(conn, rx, weak))
            .map_err(|e| StoreError::Fatal(format!("cannot start the writer thread: {e}")))?;
        *lock(&inner.writer_thread) = Some(handle);
        Ok(Store { inner })
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

    /// Run a write operation on the writer thread, grouped with whatever else is waiting,
    /// and return its result once its transaction is durably committed.
    pub async fn write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let op: Op = Box::new(move |conn| {
            let result = f(conn);
            let ok = result.is_ok();
            let reply: Reply = Box::new(move |commit_error| {
                let _ = tx.send(match commit_error {
                    None => result,
                    Some(e) => Err(StoreError::Commit(e.to_string())),
                });
            });
            (ok, reply)
        });
        let sender = lock(&self.inner.writer).clone().ok_or(StoreError::Closed)?;
        sender.send(op).map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
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

    /// Run a read on the current thread (for CLI tools and tests outside a runtime).
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
        let mut pool = lock(&self.inner.readers);
        if pool.len() < 8 {
            pool.push(conn);
        }
        result
    }

    /// Stop the writer after the operations already sent, checkpoint the WAL into the
    /// database file and truncate it, so the file alone is a complete copy.
    pub fn close(&self) -> Result<(), StoreError> {
        lock(&self.inner.writer).take();
        if let Some(h) = lock(&self.inner.writer_thread).take() {
            let _ = h.join();
        }
        lock(&self.inner.readers).clear();
        open::checkpoint_truncate(&self.inner.path)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The writer thread: take every operation waiting, run them in one transaction, commit,
/// answer. Ends when every sender is gone.
fn writer_loop(conn: Connection, rx: mpsc::Receiver<Op>, inner: std::sync::Weak<Inner>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let mut replies = Vec::with_capacity(batch.len());
        let commit = (|| -> Result<(), StoreError> {
            conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
            // One operation alone needs no savepoint: if it fails, the whole transaction
            // is rolled back below instead.
            let alone = batch.len() == 1;
            let mut failed_alone = false;
            for op in batch.drain(..) {
                if !alone {
                    conn.prepare_cached("SAVEPOINT op")?.execute([])?;
                }
                let (ok, reply) = op(&conn);
                replies.push(reply);
                if alone {
                    failed_alone = !ok;
                } else if ok {
                    conn.prepare_cached("RELEASE op")?.execute([])?;
                } else {
                    conn.prepare_cached("ROLLBACK TO op")?.execute([])?;
                    conn.prepare_cached("RELEASE op")?.execute([])?;
                }
            }
            if failed_alone {
                conn.prepare_cached("ROLLBACK")?.execute([])?;
            } else {
                conn.prepare_cached("COMMIT")?.execute([])?;
            }
            Ok(())
        })();
        if commit.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        // Operations that never ran (the batch failed before them) are answered by dropping
        // their closures: their callers see `Closed`-like errors through the dropped sender.
        drop(batch);
        if let Some(inner) = inner.upgrade() {
            inner.commits.fetch_add(1, Ordering::Relaxed);
        }
        let err = commit.err();
        if let Some(e) = &err {
            tracing::error!(error = %e, "a write transaction failed to commit");
        }
        for reply in replies {
            reply(err.as_ref());
        }
    }
    drop(conn);
}
