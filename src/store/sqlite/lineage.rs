//! Noticing an older copy of the database (SQLite only): a hand copy of `tally.db` taken while
//! the daemon ran (without its `-wal`), a restored `tally backup`, or a database whose `-wal`
//! was deleted after a crash is consistent but *older*: jobs the original already sent (and
//! was charged for) look queued in it. Serving it as it is would send them again.
//!
//! Two records, one in the database and one beside it:
//! - the `lineage` row in the database: a random id for the database's history, `seq` (one
//!   more in every write transaction that holds a durable operation — the writer's one extra
//!   statement per such batch, `store::sqlite`), `running` (set while `tally serve` serves it,
//!   and checkpointed into the main file at start, so a copy of the file alone taken while it
//!   runs says so) and `backup_at` (set in every copy `tally backup` writes);
//! - the sidecar `tally.db.seen` in the data directory: per lineage, the highest `seq` this
//!   directory has seen. It is rewritten durably (temp file, fsync, rename, fsync of the
//!   directory) at start and at a clean stop, and after every durable commit the new `seq` is
//!   written into it in place, without an fsync ([`Tracker::note`]): a process crash keeps
//!   that write (the page cache survives it), a power loss may lose it, which only makes the
//!   sidecar lag behind the database — never run ahead of a commit that reached the disk,
//!   because with `durability = "full"` the note is written after the fsync of the WAL that
//!   covers the commit (the flusher, `store::sqlite::flush`). With `durability = "normal"`
//!   the notes are fsynced by a thread of their own at most once a second ([`Tracker`]), so a
//!   power loss that takes commits back from the database is noticed unless it came within
//!   that second.
//!
//! [`judge`] decides, at `tally serve` start-up (and for `tally check` / `tally restore`'s
//! forecast): the database is older when its `seq` is below what the sidecar saw for its
//! lineage; without an entry for its lineage, it is *possibly* older when it says a daemon was
//! running it (a copy taken while running, served somewhere else) or that `tally backup` wrote
//! it. What is not older: a crash with the WAL kept (the database has every commit the sidecar
//! noted), a clean stop and start, a power loss with `durability = "full"` (the commit was
//! fsynced before its note). With `durability = "normal"` a power loss can lose commits whose
//! note reached the disk (fsynced within a second); the database is then older in fact (a
//! `calling` may be lost), and holding — with the lost-tail notice — is the right answer.
//!
//! An older database is served with every job that was not settled in it held
//! (`store::held`), and starts a new lineage (it forked from the history the sidecar saw), so
//! that the same copy restored again is noticed again.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::StoreError;
use crate::domain::Millis;

/// The first line of the sidecar file.
const HEADER: &str = "tally-seen 1\n";
/// At most this many lineages are remembered (the newest first).
const MAX_LINEAGES: usize = 32;

/// The sidecar beside the database `db` (`tally.db` → `tally.db.seen`).
pub fn sidecar_path(db: &Path) -> PathBuf {
    let name = db.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| "tally.db".into());
    db.with_file_name(format!("{name}.seen"))
}

/// A new random lineage id.
fn new_lineage() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The database's `lineage` row.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct DbState {
    pub lineage: String,
    pub seq: i64,
    pub running: bool,
    pub backup_at: Option<Millis>,
}

/// Read the `lineage` row (`None` for a database of a schema without it).
pub fn read_state(c: &Connection) -> Result<Option<DbState>, StoreError> {
    let has: bool =
        c.query_row("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'lineage'", [], |r| {
            r.get::<_, i64>(0)
        })? > 0;
    if !has {
        return Ok(None);
    }
    Ok(c.query_row("SELECT lineage, seq, running, backup_at FROM lineage WHERE id = 1", [], |r| {
        Ok(DbState { lineage: r.get(0)?, seq: r.get(1)?, running: r.get::<_, i64>(2)? != 0, backup_at: r.get(3)? })
    })
    .optional()?)
}

/// Mark a copy written by `tally backup` (its own connection, before it is checked and renamed
/// into place), so that serving it later holds what it would send again.
pub(crate) fn mark_backup(c: &Connection, now: Millis) -> Result<(), StoreError> {
    let has: i64 =
        c.query_row("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'lineage'", [], |r| r.get(0))?;
    if has > 0 {
        c.execute("UPDATE lineage SET backup_at = ?1", [now])?;
    }
    Ok(())
}

