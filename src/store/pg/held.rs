//! What PostgreSQL code not yet written over [`crate::store::tx::Tx`] still calls of held jobs,
//! forwarding to the one logic in `store::ops::held`, and the held list, which needs
//! PostgreSQL's task reader until reading a task is written once.

use super::{PgStore, Tx};
use crate::store::held::Held;
use crate::store::{StoreError, TaskView};

/// The hold of one task, if it is held (`ops::held::held_of`).
pub(super) fn held_of(tx: &mut Tx<'_, '_>, task: &str) -> Result<Option<Held>, StoreError> {
    crate::store::ops::held::held_of(tx, task)
}

impl PgStore {
    /// Held jobs, and how many there are (`ops::held::held_tasks`).
    pub async fn held_tasks(&self, limit: usize) -> Result<(i64, Vec<TaskView>), StoreError> {
        self.read(move |tx| crate::store::ops::held::held_tasks(tx, limit, &mut |tx, t| super::read::get_task(tx, t)))
            .await
    }
}
