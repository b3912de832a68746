//! Crash points at the boundaries of DESIGN §3, compiled in only with the `failpoints`
//! feature. A triggered point ends the process the way SIGKILL would: `abort()`, no
//! destructors, no flush. Enable with `FAILPOINTS=after-calling=return` (the `fail` crate's
//! syntax) on a binary built with `--features failpoints`.

/// The names of every crash point, in the order a task meets them.
pub const POINTS: &[&str] =
    &["after-submit", "after-sent", "after-claim", "after-calling", "after-accepted", "after-answer", "after-artifact"];

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
