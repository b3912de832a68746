//! The delivery crash matrix (issue #26): every crash point of a delivery
//! (`engine::deliver::DELIVERY_POINTS`) × each target kind (`folder`; `s3` on a real
//! S3-compatible server, moto) × each backend (SQLite; PostgreSQL, one node restarted under
//! its name).
//!
//! A cell: a two-shot set on the demo provider, both images chosen, delivered with the
//! `original` profile (so the right bytes are known independently: the chosen images' sha256)
//! to a target of its own (a folder, or a key prefix in the bucket). The daemon aborts at the
//! point, the way SIGKILL would; the outside world at that moment is what the point says
//! (how many files landed, whether the manifest did). Restarted without crash points, the
//! daemon resumes the delivery, which ends `delivered`, and the outside world is read back,
//! not only the API: exactly the two files and the manifests (the delivery's own
//! `manifest-ID.*`, and `manifest.*`) are at the target, each file
//! once with the chosen image's sha256; nothing was written twice or over (a file already
//! there at the crash keeps its inode and modification time; moto's log shows one accepted
//! PUT per file); no temporary file is left; `manifest.csv` and `manifest.json` list exactly
//! the files with their sha256 and bytes; and each item's recorded attempts are what the
//! point implies (written again only when nothing was there to find).
//!
//! Table-driven: one test per target kind × backend runs every point in turn on one data
//! directory (and one moto), so a cell costs a daemon start and a restart. A point added to
//! `DELIVERY_POINTS` without an expectation here fails the matrix.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use tally::engine::deliver::DELIVERY_POINTS;

use crate::common::{Daemon, FAST_DEMO, TempDir, sha256_hex, wait_for};
use crate::deliveries::{chosen_set, deliver, ended};
use crate::delivery_s3::Moto;

#[test]
fn folder_on_sqlite() {
    matrix(Kind::Folder, false);
}

#[test]
fn folder_on_postgres() {
    matrix(Kind::Folder, true);
}

#[test]
fn s3_on_sqlite() {
    matrix(Kind::S3, false);
}

#[test]
fn s3_on_postgres() {
    matrix(Kind::S3, true);
}

