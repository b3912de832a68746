//! The `folder` target: files written into a local directory, durably and never over another
//! file. Blocking file work; [`super::target::Target`] runs it off the async runtime.
//!
//! A write ([`FolderTarget::put`]): the bytes go to a temporary name in the same directory
//! (`.NAME.tally-tmp-PID-N`), are fsynced, then moved to NAME with a move that refuses to
//! replace anything (`renameat2(RENAME_NOREPLACE)`; where the file system does not support
//! it, a hard link then removal of the temporary name, which refuses the same way), and the
//! directory is fsynced so the new name survives a power cut.
//!
//! Invariants, enforced here: an existing NAME is never replaced, whatever it holds (same
//! sha256: [`Put::AlreadyThere`]; other bytes: [`Put::Different`], left alone); no temporary
//! file is left behind by a write that fails, except after a crash of the process itself
//! (then a later write of that name does not reuse it: the temporary names carry the process
//! id and a counter, and they start with `.` so they are not taken for delivered files; the
//! next write of that name removes such a leftover once it is surely dead — see
//! [`sweep_leftovers`] —, and a delivery that resumed removes its own once it ends — see
//! [`FolderTarget::sweep`]);
//! when `put` answers [`Put::Written`], the file and its name are on disk (fsynced).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::target::{Look, Put, TargetError};
use crate::domain::words::say_with;

/// A local directory files are delivered into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FolderTarget {
    /// The target's name (`[[delivery.targets]] name`).
    pub name: String,
    /// The directory; created (with its parents) on the first write when missing.
    pub path: PathBuf,
    /// How long one write may take (`timeout_ms`), applied by [`super::target::Target`].
    pub timeout: Duration,
}

/// Where in a write a test makes it fail (unit tests only).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// After the temporary file is written and fsynced, before it is moved into place.
    BeforeMove,
}

