//! Held jobs on both backends (`store::held`): what an older copy of the database would send
//! again is held — never dispatched, no wake-up armed for it — until the owner releases it,
//! one by one or all together; a held task of a set keeps its set's rule (the shots one after
//! another, the candidates of a shot together); a
//! look at the provider (`Store::settle_held`) adopts a request found there as an accepted
//! execution that recovery resumes and polls, or notes what it found, each only while the
//! job is still held as the look read it.

use crate::common::{En, en_opt};
use std::collections::BTreeSet;

use tally::domain::{Charge, Phase, TaskStatus};
use tally::store::held::{HeldLook, HeldSettle, LOOK_NOTE, Release, Settled};
use tally::store::*;

use super::both;
use super::fixtures::file_problems;
use super::single::{LEASE, T0, artifact, claimed, ids, kinds, submit};

both!(
    held_jobs_wait_for_the_owner_and_go_when_released,
    a_held_set_still_runs_its_shots_one_after_another,
    a_held_job_found_at_the_provider_is_polled_and_never_sent,
    a_look_that_proves_nothing_keeps_the_job_held_and_says_what_it_found,
    a_found_shot_waits_while_another_shot_of_its_set_is_live,
    a_copy_restored_from_before_its_start_is_started_when_its_request_is_found
);

fn set_of<I: IntoIterator<Item = S>, S: Into<String>>(v: I) -> BTreeSet<String> {
    v.into_iter().map(Into::into).collect()
}

async fn held_jobs_wait_for_the_owner_and_go_when_released(s: Store) {
    // c's request has left (phase `calling`): recovery decides it, a hold never touches it.
    let c = submit(&s, "in flight c").await;
    let claim = claimed(&s, &c, T0 + 1, "boot").await;
    s.record_calling(claim.execution_token.clone(), claim.lease_token.clone(), T0 + 1, CallingFacts::billed())
        .await
        .expect("calling");
    let a = submit(&s, "held a").await;
    let b = submit(&s, "held b").await;
    let now = T0 + 2;
    let held = s.hold_unsettled("queued when the backup was taken".into(), now).await.expect("hold");
    assert_eq!(set_of(held.clone()), set_of([a.clone(), b.clone()]), "the queued jobs, not the one in flight");
    for id in [&a, &b] {
        let t = s.get_task(id.clone()).await.expect("get").expect("task");
        assert_eq!(t.status, TaskStatus::Waiting);
        let h = t.held.as_ref().expect("held");
        assert_eq!((h.reason.en(), h.since), ("queued when the backup was taken".to_string(), now));
        assert_eq!(
            en_opt(t.waiting_for.as_deref()).as_deref(),
            Some("queued when the backup was taken"),
            "the wait says why"
        );
    }
    assert!(s.get_task(c.clone()).await.expect("get").expect("task").held.is_none());
    let batch = s.dispatch_due(now + 1, 100, LEASE, "boot2").await.expect("dispatch");
    assert!(ids(&batch).iter().all(|id| *id != a && *id != b), "a held job is never dispatched: {:?}", ids(&batch));
    assert_eq!(batch.next_due, None, "and no wake-up is armed for it");
    let (total, list) = s.held_tasks(10).await.expect("held list");
    assert_eq!((total, set_of(list.iter().map(|t| t.id.clone()))), (2, set_of([a.clone(), b.clone()])));
    let attention =
        s.list_tasks(TaskFilter { needs_attention: true, ..TaskFilter::default() }, None, 10).await.expect("attention");
    assert_eq!(set_of(attention.iter().map(|t| t.id.clone())), set_of([a.clone(), b.clone()]), "they need the owner");
    assert_eq!(s.hold_unsettled("again".into(), now + 1).await.expect("hold again"), Vec::<String>::new());

    let r = s.release_held(Release::Ids(vec![a.clone(), "no-such-task".into()]), now + 2).await.expect("release");
    assert_eq!((r.released, r.not_held), (vec![a.clone()], vec!["no-such-task".to_string()]));
    let t = s.get_task(a.clone()).await.expect("get").expect("task");
    assert!(t.held.is_none());
    assert_eq!(ids(&s.dispatch_due(now + 2, 100, LEASE, "boot2").await.expect("dispatch")), [a.as_str()]);
    let r = s.release_held(Release::All, now + 3).await.expect("release all");
    assert_eq!((r.released, r.not_held.len()), (vec![b.clone()], 0));
    assert_eq!(ids(&s.dispatch_due(now + 3, 100, LEASE, "boot2").await.expect("dispatch")), [b.as_str()]);
    assert_eq!(s.held_tasks(10).await.expect("held list").0, 0);
    let r = s.release_held(Release::Ids(vec![b.clone()]), now + 4).await.expect("release twice");
    assert_eq!((r.released.len(), r.not_held), (0, vec![b.clone()]), "a released job is not held any more");
    let kinds: Vec<String> = s.events(a).await.expect("events").into_iter().map(|e| e.kind).collect();
    let (h, r) = (kinds.iter().position(|k| k == "held"), kinds.iter().position(|k| k == "released"));
    assert!(h.is_some() && h < r, "the timeline says it was held, then released: {kinds:?}");
}

