//! PostgreSQL schema migrations. `tests/fixtures/pg-schema-v1.sql` is the schema as version 1
//! shipped it; a database made from it, with rows, must migrate to exactly the catalog a new
//! database gets from `schema-pg.sql` (every column with its type, default and collation,
//! every constraint and index, the notify triggers and the functions they run). So a later
//! change to `schema-pg.sql` without a migration in `store::postgres::MIGRATIONS` fails here:
//! schema changes on PostgreSQL are migrations, never edits. Also: a migration waits until no other node runs, and a
//! newer schema is refused.

use postgres::{Client, NoTls};
use tally::domain::Charge;
use tally::store::StoreError;
use tally::store::postgres::{LOCK_CLASS, PG_SCHEMA_VERSION, PgStore};

use super::fixtures::{pg_options, pg_url, schema};

/// A plain connection (these tests are synchronous: no runtime, so the sync client is fine).
fn connect(url: &str) -> Client {
    Client::connect(url, NoTls).expect("connect")
}

/// Make `schema` a version-1 tally database with a few rows of each kind the migration
/// touches.
fn make_v1(c: &mut Client, schema: &str) {
    c.batch_execute(&format!("CREATE SCHEMA {schema}; SET search_path = {schema};")).expect("schema");
    c.batch_execute(include_str!("../../fixtures/pg-schema-v1.sql")).expect("the v1 schema");
    c.batch_execute(
        "INSERT INTO tally_schema (version, installed_at) VALUES (1, 1);
         INSERT INTO tasks (id, request_hash, provider, prompt, status, created_at, updated_at, may_have_charged)
         VALUES ('ok', 'h1', 'p', 'ok', 'succeeded', 1, 1, true), ('no', 'h2', 'p', 'no', 'failed', 1, 1, true),
                ('never', 'h3', 'p', 'never', 'failed', 1, 1, false), ('live', 'h4', 'p', 'live', 'queued', 1, 1, false);
         INSERT INTO envelopes (id, task_id, provider, status, due_at)
         VALUES ('e1', 'ok', 'p', 'consumed', 1), ('e2', 'no', 'p', 'consumed', 1), ('e3', 'never', 'p', 'consumed', 1),
                ('e4', 'live', 'p', 'pending', 1);
         INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, node_id, boot_id,
                                 heartbeat_at, started_at, calling_at)
         VALUES ('x1', 'ok', 1, 'succeeded', 'calling', 'k1', 'n', 'b', 1, 1, 1),
                ('x2', 'no', 1, 'failed', 'calling', 'k2', 'n', 'b', 1, 1, 1),
                ('x3', 'never', 1, 'failed', 'claimed', 'k3', 'n', 'b', 1, 1, NULL);
         INSERT INTO blobs (id, sha256, bytes, media_type, data)
         SELECT 'a1', encode(sha256(d), 'hex'), length(d), 'image/png', d
         FROM (SELECT '\\x89504e470d0a1a0a00'::bytea AS d) img;
         INSERT INTO artifacts (id, task_id, execution_token, sha256, bytes, media_type, created_at)
         SELECT 'a1', 'ok', 'x1', sha256, bytes, media_type, 1 FROM blobs WHERE id = 'a1';
         SET search_path = public;",
    )
    .expect("v1 rows");
}

/// Everything about a schema's tables that a migration must get right, in a stable order,
/// with the schema's own name taken out.
fn catalog(c: &mut Client, schema: &str) -> Vec<String> {
    let mut out = Vec::new();
    for r in c
        .query(
            "SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, ''),
                    coalesce(collation_name, '')
             FROM information_schema.columns WHERE table_schema = $1 ORDER BY table_name, column_name",
            &[&schema],
        )
        .expect("columns")
    {
        let cols: Vec<String> = (0..6).map(|i| r.get::<_, String>(i)).collect();
        out.push(format!("column {}", cols.join(" | ")));
    }
    for r in c
        .query(
            "SELECT cl.relname::text, co.conname::text, pg_get_constraintdef(co.oid)
             FROM pg_constraint co JOIN pg_class cl ON cl.oid = co.conrelid JOIN pg_namespace n ON n.oid = cl.relnamespace
             WHERE n.nspname = $1 ORDER BY 1, 2",
            &[&schema],
        )
        .expect("constraints")
    {
        out.push(format!("constraint {} {} {}", r.get::<_, String>(0), r.get::<_, String>(1), r.get::<_, String>(2)));
    }
    for r in c
        .query("SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY 1", &[&schema])
        .expect("indexes")
    {
        out.push(format!("index {} {}", r.get::<_, String>(0), r.get::<_, String>(1)));
    }
    for r in c
        .query(
            "SELECT c.relname::text, c.reloptions::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind = 'r' AND c.reloptions IS NOT NULL ORDER BY 1",
            &[&schema],
        )
        .expect("table options")
    {
        out.push(format!("options {} {}", r.get::<_, String>(0), r.get::<_, String>(1)));
    }
    for r in c
        .query(
            "SELECT event_object_table::text, trigger_name::text, event_manipulation::text, action_statement
             FROM information_schema.triggers WHERE trigger_schema = $1 ORDER BY 1, 2, 3",
            &[&schema],
        )
        .expect("triggers")
    {
        let t: Vec<String> = (0..4).map(|i| r.get::<_, String>(i)).collect();
        out.push(format!("trigger {}", t.join(" | ")));
    }
    // The functions (the notify triggers' channel names, the slot rows' upkeep): a migration
    // that changes a function must leave the very text a new schema has.
    for r in c
        .query(
            "SELECT p.proname::text, pg_get_functiondef(p.oid) FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1 ORDER BY 1",
            &[&schema],
        )
        .expect("functions")
    {
        out.push(format!("function {} {}", r.get::<_, String>(0), r.get::<_, String>(1)));
    }
    out.into_iter().map(|line| line.replace(&format!("{schema}."), "S.")).collect()
}

