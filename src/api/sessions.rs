//! Browser sessions for the web page: one-time sign-in codes (in memory: a code is for the
//! next few minutes, and the one printed at start-up is new at every start), and sessions
//! (session id → CSRF token), kept in the database (`web_sessions`, the sha256 of the id,
//! never the id itself) so that a restart of the daemon does not sign a browser out. A
//! session ends after [`IDLE_LIFETIME`] without use, or with `tally sign-out --all`.
//!
//! Reads go through a small in-memory cache, re-checked against the database at most every
//! [`RECHECK`] (so on PostgreSQL a session ended through another node ends here within that
//! time), and a session's use is written at most every [`TOUCH_EVERY`]. Without a store
//! ([`Sessions::new`], unit tests) sessions live in memory only.
//!
//! Codes and ids are 244 random bits from the OS (two v4 UUIDs), compared by exact match.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::api::auth::{constant_time_eq, new_token};
use crate::clock::{Clock, SystemClock};
use crate::domain::Millis;
use crate::store::{Store, StoreError};

/// How long a code made by `POST /v1/session/sign-in-url` stays usable. The code printed at
/// start-up has no deadline (the user may open it hours later), but it is still one use.
pub const CODE_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// How long a pairing (`POST /v1/session/pair`, `tally sign-in --qr`) stays usable: its
/// link and its short code, once, whichever is used first.
pub const PAIR_LIFETIME: Duration = Duration::from_secs(10 * 60);

/// Wrong short codes typed (anywhere, in total) before every short code still waiting is
/// dropped: a short code has about 39.6 bits, so ten guesses in its ten minutes leave an
/// attacker about one chance in 8·10¹⁰. Pairing links keep working; a new pairing makes a new
/// short code.
pub const MAX_SHORT_MISSES: u32 = 10;

/// The letters of a short code: digits and capitals without 0, O, 1, I and L (read aloud or
/// typed on a phone without confusion).
const SHORT_ALPHABET: &[u8] = b"23456789ABCDEFGHJKMNPQRSTUVWXYZ";
/// A short code's length, without the dash shown in its middle.
const SHORT_LEN: usize = 8;

/// A session not used for this long ends (its cookie's `Max-Age` too).
pub const IDLE_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// A cached session is checked against the database again after this long.
const RECHECK: Duration = Duration::from_secs(30);
/// A session's last use is written at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(3600);

/// At most this many unused codes are kept; making one more forgets the oldest.
const MAX_CODES: usize = 64;
/// At most this many sessions are cached (and, without a store, kept); one more drops the
/// oldest from the cache (a stored one is read again when used).
const MAX_SESSIONS: usize = 256;

/// One-time codes and sessions. Cheap to share behind an `Arc`.
pub struct Sessions {
    inner: Mutex<Inner>,
    store: Option<Store>,
    /// Every ended session (`Some(id)`) or all of them (`None`), for the live streams opened
    /// with them, which end at once ([`Sessions::subscribe_ended`]).
    ended: tokio::sync::broadcast::Sender<Option<String>>,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions { inner: Mutex::default(), store: None, ended: tokio::sync::broadcast::channel(64).0 }
    }
}

/// A cached session.
#[derive(Debug, Clone)]
struct Cached {
    csrf: String,
    /// When it was last read from (or written to) the database.
    checked: Instant,
    /// When its use was last written.
    touched: Instant,
}

#[derive(Default)]
struct Inner {
    /// Unused codes, oldest first.
    codes: VecDeque<Code>,
    /// Wrong short codes typed since the last one that worked ([`MAX_SHORT_MISSES`]).
    short_misses: u32,
    /// Session id → its CSRF token and cache times.
    sessions: HashMap<String, Cached>,
    /// Session ids, oldest first (for the cap).
    order: VecDeque<String>,
}

/// One unused sign-in code.
struct Code {
    /// The link's code (244 random bits).
    code: String,
    /// A pairing's short code (normalised: no dash, capitals), usable instead of the link.
    short: Option<String>,
    /// When it stops working (`None`: no deadline).
    deadline: Option<Instant>,
}

/// A pairing: a link's code and the short code that works instead of it, once in all.
#[derive(Debug, Clone)]
pub struct Pairing {
    /// The link's code (`/login?code=…`).
    pub code: String,
    /// The short code as shown, `ABCD-EFGH` (typed at `/login?pair=…`).
    pub short: String,
}

