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
//! - a draft's drafting tasks, its photos and the set confirmed from it (drafts themselves are
//!   not pruned yet);
//! - a task with a possibly charged or charged request in the calendar month of the
//!   cutoff or later (taken in the earliest zone, so any `[ui] time_zone`'s month is whole):
//!   budgets and the month's spend are summed from those requests, so deleting them early
//!   would free budget room that was really spent (`PAID_RECENTLY`).
//!
//! Age is a task's `updated_at`: when it last changed (settled, resolved). The plan is read
//! once ([`plan`], decided by the pure [`choose`]); deletes run in bounded batches, each its
//! own write operation so other writes interleave (`Store::prune` runs them), and each
//! re-checks what it deletes. On SQLite `PRAGMA incremental_vacuum` in bounded steps then
//! gives the freed pages back (`auto_vacuum = INCREMENTAL`, set by `store::sqlite::open`); PostgreSQL
//! gives the space of deleted rows back to its own free space (autovacuum), not to the file
//! system, so `freed_bytes` is 0 there.
//!
//! **Several nodes at once (PostgreSQL).** Any node may prune while others retry, resolve and
//! create sets, so where transactions run side by side ([`Tx::locking`]) every delete
//! re-checks its evidence after taking the lock the competing operation takes first:
//! - a task outside a set: its envelope row ([`Tx::lock_task`]), which a retry or a
//!   resolution of it locks first — so a retry either commits before (the re-check sees it and
//!   the task is kept) or runs after and finds no task;
//! - a set: its shots' envelopes (in id order), then the set row ([`Tx::lock_set`]), which a
//!   shot's retry locks too — so a retry made meanwhile is a live shot that keeps the set;
//! - a reference photo: its `uploads` row, which a new set naming it locks `FOR KEY SHARE`
//!   before checking it exists (`ops::sets`) — so either the set sees the photo gone and says
//!   so, or the prune sees the set and keeps the photo.
//!
//! Under SQLite's single writer the same re-checks run with no lock.

use std::collections::{HashMap, HashSet};

use rusqlite::Connection;
use serde::Serialize;

use super::tx::Tx;
use super::{SqliteStore, StoreError};
use crate::domain::Millis;

/// Tasks deleted per write operation.
pub(in crate::store) const TASK_BATCH: usize = 200;
/// Pages given back per writer operation (8 MiB of 4 KiB pages).
const VACUUM_PAGES: i64 = 2048;

/// What a prune did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
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
    /// Old enough, but a shot of a set with a task that is not (unknown, running, recent), or
    /// of a set with a delivery not yet ended.
    pub kept_in_sets: u64,
    /// Old enough, but a kept task is a retry of it.
    pub kept_retried: u64,
    /// Old enough, but a request of it counts toward this month's spend and budgets.
    pub kept_for_spend: u64,
    /// Bytes the database file gave back (`incremental_vacuum`; 0 for a dry run).
    pub freed_bytes: i64,
}

/// What a prune will delete, decided from one read.
#[derive(Debug, Default)]
pub(in crate::store) struct Plan {
    /// Tasks outside sets, newest first (a retry is newer than what it retries, so it goes
    /// first and its original is no longer pointed at when its turn comes).
    pub singles: Vec<String>,
    pub sets: Vec<String>,
    pub uploads: Vec<String>,
    pub report: PruneReport,
}

/// A task status that is settled and resolved (`unknown` is not).
macro_rules! settled {
    () => {
        "status IN ('succeeded', 'failed', 'canceled')"
    };
}

/// Task `t` has a request that counts as spend from parameter `?N` on (see the module docs):
/// `paid_recently!("N")`, with `?N` the start of the cutoff's month ([`spend_floor`]).
macro_rules! paid_recently {
    ($n:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM executions x WHERE x.task_id = t.id
               AND x.charge IN ('possible', 'charged') AND x.calling_at >= ?",
            $n,
            ")"
        )
    };
}