/// What the data directory has seen: per lineage, the highest `seq` (the current one first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    entries: Vec<(String, i64)>,
}

impl Seen {
    /// Read the sidecar: `Ok(None)` when there is none, an error in words when it cannot be
    /// read or parsed.
    pub fn load(path: &Path) -> Result<Option<Seen>, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let Some(body) = text.strip_prefix(HEADER) else {
            return Err(format!("{} is not a tally sidecar file", path.display()));
        };
        let mut entries = Vec::new();
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            let mut parts = line.split_whitespace();
            let (Some(id), Some(seq), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("{}: a line is malformed", path.display()));
            };
            let seq: i64 = seq.parse().map_err(|_| format!("{}: a sequence number is malformed", path.display()))?;
            entries.push((id.to_string(), seq));
        }
        Ok(Some(Seen { entries }))
    }

    /// The highest `seq` seen for `lineage`.
    pub fn get(&self, lineage: &str) -> Option<i64> {
        self.entries.iter().find(|(l, _)| l == lineage).map(|(_, s)| *s)
    }

    /// Make `lineage` the current one, at least at `seq`.
    fn record(&mut self, lineage: &str, seq: i64) {
        let seq = self.get(lineage).map_or(seq, |s| s.max(seq));
        self.entries.retain(|(l, _)| l != lineage);
        self.entries.insert(0, (lineage.to_string(), seq));
        self.entries.truncate(MAX_LINEAGES);
    }

    fn text(&self) -> String {
        let mut s = HEADER.to_string();
        for (l, seq) in &self.entries {
            s.push_str(&format!("{l} {seq:020}\n"));
        }
        s
    }

    /// Write the whole file durably: a temporary file, fsynced, renamed over the old one, and
    /// the directory fsynced.
    fn save(&self, path: &Path) -> Result<(), StoreError> {
        let io = |what: &str, e: std::io::Error| StoreError::Fatal(format!("{what} {}: {e}", path.display()));
        let tmp = path.with_file_name(format!(
            ".{}.tmp",
            path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
        ));
        let mut f = File::create(&tmp).map_err(|e| io("cannot write", e))?;
        f.write_all(self.text().as_bytes()).map_err(|e| io("cannot write", e))?;
        f.sync_all().map_err(|e| io("cannot fsync", e))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(|e| io("cannot rename into place", e))?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("cannot fsync the directory of", e))
    }
}

/// Why a database is (possibly) older than what it would be served as.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Older {
    /// This data directory saw a later state of the same database: a restored copy or backup,
    /// or a `tally.db-wal` deleted after a crash.
    Behind { seen: i64, has: i64 },
    /// The file says a daemon was running it, and this data directory never saw it: a copy
    /// taken while tally ran, without its newest commits.
    CopiedWhileRunning,
    /// Written by `tally backup` (at this time), and older than what this data directory saw, or
    /// never seen here.
    Backup { at: Millis },
}

impl Older {
    /// The plain-words reason each held job carries.
    pub fn hold_reason(&self) -> String {
        match self {
            Older::Backup { at } => {
                crate::domain::words::say_with("say.held_backup", &[("at", &crate::clock::rfc3339(*at))])
            }
            Older::CopiedWhileRunning => crate::domain::words::say("say.held_copy"),
            Older::Behind { .. } => crate::domain::words::say("say.held_behind"),
        }
    }

    /// What was noticed, in words (start-up, `tally check`, `tally restore`).
    pub fn explain(&self) -> String {
        match self {
            Older::Behind { seen, has } => format!(
                "the database is older than what this data directory has seen (its commit sequence is {has}; this \
                 directory saw {seen}): a restored copy, or a deleted tally.db-wal"
            ),
            Older::CopiedWhileRunning => "the database was copied while a tally daemon was running it, so the newest \
                                          work may be missing from it"
                .to_string(),
            Older::Backup { at } => {
                format!(
                    "the database is a backup taken at {}; work done after that is not in it",
                    crate::clock::rfc3339(*at)
                )
            }
        }
    }
}

