//! Fills a fresh tally database with finished history through a separate rusqlite connection,
//! row for row as the engine would have left it for a task that succeeded on its first
//! attempt: task `succeeded`, envelope `consumed`, execution `succeeded` (phase `calling`),
//! one artifact row with its stored image (the small bench PNG), and the four events (`submitted`, `claimed`, `calling`, `succeeded`).
//!
//! Run it on a database that [`crate::store::Store::open`] created (schema, `user_version`,
//! `application_id`) and then closed; reopen the store afterwards.

use std::path::Path;

use rusqlite::{Connection, params};
use sha2::{Digest, Sha256};

use crate::domain::{Millis, hex, request_hash};

/// Insert `n` finished tasks ending just before `now`, in transactions of `batch` tasks.
/// Returns the number of rows written (all tables).
pub fn finished_tasks(db: &Path, n: u64, now: Millis, provider: &str) -> Result<u64, String> {
    let e = |e: rusqlite::Error| format!("populate: {e}");
    let mut c = Connection::open(db).map_err(e)?;
    // Speed over safety while filling a scratch database: the store reopens it in WAL/FULL.
    c.execute_batch("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -1048576;").map_err(e)?;
    let png = crate::render::placeholder_png("tally bench", 8);
    let sha = hex(&Sha256::digest(&png));
    let boot = uuid::Uuid::new_v4().to_string();
    let params_json = serde_json::json!({});
    let batch = 50_000u64;
    let mut rows = 0u64;
    let mut i = 0u64;
    while i < n {
        let end = (i + batch).min(n);
        let tx = c.transaction().map_err(e)?;
        {
            let mut task = tx
                .prepare(
                    "INSERT INTO tasks (id, idempotency_key, request_hash, provider, prompt, params, status, reason,
                        attempts, may_have_charged, created_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, '{}', 'succeeded', NULL, 1, 1, ?6, ?7)",
                )
                .map_err(e)?;
            let mut env = tx
                .prepare(
                    "INSERT INTO envelopes (id, task_id, provider, status, due_at, send_count, sent_at, lease_boot)
                     VALUES (?1, ?2, ?3, 'consumed', ?4, 1, ?4, ?5)",
                )
                .map_err(e)?;
            let mut exec = tx
                .prepare(
                    "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, boot_id,
                        heartbeat_at, started_at, calling_at, finished_at)
                     VALUES (?1, ?2, 1, 'succeeded', 'calling', ?3, ?4, ?5, ?5, ?5, ?6)",
                )
                .map_err(e)?;
            let mut art = tx
                .prepare(
                    "INSERT INTO artifacts (id, task_id, execution_token, sha256, bytes, media_type, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, 'image/png', ?6)",
                )
                .map_err(e)?;
            let mut blob = tx
                .prepare("INSERT INTO blobs (id, sha256, bytes, media_type, data) VALUES (?1, ?2, ?3, 'image/png', ?4)")
                .map_err(e)?;
            let mut ev = tx
                .prepare(
                    "INSERT INTO events (task_id, at, actor, kind, message, execution_token) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(e)?;
            let succeeded_msg = format!("image saved ({} bytes, sha256 {sha})", png.len());
            for k in i..end {
                // One task every 2.5 s of history, oldest first, so ids sort by creation time.
                let created = now - ((n - k) as Millis) * 2500 - 60_000;
                let id = v7(created);
                let key = format!("bench-hist-{k}");
                let prompt = format!("product photo {k}: a red sneaker on a white background");
                let hash = request_hash(provider, &prompt, &params_json, "");
                task.execute(params![id, key, hash, provider, prompt, created, created + 900]).map_err(e)?;
                env.execute(params![v7(created), id, provider, created, boot]).map_err(e)?;
                let token = uuid::Uuid::new_v4().to_string();
                exec.execute(params![token, id, format!("tally-{token}"), boot, created + 2, created + 900])
                    .map_err(e)?;
                let art_id = v7(created + 900);
                art.execute(params![art_id, id, token, sha, png.len() as i64, created + 900]).map_err(e)?;
                blob.execute(params![art_id, sha, png.len() as i64, png]).map_err(e)?;
                ev.execute(params![id, created, "api", "submitted", "submitted", None::<String>]).map_err(e)?;
                ev.execute(params![id, created + 2, "worker", "claimed", "attempt 1 started", token]).map_err(e)?;
                ev.execute(params![
                    id,
                    created + 2,
                    "worker",
                    "calling",
                    "sending the request to the provider; from now on it may be charged",
                    token
                ])
                .map_err(e)?;
                ev.execute(params![id, created + 900, "worker", "succeeded", succeeded_msg, token]).map_err(e)?;
                rows += 9;
            }
        }
        tx.commit().map_err(e)?;
        i = end;
    }
    // No ANALYZE: tally never runs it, so the planner sees what a real daemon's database has.
    Ok(rows)
}

/// A UUIDv7 for a moment in the past (ms since the epoch).
fn v7(ms: Millis) -> String {
    let ms = ms.max(0) as u64;
    let ts = uuid::Timestamp::from_unix(uuid::NoContext, ms / 1000, ((ms % 1000) * 1_000_000) as u32);
    uuid::Uuid::new_v7(ts).to_string()
}