/// The earliest the month the cutoff falls in can begin in any zone (UTC−12 to UTC+14):
/// requests from then on are kept, so the local month a budget counts (`[ui] time_zone`,
/// whichever it is or becomes) keeps every request it sums.
pub(in crate::store) fn spend_floor(cutoff: Millis) -> Millis {
    crate::domain::zone::earliest_month_start(cutoff)
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

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// What a prune of what settled before `cutoff` would delete, and what it keeps.
pub(in crate::store) fn plan(tx: &mut dyn Tx, cutoff: Millis) -> Result<Plan, StoreError> {
    let floor = spend_floor(cutoff);
    let mut report = PruneReport { cutoff, ..PruneReport::default() };
    let rows: Vec<(String, Option<String>)> = tx
        .rows(
            concat!(
                "SELECT id, set_id FROM tasks t WHERE ",
                settled!(),
                " AND updated_at < ?1 AND NOT ",
                paid_recently!("2")
            ),
            &[&cutoff, &floor],
        )?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?)))
        .collect::<Result<_, StoreError>>()?;
    report.kept_for_spend = count(
        tx.one(
            concat!(
                "SELECT count(*) FROM tasks t WHERE ",
                settled!(),
                " AND updated_at < ?1 AND ",
                paid_recently!("2")
            ),
            &[&cutoff, &floor],
        )?
        .get(0)?,
    );
    report.kept_unknown =
        count(tx.one("SELECT count(*) FROM tasks WHERE status = 'unknown' AND updated_at < ?1", &[&cutoff])?.get(0)?);
    // Every task of each set one of `rows` belongs to.
    let mut members: HashMap<String, Vec<String>> = HashMap::new();
    for r in tx.rows(
        concat!(
            "SELECT set_id, id FROM tasks WHERE set_id IN (SELECT t.set_id FROM tasks t WHERE ",
            settled!(),
            " AND updated_at < ?1 AND NOT ",
            paid_recently!("2"),
            ")"
        ),
        &[&cutoff, &floor],
    )? {
        members.entry(r.get(0)?).or_default().push(r.get(1)?);
    }
    let links: Vec<(String, String)> = tx
        .rows("SELECT id, retry_of FROM tasks WHERE retry_of IS NOT NULL", &[])?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?)))
        .collect::<Result<_, StoreError>>()?;
    let Choice { prunable, singles, sets, kept_retried, kept_in_sets } = choose(&rows, &members, &links);
    report.kept_retried = kept_retried;
    report.kept_in_sets = kept_in_sets;
    // The images of the old enough tasks, of which those of the prunable ones are counted.
    for r in tx.rows(
        concat!(
            "SELECT task_id, count(*), CAST(coalesce(sum(bytes), 0) AS BIGINT) FROM artifacts
             WHERE task_id IN (SELECT id FROM tasks t WHERE ",
            settled!(),
            " AND updated_at < ?1) GROUP BY task_id"
        ),
        &[&cutoff],
    )? {
        if prunable.contains(&r.get::<String>(0)?) {
            report.images += count(r.get(1)?);
            report.image_bytes += r.get::<i64>(2)?;
        }
    }
    report.tasks = prunable.len() as u64;
    report.sets = sets.len() as u64;
    // Reference photos no kept set uses, uploaded before the cutoff: each with the sets that
    // use it (none: one row with no set).
    let pruned_sets: HashSet<&String> = sets.iter().collect();
    let mut uploads: Vec<(String, i64, bool)> = Vec::new();
    for r in tx.rows(
        "SELECT u.id, u.bytes, r.set_id FROM uploads u LEFT JOIN set_references r ON r.upload_id = u.id
         WHERE u.created_at < ?1 ORDER BY u.id",
        &[&cutoff],
    )? {
        let (id, bytes, user): (String, i64, Option<String>) = (r.get(0)?, r.get(1)?, r.get(2)?);
        let goes = user.is_none_or(|s| pruned_sets.contains(&s));
        match uploads.last_mut() {
            Some(last) if last.0 == id => last.2 &= goes,
            _ => uploads.push((id, bytes, goes)),
        }
    }
    let uploads: Vec<String> = uploads
        .into_iter()
        .filter(|(_, _, goes)| *goes)
        .map(|(id, bytes, _)| {
            report.image_bytes += bytes;
            id
        })
        .collect();
    report.uploads = uploads.len() as u64;
    Ok(Plan { singles, sets, uploads, report })
}

