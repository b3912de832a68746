//! Groups B and C: scripted interleavings and several nodes at once. On SQLite a "node" is
//! another handle on the same store with its own boot id (one writer orders everything); on
//! PostgreSQL it is another store on the same schema with its own node name, connections and
//! lock — the case the row locks exist for.

use std::collections::{HashMap, HashSet};

use tally::domain::TaskStatus;
use tally::store::*;

use super::fixtures::{int, pg_options, pg_url, provider_p, schema, sqlite};
use super::money::nodes_together_never_overshoot_a_budget;
use super::pickup::nodes_picking_up_at_once_never_exceed_the_providers_slots;
use super::single::{LEASE, T0, artifact, submit, task};
use tally::store::postgres::PgStore;

/// `k` handles on one fresh store of each backend (`None` when PostgreSQL is skipped).
fn sqlite_nodes(k: usize) -> Vec<Store> {
    let s = sqlite();
    (0..k).map(|_| s.clone()).collect()
}

fn pg_nodes(k: usize) -> Option<Vec<Store>> {
    let url = pg_url()?;
    let schema = schema();
    Some(
        (0..k)
            .map(|i| Store::from(PgStore::open(pg_options(&url, &schema, &format!("node-{i}"))).expect("open node")))
            .collect(),
    )
}

macro_rules! nodes {
    ($($name:ident($k:expr)),* $(,)?) => {
        mod sqlite_nodes {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let n = super::sqlite_nodes($k);
                    n[0].configure_providers(super::provider_p()).await.expect("configure");
                    super::$name(n.clone()).await;
                    super::super::fixtures::remove_sqlite(&n[0]);
                }
            )*
        }
        mod postgres_nodes {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(n) = super::pg_nodes($k) {
                        n[0].configure_providers(super::provider_p()).await.expect("configure");
                        super::$name(n.clone()).await;
                        for s in &n {
                            let _ = s.close();
                        }
                    }
                }
            )*
        }
    };
}

nodes!(
    two_dispatches_at_once_claim_a_task_once(2),
    nodes_dispatching_at_once_claim_disjoint_envelopes(3),
    nodes_dispatching_at_once_never_exceed_the_providers_slots(3),
    a_submit_replayed_on_another_node_is_the_same_task(2),
    several_nodes_running_and_recovering_keep_every_rule(3),
    nodes_together_never_overshoot_a_budget(3),
    nodes_picking_up_at_once_never_exceed_the_providers_slots(3),
);

async fn two_dispatches_at_once_claim_a_task_once(n: Vec<Store>) {
    let id = submit(&n[0], "twice").await;
    let (a, b) = tokio::join!(n[0].dispatch_due(T0, 10, LEASE, "boot-0"), n[1].dispatch_due(T0, 10, LEASE, "boot-1"));
    let won = a.expect("dispatch a").claims.len() + b.expect("dispatch b").claims.len();
    assert_eq!(won, 1, "exactly one dispatch claims it");
    assert_eq!(int(&n[0], "SELECT count(*) FROM executions").await, 1);
    let _ = id;
}

async fn nodes_dispatching_at_once_claim_disjoint_envelopes(n: Vec<Store>) {
    for i in 0..60 {
        n[i % n.len()].submit(task(&format!("d{i}")), T0).await.expect("submit");
    }
    let mut handles = Vec::new();
    for (i, s) in n.iter().enumerate() {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let b = s.dispatch_due(T0, 7, LEASE, &format!("boot-{i}")).await.expect("dispatch");
                if b.claims.is_empty() {
                    break;
                }
                mine.extend(b.claims.into_iter().map(|c| c.envelope_id));
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("dispatcher"));
    }
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), 60, "every envelope claimed");
    assert_eq!(distinct.len(), 60, "none claimed twice");
    assert_eq!(int(&n[0], "SELECT count(*) FROM envelopes WHERE status = 'sent' AND send_count = 1").await, 60);
    assert_eq!(int(&n[0], "SELECT count(*) FROM executions WHERE status = 'running'").await, 60);
}

/// The slots are the provider's, not a node's: nodes dispatching at once claim no more than
/// `max_concurrency` between them (each dispatch counts the claimed envelopes under a lock of
/// the provider's row on PostgreSQL, under the one writer on SQLite).
async fn nodes_dispatching_at_once_never_exceed_the_providers_slots(n: Vec<Store>) {
    n[0].configure_providers(vec![ProviderSlots { reserve: 0, ..ProviderSlots::new("p", 5) }])
        .await
        .expect("configure");
    for i in 0..30 {
        n[i % n.len()].submit(task(&format!("s{i}")), T0).await.expect("submit");
    }
    let mut handles = Vec::new();
    for (i, s) in n.iter().enumerate() {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let mut got = 0;
            for _ in 0..5 {
                got += s.dispatch_due(T0, 4, LEASE, &format!("boot-{i}")).await.expect("dispatch").claims.len();
            }
            got
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.expect("dispatcher");
    }
    assert_eq!(total, 5, "all slots used, none twice");
    assert_eq!(int(&n[0], "SELECT count(*) FROM envelopes WHERE status = 'sent'").await, 5);
}