/// What a crash at `point` leaves at the target (how many of the two item files, whether the
/// manifest), and each item's attempts once the delivery ended.
fn expected(point: &str) -> (usize, bool, [i64; 2]) {
    match point {
        // Held, nothing recorded or written: both items are written once after the restart.
        "deliver-after-claim" => (0, false, [1, 1]),
        // Item 0 recorded `writing`, nothing written: the restart looks, finds nothing, writes.
        "deliver-after-writing" => (0, false, [2, 1]),
        // Item 0 written, not confirmed: the restart looks and finds it (same sha256).
        "deliver-after-put" => (1, false, [1, 1]),
        // Item 0 confirmed: only item 1 is left.
        "deliver-after-confirm" => (1, false, [1, 1]),
        // Every item confirmed and the manifest written; the delivery's own state not.
        "deliver-after-manifest" => (2, true, [1, 1]),
        other => panic!("the delivery crash matrix has no expectation for the point {other}"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Folder,
    S3,
}

/// Where the cells' files go, and how the test reads them back (independently of tally).
struct Place {
    kind: Kind,
    /// Folder: each point's folder is `root/POINT`.
    root: PathBuf,
    /// S3: each point's prefix is `POINT/`.
    moto: Option<Moto>,
}

impl Place {
    /// The `[[delivery.targets]]` entry of point `i`'s target, `t{i}`.
    fn target_toml(&self, i: usize, point: &str) -> String {
        match (self.kind, &self.moto) {
            (Kind::S3, Some(m)) => format!(
                "[[delivery.targets]]\nname = \"t{i}\"\nkind = \"s3\"\nendpoint = \"{}\"\nregion = \"us-east-1\"\n\
                 bucket = \"{}\"\nprefix = \"{point}/\"\naccess_key_id_env = \"TALLY_TEST_S3_KEY\"\n\
                 secret_access_key_env = \"TALLY_TEST_S3_SECRET\"\ntimeout_ms = 10000\n\n",
                m.endpoint(),
                m.bucket
            ),
            _ => format!(
                "[[delivery.targets]]\nname = \"t{i}\"\nkind = \"folder\"\npath = \"{}\"\n\n",
                self.root.join(point).display()
            ),
        }
    }

    /// Every file at point `point`'s target by name, and the temporary files left there.
    fn files(&self, point: &str) -> (BTreeMap<String, Vec<u8>>, Vec<String>) {
        let mut files = BTreeMap::new();
        let mut temps = Vec::new();
        match &self.moto {
            Some(m) => {
                let prefix = format!("{point}/");
                for (key, (bytes, meta)) in m.objects(&prefix) {
                    let name = key.strip_prefix(&prefix).unwrap_or(&key).to_string();
                    if let Some(meta) = meta {
                        assert_eq!(meta, sha256_hex(&bytes), "{point}: {name}'s sha256 metadata is not its bytes'");
                    }
                    files.insert(name, bytes);
                }
            }
            None => {
                let dir = self.root.join(point);
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.starts_with('.') {
                        temps.push(name);
                    } else {
                        files.insert(name, std::fs::read(e.path()).expect("read a delivered file"));
                    }
                }
            }
        }
        (files, temps)
    }

    /// A folder file's inode and modification time (what a rewrite would change).
    fn stamp(&self, point: &str, name: &str) -> Option<(u64, SystemTime)> {
        let m = std::fs::metadata(self.root.join(point).join(name)).ok()?;
        Some((std::os::unix::fs::MetadataExt::ino(&m), m.modified().ok()?))
    }
}

/// Every delivery crash point in turn for one target kind and backend (see the module docs).
fn matrix(kind: Kind, postgres: bool) {
    let moto = (kind == Kind::S3).then(Moto::start);
    let tmp = TempDir::new();
    let place = Place { kind, root: tmp.path().join("out"), moto };
    let targets: String = DELIVERY_POINTS.iter().enumerate().map(|(i, p)| place.target_toml(i, p)).collect();
    let mut d = Daemon::configure(&format!("{FAST_DEMO}\n{targets}"));
    if postgres && d.on_postgres("deliver-crash").is_none() {
        return;
    }
    if let Some(m) = &place.moto {
        d.env.push(("TALLY_TEST_S3_KEY".into(), m.creds.access_key_id.clone()));
        d.env.push(("TALLY_TEST_S3_SECRET".into(), m.creds.secret_access_key.clone()));
    }
    let on = if postgres { "postgres" } else { "sqlite" };
    let started = Instant::now();
    for (i, point) in DELIVERY_POINTS.iter().copied().enumerate() {
        let cell = format!("{kind:?} on {on}, {point}");
        let (at_crash, manifest_at_crash, attempts) = expected(point);
        d.env.push(("FAILPOINTS".into(), format!("{point}=return")));
        d.spawn();
        let (set, arts) = chosen_set(&d, true);
        let id = deliver(&d, &set, "original", &format!("t{i}"), false);
        let exited = wait_for(Duration::from_secs(30), || d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()));
        assert!(exited.is_some_and(|s| !s.success()), "{cell}: the crash point never fired; stderr:\n{}", d.stderr());
        assert!(d.stderr().contains(&format!("crash point {point} reached")), "{cell}: {}", d.stderr());
        d.child = None;

        // The outside world at the crash.
        let (files, temps) = place.files(point);
        let items_there = files.keys().filter(|n| !n.starts_with("manifest")).count();
        assert_eq!(items_there, at_crash, "{cell}: files at the crash: {:?}", files.keys());
        assert_eq!(files.contains_key("manifest.json"), manifest_at_crash, "{cell}: {:?}", files.keys());
        assert!(temps.is_empty(), "{cell}: temporary files at the crash: {temps:?}");
        let stamps: BTreeMap<String, _> =
            files.keys().filter_map(|n| place.stamp(point, n).map(|s| (n.clone(), s))).collect();

        // Restart without crash points: the delivery resumes and ends.
        d.env.retain(|(k, _)| k != "FAILPOINTS");
        d.spawn();
        let done = ended(&d, &id);
        assert_eq!(done["state"], "delivered", "{cell}: {done}");
        let items = done["items"].as_array().expect("items").clone();
        let (files, temps) = place.files(point);
        assert!(temps.is_empty(), "{cell}: temporary files left: {temps:?}");
        let mut want: BTreeSet<String> =
            items.iter().map(|i| i["file_name"].as_str().expect("name").to_string()).collect();
        assert_eq!(want.len(), 2, "{cell}: two distinct file names: {done}");
        want.extend(["manifest.csv".to_string(), "manifest.json".to_string()]);
        want.extend([format!("manifest-{id}.csv"), format!("manifest-{id}.json")]);
        assert_eq!(files.keys().cloned().collect::<BTreeSet<_>>(), want, "{cell}: what is at the target");
        for ((item, (_, sha)), tries) in items.iter().zip(&arts).zip(attempts) {
            let name = item["file_name"].as_str().expect("name");
            assert_eq!(item["state"], "delivered", "{cell}: {item}");
            assert_eq!(item["sha256"].as_str(), Some(sha.as_str()), "{cell}: {item}");
            assert_eq!(&sha256_hex(&files[name]), sha, "{cell}: {name} is not the chosen image");
            assert_eq!(item["bytes"].as_u64(), Some(files[name].len() as u64), "{cell}: {item}");
            assert_eq!(item["attempts"].as_i64(), Some(tries), "{cell}: {name}'s attempts: {done}");
            if let Some(before) = stamps.get(name) {
                assert_eq!(place.stamp(point, name).as_ref(), Some(before), "{cell}: {name} was written over");
            }
            if let Some(m) = &place.moto {
                assert_eq!(m.puts(&format!("{point}/{name}"), 200), 1, "{cell}: {name} was written more than once");
            }
        }
        check_manifests(&cell, &files, &items);
        let own = |ext: &str| files.get(&format!("manifest-{id}.{ext}"));
        assert_eq!(own("json"), files.get("manifest.json"), "{cell}: the delivery's own manifest");
        assert_eq!(own("csv"), files.get("manifest.csv"), "{cell}: the delivery's own manifest");
        d.kill();
    }
    eprintln!(
        "delivery crash matrix, {kind:?} on {on}: {} points in {:.1} s",
        DELIVERY_POINTS.len(),
        started.elapsed().as_secs_f64()
    );
}