/// Delete one task and everything that hangs off it (the caller holds its locks and has
/// re-checked that it may go). Adds what it deleted to `r`. Deleting a set
/// (`ops::set_edit::delete_set`) deletes its unsent tasks with it too.
pub(in crate::store) fn delete_task(tx: &mut dyn Tx, id: &str, r: &mut PruneReport) -> Result<(), StoreError> {
    let images =
        tx.rows("DELETE FROM blobs WHERE id IN (SELECT id FROM artifacts WHERE task_id = ?1) RETURNING bytes", &[&id])?;
    for row in &images {
        r.image_bytes += row.get::<i64>(0)?;
    }
    r.images += images.len() as u64;
    tx.exec("DELETE FROM artifacts WHERE task_id = ?1", &[&id])?;
    tx.exec("DELETE FROM events WHERE task_id = ?1", &[&id])?;
    tx.exec("DELETE FROM executions WHERE task_id = ?1", &[&id])?;
    tx.exec("DELETE FROM envelopes WHERE task_id = ?1", &[&id])?;
    tx.exec("DELETE FROM tasks WHERE id = ?1", &[&id])?;
    r.tasks += 1;
    Ok(())
}

/// Delete tasks outside sets, each under its envelope lock and re-checked: still settled
/// (not `unknown`), still older than the cutoff, not counted in the cutoff month's spend, and
/// no task is a retry of it. What it deleted.
pub(in crate::store) fn delete_singles(
    tx: &mut dyn Tx,
    ids: &[String],
    cutoff: Millis,
) -> Result<PruneReport, StoreError> {
    let floor = spend_floor(cutoff);
    let mut r = PruneReport::default();
    for id in ids {
        tx.lock_task(id)?;
        let still = tx.opt(
            concat!(
                "SELECT 1 FROM tasks t WHERE t.id = ?1 AND t.set_id IS NULL AND t.",
                settled!(),
                " AND t.updated_at < ?2
                   AND NOT EXISTS (SELECT 1 FROM tasks x WHERE x.retry_of = t.id)
                   AND NOT EXISTS (SELECT 1 FROM draft_revisions d WHERE d.task_id = t.id) AND NOT ",
                paid_recently!("3")
            ),
            &[&id, &cutoff, &floor],
        )?;
        if still.is_some() {
            delete_task(tx, id, &mut r)?;
        }
    }
    Ok(r)
}

