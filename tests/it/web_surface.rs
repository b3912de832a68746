//! The web page as a shop owner would choose it, in headless Chromium: a set made entirely in
//! the page (two reference photos, one by the file picker and one dropped, three shots in plain
//! words), thumbnails in the lists, the reference photos on the set page, "Download all" as a
//! zip holding every image under its recognisable name, keyboard focus kept while a row updates
//! live, staying signed in across a restart, the "sign in again" panel after `tally sign-out
//! --all`, and axe-core clean on every view.
//!
//! With `TALLY_SCREENSHOTS_DIR` set (`scripts/screenshots.sh` does), the main views are also
//! saved there at desktop (1280×800) and phone (390×844) width.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use base64::prelude::*;
use fantoccini::Locator;
use serde_json::json;

use crate::browser::Browser;
use crate::common::{Daemon, Mock, TempDir, sha256_hex};
use crate::web::printed_sign_in_url;

fn shots_dir() -> Option<PathBuf> {
    std::env::var_os("TALLY_SCREENSHOTS_DIR").map(PathBuf::from)
}

/// Save the view at desktop and phone width when screenshots were asked for.
async fn shoot(b: &Browser, name: &str, ready: &str) {
    let Some(dir) = shots_dir() else { return };
    for (w, h, tag) in [(1280u32, 800u32, "desktop"), (390, 844, "phone")] {
        // The window is taller than its viewport by the browser's own frame: add that (the
        // width is the viewport's already, also below Chromium's smallest window).
        b.c().set_window_size(w, h).await.expect("resize");
        let dy = b.js("Math.max(0, window.outerHeight - window.innerHeight)").await.as_u64().unwrap_or(0) as u32;
        b.c().set_window_size(w, h + dy).await.expect("resize");
        b.until("the view", 10, ready).await;
        b.js("(document.activeElement && document.activeElement.blur(), window.scrollTo(0, 0), true)").await;
        tokio::time::sleep(Duration::from_millis(300)).await; // let lazy thumbnails paint for the picture
        b.screenshot_into(&dir, &format!("{name}-{tag}.png")).await;
    }
    b.c().set_window_size(1280, 900).await.expect("resize");
}

/// A small JPEG of one colour (the second reference photo).
fn jpeg() -> Vec<u8> {
    let img = image::RgbImage::from_pixel(40, 30, image::Rgb([30, 90, 200]));
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new(&mut out).encode_image(&img).expect("encode a JPEG");
    out
}

fn unzip(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).expect("a readable zip");
    (0..z.len())
        .map(|i| {
            let mut e = z.by_index(i).expect("entry");
            let name = e.name().expect("utf-8 name").to_string();
            let mut data = Vec::new();
            e.read_to_end(&mut data).expect("entry bytes (CRC checked)");
            (name, data)
        })
        .collect()
}

