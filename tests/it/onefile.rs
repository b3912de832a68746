//! One file holds the shop's work: images live in the database. The migration of an older
//! data dir (schema version 2, images as files in `artifacts/` and `uploads/`) into the
//! database, file by file, verified; what it does with files it cannot move; and the fixture
//! the crash matrix reuses (`crash::migration_*`).

use std::path::Path;

use tally::config::Durability;
use tally::domain::TaskStatus;
use tally::store::Store;

use crate::common::sha256_hex;
use crate::engine::temp_dir;

/// A data dir as tally's schema version 2 left it, and what its images are.
pub struct V2Fixture {
    /// (download path, sha256) of every image that must survive: the artifacts of tasks A, B,
    /// C (a set's shot) and of D and E (saved by version 2 but not recorded), and upload U.
    pub images: Vec<(String, String)>,
    /// Files that belong to rows (relative to the data dir).
    pub files: Vec<String>,
    /// A file no row points to (left in place).
    pub orphan: String,
    /// Task ids: A, B (JPEG), C (set shot), D (running, image saved), E (unknown, late image).
    pub tasks: [String; 5],
}

fn png(text: &str) -> Vec<u8> {
    tally::render::placeholder_png(text, 8)
}

fn jpeg(text: &str) -> Vec<u8> {
    let mut b = vec![0xff, 0xd8, 0xff, 0xe0];
    b.extend_from_slice(format!("a stand-in JPEG body for {text}").as_bytes());
    b
}

/// Rows and files of a version 2 data dir being written.
struct V2Writer<'a> {
    data: &'a Path,
    c: rusqlite::Connection,
    now: i64,
    images: Vec<(String, String)>,
    files: Vec<String>,
}

impl V2Writer<'_> {
    fn write(&self, rel: &str, bytes: &[u8]) {
        std::fs::write(self.data.join(rel), bytes).expect("write file");
    }

    fn task(&self, id: &str, prompt: &str, status: &str, set: Option<(&str, i64, &str)>) {
        self.c
            .execute(
                "INSERT INTO tasks (id, request_hash, provider, prompt, status, attempts, may_have_charged, set_id,
                    set_position, shot_role, created_at, updated_at)
                 VALUES (?1, 'h', 'demo', ?2, ?3, 1, 1, ?4, ?5, ?6, ?7, ?7)",
                rusqlite::params![id, prompt, status, set.map(|s| s.0), set.map(|s| s.1), set.map(|s| s.2), self.now],
            )
            .expect("task");
    }

    fn envelope(&self, task: &str, status: &str) {
        let sent = status == "sent";
        self.c
            .execute(
                "INSERT INTO envelopes (id, task_id, provider, status, due_at, send_count, sent_at, lease_token,
                    lease_expires_at, lease_boot)
                 VALUES (?1, ?2, 'demo', ?3, ?4, 1, ?4, ?5, ?6, 'version-2-boot')",
                rusqlite::params![
                    uuid::Uuid::now_v7().to_string(),
                    task,
                    status,
                    self.now,
                    sent.then_some("old-lease"),
                    sent.then_some(self.now + 30_000)
                ],
            )
            .expect("envelope");
    }

    fn execution(&self, token: &str, task: &str, status: &str) {
        self.c
            .execute(
                "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, boot_id,
                    heartbeat_at, started_at, calling_at)
                 VALUES (?1, ?2, 1, ?3, 'calling', ?4, 'version-2-boot', ?5, ?5, ?5)",
                rusqlite::params![token, task, status, format!("tally-{token}"), self.now],
            )
            .expect("execution");
    }

    fn artifact(&mut self, task: &str, token: &str, bytes: &[u8], ext: &str, media: &str) {
        let art = uuid::Uuid::now_v7().to_string();
        let rel = format!("artifacts/{token}.{ext}");
        self.write(&rel, bytes);
        self.c
            .execute(
                "INSERT INTO artifacts (id, task_id, execution_token, path, sha256, bytes, media_type, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                rusqlite::params![art, task, token, rel, sha256_hex(bytes), bytes.len() as i64, media, self.now],
            )
            .expect("artifact");
        self.images.push((format!("/v1/artifacts/{art}"), sha256_hex(bytes)));
        self.files.push(rel);
    }
}