/// Counts temporary names made by this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl FolderTarget {
    /// Write `bytes` (whose lowercase hex sha256 is `sha256`) as `name` in the folder; see the
    /// module doc. `name` must be a plain file name (no separator, not starting with `.`), as
    /// [`super::names`] makes them; another is refused as [`TargetError::Permanent`].
    /// Errors: a full disk or quota is `Transient`; no permission, a read-only file system, a
    /// path that is not a directory, `Permanent`; a failure after the file took its name (the
    /// directory's fsync) is `Ambiguous` (look before writing again).
    pub fn put(&self, name: &str, bytes: &[u8], sha256: &str) -> Result<Put, TargetError> {
        self.put_inner(name, bytes, sha256, None)
    }

    /// Write `bytes` as `name`, replacing whatever file is there (temporary name, fsync,
    /// rename, fsync the directory): only for a delivery's manifest, which a later delivery to
    /// the same folder rewrites. Never used for an image (those go through [`Self::put`]).
    pub fn replace(&self, name: &str, bytes: &[u8]) -> Result<(), TargetError> {
        check_file_name(name)?;
        let dir = &self.path;
        fs::create_dir_all(dir)
            .map_err(|e| classify(&e, &say_with("say.cannot_create_folder", &[("dir", &dir.display().to_string())])))?;
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tally-tmp-{}-{n}", std::process::id()));
        let guard = TempGuard(Some(tmp.clone()));
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, dir.join(name))
        };
        write().map_err(|e| {
            classify(&e, &say_with("say.cannot_write_in", &[("name", name), ("dir", &dir.display().to_string())]))
        })?;
        drop(guard);
        sync_dir(dir).map_err(|e| classify(&e, &format!("cannot sync {}", dir.display())))
    }

    /// What is at `name`: [`Look::Absent`], or [`Look::Present`] with the sha256 of its bytes.
    /// Something that is not a regular file (a directory) is [`Look::CannotTell`].
    pub fn look(&self, name: &str) -> Result<Look, TargetError> {
        check_file_name(name)?;
        let path = self.path.join(name);
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Look::Absent),
            Err(e) => Err(classify(&e, &format!("cannot look at {}", path.display()))),
            Ok(m) if !m.is_file() => {
                Ok(Look::CannotTell(format!("{} is there but is not a regular file", path.display())))
            }
            Ok(_) => match file_sha256(&path) {
                Ok(sha256) => Ok(Look::Present { sha256, remote_id: None }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Look::Absent),
                Err(e) => Err(classify(&e, &format!("cannot read {}", path.display()))),
            },
        }
    }

    fn put_inner(
        &self,
        name: &str,
        bytes: &[u8],
        sha256: &str,
        #[cfg(test)] fault: Option<Fault>,
        #[cfg(not(test))] _fault: Option<()>,
    ) -> Result<Put, TargetError> {
        check_file_name(name)?;
        let dir = &self.path;
        if let Ok(m) = fs::metadata(dir)
            && !m.is_dir()
        {
            return Err(TargetError::Permanent(say_with("say.not_a_folder", &[("path", &dir.display().to_string())])));
        }
        if !dir.is_dir() {
            fs::create_dir_all(dir).map_err(|e| {
                classify(&e, &say_with("say.cannot_create_folder", &[("dir", &dir.display().to_string())]))
            })?;
            // The new folder's own name must survive a power cut too.
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(parent).map_err(|e| classify(&e, &format!("cannot sync {}", parent.display())))?;
            }
        }
        let path = dir.join(name);
        sweep_leftovers(dir, name, self.timeout);
        // Already there? Then nothing is written (the move below would refuse anyway; this
        // spares writing a temporary copy).
        if let Some(answer) = existing(&path, sha256)? {
            return Ok(answer);
        }
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tally-tmp-{}-{n}", std::process::id()));
        let guard = TempGuard(Some(tmp.clone()));
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()
        };
        write().map_err(|e| {
            classify(&e, &say_with("say.cannot_write_in", &[("name", name), ("dir", &dir.display().to_string())]))
        })?;
        // A crash here leaves the temporary file behind (the process dies with its guard).
        crate::failpoint::crash("deliver-folder-after-temp");
        #[cfg(test)]
        if fault == Some(Fault::BeforeMove) {
            return Err(TargetError::Transient("injected fault before the move".into()));
        }
        match move_no_replace(&tmp, &path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                drop(guard);
                // Someone put a file of that name there since the look above.
                return existing(&path, sha256)?.ok_or_else(|| {
                    TargetError::Transient(format!("{} appeared and vanished while writing; try again", path.display()))
                });
            }
            Err(e) => {
                return Err(classify(
                    &e,
                    &say_with("say.cannot_move_into_place", &[("name", name), ("dir", &dir.display().to_string())]),
                ));
            }
        }
        // The temporary name is gone (renamed) or is a second link to the delivered file: the
        // guard removes that link, leaving the file under its name.
        drop(guard);
        sync_dir(dir).map_err(|e| {
            TargetError::Ambiguous(format!(
                "{} was written but the folder could not be synced ({e}); it may not survive a power cut — look \
                 before writing again",
                path.display()
            ))
        })?;
        Ok(Put::Written)
    }

    /// Remove the temporary files of `names` (a delivery's files and manifests) that an
    /// earlier, killed run left here: once a resumed delivery has ended, its leftovers go at
    /// once, not only when the same name is written again after `timeout`. A leftover goes
    /// only when it is surely dead and surely that earlier run's: its process id is not this
    /// process and no process of that id exists on this machine, and it was last written
    /// before `before` (when this run took the delivery). Best effort; answers how many went.
    pub fn sweep(&self, names: &[String], before: std::time::SystemTime) -> usize {
        let Ok(entries) = fs::read_dir(&self.path) else { return 0 };
        let mut removed = 0;
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(pid) = file.to_str().and_then(|f| names.iter().find_map(|n| leftover_pid(f, n))) else {
                continue;
            };
            let earlier = entry.metadata().ok().and_then(|m| m.modified().ok()).is_some_and(|t| t < before);
            if pid != std::process::id() && earlier && !process_exists(pid) && fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

/// The process id in `file` when it is a temporary name of `name` (`.NAME.tally-tmp-PID-N`).
fn leftover_pid(file: &str, name: &str) -> Option<u32> {
    let rest = file.strip_prefix('.')?.strip_prefix(name)?.strip_prefix(".tally-tmp-")?;
    let (pid, n) = rest.split_once('-')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse::<u32>().ok()
}

/// Remove the temporary files of `name` that a killed process left in `dir` (a delivery
/// resumed after a crash writes the name again). Only a leftover that is surely dead goes: its
/// process id is not this process and no process of that id exists on this machine, and it
/// was last written longer ago than one write may take (`timeout`), so neither a write of
/// this process nor one of another live process — on this machine, or on another one sharing
/// the folder, whose ids mean nothing here — can lose its file. Best effort: a leftover that
/// cannot be removed stays, and the write goes on (it never reuses the name).
fn sweep_leftovers(dir: &Path, name: &str, timeout: Duration) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(pid) = file.to_str().and_then(|f| leftover_pid(f, name)) else { continue };
        let old = entry
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > timeout);
        if pid != std::process::id() && old && !process_exists(pid) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Whether a process with this id exists on this machine (`kill(pid, 0)`: only `ESRCH` says
/// it does not; no permission to signal it means it exists).
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return true };
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes a temporary file when dropped (after a failure, or the hard link after a move).
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            // Best effort: gone already (renamed) is the usual case.
            let _ = fs::remove_file(p);
        }
    }
}

