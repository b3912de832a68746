//! Crash points at the boundaries of DESIGN §3, compiled in only with the `failpoints`
//! feature. A triggered point ends the process the way SIGKILL would: `abort()`, no
//! destructors, no flush. Enable with `FAILPOINTS=after-calling=return` (the `fail` crate's
//! syntax) on a binary built with `--features failpoints`.

/// The names of every crash point a task meets, in order (`before-finish-commit` fires on the
/// writer thread inside the finish transaction, before its commit).
///
/// A submit that takes the one-commit pickup (`store::ops::pickup`) meets `after-pickup` (the
/// submit, claim and `calling` committed together; the client may not have its answer yet) and
/// `before-pickup-call` (in the worker, just before the request leaves) instead of the four
/// points from `after-submit` to `after-calling`; the rest are the same.
pub const POINTS: &[&str] = &[
    "after-submit",
    "after-sent",
    "after-claim",
    "after-calling",
    "after-pickup",
    "before-pickup-call",
    "after-accepted",
    "after-answer",
    "before-finish-commit",
    "after-finish",
];

/// The crash points of the start-up migration that moves an older data dir's image files into
/// the database (`store::sqlite::migrate`), in order.
pub const MIGRATION_POINTS: &[&str] = &["migrate-after-schema", "migrate-after-move", "migrate-after-remove"];

/// The crash points of a draft's confirmation (`store::ops::drafts::confirm`): inside its
/// transaction after the set and its tasks are written but before the link (nothing of it is
/// committed), and in the engine just after its commit (the whole set is).
pub const DRAFT_POINTS: &[&str] = &["confirm-before-link", "after-confirm"];

/// Abort the process here if the named crash point is enabled.
#[inline]
pub fn crash(name: &'static str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| {
        eprintln!("tally: crash point {name} reached; aborting");
        std::process::abort()
    });
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

/// A point where a test can hold this process for a while (`FAILPOINTS=name=sleep(ms)`), to
/// keep an operation in a known state while it checks another (e.g. a second backup while the
/// first holds its lock: `backup-before-rename`). Nothing happens without the `failpoints`
/// feature, or when the point is not enabled.
#[inline]
pub fn pause(name: &'static str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name);
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
