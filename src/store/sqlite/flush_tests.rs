//! Tests of pipelined group commit (`store::sqlite::flush`): durable answers and reads wait for
//! an fsync that started after the commit, ordered ones do not, a lone operation is fsynced by
//! the writer itself and a batch of several by the flusher, a failed fsync stops the store, and
//! the flusher's fd stays on the WAL's inode.

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rusqlite::Connection;

use super::flush::wal_path;
use super::{Commit, SqliteStore, StoreError};
use crate::config::Durability;

fn store(durability: Durability) -> (SqliteStore, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("tally-flush-{}", uuid::Uuid::new_v4()));
    let store = SqliteStore::open(&dir.join("tally.db"), durability).expect("open");
    (store, dir)
}

fn insert(v: i64) -> impl FnMut(&Connection) -> Result<i64, StoreError> + Send + 'static {
    move |c| {
        c.execute("INSERT INTO t (v) VALUES (?1)", [v])?;
        Ok(v)
    }
}

fn rows(store: &SqliteStore) -> Result<Vec<i64>, StoreError> {
    store.read_blocking(|c| {
        let mut st = c.prepare("SELECT v FROM t ORDER BY v")?;
        let v = st.query_map([], |r| r.get(0))?.collect::<Result<Vec<i64>, _>>()?;
        Ok(v)
    })
}

const WAIT: Duration = Duration::from_secs(20);

/// A read of `t` on its own thread, started while an fsync is held: it reports what it read
/// and whether `released` was already set when it returned.
struct Reader {
    released: Arc<AtomicBool>,
    seen: std::sync::mpsc::Receiver<(Result<Vec<i64>, StoreError>, bool)>,
    thread: std::thread::JoinHandle<()>,
}

impl Reader {
    fn start(store: &SqliteStore) -> Reader {
        let released = Arc::new(AtomicBool::new(false));
        let (seen_tx, seen) = std::sync::mpsc::channel();
        let thread = {
            let (store, released) = (store.clone(), released.clone());
            std::thread::spawn(move || {
                let r = rows(&store);
                let _ = seen_tx.send((r, released.load(Ordering::SeqCst)));
            })
        };
        Reader { released, seen, thread }
    }

    /// Whether it has returned already.
    fn returned(&self) -> bool {
        !matches!(self.seen.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty))
    }

    /// What it read, and whether it returned after `released` was set.
    fn result(self) -> (Result<Vec<i64>, StoreError>, bool) {
        let got = self.seen.recv_timeout(WAIT).expect("the reader returns");
        self.thread.join().expect("reader");
        got
    }
}

