//! Opening the database: pragmas (set, then read back and asserted), schema creation and
//! migration by `PRAGMA user_version` (and, from version 3, moving image files into the
//! database: `store::sqlite::migrate`). The whole-file operations (check, backup, restore) are in
//! `store::sqlite::whole`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, trace::TraceEventCodes};

use crate::config::Durability;
use crate::store::StoreError;

/// The schema version this build writes. Older databases are migrated; newer ones refused.
pub const SCHEMA_VERSION: i64 = 18;

/// `PRAGMA application_id` of tally databases ("taly").
pub(super) const APPLICATION_ID: i64 = 0x7461_6c79;

/// The full current schema.
const SCHEMA: &str = include_str!("../../../schema.sql");

/// Migrations from version `n` to `n + 1`, indexed by `n - 1`. Each runs in the transaction
/// that also bumps `user_version`.
const MIGRATIONS: &[&str] = &[
    // 1 → 2: product image sets and reference uploads.
    "CREATE TABLE uploads (
        id TEXT PRIMARY KEY, sha256 TEXT NOT NULL UNIQUE, path TEXT NOT NULL,
        bytes INTEGER NOT NULL CHECK (bytes > 0),
        media_type TEXT NOT NULL CHECK (media_type IN ('image/png', 'image/jpeg', 'image/webp')),
        created_at INTEGER NOT NULL) STRICT;
     CREATE TABLE sets (
        id TEXT PRIMARY KEY, idempotency_key TEXT UNIQUE, request_hash TEXT NOT NULL, product TEXT NOT NULL,
        style TEXT, provider TEXT NOT NULL, canceled INTEGER NOT NULL DEFAULT 0 CHECK (canceled IN (0, 1)),
        created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL) STRICT;
     CREATE TABLE set_references (
        set_id TEXT NOT NULL REFERENCES sets(id), position INTEGER NOT NULL,
        upload_id TEXT NOT NULL REFERENCES uploads(id), PRIMARY KEY (set_id, position)) STRICT;
     ALTER TABLE tasks ADD COLUMN shot_role TEXT CHECK (shot_role IN ('main', 'selling_point', 'scene'));
     CREATE INDEX tasks_by_set ON tasks(set_id, set_position) WHERE set_id IS NOT NULL;",
    // 2 → 3: the provider's handle for an accepted job (fal's status/response URLs), JSON.
    "ALTER TABLE executions ADD COLUMN provider_handle TEXT;",
    // 3 → 4: image bytes move into the database. The files' rows are listed in
    // `legacy_files` (with what they record), the tables lose their `path`, and
    // `store::sqlite::migrate` then moves each file in, verified, and drops `legacy_files` when done.
    "CREATE TABLE blobs (
        id TEXT PRIMARY KEY, sha256 TEXT NOT NULL, bytes INTEGER NOT NULL CHECK (bytes > 0),
        media_type TEXT NOT NULL CHECK (media_type IN ('image/png', 'image/jpeg', 'image/webp')),
        data BLOB NOT NULL CHECK (length(data) = bytes)) STRICT;
     CREATE TABLE legacy_files (
        id TEXT PRIMARY KEY, path TEXT NOT NULL, sha256 TEXT NOT NULL, bytes INTEGER NOT NULL,
        media_type TEXT NOT NULL, moved INTEGER NOT NULL DEFAULT 0 CHECK (moved IN (0, 1))) STRICT;
     INSERT INTO legacy_files (id, path, sha256, bytes, media_type) SELECT id, path, sha256, bytes, media_type FROM artifacts;
     INSERT INTO legacy_files (id, path, sha256, bytes, media_type) SELECT id, path, sha256, bytes, media_type FROM uploads;
     CREATE TABLE artifacts_v4 (
        id TEXT PRIMARY KEY, task_id TEXT NOT NULL REFERENCES tasks(id),
        execution_token TEXT NOT NULL UNIQUE REFERENCES executions(token), sha256 TEXT NOT NULL,
        bytes INTEGER NOT NULL CHECK (bytes > 0),
        media_type TEXT NOT NULL CHECK (media_type IN ('image/png', 'image/jpeg', 'image/webp')),
        created_at INTEGER NOT NULL) STRICT;
     INSERT INTO artifacts_v4 SELECT id, task_id, execution_token, sha256, bytes, media_type, created_at FROM artifacts;
     DROP TABLE artifacts;
     ALTER TABLE artifacts_v4 RENAME TO artifacts;
     CREATE INDEX artifacts_by_task ON artifacts(task_id);
     ALTER TABLE uploads DROP COLUMN path;
     CREATE INDEX tasks_settled_by_age ON tasks(updated_at) WHERE status IN ('succeeded', 'failed', 'canceled');",
    // 4 → 5: charge evidence per execution, prices, budget holds, retry keys per original.
    // Earlier versions recorded only "calling was reached", so an old request that did not
    // succeed is backfilled as 'possible' (what tally told the user then), never 'refused'.
    // (The table CHECK tying `charge` to `calling_at` cannot be added by ALTER TABLE; new
    // databases have it, and `check` tests the rule on every version.)
    "ALTER TABLE executions ADD COLUMN charge TEXT NOT NULL DEFAULT 'none'
        CHECK (charge IN ('none', 'refused', 'possible', 'charged'));
     ALTER TABLE executions ADD COLUMN billable INTEGER NOT NULL DEFAULT 1 CHECK (billable IN (0, 1));
     ALTER TABLE executions ADD COLUMN cost_micros INTEGER;
     ALTER TABLE executions ADD COLUMN currency TEXT;
     ALTER TABLE executions ADD COLUMN model TEXT;
     UPDATE executions SET charge = CASE WHEN calling_at IS NULL THEN 'none'
                                         WHEN status = 'succeeded' THEN 'charged' ELSE 'possible' END;
     CREATE INDEX executions_paid ON executions(calling_at) WHERE charge <> 'none';
     ALTER TABLE envelopes ADD COLUMN budget_hold INTEGER NOT NULL DEFAULT 0 CHECK (budget_hold IN (0, 1));
     ALTER TABLE tasks ADD COLUMN retry_key TEXT;
     CREATE UNIQUE INDEX tasks_by_retry_key ON tasks(retry_of, retry_key) WHERE retry_key IS NOT NULL;",
    // 5 → 6: dispatch by lanes and fairness keys for free provider slots (store::ops::dispatch).
    // Pending envelopes start waiting (pass NULL) and become ready at the next dispatch; what
    // the system had put back (a task waiting or with attempts) is in the recovery lane.
    "ALTER TABLE tasks ADD COLUMN group_key TEXT;
     ALTER TABLE envelopes ADD COLUMN lane TEXT NOT NULL DEFAULT 'fresh' CHECK (lane IN ('fresh', 'recovery'));
     ALTER TABLE envelopes ADD COLUMN fair_key TEXT NOT NULL DEFAULT '';
     ALTER TABLE envelopes ADD COLUMN pass INTEGER CHECK (pass IS NULL OR status = 'pending');
     UPDATE envelopes SET lane = 'recovery'
      WHERE task_id IN (SELECT id FROM tasks WHERE status = 'waiting' OR attempts > 0);
     UPDATE envelopes SET fair_key = 'set:' || (SELECT set_id FROM tasks t WHERE t.id = envelopes.task_id)
      WHERE (SELECT set_id FROM tasks t WHERE t.id = envelopes.task_id) IS NOT NULL;
     DROP INDEX envelopes_due;
     CREATE INDEX envelopes_waiting ON envelopes(due_at) WHERE status = 'pending' AND pass IS NULL AND due_at IS NOT NULL;
     CREATE INDEX envelopes_ready ON envelopes(provider, lane, pass, id) WHERE status = 'pending' AND pass IS NOT NULL;
     CREATE INDEX envelopes_ready_key ON envelopes(provider, lane, fair_key, pass) WHERE status = 'pending' AND pass IS NOT NULL;
     CREATE INDEX envelopes_in_flight ON envelopes(provider, lane) WHERE status = 'sent';
     CREATE TABLE providers (
        name TEXT PRIMARY KEY, max_concurrency INTEGER NOT NULL CHECK (max_concurrency >= 1),
        reserve INTEGER NOT NULL DEFAULT 1 CHECK (reserve >= 0),
        fresh_weight INTEGER NOT NULL DEFAULT 4 CHECK (fresh_weight >= 1),
        recovery_weight INTEGER NOT NULL DEFAULT 1 CHECK (recovery_weight >= 1),
        fifo INTEGER NOT NULL DEFAULT 0 CHECK (fifo IN (0, 1)),
        configured INTEGER NOT NULL DEFAULT 1 CHECK (configured IN (0, 1)),
        paused_until INTEGER, recovery_limit INTEGER,
        fresh_pass INTEGER NOT NULL DEFAULT 0, recovery_pass INTEGER NOT NULL DEFAULT 0) STRICT;",
    // 6 → 7: noticing an older copy of the database (store::sqlite::lineage) and holding what it would
    // otherwise send again (store::held). An upgraded database starts a lineage of its own, at 0.
    "ALTER TABLE envelopes ADD COLUMN held_at INTEGER;
     ALTER TABLE envelopes ADD COLUMN held_reason TEXT;
     CREATE INDEX envelopes_held ON envelopes(held_at) WHERE status = 'pending' AND held_at IS NOT NULL;
     CREATE TABLE lineage (
        id INTEGER PRIMARY KEY CHECK (id = 1), lineage TEXT NOT NULL, seq INTEGER NOT NULL DEFAULT 0,
        running INTEGER NOT NULL DEFAULT 0 CHECK (running IN (0, 1)), backup_at INTEGER) STRICT;
     INSERT INTO lineage (id, lineage) VALUES (1, lower(hex(randomblob(16))));",
    // 7 → 8: candidates per shot, the owner's choice per shot, and a set's own timeline
    // (store::choice). Every existing shot task is its shot's candidate 0.
    "ALTER TABLE tasks ADD COLUMN candidate INTEGER NOT NULL DEFAULT 0 CHECK (candidate >= 0);
     CREATE TABLE set_choices (
        set_id TEXT NOT NULL REFERENCES sets(id), position INTEGER NOT NULL,
        artifact_id TEXT NOT NULL REFERENCES artifacts(id), chosen_at INTEGER NOT NULL,
        PRIMARY KEY (set_id, position)) STRICT;
     CREATE TABLE set_events (
        id INTEGER PRIMARY KEY, set_id TEXT NOT NULL REFERENCES sets(id), at INTEGER NOT NULL,
        kind TEXT NOT NULL, message TEXT NOT NULL) STRICT;
     CREATE INDEX set_events_by_set ON set_events(set_id, id);",
    // 8 → 9: the owner's record of a charge, budgets set from the page or CLI, and web
    // sessions that survive a restart.
    "ALTER TABLE executions ADD COLUMN charge_recorded_at INTEGER;
     CREATE INDEX executions_recorded ON executions(calling_at) WHERE charge_recorded_at IS NOT NULL;
     CREATE TABLE budget_setting (
        id INTEGER PRIMARY KEY CHECK (id = 1), limits TEXT NOT NULL, set_at INTEGER NOT NULL) STRICT;
     CREATE TABLE web_sessions (
        id_hash TEXT PRIMARY KEY, csrf TEXT NOT NULL, created_at INTEGER NOT NULL,
        last_used_at INTEGER NOT NULL) STRICT;",
    // 9 → 10: deliveries and their items (store::ops::deliveries).
    "CREATE TABLE deliveries (
         id               TEXT PRIMARY KEY,
         set_id           TEXT NOT NULL,
         profile          TEXT NOT NULL,
         target           TEXT NOT NULL,
         forced           INTEGER NOT NULL DEFAULT 0 CHECK (forced IN (0, 1)),
         state            TEXT NOT NULL DEFAULT 'queued'
                          CHECK (state IN ('queued', 'delivering', 'delivered', 'partly_delivered', 'failed', 'unknown')),
         runner           TEXT,
         lease_until      INTEGER,
         created_at       INTEGER NOT NULL,
         updated_at       INTEGER NOT NULL
     ) STRICT;
     CREATE INDEX deliveries_by_set ON deliveries(set_id, id);
     CREATE INDEX deliveries_open ON deliveries(id) WHERE state IN ('queued', 'delivering');
     
     CREATE TABLE delivery_items (
         delivery_id      TEXT NOT NULL REFERENCES deliveries(id),
         position         INTEGER NOT NULL,
         task_id          TEXT NOT NULL,
         artifact_id      TEXT NOT NULL,
         shot_role        TEXT,
         file_name        TEXT NOT NULL,
         state            TEXT NOT NULL DEFAULT 'queued'
                          CHECK (state IN ('queued', 'writing', 'delivered', 'failed', 'unknown')),
         attempts         INTEGER NOT NULL DEFAULT 0,
         sha256           TEXT,
         bytes            INTEGER,
         width            INTEGER,
         height           INTEGER,
         why              TEXT,
         retry_safe       INTEGER CHECK (retry_safe IN (0, 1)),
         updated_at       INTEGER NOT NULL,
         PRIMARY KEY (delivery_id, position)
     ) STRICT;",
    // 10 → 11: operation kinds (issue #35): a task's operation and the image it works on; why a
    // provider is paused (a rate-limit hold is not an opened circuit).
    "ALTER TABLE tasks ADD COLUMN operation TEXT NOT NULL DEFAULT 'generate';
     ALTER TABLE tasks ADD COLUMN source_kind TEXT CHECK (source_kind IN ('artifact', 'upload'));
     ALTER TABLE tasks ADD COLUMN source_id TEXT CHECK ((source_kind IS NULL) = (source_id IS NULL));
     CREATE INDEX tasks_by_source ON tasks(source_id) WHERE source_id IS NOT NULL;
     ALTER TABLE providers ADD COLUMN paused_reason TEXT CHECK (paused_reason IN ('circuit', 'rate_limit'));
     CREATE TABLE notices (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, at INTEGER NOT NULL, data TEXT NOT NULL,
        dismissed_at INTEGER) STRICT;",
    // 11 → 12: a delivery names the product a `shopify` target attaches to, and each item
    // keeps the id the destination gave it (issue #38).
    "ALTER TABLE deliveries ADD COLUMN shopify_product TEXT;
     ALTER TABLE delivery_items ADD COLUMN remote_id TEXT;",
    // 12 → 13: drafts (issue #36): drafts, their photos and revisions, the JSON answers of
    // `draft` calls, and a set's link to the draft revision it came from.
    concat!(
        "ALTER TABLE sets ADD COLUMN draft_id TEXT; ALTER TABLE sets ADD COLUMN draft_revision INTEGER;",
        include_str!("drafts-v13.sql")
    ),
    // 13 → 14: more shot roles — a drafted shot keeps its role in its set (`detail`, `size`),
    // and `main_white` is reserved for the listing's white main image. A column's CHECK cannot
    // be changed in place: the column is renamed, a new one with the wider CHECK added and
    // filled, and the old one dropped (its own CHECK goes with it; no index names it).
    "ALTER TABLE tasks RENAME COLUMN shot_role TO shot_role_v13;
     ALTER TABLE tasks ADD COLUMN shot_role TEXT CHECK (shot_role IN ('main', 'selling_point', 'scene', 'detail', 'size', 'main_white'));
     UPDATE tasks SET shot_role = shot_role_v13 WHERE shot_role_v13 IS NOT NULL;
     ALTER TABLE tasks DROP COLUMN shot_role_v13;",
    // 14 → 15: a duplicate is a copy to edit until it is started (issue #39): `started_at`
    // NULL marks a set none of whose tasks may be scheduled; every existing set was started.
    "ALTER TABLE sets ADD COLUMN started_at INTEGER;
     UPDATE sets SET started_at = created_at;",
    // 15 → 16: a web session names the device it signed in ("iPhone · Safari"), for the page's
    // list of signed-in devices.
    "ALTER TABLE web_sessions ADD COLUMN device TEXT;",
    // 16 → 17: settings the owner changes in the page (issue #39: the shop's time zone), and
    // when a provider's pause began and what failed, so a hold says how long and why.
    "CREATE TABLE shop_settings (key TEXT PRIMARY KEY, value TEXT NOT NULL, set_at INTEGER NOT NULL) STRICT;
     ALTER TABLE providers ADD COLUMN paused_at INTEGER;
     ALTER TABLE providers ADD COLUMN paused_why TEXT;",
    // 17 → 18: listing images (issue #37): the words each shot's image carries (a JSON array
    // by position, null where none), and per delivery item the profile it was made with (a
    // profile per shot role) and the words drawn on it, kept as they were when it was asked for.
    "ALTER TABLE sets ADD COLUMN overlays TEXT;
     ALTER TABLE delivery_items ADD COLUMN profile TEXT;
     ALTER TABLE delivery_items ADD COLUMN overlay TEXT;",
];

