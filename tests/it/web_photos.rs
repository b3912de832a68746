//! A shop owner's phone photos in the page, on a phone (issue #39; headless Chromium emulating
//! a 390×844 touch screen), in English and in Simplified Chinese (`ui.language`), axe-clean
//! with nothing scrolling sideways: a portrait photo stored on its side with an EXIF
//! orientation (as a phone stores it), picked in the new-set form, shows upright — its
//! thumbnail (made by the daemon) and its enlarged image (the stored bytes, turned by the
//! browser); and an iPhone's HEIC photo is refused before anything is uploaded, with the
//! setting that fixes it, the form still making the set with a photo that can be read.

use serde_json::{Value, json};

use crate::browser::Browser;
use crate::common::{Daemon, FAST_DEMO, TempDir, sha256_hex};
use crate::web::printed_sign_in_url;
use crate::web_views::check_view;

/// A JPEG of `w`×`h` with an EXIF APP1 segment saying `orientation` (1–8), as a phone stores
/// a portrait photo: the sensor's landscape pixels and "turn 90° clockwise" (6). (The same as
/// the daemon's own unit-test helper, which integration tests cannot reach.)
fn jpeg_with_orientation(w: u32, h: u32, orientation: u16) -> Vec<u8> {
    let img = image::RgbImage::from_fn(
        w,
        h,
        |x, _| if x < w / 2 { image::Rgb([200, 0, 0]) } else { image::Rgb([0, 0, 200]) },
    );
    let mut plain = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut plain, 90).encode_image(&img).expect("jpeg");
    // TIFF (little endian): header, one IFD with one entry (0x0112 Orientation, SHORT, 1).
    let mut tiff = b"II*\0".to_vec();
    tiff.extend(8u32.to_le_bytes());
    tiff.extend(1u16.to_le_bytes());
    tiff.extend(0x0112u16.to_le_bytes());
    tiff.extend(3u16.to_le_bytes());
    tiff.extend(1u32.to_le_bytes());
    tiff.extend(orientation.to_le_bytes());
    tiff.extend([0, 0]);
    tiff.extend(0u32.to_le_bytes());
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend(tiff);
    // Right after SOI: FF E1, the segment's length (itself included), the segment.
    let mut out = plain[..2].to_vec();
    out.extend([0xff, 0xe1]);
    out.extend(u16::try_from(app1.len() + 2).expect("a short segment").to_be_bytes());
    out.extend(app1);
    out.extend(&plain[2..]);
    out
}

/// A daemon on the demo provider, in `language` ("en" or "zh-CN").
fn daemon_in(language: &str) -> Daemon {
    let ui = if language == "en" { String::new() } else { format!("[ui]\nlanguage = \"{language}\"\n\n") };
    Daemon::start(&format!("{ui}{FAST_DEMO}"))
}

/// The page's `POST /v1/uploads` requests from now on are counted in `window.uploadsSent`.
const COUNT_UPLOADS: &str = "(() => { window.uploadsSent = 0; const send = window.fetch;
  window.fetch = function (url, opts) {
    if (String(url).includes('/v1/uploads') && opts && opts.method === 'POST') window.uploadsSent += 1;
    return send.apply(this, arguments);
  };
  return true; })()";

/// The reference photos the daemon stores (rows of `uploads`).
fn stored_uploads(d: &Daemon) -> i64 {
    let db = d.data.join("tally.db");
    let c =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).expect("open the db");
    c.query_row("SELECT count(*) FROM uploads", [], |r| r.get(0)).expect("count uploads")
}

/// Signed in on a phone, on the new-set form.
async fn new_set_form(url: &str, language: &str) -> Browser {
    let b = Browser::phone().await;
    b.sign_in(url).await;
    assert_eq!(b.js("[document.documentElement.lang, window.innerWidth]").await, json!([language, 390]));
    b.js("(location.hash = '#/sets/new')").await;
    b.until("the new-set form", 15, "document.getElementById('set-product') !== null").await;
    b
}