/// Write a schema version 2 data dir into `data` (created): the v2 schema, rows for every
/// kind of image file version 2 could leave, and the files themselves.
pub fn v2_data_dir(data: &Path) -> V2Fixture {
    use tally::clock::Clock;
    std::fs::create_dir_all(data.join("artifacts")).expect("artifacts dir");
    std::fs::create_dir_all(data.join("uploads")).expect("uploads dir");
    let c = rusqlite::Connection::open(data.join("tally.db")).expect("open");
    c.execute_batch(include_str!("../fixtures/schema-v2.sql")).expect("v2 schema");
    c.execute_batch("PRAGMA application_id = 1952541817; PRAGMA user_version = 2;").expect("v2 header");
    let mut w = V2Writer { data, c, now: tally::clock::SystemClock.now(), images: Vec::new(), files: Vec::new() };
    let id = || uuid::Uuid::now_v7().to_string();
    let tasks = [id(), id(), id(), id(), id()];
    let tokens: Vec<String> = (0..5).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    // A and B: succeeded, a PNG and a JPEG.
    for (i, (bytes, ext, media)) in
        [(png("task a"), "png", "image/png"), (jpeg("task b"), "jpg", "image/jpeg")].into_iter().enumerate()
    {
        w.task(&tasks[i], &format!("old task {i}"), "succeeded", None);
        w.envelope(&tasks[i], "consumed");
        w.execution(&tokens[i], &tasks[i], "succeeded");
        w.artifact(&tasks[i], &tokens[i], &bytes, ext, media);
    }
    // A set with a reference upload U and one succeeded shot C.
    let (set, upload) = (id(), id());
    let photo = png("reference photo");
    let rel = format!("uploads/{}.png", sha256_hex(&photo));
    w.write(&rel, &photo);
    w.c.execute(
        "INSERT INTO uploads (id, sha256, path, bytes, media_type, created_at) VALUES (?1, ?2, ?3, ?4, 'image/png', ?5)",
        rusqlite::params![upload, sha256_hex(&photo), rel, photo.len() as i64, w.now],
    )
    .expect("upload");
    w.images.push((format!("/v1/uploads/{upload}"), sha256_hex(&photo)));
    w.files.push(rel);
    w.c.execute(
        "INSERT INTO sets (id, request_hash, product, provider, created_at, updated_at)
         VALUES (?1, 'h', 'red sneaker', 'demo', ?2, ?2)",
        rusqlite::params![set, w.now],
    )
    .expect("set");
    w.c.execute(
        "INSERT INTO set_references (set_id, position, upload_id) VALUES (?1, 0, ?2)",
        rusqlite::params![set, upload],
    )
    .expect("reference");
    w.task(&tasks[2], "the shoe on white — product: red sneaker", "succeeded", Some((&set, 0, "main")));
    w.envelope(&tasks[2], "consumed");
    w.execution(&tokens[2], &tasks[2], "succeeded");
    w.artifact(&tasks[2], &tokens[2], &png("shot c"), "png", "image/png");
    // D: version 2 saved its image, then crashed before the finish committed.
    w.task(&tasks[3], "saved before the crash", "running", None);
    w.envelope(&tasks[3], "sent");
    w.execution(&tokens[3], &tasks[3], "running");
    w.write(&format!("artifacts/{}.png", tokens[3]), &png("task d"));
    // E: unknown; its late image was saved but never attached.
    w.task(&tasks[4], "late image", "unknown", None);
    w.envelope(&tasks[4], "consumed");
    w.execution(&tokens[4], &tasks[4], "unknown");
    w.write(&format!("artifacts/{}.png", tokens[4]), &png("task e"));
    // Leftovers: a file no row points to, and a half-written temporary file.
    let orphan = format!("artifacts/{}.png", uuid::Uuid::new_v4());
    w.write(&orphan, &png("orphan"));
    w.write("artifacts/.half-written.tmp", b"partial");
    V2Fixture { images: w.images, files: w.files, orphan, tasks }
}

/// Every image of the fixture, read back from the store by id, has its sha256.
fn assert_images(store: &Store, f: &V2Fixture) {
    for (path, sha) in &f.images {
        let id = path.rsplit('/').next().expect("id");
        let (_, bytes) = store.read_image_bytes_blocking(id).expect("read").unwrap_or_else(|| panic!("{path} lost"));
        assert_eq!(&sha256_hex(&bytes), sha, "{path}");
    }
}

/// The columns and indexes of every table, to compare a migrated database with a new one.
fn shape(db: &Path) -> Vec<String> {
    let c = rusqlite::Connection::open(db).expect("open");
    let mut out = Vec::new();
    let tables: Vec<String> = c
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("tables");
    for t in tables {
        // Sorted: a column added by ALTER TABLE sits last, wherever schema.sql puts it.
        let mut cols: Vec<String> = c
            .prepare("SELECT name || ' ' || type || ' ' || \"notnull\" || ' ' || pk FROM pragma_table_info(?1)")
            .and_then(|mut s| s.query_map([&t], |r| r.get(0))?.collect())
            .expect("columns");
        cols.sort();
        out.push(format!("{t}: {}", cols.join(", ")));
    }
    let indexes: Vec<String> = c
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'index' ORDER BY name")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("indexes");
    out.push(format!("indexes: {}", indexes.join(", ")));
    out
}