/// What typing a short code came to.
#[derive(Debug)]
pub enum ShortRedeemed {
    /// A new session.
    Session(Session),
    /// No pairing waits with this code (wrong, used or expired).
    Unknown,
    /// Too many wrong codes were typed: every short code waiting was dropped.
    TooManyMisses,
}

/// A new short code from the OS's randomness (rejection sampling: no letter more likely).
fn new_short() -> String {
    let mut out = String::with_capacity(SHORT_LEN + 1);
    let limit = (256 / SHORT_ALPHABET.len() * SHORT_ALPHABET.len()) as u8;
    while out.len() < SHORT_LEN + 1 {
        for b in uuid::Uuid::new_v4().into_bytes() {
            if out.len() == SHORT_LEN / 2 {
                out.push('-');
            }
            if b < limit && out.len() < SHORT_LEN + 1 {
                out.push(char::from(SHORT_ALPHABET[usize::from(b) % SHORT_ALPHABET.len()]));
            }
        }
    }
    out
}

/// A typed short code as stored: letters and digits only, in capitals.
pub fn normalise_short(typed: &str) -> String {
    typed.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_uppercase()).collect()
}

/// A short name of the device a browser runs on, from its User-Agent: "iPhone · Safari",
/// "Android · Chrome", "Windows · Edge". Unknown parts say so; at most 60 characters.
pub fn device_name(user_agent: &str) -> String {
    let ua = user_agent;
    let platform = if ua.contains("iPhone") {
        "iPhone"
    } else if ua.contains("iPad") {
        "iPad"
    } else if ua.contains("Android") {
        "Android"
    } else if ua.contains("Windows") {
        "Windows"
    } else if ua.contains("Mac OS X") || ua.contains("Macintosh") {
        "Mac"
    } else if ua.contains("CrOS") {
        "ChromeOS"
    } else if ua.contains("Linux") {
        "Linux"
    } else {
        "unknown device"
    };
    let browser = if ua.contains("MicroMessenger") {
        "WeChat"
    } else if ua.contains("Edg/") || ua.contains("EdgA/") || ua.contains("EdgiOS/") {
        "Edge"
    } else if ua.contains("Firefox/") || ua.contains("FxiOS/") {
        "Firefox"
    } else if ua.contains("HeadlessChrome") {
        "Chromium (headless)"
    } else if ua.contains("Chrome/") || ua.contains("CriOS/") {
        "Chrome"
    } else if ua.contains("Safari/") {
        "Safari"
    } else if ua.trim().is_empty() {
        "no browser named"
    } else {
        "other browser"
    };
    format!("{platform} · {browser}")
}

/// A signed-in browser: its session id and the CSRF token its page must send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The value of the `tally_session` cookie.
    pub id: String,
    /// What the page must send in `X-CSRF-Token` on state-changing requests.
    pub csrf_token: String,
}

