//! Deliveries (`store::ops::deliveries`, issue #26) on both backends: a delivery records one
//! queued item per shot's chosen image (refused when a choice changed meanwhile); one engine
//! run holds it at a time (another takes it over only once its lease ran out, and the one
//! that lost it changes nothing); an item is recorded `writing` with its file's facts before
//! the write and confirmed after; the delivery's state follows its items once settled; a retry re-queues
//! only what is not delivered, keeping the recorded sha256 so the runner looks first.
//!
//! The holder race (seam.rs's rule table): a run whose delivery was taken over records,
//! confirms and settles nothing — scripted in order on both backends
//! (`a_run_that_lost_its_delivery_changes_nothing`), and on PostgreSQL forced into the gap
//! between the holder check and the write: another session takes the delivery over and holds
//! its row uncommitted while the stale run's operation starts (`pg_holder`).

use crate::common::en_opt;
use serde_json::json;
use tally::store::*;

use super::both;
use super::single::{LEASE, T0, artifact};

both!(a_delivery_is_recorded_held_by_one_run_and_settled_item_by_item, a_run_that_lost_its_delivery_changes_nothing);

fn set_of_two() -> NewSet {
    let shot = |role: &str| NewShot {
        role: role.into(),
        prompt: format!("{role} shot"),
        params: json!({}),
        candidates: 1,
        ..NewShot::default()
    };
    NewSet {
        product: "teapot".into(),
        style: None,
        provider: "p".into(),
        references: vec![],
        shots: vec![shot("main"), shot("scene")],
        idempotency_key: None,
    }
}

fn facts(n: u8) -> FileFacts {
    FileFacts { sha256: format!("{n:02x}").repeat(32), bytes: 100 + i64::from(n), width: 600, height: 800 }
}

