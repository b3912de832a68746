//! Pipelined group commit, its second half (SQLite): the flusher thread `fdatasync`s the WAL
//! while the writer goes on with the next batch; durable operations are answered, and readers
//! let go, only once the WAL is on disk up to what they depend on; a failed fsync stops the store.
//!
//! Who fsyncs: the flusher, while the writer runs the next batch — unless the batch was one
//! operation alone with nothing queued behind it (one task at a time, an idle engine's
//! pickup), when the writer fsyncs itself ([`Flush::sync_inline`]) rather than hand the batch
//! to the flusher and have the answer handed back: measured 1.14–1.37× on one worker, no
//! change at 16 (bench-results/2026-12-02-s8-sitting.md). Batches of several keep the pipeline.
//! Either way one fsync runs at a time (`syncing`), and everything below holds for both.
//!
//! Generations: the writer numbers its batches 1, 2, 3, …; [`Flush::begin`] is called just
//! before a batch's `COMMIT` and [`Flush::ended`] just after it returned (success or not).
//!
//! Invariants enforced here:
//! - **An answer after an fsync that started after the commit.** The flusher reads `committed`
//!   (set only after `COMMIT` returned) *before* it calls `fdatasync`, and on success raises
//!   `flushed` to that value; a durable batch waits until `flushed` reaches its generation (or,
//!   when it wrote nothing, the last batch that wrote). So its WAL frames were written to the
//!   file before the fsync that answers it began.
//! - **Nobody is told what a power loss could take back after a durable write.** An ordered
//!   operation's own writes are not waited for (as before pipelining), but its answer — which
//!   may show a durable write of an earlier batch, a dispatch that claimed a task whose submit
//!   is not on disk yet — waits, like a read, until every durable commit begun before it is.
//! - **Readers never see a durable write before it is on disk.** `durable_begun` is raised
//!   before the `COMMIT` of every batch that holds a durable operation and wrote something, so a
//!   read transaction that can see that commit started after the raise; every read waits, *after*
//!   it read and before its caller gets the result, until `flushed` reaches the `durable_begun`
//!   it then finds ([`Flush::wait_readable`]). Free when nothing is pending (one mutex, no fsync).
//!   Ordered writes stay visible at commit, as they always were.
//! - **The fd is the WAL's inode for the writer's whole life.** fsync is per inode on Linux:
//!   the flusher's own read-only fd on `tally.db-wal` covers the frames SQLite's fd wrote.
//!   SQLite never deletes or replaces the WAL while a connection holds it open (only the last
//!   connection to close, holding an exclusive lock, deletes it: `sqlite3WalClose`); restarts
//!   rewrite it from the start and `journal_size_limit` / `wal_checkpoint(TRUNCATE)` shrink it
//!   with `ftruncate`, all on the same inode (a test checks the inode after both).
//! - **A failed fsync is never retried** (PostgreSQL's lesson, "fsyncgate", 2018: after a failed
//!   fsync Linux may have dropped the dirty pages, and a second fsync then succeeds over lost
//!   data). The first failure poisons the store for good: every waiting and later operation,
//!   read or write, fails with [`StoreError::DiskFailed`], the writer commits nothing more, and
//!   the daemon stops ([`Flush::failed`]); only a restart (which recovers from what is on disk)
//!   serves again. Writeback errors on the WAL found by another fd (SQLite's checkpoint) reach
//!   the flusher's fd too (Linux ≥ 4.13 reports a writeback error once to every open file).
//! - No polling: the flusher and waiting readers sleep on condition variables; idle, the
//!   flusher thread does not wake at all.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Condvar, Mutex, OnceLock};

use tokio::sync::watch;

use super::lock;
use super::writer::Job;
use crate::store::StoreError;

/// A batch's answers waiting for the flush.
struct Waiting {
    /// How many of `jobs` are durable operations (counted as fsync waits).
    durable: usize,
    /// The generation `flushed` must reach.
    need: u64,
    /// The database's lineage `seq` after the batch (`store::sqlite::lineage`), noted in the
    /// sidecar once the batch is on disk.
    seq: Option<i64>,
    jobs: Vec<Box<dyn Job>>,
}

