//! Retention on both backends: what a prune takes and what it must keep (`store::prune`'s
//! rules), a dry run that deletes nothing, nothing left behind, and — what matters with
//! several nodes — a prune racing a retry of the task it deletes, or a new set naming the
//! photo it deletes, never leaves a dangling link or fails with a database error: each delete
//! re-checks its evidence under the lock the other operation takes. The races on both
//! backends are free-running (they may or may not interleave); `pg_locks` makes the two
//! PostgreSQL interleavings happen for certain, by holding the lock a prune holds, or the one
//! a competing change holds, from a connection of its own.

use futures_util::future::join_all;
use serde_json::json;
use tally::domain::{Charge, FailureKind, TaskStatus};
use tally::store::*;

use super::both;
use super::fixtures::{ack, int};
use super::money::priced;
use super::single::{T0, artifact, claimed, png, submit};

both!(
    a_prune_takes_old_settled_work_and_keeps_what_someone_still_needs,
    a_prune_racing_a_retry_of_its_task_keeps_the_original_or_the_retry_finds_nothing,
    a_prune_racing_a_new_set_keeps_the_photo_or_the_set_says_it_is_gone,
);

/// 24 hours in ms.
const DAY: i64 = 86_400_000;

/// Run `id` (just submitted, the only task due) through one request ending in `end`, at `at`.
async fn run(s: &Store, id: &str, at: i64, end: Finish) -> TaskStatus {
    let c = claimed(s, id, at, "boot").await;
    let out = s.record_calling(c.execution_token.clone(), c.lease_token.clone(), at, priced(10_000, Vec::new())).await;
    assert_eq!(out.expect("calling"), CallingOutcome::Calling);
    s.finish(c.execution_token.clone(), c.lease_token, end, at + 1).await.expect("finish")
}

fn ok(tag: &str) -> Finish {
    Finish::Succeeded(artifact(tag))
}

fn rejected() -> Finish {
    Finish::Failed { kind: FailureKind::Rejected, reason: "no".into(), charge: Charge::Refused }
}

fn lost() -> Finish {
    Finish::Unknown { reason: "the answer was lost".into() }
}

/// A set of `ends.len()` shots using a new photo `photo` uploaded at `at`, each run in turn.
async fn set(s: &Store, product: &str, photo: &str, at: i64, ends: Vec<Finish>) -> (String, String) {
    let up = s.save_upload(NewImage::verify(png(photo)).expect("png"), at).await.expect("upload");
    let shots = (0..ends.len())
        .map(|i| NewShot {
            role: "scene".into(),
            prompt: format!("{product} {i}"),
            params: json!({}),
            candidates: 1,
            ..NewShot::default()
        })
        .collect();
    let new = NewSet {
        product: product.into(),
        style: None,
        provider: "p".into(),
        references: vec![up.id.clone()],
        shots,
        idempotency_key: None,
    };
    let SubmitOutcome::Created(sid) = s.create_set(new, at).await.expect("set") else { panic!("a new set") };
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    for (i, (shot, end)) in view.shots.iter().zip(ends).enumerate() {
        // Each next shot is scheduled when the one before settles.
        run(s, &shot.id, at + 10 * i as i64, end).await;
    }
    (sid, up.id)
}

async fn exists(s: &Store, id: &str) -> bool {
    s.get_task(id.into()).await.expect("get").is_some()
}