async fn a_delivery_is_recorded_held_by_one_run_and_settled_item_by_item(s: Store) {
    let SubmitOutcome::Created(sid) = s.create_set(set_of_two(), T0).await.expect("create") else { panic!("set") };
    for i in 0..2 {
        let now = T0 + 10 * (i + 1);
        let b = s.dispatch_due(now, 10, LEASE, "boot").await.expect("dispatch");
        let c = &b.claims[0];
        let f = Finish::Succeeded(artifact(&c.execution_token));
        s.finish(c.execution_token.clone(), c.lease_token.clone(), f, now + 1).await.expect("finish");
    }
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    let arts: Vec<String> = view.shots.iter().map(|t| t.artifacts[0].id.clone()).collect();
    let item = |pos: usize, art: &str| NewDeliveryItem {
        position: pos as i64,
        task_id: view.shots[pos].id.clone(),
        artifact_id: art.to_string(),
        shot_role: view.shots[pos].shot_role.clone(),
        file_name: format!("teapot_{pos}.png"),
        ..NewDeliveryItem::default()
    };
    let new = |items: Vec<NewDeliveryItem>| NewDelivery {
        set_id: sid.clone(),
        profile: "original".into(),
        target: "exports".into(),
        forced: false,
        shopify_product: None,
        items,
    };
    // Shot 0 is chosen, shot 1 not: a delivery naming shot 1's image is refused.
    s.choose(sid.clone(), 0, Some(arts[0].clone()), T0 + 50).await.expect("choose 0");
    let two = vec![item(0, &arts[0]), item(1, &arts[1])];
    let out = s.create_delivery(new(two.clone()), T0 + 51).await.expect("create");
    assert!(matches!(out, DeliveryCreateOutcome::ChoiceChanged(_)), "{out:?}");
    let mut missing = new(two.clone());
    missing.set_id = "no-such-set".into();
    assert_eq!(s.create_delivery(missing, T0 + 51).await.expect("create"), DeliveryCreateOutcome::NoSet);
    s.choose(sid.clone(), 1, Some(arts[1].clone()), T0 + 52).await.expect("choose 1");
    let DeliveryCreateOutcome::Created(d) = s.create_delivery(new(two), T0 + 53).await.expect("create") else {
        panic!("created")
    };
    assert_eq!(d.state, DeliveryState::Queued);
    assert_eq!(d.items.iter().map(|i| i.state).collect::<Vec<_>>(), [ItemState::Queued, ItemState::Queued]);
    assert_eq!(d.items[1].file_name, "teapot_1.png");
    assert!(!d.forced);

    // Run r1 takes it; r2 cannot while r1's lease holds, and takes it over once it ran out.
    let lease = 1_000;
    let got = s.claim_delivery("r1".into(), T0 + 60, lease, None).await.expect("claim").expect("r1 gets it");
    assert_eq!((got.id.as_str(), got.state), (d.id.as_str(), DeliveryState::Delivering));
    assert_eq!(s.claim_delivery("r2".into(), T0 + 61, lease, None).await.expect("claim"), None);
    assert_eq!(s.next_delivery_lease_end().await.expect("lease"), Some(T0 + 60 + lease));
    let late = T0 + 60 + lease + 1;
    assert!(s.claim_delivery("r2".into(), late, lease, None).await.expect("claim").is_some(), "lease ran out");
    // r1 lost it: its writes change nothing.
    let lost = s.record_delivery_writing(d.id.clone(), 0, "r1".into(), facts(1), late + 1, lease).await;
    assert!(!lost.expect("write"), "the run that lost the delivery records nothing");
    let lost = s.confirm_delivery_item(d.id.clone(), 0, "r1".into(), ItemOutcome::Delivered, late + 1).await;
    assert_eq!(lost.expect("confirm"), None);

    // r2: item 0 recorded writing (with its facts) then delivered; item 1 failed.
    assert!(s.record_delivery_writing(d.id.clone(), 0, "r2".into(), facts(1), late + 2, lease).await.expect("w"));
    let now = s.delivery(d.id.clone()).await.expect("get").expect("delivery");
    assert_eq!(now.items[0].state, ItemState::Writing);
    assert_eq!((now.items[0].sha256.clone(), now.items[0].bytes), (Some(facts(1).sha256), Some(101)));
    assert_eq!((now.items[0].width, now.items[0].height, now.items[0].attempts), (Some(600), Some(800), 1));
    let st = s.confirm_delivery_item(d.id.clone(), 0, "r2".into(), ItemOutcome::Delivered, late + 3).await;
    assert_eq!(st.expect("confirm"), Some(DeliveryState::Delivering));
    assert!(s.record_delivery_writing(d.id.clone(), 1, "r2".into(), facts(2), late + 4, lease).await.expect("w"));
    let failed = ItemOutcome::Failed { why: "the disk is full".into(), retry_safe: true };
    let st = s.confirm_delivery_item(d.id.clone(), 1, "r2".into(), failed, late + 5).await.expect("confirm");
    assert_eq!(st, Some(DeliveryState::PartlyDelivered));
    let held = s.delivery(d.id.clone()).await.expect("get").expect("delivery");
    assert_eq!(held.state, DeliveryState::Delivering, "its own state waits for the runner (the manifest first)");
    let st = s.settle_delivery(d.id.clone(), "r2".into(), late + 5).await.expect("settle");
    assert_eq!(st, Some(DeliveryState::PartlyDelivered));
    let now = s.delivery(d.id.clone()).await.expect("get").expect("delivery");
    assert_eq!(now.state, DeliveryState::PartlyDelivered);
    assert_eq!(
        (en_opt(now.items[1].why.as_deref()).as_deref(), now.items[1].retry_safe),
        (Some("the disk is full"), Some(true))
    );
    assert_eq!(s.next_delivery_lease_end().await.expect("lease"), None, "a finished delivery holds no lease");

    // Retry: only item 1 is queued again, its sha256 kept (the runner looks first).
    let RetryDeliveryOutcome::Requeued(again, n) = s.retry_delivery(d.id.clone(), late + 6).await.expect("retry")
    else {
        panic!("requeued")
    };
    assert_eq!((n, again.state), (1, DeliveryState::Queued));
    assert_eq!(again.items.iter().map(|i| i.state).collect::<Vec<_>>(), [ItemState::Delivered, ItemState::Queued]);
    assert_eq!((again.items[1].sha256.clone(), again.items[1].why.clone()), (Some(facts(2).sha256), None));
    assert!(matches!(
        s.retry_delivery(d.id.clone(), late + 7).await.expect("retry"),
        RetryDeliveryOutcome::Busy(DeliveryState::Queued)
    ));
    // A run left it `delivering` with item 1 `writing` (a crash): another run takes it over at
    // once with `takeover`, and the item ends unknown (the target could not say).
    let r3 = s.claim_delivery("r3".into(), late + 8, lease, None).await.expect("claim").expect("r3");
    assert!(s.record_delivery_writing(r3.id.clone(), 1, "r3".into(), facts(2), late + 9, lease).await.expect("w"));
    let r4 =
        s.claim_delivery("r4".into(), late + 10, lease, Some(String::new())).await.expect("claim").expect("takeover");
    assert_eq!(r4.items[1].state, ItemState::Writing, "the interrupted write is visible to the new run");
    let unknown = ItemOutcome::Unknown { why: "the target cannot say".into() };
    let st = s.confirm_delivery_item(d.id.clone(), 1, "r4".into(), unknown, late + 11).await.expect("confirm");
    assert_eq!(st, Some(DeliveryState::PartlyDelivered));
    let st = s.settle_delivery(d.id.clone(), "r4".into(), late + 12).await.expect("settle");
    assert_eq!(st, Some(DeliveryState::PartlyDelivered));
    assert_eq!(s.settle_delivery(d.id.clone(), "r4".into(), late + 12).await.expect("settle"), None, "not held");
    let list = s.set_deliveries(sid.clone()).await.expect("list");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].items[1].state, ItemState::Unknown);
    assert_eq!(s.retry_delivery("nope".into(), late + 13).await.expect("retry"), RetryDeliveryOutcome::NoDelivery);
    assert!(s.delivery("nope".into()).await.expect("get").is_none());
}

