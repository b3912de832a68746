//! Money where it is spent, in a real browser (headless Chromium, axe-core on each view): the
//! price before every button that sends a request (New job, Create the set, Retry, Generate
//! another, more candidates of a set's shot, resuming a set's canceled shots), "Generate
//! another", more candidates and resuming asking first, resuming offering exactly the
//! canceled shots that were never sent, the budget in the page, and Spend following a charge
//! recorded by hand.

use std::time::Duration;

use fantoccini::Locator;
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::common::{Daemon, Mock, wait_for};
use crate::web::printed_sign_in_url;

/// A paid provider with a price, one without, and the free demo.
fn money_providers(mock: &Mock) -> String {
    let base = mock.base();
    format!(
        "[[providers]]\nname = \"paid\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\nmodel = \"gpt-image-1\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 2\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n\
         price_per_image = 0.04\n\n\
         [[providers]]\nname = \"unpriced\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\nmodel = \"gpt-image-1\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 2\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n\n\
         [[providers]]\nname = \"demo\"\nkind = \"demo\"\ndelay_ms = 20\n"
    )
}

fn task_count(d: &Daemon) -> usize {
    d.call("GET", "/v1/tasks?limit=200", None).json()["tasks"].as_array().map_or(0, Vec::len)
}

#[test]
fn the_price_is_shown_before_each_spending_button() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let mut d = Daemon::configure(&money_providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&url).await;

        // New job: the price beside Generate, for each kind of provider.
        let select = b.c().find(Locator::Css("#provider")).await.expect("provider");
        select.select_by_value("paid").await.expect("pick");
        let price = b.js("document.getElementById('generate-price').textContent").await;
        assert!(price.as_str().unwrap_or("").contains("$0.04"), "price beside Generate: {price}");
        select.select_by_value("unpriced").await.expect("pick");
        let price = b.js("document.getElementById('generate-price').textContent").await;
        assert!(price.as_str().unwrap_or("").contains("price not configured"), "{price}");
        select.select_by_value("demo").await.expect("pick");
        let price = b.js("document.getElementById('generate-price').textContent").await;
        assert!(price.as_str().unwrap_or("").contains("free"), "{price}");
        b.assert_accessible("the jobs page with a price").await;

        // Create the set: shots × the price.
        b.js("(location.hash = '#/sets/new')").await;
        b.until("the new-set form", 10, "document.getElementById('set-provider') !== null").await;
        b.c()
            .find(Locator::Css("#set-provider"))
            .await
            .expect("set provider")
            .select_by_value("paid")
            .await
            .expect("pick");
        let price = b.js("document.getElementById('set-price').textContent").await;
        assert!(
            price.as_str().unwrap_or("").contains("$0.12") && price.as_str().unwrap_or("").contains("3 ×"),
            "{price}"
        );
        b.click("#add-shot").await;
        let price = b.js("document.getElementById('set-price').textContent").await;
        assert!(price.as_str().unwrap_or("").contains("$0.16"), "four shots: {price}");
        b.assert_accessible("the new-set form with a price").await;

        // A finished paid job: "Generate another" names the price and asks first.
        let r = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "priced mug", "provider": "paid"})));
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        let id = r.json()["id"].as_str().expect("id").to_string();
        let done = wait_for(Duration::from_secs(30), || {
            (d.call("GET", &format!("/v1/tasks/{id}"), None).json()["status"] == "succeeded").then_some(())
        });
        assert!(done.is_some(), "the paid job did not succeed");
        b.js(&format!("(location.hash = '#/tasks/{id}')")).await;
        b.until("the job's page", 10, "document.getElementById('generate-another') !== null").await;
        let hint = b.js("document.getElementById('retry-hint').textContent").await;
        assert!(hint.as_str().unwrap_or("").contains("$0.04"), "{hint}");
        let before = task_count(&d);
        let ask = b.ask("#generate-another").await;
        assert!(ask.contains("$0.04"), "the question names the price: {ask}");
        b.assert_accessible("the generate-another question").await;
        b.say_no().await;
        assert_eq!(task_count(&d), before, "saying no spent nothing");
        b.ask("#generate-another").await;
        b.click("#confirm-yes").await;
        b.until("another job", 10, &format!("location.hash.startsWith('#/tasks/') && !location.hash.endsWith('{id}')"))
            .await;
        assert_eq!(task_count(&d), before + 1, "saying yes made one new job");

        // A set's shot on the paid provider: "Generate another like this" (more candidates)
        // names the price on the button and in its question; saying no adds nothing.
        let r = d.call(
            "POST",
            "/v1/sets",
            Some(&json!({"product": "priced teapot", "provider": "paid", "shots": [{"role": "main", "prompt": "on oak"}]})),
        );
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        let set = r.json()["id"].as_str().expect("set id").to_string();
        d.wait_status(r.json()["shots"][0]["id"].as_str().expect("shot"), &["succeeded"]);
        b.js(&format!("(location.hash = '#/sets/{set}')")).await;
        let label = b.until("more candidates", 10, "document.getElementById('shot-more-0')?.textContent").await;
        assert!(label.as_str().unwrap_or("").contains("$0.04"), "the price on the button: {label}");
        let before = task_count(&d);
        let ask = b.ask("#shot-more-0").await;
        assert!(ask.contains("$0.04"), "the question names the price: {ask}");
        b.assert_accessible("the more-candidates question").await;
        b.say_no().await;
        assert_eq!(task_count(&d), before, "saying no spent nothing");
        b.ask("#shot-more-0").await;
        b.click("#confirm-yes").await;
        b.until("a second candidate", 30, "document.querySelectorAll('#candidates-0 .candidate').length === 2").await;
        assert_eq!(task_count(&d), before + 1, "saying yes asked for one more image");

        // An unknown job: the price beside Retry.
        mock.behave(json!({ "drop_response": true }));
        let r = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "lost mug", "provider": "paid"})));
        let lost = r.json()["id"].as_str().expect("id").to_string();
        let unknown = wait_for(Duration::from_secs(30), || {
            (d.call("GET", &format!("/v1/tasks/{lost}"), None).json()["status"] == "unknown").then_some(())
        });
        mock.behave(json!({ "drop_response": false }));
        assert!(unknown.is_some(), "the lost job did not become unknown");
        b.js(&format!("(location.hash = '#/tasks/{lost}')")).await;
        b.until("the unknown job", 10, "document.getElementById('retry-price') !== null").await;
        let price = b.js("document.getElementById('retry-price').textContent").await;
        assert!(price.as_str().unwrap_or("").contains("$0.04"), "price beside Retry: {price}");
        b.assert_accessible("an unknown job with a price").await;
        b.close().await;
    });
}

