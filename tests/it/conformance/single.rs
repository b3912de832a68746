//! Group A: every single-operation rule of the store, on both backends. Times are explicit
//! (`T0` and offsets), never the wall clock.
//!
//! Longer than 600 lines: one short test per store rule, all run on both backends through the
//! same `both!` list; keeping them together keeps that list complete.

use crate::common::En;
use serde_json::json;
use tally::domain::{FailureKind, Phase, TaskStatus};
use tally::store::*;

use super::both;
use super::fixtures::{ack, int, search, with_status};

pub const T0: i64 = 1_000_000;
pub const LEASE: i64 = 30_000;

pub fn task(prompt: &str) -> NewTask {
    NewTask { provider: "p".into(), prompt: prompt.into(), ..NewTask::default() }
}

pub async fn submit(s: &Store, prompt: &str) -> String {
    s.submit(task(prompt), T0).await.expect("submit").task_id().to_string()
}

/// Dispatch everything ready at `now` (as process run `boot`) and return the claim of `id`.
pub async fn claimed(s: &Store, id: &str, now: i64, boot: &str) -> Claim {
    let batch = s.dispatch_due(now, 100, LEASE, boot).await.expect("dispatch");
    batch.claims.into_iter().find(|c| c.task_id == id).expect("claimed")
}

/// The task ids a dispatch claimed, in order.
pub fn ids(b: &DispatchBatch) -> Vec<&str> {
    b.claims.iter().map(|c| c.task_id.as_str()).collect()
}

pub async fn status(s: &Store, id: &str) -> TaskStatus {
    s.get_task(id.into()).await.expect("get").expect("exists").status
}

pub async fn kinds(s: &Store, id: &str) -> Vec<String> {
    s.events(id.into()).await.expect("events").into_iter().map(|e| e.kind).collect()
}

/// A small "image" (the PNG signature and some distinct bytes: what the store checks).
pub fn png(tag: &str) -> Vec<u8> {
    let mut b = b"\x89PNG\r\n\x1a\n".to_vec();
    b.extend_from_slice(tag.as_bytes());
    b.extend_from_slice(&[0u8; 64]);
    b
}

/// A verified artifact made from [`png`]`(tag)`.
pub fn artifact(tag: &str) -> NewArtifact {
    NewArtifact::new(NewImage::verify(png(tag)).expect("a png"))
}

both!(
    submit_writes_task_envelope_and_event_at_once,
    same_key_same_request_is_existing_and_different_is_conflict,
    dispatch_claims_at_most_the_limit_in_order_and_reports_the_next_due,
    a_dispatch_claims_once_with_a_lease_and_a_new_execution,
    a_saturated_or_paused_provider_is_not_dispatched_to_and_nothing_is_written,
    lanes_interleave_by_weight_and_keys_take_turns,
    a_long_queue_is_counted_only_up_to_100_in_a_wait_reason,
    the_recovery_lane_keeps_the_reserve_free_and_slow_starts_after_a_pause,
    a_claim_handed_back_before_calling_counts_nothing,
    calling_is_recorded_once_from_claimed_and_counts_the_attempt,
    accepted_job_id_is_kept_and_a_resumed_claim_adopts_the_execution,
    every_post_claim_write_is_fenced_after_a_requeue,
    finish_succeeded_attaches_the_artifact_and_consumes_the_envelope,
    finish_failed_unknown_and_canceled_settle_the_task,
    retry_later_requeues_until_attempts_are_used_up,
    a_not_now_is_not_an_attempt_and_reuses_its_key,
    late_result_resolves_only_an_unknown_execution,
    cancel_is_immediate_before_sending_and_a_request_while_running,
    retry_needs_acknowledgement_after_a_possible_charge_and_makes_a_new_task,
    resolve_only_an_unknown_task,
    leftovers_are_expired_leases_and_leases_of_earlier_runs,
    recovery_applies_each_decision_and_skips_what_changed,
    sets_run_one_shot_at_a_time_and_cancel_the_unsent,
    uploads_are_deduplicated_by_content,
    a_stored_image_streams_back_in_chunks_as_it_was_stored,
    lists_page_by_id_and_count_by_status,
    a_search_finds_a_prompt_or_a_sets_product_in_any_case,
    an_idle_store_runs_no_statements,
);

async fn submit_writes_task_envelope_and_event_at_once(s: Store) {
    let (out, view) = s.submit_and_get(task("one"), T0).await.expect("submit");
    let SubmitOutcome::Created(id) = out else { panic!("not created: {out:?}") };
    let view = view.expect("view read in the same operation");
    assert_eq!((view.status, view.attempts, view.charge.state), (TaskStatus::Queued, 0, tally::domain::Charge::None));
    assert_eq!((view.created_at, view.updated_at), (T0, T0));
    assert_eq!(kinds(&s, &id).await, ["submitted"]);
    assert_eq!(int(&s, "SELECT count(*) FROM envelopes WHERE status = 'pending'").await, 1);
    assert_eq!(s.next_sent_deadline().await.expect("deadline"), None);
}

async fn same_key_same_request_is_existing_and_different_is_conflict(s: Store) {
    let keyed = |prompt: &str| NewTask { idempotency_key: Some("k-1".into()), ..task(prompt) };
    let SubmitOutcome::Created(id) = s.submit(keyed("a"), T0).await.expect("first") else { panic!() };
    assert_eq!(s.submit(keyed("a"), T0 + 1).await.expect("again"), SubmitOutcome::Existing(id.clone()));
    assert_eq!(s.submit(keyed("b"), T0 + 2).await.expect("other"), SubmitOutcome::Conflict(id.clone()));
    let with_params = NewTask { params: json!({"size": "512x512"}), ..keyed("a") };
    assert_eq!(s.submit(with_params, T0 + 3).await.expect("params"), SubmitOutcome::Conflict(id));
    assert_eq!(int(&s, "SELECT count(*) FROM tasks").await, 1);
}

async fn dispatch_claims_at_most_the_limit_in_order_and_reports_the_next_due(s: Store) {
    let mut ids_ = Vec::new();
    for i in 0..3 {
        ids_.push(s.submit(task(&format!("t{i}")), T0 + i).await.expect("submit").task_id().to_string());
    }
    let b = s.dispatch_due(T0 + 2, 1, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b), [ids_[0].as_str()]);
    let c = &b.claims[0];
    assert_eq!((c.send_count, c.due_at, c.provider.as_str(), c.lane), (1, T0, "p", Lane::Fresh));
    assert_eq!(b.next_due, None, "nothing waits for a time: the rest is ready");
    let b = s.dispatch_due(T0 + 2, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b), [ids_[1].as_str(), ids_[2].as_str()], "in submit order");
    assert_eq!(s.next_sent_deadline().await.expect("deadline"), Some(T0 + 2 + LEASE));
    let b = s.dispatch_due(T0 + 5, 0, LEASE, "boot").await.expect("dispatch");
    assert!(b.claims.is_empty(), "limit 0 claims nothing");
}

