//! Unit tests of the dispatcher's store operation (`store::ops::dispatch`) on SQLite: batched
//! pauses and slow start, the lanes' shares, and a dispatch's cost with a backlog.

use super::super::{NewTask, ProviderSlots};
use super::*;

async fn store_with(backlog: usize) -> (SqliteStore, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("tally-dispatch-{}", uuid::Uuid::new_v4()));
    let store = SqliteStore::open(&dir.join("tally.db"), crate::config::Durability::Normal).expect("open");
    crate::store::Store::from(store.clone())
        .configure_providers(vec![ProviderSlots::new("p", 8)])
        .await
        .expect("configure");
    store
        .write(move |c| {
            for i in 0..backlog {
                let t = NewTask { provider: "p".into(), prompt: format!("r{i}"), ..NewTask::default() };
                super::super::submit(&mut crate::store::sqlite::tx::SqliteTx::new(c), &t, 1_000)?;
            }
            c.execute("UPDATE envelopes SET lane = 'recovery'", [])?;
            Ok(())
        })
        .await
        .expect("backlog");
    (store, dir)
}

fn state(max: i64, reserve: i64) -> State {
    State {
        name: "p".into(),
        max,
        reserve,
        fresh_weight: 4,
        recovery_weight: 1,
        fifo: false,
        paused_until: None,
        recovery_limit: None,
        fresh_pass: 0,
        recovery_pass: 0,
        in_fresh: 0,
        in_recovery: 0,
        ready: true,
        recovery_ready: false,
    }
}

fn candidates_of(lane: Lane, n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            id: format!("{lane:?}-{i}"),
            task_id: format!("t-{lane:?}-{i}"),
            lane,
            pass: i as i64,
            due_at: 0,
            resumed: false,
        })
        .collect()
}

/// A paused provider gets nothing and wakes the dispatcher when its pause ends; once the
/// pause is over its recovery lane starts again at one call; a full provider gets nothing.
#[test]
fn a_pause_holds_a_provider_and_its_end_starts_the_slow_start() {
    let mut next_due = Some(9_000);
    let mut s = State { paused_until: Some(5_000), ..state(4, 1) };
    assert_eq!(plan_provider(&mut s, 1_000, 10, &mut next_due), None);
    assert_eq!(next_due, Some(5_000), "the pause's end is the next look");
    assert_eq!(plan_provider(&mut s, 5_000, 10, &mut next_due), Some((4, 1)));
    assert_eq!((s.paused_until, s.recovery_limit), (None, Some(1)));
    let mut full = State { in_fresh: 3, in_recovery: 1, ..state(4, 1) };
    assert_eq!(plan_provider(&mut full, 5_000, 10, &mut next_due), None);
    let mut capped = State { in_recovery: 2, ..state(8, 2) };
    assert_eq!(plan_provider(&mut capped, 5_000, 3, &mut next_due), Some((3, 3)), "2 of 6 recovery slots used");
}

/// With both lanes full the lanes share by weight (fresh 4 : recovery 1), recovery first on
/// the tie; a FIFO provider takes its candidates by place alone.
#[test]
fn lanes_share_by_weight_and_fifo_goes_by_place() {
    let mut s = state(10, 1);
    let out = interleave(&mut s, candidates_of(Lane::Fresh, 10), candidates_of(Lane::Recovery, 10), 10);
    let lanes: Vec<Lane> = out.iter().map(|c| c.lane).collect();
    assert_eq!(lanes.iter().filter(|l| **l == Lane::Recovery).count(), 2, "{lanes:?}");
    assert_eq!(lanes[0], Lane::Recovery, "the tie goes to the recovery lane");
    let mut fifo = State { fifo: true, ..state(10, 1) };
    let mut recovery = candidates_of(Lane::Recovery, 2);
    recovery[0].pass = -1;
    let out = interleave(&mut fifo, candidates_of(Lane::Fresh, 2), recovery, 3);
    let passes: Vec<i64> = out.iter().map(|c| c.pass).collect();
    assert_eq!(passes, [-1, 0, 1]);
}

/// The VM steps a dispatch of one claim takes, summed over its statements.
async fn steps_of_one_dispatch(store: &SqliteStore, now: Millis) -> i64 {
    let t = NewTask { provider: "p".into(), prompt: format!("fresh {now}"), ..NewTask::default() };
    store
        .write(move |c| super::super::submit(&mut crate::store::sqlite::tx::SqliteTx::new(c), &t, now))
        .await
        .expect("submit");
    store
        .write(move |c| {
            for sql in [PROVIDERS_STATE, CANDIDATES] {
                c.prepare_cached(sql)?.reset_status(rusqlite::StatementStatus::VmStep);
            }
            let batch = dispatch_due(&mut crate::store::sqlite::tx::SqliteTx::new(c), now, 1, 60_000, "b", None)?;
            assert_eq!(batch.claims.len(), 1);
            let mut steps = 0;
            for sql in [PROVIDERS_STATE, CANDIDATES] {
                steps += c.prepare_cached(sql)?.get_status(rusqlite::StatementStatus::VmStep);
            }
            Ok(steps as i64)
        })
        .await
        .expect("dispatch")
}

/// Fairness is an index order, not a scan: choosing who goes next costs the same with a
/// 10,000-task backlog as with 10 (the VM steps of the reads, within a small margin).
#[tokio::test]
async fn dispatch_cost_is_flat_with_a_backlog() {
    let (small, d1) = store_with(10).await;
    let (large, d2) = store_with(10_000).await;
    let (a, b) = (steps_of_one_dispatch(&small, 2_000).await, steps_of_one_dispatch(&large, 2_000).await);
    assert!(b <= a + a / 2, "a dispatch took {b} VM steps with 10,000 waiting, {a} with 10");
    for plan in large.dispatch_plans().await.expect("plans") {
        assert!(!plan.contains("SCAN e ") && !plan.contains("SCAN envelopes"), "a dispatch read scans: {plan}");
    }
    for (s, d) in [(small, d1), (large, d2)] {
        s.close().expect("close");
        let _ = std::fs::remove_dir_all(d);
    }
}