/// A set of two shots, each run to success and chosen, and a queued delivery of both: its id.
async fn queued_delivery(s: &Store) -> String {
    let SubmitOutcome::Created(sid) = s.create_set(set_of_two(), T0).await.expect("create") else { panic!("set") };
    for i in 0..2 {
        let now = T0 + 10 * (i + 1);
        let b = s.dispatch_due(now, 10, LEASE, "boot").await.expect("dispatch");
        let c = &b.claims[0];
        let f = Finish::Succeeded(artifact(&c.execution_token));
        s.finish(c.execution_token.clone(), c.lease_token.clone(), f, now + 1).await.expect("finish");
    }
    let view = s.get_set(sid.clone()).await.expect("get").expect("set");
    let mut items = Vec::new();
    for (pos, shot) in view.shots.iter().enumerate() {
        let art = shot.artifacts[0].id.clone();
        s.choose(sid.clone(), pos as i64, Some(art.clone()), T0 + 50).await.expect("choose");
        items.push(NewDeliveryItem {
            position: pos as i64,
            task_id: shot.id.clone(),
            artifact_id: art,
            shot_role: shot.shot_role.clone(),
            file_name: format!("teapot_{pos}.png"),
            ..NewDeliveryItem::default()
        });
    }
    let new = NewDelivery {
        set_id: sid,
        profile: "original".into(),
        target: "exports".into(),
        forced: false,
        shopify_product: None,
        items,
    };
    let DeliveryCreateOutcome::Created(d) = s.create_delivery(new, T0 + 53).await.expect("create") else {
        panic!("created")
    };
    d.id
}

