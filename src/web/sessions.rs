//! Browser sessions for the web page, in memory only: one-time sign-in codes, and sessions
//! (session id → CSRF token). Nothing here is written to disk, so a restart signs everyone
//! out; `tally sign-in` prints a new URL.
//!
//! Codes and ids are 244 random bits from the OS (two v4 UUIDs), compared by exact match.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::auth::{constant_time_eq, new_token};

/// How long a code made by `POST /v1/session/sign-in-url` stays usable. The code printed at
/// start-up has no deadline (the user may open it hours later), but it is still one use.
pub const CODE_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// At most this many unused codes are kept; making one more forgets the oldest.
const MAX_CODES: usize = 64;
/// At most this many sessions are kept; signing in once more ends the oldest.
const MAX_SESSIONS: usize = 256;

/// One-time codes and sessions. Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct Sessions {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Unused codes with their deadline (`None`: no deadline), oldest first.
    codes: VecDeque<(String, Option<Instant>)>,
    /// Session id → CSRF token.
    sessions: HashMap<String, String>,
    /// Session ids, oldest first (for the cap).
    order: VecDeque<String>,
}

/// A signed-in browser: its session id and the CSRF token its page must send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The value of the `tally_session` cookie.
    pub id: String,
    /// What the page must send in `X-CSRF-Token` on state-changing requests.
    pub csrf_token: String,
}

impl Sessions {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new one-time sign-in code, usable once, until `lifetime` has passed (`None`: no
    /// deadline).
    pub fn new_code(&self, lifetime: Option<Duration>) -> String {
        let code = new_token();
        let mut inner = self.lock();
        let now = Instant::now();
        inner.codes.retain(|(_, deadline)| deadline.is_none_or(|d| d > now));
        while inner.codes.len() >= MAX_CODES {
            inner.codes.pop_front();
        }
        inner.codes.push_back((code.clone(), lifetime.map(|l| now + l)));
        code
    }

    /// Consume a code: a new session if the code is known, unused and not expired; `None`
    /// otherwise. A code works once, whatever happens next.
    pub fn redeem(&self, code: &str) -> Option<Session> {
        let mut inner = self.lock();
        let pos = inner.codes.iter().position(|(c, _)| constant_time_eq(c.as_bytes(), code.as_bytes()))?;
        let (_, deadline) = inner.codes.remove(pos)?;
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return None;
        }
        let session = Session { id: new_token(), csrf_token: new_token() };
        while inner.order.len() >= MAX_SESSIONS {
            if let Some(old) = inner.order.pop_front() {
                inner.sessions.remove(&old);
            }
        }
        inner.sessions.insert(session.id.clone(), session.csrf_token.clone());
        inner.order.push_back(session.id.clone());
        Some(session)
    }

    /// The session with this id, if it exists.
    pub fn get(&self, id: &str) -> Option<Session> {
        self.lock().sessions.get(id).map(|csrf| Session { id: id.to_string(), csrf_token: csrf.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_works_once() {
        let s = Sessions::new();
        let code = s.new_code(None);
        assert!(code.len() >= 32);
        let session = s.redeem(&code).expect("first use");
        assert_ne!(session.id, session.csrf_token);
        assert_eq!(s.get(&session.id), Some(session));
        assert!(s.redeem(&code).is_none(), "second use");
        assert!(s.redeem("nope").is_none());
        assert!(s.get("nope").is_none());
    }

    #[test]
    fn an_expired_code_is_refused() {
        let s = Sessions::new();
        let code = s.new_code(Some(Duration::ZERO));
        assert!(s.redeem(&code).is_none());
    }

    #[test]
    fn old_sessions_are_dropped_at_the_cap() {
        let s = Sessions::new();
        let first = s.redeem(&s.new_code(None)).expect("session");
        for _ in 0..MAX_SESSIONS {
            s.redeem(&s.new_code(None)).expect("session");
        }
        assert!(s.get(&first.id).is_none());
    }
}
