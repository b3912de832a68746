//! What only the PostgreSQL backend has: the node lock (a second process with the same node
//! name is refused; a new run recovers its own earlier run's leases at once; a peer whose
//! lock connection is gone is recovered at once; a node whose lock connection drops is told
//! to fence itself), wake-ups through LISTEN/NOTIFY, and the database clock.

use std::time::Duration;

use tally::domain::TaskStatus;
use tally::store::postgres::{NodeState, PgOptions, PgStore};
use tally::store::*;

use super::fixtures::{pg_options, pg_url, schema};
use super::single::{LEASE, T0, claimed, task};

/// Test-only counts read straight from the database.
trait Counts {
    async fn int_sent(&self, provider: &'static str) -> i64;
    async fn int_lock_waiters(&self) -> i64;
}

impl Counts for Store {
    async fn int_sent(&self, provider: &'static str) -> i64 {
        pg(self)
            .raw(move |c| {
                Ok(c.query_one("SELECT count(*) FROM envelopes WHERE status = 'sent' AND provider = $1", &[&provider])?
                    .get(0))
            })
            .await
            .expect("count")
    }

    /// Sessions waiting for this node's lock (a peer's watcher blocked on it).
    async fn int_lock_waiters(&self) -> i64 {
        let key = i64::from(pg(self).node_lock_key());
        pg(self)
            .raw(move |c| {
                Ok(c.query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1952541817::bigint::oid
                   AND objid = $1::bigint::oid AND objsubid = 2 AND NOT granted",
                    &[&key],
                )?
                .get(0))
            })
            .await
            .expect("count")
    }
}

/// Two nodes on one fresh schema (`None` when skipping).
/// The PostgreSQL store behind the seam, for what only that backend has.
fn pg(s: &Store) -> &PgStore {
    s.postgres().expect("a PostgreSQL store")
}

fn two_nodes() -> Option<(String, String, Store, Store)> {
    let url = pg_url()?;
    let schema = schema();
    let a = Store::from(PgStore::open(pg_options(&url, &schema, "node-a")).expect("open a"));
    let b = Store::from(PgStore::open(pg_options(&url, &schema, "node-b")).expect("open b"));
    Some((url, schema, a, b))
}

/// Terminate a node's lock connection from another store, as an operator (or a network
/// failure) would.
async fn terminate_node_connection(victim: &Store, by: &Store) {
    let pid = pg(victim).node_backend_pid().expect("node connection");
    let done: bool = pg(by)
        .raw(move |c| Ok(c.query_one("SELECT pg_terminate_backend($1)", &[&pid])?.get(0)))
        .await
        .expect("terminate");
    assert!(done, "the node connection was terminated");
}

