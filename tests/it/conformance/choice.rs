//! Candidates per shot and the owner's choice (`store::choice`), on both backends: a set's
//! shots go one after another and the candidates of a shot together (more candidates of the
//! running shot go at once, a task of another shot waits), more can be added to one shot, a
//! retried candidate keeps its place, and a choice names only a succeeded candidate of that
//! shot, every change in the set's timeline.

use crate::common::En;
use serde_json::json;
use tally::domain::TaskStatus;
use tally::store::*;

use super::both;
use super::fixtures::ack;
use super::single::{LEASE, T0, artifact, ids};

both!(
    the_shots_go_one_after_another_and_the_candidates_of_a_shot_together,
    candidates_are_tasks_scheduled_like_shots_and_more_can_be_added,
    a_choice_names_only_a_succeeded_candidate_of_its_shot,
    an_edit_or_cutout_candidate_is_made_from_an_image_of_its_own_shot
);

fn shot(role: &str, candidates: u32) -> NewShot {
    NewShot { role: role.into(), prompt: format!("{role} shot"), params: json!({}), candidates, ..NewShot::default() }
}

fn set(shots: Vec<NewShot>) -> NewSet {
    NewSet {
        product: "teapot".into(),
        style: None,
        provider: "p".into(),
        references: vec![],
        shots,
        idempotency_key: None,
    }
}

