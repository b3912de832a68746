//! Retention: deleting settled work older than a cutoff (`tally prune`, `[retention]`), with
//! its images, executions and events, and giving the freed pages back to the file system.
//!
//! What is kept, whatever its age (enforced here, and re-checked in the transaction that
//! deletes, since the daemon may have changed a task since the plan was made):
//! - a task that is not settled, or is `unknown` (nobody has resolved it: its outcome, and what
//!   it may have cost, is still an open question for a person);
//! - every shot of a set that has any such task (a set is pruned whole or not at all, so a set
//!   is never shown with shots missing);
//! - a task that a kept task retries (`retry_of` keeps pointing at something);
//! - a reference photo a kept set uses, or one uploaded after the cutoff;
//! - a task with a possibly charged or charged request in the calendar month (UTC) of the
//!   cutoff or later: budgets and the month's spend are summed from those requests, so
//!   deleting them early would free budget room that was really spent (`PAID_RECENTLY`).
//!
//! Age is a task's `updated_at`: when it last changed (settled, resolved). Deletes run in
//! bounded batches (each its own writer operation, so other writes interleave), then
//! `PRAGMA incremental_vacuum` in bounded steps gives the freed pages back
//! (`auto_vacuum = INCREMENTAL`, set by `store::open`).

use std::collections::{HashMap, HashSet};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use super::{SqliteStore, StoreError};
use crate::domain::Millis;

/// Tasks deleted per writer operation.
const TASK_BATCH: usize = 200;
/// Pages given back per writer operation (8 MiB of 4 KiB pages).
const VACUUM_PAGES: i64 = 2048;

/// What a prune did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    pub dry_run: bool,
    /// Settled before this moment (ms since the epoch).
    pub cutoff: Millis,
    /// Tasks deleted, shots of deleted sets included.
    pub tasks: u64,
    pub sets: u64,
    /// Generated images deleted with their tasks.
    pub images: u64,
    /// Reference photos deleted (no kept set uses them).
    pub uploads: u64,
    /// Bytes of images and reference photos deleted.
    pub image_bytes: i64,
    /// Old enough, but `unknown`: kept until someone resolves them.
    pub kept_unknown: u64,
    /// Old enough, but a shot of a set with a task that is not (unknown, running, recent).
    pub kept_in_sets: u64,
    /// Old enough, but a kept task is a retry of it.
    pub kept_retried: u64,
    /// Old enough, but a request of it counts toward this month's spend and budgets.
    pub kept_for_spend: u64,
    /// Bytes the database file gave back (`incremental_vacuum`; 0 for a dry run).
    pub freed_bytes: i64,
}

/// What a prune will delete, decided from one consistent read.
#[derive(Debug, Default)]
struct Plan {
    /// Tasks outside sets, newest first (a retry is newer than what it retries, so it goes
    /// first and its original is no longer pointed at when its turn comes).
    singles: Vec<String>,
    sets: Vec<String>,
    uploads: Vec<String>,
    report: PruneReport,
}

pub(in crate::store) const SETTLED: &str = "status IN ('succeeded', 'failed', 'canceled')";

/// Task `t` has a request that counts as spend from `?N` on (see the module docs); `{N}` is
/// the parameter holding the start of the cutoff's month.
const PAID_RECENTLY: &str = "EXISTS (SELECT 1 FROM executions x WHERE x.task_id = t.id
     AND x.charge IN ('possible', 'charged') AND x.calling_at >= ?{N})";

/// [`PAID_RECENTLY`] with its parameter number.
fn paid_recently(n: u8) -> String {
    PAID_RECENTLY.replace("{N}", &n.to_string())
}

/// The start of the month (UTC) the cutoff falls in: requests from then on are kept.
pub(in crate::store) fn spend_floor(cutoff: Millis) -> Millis {
    crate::store::spend::Period::Month.bounds(cutoff).0
}

/// Which old-enough settled tasks may go, given the sets they belong to and every retry
/// link (both backends decide with this): a set goes whole or not at all, and the original
/// of a kept task is kept (and with it its whole set).
pub(in crate::store) struct Choice {
    /// Every task that goes, shots of pruned sets included.
    pub prunable: HashSet<String>,
    /// Tasks outside sets, newest first (a retry is newer than what it retries, so it goes
    /// first and its original is no longer pointed at when its turn comes).
    pub singles: Vec<String>,
    /// Sets that go whole.
    pub sets: Vec<String>,
    /// Old enough, but a kept task retries it.
    pub kept_retried: u64,
    /// Old enough, but a shot of a kept set.
    pub kept_in_sets: u64,
}