#[derive(Default)]
struct State {
    /// The latest batch whose `COMMIT` began.
    begun: u64,
    /// The latest batch that wrote something (`COMMIT` begun).
    last_write: u64,
    /// The latest batch with a durable operation that wrote something (`COMMIT` begun).
    durable_begun: u64,
    /// The latest batch whose `COMMIT` returned.
    committed: u64,
    /// Every batch up to this one is on disk (an fsync that started after its commit succeeded).
    flushed: u64,
    /// The highest generation someone waits for.
    wanted: u64,
    waiting: VecDeque<Waiting>,
    /// An fsync is running (the flusher's or the writer's own, [`Flush::sync_inline`]): one
    /// at a time, so neither repeats the other's.
    syncing: bool,
    stop: bool,
}

/// What failed, kept for every later answer.
#[derive(Debug, Clone)]
pub(crate) struct Poison {
    what: String,
    error: String,
}

impl Poison {
    /// The error every operation gets from now on.
    pub(crate) fn error(&self) -> StoreError {
        StoreError::DiskFailed { what: self.what.clone(), error: self.error.clone() }
    }
}

/// The flush horizon shared by the writer, the flusher thread and the readers.
pub(super) struct Flush {
    /// Pipelined (`durability = "full"`): durable answers and reads wait for the flusher.
    /// Otherwise (`normal`) nothing waits and there is no flusher thread.
    pipelined: bool,
    state: Mutex<State>,
    /// Wakes the flusher: something is wanted that is not flushed, or stop.
    work: Condvar,
    /// Wakes readers waiting for `flushed`.
    done: Condvar,
    /// Set once, by the first failed fsync; never cleared.
    poison: OnceLock<Poison>,
    /// The poison's message, for the daemon (`SqliteStore::failed`).
    failed: watch::Sender<Option<String>>,
    #[cfg(test)]
    fail_next: std::sync::atomic::AtomicBool,
    /// Unit tests: the writer never fsyncs itself (to script the flusher's pipelining).
    #[cfg(test)]
    inline_off: std::sync::atomic::AtomicBool,
    /// Unit tests: hold each fsync until released (the name of the thread that runs it is sent
    /// first).
    #[cfg(test)]
    gate: Mutex<Option<(std::sync::mpsc::Sender<String>, std::sync::mpsc::Receiver<()>)>>,
}

impl Flush {
    pub(super) fn new(pipelined: bool) -> Flush {
        Flush {
            pipelined,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            done: Condvar::new(),
            poison: OnceLock::new(),
            failed: watch::channel(None).0,
            #[cfg(test)]
            fail_next: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            inline_off: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            gate: Mutex::new(None),
        }
    }

    /// The poison, once an fsync failed.
    pub(super) fn poisoned(&self) -> Option<&Poison> {
        self.poison.get()
    }