/// Is the database (in state `db`) older than what it would be served as, given what the
/// data directory has seen? See the module docs for why each case is what it is.
pub fn judge(db: &DbState, seen: Option<&Seen>) -> Option<Older> {
    if let Some(s) = seen.and_then(|s| s.get(&db.lineage)) {
        if db.seq >= s {
            return None;
        }
        // Older than this directory's own history; a backup says so more exactly.
        return Some(match db.backup_at {
            Some(at) => Older::Backup { at },
            None => Older::Behind { seen: s, has: db.seq },
        });
    }
    if db.running {
        return Some(Older::CopiedWhileRunning);
    }
    db.backup_at.map(|at| Older::Backup { at })
}

/// What serving a database in a data directory would do: whether it is older, and how many
/// jobs would be held (`tally check`, `tally restore`).
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct Forecast {
    pub older: Option<Older>,
    pub would_hold: i64,
    /// Jobs already held in the database.
    pub held: i64,
    /// The sidecar could not be read (then only the database's own marks count).
    pub sidecar_problem: Option<String>,
}

/// The [`Forecast`] for serving the database file `db` as `live_db` (the data directory's
/// database, whose sidecar says what the directory has seen). The sidecar is read before the
/// database, so a daemon committing meanwhile can only make the database look newer.
pub fn forecast(db: &Path, live_db: &Path) -> Result<Forecast, StoreError> {
    let (seen, sidecar_problem) = match Seen::load(&sidecar_path(live_db)) {
        Ok(s) => (s, None),
        Err(e) => (None, Some(e)),
    };
    let c = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    c.busy_timeout(std::time::Duration::from_secs(5))?;
    c.execute_batch("BEGIN")?;
    let Some(state) = read_state(&c)? else { return Ok(Forecast { sidecar_problem, ..Forecast::default() }) };
    let older = judge(&state, seen.as_ref());
    let would_hold = if older.is_some() { crate::store::held::count_holdable(&c)? } else { 0 };
    let held = crate::store::held::count_held(&c)?;
    c.execute_batch("COMMIT")?;
    Ok(Forecast { older, would_hold, held, sidecar_problem })
}

/// Keeps the sidecar up to date while the database is served: [`Tracker::note`] after every
/// durable commit (in place, no fsync), [`Tracker::save`] durably at a clean stop.
///
/// With `durability = "normal"` (no fsync per commit) the notes are also made durable, at most
/// once every [`SIDECAR_SYNC_EVERY`], by a thread that sleeps on a channel until a note
/// arrives ([`Syncer`]): then a power loss that takes commits back from the database finds
/// the sidecar ahead of it and says so (the lost-tail notice), unless the loss came within
/// that interval of their notes. With `"full"` the sidecar needs no fsync of its own: a note
/// follows the fsync of the WAL that covers it, so the database is never behind what a
/// power-cut sidecar kept.
pub(crate) struct Tracker {
    path: PathBuf,
    file: File,
    /// Where the current lineage's `seq` is in the file.
    offset: u64,
    seen: Mutex<Seen>,
    failed: AtomicBool,
    /// The highest `seq` written into the sidecar so far.
    noted: Arc<AtomicI64>,
    /// `durability = "normal"` only: the thread that makes the notes durable.
    syncer: Option<Syncer>,
}

/// How often, at most, the sidecar is fsynced with `durability = "normal"`.
pub(crate) const SIDECAR_SYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The sidecar's fsync thread with `durability = "normal"`: woken by a note (a bounded channel
/// of one: a wake already pending covers the next notes), it waits [`SIDECAR_SYNC_EVERY`] so
/// the notes of a burst share one fsync, then fdatasyncs the sidecar and records the `seq` that
/// fsync covered. Idle when nothing is noted; it ends when the tracker is dropped.
struct Syncer {
    wake: std::sync::mpsc::SyncSender<()>,
    /// The highest `seq` known durable in the sidecar.
    synced: Arc<AtomicI64>,
}

