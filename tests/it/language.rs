//! The owner's language beyond the page's frame (issue #27): the task JSON's sentences, the
//! history lines, a held job's words and the API's errors in Simplified Chinese when asked
//! for with `Accept-Language` (or the page's cookie), byte-for-byte English otherwise; the CLI
//! printing them with `ui.language = "zh-CN"`; and the main views of the page in Chinese,
//! axe-core clean, saying a job's sentences and history in Chinese; a set with two candidates
//! per shot (its candidates, Deliver section, Duplicate dialog) and a queued set's Edit forms in
//! Chinese with none of their English words left, axe-core clean.

use serde_json::{Value, json};

use crate::browser::Browser;
use crate::common::{Daemon, FAST_DEMO, Mock, OPENAI_MODEL, request, wait_for};
use crate::web::printed_sign_in_url;

/// Whether `s` has Chinese characters in it.
fn chinese(s: &str) -> bool {
    s.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))
}

/// `path` on `d` with the token and `headers`, as JSON.
fn get(d: &Daemon, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let auth = format!("Bearer {}", d.token());
    let mut all = vec![("Authorization", auth.as_str())];
    all.extend_from_slice(headers);
    let r = request(d.port, "GET", path, &all, None);
    (r.status, r.json())
}

const ZH: &[(&str, &str)] = &[("Accept-Language", "zh-CN,zh;q=0.9,en;q=0.5")];