async fn a_dispatch_claims_once_with_a_lease_and_a_new_execution(s: Store) {
    let id = submit(&s, "claim").await;
    let c = claimed(&s, &id, T0, "boot").await;
    assert_eq!((c.attempt, c.phase, c.resumed), (1, Phase::Claimed, false));
    assert_eq!(c.idempotency_key, provider_key(&id, 1), "the key is derived from the task and attempt");
    assert!(!c.lease_token.is_empty() && !c.execution_token.is_empty());
    assert!(s.dispatch_due(T0, 10, LEASE, "boot").await.expect("dispatch").claims.is_empty(), "claimed once");
    assert_eq!(status(&s, &id).await, TaskStatus::Running);
    assert_eq!(int(&s, "SELECT count(*) FROM executions").await, 1);
    assert_eq!(s.next_sent_deadline().await.expect("deadline"), Some(T0 + LEASE));
    assert_eq!(kinds(&s, &id).await, ["submitted"], "a claim writes no timeline event");
}

async fn a_saturated_or_paused_provider_is_not_dispatched_to_and_nothing_is_written(s: Store) {
    s.configure_providers(vec![ProviderSlots::new("p", 1)]).await.expect("configure");
    let first = submit(&s, "first").await;
    let second = submit(&s, "second").await;
    let c = claimed(&s, &first, T0, "boot").await;
    for round in 1..=3 {
        let b = s.dispatch_due(T0 + round, 10, LEASE, "boot").await.expect("dispatch");
        assert!(b.claims.is_empty(), "round {round}: no free slot, nothing claimed");
        assert_eq!(b.next_due, None, "a finished call wakes the dispatcher, not a timer");
    }
    let t = s.get_task(second.clone()).await.expect("get").expect("task");
    assert_eq!((t.status, t.attempts), (TaskStatus::Queued, 0));
    assert!(t.reason.en().contains("free slot at p (all 1 of its slots are in use)"), "{:?}", t.reason);
    assert_eq!(kinds(&s, &second).await, ["submitted"]);
    assert_eq!(int(&s, "SELECT send_count FROM envelopes WHERE status = 'pending'").await, 0);
    // The slot frees while the provider is paused: still nothing, until the pause ends.
    let pause =
        |until, reason, at, why: Option<&str>| tally::store::Pause { until, reason, at, why: why.map(str::to_string) };
    let circuit = tally::store::PauseReason::Circuit;
    let rate = tally::store::PauseReason::RateLimit;
    s.pause_provider("p".into(), pause(T0 + 5_000, circuit, T0, Some("HTTP 503: overloaded"))).await.expect("pause");
    s.finish(c.execution_token, c.lease_token, Finish::CanceledBeforeCall, T0 + 10).await.expect("finish");
    let b = s.dispatch_due(T0 + 20, 10, LEASE, "boot").await.expect("dispatch");
    assert!(b.claims.is_empty(), "paused");
    assert_eq!(b.next_due, Some(T0 + 5_000), "the dispatcher wakes when the pause ends");
    let t = s.get_task(second.clone()).await.expect("get").expect("task");
    assert!(
        t.reason.en().contains("(the last time: HTTP 503: overloaded); tally has paused new calls"),
        "{:?}",
        t.reason
    );
    // A rate-limit hold that ends later is told as one, not as an outage (the reason follows
    // the pause that ends last); a shorter one changes nothing.
    s.pause_provider("p".into(), pause(T0 + 4_000, rate, T0 + 10, None)).await.expect("pause");
    let t = s.get_task(second.clone()).await.expect("get").expect("task");
    assert!(t.reason.en().contains("failed several times"), "{:?}", t.reason);
    s.pause_provider("p".into(), pause(T0 + 6_000, rate, T0 + 20, None)).await.expect("pause");
    let t = s.get_task(second.clone()).await.expect("get").expect("task");
    let why = t.reason.en();
    // How long the provider asked for: from the hold's start to its end (5.98 s, told as 6 s).
    assert!(why.contains("asked tally to wait 6 s (a rate limit)") && !why.contains("failed"), "{why}");
    let b = s.dispatch_due(T0 + 5_000, 10, LEASE, "boot").await.expect("dispatch");
    assert!(b.claims.is_empty(), "held");
    let b = s.dispatch_due(T0 + 6_000, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b), [second.as_str()]);
}

/// Fill the recovery lane: `n` tasks claimed by an earlier run and abandoned by recovery
/// (with the default provider `p`; the caller configures its own afterwards).
async fn recovered(s: &Store, n: usize, tag: &str) -> Vec<String> {
    s.configure_providers(super::fixtures::provider_p()).await.expect("configure");
    let mut out = Vec::new();
    for i in 0..n {
        out.push(submit(s, &format!("{tag} {i}")).await);
    }
    s.dispatch_due(T0, 1000, LEASE, "old").await.expect("dispatch");
    let rows = s.leftovers(T0 + 1, "new").await.expect("leftovers");
    let items: Vec<_> = rows.into_iter().map(|r| (r, Recovery::Abandon)).collect();
    assert_eq!(s.apply_recovery(items, T0 + 1).await.expect("apply").len(), n);
    out
}

/// Claim one at a time (a provider with one slot) and finish each: the dispatch order.
async fn order_of(s: &Store, n: usize, now: i64) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..n {
        let b = s.dispatch_due(now + i as i64, 1, LEASE, "new").await.expect("dispatch");
        let Some(c) = b.claims.into_iter().next() else { break };
        out.push(c.task_id.clone());
        s.finish(c.execution_token, c.lease_token, Finish::CanceledBeforeCall, now + i as i64).await.expect("finish");
    }
    out
}

