//! Checkpoints off the writer thread: a checkpointer thread with a connection of its own copies
//! the WAL into the database file while the writer goes on committing; the writer checkpoints
//! itself only past a hard limit.
//!
//! How it runs:
//! - A WAL hook on the write connection (it replaces SQLite's automatic checkpoint) learns the
//!   WAL's size in pages after every commit. Past [`SOFT_PAGES`] it wakes the checkpointer
//!   (a condition variable: no polling), which runs a PASSIVE checkpoint on its own
//!   connection — on the second CPU, while the writer runs the next batch.
//! - After a batch is committed and answered, if the WAL holds [`HARD_PAGES`] or more, the
//!   writer runs a PASSIVE checkpoint itself, first waiting for one the checkpointer may be
//!   running (SQLite answers a second concurrent checkpoint with `SQLITE_BUSY` at once, so the
//!   two take turns through [`Shared::turn`]).
//!
//! Invariants enforced here:
//! - **The WAL is bounded whatever the checkpointer does.** After any commit that leaves the
//!   WAL at [`HARD_PAGES`] or more, the writer checkpoints before its next batch, so the WAL
//!   restarts from its beginning at that next batch: it never holds more than
//!   `HARD_PAGES - 1` pages plus one batch (at most about 32 MiB of images, `MAX_BATCH_BYTES`),
//!   even if the checkpointer is stopped, paused or could not open its connection. The
//!   condition, as before this module: no reader holds one snapshot across it (downloads read
//!   one chunk per read transaction; `tally backup` is the exception for its length).
//!   Tested in `a_stopped_checkpointer_cannot_let_the_wal_pass_the_hard_limit`.
//! - **Nothing durable depends on the checkpointer.** A commit is durable by the writer's own
//!   WAL write (and fsync, `synchronous = FULL`) before anyone is answered; a checkpoint only
//!   copies committed frames into the database file. The checkpointer's connection runs with
//!   `synchronous = FULL` (set and read back), so SQLite fsyncs the WAL before it copies
//!   frames into the database and the database before it lets the WAL be reused — the same
//!   order as the automatic checkpoint it replaces. If the checkpointer fails or dies, the
//!   writer's hard-limit checkpoints do its work.
//! - A WAL hook never fails the commit that called it (it only stores a number and notifies):
//!   SQLite would report the commit as failed although it happened.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use rusqlite::Connection;
use rusqlite::wal::CheckpointMode;

use crate::stages::{self, Stage};
use crate::store::StoreError;

/// Past this many WAL pages (SQLite's default automatic checkpoint, about 4 MiB of 4 KiB pages)
/// a commit wakes the checkpointer.
pub const SOFT_PAGES: i64 = 1000;

/// At or past this many WAL pages (16 MiB of 4 KiB pages) after a commit, the writer
/// checkpoints itself before its next batch (see the module docs for the bound this gives).
pub const HARD_PAGES: i64 = 4096;

/// What the writer, its WAL hook and the checkpointer thread share.
#[derive(Default)]
pub(crate) struct Shared {
    /// The WAL's size in pages after the writer's last commit (from the WAL hook).
    wal_pages: AtomicI64,
    /// Whether the checkpointer has work (set by the hook) and whether it must stop.
    wake: Mutex<Wake>,
    bell: Condvar,
    /// Held while either connection runs a checkpoint.
    turn: Mutex<()>,
    /// Checkpoints the checkpointer ran, and the ones the writer ran itself.
    background: AtomicU64,
    forced: AtomicU64,
    /// The checkpointer does nothing while set (tests: a checkpointer that fell behind).
    paused: AtomicBool,
}

#[derive(Default)]
struct Wake {
    work: bool,
    stop: bool,
}

