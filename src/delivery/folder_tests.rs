//! Tests of the folder target: the files on disk after each kind of write, including failures
//! of the real file system (a full and a read-only tmpfs, which root cannot write past).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::*;
use crate::delivery::render::sha256_hex;

fn temp(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tally-folder-{tag}-{}", uuid::Uuid::new_v4()))
}

fn target(path: &Path) -> FolderTarget {
    FolderTarget { name: "out".into(), path: path.to_path_buf(), timeout: Duration::from_secs(30) }
}

/// Every entry in `dir`, temporary ones included, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

#[test]
fn a_write_lands_under_its_name_and_nothing_else() {
    let dir = temp("write").join("nested/twice");
    let t = target(&dir);
    let bytes = b"a listing-ready image".to_vec();
    let sha = sha256_hex(&bytes);
    assert_eq!(t.look("a.jpg"), Ok(Look::Absent));
    assert_eq!(t.put("a.jpg", &bytes, &sha), Ok(Put::Written));
    assert_eq!(fs::read(dir.join("a.jpg")).expect("written"), bytes);
    assert_eq!(listing(&dir), ["a.jpg"]);
    assert_eq!(t.look("a.jpg"), Ok(Look::Present { sha256: sha.clone(), remote_id: None }));
    // The same bytes again: already there, nothing written.
    assert_eq!(t.put("a.jpg", &bytes, &sha), Ok(Put::AlreadyThere));
    assert_eq!(listing(&dir), ["a.jpg"]);
}

#[test]
fn a_different_file_is_never_overwritten() {
    let dir = temp("different");
    fs::create_dir_all(&dir).expect("dir");
    fs::write(dir.join("a.jpg"), b"the owner's own file").expect("seed");
    let t = target(&dir);
    let bytes = b"ours".to_vec();
    let answer = t.put("a.jpg", &bytes, &sha256_hex(&bytes));
    assert_eq!(answer, Ok(Put::Different { existing_sha256: Some(sha256_hex(b"the owner's own file")) }));
    assert_eq!(fs::read(dir.join("a.jpg")).expect("still there"), b"the owner's own file");
    assert_eq!(listing(&dir), ["a.jpg"]);
}

#[test]
fn a_file_appearing_between_the_look_and_the_move_is_not_replaced() {
    let dir = temp("race");
    fs::create_dir_all(&dir).expect("dir");
    let (tmp, to) = (dir.join(".tmp"), dir.join("a.jpg"));
    fs::write(&tmp, b"ours").expect("tmp");
    fs::write(&to, b"theirs").expect("theirs");
    let e = move_no_replace(&tmp, &to).expect_err("must refuse");
    assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
    assert_eq!(fs::read(&to).expect("kept"), b"theirs");
}

#[test]
fn names_that_are_not_plain_file_names_are_refused() {
    let dir = temp("names");
    let t = target(&dir.join("inner"));
    for bad in ["../escape.jpg", "a/b.jpg", ".hidden.jpg", "", "..", "a\\b.jpg", "a\nb.jpg"] {
        match t.put(bad, b"x", &sha256_hex(b"x")) {
            Err(TargetError::Permanent(why)) => {
                assert!(crate::domain::words::english(&why).contains("plain file name"), "{bad:?}: {why}")
            }
            other => panic!("{bad:?}: {other:?}"),
        }
        assert!(matches!(t.look(bad), Err(TargetError::Permanent(_))), "{bad:?}");
    }
    assert_eq!(listing(&dir), Vec::<String>::new(), "nothing written, not even the folder");
}

#[test]
fn a_failure_before_the_move_leaves_no_temporary_file() {
    let dir = temp("fault");
    let t = target(&dir);
    let e = t.put_inner("a.jpg", b"bytes", &sha256_hex(b"bytes"), Some(Fault::BeforeMove)).expect_err("fault");
    assert!(matches!(e, TargetError::Transient(_)), "{e:?}");
    assert_eq!(listing(&dir), Vec::<String>::new());
    // A later write of the same name works.
    assert_eq!(t.put("a.jpg", b"bytes", &sha256_hex(b"bytes")), Ok(Put::Written));
    assert_eq!(listing(&dir), ["a.jpg"]);
}

/// A process id no process has: a child that was started and waited for (its id is free
/// until the system hands it out again, which a test's few milliseconds do not reach).
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    child.wait().expect("wait");
    pid
}

/// A temporary file as a write of `name` by process `pid` leaves it, last written `age` ago.
fn leftover(dir: &Path, name: &str, pid: u32, age: Duration) -> String {
    let file = format!(".{name}.tally-tmp-{pid}-7");
    let f = File::create(dir.join(&file)).expect("create leftover");
    f.set_modified(std::time::SystemTime::now() - age).expect("set mtime");
    file
}

