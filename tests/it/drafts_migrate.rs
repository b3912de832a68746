//! Drafts' schema migrations on SQLite: 12 → 13 (the draft tables and a set's link) and 13 → 14
//! (the shot roles a drafted set keeps); 14 → 15 (a copy to edit: every set already there counts
//! as started); and 15 → 16 (a web session's device). PostgreSQL's are in
//! `conformance::pg_migrate`.

use crate::common::TempDir;

/// SQLite 12 → 13: a database from before drafts gains their tables and a set's link.
#[tokio::test]
async fn a_version_12_database_gains_the_draft_tables() {
    let dir = TempDir::new();
    let db = dir.path().join("tally.db");
    let durability = tally::config::Durability::Full;
    tally::store::Store::open(&db, durability).expect("new").close().expect("close");
    rusqlite::Connection::open(&db)
        .and_then(|c| {
            c.execute_batch(
                "DROP TABLE answers; DROP TABLE draft_revisions; DROP TABLE draft_photos; DROP TABLE drafts;
                 ALTER TABLE sets DROP COLUMN started_at;
                 ALTER TABLE sets DROP COLUMN draft_revision; ALTER TABLE sets DROP COLUMN draft_id;
                 ALTER TABLE web_sessions DROP COLUMN device; DROP TABLE shop_settings; ALTER TABLE providers DROP COLUMN paused_at; ALTER TABLE providers DROP COLUMN paused_why; ALTER TABLE sets DROP COLUMN overlays; ALTER TABLE delivery_items DROP COLUMN profile; ALTER TABLE delivery_items DROP COLUMN overlay; PRAGMA user_version = 12;",
            )
        })
        .expect("make it version 12");
    let store = tally::store::Store::open(&db, durability).expect("migrates");
    store.close().expect("close");
    let c = rusqlite::Connection::open(&db).expect("open");
    let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).expect("version");
    assert_eq!(version, tally::store::SCHEMA_VERSION);
    for t in ["drafts", "draft_photos", "draft_revisions", "answers"] {
        let n: i64 = c
            .query_row("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?1", [t], |r| r.get(0))
            .expect("schema");
        assert_eq!(n, 1, "{t}");
    }
    c.execute_batch("SELECT draft_id, draft_revision FROM sets").expect("the set's link");
}

/// Schema 13 → 14: a version-13 database (shot roles main, selling_point, scene) keeps every
/// task's role and takes the drafted roles after the migration; confirming a draft keeps a
/// detail shot's role in its set.
#[tokio::test]
async fn a_version_13_database_keeps_its_roles_and_takes_a_detail_shot() {
    let dir = TempDir::new();
    let db = dir.path().join("tally.db");
    let durability = tally::config::Durability::Full;
    tally::store::Store::open(&db, durability).expect("new").close().expect("close");
    // Back to version 13's column: the three roles only, one task of each and one without.
    rusqlite::Connection::open(&db)
        .and_then(|c| {
            c.execute_batch(
                "ALTER TABLE sets DROP COLUMN started_at;
                 ALTER TABLE tasks DROP COLUMN shot_role;
                 ALTER TABLE tasks ADD COLUMN shot_role TEXT CHECK (shot_role IN ('main', 'selling_point', 'scene'));
                 INSERT INTO tasks (id, provider, prompt, params, request_hash, status, created_at, updated_at, shot_role)
                 VALUES ('t1', 'demo', 'p', '{}', 'h1', 'succeeded', 1, 1, 'main'),
                        ('t2', 'demo', 'p', '{}', 'h2', 'succeeded', 1, 1, 'scene'),
                        ('t3', 'demo', 'p', '{}', 'h3', 'succeeded', 1, 1, NULL);
                 ALTER TABLE web_sessions DROP COLUMN device; DROP TABLE shop_settings; ALTER TABLE providers DROP COLUMN paused_at; ALTER TABLE providers DROP COLUMN paused_why; ALTER TABLE sets DROP COLUMN overlays; ALTER TABLE delivery_items DROP COLUMN profile; ALTER TABLE delivery_items DROP COLUMN overlay; PRAGMA user_version = 13;",
            )
        })
        .expect("make it version 13");
    let refused = rusqlite::Connection::open(&db)
        .and_then(|c| c.execute("UPDATE tasks SET shot_role = 'detail' WHERE id = 't3'", []));
    assert!(refused.is_err(), "version 13 refuses a detail role");
    let store = tally::store::Store::open(&db, durability).expect("migrates");
    let notes = store.migration_notes().join("\n");
    assert!(notes.contains("13 to 14"), "{notes}");
    store.close().expect("close");
    let c = rusqlite::Connection::open(&db).expect("open");
    let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).expect("version");
    assert_eq!(version, tally::store::SCHEMA_VERSION);
    let roles: Vec<Option<String>> = c
        .prepare("SELECT shot_role FROM tasks WHERE id IN ('t1', 't2', 't3') ORDER BY id")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("roles");
    assert_eq!(roles, vec![Some("main".into()), Some("scene".into()), None], "every role kept");
    c.execute("UPDATE tasks SET shot_role = 'detail' WHERE id = 't3'", []).expect("a detail role now");
    assert!(c.execute("UPDATE tasks SET shot_role = 'hero' WHERE id = 't3'", []).is_err(), "still checked");
    let check = c.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0)).expect("integrity");
    assert_eq!(check, "ok");
}