#[test]
fn a_shop_owner_makes_a_set_in_the_page_and_downloads_every_image() {
    let mock = Mock::start(&[]);
    let providers = format!(
        "[[providers]]\nname = \"demo\"\nkind = \"demo\"\nmax_concurrency = 2\ndelay_ms = 300\n\n\
         [[providers]]\nname = \"studio\"\nkind = \"demo\"\nmax_concurrency = 1\ndelay_ms = 2500\n\n\
         [[providers]]\nname = \"openai\"\nkind = \"openai_images\"\nbase_url = \"{}\"\nmodel = \"gpt-image-1\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n",
        mock.base()
    );
    let mut d = Daemon::configure(&providers);
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    let url = printed_sign_in_url(&d);
    let photos = TempDir::new();
    let front = tally::render::placeholder_png("red sneaker, front", 64);
    let side = jpeg();
    let front_path = photos.path().join("front.png");
    std::fs::write(&front_path, &front).unwrap();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        // A browser that is not signed in, and a reused link: styled pages that say what to do.
        b.c().goto(&format!("http://127.0.0.1:{}/", d.port)).await.expect("open");
        b.until("the signed-out page", 10, "document.querySelector('h1')?.innerText.includes('Sign in')").await;
        b.assert_accessible("the signed-out page").await;
        b.sign_in(&url).await;
        b.c().goto(&url).await.expect("the used link again");
        b.until("the used-link page", 10, "document.querySelector('h1')?.innerText.includes('not valid')").await;
        let styled = b.js("getComputedStyle(document.body).fontFamily").await;
        assert!(!styled.as_str().unwrap_or("").contains("serif") || styled.as_str().unwrap_or("").contains("sans"));
        b.assert_accessible("the used sign-in link page").await;
        b.c().goto(&format!("http://127.0.0.1:{}/#/sets/new", d.port)).await.expect("open the page");

        // A new set, entirely in the page: product, one photo picked, one dropped, three shots.
        b.until("the new-set form", 15, "document.getElementById('new-set') !== null").await;
        assert_eq!(b.js("document.title").await, "New image set · tally");
        assert_eq!(b.js("document.activeElement.id").await, "view-title", "focus moves to the new view");
        b.c().find(Locator::Css("#set-product")).await.unwrap().send_keys("Red Sneaker").await.unwrap();
        b.c().find(Locator::Css("#set-refs")).await.unwrap().send_keys(front_path.to_str().unwrap()).await.unwrap();
        b.c()
            .execute(
                "const bytes = Uint8Array.from(atob(arguments[0]), c => c.charCodeAt(0));
                 const dt = new DataTransfer();
                 dt.items.add(new File([bytes], 'side.jpg', { type: 'image/jpeg' }));
                 document.getElementById('drop-zone').dispatchEvent(
                   new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
                 return true;",
                vec![json!(BASE64_STANDARD.encode(&side))],
            )
            .await
            .expect("drop a photo");
        b.until("two previews", 10, "document.querySelectorAll('#ref-previews img').length === 2 && \
            Array.from(document.querySelectorAll('#ref-previews img')).every(i => i.complete && i.naturalWidth > 0)").await;
        let roles = b.js("Array.from(document.querySelectorAll('.shot-role')).map(s => s.selectedOptions[0].text)").await;
        assert_eq!(roles, json!(["Main photo", "Selling point", "Lifestyle scene"]), "roles in plain words");
        for (i, words) in [(1, "the shoe on a white background"), (2, "close-up of the sole"), (3, "on a wet city street")] {
            b.c().find(Locator::Css(&format!("#shot-prompt-{i}"))).await.unwrap().send_keys(words).await.unwrap();
        }
        b.c().find(Locator::Css("#set-style")).await.unwrap().send_keys("soft studio light").await.unwrap();
        b.c().find(Locator::Css("#set-provider")).await.unwrap().select_by_value("demo").await.unwrap();
        b.assert_accessible("the new-set form").await;
        shoot(&b, "new-set", "document.getElementById('new-set') !== null").await;
        b.click("#create-set").await;
        let hash = b.until("the set's page", 20, "location.hash.startsWith('#/sets/0') && location.hash").await;
        let set_id = hash.as_str().unwrap().trim_start_matches("#/sets/").to_string();
        b.until("the set to finish", 30, "document.querySelector('article.detail')?.dataset.status === 'done'").await;
        assert_eq!(b.js("document.querySelector('h1').innerText").await, "Red Sneaker");

        // What the API holds is what was entered.
        let set = d.call("GET", &format!("/v1/sets/{set_id}"), None).json();
        let refs: Vec<&str> = set["references"].as_array().unwrap().iter().map(|r| r["sha256"].as_str().unwrap()).collect();
        assert_eq!(refs, [sha256_hex(&front), sha256_hex(&side)], "both photos, in order");
        let shots: Vec<(&str, &str)> = set["shots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["role"].as_str().unwrap(), s["prompt"].as_str().unwrap()))
            .collect();
        assert_eq!(shots.len(), 3);
        assert_eq!(shots.iter().map(|s| s.0).collect::<Vec<_>>(), ["main", "selling_point", "scene"]);
        assert!(shots[1].1.starts_with("close-up of the sole") && shots[1].1.contains("soft studio light"), "{shots:?}");

        // The set page: the reference photos and each shot as a thumbnail, enlarged on a click.
        b.until("reference thumbnails", 15, "Array.from(document.querySelectorAll('#references img')).filter(i => i.complete && i.naturalWidth > 0).length === 2").await;
        b.until("shot thumbnails", 15, "Array.from(document.querySelectorAll('.shot img.thumb')).filter(i => i.complete && i.naturalWidth > 0 && i.src.endsWith('/thumbnail')).length === 3").await;
        b.assert_accessible("a finished set").await;
        shoot(&b, "set", "document.querySelectorAll('.shot img.thumb').length === 3").await;
        b.click(".shot .thumb-button").await;
        b.until("the enlarged image", 10, "document.getElementById('image-dialog').open && document.getElementById('image-dialog-img').naturalWidth > 0").await;
        b.assert_accessible("the enlarged image").await;
        b.click("#image-dialog-close").await;

        // "Download all": the zip the page links to holds every image under its product and role.
        let zip = b
            .c()
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 fetch(document.getElementById('download-all').href, { credentials: 'same-origin' })
                   .then(r => r.arrayBuffer()).then(buf => {
                     let s = ''; new Uint8Array(buf).forEach(b => s += String.fromCharCode(b)); done(btoa(s)); });",
                vec![],
            )
            .await
            .expect("fetch the zip");
        let entries = unzip(&BASE64_STANDARD.decode(zip.as_str().unwrap()).unwrap());
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["red-sneaker_main.png", "red-sneaker_selling-point.png", "red-sneaker_scene.png"]);
        for ((_, bytes), shot) in entries.iter().zip(set["shots"].as_array().unwrap()) {
            assert_eq!(sha256_hex(bytes), shot["artifacts"][0]["sha256"], "each image is the shot's own");
        }

        // A shot's page links back to its set.
        b.click(".shot .more-link").await;
        b.until("the shot's page", 10, "document.getElementById('back-to-set') !== null").await;
        let back = b.js("document.getElementById('back-to-set').innerText").await;
        assert!(back.as_str().unwrap_or("").contains("Red Sneaker"), "{back}");
        b.assert_accessible("a shot's page").await;

        // The lists show images first: small thumbnails, served small.
        b.js("(location.hash = '#/sets')").await;
        b.until("set thumbnails", 10, "Array.from(document.querySelectorAll('#set-list img.thumb')).some(i => i.complete && i.naturalWidth > 0)").await;
        b.assert_accessible("the sets list").await;
        shoot(&b, "sets", "document.getElementById('set-list') !== null").await;
        let art = set["shots"][0]["artifacts"][0]["url"].as_str().unwrap().to_string();
        let thumb = d.call("GET", &format!("{art}/thumbnail"), None);
        let full = d.call("GET", &art, None);
        assert_eq!(thumb.header("content-type"), Some("image/jpeg"));
        let t = image::load_from_memory(&thumb.body).expect("a thumbnail that decodes");
        assert!(t.width() <= 256 && t.height() <= 256, "{}x{}", t.width(), t.height());
        // Served small: a list's thumbnail is a small JPEG (the demo's flat PNGs are smaller
        // still, so its size is bounded rather than compared with the image's).
        assert!(thumb.body.len() <= 32 * 1024, "the thumbnail is {} bytes", thumb.body.len());
        let i = image::load_from_memory(&full.body).expect("the image decodes");
        assert!(t.width() <= i.width() && t.height() <= i.height(), "the thumbnail is no larger than the image");

        // An unknown job for the list, so every colour is on it.
        mock.behave(json!({ "drop_response": true }));
        let lost = d.call("POST", "/v1/tasks", Some(&json!({ "prompt": "blue mug, answer lost", "provider": "openai" }))).json();
        d.wait_status(lost["id"].as_str().unwrap(), &["unknown"]);
        mock.behave(json!({ "drop_response": false }));

        // Focus stays on a row while it updates live, and the row is the same element.
        b.js("(location.hash = '#/')").await;
        b.until("the jobs list", 10, "document.querySelectorAll('#task-list li').length >= 4").await;
        let slow = d.call("POST", "/v1/tasks", Some(&json!({ "prompt": "green tote on a bench", "provider": "studio" }))).json();
        let slow_id = slow["id"].as_str().unwrap().to_string();
        let row = format!("document.querySelector(\"#task-list li[data-task-id='{slow_id}']\")");
        b.until("the running job", 10, &format!("{row}?.dataset.status === 'running'")).await;
        b.until("list thumbnails", 10, "Array.from(document.querySelectorAll('#task-list img.thumb')).some(i => i.complete && i.naturalWidth > 0)").await;
        b.js(&format!("(window.__row = {row}, window.__row.querySelector('a.task-link').focus(), document.activeElement.__mark = 1)")).await;
        b.until("the job to finish", 20, &format!("{row}?.dataset.status === 'succeeded'")).await;
        assert_eq!(b.js(&format!("{row} === window.__row")).await, true, "the row was replaced");
        assert_eq!(b.js("document.activeElement.__mark === 1 && document.activeElement.matches('a.task-link')").await, true, "focus moved");
        let title = b.js(&format!("{row}.querySelector('.title').innerText")).await;
        assert_eq!(title, "green tote on a bench", "a job is named by its prompt");
        let shot_row = b.js("Array.from(document.querySelectorAll('#task-list li')).find(li => li.innerText.includes('Image set: Red Sneaker')) !== undefined").await;
        assert_eq!(shot_row, true, "the list says which set a job belongs to");
        b.assert_accessible("the jobs list").await;
        shoot(&b, "jobs", "document.querySelectorAll('#task-list li').length >= 5").await;

        // A finished job: image first, "Generate another like this", and the details folded away.
        b.js(&format!("(location.hash = '#/tasks/{slow_id}')")).await;
        b.until("the job's page", 10, "document.getElementById('generate-another') !== null").await;
        assert_eq!(b.js("document.title").await, "green tote on a bench · tally");
        assert_eq!(b.js("document.getElementById('technical').open").await, false);
        let tech = b.js("document.getElementById('technical').textContent").await;
        assert!(tech.as_str().unwrap_or("").contains(&slow_id), "ids live in the technical details");
        b.assert_accessible("a finished job").await;
        shoot(&b, "job", "document.getElementById('task-image')?.complete").await;
        b.click("#generate-another").await;
        // It asks first, naming the price (the demo is free).
        b.until("the confirmation", 5, "document.getElementById('confirm-dialog').open").await;
        let ask = b.js("document.getElementById('confirm-dialog').innerText").await;
        assert!(ask.as_str().unwrap_or("").contains("free"), "{ask}");
        b.click("#confirm-yes").await;
        let again = b.until("another job", 10, &format!("location.hash.startsWith('#/tasks/') && !location.hash.endsWith('{slow_id}') && location.hash")).await;
        let again_id = again.as_str().unwrap().trim_start_matches("#/tasks/").to_string();
        let again = d.call("GET", &format!("/v1/tasks/{again_id}"), None).json();
        assert_eq!((again["prompt"].as_str(), again["provider"].as_str()), (Some("green tote on a bench"), Some("studio")));

        // The unknown job: what it means, the resolve form first.
        b.js(&format!("(location.hash = '#/tasks/{}')", lost["id"].as_str().unwrap())).await;
        b.until("the unknown job", 10, "document.getElementById('resolve-form') !== null").await;
        let order = b.js("document.getElementById('resolve-form').compareDocumentPosition(document.getElementById('retry-task')) & Node.DOCUMENT_POSITION_FOLLOWING").await;
        assert_ne!(order, 0, "recording what you found comes before generating again");
        b.click("#resolve-submit").await;
        let err = b.until("the error next to the button", 5, "!document.getElementById('resolve-error').hidden && document.activeElement.id").await;
        assert_eq!(err, "resolve-error", "the error is focused, next to the control");
        b.assert_accessible("an unknown job").await;
        shoot(&b, "unknown", "document.getElementById('unknown-explainer') !== null").await;

        // Spend: there, even when this daemon does not count spend yet.
        b.js("(location.hash = '#/spend')").await;
        b.until("the spend view", 10, "document.getElementById('spend-table')?.innerText.length > 0").await;
        b.assert_accessible("the spend view").await;
        b.close().await;
    });
}

