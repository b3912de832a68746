//! The page copy under `tally backup` and `tally restore` (SQLite's backup API in one step,
//! with the kernel's writeback started as it goes), the check of a copy while it is written
//! out, and the file-length check of `tally serve`'s start-up guard (issue #41).

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::whole::{check, io_fatal};
use crate::store::StoreError;
use crate::store::check::CheckReport;

/// Seconds per step of a whole-file operation.
pub(super) struct Phases {
    at: std::time::Instant,
    pub(super) done: Vec<(&'static str, f64)>,
}

impl Phases {
    pub(super) fn start() -> Self {
        Phases { at: std::time::Instant::now(), done: Vec::new() }
    }

    /// The step `name` ended now.
    pub(super) fn mark(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.done.push((name, (now - self.at).as_secs_f64()));
        self.at = now;
    }
}

/// Copy every page of the database `from` reads into a new file at `to` with SQLite's online
/// backup API, in one step: one read transaction on `from` for the whole copy, so the copy is
/// one consistent snapshot (a WAL's committed frames included), page for page — the page
/// size and `auto_vacuum` of the source kept, nothing rebuilt. The copy is written without a
/// journal or fsyncs of its own: it is a temporary file until its caller has checked and
/// fsynced it ([`check_and_sync`]), and is removed on any failure.
pub(super) fn page_copy(from: &Connection, to: &Path) -> Result<(), StoreError> {
    let mut dest = Connection::open(to)?;
    dest.execute_batch("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")?;
    let backup = rusqlite::backup::Backup::new(from, &mut dest)?;
    let _writeback = Writeback::start(to);
    match backup.step(-1)? {
        rusqlite::backup::StepResult::Done => Ok(()),
        other => Err(StoreError::Fatal(format!("the page copy stopped before its end ({other:?})"))),
    }
}

/// While a copy is written, asks the kernel every [`Writeback::EVERY`] to start writing what
/// is already in the file (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`: it starts the
/// writes and waits for none), so the disk works while SQLite copies instead of all at the
/// final fsync — as `cp` then `sync` overlap by the kernel's own writeback. Only a head start:
/// durability still comes from the fsync after the check. Stops when dropped.
struct Writeback {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writeback {
    const EVERY: Duration = Duration::from_millis(100);

    fn start(path: &Path) -> Writeback {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let file = std::fs::OpenOptions::new().write(true).open(path);
        let thread = file.ok().and_then(|file| {
            std::thread::Builder::new()
                .name("tally-writeback".into())
                .spawn(move || {
                    // The channel is the stop signal and the pace: a message or a hang-up ends it.
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(Self::EVERY) {
                        start_writeback(&file);
                    }
                })
                .ok()
        });
        Writeback { stop: Some(stop), thread }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Start writing `file`'s dirty pages to disk without waiting (a hint; errors are left to the
/// fsync that follows).
#[cfg(target_os = "linux")]
fn start_writeback(file: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call only starts write-out of its pages.
    unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &std::fs::File) {}

/// [`check`] the file at `path` while the kernel writes it to disk (an fsync on a thread of
/// its own: the check reads the just-written pages from the page cache, so the two overlap),
/// then fsync it once more to be sure of the whole. Returns the report and the file's size.
pub(super) fn check_and_sync(path: &Path, phases: &mut Phases) -> Result<(CheckReport, u64), StoreError> {
    let file = std::fs::File::open(path).map_err(|e| io_fatal("cannot reopen the copy", e))?;
    let (report, flushed) = std::thread::scope(|s| {
        let flushing = s.spawn(|| file.sync_all());
        let report = check(path);
        phases.mark("check");
        (report, flushing.join())
    });
    let report = report?;
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(io_fatal("cannot fsync the copy", e)),
        Err(_) => return Err(StoreError::Fatal("the fsync thread panicked".into())),
    }
    file.sync_all().map_err(|e| io_fatal("cannot fsync the copy", e))?;
    phases.mark("fsync");
    let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok((report, bytes))
}

/// Whether the database file is shorter than its header says it is: a copy cut short. The
/// header's page count (bytes 28–31) is trusted only when SQLite marked it valid (bytes 92–95
/// equal the change counter, bytes 24–27), as SQLite itself does; pages a WAL adds beyond it
/// are in the WAL, not in this file. `None` when the file is long enough or the count is not
/// valid (SQLite then takes the file's length as the truth).
pub(super) fn cut_short(db: &Path) -> Option<String> {
    use std::io::Read;
    let mut header = [0u8; 100];
    let mut f = std::fs::File::open(db).ok()?;
    f.read_exact(&mut header).ok()?;
    let len = f.metadata().ok()?.len();
    let be = |at: usize| u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536u64,
        n => u64::from(n),
    };
    let pages = u64::from(be(28));
    if be(92) != be(24) || pages == 0 || len >= pages * page_size {
        return None;
    }
    Some(format!(
        "the file is {len} bytes, but its header says {} ({pages} pages of {page_size}): it was cut short",
        pages * page_size
    ))
}