    /// Resolves with the reason once an fsync failed; never otherwise.
    pub(super) async fn failed(&self) -> String {
        let mut rx = self.failed.subscribe();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return why;
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Stop the store for good: an fsync of `what` failed with `error`. Logged once; every
    /// durable batch still waiting is answered with the error; readers waiting are woken.
    pub(super) fn poison(&self, what: &str, error: &str) {
        let p = Poison { what: what.into(), error: error.into() };
        if self.poison.set(p).is_err() {
            return;
        }
        let e = self.poison.get().map(Poison::error).unwrap_or(StoreError::Closed);
        tracing::error!(error = %e, "a failed fsync stopped the store");
        self.failed.send_replace(Some(e.to_string()));
        let waiting: Vec<Waiting> = lock(&self.state).waiting.drain(..).collect();
        for w in waiting {
            for job in w.jobs {
                job.answer(Some(&e));
            }
        }
        self.done.notify_all();
        self.work.notify_all();
    }

    /// The writer is about to `COMMIT` a batch: number it. `wrote`: it changed rows;
    /// `durable`: it holds a durable operation. Returns the batch's generation, the one its
    /// durable answers need flushed (the last batch that wrote, itself included) and the one
    /// its ordered answers need flushed (the last durable batch that wrote, itself included).
    pub(super) fn begin(&self, wrote: bool, durable: bool) -> (u64, u64, u64) {
        let mut s = lock(&self.state);
        s.begun += 1;
        let generation = s.begun;
        if wrote {
            s.last_write = generation;
            if durable {
                s.durable_begun = generation;
            }
        }
        (generation, s.last_write, s.durable_begun)
    }

    /// The `COMMIT` of batch `generation` returned (whether it succeeded or not).
    pub(super) fn ended(&self, generation: u64) {
        let mut s = lock(&self.state);
        s.committed = generation;
        if s.wanted > s.flushed {
            self.work.notify_one();
        }
    }

    /// Answer a committed batch's operations once `need` is on disk (at once when it is
    /// already, or when nothing is pipelined; `note` is then given `seq`, else the flusher
    /// notes it). `durable`: they are durable operations (counted as fsync waits).
    pub(super) fn answer_when_flushed(
        &self,
        need: u64,
        seq: Option<i64>,
        jobs: Vec<Box<dyn Job>>,
        durable: bool,
        note: impl Fn(i64),
    ) {
        if jobs.is_empty() && seq.is_none() {
            return;
        }
        let jobs = {
            let mut s = lock(&self.state);
            // Checked under the lock, so that a poisoning drains this batch if it is queued.
            if let Some(p) = self.poisoned() {
                drop(s);
                let e = p.error();
                for job in jobs {
                    job.answer(Some(&e));
                }
                return;
            }
            if self.pipelined && need > s.flushed {
                s.wanted = s.wanted.max(need);
                let durable = if durable { jobs.len() } else { 0 };
                // The writer then fsyncs itself or hands the batch to the flusher
                // (`sync_inline`, `hand_off`).
                s.waiting.push_back(Waiting { durable, need, seq, jobs });
                return;
            }
            jobs
        };
        if let Some(seq) = seq {
            note(seq);
        }
        for job in jobs {
            job.answer(None);
        }
    }

    /// A reader read: wait until every durable write it could have seen is on disk (see the
    /// module's invariants). Fails once the store is poisoned.
    pub(super) fn wait_readable(&self) -> Result<(), StoreError> {
        if let Some(p) = self.poisoned() {
            return Err(p.error());
        }
        if !self.pipelined {
            return Ok(());
        }
        let mut s = lock(&self.state);
        let target = s.durable_begun;
        if s.flushed >= target {
            return Ok(());
        }
        s.wanted = s.wanted.max(target);
        self.work.notify_one();
        while s.flushed < target {
            if let Some(p) = self.poisoned() {
                return Err(p.error());
            }
            s = self.done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    /// `fdatasync` of the WAL (`fsync-fails`: a failpoint that makes it fail with EIO).
    fn sync_wal(&self, wal: &File) -> std::io::Result<()> {
        let _t = crate::stages::span(crate::stages::Stage::WalFsync);
        #[cfg(feature = "failpoints")]
        fail::fail_point!("fsync-fails", |_| Err(std::io::Error::from_raw_os_error(libc::EIO)));
        #[cfg(test)]
        if let Some((entered, release)) = &*lock(&self.gate) {
            let _ = entered.send(std::thread::current().name().unwrap_or_default().to_string());
            let _ = release.recv();
        }
        #[cfg(test)]
        if self.fail_next.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        wal.sync_data()
    }

    /// Unit tests: make the flusher's next fsync fail.
    #[cfg(test)]
    pub(super) fn fail_next_fsync(&self) {
        self.fail_next.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Unit tests: from now on every fsync is the flusher's.
    #[cfg(test)]
    pub(super) fn no_inline_fsyncs(&self) {
        self.inline_off.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Unit tests: hold every later fsync at its start; the first receiver gets the name of
    /// the thread that runs it when one starts, and each message on the second lets one go
    /// (dropping it lets all go).
    #[cfg(test)]
    pub(super) fn hold_fsyncs(&self) -> (std::sync::mpsc::Receiver<String>, std::sync::mpsc::Sender<()>) {
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        *lock(&self.gate) = Some((entered_tx, release_rx));
        (entered, release)
    }

    /// The writer stops: the flusher flushes what is still wanted, then ends.
    pub(super) fn stop(&self) {
        lock(&self.state).stop = true;
        self.work.notify_all();
    }

    /// The flusher thread: wait until something committed is wanted on disk and no fsync is
    /// running, fdatasync the WAL, answer who waited for it. Ends after the writer stopped
    /// (having flushed what was wanted), or at the first failed fsync. `after` is told each
    /// flush's lineage `seq` and how many durable operations it answered.
    pub(super) fn run(&self, wal: File, what: &str, after: impl Fn(Option<i64>, usize)) {
        loop {
            let target = {
                let mut s = lock(&self.state);
                loop {
                    if self.poison.get().is_some() {
                        return;
                    }
                    if !s.syncing && s.wanted > s.flushed && s.committed > s.flushed {
                        s.syncing = true;
                        break s.committed;
                    }
                    if s.stop && !s.syncing {
                        return;
                    }
                    s = self.work.wait(s).unwrap_or_else(|e| e.into_inner());
                }
            };
            if !self.sync_to(&wal, target, what, &after) {
                return;
            }
        }
    }

    /// The writer goes on with its next batch: wake the flusher for what waits for the disk.
    pub(super) fn hand_off(&self) {
        let s = lock(&self.state);
        if s.wanted > s.flushed {
            self.work.notify_one();
        }
    }

    /// The writer's own fsync, after a batch of one operation with nothing queued behind it
    /// (the writer decides that), when that batch waits for the disk. Saves the two thread
    /// hand-offs (to the flusher and back) that a lone task would otherwise pay per durable
    /// commit; batches of several are handed to the flusher ([`Flush::hand_off`]) while the
    /// writer runs the next one. Nothing happens when an fsync is already running (it or the
    /// next one answers the batch).
    pub(super) fn sync_inline(&self, wal: &File, what: &str, after: impl Fn(Option<i64>, usize)) {
        #[cfg(test)]
        if self.inline_off.load(std::sync::atomic::Ordering::SeqCst) {
            return self.hand_off();
        }
        let target = {
            let mut s = lock(&self.state);
            if self.poison.get().is_some() || s.syncing || s.wanted <= s.flushed || s.committed <= s.flushed {
                return;
            }
            s.syncing = true;
            s.committed
        };
        self.sync_to(wal, target, what, &after);
    }

    /// One fsync of the WAL covering every batch committed up to `target` (the caller set
    /// `syncing`), then answer who waited for it. False once the store is poisoned.
    fn sync_to(&self, wal: &File, target: u64, what: &str, after: &impl Fn(Option<i64>, usize)) -> bool {
        let synced = self.sync_wal(wal);
        let (ready, seq) = {
            let mut s = lock(&self.state);
            s.syncing = false;
            if let Err(e) = synced {
                drop(s);
                // Never retried: see the module's invariants.
                self.poison(what, &e.to_string());
                return false;
            }
            s.flushed = s.flushed.max(target);
            let mut ready = Vec::new();
            let mut seq = None;
            while s.waiting.front().is_some_and(|w| w.need <= target) {
                if let Some(w) = s.waiting.pop_front() {
                    seq = seq.max(w.seq);
                    ready.push(w);
                }
            }
            (ready, seq)
        };
        self.done.notify_all();
        // The other syncer may have been waiting for this one to end.
        self.work.notify_one();
        let answered = ready.iter().map(|w| w.durable).sum();
        after(seq, answered);
        for w in ready {
            for job in w.jobs {
                job.answer(None);
            }
        }
        true
    }
}

/// The flusher finished an fsync that answered `answered` durable operations: count it, and
/// note the lineage `seq` now on disk in the sidecar (`store::sqlite::lineage`).
pub(super) fn flushed(inner: &std::sync::Weak<super::Inner>, seq: Option<i64>, answered: usize) {
    if let Some(inner) = inner.upgrade() {
        inner.fsyncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        inner.durable_waits.fetch_add(answered as u64, std::sync::atomic::Ordering::Relaxed);
        if let (Some(seq), Some(t)) = (seq, inner.tracker.get()) {
            t.note(seq);
        }
    }
}

/// The WAL file beside the database `db` (`tally.db` → `tally.db-wal`).
pub(super) fn wal_path(db: &std::path::Path) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    std::path::PathBuf::from(name)
}

/// Whether a SQLite error is a failed fsync (of the WAL header at a restart, or in a
/// checkpoint): the store must stop as for the flusher's own.
pub(super) fn is_fsync_error(e: &StoreError) -> bool {
    use rusqlite::ffi::{SQLITE_IOERR_DIR_FSYNC, SQLITE_IOERR_FSYNC};
    matches!(e, StoreError::Sqlite(rusqlite::Error::SqliteFailure(f, _))
        if f.extended_code == SQLITE_IOERR_FSYNC || f.extended_code == SQLITE_IOERR_DIR_FSYNC)
}
