//! Money, on both backends: the charge each outcome records (and the store's own rule that a
//! request which never left, or whose provider never bills, costs nothing), the retry rules
//! (one live retry per task and shot, a second retry names the first, keys scoped to their
//! original, the needs-attention list), budgets checked in the transaction that records
//! `calling` (concurrent calls, and — in `multi` — several nodes, never overshoot one; a held
//! call waits for its period and checks again when released), and the spend reads.

use crate::common::En;
use futures_util::future::join_all;
use tally::domain::{Charge, FailureKind, TaskStatus};
use tally::store::spend::{Group, Limit, Period};
use tally::store::*;

use super::both;
use super::fixtures::int;
use super::single::{LEASE, T0, artifact, claimed, kinds, submit, task};

both!(
    each_outcome_records_the_charge_its_evidence_proves,
    a_request_that_never_left_or_never_bills_costs_nothing,
    an_unknown_recovered_after_a_crash_is_possibly_charged,
    a_second_retry_needs_the_first_settled_and_named,
    a_retry_key_is_scoped_to_its_original_task,
    concurrent_retries_of_one_failed_shot_make_one_task,
    concurrent_calls_never_overshoot_a_budget,
    a_held_call_waits_for_its_period_and_checks_again_when_released,
    spend_reads_count_what_reached_the_provider,
    the_owners_record_of_the_charge_replaces_possible_and_says_by_hand,
);

const USD: &str = "USD";
/// 24 hours in ms.
const DAY: i64 = 86_400_000;

/// A billed request at `cost` micros, checked against `limits`.
pub fn priced(cost: i64, limits: Vec<Limit>) -> CallingFacts {
    CallingFacts {
        billable: true,
        cost_micros: Some(cost),
        currency: Some(USD.into()),
        model: Some("m1".into()),
        limits,
    }
}

/// A daily limit for the whole cluster.
pub fn daily(micros: i64) -> Limit {
    Limit { period: Period::Day, provider: None, micros, currency: USD.into(), zone: jiff::tz::TimeZone::UTC }
}

/// Claim `id` and record `calling` with `facts`, which must go through; returns the claim.
pub async fn calling(s: &Store, id: &str, now: i64, facts: CallingFacts) -> Claim {
    let c = claimed(s, id, now, "boot").await;
    let out = s.record_calling(c.execution_token.clone(), c.lease_token.clone(), now, facts).await.expect("calling");
    assert_eq!(out, CallingOutcome::Calling);
    c
}

async fn finish(s: &Store, c: &Claim, f: Finish, now: i64) -> TaskStatus {
    s.finish(c.execution_token.clone(), c.lease_token.clone(), f, now).await.expect("finish")
}

async fn charge(s: &Store, id: &str) -> ChargeSummary {
    s.get_task(id.into()).await.expect("get").expect("task").charge
}

async fn last_event(s: &Store, id: &str) -> String {
    s.events(id.into()).await.expect("events").pop().expect("an event").message.en()
}

fn failed(charge: Charge) -> Finish {
    Finish::Failed { kind: FailureKind::Rejected, reason: "the provider said no".into(), charge }
}

