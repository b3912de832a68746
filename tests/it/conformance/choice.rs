//! Candidates per shot and the owner's choice (`store::choice`), on both backends: candidates
//! are tasks scheduled one at a time like shots, more can be added to one shot, a retried
//! candidate keeps its place, and a choice names only a succeeded candidate of that shot, every
//! change in the set's timeline.

use serde_json::json;
use tally::domain::TaskStatus;
use tally::store::*;

use super::both;
use super::fixtures::ack;
use super::single::{LEASE, T0, artifact, ids};

both!(
    candidates_are_tasks_scheduled_like_shots_and_more_can_be_added,
    a_choice_names_only_a_succeeded_candidate_of_its_shot,
    an_edit_or_cutout_candidate_is_made_from_an_image_of_its_own_shot
);

fn shot(role: &str, candidates: u32) -> NewShot {
    NewShot { role: role.into(), prompt: format!("{role} shot"), params: json!({}), candidates }
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

/// Dispatch the one due task of the set and finish it with an image; its task id.
async fn run_next(s: &Store, now: i64) -> String {
    let b = s.dispatch_due(now, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(b.claims.len(), 1, "one task of a set at a time: {:?}", ids(&b));
    let c = &b.claims[0];
    let f = Finish::Succeeded(artifact(&c.execution_token));
    s.finish(c.execution_token.clone(), c.lease_token.clone(), f, now + 1).await.expect("finish");
    c.task_id.clone()
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
    // One task of the set at a time, shot by shot, candidates in order.
    let mut order = Vec::new();
    for i in 0..3 {
        order.push(run_next(&s, T0 + 10 * (i + 1)).await);
    }
    let want: Vec<String> = view.tasks().map(|t| t.id.clone()).collect();
    assert_eq!(order, want);
    // More candidates for shot 1: queued as its candidates 1 and 2, and run (one at a time).
    let AddOutcome::Added(new) = s.add_candidates(sid.clone(), 1, 2, None, T0 + 100).await.expect("add") else {
        panic!("added")
    };
    assert_eq!(new.len(), 2);
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    assert_eq!(view.candidates[1].iter().map(|t| t.candidate).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(view.candidates[1][1].prompt, view.candidates[1][0].prompt, "the shot's own request");
    assert_eq!(view.candidates[1][1].shot_role.as_deref(), Some("scene"));
    let b = s.dispatch_due(T0 + 101, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b), [new[0].as_str()], "the first new candidate, alone");
    assert_eq!(b.claims[0].candidate, 1, "the claim says which candidate (the demo draws each differently)");
    // Cancel it while the other is still waiting: a retry of it is allowed (one live retry per
    // candidate, not per shot) and takes its place.
    assert_eq!(s.cancel(new[1].clone(), T0 + 102).await.expect("cancel"), CancelOutcome::Canceled);
    let retry = s.retry(new[1].clone(), ack(false), None, T0 + 103).await.expect("retry");
    let RetryOutcome::Created(again) = retry else { panic!("a retry of a canceled candidate: {retry:?}") };
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    let now: Vec<&str> = view.candidates[1].iter().map(|t| t.id.as_str()).collect();
    assert_eq!(now, [view.candidates[1][0].id.as_str(), new[0].as_str(), again.as_str()]);
    assert!(view.replaced.contains(&new[1]), "{:?}", view.replaced);
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
    assert_eq!(delivery_blocking(&view), ["2 shots have no chosen image: Main photo, Lifestyle scene"]);
    for i in 0..3 {
        run_next(&s, T0 + 10 * (i + 1)).await;
    }
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
    assert_eq!(delivery_blocking(&view), ["1 shot has no chosen image: Lifestyle scene"]);
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
    assert!(view.timeline[2].message.contains(&a1), "a change names what it replaced: {}", view.timeline[2].message);
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
