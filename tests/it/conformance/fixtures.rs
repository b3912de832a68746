//! The conformance suite's fixtures and helpers. The suite tests the production seam: every
//! test takes the [`Store`] the engine holds (`src/store/seam.rs`) and calls its own methods,
//! so a wrong arm or a swapped argument in the seam fails here (River's
//! `riverdrivertest.Exercise`, which runs against each driver's production interface, is the
//! model). This file opens a fresh store of each kind and holds the few free helpers the tests
//! share (inspection SQL, the file check, short forms of a filter or an acknowledgement); there
//! is no trait of its own between the tests and `Store`.
//!
//! PostgreSQL comes from `TALLY_TEST_PG_URL` (`scripts/with-postgres.sh` starts a throw-away
//! server and sets it; `scripts/test.sh` runs the suite through it). Every store gets its own
//! schema in that database; the nodes of one multi-node test share one. Without the variable
//! the PostgreSQL tests fail and say how to run them — unless `TALLY_SKIP_PG=1` is set
//! outside CI; under `CI=true` a missing PostgreSQL is always a failure.

#![allow(dead_code)]

use tally::config::Durability;
use tally::domain::TaskStatus;
use tally::store::postgres::PgOptions;
use tally::store::*;

/// An integer from one SQL query written so both dialects accept it (test inspection, read
/// straight from the database under the store).
pub async fn int(s: &Store, sql: &'static str) -> i64 {
    match s {
        Store::Sqlite(_) => s.read(move |c| Ok(c.query_row(sql, [], |r| r.get::<_, i64>(0))?)).await.expect(sql),
        Store::Postgres(p) => p.raw(move |c| Ok(c.query_one(sql, &[])?.get::<_, i64>(0))).await.expect(sql),
    }
}

/// What `tally check` finds in the store's database file (SQLite; a PostgreSQL store has no
/// file here and answers nothing: its check is tested through `tally check` on a node).
pub fn file_problems(s: &Store) -> Vec<String> {
    s.path().map(|p| tally::store::check(p).expect("check runs").problems).unwrap_or_default()
}

/// The acknowledgement of a retry that only says whether the possible charge was accepted.
pub fn ack(possible_charge: bool) -> RetryAck {
    RetryAck { possible_charge, retried_as: None }
}

/// The task filter of one status (or none: every task).
pub fn with_status(status: Option<TaskStatus>) -> TaskFilter {
    TaskFilter { status, ..Default::default() }
}

/// Tasks whose prompt or set product contains `text`, newest first (`list_tasks` with a search).
pub async fn search(s: &Store, text: &str, limit: usize) -> Result<Vec<TaskView>, StoreError> {
    s.list_tasks(TaskFilter { search: Some(text.to_string()), ..Default::default() }, None, limit).await
}

/// The provider every conformance test submits to: plenty of slots, no reserve (the tests of
/// slots and lanes configure their own).
pub fn provider_p() -> Vec<ProviderSlots> {
    vec![ProviderSlots { reserve: 0, ..ProviderSlots::new("p", 100) }]
}

/// A fresh SQLite store in its own temp dir.
pub fn sqlite() -> Store {
    let dir = std::env::temp_dir().join(format!("tally-conf-{}", uuid::Uuid::new_v4()));
    Store::open(&dir.join("tally.db"), Durability::Full).expect("open sqlite")
}

/// Close a store made by [`sqlite`] and remove its directory.
pub fn remove_sqlite(s: &Store) {
    let _ = s.close();
    if let Some(dir) = s.path().and_then(|p| p.parent()) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

pub use crate::common::pg_url;

/// A fresh schema name.
pub fn schema() -> String {
    format!("t_{}", uuid::Uuid::new_v4().simple())
}

/// Options for a node of a test schema: the caller's clock, two operation connections.
pub fn pg_options(url: &str, schema: &str, node: &str) -> PgOptions {
    PgOptions {
        url: url.to_string(),
        node: node.to_string(),
        connections: 2,
        durability: Durability::Full,
        schema: Some(schema.to_string()),
        db_clock: false,
        listen: true,
        poll: None,
        watch_peers: true,
        lease: std::time::Duration::from_secs(30),
    }
}

/// A fresh PostgreSQL store (node `node-a`) in its own schema, behind the seam (`Store`) as the
/// engine holds it; `None` only when skipping.
pub fn postgres() -> Option<Store> {
    let url = pg_url()?;
    Some(Store::open_postgres(pg_options(&url, &schema(), "node-a")).expect("open postgres"))
}