#[test]
fn the_owner_sets_a_budget_in_the_page_and_a_held_job_says_so() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let mut d = Daemon::configure(&money_providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&url).await;
        assert_eq!(b.js("document.getElementById('budget-line') === null").await, true, "no budget, no line");

        // Set a daily budget of one image in the Spend view.
        b.js("(location.hash = '#/spend')").await;
        b.until("the budget form", 10, "document.getElementById('budget-form') !== null").await;
        let source = b.js("document.getElementById('budget-source').textContent").await;
        assert!(source.as_str().unwrap_or("").contains("configuration file"), "{source}");
        b.c().find(Locator::Css("#budget-daily")).await.expect("daily").send_keys("0.04").await.expect("type");
        b.click("#budget-save").await;
        b.until("the budget saved", 10, "document.getElementById('budget-reset') !== null").await;
        let set = d.call("GET", "/v1/budget", None).json();
        assert_eq!((set["daily"].as_f64(), set["source"].as_str()), (Some(0.04), Some("set")), "{set}");
        let summary = b.js("document.getElementById('budget-all').textContent").await;
        assert!(summary.as_str().unwrap_or("").contains("Today $0.00 of $0.04"), "{summary}");
        b.assert_accessible("the spend view with the budget").await;

        // One job fits; the second is held, and the page says it is the budget.
        let first = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "budget one", "provider": "paid"}))).json();
        d.wait_status(first["id"].as_str().expect("id"), &["succeeded"]);
        let second = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "budget two", "provider": "paid"}))).json();
        let id = second["id"].as_str().expect("id").to_string();
        d.wait_status(&id, &["waiting"]);
        b.js("(location.hash = '#/')").await;
        let line = b.until("the budget line", 10, "document.getElementById('budget-line')?.textContent").await;
        assert!(line.as_str().unwrap_or("").contains("Today $0.04 of $0.04"), "{line}");
        let row = b
            .until("the held job", 10, "Array.from(document.querySelectorAll('#task-list li')).find(li => li.textContent.includes('budget two'))?.textContent")
            .await;
        let row = row.as_str().unwrap_or("");
        assert!(row.contains("Held: today's budget of $0.04 is spent — raise it or wait until tomorrow"), "{row}");
        assert!(!row.contains("has room"), "not the wrong reason: {row}");
        b.assert_accessible("the jobs page with a held job").await;

        // Raise it in the page: the held job goes at once.
        b.js("(location.hash = '#/spend')").await;
        b.until("the budget form", 10, "document.getElementById('budget-daily') !== null").await;
        b.js("(document.getElementById('budget-daily').value = '')").await;
        b.c().find(Locator::Css("#budget-daily")).await.expect("daily").send_keys("1").await.expect("type");
        b.click("#budget-save").await;
        let done = d.wait_status(&id, &["succeeded", "failed", "unknown", "canceled"]);
        assert_eq!(done["status"], "succeeded", "{done}");
        b.until("the new limit shown", 10, "document.getElementById('budget-all')?.textContent.includes('of $1')").await;
        b.close().await;
    });
}

