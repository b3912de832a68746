//! Listing images (issue #37), through the daemon on the demo provider: a `main_white` shot
//! cut out of a photo of the real product and composed on pure white, words drawn by tally on a
//! selling-point shot, a profile per shot role, and every built-in profile's rules checked on
//! the delivered files' decoded pixels (border exactly white, the product's share of the frame,
//! pixel size, bytes, format, no alpha) for photos on coloured, patterned and near-white
//! backgrounds. A set made from a draft is delivered for Taobao, Pinduoduo and Amazon; bad input
//! is refused in plain words with nothing written.

use std::path::{Path, PathBuf};
use std::time::Duration;

use image::{GenericImageView, RgbImage};
use serde_json::{Value, json};

use crate::common::{Daemon, TempDir, request, wait_for};

/// The backgrounds a product photo is taken on.
#[derive(Debug, Clone, Copy)]
enum Backdrop {
    Coloured,
    Patterned,
    NearWhite,
}

/// A 1400×1000 photo: a red product (600×500, a darker stripe across it) on `bg`.
fn photo(bg: Backdrop) -> Vec<u8> {
    let img = RgbImage::from_fn(1400, 1000, |x, y| {
        if (400..1000).contains(&x) && (250..750).contains(&y) {
            return if (480..520).contains(&y) { image::Rgb([120, 20, 20]) } else { image::Rgb([200, 30, 30]) };
        }
        match bg {
            Backdrop::Coloured => image::Rgb([170, 200, 230]),
            Backdrop::Patterned if (x / 50 + y / 50) % 2 == 0 => image::Rgb([200, 220, 240]),
            Backdrop::Patterned => image::Rgb([120, 170, 120]),
            Backdrop::NearWhite => image::Rgb([246, 246, 244]),
        }
    });
    png(&img)
}

fn png(img: &RgbImage) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).expect("png");
    out.into_inner()
}

/// A daemon with the demo provider at its default size (1024 px, as the models it stands in
/// for) and a folder target `out`.
fn daemon() -> (Daemon, PathBuf, TempDir) {
    let dir = TempDir::new();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    let extra = format!(
        "[[providers]]\nname = \"demo\"\nkind = \"demo\"\nmax_concurrency = 4\ndelay_ms = 10\n\n\
         [[delivery.targets]]\nname = \"out\"\nkind = \"folder\"\npath = \"{}\"\n",
        out.display()
    );
    let mut d = Daemon::configure(&extra);
    d.spawn();
    (d, out, dir)
}