/// The items' (state, attempts, sha256) in order.
async fn items(s: &Store, id: &str) -> Vec<(ItemState, i64, Option<String>)> {
    let d = s.delivery(id.to_string()).await.expect("get").expect("delivery");
    d.items.into_iter().map(|i| (i.state, i.attempts, i.sha256)).collect()
}

/// r1 records item 0 `writing`, its lease runs out and r2 takes the delivery over: r1's
/// `writing` of item 1, its confirm of item 0 and its settle each change nothing (the items
/// and the delivery are as r2 found them), while r2's own go through. A takeover at start-up
/// takes the deliveries of the dead runs it names by prefix, lease or not, and no others.
async fn a_run_that_lost_its_delivery_changes_nothing(s: Store) {
    let id = queued_delivery(&s).await;
    let lease = 1_000;
    let t = T0 + 100;
    assert!(s.claim_delivery("r1".into(), t, lease, None).await.expect("claim").is_some());
    assert!(s.record_delivery_writing(id.clone(), 0, "r1".into(), facts(1), t + 1, lease).await.expect("writing"));
    let late = t + 1 + lease + 1;
    let r2 = s.claim_delivery("r2".into(), late, lease, None).await.expect("claim").expect("lease ran out");
    assert_eq!(r2.items[0].state, ItemState::Writing);
    let found = items(&s, &id).await;
    assert_eq!(found[0], (ItemState::Writing, 1, Some(facts(1).sha256)));

    // The stale run, after the takeover.
    let w = s.record_delivery_writing(id.clone(), 1, "r1".into(), facts(2), late + 1, lease).await.expect("w");
    assert!(!w, "a stale run recorded a write");
    let c = s.confirm_delivery_item(id.clone(), 0, "r1".into(), ItemOutcome::Delivered, late + 2).await;
    assert_eq!(c.expect("confirm"), None, "a stale run confirmed an item");
    let failed = ItemOutcome::Failed { why: "stale".into(), retry_safe: true };
    assert_eq!(s.confirm_delivery_item(id.clone(), 1, "r1".into(), failed, late + 2).await.expect("confirm"), None);
    assert_eq!(s.settle_delivery(id.clone(), "r1".into(), late + 3).await.expect("settle"), None);
    assert_eq!(items(&s, &id).await, found, "the stale run changed an item");
    let d = s.delivery(id.clone()).await.expect("get").expect("delivery");
    assert_eq!(d.state, DeliveryState::Delivering);
    assert_eq!(s.next_delivery_lease_end().await.expect("lease"), Some(late + lease), "r2's lease, not r1's");

    // r2 goes on.
    let c = s.confirm_delivery_item(id.clone(), 0, "r2".into(), ItemOutcome::Delivered, late + 4).await;
    assert_eq!(c.expect("confirm"), Some(DeliveryState::Delivering));

    // Start-up takeovers by prefix: node-x's new run takes node-x's earlier run's delivery at
    // once; node-y's does not (its lease holds), nor does a run of a node whose name only
    // starts the same way.
    let t = late + 10;
    assert!(s.claim_delivery("node-x/b1".into(), t, lease, Some(String::new())).await.expect("claim").is_some());
    let other =
        |runner: &str, prefix: &str| s.claim_delivery(runner.to_string(), t + 1, lease, Some(prefix.to_string()));
    assert_eq!(other("node-y/b1", "node-y/").await.expect("claim"), None, "another node's live lease");
    assert_eq!(other("node-x2/b1", "node-x2/").await.expect("claim"), None, "a node named alike");
    let taken = other("node-x/b2", "node-x/").await.expect("claim").expect("its own earlier run");
    assert_eq!(taken.id, id);
    assert_eq!(other("node-x/b2", "node-x/").await.expect("claim"), None, "a run never takes its own again");
    let c = s.confirm_delivery_item(id.clone(), 1, "node-x/b1".into(), ItemOutcome::Delivered, t + 2).await;
    assert_eq!(c.expect("confirm"), None, "the run taken over at start-up is stale");
    assert!(s.record_delivery_writing(id.clone(), 1, "node-x/b2".into(), facts(2), t + 3, lease).await.expect("w"));
    let c = s.confirm_delivery_item(id.clone(), 1, "node-x/b2".into(), ItemOutcome::Delivered, t + 4).await;
    assert_eq!(c.expect("confirm"), Some(DeliveryState::Delivered));
    assert_eq!(
        s.settle_delivery(id.clone(), "node-x/b2".into(), t + 5).await.expect("s"),
        Some(DeliveryState::Delivered)
    );
}

