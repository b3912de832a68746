//! A set's reference photos changed in a real browser (issue #27; headless Chromium): added
//! through the set's own file input (and one dropped on it), removed with its button while no request of the set
//! left, each change checked through `GET /v1/sets/{id}` and by the stored bytes' sha256, with
//! the shots each photo goes with named; refused in the page's words (the daemon's 409) once
//! a shot of the set is being generated; dark mode at 320 px axe-clean with no sideways
//! scrolling. And the way forward after a refusal before sending: two photos on a one-photo
//! model, one removed in the page, the shot offered again with its price and a question, and
//! generated — the mock's ledger shows exactly one charged request for it.

use base64::prelude::*;
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::common::{Daemon, Mock, TempDir, request, sha256_hex};
use crate::web::printed_sign_in_url;
use crate::web_views::{check_view, daemon_with_jobs, set_width};

/// The sha256 of each of the set's reference photos, in order, as the API lists them, after
/// checking that the bytes `GET /v1/uploads/{id}` serves hash to what it says.
fn reference_hashes(d: &Daemon, set: &str) -> Vec<String> {
    let s = d.call("GET", &format!("/v1/sets/{set}"), None).json();
    let mut out = Vec::new();
    for r in s["references"].as_array().expect("references") {
        let id = r["id"].as_str().expect("upload id");
        let got = d.call("GET", &format!("/v1/uploads/{id}"), None);
        assert_eq!(got.status, 200, "upload {id}");
        assert_eq!(sha256_hex(&got.body), r["sha256"].as_str().expect("sha256"), "stored bytes of {id}");
        out.push(sha256_hex(&got.body));
    }
    out
}

#[test]
fn reference_photos_are_added_and_removed_in_the_page_and_refused_once_a_shot_is_being_generated() {
    // `slow` keeps the first set's shot running for minutes (one slot), so the second set
    // stays queued: nothing of it was sent.
    let mut d =
        Daemon::configure("[[providers]]\nname = \"slow\"\nkind = \"demo\"\nmax_concurrency = 1\ndelay_ms = 600000\n");
    d.spawn();
    let auth = format!("Bearer {}", d.token());
    let pinned = tally::render::placeholder_png("the running set's photo", 48);
    let r = request(
        d.port,
        "POST",
        "/v1/uploads",
        &[("Authorization", &auth), ("Content-Type", "image/png")],
        Some(&pinned),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let upload = r.json()["id"].as_str().expect("upload id").to_string();
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "lamp", "provider": "slow", "references": [upload],
            "shots": [{"role": "main", "prompt": "on a desk"}]})),
    );
    assert_eq!(r.status, 201);
    let running = r.json()["id"].as_str().expect("id").to_string();
    d.wait_status(r.json()["shots"][0]["id"].as_str().expect("shot"), &["running"]);
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "teapot", "provider": "slow",
            "shots": [{"role": "main", "prompt": "on a table"}, {"role": "scene", "prompt": "in a kitchen"}]})),
    );
    assert_eq!(r.status, 201);
    let set = r.json()["id"].as_str().expect("id").to_string();

    let photos = TempDir::new();
    let front = tally::render::placeholder_png("teapot, front", 64);
    let side = tally::render::placeholder_png("teapot, side", 72);
    let back = tally::render::placeholder_png("teapot, back", 56);
    let (front_path, side_path) = (photos.path().join("front.png"), photos.path().join("side.png"));
    std::fs::write(&front_path, &front).expect("write a photo");
    std::fs::write(&side_path, &side).expect("write a photo");

    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start_with(&["--force-dark-mode"]).await;
        b.c().goto(&url).await.expect("sign in");
        set_width(&b, 320).await;
        b.until("the jobs page", 15, "document.getElementById('new-task') !== null").await;

        // A queued set without photos: the page offers to add some.
        b.js(&format!("(location.hash = '#/sets/{set}')")).await;
        b.until("the photo picker", 10, "document.getElementById('ref-add') !== null").await;
        assert_eq!(b.js("document.getElementById('references')").await, Value::Null, "no photos yet");
        check_view(&b, "a set with no photos, offering to add some").await;

        // Two photos, one after the other, through the set's own file input.
        for (path, n) in [(&front_path, 1), (&side_path, 2)] {
            let input = b.c().find(fantoccini::Locator::Css("#ref-add")).await.expect("picker");
            input.send_keys(path.to_str().expect("path")).await.expect("pick a file");
            b.until(
                "the photo on the page",
                15,
                &format!("document.querySelectorAll('#references li').length === {n} && document.getElementById('ref-add') !== null"),
            )
            .await;
        }
        assert_eq!(reference_hashes(&d, &set), [sha256_hex(&front), sha256_hex(&side)], "both photos, in order");
        // A third, dropped on the section (as in the new-set form).
        b.c()
            .execute(
                "const bytes = Uint8Array.from(atob(arguments[0]), c => c.charCodeAt(0));
                 const dt = new DataTransfer();
                 dt.items.add(new File([bytes], 'back.png', { type: 'image/png' }));
                 document.getElementById('ref-drop').dispatchEvent(
                   new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
                 return true;",
                vec![json!(BASE64_STANDARD.encode(&back))],
            )
            .await
            .expect("drop a photo");
        b.until("three photos", 15, "document.querySelectorAll('#references li').length === 3").await;
        let all = [sha256_hex(&front), sha256_hex(&side), sha256_hex(&back)];
        assert_eq!(reference_hashes(&d, &set), all, "three photos, in order");
        let shown: Value = b.js("Array.from(document.querySelectorAll('#references li')).map(li => li.dataset.sha256)").await;
        assert_eq!(shown, json!(all), "the page shows what the daemon stores");
        // Which shots each photo goes with: every shot of the set.
        let used = b.js("document.getElementById('ref-used-1').textContent").await;
        assert_eq!(used, json!("Sent with every shot: 1. Main photo, 2. Lifestyle scene"));
        b.until(
            "the thumbnails",
            10,
            "Array.from(document.querySelectorAll('#references img')).every(i => i.complete && i.naturalWidth > 0)",
        )
        .await;
        check_view(&b, "a set with two photos that can still change").await;

        // Remove the first: the others stay, in order, their bytes unchanged.
        b.click("#ref-remove-0").await;
        b.until("two photos left", 10, "document.querySelectorAll('#references li').length === 2").await;
        assert_eq!(reference_hashes(&d, &set), [sha256_hex(&side), sha256_hex(&back)], "the first one is gone");
        let timeline = d.call("GET", &format!("/v1/sets/{set}"), None).json()["timeline"].clone();
        assert!(timeline.to_string().contains("reference photos (2 now)"), "{timeline}");

        // The running set: the daemon refuses (its shot is being generated), and the page says
        // so in plain words, next to the photos; nothing changes.
        b.js(&format!("(location.hash = '#/sets/{running}')")).await;
        b.until("the running set's photos", 10, "document.getElementById('ref-remove-0') !== null").await;
        b.click("#ref-remove-0").await;
        let said = b.until("the refusal", 10, "!document.getElementById('refs-error').hidden && document.getElementById('refs-error').textContent").await;
        let said = said.as_str().unwrap_or("");
        assert!(
            said.contains("shot 1 (Main photo) is being generated now")
                && said.contains("can no longer be changed")
                && said.contains("Duplicate the set"),
            "{said}"
        );
        assert_eq!(reference_hashes(&d, &running), [sha256_hex(&pinned)], "the refused edit changed nothing");
        check_view(&b, "a refused change of the photos").await;
        b.close().await;
    });
}

