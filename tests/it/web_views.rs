//! The page for every owner, in headless Chromium (issue #27): dark mode clean by axe-core on
//! every main view, no sideways scrolling at 320 px (the new-set form included), tap targets of
//! at least 24 × 24 px; the jobs list always showing which filter and search are applied, with
//! one click to clear, and an empty result saying why; a request refused before sending worded
//! with its fix and no retry offered; and an unknown job naming where to look at the provider.
//! The dark pass covers the jobs list, one job (unknown, refused, ready), the sets, a set, the
//! new-set form, Spend, the retry and confirmation dialogs, the job views in Chinese, and the
//! signed-out pages; it saves screenshots at 320 px into target/screenshots.

use fantoccini::Locator;
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::common::{Daemon, Mock, OPENAI_MODEL, request};
use crate::web::printed_sign_in_url;

/// What the tests look at: a set whose only shot was refused before sending (two reference
/// photos on a one-photo model), a ready job, and an unknown one.
pub(crate) struct Jobs {
    pub(crate) set: String,
    pub(crate) refused: String,
    pub(crate) ready: String,
    pub(crate) unknown: String,
}

/// A daemon with a one-photo FLUX model on Replicate, a priced OpenAI model and the demo, all
/// against `mock`, and the jobs above made through the API.
pub(crate) fn daemon_with_jobs(mock: &Mock) -> (Daemon, Jobs) {
    let base = mock.base();
    let common = "api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 2\npoll_interval_ms = 50\n\
                  request_timeout_ms = 5000\nconnect_timeout_ms = 1000\n";
    let providers = format!(
        "[[providers]]\nname = \"flux\"\nkind = \"replicate\"\nbase_url = \"{base}\"\n\
         model = \"black-forest-labs/flux-kontext-pro\"\nprice_per_image = 0.04\n{common}\n\
         [[providers]]\nname = \"openai\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\nmodel = \"{OPENAI_MODEL}\"\n\
         price_per_image = 0.04\ndashboard_url = \"https://gateway.example/console\"\n{common}\n\
         [[providers]]\nname = \"demo\"\nkind = \"demo\"\ndelay_ms = 20\n"
    );
    let mut d = Daemon::configure(&providers);
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    let auth = format!("Bearer {}", d.token());
    let mut refs = Vec::new();
    for words in ["teapot, front", "teapot, side"] {
        let png = tally::render::placeholder_png(words, 64);
        let r = request(
            d.port,
            "POST",
            "/v1/uploads",
            &[("Authorization", &auth), ("Content-Type", "image/png")],
            Some(&png),
        );
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        refs.push(r.json()["id"].as_str().expect("upload id").to_string());
    }
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "teapot", "references": refs, "provider": "flux",
            "shots": [{"role": "main", "prompt": "the teapot on white"}]})),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let set = r.json()["id"].as_str().expect("set id").to_string();
    let refused = r.json()["shots"][0]["id"].as_str().expect("shot id").to_string();
    d.wait_status(&refused, &["failed"]);

    let r = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "blue mug on oak", "provider": "demo"})));
    let ready = r.json()["id"].as_str().expect("id").to_string();
    d.wait_status(&ready, &["succeeded"]);

    // An unknown outcome: the mock charges, then drops the answer.
    mock.behave(json!({ "drop_response": true }));
    let r = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "brass lamp, lost answer", "provider": "openai"})));
    let unknown = r.json()["id"].as_str().expect("id").to_string();
    d.wait_status(&unknown, &["unknown"]);
    mock.behave(json!({ "drop_response": false }));
    (d, Jobs { set, refused, ready, unknown })
}

/// Interactive elements smaller than 24 × 24 CSS px (WCAG 2.2, 2.5.8) on the page as it is:
/// links, buttons, fields, disclosures, and the labels that carry a radio or checkbox.
const SMALL_TARGETS: &str = "(() => { const bad = [];
  for (const el of document.querySelectorAll('a[href], button, select, input, textarea, summary, label.check')) {
    if (el.closest('[hidden], dialog:not([open])') || el.matches('.visually-hidden, .skip')) continue;
    if (el.matches('input[type=radio], input[type=checkbox]')) continue;
    const cs = getComputedStyle(el);
    if (cs.display === 'none' || cs.visibility === 'hidden') continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.width < 24 || r.height < 24) bad.push((el.id ? '#' + el.id : el.tagName.toLowerCase() + '.' + el.className) +
      ' ' + Math.round(r.width) + 'x' + Math.round(r.height) + ' \"' + (el.textContent || '').trim().slice(0, 40) + '\"');
  }
  return bad; })()";