fn upload(d: &Daemon, bytes: &[u8]) -> String {
    let auth = format!("Bearer {}", d.token());
    let r = request(
        d.port,
        "POST",
        "/v1/uploads",
        &[("Authorization", auth.as_str()), ("Content-Type", "image/png")],
        Some(bytes),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    r.json()["id"].as_str().expect("id").to_string()
}

/// Wait until every candidate of set `id` has ended; the set.
fn settled(d: &Daemon, id: &str) -> Value {
    let mut last = Value::Null;
    wait_for(Duration::from_secs(60), || {
        last = d.call("GET", &format!("/v1/sets/{id}"), None).json();
        let cands: Vec<&Value> =
            last["shots"].as_array()?.iter().flat_map(|s| s["candidates"].as_array()).flatten().collect();
        let done =
            |c: &&Value| ["succeeded", "failed", "unknown", "canceled"].contains(&c["status"].as_str().unwrap_or(""));
        (!cands.is_empty() && cands.iter().all(done)).then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("set {id} never settled: {last}"))
}

/// Choose each shot's first succeeded candidate.
fn choose_all(d: &Daemon, set: &Value) {
    let id = set["id"].as_str().expect("id");
    for (i, shot) in set["shots"].as_array().expect("shots").iter().enumerate() {
        let art = shot["candidates"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["status"] == "succeeded"))
            .map(|c| c["artifact"]["id"].clone())
            .unwrap_or_else(|| panic!("shot {i} has no image: {shot}"));
        let r = d.call("PUT", &format!("/v1/sets/{id}/shots/{i}/choice"), Some(&json!({"artifact_id": art})));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
}

/// Deliver set `id` with `body` (plus `target: out`) and wait for it to end; the delivery.
fn deliver(d: &Daemon, id: &str, body: Value) -> Value {
    let mut body = body;
    body["target"] = json!("out");
    let r = d.call("POST", &format!("/v1/sets/{id}/deliveries"), Some(&body));
    assert_eq!(r.status, 201, "{body}: {}", String::from_utf8_lossy(&r.body));
    let did = r.json()["id"].as_str().expect("delivery").to_string();
    let mut last = Value::Null;
    wait_for(Duration::from_secs(60), || {
        last = d.call("GET", &format!("/v1/deliveries/{did}"), None).json();
        (last["state"] != "queued" && last["state"] != "delivering").then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("delivery {did} never ended: {last}"))
}

/// The delivered files of `dv` read back from `out`: (role, profile, bytes), the bytes'
/// sha256 checked against the item's.
fn files(out: &Path, dv: &Value) -> Vec<(String, String, Vec<u8>)> {
    assert_eq!(dv["state"], "delivered", "{dv}");
    dv["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|it| {
            let name = it["file_name"].as_str().expect("name");
            let bytes = std::fs::read(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(tally::delivery::render::sha256_hex(&bytes), it["sha256"].as_str().expect("sha"), "{name}");
            let profile = it["profile"].as_str().or(dv["profile"].as_str()).expect("profile").to_string();
            (it["shot_role"].as_str().unwrap_or("").to_string(), profile, bytes)
        })
        .collect()
}

/// What a profile promises, from `GET /v1/delivery/profiles`.
fn profiles(d: &Daemon) -> Vec<Value> {
    d.call("GET", "/v1/delivery/profiles", None).json()["profiles"].as_array().expect("profiles").clone()
}

/// The product's box (pixels darker than 250 in some channel) and how many of the outer edge's
/// pixels are not exactly white.
fn measure(img: &RgbImage) -> (Option<(u32, u32, u32, u32)>, usize) {
    let (w, h) = img.dimensions();
    let mut b: Option<(u32, u32, u32, u32)> = None;
    let mut edge_off = 0;
    for (x, y, p) in img.enumerate_pixels() {
        if (x == 0 || y == 0 || x + 1 == w || y + 1 == h) && p.0 != [255, 255, 255] {
            edge_off += 1;
        }
        if p.0.iter().any(|c| *c < 250) {
            b = Some(b.map_or((x, y, x, y), |(a, c, e, f)| (a.min(x), c.min(y), e.max(x), f.max(y))));
        }
    }
    (b, edge_off)
}

/// Every rule `profile` states, asserted on `bytes` decoded; a white main image also on pure
/// white at 85 % or more whatever the profile.
fn assert_rules(profile: &Value, role: &str, bytes: &[u8]) {
    let name = profile["name"].as_str().expect("name");
    let what = format!("{name} / {role}");
    let format = image::guess_format(bytes).expect("a known format");
    let want = match profile["format"].as_str() {
        Some("jpeg") => image::ImageFormat::Jpeg,
        Some("png") => image::ImageFormat::Png,
        Some("webp") => image::ImageFormat::WebP,
        _ => format,
    };
    assert_eq!(format, want, "{what}");
    if let Some(max) = profile["max_bytes"].as_u64() {
        assert!(bytes.len() as u64 <= max, "{what}: {} bytes > {max}", bytes.len());
    }
    let img = image::load_from_memory(bytes).expect("decodes");
    if let (Some(w), Some(h)) = (profile["width"].as_u64(), profile["height"].as_u64()) {
        assert_eq!((u64::from(img.width()), u64::from(img.height())), (w, h), "{what}");
    }
    if profile["no_alpha"] == true {
        assert!(!img.color().has_alpha(), "{what}: has alpha");
    }
    let rgb = img.to_rgb8();
    let (product, edge_off) = measure(&rgb);
    let (w, h) = rgb.dimensions();
    let fill = |(x0, y0, x1, y1): (u32, u32, u32, u32)| {
        (f64::from(x1 - x0 + 1) / f64::from(w)).max(f64::from(y1 - y0 + 1) / f64::from(h))
    };
    let white = profile["background_rule"] == "pure_white" || role == "main_white";
    if white {
        assert_eq!(edge_off, 0, "{what}: {edge_off} edge pixels are not pure white");
        let (x0, y0, x1, y1) = product.expect("a product");
        // Clear of the product (and of a JPEG's ringing around it), every pixel is pure white.
        let off = rgb
            .enumerate_pixels()
            .filter(|(x, y, p)| {
                let near = *x + 16 >= x0 && *x <= x1 + 16 && *y + 16 >= y0 && *y <= y1 + 16;
                !near && p.0 != [255, 255, 255]
            })
            .count();
        assert_eq!(off, 0, "{what}: {off} pixels around the product are not pure white");
    }
    let min_fill = profile["fill"].as_f64().or((role == "main_white").then_some(0.85));
    if let Some(min) = min_fill {
        let got = fill(product.expect("a product"));
        assert!(got >= min, "{what}: the product fills {got:.3} of the frame, under {min}");
    }
    if role == "main_white" {
        // The photo's backdrop is gone: no blue, green or grey-white of it is left.
        let left = rgb.pixels().filter(|p| p.0[2] > 200 && p.0[0] < 190 || p.0[1] > 150 && p.0[0] < 140).count();
        assert_eq!(left, 0, "{what}: {left} pixels of the photo's backdrop are left");
    }
}

/// The shots of a listing set: a white main image from `photo`, a selling point with words, a
/// scene.
fn shots(photo: &str, words: &[&str]) -> Value {
    json!([
        {"role": "main_white", "source": {"upload": photo}},
        {"role": "selling_point", "prompt": "the cup, close up", "overlay": {"template": "headline_band", "lines": words}},
        {"role": "scene", "prompt": "the cup on a table"},
    ])
}

#[test]
fn every_builtin_profile_meets_its_rules_on_the_pixels_for_three_backdrops() {
    let (mut d, out, _dir) = daemon();
    let all = profiles(&d);
    for backdrop in [Backdrop::Coloured, Backdrop::Patterned, Backdrop::NearWhite] {
        let ph = upload(&d, &photo(backdrop));
        let product = format!("cup {backdrop:?}");
        let r = d.call("POST", "/v1/sets", Some(&json!({"product": product, "shots": shots(&ph, &["Hand painted"])})));
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        let set = settled(&d, r.json()["id"].as_str().expect("id"));
        let id = set["id"].as_str().expect("id").to_string();
        assert_eq!(set["shots"][0]["source"], json!({"upload": ph}), "the shot shows its photo");
        assert_eq!(set["shots"][0]["candidates"][0]["operation"], "cutout");
        choose_all(&d, &set);
        for p in &all {
            let name = p["name"].as_str().expect("name");
            if name == "original" {
                // The bytes as generated cannot carry words tally draws: refused, nothing written.
                let r = d.call(
                    "POST",
                    &format!("/v1/sets/{id}/deliveries"),
                    Some(&json!({"profile": name, "target": "out"})),
                );
                assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
                assert!(r.json()["blocking"].to_string().contains("cannot draw"), "{}", r.json());
                continue;
            }
            let rules = p["background_rule"].is_string() || p["fill"].is_number();
            let body = if rules {
                // A main-image profile for the main image; the others get their marketplace's.
                if name == "taobao_white" {
                    json!({"profile": "taobao_main", "profiles": {"main_white": name}})
                } else {
                    json!({"profile": "amazon", "profiles": {"main_white": name}})
                }
            } else {
                json!({"profile": name})
            };
            let dv = deliver(&d, &id, body);
            for (role, used, bytes) in files(&out, &dv) {
                let profile = all.iter().find(|q| q["name"] == used.as_str()).expect("known profile");
                assert_rules(profile, &role, &bytes);
            }
            if rules {
                // The same rules on a generated shot's file: it is not on pure white, so it is refused
                // with the measured value, and nothing is written.
                let r = d.call(
                    "POST",
                    &format!("/v1/sets/{id}/deliveries"),
                    Some(&json!({"profile": name, "target": "out"})),
                );
                assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
                let why = r.json()["blocking"].to_string();
                assert!(why.contains("not pure white") && why.contains("edge pixels"), "{name}: {why}");
            }
        }
    }
    d.term();
}

#[test]
fn the_preview_is_the_delivered_file_and_the_words_are_tallys_own_rendering() {
    let (mut d, out, _dir) = daemon();
    let ph = upload(&d, &photo(Backdrop::Coloured));
    let r =
        d.call("POST", "/v1/sets", Some(&json!({"product": "teapot", "shots": shots(&ph, &["手工青花", "礼盒装"])})));
    let set = settled(&d, r.json()["id"].as_str().expect("id"));
    let id = set["id"].as_str().expect("id").to_string();
    choose_all(&d, &set);
    let set = d.call("GET", &format!("/v1/sets/{id}?profile=pinduoduo_carousel"), None).json();
    let shot = &set["shots"][1];
    assert_eq!(shot["overlay"]["lines"], json!(["手工青花", "礼盒装"]));
    let rendering = &shot["rendering"];
    assert_eq!(rendering["profile"], "pinduoduo_carousel", "{shot}");
    let chosen_sha = shot["candidates"][0]["artifact"]["sha256"].as_str().expect("sha").to_string();
    let preview = d.call("GET", rendering["url"].as_str().expect("url"), None);
    assert_eq!(preview.status, 200);
    let preview_sha = tally::delivery::render::sha256_hex(&preview.body);
    assert_eq!(rendering["sha256"].as_str(), Some(preview_sha.as_str()));
    assert_ne!(preview_sha, chosen_sha, "words are drawn on a new rendering, never on the stored image");
    let dv = deliver(&d, &id, json!({"profile": "pinduoduo_carousel"}));
    let delivered = files(&out, &dv);
    let (_, _, sp) = delivered.iter().find(|(r, ..)| r == "selling_point").expect("selling point");
    assert_eq!(tally::delivery::render::sha256_hex(sp), preview_sha, "the preview is the delivered file");
    // The set's zip made with the profile holds the same files.
    let z = d.call("GET", &format!("/v1/sets/{id}/download?profile=pinduoduo_carousel"), None);
    assert_eq!(z.status, 200);
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(z.body)).expect("a zip");
    let mut zipped = Vec::new();
    for i in 0..archive.len() {
        let mut f = archive.by_index(i).expect("entry");
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut bytes).expect("read");
        zipped.push(tally::delivery::render::sha256_hex(&bytes));
    }
    for (_, _, bytes) in &delivered {
        assert!(zipped.contains(&tally::delivery::render::sha256_hex(bytes)), "the zip holds each delivered file");
    }
    // The stored image is unchanged.
    let stored = d.call("GET", &format!("/v1/artifacts/{}", shot["chosen"].as_str().expect("chosen")), None);
    assert_eq!(tally::delivery::render::sha256_hex(&stored.body), chosen_sha);

    // The words change after the images were made (they are never sent): a new rendering; the
    // delivery already made keeps the words it was asked with. Removed with null.
    let patch = |body: Value| d.call("PATCH", &format!("/v1/sets/{id}"), Some(&body));
    let r = patch(json!({"shots": [{"position": 1, "overlay": {"template": "badge", "lines": ["新品"]}}]}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let now = d.call("GET", &format!("/v1/sets/{id}?profile=pinduoduo_carousel"), None).json();
    assert_eq!(now["shots"][1]["overlay"]["lines"], json!(["新品"]));
    assert_ne!(now["shots"][1]["rendering"]["sha256"].as_str(), Some(preview_sha.as_str()));
    assert!(now["timeline"].to_string().contains("新品"), "{}", now["timeline"]);
    let kept = d.call("GET", &format!("/v1/deliveries/{}", dv["id"].as_str().expect("id")), None).json();
    assert_eq!(kept["items"][1]["overlay"]["lines"], json!(["手工青花", "礼盒装"]));
    let white = patch(json!({"shots": [{"position": 0, "overlay": {"template": "badge", "lines": ["x"]}}]}));
    assert_eq!(white.status, 422, "no words on a white main image");
    assert_eq!(patch(json!({"shots": [{"position": 1, "overlay": null}]})).status, 200);
    // A copy to edit keeps the white main image's photo and the words; its product changes
    // without touching the cutout; the white main image has no prompt or role to change.
    let copy = d.call("POST", &format!("/v1/sets/{id}/duplicate"), Some(&json!({})));
    assert_eq!(copy.status, 201, "{}", String::from_utf8_lossy(&copy.body));
    let cid = copy.json()["id"].as_str().expect("copy").to_string();
    assert_eq!(copy.json()["shots"][0]["source"], json!({"upload": ph}));
    let r = d.call("PATCH", &format!("/v1/sets/{cid}"), Some(&json!({"product": "tea cup"})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        (r.json()["shots"][0]["prompt"].as_str(), &r.json()["shots"][0]["source"]),
        (Some(""), &json!({"upload": ph}))
    );
    for body in [
        json!({"shots": [{"position": 0, "prompt": "a cup"}]}),
        json!({"shots": [{"position": 2, "role": "main_white"}]}),
    ] {
        let r = d.call("PATCH", &format!("/v1/sets/{cid}"), Some(&body));
        assert_eq!(r.status, 422, "{body}: {}", String::from_utf8_lossy(&r.body));
    }
    let now = d.call("GET", &format!("/v1/sets/{id}"), None).json();
    assert!(now["shots"][1]["overlay"].is_null() && now["shots"][1]["rendering"].is_null(), "{}", now["shots"][1]);
    d.term();
}

#[test]
fn a_drafted_set_with_a_white_main_image_and_chinese_words_is_delivered_for_taobao_pinduoduo_and_amazon() {
    let (mut d, out, _dir) = daemon();
    let all = profiles(&d);
    let ph = upload(&d, &photo(Backdrop::Patterned));
    let body = json!({"product": "青花瓷茶杯", "photos": [ph], "facts": {"material": "porcelain", "craft": "手绘"},
        "marketplace": "taobao", "language": "zh-CN", "provider": "demo"});
    let r = d.call("POST", "/v1/drafts", Some(&body));
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    let did = r.json()["id"].as_str().expect("id").to_string();
    let dr = wait_for(Duration::from_secs(30), || {
        let v = d.call("GET", &format!("/v1/drafts/{did}"), None).json();
        (v["status"] != "drafting").then_some(v)
    })
    .expect("drafted");
    assert_eq!(dr["status"], "ready", "{dr}");
    // The owner makes the plan a listing: a white main image from the photo, and the two
    // drafted selling points with words of the owner's, in Chinese.
    let mut plan: Vec<Value> = vec![json!({"role": "main_white", "purpose": "白底主图", "prompt": "", "candidates": 1,
        "profile": "taobao_white", "source": {"upload": ph}})];
    let words = [["手工青花"], ["礼盒包装，送礼体面"]];
    for (k, s) in
        dr["shots"].as_array().expect("shots").iter().filter(|s| s["role"] == "selling_point").take(2).enumerate()
    {
        let mut s = s.clone();
        s["overlay"] = json!({"template": if k == 0 { "headline_band" } else { "side_panel" }, "lines": words[k]});
        s["candidates"] = json!(1);
        plan.push(s);
    }
    assert_eq!(plan.len(), 3, "the demo drafts two selling points from two facts: {dr}");
    let r = d.call("PATCH", &format!("/v1/drafts/{did}"), Some(&json!({"revision": 1, "shots": plan})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let c = d.call("POST", &format!("/v1/drafts/{did}/confirm"), Some(&json!({"revision": 2})));
    assert_eq!(c.status, 201, "{}", String::from_utf8_lossy(&c.body));
    let set = settled(&d, c.json()["set_id"].as_str().expect("set"));
    let id = set["id"].as_str().expect("id").to_string();
    assert_eq!(set["shots"][2]["overlay"]["template"], "side_panel");
    choose_all(&d, &set);
    let check = |dv: &Value| {
        let got = files(&out, dv);
        assert_eq!(got.len(), 3);
        for (k, (role, used, bytes)) in got.iter().enumerate() {
            assert_rules(all.iter().find(|q| q["name"] == used.as_str()).expect("profile"), role, bytes);
            if role == "selling_point" {
                // tally's words: white text on the template's dark panel (the bottom band, the
                // left panel), where the demo's placeholder is light.
                let img = image::load_from_memory(bytes).expect("decodes").to_rgb8();
                let (w, h) = img.dimensions();
                let (x, y) = if k == 1 { (4, h - 4) } else { (4, h / 2) };
                assert!(img.get_pixel(x, y).0.iter().all(|c| *c < 70), "{role} {k}: the panel at ({x}, {y})");
                let ink = img.enumerate_pixels().filter(|(px, py, p)| {
                    let inside = if k == 1 { *py > h * 7 / 10 } else { *px < w * 2 / 5 };
                    inside && p.0.iter().all(|c| *c > 200)
                });
                assert!(ink.count() > 100, "{role} {k}: white letters on the panel");
            }
        }
    };
    check(&deliver(&d, &id, json!({"profile": "taobao_main", "profiles": {"main_white": "taobao_white"}})));
    check(&deliver(&d, &id, json!({"profile": "pinduoduo_carousel"})));

    // The same photo as an English listing for Amazon.
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "blue and white cup",
        "shots": shots(&ph, &["Hand painted", "Gift boxed"])})),
    );
    let en = settled(&d, r.json()["id"].as_str().expect("id"));
    choose_all(&d, &en);
    check(&deliver(
        &d,
        en["id"].as_str().expect("id"),
        json!({"profile": "amazon", "profiles": {"main_white": "amazon_main"}}),
    ));
    d.term();
}

#[test]
fn bad_listing_input_is_refused_in_plain_words_before_anything_is_written() {
    let (mut d, out, _dir) = daemon();
    let refused = |body: Value, words: &str| {
        let r = d.call("POST", "/v1/sets", Some(&body));
        assert_eq!(r.status, 422, "{body}: {}", String::from_utf8_lossy(&r.body));
        let m = r.json()["error"]["message"].as_str().unwrap_or("").to_string();
        assert!(m.contains(words), "{m}");
    };
    let ph = upload(&d, &photo(Backdrop::Coloured));
    refused(json!({"product": "cup", "shots": [{"role": "main_white"}]}), "source");
    refused(
        json!({"product": "cup", "shots": [{"role": "main", "prompt": "a cup", "source": {"upload": ph}}]}),
        "main_white",
    );
    refused(
        json!({"product": "cup", "shots": [{"role": "main_white", "source": {"upload": ph},
            "overlay": {"template": "badge", "lines": ["new"]}}]}),
        "no words",
    );
    refused(
        json!({"product": "cup", "shots": [{"role": "selling_point", "prompt": "a cup",
            "overlay": {"template": "no_such_template", "lines": ["x"]}}]}),
        "no_such_template",
    );
    refused(
        json!({"product": "cup", "shots": [{"role": "selling_point", "prompt": "a cup",
            "overlay": {"template": "headline_band", "lines": ["很长的卖点文字".repeat(60)]}}]}),
        "fit",
    );
    refused(json!({"product": "cup", "shots": [{"role": "main_white", "source": {"upload": "nope"}}]}), "nope");
    // A photo of nothing but its backdrop: the cutout finds no product, in plain words; a photo
    // with no backdrop at all: no background.
    let plain = upload(&d, &png(&RgbImage::from_pixel(800, 600, image::Rgb([170, 200, 230]))));
    let noisy = upload(
        &d,
        &png(&RgbImage::from_fn(800, 600, |x, y| {
            image::Rgb([(x * 7 % 256) as u8, (y * 13 % 256) as u8, ((x + y) % 256) as u8])
        })),
    );
    for (upload_id, words) in [(plain, "no product"), (noisy, "background")] {
        let r = d.call(
            "POST",
            "/v1/sets",
            Some(&json!({"product": "cup", "shots": [{"role": "main_white", "source": {"upload": upload_id}}]})),
        );
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        let set = settled(&d, r.json()["id"].as_str().expect("id"));
        let c = &set["shots"][0]["candidates"][0];
        assert_eq!(c["status"], "failed", "{c}");
        let task = d.call("GET", &format!("/v1/tasks/{}", c["task_id"].as_str().expect("task")), None).json();
        assert!(task["reason"].as_str().unwrap_or("").contains(words), "{task}");
    }
    // A profile per role that does not exist, or for a role that does not exist: named.
    let r =
        d.call("POST", "/v1/sets", Some(&json!({"product": "cup", "shots": [{"role": "main", "prompt": "a cup"}]})));
    let set = settled(&d, r.json()["id"].as_str().expect("id"));
    choose_all(&d, &set);
    let sid = set["id"].as_str().expect("id");
    for (profiles, words) in [(json!({"main": "amazon_mian"}), "amazon_mian"), (json!({"hero": "amazon"}), "hero")] {
        let body = json!({"profile": "amazon", "target": "out", "profiles": profiles});
        let r = d.call("POST", &format!("/v1/sets/{sid}/deliveries"), Some(&body));
        assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
        assert!(r.json()["error"]["message"].as_str().unwrap_or("").contains(words), "{}", r.json());
    }
    assert_eq!(std::fs::read_dir(&out).expect("out").count(), 0, "nothing was written");
    d.term();
}

#[test]
fn the_cli_makes_a_white_main_image_draws_words_and_delivers_a_profile_per_role() {
    let (mut d, out, dir) = daemon();
    let photo_path = dir.path().join("cup.png");
    std::fs::write(&photo_path, photo(Backdrop::NearWhite)).expect("photo");
    let main = format!("main_white:@{}", photo_path.display());
    let o = d.cli(&[
        "set",
        "create",
        "--product",
        "cup",
        "--shot",
        &main,
        "--shot",
        "selling_point:the cup, close up",
        "--overlay",
        "selling_point:badge:NEW",
        "--overlay",
        "selling_point:badge:Hand made",
        "--wait",
        "--json",
    ]);
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let set: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(set["shots"][1]["overlay"], json!({"template": "badge", "lines": ["NEW", "Hand made"]}));
    assert!(set["shots"][0]["source"]["upload"].is_string(), "{set}");
    let id = set["id"].as_str().expect("id").to_string();
    choose_all(&d, &set);
    let o = d.cli(&["set", "status", &id, "--profile", "amazon_main"]);
    let status = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(status.contains("not pure white"), "amazon_main's rules on the selling point: {status}");
    let o = d.cli(&[
        "set",
        "deliver",
        &id,
        "--profile",
        "amazon",
        "--profile-for",
        "main_white=amazon_main",
        "--to",
        "out",
        "--wait",
        "--json",
    ]);
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let dv: Value = serde_json::from_slice(&o.stdout).expect("json");
    let got = files(&out, &dv);
    let main = got.iter().find(|(r, ..)| r == "main_white").expect("main");
    assert_eq!(main.1, "amazon_main");
    // The manifest names each file's own profile.
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).expect("manifest")).expect("json");
    let used: Vec<&str> =
        manifest["files"].as_array().expect("files").iter().filter_map(|f| f["profile"].as_str()).collect();
    assert_eq!(used, ["amazon_main", "amazon"], "{manifest}");
    let all = profiles(&d);
    assert_rules(all.iter().find(|p| p["name"] == "amazon_main").expect("amazon_main"), "main_white", &main.2);
    let (w, h) = image::load_from_memory(&main.2).expect("jpeg").dimensions();
    assert!(w.max(h) >= 1000);
    d.term();
}