/// Released, a held task of a set goes by its set's rule: with the candidates of the live
/// shot at once, a task of another shot after it.
async fn a_held_set_still_runs_its_shots_one_after_another(s: Store) {
    let shot = |role: &str, candidates| NewShot {
        role: role.into(),
        prompt: format!("{role} shot"),
        params: serde_json::json!({}),
        candidates,
        ..NewShot::default()
    };
    let set = NewSet {
        product: "mug".into(),
        style: None,
        provider: "p".into(),
        references: Vec::new(),
        shots: vec![shot("main", 2), shot("scene", 1)],
        idempotency_key: None,
    };
    let SubmitOutcome::Created(sid) = s.create_set(set, T0).await.expect("create") else { panic!("not created") };
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    let (main, scene): (Vec<String>, String) =
        (view.candidates[0].iter().map(|t| t.id.clone()).collect(), view.candidates[1][0].id.clone());
    let held = s.hold_unsettled("copied while running".into(), T0 + 1).await.expect("hold");
    assert_eq!(set_of(held), set_of(view.tasks().map(|t| t.id.clone())), "the scheduled shot and the later one");
    assert!(s.dispatch_due(T0 + 2, 100, LEASE, "boot").await.expect("dispatch").claims.is_empty());
    // One candidate of the first shot released: it goes, alone.
    let r = s.release_held(Release::Ids(vec![main[0].clone()]), T0 + 3).await.expect("release");
    assert_eq!(r.released.len(), 1);
    let b = s.dispatch_due(T0 + 3, 100, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b), [main[0].as_str()]);
    // The later shot released while the first runs: it waits.
    s.release_held(Release::Ids(vec![scene.clone()]), T0 + 4).await.expect("release");
    assert!(
        s.dispatch_due(T0 + 4, 100, LEASE, "boot").await.expect("dispatch").claims.is_empty(),
        "a later shot waits"
    );
    // The other candidate of the running shot released: at once, beside it.
    s.release_held(Release::Ids(vec![main[1].clone()]), T0 + 5).await.expect("release");
    let b2 = s.dispatch_due(T0 + 5, 100, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b2), [main[1].as_str()], "a candidate of the running shot goes beside it");
    // Both settled: the later shot goes.
    for c in b.claims.iter().chain(&b2.claims) {
        let f = Finish::Succeeded(artifact(&c.task_id));
        s.finish(c.execution_token.clone(), c.lease_token.clone(), f, T0 + 6).await.expect("finish");
    }
    let b3 = s.dispatch_due(T0 + 7, 100, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b3), [scene.as_str()], "then the next shot");
}

fn adopt(task: &str, since: i64, attempts: i64, job: &str) -> HeldLook {
    HeldLook {
        task: task.into(),
        since,
        attempts,
        settle: HeldSettle::Adopt {
            job_id: job.into(),
            key: provider_key(task, attempts + 1),
            attempt: attempts + 1,
            facts: CallingFacts { cost_micros: Some(40_000), currency: Some("USD".into()), ..CallingFacts::billed() },
        },
    }
}

