//! Retention on PostgreSQL (`tally prune`, `[retention]`): what `store::prune` does on SQLite,
//! with the same rules about what is kept whatever its age (not settled or `unknown`, a set
//! with such a shot, the original of a kept retry, a reference photo a kept set uses or one
//! uploaded after the cutoff, a request counted in the cutoff month's spend) and the same
//! decision (`store::prune::choose`).
//!
//! **Several nodes at once.** Any node may prune (each with `[retention]` runs its own timer)
//! while others retry, resolve and create sets, so every delete re-checks its evidence after
//! taking the lock the competing operation takes first (rule L of `store::pg`):
//! - a task outside a set: its envelope row, which a retry or a resolution of it locks first —
//!   so a retry either commits before (the re-check sees it and the task is kept) or runs
//!   after and finds no task;
//! - a set: its shots' envelopes (in id order), then the set row, which a shot's retry locks
//!   too — so a retry made meanwhile is a live shot that keeps the set;
//! - a reference photo: its `uploads` row, which a new set naming it locks `FOR KEY SHARE`
//!   before checking it exists (`pg::sets`) — so either the set sees the photo gone and says
//!   so, or the prune sees the set and keeps the photo.
//!
//! Deletes run in bounded batches, each its own transaction. PostgreSQL gives the space of
//! deleted rows back to its own free space (autovacuum), not to the file system, so
//! `freed_bytes` is 0 here.

use std::collections::{HashMap, HashSet};

use super::ops::lock_task;
use super::{PgStore, Tx};
use crate::domain::Millis;
use crate::store::StoreError;
use crate::store::prune::{Choice, PruneReport, add, choose, spend_floor};

/// Tasks deleted per transaction.
const TASK_BATCH: usize = 200;

/// What a prune will delete, decided from one consistent read.
struct Plan {
    singles: Vec<String>,
    sets: Vec<String>,
    uploads: Vec<String>,
    report: PruneReport,
}