/// Regression (HTTP submit fell from ~7,600 to ~1,500 requests/s with a growing queue): a wait
/// reason counted every earlier task, walking the index once per task for every submit's
/// answer and every listed job. It counts at most 100 now, and says so.
async fn a_long_queue_is_counted_only_up_to_100_in_a_wait_reason(s: Store) {
    let mut ids = Vec::new();
    for i in 0..150 {
        let t = NewTask { group: Some("batch".into()), ..task(&format!("batch {i}")) };
        ids.push(s.submit(t, T0).await.expect("submit").task_id().to_string());
    }
    let reason = |id: &str| {
        let s = &s;
        let id = id.to_string();
        async move { s.get_task(id).await.expect("get").expect("task").waiting_for.en() }
    };
    assert_eq!(reason(&ids[49]).await, "Queued behind 49 earlier tasks of this group.");
    assert_eq!(reason(&ids[149]).await, "Queued behind 100 or more earlier tasks of this group.");
}

async fn lanes_interleave_by_weight_and_keys_take_turns(s: Store) {
    let r = recovered(&s, 5, "recovered").await;
    s.configure_providers(vec![ProviderSlots { reserve: 0, ..ProviderSlots::new("p", 1) }]).await.expect("configure");
    let mut f = Vec::new();
    for i in 0..5 {
        f.push(s.submit(task(&format!("fresh {i}")), T0 + 2).await.expect("submit").task_id().to_string());
    }
    let got = order_of(&s, 10, T0 + 3).await;
    let want = [&r[0], &f[0], &f[1], &f[2], &f[3], &r[1], &f[4], &r[2], &r[3], &r[4]];
    assert_eq!(got.iter().collect::<Vec<_>>(), want, "fresh 4 : recovery 1, never starved");
    // Within a lane, fairness keys take turns: a group's batch does not hold back another's task.
    let grouped = |g: &str, i: usize| NewTask { group: Some(g.into()), ..task(&format!("{g} {i}")) };
    let mut a = Vec::new();
    for i in 0..3 {
        a.push(s.submit(grouped("a", i), T0 + 20).await.expect("submit").task_id().to_string());
    }
    let b = s.submit(grouped("b", 0), T0 + 21).await.expect("submit").task_id().to_string();
    let t = s.get_task(a[2].clone()).await.expect("get").expect("task");
    assert!(t.reason.en().contains("Queued behind 2 earlier tasks of this group"), "{:?}", t.reason);
    assert_eq!(order_of(&s, 4, T0 + 30).await, [a[0].clone(), b, a[1].clone(), a[2].clone()]);
}

async fn the_recovery_lane_keeps_the_reserve_free_and_slow_starts_after_a_pause(s: Store) {
    recovered(&s, 30, "backlog").await;
    s.configure_providers(vec![ProviderSlots { reserve: 2, ..ProviderSlots::new("p", 8) }]).await.expect("configure");
    let b = s.dispatch_due(T0 + 2, 100, LEASE, "new").await.expect("dispatch");
    assert_eq!(b.claims.len(), 6, "8 slots minus the reserve of 2");
    assert!(b.claims.iter().all(|c| c.lane == Lane::Recovery && !c.slow_start));
    let fresh = s.submit(task("clicked just now"), T0 + 3).await.expect("submit").task_id().to_string();
    assert_eq!(ids(&s.dispatch_due(T0 + 3, 100, LEASE, "new").await.expect("dispatch")), [fresh.as_str()]);
    for c in b.claims {
        s.finish(c.execution_token, c.lease_token, Finish::CanceledBeforeCall, T0 + 4).await.expect("finish");
    }
    // An outage: the circuit opens; when it closes, the recovery lane starts at one call and
    // grows with each success (1, 2, 4, …), halving on an overload answer.
    s.pause_provider(
        "p".into(),
        tally::store::Pause { until: T0 + 10_000, reason: tally::store::PauseReason::Circuit, at: 0, why: None },
    )
    .await
    .expect("pause");
    let mut rounds = Vec::new();
    let mut now = T0 + 10_000;
    for round in 0..4 {
        let b = s.dispatch_due(now, 100, LEASE, "new").await.expect("dispatch");
        assert!(b.claims.iter().all(|c| c.lane == Lane::Recovery));
        assert!(round == 3 || b.claims.iter().all(|c| c.slow_start), "round {round} is in the slow start");
        rounds.push(b.claims.len());
        for c in b.claims {
            if c.slow_start {
                s.slow_start_feedback("p".into(), true).await.expect("feedback");
            }
            s.finish(c.execution_token, c.lease_token, Finish::CanceledBeforeCall, now).await.expect("finish");
        }
        now += 1;
    }
    assert_eq!(rounds, [1, 2, 4, 6], "1, 2, 4, then the cap (8 − reserve 2)");
    s.pause_provider(
        "p".into(),
        tally::store::Pause { until: now + 10, reason: tally::store::PauseReason::Circuit, at: 0, why: None },
    )
    .await
    .expect("pause");
    let b = s.dispatch_due(now + 10, 100, LEASE, "new").await.expect("dispatch");
    assert_eq!(b.claims.len(), 1);
    s.slow_start_feedback("p".into(), true).await.expect("feedback"); // limit 2
    s.slow_start_feedback("p".into(), true).await.expect("feedback"); // limit 3
    s.slow_start_feedback("p".into(), true).await.expect("feedback"); // limit 4
    s.slow_start_feedback("p".into(), false).await.expect("feedback"); // a 429: 2
    let b2 = s.dispatch_due(now + 11, 100, LEASE, "new").await.expect("dispatch");
    assert_eq!(b2.claims.len(), 1, "halved to 2, one of them still in flight");
}

async fn a_claim_handed_back_before_calling_counts_nothing(s: Store) {
    let id = submit(&s, "paused after the dispatch").await;
    let c = claimed(&s, &id, T0, "boot").await;
    let why = "Provider `p` paused.".to_string();
    s.release_claim(c.execution_token.clone(), c.lease_token.clone(), T0 + 5_000, why.clone(), T0 + 1)
        .await
        .expect("release");
    let again = s.release_claim(c.execution_token.clone(), c.lease_token.clone(), T0 + 5_000, why, T0 + 2).await;
    assert!(matches!(again, Err(StoreError::Fenced)), "{again:?}");
    assert!(matches!(
        s.record_calling(c.execution_token, c.lease_token, T0 + 2, CallingFacts::billed()).await,
        Err(StoreError::Fenced)
    ));
    let t = s.get_task(id.clone()).await.expect("get").expect("task");
    assert_eq!((t.status, t.attempts), (TaskStatus::Waiting, 0));
    assert_eq!(int(&s, "SELECT send_count FROM envelopes").await, 0, "not a lost dispatch");
    let b = s.dispatch_due(T0 + 4_999, 10, LEASE, "boot").await.expect("dispatch");
    assert!(b.claims.is_empty());
    assert_eq!(b.next_due, Some(T0 + 5_000));
    let c = claimed(&s, &id, T0 + 5_000, "boot").await;
    assert_eq!((c.lane, c.attempt, c.resumed), (Lane::Recovery, 1, false));
}

