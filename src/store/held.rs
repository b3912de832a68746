//! Held jobs: what an older copy of the database would otherwise send again
//! (`store::sqlite::lineage` decides when a database is older). The types are here; the operations,
//! written once for both backends, are in `store::ops::held`.
//!
//! A held job's envelope is `pending` with `due_at` and `pass` NULL and `held_at` /
//! `held_reason` set; its task is `waiting` with the reason. The dispatcher only claims ready
//! envelopes (`pass` set) and only promotes waiting ones with a due time, and the tasks of a
//! set are only scheduled from unheld envelopes (`ops::common::schedule_next_shot_of`), so nothing
//! dispatches a held envelope and nothing polls for it: it moves only when the owner releases
//! it (`ops::held::release_held`) or cancels it, or a look at its provider finds its request
//! (below).
//!
//! What is held: every job that was not settled in the database and whose request did not
//! leave in it — queued and waiting ones, and claimed executions that had not recorded
//! `calling` (abandoned here, as recovery would). A job whose execution recorded `calling` or
//! `accepted` is left to start-up recovery, which never sends it blind (a replay with the same
//! key, a lookup, or `unknown`).
//!
//! **Settled by a look at the provider** (`engine::lookup` decides, `ops::held::settle_held`
//! applies, re-checking in its transaction that the job is still held as it was read): a
//! request of the job found at the provider becomes the job's execution in phase `accepted`,
//! which recovery polls like any other (so its image and its charge evidence land through the
//! worker's fenced finish, and nothing is sent); a look that proved nothing stays held and its
//! reason says what the look found. Nothing is released by a look (see `engine::lookup`).

use std::sync::LazyLock;

use rusqlite::Connection;
use serde::Serialize;

use super::StoreError;
use super::ops::held::HOLDABLE;
use super::sqlite::tx::SqliteTx;
use crate::domain::Millis;

/// Why a task is held, and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct Held {
    pub reason: String,
    pub since: Millis,
}

/// What a look at the provider decided about one held job, applied by
/// `Store::settle_held` only while the job is still held as [`HeldLook`] read it.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum HeldSettle {
    /// The provider shows exactly one request of this job: it becomes the job's execution
    /// (`attempt`, sent with `key`), in phase `accepted` with the provider's job id, on a lease
    /// that has already run out, so recovery hands it to a worker that polls it.
    Adopt {
        job_id: String,
        key: String,
        attempt: i64,
        /// What the request cost, as `record_calling` would have recorded it (no budget
        /// check: the money was spent by the daemon that sent it).
        facts: super::CallingFacts,
    },
    /// Nothing proven, or nothing the daemon may act on by itself: the job stays held, and
    /// `found` (plain words) is added to its reason.
    Keep { found: String },
}

/// One held job as a look read it, and what the look decided.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct HeldLook {
    pub task: String,
    /// When it was held (`Held::since`): a job released and held again is another hold.
    pub since: Millis,
    /// The task's attempts when it was read: nothing may have run since.
    pub attempts: i64,
    pub settle: HeldSettle,
}

/// What `Store::settle_held` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The found request is the job's execution now; recovery polls it.
    Adopted,
    /// Still held, its reason saying what the look found.
    Kept,
    /// The job is not held as it was read any more (released, canceled, held again):
    /// nothing was written.
    Changed,
    /// A task of another shot of its image set is live: nothing was written (a set's shots go
    /// one after another; only the candidates of one shot run together); the next look tries
    /// again.
    SetBusy,
}

/// Words that start what a look at the provider found, inside a held job's reason; a later
/// look replaces what follows them.
pub const LOOK_NOTE: &str = " — Looked up at the provider: ";

/// Which held jobs to release.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
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
