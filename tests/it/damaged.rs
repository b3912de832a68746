//! Damaged images through the real HTTP API, on both backends (issue 24, finding 3): bytes in
//! the database that no longer match their recorded sha256, or are cut short, are an error
//! that says so. A download answers `image_damaged` (500, the one error shape) before its
//! first byte when the image is small enough to check first, and a large one that has started
//! ends without its last bytes (fewer than its `Content-Length`: no client takes it for
//! complete); a thumbnail answers `image_damaged`; the set zip leaves the damaged images out
//! with a note inside it naming them, and `tally set download` saves the rest and says so; the
//! web page (headless Chromium) shows "Damaged image" in place of the thumbnail.
//!
//! The damage is done the way a bad disk or a careless edit would: on SQLite, the daemon's
//! file is opened directly while it runs; on PostgreSQL, the `bytea` is changed with SQL.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Daemon, FAST_DEMO, request, sha256_hex, wait_for};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// How an image is damaged.
#[derive(Clone, Copy)]
enum Damage {
    /// One byte at this offset from the end changed; the size stays.
    Flip { from_end: usize },
    /// Cut to its first half (the recorded size stays).
    Truncate,
}

/// Where the daemon keeps its data.
enum Backend {
    Sqlite(std::path::PathBuf),
    Postgres(String),
}

impl Backend {
    fn damage(&self, id: &str, how: Damage) {
        match self {
            Backend::Sqlite(db) => {
                let c = rusqlite::Connection::open(db).expect("open the daemon's database");
                c.busy_timeout(Duration::from_secs(10)).expect("busy timeout");
                // The schema's CHECK (length(data) = bytes) stands in the way of a cut; a bad
                // disk does not ask.
                c.execute_batch("PRAGMA ignore_check_constraints = ON").expect("pragma");
                let data: Vec<u8> =
                    c.query_row("SELECT data FROM blobs WHERE id = ?1", [id], |r| r.get(0)).expect("stored");
                let bad = damaged(&data, how);
                assert_eq!(
                    c.execute("UPDATE blobs SET data = ?1 WHERE id = ?2", rusqlite::params![bad, id]).expect("damage"),
                    1
                );
            }
            Backend::Postgres(url) => {
                let (url, id) = (url.clone(), id.to_string());
                // The sync client runs a runtime of its own: off any async thread.
                std::thread::spawn(move || {
                    let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
                    // The CHECK (length(data) = bytes), whatever PostgreSQL named it.
                    c.batch_execute(
                        "DO $$ DECLARE c text; BEGIN
                           FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = 'blobs'::regclass
                             AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%length(data)%' LOOP
                             EXECUTE format('ALTER TABLE blobs DROP CONSTRAINT %I', c);
                           END LOOP; END $$",
                    )
                    .expect("drop the length check");
                    let row = c.query_one("SELECT data FROM blobs WHERE id = $1", &[&id]).expect("stored");
                    let bad = damaged(&row.get::<_, Vec<u8>>(0), how);
                    assert_eq!(c.execute("UPDATE blobs SET data = $1 WHERE id = $2", &[&bad, &id]).expect("damage"), 1);
                })
                .join()
                .expect("damage thread");
            }
        }
    }
}

fn damaged(data: &[u8], how: Damage) -> Vec<u8> {
    let mut bad = data.to_vec();
    match how {
        Damage::Flip { from_end } => {
            let at = bad.len().saturating_sub(from_end.max(1));
            bad[at] ^= 0x5a;
        }
        Damage::Truncate => bad.truncate(bad.len() / 2),
    }
    bad
}

/// A GET read to the end of the connection, raw: status, headers, body, and whether the body
/// arrived whole (as long as its `Content-Length`, or a chunked body with its last chunk).
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    complete: bool,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&self.body)))
    }
}