async fn calling_is_recorded_once_from_claimed_and_counts_the_attempt(s: Store) {
    let id = submit(&s, "calling").await;
    let c = claimed(&s, &id, T0, "boot").await;
    s.record_calling(c.execution_token.clone(), c.lease_token.clone(), T0 + 1, CallingFacts::billed())
        .await
        .expect("calling");
    let again =
        s.record_calling(c.execution_token.clone(), c.lease_token.clone(), T0 + 2, CallingFacts::billed()).await;
    assert!(matches!(again, Err(StoreError::Fenced)), "calling only from claimed: {again:?}");
    let t = s.get_task(id.clone()).await.expect("get").expect("task");
    assert_eq!((t.attempts, t.charge.state), (1, tally::domain::Charge::Possible));
    assert_eq!(kinds(&s, &id).await, ["submitted", "calling"]);
    let wrong =
        s.record_calling(c.execution_token.clone(), "not-my-lease".into(), T0 + 3, CallingFacts::billed()).await;
    assert!(matches!(wrong, Err(StoreError::Fenced)));
    let nobody = s.record_calling("no-such-token".into(), c.lease_token, T0 + 3, CallingFacts::billed()).await;
    assert!(matches!(nobody, Err(StoreError::Fenced)));
}

async fn accepted_job_id_is_kept_and_a_resumed_claim_adopts_the_execution(s: Store) {
    let id = submit(&s, "accepted").await;
    let c = claimed(&s, &id, T0, "boot-1").await;
    s.record_calling(c.execution_token.clone(), c.lease_token.clone(), T0 + 1, CallingFacts::billed())
        .await
        .expect("calling");
    let handle = Some(r#"{"status_url":"https://queue.example/s/7"}"#.to_string());
    s.record_accepted_with(c.execution_token.clone(), c.lease_token.clone(), "job-7".into(), handle.clone(), T0 + 2)
        .await
        .expect("accepted");
    // The run dies; a later run recovers by resuming the same execution.
    let rows = s.leftovers(T0 + 3, "boot-2").await.expect("leftovers");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].execution, Some((c.execution_token.clone(), Phase::Accepted)));
    let applied = s.apply_recovery(vec![(rows[0].clone(), Recovery::Resume)], T0 + 4).await.expect("apply");
    assert_eq!(applied, [(id.clone(), TaskStatus::Waiting)]);
    let again = claimed(&s, &id, T0 + 5, "boot-2").await;
    assert_eq!(again.execution_token, c.execution_token, "the same execution, not a new attempt");
    assert_eq!((again.phase, again.resumed, again.attempt), (Phase::Accepted, true, 1));
    assert_eq!(again.job_id.as_deref(), Some("job-7"));
    assert_eq!(again.job_handle, handle, "the adapter's handle comes back with the job id");
    assert_eq!(c.job_handle, None);
    assert_eq!(again.calling_at, Some(T0 + 1));
    assert_eq!(again.idempotency_key, c.idempotency_key);
    assert_eq!(int(&s, "SELECT count(*) FROM executions").await, 1);
    assert_eq!(kinds(&s, &id).await.last().map(String::as_str), Some("resumed"));
}