impl Syncer {
    fn start(file: &File, path: &Path, noted: Arc<AtomicI64>, from: i64) -> Result<Syncer, StoreError> {
        let file = file.try_clone().map_err(|e| StoreError::Fatal(format!("cannot open {}: {e}", path.display())))?;
        let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
        let synced = Arc::new(AtomicI64::new(from));
        let done = synced.clone();
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("tally-sidecar".into())
            .spawn(move || {
                let mut warned = false;
                while woken.recv().is_ok() {
                    std::thread::sleep(SIDECAR_SYNC_EVERY);
                    // Every note up to this value was written before this read (and so before
                    // the fsync below covers the file).
                    let upto = noted.load(Ordering::SeqCst);
                    match file.sync_data() {
                        Ok(()) => done.fetch_max(upto, Ordering::SeqCst),
                        Err(e) => {
                            if !std::mem::replace(&mut warned, true) {
                                tracing::warn!(error = %e, path = %shown, "cannot fsync the data directory's sidecar");
                            }
                            continue;
                        }
                    };
                }
            })
            .map_err(|e| StoreError::Fatal(format!("cannot start the sidecar's fsync thread: {e}")))?;
        Ok(Syncer { wake, synced })
    }
}

impl Tracker {
    /// Write `seen` (whose first entry is the current lineage) durably and keep it open; with
    /// `sync_notes` (`durability = "normal"`) start the [`Syncer`].
    fn start(path: &Path, seen: Seen, sync_notes: bool) -> Result<Tracker, StoreError> {
        seen.save(path)?;
        let first = seen.entries.first().map(|(l, _)| l.len()).unwrap_or(0);
        let at = seen.entries.first().map_or(0, |(_, s)| *s);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| StoreError::Fatal(format!("cannot open {}: {e}", path.display())))?;
        let noted = Arc::new(AtomicI64::new(at));
        let syncer = if sync_notes { Some(Syncer::start(&file, path, noted.clone(), at)?) } else { None };
        Ok(Tracker {
            path: path.to_path_buf(),
            file,
            offset: (HEADER.len() + first + 1) as u64,
            seen: Mutex::new(seen),
            failed: AtomicBool::new(false),
            noted,
            syncer,
        })
    }

    /// The writer committed a transaction that took the database to `seq`: write it into the
    /// sidecar in place (one `pwrite` of 20 digits, no fsync). A failure is logged once; the
    /// sidecar then lags, which can only make a later check hold less, never more.
    pub(crate) fn note(&self, seq: i64) {
        if let Some((_, s)) = super::lock(&self.seen).entries.first_mut() {
            *s = (*s).max(seq);
        }
        match self.file.write_at(format!("{seq:020}").as_bytes(), self.offset) {
            Ok(_) => {
                self.noted.fetch_max(seq, Ordering::SeqCst);
                if let Some(s) = &self.syncer {
                    // Full: a wake is pending already, and its fsync comes after this write.
                    let _ = s.wake.try_send(());
                }
            }
            Err(e) => {
                if !self.failed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, path = %self.path.display(), "cannot update the data directory's sidecar");
                }
            }
        }
    }

    /// The `seq` last written into the sidecar, and (`durability = "normal"`) the one known
    /// durable there (`GET /metrics`: `tally_sidecar_seq`).
    pub(crate) fn seqs(&self) -> (i64, Option<i64>) {
        (self.noted.load(Ordering::SeqCst), self.syncer.as_ref().map(|s| s.synced.load(Ordering::SeqCst)))
    }

    /// Rewrite the sidecar durably with the current lineage at `seq`.
    fn save(&self, seq: i64) -> Result<(), StoreError> {
        let mut seen = super::lock(&self.seen);
        if let Some((_, s)) = seen.entries.first_mut() {
            *s = (*s).max(seq);
        }
        seen.save(&self.path)
    }
}

/// What start-up found and did.
#[derive(Debug, Clone, Default)]
pub struct ServeStart {
    /// Why the database is older, if it is.
    pub older: Option<Older>,
    /// Jobs held now (0 when the database is not older).
    pub held: usize,
    /// The sidecar could not be read, in words (start-up then went by the database's marks).
    pub sidecar_problem: Option<String>,
}

