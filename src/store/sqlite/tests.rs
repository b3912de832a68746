//! Tests of the writer's batches (`store::sqlite`): savepoints only when needed, and
//! `durability = "normal"` never fsyncs.

use super::*;

fn level(c: &Connection) -> Result<i64, StoreError> {
    Ok(c.query_row("PRAGMA synchronous", [], |r| r.get(0))?)
}

fn store(durability: Durability) -> (SqliteStore, PathBuf) {
    let dir = std::env::temp_dir().join(format!("tally-commit-{}", uuid::Uuid::new_v4()));
    (SqliteStore::open(&dir.join("tally.db"), durability).expect("open"), dir)
}

/// An operation that fails after it wrote is undone alone: the others of its batch
/// commit, each with its own result (the batch is run again with savepoints).
#[tokio::test]
async fn a_failing_operation_is_undone_alone_and_its_batch_commits() {
    let (store, dir) = store(Durability::Full);
    store.write(|c| Ok(c.execute_batch("CREATE TABLE t (v INTEGER)")?)).await.expect("table");
    let (release, held) = mpsc::channel::<()>();
    let (entered_tx, entered) = mpsc::channel::<()>();
    let holding = store
        .send(Commit::Ordered, 0, move |_| {
            let _ = entered_tx.send(());
            let _ = held.recv();
            Ok(())
        })
        .expect("send");
    entered.recv_timeout(std::time::Duration::from_secs(10)).expect("the writer runs the holding operation");
    let insert = |v: i64, fail: bool| {
        move |c: &Connection| -> Result<i64, StoreError> {
            c.execute("INSERT INTO t (v) VALUES (?1)", [v])?;
            if fail {
                return Err(StoreError::Invalid("after a write".into()));
            }
            Ok(v)
        }
    };
    let a = store.send(Commit::Durable, 0, insert(1, false)).expect("send");
    let b = store.send(Commit::Durable, 0, insert(2, true)).expect("send");
    let fenced = store.send(Commit::Durable, 0, |_: &Connection| -> Result<(), StoreError> { Err(StoreError::Fenced) });
    let c = store.send(Commit::Durable, 0, insert(3, false)).expect("send");
    drop(release);
    holding.await.expect("reply").expect("holding op");
    assert_eq!(a.await.expect("reply").expect("a"), 1);
    assert!(matches!(b.await.expect("reply"), Err(StoreError::Invalid(_))));
    assert!(matches!(fenced.expect("send").await.expect("reply"), Err(StoreError::Fenced)));
    assert_eq!(c.await.expect("reply").expect("c"), 3);
    let rows: Vec<i64> = store
        .read(|c| {
            let mut st = c.prepare("SELECT v FROM t ORDER BY v")?;
            let v = st.query_map([], |r| r.get(0))?.collect::<Result<Vec<i64>, _>>()?;
            Ok(v)
        })
        .await
        .expect("read");
    assert_eq!(rows, [1, 3], "the failed operation's write is gone, the others' kept");
    store.close().expect("close");
    let _ = std::fs::remove_dir_all(dir);
}

/// With `durability = "normal"` nothing is fsynced per commit, whatever an op asks for.
#[tokio::test]
async fn normal_durability_never_fsyncs_a_commit() {
    let (store, dir) = store(Durability::Normal);
    assert_eq!(store.write(level).await.expect("durable"), 1);
    assert_eq!(store.write_ordered(level).await.expect("ordered"), 1);
    store.write(|c| Ok(c.execute_batch("CREATE TABLE t (v INTEGER); INSERT INTO t VALUES (1)")?)).await.expect("w");
    assert_eq!((store.fsyncs(), store.durable_waits()), (0, 0), "no flusher with durability = normal");
    store.close().expect("close");
    let _ = std::fs::remove_dir_all(dir);
}