/// Elements that stick out to the right of the viewport (what makes the page scroll sideways).
const WIDE: &str = "(() => { const w = document.documentElement.clientWidth; const out = [];
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.right > w + 0.5 && r.width > 0) out.push((el.id ? '#' + el.id : el.tagName.toLowerCase() + '.' + el.className) + ' right=' + Math.round(r.right));
  }
  return out.slice(0, 15); })()";

/// The viewport width by the page's own measure.
pub(crate) async fn set_width(b: &Browser, w: u32) {
    b.c().set_window_size(w, 800).await.expect("resize");
    let inner = b.js("window.innerWidth").await.as_u64().unwrap_or(0) as u32;
    if inner != w {
        // The window frame: widen by the difference so the viewport is `w`.
        b.c().set_window_size(w + w.saturating_sub(inner), 800).await.expect("resize");
    }
    let inner = b.js("window.innerWidth").await;
    assert_eq!(inner, json!(w), "the viewport is {w} px wide");
}

/// The checks every main view passes at this width: axe-core clean, no sideways scrolling, no
/// tap target under 24 × 24 px.
pub(crate) async fn check_view(b: &Browser, name: &str) {
    b.js("(document.activeElement && document.activeElement.blur(), window.scrollTo(0, 0), true)").await;
    let scroll = b.js("[document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]").await;
    let wide = b.js(WIDE).await;
    assert!(scroll[0].as_u64() <= scroll[1].as_u64(), "{name} scrolls sideways ({scroll}); sticking out: {wide}");
    let small = b.js(SMALL_TARGETS).await;
    assert_eq!(small, json!([]), "{name}: tap targets under 24 × 24 px");
    b.assert_accessible(name).await;
}

