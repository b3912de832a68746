//! Moving the image files of schema versions up to 3 (`artifacts/` and `uploads/` beside the
//! database) into the database, at start-up, before anything else runs.
//!
//! The schema step (`open::MIGRATIONS`, 3 → 4) lists every file its rows point to in
//! `legacy_files`, with the size and sha256 the row recorded. This module then works through
//! that list; each step is safe to be killed at any point and started again:
//!
//! 1. a batch of files is read and **verified** (size and sha256 against the row); the good
//!    ones are inserted as blobs and marked `moved` **in one transaction**;
//! 2. only after that commit are their files removed;
//! 3. then their `legacy_files` rows are deleted.
//!
//! A kill before 1 commits leaves the files and rows as they were (done again, nothing
//! duplicated: a blob and its `moved` mark commit together); between 1 and 3 the files may
//! or may not be gone, and step 2 runs again (removing a missing file is fine). A file that is
//! missing or does not match its row is **not** moved and not removed: it stays listed, start-up
//! says so, and `tally check` reports it, so putting the right file back and starting again
//! finishes the job. When the list is empty, `legacy_files` is dropped.
//!
//! One more kind of file is evidence: an older version saved an image as
//! `artifacts/<execution token>.<ext>` *before* committing it, so a crash could leave the image
//! of a task still `running` (or a late image of an `unknown` one) on disk without a row. That
//! version finished such tasks from the file at start-up; this one stores images in the same
//! transaction as the finish and has no such path, so the migration does it one last time:
//! the file is verified, committed as the task's artifact (recorded in the timeline), and
//! listed as moved, so it is removed like the others.

use std::path::{Component, Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};

use super::StoreError;
use crate::clock::Clock;
use crate::domain::{Actor, TaskStatus};
use crate::store::blobs::{NewArtifact, NewImage};
use crate::store::ops::common::{consume_envelope, event, insert_artifact, on_settled, set_task};
use crate::store::sqlite::tx::SqliteTx;

/// At most this many bytes of files are read and committed per transaction.
const BATCH_BYTES: i64 = 64 << 20;

/// The directories an older version kept images in, relative to the data dir.
const DIRS: &[&str] = &["artifacts", "uploads"];

/// Whether a migration of image files has not finished yet.
pub(super) fn in_progress(c: &Connection) -> Result<bool, StoreError> {
    Ok(c.prepare("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'legacy_files'")?
        .query_row([], |_| Ok(()))
        .optional()?
        .is_some())
}

/// `rel` under `dir`, if `rel` is a plain relative path (no `..`, not absolute).
fn inside(dir: &Path, rel: &str) -> Option<PathBuf> {
    let p = Path::new(rel);
    p.components().all(|c| matches!(c, Component::Normal(_))).then(|| dir.join(p))
}

