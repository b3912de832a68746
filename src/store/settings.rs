//! Settings the owner changes at run time and that must survive a restart: the budget set
//! from the page, the CLI or `PUT /v1/budget` (`budget_setting`, one row), and the web page's
//! sessions (`web_sessions`: the sha256 of each cookie value, never the value). The
//! PostgreSQL twins are in `store::pg::settings`.

use rusqlite::{OptionalExtension, params};

use super::{SqliteStore, StoreError};
use crate::domain::Millis;

/// A stored web session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSession {
    pub csrf: String,
    pub created_at: Millis,
    pub last_used_at: Millis,
}

impl SqliteStore {
    /// The budget set at run time (its JSON), if one is set.
    pub async fn budget_setting(&self) -> Result<Option<String>, StoreError> {
        self.read(|c| {
            Ok(c.prepare_cached("SELECT limits FROM budget_setting WHERE id = 1")?
                .query_row([], |r| r.get(0))
                .optional()?)
        })
        .await
    }

    /// Store the budget in force (`Some(json)`), or remove it (`None`: the config's applies).
    pub async fn set_budget_setting(&self, limits: Option<String>, now: Millis) -> Result<(), StoreError> {
        self.write(move |c| {
            match &limits {
                Some(l) => c
                    .prepare_cached(
                        "INSERT INTO budget_setting (id, limits, set_at) VALUES (1, ?1, ?2)
                         ON CONFLICT (id) DO UPDATE SET limits = excluded.limits, set_at = excluded.set_at",
                    )?
                    .execute(params![l, now])?,
                None => c.prepare_cached("DELETE FROM budget_setting")?.execute([])?,
            };
            Ok(())
        })
        .await
    }

    /// Record a new session.
    pub async fn insert_session(&self, id_hash: String, csrf: String, now: Millis) -> Result<(), StoreError> {
        self.write(move |c| {
            c.prepare_cached(
                "INSERT INTO web_sessions (id_hash, csrf, created_at, last_used_at) VALUES (?1, ?2, ?3, ?3)",
            )?
            .execute(params![id_hash, csrf, now])?;
            Ok(())
        })
        .await
    }

    /// A session by the hash of its cookie value.
    pub async fn session(&self, id_hash: String) -> Result<Option<StoredSession>, StoreError> {
        self.read(move |c| {
            Ok(c.prepare_cached("SELECT csrf, created_at, last_used_at FROM web_sessions WHERE id_hash = ?1")?
                .query_row([&id_hash], |r| {
                    Ok(StoredSession { csrf: r.get(0)?, created_at: r.get(1)?, last_used_at: r.get(2)? })
                })
                .optional()?)
        })
        .await
    }

    /// Note that a session was used at `now` (an ordered write: losing it to a power cut only
    /// makes the session look older), and delete sessions unused since `expired_before`.
    pub async fn touch_session(&self, id_hash: String, now: Millis, expired_before: Millis) -> Result<(), StoreError> {
        self.write_ordered(move |c| {
            c.prepare_cached("UPDATE web_sessions SET last_used_at = ?2 WHERE id_hash = ?1 AND last_used_at < ?2")?
                .execute(params![id_hash, now])?;
            c.prepare_cached("DELETE FROM web_sessions WHERE last_used_at < ?1")?.execute([expired_before])?;
            Ok(())
        })
        .await
    }

    /// End one session (`Some(hash)`) or all of them (`None`); returns how many ended.
    pub async fn delete_sessions(&self, id_hash: Option<String>) -> Result<usize, StoreError> {
        self.write(move |c| {
            Ok(match &id_hash {
                Some(h) => c.prepare_cached("DELETE FROM web_sessions WHERE id_hash = ?1")?.execute([h])?,
                None => c.prepare_cached("DELETE FROM web_sessions")?.execute([])?,
            })
        })
        .await
    }
}