fn plan(tx: &mut Tx<'_, '_>, cutoff: Millis) -> Result<Plan, StoreError> {
    let floor = spend_floor(cutoff);
    let mut report = PruneReport { cutoff, ..PruneReport::default() };
    let rows: Vec<(String, Option<String>)> = tx
        .rows(
            "SELECT id, set_id FROM tasks t WHERE status IN ('succeeded', 'failed', 'canceled') AND updated_at < $1
               AND NOT EXISTS (SELECT 1 FROM executions x WHERE x.task_id = t.id
                                 AND x.charge IN ('possible', 'charged') AND x.calling_at >= $2)",
            &[&cutoff, &floor],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let kept_for_spend: i64 = tx
        .one(
            "SELECT count(*) FROM tasks t WHERE status IN ('succeeded', 'failed', 'canceled') AND updated_at < $1
               AND EXISTS (SELECT 1 FROM executions x WHERE x.task_id = t.id
                             AND x.charge IN ('possible', 'charged') AND x.calling_at >= $2)",
            &[&cutoff, &floor],
        )?
        .get(0);
    report.kept_for_spend = kept_for_spend.max(0) as u64;
    let kept_unknown: i64 =
        tx.one("SELECT count(*) FROM tasks WHERE status = 'unknown' AND updated_at < $1", &[&cutoff])?.get(0);
    report.kept_unknown = kept_unknown.max(0) as u64;
    let set_ids: Vec<String> =
        rows.iter().filter_map(|(_, set)| set.clone()).collect::<HashSet<_>>().into_iter().collect();
    let mut members: HashMap<String, Vec<String>> = HashMap::new();
    for r in tx.rows("SELECT set_id, id FROM tasks WHERE set_id = ANY($1)", &[&set_ids])? {
        members.entry(r.get(0)).or_default().push(r.get(1));
    }
    let links: Vec<(String, String)> = tx
        .rows("SELECT id, retry_of FROM tasks WHERE retry_of IS NOT NULL", &[])?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let Choice { prunable, singles, sets, kept_retried, kept_in_sets } = choose(&rows, &members, &links);
    report.kept_retried = kept_retried;
    report.kept_in_sets = kept_in_sets;
    let ids: Vec<String> = prunable.into_iter().collect();
    let r =
        tx.one("SELECT count(*), coalesce(sum(bytes), 0)::bigint FROM artifacts WHERE task_id = ANY($1)", &[&ids])?;
    let (images, bytes): (i64, i64) = (r.get(0), r.get(1));
    report.images = images.max(0) as u64;
    report.image_bytes = bytes;
    report.tasks = ids.len() as u64;
    report.sets = sets.len() as u64;
    // Reference photos no kept set uses, uploaded before the cutoff.
    let mut uploads = Vec::new();
    for r in tx.rows(
        "SELECT u.id, u.bytes FROM uploads u WHERE u.created_at < $1
           AND NOT EXISTS (SELECT 1 FROM set_references r WHERE r.upload_id = u.id AND NOT r.set_id = ANY($2))
         ORDER BY u.id",
        &[&cutoff, &sets],
    )? {
        let bytes: i64 = r.get(1);
        report.image_bytes += bytes;
        uploads.push(r.get(0));
    }
    report.uploads = uploads.len() as u64;
    Ok(Plan { singles, sets, uploads, report })
}

/// Delete one task and everything that hangs off it (the caller holds its locks and has
/// re-checked that it may go). Returns (images, image bytes) deleted.
fn delete_task(tx: &mut Tx<'_, '_>, id: &str) -> Result<(u64, i64), StoreError> {
    let r = tx.one(
        "WITH gone AS (DELETE FROM blobs WHERE id IN (SELECT id FROM artifacts WHERE task_id = $1) RETURNING bytes)
         SELECT count(*), coalesce(sum(bytes), 0)::bigint FROM gone",
        &[&id],
    )?;
    let (images, bytes): (i64, i64) = (r.get(0), r.get(1));
    tx.exec("DELETE FROM artifacts WHERE task_id = $1", &[&id])?;
    tx.exec("DELETE FROM events WHERE task_id = $1", &[&id])?;
    tx.exec("DELETE FROM executions WHERE task_id = $1", &[&id])?;
    tx.exec("DELETE FROM envelopes WHERE task_id = $1", &[&id])?;
    tx.exec("DELETE FROM tasks WHERE id = $1", &[&id])?;
    Ok((images.max(0) as u64, bytes))
}

/// Delete tasks outside sets, each under its envelope lock and re-checked: still settled
/// (not `unknown`), still older than the cutoff, not counted in the cutoff month's spend, and
/// no task is a retry of it.
fn delete_singles(tx: &mut Tx<'_, '_>, ids: &[String], cutoff: Millis) -> Result<PruneReport, StoreError> {
    let floor = spend_floor(cutoff);
    let mut r = PruneReport::default();
    for id in ids {
        lock_task(tx, id)?;
        let still = tx.opt(
            "SELECT 1 FROM tasks t WHERE t.id = $1 AND t.set_id IS NULL
               AND t.status IN ('succeeded', 'failed', 'canceled') AND t.updated_at < $2
               AND NOT EXISTS (SELECT 1 FROM tasks x WHERE x.retry_of = t.id)
               AND NOT EXISTS (SELECT 1 FROM executions x WHERE x.task_id = t.id
                                 AND x.charge IN ('possible', 'charged') AND x.calling_at >= $3)",
            &[&id, &cutoff, &floor],
        )?;
        if still.is_none() {
            continue;
        }
        let (images, bytes) = delete_task(tx, id)?;
        r.tasks += 1;
        r.images += images;
        r.image_bytes += bytes;
    }
    Ok(r)
}

/// Delete a whole set if, under its shots' envelope locks and its own row lock, every one of
/// its shots is settled (not `unknown`), older than the cutoff and not counted in the cutoff
/// month's spend, and no task outside it retries one of them.
fn delete_set(tx: &mut Tx<'_, '_>, set: &str, cutoff: Millis) -> Result<PruneReport, StoreError> {
    let floor = spend_floor(cutoff);
    let mut r = PruneReport::default();
    tx.rows(
        "SELECT 1 FROM envelopes WHERE task_id IN (SELECT id FROM tasks WHERE set_id = $1) ORDER BY task_id FOR UPDATE",
        &[&set],
    )?;
    if !super::sets::lock_set(tx, set)? {
        return Ok(r);
    }
    let blocking: i64 = tx
        .one(
            "SELECT count(*) FROM tasks t WHERE t.set_id = $1
               AND (t.status NOT IN ('succeeded', 'failed', 'canceled') OR t.updated_at >= $2
                    OR EXISTS (SELECT 1 FROM tasks x WHERE x.retry_of = t.id AND x.set_id IS DISTINCT FROM $1)
                    OR EXISTS (SELECT 1 FROM executions x WHERE x.task_id = t.id
                                 AND x.charge IN ('possible', 'charged') AND x.calling_at >= $3))",
            &[&set, &cutoff, &floor],
        )?
        .get(0);
    if blocking > 0 {
        return Ok(r);
    }
    let ids: Vec<String> = tx
        .rows("SELECT id FROM tasks WHERE set_id = $1 ORDER BY id DESC", &[&set])?
        .iter()
        .map(|row| row.get(0))
        .collect();
    // Retries inside the set point at shots of the same set: unlink them first.
    tx.exec("UPDATE tasks SET retry_of = NULL WHERE set_id = $1 AND retry_of IS NOT NULL", &[&set])?;
    // A choice names an artifact of the set: it goes before the artifacts do.
    tx.exec("DELETE FROM set_choices WHERE set_id = $1", &[&set])?;
    for id in &ids {
        let (images, bytes) = delete_task(tx, id)?;
        r.tasks += 1;
        r.images += images;
        r.image_bytes += bytes;
    }
    tx.exec("DELETE FROM set_references WHERE set_id = $1", &[&set])?;
    tx.exec("DELETE FROM set_events WHERE set_id = $1", &[&set])?;
    tx.exec("DELETE FROM sets WHERE id = $1", &[&set])?;
    r.sets += 1;
    Ok(r)
}

/// Delete reference photos that, under their row lock, no set uses and that were uploaded
/// before the cutoff.
fn delete_uploads(tx: &mut Tx<'_, '_>, ids: &[String], cutoff: Millis) -> Result<PruneReport, StoreError> {
    let mut r = PruneReport::default();
    for id in ids {
        if tx.opt("SELECT 1 FROM uploads WHERE id = $1 FOR UPDATE", &[&id])?.is_none() {
            continue;
        }
        let n = tx.exec(
            "DELETE FROM uploads WHERE id = $1 AND created_at < $2
               AND NOT EXISTS (SELECT 1 FROM set_references WHERE upload_id = $1)",
            &[&id, &cutoff],
        )?;
        if n > 0 {
            r.uploads += 1;
            let bytes: Option<i64> =
                tx.opt("DELETE FROM blobs WHERE id = $1 RETURNING bytes", &[&id])?.map(|row| row.get(0));
            r.image_bytes += bytes.unwrap_or(0);
        }
    }
    Ok(r)
}

impl PgStore {
    /// Delete settled work older than `cutoff` (see the module docs), or with `dry_run` only
    /// say what would go. Deletes in bounded batches, each re-checking what it deletes under
    /// the locks that order it against retries, resolutions and new sets on any node.
    pub async fn prune(&self, cutoff: Millis, dry_run: bool) -> Result<PruneReport, StoreError> {
        let plan = self.read(move |tx| plan(tx, cutoff)).await?;
        if dry_run {
            return Ok(PruneReport { dry_run: true, ..plan.report });
        }
        let mut done = PruneReport { cutoff, ..PruneReport::default() };
        for batch in plan.singles.chunks(TASK_BATCH) {
            let ids = batch.to_vec();
            add(&mut done, &self.write(move |tx| delete_singles(tx, &ids, cutoff)).await?);
        }
        for set in plan.sets {
            add(&mut done, &self.write(move |tx| delete_set(tx, &set, cutoff)).await?);
        }
        let uploads = plan.uploads;
        add(&mut done, &self.write(move |tx| delete_uploads(tx, &uploads, cutoff)).await?);
        done.kept_unknown = plan.report.kept_unknown;
        done.kept_in_sets = plan.report.kept_in_sets;
        done.kept_retried = plan.report.kept_retried;
        done.kept_for_spend = plan.report.kept_for_spend;
        Ok(done)
    }

    /// When the oldest settled task changed at or after `since` last changed (`None`: none
    /// did), for the retention timer.
    pub async fn next_prunable(&self, since: Millis) -> Result<Option<Millis>, StoreError> {
        self.read(move |tx| {
            Ok(tx
                .one(
                    "SELECT min(updated_at) FROM tasks WHERE status IN ('succeeded', 'failed', 'canceled')
                       AND updated_at >= $1",
                    &[&since],
                )?
                .get(0))
        })
        .await
    }
}