/// `manifest.json` and `manifest.csv` list exactly the delivered items' files, each with the
/// sha256 and size of the bytes at the target.
pub(crate) fn check_manifests(cell: &str, files: &BTreeMap<String, Vec<u8>>, items: &[Value]) {
    let mut want: Vec<(String, String, u64)> = items
        .iter()
        .filter(|i| i["state"] == "delivered")
        .map(|i| {
            let name = i["file_name"].as_str().expect("name").to_string();
            let bytes = files.get(&name).unwrap_or_else(|| panic!("{cell}: {name} is not at the target"));
            (name, sha256_hex(bytes), bytes.len() as u64)
        })
        .collect();
    want.sort();
    let json: Value = serde_json::from_slice(files.get("manifest.json").expect("manifest.json")).expect("valid json");
    let mut listed: Vec<(String, String, u64)> = json["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
            (s("file_name"), s("sha256"), f["bytes"].as_u64().unwrap_or(0))
        })
        .collect();
    listed.sort();
    assert_eq!(listed, want, "{cell}: manifest.json does not match the files");
    let csv = String::from_utf8(files.get("manifest.csv").expect("manifest.csv").clone()).expect("utf-8");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let col = |n: &str| header.iter().position(|h| *h == n).unwrap_or_else(|| panic!("{cell}: no {n} column"));
    let (name, sha, bytes) = (col("file_name"), col("sha256"), col("bytes"));
    let mut rows: Vec<(String, String, u64)> = lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            (cells[name].to_string(), cells[sha].to_string(), cells[bytes].parse().unwrap_or(0))
        })
        .collect();
    rows.sort();
    assert_eq!(rows, want, "{cell}: manifest.csv does not match the files:\n{csv}");
}

/// A delivery killed mid-write — its temporary file written, the file not yet under its name
/// (`deliver-folder-after-temp`) — and resumed at once: once it ends, the leftover temporary
/// file is gone, although it is younger than `timeout_ms` (a later write of the same name
/// alone would leave it).
#[test]
fn a_resumed_delivery_sweeps_its_own_temporary_files() {
    let tmp = TempDir::new();
    let out = tmp.path().join("out");
    let target = format!("[[delivery.targets]]\nname = \"t\"\nkind = \"folder\"\npath = \"{}\"\n", out.display());
    let mut d = Daemon::configure(&format!("{FAST_DEMO}\n{target}"));
    d.env.push(("FAILPOINTS".into(), "deliver-folder-after-temp=return".into()));
    d.spawn();
    let (set, arts) = chosen_set(&d, true);
    let id = deliver(&d, &set, "original", "t", false);
    let exited = wait_for(Duration::from_secs(30), || d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()));
    assert!(exited.is_some_and(|s| !s.success()), "the crash point never fired; stderr:\n{}", d.stderr());
    d.child = None;
    let listing = || crate::deliveries::files(&out);
    let temps: Vec<String> = listing().into_iter().filter(|n| n.starts_with('.')).collect();
    assert_eq!(temps.len(), 1, "the crash left one temporary file: {:?}", listing());
    assert!(temps[0].contains(".tally-tmp-"), "{temps:?}");

    d.env.retain(|(k, _)| k != "FAILPOINTS");
    d.spawn();
    let done = ended(&d, &id);
    assert_eq!(done["state"], "delivered", "{done}");
    let names = listing();
    assert!(names.iter().all(|n| !n.starts_with('.')), "temporary files left after the delivery ended: {names:?}");
    for (item, (_, sha)) in done["items"].as_array().expect("items").iter().zip(&arts) {
        let bytes = std::fs::read(out.join(item["file_name"].as_str().expect("name"))).expect("delivered");
        assert_eq!(&sha256_hex(&bytes), sha);
    }
    assert!(names.contains(&format!("manifest-{id}.json")), "{names:?}");
}
