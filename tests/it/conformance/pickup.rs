//! The one-commit pickup (`store::ops::pickup`, issue #28) on both backends: a submit that
//! finds a free slot, with nothing ahead of its task in the fair order, claims it and records
//! `calling` in its own commit; in every other case it is the plain submit. The provider's cap
//! holds with fast submits and dispatches racing (several nodes on PostgreSQL:
//! `nodes_picking_up_at_once_never_exceed_the_providers_slots`, run from `multi`).

use tally::domain::{Phase, TaskStatus};
use tally::store::*;

use super::both;
use super::fixtures::int;
use super::money::{daily, priced};
use super::single::{LEASE, T0, kinds, submit, task};

both!(
    a_free_slot_takes_the_task_to_calling_in_the_submits_commit,
    a_full_slot_a_pause_or_work_ahead_keeps_the_normal_path,
    a_budget_holds_a_fast_submit_before_anything_is_sent,
    a_replayed_key_is_not_picked_up_again,
);

/// The fast path's lease and money facts (a billed call with no price or limit).
pub fn pickup(boot: &str) -> Pickup {
    Pickup { lease_ms: LEASE, boot: boot.into(), node: None, facts: CallingFacts::billed() }
}

/// Submit `prompt` on the fast path; what the store did.
pub async fn fast(s: &Store, prompt: &str, now: i64) -> (String, PickedUp) {
    let (out, _, picked) = s.submit_and_pick_up(task(prompt), now, pickup("boot"), false).await.expect("submit");
    (out.task_id().to_string(), picked)
}