async fn a_prune_takes_old_settled_work_and_keeps_what_someone_still_needs(s: Store) {
    let cutoff = T0 + 90 * DAY;
    let recent = T0 + 100 * DAY;
    let old_ok = submit(&s, "old, succeeded").await;
    run(&s, &old_ok, T0, ok("old ok")).await;
    let old_failed = submit(&s, "old, failed").await;
    run(&s, &old_failed, T0, rejected()).await;
    let old_unknown = submit(&s, "old, unknown").await;
    run(&s, &old_unknown, T0, lost()).await;
    let retried = submit(&s, "old, failed, retried later").await;
    run(&s, &retried, T0, rejected()).await;
    let (done_set, done_photo) = set(&s, "done set", "done", T0, vec![ok("d1"), ok("d2")]).await;
    let (open_set, open_photo) = set(&s, "open set", "open", T0, vec![ok("o1"), lost()]).await;
    // Settled before the cutoff, but its request left in the cutoff's month: this month's
    // spend and budgets count it.
    let spent = submit(&s, "spent this month").await;
    run(&s, &spent, cutoff - 600_000, ok("spent")).await;
    let fresh = submit(&s, "recent").await;
    run(&s, &fresh, recent, ok("recent")).await;
    let RetryOutcome::Created(retry) = s.retry(retried.clone(), ack(true), None, recent).await.expect("retry") else {
        panic!("a retry")
    };
    let fresh_photo = s.save_upload(NewImage::verify(png("fresh")).expect("png"), recent).await.expect("up").id;
    let tasks = || int(&s, "SELECT count(*) FROM tasks");
    let blobs = || int(&s, "SELECT count(*) FROM blobs");
    let before = (tasks().await, blobs().await);
    assert_eq!(before, (11, 9), "11 tasks; 6 images and 3 photos");

    let dry = s.prune(cutoff, true).await.expect("dry run");
    assert!(dry.dry_run);
    assert_eq!((dry.tasks, dry.sets, dry.images, dry.uploads), (4, 1, 3, 1), "{dry:?}");
    assert_eq!((dry.kept_unknown, dry.kept_in_sets, dry.kept_retried, dry.kept_for_spend), (2, 1, 1, 1), "{dry:?}");
    assert_eq!((tasks().await, blobs().await), before, "a dry run deletes nothing");

    let done = s.prune(cutoff, false).await.expect("prune");
    assert_eq!((done.tasks, done.sets, done.images, done.uploads), (4, 1, 3, 1), "{done:?}");
    assert_eq!(done.image_bytes, dry.image_bytes);
    assert_eq!((done.kept_unknown, done.kept_in_sets, done.kept_retried, done.kept_for_spend), (2, 1, 1, 1));
    for gone in [&old_ok, &old_failed] {
        assert!(!exists(&s, gone).await, "{gone} kept");
    }
    assert!(s.get_set(done_set).await.expect("get").is_none(), "the finished set went whole");
    assert!(s.upload(done_photo).await.expect("get").is_none(), "its photo with it");
    for kept in [&old_unknown, &retried, &retry, &spent, &fresh] {
        assert!(exists(&s, kept).await, "{kept} deleted");
    }
    let open = s.get_set(open_set).await.expect("get").expect("the set with an unknown shot stays");
    assert_eq!(open.shots.len(), 2, "a set goes whole or not at all");
    for kept in [open_photo, fresh_photo] {
        assert!(s.upload(kept).await.expect("get").is_some(), "a photo in use or uploaded recently stays");
    }
    for (what, sql) in [
        ("events", "SELECT count(*) FROM events WHERE task_id NOT IN (SELECT id FROM tasks)"),
        ("executions", "SELECT count(*) FROM executions WHERE task_id NOT IN (SELECT id FROM tasks)"),
        ("envelopes", "SELECT count(*) FROM envelopes WHERE task_id NOT IN (SELECT id FROM tasks)"),
        ("artifacts", "SELECT count(*) FROM artifacts WHERE task_id NOT IN (SELECT id FROM tasks)"),
        (
            "image bytes",
            "SELECT count(*) FROM blobs WHERE id NOT IN (SELECT id FROM artifacts) AND id NOT IN (SELECT id FROM uploads)",
        ),
    ] {
        assert_eq!(int(&s, sql).await, 0, "{what} left behind");
    }
    assert_eq!((tasks().await, blobs().await), (before.0 - 4, before.1 - 4));
    // The kept work still reads whole: the spend report still counts this month's request.
    assert_eq!(s.get_task(spent.clone()).await.expect("get").expect("spent").artifacts.len(), 1);
    let again = s.prune(cutoff, false).await.expect("again");
    assert_eq!((again.tasks, again.sets, again.uploads), (0, 0, 0), "nothing more to do");
    assert_eq!(s.next_prunable(cutoff).await.expect("next"), Some(recent + 1), "the recent task, when it settled");
    assert_eq!(s.next_prunable(recent + 2).await.expect("next"), None);
}