/// Work through `legacy_files` (see the module docs). Returns what it did, in plain words.
pub(super) fn move_files_in(c: &Connection, data_dir: &Path) -> Result<Vec<String>, StoreError> {
    if !in_progress(c)? {
        return Ok(Vec::new());
    }
    let mut notes = Vec::new();
    let recovered = recover_saved(c, data_dir)?;
    if recovered > 0 {
        notes.push(format!(
            "finished {recovered} task(s) from images the previous version had saved but not yet recorded \
             (each verified; see the task's timeline)"
        ));
    }
    let (mut artifacts, mut uploads, mut removed) = (0u64, 0u64, 0u64);
    let mut failed: Vec<(String, String)> = Vec::new();
    loop {
        // Steps 2 and 3 for everything already committed.
        let moved: Vec<(String, String)> = c
            .prepare("SELECT id, path FROM legacy_files WHERE moved = 1")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        for (_, rel) in &moved {
            let Some(path) = inside(data_dir, rel) else { continue };
            match std::fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => notes.push(format!("could not remove {rel} (its image is in the database now): {e}")),
            }
        }
        if !moved.is_empty() {
            crate::failpoint::crash("migrate-after-remove");
            c.execute("DELETE FROM legacy_files WHERE moved = 1", [])?;
        }
        // Step 1 for the next batch.
        let skip: Vec<&str> = failed.iter().map(|(id, _)| id.as_str()).collect();
        let mut batch = Vec::new();
        let mut size = 0i64;
        {
            let mut stmt = c.prepare("SELECT id, path, sha256, bytes FROM legacy_files WHERE moved = 0 ORDER BY id")?;
            let rows = stmt.query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, i64>(3)?))
            })?;
            for row in rows {
                let row = row?;
                if skip.contains(&row.0.as_str()) {
                    continue;
                }
                if !batch.is_empty() && size + row.3 > BATCH_BYTES {
                    break;
                }
                size += row.3;
                batch.push(row);
            }
        }
        if batch.is_empty() {
            break;
        }
        c.execute_batch("BEGIN IMMEDIATE")?;
        let step = (|| -> Result<(), StoreError> {
            for (id, rel, sha, bytes) in &batch {
                match read_verified(data_dir, rel, sha, *bytes) {
                    Ok(img) => {
                        crate::store::blobs::insert_blob(c, id, &img)?;
                        c.execute("UPDATE legacy_files SET moved = 1 WHERE id = ?1", [id])?;
                        if rel.starts_with("uploads/") {
                            uploads += 1;
                        } else {
                            artifacts += 1;
                        }
                    }
                    Err(why) => failed.push((id.clone(), format!("{rel}: {why}"))),
                }
            }
            Ok(())
        })();
        match step {
            Ok(()) => c.execute_batch("COMMIT")?,
            Err(e) => {
                let _ = c.execute_batch("ROLLBACK");
                return Err(e);
            }
        }
        crate::failpoint::crash("migrate-after-move");
    }
    if artifacts + uploads > 0 {
        notes.push(format!(
            "moved {artifacts} generated image(s) and {uploads} reference photo(s) from artifacts/ and uploads/ \
             into the database, each verified against its recorded sha256; removed {removed} file(s) after their \
             bytes were committed"
        ));
    }
    for (_, why) in &failed {
        notes.push(format!(
            "could not move {why}; the file (if any) was left where it is and the task keeps its record; \
             put the right file back and start tally again to move it"
        ));
    }
    if failed.is_empty() {
        c.execute_batch("DROP TABLE legacy_files")?;
        notes.extend(tidy_dirs(data_dir));
    }
    Ok(notes)
}

/// Read the file `rel` and check it against the size and sha256 its row recorded.
fn read_verified(data_dir: &Path, rel: &str, sha: &str, bytes: i64) -> Result<NewImage, String> {
    let path = inside(data_dir, rel).ok_or("the recorded path leaves the data directory")?;
    let data = std::fs::read(&path).map_err(|e| format!("cannot read it ({e})"))?;
    if data.len() as i64 != bytes {
        return Err(format!("it has {} bytes, its row records {bytes}", data.len()));
    }
    let img = NewImage::verify(data).map_err(|e| e.to_string())?;
    if img.sha256() != sha {
        return Err("its sha256 differs from the one its row records".into());
    }
    Ok(img)
}

/// Version 2's crash evidence (see the module docs): commit the saved image of an execution
/// that is still `running` (phase `calling` or `accepted`), or a late image of an `unknown`
/// one, and list its file as moved. Each in its own transaction, which re-reads the state it
/// acts on. Returns how many tasks it finished.
fn recover_saved(c: &Connection, data_dir: &Path) -> Result<u64, StoreError> {
    let candidates: Vec<String> = c
        .prepare(
            "SELECT x.token FROM executions x JOIN tasks t ON t.id = x.task_id
             WHERE NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.execution_token = x.token)
               AND ((x.status = 'running' AND x.phase IN ('calling', 'accepted'))
                    OR (x.status = 'unknown' AND t.status = 'unknown'))",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut finished = 0;
    for token in candidates {
        let Some((rel, img)) = saved_image(data_dir, &token) else { continue };
        c.execute_batch("BEGIN IMMEDIATE")?;
        let done = recover_one(c, &token, &rel, img);
        match done {
            Ok(true) => {
                c.execute_batch("COMMIT")?;
                finished += 1;
            }
            Ok(false) => c.execute_batch("ROLLBACK")?,
            Err(e) => {
                let _ = c.execute_batch("ROLLBACK");
                return Err(e);
            }
        }
    }
    Ok(finished)
}