fn raw_get(d: &Daemon, path: &str) -> Raw {
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        d.port,
        d.token()
    );
    s.write_all(head.as_bytes()).expect("send");
    let mut raw = Vec::new();
    // A reset after a partial body is what an aborted transfer may look like: keep what came.
    let _ = s.read_to_end(&mut raw);
    // No head at all (the connection closed first) is status 0.
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Raw { status: 0, headers: Vec::new(), body: raw, complete: false };
    };
    let head = text(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).expect("status");
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))).collect();
    let rest = &raw[split + 4..];
    let mut r = Raw { status, headers, body: Vec::new(), complete: false };
    if r.header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut rest = rest;
        while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(text(&rest[..eol]).trim(), 16).expect("chunk size");
            if size == 0 {
                r.complete = true;
                break;
            }
            let Some(chunk) = rest.get(eol + 2..eol + 2 + size) else {
                r.body.extend_from_slice(&rest[eol + 2..]);
                break;
            };
            r.body.extend_from_slice(chunk);
            rest = rest.get(eol + 2 + size + 2..).unwrap_or(&[]);
        }
    } else {
        let len: usize = r.header("content-length").expect("a length").parse().expect("a number");
        r.body = rest.to_vec();
        r.complete = r.body.len() == len;
    }
    r
}

/// The one error shape, with code `image_damaged`, in words that say what happened.
fn assert_damaged(r: &Raw, what: &str) {
    assert_eq!(r.status, 500, "{what}: {} {}", r.status, text(&r.body));
    let body = r.json();
    assert_eq!(body["error"]["code"], "image_damaged", "{what}: {body}");
    let msg = body["error"]["message"].as_str().expect("message");
    assert!(msg.contains("damaged") && msg.contains("tally check"), "{what}: {msg}");
    assert!(!msg.contains("try again"), "{what}: damage is not a passing problem: {msg}");
}

/// A large image (an upload of `n` bytes: PNG magic bytes, then bytes that do not repeat).
fn big_png(n: usize) -> Vec<u8> {
    let mut b = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while b.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.extend_from_slice(&x.to_le_bytes());
    }
    b.truncate(n);
    b
}

fn upload(d: &Daemon, bytes: &[u8]) -> String {
    let auth = format!("Bearer {}", d.token());
    let r =
        request(d.port, "POST", "/v1/uploads", &[("Authorization", &auth), ("Content-Type", "image/png")], Some(bytes));
    assert!(r.status < 300, "upload: {} {}", r.status, text(&r.body));
    r.json()["id"].as_str().expect("upload id").to_string()
}