#[test]
fn the_page_shows_each_listing_shot_as_the_file_a_delivery_writes() {
    let (mut d, out, _dir) = daemon();
    let ph = upload(&d, &photo(Backdrop::Coloured));
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "青花瓷茶杯", "shots": shots(&ph, &["手工青花", "礼盒装"])})),
    );
    let set = settled(&d, r.json()["id"].as_str().expect("id"));
    let id = set["id"].as_str().expect("id").to_string();
    choose_all(&d, &set);
    let url = crate::web::printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let shown: Vec<(String, String, String)> = rt.block_on(async {
        let b = crate::browser::Browser::start().await;
        b.sign_in(&url).await;
        crate::web_views::set_width(&b, 390).await;
        b.js(&format!("(location.hash = '#/sets/{id}')")).await;
        let mut shown = Vec::new();
        for n in [0, 1] {
            let fig = format!("document.getElementById('shot-preview-{n}')");
            b.until("the preview", 20, &format!("{fig} && {fig}.querySelector('img').complete && {fig}.querySelector('img').naturalWidth > 0")).await;
            // The bytes the page shows, hashed in the page.
            b.js(&format!(
                "(window.__sha = null, fetch({fig}.querySelector('img').src).then(r => r.arrayBuffer())
                   .then(x => crypto.subtle.digest('SHA-256', x))
                   .then(h => {{ window.__sha = Array.from(new Uint8Array(h)).map(v => v.toString(16).padStart(2, '0')).join(''); }}), true)"
            ))
            .await;
            let sha = b.until("the preview's sha256", 20, "window.__sha").await.as_str().expect("sha").to_string();
            let said = b.js(&format!("{fig}.dataset.sha256")).await.as_str().unwrap_or("").to_string();
            let profile = b.js(&format!("{fig}.dataset.profile")).await.as_str().unwrap_or("").to_string();
            shown.push((sha, said, profile));
        }
        let words = b.js("document.getElementById('shot-words-1').textContent").await;
        assert!(words.as_str().is_some_and(|w| w.contains("手工青花 / 礼盒装")), "{words}");
        crate::web_views::check_view(&b, "a listing set with its previews").await;
        b.close().await;
        shown
    });
    let profile = shown[0].2.clone();
    let dv = deliver(&d, &id, json!({"profile": profile}));
    let delivered = files(&out, &dv);
    for (n, role) in [(0, "main_white"), (1, "selling_point")] {
        let (_, _, bytes) = delivered.iter().find(|(r, ..)| r == role).expect("delivered");
        let sha = tally::delivery::render::sha256_hex(bytes);
        assert_eq!(shown[n].0, sha, "{role}: the page's preview is the delivered file");
        assert_eq!(shown[n].1, sha, "{role}: the sha256 the set's JSON gives");
    }
    d.term();
}

