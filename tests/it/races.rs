//! What only a SQLite file can show about recovery: a power loss that erases a `calling`
//! record, made exact by copying the database file, must not change the key the resend
//! carries. The scripted interleavings of the reconciler and a live worker run on both
//! backends in `conformance::races` (with `tally check` on the SQLite file).

use std::path::PathBuf;

use tally::config::Durability;
use tally::domain::{Decision, Leftover, Millis, Phase, decide};
use tally::providers::Capabilities;
use tally::store::{Claim, LeftoverRow, NewTask, ProviderSlots, Recovery, Store, StoreError, provider_key};

/// The lease and hand-off grace the scripts use.
const LEASE: Millis = 30_000;
/// The time the scripts start at.
const T0: Millis = 1_000_000_000;
const BOOT: &str = "this-boot";

const IDEM: Capabilities = Capabilities { idempotent_create: true, lookup: false };

struct Script {
    dir: PathBuf,
    store: Store,
    task: String,
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.store.close();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Script {
    async fn new(tag: &str) -> Script {
        let dir = crate::engine::temp_dir(&format!("race-{tag}"));
        let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("open");
        store.configure_providers(vec![ProviderSlots::new("p", 4)]).await.expect("configure");
        let t = NewTask { provider: "p".into(), prompt: tag.into(), ..NewTask::default() };
        let task = store.submit(t, T0).await.expect("submit").task_id().to_string();
        Script { dir, store, task }
    }

    /// The dispatcher claims the envelope at `now` (None: nothing was due): a worker holding
    /// a fresh lease.
    async fn dispatch(&self, now: Millis) -> Option<Claim> {
        let batch = self.store.dispatch_due(now, 10, LEASE, BOOT).await.expect("dispatch");
        batch.claims.into_iter().find(|c| c.task_id == self.task)
    }

    /// Dispatch at `now`: a worker holding a fresh lease.
    async fn worker(&self, now: Millis) -> Claim {
        self.dispatch(now).await.expect("claimed")
    }

    /// What `domain::decide` makes of a leftover, as the reconciler maps it.
    fn decision(row: &LeftoverRow, caps: Capabilities) -> Recovery {
        let left = Leftover::of(row.execution.as_ref().map(|(_, p)| *p), row.send_count as u32);
        match decide(&left, Some(caps), 10) {
            Decision::Requeue => Recovery::Requeue,
            Decision::GiveUp => Recovery::GiveUp,
            Decision::Abandon => Recovery::Abandon,
            Decision::Resume => Recovery::Resume,
            Decision::Unknown => Recovery::Unknown,
        }
    }

    async fn calling(&self, c: &Claim, now: Millis) -> Result<(), StoreError> {
        let facts = tally::store::CallingFacts::billed();
        self.store.record_calling(c.execution_token.clone(), c.lease_token.clone(), now, facts).await.map(|_| ())
    }
}

// ---- the provider key ----

/// With `durability = "normal"` a power loss can erase the `calling` record of a request that
/// left. Here the loss is made exact: the database is copied as it was before `calling`, then
/// the copy is recovered as a restart would. The resend must carry the key the lost request
/// carried, so an idempotent provider answers it without a second charge.
#[tokio::test]
async fn a_lost_calling_record_resends_with_a_new_idempotency_key() {
    let s = Script::new("lost-calling").await;
    let a = s.worker(T0).await;
    assert_eq!(a.idempotency_key, provider_key(&s.task, 1));
    // The disk as a power cut right after the claim leaves it (the claim is in the WAL).
    let lost = crate::engine::temp_dir("race-lost-calling-copy");
    for f in ["tally.db", "tally.db-wal"] {
        if s.dir.join(f).exists() {
            std::fs::copy(s.dir.join(f), lost.join(f)).expect("copy");
        }
    }
    s.calling(&a, T0 + 1).await.expect("calling"); // the request leaves with a.idempotency_key
    let store = Store::open(&lost.join("tally.db"), Durability::Normal).expect("open the copy");
    let rows = store.leftovers(T0 + 2, "after-power-loss").await.expect("leftovers");
    assert_eq!(rows.len(), 1);
    assert!(matches!(rows[0].execution, Some((_, Phase::Claimed))), "the copy lost `calling`");
    let row = rows[0].clone();
    assert!(matches!(Script::decision(&row, IDEM), Recovery::Abandon));
    assert_eq!(store.apply_recovery(vec![(row, Recovery::Abandon)], T0 + 2).await.expect("apply").len(), 1);
    let b = store.dispatch_due(T0 + 3, 10, LEASE, "after-power-loss").await.expect("dispatch").claims.remove(0);
    assert_eq!(b.attempt, 1);
    assert_eq!(b.idempotency_key, a.idempotency_key, "the resend carries a new key: a second charge");
    let _ = store.close();
    let _ = std::fs::remove_dir_all(lost);
}