fn damaged_images_are_errors_that_say_so(pg: bool) {
    let mut d = Daemon::configure(FAST_DEMO);
    let backend = if pg {
        if d.on_postgres("damage-node").is_none() {
            return;
        }
        let cfg = std::fs::read_to_string(&d.config).expect("config");
        let url = cfg
            .lines()
            .find_map(|l| l.strip_prefix("postgres_url = \""))
            .and_then(|l| l.strip_suffix('"'))
            .expect("the test's PostgreSQL URL")
            .to_string();
        Backend::Postgres(url)
    } else {
        Backend::Sqlite(d.data.join("tally.db"))
    };
    d.spawn();
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({ "product": "Blue Mug", "provider": "demo", "shots": [
            { "role": "main", "prompt": "on white" },
            { "role": "scene", "prompt": "on a table" },
            { "role": "selling_point", "prompt": "the handle" } ] })),
    );
    assert_eq!(r.status, 201, "{}", text(&r.body));
    let set_id = r.json()["id"].as_str().expect("set id").to_string();
    let set = wait_for(Duration::from_secs(30), || {
        let s = d.call("GET", &format!("/v1/sets/{set_id}"), None).json();
        (s["status"] != "running").then_some(s)
    })
    .expect("the set settled");
    let arts: Vec<(String, String)> = set["shots"]
        .as_array()
        .expect("shots")
        .iter()
        .map(|s| {
            let a = &s["artifacts"][0];
            (a["id"].as_str().expect("artifact id").to_string(), a["sha256"].as_str().expect("sha").to_string())
        })
        .collect();
    assert_eq!(arts.len(), 3, "{set}");
    let small = upload(&d, &tally::render::placeholder_png("front", 64));
    let big_bytes = big_png(5 << 20);
    let big = upload(&d, &big_bytes);

    backend.damage(&arts[1].0, Damage::Flip { from_end: 100 });
    backend.damage(&arts[2].0, Damage::Truncate);
    backend.damage(&small, Damage::Flip { from_end: 10 });
    // Near the end: the download has sent most of the bytes when the hash tells.
    backend.damage(&big, Damage::Flip { from_end: 10 });

    // The intact image still downloads whole, with its sha256.
    let ok = raw_get(&d, &format!("/v1/artifacts/{}", arts[0].0));
    assert!(ok.status == 200 && ok.complete, "{}", ok.status);
    assert_eq!(sha256_hex(&ok.body), arts[0].1);
    assert_eq!(raw_get(&d, &format!("/v1/artifacts/{}/thumbnail", arts[0].0)).status, 200);

    // Small damaged images: checked before the first byte.
    assert_damaged(&raw_get(&d, &format!("/v1/artifacts/{}", arts[1].0)), "a flipped byte");
    assert_damaged(&raw_get(&d, &format!("/v1/artifacts/{}", arts[2].0)), "a truncated image");
    assert_damaged(&raw_get(&d, &format!("/v1/uploads/{small}")), "a flipped upload");
    for (path, what) in [
        (format!("/v1/artifacts/{}/thumbnail", arts[1].0), "the thumbnail of a flipped image"),
        (format!("/v1/artifacts/{}/thumbnail", arts[2].0), "the thumbnail of a truncated image"),
        (format!("/v1/uploads/{small}/thumbnail"), "the thumbnail of a flipped upload"),
        (format!("/v1/uploads/{big}/thumbnail"), "the thumbnail of a large damaged upload"),
    ] {
        assert_damaged(&raw_get(&d, &path), what);
    }

    // A large damaged image has started when the damage shows: the transfer ends incomplete.
    let r = raw_get(&d, &format!("/v1/uploads/{big}"));
    assert_eq!(r.status, 200, "{}", text(&r.body));
    assert!(!r.complete, "a damaged large image arrived as a complete transfer ({} bytes)", r.body.len());
    assert!(r.body.len() < big_bytes.len(), "{} bytes", r.body.len());

    // The zip: whole and readable, the intact image in it, the damaged ones left out and named.
    let z = raw_get(&d, &format!("/v1/sets/{set_id}/download"));
    assert!(z.status == 200 && z.complete, "{} {}", z.status, text(&z.body));
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(z.body.clone())).expect("a readable zip");
    let names: Vec<String> =
        (0..zip.len()).map(|i| zip.by_index(i).expect("entry").name().expect("name").to_string()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let mut first = Vec::new();
    zip.by_index(0).expect("entry").read_to_end(&mut first).expect("read");
    assert_eq!(sha256_hex(&first), arts[0].1, "{names:?}");
    assert_eq!(names[1], "NOT-INCLUDED.txt", "{names:?}");
    let mut note = String::new();
    zip.by_name("NOT-INCLUDED.txt").expect("the note").read_to_string(&mut note).expect("read");
    for (id, _) in &arts[1..] {
        assert!(note.contains(id.as_str()), "the note names {id}:\n{note}");
    }
    assert!(note.contains("damaged") && note.contains("tally check"), "{note}");
    assert_eq!(z.header("tally-images-left-out"), Some("2"), "{:?}", z.headers);

    // `tally set download`: the intact image saved, the rest named, a non-zero exit.
    let dir = d.dir.path().join("saved");
    let out = d.cli(&["set", "download", &set_id, dir.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(5), "{}{}", text(&out.stdout), text(&out.stderr));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(all.contains("left out") && all.contains(&arts[1].0) && all.contains(&arts[2].0), "{all}");
    let saved: Vec<_> = std::fs::read_dir(&dir).expect("saved").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(saved.len(), 2, "the image and the note: {saved:?}");
    assert!(saved.iter().any(|n| n == "NOT-INCLUDED.txt"), "{saved:?}");

    // `tally check` still names every damaged image (SQLite file; PostgreSQL database).
    let check = d.cli(&["check"]);
    assert_eq!(check.status.code(), Some(5), "{}", text(&check.stdout));
    for id in [&arts[1].0, &arts[2].0, &small, &big] {
        assert!(text(&check.stdout).contains(id.as_str()), "check names {id}: {}", text(&check.stdout));
    }
}

#[test]
fn damaged_images_are_errors_that_say_so_on_sqlite() {
    damaged_images_are_errors_that_say_so(false);
}

#[test]
fn damaged_images_are_errors_that_say_so_on_postgres() {
    damaged_images_are_errors_that_say_so(true);
}

/// The page says so too: in headless Chromium, the set page shows a damaged shot's image as
/// "Damaged image: … left out of the set's zip" in place of its thumbnail (the intact one
/// keeps its thumbnail), and stays accessible (axe-core).
#[test]
fn the_set_page_shows_a_damaged_image_as_damaged() {
    let mut d = Daemon::configure(FAST_DEMO);
    d.spawn();
    let url = crate::web::printed_sign_in_url(&d);
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({ "product": "Green Vase", "provider": "demo", "shots": [
            { "role": "main", "prompt": "on white" },
            { "role": "scene", "prompt": "on a shelf" } ] })),
    );
    assert_eq!(r.status, 201, "{}", text(&r.body));
    let set_id = r.json()["id"].as_str().expect("set id").to_string();
    let set = wait_for(Duration::from_secs(30), || {
        let s = d.call("GET", &format!("/v1/sets/{set_id}"), None).json();
        (s["status"] != "running").then_some(s)
    })
    .expect("the set settled");
    let damaged_id = set["shots"][1]["artifacts"][0]["id"].as_str().expect("artifact").to_string();
    Backend::Sqlite(d.data.join("tally.db")).damage(&damaged_id, Damage::Flip { from_end: 100 });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = crate::browser::Browser::start().await;
        b.c().goto(&url).await.expect("sign in");
        b.c().goto(&format!("http://127.0.0.1:{}/#/sets/{set_id}", d.port)).await.expect("the set page");
        // One condition read at once: the page may draw the set again (a change event) between
        // a check that the mark exists and a second look at it, and the new drawing marks the
        // image again only when its thumbnail has failed again.
        let marked = "Array.from(document.querySelectorAll('#shots .thumb.damaged'))";
        b.until(
            "exactly the damaged image marked, saying it is left out of the zip",
            20,
            &format!("{marked}.length === 1 && {marked}[0].innerText.includes(\"left out of the set's zip\")"),
        )
        .await;
        let loaded = "Array.from(document.querySelectorAll('#shots img.thumb')) \
            .filter(i => i.complete && i.naturalWidth > 0).length";
        b.until("the intact thumbnail loaded", 20, &format!("{loaded} > 0")).await;
        assert_eq!(b.js(loaded).await, 1, "the intact shot keeps its thumbnail");
        b.assert_accessible("a set page with a damaged image").await;
        b.close().await;
    });
}