#[test]
fn an_older_data_dir_moves_its_images_into_the_database() {
    let dir = temp_dir("v2");
    let f = v2_data_dir(&dir);
    let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("migrates");
    let notes = store.migration_notes().join("\n");
    assert!(notes.contains("from schema version 3 to 4"), "{notes}");
    assert!(notes.contains("moved 3 generated image(s) and 1 reference photo(s)"), "{notes}");
    assert!(notes.contains("finished 2 task(s) from images the previous version had saved"), "{notes}");
    assert!(notes.contains("left 1 file(s)"), "the orphan is named: {notes}");
    assert_images(&store, &f);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for (i, kind) in [(3, "recovered"), (4, "late_result")] {
        let t = rt.block_on(store.get_task(f.tasks[i].clone())).expect("read").expect("task");
        assert_eq!((t.status, t.artifacts.len()), (TaskStatus::Succeeded, 1), "task {i}");
        let kinds: Vec<String> =
            rt.block_on(store.events(f.tasks[i].clone())).expect("events").into_iter().map(|e| e.kind).collect();
        assert!(kinds.contains(&kind.to_string()), "task {i}: {kinds:?}");
    }
    store.close().expect("close");
    // Files are gone once their bytes are committed; the orphan stays; uploads/ is gone.
    for rel in &f.files {
        assert!(!dir.join(rel).exists(), "{rel} was not removed");
    }
    assert!(dir.join(&f.orphan).exists(), "a file no row points to is not tally's to delete");
    assert!(!dir.join("artifacts/.half-written.tmp").exists());
    assert!(!dir.join("uploads").exists());
    let report = tally::store::check(&dir.join("tally.db")).expect("check");
    assert_eq!(report.problems, Vec::<String>::new());
    assert_eq!((report.artifacts, report.uploads), (5, 1));
    // The migrated database has the shape of a new one (legacy_files dropped), and
    // auto_vacuum is on.
    let fresh = temp_dir("fresh");
    Store::open(&fresh.join("tally.db"), Durability::Full).and_then(|s| s.close()).expect("fresh");
    assert_eq!(shape(&dir.join("tally.db")), shape(&fresh.join("tally.db")));
    let av: i64 = rusqlite::Connection::open(dir.join("tally.db"))
        .and_then(|c| c.query_row("PRAGMA auto_vacuum", [], |r| r.get(0)))
        .expect("auto_vacuum");
    assert_eq!(av, 2, "incremental auto_vacuum on a migrated database");
    // Opening again does nothing more.
    let again = Store::open(&dir.join("tally.db"), Durability::Full).expect("reopen");
    assert!(again.migration_notes().is_empty(), "{:?}", again.migration_notes());
    assert_images(&again, &f);
    again.close().expect("close");
}

#[test]
fn an_image_file_that_is_missing_or_changed_is_kept_and_reported_until_it_is_right() {
    let dir = temp_dir("v2-bad");
    let f = v2_data_dir(&dir);
    let (gone, changed) = (&f.files[0], &f.files[1]);
    let saved = std::fs::read(dir.join(gone)).expect("read");
    std::fs::remove_file(dir.join(gone)).expect("remove");
    let original = std::fs::read(dir.join(changed)).expect("read");
    let mut other = original.clone();
    *other.last_mut().expect("bytes") ^= 1;
    std::fs::write(dir.join(changed), &other).expect("change");

    let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("starts anyway");
    let notes = store.migration_notes().join("\n");
    assert!(notes.contains(&format!("could not move {gone}: cannot read it")), "{notes}");
    assert!(notes.contains(&format!("could not move {changed}: its sha256 differs")), "{notes}");
    assert!(notes.contains("moved 1 generated image(s) and 1 reference photo(s)"), "{notes}");
    store.close().expect("close");
    assert_eq!(std::fs::read(dir.join(changed)).expect("left in place"), other, "a changed file is not touched");
    let report = tally::store::check(&dir.join("tally.db")).expect("check");
    let unmoved = report.unmoved.join("\n");
    assert!(unmoved.contains(&format!("is still the file {gone}")), "{unmoved}");
    assert!(unmoved.contains(&format!("is still the file {changed}")), "{unmoved}");
    assert_eq!(report.problems, Vec::<String>::new(), "an unmoved image is reported once, as unmoved");

    // The right files back: the next start finishes the job.
    std::fs::write(dir.join(gone), &saved).expect("put back");
    std::fs::write(dir.join(changed), &original).expect("put back");
    let store = Store::open(&dir.join("tally.db"), Durability::Full).expect("reopen");
    let notes = store.migration_notes().join("\n");
    assert!(notes.contains("moved 2 generated image(s) and 0 reference photo(s)"), "{notes}");
    assert_images(&store, &f);
    store.close().expect("close");
    assert_eq!(tally::store::check(&dir.join("tally.db")).expect("check").problems, Vec::<String>::new());
}