async fn a_held_job_found_at_the_provider_is_polled_and_never_sent(s: Store) {
    let a = submit(&s, "found at the provider").await;
    let now = T0 + 2;
    s.hold_unsettled("queued when the backup was taken".into(), now).await.expect("hold");
    // A look that read another hold, or another attempt count, writes nothing.
    for stale in [adopt(&a, now - 1, 0, "job-1"), adopt(&a, now, 1, "job-1")] {
        assert_eq!(s.settle_held(stale, now + 1).await.expect("settle"), Settled::Changed);
    }
    assert!(s.get_task(a.clone()).await.expect("get").expect("task").held.is_some(), "still held");
    assert_eq!(s.settle_held(adopt(&a, now, 0, "job-1"), now + 1).await.expect("settle"), Settled::Adopted);
    let t = s.get_task(a.clone()).await.expect("get").expect("task");
    assert_eq!((t.status, t.held.is_none(), t.attempts), (TaskStatus::Running, true, 1), "{t:?}");
    assert_eq!((t.charge.state, t.charge.requests, t.charge.cost_micros), (Charge::Possible, 1, Some(40_000)));
    assert_eq!(
        s.settle_held(adopt(&a, now, 0, "job-2"), now + 2).await.expect("settle"),
        Settled::Changed,
        "applied once: the job is not held any more"
    );
    assert!(file_problems(&s).is_empty(), "tally check accepts it: {:?}", file_problems(&s));
    // Nothing dispatches it as new work; recovery takes it over at once and resumes it.
    assert!(s.dispatch_due(now + 2, 100, LEASE, "boot").await.expect("dispatch").claims.is_empty());
    let rows = s.leftovers(now + 2, "boot").await.expect("leftovers");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].execution.as_ref().map(|e| e.1), Some(Phase::Accepted));
    s.apply_recovery(vec![(rows[0].clone(), Recovery::Resume)], now + 3).await.expect("resume");
    let c = claimed(&s, &a, now + 4, "boot").await;
    assert_eq!((c.phase, c.resumed, c.attempt), (Phase::Accepted, true, 1));
    assert_eq!(c.job_id.as_deref(), Some("job-1"), "the worker polls the job the provider showed");
    assert_eq!(c.idempotency_key, provider_key(&a, 1));
    let f = Finish::Succeeded(artifact(&c.execution_token));
    let done = s.finish(c.execution_token, c.lease_token, f, now + 5).await.expect("finish");
    assert_eq!(done, TaskStatus::Succeeded);
    let t = s.get_task(a.clone()).await.expect("get").expect("task");
    assert_eq!((t.charge.state, t.charge.requests, t.artifacts.len()), (Charge::Charged, 1, 1), "{t:?}");
    let k = kinds(&s, &a).await;
    let (h, f) = (k.iter().position(|k| k == "held"), k.iter().position(|k| k == "found_at_provider"));
    assert!(h.is_some() && h < f, "the timeline says it was held, then found: {k:?}");
    assert!(!k.iter().any(|k| k == "calling"), "nothing was sent: {k:?}");
}

async fn a_look_that_proves_nothing_keeps_the_job_held_and_says_what_it_found(s: Store) {
    let b = submit(&s, "kept").await;
    let now = T0 + 2;
    s.hold_unsettled("queued when the backup was taken".into(), now).await.expect("hold");
    let keep = |found: &str| HeldLook {
        task: b.clone(),
        since: now,
        attempts: 0,
        settle: HeldSettle::Keep { found: found.into() },
    };
    assert_eq!(s.settle_held(keep("cannot list"), now + 1).await.expect("keep"), Settled::Kept);
    assert_eq!(s.settle_held(keep("cannot list"), now + 2).await.expect("keep"), Settled::Kept);
    assert_eq!(s.settle_held(keep("still cannot list"), now + 3).await.expect("keep"), Settled::Kept);
    let t = s.get_task(b.clone()).await.expect("get").expect("task");
    let want = format!("queued when the backup was taken{LOOK_NOTE}still cannot list");
    assert_eq!(t.held.as_ref().map(|h| (h.reason.en(), h.since)), Some((want.clone(), now)), "replaced, not appended");
    assert_eq!(en_opt(t.waiting_for.as_deref()), Some(want.clone()));
    let looks = kinds(&s, &b).await.into_iter().filter(|k| k == "looked_up").count();
    assert_eq!(looks, 2, "a look that found the same thing again writes nothing");
    assert!(s.dispatch_due(now + 4, 100, LEASE, "boot").await.expect("dispatch").claims.is_empty(), "still held");
    let r = s.release_held(Release::Ids(vec![b.clone()]), now + 5).await.expect("release");
    assert_eq!(r.released, vec![b.clone()], "the owner can still send it");
}

