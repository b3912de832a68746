//! Operations on a finished image in a real browser (headless Chromium, axe-core on each view;
//! issue #35): "Edit this image…" with an instruction on the free demo, the result beside its
//! source and the source listing what was made from it; "Cut out the product" on a paid
//! provider naming its price beside the button and in its question, saying no sending nothing
//! (the mock's ledger) and yes sending one charged request; both in English and in Chinese.

use fantoccini::Locator;
use serde_json::json;

use crate::browser::Browser;
use crate::common::{Daemon, Mock, OPENAI_MODEL};
use crate::web::printed_sign_in_url;

fn ops_providers(mock: &Mock) -> String {
    format!(
        "[[providers]]\nname = \"demo\"\nkind = \"demo\"\ndelay_ms = 20\n\n\
         [[providers]]\nname = \"oa\"\nkind = \"openai_images\"\nbase_url = \"{b}\"\nmodel = \"{OPENAI_MODEL}\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nprice_per_image = 0.04\n\n\
         [[providers]]\nname = \"pr\"\nkind = \"photoroom\"\nbase_url = \"{b}\"\napi_key_env = \"TALLY_TEST_KEY\"\n\
         price_per_image = 0.02\n",
        b = mock.base()
    )
}

fn charged(mock: &Mock) -> usize {
    mock.lines().iter().filter(|l| l["charged"] == true).count()
}

fn edit_and_cut_out_from_the_page(language: &str) {
    let mock = Mock::start(&[]);
    let ui = if language == "zh-CN" { "[ui]\nlanguage = \"zh-CN\"\n\n" } else { "" };
    let mut d = Daemon::configure(&format!("{ui}{}", ops_providers(&mock)));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    let url = printed_sign_in_url(&d);
    let src = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "a blue mug", "provider": "demo"}))).json();
    let src_id = src["id"].as_str().expect("id").to_string();
    d.wait_status(&src_id, &["succeeded"]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&url).await;
        b.js(&format!("(location.hash = '#/tasks/{src_id}')")).await;
        b.until("the operations", 10, "document.getElementById('edit-send') !== null").await;
        // The demo edits for free: said beside the button; the cutout offers both providers.
        let price = b.js("document.getElementById('edit-price').textContent").await;
        let free = if language == "zh-CN" { "免费" } else { "Free" };
        assert!(price.as_str().unwrap_or("").contains(free), "{price}");
        b.assert_accessible("a finished job with its operations").await;
        b.screenshot(&format!("ops-source-{language}")).await;

        // An empty instruction is refused in the page, sending nothing.
        b.click("#edit-send").await;
        b.until("the empty-instruction error", 5, "!document.getElementById('edit-error').hidden").await;
        b.c().find(Locator::Css("#edit-instruction")).await.expect("instruction").send_keys("on marble").await.expect("type");
        b.click("#edit-send").await;
        let edit_id = b
            .until(
                "the edit's page",
                10,
                &format!("location.hash.startsWith('#/tasks/') && !location.hash.endsWith('{src_id}') && location.hash.slice(8)"),
            )
            .await;
        let edit_id = edit_id.as_str().expect("id").to_string();
        let edit = d.wait_status(&edit_id, &["succeeded", "failed", "unknown"]);
        assert_eq!((edit["status"].as_str(), edit["operation"].as_str()), (Some("succeeded"), Some("edit")), "{edit}");
        assert_eq!(edit["prompt"], "on marble");
        // The result beside the image it was made from, linked to the job that made it.
        b.until("the source image", 10, "document.getElementById('source-image') !== null").await;
        let link = b.js("document.getElementById('source-job').getAttribute('href')").await;
        assert_eq!(link.as_str(), Some(format!("#/tasks/{src_id}").as_str()));
        b.until("the result", 10, "document.getElementById('task-image') !== null").await;
        b.assert_accessible("an edit beside its source").await;

        // Back on the source: what was made from it.
        b.js(&format!("(location.hash = '#/tasks/{src_id}')")).await;
        let listed = b.until("the derived list", 10, "document.querySelector('#derived a')?.getAttribute('href')").await;
        assert_eq!(listed.as_str(), Some(format!("#/tasks/{edit_id}").as_str()));

        // A paid cutout: the price beside the button and in the question; no sends nothing.
        b.c()
            .find(Locator::Css("#cutout-provider"))
            .await
            .expect("cutout provider")
            .select_by_value("pr")
            .await
            .expect("pick");
        let label = b.js("document.getElementById('cutout-send').textContent").await;
        assert!(label.as_str().unwrap_or("").contains("$0.02"), "the price on the button: {label}");
        let ask = b.ask("#cutout-send").await;
        assert!(ask.contains("$0.02"), "the question names the price: {ask}");
        b.assert_accessible("the cutout question").await;
        b.say_no().await;
        assert_eq!(charged(&mock), 0, "saying no sent nothing");
        b.ask("#cutout-send").await;
        b.click("#confirm-yes").await;
        let cut_id = b
            .until(
                "the cutout's page",
                10,
                &format!("location.hash.startsWith('#/tasks/') && !location.hash.endsWith('{src_id}') && location.hash.slice(8)"),
            )
            .await;
        let cut = d.wait_status(cut_id.as_str().expect("id"), &["succeeded", "failed", "unknown"]);
        assert_eq!((cut["status"].as_str(), cut["operation"].as_str()), (Some("succeeded"), Some("cutout")), "{cut}");
        assert_eq!(charged(&mock), 1, "saying yes sent one charged request");
        b.until("the cutout beside its source", 10, "document.getElementById('source-image') !== null").await;
        b.assert_accessible("a cutout").await;
        b.screenshot(&format!("ops-cutout-{language}")).await;
        b.close().await;
    });
    d.term();
}

#[test]
fn edit_and_cut_out_a_finished_image_from_the_page() {
    edit_and_cut_out_from_the_page("en");
}

#[test]
fn edit_and_cut_out_a_finished_image_from_the_page_in_chinese() {
    edit_and_cut_out_from_the_page("zh-CN");
}