/// What the database keeps of a session id.
fn id_hash(id: &str) -> String {
    Sha256::digest(id.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn now_ms() -> Millis {
    SystemClock.now()
}

fn idle_ms() -> Millis {
    IDLE_LIFETIME.as_millis() as Millis
}

impl Sessions {
    /// An empty store, in memory only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sessions kept in `store`, so that they survive a restart.
    pub fn stored(store: Store) -> Self {
        Sessions { store: Some(store), ..Sessions::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new one-time sign-in code, usable once, until `lifetime` has passed (`None`: no
    /// deadline).
    pub fn new_code(&self, lifetime: Option<Duration>) -> String {
        let code = new_token();
        self.keep(Code { code: code.clone(), short: None, deadline: lifetime.map(|l| Instant::now() + l) });
        code
    }

    /// A new pairing: a link's code and a short code, usable once in all, for
    /// [`PAIR_LIFETIME`].
    pub fn new_pairing(&self) -> Pairing {
        let pairing = Pairing { code: new_token(), short: new_short() };
        self.keep(Code {
            code: pairing.code.clone(),
            short: Some(normalise_short(&pairing.short)),
            deadline: Some(Instant::now() + PAIR_LIFETIME),
        });
        pairing
    }

    /// Keep an unused code (expired ones go, and the oldest beyond [`MAX_CODES`]).
    fn keep(&self, code: Code) {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.codes.retain(|c| c.deadline.is_none_or(|d| d > now));
        while inner.codes.len() >= MAX_CODES {
            inner.codes.pop_front();
        }
        inner.codes.push_back(code);
    }

    /// Remember a session in the cache.
    fn cache(&self, id: &str, csrf: &str) {
        let mut inner = self.lock();
        while inner.order.len() >= MAX_SESSIONS {
            if let Some(old) = inner.order.pop_front() {
                inner.sessions.remove(&old);
            }
        }
        let now = Instant::now();
        inner.sessions.insert(id.to_string(), Cached { csrf: csrf.to_string(), checked: now, touched: now });
        inner.order.push_back(id.to_string());
    }

    fn forget(&self, id: &str) {
        let mut inner = self.lock();
        inner.sessions.remove(id);
        inner.order.retain(|x| x != id);
    }

    /// Consume a code: a new session if the code is known, unused and not expired; `None`
    /// otherwise. A code works once, whatever happens next. The session is stored before it
    /// is handed out.
    pub async fn redeem(&self, code: &str, device: Option<String>) -> Result<Option<Session>, StoreError> {
        {
            let mut inner = self.lock();
            let Some(pos) = inner.codes.iter().position(|c| constant_time_eq(c.code.as_bytes(), code.as_bytes()))
            else {
                return Ok(None);
            };
            let Some(found) = inner.codes.remove(pos) else { return Ok(None) };
            if found.deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(None);
            }
        }
        self.start_session(device).await.map(Some)
    }

    /// Consume a pairing by its short code (as typed: dashes, spaces and case do not matter).
    /// After [`MAX_SHORT_MISSES`] wrong ones every short code still waiting is dropped, so
    /// that guessing cannot outrun a code's ten minutes.
    pub async fn redeem_short(&self, typed: &str, device: Option<String>) -> Result<ShortRedeemed, StoreError> {
        let typed = normalise_short(typed);
        {
            let mut inner = self.lock();
            let now = Instant::now();
            let pos = inner.codes.iter().position(|c| {
                c.short.as_deref().is_some_and(|s| constant_time_eq(s.as_bytes(), typed.as_bytes()))
                    && c.deadline.is_none_or(|d| d > now)
            });
            match pos {
                Some(pos) => {
                    inner.codes.remove(pos);
                    inner.short_misses = 0;
                }
                None => {
                    inner.short_misses += 1;
                    if inner.short_misses >= MAX_SHORT_MISSES {
                        for c in inner.codes.iter_mut() {
                            c.short = None;
                        }
                        inner.short_misses = 0;
                        return Ok(ShortRedeemed::TooManyMisses);
                    }
                    return Ok(ShortRedeemed::Unknown);
                }
            }
        }
        self.start_session(device).await.map(ShortRedeemed::Session)
    }

    /// A new session of `device`, stored before it is handed out.
    async fn start_session(&self, device: Option<String>) -> Result<Session, StoreError> {
        let session = Session { id: new_token(), csrf_token: new_token() };
        if let Some(store) = &self.store {
            store.insert_session(id_hash(&session.id), session.csrf_token.clone(), device, now_ms()).await?;
        }
        self.cache(&session.id, &session.csrf_token);
        Ok(session)
    }

    /// The session with this id, if it exists and has not expired. A store error counts as
    /// no session (the browser is asked to sign in again; nothing is lost).
    pub async fn get(&self, id: &str) -> Option<Session> {
        let cached = self.lock().sessions.get(id).cloned();
        let Some(store) = &self.store else {
            return cached.map(|c| Session { id: id.to_string(), csrf_token: c.csrf });
        };
        if let Some(c) = &cached
            && c.checked.elapsed() < RECHECK
        {
            if c.touched.elapsed() >= TOUCH_EVERY {
                self.touch(store, id).await;
            }
            return Some(Session { id: id.to_string(), csrf_token: c.csrf.clone() });
        }
        let found = match store.session(id_hash(id)).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "could not read a web session; the browser is asked to sign in again");
                return None;
            }
        };
        match found {
            Some(s) if s.last_used_at > now_ms() - idle_ms() => {
                let touched = cached.map(|c| c.touched);
                self.cache(id, &s.csrf);
                if let Some(t) = touched
                    && let Some(c) = self.lock().sessions.get_mut(id)
                {
                    c.touched = t;
                }
                if now_ms() - s.last_used_at >= TOUCH_EVERY.as_millis() as Millis {
                    self.touch(store, id).await;
                }
                Some(Session { id: id.to_string(), csrf_token: s.csrf })
            }
            _ => {
                self.forget(id);
                None
            }
        }
    }

    /// Write a session's use (and drop expired ones); a failure is only logged.
    async fn touch(&self, store: &Store, id: &str) {
        let now = now_ms();
        if let Err(e) = store.touch_session(id_hash(id), now, now - idle_ms()).await {
            tracing::warn!(error = %e, "could not note a web session's use");
            return;
        }
        if let Some(c) = self.lock().sessions.get_mut(id) {
            c.touched = Instant::now();
        }
    }

    /// Every session in use (stored ones only: without a store, none), the most recently used
    /// first, each by the sha256 of its cookie value.
    pub async fn list(&self) -> Result<Vec<crate::store::settings::SessionRow>, StoreError> {
        match &self.store {
            Some(store) => store.sessions(now_ms() - idle_ms()).await,
            None => Ok(Vec::new()),
        }
    }

    /// End the session whose cookie value hashes to `hash` (from [`Sessions::list`]); whether
    /// one ended. Its live streams on this node end at once; another PostgreSQL node notices
    /// within [`RECHECK`].
    pub async fn end_listed(&self, hash: &str) -> Result<bool, StoreError> {
        let cached = self.lock().sessions.keys().find(|id| id_hash(id) == hash).cloned();
        if let Some(id) = &cached {
            let _ = self.ended.send(Some(id.clone()));
        }
        let ended = match &self.store {
            Some(store) => store.delete_sessions(Some(hash.to_string())).await? > 0,
            None => cached.is_some(),
        };
        if let Some(id) = cached {
            self.forget(&id);
        }
        Ok(ended)
    }

    /// The sha256 of a session id, as [`Sessions::list`] names it.
    pub fn listed_id(id: &str) -> String {
        id_hash(id)
    }

    /// Hear of sessions ending: `Some(id)` one, `None` all (a live stream opened with a session
    /// ends when it hears of it; a receiver that fell behind treats it as all).
    pub fn subscribe_ended(&self) -> tokio::sync::broadcast::Receiver<Option<String>> {
        self.ended.subscribe()
    }

    /// End one session (`Some(id)`) or every session (`None`); how many ended. Its live
    /// streams end too.
    pub async fn end(&self, id: Option<&str>) -> Result<usize, StoreError> {
        // Said first: even if the database write fails below, a stream of this session stops.
        let _ = self.ended.send(id.map(str::to_string));
        let stored = match &self.store {
            Some(store) => store.delete_sessions(id.map(id_hash)).await?,
            None => 0,
        };
        let mut inner = self.lock();
        let cached = match id {
            Some(id) => {
                inner.order.retain(|x| x != id);
                usize::from(inner.sessions.remove(id).is_some())
            }
            None => {
                inner.order.clear();
                inner.sessions.drain().count()
            }
        };
        Ok(if self.store.is_some() { stored } else { cached })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_code_works_once() {
        let s = Sessions::new();
        let code = s.new_code(None);
        assert!(code.len() >= 32);
        let session = s.redeem(&code, None).await.expect("redeem").expect("first use");
        assert_ne!(session.id, session.csrf_token);
        assert_eq!(s.get(&session.id).await, Some(session));
        assert!(s.redeem(&code, None).await.expect("redeem").is_none(), "second use");
        assert!(s.redeem("nope", None).await.expect("redeem").is_none());
        assert!(s.get("nope").await.is_none());
    }

    #[tokio::test]
    async fn a_pairing_works_once_by_its_link_or_its_short_code() {
        let s = Sessions::new();
        let p = s.new_pairing();
        assert_eq!(p.short.len(), SHORT_LEN + 1);
        assert_eq!(p.short.as_bytes()[SHORT_LEN / 2], b'-');
        assert!(normalise_short(&p.short).bytes().all(|b| SHORT_ALPHABET.contains(&b)));
        // Typed in lower case with spaces: still the code; then neither works again.
        let typed = format!(" {} ", p.short.to_lowercase().replace('-', " "));
        assert!(matches!(s.redeem_short(&typed, None).await.expect("redeem"), ShortRedeemed::Session(_)));
        assert!(s.redeem(&p.code, None).await.expect("redeem").is_none(), "the link after its short code");
        assert!(matches!(s.redeem_short(&p.short, None).await.expect("redeem"), ShortRedeemed::Unknown));

        let q = s.new_pairing();
        assert!(s.redeem(&q.code, None).await.expect("redeem").is_some());
        assert!(matches!(s.redeem_short(&q.short, None).await.expect("redeem"), ShortRedeemed::Unknown));
        // A plain sign-in code has no short code.
        let c = s.new_code(None);
        assert!(matches!(s.redeem_short(&c, None).await.expect("redeem"), ShortRedeemed::Unknown));
    }

    #[tokio::test]
    async fn too_many_wrong_short_codes_drop_every_waiting_one_but_not_the_links() {
        let s = Sessions::new();
        let p = s.new_pairing();
        let mut last = None;
        for _ in 0..MAX_SHORT_MISSES {
            last = Some(s.redeem_short("2222-2222", None).await.expect("redeem"));
        }
        assert!(matches!(last, Some(ShortRedeemed::TooManyMisses)), "{last:?}");
        assert!(matches!(s.redeem_short(&p.short, None).await.expect("redeem"), ShortRedeemed::Unknown));
        assert!(s.redeem(&p.code, None).await.expect("redeem").is_some(), "the link still works");
        // A new pairing's short code works again.
        let q = s.new_pairing();
        assert!(matches!(s.redeem_short(&q.short, None).await.expect("redeem"), ShortRedeemed::Session(_)));
    }

    #[test]
    fn a_device_is_named_by_its_user_agent() {
        for (ua, name) in [
            (
                "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) \
                 Version/17.5 Mobile/15E148 Safari/604.1",
                "iPhone · Safari",
            ),
            (
                "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) \
                 Chrome/126.0.0.0 Mobile Safari/537.36",
                "Android · Chrome",
            ),
            (
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) \
                 Chrome/126.0.0.0 Safari/537.36 Edg/126.0.0.0",
                "Windows · Edge",
            ),
            (
                "Mozilla/5.0 (Linux; Android 13; V2219A) AppleWebKit/537.36 Chrome/116.0 Mobile Safari/537.36 \
                 MicroMessenger/8.0.47",
                "Android · WeChat",
            ),
            ("", "unknown device · no browser named"),
        ] {
            assert_eq!(device_name(ua), name, "{ua}");
        }
    }

    #[tokio::test]
    async fn an_expired_code_is_refused() {
        let s = Sessions::new();
        let code = s.new_code(Some(Duration::ZERO));
        assert!(s.redeem(&code, None).await.expect("redeem").is_none());
    }

    #[tokio::test]
    async fn old_sessions_are_dropped_at_the_cap_and_ending_all_ends_them() {
        let s = Sessions::new();
        let first = s.redeem(&s.new_code(None), None).await.expect("redeem").expect("session");
        for _ in 0..MAX_SESSIONS {
            s.redeem(&s.new_code(None), None).await.expect("redeem").expect("session");
        }
        assert!(s.get(&first.id).await.is_none());
        assert_eq!(s.end(None).await.expect("end"), MAX_SESSIONS);
    }

    #[tokio::test]
    async fn a_stored_session_outlives_its_cache_and_ends_everywhere() {
        let dir = std::env::temp_dir().join(format!("tally-sessions-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let store = Store::open(&dir.join("tally.db"), crate::config::Durability::Full).expect("store");
        let a = Sessions::stored(store.clone());
        let session = a.redeem(&a.new_code(None), None).await.expect("redeem").expect("session");
        // Another Sessions over the same database (a restarted daemon) knows it.
        let b = Sessions::stored(store.clone());
        assert_eq!(b.get(&session.id).await, Some(session.clone()));
        let stored = store.session(id_hash(&session.id)).await.expect("read").expect("stored");
        assert_eq!(stored.csrf, session.csrf_token);
        assert!(store.session(session.id.clone()).await.expect("read").is_none(), "only the id's hash is stored");
        assert_eq!(b.end(None).await.expect("end all"), 1);
        assert!(Sessions::stored(store.clone()).get(&session.id).await.is_none());
        let _ = store.close();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
