//! The store conformance suite: one set of store-level tests that every backend must pass
//! (River's `riverdrivertest` is the model). Each test is a generic function over
//! [`backend::Backend`]; [`both!`] runs it once on a fresh SQLite store and once on a fresh
//! PostgreSQL store (its own schema on the throw-away server), so the two `ops` ports are held
//! to one meaning. Groups: `single` (every single-operation rule), `multi` (scripted
//! interleavings and several nodes at once, with an invariant checker over the event log),
//! `pg` (what only the PostgreSQL backend has: node lock and self-fencing, wake-ups, the
//! database clock), `held` (jobs held because the database was older than what was served,
//! and their release).

pub mod backend;
mod choice;
mod deliveries;
mod held;
mod money;
mod multi;
mod pg;
mod pg_migrate;
mod prune;
mod races;
mod settings;
mod single;

/// Run each named generic test on both backends: `sqlite::NAME` and `postgres::NAME`.
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let s = $crate::conformance::backend::sqlite();
                    s.configure_providers($crate::conformance::backend::provider_p()).await.expect("configure");
                    super::$name(s.clone()).await;
                    $crate::conformance::backend::remove_sqlite(&s);
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(s) = $crate::conformance::backend::postgres() {
                        s.configure_providers($crate::conformance::backend::provider_p()).await.expect("configure");
                        super::$name(s.clone()).await;
                        let _ = s.close();
                    }
                }
            )*
        }
    };
}
pub(crate) use both;