async fn each_outcome_records_the_charge_its_evidence_proves(s: Store) {
    let price = || priced(40_000, Vec::new());
    let ok = submit(&s, "ok").await;
    let c = calling(&s, &ok, T0, price()).await;
    finish(&s, &c, Finish::Succeeded(artifact("ok")), T0 + 1).await;
    let sum = charge(&s, &ok).await;
    assert_eq!(
        (sum.state, sum.requests, sum.cost_micros, sum.currency.as_deref()),
        (Charge::Charged, 1, Some(40_000), Some(USD))
    );
    assert!(last_event(&s, &ok).await.ends_with("— charged (about $0.04)"), "{}", last_event(&s, &ok).await);

    let refused = submit(&s, "refused").await;
    let c = calling(&s, &refused, T0, price()).await;
    finish(&s, &c, failed(Charge::Refused), T0 + 1).await;
    let sum = charge(&s, &refused).await;
    assert_eq!((sum.state, sum.requests, sum.cost_micros), (Charge::Refused, 1, None), "a refusal costs nothing");
    assert!(last_event(&s, &refused).await.contains("a definite refusal, which the provider does not charge for"));

    let lost = submit(&s, "lost").await;
    let c = calling(&s, &lost, T0, price()).await;
    finish(&s, &c, Finish::Unknown { reason: "the answer was lost".into() }, T0 + 1).await;
    assert_eq!(charge(&s, &lost).await.state, Charge::Possible);
    assert!(last_event(&s, &lost).await.contains("it may have been charged (about $0.04)"));
    // A late answer of the same execution proves the charge.
    assert!(s.late_result(c.execution_token.clone(), artifact("late"), T0 + 2).await.expect("late"));
    assert_eq!(charge(&s, &lost).await.state, Charge::Charged);

    // A refused attempt, then a charged one: two requests, the heavier state, the cost of the
    // one that may cost.
    let twice = submit(&s, "twice").await;
    let c = calling(&s, &twice, T0, price()).await;
    let again = Finish::RetryLater {
        due_at: T0 + 10,
        kind: FailureKind::RateLimited,
        reason: "429".into(),
        max_attempts: 3,
        charge: Charge::Refused,
        counted: true,
    };
    assert_eq!(finish(&s, &c, again, T0 + 1).await, TaskStatus::Waiting);
    let c = calling(&s, &twice, T0 + 10, price()).await;
    finish(&s, &c, Finish::Succeeded(artifact("twice")), T0 + 11).await;
    let sum = charge(&s, &twice).await;
    assert_eq!((sum.state, sum.requests, sum.cost_micros), (Charge::Charged, 2, Some(40_000)));

    // An operator's resolution: an image found is charged; "it failed" leaves it possible.
    for (tag, r, want) in [
        ("found", Resolution::Succeeded(artifact("found")), Charge::Charged),
        ("gone", Resolution::Failed, Charge::Possible),
    ] {
        let id = submit(&s, tag).await;
        let c = calling(&s, &id, T0, price()).await;
        finish(&s, &c, Finish::Unknown { reason: "lost".into() }, T0 + 1).await;
        assert_eq!(
            s.resolve(id.clone(), r, OwnerCharge::Unknown, "checked".into(), T0 + 2).await.expect("resolve"),
            ResolveOutcome::Resolved
        );
        assert_eq!(charge(&s, &id).await.state, want, "{tag}");
    }
    let gone = s.list_tasks(TaskFilter::default(), None, 50).await.expect("list");
    assert!(gone.iter().any(|t| t.prompt == "gone" && t.charge.state == Charge::Possible), "lists carry the charge");
}

async fn a_request_that_never_left_or_never_bills_costs_nothing(s: Store) {
    // The caller claims a charge for a request that never recorded `calling`: the store says none.
    let early = submit(&s, "early").await;
    let c = claimed(&s, &early, T0, "boot").await;
    finish(&s, &c, failed(Charge::Charged), T0 + 1).await;
    assert_eq!(charge(&s, &early).await, ChargeSummary::default());
    assert!(!last_event(&s, &early).await.contains("charged"), "no money words where nothing was sent");

    // A provider that never bills: its requests are `none` whatever the outcome.
    let free = submit(&s, "free").await;
    let facts = CallingFacts { billable: false, ..CallingFacts::default() };
    let c = calling(&s, &free, T0, facts).await;
    assert!(last_event(&s, &free).await.contains("(this provider never charges)"));
    finish(&s, &c, Finish::Succeeded(artifact("free")), T0 + 1).await;
    assert_eq!(charge(&s, &free).await.state, Charge::None);
    assert!(last_event(&s, &free).await.ends_with("— this provider never charges"));
    assert_eq!(int(&s, "SELECT count(*) FROM executions WHERE charge <> 'none'").await, 0);
}