#[test]
fn a_write_removes_the_leftovers_of_a_killed_write_of_that_name_and_only_those() {
    let dir = temp("sweep");
    fs::create_dir_all(&dir).expect("dir");
    let t = target(&dir); // one write may take 30 s
    let long_ago = Duration::from_secs(3600);
    let dead = leftover(&dir, "a.jpg", dead_pid(), long_ago);
    // Not surely dead: this process's own, a live process's (pid 1), a recent one (a write of
    // another machine sharing the folder may be under way), another name's.
    let ours = leftover(&dir, "a.jpg", std::process::id(), long_ago);
    let live = leftover(&dir, "a.jpg", 1, long_ago);
    let recent = leftover(&dir, "a.jpg", dead_pid(), Duration::from_secs(1));
    let other = leftover(&dir, "b.jpg", dead_pid(), long_ago);
    let odd = ".a.jpg.tally-tmp-notapid-1".to_string();
    File::create(dir.join(&odd)).expect("odd");

    assert_eq!(t.put("a.jpg", b"bytes", &sha256_hex(b"bytes")), Ok(Put::Written));
    let left = listing(&dir);
    assert!(!left.contains(&dead), "the dead write's leftover is removed: {left:?}");
    for kept in [&ours, &live, &recent, &other, &odd] {
        assert!(left.contains(kept), "{kept} is kept: {left:?}");
    }
    assert!(left.contains(&"a.jpg".to_string()));
    // Also when the file is already there (a resumed delivery finds it delivered).
    let dead_again = leftover(&dir, "a.jpg", dead_pid(), long_ago);
    assert_eq!(t.put("a.jpg", b"bytes", &sha256_hex(b"bytes")), Ok(Put::AlreadyThere));
    assert!(!listing(&dir).contains(&dead_again));
}

#[test]
fn a_path_that_is_a_file_or_a_directory_in_the_way_is_permanent() {
    let dir = temp("notdir");
    fs::create_dir_all(&dir).expect("dir");
    fs::write(dir.join("file"), b"x").expect("file");
    let t = target(&dir.join("file"));
    assert!(matches!(t.put("a.jpg", b"x", &sha256_hex(b"x")), Err(TargetError::Permanent(_))));
    fs::create_dir(dir.join("a.jpg")).expect("a dir named like the file");
    let t = target(&dir);
    match t.put("a.jpg", b"x", &sha256_hex(b"x")) {
        Err(TargetError::Permanent(why)) => {
            assert!(crate::domain::words::english(&why).contains("in the way"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(t.look("a.jpg"), Ok(Look::CannotTell(_))));
    assert_eq!(listing(&dir), ["a.jpg", "file"]);
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mount a `size`-byte tmpfs; `None` (after saying so on stderr) where mounting is not
    /// permitted outside CI; under `CI=true` that is a failure.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = temp("tmpfs");
        fs::create_dir_all(&dir).expect("mount point");
        let (src, target, kind) = (c("tmpfs"), c(dir.as_os_str().as_bytes()), c("tmpfs"));
        let data = c(format!("size={size},mode=0755").as_bytes());
        // SAFETY: all arguments are valid NUL-terminated strings that live across the call.
        let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), kind.as_ptr(), 0, data.as_ptr().cast()) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!(
                    "cannot mount a tmpfs for the full-disk test ({e}); CI must run tests as root with mount rights"
                );
            }
            eprintln!("NOT RUN: the full-disk/read-only folder test needs to mount a tmpfs ({e})");
            return None;
        }
        Some(Tmpfs(dir))
    }

    fn remount_read_only(&self) {
        let target = c(self.0.as_os_str().as_bytes());
        let flags = libc::MS_REMOUNT | libc::MS_RDONLY;
        // SAFETY: valid strings; null source and type are allowed for a remount.
        let rc = unsafe { libc::mount(std::ptr::null(), target.as_ptr(), std::ptr::null(), flags, std::ptr::null()) };
        assert_eq!(rc, 0, "remount read-only: {}", io::Error::last_os_error());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = c(self.0.as_os_str().as_bytes());
        // SAFETY: a valid path string.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        let _ = fs::remove_dir(&self.0);
    }
}

fn c(bytes: impl AsRef<[u8]>) -> CString {
    CString::new(bytes.as_ref()).expect("no NUL")
}

#[test]
fn a_full_disk_is_transient_and_a_read_only_one_permanent_and_neither_leaves_a_file() {
    let Some(fs_) = Tmpfs::mount("64k") else { return };
    let t = target(&fs_.0.join("out"));
    let big = vec![7u8; 512 * 1024];
    match t.put("big.jpg", &big, &sha256_hex(&big)) {
        Err(TargetError::Transient(why)) => {
            assert!(crate::domain::words::english(&why).contains("disk is full"), "{why}")
        }
        other => panic!("a write larger than the disk: {other:?}"),
    }
    assert_eq!(listing(&fs_.0.join("out")), Vec::<String>::new(), "no stray temporary file");
    // The space came back: a small file fits.
    assert_eq!(t.put("small.jpg", b"small", &sha256_hex(b"small")), Ok(Put::Written));
    fs_.remount_read_only();
    match t.put("other.jpg", b"other", &sha256_hex(b"other")) {
        Err(TargetError::Permanent(why)) => assert!(crate::domain::words::english(&why).contains("read-only"), "{why}"),
        other => panic!("a write to a read-only file system: {other:?}"),
    }
    // What is there can still be looked at and recognised.
    assert_eq!(t.put("small.jpg", b"small", &sha256_hex(b"small")), Ok(Put::AlreadyThere));
    assert_eq!(listing(&fs_.0.join("out")), ["small.jpg"]);
}