/// Delete a whole set if, under its shots' envelope locks and its own row lock, every one of
/// its shots is settled (not `unknown`), older than the cutoff and not counted in the cutoff
/// month's spend, and no task outside it retries one of them. What it deleted.
pub(in crate::store) fn delete_set(tx: &mut dyn Tx, set: &str, cutoff: Millis) -> Result<PruneReport, StoreError> {
    let floor = spend_floor(cutoff);
    let mut r = PruneReport::default();
    if tx.locking() {
        // Every shot's envelope, in id order (the order other operations lock more than one
        // task in), before the set row.
        tx.rows(
            "SELECT 1 FROM envelopes WHERE task_id IN (SELECT id FROM tasks WHERE set_id = ?1) ORDER BY task_id FOR UPDATE",
            &[&set],
        )?;
    }
    tx.lock_set(set)?;
    if tx.opt("SELECT 1 FROM sets WHERE id = ?1", &[&set])?.is_none() {
        return Ok(r);
    }
    // A set a draft was confirmed into is kept with its draft (drafts are not pruned yet).
    if tx.opt("SELECT 1 FROM drafts WHERE set_id = ?1", &[&set])?.is_some() {
        return Ok(r);
    }
    let blocking: i64 = tx
        .one(
            concat!(
                "SELECT count(*) FROM tasks t WHERE t.set_id = ?1
                   AND (NOT (t.",
                settled!(),
                ") OR t.updated_at >= ?2
                        OR EXISTS (SELECT 1 FROM tasks x WHERE x.retry_of = t.id AND (x.set_id IS NULL OR x.set_id <> ?1))
                        OR ",
                paid_recently!("3"),
                ")"
            ),
            &[&set, &cutoff, &floor],
        )?
        .get(0)?;
    if blocking > 0 {
        return Ok(r);
    }
    // A delivery not yet ended reads the set's chosen images while it writes its files: the set
    // stays (issue #43), and a later prune (or the retention timer) takes it once the delivery
    // has ended. Checked in the transaction that deletes, so a delivery recorded before it
    // commits is seen.
    if tx.opt("SELECT 1 FROM deliveries WHERE set_id = ?1 AND state IN ('queued', 'delivering')", &[&set])?.is_some() {
        let shots: i64 = tx.one("SELECT count(*) FROM tasks WHERE set_id = ?1", &[&set])?.get(0)?;
        r.kept_in_sets += count(shots);
        return Ok(r);
    }
    let ids: Vec<String> = tx
        .rows("SELECT id FROM tasks WHERE set_id = ?1 ORDER BY id DESC", &[&set])?
        .iter()
        .map(|row| row.get(0))
        .collect::<Result<_, _>>()?;
    // Retries inside the set point at shots of the same set: unlink them first.
    tx.exec("UPDATE tasks SET retry_of = NULL WHERE set_id = ?1 AND retry_of IS NOT NULL", &[&set])?;
    // A choice names an artifact of the set: it goes before the artifacts do.
    tx.exec("DELETE FROM set_choices WHERE set_id = ?1", &[&set])?;
    for id in &ids {
        delete_task(tx, id, &mut r)?;
    }
    tx.exec("DELETE FROM set_references WHERE set_id = ?1", &[&set])?;
    tx.exec("DELETE FROM set_events WHERE set_id = ?1", &[&set])?;
    tx.exec("DELETE FROM sets WHERE id = ?1", &[&set])?;
    r.sets += 1;
    Ok(r)
}

/// Delete reference photos that, now (under their row lock where transactions run side by
/// side), no set uses and that were uploaded before the cutoff. What it deleted.
pub(in crate::store) fn delete_uploads(
    tx: &mut dyn Tx,
    ids: &[String],
    cutoff: Millis,
) -> Result<PruneReport, StoreError> {
    let mut r = PruneReport::default();
    for id in ids {
        if tx.locking() && tx.opt("SELECT 1 FROM uploads WHERE id = ?1 FOR UPDATE", &[&id])?.is_none() {
            continue;
        }
        let n = tx.exec(
            "DELETE FROM uploads WHERE id = ?1 AND created_at < ?2
               AND NOT EXISTS (SELECT 1 FROM set_references WHERE upload_id = ?1)
               AND NOT EXISTS (SELECT 1 FROM draft_photos WHERE upload_id = ?1)",
            &[&id, &cutoff],
        )?;
        if n > 0 {
            r.uploads += 1;
            if let Some(row) = tx.opt("DELETE FROM blobs WHERE id = ?1 RETURNING bytes", &[&id])? {
                r.image_bytes += row.get::<i64>(0)?;
            }
        }
    }
    Ok(r)
}

/// When the oldest settled task changed at or after `since` last changed (`None`: none did):
/// the retention timer's next due time is that plus its age limit.
pub(in crate::store) fn next_prunable(tx: &mut dyn Tx, since: Millis) -> Result<Option<Millis>, StoreError> {
    tx.one(concat!("SELECT min(updated_at) FROM tasks WHERE ", settled!(), " AND updated_at >= ?1"), &[&since])?.get(0)
}

/// Give back up to `pages` free pages (SQLite); returns the free pages left. (Each step of the
/// pragma frees one page: it is run to completion.)
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
    /// The database file's size in bytes, by its pages (before and after a prune).
    pub(in crate::store) async fn db_bytes(&self) -> Result<i64, StoreError> {
        self.read(db_bytes).await
    }

    /// Give the free pages back to the file system, in bounded steps. Losing a step to a
    /// power cut leaves pages on the free list, nothing more: ordered commits are enough.
    pub(in crate::store) async fn vacuum(&self) -> Result<(), StoreError> {
        while self.write_ordered(|c| vacuum_step(c, VACUUM_PAGES)).await? > 0 {}
        Ok(())
    }
}

/// Add what one batch deleted to the totals.
pub(in crate::store) fn add(total: &mut PruneReport, r: &PruneReport) {
    total.tasks += r.tasks;
    total.sets += r.sets;
    total.images += r.images;
    total.uploads += r.uploads;
    total.image_bytes += r.image_bytes;
    total.kept_in_sets += r.kept_in_sets;
}
