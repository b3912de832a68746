//! Deliveries through a real daemon on the demo provider (issue #26): `POST
//! /v1/sets/{id}/deliveries` (409 with `blocking`, 404/422 for what does not exist), the
//! original bytes delivered byte for byte with a manifest, a padded custom profile decoded,
//! delivering twice writing nothing twice, a file that is in the way failing that item only
//! and a retry re-sending only it, `tally set deliver --wait` / `tally delivery retry --wait`
//! exit codes. Crashes at every phase of a delivery are `delivery_crash`'s matrix.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

/// `tall600`: 600×800 PNG on white; targets `out` (a folder in the test's temp dir).
fn delivery_config(out: &Path) -> String {
    format!(
        "{FAST_DEMO}\n[[delivery.profiles]]\nname = \"tall600\"\nwidth = 600\nheight = 800\nfit = \"pad\"\n\
         background = \"#ffffff\"\nformat = \"png\"\nfile_name = \"{{product}}_{{role}}_{{profile}}.{{ext}}\"\n\n\
         [[delivery.targets]]\nname = \"out\"\nkind = \"folder\"\npath = \"{}\"\n",
        out.display()
    )
}

/// A daemon with the delivery config; its `out` folder.
fn daemon(env: &[(&str, &str)]) -> (Daemon, PathBuf) {
    daemon_on(env, false).expect("a SQLite daemon")
}

/// [`daemon`], on PostgreSQL when `postgres` (`None` when the PostgreSQL tests are skipped).
fn daemon_on(env: &[(&str, &str)], postgres: bool) -> Option<(Daemon, PathBuf)> {
    let tmp = TempDir::new();
    let out = tmp.path().join("out");
    std::mem::forget(tmp); // the folder target outlives the test's checks
    let mut d = Daemon::configure(&delivery_config(&out));
    if postgres {
        d.on_postgres("deliver-node")?;
    }
    d.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    d.spawn();
    Some((d, out))
}

/// A settled two-shot set (main, scene), each shot's image chosen: (set id, [(artifact id, sha256)]).
pub(crate) fn chosen_set(d: &Daemon, choose: bool) -> (String, Vec<(String, String)>) {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let body = json!({"product": "green teapot", "shots": [
        {"role": "main", "prompt": format!("on white {tag}")},
        {"role": "scene", "prompt": format!("on a shelf {tag}")}]});
    let r = d.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id = r.json()["id"].as_str().expect("id").to_string();
    let set = wait_for(Duration::from_secs(60), || {
        let s = d.call("GET", &format!("/v1/sets/{id}"), None).json();
        let shots = s["shots"].as_array()?.clone();
        shots.iter().all(|x| x["candidates"][0]["status"] == "succeeded").then_some(s)
    })
    .unwrap_or_else(|| panic!("set {id} never succeeded"));
    let arts: Vec<(String, String)> = set["shots"]
        .as_array()
        .expect("shots")
        .iter()
        .map(|x| {
            let a = &x["candidates"][0]["artifact"];
            (a["id"].as_str().expect("artifact").to_string(), a["sha256"].as_str().expect("sha").to_string())
        })
        .collect();
    if choose {
        for (i, (a, _)) in arts.iter().enumerate() {
            let r = d.call("PUT", &format!("/v1/sets/{id}/shots/{i}/choice"), Some(&json!({"artifact_id": a})));
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        }
    }
    (id, arts)
}

