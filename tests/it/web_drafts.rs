//! "Start from photos" in a real browser (issue #36; headless Chromium at phone width): a
//! photo picked and one dropped in the page, the product named, the price of drafting shown
//! before anything is sent, the draft read, a question answered and a shot edited (each a new
//! revision through `PATCH /v1/drafts/{id}`; a stale one said in plain words and the latest
//! shown; the draft found again from the image sets page), the set's total price shown before
//! confirming, then the set made and generated — in English (light) and in Simplified Chinese
//! (dark, no run of English words), axe-clean with nothing scrolling sideways. And a draft on
//! a provider that bills (`openai_responses` on the mock) and its set on one that charges per
//! image: their prices shown before each is sent (the page's estimate of a redraft is the
//! daemon's), nothing sent before "yes", one charged drafting request, and the set generated.
//! And a draft whose answer failed tally's schema: why, in the daemon's words, and the answer
//! kept; the form refusing to draft without a photo.

use base64::prelude::*;
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::common::{Daemon, FAST_DEMO, Mock, TempDir};
use crate::web::printed_sign_in_url;
use crate::web_views::{check_view, set_width};

/// Two product photos on disk, for the page's file input.
fn photo_files(dir: &TempDir) -> Vec<String> {
    ["cup, front", "cup, side"]
        .iter()
        .enumerate()
        .map(|(i, words)| {
            let path = dir.path().join(format!("cup-{i}.png"));
            std::fs::write(&path, tally::render::placeholder_png(words, 64)).expect("write a photo");
            path.to_string_lossy().to_string()
        })
        .collect()
}

/// The first amount in dollars in `text` ("$0.005").
fn amount_in(text: &str) -> String {
    let from = text.find('$').unwrap_or_else(|| panic!("no amount in {text}"));
    text[from..]
        .chars()
        .take_while(|c| *c == '$' || *c == '.' || c.is_ascii_digit())
        .collect::<String>()
        .trim_end_matches('.')
        .to_string()
}