async fn a_found_shot_waits_while_another_shot_of_its_set_is_live(s: Store) {
    let shot = |role: &str| NewShot {
        role: role.into(),
        prompt: format!("{role} shot"),
        params: serde_json::json!({}),
        candidates: 1,
        ..NewShot::default()
    };
    let set = NewSet {
        product: "lamp".into(),
        style: None,
        provider: "p".into(),
        references: Vec::new(),
        shots: vec![shot("main"), shot("scene")],
        idempotency_key: None,
    };
    let SubmitOutcome::Created(sid) = s.create_set(set, T0).await.expect("create") else { panic!("not created") };
    let shots: Vec<String> =
        s.get_set(sid.clone()).await.expect("get").expect("set").shots.into_iter().map(|t| t.id).collect();
    // A second candidate of the main shot, asked for before the copy was taken.
    let AddOutcome::Added(more) = s.add_candidates(sid, 0, 1, None, T0).await.expect("add") else { panic!("added") };
    let now = T0 + 1;
    s.hold_unsettled("copied while running".into(), now).await.expect("hold");
    assert_eq!(s.settle_held(adopt(&shots[0], now, 0, "job-main"), now + 1).await.expect("adopt"), Settled::Adopted);
    assert_eq!(
        s.settle_held(adopt(&shots[1], now, 0, "job-scene"), now + 2).await.expect("adopt"),
        Settled::SetBusy,
        "the shots of a set one after another, found ones too"
    );
    assert_eq!(
        s.settle_held(adopt(&more[0], now, 0, "job-main-2"), now + 3).await.expect("adopt"),
        Settled::Adopted,
        "a candidate of the live shot goes beside it"
    );
    let t = s.get_task(shots[1].clone()).await.expect("get").expect("task");
    assert_eq!(t.held.as_ref().map(|h| h.reason.en()).as_deref(), Some("copied while running"), "nothing written");
    assert_eq!((t.status, t.attempts), (TaskStatus::Waiting, 0));
}

/// A copy to edit (issue #39) restored from a backup taken before its start, whose request is
/// then found at the provider: the job is adopted (polled, never sent again), and the copy no
/// longer shows as one that sent nothing.
async fn a_copy_restored_from_before_its_start_is_started_when_its_request_is_found(s: Store) {
    let shot = NewShot {
        role: "main".into(),
        prompt: "a".into(),
        params: serde_json::json!({}),
        candidates: 1,
        ..NewShot::default()
    };
    let set = NewSet {
        product: "teapot".into(),
        style: None,
        provider: "p".into(),
        references: vec![],
        shots: vec![shot],
        idempotency_key: None,
    };
    let SubmitOutcome::Created(id) = s.create_set(set, T0).await.expect("create") else { panic!("created") };
    let out = s.duplicate_set(id, None, false, T0 + 1).await.expect("duplicate");
    let Some(SubmitOutcome::Created(copy)) = out else { panic!("created: {out:?}") };
    let task = s.get_set(copy.clone()).await.expect("get").expect("copy").shots[0].id.clone();
    let now = T0 + 2;
    s.hold_unsettled("queued when the backup was taken".into(), now).await.expect("hold");
    assert_eq!(s.settle_held(adopt(&task, now, 0, "job-1"), now + 1).await.expect("settle"), Settled::Adopted);
    let view = s.get_set(copy).await.expect("get").expect("copy");
    assert!(view.started, "a request of it left: it was started");
    assert_eq!(set_summary(&view).0, SetStatus::Running);
}