#[test]
fn dark_mode_at_320_px_is_clean_on_every_main_view() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let (d, jobs) = daemon_with_jobs(&mock);
    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start_with(&["--force-dark-mode"]).await;
        b.c().goto(&url).await.expect("sign in");
        b.until("the jobs page", 15, "document.getElementById('task-list')?.children.length >= 3").await;
        assert_eq!(b.js("matchMedia('(prefers-color-scheme: dark)').matches").await, json!(true), "dark mode");
        let bg = b.js("getComputedStyle(document.body).backgroundColor").await;
        assert_eq!(bg, json!("rgb(20, 24, 29)"), "the dark theme's background");
        // Primary buttons: dark words on a light blue (white on mid blue failed contrast).
        let generate = b.js("getComputedStyle(document.getElementById('submit-task')).color").await;
        assert_eq!(generate, json!("rgb(11, 26, 48)"));

        let views: Vec<(String, &str, String)> = vec![
            ("#/".into(), "jobs", "document.getElementById('task-list')?.children.length >= 3".into()),
            (
                format!("#/tasks/{}", jobs.unknown),
                "an unknown job",
                "document.getElementById('where-to-look') !== null".into(),
            ),
            (
                format!("#/tasks/{}", jobs.refused),
                "a refused job",
                "document.getElementById('refusal') !== null".into(),
            ),
            (format!("#/tasks/{}", jobs.ready), "a ready job", "document.getElementById('task-image') !== null".into()),
            ("#/sets".into(), "image sets", "document.getElementById('set-list') !== null".into()),
            (
                format!("#/sets/{}", jobs.set),
                "a set",
                "document.getElementById('deliver')?.dataset.ready === 'true'".into(),
            ),
            ("#/sets/new".into(), "the new-set form", "document.getElementById('new-set') !== null".into()),
            ("#/spend".into(), "spend", "document.getElementById('spend-table')?.children.length > 0".into()),
        ];
        for width in [320u32, 1280] {
            set_width(&b, width).await;
            for (hash, name, ready) in &views {
                b.js(&format!("(location.hash = '{hash}')")).await;
                b.until(name, 15, ready).await;
                check_view(&b, &format!("{name} at {width} px in dark mode")).await;
                if width == 320 {
                    b.screenshot(&format!("dark-320-{}.png", name.replace(' ', "-"))).await;
                }
            }
        }
        // The dialogs, open, at 320 px: the retry's cost confirmation, "Generate another" asking
        // first, and the resolve form of a shot.
        set_width(&b, 320).await;
        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.unknown)).await;
        b.until("the unknown job", 10, "document.getElementById('retry-task') !== null").await;
        b.click("#retry-task").await;
        b.until("the retry dialog", 10, "document.getElementById('retry-dialog').open").await;
        check_view(&b, "the retry dialog at 320 px in dark mode").await;
        b.click("#retry-cancel").await;
        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.ready)).await;
        b.until("the ready job", 10, "document.getElementById('generate-another') !== null").await;
        b.click("#generate-another").await;
        b.until("the confirmation", 10, "document.getElementById('confirm-dialog').open").await;
        check_view(&b, "the confirmation dialog at 320 px in dark mode").await;
        b.click("#confirm-no").await;

        // The jobs list with a filter and a search applied, and empty.
        b.js("(location.hash = '#/')").await;
        b.until("the jobs page", 15, "document.getElementById('status-filter') !== null").await;
        b.c()
            .find(Locator::Css("#status-filter"))
            .await
            .expect("filter")
            .select_by_value("attention")
            .await
            .expect("pick");
        b.c().find(Locator::Css("#search")).await.expect("search").send_keys("teapot").await.expect("type");
        b.until("the empty result", 15, "document.getElementById('empty-text')?.textContent").await;
        check_view(&b, "an empty filtered list at 320 px in dark mode").await;
        b.js("(document.getElementById('applied').scrollIntoView(), true)").await;
        b.screenshot("dark-320-jobs-filtered.png").await;
        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.refused)).await;
        b.until("the refused job", 10, "document.getElementById('refusal') !== null").await;
        b.js("(document.getElementById('refusal').scrollIntoView(), true)").await;
        b.screenshot("dark-320-refused.png").await;

        // The same views in Simplified Chinese (the page's switch is a cookie), 320 px, dark.
        b.js("(document.cookie = 'tally_lang=zh-CN; Path=/; SameSite=Strict', location.hash = '#/', location.reload(), true)")
            .await;
        b.until("the page in Chinese", 15, "document.documentElement.lang === 'zh-CN' && document.getElementById('task-list') !== null")
            .await;
        for (hash, name, ready) in views.iter().filter(|(_, name, _)| name.contains("job") || name.contains("new-set")) {
            b.js(&format!("(location.hash = '{hash}')")).await;
            b.until(name, 15, ready).await;
            check_view(&b, &format!("{name} at 320 px in dark mode, in Chinese")).await;
        }
        let refusal = b
            .js(&format!("(location.hash = '#/tasks/{}', true)", jobs.refused))
            .await;
        assert_eq!(refusal, json!(true));
        let problem = b.until("the refusal in Chinese", 15, "document.getElementById('refusal-problem')?.textContent").await;
        assert_eq!(problem, json!("这个模型只接受一张参考照片,而这个任务有 2 张。"));
        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.unknown)).await;
        let link = b.until("where to look in Chinese", 15, "document.getElementById('where-to-look-link')?.textContent").await;
        assert!(link.as_str().unwrap_or("").contains("打开为这个服务商设置的控制台"), "{link}");
        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.refused)).await;
        b.until("the refusal", 15, "document.getElementById('refusal') !== null").await;
        b.js("(document.cookie = 'tally_lang=en; Path=/; SameSite=Strict', location.reload(), true)").await;
        b.until("the page in English", 15, "document.documentElement.lang === 'en' && document.getElementById('refusal') !== null")
            .await;

        // A person looks at it: the new-set form at 320 px, dark.
        b.js("(location.hash = '#/sets/new')").await;
        b.until("the new-set form", 10, "document.getElementById('new-set') !== null").await;
        b.js("(document.activeElement && document.activeElement.blur(), window.scrollTo(0, 0), true)").await;
        b.screenshot("dark-320-new-set.png").await;
        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.unknown)).await;
        b.until("the unknown job", 10, "document.getElementById('where-to-look') !== null").await;
        b.js("(document.getElementById('where-to-look').scrollIntoView(), true)").await;
        b.screenshot("dark-320-unknown.png").await;

        // Signed out: the "sign in again" panel, then the page for a browser that is not signed in.
        let out = d.cli(&["sign-out", "--all"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        b.js("(location.hash = '#/sets')").await;
        b.until("the sign-in-again panel", 30, "document.getElementById('signed-out') !== null").await;
        check_view(&b, "the sign-in-again panel at 320 px in dark mode").await;
        b.c().goto(&format!("http://127.0.0.1:{}/", d.port)).await.expect("open");
        b.until("the signed-out page", 10, "document.querySelector('h1')?.innerText.includes('Sign in')").await;
        check_view(&b, "the signed-out page at 320 px in dark mode").await;
        b.close().await;
    });
}

