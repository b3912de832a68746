//! The one way tally reads the time. Everything that stores or compares a time takes it from
//! a [`Clock`], so tests can move time instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::domain::Millis;

/// A source of the current time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch, now.
    fn now(&self) -> Millis;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0)
    }
}

/// The system's wall clock shifted by a fixed offset: on PostgreSQL, this machine's clock
/// corrected to the database's (measured when the store opened), so the engine's timers agree
/// with the clock that decides leases and due times.
#[derive(Debug, Clone, Copy)]
pub struct OffsetClock {
    offset: Millis,
}

impl OffsetClock {
    /// The system clock plus `offset` milliseconds.
    pub fn new(offset: Millis) -> Self {
        OffsetClock { offset }
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> Millis {
        SystemClock.now() + self.offset
    }
}

/// The clock a daemon on SQLite runs by: the system's. Test builds (`failpoints`) may start it
/// at another time, `TALLY_TEST_CLOCK_AT` (RFC 3339), from which it runs on at the system
/// clock's pace: how the tests put a daemon just before a local midnight without waiting for
/// one.
pub fn system_or_test_start() -> std::sync::Arc<dyn Clock> {
    #[cfg(feature = "failpoints")]
    if let Some(at) = std::env::var("TALLY_TEST_CLOCK_AT").ok().and_then(|t| t.parse::<jiff::Timestamp>().ok()) {
        tracing::warn!(at = %at, "test build: the engine's clock starts at TALLY_TEST_CLOCK_AT");
        return std::sync::Arc::new(OffsetClock::new(at.as_millisecond() - SystemClock.now()));
    }
    std::sync::Arc::new(SystemClock)
}

/// A clock that only moves when told to (tests).
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A manual clock starting at `start`.
    pub fn new(start: Millis) -> Self {
        ManualClock(AtomicI64::new(start))
    }

    /// Move the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as Millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

/// Sleep until `deadline` as measured by `clock`. With a manual clock this sleeps for the
/// difference at the time of the call; callers re-check the clock when woken.
pub async fn sleep_until(clock: &dyn Clock, deadline: Millis) {
    let wait = (deadline - clock.now()).max(0) as u64;
    tokio::time::sleep(Duration::from_millis(wait)).await;
}

/// Format milliseconds since the epoch as RFC 3339 with milliseconds, UTC.
pub fn rfc3339(ms: Millis) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}
