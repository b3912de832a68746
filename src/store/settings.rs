//! Settings the owner changes at run time and that must survive a restart: the budget set
//! from the page, the CLI or `PUT /v1/budget` (`budget_setting`, one row), and the web page's
//! sessions (`web_sessions`: the sha256 of each cookie value, never the value). The
//! operations, written once for both backends, are in `store::ops::settings`.

use crate::domain::Millis;

/// A web session as the page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct SessionRow {
    /// The sha256 of the cookie value (the session's id in the API; it signs nothing in).
    pub id_hash: String,
    /// The device it signed in, from its browser's User-Agent ("iPhone · Safari").
    pub device: Option<String>,
    pub created_at: Millis,
    pub last_used_at: Millis,
}

/// A web session as stored, for its browser.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct StoredSession {
    pub csrf: String,
    pub created_at: Millis,
    pub last_used_at: Millis,
}