/// What a file already at `path` means for a write of `sha256`: `None` when nothing is there.
fn existing(path: &Path, sha256: &str) -> Result<Option<Put>, TargetError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(classify(&e, &format!("cannot look at {}", path.display()))),
        Ok(m) if !m.is_file() => {
            return Err(TargetError::Permanent(format!(
                "{} is in the way: it is there and is not a regular file",
                path.display()
            )));
        }
        Ok(_) => {}
    }
    match file_sha256(path) {
        Ok(there) if there.eq_ignore_ascii_case(sha256) => Ok(Some(Put::AlreadyThere)),
        Ok(there) => Ok(Some(Put::Different { existing_sha256: Some(there) })),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(classify(&e, &format!("cannot read {}", path.display()))),
    }
}

/// A name the folder accepts: a plain file name, as `delivery::names` makes them.
fn check_file_name(name: &str) -> Result<(), TargetError> {
    if name.is_empty()
        || name.len() > 255
        || name.starts_with('.')
        || name.contains(['/', '\\', '\0'])
        || name.chars().any(char::is_control)
    {
        return Err(TargetError::Permanent(format!(
            "`{name}` is not a plain file name (no path separators, not starting with '.')"
        )));
    }
    Ok(())
}

/// The lowercase hex sha256 of a file, read in chunks.
fn file_sha256(path: &Path) -> io::Result<String> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(crate::domain::hex(&h.finalize()))
}

/// Move `from` to `to`, failing with `AlreadyExists` rather than replacing `to`. Linux:
/// `renameat2(RENAME_NOREPLACE)`; where the file system refuses that flag, or elsewhere, a
/// hard link (which also fails when `to` exists) — the caller removes `from` afterwards.
fn move_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
        let (f, t) = (c(from)?, c(to)?);
        // SAFETY: both are valid NUL-terminated paths that live across the call.
        let rc =
            unsafe { libc::renameat2(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), libc::RENAME_NOREPLACE) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::ENOTSUP)) {
            return Err(e);
        }
    }
    fs::hard_link(from, to)
}

/// fsync a directory, so the names in it survive a power cut.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// An I/O error as a target error: what trying again can fix is `Transient`.
fn classify(e: &io::Error, what: &str) -> TargetError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => TargetError::Transient(say_with("say.disk_full", &[("what", what)])),
        Some(libc::EDQUOT) => TargetError::Transient(say_with("say.disk_quota", &[("what", what)])),
        Some(libc::EACCES | libc::EPERM) => {
            TargetError::Permanent(say_with("say.permission_denied", &[("what", what)]))
        }
        Some(libc::EROFS) => TargetError::Permanent(say_with("say.read_only", &[("what", what)])),
        Some(libc::ENOTDIR | libc::EISDIR | libc::ENAMETOOLONG | libc::ELOOP | libc::EINVAL) => {
            TargetError::Permanent(format!("{what}: {e}"))
        }
        _ => TargetError::Transient(format!("{what}: {e}")),
    }
}

#[cfg(test)]
#[path = "folder_tests.rs"]
mod tests;