#[test]
fn recording_what_the_dashboard_shows_changes_the_job_and_spend() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let mut d = Daemon::configure(&money_providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    let url = printed_sign_in_url(&d);
    mock.behave(json!({ "drop_response": true }));
    let lost = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "lost vase", "provider": "paid"}))).json();
    let id = lost["id"].as_str().expect("id").to_string();
    d.wait_status(&id, &["unknown"]);
    mock.behave(json!({ "drop_response": false }));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&url).await;
        // Spend before the record: one request that may have been charged, $0.04.
        let cells = "Array.from(document.querySelectorAll('#spend-rows tbody tr:first-child td')).map(td => td.textContent)";
        b.js("(location.hash = '#/spend')").await;
        b.until("the spend table", 10, "document.getElementById('spend-rows') !== null").await;
        let row = b.js(cells).await;
        assert_eq!(row[0], json!("0"), "charged: {row}");
        assert!(row[1].as_str().unwrap_or("").starts_with("1") && row[1].as_str().unwrap_or("").contains("$0.04"), "{row}");
        b.js(&format!("(location.hash = '#/tasks/{id}')")).await;
        b.until("the resolve form", 10, "document.getElementById('resolve-form') !== null").await;
        b.click("#resolve-failed").await;
        b.click("#resolve-not-charged").await;
        b.assert_accessible("the resolve form with the charge record").await;
        b.click("#resolve-submit").await;
        let t = d.wait_status(&id, &["failed"]);
        assert_eq!((t["charge"]["state"].as_str(), t["charge"]["recorded_by_hand"].as_bool()), (Some("none"), Some(true)));
        let words = b
            .until("the job's charge words", 10, "document.querySelector('main')?.innerText.includes('you recorded that the provider') && document.querySelector('main').innerText")
            .await;
        assert!(words.as_str().unwrap_or("").contains("Not charged: you recorded that the provider's dashboard shows no charge."), "{words}");
        b.js("(location.hash = '#/spend')").await;
        let by_hand = b.until("the by-hand note", 10, "document.getElementById('spend-by-hand')?.textContent").await;
        assert!(by_hand.as_str().unwrap_or("").contains("1 of these requests"), "{by_hand}");
        // Spend follows the record: nothing charged, nothing left that may have been.
        let row = b.js(cells).await;
        assert_eq!((row[0].clone(), row[1].clone()), (json!("0"), json!("0")), "Spend after the record: {row}");
        b.close().await;
    });
}

