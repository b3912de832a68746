//! The network and statement timeouts of a node's PostgreSQL connections, all derived from the
//! engine's lease (`[engine] lease_secs`), so that a node cut off from the database notices
//! well within one lease, fences itself and answers 503, and the server lets go of a vanished
//! node's locks, instead of both sides waiting for the operating system's two-hour keepalive.
//!
//! With `L` the lease (each value clamped to the range in [`Timeouts::from_lease`]):
//!
//! | what | value | why |
//! |---|---|---|
//! | lock-session liveness check, when idle | every `L/6`, answer within `L/6` (each at least 1 s) | a cut-off node fences itself within `L/3` of the last answer (2 s for leases under 6 s), before a peer can take its leases (at `L`); this is the one check that also sees a dead path behind a TCP proxy or load balancer that keeps the node's own TCP connection alive |
//! | client TCP keepalive | idle `L/6`, then every `L/12`, 3 probes | a silent direct path is dropped by the kernel after about `5L/12` |
//! | client and server `tcp_user_timeout` | `L/3` | data unacknowledged that long (a query sent into a black hole) ends the connection instead of retransmitting for ~15 minutes |
//! | server `tcp_keepalives_*` (per session) | as the client's | the server ends a vanished node's sessions — and releases its node lock, so peers recover its work at once — instead of after two hours |
//! | connect timeout | `L/3` | a reconnect into a partition gives up within the lease |
//! | `lock_timeout` | `L` | no operation waits longer than a lease for a row lock: the caller gets an error (503) and tries again |
//! | `idle_in_transaction_session_timeout` | `L/2` | a transaction whose client vanished between two statements releases its row locks within half a lease |
//! | `statement_timeout` | `2L` | no statement runs for longer than two leases |
//!
//! Transactions are short (no network call inside one), so none of these fires on a healthy
//! cluster; a busy machine that stalls a node longer than these is a node that would lose its
//! lease anyway.

use std::time::Duration;

/// The derived timeouts (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Timeouts {
    /// How long the lock session waits for a notification before it checks the connection.
    pub probe_every: Duration,
    /// How long the liveness check may take.
    pub probe_timeout: Duration,
    pub connect: Duration,
    pub keepalive_idle: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_retries: u32,
    pub tcp_user_timeout: Duration,
    pub lock_timeout: Duration,
    pub idle_in_transaction: Duration,
    pub statement: Duration,
}

fn clamp(d: Duration, lo: u64, hi: u64) -> Duration {
    d.clamp(Duration::from_millis(lo), Duration::from_millis(hi))
}

impl Timeouts {
    /// The timeouts for a lease of `lease`.
    pub fn from_lease(lease: Duration) -> Timeouts {
        let sixth = lease / 6;
        Timeouts {
            probe_every: clamp(sixth, 1_000, 10_000),
            probe_timeout: clamp(sixth, 1_000, 10_000),
            connect: clamp(lease / 3, 1_000, 20_000),
            // The kernel counts keepalive times in whole seconds.
            keepalive_idle: clamp(sixth, 1_000, 10_000),
            keepalive_interval: clamp(lease / 12, 1_000, 5_000),
            keepalive_retries: 3,
            tcp_user_timeout: clamp(lease / 3, 1_000, 20_000),
            lock_timeout: clamp(lease, 2_000, 60_000),
            idle_in_transaction: clamp(lease / 2, 2_000, 60_000),
            statement: clamp(lease * 2, 10_000, 120_000),
        }
    }

    /// Apply the client-side settings to a connection configuration.
    pub(super) fn configure(&self, config: &mut postgres::Config) {
        config
            .connect_timeout(self.connect)
            .tcp_user_timeout(self.tcp_user_timeout)
            .keepalives(true)
            .keepalives_idle(self.keepalive_idle)
            .keepalives_interval(self.keepalive_interval)
            .keepalives_retries(self.keepalive_retries);
    }

    /// The server-side TCP settings of a session (`SET`; they apply to TCP sessions only, and
    /// read as 0 on a Unix socket).
    pub(super) fn server_tcp_sql(&self) -> String {
        format!(
            "SET tcp_keepalives_idle = {}; SET tcp_keepalives_interval = {}; SET tcp_keepalives_count = {}; \
             SET tcp_user_timeout = {};",
            self.keepalive_idle.as_secs().max(1),
            self.keepalive_interval.as_secs().max(1),
            self.keepalive_retries,
            self.tcp_user_timeout.as_millis()
        )
    }

    /// The statement settings of an operation connection.
    pub(super) fn statement_sql(&self) -> String {
        format!(
            "SET lock_timeout = {}; SET idle_in_transaction_session_timeout = {}; SET statement_timeout = {};",
            self.lock_timeout.as_millis(),
            self.idle_in_transaction.as_millis(),
            self.statement.as_millis()
        )
    }
}

/// Apply the server-side TCP settings to a session; a server that does not know one of them
/// (PostgreSQL before 12 has no `tcp_user_timeout`) keeps its default, with a warning.
pub(super) fn apply_server_tcp(client: &mut postgres::Client, t: &Timeouts) {
    if let Err(e) = client.batch_execute(&t.server_tcp_sql()) {
        tracing::warn!(error = %e, "the server did not take tally's TCP keepalive settings; it keeps its defaults");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cut-off node must fence itself (probe interval + probe timeout) well before a peer
    /// could take its leases, and the server-side settings must be valid SQL numbers.
    #[test]
    fn the_timeouts_fit_inside_the_lease() {
        for secs in [1u64, 3, 10, 30, 120, 600] {
            let lease = Duration::from_secs(secs);
            let t = Timeouts::from_lease(lease);
            if secs >= 3 {
                assert!(t.probe_every + t.probe_timeout <= lease * 2 / 3, "{secs}: {t:?}");
                assert!(t.idle_in_transaction < lease, "{secs}: {t:?}");
            }
            assert!(t.keepalive_idle >= Duration::from_secs(1) && t.keepalive_interval >= Duration::from_secs(1));
            assert!(t.server_tcp_sql().contains("tcp_user_timeout = "), "{}", t.server_tcp_sql());
        }
        let d = Timeouts::from_lease(Duration::from_secs(30));
        assert_eq!((d.probe_every, d.probe_timeout), (Duration::from_secs(5), Duration::from_secs(5)));
        assert_eq!(d.statement, Duration::from_secs(60), "the default lease keeps the old 60 s statement timeout");
    }
}