async fn every_post_claim_write_is_fenced_after_a_requeue(s: Store) {
    let id = submit(&s, "fenced").await;
    let c = claimed(&s, &id, T0, "boot").await;
    let rows = s.leftovers(T0 + LEASE + 1, "boot").await.expect("leftovers");
    assert_eq!(rows.len(), 1, "the lease expired");
    s.apply_recovery(vec![(rows[0].clone(), Recovery::Abandon)], T0 + LEASE + 1).await.expect("abandon");
    let (x, l) = (c.execution_token.clone(), c.lease_token.clone());
    assert!(matches!(
        s.record_calling(x.clone(), l.clone(), T0 + LEASE + 2, CallingFacts::billed()).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        s.record_accepted(x.clone(), l.clone(), "j".into(), T0 + LEASE + 2).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(s.heartbeat(x.clone(), l.clone(), T0 + LEASE + 2, LEASE).await, Err(StoreError::Fenced)));
    let f = Finish::Succeeded(artifact(&x));
    assert!(matches!(s.finish(x.clone(), l, f, T0 + LEASE + 2).await, Err(StoreError::Fenced)));
    assert_eq!(int(&s, "SELECT count(*) FROM artifacts").await, 0, "a fenced write writes nothing");
    assert_eq!(status(&s, &id).await, TaskStatus::Waiting);
    assert_eq!(int(&s, "SELECT count(*) FROM executions WHERE status = 'abandoned'").await, 1);
}

async fn finish_succeeded_attaches_the_artifact_and_consumes_the_envelope(s: Store) {
    let id = submit(&s, "ok").await;
    let c = claimed(&s, &id, T0, "boot").await;
    s.record_calling(c.execution_token.clone(), c.lease_token.clone(), T0 + 1, CallingFacts::billed())
        .await
        .expect("calling");
    s.heartbeat(c.execution_token.clone(), c.lease_token.clone(), T0 + 2, LEASE).await.expect("heartbeat");
    assert_eq!(s.next_sent_deadline().await.expect("deadline"), Some(T0 + 2 + LEASE), "the heartbeat moved the lease");
    let a = artifact(&c.execution_token);
    let st = s.finish(c.execution_token.clone(), c.lease_token.clone(), Finish::Succeeded(a.clone()), T0 + 3).await;
    assert_eq!(st.expect("finish"), TaskStatus::Succeeded);
    let t = s.get_task(id.clone()).await.expect("get").expect("task");
    assert_eq!(t.status, TaskStatus::Succeeded);
    assert_eq!(t.artifacts.len(), 1);
    assert_eq!((t.artifacts[0].sha256.as_str(), t.artifacts[0].bytes), (a.image.sha256(), a.image.len()));
    let got = s.artifact(a.id.clone()).await.expect("artifact").expect("exists");
    assert_eq!((got.task_id.as_str(), got.media_type.as_str()), (id.as_str(), "image/png"));
    let (meta, bytes) = s.read_image_bytes(a.id.clone()).await.expect("read").expect("stored");
    assert_eq!(bytes, png(&c.execution_token), "the bytes committed with the finish");
    assert_eq!((meta.sha256.as_str(), meta.bytes), (a.image.sha256(), a.image.len()));
    assert_eq!(int(&s, "SELECT count(*) FROM envelopes WHERE status = 'consumed'").await, 1);
    assert_eq!(s.next_sent_deadline().await.expect("deadline"), None);
    let again = s.finish(c.execution_token, c.lease_token, Finish::Succeeded(artifact("x")), T0 + 4).await;
    assert!(matches!(again, Err(StoreError::Fenced)), "an execution finishes once");
}

async fn finish_failed_unknown_and_canceled_settle_the_task(s: Store) {
    let cases = [
        (
            Finish::Failed {
                kind: FailureKind::Rejected,
                reason: "bad prompt".into(),
                charge: tally::domain::Charge::Refused,
            },
            TaskStatus::Failed,
            "failed",
        ),
        (Finish::Unknown { reason: "timed out".into() }, TaskStatus::Unknown, "unknown"),
        (Finish::CanceledBeforeCall, TaskStatus::Canceled, "canceled"),
    ];
    for (i, (f, want, kind)) in cases.into_iter().enumerate() {
        let id = submit(&s, &format!("settle {i}")).await;
        let c = claimed(&s, &id, T0 + i as i64, "boot").await;
        let st = s.finish(c.execution_token, c.lease_token, f, T0 + 10).await.expect("finish");
        assert_eq!(st, want);
        assert_eq!(status(&s, &id).await, want);
        assert_eq!(kinds(&s, &id).await.last().map(String::as_str), Some(kind));
    }
    let t = s.list_tasks(with_status(Some(TaskStatus::Failed)), None, 10).await.expect("list");
    assert_eq!(t[0].failure_kind.as_deref(), Some("rejected"));
    assert_eq!(int(&s, "SELECT count(*) FROM envelopes WHERE status = 'consumed'").await, 3);
}

async fn retry_later_requeues_until_attempts_are_used_up(s: Store) {
    let id = submit(&s, "retry later").await;
    for attempt in 1..=2i64 {
        let now = T0 + attempt * 10_000;
        let c = claimed(&s, &id, now, "boot").await;
        assert_eq!(c.attempt, attempt);
        s.record_calling(c.execution_token.clone(), c.lease_token.clone(), now, CallingFacts::billed())
            .await
            .expect("calling");
        let f = Finish::RetryLater {
            due_at: now + 5_000,
            kind: FailureKind::RateLimited,
            reason: "429".into(),
            max_attempts: 2,
            charge: tally::domain::Charge::Refused,
            counted: true,
        };
        let st = s.finish(c.execution_token, c.lease_token, f, now + 1).await.expect("finish");
        if attempt == 1 {
            assert_eq!(st, TaskStatus::Waiting);
            let b = s.dispatch_due(now + 4_999, 10, LEASE, "boot").await.expect("dispatch");
            assert!(b.claims.is_empty(), "not before its due time");
            assert_eq!(b.next_due, Some(now + 5_000));
        } else {
            assert_eq!(st, TaskStatus::Failed, "attempts used up");
        }
    }
    let t = s.get_task(id.clone()).await.expect("get").expect("task");
    assert_eq!((t.status, t.attempts, t.failure_kind.as_deref()), (TaskStatus::Failed, 2, Some("rate_limited")));
    assert!(kinds(&s, &id).await.contains(&"retry_scheduled".to_string()));
}

/// A "not now" (a 429 the provider refused) is not an attempt: three of them with
/// `max_attempts = 2` leave the task waiting, at attempt 1 with the same idempotency key each
/// time (the refused request's key, which is right to reuse), and no dispatch counted as lost.
async fn a_not_now_is_not_an_attempt_and_reuses_its_key(s: Store) {
    let id = submit(&s, "not now").await;
    for round in 1..=3i64 {
        let now = T0 + round * 10_000;
        let c = claimed(&s, &id, now, "boot").await;
        assert_eq!((c.attempt, c.idempotency_key.as_str()), (1, provider_key(&id, 1).as_str()), "round {round}");
        s.record_calling(c.execution_token.clone(), c.lease_token.clone(), now, CallingFacts::billed())
            .await
            .expect("calling");
        let f = Finish::RetryLater {
            due_at: now + 5_000,
            kind: FailureKind::RateLimited,
            reason: "HTTP 429: slow down".into(),
            max_attempts: 2,
            charge: tally::domain::Charge::Refused,
            counted: false,
        };
        let st = s.finish(c.execution_token, c.lease_token, f, now + 1).await.expect("finish");
        assert_eq!(st, TaskStatus::Waiting, "round {round}: a not-now never uses up the attempts");
        assert_eq!(int(&s, "SELECT send_count FROM envelopes").await, 0, "not a lost dispatch");
    }
    let t = s.get_task(id.clone()).await.expect("get").expect("task");
    assert_eq!((t.status, t.attempts), (TaskStatus::Waiting, 0));
    assert!(t.reason.en().contains("did not take the request yet"), "{:?}", t.reason);
    // Then it goes through, still as attempt 1.
    let c = claimed(&s, &id, T0 + 50_000, "boot").await;
    assert_eq!(c.attempt, 1);
}

async fn late_result_resolves_only_an_unknown_execution(s: Store) {
    let id = submit(&s, "late").await;
    let c = claimed(&s, &id, T0, "boot").await;
    assert!(
        !s.late_result(c.execution_token.clone(), artifact(&c.execution_token), T0 + 1).await.expect("late"),
        "running"
    );
    s.record_calling(c.execution_token.clone(), c.lease_token.clone(), T0 + 1, CallingFacts::billed())
        .await
        .expect("calling");
    s.finish(c.execution_token.clone(), c.lease_token, Finish::Unknown { reason: "lost".into() }, T0 + 2)
        .await
        .expect("unknown");
    assert!(!s.late_result("other-token".into(), artifact("other"), T0 + 3).await.expect("late"));
    assert!(s.late_result(c.execution_token.clone(), artifact(&c.execution_token), T0 + 3).await.expect("late"));
    assert_eq!(status(&s, &id).await, TaskStatus::Succeeded);
    assert!(!s.late_result(c.execution_token.clone(), artifact("again"), T0 + 4).await.expect("late"), "only once");
    assert_eq!(int(&s, "SELECT count(*) FROM artifacts").await, 1);
}

async fn cancel_is_immediate_before_sending_and_a_request_while_running(s: Store) {
    let queued = submit(&s, "queued").await;
    assert_eq!(s.cancel(queued.clone(), T0 + 1).await.expect("cancel"), CancelOutcome::Canceled);
    assert_eq!(status(&s, &queued).await, TaskStatus::Canceled);
    assert!(s.dispatch_due(T0 + 2, 10, LEASE, "boot").await.expect("dispatch").claims.is_empty());
    let running = submit(&s, "running").await;
    let c = claimed(&s, &running, T0 + 3, "boot").await;
    assert_eq!(s.cancel(running.clone(), T0 + 4).await.expect("cancel"), CancelOutcome::Requested);
    let t = s.get_task(running.clone()).await.expect("get").expect("task");
    assert!(t.cancel_requested);
    s.finish(c.execution_token.clone(), c.lease_token, Finish::Succeeded(artifact(&c.execution_token)), T0 + 5)
        .await
        .expect("finish");
    let t = s.get_task(running.clone()).await.expect("get").expect("task");
    assert_eq!(t.status, TaskStatus::Succeeded, "the paid result is kept");
    assert!(t.reason.en().contains("cancel was requested"));
    assert_eq!(s.cancel(running, T0 + 6).await.expect("cancel"), CancelOutcome::Settled(TaskStatus::Succeeded));
    assert_eq!(s.cancel("no-such-task".into(), T0 + 6).await.expect("cancel"), CancelOutcome::NotFound);
}

async fn retry_needs_acknowledgement_after_a_possible_charge_and_makes_a_new_task(s: Store) {
    let id = submit(&s, "retry me").await;
    assert_eq!(
        s.retry(id.clone(), ack(false), None, T0).await.expect("retry"),
        RetryOutcome::NotRetryable(TaskStatus::Queued)
    );
    let c = claimed(&s, &id, T0, "boot").await;
    s.record_calling(c.execution_token.clone(), c.lease_token.clone(), T0 + 1, CallingFacts::billed())
        .await
        .expect("calling");
    s.finish(c.execution_token, c.lease_token, Finish::Unknown { reason: "lost".into() }, T0 + 2)
        .await
        .expect("unknown");
    assert_eq!(s.retry(id.clone(), ack(false), None, T0 + 3).await.expect("retry"), RetryOutcome::NeedsAcknowledgement);
    let RetryOutcome::Created(new) = s.retry(id.clone(), ack(true), Some("r-1".into()), T0 + 4).await.expect("retry")
    else {
        panic!("acknowledged retry creates a task")
    };
    assert_eq!(
        s.retry(id.clone(), ack(true), Some("r-1".into()), T0 + 5).await.expect("retry"),
        RetryOutcome::Existing(new.clone())
    );
    let t = s.get_task(new.clone()).await.expect("get").expect("task");
    assert_eq!(
        (t.retry_of.as_deref(), t.status, t.prompt.as_str()),
        (Some(id.as_str()), TaskStatus::Queued, "retry me")
    );
    assert_eq!(kinds(&s, &id).await.last().map(String::as_str), Some("retried"));
    assert_eq!(s.retry("nope".into(), ack(true), None, T0).await.expect("retry"), RetryOutcome::NotFound);
}

async fn resolve_only_an_unknown_task(s: Store) {
    let a = submit(&s, "resolve a").await;
    assert_eq!(
        s.resolve(a.clone(), Resolution::Failed, OwnerCharge::Unknown, String::new(), T0).await.expect("resolve"),
        ResolveOutcome::NotUnknown(TaskStatus::Queued)
    );
    let b = submit(&s, "resolve b").await;
    for c in s.dispatch_due(T0, 10, LEASE, "boot").await.expect("dispatch").claims {
        s.finish(c.execution_token, c.lease_token, Finish::Unknown { reason: "lost".into() }, T0)
            .await
            .expect("unknown");
    }
    assert_eq!(
        s.resolve(a.clone(), Resolution::Failed, OwnerCharge::Unknown, "checked".into(), T0 + 2)
            .await
            .expect("resolve"),
        ResolveOutcome::Resolved
    );
    let t = s.get_task(a.clone()).await.expect("get").expect("task");
    assert_eq!((t.status, t.failure_kind.as_deref()), (TaskStatus::Failed, Some("operator")));
    let img = Resolution::Succeeded(artifact("resolved-b"));
    assert_eq!(
        s.resolve(b.clone(), img, OwnerCharge::Unknown, String::new(), T0 + 3).await.expect("resolve"),
        ResolveOutcome::Resolved
    );
    let t = s.get_task(b).await.expect("get").expect("task");
    assert_eq!((t.status, t.artifacts.len()), (TaskStatus::Succeeded, 1));
    assert_eq!(
        s.resolve("nope".into(), Resolution::Failed, OwnerCharge::Unknown, String::new(), T0).await.expect("resolve"),
        ResolveOutcome::NotFound
    );
}

async fn leftovers_are_expired_leases_and_leases_of_earlier_runs(s: Store) {
    let early = submit(&s, "early").await;
    let a = claimed(&s, &early, T0, "boot-1").await;
    let running = submit(&s, "running").await;
    let c = claimed(&s, &running, T0 + 1, "boot-1").await;
    assert!(s.leftovers(T0 + 2, "boot-1").await.expect("leftovers").is_empty(), "live leases of this run");
    let rows = s.leftovers(T0 + LEASE, "boot-1").await.expect("leftovers");
    assert_eq!(rows.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(), [early.as_str()], "a lease that ran out");
    assert_eq!(
        (rows[0].send_count, rows[0].lease_token.as_deref(), &rows[0].execution),
        (1, Some(a.lease_token.as_str()), &Some((a.execution_token.clone(), Phase::Claimed)))
    );
    let mut rows = s.leftovers(T0 + 2, "boot-2").await.expect("leftovers");
    rows.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    assert_eq!(rows.len(), 2, "every lease of an earlier run counts as expired at once");
    let r = rows.iter().find(|r| r.task_id == running).expect("running leftover");
    assert_eq!(r.lease_token.as_deref(), Some(c.lease_token.as_str()));
    assert_eq!(r.execution, Some((c.execution_token.clone(), Phase::Claimed)));
    assert_eq!(r.provider, "p");
}

async fn recovery_applies_each_decision_and_skips_what_changed(s: Store) {
    // One task per decision, all claimed by an earlier run; the last three reached `calling`.
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(submit(&s, &format!("recover {i}")).await);
    }
    let mut claims: Vec<Claim> = s.dispatch_due(T0, 100, LEASE, "old").await.expect("dispatch").claims;
    claims.sort_by_key(|c| ids.iter().position(|i| *i == c.task_id));
    assert_eq!(
        claims.iter().map(|c| c.task_id.as_str()).collect::<Vec<_>>(),
        ids.iter().map(String::as_str).collect::<Vec<_>>()
    );
    for c in &claims[2..] {
        s.record_calling(c.execution_token.clone(), c.lease_token.clone(), T0 + 1, CallingFacts::billed())
            .await
            .expect("calling");
    }
    let rows = s.leftovers(T0 + 2, "new").await.expect("leftovers");
    assert_eq!(rows.len(), 5);
    let row = |id: &str| rows.iter().find(|r| r.task_id == id).cloned().expect("row");
    let decisions = vec![
        (row(&ids[0]), Recovery::Abandon),
        (row(&ids[1]), Recovery::GiveUp),
        (row(&ids[2]), Recovery::Unknown),
        (row(&ids[3]), Recovery::Resume),
        (row(&ids[4]), Recovery::Resume),
    ];
    // Something changes after the read: task 1's worker finishes first (still holding its lease).
    let c1 = &claims[1];
    s.finish(
        c1.execution_token.clone(),
        c1.lease_token.clone(),
        Finish::Failed { kind: FailureKind::Rejected, reason: "no".into(), charge: tally::domain::Charge::Refused },
        T0 + 3,
    )
    .await
    .expect("finish");
    let mut applied = s.apply_recovery(decisions, T0 + 4).await.expect("apply");
    applied.sort_by(|a, b| a.0.cmp(&b.0));
    let mut want = vec![
        (ids[0].clone(), TaskStatus::Waiting),
        (ids[2].clone(), TaskStatus::Unknown),
        (ids[3].clone(), TaskStatus::Waiting),
        (ids[4].clone(), TaskStatus::Waiting),
    ];
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(applied, want, "the finished task's decision is skipped");
    assert_eq!(status(&s, &ids[1]).await, TaskStatus::Failed, "its own outcome stands");
    assert_eq!(kinds(&s, &ids[0]).await.last().map(String::as_str), Some("abandoned"));
    assert_eq!(kinds(&s, &ids[4]).await.last().map(String::as_str), Some("recovering"));
    assert_eq!(int(&s, "SELECT count(*) FROM executions WHERE status = 'abandoned'").await, 1);
    assert_eq!(int(&s, "SELECT count(*) FROM executions WHERE status = 'unknown'").await, 1);
    assert_eq!(int(&s, "SELECT count(*) FROM executions WHERE status = 'running'").await, 2, "the resumed ones");
    // What recovery puts back is in the recovery lane.
    assert_eq!(int(&s, "SELECT count(*) FROM envelopes WHERE status = 'pending' AND lane = 'recovery'").await, 3);
    // A call that may have left is never given up as undelivered.
    let r = s.leftovers(T0 + 2, "new").await.expect("rows");
    assert!(r.is_empty(), "{r:?}");
    // GiveUp on a claim lost before calling fails the task as undeliverable.
    let id = submit(&s, "give up").await;
    let _ = claimed(&s, &id, T0 + 5, "old").await;
    let r = s.leftovers(T0 + 5, "new").await.expect("rows").into_iter().find(|r| r.task_id == id).expect("row");
    assert_eq!(
        s.apply_recovery(vec![(r, Recovery::GiveUp)], T0 + 6).await.expect("apply"),
        [(id.clone(), TaskStatus::Failed)]
    );
    let t = s.get_task(id).await.expect("get").expect("task");
    assert_eq!(t.failure_kind.as_deref(), Some("undeliverable"));
    assert_eq!(int(&s, "SELECT count(*) FROM envelopes WHERE status = 'dead'").await, 1);
}