/// Pick the file at `path` with the form's photo picker, as a person would.
async fn pick(b: &Browser, path: &std::path::Path) {
    let input = b.c().find(fantoccini::Locator::Css("#set-refs")).await.expect("the photo picker");
    input.send_keys(path.to_str().expect("a path")).await.expect("pick a file");
}

/// Name the product, describe the three shots and create the set; its id once the page shows it.
async fn create_the_set(b: &Browser, product: &str) -> String {
    let fill = |css: String, text: String| async move {
        let el = b.c().find(fantoccini::Locator::Css(&css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
        el.send_keys(&text).await.unwrap_or_else(|e| panic!("type into {css}: {e}"));
    };
    fill("#set-product".into(), product.into()).await;
    for i in 1..=3 {
        fill(format!("#shot-prompt-{i}"), format!("shot {i} of the vase")).await;
    }
    b.click("#create-set").await;
    let id = b.until("the new set", 20, "(location.hash.match(/^#\\/sets\\/([0-9a-f-]{36})$/) || [])[1]").await;
    id.as_str().expect("a set id").to_string()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

#[test]
fn a_portrait_phone_photo_on_its_side_shows_upright_on_a_phone() {
    upright_in("en", "vase on its side");
}

#[test]
fn a_portrait_phone_photo_on_its_side_shows_upright_on_a_phone_in_chinese() {
    upright_in("zh-CN", "侧放的花瓶");
}

fn upright_in(language: &str, product: &str) {
    let d = daemon_in(language);
    let url = printed_sign_in_url(&d);
    let dir = TempDir::new();
    let photo = jpeg_with_orientation(400, 200, 6);
    let path = dir.path().join("IMG_0002.JPG");
    std::fs::write(&path, &photo).expect("write the photo");
    rt().block_on(async {
        let b = new_set_form(&url, language).await;
        pick(&b, &path).await;
        b.until("the photo listed", 10, "document.querySelectorAll('#ref-previews li').length === 1").await;
        check_view(&b, &format!("the new-set form with a phone photo ({language})")).await;
        let set = create_the_set(&b, product).await;

        // The stored photo is the file's bytes, its EXIF orientation kept.
        let s = d.call("GET", &format!("/v1/sets/{set}"), None).json();
        let refs = s["references"].as_array().cloned().unwrap_or_default();
        assert_eq!(refs.len(), 1, "{s}");
        assert_eq!(refs[0]["sha256"], json!(sha256_hex(&photo)), "{s}");
        let upload = refs[0]["id"].as_str().expect("upload id").to_string();

        // Its thumbnail, as the daemon made it (a JPEG without EXIF): taller than wide. With
        // the orientation ignored it would be 256×128.
        let thumb = "document.querySelector('#references li img')";
        b.until("the thumbnail", 15, &format!("{thumb} !== null")).await;
        b.js(&format!("({thumb}.scrollIntoView(), true)")).await;
        let size = b
            .until(
                "the thumbnail loaded",
                15,
                &format!("(i => i && i.complete && i.naturalWidth > 0 && [i.naturalWidth, i.naturalHeight, i.getAttribute('src')])({thumb})"),
            )
            .await;
        assert_eq!(size, json!([128, 256, format!("/v1/uploads/{upload}/thumbnail")]), "an upright thumbnail");
        check_view(&b, &format!("the set with its upright photo ({language})")).await;

        // Enlarged: the stored bytes, which the browser turns by their EXIF orientation; the
        // box it draws is taller than wide (it would be twice as wide as tall on its side).
        b.click("#references li .thumb-button").await;
        let full = "document.getElementById('image-dialog-img')";
        let shown = b
            .until(
                "the enlarged photo",
                15,
                &format!(
                    "document.getElementById('image-dialog').open && (i => i.complete && i.naturalWidth > 0 && \
                     (r => [r.width, r.height, i.getAttribute('src')])(i.getBoundingClientRect()))({full})"
                ),
            )
            .await;
        let (w, h) = (shown[0].as_f64().unwrap_or(0.0), shown[1].as_f64().unwrap_or(0.0));
        assert!(h > w * 1.5 && w > 0.0, "the enlarged photo stands upright: {shown}");
        assert_eq!(shown[2], json!(format!("/v1/uploads/{upload}")), "the full photo, not the thumbnail");
        b.assert_accessible(&format!("the enlarged photo ({language})")).await;
        b.click("#image-dialog-close").await;
        b.until("the dialog closed", 5, "!document.getElementById('image-dialog').open").await;
        b.close().await;
    });
}

#[test]
fn an_iphone_heic_photo_is_refused_with_its_fix_before_uploading_on_a_phone() {
    heic_in("en", "Most Compatible", "HEIC vase");
}

#[test]
fn an_iphone_heic_photo_is_refused_with_its_fix_before_uploading_on_a_phone_in_chinese() {
    heic_in("zh-CN", "兼容性最佳", "HEIC 花瓶");
}

fn heic_in(language: &str, fix: &str, product: &str) {
    let d = daemon_in(language);
    let url = printed_sign_in_url(&d);
    let dir = TempDir::new();
    // An iPhone's photo: an ISO BMFF file whose brand is `heic`.
    let mut heic = b"\0\0\0\x18ftypheic\0\0\0\0mif1heic".to_vec();
    heic.extend([0u8; 64]);
    let heic_path = dir.path().join("IMG_0001.HEIC");
    std::fs::write(&heic_path, &heic).expect("write the HEIC photo");
    let jpeg = jpeg_with_orientation(400, 200, 1);
    let jpeg_path = dir.path().join("IMG_0001.JPG");
    std::fs::write(&jpeg_path, &jpeg).expect("write the JPEG photo");
    rt().block_on(async {
        let b = new_set_form(&url, language).await;
        b.js(COUNT_UPLOADS).await;
        pick(&b, &heic_path).await;
        let said = b
            .until("the refusal", 10, "(e => e && !e.hidden && e.textContent)(document.getElementById('refs-error'))")
            .await;
        let said = said.as_str().unwrap_or("").to_string();
        assert!(said.contains("IMG_0001.HEIC") && said.contains("HEIC") && said.contains(fix), "{said}");
        assert_eq!(b.js("document.querySelectorAll('#ref-previews li').length").await, json!(0), "not listed");
        assert_eq!(b.js("window.uploadsSent").await, json!(0), "nothing sent for it");
        assert_eq!(stored_uploads(&d), 0, "nothing stored");
        check_view(&b, &format!("the new-set form refusing a HEIC photo ({language})")).await;

        // The form goes on: a JPEG is taken, and the set is made with it alone.
        pick(&b, &jpeg_path).await;
        b.until("the JPEG listed", 10, "document.querySelectorAll('#ref-previews li').length === 1").await;
        assert_eq!(b.js("document.getElementById('refs-error').hidden").await, json!(true), "the refusal is gone");
        let listed = b.js("document.querySelector('#ref-previews li').dataset.file").await;
        assert_eq!(listed, json!("IMG_0001.JPG"));
        let set = create_the_set(&b, product).await;
        let s: Value = d.call("GET", &format!("/v1/sets/{set}"), None).json();
        let refs: Vec<Value> = s["references"].as_array().cloned().unwrap_or_default();
        let hashes: Vec<Value> = refs.iter().map(|r| r["sha256"].clone()).collect();
        assert_eq!(hashes, [json!(sha256_hex(&jpeg))], "the set has the JPEG alone: {s}");
        assert_eq!(b.js("window.uploadsSent").await, json!(1), "one upload: the JPEG");
        assert_eq!(stored_uploads(&d), 1, "one photo stored");
        b.until("the set's photo", 15, "document.querySelectorAll('#references li').length === 1").await;
        b.close().await;
    });
}