async fn wait_state(s: &Store, want: fn(&NodeState) -> bool) -> NodeState {
    let mut rx = pg(s).node_state().expect("state");
    let got = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(want)).await;
    got.expect("state change in time").expect("state channel").clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_node_name_is_refused() {
    let Some(url) = pg_url() else { return };
    let schema = schema();
    let a = PgStore::open(pg_options(&url, &schema, "shop-1")).expect("open");
    let err = PgStore::open(pg_options(&url, &schema, "shop-1")).err().expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("node name `shop-1`") && msg.contains("already connected"), "{msg}");
    // Another name on the same database is fine, and the first one's lock frees on close.
    let b = PgStore::open(pg_options(&url, &schema, "shop-2")).expect("another node");
    a.close().expect("close");
    let again = PgStore::open(pg_options(&url, &schema, "shop-1")).expect("the name is free again");
    for s in [b, again] {
        s.close().expect("close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_lock_is_gone_is_recovered_at_once_and_is_told_to_fence_itself() {
    let Some((_, _, a, b)) = two_nodes() else { return };
    let id = a.submit(task("peer"), T0).await.expect("submit").task_id().to_string();
    a.configure_providers(super::fixtures::provider_p()).await.expect("configure");
    let c = claimed(&a, &id, T0, "a-run-1").await;
    assert!(
        b.leftovers(T0 + 1, "b-run-1").await.expect("leftovers").is_empty(),
        "a live peer's lease is not b's to take"
    );
    terminate_node_connection(&a, &b).await;
    let state = wait_state(&a, |s| matches!(s, NodeState::Lost(_))).await;
    assert!(matches!(state, NodeState::Lost(_)), "{state:?}");
    // The server releases the lock as the terminated session exits, a moment after the
    // client saw the connection close: wait for that (bounded), at the caller's same `now`.
    let start = std::time::Instant::now();
    let rows = loop {
        let rows = b.leftovers(T0 + 1, "b-run-1").await.expect("leftovers");
        if !rows.is_empty() || start.elapsed() > Duration::from_secs(5) {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        rows.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(),
        [id.as_str()],
        "recoverable at once, long before the lease runs out"
    );
    let applied = b.apply_recovery(vec![(rows[0].clone(), Recovery::Abandon)], T0 + 2).await.expect("apply");
    assert_eq!(applied, [(id.clone(), TaskStatus::Waiting)]);
    // The fenced node's worker can no longer start the paid call.
    let late = a.record_calling(c.execution_token, c.lease_token, T0 + 3, tally::store::CallingFacts::billed()).await;
    assert!(matches!(late, Err(StoreError::Fenced)), "{late:?}");
    // Once it takes its lock again it is a node like any other.
    pg(&a).relock().expect("relock");
    assert_eq!(*pg(&a).node_state().expect("state").borrow(), NodeState::Held);
    for s in [a, b] {
        s.close().expect("close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_recovers_its_earlier_runs_leases_at_once_but_not_a_live_peers() {
    let Some((url, schema, a, b)) = two_nodes() else { return };
    let mine = a.submit(task("mine"), T0).await.expect("submit").task_id().to_string();
    a.configure_providers(super::fixtures::provider_p()).await.expect("configure");
    let _ = claimed(&a, &mine, T0, "a-run-1").await;
    let theirs = b.submit(task("theirs"), T0).await.expect("submit").task_id().to_string();
    let _ = claimed(&b, &theirs, T0, "b-run-1").await;
    a.close().expect("close a");
    let a2 = Store::from(PgStore::open(pg_options(&url, &schema, "node-a")).expect("restart a"));
    let rows = a2.leftovers(T0 + 1, "a-run-2").await.expect("leftovers");
    assert_eq!(rows.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(), [mine.as_str()]);
    // b's lease is someone else's live work until it expires.
    let later = a2.leftovers(T0 + LEASE, "a-run-2").await.expect("leftovers");
    assert_eq!(later.len(), 2, "by expiry, anyone may recover it");
    for s in [a2, b] {
        s.close().expect("close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_on_one_node_wakes_the_others_dispatcher_and_reconciler() {
    let Some((_, _, a, b)) = two_nodes() else { return };
    let (due, lease) = (pg(&b).signals().clone(), pg(&b).signals().clone());
    let woke_due = tokio::spawn(async move { due.due.notified().await });
    let woke_lease = tokio::spawn(async move { lease.lease.notified().await });
    let (tasks_tx, mut tasks) = tokio::sync::broadcast::channel(16);
    *pg(&b).signals().tasks.lock().expect("lock") = Some(tasks_tx);
    let id = a.submit(task("wake"), T0).await.expect("submit").task_id().to_string();
    tokio::time::timeout(Duration::from_secs(5), woke_due).await.expect("b's dispatcher woken").expect("task");
    let (task_id, status) =
        tokio::time::timeout(Duration::from_secs(5), tasks.recv()).await.expect("change").expect("recv");
    assert_eq!((task_id.as_str(), status.as_str()), (id.as_str(), "queued"), "b's live views see a's change");
    a.configure_providers(super::fixtures::provider_p()).await.expect("configure");
    a.dispatch_due(T0, 10, LEASE, "a-run").await.expect("dispatch");
    tokio::time::timeout(Duration::from_secs(5), woke_lease).await.expect("b's reconciler woken").expect("task");
    for s in [a, b] {
        s.close().expect("close");
    }
}

/// Channels belong to the database, not to a schema: a node hears only its own schema's
/// wake-ups. Before schema version 9 the channel names were bare, so a busy cluster in another
/// schema of the same database woke every idle node of this one — each hint a dispatch and a
/// deadline read (the "idle under load" finding of issue #28: thousands of statements from
/// idle nodes under the parallel test run). Deterministic, no waiting for nothing: the other
/// schema's hints commit before this schema's marker, and a listener gets notifications in
/// commit order, so when the marker arrives every earlier hint has been heard or ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_hears_no_wake_up_of_another_schema_in_the_same_database() {
    let Some((url, _, a, b)) = two_nodes() else { return };
    let (tasks_tx, mut tasks) = tokio::sync::broadcast::channel(64);
    *pg(&a).signals().tasks.lock().expect("lock") = Some(tasks_tx);
    // A busy node of another schema: a submit (due, task) and a dispatch (lease, task).
    let x = Store::from(PgStore::open(pg_options(&url, &schema(), "node-x")).expect("open x"));
    x.configure_providers(super::fixtures::provider_p()).await.expect("configure");
    let foreign = x.submit(task("elsewhere"), T0).await.expect("submit").task_id().to_string();
    let claims = x.dispatch_due(T0, 10, LEASE, "x-run").await.expect("dispatch").claims;
    assert_eq!(claims.len(), 1, "the other schema's node handed its task out");
    // The marker: a submit on a's own schema, by its peer.
    let marker = b.submit(task("here"), T0).await.expect("submit").task_id().to_string();
    let mut seen = Vec::new();
    loop {
        let (id, _) = tokio::time::timeout(Duration::from_secs(5), tasks.recv())
            .await
            .expect("a hears its peer's submit")
            .expect("recv");
        if id == marker {
            break;
        }
        seen.push(id);
    }
    assert!(!seen.contains(&foreign), "a heard another schema's task change: {seen:?}");
    let h = &pg(&a).signals().heard;
    // The marker's `due` hint comes in the same commit as its task hint, but a's listener may
    // count it just after handing the task hint on: wait for it (every other schema's hint
    // was delivered before both, in commit order).
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while h.due.load(std::sync::atomic::Ordering::Relaxed) == 0 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let heard = [&h.due, &h.lease, &h.task].map(|c| c.load(std::sync::atomic::Ordering::Relaxed));
    assert_eq!(heard, [1, 0, 1], "due, lease, task hints heard: only the peer's submit");
    for s in [a, b, x] {
        s.close().expect("close");
    }
}

/// With the database clock, an operation's `START TRANSACTION` travels with its clock read in
/// one round trip (`store::postgres::conn`): a submit sends one round trip fewer than it runs
/// statements; an operation that fails inside its transaction leaves its connection usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_opens_its_transaction_in_the_round_trip_of_its_clock_read() {
    let Some(url) = pg_url() else { return };
    let opts = PgOptions { db_clock: true, connections: 1, ..pg_options(&url, &schema(), "trips") };
    let s = Store::from(PgStore::open(opts).expect("open"));
    // The first submit prepares its statements (a round trip each, no statement).
    s.submit(task("warm"), 5).await.expect("submit");
    let (st0, rt0) = (pg(&s).statements(), pg(&s).round_trips());
    s.submit(task("counted"), 5).await.expect("submit");
    let (st, rt) = (pg(&s).statements() - st0, pg(&s).round_trips() - rt0);
    assert!(st >= 4, "a submit runs START TRANSACTION, the clock, its inserts and COMMIT: {st}");
    assert_eq!(rt, st - 1, "START TRANSACTION and the clock read share a round trip ({st} statements)");
    // An operation that fails after its transaction opened (a finish of an execution that
    // does not exist is fenced once its lock statement found nothing) is rolled back, and the
    // connection — the only one — serves the next operation.
    let fenced = s.finish("no-such-execution".into(), "no-lease".into(), Finish::CanceledBeforeCall, 5).await;
    assert!(matches!(fenced, Err(StoreError::Fenced)), "{fenced:?}");
    // `SAVEPOINT` outside a transaction block fails (25P01); inside one it succeeds.
    let outside: bool = pg(&s).raw(|c| Ok(c.batch_execute("SAVEPOINT probe").is_err())).await.expect("probe");
    assert!(outside, "the failed operation's transaction was left open on the connection");
    let id = s.submit(task("after"), 5).await.expect("submit after a failed operation").task_id().to_string();
    assert!(s.get_task(id).await.expect("get").is_some());
    s.close().expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_clock_leases_expire_on_the_servers_time_not_the_callers() {
    let Some(url) = pg_url() else { return };
    let opts = PgOptions { db_clock: true, ..pg_options(&url, &schema(), "clocked") };
    let s = Store::from(PgStore::open(opts).expect("open"));
    let wall = tally::clock::Clock::now(&tally::clock::SystemClock);
    // The caller's clocks are wildly wrong; the server's is used for every time written.
    let id = s.submit(task("clock"), 5).await.expect("submit").task_id().to_string();
    let t = s.get_task(id.clone()).await.expect("get").expect("task");
    assert!((t.created_at - wall).abs() < 60_000, "created_at {} is the server's time (wall {wall})", t.created_at);
    s.configure_providers(super::fixtures::provider_p()).await.expect("configure");
    let _ = claimed(&s, &id, 7, "run-1").await;
    let rows = s.leftovers(i64::MAX / 2, "run-1").await.expect("leftovers");
    assert!(rows.is_empty(), "a caller far in the future does not expire a lease the server says is live");
    let deadline = s.next_sent_deadline().await.expect("deadline").expect("one");
    assert!((deadline - wall - LEASE).abs() < 60_000, "the lease runs {LEASE} ms from the server's now");
    s.close().expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_capacity_holds_across_nodes_and_a_full_provider_blocks_no_other() {
    let Some((_, _, a, b)) = two_nodes() else { return };
    a.configure_providers(vec![
        ProviderSlots { reserve: 0, ..ProviderSlots::new("p", 2) },
        ProviderSlots { reserve: 0, ..ProviderSlots::new("q", 5) },
    ])
    .await
    .expect("configure");
    let mut p_tasks = Vec::new();
    for i in 0..5 {
        p_tasks.push(a.submit(task(&format!("p{i}")), T0 + i).await.expect("submit").task_id().to_string());
    }
    // A task for another provider, submitted after all of p's: p being full must not hold it back.
    let q = NewTask { provider: "q".into(), ..task("q0") };
    let q_task = b.submit(q, T0 + 10).await.expect("submit").task_id().to_string();
    let first = a.dispatch_due(T0 + 20, 10, LEASE, "a-run").await.expect("dispatch");
    let mut got: Vec<&str> = first.claims.iter().map(|c| c.task_id.as_str()).collect();
    got.sort();
    let mut want = vec![p_tasks[0].as_str(), p_tasks[1].as_str(), q_task.as_str()];
    want.sort();
    assert_eq!(got, want, "two of p (its cap) and q's");
    let second = b.dispatch_due(T0 + 20, 10, LEASE, "b-run").await.expect("dispatch");
    assert!(second.claims.is_empty(), "the other node sees p full: {:?}", second.claims);
    assert_eq!(second.next_due, None, "a full provider's ready work is not 'due' (the dispatcher would spin)");
    // A slot frees on node a; node b may now claim exactly one more.
    let c = first.claims.iter().find(|c| c.task_id == p_tasks[0]).expect("p0").clone();
    a.finish(
        c.execution_token,
        c.lease_token,
        Finish::Failed {
            kind: tally::domain::FailureKind::Rejected,
            reason: "no".into(),
            charge: tally::domain::Charge::Refused,
        },
        T0 + 22,
    )
    .await
    .expect("finish");
    let third = b.dispatch_due(T0 + 23, 10, LEASE, "b-run").await.expect("dispatch");
    assert_eq!(third.claims.iter().map(|c| c.task_id.as_str()).collect::<Vec<_>>(), [p_tasks[2].as_str()]);
    assert_eq!(a.int_sent("p").await, 2, "never more than the cap in flight");
    for s in [a, b] {
        s.close().expect("close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_dies_is_noticed_at_once_without_any_polling() {
    let Some((_, _, a, b)) = two_nodes() else { return };
    let gone = pg(&b).signals().clone();
    let noticed = tokio::spawn(async move { gone.peer_gone.notified().await });
    // Let b's watcher settle on a (it blocks in a lock wait: no statement runs meanwhile).
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let waiting = a.int_lock_waiters().await;
        if waiting > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(a.int_lock_waiters().await > 0, "b watches a");
    let t0 = std::time::Instant::now();
    terminate_node_connection(&a, &b).await;
    tokio::time::timeout(Duration::from_secs(5), noticed).await.expect("b noticed a's death").expect("task");
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "noticed after {took:?}");
    for s in [a, b] {
        s.close().expect("close");
    }
}

/// Regression: closing a store right after it opened, while a peer runs, hung for ever when
/// the stop's cancel reached the peer watcher between two statements (it then blocked in
/// `pg_advisory_lock` on the live peer). Each close must return, 20 times in a row.
#[test]
fn a_store_closed_while_its_watcher_starts_never_hangs() {
    let Some(url) = pg_url() else { return };
    let schema = schema();
    let peer = PgStore::open(pg_options(&url, &schema, "peer")).expect("open the peer");
    for i in 0..20 {
        let s = PgStore::open(pg_options(&url, &schema, "brief")).expect("open");
        let (done, closed) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(s.close());
        });
        match closed.recv_timeout(Duration::from_secs(10)) {
            Ok(r) => r.expect("close"),
            Err(_) => panic!("close {i} hung (the watcher was left waiting on the peer's lock)"),
        }
    }
    peer.close().expect("close the peer");
}

/// A plain connection into `schema`, holding a transaction open on a thread of its own: it
/// runs `sql` (locking what it names), says so, and rolls back when told (issue #28 tests).
fn hold_locks(
    url: &str,
    schema: &str,
    sql: &'static str,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (url, schema) = (url.to_string(), schema.to_string());
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).expect("connect");
        let mut t = c.transaction().expect("begin");
        t.batch_execute(&format!("SET LOCAL search_path = {schema}; {sql}")).expect("lock");
        held_tx.send(()).expect("held");
        let _ = release_rx.recv();
        t.rollback().expect("rollback");
    });
    held_rx.recv_timeout(Duration::from_secs(10)).expect("the locks are held");
    (release_tx, h)
}

/// No cluster-wide lock on the dispatch path (issue #28): while another session holds every
/// `providers` row and one of p's slot rows — what another node's dispatch held under the old
/// provider-cap lock, and holds now while it claims — a dispatch of fresh work neither waits
/// for it nor takes the held slot: it claims the other free slots at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_waits_for_no_other_dispatch_and_skips_the_slots_it_holds() {
    let Some((url, schema, a, b)) = two_nodes() else { return };
    a.configure_providers(vec![ProviderSlots { reserve: 0, ..ProviderSlots::new("p", 3) }]).await.expect("configure");
    for i in 0..5 {
        b.submit(task(&format!("f{i}")), T0 + i).await.expect("submit");
    }
    let (release, holder) = hold_locks(
        &url,
        &schema,
        "SELECT name FROM providers FOR UPDATE;
         SELECT slot FROM provider_slots WHERE provider = 'p' ORDER BY slot LIMIT 1 FOR UPDATE;",
    );
    let started = std::time::Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(5), a.dispatch_due(T0 + 10, 10, LEASE, "a-run"))
        .await
        .expect("the dispatch did not wait for the other session's locks")
        .expect("dispatch");
    assert_eq!(got.claims.len(), 2, "the two slots nobody holds, not the held one");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    release.send(()).expect("release");
    holder.join().expect("holder");
    let more = a.dispatch_due(T0 + 11, 10, LEASE, "a-run").await.expect("dispatch");
    assert_eq!(more.claims.len(), 1, "the freed slot, and no more");
    assert_eq!(a.int_sent("p").await, 3);
    for s in [a, b] {
        s.close().expect("close");
    }
}