impl Shared {
    /// Checkpoints run so far: (by the checkpointer, by the writer past the hard limit).
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.background.load(Ordering::Relaxed), self.forced.load(Ordering::Relaxed))
    }

    /// Hold (or let go of) the checkpointer: while held it answers wake-ups with nothing.
    pub(crate) fn pause(&self, on: bool) {
        self.paused.store(on, Ordering::Relaxed);
    }

    fn ring(&self, stop: bool) {
        let mut w = lock(&self.wake);
        if stop {
            w.stop = true;
        } else {
            w.work = true;
        }
        self.bell.notify_one();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The checkpointer thread. Dropping it stops the thread and waits for it (a checkpoint it is
/// running finishes first).
pub(crate) struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<thread::JoinHandle<()>>,
    /// The writer's checkpoints that failed in a row (logged when they start failing, so a
    /// full disk does not flood the log).
    failing: std::cell::Cell<u64>,
}

impl Checkpointer {
    /// Install the WAL hook on the write connection and start the checkpointer thread for the
    /// database at `path`. Its connection is opened on the thread; if that fails, it logs why
    /// and ends, and the writer's hard-limit checkpoints keep the WAL bounded.
    pub(crate) fn start(writer: &mut Connection, path: &Path, shared: Arc<Shared>) -> Result<Self, StoreError> {
        let hook = shared.clone();
        writer.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
            let pages = i64::from(pages);
            hook.wal_pages.store(pages, Ordering::Relaxed);
            if pages >= SOFT_PAGES {
                hook.ring(false);
            }
            Ok(())
        }))?;
        let (s, p): (Arc<Shared>, PathBuf) = (shared.clone(), path.to_path_buf());
        let thread = thread::Builder::new()
            .name("tally-checkpointer".into())
            .spawn(move || run(&p, &s))
            .map_err(|e| StoreError::Fatal(format!("cannot start the checkpointer thread: {e}")))?;
        Ok(Checkpointer { shared, thread: Some(thread), failing: std::cell::Cell::new(0) })
    }

    /// After a batch was committed and answered: if the WAL reached [`HARD_PAGES`], checkpoint
    /// on the writer's connection (after any checkpoint the checkpointer is running), so that
    /// the next batch starts the WAL over. An error is logged, not returned: the commit
    /// already happened, and the next batch tries again.
    pub(crate) fn after_batch(&self, writer: &Connection) {
        if self.shared.wal_pages.load(Ordering::Relaxed) < HARD_PAGES {
            return;
        }
        let _t = stages::span(Stage::Checkpoint);
        let _turn = lock(&self.shared.turn);
        match writer.wal_checkpoint_v2(Some(rusqlite::MAIN_DB), CheckpointMode::PASSIVE) {
            Ok((log, done)) => {
                self.shared.forced.fetch_add(1, Ordering::Relaxed);
                self.failing.set(0);
                tracing::debug!(log, done, "the writer checkpointed the WAL past its hard limit");
            }
            Err(e) => {
                if self.failing.get() == 0 {
                    tracing::warn!(error = %e, "the writer's checkpoint past the WAL's hard limit failed");
                }
                self.failing.set(self.failing.get() + 1);
            }
        }
        // Until the next commit says otherwise.
        self.shared.wal_pages.store(0, Ordering::Relaxed);
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.ring(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The checkpointer's connection: read-write (a checkpoint writes the database file),
/// `synchronous = FULL` so that a checkpoint fsyncs the WAL before copying and the database
/// before the WAL is reused.
fn open(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    let got: i64 = conn.pragma_query_value(None, "synchronous", |r| r.get(0))?;
    if got != 2 {
        return Err(StoreError::Pragma { pragma: "synchronous", wanted: "2".into(), got: got.to_string() });
    }
    Ok(conn)
}

/// The checkpointer thread's loop: wait for a wake-up, run one PASSIVE checkpoint, repeat,
/// until stopped.
fn run(path: &Path, shared: &Shared) {
    let conn = match open(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot open the checkpointer's connection; the writer checkpoints alone");
            return;
        }
    };
    // Checkpoints that failed in a row (logged once when they start failing, as the writer does).
    let mut failing = 0u64;
    loop {
        {
            let mut w = lock(&shared.wake);
            while !w.work && !w.stop {
                w = shared.bell.wait(w).unwrap_or_else(|e| e.into_inner());
            }
            if w.stop {
                break;
            }
            w.work = false;
        }
        if shared.paused.load(Ordering::Relaxed) {
            continue;
        }
        let turn = lock(&shared.turn);
        let result = conn.wal_checkpoint_v2(Some(rusqlite::MAIN_DB), CheckpointMode::PASSIVE);
        drop(turn);
        match result {
            Ok(_) => {
                shared.background.fetch_add(1, Ordering::Relaxed);
                if failing > 0 {
                    tracing::info!(failed = failing, "checkpoints work again");
                }
                failing = 0;
            }
            Err(e) => {
                if failing == 0 {
                    tracing::warn!(error = %e, "a background checkpoint failed; the writer checkpoints past the hard limit");
                }
                failing += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Durability;
    use crate::store::sqlite::SqliteStore;

    const FRAME: u64 = 24 + 4096;

    fn store() -> (SqliteStore, PathBuf) {
        let dir = std::env::temp_dir().join(format!("tally-ckpt-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("tally.db"), Durability::Full).expect("open");
        (store, dir)
    }

    fn wal_bytes(dir: &Path) -> u64 {
        std::fs::metadata(dir.join("tally.db-wal")).map(|m| m.len()).unwrap_or(0)
    }

    /// One write of about 1 MiB (256 pages), committed alone.
    async fn write_mib(store: &SqliteStore, i: i64) {
        store
            .write(move |c| Ok(c.execute("INSERT INTO t (i, b) VALUES (?1, randomblob(1 << 20))", [i])?))
            .await
            .expect("write");
    }

    /// A paused checkpointer (one that fell behind, or died) cannot let the WAL grow past the
    /// hard limit plus one batch: the writer checkpoints itself. Without the writer's
    /// checkpoint the WAL here would reach 60 MiB.
    #[tokio::test]
    async fn a_stopped_checkpointer_cannot_let_the_wal_pass_the_hard_limit() {
        let (store, dir) = store();
        store.write(|c| Ok(c.execute_batch("CREATE TABLE t (i INTEGER, b BLOB)")?)).await.expect("table");
        store.checkpoints().pause(true);
        // One batch here: one 1 MiB row, its overflow pages and the b-tree pages it touches.
        let batch_pages = 300;
        let bound = 32 + (HARD_PAGES as u64 - 1 + batch_pages) * FRAME;
        let mut peak = 0;
        for i in 0..60 {
            write_mib(&store, i).await;
            peak = peak.max(wal_bytes(&dir));
            assert!(peak <= bound, "WAL {peak} bytes after write {i}, bound {bound}");
        }
        let (background, forced) = store.checkpoints().counts();
        assert_eq!(background, 0, "the paused checkpointer ran no checkpoint");
        assert!(forced >= 3, "the writer checkpointed itself at the hard limit ({forced} times)");
        assert!(
            peak >= (HARD_PAGES as u64 - 1) * FRAME / 2,
            "the WAL did grow (peak {peak}): the test measured something"
        );
        store.close().expect("close");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// With the checkpointer running, the commits that pass the soft limit wake it and it
    /// checkpoints on its own connection; every row is still there after a clean stop.
    #[tokio::test]
    async fn the_checkpointer_checkpoints_off_the_writer() {
        let (store, dir) = store();
        store.write(|c| Ok(c.execute_batch("CREATE TABLE t (i INTEGER, b BLOB)")?)).await.expect("table");
        for i in 0..12 {
            write_mib(&store, i).await;
        }
        // It was woken (the WAL passed the soft limit after ~4 writes); wait for its checkpoint
        // to be counted, by condition, with a generous deadline.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while store.checkpoints().counts().0 == 0 {
            assert!(std::time::Instant::now() < deadline, "the checkpointer never checkpointed");
            write_mib(&store, 100).await;
        }
        let n: i64 = store.read(|c| Ok(c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?)).await.expect("count");
        assert!(n >= 12);
        store.close().expect("close");
        assert_eq!(wal_bytes(&dir), 0, "a clean stop still leaves an empty WAL");
        let _ = std::fs::remove_dir_all(dir);
    }
}
