//! The SQLite writer thread: it takes every operation waiting, runs them in one transaction,
//! commits once, and answers each (durable ones once their commit is on disk, fsynced by the
//! flusher or, for a lone operation, by itself: `store::sqlite::flush`); it also runs the
//! checkpoints. The invariants it keeps are stated in `store::sqlite` (one writer, group commit,
//! savepoints only after a failure, the checkpoint policy).

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;

use rusqlite::{Connection, OptionalExtension};
use tokio::sync::oneshot;

use super::{Inner, flush, open};
use crate::stages::{self, Stage};
use crate::store::{Commit, StoreError};

/// At most this many operations share one commit.
const MAX_BATCH: usize = 256;
/// At most about this many bytes of images share one commit (an operation larger than this
/// commits alone): a burst of large images reaches the WAL in bounded commits.
const MAX_BATCH_BYTES: usize = 32 << 20;

/// The work of an operation: run on the write connection (possibly twice: see the writer's
/// batches), keeping its latest result, and answered once the batch's commit finished.
pub(super) trait Job: Send {
    /// Run (again) on the write connection; true if the operation succeeded.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answer the caller: the latest result, or `Some(error)` if the commit failed.
    fn answer(self: Box<Self>, commit_error: Option<&StoreError>);
}

pub(super) struct JobOf<R, F> {
    pub(super) f: F,
    pub(super) result: Option<Result<R, StoreError>>,
    pub(super) tx: oneshot::Sender<Result<R, StoreError>>,
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
pub(super) struct Op {
    pub(super) commit: Commit,
    /// When it was sent, while stages are timed (`tally bench --profile`).
    pub(super) queued: Option<std::time::Instant>,
    /// Image bytes the operation writes (for [`MAX_BATCH_BYTES`]).
    pub(super) weight: usize,
    pub(super) job: Box<dyn Job>,
}

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) conn: Connection,
    /// Frames in the WAL after the last commit that wrote (SQLite's WAL hook); swapped to 0
    /// when read.
    pub(super) frames: Arc<AtomicI32>,
    pub(super) inner: std::sync::Weak<Inner>,
    pub(super) flush: Arc<flush::Flush>,
    pub(super) flusher: Option<thread::JoinHandle<()>>,
    /// The WAL and its name (for a failed fsync's message), for the fsyncs the writer runs
    /// itself after a lone operation with nothing queued behind it (`full` only).
    pub(super) wal: Option<(std::fs::File, String)>,
    pub(super) path: PathBuf,
}

impl Writer {
    /// Take every operation waiting, run them in one transaction, commit, answer (durable
    /// operations once the flusher says their commit is on disk). Ends when every sender is
    /// gone, after the flusher flushed what was still wanted.
    pub(super) fn run(mut self, rx: mpsc::Receiver<Op>) {
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
            // A lone operation with nothing behind it: fsync here rather than wake the flusher
            // and wait for it.
            if let Some((wal, what)) = &self.wal {
                if carried.is_none() {
                    carried = rx.try_recv().ok();
                }
                if carried.is_some() || !lone {
                    self.flush.hand_off();
                } else {
                    let inner = &self.inner;
                    self.flush.sync_inline(wal, what, |seq, answered| flush::flushed(inner, seq, answered));
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
        let _t = stages::span(Stage::Checkpoint);
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
