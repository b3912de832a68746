//! Per-stage timings of a task's path, for `tally bench --profile` (issue #28): where a task's
//! microseconds go — the store calls as the engine sees them (submit, dispatch, `calling`,
//! finish), the provider call, the image check, and below them the hand-off to the store's
//! thread, the operation's own run, SQL statements, the commit, lock statements and the
//! image blob's insert.
//!
//! **Off, it costs one relaxed atomic load per instrumented point** and reads no clock:
//! [`span`] returns an inert guard unless [`enable`] was called (only `tally bench
//! --profile` calls it). The timings are process-wide sums (`tally bench` runs its engines
//! in-process and reads them per run with [`reset`] and [`snapshot`]). Stages nest — SQL runs
//! inside an operation's run, which runs inside a store call — so the rows of a profile are
//! not to be added up; [`Stage::parent`] says what contains what.
//!
//! Imports nothing of the crate: the store, the engine and the bench all use it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

/// A stage of a task's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The engine's submit call (`Engine::submit`/`submit_and_get`), whole: the client's wait.
    Submit,
    /// The dispatcher's `Store::dispatch_due` call, whole.
    Dispatch,
    /// The worker's `Store::record_calling` call, whole.
    Calling,
    /// The provider call (`Provider::submit`), whole.
    ProviderCall,
    /// Checking the image: its type and sha256, off the writer (`NewImage::verify_async`).
    VerifyImage,
    /// The worker's `Store::finish` call, whole (the image's bytes commit with it).
    Finish,
    /// A write operation waiting for the store's thread: from being sent to starting to run
    /// (the hand-off from tokio, and the wait behind other operations and batches).
    StoreQueue,
    /// A write operation running on the store's thread (its statements and its Rust).
    StoreRun,
    /// A commit (SQLite: one per group-commit batch, the fsync included when the batch is
    /// durable; PostgreSQL: one per operation).
    Commit,
    /// One SQL statement, executed and its rows read (both backends, writer and readers).
    Sql,
    /// A statement that takes explicit row locks before deciding (PostgreSQL: the
    /// dispatch's provider lock, the task's envelope lock); the wait for a lock is inside.
    LockStatement,
    /// The image blob's insert (its bytes into `blobs`).
    BlobWrite,
    /// SQLite: a PASSIVE checkpoint the writer runs after a commit left the WAL past its
    /// threshold (the writer takes no batch meanwhile).
    Checkpoint,
    /// SQLite, `durability = "full"`: an `fdatasync` of the WAL, by the flusher (beside the
    /// writer) or by the writer itself after a lone operation (`store::sqlite::flush`).
    WalFsync,
}

impl Stage {
    /// Every stage, in the order a profile lists them.
    pub const ALL: [Stage; 14] = [
        Stage::Submit,
        Stage::Dispatch,
        Stage::Calling,
        Stage::ProviderCall,
        Stage::VerifyImage,
        Stage::Finish,
        Stage::StoreQueue,
        Stage::StoreRun,
        Stage::Commit,
        Stage::Sql,
        Stage::LockStatement,
        Stage::BlobWrite,
        Stage::Checkpoint,
        Stage::WalFsync,
    ];

    /// The stage's name in a profile.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Submit => "submit call",
            Stage::Dispatch => "dispatch call",
            Stage::Calling => "calling call",
            Stage::ProviderCall => "provider call",
            Stage::VerifyImage => "image check (type, sha256)",
            Stage::Finish => "finish call",
            Stage::StoreQueue => "store: wait for its thread",
            Stage::StoreRun => "store: operation run",
            Stage::Commit => "store: commit",
            Stage::Sql => "SQL statements",
            Stage::LockStatement => "lock statements",
            Stage::BlobWrite => "image blob insert",
            Stage::Checkpoint => "store: checkpoint (writer)",
            Stage::WalFsync => "store: WAL fsync (flusher or writer)",
        }
    }

    /// What this stage runs inside (`None`: a top-level stage of the task's path).
    pub fn parent(self) -> Option<&'static str> {
        match self {
            Stage::StoreQueue | Stage::StoreRun | Stage::Commit | Stage::Checkpoint | Stage::WalFsync => {
                Some("the store calls")
            }
            Stage::Sql | Stage::BlobWrite => Some(Stage::StoreRun.name()),
            Stage::LockStatement => Some(Stage::Sql.name()),
            _ => None,
        }
    }
}

const N: usize = Stage::ALL.len();

static ON: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static COUNTS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];

/// Whether stages are being timed.
#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Start (or stop) timing stages, process-wide.
pub fn enable(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Forget every timing so far.
pub fn reset() {
    for i in 0..N {
        NANOS[i].store(0, Ordering::Relaxed);
        COUNTS[i].store(0, Ordering::Relaxed);
    }
}

/// The time now, when stages are being timed (`None` otherwise: no clock read).
#[inline]
pub fn start() -> Option<Instant> {
    if enabled() { Some(Instant::now()) } else { None }
}

/// Add the time since `since` (from [`start`]) to `stage`.
#[inline]
pub fn record(stage: Stage, since: Option<Instant>) {
    if let Some(t) = since {
        add(stage, t.elapsed().as_nanos() as u64);
    }
}

/// Add `nanos` to `stage`, one occurrence.
pub fn add(stage: Stage, nanos: u64) {
    let i = stage as usize;
    NANOS[i].fetch_add(nanos, Ordering::Relaxed);
    COUNTS[i].fetch_add(1, Ordering::Relaxed);
}

/// A timed stage: records its length when dropped (nothing when stages are not timed).
#[must_use = "the stage is timed until this guard is dropped"]
pub struct Span(Stage, Option<Instant>);

impl Drop for Span {
    fn drop(&mut self) {
        record(self.0, self.1);
    }
}

/// Time `stage` until the returned guard is dropped.
#[inline]
pub fn span(stage: Stage) -> Span {
    Span(stage, start())
}

/// One stage's sums.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StageTime {
    /// [`Stage::name`].
    pub stage: &'static str,
    /// The stage this one runs inside (its name), if any.
    pub within: Option<&'static str>,
    /// How many times it ran.
    pub count: u64,
    /// Its total time, in microseconds.
    pub total_us: f64,
}

/// Every stage's sums since the last [`reset`].
pub fn snapshot() -> Vec<StageTime> {
    Stage::ALL
        .iter()
        .map(|&s| StageTime {
            stage: s.name(),
            within: s.parent(),
            count: COUNTS[s as usize].load(Ordering::Relaxed),
            total_us: NANOS[s as usize].load(Ordering::Relaxed) as f64 / 1000.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off, a span records nothing; on, it records its occurrence and a length at least as long
    /// as the time it was held. (Other tests of this binary may time stages at the same time
    /// only if they enable it, which none does; the counts are compared as growth.)
    #[test]
    fn spans_count_only_when_enabled() {
        let count = |s: Stage| snapshot().into_iter().find(|t| t.stage == s.name()).map(|t| (t.count, t.total_us));
        let before = count(Stage::BlobWrite).unwrap_or_default();
        drop(span(Stage::BlobWrite));
        assert_eq!(count(Stage::BlobWrite).unwrap_or_default(), before, "off: nothing recorded");
        enable(true);
        {
            let _s = span(Stage::BlobWrite);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        enable(false);
        let (n, us) = count(Stage::BlobWrite).unwrap_or_default();
        assert_eq!(n, before.0 + 1);
        assert!(us - before.1 >= 2000.0, "{us} µs recorded for a 2 ms span");
        assert_eq!(Stage::ALL.iter().filter(|s| s.parent().is_none()).count(), 6);
    }
}