#[test]
fn a_version_1_database_migrates_to_the_catalog_of_a_new_one() {
    let Some(url) = pg_url() else { return };
    let (old, new) = (schema(), schema());
    let mut c = connect(&url);
    make_v1(&mut c, &old);
    let migrated = PgStore::open(pg_options(&url, &old, "node-a")).expect("a version 1 database migrates");
    let fresh = PgStore::open(pg_options(&url, &new, "node-a")).expect("a new database");
    let (a, b) = (catalog(&mut c, &old), catalog(&mut c, &new));
    let only_old: Vec<&String> = a.iter().filter(|l| !b.contains(l)).collect();
    let only_new: Vec<&String> = b.iter().filter(|l| !a.contains(l)).collect();
    assert!(
        only_old.is_empty() && only_new.is_empty(),
        "a migrated schema differs from a new one (did schema-pg.sql change without a migration?)\n\
         only after migrating: {only_old:#?}\nonly in a new database: {only_new:#?}"
    );
    let version: i32 =
        c.query_one(&format!("SELECT max(version) FROM {old}.tally_schema"), &[]).expect("version").get(0);
    assert_eq!(version, PG_SCHEMA_VERSION);
    // Version 1 knew only "calling was reached": a success is charged, anything else after
    // `calling` possible (never guessed to be refused), an execution that never called none.
    let charges: Vec<(String, String)> = c
        .query(&format!("SELECT token, charge FROM {old}.executions ORDER BY token"), &[])
        .expect("charges")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let want = [("x1", Charge::Charged), ("x2", Charge::Possible), ("x3", Charge::None)];
    assert_eq!(charges, want.map(|(t, ch)| (t.to_string(), ch.as_str().to_string())));
    migrated.close().expect("close");
    fresh.close().expect("close");
    let report = tally::store::postgres::check(&url, Some(&old)).expect("check");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // A second open finds nothing to do.
    let again = PgStore::open(pg_options(&url, &old, "node-a")).expect("reopen");
    again.close().expect("close");
    let rows: i64 = c.query_one(&format!("SELECT count(*) FROM {old}.tally_schema"), &[]).expect("rows").get(0);
    assert_eq!(rows, i64::from(PG_SCHEMA_VERSION), "one row per version");
}