/// The slot rows in the database, for provider `p`: (rows, rows held by a `sent` envelope of p,
/// rows held by anything else).
async fn slot_rows(s: &Store) -> (i64, i64, i64) {
    pg(s)
        .raw(|c| {
            let r = c.query_one(
                "SELECT count(*),
                        count(*) FILTER (WHERE e.status = 'sent' AND e.provider = 'p'),
                        count(*) FILTER (WHERE s.envelope_id IS NOT NULL AND (e.id IS NULL OR e.status <> 'sent'))
                 FROM provider_slots s LEFT JOIN envelopes e ON e.id = s.envelope_id WHERE s.provider = 'p'",
                &[],
            )?;
            Ok((r.get(0), r.get(1), r.get(2)))
        })
        .await
        .expect("slot rows")
}

/// A finished call gives its slot back in its own transaction; a cap lowered below the calls
/// out holds from the next dispatch (each call ending removes its row until the cap is met),
/// and a raised one adds free rows at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_rows_follow_the_cap_and_the_calls() {
    let Some((url, schema, a, b)) = two_nodes() else { return };
    let cap = |n| vec![ProviderSlots { reserve: 0, ..ProviderSlots::new("p", n) }];
    a.configure_providers(cap(3)).await.expect("configure");
    assert_eq!(slot_rows(&a).await, (3, 0, 0));
    for i in 0..6 {
        a.submit(task(&format!("c{i}")), T0 + i).await.expect("submit");
    }
    let mut out = a.dispatch_due(T0 + 10, 10, LEASE, "a-run").await.expect("dispatch").claims;
    assert_eq!(out.len(), 3);
    assert_eq!(slot_rows(&a).await, (3, 3, 0), "each sent envelope holds one row");
    b.configure_providers(cap(1)).await.expect("lower the cap");
    assert_eq!(slot_rows(&a).await, (3, 3, 0), "rows still held stay until their calls end");
    let fail = || Finish::Failed {
        kind: tally::domain::FailureKind::Rejected,
        reason: "no".into(),
        charge: tally::domain::Charge::Refused,
    };
    let mut now = T0 + 20;
    for want in [(2, 2, 0), (1, 1, 0)] {
        let c = out.remove(0);
        b.finish(c.execution_token, c.lease_token, fail(), now).await.expect("finish");
        assert_eq!(slot_rows(&a).await, want, "the row of an ended call goes while above the cap");
        assert!(b.dispatch_due(now + 1, 10, LEASE, "b-run").await.expect("dispatch").claims.is_empty());
        now += 10;
    }
    let c = out.remove(0);
    a.finish(c.execution_token, c.lease_token, fail(), now).await.expect("finish");
    assert_eq!(slot_rows(&a).await, (1, 0, 0), "at the cap the row is freed, not removed");
    let one = b.dispatch_due(now + 1, 10, LEASE, "b-run").await.expect("dispatch").claims;
    assert_eq!(one.len(), 1);
    a.configure_providers(cap(4)).await.expect("raise the cap");
    assert_eq!(slot_rows(&a).await, (4, 1, 0));
    assert_eq!(a.dispatch_due(now + 2, 10, LEASE, "a-run").await.expect("dispatch").claims.len(), 2, "the rest");
    assert_eq!(slot_rows(&a).await, (4, 3, 0));
    for s in [a, b] {
        s.close().expect("close");
    }
    let report = tokio::task::spawn_blocking(move || tally::store::postgres::check(&url, Some(&schema)))
        .await
        .expect("check thread")
        .expect("check");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}
