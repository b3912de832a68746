//! The set zip with `?which=chosen|all` and `?profile=` through a real daemon configured with
//! a `[[delivery.profiles]]` entry: the entries are decoded and measured (pixel size, padding
//! colour, format), named by the profile's pattern, and listed with their sha256 in the zip's
//! `manifest.csv` and `manifest.json`.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

const TALL600: &str = r##"
[[delivery.profiles]]
name = "tall600"
width = 600
height = 800
fit = "pad"
background = "#ffffff"
format = "png"
file_name = "{product}_{role}_{profile}.{ext}"
"##;

/// Every entry of a zip: name → bytes.
fn entries(body: Vec<u8>) -> BTreeMap<String, Vec<u8>> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(body)).expect("a zip");
    let mut out = BTreeMap::new();
    for i in 0..z.len() {
        let mut e = z.by_index(i).expect("entry");
        let mut b = Vec::new();
        e.read_to_end(&mut b).expect("read");
        out.insert(e.name().expect("a name").to_string(), b);
    }
    out
}

fn settled(d: &Daemon, id: &str) -> Value {
    let mut last = Value::Null;
    let done = wait_for(Duration::from_secs(60), || {
        last = d.call("GET", &format!("/v1/sets/{id}"), None).json();
        let shots = last["shots"].as_array()?;
        let all: Vec<&Value> = shots.iter().flat_map(|s| s["candidates"].as_array().into_iter().flatten()).collect();
        (all.len() == 3 && all.iter().all(|c| c["status"] == "succeeded")).then(|| last.clone())
    });
    done.unwrap_or_else(|| panic!("set {id} never settled: {last}"))
}

fn artifact(c: &Value) -> (String, String) {
    (c["artifact"]["id"].as_str().expect("id").into(), c["artifact"]["sha256"].as_str().expect("sha").into())
}

#[test]
fn the_set_zip_picks_chosen_or_all_and_renders_with_a_profile() {
    let d = Daemon::start(&format!("{FAST_DEMO}{TALL600}"));
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let body = json!({"product": "green teapot", "shots": [
        {"role": "main", "prompt": format!("on white {tag}"), "candidates": 2},
        {"role": "scene", "prompt": format!("on a shelf {tag}")}]});
    let r = d.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id = r.json()["id"].as_str().expect("id").to_string();
    let s = settled(&d, &id);
    let main: Vec<(String, String)> =
        s["shots"][0]["candidates"].as_array().expect("candidates").iter().map(artifact).collect();
    let scene = artifact(&s["shots"][1]["candidates"][0]);

    // Nothing chosen yet: `which=chosen` says so; bad values are refused in words.
    let r = d.call("GET", &format!("/v1/sets/{id}/download?which=chosen"), None);
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], "nothing_chosen");
    let r = d.call("GET", &format!("/v1/sets/{id}/download?which=some"), None);
    assert_eq!(r.status, 400);
    let r = d.call("GET", &format!("/v1/sets/{id}/download?profile=ebay"), None);
    assert_eq!(r.status, 400);
    let msg = r.json()["error"]["message"].as_str().unwrap_or("").to_string();
    assert!(msg.contains("profile `ebay`") && msg.contains("amazon") && msg.contains("tall600"), "{msg}");

    // Choose the main shot's second candidate.
    let r = d.call("PUT", &format!("/v1/sets/{id}/shots/0/choice"), Some(&json!({"artifact_id": main[1].0})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));

    // which=chosen: exactly the chosen image, as generated.
    let r = d.call("GET", &format!("/v1/sets/{id}/download?which=chosen"), None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let z = entries(r.body);
    let shas: Vec<String> = z.values().map(|b| sha256_hex(b)).collect();
    assert_eq!(shas, [main[1].1.clone()], "{:?}", z.keys());
    // which=all: every candidate's image.
    let z = entries(d.call("GET", &format!("/v1/sets/{id}/download?which=all"), None).body);
    let mut shas: Vec<String> = z.values().map(|b| sha256_hex(b)).collect();
    let mut want = vec![main[0].1.clone(), main[1].1.clone(), scene.1.clone()];
    shas.sort();
    want.sort();
    assert_eq!(shas, want);

    // The configured profile over the default pick (the chosen main image, the scene's only one).
    let r = d.call("GET", &format!("/v1/sets/{id}/download?profile=tall600"), None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let cd = r.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-disposition")).map(|(_, v)| v.clone());
    let cd = cd.unwrap_or_default();
    assert!(cd.contains("green-teapot_tall600.zip"), "{cd}");
    let z = entries(r.body);
    let names: Vec<&str> = z.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["green-teapot_main_tall600.png", "green-teapot_scene_tall600.png", "manifest.csv", "manifest.json"]
    );
    for name in &names[..2] {
        let img = image::load_from_memory(&z[*name]).expect("decodes").to_rgb8();
        assert_eq!(image::guess_format(&z[*name]).expect("format"), image::ImageFormat::Png);
        assert_eq!(img.dimensions(), (600, 800), "{name}");
        // The square demo image fills the width; white above and below.
        for x in (0..600).step_by(50) {
            assert_eq!(img.get_pixel(x, 5).0, [255, 255, 255], "{name} ({x},5)");
            assert_eq!(img.get_pixel(x, 794).0, [255, 255, 255], "{name} ({x},794)");
        }
        assert!((0..600).step_by(25).any(|x| img.get_pixel(x, 400).0 != [255, 255, 255]), "{name}: no image");
    }
    let manifest: Value = serde_json::from_slice(&z["manifest.json"]).expect("json");
    let files = manifest["files"].as_array().expect("files");
    assert_eq!(files.len(), 2);
    for f in files {
        let name = f["file_name"].as_str().expect("name");
        assert_eq!(f["sha256"].as_str(), Some(sha256_hex(&z[name]).as_str()), "{f}");
        assert_eq!((f["width"].as_u64(), f["height"].as_u64()), (Some(600), Some(800)));
        assert_eq!(f["bytes"].as_u64(), Some(z[name].len() as u64));
        assert_eq!(f["profile"], "tall600");
        assert_eq!(f["charge"], "none", "the demo never charges");
    }
    assert_eq!(files[0]["source_artifact_id"].as_str(), Some(main[1].0.as_str()), "the chosen one");
    let csv = String::from_utf8(z["manifest.csv"].clone()).expect("utf-8");
    assert_eq!(csv.lines().count(), 3, "{csv}");
    assert!(csv.starts_with("product,shot_role,profile,file_name,sha256,"), "{csv}");

    // A built-in profile with which=all: three JPEGs at taobao's 800×800.
    let r = d.call("GET", &format!("/v1/sets/{id}/download?profile=taobao&which=all"), None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let z = entries(r.body);
    let jpgs: Vec<&String> = z.keys().filter(|n| n.ends_with(".jpg")).collect();
    assert_eq!(jpgs.len(), 3, "{:?}", z.keys());
    assert!(jpgs.iter().any(|n| n.as_str() == "green-teapot_main_1_taobao-2.jpg"), "{jpgs:?}");
    for n in jpgs {
        assert_eq!(image::guess_format(&z[n]).expect("format"), image::ImageFormat::Jpeg, "{n}");
        assert_eq!(image::load_from_memory(&z[n]).expect("decodes").to_rgb8().dimensions(), (800, 800), "{n}");
        assert!(z[n].len() <= 3_000_000);
    }
}