#[test]
fn a_migration_waits_until_no_other_node_runs() {
    let Some(url) = pg_url() else { return };
    let s = schema();
    let mut c = connect(&url);
    make_v1(&mut c, &s);
    // A node of the old build is running: its row, and its lock held on a session of its own.
    let key = 4242i32;
    c.execute(&format!("INSERT INTO {s}.nodes (name, lock_key) VALUES ('old-node', $1)"), &[&key]).expect("node row");
    let mut holder = connect(&url);
    let _: bool = holder.query_one("SELECT pg_try_advisory_lock($1, $2)", &[&LOCK_CLASS, &key]).expect("lock").get(0);
    match PgStore::open(pg_options(&url, &s, "node-new")) {
        Err(StoreError::Invalid(msg)) => {
            assert!(msg.contains("old-node") && msg.contains("Stop every node"), "{msg}")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("migrated while another node runs"),
    }
    let version: i32 = c.query_one(&format!("SELECT max(version) FROM {s}.tally_schema"), &[]).expect("version").get(0);
    assert_eq!(version, 1, "nothing was migrated");
    // The old node stops (its lock is given back): now the migration runs.
    let _: bool = holder.query_one("SELECT pg_advisory_unlock($1, $2)", &[&LOCK_CLASS, &key]).expect("unlock").get(0);
    PgStore::open(pg_options(&url, &s, "node-new"))
        .expect("migrates once the old node is gone")
        .close()
        .expect("close");
}

#[test]
fn a_newer_schema_is_refused() {
    let Some(url) = pg_url() else { return };
    let s = schema();
    PgStore::open(pg_options(&url, &s, "node-a")).expect("new").close().expect("close");
    let mut c = connect(&url);
    c.execute(&format!("INSERT INTO {s}.tally_schema (version, installed_at) VALUES (99, 1)"), &[]).expect("bump");
    match PgStore::open(pg_options(&url, &s, "node-a")) {
        Err(StoreError::TooNew { found, supported, .. }) => {
            assert_eq!((found, supported), (99, PG_SCHEMA_VERSION.into()))
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a newer schema was opened"),
    }
}

/// A `tally_schema` with no row (a hand-edited or half-restored database) is refused in plain
/// words, not a panic on the NULL its `max(version)` reads.
#[test]
fn a_schema_table_with_no_version_is_refused() {
    let Some(url) = pg_url() else { return };
    let s = schema();
    PgStore::open(pg_options(&url, &s, "node-a")).expect("new").close().expect("close");
    let mut c = connect(&url);
    c.execute(&format!("DELETE FROM {s}.tally_schema"), &[]).expect("empty it");
    match PgStore::open(pg_options(&url, &s, "node-a")) {
        Err(StoreError::NotTally { reason, .. }) => assert!(reason.contains("no version"), "{reason}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a schema with no version was opened"),
    }
}

/// Version 7 → 8 (issue #28): a database whose calls are out when it migrates gives each
/// `sent` envelope a slot row of its provider, and the provider `max_concurrency` rows in all,
/// so the calls already out count against the cap from the first dispatch.
#[test]
fn version_8_gives_the_calls_already_out_their_slots() {
    use tally::store::{NewTask, ProviderSlots, Store};
    let Some(url) = pg_url() else { return };
    let s = schema();
    // The sync client runs a runtime of its own: the store's async calls run in this one.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let store = Store::from(PgStore::open(pg_options(&url, &s, "node-a")).expect("new"));
    rt.block_on(async {
        let slots = vec![ProviderSlots { reserve: 0, ..ProviderSlots::new("p", 3) }];
        store.configure_providers(slots).await.expect("configure");
        for i in 0..2 {
            let t = NewTask { provider: "p".into(), prompt: format!("m{i}"), ..NewTask::default() };
            store.submit(t, 1_000).await.expect("submit");
        }
        assert_eq!(store.dispatch_due(2_000, 10, 30_000, "run").await.expect("dispatch").claims.len(), 2);
    });
    store.close().expect("close");
    // Back to version 7: what the migrations since add, gone (9 → 10's columns, 11 → 12's drafts
    // and 13 → 14's `started_at` too).
    let mut c = connect(&url);
    c.batch_execute(&format!(
        "SET search_path = {s};
         DROP TABLE provider_slots; DROP FUNCTION tally_slot_free() CASCADE; DROP FUNCTION tally_slot_size() CASCADE;
         ALTER TABLE tasks DROP COLUMN operation, DROP COLUMN source_kind, DROP COLUMN source_id;
         ALTER TABLE providers DROP COLUMN paused_reason; DROP TABLE notices;
         ALTER TABLE deliveries DROP COLUMN shopify_product; ALTER TABLE delivery_items DROP COLUMN remote_id;
         DROP TABLE answers; DROP TABLE draft_revisions; DROP TABLE draft_photos; DROP TABLE drafts;
         ALTER TABLE sets DROP COLUMN draft_id, DROP COLUMN draft_revision, DROP COLUMN started_at;
         ALTER TABLE web_sessions DROP COLUMN device; DROP TABLE shop_settings;
         ALTER TABLE providers DROP COLUMN paused_at, DROP COLUMN paused_why;
         ALTER TABLE sets DROP COLUMN overlays; ALTER TABLE delivery_items DROP COLUMN profile, DROP COLUMN overlay;
         UPDATE tally_schema SET version = 7 WHERE version > 7; SET search_path = public;"
    ))
    .expect("back to version 7");
    let store = Store::from(PgStore::open(pg_options(&url, &s, "node-a")).expect("migrates"));
    let r = c
        .query_one(
            &format!(
                "SELECT count(*), count(*) FILTER (WHERE e.status = 'sent')
                 FROM {s}.provider_slots x LEFT JOIN {s}.envelopes e ON e.id = x.envelope_id WHERE x.provider = 'p'"
            ),
            &[],
        )
        .expect("slots");
    let (rows, held): (i64, i64) = (r.get(0), r.get(1));
    assert_eq!((rows, held), (3, 2), "three rows, the two calls out holding one each");
    rt.block_on(async {
        let t = NewTask { provider: "p".into(), prompt: "after".into(), ..NewTask::default() };
        store.submit(t, 3_000).await.expect("submit");
        let got = store.dispatch_due(3_000, 10, 30_000, "run2").await.expect("dispatch").claims.len();
        assert_eq!(got, 1, "one slot left of three");
    });
    store.close().expect("close");
}