async fn an_unknown_recovered_after_a_crash_is_possibly_charged(s: Store) {
    let id = submit(&s, "crash").await;
    let c = calling(&s, &id, T0, priced(10_000, Vec::new())).await;
    let rows = s.leftovers(T0 + LEASE + 1, "boot").await.expect("leftovers");
    let row = rows.into_iter().find(|r| r.task_id == id).expect("a leftover");
    assert_eq!(row.execution.as_ref().map(|(t, _)| t.as_str()), Some(c.execution_token.as_str()));
    let applied = s.apply_recovery(vec![(row, Recovery::Unknown)], T0 + LEASE + 2).await.expect("apply");
    assert_eq!(applied, [(id.clone(), TaskStatus::Unknown)]);
    assert_eq!(charge(&s, &id).await.state, Charge::Possible);
    assert!(last_event(&s, &id).await.ends_with("automatic retries stopped — it may have been charged (about $0.01)"));
}

fn acked(retried_as: Option<&str>) -> RetryAck {
    RetryAck { possible_charge: true, retried_as: retried_as.map(str::to_string) }
}

async fn retry(s: &Store, id: &str, ack: RetryAck, key: Option<&str>) -> RetryOutcome {
    s.retry(id.into(), ack, key.map(str::to_string), T0 + 50).await.expect("retry")
}

/// Run `id` to a failure at `now` (after it is due) whose request reached the provider.
async fn fail_it(s: &Store, id: &str, how: Charge, now: i64) {
    let c = calling(s, id, now, CallingFacts::billed()).await;
    finish(s, &c, failed(how), now + 1).await;
}

async fn a_second_retry_needs_the_first_settled_and_named(s: Store) {
    let a = submit(&s, "twice").await;
    let c = calling(&s, &a, T0, CallingFacts::billed()).await;
    finish(&s, &c, Finish::Unknown { reason: "lost".into() }, T0 + 1).await;
    let attention = TaskFilter { needs_attention: true, ..TaskFilter::default() };
    let listed = |s: Store| {
        let attention = attention.clone();
        async move { s.list_tasks(attention, None, 50).await.expect("list").into_iter().map(|t| t.id).collect::<Vec<_>>() }
    };
    assert_eq!(listed(s.clone()).await, std::slice::from_ref(&a));
    let not_unknown = TaskFilter { status: Some(TaskStatus::Failed), needs_attention: true, ..TaskFilter::default() };
    assert!(s.list_tasks(not_unknown, None, 50).await.expect("list").is_empty());
    assert_eq!(retry(&s, &a, RetryAck::default(), None).await, RetryOutcome::NeedsAcknowledgement);

    let RetryOutcome::Created(first) = retry(&s, &a, acked(None), None).await else { panic!("first retry") };
    assert!(listed(s.clone()).await.is_empty(), "a retried unknown task leaves the to-do list");
    let t = s.get_task(a.clone()).await.expect("get").expect("a");
    assert_eq!(t.retried_as, Some((first.clone(), TaskStatus::Queued)));
    assert_eq!(
        retry(&s, &a, acked(Some(&first)), None).await,
        RetryOutcome::RetryInProgress { id: first.clone(), status: TaskStatus::Queued },
        "not while the first retry is live, even when named"
    );
    fail_it(&s, &first, Charge::Refused, T0 + 100).await;
    assert_eq!(
        retry(&s, &a, acked(None), None).await,
        RetryOutcome::AlreadyRetried { id: first.clone(), status: TaskStatus::Failed }
    );
    assert_eq!(
        retry(&s, &a, acked(Some("some-other-task")), None).await,
        RetryOutcome::AlreadyRetried { id: first.clone(), status: TaskStatus::Failed }
    );
    let RetryOutcome::Created(second) = retry(&s, &a, acked(Some(&first)), None).await else { panic!("second") };
    let t = s.get_task(a.clone()).await.expect("get").expect("a");
    assert_eq!(t.retried_as.map(|r| r.0), Some(second));
    assert!(kinds(&s, &a).await.iter().filter(|k| *k == "retried").count() == 2);
}