/// Type `text` into the field `css` (emptied first), as a person would.
async fn type_into(b: &Browser, css: &str, text: &str) {
    let el = b.c().find(fantoccini::Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
    el.clear().await.unwrap_or_else(|e| panic!("clear {css}: {e}"));
    el.send_keys(text).await.unwrap_or_else(|e| panic!("type into {css}: {e}"));
}

/// Choose `value` in the select `css`.
async fn choose(b: &Browser, css: &str, value: &str) {
    let el = b.c().find(fantoccini::Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
    el.select_by_value(value).await.unwrap_or_else(|e| panic!("choose {value} in {css}: {e}"));
}

/// From the image sets to the filled "Start from photos" form: the photos picked, the
/// product named, one fact given, the marketplace, language and drafting provider chosen.
async fn fill_the_form(b: &Browser, photos: &[String], product: &str, material: &str, lang: &str, provider: &str) {
    b.js("(location.hash = '#/sets')").await;
    b.until("the entry", 15, "document.getElementById('new-draft-link') !== null").await;
    b.click("#new-draft-link").await;
    b.until("the form", 15, "document.getElementById('draft-product') !== null").await;
    // The first photo picked, the second dropped on the form.
    let input = b.c().find(fantoccini::Locator::Css("#draft-photos")).await.expect("picker");
    input.send_keys(&photos[0]).await.expect("pick a photo");
    b.until("the photo listed", 10, "document.querySelectorAll('#draft-previews li').length === 1").await;
    let bytes = std::fs::read(&photos[1]).expect("read a photo");
    b.c()
        .execute(
            "const bytes = Uint8Array.from(atob(arguments[0]), c => c.charCodeAt(0));
             const dt = new DataTransfer();
             dt.items.add(new File([bytes], 'cup-1.png', { type: 'image/png' }));
             document.getElementById('draft-drop').dispatchEvent(
               new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
             return true;",
            vec![json!(BASE64_STANDARD.encode(&bytes))],
        )
        .await
        .expect("drop a photo");
    b.until("both photos listed", 10, "document.querySelectorAll('#draft-previews li').length === 2").await;
    type_into(b, "#draft-product", product).await;
    type_into(b, "#draft-fact-material", material).await;
    choose(b, "#draft-marketplace", if lang == "zh-CN" { "taobao" } else { "amazon" }).await;
    choose(b, "#draft-language", lang).await;
    choose(b, "#draft-provider", provider).await;
}

/// The draft the page shows, once it is ready: its id and the API's view of it.
async fn ready_draft(b: &Browser, d: &Daemon) -> (String, Value) {
    let id = b
        .until(
            "the draft's address",
            20,
            "location.hash !== '#/drafts/new' && (location.hash.match(/^#\\/drafts\\/([^/]+)$/) || [])[1]",
        )
        .await;
    let id = id.as_str().expect("a draft id").to_string();
    b.until("the draft ready", 30, "document.getElementById('draft-confirm') !== null").await;
    (id.clone(), d.call("GET", &format!("/v1/drafts/{id}"), None).json())
}

/// Wait for the page to show revision `n`.
async fn revision(b: &Browser, n: i64) {
    b.until(
        &format!("revision {n}"),
        15,
        &format!("document.querySelector('article.draft')?.dataset.revision === '{n}'"),
    )
    .await;
}

/// On the set the confirmation opened: every candidate of every shot generated.
async fn set_generates(b: &Browser, d: &Daemon) -> Value {
    let id = b.until("the set's address", 20, "(location.hash.match(/^#\\/sets\\/([^/]+)$/) || [])[1]").await;
    let id = id.as_str().expect("a set id").to_string();
    b.until(
        "every shot generated",
        60,
        "document.querySelectorAll('li.shot').length > 0 && \
         Array.from(document.querySelectorAll('li.shot')).every(s => s.dataset.status === 'succeeded')",
    )
    .await;
    let s = d.call("GET", &format!("/v1/sets/{id}"), None).json();
    for shot in s["shots"].as_array().expect("shots") {
        for c in shot["candidates"].as_array().expect("candidates") {
            assert_eq!(c["status"], "succeeded", "{s}");
        }
    }
    s
}

/// The whole flow on the demo in one language: photos → draft (free, said before) → answer a
/// question → edit a shot → confirm (free, said before) → the set generates.
async fn demo_flow(b: &Browser, d: &Daemon, photos: &[String], lang: &str) {
    let zh = lang == "zh-CN";
    let (product, material) = if zh { ("青花瓷茶杯", "陶瓷") } else { ("blue porcelain cup", "porcelain") };
    fill_the_form(b, photos, product, material, lang, "demo").await;
    b.until("the demo's price", 10, "document.getElementById('draft-price').textContent.includes(' demo ')").await;
    let price = b.js("document.getElementById('draft-price').textContent").await;
    let free = if zh {
        "用 demo 起草是免费的：它从不收费。"
    } else {
        "Drafting with demo is free: it never charges."
    };
    assert_eq!(price, json!(free), "the price before drafting");
    check_view(b, &format!("the new-draft form ({lang})")).await;
    if zh {
        crate::language::assert_no_english(
            b,
            "the new-draft form in Chinese",
            &[product, material, "cup-0.png", "cup-1.png"],
        )
        .await;
    }
    let drafts_before = d.call("GET", "/v1/drafts", None).json()["drafts"].as_array().map_or(0, Vec::len);
    let sets_before = d.call("GET", "/v1/sets", None).json()["sets"].as_array().map_or(0, Vec::len);
    b.click("#draft-create").await;
    let (id, dr) = ready_draft(b, d).await;
    assert_eq!(d.call("GET", "/v1/drafts", None).json()["drafts"].as_array().map(Vec::len), Some(drafts_before + 1));
    assert_eq!((dr["status"].as_str(), dr["revision"].as_i64()), (Some("ready"), Some(1)), "{dr}");
    assert_eq!(dr["photos"].as_array().map(Vec::len), Some(2), "both photos: {dr}");
    assert_eq!((dr["language"].as_str(), dr["provider"].as_str()), (Some(lang), Some("demo")));
    let title = b.js("document.getElementById('draft-copy-title-text').textContent").await;
    assert_eq!(title, dr["copy"]["title"], "the copy's title");
    let shots = b.js("document.querySelectorAll('#draft-shots > li').length").await;
    assert_eq!(shots.as_u64(), dr["shots"].as_array().map(|s| s.len() as u64));
    let owner = b.js("document.querySelector('#draft-fact-list li[data-key=\"material\"]').innerText").await;
    let said =
        if zh { "材质：陶瓷 （你提供的，已确认）" } else { "Material: porcelain (from you, confirmed)" };
    assert_eq!(owner.as_str().map(|s| s.split_whitespace().collect::<Vec<_>>().join(" ")).as_deref(), Some(said));
    let charge = b.js("document.getElementById('draft-charge').textContent").await;
    assert_eq!(charge, json!(if zh { "免费：demo 从不收费。" } else { "Free: demo never charges." }));
    check_view(b, &format!("a ready draft ({lang})")).await;
    if zh {
        // The demo's bullets name the fact's key as given ("material").
        crate::language::assert_no_english(b, "a ready draft in Chinese", &[product, material, "demo"]).await;
    }

    // Answer the first question with its second option: revision 2, the answer recorded.
    let q = dr["questions"][0].clone();
    let option = q["options"][1].as_str().expect("an option").to_string();
    b.click("#draft-q-0-1").await;
    b.click("#draft-q-save-0").await;
    revision(b, 2).await;
    let shown = b.until("the answer", 10, "document.getElementById('draft-q-answer-0')?.textContent").await;
    assert!(shown.as_str().unwrap_or("").ends_with(&option), "{shown}");
    let dr = d.call("GET", &format!("/v1/drafts/{id}"), None).json();
    assert_eq!(dr["questions"][0]["answer"], json!(option), "{dr}");

    // The image sets page lists the draft not confirmed yet; its link leads back to it.
    b.js("(location.hash = '#/sets')").await;
    let link = format!("#open-draft-list li[data-draft-id=\"{id}\"] a");
    b.until("the draft listed", 10, &format!("document.querySelector('{link}') !== null")).await;
    check_view(b, &format!("the image sets with a draft not confirmed yet ({lang})")).await;
    b.click(&link).await;
    revision(b, 2).await;

    // Someone changes the draft behind the page's back: the page's next edit is stale, says so
    // in plain words, and shows the latest revision; made again, it is saved.
    let mut copy = dr["copy"].clone();
    copy["title"] = json!(format!("{product}!"));
    let r = d.call("PATCH", &format!("/v1/drafts/{id}"), Some(&json!({"revision": 2, "copy": copy})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let prompt = if zh { "白色大理石上的茶杯，柔和的光" } else { "the cup on white marble, soft light" };
    for attempt in 0..2 {
        b.click("#draft-shot-edit-0").await;
        type_into(b, "#draft-shot-prompt-in-0", prompt).await;
        choose(b, "#draft-shot-candidates-in-0", "1").await;
        b.click("#draft-shot-save-0").await;
        if attempt == 0 {
            let said = b.until("the stale revision said", 10, "!document.getElementById('draft-error').hidden && document.getElementById('draft-error').textContent").await;
            let stale = if zh { "刚刚在别处" } else { "changed meanwhile" };
            assert!(said.as_str().unwrap_or("").contains(stale), "{said}");
            revision(b, 3).await;
            let t = b.js("document.getElementById('draft-copy-title-text').textContent").await;
            assert_eq!(t, json!(format!("{product}!")), "the latest revision is shown");
            assert_eq!(d.call("GET", &format!("/v1/drafts/{id}"), None).json()["revision"], 3, "nothing saved");
        }
    }
    revision(b, 4).await;
    let dr = d.call("GET", &format!("/v1/drafts/{id}"), None).json();
    assert_eq!(
        (dr["shots"][0]["prompt"].as_str(), dr["shots"][0]["candidates"].as_i64()),
        (Some(prompt), Some(1)),
        "{dr}"
    );
    assert_eq!(b.js("document.getElementById('draft-shot-prompt-0').textContent").await, json!(prompt));

    // The set's price before confirming: free on the demo.
    let images: i64 =
        dr["shots"].as_array().expect("shots").iter().map(|s| s["candidates"].as_i64().unwrap_or(1)).sum();
    let total = b.js("document.getElementById('draft-confirm-price').textContent").await;
    let n = dr["shots"].as_array().map_or(0, Vec::len);
    let expect = if zh {
        format!("{n} 个镜头，共 {images} 张图片，用 demo：免费。")
    } else {
        format!("{n} shots, {images} images at demo: free.")
    };
    assert_eq!(total, json!(expect), "the total before confirming");
    check_view(b, &format!("an edited draft ({lang})")).await;
    assert_eq!(
        d.call("GET", "/v1/sets", None).json()["sets"].as_array().map(Vec::len),
        Some(sets_before),
        "no set yet"
    );
    b.click("#draft-confirm").await;
    let s = set_generates(b, d).await;
    assert_eq!(s["shots"].as_array().map(Vec::len), Some(n), "the confirmed revision's shots");
    assert!(s["shots"][0]["prompt"].as_str().is_some_and(|p| p.starts_with(prompt)), "{s}");
    assert_eq!(s["references"].as_array().map(Vec::len), Some(2), "the draft's photos");
    let dr = d.call("GET", &format!("/v1/drafts/{id}"), None).json();
    assert_eq!((dr["status"].as_str(), &dr["set_id"]), (Some("confirmed"), &s["id"]), "{dr}");
    check_view(b, &format!("the set made from the draft ({lang})")).await;
    // The draft itself now leads to its set.
    b.js(&format!("(location.hash = '#/drafts/{id}')")).await;
    b.until("the link to the set", 10, "document.getElementById('draft-set-link') !== null").await;
    assert_eq!(b.js("document.getElementById('draft-confirm')").await, Value::Null, "confirmed once");
}

#[test]
fn photos_become_a_draft_then_a_generated_set_in_english_and_chinese_at_phone_width() {
    let mut d = Daemon::configure(FAST_DEMO);
    d.spawn();
    let dir = TempDir::new();
    let photos = photo_files(&dir);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        // English, light.
        let b = Browser::start().await;
        b.sign_in(&printed_sign_in_url(&d)).await;
        set_width(&b, 390).await;
        demo_flow(&b, &d, &photos, "en").await;
        b.close().await;
        // Simplified Chinese, dark.
        let b = Browser::start_with(&["--force-dark-mode"]).await;
        let r = d.call("POST", "/v1/session/sign-in-url", Some(&json!({})));
        b.sign_in(r.json()["url"].as_str().expect("a sign-in url")).await;
        b.js("(document.cookie = 'tally_lang=zh-CN; Path=/; SameSite=Strict', location.reload(), true)").await;
        b.until(
            "the page in Chinese",
            15,
            "document.documentElement.lang === 'zh-CN' && document.getElementById('new-task') !== null",
        )
        .await;
        assert_eq!(b.js("matchMedia('(prefers-color-scheme: dark)').matches").await, json!(true), "dark mode");
        set_width(&b, 390).await;
        demo_flow(&b, &d, &photos, "zh-CN").await;
        b.close().await;
    });
    d.term();
}

#[test]
fn the_price_of_a_paid_draft_and_of_its_set_is_shown_before_each_is_sent() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let base = mock.base();
    // `paid` first: the default provider, which makes the set (openai_responses only drafts).
    let providers = format!(
        "[[providers]]\nname = \"paid\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\nmodel = \"gpt-image-1\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 2\nprice_per_image = 0.04\n\n\
         [[providers]]\nname = \"oa\"\nkind = \"openai_responses\"\nbase_url = \"{base}\"\nmodel = \"gpt-5-mini\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\npoll_interval_ms = 20\nmax_output_tokens = 2000\n\
         price_per_million_input_tokens = 0.25\nprice_per_million_output_tokens = 2.0\n\n{FAST_DEMO}"
    );
    let mut d = Daemon::configure(&providers);
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-drafts".into()));
    d.spawn();
    let dir = TempDir::new();
    let photos = photo_files(&dir);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&printed_sign_in_url(&d)).await;
        set_width(&b, 390).await;
        fill_the_form(&b, &photos, "blue porcelain cup", "porcelain", "en", "oa").await;
        // Two photos (1600 tokens each), the request (~350 tokens) and up to 2000 tokens of
        // answer: 0.25 and 2.0 per million, about $0.005 at most.
        // The price line follows the form through the daemon's estimate: wait for oa's.
        b.until("oa's price", 10, "document.getElementById('draft-price').textContent.includes(' oa ')").await;
        let price = b.js("document.getElementById('draft-price').textContent").await;
        assert_eq!(
            price,
            json!(
                "Drafting with oa is one paid request: at most about $0.005 (the photos, the request and an answer \
                 of up to 2000 tokens)."
            ),
            "the price before drafting"
        );
        check_view(&b, "the new-draft form on a provider that bills").await;
        // Asked first, with the price; "no" sends nothing.
        let ask = b.ask("#draft-create").await;
        assert!(ask.contains("Draft with oa?") && ask.contains("at most about $0.005"), "{ask}");
        b.assert_accessible("the question before a paid draft").await;
        b.say_no().await;
        assert_eq!(mock.count_endpoint("POST /v1/responses"), (0, 0), "saying no sent nothing");
        assert_eq!(d.call("GET", "/v1/drafts", None).json()["drafts"].as_array().map(Vec::len), Some(0));
        b.ask("#draft-create").await;
        b.click("#confirm-yes").await;
        let (id, dr) = ready_draft(&b, &d).await;
        assert_eq!(mock.count_endpoint("POST /v1/responses"), (1, 1), "one drafting request, charged");
        assert_eq!(dr["charge"]["state"], "charged", "{dr}");
        let charge = b.js("document.getElementById('draft-charge').textContent").await;
        assert!(charge.as_str().unwrap_or("").starts_with("Charged (about $0.00"), "{charge}");
        // Drafting again is priced before it is asked for, and the daemon's own estimate (its
        // 409) is the same amount; "no" sends nothing.
        let again = b.js("document.getElementById('draft-redraft-price').textContent").await;
        let again = again.as_str().unwrap_or("").to_string();
        assert!(again.contains("at most about $0.00"), "{again}");
        let ask = b.ask("#draft-redraft").await;
        assert!(ask.contains("Drafting again sends a new request to oa"), "{ask}");
        assert_eq!(amount_in(&ask), amount_in(&again), "the page's estimate is the daemon's: {ask} / {again}");
        b.say_no().await;
        assert_eq!(mock.count_endpoint("POST /v1/responses"), (1, 1), "saying no sent nothing");

        // The set's total before confirming: every candidate image at $0.04 on `paid`.
        let images: i64 =
            dr["shots"].as_array().expect("shots").iter().map(|s| s["candidates"].as_i64().unwrap_or(1)).sum();
        let n = dr["shots"].as_array().map_or(0, Vec::len);
        assert_eq!(b.js("document.getElementById('draft-set-provider').value").await, json!("paid"));
        let total = b.js("document.getElementById('draft-confirm-price').textContent").await;
        let each = format!("{images} × $0.04");
        assert!(
            total.as_str().is_some_and(
                |t| t.starts_with(&format!("{n} shots, {images} images at paid: about $0.")) && t.contains(&each)
            ),
            "{total}"
        );
        check_view(&b, "a paid draft before confirming").await;
        // Confirming asks with the daemon's estimate; "no" makes nothing.
        let ask = b.ask("#draft-confirm").await;
        let amount = format!("about ${:.2}", 0.04 * images as f64);
        assert!(ask.contains(&format!("this set is {images} images, {amount} in all")), "{ask}");
        b.assert_accessible("the question before confirming a paid set").await;
        b.say_no().await;
        assert_eq!(d.call("GET", "/v1/sets", None).json()["sets"].as_array().map(Vec::len), Some(0), "no set");
        b.ask("#draft-confirm").await;
        b.click("#confirm-yes").await;
        let s = set_generates(&b, &d).await;
        assert_eq!(s["provider"], "paid");
        let dr = d.call("GET", &format!("/v1/drafts/{id}"), None).json();
        assert_eq!(dr["set_id"], s["id"], "{dr}");
        b.close().await;
    });
    assert_eq!(mock.count_endpoint("POST /v1/responses"), (1, 1), "still one drafting request");
    d.term();
}

