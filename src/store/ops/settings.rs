//! Settings the owner changes at run time, written once over [`Tx`]: the budget set at run
//! time (one row), other settings by key (`shop_settings`: the shop's time zone) and the web
//! page's sessions (the sha256 of each cookie value, never the
//! value). On PostgreSQL they are shared by every node: a budget set through one node holds
//! on all of them once each re-reads it, and a session started on one node is accepted by
//! the others.

use crate::domain::Millis;
use crate::store::StoreError;
use crate::store::settings::{SessionRow, StoredSession};
use crate::store::tx::Tx;

/// The budget set at run time (its JSON), if one is set.
pub(in crate::store) fn budget_setting(tx: &mut dyn Tx) -> Result<Option<String>, StoreError> {
    tx.opt("SELECT limits FROM budget_setting WHERE id = 1", &[])?.map(|r| r.get(0)).transpose()
}

/// Store the budget in force (`Some(json)`), or remove it (`None`: the config's applies).
pub(in crate::store) fn set_budget_setting(
    tx: &mut dyn Tx,
    limits: Option<&str>,
    now: Millis,
) -> Result<(), StoreError> {
    match limits {
        Some(l) => tx.exec(
            "INSERT INTO budget_setting (id, limits, set_at) VALUES (1, ?1, ?2)
             ON CONFLICT (id) DO UPDATE SET limits = excluded.limits, set_at = excluded.set_at",
            &[&l, &now],
        )?,
        None => tx.exec("DELETE FROM budget_setting", &[])?,
    };
    Ok(())
}

/// A setting the owner changed in the page (`shop_settings`), if it is set.
pub(in crate::store) fn shop_setting(tx: &mut dyn Tx, key: &str) -> Result<Option<String>, StoreError> {
    tx.opt("SELECT value FROM shop_settings WHERE key = ?1", &[&key])?.map(|r| r.get(0)).transpose()
}

/// Store a setting (`Some`), or remove it (`None`: the configuration's applies again).
pub(in crate::store) fn set_shop_setting(
    tx: &mut dyn Tx,
    key: &str,
    value: Option<&str>,
    now: Millis,
) -> Result<(), StoreError> {
    match value {
        Some(v) => tx.exec(
            "INSERT INTO shop_settings (key, value, set_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value, set_at = excluded.set_at",
            &[&key, &v, &now],
        )?,
        None => tx.exec("DELETE FROM shop_settings WHERE key = ?1", &[&key])?,
    };
    Ok(())
}

/// Record a new session.
pub(in crate::store) fn insert_session(
    tx: &mut dyn Tx,
    id_hash: &str,
    csrf: &str,
    device: Option<&str>,
    now: Millis,
) -> Result<(), StoreError> {
    tx.exec(
        "INSERT INTO web_sessions (id_hash, csrf, created_at, last_used_at, device) VALUES (?1, ?2, ?3, ?3, ?4)",
        &[&id_hash, &csrf, &now, &device],
    )?;
    Ok(())
}

/// Every session not unused since `expired_before`, the most recently used first.
pub(in crate::store) fn sessions(tx: &mut dyn Tx, expired_before: Millis) -> Result<Vec<SessionRow>, StoreError> {
    tx.rows(
        "SELECT id_hash, device, created_at, last_used_at FROM web_sessions WHERE last_used_at >= ?1
         ORDER BY last_used_at DESC, id_hash",
        &[&expired_before],
    )?
    .into_iter()
    .map(|r| Ok(SessionRow { id_hash: r.get(0)?, device: r.get(1)?, created_at: r.get(2)?, last_used_at: r.get(3)? }))
    .collect()
}

/// A session by the hash of its cookie value.
pub(in crate::store) fn session(tx: &mut dyn Tx, id_hash: &str) -> Result<Option<StoredSession>, StoreError> {
    let Some(r) = tx.opt("SELECT csrf, created_at, last_used_at FROM web_sessions WHERE id_hash = ?1", &[&id_hash])?
    else {
        return Ok(None);
    };
    Ok(Some(StoredSession { csrf: r.get(0)?, created_at: r.get(1)?, last_used_at: r.get(2)? }))
}

/// Note that a session was used at `now`, and delete sessions unused since `expired_before`.
pub(in crate::store) fn touch_session(
    tx: &mut dyn Tx,
    id_hash: &str,
    now: Millis,
    expired_before: Millis,
) -> Result<(), StoreError> {
    tx.exec("UPDATE web_sessions SET last_used_at = ?2 WHERE id_hash = ?1 AND last_used_at < ?2", &[&id_hash, &now])?;
    tx.exec("DELETE FROM web_sessions WHERE last_used_at < ?1", &[&expired_before])?;
    Ok(())
}

/// End one session (`Some(hash)`) or all of them (`None`); how many ended.
pub(in crate::store) fn delete_sessions(tx: &mut dyn Tx, id_hash: Option<&str>) -> Result<usize, StoreError> {
    let n = match id_hash {
        Some(h) => tx.exec("DELETE FROM web_sessions WHERE id_hash = ?1", &[&h])?,
        None => tx.exec("DELETE FROM web_sessions", &[])?,
    };
    Ok(n as usize)
}
