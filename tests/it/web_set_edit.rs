//! Set edit and duplicate in a real browser (issue #27's "Done when"; headless Chromium in
//! dark mode at 320 px, each view axe-core clean with no sideways scrolling and no small tap
//! target): a typo fixed in a queued shot through its Edit form (the daemon
//! stores it, the card shows it), a running shot offering no Edit, the product and style of a
//! set with nothing sent changed (every shot follows), a duplicate opened as a copy to edit
//! and started with "Start generating" (a priced provider's question names the amount; saying
//! no sends nothing; the copy never started is deleted), and a failed set deleted after a
//! confirmation while Spend still lists its charge.

use std::time::Duration;

use fantoccini::Locator;
use serde_json::json;

use crate::browser::Browser;
use crate::common::{Daemon, Mock, wait_for};
use crate::web::printed_sign_in_url;
use crate::web_views::{check_view, set_width};

fn set_count(d: &Daemon) -> usize {
    d.call("GET", "/v1/sets?limit=100", None).json()["sets"].as_array().map_or(0, Vec::len)
}

#[test]
fn a_queued_shot_is_edited_a_set_duplicated_and_a_failed_set_deleted_in_the_page() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let base = mock.base();
    // `slow` keeps a set's first shot running for minutes, so its later shots stay queued.
    let mut d = Daemon::configure(&format!(
        "[[providers]]\nname = \"slow\"\nkind = \"demo\"\nmax_concurrency = 1\ndelay_ms = 600000\n\n\
         [[providers]]\nname = \"paid\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\nmodel = \"gpt-image-1\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 2\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n\
         price_per_image = 0.04\n"
    ));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "teapot", "provider": "slow",
            "shots": [{"role": "main", "prompt": "on a table"}, {"role": "scene", "prompt": "in a kitchin"}]})),
    );
    assert_eq!(r.status, 201);
    let set = r.json()["id"].as_str().expect("id").to_string();
    let first = r.json()["shots"][0]["id"].as_str().expect("shot").to_string();
    d.wait_status(&first, &["running"]);

    // A failed set whose request reached the provider: the answer is lost, and the owner
    // records from the dashboard that it failed and was charged.
    mock.behave(json!({ "drop_response": true }));
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "kettle", "provider": "paid", "shots": [{"role": "main", "prompt": "on white"}]})),
    );
    let failed = r.json()["id"].as_str().expect("id").to_string();
    let lost = r.json()["shots"][0]["id"].as_str().expect("shot").to_string();
    let unknown = wait_for(Duration::from_secs(30), || {
        (d.call("GET", &format!("/v1/tasks/{lost}"), None).json()["status"] == "unknown").then_some(())
    });
    mock.behave(json!({ "drop_response": false }));
    assert!(unknown.is_some(), "the lost shot did not become unknown");
    let r =
        d.call("POST", &format!("/v1/tasks/{lost}/resolve"), Some(&json!({"outcome": "failed", "charge": "charged"})));
    assert_eq!(r.status, 200);

    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        // Dark mode at 320 px, the strictest of the page's looks: every view and form below is
        // checked with axe-core, for sideways scrolling and for tap targets under 24 × 24 px.
        let b = Browser::start_with(&["--force-dark-mode"]).await;
        b.c().goto(&url).await.expect("sign in");
        set_width(&b, 320).await;
        b.until("the jobs page", 15, "document.getElementById('new-task') !== null").await;

        // The set: the queued shot offers Edit, the running one does not.
        b.js(&format!("(location.hash = '#/sets/{set}')")).await;
        b.until("the set", 10, "document.getElementById('shot-edit-1') !== null").await;
        assert_eq!(b.js("document.getElementById('shot-edit-0') === null").await, true, "a running shot is not editable");
        assert_eq!(b.js("document.getElementById('delete-set') === null").await, true, "a running set is not deletable");
        check_view(&b, "a set with a queued shot").await;
        b.click("#shot-edit-1").await;
        b.until("the edit form", 5, "document.getElementById('shot-edit-prompt-1') !== null").await;
        let words = b.js("document.getElementById('shot-edit-prompt-1').value").await;
        assert_eq!(words, "in a kitchin", "the form starts from the shot's own words");
        check_view(&b, "the shot's edit form").await;
        let field = b.c().find(Locator::Css("#shot-edit-prompt-1")).await.expect("prompt");
        field.clear().await.expect("clear");
        field.send_keys("in a kitchen").await.expect("type");
        b.click("#shot-edit-save-1").await;
        b.until(
            "the fixed words on the card",
            10,
            "document.getElementById('shot-edit-form-1') === null && \
             document.querySelector('li.shot[data-position=\"1\"]').innerText.includes('in a kitchen')",
        )
        .await;
        let stored = d.call("GET", &format!("/v1/sets/{set}"), None).json();
        assert_eq!(stored["shots"][1]["prompt"], "in a kitchen — product: teapot");
        assert_eq!(stored["shots"][1]["status"], "queued", "still waiting its turn, nothing sent");
        assert_eq!(stored["shots"][0]["prompt"], "on a table — product: teapot", "the running shot is untouched");

        // Duplicate (the question says the copy sends nothing until it is started); the copy
        // opens, a copy to edit with "Start generating".
        let before = set_count(&d);
        b.click("#duplicate-set").await;
        b.until("the question", 5, "document.getElementById('confirm-dialog').open").await;
        let ask = b.js("document.getElementById('confirm-dialog').innerText").await;
        assert!(ask.as_str().unwrap_or("").contains("until you press Start generating"), "{ask}");
        b.click("#confirm-yes").await;
        b.until(
            "the copy",
            10,
            &format!("location.hash.startsWith('#/sets/') && !location.hash.endsWith('{set}') && document.getElementById('shots') !== null"),
        )
        .await;
        assert_eq!(set_count(&d), before + 1);
        let hash = b.js("location.hash").await;
        let copy = hash.as_str().unwrap_or("").trim_start_matches("#/sets/").to_string();
        let copied = d.call("GET", &format!("/v1/sets/{copy}"), None).json();
        assert_eq!((copied["product"].clone(), copied["status"].clone()), (json!("teapot"), json!("draft")));
        b.until("Start generating", 10, "document.getElementById('start-set') !== null").await;
        let price = b.js("document.getElementById('start-price').innerText").await;
        assert!(price.as_str().unwrap_or("").contains("free"), "the demo is free: {price}");
        assert_eq!(copied["shots"][1]["prompt"], "in a kitchen — product: teapot", "the copy has the fix");
        // Its history names the set it came from by a link, not a raw id.
        let link = b.until("the history's link", 10, "document.querySelector('#set-timeline a.set-link')?.dataset.setId").await;
        assert_eq!(link, json!(set), "the link opens the original");
        let lines = b.js("document.getElementById('set-timeline').innerText").await;
        assert!(!lines.as_str().unwrap_or("").contains(&set), "a raw id in the history: {lines}");
        check_view(&b, "the duplicated set").await;
        // Nothing of the copy was sent (the slow provider's one slot is busy): its product and
        // style can change, and every shot follows.
        b.until("the copy's set edit", 10, "document.getElementById('set-edit') !== null").await;
        b.click("#set-edit").await;
        b.until("the set's edit form", 5, "document.getElementById('set-edit-product') !== null").await;
        check_view(&b, "the set's edit form").await;
        let field = b.c().find(Locator::Css("#set-edit-product")).await.expect("product");
        field.clear().await.expect("clear");
        field.send_keys("green teapot").await.expect("type");
        b.c().find(Locator::Css("#set-edit-style")).await.expect("style").send_keys("soft light").await.expect("type");
        b.click("#set-edit-save").await;
        b.until("the new title", 10, "document.querySelector('h1') && document.querySelector('h1').innerText.includes('green teapot')")
            .await;
        let edited = d.call("GET", &format!("/v1/sets/{copy}"), None).json();
        assert_eq!((edited["product"].clone(), edited["style"].clone()), (json!("green teapot"), json!("soft light")));
        for shot in edited["shots"].as_array().expect("shots") {
            let p = shot["prompt"].as_str().unwrap_or_default();
            assert!(p.ends_with(" — product: green teapot; style: soft light"), "{p}");
        }
        assert_eq!(
            d.call("GET", &format!("/v1/sets/{set}"), None).json()["product"],
            "teapot",
            "the original is untouched"
        );
        // Started (free: nothing to ask): it is a set like any other now.
        b.click("#start-set").await;
        b.until("the started copy", 10, "document.getElementById('start-set') === null").await;
        assert_eq!(d.call("GET", &format!("/v1/sets/{copy}"), None).json()["status"], "running");

        // The failed set: no Edit; its copy's start is priced (saying no sends nothing), and the
        // copy never started is deleted.
        b.js(&format!("(location.hash = '#/sets/{failed}')")).await;
        b.until("the failed set", 10, "document.getElementById('delete-set') !== null").await;
        assert_eq!(b.js("document.getElementById('shot-edit-0') === null").await, true);
        check_view(&b, "a failed set").await;
        let sent = mock.lines().len();
        b.click("#duplicate-set").await;
        b.until("the question", 5, "document.getElementById('confirm-dialog').open").await;
        b.click("#confirm-yes").await;
        b.until("the paid copy", 10, &format!("!location.hash.endsWith('{failed}') && document.getElementById('start-set') !== null"))
            .await;
        let price = b.js("document.getElementById('start-price').innerText").await;
        assert!(price.as_str().unwrap_or("").contains("$0.04"), "the price beside the button: {price}");
        check_view(&b, "a copy to edit").await;
        b.click("#start-set").await;
        b.until("the question", 5, "document.getElementById('confirm-dialog').open").await;
        let ask = b.js("document.getElementById('confirm-dialog').innerText").await;
        assert!(ask.as_str().unwrap_or("").contains("$0.04"), "the question names the price: {ask}");
        b.click("#confirm-no").await;
        b.until("the dialog closed", 5, "!document.getElementById('confirm-dialog').open").await;
        let hash = b.js("location.hash").await;
        let paid_copy = hash.as_str().unwrap_or("").trim_start_matches("#/sets/").to_string();
        assert_eq!(d.call("GET", &format!("/v1/sets/{paid_copy}"), None).json()["status"], "draft");
        assert_eq!(mock.lines().len(), sent, "saying no sent nothing");
        let before = set_count(&d);
        b.click("#delete-set").await;
        b.until("the question", 5, "document.getElementById('confirm-dialog').open").await;
        b.click("#confirm-yes").await;
        b.until("the sets list", 10, "location.hash === '#/sets' && document.getElementById('set-list') !== null").await;
        assert_eq!(set_count(&d), before - 1, "the copy never started is deleted");
        b.js(&format!("(location.hash = '#/sets/{failed}')")).await;
        b.until("the failed set", 10, "document.getElementById('delete-set') !== null").await;
        b.click("#delete-set").await;
        b.until("the question", 5, "document.getElementById('confirm-dialog').open").await;
        let ask = b.js("document.getElementById('confirm-dialog').innerText").await;
        assert!(ask.as_str().unwrap_or("").contains("Spend"), "{ask}");
        check_view(&b, "the delete question").await;
        b.click("#confirm-yes").await;
        b.until("the sets list", 10, "location.hash === '#/sets' && document.getElementById('set-list') !== null").await;
        assert_eq!(d.call("GET", &format!("/v1/sets/{failed}"), None).status, 404);
        let listed = b.js("document.getElementById('set-list').innerText").await;
        assert!(!listed.as_str().unwrap_or("").contains("kettle"), "{listed}");

        // Spend still lists its charge.
        b.js("(location.hash = '#/spend')").await;
        b.until("the spend table", 10, "document.getElementById('spend-rows') !== null").await;
        let spend = b.js("document.getElementById('spend-rows').innerText").await;
        assert!(spend.as_str().unwrap_or("").contains("$0.04"), "{spend}");
        let job = d.call("GET", &format!("/v1/tasks/{lost}"), None).json();
        assert_eq!(job["charge"]["state"], "charged", "{job}");
        b.close().await;
    });
}