/// Dispatch the one due task and finish it with an image; its task id.
async fn run_next(s: &Store, now: i64) -> String {
    let b = s.dispatch_due(now, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(b.claims.len(), 1, "one task due: {:?}", ids(&b));
    finish_all(s, &b, now + 1).await.remove(0)
}

/// Finish every claim of `b` with an image; their task ids, in claim order.
async fn finish_all(s: &Store, b: &DispatchBatch, now: i64) -> Vec<String> {
    let mut done = Vec::new();
    for c in &b.claims {
        let f = Finish::Succeeded(artifact(&c.execution_token));
        s.finish(c.execution_token.clone(), c.lease_token.clone(), f, now).await.expect("finish");
        done.push(c.task_id.clone());
    }
    done
}

/// Dispatch every due task, finish them all; their task ids, sorted.
async fn run_due(s: &Store, now: i64) -> Vec<String> {
    let b = s.dispatch_due(now, 100, LEASE, "boot").await.expect("dispatch");
    let mut done = finish_all(s, &b, now + 1).await;
    done.sort();
    done
}

fn sorted(ids: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

/// How many `scheduled` lines a task's timeline holds.
async fn scheduled(s: &Store, id: &str) -> usize {
    super::single::kinds(s, id).await.iter().filter(|k| *k == "scheduled").count()
}

/// The scheduling rule of issue #41: a set's live tasks (handed out, or pending with a due
/// time) always belong to one shot; all the candidates of that shot are due together; the next
/// shot's all become due (one `scheduled` line each) when the last of it settled; a candidate
/// added to the live shot is due at once, one added to another shot waits.
async fn the_shots_go_one_after_another_and_the_candidates_of_a_shot_together(s: Store) {
    let SubmitOutcome::Created(sid) =
        s.create_set(set(vec![shot("main", 3), shot("scene", 3)]), T0).await.expect("create")
    else {
        panic!("created")
    };
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    let of = |shot: usize| view.candidates[shot].iter().map(|t| t.id.clone()).collect::<Vec<_>>();
    let (first, second) = (of(0), of(1));
    assert_eq!((first.len(), second.len()), (3, 3));
    // Started: the 3 candidates of shot 0 are due, the 3 of shot 1 wait.
    let b = s.dispatch_due(T0 + 1, 100, LEASE, "boot").await.expect("dispatch");
    let mut claimed: Vec<String> = ids(&b).iter().map(|s| s.to_string()).collect();
    claimed.sort();
    assert_eq!(claimed, sorted(&first.iter().map(String::as_str).collect::<Vec<_>>()), "shot 0's candidates, together");
    for t in &second {
        let t = s.get_task(t.clone()).await.expect("get").expect("task");
        assert_eq!(t.status, TaskStatus::Queued);
        let why = t.waiting_for.en();
        assert!(why.contains("1 earlier shot"), "waits behind one shot (not three tasks): {why}");
    }
    // Two of them settle: the third is still live, so shot 1 still waits.
    let by_task = |id: &str| b.claims.iter().find(|c| c.task_id == id).expect("claimed").clone();
    for id in &first[..2] {
        let c = by_task(id);
        let f = Finish::Succeeded(artifact(&c.execution_token));
        s.finish(c.execution_token.clone(), c.lease_token.clone(), f, T0 + 2).await.expect("finish");
    }
    assert!(s.dispatch_due(T0 + 3, 100, LEASE, "boot").await.expect("dispatch").claims.is_empty());
    // A more-candidates task of the live shot is due at once; one of the other shot waits.
    let AddOutcome::Added(more) = s.add_candidates(sid.clone(), 0, 1, None, T0 + 4).await.expect("add") else {
        panic!("added")
    };
    let AddOutcome::Added(later) = s.add_candidates(sid.clone(), 1, 1, None, T0 + 5).await.expect("add") else {
        panic!("added")
    };
    let b2 = s.dispatch_due(T0 + 6, 100, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b2), [more[0].as_str()], "beside the running shot, at once");
    // The last of shot 0 settles (its third candidate, then the added one): shot 1's three and
    // its added candidate become due together, each with one `scheduled` line.
    let c = by_task(&first[2]);
    let f = Finish::Succeeded(artifact(&c.execution_token));
    s.finish(c.execution_token.clone(), c.lease_token.clone(), f, T0 + 7).await.expect("finish");
    assert!(s.dispatch_due(T0 + 8, 100, LEASE, "boot").await.expect("dispatch").claims.is_empty(), "one still live");
    finish_all(&s, &b2, T0 + 9).await;
    let mut want: Vec<&str> = second.iter().map(String::as_str).collect();
    want.push(later[0].as_str());
    assert_eq!(run_due(&s, T0 + 10).await, sorted(&want), "shot 1, all together");
    for id in &want {
        assert_eq!(scheduled(&s, id).await, 1, "one scheduled line for {id}");
    }
    for id in &first {
        assert_eq!(scheduled(&s, id).await, 0, "due at its submit: {id}");
    }
    let view = s.get_set(sid).await.expect("get").expect("set");
    assert!(view.tasks().all(|t| t.status == TaskStatus::Succeeded));
}

async fn candidates_are_tasks_scheduled_like_shots_and_more_can_be_added(s: Store) {
    let SubmitOutcome::Created(sid) =
        s.create_set(set(vec![shot("main", 2), shot("scene", 1)]), T0).await.expect("create")
    else {
        panic!("created")
    };
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    let lens: Vec<usize> = view.candidates.iter().map(Vec::len).collect();
    assert_eq!(lens, [2, 1]);
    assert_eq!(view.shots.len(), 2, "shots stay one per shot");
    assert_eq!(view.shots[0].id, view.candidates[0][0].id, "a shot's task is its first candidate");
    assert_eq!(view.candidates[0].iter().map(|t| t.candidate).collect::<Vec<_>>(), [0, 1]);
    // Shot by shot, the candidates of a shot together.
    let c0: Vec<&str> = view.candidates[0].iter().map(|t| t.id.as_str()).collect();
    assert_eq!(run_due(&s, T0 + 10).await, sorted(&c0));
    assert_eq!(run_due(&s, T0 + 20).await, [view.candidates[1][0].id.clone()]);
    // More candidates for shot 1 after the set settled: queued as its candidates 1 and 2, and
    // run together.
    let AddOutcome::Added(new) = s.add_candidates(sid.clone(), 1, 2, None, T0 + 100).await.expect("add") else {
        panic!("added")
    };
    assert_eq!(new.len(), 2);
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    assert_eq!(view.candidates[1].iter().map(|t| t.candidate).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(view.candidates[1][1].prompt, view.candidates[1][0].prompt, "the shot's own request");
    assert_eq!(view.candidates[1][1].shot_role.as_deref(), Some("scene"));
    // Both due together: a dispatch of one slot takes the first.
    let b = s.dispatch_due(T0 + 101, 1, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b), [new[0].as_str()], "the first new candidate first");
    assert_eq!(b.claims[0].candidate, 1, "the claim says which candidate (the demo draws each differently)");
    // Cancel the second (due, not claimed) while the first runs: a retry of it is allowed (one
    // live retry per candidate, not per shot), takes its place and, of the running shot, is
    // due at once.
    assert_eq!(s.cancel(new[1].clone(), T0 + 102).await.expect("cancel"), CancelOutcome::Canceled);
    let retry = s.retry(new[1].clone(), ack(false), None, T0 + 103).await.expect("retry");
    let RetryOutcome::Created(again) = retry else { panic!("a retry of a canceled candidate: {retry:?}") };
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    let now: Vec<&str> = view.candidates[1].iter().map(|t| t.id.as_str()).collect();
    assert_eq!(now, [view.candidates[1][0].id.as_str(), new[0].as_str(), again.as_str()]);
    assert!(view.replaced.contains(&new[1]), "{:?}", view.replaced);
    let b = s.dispatch_due(T0 + 104, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b), [again.as_str()], "the retry, beside its running shot");
    let kinds: Vec<&str> = view.timeline.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["created", "candidates_added"]);
    // The refusals.
    assert_eq!(s.add_candidates("nope".into(), 0, 1, None, T0).await.expect("add"), AddOutcome::NoSet);
    assert_eq!(s.add_candidates(sid.clone(), 7, 1, None, T0).await.expect("add"), AddOutcome::NoShot);
    for _ in 0..3 {
        assert!(matches!(
            s.add_candidates(sid.clone(), 0, 4, None, T0 + 200).await.expect("add"),
            AddOutcome::Added(_)
        ));
    }
    assert_eq!(
        s.add_candidates(sid.clone(), 0, 3, None, T0 + 201).await.expect("add"),
        AddOutcome::TooMany { has: 14 },
        "a shot holds at most {MAX_SHOT_CANDIDATES}"
    );
    s.cancel_set(sid.clone(), T0 + 300).await.expect("cancel");
    assert_eq!(s.add_candidates(sid.clone(), 0, 1, None, T0 + 301).await.expect("add"), AddOutcome::Canceled);
}