#[test]
fn filters_show_what_is_applied_refusals_say_the_fix_and_unknowns_where_to_look() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let (d, jobs) = daemon_with_jobs(&mock);

    // The API: a refusal before sending, with its fix; nothing reached the provider.
    let t = d.call("GET", &format!("/v1/tasks/{}", jobs.refused), None).json();
    let r = &t["refused_before_sending"];
    assert_eq!(r["kind"], "too_many_references", "{t}");
    assert_eq!((r["references_taken"].as_u64(), r["references_given"].as_u64()), (Some(1), Some(2)), "{t}");
    assert_eq!(r["retry_helps"], false);
    assert!(r["fix"].as_str().unwrap_or("").contains("remove 1"), "{r}");
    assert_eq!(t["charge"]["state"], "none");
    assert!(t["retry"]["note"].as_str().unwrap_or("").contains("refused the same way"), "{t}");
    assert_eq!(mock.count("the teapot on white").0, 0, "no request reached the provider");
    // Where to look, in the API and the CLI: the provider's page and the request's details.
    let t = d.call("GET", &format!("/v1/tasks/{}", jobs.unknown), None).json();
    let w = &t["where_to_look"];
    // The mock is a gateway, not api.openai.com: the console its config names, never OpenAI's.
    assert_eq!(w["url"], "https://gateway.example/console", "{t}");
    let what: Vec<&str> =
        w["match_by"].as_array().expect("match_by").iter().filter_map(|m| m["what"].as_str()).collect();
    assert_eq!(what, ["sent_at", "model", "prompt"], "{w}");
    assert_eq!(w["match_by"][1]["value"], OPENAI_MODEL);
    let out = d.cli(&["status", &jobs.unknown]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("look      the console set for this provider: https://gateway.example/console"), "{text}");
    assert!(text.contains(OPENAI_MODEL) && text.contains("brass lamp"), "{text}");
    let out = d.cli(&["status", &jobs.refused]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("fix       ") && text.contains("remove 1"), "{text}");

    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.c().goto(&url).await.expect("sign in");
        b.until("the jobs page", 15, "document.getElementById('task-list')?.children.length >= 3").await;
        assert_eq!(b.js("document.getElementById('applied').children.length").await, json!(0), "nothing applied");

        // A filter shows as a chip; a search as another; the empty result says why.
        b.c()
            .find(Locator::Css("#status-filter"))
            .await
            .expect("filter")
            .select_by_value("attention")
            .await
            .expect("pick");
        let applied = b.until("the filter chip", 10, "document.getElementById('clear-filter') && document.getElementById('applied').innerText").await;
        assert!(applied.as_str().unwrap_or("").contains("Showing: Needs your attention"), "{applied}");
        b.c().find(Locator::Css("#search")).await.expect("search").send_keys("teapot").await.expect("type");
        let empty = b.until("the empty result", 15, "!document.getElementById('empty').hidden && document.getElementById('empty-text')?.textContent").await;
        assert_eq!(empty, json!("No jobs match “teapot” in Needs your attention."), "why it is empty");
        let applied = b.js("document.getElementById('applied').innerText").await;
        assert!(applied.as_str().unwrap_or("").contains("Search: “teapot”"), "{applied}");
        b.assert_accessible("the jobs list with a filter and a search, empty").await;
        let more = b.js("getComputedStyle(document.getElementById('more')).display").await;
        assert_eq!(more, json!("none"), "no \"Show older jobs\" under an empty result");

        // Leaving and coming back keeps them, shown, not silently.
        b.js("(location.hash = '#/sets')").await;
        b.until("the sets", 10, "document.getElementById('set-list') !== null").await;
        b.js("(location.hash = '#/')").await;
        b.until("the jobs page", 10, "document.getElementById('applied')?.children.length > 0").await;
        let applied = b.js("document.getElementById('applied').innerText").await;
        assert!(
            applied.as_str().unwrap_or("").contains("Needs your attention")
                && applied.as_str().unwrap_or("").contains("teapot"),
            "{applied}"
        );
        let search = b.js("document.getElementById('search').value").await;
        assert_eq!(search, json!("teapot"));

        // One click clears both: the refused teapot shot is listed again.
        b.until("the empty result", 15, "document.getElementById('empty-clear')").await;
        b.click("#empty-clear").await;
        b.until("every job", 15, &format!("document.querySelector(\"li[data-task-id='{}']\") !== null && document.querySelector(\"li[data-task-id='{}']\") !== null", jobs.refused, jobs.ready)).await;
        assert_eq!(b.js("document.getElementById('applied').children.length").await, json!(0));
        assert_eq!(b.js("document.getElementById('status-filter').value").await, json!(""));
        assert_eq!(b.js("document.getElementById('search').value").await, json!(""));
        // Only a search: the chip's own ✕ clears it.
        b.c().find(Locator::Css("#search")).await.expect("search").send_keys("no such thing").await.expect("type");
        let empty = b.until("the empty result", 15, "!document.getElementById('empty').hidden && document.getElementById('empty-text')?.textContent").await;
        assert_eq!(empty, json!("No jobs match “no such thing”."));
        b.click("#clear-search").await;
        b.until("the list again", 15, "document.getElementById('empty').hidden && document.getElementById('task-list').children.length >= 3").await;

        // The refused shot: the reason and the fix, and no retry that cannot help.
        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.refused)).await;
        let problem = b.until("the refusal", 15, "document.getElementById('refusal-problem')?.textContent").await;
        assert_eq!(problem, json!("This model takes one reference photo, and this job has 2."));
        let fix = b.js("document.getElementById('refusal-fix').textContent").await;
        assert_eq!(fix, json!("To fix it: remove 1 of the reference photos, or choose another provider."));
        let message = b.js("document.getElementById('task-message').textContent").await;
        assert!(message.as_str().unwrap_or("").starts_with("Not sent:"), "{message}");
        assert!(!message.as_str().unwrap_or("").contains("refused the request"), "{message}");
        assert_eq!(b.js("document.getElementById('retry-task')").await, Value::Null, "no retry button");
        b.assert_accessible("a job refused before sending").await;
        // The set's shot card says the same, without a retry button.
        b.js(&format!("(location.hash = '#/sets/{}')", jobs.set)).await;
        let fix = b.until("the shot's fix", 15, "document.getElementById('shot-fix-0')?.textContent").await;
        assert!(fix.as_str().unwrap_or("").contains("remove 1 of the reference photos"), "{fix}");
        assert_eq!(b.js("document.getElementById('shot-retry-0')").await, Value::Null, "no retry on the shot");

        // The unknown job: a link to the provider's page and the details to match by.
        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.unknown)).await;
        let href = b.until("where to look", 15, "document.getElementById('where-to-look-link')?.href").await;
        assert_eq!(href, json!("https://gateway.example/console"));
        let link = b.js("document.getElementById('where-to-look-link').textContent").await;
        assert!(link.as_str().unwrap_or("").contains("Open the console set for this provider"), "{link}");
        assert_eq!(b.js("document.getElementById('where-to-look-link').target").await, json!("_blank"));
        let details = b.js("document.getElementById('match-by').innerText").await;
        let details = details.as_str().unwrap_or("");
        assert!(
            details.contains("Time sent") && details.contains(OPENAI_MODEL) && details.contains("brass lamp"),
            "{details}"
        );
        b.assert_accessible("an unknown job with where to look").await;
        b.close().await;
    });
}