/// [`Choice`] from `rows` (the old-enough settled tasks with their set), `members` (every
/// task of each of those sets) and `links` (every (retry, original) pair).
pub(in crate::store) fn choose(
    rows: &[(String, Option<String>)],
    members: &HashMap<String, Vec<String>>,
    links: &[(String, String)],
) -> Choice {
    let mut prunable: HashSet<String> = rows.iter().map(|(id, _)| id.clone()).collect();
    let set_of: HashMap<String, String> =
        rows.iter().filter_map(|(id, set)| set.clone().map(|s| (id.clone(), s))).collect();
    let mut kept_sets: HashSet<String> = HashSet::new();
    for (set, ids) in members {
        if !ids.iter().all(|id| prunable.contains(id)) {
            kept_sets.insert(set.clone());
        }
    }
    let mut retried: HashSet<String> = HashSet::new();
    loop {
        for set in &kept_sets {
            for id in members.get(set).into_iter().flatten() {
                prunable.remove(id);
            }
        }
        let mut changed = false;
        for (child, parent) in links {
            if !prunable.contains(child) && prunable.remove(parent) {
                retried.insert(parent.clone());
                if let Some(set) = set_of.get(parent) {
                    kept_sets.insert(set.clone());
                }
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let kept_in_sets = rows
        .iter()
        .filter(|(id, set)| set.as_ref().is_some_and(|s| kept_sets.contains(s)) && !retried.contains(id))
        .count() as u64;
    let mut singles: Vec<String> =
        rows.iter().filter(|(id, set)| set.is_none() && prunable.contains(id)).map(|(id, _)| id.clone()).collect();
    singles.sort_unstable_by(|a, b| b.cmp(a));
    let mut sets: Vec<String> = members.keys().filter(|s| !kept_sets.contains(*s)).cloned().collect();
    sets.sort();
    Choice { prunable, singles, sets, kept_retried: retried.len() as u64, kept_in_sets }
}

fn plan(c: &Connection, cutoff: Millis) -> Result<Plan, StoreError> {
    let mut report = PruneReport { cutoff, ..PruneReport::default() };
    let rows: Vec<(String, Option<String>)> = c
        .prepare_cached(&format!(
            "SELECT id, set_id FROM tasks t WHERE {SETTLED} AND updated_at < ?1 AND NOT {}",
            paid_recently(2)
        ))?
        .query_map(params![cutoff, spend_floor(cutoff)], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    report.kept_for_spend = c
        .prepare_cached(&format!(
            "SELECT count(*) FROM tasks t WHERE {SETTLED} AND updated_at < ?1 AND {}",
            paid_recently(2)
        ))?
        .query_row(params![cutoff, spend_floor(cutoff)], |r| r.get::<_, i64>(0))?
        .max(0) as u64;
    report.kept_unknown = c
        .prepare_cached("SELECT count(*) FROM tasks WHERE status = 'unknown' AND updated_at < ?1")?
        .query_row([cutoff], |r| r.get::<_, i64>(0))?
        .max(0) as u64;
    let set_ids: HashSet<&String> = rows.iter().filter_map(|(_, set)| set.as_ref()).collect();
    let mut members: HashMap<String, Vec<String>> = HashMap::new();
    for set in set_ids {
        let ids: Vec<String> = c
            .prepare_cached("SELECT id FROM tasks WHERE set_id = ?1")?
            .query_map([set], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        members.insert(set.clone(), ids);
    }
    let links: Vec<(String, String)> = c
        .prepare_cached("SELECT id, retry_of FROM tasks WHERE retry_of IS NOT NULL")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let Choice { prunable, singles, sets, kept_retried, kept_in_sets } = choose(&rows, &members, &links);
    report.kept_retried = kept_retried;
    report.kept_in_sets = kept_in_sets;
    for id in prunable.iter() {
        let (n, bytes): (i64, i64) = c
            .prepare_cached("SELECT count(*), coalesce(sum(bytes), 0) FROM artifacts WHERE task_id = ?1")?
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        report.images += n.max(0) as u64;
        report.image_bytes += bytes;
    }
    report.tasks = prunable.len() as u64;
    report.sets = sets.len() as u64;
    // Reference photos no kept set uses, uploaded before the cutoff.
    let pruned_sets: HashSet<&String> = sets.iter().collect();
    let old_uploads: Vec<(String, i64)> = c
        .prepare_cached("SELECT id, bytes FROM uploads WHERE created_at < ?1")?
        .query_map([cutoff], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let mut uploads = Vec::new();
    for (id, bytes) in old_uploads {
        let users: Vec<String> = c
            .prepare_cached("SELECT set_id FROM set_references WHERE upload_id = ?1")?
            .query_map([&id], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        if users.iter().all(|s| pruned_sets.contains(s)) {
            report.image_bytes += bytes;
            uploads.push(id);
        }
    }
    report.uploads = uploads.len() as u64;
    Ok(Plan { singles, sets, uploads, report })
}

/// Delete one task and everything that hangs off it (the caller has checked it may go).
/// Returns (images, image bytes) deleted.
fn delete_task(c: &Connection, id: &str) -> Result<(u64, i64), StoreError> {
    let arts: Vec<String> = c
        .prepare_cached("SELECT id FROM artifacts WHERE task_id = ?1")?
        .query_map([id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut bytes = 0;
    for a in &arts {
        bytes += super::blobs::delete_blob(c, a)?;
    }
    for sql in [
        "DELETE FROM artifacts WHERE task_id = ?1",
        "DELETE FROM events WHERE task_id = ?1",
        "DELETE FROM executions WHERE task_id = ?1",
        "DELETE FROM envelopes WHERE task_id = ?1",
        "DELETE FROM tasks WHERE id = ?1",
    ] {
        c.prepare_cached(sql)?.execute([id])?;
    }
    Ok((arts.len() as u64, bytes))
}

/// Delete tasks outside sets, re-checking each: still settled (not `unknown`), still older
/// than the cutoff, and no remaining task is a retry of it. Adds what it deleted to `r`.
fn delete_singles(c: &Connection, ids: &[String], cutoff: Millis, r: &mut PruneReport) -> Result<(), StoreError> {
    for id in ids {
        let still: Option<()> = c
            .prepare_cached(&format!(
                "SELECT 1 FROM tasks t WHERE t.id = ?1 AND t.set_id IS NULL AND {SETTLED} AND t.updated_at < ?2
                 AND NOT EXISTS (SELECT 1 FROM tasks x WHERE x.retry_of = t.id) AND NOT {}",
                paid_recently(3)
            ))?
            .query_row(params![id, cutoff, spend_floor(cutoff)], |_| Ok(()))
            .optional()?;
        if still.is_none() {
            continue;
        }
        let (images, bytes) = delete_task(c, id)?;
        r.tasks += 1;
        r.images += images;
        r.image_bytes += bytes;
    }
    Ok(())
}

/// Delete a whole set if, re-checked now, every one of its shots is settled (not `unknown`)
/// and older than the cutoff and no task outside it retries one of them.
fn delete_set(c: &Connection, set: &str, cutoff: Millis, r: &mut PruneReport) -> Result<(), StoreError> {
    let blocking: i64 = c
        .prepare_cached(&format!(
            "SELECT count(*) FROM tasks t WHERE t.set_id = ?1 AND (NOT ({SETTLED}) OR t.updated_at >= ?2
               OR EXISTS (SELECT 1 FROM tasks x WHERE x.retry_of = t.id AND x.set_id IS NOT ?1) OR {})",
            paid_recently(3)
        ))?
        .query_row(params![set, cutoff, spend_floor(cutoff)], |row| row.get(0))?;
    if blocking > 0 {
        return Ok(());
    }
    let ids: Vec<String> = c
        .prepare_cached("SELECT id FROM tasks WHERE set_id = ?1 ORDER BY id DESC")?
        .query_map([set], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    // Retries inside the set point at shots of the same set: unlink them first.
    c.prepare_cached("UPDATE tasks SET retry_of = NULL WHERE set_id = ?1")?.execute([set])?;
    // A choice names an artifact of the set: it goes before the artifacts do.
    c.prepare_cached("DELETE FROM set_choices WHERE set_id = ?1")?.execute([set])?;
    for id in &ids {
        let (images, bytes) = delete_task(c, id)?;
        r.tasks += 1;
        r.images += images;
        r.image_bytes += bytes;
    }
    c.prepare_cached("DELETE FROM set_references WHERE set_id = ?1")?.execute([set])?;
    c.prepare_cached("DELETE FROM set_events WHERE set_id = ?1")?.execute([set])?;
    c.prepare_cached("DELETE FROM sets WHERE id = ?1")?.execute([set])?;
    r.sets += 1;
    Ok(())
}

/// Delete reference photos that, now, no set uses and that were uploaded before the cutoff.
fn delete_uploads(c: &Connection, ids: &[String], cutoff: Millis, r: &mut PruneReport) -> Result<(), StoreError> {
    for id in ids {
        let n = c
            .prepare_cached(
                "DELETE FROM uploads WHERE id = ?1 AND created_at < ?2
                 AND NOT EXISTS (SELECT 1 FROM set_references WHERE upload_id = ?1)",
            )?
            .execute(params![id, cutoff])?;
        if n > 0 {
            r.uploads += 1;
            r.image_bytes += super::blobs::delete_blob(c, id)?;
        }
    }
    Ok(())
}

/// Give back up to `pages` free pages; returns the free pages left. (Each step of the pragma
/// frees one page: it is run to completion.)
fn vacuum_step(c: &Connection, pages: i64) -> Result<i64, StoreError> {
    let mut stmt = c.prepare_cached(&format!("PRAGMA incremental_vacuum({pages})"))?;
    let mut rows = stmt.query([])?;
    while rows.next()?.is_some() {}
    Ok(c.prepare_cached("PRAGMA freelist_count")?.query_row([], |r| r.get(0))?)
}

/// The database's size in bytes, by its pages.
fn db_bytes(c: &Connection) -> Result<i64, StoreError> {
    let pages: i64 = c.prepare_cached("PRAGMA page_count")?.query_row([], |r| r.get(0))?;
    let size: i64 = c.prepare_cached("PRAGMA page_size")?.query_row([], |r| r.get(0))?;
    Ok(pages * size)
}

impl SqliteStore {
    /// Delete settled work older than `cutoff` (see the module docs), or with `dry_run` only
    /// say what would go. Deletes in bounded batches, each re-checking what it deletes, then
    /// gives the freed pages back.
    pub async fn prune(&self, cutoff: Millis, dry_run: bool) -> Result<PruneReport, StoreError> {
        let plan = self.read(move |c| plan(c, cutoff)).await?;
        if dry_run {
            return Ok(PruneReport { dry_run: true, ..plan.report });
        }
        let before = self.read(db_bytes).await?;
        let mut done = PruneReport { cutoff, ..PruneReport::default() };
        for batch in plan.singles.chunks(TASK_BATCH) {
            let ids = batch.to_vec();
            let r = self
                .write(move |c| {
                    let mut r = PruneReport::default();
                    delete_singles(c, &ids, cutoff, &mut r)?;
                    Ok(r)
                })
                .await?;
            add(&mut done, &r);
        }
        for set in plan.sets {
            let r = self
                .write(move |c| {
                    let mut r = PruneReport::default();
                    delete_set(c, &set, cutoff, &mut r)?;
                    Ok(r)
                })
                .await?;
            add(&mut done, &r);
        }
        let uploads = plan.uploads;
        let r = self
            .write(move |c| {
                let mut r = PruneReport::default();
                delete_uploads(c, &uploads, cutoff, &mut r)?;
                Ok(r)
            })
            .await?;
        add(&mut done, &r);
        // Losing a vacuum step to a power cut leaves pages on the free list, nothing more:
        // ordered commits are enough.
        while self.write_ordered(|c| vacuum_step(c, VACUUM_PAGES)).await? > 0 {}
        let after = self.read(db_bytes).await?;
        done.freed_bytes = (before - after).max(0);
        done.kept_unknown = plan.report.kept_unknown;
        done.kept_in_sets = plan.report.kept_in_sets;
        done.kept_retried = plan.report.kept_retried;
        done.kept_for_spend = plan.report.kept_for_spend;
        Ok(done)
    }

    /// When the oldest settled task changed at or after `since` last changed (`None`: none
    /// did): the retention timer's next due time is that plus its age limit.
    pub async fn next_prunable(&self, since: Millis) -> Result<Option<Millis>, StoreError> {
        self.read(move |c| {
            Ok(c.prepare_cached(&format!("SELECT min(updated_at) FROM tasks WHERE {SETTLED} AND updated_at >= ?1"))?
                .query_row([since], |r| r.get(0))?)
        })
        .await
    }
}

pub(in crate::store) fn add(total: &mut PruneReport, r: &PruneReport) {
    total.tasks += r.tasks;
    total.sets += r.sets;
    total.images += r.images;
    total.uploads += r.uploads;
    total.image_bytes += r.image_bytes;
}