async fn a_choice_names_only_a_succeeded_candidate_of_its_shot(s: Store) {
    let SubmitOutcome::Created(sid) =
        s.create_set(set(vec![shot("main", 2), shot("scene", 1)]), T0).await.expect("create")
    else {
        panic!("created")
    };
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    assert_eq!(view.chosen, [None, None]);
    assert_eq!(
        delivery_blocking(&view).iter().map(|l| l.en()).collect::<Vec<_>>(),
        ["2 shots have no chosen image: Main photo, Lifestyle scene"]
    );
    run_due(&s, T0 + 10).await;
    run_due(&s, T0 + 20).await;
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    let art = |shot: usize, c: usize| view.candidates[shot][c].artifacts[0].id.clone();
    let (a0, a1, b0) = (art(0, 0), art(0, 1), art(1, 0));
    assert_eq!(s.choose(sid.clone(), 0, Some(b0.clone()), T0 + 50).await.expect("choose"), ChoiceOutcome::OtherShot);
    assert_eq!(
        s.choose(sid.clone(), 0, Some("nope".into()), T0 + 50).await.expect("choose"),
        ChoiceOutcome::NoArtifact
    );
    assert_eq!(s.choose(sid.clone(), 9, Some(a0.clone()), T0 + 50).await.expect("choose"), ChoiceOutcome::NoShot);
    assert_eq!(s.choose("nope".into(), 0, Some(a0.clone()), T0 + 50).await.expect("choose"), ChoiceOutcome::NoSet);
    // A task of its own is no candidate of any shot.
    let own = s.submit(NewTask { provider: "p".into(), prompt: "loose".into(), ..NewTask::default() }, T0 + 60).await;
    let own = own.expect("submit").task_id().to_string();
    let b = s.dispatch_due(T0 + 61, 10, LEASE, "boot").await.expect("dispatch");
    let c = b.claims.iter().find(|c| c.task_id == own).expect("claimed");
    let f = Finish::Succeeded(artifact(&c.execution_token));
    s.finish(c.execution_token.clone(), c.lease_token.clone(), f, T0 + 62).await.expect("finish");
    let loose = s.get_task(own).await.expect("get").expect("task").artifacts[0].id.clone();
    assert_eq!(s.choose(sid.clone(), 0, Some(loose), T0 + 63).await.expect("choose"), ChoiceOutcome::OtherShot);
    // Choose, choose the same again (no change), change, clear.
    assert_eq!(
        s.choose(sid.clone(), 0, Some(a1.clone()), T0 + 70).await.expect("choose"),
        ChoiceOutcome::Chosen { previous: None }
    );
    assert_eq!(
        s.choose(sid.clone(), 0, Some(a1.clone()), T0 + 71).await.expect("choose"),
        ChoiceOutcome::Chosen { previous: None }
    );
    assert_eq!(
        s.choose(sid.clone(), 0, Some(a0.clone()), T0 + 72).await.expect("choose"),
        ChoiceOutcome::Chosen { previous: Some(a1.clone()) }
    );
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    assert_eq!(view.chosen, [Some(a0.clone()), None]);
    assert_eq!(
        delivery_blocking(&view).iter().map(|l| l.en()).collect::<Vec<_>>(),
        ["1 shot has no chosen image: Lifestyle scene"]
    );
    assert_eq!(
        s.choose(sid.clone(), 1, Some(b0.clone()), T0 + 73).await.expect("choose"),
        ChoiceOutcome::Chosen { previous: None }
    );
    assert!(delivery_blocking(&s.get_set(sid.clone()).await.expect("get").expect("set")).is_empty());
    assert_eq!(
        s.choose(sid.clone(), 0, None, T0 + 74).await.expect("clear"),
        ChoiceOutcome::Cleared { previous: Some(a0.clone()) }
    );
    assert_eq!(
        s.choose(sid.clone(), 0, None, T0 + 75).await.expect("clear"),
        ChoiceOutcome::Cleared { previous: None }
    );
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    assert_eq!(view.chosen, [None, Some(b0.clone())]);
    let kinds: Vec<&str> = view.timeline.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["created", "chosen", "chosen", "chosen", "choice_cleared"], "a no-change choice writes nothing");
    assert!(
        view.timeline[2].message.en().contains(&a1),
        "a change names what it replaced: {}",
        view.timeline[2].message
    );
    assert_eq!(view.shots[0].status, TaskStatus::Succeeded);
}