/// A draft whose answer did not match tally's schema: the page says it failed and why, in the
/// daemon's words, keeps the answer under Technical details, offers no confirmation, and
/// prices "Draft again" before it is asked for. The form refuses to draft without a photo.
#[test]
fn a_failed_draft_says_why_keeps_the_answer_and_prices_drafting_again() {
    let mock = Mock::start(&[]);
    let answer = r#"{"shots": [], "note": "not the schema"}"#;
    mock.behave(json!({"draft_answer": answer}));
    let base = mock.base();
    let providers = format!(
        "{FAST_DEMO}\n[[providers]]\nname = \"oa\"\nkind = \"openai_responses\"\nbase_url = \"{base}\"\n\
         model = \"gpt-5-mini\"\napi_key_env = \"TALLY_TEST_KEY\"\npoll_interval_ms = 20\nmax_output_tokens = 2000\n\
         price_per_million_input_tokens = 0.25\nprice_per_million_output_tokens = 2.0\n"
    );
    let mut d = Daemon::configure(&providers);
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-drafts".into()));
    d.spawn();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&printed_sign_in_url(&d)).await;
        set_width(&b, 390).await;
        b.js("(location.hash = '#/drafts/new')").await;
        b.until("the form", 15, "document.getElementById('draft-product') !== null").await;
        type_into(&b, "#draft-product", "mug").await;
        b.click("#draft-create").await;
        let said = b.until("the refusal", 10, "!document.getElementById('draft-create-error').hidden && document.getElementById('draft-create-error').textContent").await;
        assert_eq!(said, json!("Add at least one photo of the product."));
        assert_eq!(d.call("GET", "/v1/drafts", None).json()["drafts"].as_array().map(Vec::len), Some(0));

        let dir = TempDir::new();
        let photos = photo_files(&dir);
        let auth = format!("Bearer {}", d.token());
        let r = crate::common::request(
            d.port,
            "POST",
            "/v1/uploads",
            &[("Authorization", &auth), ("Content-Type", "image/png")],
            Some(&std::fs::read(&photos[0]).expect("a photo")),
        );
        let upload = r.json()["id"].as_str().expect("upload id").to_string();
        let r = d.call(
            "POST",
            "/v1/drafts",
            Some(&json!({"product": "mug", "photos": [upload], "language": "en", "provider": "oa"})),
        );
        assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
        let id = r.json()["id"].as_str().expect("id").to_string();
        b.js(&format!("(location.hash = '#/drafts/{id}')")).await;
        b.until("the failed draft", 30, "document.querySelector('article.draft')?.dataset.status === 'failed'").await;
        let status = b.js("document.getElementById('draft-status').textContent").await;
        let status = status.as_str().unwrap_or("");
        assert!(status.starts_with("The draft failed.") && status.contains("schema"), "{status}");
        let kept = b.js("document.querySelector('details.technical code').textContent").await;
        assert_eq!(kept, json!(answer), "the answer as it came");
        assert_eq!(b.js("document.getElementById('draft-confirm')").await, Value::Null, "nothing to confirm");
        let again = b.js("document.getElementById('draft-redraft-price').textContent").await;
        assert!(again.as_str().unwrap_or("").contains("at most about $0.00"), "{again}");
        let charge = b.js("document.getElementById('draft-charge').textContent").await;
        assert!(charge.as_str().unwrap_or("").starts_with("Charged"), "{charge}");
        check_view(&b, "a failed draft").await;
        b.close().await;
    });
    assert_eq!(mock.count_endpoint("POST /v1/responses"), (1, 1), "sent once, never again on its own");
    d.term();
}