async fn sets_run_one_shot_at_a_time_and_cancel_the_unsent(s: Store) {
    let up = s.save_upload(NewImage::verify(png("product photo")).expect("png"), T0).await.expect("upload");
    let shot = |role: &str| NewShot {
        role: role.into(),
        prompt: format!("{role} shot"),
        params: json!({}),
        candidates: 1,
        ..NewShot::default()
    };
    let set = NewSet {
        product: "mug".into(),
        style: Some("bright".into()),
        provider: "p".into(),
        references: vec![up.id.clone()],
        shots: vec![shot("main"), shot("selling_point"), shot("scene")],
        idempotency_key: Some("set-1".into()),
    };
    let SubmitOutcome::Created(sid) = s.create_set(set.clone(), T0).await.expect("create") else { panic!() };
    assert_eq!(s.create_set(set.clone(), T0 + 1).await.expect("again"), SubmitOutcome::Existing(sid.clone()));
    let bad = NewSet { references: vec!["no-such-upload".into()], idempotency_key: None, ..set };
    assert!(matches!(s.create_set(bad, T0).await, Err(StoreError::Invalid(_))));
    let b = s.dispatch_due(T0 + 1, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(b.claims.len(), 1, "the first shot (of one candidate) alone");
    assert_eq!(b.next_due, None, "the others are unscheduled");
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    assert_eq!(view.shots.len(), 3);
    assert_eq!(view.references.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [up.id.as_str()]);
    let c = &b.claims[0];
    assert_eq!(c.task_id, view.shots[0].id);
    assert_eq!(c.references.len(), 1, "the set's references travel with the claim");
    let t = s.get_task(view.shots[2].id.clone()).await.expect("get").expect("task");
    assert!(t.reason.en().contains("behind 2 earlier shots of this set"), "{:?}", t.reason);
    s.finish(c.execution_token.clone(), c.lease_token.clone(), Finish::Succeeded(artifact(&c.execution_token)), T0 + 2)
        .await
        .expect("finish");
    let b = s.dispatch_due(T0 + 3, 10, LEASE, "boot").await.expect("dispatch");
    assert_eq!(ids(&b), [view.shots[1].id.as_str()], "the next shot");
    assert_eq!(kinds(&s, &view.shots[1].id).await.last().map(String::as_str), Some("scheduled"));
    // The second shot is claimed (running, nothing sent yet): it finishes honestly; the third,
    // not yet scheduled, cancels.
    assert_eq!(s.cancel_set(sid.clone(), T0 + 4).await.expect("cancel"), Some(1), "every shot not yet claimed");
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    assert!(view.canceled);
    let st: Vec<TaskStatus> = view.shots.iter().map(|t| t.status).collect();
    assert_eq!(st, [TaskStatus::Succeeded, TaskStatus::Running, TaskStatus::Canceled]);
    assert_eq!(s.list_sets(None, 10).await.expect("list").len(), 1);
    assert_eq!(s.cancel_set("nope".into(), T0).await.expect("cancel"), None);
}

/// The blob family's blocking side (`Store::open_blob`, `read_image_bytes_blocking`: what
/// downloads stream from), on each backend: an image larger than one chunk comes back whole,
/// in more than one chunk, and an unknown id is `None`.
async fn a_stored_image_streams_back_in_chunks_as_it_was_stored(s: Store) {
    let mut big = png("a large photo");
    big.extend((0..600_000u32).map(|i| (i % 251) as u8));
    let up = s.save_upload(NewImage::verify(big.clone()).expect("png"), T0).await.expect("save");
    let read = s.clone();
    let (whole, chunks, missing) = tokio::task::spawn_blocking(move || {
        let whole = read.read_image_bytes_blocking(&up.id).expect("read").expect("stored");
        let mut r = read.open_blob(&up.id).expect("open").expect("stored");
        let mut chunks = Vec::new();
        while let Some(c) = r.next_chunk(CHUNK).expect("chunk") {
            chunks.push(c);
        }
        (whole, chunks, read.open_blob("no-such-image").expect("open").is_none())
    })
    .await
    .expect("join");
    assert_eq!((whole.1.len(), whole.0.bytes), (big.len(), big.len() as i64));
    assert!(whole.1 == big, "the bytes read back are the bytes stored");
    assert!(chunks.len() > 1, "more than one chunk: {}", chunks.len());
    assert!(chunks.concat() == big, "the chunks join to the stored bytes");
    assert!(missing, "an unknown id is None");
}

async fn uploads_are_deduplicated_by_content(s: Store) {
    let img = || NewImage::verify(png("the same photo")).expect("png");
    let first = s.save_upload(img(), T0).await.expect("save");
    let second = s.save_upload(img(), T0 + 1).await.expect("save");
    assert_eq!(first.id, second.id, "the same content is one upload");
    assert_eq!((first.created_at, first.bytes), (T0, img().len()));
    let (meta, bytes) = s.read_image_bytes(first.id.clone()).await.expect("read").expect("stored");
    assert_eq!((bytes, meta.media_type.as_str()), (png("the same photo"), "image/png"));
    let other = s.save_upload(NewImage::verify(png("another photo")).expect("png"), T0).await.expect("save");
    assert_ne!(other.id, first.id);
    assert!(s.upload(first.id.clone()).await.expect("get").is_some());
    assert!(s.upload("no-such-upload".into()).await.expect("get").is_none());
    let (u, product) = s.upload_for_download(first.id).await.expect("get").expect("exists");
    assert_eq!((u.sha256.as_str(), product), (meta.sha256.as_str(), None), "no set uses it yet");
    assert_eq!(int(&s, "SELECT count(*) FROM blobs").await, 2);
}

fn ids_of(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

async fn lists_page_by_id_and_count_by_status(s: Store) {
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(s.submit(task(&format!("list {i}")), T0 + i).await.expect("submit").task_id().to_string());
    }
    let b = s.dispatch_due(T0 + 10, 1, LEASE, "boot").await.expect("dispatch");
    assert_eq!(self::ids(&b), ids_of(&ids[..1]));
    let page = s.list_tasks(with_status(None), None, 2).await.expect("list");
    assert_eq!(
        page.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        [ids[4].as_str(), ids[3].as_str()],
        "newest first"
    );
    let next = s.list_tasks(with_status(None), Some(ids[3].clone()), 10).await.expect("list");
    assert_eq!(
        next.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        [ids[2].as_str(), ids[1].as_str(), ids[0].as_str()]
    );
    let running = s.list_tasks(with_status(Some(TaskStatus::Running)), None, 10).await.expect("list");
    assert_eq!(running.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [ids[0].as_str()]);
    let mut counts = s.status_counts().await.expect("counts");
    counts.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(counts, [(TaskStatus::Queued, 4), (TaskStatus::Running, 1)]);
    assert!(s.get_task("nope".into()).await.expect("get").is_none());
}

async fn an_idle_store_runs_no_statements(s: Store) {
    let id = submit(&s, "idle").await;
    let _ = claimed(&s, &id, T0, "boot").await;
    let before = s.statements();
    // The measurement period: nothing is asked of the store, and nothing must happen.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(s.statements(), before, "no statement without a caller");
    assert!(before > 0, "the counter counts");
}

async fn a_search_finds_a_prompt_or_a_sets_product_in_any_case(s: Store) {
    let red = s.submit(task("Red sneaker on white"), T0).await.expect("submit").task_id().to_string();
    let mug = s.submit(task("blue mug on a table"), T0 + 1).await.expect("submit").task_id().to_string();
    let shot = |role: &str| NewShot {
        role: role.into(),
        prompt: format!("{role} shot"),
        params: json!({}),
        candidates: 1,
        ..NewShot::default()
    };
    let set = NewSet {
        product: "Canvas Tote".into(),
        style: None,
        provider: "p".into(),
        references: Vec::new(),
        shots: vec![shot("main"), shot("scene")],
        idempotency_key: None,
    };
    let SubmitOutcome::Created(sid) = s.create_set(set, T0 + 2).await.expect("create") else { panic!() };
    let shots: Vec<String> = s.get_set(sid).await.expect("get").expect("set").shots.into_iter().map(|t| t.id).collect();
    let ids = |ts: Vec<TaskView>| ts.into_iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(search(&s, "SNEAKER", 10).await.expect("search")), [red], "a prompt, any case");
    assert_eq!(ids(search(&s, "mug on", 10).await.expect("search")), [mug]);
    let mut by_product = ids(search(&s, "canvas tote", 10).await.expect("search"));
    by_product.sort();
    let mut want = shots.clone();
    want.sort();
    assert_eq!(by_product, want, "a set's product finds its shots, whose prompts do not name it");
    assert_eq!(ids(search(&s, "scene", 10).await.expect("search")), [shots[1].clone()]);
    assert!(search(&s, "% _ nothing like this", 10).await.expect("search").is_empty(), "no wildcards");
    assert_eq!(search(&s, "on", 1).await.expect("search").len(), 1, "the limit holds");
}