async fn a_submit_replayed_on_another_node_is_the_same_task(n: Vec<Store>) {
    let keyed = |i: usize| NewTask { idempotency_key: Some(format!("key-{i}")), ..task(&format!("k{i}")) };
    let mut pairs = Vec::new();
    for i in 0..20 {
        let (a, b) = (n[0].clone(), n[1].clone());
        pairs.push(tokio::spawn(async move {
            let (x, y) = tokio::join!(a.submit(keyed(i), T0), b.submit(keyed(i), T0));
            (x.expect("submit a"), y.expect("submit b"))
        }));
    }
    for p in pairs {
        let (x, y) = p.await.expect("pair");
        assert_eq!(x.task_id(), y.task_id(), "one task per key, whichever node answers");
        let created = [&x, &y].iter().filter(|o| matches!(o, SubmitOutcome::Created(_))).count();
        assert_eq!(created, 1, "{x:?} {y:?}");
    }
    assert_eq!(int(&n[0], "SELECT count(*) FROM tasks").await, 20);
}

/// Several nodes submit, dispatch, claim, call and finish at once; some workers "crash"
/// (stop before finishing, some after `calling`) and every node's reconciler recovers what
/// expired, at a time when the crashed leases have run out. Then the invariant checker reads
/// the event log: every task settled or unknown, no task with two `calling` executions
/// (the provider here has no capability, so a crash after `calling` must end `unknown`),
/// and no execution claimed twice.
async fn several_nodes_running_and_recovering_keep_every_rule(n: Vec<Store>) {
    const TASKS: usize = 45;
    let mut ids = Vec::new();
    for i in 0..TASKS {
        ids.push(submit(&n[i % n.len()], &format!("c{i}")).await);
    }
    let mut round_now = T0;
    for round in 0..30 {
        if int(&n[0], "SELECT count(*) FROM envelopes WHERE status IN ('pending', 'sent')").await == 0 {
            break;
        }
        let mut handles = Vec::new();
        for (k, s) in n.iter().enumerate() {
            let (s, boot) = (s.clone(), format!("boot-{k}-{round}"));
            handles.push(tokio::spawn(async move {
                let b = s.dispatch_due(round_now, 5, LEASE, &boot).await.expect("dispatch");
                for (j, c) in b.claims.into_iter().enumerate() {
                    // Workers crash in the first rounds only, so the run ends.
                    let crash = if round < 4 { (j + k + round) % 4 } else { 3 };
                    if crash == 0 {
                        continue; // crashed after the claim, before calling
                    }
                    s.record_calling(
                        c.execution_token.clone(),
                        c.lease_token.clone(),
                        round_now,
                        CallingFacts::billed(),
                    )
                    .await
                    .expect("calling");
                    if crash == 1 {
                        continue; // crashed during the call
                    }
                    let f = Finish::Succeeded(artifact(&c.execution_token));
                    s.finish(c.execution_token, c.lease_token, f, round_now + 1).await.expect("finish");
                }
            }));
        }
        for h in handles {
            h.await.expect("node");
        }
        // Every crashed lease has run out; each node reconciles at once, racing the others.
        round_now += LEASE + 1;
        let mut recs = Vec::new();
        for (k, s) in n.iter().enumerate() {
            let (s, boot) = (s.clone(), format!("boot-{k}-{}", round + 1));
            recs.push(tokio::spawn(async move {
                let rows = s.leftovers(round_now, &boot).await.expect("leftovers");
                let items = rows
                    .into_iter()
                    .map(|r| {
                        let d = match &r.execution {
                            None => Recovery::Requeue,
                            Some((_, tally::domain::Phase::Claimed)) => Recovery::Abandon,
                            Some(_) => Recovery::Unknown,
                        };
                        (r, d)
                    })
                    .collect();
                s.apply_recovery(items, round_now).await.expect("apply").len()
            }));
        }
        for r in recs {
            r.await.expect("reconciler");
        }
    }
    // Nothing is left in flight: all tasks settled or unknown.
    for id in &ids {
        let t = n[0].get_task(id.clone()).await.expect("get").expect("task");
        assert!(matches!(t.status, TaskStatus::Succeeded | TaskStatus::Unknown), "{id}: {:?}", t.status);
    }
    // The invariant checker over the event log.
    let mut calling: HashMap<String, HashSet<String>> = HashMap::new();
    let mut claimed_events: HashMap<String, usize> = HashMap::new();
    for id in &ids {
        for e in n[1 % n.len()].events(id.clone()).await.expect("events") {
            let x = e.execution_token.clone().unwrap_or_default();
            match e.kind.as_str() {
                "calling" => {
                    calling.entry(id.clone()).or_default().insert(x);
                }
                "claimed" => *claimed_events.entry(x).or_default() += 1,
                _ => {}
            }
        }
        let t = n[0].get_task(id.clone()).await.expect("get").expect("task");
        let calls = calling.get(id).map_or(0, HashSet::len);
        assert!(calls <= 1, "{id}: {calls} executions called a provider that cannot prove anything");
        if t.status == TaskStatus::Unknown {
            assert_eq!(calls, 1, "{id}: unknown only after a call");
        }
    }
    assert!(claimed_events.values().all(|&c| c == 1), "an execution is claimed once");
    assert_eq!(int(&n[0], "SELECT count(*) FROM executions WHERE status = 'running'").await, 0);
    assert_eq!(int(&n[0], "SELECT count(*) FROM envelopes WHERE status IN ('pending', 'sent')").await, 0);
    let succeeded = int(&n[0], "SELECT count(*) FROM tasks WHERE status = 'succeeded'").await;
    assert_eq!(succeeded, int(&n[0], "SELECT count(*) FROM artifacts").await, "one artifact per success");
    assert!(succeeded > 0 && succeeded < TASKS as i64, "the run exercised both outcomes: {succeeded}");
}