async fn a_prune_racing_a_retry_of_its_task_keeps_the_original_or_the_retry_finds_nothing(s: Store) {
    let cutoff = T0 + 90 * DAY;
    let mut ids = Vec::new();
    for i in 0..12 {
        let id = submit(&s, &format!("race {i}")).await;
        run(&s, &id, T0, rejected()).await;
        ids.push(id);
    }
    let retries = join_all(ids.iter().map(|id| {
        let (s, id) = (s.clone(), id.clone());
        tokio::spawn(async move { s.retry(id, ack(true), None, cutoff).await })
    }));
    let prune = {
        let s = s.clone();
        tokio::spawn(async move { s.prune(cutoff, false).await })
    };
    let (retries, prune) = tokio::join!(retries, prune);
    let pruned = prune.expect("join").expect("the prune succeeds whatever runs beside it");
    let mut made = 0;
    for (id, r) in ids.iter().zip(retries) {
        match r.expect("join").expect("the retry succeeds whatever runs beside it") {
            RetryOutcome::Created(new) => {
                made += 1;
                assert!(exists(&s, id).await, "{id} was deleted although {new} retries it");
                let t = s.get_task(new.clone()).await.expect("get").expect("the retry");
                assert_eq!(t.retry_of.as_deref(), Some(id.as_str()));
            }
            RetryOutcome::NotFound => assert!(!exists(&s, id).await),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(made + pruned.tasks as usize, ids.len(), "each task was either retried or pruned: {pruned:?}");
    let dangling = "SELECT count(*) FROM tasks WHERE retry_of IS NOT NULL AND retry_of NOT IN (SELECT id FROM tasks)";
    assert_eq!(int(&s, dangling).await, 0);
}

async fn a_prune_racing_a_new_set_keeps_the_photo_or_the_set_says_it_is_gone(s: Store) {
    let cutoff = T0 + 90 * DAY;
    let mut photos = Vec::new();
    for i in 0..8 {
        let up = s.save_upload(NewImage::verify(png(&format!("photo {i}"))).expect("png"), T0).await.expect("up");
        photos.push(up.id);
    }
    let sets = join_all(photos.iter().map(|photo| {
        let (s, photo) = (s.clone(), photo.clone());
        tokio::spawn(async move {
            let new = NewSet {
                product: format!("uses {photo}"),
                style: None,
                provider: "p".into(),
                references: vec![photo],
                shots: vec![NewShot {
                    role: "main".into(),
                    prompt: "main".into(),
                    params: json!({}),
                    candidates: 1,
                    ..NewShot::default()
                }],
                idempotency_key: None,
            };
            s.create_set(new, cutoff).await
        })
    }));
    let prune = {
        let s = s.clone();
        tokio::spawn(async move { s.prune(cutoff, false).await })
    };
    let (sets, prune) = tokio::join!(sets, prune);
    let pruned = prune.expect("join").expect("the prune succeeds whatever runs beside it");
    let mut made = 0;
    for (photo, r) in photos.iter().zip(sets) {
        match r.expect("join") {
            Ok(SubmitOutcome::Created(sid)) => {
                made += 1;
                assert!(s.upload(photo.clone()).await.expect("get").is_some(), "{photo} deleted under set {sid}");
                let view = s.get_set(sid).await.expect("get").expect("set");
                assert_eq!(view.references.len(), 1);
            }
            Err(StoreError::Invalid(msg)) => {
                assert!(msg.contains("no upload"), "{msg}");
                assert!(s.upload(photo.clone()).await.expect("get").is_none());
            }
            other => panic!("a database error instead of an answer: {other:?}"),
        }
    }
    assert_eq!(made + pruned.uploads as usize, photos.len(), "each photo was either used or pruned: {pruned:?}");
    let dangling = "SELECT count(*) FROM set_references WHERE upload_id NOT IN (SELECT id FROM uploads)";
    assert_eq!(int(&s, dangling).await, 0);
}

/// The two interleavings on PostgreSQL, forced: another session holds a row lock the way a
/// competing operation (or a prune) does, the store's operation is started and seen waiting
/// for it, then the session commits its change.
pub(super) mod pg_locks {
    use std::time::{Duration, Instant};

    use ::postgres::{Client, NoTls};
    use tally::store::postgres::PgStore;
    use tally::store::*;

    use super::super::fixtures::{pg_options, pg_url, provider_p, schema};
    use super::super::single::{T0, png, submit};
    use super::{DAY, exists, rejected, run};

    /// A session of its own on `schema`.
    fn session(url: &str, schema: &str) -> Client {
        let mut c = Client::connect(url, NoTls).expect("connect");
        c.batch_execute(&format!("SET search_path = {schema}")).expect("search path");
        c
    }

    /// Wait until a session waits for a lock that `holder` holds (the store's operation has
    /// reached it).
    fn until_blocked_by(watch: &mut Client, holder: i32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let waiting: i64 = watch
                .query_one("SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", &[&holder])
                .expect("activity")
                .get(0);
            if waiting > 0 {
                return;
            }
            assert!(Instant::now() < deadline, "the operation never reached the lock");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The backend pid of a session.
    fn pid(c: &mut Client) -> i32 {
        c.query_one("SELECT pg_backend_pid()", &[]).expect("pid").get(0)
    }

    /// Another session, on a thread of its own (the sync client cannot run on the test's
    /// async threads): it runs `lock` in an open transaction, says so, waits until a session
    /// is blocked by it, then runs `change` (which commits).
    pub(in crate::conformance) fn holding(
        url: &str,
        schema: &str,
        lock: String,
        change: String,
    ) -> (tokio::sync::oneshot::Receiver<()>, std::thread::JoinHandle<()>) {
        let (url, schema) = (url.to_string(), schema.to_string());
        let (locked, is_locked) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            let (mut other, mut watch) = (session(&url, &schema), session(&url, &schema));
            let holder = pid(&mut other);
            other.batch_execute(&format!("BEGIN; {lock}")).expect("lock");
            let _ = locked.send(());
            until_blocked_by(&mut watch, holder);
            other.batch_execute(&format!("{change}; COMMIT")).expect("change");
        });
        (is_locked, thread)
    }

    /// A task changes while a prune is about to delete it: the prune waits for its envelope
    /// lock, re-checks, and keeps the task (without that lock the re-check runs first and
    /// the prune deletes a task that has just become recent: checked by taking it out).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prune_rechecks_a_task_under_its_envelope_lock() {
        let Some(url) = pg_url() else { return };
        let schema = schema();
        let s = Store::from(PgStore::open(pg_options(&url, &schema, "node-a")).expect("open"));
        s.configure_providers(provider_p()).await.expect("configure");
        let cutoff = T0 + 90 * DAY;
        let id = submit(&s, "old").await;
        run(&s, &id, T0, rejected()).await;
        let (locked, other) = holding(
            &url,
            &schema,
            format!("SELECT 1 FROM envelopes WHERE task_id = '{id}' FOR UPDATE"),
            format!("UPDATE tasks SET updated_at = {cutoff} WHERE id = '{id}'"),
        );
        locked.await.expect("the other session holds the envelope");
        let prune = s.prune(cutoff, false).await;
        tokio::task::spawn_blocking(move || other.join()).await.expect("join").expect("the other session");
        let r = prune.expect("prune");
        assert_eq!(r.tasks, 0, "{r:?}");
        assert!(exists(&s, &id).await, "a task that changed while the prune waited was deleted");
        s.close().expect("close");
    }

    /// A new set names a photo that a prune is deleting: the set waits for the photo's row,
    /// then says it is gone — a clear error, not a foreign-key failure from the database (the
    /// old code read the photo without a lock: it failed so on the reference).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_set_waits_for_a_photo_being_pruned_and_says_it_is_gone() {
        let Some(url) = pg_url() else { return };
        let schema = schema();
        let s = Store::from(PgStore::open(pg_options(&url, &schema, "node-a")).expect("open"));
        let photo = s.save_upload(NewImage::verify(png("photo")).expect("png"), T0).await.expect("up").id;
        let (locked, other) = holding(
            &url,
            &schema,
            format!("SELECT 1 FROM uploads WHERE id = '{photo}' FOR UPDATE"),
            format!("DELETE FROM uploads WHERE id = '{photo}'; DELETE FROM blobs WHERE id = '{photo}'"),
        );
        locked.await.expect("the other session holds the photo");
        let new = NewSet {
            product: "mug".into(),
            style: None,
            provider: "p".into(),
            references: vec![photo],
            shots: vec![NewShot {
                role: "main".into(),
                prompt: "main".into(),
                params: serde_json::json!({}),
                candidates: 1,
                ..NewShot::default()
            }],
            idempotency_key: None,
        };
        let created = s.create_set(new, T0 + 90 * DAY).await;
        tokio::task::spawn_blocking(move || other.join()).await.expect("join").expect("the other session");
        match created {
            Err(StoreError::Invalid(msg)) => assert!(msg.contains("no upload"), "{msg}"),
            other => panic!("not a clear answer: {other:?}"),
        }
        s.close().expect("close");
    }
}