async fn a_retry_key_is_scoped_to_its_original_task(s: Store) {
    let a = submit(&s, "a").await;
    fail_it(&s, &a, Charge::Refused, T0 + 20).await;
    let b = submit(&s, "b").await;
    fail_it(&s, &b, Charge::Refused, T0 + 20).await;
    // A refused request cost nothing: no acknowledgement needed.
    let RetryOutcome::Created(ra) = retry(&s, &a, RetryAck::default(), Some("k")).await else { panic!("a") };
    let RetryOutcome::Created(rb) = retry(&s, &b, RetryAck::default(), Some("k")).await else {
        panic!("the same key on another task must make that task's own retry")
    };
    assert_ne!(ra, rb);
    assert_eq!(s.get_task(rb.clone()).await.expect("get").expect("rb").retry_of.as_deref(), Some(b.as_str()));
    assert_eq!(retry(&s, &a, RetryAck::default(), Some("k")).await, RetryOutcome::Existing(ra));
    // A retry key never collides with a submit key.
    let keyed = NewTask { idempotency_key: Some("k".into()), ..task("c") };
    assert!(matches!(s.submit(keyed, T0).await.expect("submit"), SubmitOutcome::Created(_)));
}

async fn concurrent_retries_of_one_failed_shot_make_one_task(s: Store) {
    let set = NewSet {
        product: "red sneaker".into(),
        style: None,
        provider: "p".into(),
        references: Vec::new(),
        shots: vec![NewShot {
            role: "main".into(),
            prompt: "on white".into(),
            params: serde_json::json!({}),
            candidates: 1,
            ..NewShot::default()
        }],
        idempotency_key: None,
    };
    let set_id = s.create_set(set, T0).await.expect("set").task_id().to_string();
    let shot = s.get_set(set_id.clone()).await.expect("get").expect("set").shots[0].id.clone();
    fail_it(&s, &shot, Charge::Possible, T0 + 20).await;
    let outcomes = join_all((0..10).map(|_| retry(&s, &shot, acked(None), None))).await;
    let created: Vec<&String> =
        outcomes.iter().filter_map(|o| if let RetryOutcome::Created(id) = o { Some(id) } else { None }).collect();
    assert_eq!(created.len(), 1, "{outcomes:?}");
    for o in &outcomes {
        match o {
            RetryOutcome::Created(_) => {}
            RetryOutcome::RetryInProgress { id, .. } => assert_eq!(id, created[0]),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(int(&s, "SELECT count(*) FROM tasks WHERE set_position = 0").await, 2, "the shot and its one retry");
    // The failed shot's earlier retry settles; a retry of the shot and one of its retry at
    // once still make one live task at the position.
    let first = created[0].clone();
    fail_it(&s, &first, Charge::Refused, T0 + 100).await;
    let (x, y) = tokio::join!(retry(&s, &shot, acked(Some(&first)), None), retry(&s, &first, acked(None), None));
    let made = [&x, &y].iter().filter(|o| matches!(o, RetryOutcome::Created(_))).count();
    assert_eq!(made, 1, "{x:?} {y:?}");
    let live =
        int(&s, "SELECT count(*) FROM tasks WHERE set_position = 0 AND status IN ('queued', 'waiting', 'running')");
    assert_eq!(live.await, 1);
}

async fn concurrent_calls_never_overshoot_a_budget(s: Store) {
    let mut claims = Vec::new();
    for i in 0..20 {
        let id = submit(&s, &format!("budget {i}")).await;
        claims.push((id.clone(), claimed(&s, &id, T0, "boot").await));
    }
    let now = T0 + 5;
    let limit = daily(5 * 40_000 + 39_999);
    let outcomes = join_all(claims.iter().map(|(_, c)| {
        s.record_calling(c.execution_token.clone(), c.lease_token.clone(), now, priced(40_000, vec![limit.clone()]))
    }))
    .await;
    let calls = outcomes.iter().filter(|o| matches!(o, Ok(CallingOutcome::Calling))).count();
    assert_eq!(calls, 5, "{outcomes:?}");
    let tomorrow = (now / DAY + 1) * DAY;
    for ((id, _), out) in claims.iter().zip(&outcomes) {
        let t = s.get_task(id.clone()).await.expect("get").expect("task");
        match out {
            Ok(CallingOutcome::Calling) => assert_eq!((t.attempts, t.charge.state), (1, Charge::Possible)),
            Ok(CallingOutcome::Held { due_at, reason }) => {
                assert_eq!(*due_at, tomorrow, "it waits for the next day");
                assert!(reason.en().contains("Held: today's budget of $0.239999 is spent"), "{reason}");
                assert_eq!((t.status, t.attempts, t.charge.state), (TaskStatus::Waiting, 0, Charge::None));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        int(&s, "SELECT CAST(coalesce(sum(cost_micros), 0) AS bigint) FROM executions WHERE charge <> 'none'").await,
        200_000
    );
}

async fn a_held_call_waits_for_its_period_and_checks_again_when_released(s: Store) {
    let limit = daily(50_000);
    let first = submit(&s, "first").await;
    calling(&s, &first, T0, priced(40_000, vec![limit.clone()])).await;
    let second = submit(&s, "second").await;
    let c = claimed(&s, &second, T0 + 1, "boot").await;
    let out = s
        .record_calling(c.execution_token.clone(), c.lease_token.clone(), T0 + 2, priced(40_000, vec![limit.clone()]))
        .await
        .expect("calling");
    let CallingOutcome::Held { due_at, reason } = out else { panic!("not held: {out:?}") };
    let tomorrow = (T0 / DAY + 1) * DAY;
    assert_eq!(due_at, tomorrow);
    assert!(reason.en().contains("nothing was sent"), "{reason}");
    let t = s.get_task(second.clone()).await.expect("get").expect("task");
    assert_eq!((t.status, t.attempts, t.reason.as_deref()), (TaskStatus::Waiting, 0, Some(reason.as_str())));
    assert_eq!(kinds(&s, &second).await.last().map(String::as_str), Some("budget"));
    // Its hand-off was taken back: it does not count as a lost delivery.
    assert_eq!(int(&s, "SELECT max(send_count) FROM envelopes WHERE budget_hold").await, 0);
    // Later the same day it is not due; the dispatcher's next due time is the period's end.
    let b = s.dispatch_due(T0 + 3_600_000, 10, 10_000, "boot").await.expect("dispatch");
    assert!(b.claims.is_empty());
    assert_eq!(b.next_due, Some(tomorrow));
    // A release (a raised limit, SIGHUP) makes it due now, and it checks the limits in force.
    assert_eq!(s.release_budget_holds(T0 + 3_600_000).await.expect("release"), 1);
    let c = claimed(&s, &second, T0 + 3_600_001, "boot").await;
    assert_eq!(c.attempt, 1, "the held execution counted no attempt");
    let out = s
        .record_calling(
            c.execution_token.clone(),
            c.lease_token.clone(),
            T0 + 3_600_002,
            priced(40_000, vec![daily(80_000)]),
        )
        .await
        .expect("calling");
    assert_eq!(out, CallingOutcome::Calling);
    let t = s.get_task(second).await.expect("get").expect("task");
    assert_eq!((t.status, t.attempts, t.charge.state), (TaskStatus::Running, 1, Charge::Possible));
}

async fn spend_reads_count_what_reached_the_provider(s: Store) {
    // Day 1: one charged, one refused, one possibly charged; day 2: one charged on provider q,
    // and one unpriced.
    let day1 = 20 * DAY + 1_000;
    let day2 = day1 + DAY;
    let on = |p: &str, prompt: &str| NewTask { provider: p.into(), ..task(prompt) };
    let slots = |p: &str| ProviderSlots { reserve: 0, ..ProviderSlots::new(p, 100) };
    s.configure_providers(vec![slots("p"), slots("q")]).await.expect("configure");
    let mut ids = Vec::new();
    for (provider, at, outcome, cost) in [
        ("p", day1, Finish::Succeeded(artifact("s1")), Some(30_000)),
        ("p", day1 + 1, failed(Charge::Refused), Some(30_000)),
        ("p", day1 + 2, Finish::Unknown { reason: "lost".into() }, Some(30_000)),
        ("q", day2, Finish::Succeeded(artifact("s2")), Some(50_000)),
        ("q", day2 + 1, Finish::Succeeded(artifact("s3")), None),
    ] {
        let id = s.submit(on(provider, &format!("{provider}{at}")), at).await.expect("submit").task_id().to_string();
        let facts = CallingFacts { cost_micros: cost, ..priced(0, Vec::new()) };
        let c = calling(&s, &id, at, facts).await;
        finish(&s, &c, outcome, at).await;
        ids.push(id);
    }
    let r = s.spend(day1 - 1_000, day2 + DAY, Group::Day, jiff::tz::TimeZone::UTC).await.expect("spend");
    assert_eq!(r.rows.len(), 2);
    let (a, b) = (&r.rows[0], &r.rows[1]);
    assert_eq!((a.key.as_str(), a.charged.count, a.possibly_charged.count, a.refused), ("1970-01-21", 1, 1, 1));
    assert_eq!((a.charged.amount, a.possibly_charged.amount), (0.03, 0.03));
    assert_eq!((b.key.as_str(), b.charged.count, b.charged.amount, b.unpriced), ("1970-01-22", 2, 0.05, 1));
    assert_eq!((r.totals.charged.count, r.totals.charged.amount, r.currency.as_deref()), (3, 0.08, Some(USD)));
    let by = s.spend(day1 - 1_000, day2 + DAY, Group::Provider, jiff::tz::TimeZone::UTC).await.expect("spend");
    assert_eq!(by.rows.iter().map(|r| (r.key.as_str(), r.charged.count)).collect::<Vec<_>>(), [("p", 1), ("q", 2)]);
    let month = s.spend(day1 - 1_000, day2 + DAY, Group::Month, jiff::tz::TimeZone::UTC).await.expect("spend");
    assert_eq!(month.rows.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["1970-01"]);
    let only_day2 = s.spend(day2, day2 + DAY, Group::Day, jiff::tz::TimeZone::UTC).await.expect("spend");
    assert_eq!(only_day2.totals.charged.count, 2, "`from` bounds the report");

    let reqs = s.paid_requests(day1 - 1_000, day2 + DAY).await.expect("requests");
    assert_eq!(
        reqs.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(),
        ids.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert_eq!(
        reqs.iter().map(|r| (r.charge, r.cost_micros, r.model.as_deref())).collect::<Vec<_>>(),
        [
            (Charge::Charged, Some(30_000), Some("m1")),
            (Charge::Refused, Some(30_000), Some("m1")),
            (Charge::Possible, Some(30_000), Some("m1")),
            (Charge::Charged, Some(50_000), Some("m1")),
            (Charge::Charged, None, Some("m1")),
        ]
    );

    let limits = vec![
        daily(100_000),
        Limit {
            period: Period::Month,
            provider: Some("q".into()),
            micros: 1,
            currency: USD.into(),
            zone: jiff::tz::TimeZone::UTC,
        },
    ];
    let used = s.budget_use(limits, day1 + 5).await.expect("budget use");
    assert_eq!(used.iter().map(|u| (u.period, u.spent)).collect::<Vec<_>>(), [("daily", 0.06), ("monthly", 0.05)]);

    let mut totals = s.charge_totals().await.expect("totals");
    totals.sort_by_key(|(p, c, _, _, _)| (p.clone(), c.as_str()));
    assert_eq!(
        totals,
        [
            ("p".into(), Charge::Charged, Some(USD.into()), 1, 30_000),
            ("p".into(), Charge::Possible, Some(USD.into()), 1, 30_000),
            ("p".into(), Charge::Refused, Some(USD.into()), 1, 30_000),
            ("q".into(), Charge::Charged, Some(USD.into()), 2, 50_000),
        ]
    );
}

/// Several nodes recording calls against one budget at once (on PostgreSQL: separate stores
/// with their own connections; on SQLite: handles of one store): together they record
/// exactly as many as the limit allows. Each node hands off and claims its own tasks, so
/// every node's `record_calling` runs on its own connections and only the budget lock orders
/// them.
pub async fn nodes_together_never_overshoot_a_budget(n: Vec<Store>) {
    let mut claims = Vec::new();
    for (k, node) in n.iter().enumerate() {
        for i in 0..8 {
            let id = submit(node, &format!("node {k} call {i}")).await;
            claims.push((k, claimed(node, &id, T0, &format!("boot-{k}")).await));
        }
    }
    let limit = daily(7 * 25_000 + 24_999);
    let outcomes = join_all(claims.iter().map(|(k, c)| {
        n[*k].record_calling(
            c.execution_token.clone(),
            c.lease_token.clone(),
            T0 + 5,
            priced(25_000, vec![limit.clone()]),
        )
    }))
    .await;
    let calls = outcomes.iter().filter(|o| matches!(o, Ok(CallingOutcome::Calling))).count();
    let held = outcomes.iter().filter(|o| matches!(o, Ok(CallingOutcome::Held { .. }))).count();
    assert_eq!((calls, held), (7, claims.len() - 7), "{outcomes:?}");
    let spent =
        int(&n[0], "SELECT CAST(coalesce(sum(cost_micros), 0) AS bigint) FROM executions WHERE charge <> 'none'");
    assert_eq!(spent.await, 7 * 25_000);
    let waiting = int(&n[0], "SELECT count(*) FROM tasks WHERE status = 'waiting' AND attempts = 0");
    assert_eq!(waiting.await as usize, held);
}

async fn the_owners_record_of_the_charge_replaces_possible_and_says_by_hand(s: Store) {
    let price = || priced(40_000, Vec::new());
    // Three unknowns, resolved as failed with each record of the charge.
    let mut ids = Vec::new();
    for (tag, owner, want) in [
        ("not-charged", OwnerCharge::NotCharged, Charge::None),
        ("charged", OwnerCharge::Charged, Charge::Charged),
        ("no-record", OwnerCharge::Unknown, Charge::Possible),
    ] {
        let id = submit(&s, tag).await;
        let c = calling(&s, &id, T0, price()).await;
        finish(&s, &c, Finish::Unknown { reason: "lost".into() }, T0 + 1).await;
        let out = s.resolve(id.clone(), Resolution::Failed, owner, "dashboard".into(), T0 + 2).await;
        assert_eq!(out.expect("resolve"), ResolveOutcome::Resolved);
        let sum = charge(&s, &id).await;
        assert_eq!(sum.state, want, "{tag}");
        assert_eq!(sum.recorded_by_hand, owner != OwnerCharge::Unknown, "{tag}");
        ids.push((id, owner));
    }
    // The history says what was recorded.
    assert!(last_event(&s, &ids[0].0).await.contains("shows no charge"));
    assert!(last_event(&s, &ids[1].0).await.contains("shows a charge"));
    // The requests list keeps the one recorded as not charged, marked by hand; the budget
    // and the spend report count it as nothing.
    let paid = s.paid_requests(0, T0 + 10).await.expect("paid");
    let row = |id: &str| paid.iter().find(|r| r.task_id == id).cloned();
    let none = row(&ids[0].0).expect("listed though not charged");
    assert_eq!((none.charge, none.by_hand), (Charge::None, true));
    assert_eq!(row(&ids[1].0).map(|r| (r.charge, r.by_hand)), Some((Charge::Charged, true)));
    assert_eq!(row(&ids[2].0).map(|r| (r.charge, r.by_hand)), Some((Charge::Possible, false)));
    let report = s.spend(0, T0 + 10, Group::Day, jiff::tz::TimeZone::UTC).await.expect("spend");
    assert_eq!((report.totals.charged.count, report.totals.possibly_charged.count), (1, 1));
    assert_eq!(report.totals.recorded_by_hand, 2);
    let used = s.budget_use(vec![daily(1_000_000)], T0 + 10).await.expect("use");
    assert!((used[0].spent - 0.08).abs() < 1e-9, "charged + possible count, not the one recorded as free: {used:?}");
}
