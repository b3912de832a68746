//! What a background service (dispatcher, reconciler) does when the store fails: it never
//! exits for good while the daemon keeps serving, and it never floods the log.
//!
//! - A full or failing disk, or a transient error: wait, doubling from one second up to
//!   [`MAX_WAIT`], and try again; the first failure is an ERROR, later ones one WARN per wait,
//!   and the first success after them an INFO. Idle stays idle: nothing is retried unless the
//!   service had work.
//! - A database that cannot be used (read-only, corrupt, not tally's): the service stops and
//!   asks the daemon to stop cleanly ([`Shared::give_up`]), which `tally serve` turns into a
//!   clean shutdown with exit code 1 and the reason.
//! - A closed store: the daemon is stopping; the service ends quietly.

use std::time::Duration;

use super::Shared;
use crate::store::{Severity, StoreError};

/// The longest wait between tries.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(30);

/// A service's failure streak.
pub(super) struct Trouble {
    service: &'static str,
    failures: u32,
}

/// What the service does next.
pub(super) enum Next {
    /// Wait this long, then try again.
    Wait(Duration),
    /// End the service (the daemon is stopping).
    Stop,
}

impl Trouble {
    pub(super) fn new(service: &'static str) -> Self {
        Trouble { service, failures: 0 }
    }

    /// The store answered: end a failure streak (said once).
    pub(super) fn ok(&mut self) {
        if self.failures > 0 {
            tracing::info!(service = self.service, failures = self.failures, "the database works again");
            self.failures = 0;
        }
    }

    /// The store failed with `e`: log it (rate-limited) and say what to do.
    pub(super) fn failed(&mut self, shared: &Shared, e: &StoreError) -> Next {
        match e.severity() {
            Severity::Closed => Next::Stop,
            Severity::Fatal => {
                tracing::error!(service = self.service, error = %e, "the database cannot be used; stopping");
                shared.give_up(e.to_string());
                Next::Stop
            }
            Severity::Resource | Severity::Transient => {
                self.failures += 1;
                let wait = Duration::from_secs(1u64 << (self.failures - 1).min(5)).min(MAX_WAIT);
                if self.failures == 1 {
                    tracing::error!(service = self.service, error = %e, retry_in = ?wait, "the database failed; trying again later");
                } else {
                    tracing::warn!(service = self.service, error = %e, failures = self.failures, retry_in = ?wait, "the database still fails");
                }
                Next::Wait(wait)
            }
        }
    }
}