#[test]
fn a_shot_refused_for_two_photos_is_generated_once_one_is_removed_in_the_page() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let (d, jobs) = daemon_with_jobs(&mock);
    assert_eq!(mock.count("the teapot on white"), (0, 0), "the refusal sent nothing");
    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&url).await;

        // Refused, with the fix, and no retry while both photos are there.
        b.js(&format!("(location.hash = '#/sets/{}')", jobs.set)).await;
        let fix = b.until("the shot's fix", 15, "document.getElementById('shot-fix-0')?.textContent").await;
        assert!(fix.as_str().unwrap_or("").contains("remove 1 of the reference photos"), "{fix}");
        assert_eq!(b.js("document.getElementById('shot-retry-0')").await, Value::Null, "no retry that cannot help");

        // Remove the second photo in the page: the shot is offered again, with its price.
        b.click("#ref-remove-1").await;
        b.until("the retry", 10, "document.getElementById('shot-retry-0') !== null").await;
        assert_eq!(b.js("document.querySelectorAll('#references li').length").await, json!(1));
        let fix = b.js("document.getElementById('shot-fix-0').textContent").await;
        assert!(fix.as_str().unwrap_or("").contains("now has 1 reference photo"), "{fix}");
        let price = b.js("document.getElementById('shot-retry-price-0').textContent").await;
        assert_eq!(price, json!("Trying again sends a new request to flux: about $0.04."));
        let t = d.call("GET", &format!("/v1/tasks/{}", jobs.refused), None).json();
        let r = &t["refused_before_sending"];
        assert_eq!((r["retry_helps"].as_bool(), r["references_now"].as_u64()), (Some(true), Some(1)), "{t}");
        assert_eq!(r["references_given"], 2, "the record of what was refused stays");
        assert_eq!(t["charge"]["state"], "none", "nothing was sent, so nothing was charged");
        b.assert_accessible("a refused shot that can be generated again").await;

        // The job's own page says the same: the retry, its price, no "no retry" note.
        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.refused)).await;
        let price = b.until("the job's retry price", 10, "document.getElementById('retry-price')?.textContent").await;
        assert!(price.as_str().unwrap_or("").contains("$0.04"), "{price}");
        assert_eq!(b.js("document.getElementById('refusal-no-retry')").await, Value::Null);
        assert!(b.js("document.getElementById('retry-task') !== null").await == json!(true));

        // Back on the set: Retry asks first, naming the price; saying no sends nothing.
        b.js(&format!("(location.hash = '#/sets/{}')", jobs.set)).await;
        b.until("the retry", 10, "document.getElementById('shot-retry-0') !== null").await;
        b.click("#shot-retry-0").await;
        b.until("the question", 5, "document.getElementById('confirm-dialog').open").await;
        let ask = b.js("document.getElementById('confirm-dialog').innerText").await;
        let ask = ask.as_str().unwrap_or("");
        assert!(ask.contains("about $0.04") && ask.contains("Nothing was charged"), "{ask}");
        b.assert_accessible("the retry question").await;
        b.click("#confirm-no").await;
        b.until("the dialog closed", 5, "!document.getElementById('confirm-dialog').open").await;
        assert_eq!(mock.count("the teapot on white"), (0, 0), "saying no sent nothing");
        b.click("#shot-retry-0").await;
        b.until("the question", 5, "document.getElementById('confirm-dialog').open").await;
        b.click("#confirm-yes").await;
        b.until(
            "the shot generated",
            30,
            "document.querySelector('li.shot[data-position=\"0\"]')?.dataset.status === 'succeeded'",
        )
        .await;
        b.close().await;
    });
    let s = d.call("GET", &format!("/v1/sets/{}", jobs.set), None).json();
    assert_eq!(s["shots"][0]["status"], "succeeded", "{s}");
    assert_eq!(s["references"].as_array().map(Vec::len), Some(1));
    assert_eq!(mock.count("the teapot on white"), (1, 1), "exactly one request, charged once");
}