impl super::SqliteStore {
    /// Before `tally serve` serves this database (and before start-up recovery): decide
    /// whether it is older than what its data directory has seen ([`judge`]); if so, hold every
    /// job that was not settled in it (`store::held`) and start a new lineage, in one durable
    /// write. Then record the lineage durably in the sidecar, mark the database `running`
    /// (checkpointed into the main file, so a copy of the file alone says so) and keep the
    /// sidecar up to date from the writer. Holding comes first, so a crash anywhere here holds
    /// again at the next start rather than sending.
    pub async fn begin_serving(&self, now: Millis) -> Result<ServeStart, StoreError> {
        let path = sidecar_path(self.path());
        let (seen, sidecar_problem) = match Seen::load(&path) {
            Ok(s) => (s, None),
            Err(e) => (None, Some(e)),
        };
        let Some(state) = self.write_ordered(read_state).await? else {
            return Ok(ServeStart { sidecar_problem, ..ServeStart::default() });
        };
        let older = judge(&state, seen.as_ref());
        let mut held = 0;
        let mut lineage = state.lineage.clone();
        // Until when the lost commits may reach: the sidecar's last note (written after each
        // durable commit), else now.
        let noted_until = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(now, |d| d.as_millis() as Millis);
        if let Some(o) = &older {
            let reason = o.hold_reason();
            let fork = new_lineage();
            let f = fork.clone();
            let lost = match o {
                Older::Behind { seen, has } => Some((*seen, *has)),
                _ => None,
            };
            held = self
                .write(move |c| {
                    if let Some((seen, has)) = lost {
                        lost_tail_notice(c, seen, has, noted_until, now)?;
                    }
                    let n = crate::store::held::hold_unsettled(c, &reason, now)?.len();
                    c.prepare_cached("UPDATE lineage SET lineage = ?1, backup_at = NULL")?.execute([&f])?;
                    Ok(n)
                })
                .await?;
            lineage = fork;
        }
        let seq = self.write_ordered(read_state).await?.map(|s| s.seq).unwrap_or(0);
        let mut seen = seen.unwrap_or_default();
        seen.record(&lineage, seq);
        // No WAL fd to fsync: `durability = "normal"`, whose notes the sidecar fsyncs itself.
        let tracker = Tracker::start(&path, seen, self.inner.wal_inode.is_none())?;
        let _ = self.inner.tracker.set(tracker);
        self.write(|c| Ok(c.prepare_cached("UPDATE lineage SET running = 1, backup_at = NULL")?.execute([])?)).await?;
        // Into the main file, so a copy of tally.db alone taken from now on says "running".
        if let Err(e) = super::open::checkpoint_truncate(self.path()) {
            tracing::warn!(error = %e, "cannot checkpoint the database at start-up");
        }
        Ok(ServeStart { older, held, sidecar_problem })
    }
}

/// Record that a tail of `seen - has` commits was lost (a deleted or lost `tally.db-wal`): how
/// many, the window they were made in (from the newest work the database still has until the
/// sidecar's last note) and the providers configured then (each may have received requests
/// in it, and charged them: their dashboards are where to look). Written in the transaction
/// that holds the unsettled jobs; shown by `GET /v1/held`, `tally held list` and the page.
fn lost_tail_notice(c: &Connection, seen: i64, has: i64, until: Millis, now: Millis) -> Result<(), StoreError> {
    let from: Option<Millis> = c.query_row(
        "SELECT max(t) FROM (SELECT max(updated_at) AS t FROM tasks UNION ALL SELECT max(at) FROM events)",
        [],
        |r| r.get(0),
    )?;
    let mut providers = Vec::new();
    let mut stmt = c.prepare_cached("SELECT name FROM providers WHERE configured = 1 ORDER BY name")?;
    for name in stmt.query_map([], |r| r.get::<_, String>(0))? {
        providers.push(name?);
    }
    let data = serde_json::json!({
        "missing_commits": seen - has,
        "from": from.map(crate::clock::rfc3339),
        "until": crate::clock::rfc3339(until.max(from.unwrap_or(0))),
        "providers": providers,
    });
    c.prepare_cached("INSERT INTO notices (kind, at, data) VALUES ('lost_tail', ?1, ?2)")?
        .execute(rusqlite::params![now, data.to_string()])?;
    Ok(())
}