#[test]
fn the_main_views_in_simplified_chinese_are_axe_clean_and_the_switch_changes_the_language() {
    // Served by Accept-Language even before signing in (the signed-out page).
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let mut d = Daemon::configure(&money_providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    let r = crate::common::request(d.port, "GET", "/", &[("Accept-Language", "zh-CN,zh;q=0.9,en;q=0.8")], None);
    let page = String::from_utf8_lossy(&r.body).to_string();
    assert!(page.contains("<html lang=\"zh-CN\">") && page.contains("登录 tally"), "{page}");
    let r = crate::common::request(d.port, "GET", "/", &[("Accept-Language", "en-GB,en;q=0.9")], None);
    assert!(String::from_utf8_lossy(&r.body).contains("<html lang=\"en\">"));
    drop(d);

    // ui.language = "zh-CN": the page in Chinese, whatever the browser asks.
    let mut d = Daemon::configure(&format!("[ui]\nlanguage = \"zh-CN\"\n\n{}", money_providers(&mock)));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    let url = printed_sign_in_url(&d);
    let done = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "红色运动鞋", "provider": "demo"}))).json();
    d.wait_status(done["id"].as_str().expect("id"), &["succeeded"]);
    // A budget set at run time, for all providers and for one: the panel shows both lines,
    // where the limits come from and the button that goes back to the config's.
    let r = d.call("PUT", "/v1/budget", Some(&json!({"daily": 1.0, "providers": {"paid": {"monthly": 5.0}}})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&url).await;
        assert_eq!(b.js("document.documentElement.lang").await, "zh-CN");
        assert_eq!(b.js("document.getElementById('nav-jobs').textContent").await, "任务");
        assert_eq!(b.js("document.querySelector('h1').textContent").await, "任务");
        assert_eq!(b.js("document.getElementById('submit-task').textContent").await, "生成");
        b.assert_accessible("the jobs page in Chinese").await;
        for (hash, ready, view) in [
            ("#/spend", "document.getElementById('budget-form') !== null", "spend"),
            ("#/sets", "document.getElementById('new-set-link') !== null", "image sets"),
            ("#/sets/new", "document.getElementById('create-set') !== null", "new set"),
        ] {
            b.js(&format!("(location.hash = '{hash}')")).await;
            b.until(view, 10, ready).await;
            b.assert_accessible(&format!("the {view} view in Chinese")).await;
        }
        assert_eq!(b.js("document.getElementById('create-set').textContent").await, "创建图片组");
        // The budget panel in Chinese: its lines, where the limits come from, its form and the
        // way back to the configuration's budget; then the same check on the jobs page.
        b.js("(location.hash = '#/spend')").await;
        b.until("the budget panel", 10, "document.getElementById('budget-reset') !== null").await;
        let text = |id: &str| format!("document.getElementById('{id}')?.textContent");
        assert_eq!(b.js(&text("budget-all")).await, "今天 $0.00 / $1.00 · 本月 $0.00 （无上限）");
        assert_eq!(
            b.js("document.querySelector('#budget-summary [data-provider=paid]').textContent").await,
            "paid：今天 $0.00 （无上限） · 本月 $0.00 / $5.00"
        );
        assert_eq!(
            b.js(&text("budget-source")).await,
            "这些上限是在这里（或用 tally budget set）设置的，由 tally 保存；它们取代配置文件里的预算。"
        );
        assert_eq!(b.js(&text("budget-reset")).await, "重新使用配置文件里的预算");
        crate::language::assert_no_english(&b, "the budget panel in Chinese", &["tally budget set"]).await;
        b.assert_accessible("the budget panel in Chinese").await;
        b.js("(location.hash = '#/')").await;
        b.until("the jobs page again", 10, "document.getElementById('budget-line') !== null").await;
        assert!(b.js(&text("budget-line")).await.as_str().unwrap_or("").starts_with("预算： 今天 $0.00 / $1.00"));
        crate::language::assert_no_english(&b, "the jobs page in Chinese", &[]).await;
        // The switch: English, kept across a reload.
        b.c().find(Locator::Css("#language")).await.expect("switch").select_by_value("en").await.expect("pick");
        b.until(
            "the page in English",
            15,
            "document.documentElement.lang === 'en' && document.getElementById('nav-jobs')?.textContent === 'Jobs'",
        )
        .await;
        b.assert_accessible("the page switched to English").await;
        b.close().await;
    });
}