/// The writer's automatic (PASSIVE) checkpoint runs once the WAL holds this many pages
/// (SQLite's default, about 4 MiB of 4 KiB pages), set and read back so it is not left to
/// chance. 8192 pages (32 MiB) measured about a third faster with 1.5 MB images, but then the
/// WAL needs up to ~50 MB of free disk before a checkpoint can reuse it: after a full disk
/// frees up, the WAL alone filled a small one again (`disks` tests) and stored images could
/// not be stored. Free space is worth more than the speed (bench-results/2026-12-01-s3-images-in-database.md).
pub const AUTOCHECKPOINT_PAGES: i64 = 1000;

/// The WAL is truncated back to this size after a checkpoint reset it (`journal_size_limit`),
/// so a burst of large images does not leave a large WAL file behind (checkpoint policy:
/// `store::sqlite`).
pub const WAL_SIZE_LIMIT: i64 = 64 << 20;

pub(super) fn set_and_check(
    conn: &Connection,
    pragma: &'static str,
    value: &str,
    want: &str,
) -> Result<(), StoreError> {
    conn.pragma_update(None, pragma, value)?;
    let got: String = conn.pragma_query_value(None, pragma, |r| {
        let v: rusqlite::types::Value = r.get(0)?;
        Ok(match v {
            rusqlite::types::Value::Integer(i) => i.to_string(),
            rusqlite::types::Value::Text(t) => t.to_lowercase(),
            other => format!("{other:?}"),
        })
    })?;
    if got != want {
        return Err(StoreError::Pragma { pragma, wanted: want.into(), got });
    }
    Ok(())
}

