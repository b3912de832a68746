//! Deliveries (`store::ops::deliveries`, issue #26) on both backends: a delivery records one
//! queued item per shot's chosen image (refused when a choice changed meanwhile); one engine
//! run holds it at a time (another takes it over only once its lease ran out, and the one
//! that lost it changes nothing); an item is recorded `writing` with its file's facts before
//! the write and confirmed after; the delivery's state follows its items once settled; a retry re-queues
//! only what is not delivered, keeping the recorded sha256 so the runner looks first.

use serde_json::json;
use tally::store::*;

use super::both;
use super::single::{LEASE, T0, artifact};

both!(a_delivery_is_recorded_held_by_one_run_and_settled_item_by_item);

fn set_of_two() -> NewSet {
    let shot =
        |role: &str| NewShot { role: role.into(), prompt: format!("{role} shot"), params: json!({}), candidates: 1 };
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
    };
    let new = |items: Vec<NewDeliveryItem>| NewDelivery {
        set_id: sid.clone(),
        profile: "original".into(),
        target: "exports".into(),
        forced: false,
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
    let got = s.claim_delivery("r1".into(), T0 + 60, lease, false).await.expect("claim").expect("r1 gets it");
    assert_eq!((got.id.as_str(), got.state), (d.id.as_str(), DeliveryState::Delivering));
    assert_eq!(s.claim_delivery("r2".into(), T0 + 61, lease, false).await.expect("claim"), None);
    assert_eq!(s.next_delivery_lease_end().await.expect("lease"), Some(T0 + 60 + lease));
    let late = T0 + 60 + lease + 1;
    assert!(s.claim_delivery("r2".into(), late, lease, false).await.expect("claim").is_some(), "lease ran out");
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
    assert_eq!((now.items[1].why.as_deref(), now.items[1].retry_safe), (Some("the disk is full"), Some(true)));
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
    let r3 = s.claim_delivery("r3".into(), late + 8, lease, false).await.expect("claim").expect("r3");
    assert!(s.record_delivery_writing(r3.id.clone(), 1, "r3".into(), facts(2), late + 9, lease).await.expect("w"));
    let r4 = s.claim_delivery("r4".into(), late + 10, lease, true).await.expect("claim").expect("takeover");
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