#[test]
fn the_page_makes_a_listing_set_from_a_photo_with_words() {
    let (mut d, _out, dir) = daemon();
    let photo_path = dir.path().join("cup.png");
    std::fs::write(&photo_path, photo(Backdrop::Coloured)).expect("photo");
    let url = crate::web::printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = crate::browser::Browser::start().await;
        b.sign_in(&url).await;
        crate::web_views::set_width(&b, 390).await;
        b.js("(location.hash = '#/sets/new')").await;
        b.until("the new-set form", 10, "document.getElementById('shot-role-1') !== null").await;
        let input = b.c().find(fantoccini::Locator::Css("#set-refs")).await.expect("picker");
        input.send_keys(photo_path.to_str().expect("path")).await.expect("pick the photo");
        b.js(
            "(document.getElementById('set-product').value = '青花瓷茶杯',
              document.getElementById('shot-role-1').value = 'main_white',
              document.getElementById('shot-role-1').dispatchEvent(new Event('change')),
              document.getElementById('shot-prompt-2').value = 'the cup, close up',
              document.getElementById('shot-words-2').value = '手工青花 / 礼盒装',
              document.getElementById('shot-prompt-3').value = 'the cup on a table', true)",
        )
        .await;
        let hidden = b.js("[document.getElementById('shot-prompt-1').closest('span').hidden, document.getElementById('shot-white-1').hidden]").await;
        assert_eq!(hidden, json!([true, false]), "a white main image asks for no prompt and says where it comes from");
        crate::web_views::check_view(&b, "the new-set form with a white main image").await;
        b.click("#create-set").await;
        b.until("the set's page", 20, "location.hash.startsWith('#/sets/') && location.hash !== '#/sets/new'").await;
        b.close().await;
    });
    let sets = d.call("GET", "/v1/sets", None).json();
    let set = &sets["sets"][0];
    assert_eq!(set["shots"][0]["role"], "main_white");
    assert_eq!(set["shots"][0]["source"]["upload"], set["references"][0]["id"], "cut out of the photo given");
    assert_eq!(set["shots"][1]["overlay"], json!({"template": "headline_band", "lines": ["手工青花", "礼盒装"]}));
    assert!(set["shots"][2]["overlay"].is_null());
    let set = settled(&d, set["id"].as_str().expect("id"));
    assert_eq!(set["shots"][0]["candidates"][0]["status"], "succeeded", "{}", set["shots"][0]);
    d.term();
}