pub(super) fn not_tally(path: &Path, e: rusqlite::Error) -> StoreError {
    match &e {
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::NotADatabase => {
            StoreError::NotTally { path: path.into(), reason: "the file is not an SQLite database".into() }
        }
        _ => StoreError::Sqlite(e),
    }
}

/// Open the write connection: WAL, the chosen `synchronous`, foreign keys, a busy timeout,
/// `auto_vacuum = INCREMENTAL` (so a prune can give pages back); create or migrate the schema,
/// then move image files of an older version into the database (`store::sqlite::migrate`). Returns
/// the connection and what the migration did, in plain words (empty when nothing).
pub(crate) fn open_write(path: &Path, durability: Durability) -> Result<(Connection, Vec<String>), StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Fatal(format!("cannot create data directory {}: {e}", dir.display())))?;
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    // The first statement reads the header: a file that is not SQLite fails here.
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(|e| not_tally(path, e))?;
    // SQLite opens a file it may not write read-only, silently; every write would then fail
    // while the daemon went on serving. Refuse here instead.
    if conn.is_readonly(rusqlite::MAIN_DB)? {
        return Err(StoreError::Unusable {
            path: path.into(),
            reason: "the database can only be opened read-only (check the file's and the directory's permissions \
                     and whether the file system is mounted read-only); tally must be able to write it"
                .into(),
        });
    }
    let app_id: i64 = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let tables: i64 = conn.query_row("SELECT count(*) FROM sqlite_schema WHERE type = 'table'", [], |r| r.get(0))?;
    if app_id != APPLICATION_ID && (app_id != 0 || tables > 0) {
        return Err(StoreError::NotTally { path: path.into(), reason: "it holds another application's tables".into() });
    }
    if version > SCHEMA_VERSION {
        return Err(StoreError::TooNew { path: path.into(), found: version, supported: SCHEMA_VERSION });
    }
    if tables == 0 {
        // Only takes effect before the file's first page is written (so before WAL mode).
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    }
    set_and_check(&conn, "journal_mode", "WAL", "wal")?;
    let sync = match durability {
        Durability::Full => ("FULL", "2"),
        Durability::Normal => ("NORMAL", "1"),
    };
    set_and_check(&conn, "synchronous", sync.0, sync.1)?;
    set_and_check(&conn, "foreign_keys", "ON", "1")?;
    set_and_check(&conn, "journal_size_limit", &WAL_SIZE_LIMIT.to_string(), &WAL_SIZE_LIMIT.to_string())?;
    stable_plans(&conn)?;
    set_and_check(&conn, "wal_autocheckpoint", &AUTOCHECKPOINT_PAGES.to_string(), &AUTOCHECKPOINT_PAGES.to_string())?;

    let mut notes = Vec::new();
    if tables == 0 {
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {SCHEMA}; PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        ))?;
    } else {
        for v in version..SCHEMA_VERSION {
            let step = MIGRATIONS.get((v - 1) as usize).ok_or_else(|| StoreError::NotTally {
                path: path.into(),
                reason: format!("no migration from schema version {v}"),
            })?;
            conn.execute_batch(&format!("BEGIN IMMEDIATE; {step}; PRAGMA user_version = {}; COMMIT;", v + 1))?;
            notes.push(format!("migrated the database from schema version {v} to {}", v + 1));
            crate::failpoint::crash("migrate-after-schema");
        }
    }
    let auto_vacuum: i64 = conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))?;
    if auto_vacuum != 2 {
        // An older database: switching needs a VACUUM (a full rewrite, atomic). It runs before
        // any image file is moved in, while the file is small.
        conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")?;
        let now: i64 = conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))?;
        if now != 2 {
            return Err(StoreError::Pragma { pragma: "auto_vacuum", wanted: "2".into(), got: now.to_string() });
        }
        if tables > 0 {
            notes.push("set auto_vacuum = INCREMENTAL, so that pruning gives space back".into());
        }
    }
    let data_dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    notes.extend(super::migrate::move_files_in(&conn, data_dir)?);
    Ok((conn, notes))
}

