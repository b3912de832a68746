//! The budget set at run time and the web sessions on PostgreSQL (as `store::settings`):
//! shared by every node, so a budget set through one node holds on all of them once each
//! re-reads it, and a session started on one node is accepted by the others.

use super::{PgStore, StoreError};
use crate::domain::Millis;
use crate::store::settings::StoredSession;

impl PgStore {
    /// The budget set at run time (its JSON), if one is set.
    pub async fn budget_setting(&self) -> Result<Option<String>, StoreError> {
        self.read(|tx| Ok(tx.opt("SELECT limits FROM budget_setting WHERE id = 1", &[])?.map(|r| r.get(0)))).await
    }

    /// Store the budget in force (`Some(json)`), or remove it (`None`).
    pub async fn set_budget_setting(&self, limits: Option<String>, now: Millis) -> Result<(), StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            match &limits {
                Some(l) => tx.exec(
                    "INSERT INTO budget_setting (id, limits, set_at) VALUES (1, $1, $2)
                     ON CONFLICT (id) DO UPDATE SET limits = excluded.limits, set_at = excluded.set_at",
                    &[l, &now],
                )?,
                None => tx.exec("DELETE FROM budget_setting", &[])?,
            };
            Ok(())
        })
        .await
    }

    /// Record a new session.
    pub async fn insert_session(&self, id_hash: String, csrf: String, now: Millis) -> Result<(), StoreError> {
        self.write(move |tx| {
            let now = tx.now(now)?;
            tx.exec(
                "INSERT INTO web_sessions (id_hash, csrf, created_at, last_used_at) VALUES ($1, $2, $3, $3)",
                &[&id_hash, &csrf, &now],
            )?;
            Ok(())
        })
        .await
    }

    /// A session by the hash of its cookie value.
    pub async fn session(&self, id_hash: String) -> Result<Option<StoredSession>, StoreError> {
        self.read(move |tx| {
            Ok(tx
                .opt("SELECT csrf, created_at, last_used_at FROM web_sessions WHERE id_hash = $1", &[&id_hash])?
                .map(|r| StoredSession { csrf: r.get(0), created_at: r.get(1), last_used_at: r.get(2) }))
        })
        .await
    }

    /// Note that a session was used, and delete sessions unused since `expired_before`.
    pub async fn touch_session(&self, id_hash: String, now: Millis, expired_before: Millis) -> Result<(), StoreError> {
        self.write_ordered(move |tx| {
            tx.exec(
                "UPDATE web_sessions SET last_used_at = $2 WHERE id_hash = $1 AND last_used_at < $2",
                &[&id_hash, &now],
            )?;
            tx.exec("DELETE FROM web_sessions WHERE last_used_at < $1", &[&expired_before])?;
            Ok(())
        })
        .await
    }

    /// End one session or all of them; returns how many ended.
    pub async fn delete_sessions(&self, id_hash: Option<String>) -> Result<usize, StoreError> {
        self.write(move |tx| {
            Ok(match &id_hash {
                Some(h) => tx.exec("DELETE FROM web_sessions WHERE id_hash = $1", &[h])?,
                None => tx.exec("DELETE FROM web_sessions", &[])?,
            } as usize)
        })
        .await
    }
}