async fn an_edit_or_cutout_candidate_is_made_from_an_image_of_its_own_shot(s: Store) {
    use tally::domain::operation::{Operation, Source, SourceKind};
    let SubmitOutcome::Created(sid) =
        s.create_set(set(vec![shot("main", 1), shot("scene", 1)]), T0).await.expect("create")
    else {
        panic!("created")
    };
    let main = run_next(&s, T0 + 10).await;
    let scene = run_next(&s, T0 + 20).await;
    let image = |id: String| {
        let s = s.clone();
        async move { s.get_task(id).await.expect("get").expect("task").artifacts[0].id.clone() }
    };
    let (main_img, scene_img) = (image(main).await, image(scene).await);
    let op = |artifact: &str, operation| CandidateOp {
        operation,
        artifact: artifact.to_string(),
        prompt: if operation == Operation::Edit { "on marble".into() } else { String::new() },
        provider: "p".into(),
    };
    // The scene's image is not an image of the main shot: refused, nothing added.
    let refused = s.add_candidates(sid.clone(), 0, 1, Some(op(&scene_img, Operation::Edit)), T0 + 30).await;
    assert_eq!(refused.expect("add"), AddOutcome::NotOfShot);
    let AddOutcome::Added(new) =
        s.add_candidates(sid.clone(), 0, 1, Some(op(&main_img, Operation::Cutout)), T0 + 31).await.expect("add")
    else {
        panic!("added")
    };
    let t = s.get_task(new[0].clone()).await.expect("get").expect("task");
    assert_eq!((t.operation, t.candidate, t.prompt.as_str()), (Operation::Cutout, 1, ""));
    assert_eq!(t.source, Some(Source { kind: SourceKind::Artifact, id: main_img.clone() }));
    assert_eq!(
        t.source_task,
        s.get_set(sid.clone()).await.expect("get").expect("set").candidates[0][0].id.clone().into()
    );
    // Scheduled like any candidate; once it succeeds it can be chosen.
    let cut = run_next(&s, T0 + 40).await;
    assert_eq!(cut, new[0]);
    let cut_img = image(cut).await;
    let chosen = s.choose(sid.clone(), 0, Some(cut_img.clone()), T0 + 50).await.expect("choose");
    assert!(matches!(chosen, ChoiceOutcome::Chosen { .. }), "{chosen:?}");
    let view = s.get_set(sid).await.expect("get").expect("set");
    assert_eq!(view.chosen[0].as_deref(), Some(cut_img.as_str()));
}