/// Open a read-only connection (WAL readers never block the writer).
pub(crate) fn open_read(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    stable_plans(&conn)?;
    Ok(conn)
}

/// Prepare each cached statement once: turn on SQLite's query-planner stability guarantee
/// (QPSG). Without it, a statement whose plan *could* depend on a bound value (a `LIMIT ?`,
/// a `col <= ?` beside a partial index) is silently re-prepared on every run with new values;
/// the dispatcher's query cost ~0.33 ms instead of ~0.14 ms that way. The hot statements use
/// their indexes whatever the bound values (the bench prints their plans).
fn stable_plans(conn: &Connection) -> Result<(), StoreError> {
    conn.set_prepared_statement_cache_capacity(64);
    if !conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)? {
        return Err(StoreError::Fatal("SQLite refused the query-planner stability guarantee".into()));
    }
    Ok(())
}

/// Count every statement the connection executes into `counter`.
pub(crate) fn count_statements(conn: &mut Connection, counter: Arc<AtomicU64>) -> Result<(), StoreError> {
    conn.trace_v2(
        TraceEventCodes::SQLITE_TRACE_STMT,
        Some(move |_: rusqlite::trace::TraceEvent<'_>| {
            counter.fetch_add(1, Ordering::Relaxed);
        }),
    )?;
    Ok(())
}

/// Move everything from the WAL into the database file and truncate the WAL to zero bytes.
pub(crate) fn checkpoint_truncate(path: &Path) -> Result<(), StoreError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
    if busy != 0 {
        return Err(StoreError::Fatal("the WAL checkpoint could not finish: another connection is busy".into()));
    }
    Ok(())
}
