//! `tally check` on PostgreSQL: tally's invariants (the same queries as on SQLite,
//! `store::check::TASK_INVARIANTS`) and every stored image against its recorded size and sha256 (hashed
//! by the server, `sha256(bytea)`), in one REPEATABLE READ snapshot, so it is consistent while
//! nodes write. It uses a plain connection of its own: it takes no node lock, so it runs while
//! every node is up.

use postgres::{IsolationLevel, NoTls};

use super::migrate_check;
use crate::store::check::TASK_INVARIANTS;
use crate::store::{CheckReport, StoreError};

/// Verify the tally schema the URL (and its `search_path`) points at.
pub fn check(url: &str, schema: Option<&str>) -> Result<CheckReport, StoreError> {
    let mut config: postgres::Config =
        url.parse().map_err(|e| StoreError::Fatal(format!("bad PostgreSQL URL: {e}")))?;
    if let Some(s) = schema {
        config.options(&format!("-c search_path={s}"));
    }
    std::thread::spawn(move || run(&config))
        .join()
        .map_err(|_| StoreError::Fatal("the check thread panicked".into()))?
}

fn run(config: &postgres::Config) -> Result<CheckReport, StoreError> {
    let mut client = config.connect(NoTls)?;
    let mut t = client.build_transaction().isolation_level(IsolationLevel::RepeatableRead).read_only(true).start()?;
    migrate_check(&mut t)?;
    let tasks = t.query_one("SELECT count(*) FROM tasks", &[])?.get::<_, i64>(0).max(0) as u64;
    let mut report = CheckReport { tasks, ..CheckReport::default() };
    let image_invariants: &[(&str, &str)] = &[
        (
            "artifact without its stored image",
            "SELECT a.id FROM artifacts a LEFT JOIN blobs b ON b.id = a.id WHERE b.id IS NULL",
        ),
        (
            "upload without its stored image",
            "SELECT u.id FROM uploads u LEFT JOIN blobs b ON b.id = u.id WHERE b.id IS NULL",
        ),
        (
            "stored image that no artifact or upload points to",
            "SELECT b.id FROM blobs b WHERE NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.id = b.id)
               AND NOT EXISTS (SELECT 1 FROM uploads u WHERE u.id = b.id)",
        ),
        (
            "artifact whose recorded size, sha256 or type differs from its stored image",
            "SELECT a.id FROM artifacts a JOIN blobs b ON b.id = a.id
             WHERE a.sha256 <> b.sha256 OR a.bytes <> b.bytes OR a.media_type <> b.media_type",
        ),
        (
            "upload whose recorded size, sha256 or type differs from its stored image",
            "SELECT u.id FROM uploads u JOIN blobs b ON b.id = u.id
             WHERE u.sha256 <> b.sha256 OR u.bytes <> b.bytes OR u.media_type <> b.media_type",
        ),
        (
            "stored image whose bytes do not match its recorded size and sha256",
            "SELECT id FROM blobs WHERE length(data) <> bytes OR encode(sha256(data), 'hex') <> sha256",
        ),
    ];
    // The capacity rule's rows (`store::ops::slot_rows`): each call out holds one slot row of
    // its provider, only calls out hold rows (or a hold for a fenced call, `held:<deadline>:…`,
    // until its deadline), and a provider has free rows only within its cap.
    let slot_invariants: &[(&str, &str)] = &[
        (
            "envelope sent without a provider slot",
            "SELECT e.id FROM envelopes e WHERE e.status = 'sent'
               AND NOT EXISTS (SELECT 1 FROM provider_slots s WHERE s.envelope_id = e.id)",
        ),
        (
            "provider slot held by an envelope that is not sent",
            "SELECT s.provider || ' slot ' || s.slot FROM provider_slots s LEFT JOIN envelopes e ON e.id = s.envelope_id
             WHERE s.envelope_id IS NOT NULL AND s.envelope_id NOT LIKE 'held:%' AND (e.id IS NULL OR e.status <> 'sent')",
        ),
        (
            "provider with a free slot beyond its max_concurrency",
            "SELECT p.name FROM providers p
             WHERE (SELECT count(*) FROM provider_slots s WHERE s.provider = p.name) > p.max_concurrency
               AND EXISTS (SELECT 1 FROM provider_slots s WHERE s.provider = p.name AND s.envelope_id IS NULL)",
        ),
    ];
    for (what, sql) in TASK_INVARIANTS.iter().chain(image_invariants).chain(slot_invariants) {
        for row in t.query(*sql, &[])? {
            report.problems.push(format!("{what}: {}", row.get::<_, String>(0)));
        }
    }
    let ok = "length(b.data) = b.bytes AND encode(sha256(b.data), 'hex') = b.sha256";
    report.artifacts = t
        .query_one(&format!("SELECT count(*) FROM blobs b JOIN artifacts a ON a.id = b.id WHERE {ok}"), &[])?
        .get::<_, i64>(0) as u64;
    report.uploads = t
        .query_one(&format!("SELECT count(*) FROM blobs b JOIN uploads u ON u.id = b.id WHERE {ok}"), &[])?
        .get::<_, i64>(0) as u64;
    t.commit()?;
    Ok(report)
}
