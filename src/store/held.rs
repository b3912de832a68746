//! Held jobs: what an older copy of the database would otherwise send again
//! (`store::sqlite::lineage` decides when a database is older). The types are here; the operations,
//! written once for both backends, are in `store::ops::held`.
//!
//! A held job's envelope is `pending` with `due_at` and `pass` NULL and `held_at` /
//! `held_reason` set; its task is `waiting` with the reason. The dispatcher only claims ready
//! envelopes (`pass` set) and only promotes waiting ones with a due time, and the next shot of
//! a set is only scheduled from unheld envelopes (`ops::common::schedule_next_shot_of`), so nothing
//! dispatches a held envelope and nothing polls for it: it moves only when the owner releases
//! it (`ops::held::release_held`) or cancels it.
//!
//! What is held: every job that was not settled in the database and whose request did not
//! leave in it — queued and waiting ones, and claimed executions that had not recorded
//! `calling` (abandoned here, as recovery would). A job whose execution recorded `calling` or
//! `accepted` is left to start-up recovery, which never sends it blind (a replay with the same
//! key, a lookup, or `unknown`).

use std::sync::LazyLock;

use rusqlite::Connection;
use serde::Serialize;

use super::StoreError;
use super::ops::held::HOLDABLE;
use super::sqlite::tx::SqliteTx;
use crate::domain::Millis;

/// Why a task is held, and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Held {
    pub reason: String,
    pub since: Millis,
}

/// Which held jobs to release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    All,
    Ids(Vec<String>),
}

/// What a release did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReleaseReport {
    /// Released, and queued to be sent again.
    pub released: Vec<String>,
    /// Named, but not held (unknown ids, or jobs released or canceled already).
    pub not_held: Vec<String>,
}

/// How many jobs `hold_unsettled` would hold (SQLite's start-up forecast, `store::sqlite::lineage`).
pub(crate) fn count_holdable(c: &Connection) -> Result<i64, StoreError> {
    static SQL: LazyLock<String> = LazyLock::new(|| format!("SELECT count(*) FROM ({HOLDABLE})"));
    Ok(c.query_row(&SQL, [], |r| r.get(0))?)
}

/// How many jobs are held, on a SQLite connection (`ops::held::count_held`).
pub(crate) fn count_held(c: &Connection) -> Result<i64, StoreError> {
    super::ops::held::count_held(&mut SqliteTx::new(c))
}

/// Hold every unsettled job that did not leave, on SQLite's writer at start-up
/// (`ops::held::hold_unsettled` is the one logic). Returns the held task ids.
pub(crate) fn hold_unsettled(c: &Connection, reason: &str, now: Millis) -> Result<Vec<String>, StoreError> {
    super::ops::held::hold_unsettled(&mut SqliteTx::new(c), reason, now)
}

pub(crate) use super::ops::held::held_of;