#[test]
fn the_task_json_history_and_errors_follow_the_language_asked_for_and_the_cli_its_ui_language() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let base = mock.base();
    // $0.04 an image, $0.05 a day: the first request (possibly charged) leaves no room for a
    // second, which is held by the budget.
    let mut d = Daemon::configure(&format!(
        "[budget]\ndaily = 0.05\n\n[[providers]]\nname = \"openai\"\nkind = \"openai_images\"\n\
         base_url = \"{base}\"\nmodel = \"{OPENAI_MODEL}\"\napi_key_env = \"TALLY_TEST_KEY\"\n\
         price_per_image = 0.04\nmax_concurrency = 2\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n"
    ));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-language".into()));
    d.spawn();

    // An unknown outcome: the mock charges, then drops the answer.
    mock.behave(json!({ "drop_response": true }));
    let r = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "brass lamp, lost answer", "provider": "openai"})));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let unknown = r.json()["id"].as_str().expect("id").to_string();
    let en = d.wait_status(&unknown, &["unknown"]);
    mock.behave(json!({ "drop_response": false }));
    let r = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "brass lamp, second", "provider": "openai"})));
    let held = r.json()["id"].as_str().expect("id").to_string();
    let held_en = wait_for(std::time::Duration::from_secs(30), || {
        let t = d.call("GET", &format!("/v1/tasks/{held}"), None).json();
        t["waiting_for"].as_str().is_some_and(|w| w.starts_with("Held:")).then_some(t)
    })
    .expect("the second job is held by the budget");

    // English by default, as before: the words tests and scripts read.
    let message = en["message"].as_str().unwrap_or("");
    assert!(
        message
            .starts_with("The result cannot be confirmed: the request reached the provider, but its answer was lost"),
        "{en}"
    );
    assert!(
        held_en["waiting_for"]
            .as_str()
            .unwrap_or("")
            .starts_with("Held: today's budget of $0.05 is spent — raise it or wait until tomorrow (00:00 UTC)."),
        "{held_en}"
    );

    // Asked for in Chinese: the same job's sentences in Chinese, money exact.
    let (status, zh) = get(&d, &format!("/v1/tasks/{unknown}"), ZH);
    assert_eq!(status, 200);
    let message = zh["message"].as_str().unwrap_or("");
    assert!(message.starts_with("无法确认结果：请求已经到达服务商，但它的回复丢失了"), "{zh}");
    assert!(message.ends_with("自动重试已经停止。再次生成是一次新的操作，可能会再次收费。"), "{zh}");
    let note = zh["retry"]["note"].as_str().unwrap_or("");
    assert!(note.contains("所以可能已经收费") && note.ends_with("可能会再次收费（约 $0.04）。"), "{note}");
    assert_eq!(zh["where_to_look"]["label"], "OpenAI 的用量页面", "{zh}");
    let labels: Vec<&str> =
        zh["where_to_look"]["match_by"].as_array().into_iter().flatten().filter_map(|m| m["label"].as_str()).collect();
    assert!(labels.contains(&"发送时间（UTC）") && labels.contains(&"提示词"), "{labels:?}");
    assert_eq!(zh["reason"], en["reason"], "the stored detail stays as recorded");
    assert_eq!(zh["status"], "unknown", "names for programs do not change");

    let (_, held_zh) = get(&d, &format!("/v1/tasks/{held}"), ZH);
    let waiting = held_zh["waiting_for"].as_str().unwrap_or("");
    assert!(
        waiting.starts_with("已暂停：今天的预算 $0.05 已经用完——提高预算，或者等到明天（UTC 00:00）。"),
        "{held_zh}"
    );
    assert!(waiting.ends_with("这次请求大约要 $0.04；什么都没有发送。"), "{waiting}");
    assert_eq!(held_zh["message"], held_zh["waiting_for"], "{held_zh}");

    // The history: every line the daemon wrote, in Chinese.
    let (_, ev) = get(&d, &format!("/v1/tasks/{unknown}/events"), ZH);
    let lines: Vec<&str> =
        ev["events"].as_array().into_iter().flatten().filter_map(|e| e["message"].as_str()).collect();
    assert!(lines.len() >= 3, "{ev}");
    assert!(lines.iter().all(|l| chinese(l)), "every history line in Chinese: {lines:#?}");
    assert!(lines.contains(&"第 1 次尝试：正在把请求发给服务商（价格约 $0.04）"), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("自动重试已停止——可能已经收费（约 $0.04）")), "{lines:#?}");
    let (_, ev_en) = get(&d, &format!("/v1/tasks/{unknown}/events"), &[]);
    assert!(
        ev_en["events"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["message"] == "attempt 1: sending the request to the provider (its price: about $0.04)"),
        "{ev_en}"
    );

    // An error, in Chinese; and the page's switch (its cookie) chooses the same way.
    let (status, err) = get(&d, "/v1/tasks/0190a0a0-0000-7000-8000-000000000000", ZH);
    assert_eq!((status, err["error"]["message"].as_str()), (404, Some("找不到这个任务")), "{err}");
    assert_eq!(err["error"]["code"], "not_found");
    let (_, by_cookie) = get(&d, &format!("/v1/tasks/{unknown}"), &[("Cookie", "tally_lang=zh-CN")]);
    assert_eq!(by_cookie["message"], zh["message"]);

    // The CLI in the owner's language: `ui.language = "zh-CN"` in the config it shares.
    d.term();
    let config = std::fs::read_to_string(&d.config).expect("config");
    std::fs::write(&d.config, format!("[ui]\nlanguage = \"zh-CN\"\n\n{config}")).expect("config");
    d.spawn();
    let out = d.cli(&["status", &unknown]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("无法确认结果：请求已经到达服务商，但它的回复丢失了"), "{text}");
    assert!(text.contains("可能会再次收费（约 $0.04）"), "{text}");
    assert!(text.contains("charge    可能已经收费：结果无法证明（1 个请求，约 $0.04）"), "{text}");
    assert!(text.contains("next      先查看服务商的控制台，然后记录你看到的结果："), "{text}");
    let out = d.cli(&["status", &held]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("已暂停：今天的预算 $0.05 已经用完——提高预算，或者等到明天"), "{text}");
    let out = d.cli(&["events", &unknown]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("第 1 次尝试：正在把请求发给服务商（价格约 $0.04）"), "{text}");
    let out = d.cli(&["status", "0190a0a0-0000-7000-8000-000000000000"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("找不到这个任务"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_main_views_in_chinese_are_axe_clean_and_say_a_jobs_sentences_in_chinese() {
    let mock = Mock::start(&["--job-duration-ms", "20"]);
    let (d, jobs) = crate::web_views::daemon_with_jobs(&mock);
    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.c().goto(&url).await.expect("sign in");
        b.until("the jobs page", 15, "document.getElementById('task-list')?.children.length >= 3").await;
        // The page's switch (a cookie), as an owner would choose it.
        b.js("(document.cookie = 'tally_lang=zh-CN; Path=/; SameSite=Strict', location.reload(), true)").await;
        b.until(
            "the jobs list in Chinese",
            15,
            "document.documentElement.lang === 'zh-CN' && document.getElementById('task-list')?.children.length >= 3",
        )
        .await;
        let list = b.js("document.getElementById('task-list').innerText").await;
        let list = list.as_str().unwrap_or("");
        assert!(list.contains("结果未知：请求已经到达 openai，但它的回复丢失了，所以可能已经收费。"), "{list}");
        assert!(list.contains("完成：图片已经好了。"), "{list}");
        b.assert_accessible("the jobs list in Chinese").await;

        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.unknown)).await;
        b.until("the unknown job", 15, "document.getElementById('where-to-look') !== null").await;
        let sentence = b.js("document.getElementById('task-message').textContent").await;
        assert_eq!(sentence, json!("结果未知：请求已经到达 openai，但它的回复丢失了，所以可能已经收费。"));
        let charge = b.js("document.getElementById('charge').textContent").await;
        assert!(charge.as_str().unwrap_or("").starts_with("可能已经收费（约 "), "{charge}");
        let timeline = b.js("[...document.querySelectorAll('#timeline li span')].map(e => e.textContent)").await;
        let timeline: Vec<&str> = timeline.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        assert!(!timeline.is_empty() && timeline.iter().all(|l| chinese(l)), "{timeline:?}");
        assert!(timeline.contains(&"已发给 openai。"), "{timeline:?}");
        let explainer = b.js("document.getElementById('unknown-explainer').innerText").await;
        assert!(explainer.as_str().unwrap_or("").contains("自动重试已经停止"), "{explainer}");
        let bills = b.js("document.getElementById('billing-note').textContent").await;
        assert_eq!(bills, json!("openai 怎么收费：这个服务商可能会对它收到的每个生成请求收费。"));
        // The raw history under "Technical details" comes from the API, in Chinese too.
        let raw = b
            .js("[...document.querySelectorAll('.raw-events tbody tr td:nth-child(4)')].map(e => e.textContent)")
            .await;
        assert!(raw.as_array().into_iter().flatten().filter_map(Value::as_str).all(chinese), "{raw}");
        b.assert_accessible("an unknown job in Chinese").await;
        // Retrying says, in Chinese, that it may be charged again, and how much.
        b.click("#retry-task").await;
        b.until("the retry dialog", 10, "document.getElementById('retry-dialog').open").await;
        let warning = b.js("document.getElementById('retry-warning').textContent").await;
        assert!(warning.as_str().unwrap_or("").ends_with("可能会再收费（约 $0.04）。"), "{warning}");
        let ack = b.js("document.getElementById('retry-ack-text').textContent").await;
        assert_eq!(ack, json!("我明白重新生成可能会再收费一次（约 $0.04）。"));
        b.assert_accessible("the retry dialog in Chinese").await;
        b.click("#retry-cancel").await;

        b.js(&format!("(location.hash = '#/tasks/{}')", jobs.ready)).await;
        b.until("the ready job", 15, "document.getElementById('task-image') !== null").await;
        let sentence = b.js("document.getElementById('task-message').textContent").await;
        assert_eq!(sentence, json!("完成：图片已经好了。"));
        b.assert_accessible("a ready job in Chinese").await;

        b.js(&format!("(location.hash = '#/sets/{}')", jobs.set)).await;
        b.until("a set", 15, "document.getElementById('shots') !== null").await;
        let set = b.js("document.getElementById('set-message').textContent").await;
        assert_eq!(set, json!("已结束，但有些镜头没有生成图片。"), "the set's words from the API, in Chinese");
        b.assert_accessible("a set in Chinese").await;

        b.js("(location.hash = '#/spend')").await;
        b.until("spend", 15, "document.getElementById('spend-table')?.children.length > 0").await;
        let spend = b.js("document.getElementById('main').innerText").await;
        let spend = spend.as_str().unwrap_or("");
        assert!(spend.contains("可能已收费") && spend.contains("到达服务商的请求"), "{spend}");
        assert!(!spend.contains("Possibly charged") && !spend.contains("What tally knows"), "{spend}");
        b.assert_accessible("spend in Chinese").await;
        b.screenshot("zh-spend.png").await;

        // A new set: the form and its price before "Create the set", money exact.
        b.js("(location.hash = '#/sets/new')").await;
        b.until("the new-set form", 15, "document.getElementById('set-provider') !== null").await;
        b.js("(() => { const p = document.getElementById('set-provider'); p.value = 'flux'; \
              p.dispatchEvent(new Event('change')); return true; })()")
            .await;
        let price = b.js("document.getElementById('set-price').textContent").await;
        assert!(
            price.as_str().unwrap_or("").starts_with("3 个镜头，用 flux：约 $0.12（3 × $0.04）。flux 怎么收费："),
            "{price}"
        );
        let form = b.js("document.getElementById('new-set').innerText").await;
        let form = form.as_str().unwrap_or("");
        assert!(form.contains("商品名称") && form.contains("镜头（按顺序）"), "{form}");
        assert!(!form.contains("Product name") && !form.contains("Add a shot"), "{form}");
        b.assert_accessible("a new set in Chinese").await;
        b.close().await;
    });
}