/// Make a delivery; its id.
pub(crate) fn deliver(d: &Daemon, set: &str, profile: &str, target: &str, force: bool) -> String {
    let body = json!({"profile": profile, "target": target, "force": force});
    let r = d.call("POST", &format!("/v1/sets/{set}/deliveries"), Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    r.json()["id"].as_str().expect("id").to_string()
}

/// Wait until a delivery ends; it then.
pub(crate) fn ended(d: &Daemon, id: &str) -> Value {
    let mut last = Value::Null;
    wait_for(Duration::from_secs(60), || {
        last = d.call("GET", &format!("/v1/deliveries/{id}"), None).json();
        let s = last["state"].as_str()?;
        (!["queued", "delivering"].contains(&s)).then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("delivery {id} never ended: {last}; daemon stderr:\n{}", d.stderr()))
}

pub(crate) fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn item_names(d: &Value) -> Vec<String> {
    d["items"].as_array().expect("items").iter().map(|i| i["file_name"].as_str().expect("name").to_string()).collect()
}

#[test]
fn a_set_is_delivered_byte_for_byte_padded_and_never_twice() {
    let (d, out) = daemon(&[]);
    let (set, arts) = chosen_set(&d, false);
    // Not chosen: 409 with the reasons in words; nothing is recorded.
    let r =
        d.call("POST", &format!("/v1/sets/{set}/deliveries"), Some(&json!({"profile": "original", "target": "out"})));
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
    let blocking = r.json()["blocking"].clone();
    assert!(blocking[0].as_str().unwrap_or("").contains("2 shots have no chosen image"), "{blocking}");
    // Unknown names.
    let bad = |body: Value, path: &str| d.call("POST", path, Some(&body)).status;
    let path = format!("/v1/sets/{set}/deliveries");
    assert_eq!(bad(json!({"profile": "nope", "target": "out"}), &path), 422);
    assert_eq!(bad(json!({"profile": "original", "target": "nope"}), &path), 422);
    assert_eq!(bad(json!({"profile": "original", "target": "out"}), "/v1/sets/no-such-set/deliveries"), 404);
    assert_eq!(d.call("GET", &format!("/v1/sets/{set}/deliveries"), None).json()["deliveries"], json!([]));
    let (set, arts) = {
        for (i, (a, _)) in arts.iter().enumerate() {
            let r = d.call("PUT", &format!("/v1/sets/{set}/shots/{i}/choice"), Some(&json!({"artifact_id": a})));
            assert_eq!(r.status, 200);
        }
        (set, arts)
    };

    // The original bytes, byte for byte, with the manifests.
    let first = ended(&d, &deliver(&d, &set, "original", "out", false));
    assert_eq!(first["state"], "delivered", "{first}");
    for (item, (art, sha)) in first["items"].as_array().expect("items").iter().zip(&arts) {
        let bytes = std::fs::read(out.join(item["file_name"].as_str().expect("name"))).expect("delivered file");
        let generated = d.call("GET", &format!("/v1/artifacts/{art}"), None);
        assert_eq!(generated.status, 200);
        assert_eq!(bytes, generated.body, "the original profile delivers the bytes as generated");
        assert_eq!((item["state"].as_str(), item["sha256"].as_str()), (Some("delivered"), Some(sha.as_str())));
        assert_eq!(item["bytes"].as_i64(), Some(bytes.len() as i64));
    }
    let csv = std::fs::read_to_string(out.join("manifest.csv")).expect("manifest.csv");
    for (_, sha) in &arts {
        assert!(csv.contains(sha.as_str()), "manifest.csv lists {sha}:\n{csv}");
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).expect("manifest.json")).expect("json");
    assert_eq!(manifest["files"].as_array().map(Vec::len), Some(2));

    // The same again: nothing is written twice (the files keep their inode and time).
    let stamp = |n: &str| {
        let m = std::fs::metadata(out.join(n)).expect("file");
        (std::os::unix::fs::MetadataExt::ino(&m), m.modified().expect("mtime"))
    };
    let before: Vec<_> = item_names(&first).iter().map(|n| stamp(n)).collect();
    let listing = files(&out);
    let again = ended(&d, &deliver(&d, &set, "original", "out", false));
    assert_eq!(again["state"], "delivered", "{again}");
    assert_eq!(item_names(&again), item_names(&first));
    assert_eq!(item_names(&again).iter().map(|n| stamp(n)).collect::<Vec<_>>(), before, "rewritten");
    // Only its own manifest is added; the first delivery's stays (both are listed).
    let again_id = again["id"].as_str().expect("id");
    let mut want = listing.clone();
    want.extend([format!("manifest-{again_id}.csv"), format!("manifest-{again_id}.json")]);
    want.sort();
    assert_eq!(files(&out), want, "delivering again added files");
    let first_id = first["id"].as_str().expect("id");
    let kept: Value =
        serde_json::from_slice(&std::fs::read(out.join(format!("manifest-{first_id}.json"))).expect("kept"))
            .expect("json");
    assert_eq!(kept, manifest, "the first delivery's manifest is kept as it was");

    // A custom profile: 600×800 PNG, the square demo image padded with white above and below.
    let tall = ended(&d, &deliver(&d, &set, "tall600", "out", true));
    assert_eq!(tall["state"], "delivered", "{tall}");
    assert_eq!(item_names(&tall), ["green-teapot_main_tall600.png", "green-teapot_scene_tall600.png"]);
    for name in item_names(&tall) {
        let img = image::load_from_memory(&std::fs::read(out.join(&name)).expect("file")).expect("decodes").to_rgb8();
        assert_eq!(img.dimensions(), (600, 800), "{name}");
        for x in (0..600).step_by(50) {
            assert_eq!(img.get_pixel(x, 5).0, [255, 255, 255], "{name}: padding above at x={x}");
            assert_eq!(img.get_pixel(x, 794).0, [255, 255, 255], "{name}: padding below at x={x}");
        }
        assert!((0..600).step_by(25).any(|x| img.get_pixel(x, 400).0 != [255, 255, 255]), "{name}: no image");
    }
    assert_eq!(tall["items"][0]["width"], 600);
    let listed = d.call("GET", &format!("/v1/sets/{set}/deliveries"), None).json();
    assert_eq!(listed["deliveries"].as_array().map(Vec::len), Some(3));

    // The CLI: to the default `exports` folder, waiting; exit 0.
    let o = d.cli(&["set", "deliver", &set, "--profile", "original", "--to", "exports", "--wait"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let exported = files(&d.data.join("exports"));
    for n in item_names(&first) {
        assert!(exported.contains(&n), "{n} not in exports: {exported:?}");
    }
    // Not ready through the CLI: the reasons, exit 1.
    let (other, _) = chosen_set(&d, false);
    let o = d.cli(&["set", "deliver", &other, "--profile", "original", "--to", "out"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no chosen image"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_file_in_the_way_fails_its_item_only_and_a_retry_resends_only_it() {
    let (d, out) = daemon(&[]);
    let (set, _) = chosen_set(&d, true);
    // Someone else's file under the scene's name.
    std::fs::create_dir_all(&out).expect("out");
    std::fs::write(out.join("green-teapot_scene_tall600.png"), b"not ours").expect("in the way");
    let o = d.cli(&["set", "deliver", &set, "--profile", "tall600", "--to", "out", "--force", "--wait", "--json"]);
    assert_eq!(o.status.code(), Some(3), "partly delivered exits 3: {}", String::from_utf8_lossy(&o.stderr));
    let shown: Value = serde_json::from_slice(&o.stdout).expect("json");
    let id = shown["id"].as_str().expect("id").to_string();
    assert_eq!(shown["state"], "partly_delivered");
    let items = shown["items"].as_array().expect("items").clone();
    assert_eq!((items[0]["state"].as_str(), items[1]["state"].as_str()), (Some("delivered"), Some("failed")));
    assert!(items[1]["why"].as_str().unwrap_or("").contains("never overwritten"), "{}", items[1]);
    assert_eq!(items[1]["retry_safe"], true);
    assert_eq!(std::fs::read(out.join("green-teapot_scene_tall600.png")).expect("left"), b"not ours");
    let main_before = std::fs::metadata(out.join("green-teapot_main_tall600.png")).expect("main").modified().ok();

    // Move it away and retry: only the scene is sent; exit 0.
    std::fs::remove_file(out.join("green-teapot_scene_tall600.png")).expect("remove");
    let o = d.cli(&["delivery", "retry", &id, "--wait", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let after = d.call("GET", &format!("/v1/deliveries/{id}"), None).json();
    assert_eq!(after["state"], "delivered");
    assert_eq!((after["items"][0]["attempts"].as_i64(), after["items"][1]["attempts"].as_i64()), (Some(1), Some(2)));
    let main_after = std::fs::metadata(out.join("green-teapot_main_tall600.png")).expect("main").modified().ok();
    assert_eq!(main_before, main_after, "the delivered file was not sent again");
    let scene = std::fs::read(out.join("green-teapot_scene_tall600.png")).expect("scene delivered");
    assert_eq!(Some(sha256_hex(&scene).as_str()), after["items"][1]["sha256"].as_str());
    // Nothing left to retry.
    let r = d.call("POST", &format!("/v1/deliveries/{id}/retry"), None);
    assert_eq!((r.status, r.error_code()), (409, "nothing_to_retry".to_string()));
}

/// The same through the engine on PostgreSQL: delivered, byte for byte, with the manifest.
#[test]
fn a_set_is_delivered_on_postgres() {
    let Some((d, out)) = daemon_on(&[], true) else { return };
    let (set, arts) = chosen_set(&d, true);
    let done = ended(&d, &deliver(&d, &set, "original", "out", false));
    assert_eq!(done["state"], "delivered", "{done}");
    for (item, (_, sha)) in done["items"].as_array().expect("items").iter().zip(&arts) {
        let bytes = std::fs::read(out.join(item["file_name"].as_str().expect("name"))).expect("file");
        assert_eq!(&sha256_hex(&bytes), sha);
    }
    assert!(out.join("manifest.csv").is_file() && out.join("manifest.json").is_file());
    let again = ended(&d, &deliver(&d, &set, "original", "out", false));
    assert_eq!(again["state"], "delivered", "{again}");
}

/// Schema 9 → 10 (SQLite): a database of the version before deliveries gains their tables and
/// takes a delivery's rows (PostgreSQL's 6 → 7 is held to a new database's catalog by
/// `conformance::pg_migrate`).
#[tokio::test]
async fn a_version_9_database_gains_the_delivery_tables() {
    let dir = TempDir::new();
    let db = dir.path().join("tally.db");
    let durability = tally::config::Durability::Full;
    tally::store::Store::open(&db, durability).expect("new").close().expect("close");
    rusqlite::Connection::open(&db)
        .and_then(|c| {
            // What versions 10 to 16 add, gone: the delivery tables, operations' columns, drafts,
            // copies to edit, a session's device.
            c.execute_batch(
                "DROP TABLE answers; DROP TABLE draft_revisions; DROP TABLE draft_photos; DROP TABLE drafts;
                 ALTER TABLE sets DROP COLUMN draft_revision; ALTER TABLE sets DROP COLUMN draft_id;
                 ALTER TABLE sets DROP COLUMN started_at; DROP TABLE delivery_items; DROP TABLE deliveries; DROP TABLE notices;
                 ALTER TABLE providers DROP COLUMN paused_reason; DROP INDEX tasks_by_source;
                 ALTER TABLE tasks DROP COLUMN source_id; ALTER TABLE tasks DROP COLUMN source_kind;
                 ALTER TABLE tasks DROP COLUMN operation; ALTER TABLE web_sessions DROP COLUMN device;
                 DROP TABLE shop_settings; ALTER TABLE providers DROP COLUMN paused_at; ALTER TABLE providers DROP COLUMN paused_why; ALTER TABLE sets DROP COLUMN overlays; PRAGMA user_version = 9;",
            )
        })
        .expect("make it version 9");
    let store = tally::store::Store::open(&db, durability).expect("migrates");
    let rows: i64 = store
        .write(|c| {
            c.execute_batch(
                "INSERT INTO deliveries (id, set_id, profile, target, created_at, updated_at)
                 VALUES ('d', 's', 'original', 'exports', 1, 1);
                 INSERT INTO delivery_items (delivery_id, position, task_id, artifact_id, file_name, updated_at)
                 VALUES ('d', 0, 't', 'a', 'x.png', 1);",
            )?;
            Ok(c.query_row("SELECT count(*) FROM delivery_items WHERE state = 'queued'", [], |r| r.get(0))?)
        })
        .await
        .expect("the new tables take rows");
    assert_eq!(rows, 1);
    store.close().expect("close");
    let version: i64 = rusqlite::Connection::open(&db)
        .and_then(|c| c.query_row("PRAGMA user_version", [], |r| r.get(0)))
        .expect("version");
    assert_eq!(
        version, 18,
        "and on to 18: operations (11), a delivery's shopify product and each item's remote id (12), drafts (13), \
         shot roles (14), copies to edit (15), a web session's device (16), the owner's settings (17), \
         words on images and a profile per delivery item (18)"
    );
    assert_eq!(tally::store::SCHEMA_VERSION, 18);
    assert_eq!(tally::store::postgres::PG_SCHEMA_VERSION, 17);
    let (product, remote): (Option<String>, Option<String>) = rusqlite::Connection::open(&db)
        .and_then(|c| {
            c.query_row(
                "SELECT d.shopify_product, i.remote_id FROM deliveries d JOIN delivery_items i ON i.delivery_id = d.id",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .expect("the new columns");
    assert_eq!((product, remote), (None, None));
}