/// The holder race on PostgreSQL, forced into the gap: the stale run `r1` still holds the
/// delivery as far as committed data says, while another session has taken it over (the
/// claim's `UPDATE`) and not yet committed. r1's `writing`, confirm and settle are each
/// started then, seen waiting for the delivery's row, and answered only after the takeover
/// commits: refused, nothing changed. (With the holder checked by a plain `SELECT`, the
/// confirm and the settle read the old row without waiting and write: this test then fails
/// twice over — the operation is never seen waiting, and it answers that it wrote.)
mod pg_holder {
    use tally::store::postgres::PgStore;
    use tally::store::*;

    use super::super::fixtures::{pg_options, pg_url, provider_p, schema};
    use super::super::prune::pg_locks::holding;
    use super::{facts, items, queued_delivery};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_run_waits_for_the_takeover_and_is_refused() {
        let Some(url) = pg_url() else { return };
        let schema = schema();
        let s = Store::from(PgStore::open(pg_options(&url, &schema, "node-a")).expect("open"));
        s.configure_providers(provider_p()).await.expect("configure");
        let id = queued_delivery(&s).await;
        let (lease, t) = (1_000, super::T0 + 100);
        assert!(s.claim_delivery("r1".into(), t, lease, None).await.expect("claim").is_some());
        assert!(s.record_delivery_writing(id.clone(), 0, "r1".into(), facts(1), t + 1, lease).await.expect("w"));
        let before = items(&s, &id).await;
        let give_back = format!("UPDATE deliveries SET runner = 'r1', state = 'delivering' WHERE id = '{id}'");
        let takeover = format!("UPDATE deliveries SET runner = 'r2', lease_until = {} WHERE id = '{id}'", t + 9_000);
        for op in ["writing", "confirm", "settle"] {
            // r1 holds it again as far as committed data says (a fresh start for each op).
            let (u, sc, sql) = (url.clone(), schema.clone(), give_back.clone());
            tokio::task::spawn_blocking(move || {
                let mut c = ::postgres::Client::connect(&u, ::postgres::NoTls).expect("connect");
                c.batch_execute(&format!("SET search_path = {sc}; {sql}")).expect("give it back to r1");
            })
            .await
            .expect("join");
            let (locked, other) = holding(&url, &schema, takeover.clone(), "SELECT 1".into());
            locked.await.expect("the other session holds the delivery");
            let refused = match op {
                "writing" => !s
                    .record_delivery_writing(id.clone(), 1, "r1".into(), facts(2), t + 2, lease)
                    .await
                    .expect("writing"),
                "confirm" => s
                    .confirm_delivery_item(id.clone(), 0, "r1".into(), ItemOutcome::Delivered, t + 2)
                    .await
                    .expect("confirm")
                    .is_none(),
                _ => s.settle_delivery(id.clone(), "r1".into(), t + 2).await.expect("settle").is_none(),
            };
            tokio::task::spawn_blocking(move || other.join()).await.expect("join").expect("the other session");
            assert!(refused, "{op}: the stale run's write after the takeover went through");
            assert_eq!(items(&s, &id).await, before, "{op}: the stale run changed an item");
            let d = s.delivery(id.clone()).await.expect("get").expect("delivery");
            assert_eq!(d.state, DeliveryState::Delivering, "{op}");
        }
        s.close().expect("close");
    }
}
