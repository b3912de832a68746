//! The retention timer (`[retention] older_than`): prunes settled work older than the age
//! limit (`Store::prune`), then sleeps until the next settled task becomes old enough.
//!
//! Idle means idle: it never polls. After a pass with cutoff `C`, the next task that can
//! become prunable is the oldest settled one changed at or after `C` (one indexed read); it is
//! due at its `updated_at` + the age limit, and the timer sleeps until then. If there is none,
//! nothing can become due until a task settles: it sleeps, with no timer, until the engine
//! says one did (`Shared::changed`), then reads again. Passes are spaced at least
//! [`granularity`] apart (1 % of the age, between 1 s and 1 h), so a steady stream of tasks
//! costs one pass per interval, not one per task.

use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use super::trouble::{Next, Trouble};
use crate::clock::sleep_until;
use crate::domain::Millis;

/// How far apart passes are at least: 1 % of the age limit, between 1 s and 1 h.
pub(super) fn granularity(older_than: Duration) -> Duration {
    (older_than / 100).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// Run until shutdown.
pub(super) async fn run(shared: Arc<Shared>, older_than: Duration) {
    let mut stop = shared.shutdown.subscribe();
    let age = Shared::ms(older_than);
    let step = Shared::ms(granularity(older_than));
    let mut trouble = Trouble::new("retention");
    let mut settles = shared.settles.subscribe();
    loop {
        if shared.stopping() {
            return;
        }
        // What settles from here on is seen by this pass or wakes the wait below.
        settles.borrow_and_update();
        let now = shared.now();
        let cutoff = now - age;
        let wake: Option<Millis> = match pass(&shared, cutoff).await {
            Ok(next) => {
                trouble.ok();
                next.map(|t| (t + age).max(now + step))
            }
            Err(e) => match trouble.failed(&shared, &e) {
                Next::Stop => return,
                Next::Wait(d) => Some(now + Shared::ms(d)),
            },
        };
        match wake {
            Some(at) => tokio::select! {
                _ = sleep_until(shared.clock.as_ref(), at) => {}
                _ = stop.changed() => return,
            },
            None => {
                tokio::select! {
                    r = settles.changed() => if r.is_err() { return },
                    _ = stop.changed() => return,
                }
                // The task that settled becomes old enough an age from now at the earliest.
                let next = shared.now() + age;
                tokio::select! {
                    _ = sleep_until(shared.clock.as_ref(), next) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

/// One pass: prune, say what it did, and read when the next task becomes old enough.
async fn pass(shared: &Shared, cutoff: Millis) -> Result<Option<Millis>, crate::store::StoreError> {
    let r = shared.store.prune(cutoff, false).await?;
    if r.tasks + r.uploads > 0 {
        tracing::info!(
            tasks = r.tasks,
            sets = r.sets,
            images = r.images,
            uploads = r.uploads,
            image_bytes = r.image_bytes,
            freed_bytes = r.freed_bytes,
            kept_unknown = r.kept_unknown,
            "retention pruned settled work"
        );
    }
    shared.store.next_prunable(cutoff).await
}