/// A clean stop of a served database (the writer has stopped): clear `running` with an
/// fsynced commit; the caller then checkpoints; then the sidecar is rewritten durably.
pub(crate) fn end_serving(db: &Path, tracker: &Tracker) -> Result<(), StoreError> {
    let c = Connection::open(db)?;
    c.busy_timeout(std::time::Duration::from_secs(5))?;
    c.pragma_update(None, "synchronous", "FULL")?;
    c.execute("UPDATE lineage SET running = 0", [])?;
    let seq: i64 = c.query_row("SELECT seq FROM lineage", [], |r| r.get(0))?;
    drop(c);
    tracker.save(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(lineage: &str, seq: i64, running: bool, backup_at: Option<Millis>) -> DbState {
        DbState { lineage: lineage.into(), seq, running, backup_at }
    }

    fn seen(entries: &[(&str, i64)]) -> Seen {
        Seen { entries: entries.iter().map(|(l, s)| (l.to_string(), *s)).collect() }
    }

    /// The cases of the module docs, one by one.
    #[test]
    fn judge_holds_only_what_may_have_been_sent_since() {
        let here = seen(&[("a", 10), ("b", 4)]);
        // A crash with the WAL kept, a clean restart: the database has everything noted.
        assert_eq!(judge(&db("a", 10, true, None), Some(&here)), None);
        assert_eq!(judge(&db("a", 11, false, None), Some(&here)), None);
        // A deleted WAL, a restored copy of this directory's own database.
        assert_eq!(judge(&db("a", 7, true, None), Some(&here)), Some(Older::Behind { seen: 10, has: 7 }));
        assert_eq!(judge(&db("b", 3, false, None), Some(&here)), Some(Older::Behind { seen: 4, has: 3 }));
        assert_eq!(judge(&db("b", 3, false, Some(5)), Some(&here)), Some(Older::Backup { at: 5 }));
        // A backup of exactly what this directory saw last.
        assert_eq!(judge(&db("b", 4, false, Some(5)), Some(&here)), None);
        // Never seen here: copied while running, or a backup, or a copy of a stopped daemon.
        assert_eq!(judge(&db("c", 3, true, None), Some(&here)), Some(Older::CopiedWhileRunning));
        assert_eq!(judge(&db("c", 3, false, Some(9)), None), Some(Older::Backup { at: 9 }));
        assert_eq!(judge(&db("c", 3, false, None), None), None);
    }

    #[test]
    fn the_sidecar_round_trips_and_is_updated_in_place() {
        let dir = std::env::temp_dir().join(format!("tally-seen-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = sidecar_path(&dir.join("tally.db"));
        assert_eq!(Seen::load(&path), Ok(None));
        let mut s = seen(&[("old", 3)]);
        s.record("cur", 5);
        let t = Tracker::start(&path, s, false).expect("start");
        t.note(123);
        let back = Seen::load(&path).expect("load").expect("some");
        assert_eq!(back, seen(&[("cur", 123), ("old", 3)]));
        t.save(124).expect("save");
        assert_eq!(Seen::load(&path).expect("load").expect("some").get("cur"), Some(124));
        std::fs::write(&path, "garbage").expect("write");
        assert!(Seen::load(&path).is_err(), "a damaged sidecar is an error, not an empty one");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// With `durability = "normal"` the notes are fsynced by the sidecar's thread: what it
    /// reports durable follows the notes, and nothing is reported before a note.
    #[test]
    fn normal_durability_makes_the_notes_durable_after_a_wake() {
        let dir = std::env::temp_dir().join(format!("tally-seen-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = sidecar_path(&dir.join("tally.db"));
        let t = Tracker::start(&path, seen(&[("cur", 5)]), true).expect("start");
        assert_eq!(t.seqs(), (5, Some(5)));
        for seq in 6..=40 {
            t.note(seq);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let synced = t.syncer.as_ref().map(|s| s.synced.clone()).expect("a syncer");
        std::thread::spawn(move || {
            while synced.load(Ordering::SeqCst) < 40 {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let _ = tx.send(());
        });
        rx.recv_timeout(SIDECAR_SYNC_EVERY * 10).expect("the notes were fsynced");
        assert_eq!(t.seqs(), (40, Some(40)));
        assert_eq!(Seen::load(&path).expect("load").expect("some").get("cur"), Some(40));
        let full = Tracker::start(&sidecar_path(&dir.join("other.db")), seen(&[("x", 1)]), false).expect("start");
        full.note(2);
        assert_eq!(full.seqs(), (2, None), "with full durability the sidecar has no fsync of its own");
        let _ = std::fs::remove_dir_all(dir);
    }
}