async fn a_free_slot_takes_the_task_to_calling_in_the_submits_commit(s: Store) {
    s.configure_providers(vec![ProviderSlots { reserve: 0, ..ProviderSlots::new("p", 1) }]).await.expect("configure");
    let (out, view, picked) =
        s.submit_and_pick_up(task("fast"), T0, pickup("boot"), true).await.expect("submit and pick up");
    let PickedUp::Calling(c) = picked else { panic!("a free slot and nothing ahead: {picked:?}") };
    let id = out.task_id().to_string();
    assert!(matches!(out, SubmitOutcome::Created(_)));
    assert_eq!(c.task_id, id);
    assert_eq!((c.phase, c.calling_at, c.attempt, c.resumed), (Phase::Calling, Some(T0), 1, false));
    assert_eq!(c.idempotency_key, provider_key(&id, 1));
    // The answer shows the task as committed: running, its attempt counted.
    let view = view.expect("the task as committed");
    assert_eq!((view.status, view.attempts), (TaskStatus::Running, 1));
    assert_eq!(kinds(&s, &id).await, ["submitted", "calling"]);
    assert_eq!(int(&s, "SELECT count(*) FROM executions WHERE phase = 'calling' AND status = 'running'").await, 1);
    assert_eq!(int(&s, "SELECT count(*) FROM envelopes WHERE status = 'sent' AND send_count = 1").await, 1);
    // The one slot is taken: a dispatch claims nothing, a second fast submit waits.
    assert!(s.dispatch_due(T0 + 1, 10, LEASE, "boot").await.expect("dispatch").claims.is_empty());
    let (second, picked) = fast(&s, "second", T0 + 2).await;
    assert!(matches!(picked, PickedUp::No), "{picked:?}");
    assert_eq!(s.get_task(second.clone()).await.expect("get").expect("task").status, TaskStatus::Queued);
    assert_eq!(kinds(&s, &second).await, ["submitted"]);
    // Every write after the claim is fenced on both tokens, as on the normal path.
    let wrong = s.finish(c.execution_token.clone(), "not-the-lease".into(), Finish::CanceledBeforeCall, T0 + 3).await;
    assert!(matches!(wrong, Err(StoreError::Fenced)), "{wrong:?}");
    s.heartbeat(c.execution_token.clone(), c.lease_token.clone(), T0 + 3, LEASE).await.expect("heartbeat");
    let done = Finish::Unknown { reason: "test".into() };
    s.finish(c.execution_token.clone(), c.lease_token.clone(), done, T0 + 4).await.expect("finish");
    // The slot is free again: the waiting task is dispatched as usual.
    let b = s.dispatch_due(T0 + 5, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(b.claims.iter().map(|c| c.task_id.as_str()).collect::<Vec<_>>(), [second.as_str()]);
}

async fn a_full_slot_a_pause_or_work_ahead_keeps_the_normal_path(s: Store) {
    s.configure_providers(vec![ProviderSlots { reserve: 0, ..ProviderSlots::new("p", 2) }]).await.expect("configure");
    // Ready work ahead of it: the fair order would pick that first.
    let older = submit(&s, "older").await;
    let (newer, picked) = fast(&s, "newer", T0 + 1).await;
    assert!(matches!(picked, PickedUp::No), "work ahead: {picked:?}");
    assert_eq!(int(&s, "SELECT count(*) FROM envelopes WHERE status = 'sent'").await, 0, "nothing claimed");
    let b = s.dispatch_due(T0 + 2, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(b.claims.iter().map(|c| c.task_id.as_str()).collect::<Vec<_>>(), [older.as_str(), newer.as_str()]);
    // Both slots in use.
    let (full, picked) = fast(&s, "full", T0 + 3).await;
    assert!(matches!(picked, PickedUp::No), "no free slot: {picked:?}");
    for c in b.claims {
        s.finish(c.execution_token, c.lease_token, Finish::CanceledBeforeCall, T0 + 4).await.expect("finish");
    }
    let b = s.dispatch_due(T0 + 5, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(b.claims.len(), 1, "{full} dispatched");
    // A paused provider, with a free slot and nothing ahead.
    s.pause_provider(
        "p".into(),
        tally::store::Pause { until: T0 + 1_000, reason: tally::store::PauseReason::Circuit, at: 0, why: None },
    )
    .await
    .expect("pause");
    let (_, picked) = fast(&s, "paused", T0 + 10).await;
    assert!(matches!(picked, PickedUp::No), "paused: {picked:?}");
    assert_eq!(int(&s, "SELECT count(*) FROM executions WHERE phase = 'calling'").await, 0);
}

async fn a_budget_holds_a_fast_submit_before_anything_is_sent(s: Store) {
    let p = Pickup { facts: priced(40_000, vec![daily(30_000)]), ..pickup("boot") };
    let (out, _, picked) = s.submit_and_pick_up(task("too dear"), T0, p, false).await.expect("submit");
    let PickedUp::Held { due_at, reason } = picked else { panic!("over the budget: {picked:?}") };
    assert!(due_at > T0 && !reason.is_empty(), "{due_at} {reason}");
    let t = s.get_task(out.task_id().into()).await.expect("get").expect("task");
    assert_eq!((t.status, t.attempts), (TaskStatus::Waiting, 0));
    assert_eq!(int(&s, "SELECT count(*) FROM executions WHERE calling_at IS NOT NULL").await, 0, "nothing sent");
    assert_eq!(int(&s, "SELECT count(*) FROM executions WHERE status = 'abandoned'").await, 1);
    assert_eq!(int(&s, "SELECT send_count FROM envelopes").await, 0, "not counted as a lost dispatch");
}

async fn a_replayed_key_is_not_picked_up_again(s: Store) {
    let keyed = || NewTask { idempotency_key: Some("k".into()), ..task("keyed") };
    let (first, _, picked) = s.submit_and_pick_up(keyed(), T0, pickup("boot"), false).await.expect("submit");
    assert!(matches!(picked, PickedUp::Calling(_)), "{picked:?}");
    let (again, _, picked) = s.submit_and_pick_up(keyed(), T0 + 1, pickup("boot"), false).await.expect("again");
    assert_eq!(again, SubmitOutcome::Existing(first.task_id().into()));
    assert!(matches!(picked, PickedUp::No), "{picked:?}");
    assert_eq!(int(&s, "SELECT count(*) FROM executions").await, 1);
}

/// Nodes submitting on the fast path and dispatching at once, on a provider with 5 slots: no
/// more than 5 calls are ever out, whichever path claimed them, and every slot is used.
pub async fn nodes_picking_up_at_once_never_exceed_the_providers_slots(n: Vec<Store>) {
    n[0].configure_providers(vec![ProviderSlots { reserve: 0, ..ProviderSlots::new("p", 5) }])
        .await
        .expect("configure");
    let mut handles = Vec::new();
    for (i, s) in n.iter().enumerate() {
        for j in 0..8 {
            let s = s.clone();
            handles.push(tokio::spawn(async move {
                let boot = format!("boot-{i}");
                let (_, _, picked) =
                    s.submit_and_pick_up(task(&format!("n{i} t{j}")), T0, pickup(&boot), false).await.expect("submit");
                let dispatched = s.dispatch_due(T0, 2, LEASE, &boot).await.expect("dispatch").claims.len();
                usize::from(matches!(picked, PickedUp::Calling(_))) + dispatched
            }));
        }
    }
    let mut total = 0;
    for h in handles {
        total += h.await.expect("node");
    }
    // Whatever the races left ready is dispatched now, still within the slots.
    total += n[0].dispatch_due(T0 + 1, 100, LEASE, "boot-last").await.expect("dispatch").claims.len();
    assert_eq!(total, 5, "all slots used, none twice");
    assert_eq!(int(&n[0], "SELECT count(*) FROM envelopes WHERE status = 'sent'").await, 5);
}