/// A complete image an older version saved for execution `token` (it renamed a file to its final
/// name only after writing and fsyncing it, so a file under that name is complete), verified.
fn saved_image(data_dir: &Path, token: &str) -> Option<(String, NewImage)> {
    ["png", "jpg", "webp"].iter().find_map(|ext| {
        let rel = format!("artifacts/{token}.{ext}");
        let data = std::fs::read(inside(data_dir, &rel)?).ok()?;
        let img = NewImage::verify(data).ok()?;
        (crate::domain::extension(img.media_type()) == *ext).then_some((rel, img))
    })
}

fn recover_one(c: &Connection, token: &str, rel: &str, img: NewImage) -> Result<bool, StoreError> {
    let now = crate::clock::SystemClock.now();
    let row: Option<(String, String, String, Option<String>)> = c
        .query_row(
            "SELECT x.task_id, x.status, t.status, e.status FROM executions x JOIN tasks t ON t.id = x.task_id
             LEFT JOIN envelopes e ON e.task_id = x.task_id
             WHERE x.token = ?1 AND NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.execution_token = x.token)",
            [token],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let Some((task, exec_status, task_status, envelope)) = row else { return Ok(false) };
    let art = NewArtifact::new(img);
    let late = match (exec_status.as_str(), task_status.as_str(), envelope.as_deref()) {
        ("running", "running" | "waiting" | "queued", Some("sent" | "pending")) => false,
        ("unknown", "unknown", _) => true,
        _ => return Ok(false),
    };
    c.execute("UPDATE executions SET status = 'succeeded', finished_at = ?2 WHERE token = ?1", params![token, now])?;
    let tx = &mut SqliteTx::new(c);
    insert_artifact(tx, &task, token, &art, now)?;
    if late {
        let why = crate::domain::words::say("say.late_answer");
        set_task(tx, &task, TaskStatus::Succeeded, Some(&why), None, now)?;
        let msg = "the image this execution had saved before tally was upgraded resolved the unknown outcome";
        event(tx, &task, now, Actor::Reconciler, "late_result", msg, Some(token))?;
    } else {
        let why = crate::domain::words::say("say.recovered_saved");
        set_task(tx, &task, TaskStatus::Succeeded, Some(&why), None, now)?;
        consume_envelope(tx, &task, "consumed", None)?;
        let msg = "found the image saved before the interruption, verified it and finished the task";
        event(tx, &task, now, Actor::Reconciler, "recovered", msg, Some(token))?;
    }
    on_settled(tx, &task, now)?;
    c.execute(
        "INSERT INTO legacy_files (id, path, sha256, bytes, media_type, moved) VALUES (?1, ?2, ?3, ?4, ?5, 1)",
        params![art.id, rel, art.image.sha256(), art.image.len(), art.image.media_type()],
    )?;
    Ok(true)
}

/// After the last file moved: remove an older version's temporary files and the directories if they
/// are empty; name what is left (files no row ever pointed to: not tally's to delete).
fn tidy_dirs(data_dir: &Path) -> Vec<String> {
    let mut notes = Vec::new();
    for dir in DIRS {
        let path = data_dir.join(dir);
        let Ok(entries) = std::fs::read_dir(&path) else { continue };
        let mut left = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with('.') && name.ends_with(".tmp") && std::fs::remove_file(entry.path()).is_ok()) {
                left += 1;
            }
        }
        if left == 0 {
            let _ = std::fs::remove_dir(&path);
        } else {
            notes.push(format!(
                "left {left} file(s) in {} that no task or upload points to (tally no longer uses that directory; \
                 delete them when you are sure you do not need them)",
                path.display()
            ));
        }
    }
    notes
}