/// A chosen image whose stored bytes fail their sha256 check (issue #38): `POST
/// …/deliveries` answers 409 naming the shot and the image, with or without `force`; nothing
/// is recorded and nothing is written to the target.
#[test]
fn a_damaged_chosen_image_is_a_409_and_nothing_is_written() {
    let tmp = crate::common::TempDir::new();
    let out = tmp.path().join("out");
    let mut d = Daemon::configure(&format!(
        "{FAST_DEMO}\n[[delivery.targets]]\nname = \"out\"\nkind = \"folder\"\npath = \"{}\"\n",
        out.display()
    ));
    let backend = Backend::Sqlite(d.data.join("tally.db"));
    d.spawn();
    let (set, arts) = crate::deliveries::chosen_set(&d, true);
    backend.damage(&arts[1].0, Damage::Flip { from_end: 100 });
    for force in [false, true] {
        let body = json!({"profile": "original", "target": "out", "force": force});
        let r = d.call("POST", &format!("/v1/sets/{set}/deliveries"), Some(&body));
        assert_eq!(r.status, 409, "force {force}: {}", text(&r.body));
        let blocking = r.json()["blocking"].to_string();
        assert!(blocking.contains(&arts[1].0) && blocking.contains("damaged"), "the image: {blocking}");
        assert!(blocking.to_lowercase().contains("scene"), "the shot: {blocking}");
        assert!(!blocking.contains(&arts[0].0), "only the damaged one: {blocking}");
    }
    assert_eq!(d.call("GET", &format!("/v1/sets/{set}/deliveries"), None).json()["deliveries"], json!([]));
    assert_eq!(crate::deliveries::files(&out), Vec::<String>::new(), "nothing at the target");
}