#[test]
fn resuming_canceled_shots_names_the_price_and_asks_first() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let mut d = Daemon::configure(&money_providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    // The first shot's call is held at the provider while the set is canceled, so the second
    // shot is canceled before anything was sent for it.
    mock.behave(json!({ "latency_ms": 4000 }));
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "resumed vase", "provider": "paid", "shots": [
            {"role": "main", "prompt": "resume first"}, {"role": "scene", "prompt": "resume second"}]})),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let set = r.json()["id"].as_str().expect("set id").to_string();
    let first = r.json()["shots"][0]["id"].as_str().expect("shot").to_string();
    let second = r.json()["shots"][1]["id"].as_str().expect("shot").to_string();
    d.wait_status(&first, &["running"]);
    let c = d.call("POST", &format!("/v1/sets/{set}/cancel"), Some(&json!({})));
    assert!((200..300).contains(&c.status), "cancel: {} {}", c.status, String::from_utf8_lossy(&c.body));
    mock.behave(json!({ "latency_ms": 0 }));
    d.wait_status(&second, &["canceled"]);
    d.wait_status(&first, &["succeeded", "canceled", "unknown", "failed"]);
    assert_eq!(mock.count("resume second"), (0, 0), "the canceled shot sent nothing");

    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&url).await;
        b.js(&format!("(location.hash = '#/sets/{set}')")).await;
        b.until("the resume button", 10, "document.getElementById('resume-set') !== null").await;
        let before = task_count(&d);
        let ask = b.ask("#resume-set").await;
        assert!(ask.contains("$0.04"), "the question names the price: {ask}");
        b.assert_accessible("the resume question").await;
        b.say_no().await;
        assert_eq!(task_count(&d), before, "saying no spent nothing");
        assert_eq!(mock.count("resume second"), (0, 0), "saying no sent nothing");
        b.ask("#resume-set").await;
        b.click("#confirm-yes").await;
        b.close().await;
    });
    let sent = wait_for(Duration::from_secs(30), || (mock.count("resume second").1 == 1).then_some(()));
    assert!(sent.is_some(), "saying yes generated the canceled shot: {:?}", mock.count("resume second"));
    assert_eq!(mock.count("resume second"), (1, 1), "one request, charged once");
}

#[test]
fn a_set_held_by_the_budget_raises_it_on_the_set_page() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let mut d = Daemon::configure(&format!("[budget]\ndaily = 0.04\n\n{}", money_providers(&mock)));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    // The budget takes one image: the second shot waits for it.
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "held vase", "provider": "paid", "shots": [
            {"role": "main", "prompt": "held first"}, {"role": "scene", "prompt": "held second"}]})),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let set = r.json()["id"].as_str().expect("set id").to_string();
    let second = r.json()["shots"][1]["id"].as_str().expect("shot").to_string();
    let held = d.wait_status(&second, &["waiting"]);
    assert_eq!(held["held_by_budget"], true, "{held}");
    let shown = d.call("GET", &format!("/v1/sets/{set}"), None).json();
    assert_eq!(
        (shown["shots"][0]["held_by_budget"].clone(), shown["shots"][1]["held_by_budget"].clone()),
        (json!(false), json!(true)),
        "{shown}"
    );
    assert_eq!(mock.count("held second"), (0, 0), "held: nothing sent");

    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::phone().await;
        b.sign_in(&url).await;
        b.js(&format!("(location.hash = '#/sets/{set}')")).await;
        b.until("the budget on the set page", 10, "document.getElementById('budget-daily') !== null").await;
        let line = b.js("document.getElementById('set-budget-hold-line').textContent").await;
        assert!(line.as_str().is_some_and(|l| l.starts_with("1 image of this set waits")), "{line}");
        assert_eq!(b.js("document.getElementById('shot-raise-budget-0')").await, Value::Null, "the sent shot has none");
        b.click("#shot-raise-budget-1").await;
        assert_eq!(b.js("document.activeElement.id").await, "budget-daily", "the button takes her to the limit");
        b.assert_accessible("a set held by the budget").await;
        let daily = b.c().find(Locator::Css("#budget-daily")).await.expect("daily");
        assert_eq!(daily.prop("value").await.expect("value").as_deref(), Some("0.04"), "the limit in force");
        daily.clear().await.expect("clear");
        daily.send_keys("1").await.expect("type");
        b.click("#budget-save").await;
        b.until(
            "the held shot sent",
            20,
            "document.querySelector('[data-position=\"1\"]')?.dataset.status === 'succeeded'",
        )
        .await;
        assert_eq!(b.js("document.getElementById('set-budget-hold')").await, Value::Null, "nothing waits now");
        b.close().await;
    });
    assert_eq!(mock.count("held second"), (1, 1), "raised: sent once, charged once");
    assert_eq!(d.call("GET", "/v1/budget", None).json()["daily"], 1.0);
}