/// The English words of a set's view that must not show in the Chinese page.
const SET_ENGLISH: &[&str] = &[
    "Deliver",
    "Profile",
    "Where to",
    "Use this one",
    "Candidate",
    "Compare",
    "Duplicate",
    "Generate another",
    "Details and history",
    "Shots",
    "Edit",
    "Keep it as it was",
    "reference photo",
    "Add photos",
    "Drop photos",
];

/// English words of [`SET_ENGLISH`] found in `text`.
fn english_in(text: &str) -> Vec<&'static str> {
    SET_ENGLISH.iter().copied().filter(|w| text.contains(w)).collect()
}

#[test]
fn a_set_with_candidates_its_deliver_section_and_its_edit_and_duplicate_buttons_are_in_chinese() {
    // `demo` finishes at once; `slow` keeps its one slot busy for minutes, so a set sent to it
    // after another stays queued (nothing sent: Edit is offered).
    let mut d = Daemon::configure(&format!(
        "{FAST_DEMO}\n[[providers]]\nname = \"slow\"\nkind = \"demo\"\nmax_concurrency = 1\ndelay_ms = 600000\n"
    ));
    d.spawn();
    let set = |product: &str, provider: &str, candidates: u32| -> Value {
        let body = json!({"product": product, "provider": provider, "shots": [
            {"role": "main", "prompt": "on white", "candidates": candidates},
            {"role": "scene", "prompt": "on a desk", "candidates": candidates}]});
        let r = d.call("POST", "/v1/sets", Some(&body));
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        r.json()
    };
    let settled = set("blue mug", "demo", 2)["id"].as_str().expect("id").to_string();
    wait_for(std::time::Duration::from_secs(60), || {
        let s = d.call("GET", &format!("/v1/sets/{settled}"), None).json();
        let all: Vec<Value> = s["shots"]
            .as_array()?
            .iter()
            .flat_map(|x| x["candidates"].as_array().cloned().unwrap_or_default())
            .collect();
        (all.len() == 4 && all.iter().all(|c| c["status"] == "succeeded")).then_some(())
    })
    .expect("the set's four candidates succeed");
    let blocker = set("vase", "slow", 1)["shots"][0]["id"].as_str().expect("shot").to_string();
    d.wait_status(&blocker, &["running"]);
    let queued = set("teapot", "slow", 2)["id"].as_str().expect("id").to_string();

    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.c().goto(&url).await.expect("sign in");
        b.until("the jobs page", 15, "document.getElementById('new-task') !== null").await;
        b.js("(document.cookie = 'tally_lang=zh-CN; Path=/; SameSite=Strict', location.reload(), true)").await;
        b.until("the page in Chinese", 15, "document.documentElement.lang === 'zh-CN'").await;

        // A settled set, two candidates per shot: candidates, Deliver and Duplicate in Chinese.
        b.js(&format!("(location.hash = '#/sets/{settled}')")).await;
        b.until(
            "the set",
            15,
            "document.getElementById('candidates-1') !== null && document.getElementById('deliver') !== null",
        )
        .await;
        let text = |id: &str| format!("document.getElementById('{id}')?.textContent");
        assert_eq!(b.js(&text("deliver-title")).await, json!("交付"));
        assert_eq!(b.js(&text("deliver-start")).await, json!("交付"));
        assert_eq!(b.js("document.querySelector('label[for=deliver-profile]').textContent").await, json!("平台规格"));
        let ready = b.js(&text("deliver-ready")).await;
        assert!(ready.as_str().is_some_and(|r| r.starts_with("还不能按 ") && r.ends_with(" 交付：")), "{ready}");
        assert_eq!(
            b.js("document.getElementById('candidates-0').getAttribute('aria-label')").await,
            json!("主图的候选图")
        );
        assert_eq!(
            b.js("document.getElementById('candidates-1').getAttribute('aria-label')").await,
            json!("场景图的候选图")
        );
        let uses = b.js("[...document.querySelectorAll('#shots .use-this')].map(u => u.textContent)").await;
        assert_eq!(uses, json!(["用这张", "用这张", "用这张", "用这张"]));
        assert_eq!(
            b.js("document.getElementById('use-0-1').getAttribute('aria-label')").await,
            json!("用这张：主图，候选图 2/2")
        );
        assert_eq!(b.js(&text("compare-open-0")).await, json!("勾选两张来比较（已勾选 0 张）"));
        assert_eq!(b.js(&text("duplicate-set")).await, json!("复制…"));
        assert_eq!(b.js(&text("shot-more-0")).await, json!("照这个再生成一张"));
        assert_eq!(b.js("document.getElementById('set-edit') === null").await, true, "a settled set is not editable");
        let page = b.js("document.querySelector('article.detail').innerText").await;
        let page = page.as_str().unwrap_or("");
        assert!(page.contains("把每个镜头选中的图片做成电商平台要的文件"), "{page}");
        assert!(english_in(page).is_empty(), "English left in the set: {:?}\n{page}", english_in(page));
        b.assert_accessible("a set with candidates in Chinese").await;

        // Duplicate asks first, in Chinese, and says it is free.
        b.click("#duplicate-set").await;
        b.until("the confirmation", 10, "document.getElementById('confirm-dialog').open").await;
        assert_eq!(b.js(&text("confirm-title")).await, json!("复制这个图片组？"));
        let body = b.js(&text("confirm-text")).await;
        assert_eq!(
            body,
            json!("会新建一个图片组，商品、照片和 2 个镜头都一样，它的 4 张图片会排队生成。不收费：demo 是免费的。")
        );
        assert_eq!(b.js(&text("confirm-yes")).await, json!("复制"));
        b.assert_accessible("the duplicate dialog in Chinese").await;
        b.click("#confirm-no").await;

        // A set nothing was sent for: Edit for the set and each shot, in Chinese.
        b.js(&format!("(location.hash = '#/sets/{queued}')")).await;
        b.until("the queued set", 15, "document.getElementById('shot-edit-1') !== null").await;
        assert_eq!(b.js(&text("set-edit")).await, json!("修改商品和风格"));
        assert_eq!(b.js(&text("shot-edit-0")).await, json!("修改"));
        assert_eq!(b.js(&text("duplicate-set")).await, json!("复制…"));
        // Its reference photos can still be added, in Chinese.
        assert_eq!(b.js(&text("refs-title")).await, json!("你的参考照片"));
        assert_eq!(b.js(&text("ref-add-label")).await, json!("添加照片…"));
        let hint = b.js(&text("refs-hint")).await;
        assert!(hint.as_str().is_some_and(|h| h.starts_with("这个图片组没有参考照片。")), "{hint}");
        let drop = b.js("document.querySelector('#ref-drop p').textContent").await;
        assert_eq!(drop, json!("把照片拖到这里，即可加入这个图片组。"));
        b.click("#shot-edit-0").await;
        b.until("the shot's form", 10, "document.getElementById('shot-edit-form-0') !== null").await;
        assert_eq!(b.js(&text("shot-edit-save-0")).await, json!("保存镜头"));
        assert_eq!(b.js(&text("shot-edit-cancel-0")).await, json!("保持原样"));
        let roles = b.js("[...document.querySelectorAll('#shot-edit-role-0 option')].map(o => o.textContent)").await;
        assert_eq!(roles, json!(["主图", "卖点图", "场景图"]));
        let page = b.js("document.querySelector('article.detail').innerText").await;
        let page = page.as_str().unwrap_or("");
        assert!(page.contains("这个镜头还没有发送，所以文字还可以改。"), "{page}");
        assert!(english_in(page).is_empty(), "English left in the set: {:?}\n{page}", english_in(page));
        b.assert_accessible("editing a queued shot in Chinese").await;
        b.close().await;
    });
}