/// Wait until the writer has finished `n` commits (the writer thread counts each after its
/// `COMMIT` returned), yielding in between.
async fn until_commits(store: &SqliteStore, n: u64) {
    tokio::time::timeout(WAIT, async {
        while store.commits() < n {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the writer commits");
}

/// Every batch commits at `synchronous = NORMAL`; a durable write is answered after one fsync
/// of the flusher, an ordered one without any, a durable one that wrote nothing with nothing
/// pending without any.
#[tokio::test]
async fn durable_answers_cost_one_flush_and_ordered_ones_none() {
    let (store, dir) = store(Durability::Full);
    let level =
        |c: &Connection| -> Result<i64, StoreError> { Ok(c.query_row("PRAGMA synchronous", [], |r| r.get(0))?) };
    assert_eq!(store.write(level).await.expect("durable"), 1, "the writer commits at NORMAL");
    store.write(|c| Ok(c.execute_batch("CREATE TABLE t (v INTEGER)")?)).await.expect("table");
    let (f0, w0) = (store.fsyncs(), store.durable_waits());
    store.write_ordered(insert(1)).await.expect("ordered");
    assert_eq!(store.fsyncs(), f0, "an ordered write is not flushed on its own");
    store.write(insert(2)).await.expect("durable");
    assert_eq!((store.fsyncs(), store.durable_waits()), (f0 + 1, w0 + 1), "one flush answers the durable write");
    store.write(level).await.expect("durable read");
    assert_eq!(store.fsyncs(), f0 + 1, "a durable op that wrote nothing, nothing pending: no flush");
    store.close().expect("close");
    let _ = std::fs::remove_dir_all(dir);
}

/// A durable operation alone in its batch, with nothing queued behind it, is fsynced by the
/// writer thread itself (no hand-off to the flusher and back), and a reader does not see it
/// before that fsync ended; two durable operations batched together are handed to the flusher,
/// the writer going on meanwhile.
#[tokio::test]
async fn a_lone_operation_is_fsynced_by_the_writer_and_a_batch_by_the_flusher() {
    let (store, dir) = store(Durability::Full);
    store.write(|c| Ok(c.execute_batch("CREATE TABLE t (v INTEGER)")?)).await.expect("table");
    let (entered, release) = store.inner.flush.hold_fsyncs();
    let f0 = store.fsyncs();
    let mut a = store.send(Commit::Durable, 0, insert(1)).expect("send a");
    assert_eq!(entered.recv_timeout(WAIT).expect("an fsync starts for a"), "tally-writer");
    let reader = Reader::start(&store);
    assert!(a.try_recv().is_err(), "a was answered before its fsync ended");
    assert!(!reader.returned(), "the reader saw a before the writer's fsync of it ended");
    reader.released.store(true, Ordering::SeqCst);
    release.send(()).expect("release a's fsync");
    assert_eq!(a.await.expect("reply").expect("a"), 1);
    let (r, after_release) = reader.result();
    assert_eq!(r.expect("read"), [1]);
    assert!(after_release, "the reader saw a before the writer's fsync of it ended");
    assert_eq!(store.fsyncs(), f0 + 1, "one fsync answered a");
    // Hold the writer inside an operation while b and c queue, so that they form one batch.
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let hold = store
        .send(Commit::Durable, 0, move |_: &Connection| -> Result<(), StoreError> {
            let _ = started_tx.send(());
            let _ = go_rx.recv();
            Ok(())
        })
        .expect("send the holding op");
    started.recv_timeout(WAIT).expect("the writer runs the holding op");
    let b = store.send(Commit::Durable, 0, insert(2)).expect("send b");
    let c = store.send(Commit::Durable, 0, insert(3)).expect("send c");
    go.send(()).expect("let the writer go");
    hold.await.expect("reply").expect("the holding op wrote nothing and waits for nothing");
    assert_eq!(entered.recv_timeout(WAIT).expect("an fsync starts for b and c"), "tally-flusher");
    release.send(()).expect("release b and c's fsync");
    assert_eq!((b.await.expect("reply").expect("b"), c.await.expect("reply").expect("c")), (2, 3));
    assert_eq!(store.fsyncs(), f0 + 2, "one fsync answered b and c together");
    drop(release);
    assert_eq!(rows(&store).expect("rows"), [1, 2, 3]);
    store.close().expect("close");
    let _ = std::fs::remove_dir_all(dir);
}

/// The writer's own fsync failing stops the store as the flusher's does: the lone durable write
/// waiting for it gets the error, and the daemon's signal fires.
#[tokio::test]
async fn a_failed_fsync_by_the_writer_stops_the_store() {
    let (store, dir) = store(Durability::Full);
    store.write(|c| Ok(c.execute_batch("CREATE TABLE t (v INTEGER)")?)).await.expect("table");
    store.inner.flush.fail_next_fsync();
    let e = store.write(insert(1)).await.expect_err("a durable write whose fsync failed must not succeed");
    assert!(matches!(e, StoreError::DiskFailed { .. }), "{e}");
    let why = tokio::time::timeout(WAIT, store.failed()).await.expect("the store says it failed");
    assert!(why.contains("fsync of") && why.contains("-wal"), "{why}");
    assert!(matches!(store.write(insert(2)).await, Err(StoreError::DiskFailed { .. })), "a later write");
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

/// While the flusher is inside an fsync that started before a durable commit B: B is not
/// answered by it, a reader and an ordered operation that could see B are held back (the
/// ordered one is committed); B, the reader and the ordered one go once a second fsync, started
/// after B's commit, ends.
#[tokio::test]
async fn durable_answers_and_reads_wait_for_an_fsync_that_started_after_the_commit() {
    let (store, dir) = store(Durability::Full);
    store.write(|c| Ok(c.execute_batch("CREATE TABLE t (v INTEGER)")?)).await.expect("table");
    store.inner.flush.no_inline_fsyncs();
    let (entered, release) = store.inner.flush.hold_fsyncs();
    let a = store.send(Commit::Durable, 0, insert(1)).expect("send a");
    entered.recv_timeout(WAIT).expect("the flusher starts an fsync for a");
    let commits = store.commits();
    let mut b = store.send(Commit::Durable, 0, insert(2)).expect("send b");
    let count =
        |c: &Connection| -> Result<i64, StoreError> { Ok(c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?) };
    let mut c = store.send(Commit::Ordered, 0, count).expect("send c");
    until_commits(&store, commits + 1).await;
    let reader = Reader::start(&store);
    release.send(()).expect("release the first fsync");
    assert_eq!(a.await.expect("reply").expect("a"), 1, "a is answered by the fsync that started after its commit");
    entered.recv_timeout(WAIT).expect("a second fsync starts, for b");
    assert!(b.try_recv().is_err(), "b was answered by an fsync that started before its commit");
    assert!(!reader.returned(), "a reader saw b before it was on disk");
    assert!(c.try_recv().is_err(), "an ordered op was told about b before it was on disk");
    reader.released.store(true, Ordering::SeqCst);
    drop(release);
    assert_eq!(b.await.expect("reply").expect("b"), 2);
    assert_eq!(c.await.expect("reply").expect("c"), 2, "the ordered op ran after b");
    let (r, after_release) = reader.result();
    assert_eq!(r.expect("read"), [1, 2]);
    assert!(after_release, "the reader returned before the fsync covering b ended");
    store.close().expect("close");
    let _ = std::fs::remove_dir_all(dir);
}

/// A failed fsync stops the store for good: the durable operations waiting for it get the
/// error (not success), every later write and read fails with it, the daemon's signal fires,
/// close writes nothing more; what was answered before is still in the database.
#[tokio::test]
async fn a_failed_fsync_stops_the_store() {
    let (store, dir) = store(Durability::Full);
    let path = store.path().to_path_buf();
    store.write(|c| Ok(c.execute_batch("CREATE TABLE t (v INTEGER)")?)).await.expect("table");
    store.write(insert(1)).await.expect("answered before the failure");
    store.inner.flush.no_inline_fsyncs();
    let (entered, release) = store.inner.flush.hold_fsyncs();
    let a = store.send(Commit::Durable, 0, insert(2)).expect("send a");
    entered.recv_timeout(WAIT).expect("the flusher starts an fsync for a");
    let commits = store.commits();
    let b = store.send(Commit::Durable, 0, insert(3)).expect("send b");
    until_commits(&store, commits + 1).await;
    store.inner.flush.fail_next_fsync();
    drop(release);
    for (name, r) in [("a", a.await), ("b", b.await)] {
        let e = r.expect("reply").expect_err("a durable op waiting for a failed fsync must not succeed");
        assert!(matches!(e, StoreError::DiskFailed { .. }), "{name}: {e}");
    }
    let why = tokio::time::timeout(WAIT, store.failed()).await.expect("the store says it failed");
    assert!(why.contains("fsync of") && why.contains("-wal") && why.contains("restart"), "{why}");
    assert_eq!(store.failure().as_deref(), Some(why.as_str()));
    assert!(matches!(store.write(insert(4)).await, Err(StoreError::DiskFailed { .. })), "a later write");
    assert!(
        matches!(store.write_ordered(insert(5)).await, Err(StoreError::DiskFailed { .. })),
        "a later ordered write"
    );
    assert!(matches!(rows(&store), Err(StoreError::DiskFailed { .. })), "a later read");
    assert!(store.write(insert(6)).await.expect_err("severity").is_fatal());
    assert!(matches!(store.close(), Err(StoreError::DiskFailed { .. })), "close says why");
    drop(store);
    // The process did not lose power: what was answered before the failure is there.
    let again = SqliteStore::open(&path, Durability::Full).expect("reopen");
    let got = rows(&again).expect("rows");
    assert!(got.starts_with(&[1]), "answered before the failure, lost: {got:?}");
    again.close().expect("close");
    let _ = std::fs::remove_dir_all(dir);
}

/// The flusher's fd stays on the WAL's inode while the writer runs: through another
/// connection's TRUNCATE checkpoint (`ftruncate` to 0), readers opening and closing, and the
/// writer's own checkpoints and WAL restarts under 1 MB images, which also keep the WAL
/// bounded (the checkpoint now runs from the writer, not SQLite's hook).
#[tokio::test]
async fn the_flusher_fsyncs_the_wal_inode_through_truncation_and_restarts() {
    let (store, dir) = store(Durability::Full);
    let wal = wal_path(store.path());
    let ino = store.flushed_inode().expect("durability = full has a flusher");
    assert_eq!(std::fs::metadata(&wal).expect("wal").ino(), ino);
    store.write(|c| Ok(c.execute_batch("CREATE TABLE b (data BLOB)")?)).await.expect("table");
    super::open::checkpoint_truncate(store.path()).expect("truncate from another connection");
    assert_eq!(std::fs::metadata(&wal).expect("wal").len(), 0, "TRUNCATE emptied the WAL");
    for i in 0..24 {
        store
            .write(move |c| Ok(c.execute("INSERT INTO b (data) VALUES (zeroblob(1048576 + ?1))", [i])?))
            .await
            .expect("image");
        let n: i64 =
            store.read_blocking(|c| Ok(c.query_row("SELECT count(*) FROM b", [], |r| r.get(0))?)).expect("read");
        assert_eq!(n, i + 1);
    }
    let meta = std::fs::metadata(&wal).expect("wal after restarts");
    assert_eq!(meta.ino(), ino, "the WAL was replaced: the flusher would fsync a file SQLite no longer writes");
    assert!(meta.len() < 12 << 20, "the WAL grew to {} bytes: checkpoints did not run", meta.len());
    store.close().expect("close");
    let _ = std::fs::remove_dir_all(dir);
}

/// A read of several statements sees one snapshot: a commit made between its statements (here
/// by another connection, as the writer thread would) is not half seen. Without the read
/// transaction the second count saw the new row (a draft read `succeeded` with no answer yet).
#[tokio::test]
async fn a_read_of_several_statements_sees_one_snapshot() {
    let (store, dir) = store(Durability::Normal);
    store.write(|c| Ok(c.execute_batch("CREATE TABLE t (v INTEGER)")?)).await.expect("table");
    store.write(insert(1)).await.expect("row");
    let path = store.path().to_path_buf();
    let (before, after) = store
        .read_blocking(move |c| {
            let count = |c: &Connection| -> Result<i64, StoreError> {
                Ok(c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?)
            };
            let before = count(c)?;
            let other = Connection::open(&path)?;
            other.busy_timeout(WAIT)?;
            other.execute("INSERT INTO t (v) VALUES (2)", [])?;
            Ok((before, count(c)?))
        })
        .expect("read");
    assert_eq!((before, after), (1, 1), "the read saw a commit made in its middle");
    assert_eq!(rows(&store).expect("read"), vec![1, 2], "the next read sees it");
    store.close().expect("close");
    let _ = std::fs::remove_dir_all(dir);
}
