//! The store conformance suite: one set of store-level tests that every backend must pass,
//! run against the production seam (River's `riverdrivertest.Exercise` is the model). Each
//! test takes the [`tally::store::Store`] the engine holds and calls its own methods, so the
//! seam's dispatch to each backend (`src/store/seam.rs`) is what is tested; there is no
//! test-only trait in between. [`both!`] runs each test once on a fresh SQLite store and once
//! on a fresh PostgreSQL store (its own schema on the throw-away server), so the one logic in
//! `store::ops` is held to one meaning over both dialects; `multi`'s `nodes!` does the same
//! with several handles on one store. Fixtures and the few shared helpers are in
//! [`fixtures`]. Groups: `single` (every single-operation rule), `multi` (scripted
//! interleavings and several nodes at once, with an invariant checker over the event log),
//! `races`, `money`, `pickup` (the one-commit pickup), `choice`, `set_edit`, `prune`, `settings`, `pg` (what only the PostgreSQL backend has:
//! node lock and self-fencing, wake-ups, the database clock), `pg_migrate`, `held` (jobs held
//! because the database was older than what was served, and their release).

mod choice;
mod deliveries;
pub mod fixtures;
mod held;
mod money;
mod multi;
mod pg;
mod pg_migrate;
mod pickup;
mod prune;
mod races;
mod set_edit;
mod settings;
mod single;

/// Run each named test (an `async fn(Store)`) on both backends: `sqlite::NAME` and `postgres::NAME`.
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let s = $crate::conformance::fixtures::sqlite();
                    s.configure_providers($crate::conformance::fixtures::provider_p()).await.expect("configure");
                    super::$name(s.clone()).await;
                    $crate::conformance::fixtures::remove_sqlite(&s);
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(s) = $crate::conformance::fixtures::postgres() {
                        s.configure_providers($crate::conformance::fixtures::provider_p()).await.expect("configure");
                        super::$name(s.clone()).await;
                        let _ = s.close();
                    }
                }
            )*
        }
    };
}
pub(crate) use both;