#[test]
fn a_restart_keeps_the_browser_signed_in_and_sign_out_all_ends_it() {
    let mut d = Daemon::start("[[providers]]\nname = \"demo\"\nkind = \"demo\"\ndelay_ms = 20\n");
    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.c().goto(&url).await.expect("sign in");
        b.until("the jobs page, live", 15, "document.getElementById('prompt') !== null && \
            document.getElementById('live').textContent === 'live'").await;
        b.c().find(Locator::Css("#prompt")).await.unwrap().send_keys("kept while tally restarts").await.unwrap();
        let cookie = b.c().get_named_cookie("tally_session").await.expect("session cookie");
        assert!(cookie.max_age().is_some() || cookie.expires().is_some(), "a cookie that outlives the browser window");

        let status = d.term();
        assert_eq!(status.code(), Some(0));
        b.until("reconnecting", 15, "document.getElementById('live').textContent === 'reconnecting…'").await;
        d.spawn();
        // Back without signing in again: the session was kept in the database.
        b.until("live again", 30, "document.getElementById('live').textContent === 'live'").await;
        assert_eq!(b.js("document.getElementById('signed-out') === null").await, true, "still signed in");
        assert_eq!(b.js("document.getElementById('prompt').value").await, "kept while tally restarts");
        b.js("(location.hash = '#/spend')").await;
        b.until("the spend view", 10, "document.getElementById('spend-table') !== null").await;

        // `tally sign-out --all` ends it: the next request shows the sign-in-again panel.
        let out = d.cli(&["sign-out", "--all"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("signed out 1 browser session"), "{out:?}");
        b.js("(location.hash = '#/sets')").await;
        b.until("the sign-in-again panel", 30, "document.getElementById('signed-out') !== null").await;
        assert_eq!(b.js("document.querySelector('h1').innerText").await, "Sign in again");
        let panel = b.js("document.getElementById('signed-out').innerText").await;
        assert!(panel.as_str().unwrap_or("").contains("tally sign-in"), "{panel}");
        for api_words in ["Bearer", "token", "401", "Authorization"] {
            assert!(!panel.as_str().unwrap_or("").contains(api_words), "API text on the page: {panel}");
        }
        assert_eq!(b.js("document.getElementById('live').textContent").await, "signed out");
        b.assert_accessible("the sign-in-again panel").await;
        shoot(&b, "sign-in-again", "document.getElementById('signed-out') !== null").await;

        // A new link from `tally sign-in`: the page and its live indicator are back.
        let out = d.cli(&["sign-in"]);
        let again = String::from_utf8_lossy(&out.stdout).trim().to_string();
        b.c().goto(&again).await.expect("sign in again");
        b.until("live again", 15, "document.getElementById('live').textContent === 'live'").await;
        // The page has a dark theme for browsers that ask for one.
        let dark = b
            .js("Array.from(document.styleSheets).flatMap(s => Array.from(s.cssRules)) \
                 .some(r => r.media && r.media.mediaText.includes('prefers-color-scheme: dark') && r.cssText.includes('--bg'))")
            .await;
        assert_eq!(dark, true, "a prefers-color-scheme: dark theme");
        b.close().await;
    });
}