/// Schema 14 → 15: a set of a version-14 database (whose later shot waits unscheduled, as one
/// shot at a time has it) counts as started, so it runs on as before; only a duplicate made
/// after the migration is a copy to edit.
#[tokio::test]
async fn a_version_14_database_counts_every_set_as_started() {
    use tally::store::{NewSet, NewShot, SetStatus, SubmitOutcome, set_summary};
    let dir = TempDir::new();
    let db = dir.path().join("tally.db");
    let durability = tally::config::Durability::Full;
    let store = tally::store::Store::open(&db, durability).expect("new");
    let shot = |p: &str| NewShot {
        role: "main".into(),
        prompt: p.into(),
        params: serde_json::json!({}),
        candidates: 1,
        ..NewShot::default()
    };
    let set = NewSet {
        product: "teapot".into(),
        style: None,
        provider: "demo".into(),
        references: vec![],
        shots: vec![shot("a"), shot("b")],
        idempotency_key: None,
    };
    let SubmitOutcome::Created(id) = store.create_set(set, 1_000).await.expect("create") else { panic!("created") };
    store.close().expect("close");
    rusqlite::Connection::open(&db)
        .and_then(|c| {
            c.execute_batch(
                "ALTER TABLE sets DROP COLUMN started_at; ALTER TABLE web_sessions DROP COLUMN device; \
             DROP TABLE shop_settings; ALTER TABLE providers DROP COLUMN paused_at; ALTER TABLE providers DROP COLUMN paused_why; ALTER TABLE sets DROP COLUMN overlays; ALTER TABLE delivery_items DROP COLUMN profile; ALTER TABLE delivery_items DROP COLUMN overlay; PRAGMA user_version = 14;",
            )
        })
        .expect("make it version 14");
    let store = tally::store::Store::open(&db, durability).expect("migrates");
    let notes = store.migration_notes().join("\n");
    assert!(notes.contains("14 to 15"), "{notes}");
    let view = store.get_set(id.clone()).await.expect("get").expect("set");
    assert!(view.started, "a set from before copies to edit was started");
    assert_eq!(set_summary(&view).0, SetStatus::Running);
    let out = store.duplicate_set(id, None, false, 2_000).await.expect("duplicate");
    let Some(SubmitOutcome::Created(copy)) = out else { panic!("created: {out:?}") };
    assert!(!store.get_set(copy).await.expect("get").expect("copy").started);
    store.close().expect("close");
}