/// The resume button offers exactly the canceled shots that were never sent. A set of four
/// shots is canceled while the first is at the provider: that one finishes (a running shot is
/// never cut off), the other three are canceled before anything left for them. The fourth is
/// then given the record of a request that may have been charged (an execution row written
/// into the database, as a call interrupted by a crash and canceled while tally recovered it
/// leaves one: no quicker way there). The button names 2, its question the price of 2; saying
/// yes sends exactly the second and the third; the first is not sent again, and the fourth
/// keeps its own "Generate again" with its price, and is not sent.
#[test]
fn resuming_offers_exactly_the_canceled_shots_that_were_never_sent() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let mut d = Daemon::configure(&money_providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    mock.behave(json!({ "latency_ms": 4000 }));
    let r = d.call(
        "POST",
        "/v1/sets",
        Some(&json!({"product": "resumed jug", "provider": "paid", "shots": [
            {"role": "main", "prompt": "resume one"}, {"role": "scene", "prompt": "resume two"},
            {"role": "scene", "prompt": "resume three"}, {"role": "scene", "prompt": "resume four"}]})),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let made = r.json();
    let set = made["id"].as_str().expect("set id").to_string();
    let shot = |i: usize| made["shots"][i]["id"].as_str().expect("shot").to_string();
    d.wait_status(&shot(0), &["running"]);
    let c = d.call("POST", &format!("/v1/sets/{set}/cancel"), Some(&json!({})));
    assert!((200..300).contains(&c.status), "cancel: {} {}", c.status, String::from_utf8_lossy(&c.body));
    mock.behave(json!({ "latency_ms": 0 }));
    for i in 1..4 {
        d.wait_status(&shot(i), &["canceled"]);
    }
    assert_eq!(d.wait_status(&shot(0), &["succeeded", "canceled", "unknown", "failed"])["status"], "succeeded");
    let db = rusqlite::Connection::open(d.data.join("tally.db")).expect("open the daemon's database");
    db.busy_timeout(Duration::from_secs(10)).expect("busy timeout");
    let at = jiff::Timestamp::now().as_millisecond();
    db.execute(
        "INSERT INTO executions (token, task_id, attempt, status, phase, idempotency_key, boot_id, heartbeat_at,
           started_at, calling_at, finished_at, error, charge, billable, cost_micros, currency, model)
         VALUES (?1, ?2, 1, 'abandoned', 'calling', ?1, 'an-earlier-run', ?3, ?3, ?3, ?3,
           'interrupted while calling', 'possible', 1, 40000, 'USD', 'gpt-image-1')",
        rusqlite::params![uuid::Uuid::new_v4().to_string(), shot(3), at],
    )
    .expect("record a request that may have been charged");
    let fourth = d.call("GET", &format!("/v1/tasks/{}", shot(3)), None).json();
    assert_eq!(fourth["retry"]["requires_cost_acknowledgement"], true, "{fourth}");
    let sent_before = [mock.count("resume one"), mock.count("resume four")];
    assert_eq!(sent_before, [(1, 1), (0, 0)], "the first was sent once, the fourth never");
    for tag in ["resume two", "resume three"] {
        assert_eq!(mock.count(tag), (0, 0), "{tag}: nothing sent");
    }

    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&url).await;
        b.js(&format!("(location.hash = '#/sets/{set}')")).await;
        let label = b.until("the resume button", 10, "document.getElementById('resume-set')?.textContent").await;
        assert_eq!(label, json!("Resume the 2 canceled shots that were never sent"));
        // The fourth keeps its own retry, which asks about the possible charge, with its price.
        assert_eq!(b.js("document.getElementById('shot-retry-3')?.className").await, json!("danger"));
        let price = b.js("document.getElementById('shot-retry-price-3')?.textContent").await;
        assert!(price.as_str().unwrap_or("").contains("$0.04"), "{price}");
        let before = task_count(&d);
        let ask = b.ask("#resume-set").await;
        assert!(ask.contains("Resume 2 canceled shots?") && ask.contains("$0.08"), "two requests, their price: {ask}");
        b.assert_accessible("the question resuming two of three canceled shots").await;
        b.click("#confirm-yes").await;
        b.until("the button gone", 15, "document.getElementById('resume-set') === null").await;
        assert_eq!(task_count(&d), before + 2, "two new requests");
        b.close().await;
    });
    let sent = wait_for(Duration::from_secs(30), || {
        (mock.count("resume two").1 == 1 && mock.count("resume three").1 == 1).then_some(())
    });
    assert!(sent.is_some(), "the two never sent went: {:?} {:?}", mock.count("resume two"), mock.count("resume three"));
    assert_eq!([mock.count("resume two"), mock.count("resume three")], [(1, 1), (1, 1)], "each once");
    assert_eq!([mock.count("resume one"), mock.count("resume four")], sent_before, "neither sent again");
}
