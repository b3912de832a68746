//! What PostgreSQL code not yet written over [`crate::store::tx::Tx`] still calls of image
//! sets, forwarding to the one logic in `store::ops::sets` and `store::ops::common`, and the
//! set reads that need PostgreSQL's task reader until reading a task is written once.

use super::{PgStore, Tx};
use crate::domain::Millis;
use crate::store::ops::sets::{get_set, list_sets};
use crate::store::{SetView, StoreError, UploadView};

/// Lock a set's row (rule L for set operations: set before envelope); false if there is no
/// such set.
pub(super) fn lock_set(tx: &mut Tx<'_, '_>, set: &str) -> Result<bool, StoreError> {
    Ok(tx.opt("SELECT 1 FROM sets WHERE id = $1 FOR UPDATE", &[&set])?.is_some())
}

/// After `task` settled: schedule its set's next shot if none is live (`ops::common::on_settled`).
pub(super) fn schedule_next_shot(tx: &mut Tx<'_, '_>, task: &str, now: Millis) -> Result<(), StoreError> {
    crate::store::ops::common::on_settled(tx, task, now)
}

/// The reference images of a set, in order (`ops::sets::references_of_set`).
pub(super) fn references_of_set(tx: &mut Tx<'_, '_>, set: &str) -> Result<Vec<UploadView>, StoreError> {
    crate::store::ops::sets::references_of_set(tx, set)
}

impl PgStore {
    /// A set with its current shots (`ops::sets::get_set`, its tasks read by PostgreSQL's task
    /// reader).
    pub async fn get_set(&self, id: String) -> Result<Option<SetView>, StoreError> {
        self.read(move |tx| get_set(tx, &id, &mut |tx, t| super::read::get_task(tx, t))).await
    }

    /// Sets newest first (as [`PgStore::get_set`]).
    pub async fn list_sets(&self, before: Option<String>, limit: usize) -> Result<Vec<SetView>, StoreError> {
        self.read(move |tx| list_sets(tx, before.as_deref(), limit, &mut |tx, t| super::read::get_task(tx, t))).await
    }
}