/// Schema 15 → 16: a version-15 database's web sessions stay signed in, listed with no device
/// name (they signed in before devices were named); new ones name theirs.
#[tokio::test]
async fn a_version_15_database_keeps_its_sessions_and_lists_them_unnamed() {
    let dir = TempDir::new();
    let db = dir.path().join("tally.db");
    let durability = tally::config::Durability::Full;
    tally::store::Store::open(&db, durability).expect("new").close().expect("close");
    rusqlite::Connection::open(&db)
        .and_then(|c| {
            c.execute_batch(
                "ALTER TABLE web_sessions DROP COLUMN device;
                 INSERT INTO web_sessions (id_hash, csrf, created_at, last_used_at) VALUES ('old', 'c', 5, 5);
                 DROP TABLE shop_settings; ALTER TABLE providers DROP COLUMN paused_at; ALTER TABLE providers DROP COLUMN paused_why; ALTER TABLE sets DROP COLUMN overlays; ALTER TABLE delivery_items DROP COLUMN profile; ALTER TABLE delivery_items DROP COLUMN overlay; PRAGMA user_version = 15;",
            )
        })
        .expect("make it version 15");
    let store = tally::store::Store::open(&db, durability).expect("migrates");
    assert!(store.migration_notes().join("\n").contains("15 to 16"), "{:?}", store.migration_notes());
    assert_eq!(store.session("old".into()).await.expect("read").map(|s| s.csrf), Some("c".to_string()));
    store.insert_session("new".into(), "d".into(), Some("iPhone · Safari".into()), 10).await.expect("insert");
    let listed: Vec<(String, Option<String>)> =
        store.sessions(0).await.expect("list").into_iter().map(|r| (r.id_hash, r.device)).collect();
    assert_eq!(listed, vec![("new".to_string(), Some("iPhone · Safari".to_string())), ("old".to_string(), None)]);
    store.close().expect("close");
}

/// Schema 17 → 18: a version-17 database's sets have no words and its delivery items their
/// delivery's profile; a new set carries words, kept by its copy.
#[tokio::test]
async fn a_version_17_database_takes_words_and_a_profile_per_item() {
    let dir = TempDir::new();
    let db = dir.path().join("tally.db");
    let durability = tally::config::Durability::Full;
    tally::store::Store::open(&db, durability).expect("new").close().expect("close");
    rusqlite::Connection::open(&db)
        .and_then(|c| {
            c.execute_batch(
                "ALTER TABLE sets DROP COLUMN overlays; ALTER TABLE delivery_items DROP COLUMN profile;
                 ALTER TABLE delivery_items DROP COLUMN overlay; PRAGMA user_version = 17;",
            )
        })
        .expect("make it version 17");
    let store = tally::store::Store::open(&db, durability).expect("migrates");
    assert!(store.migration_notes().join("\n").contains("17 to 18"), "{:?}", store.migration_notes());
    let words = tally::domain::overlay::Overlay { template: "badge".into(), lines: vec!["新品".into()] };
    let shot = |role: &str, overlay| tally::store::NewShot {
        role: role.into(),
        prompt: format!("{role} shot"),
        params: serde_json::json!({}),
        candidates: 1,
        overlay,
        ..tally::store::NewShot::default()
    };
    let set = tally::store::NewSet {
        product: "cup".into(),
        style: None,
        provider: "demo".into(),
        references: vec![],
        shots: vec![shot("main", None), shot("selling_point", Some(words.clone()))],
        idempotency_key: None,
    };
    let Ok(tally::store::SubmitOutcome::Created(id)) = store.create_set(set, 1_000).await else { panic!("created") };
    let view = store.get_set(id.clone()).await.expect("get").expect("set");
    assert_eq!(view.overlays, vec![None, Some(words.clone())]);
    let out = store.duplicate_set(id, None, false, 2_000).await.expect("duplicate");
    let Some(tally::store::SubmitOutcome::Created(copy)) = out else { panic!("created: {out:?}") };
    assert_eq!(store.get_set(copy).await.expect("get").expect("copy").overlays, vec![None, Some(words)]);
    store.close().expect("close");
}
