//! The owner's language beyond the page's frame (issue #27): the task JSON's sentences, the
//! history lines, a held job's words and the API's errors in Simplified Chinese when asked
//! for with `Accept-Language` (or the page's cookie), byte-for-byte English otherwise; the CLI
//! printing them with `ui.language = "zh-CN"`; and the main views of the page in Chinese,
//! axe-core clean, saying a job's sentences and history in Chinese; a set with two candidates
//! per shot (its candidates, own history, Deliver section and why it cannot be delivered,
//! Duplicate dialog), a queued set's Edit forms and the signed-out page in Chinese with no run
//! of English words left, axe-core clean; the CLI's labels and words (status, list, budget,
//! spend, held, set status) and the API's refusals (budget, delivery) in Chinese.
//!
//! Just over 600 lines on purpose: the one place that walks every surface in the second
//! language, so a surface left in English is missed in one file, not across several.

use serde_json::{Value, json};

use crate::browser::Browser;
use crate::common::{Daemon, FAST_DEMO, Mock, OPENAI_MODEL, request, wait_for};
use crate::web::printed_sign_in_url;

/// Whether `s` has Chinese characters in it.
fn chinese(s: &str) -> bool {
    s.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))
}

/// The visible text of the page, one entry per text node (trimmed, empty ones left out):
/// nothing inside a closed dialog, a hidden element, a script or a style.
const VISIBLE_TEXT: &str = "(() => { const out = []; \
    const w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT); \
    while (w.nextNode()) { const n = w.currentNode, e = n.parentElement, t = n.textContent.trim(); \
      if (!e || !t || e.closest('script,style,template')) continue; \
      if (e.checkVisibility && !e.checkVisibility()) continue; \
      out.push(t); } \
    return out; })()";

/// Runs of three or more English words in `texts` (the visible text of a view that should be
/// in Chinese), once the `allowed` text (names of providers, profiles and files, commands, the
/// owner's own words) is taken out. A word is ASCII letters (with ' or -), its punctuation
/// trimmed; anything else (Chinese, a number, an id, an amount, a path) ends a run.
fn english_runs(texts: &[String], allowed: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for text in texts {
        let mut text = text.clone();
        for a in allowed {
            text = text.replace(a, " · ");
        }
        let mut run: Vec<&str> = Vec::new();
        let mut flush = |run: &mut Vec<&str>| {
            if run.len() >= 3 {
                found.push(run.join(" "));
            }
            run.clear();
        };
        for token in text.split_whitespace() {
            let word = token.trim_matches(|c: char| ",.:;!?()\"“”…·".contains(c));
            let english = !word.is_empty()
                && word.chars().any(|c| c.is_ascii_alphabetic())
                && word.chars().all(|c| c.is_ascii_alphabetic() || c == '\'' || c == '-');
            if english {
                run.push(word);
            } else {
                flush(&mut run);
            }
            // A sentence's end ends a run too ("Ready. Next" is two runs).
            if english && token.ends_with(['.', ':', ';']) {
                flush(&mut run);
            }
        }
        flush(&mut run);
    }
    found
}

/// Words every Chinese view may show in English: names and commands, not sentences.
const ALWAYS_ALLOWED: &[&str] = &["tally serve", "tally sign-in", "tally check", "English"];

/// Assert that the view in `b` shows no run of three English words but `allowed` ones.
pub(crate) async fn assert_no_english(b: &Browser, view: &str, allowed: &[&str]) {
    let texts: Vec<String> = b
        .js(VISIBLE_TEXT)
        .await
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str().map(String::from))
        .collect();
    assert!(!texts.is_empty(), "{view}: no visible text");
    let all: Vec<&str> = ALWAYS_ALLOWED.iter().chain(allowed).copied().collect();
    let runs = english_runs(&texts, &all);
    assert!(runs.is_empty(), "{view} still shows English: {runs:#?}");
}

#[test]
fn the_english_check_finds_runs_of_english_words_and_lets_names_and_chinese_through() {
    let t = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(english_runs(&t(&["Use the configuration file's budget again"]), &[]).len(), 1);
    assert!(
        english_runs(&t(&["用 flux：约 $0.12（3 × $0.04）", "blue mug", "amazon: 2000×2000 JPEG"]), &[]).is_empty()
    );
    assert!(english_runs(&t(&["on a desk"]), &["on a desk"]).is_empty());
    assert_eq!(english_runs(&t(&["任务 0190a0a0 is being generated now"]), &[]), vec!["is being generated now"]);
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

    let auth0 = format!("Bearer {}", d.token());
    // An iPhone's HEIC photo is refused with the setting that fixes it, in either language.
    let heic = b"\0\0\0\x18ftypheic\0\0\0\0mif1heic".to_vec();
    let up = |lang: &str| {
        let h = [("Authorization", auth0.as_str()), ("Accept-Language", lang), ("Content-Type", "image/jpeg")];
        request(d.port, "POST", "/v1/uploads", &h, Some(&heic)).json()
    };
    let en = up("en");
    assert!(
        en["error"]["message"].as_str().is_some_and(|m| m.contains("HEIC") && m.contains("Most Compatible")),
        "{en}"
    );
    let zh = up("zh-CN");
    assert!(zh["error"]["message"].as_str().is_some_and(|m| m.contains("HEIC") && m.contains("兼容性最佳")), "{zh}");

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
    // The mock is an OpenAI-compatible gateway, not api.openai.com: no OpenAI page is linked.
    assert_eq!(zh["where_to_look"]["label"], "没有控制台", "{zh}");
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
    assert!(text.contains("收费      可能已经收费：结果无法证明（1 个请求，约 $0.04）"), "{text}");
    assert!(text.contains("下一步    先查看服务商的控制台，然后记录你看到的结果："), "{text}");
    assert!(text.contains("状态      结果未知\n") && text.contains("服务商    openai\n"), "{text}");
    assert!(!text.contains("charge ") && !text.contains("status ") && !text.contains("provider "), "{text}");
    let out = d.cli(&["status", &held]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("已暂停：今天的预算 $0.05 已经用完——提高预算，或者等到明天"), "{text}");
    let out = d.cli(&["events", &unknown]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("第 1 次尝试：正在把请求发给服务商（价格约 $0.04）"), "{text}");
    // The list, the budget, spend and held jobs: labels and plain words in Chinese, the
    // owner's prompts as written, machine formats (--json) unchanged.
    let out = d.cli(&["list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.contains(&unknown) && l.contains("结果未知") && l.ends_with("brass lamp, lost answer"))
    );
    assert!(!text.contains(" unknown "), "{text}");
    let out = d.cli(&["budget", "show"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("今天 $0.04 / $0.05 · 本月 $0.04（无上限）\n"), "{text}");
    assert!(text.contains("生效中：配置文件的 [budget]") && text.contains("日和月按 UTC 计算"), "{text}");
    assert!(!text.contains("today") && !text.contains("in force"), "{text}");
    let out = d.cli(&["spend"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("日期") && text.contains("可能已收费") && text.contains("被拒绝"), "{text}");
    assert!(text.contains("预算      每日 $0.05：这个周期已花费或可能已花费 $0.04；"), "{text}");
    assert!(!text.contains("possibly charged") && !text.contains("spent or possibly"), "{text}");
    let out = d.cli(&["--json", "budget", "show"]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("--json stays JSON");
    assert_eq!(json["source"], "config");
    let out = d.cli(&["held", "list"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "没有暂停的任务\n");

    // The API's refusals of a budget and of a delivery, in Chinese; their codes unchanged.
    let auth = format!("Bearer {}", d.token());
    let zh_json =
        [("Authorization", auth.as_str()), ("Accept-Language", "zh-CN"), ("Content-Type", "application/json")];
    let r = request(d.port, "PUT", "/v1/budget", &zh_json, Some(br#"{"providers": {"nope": {"daily": 1}}}"#));
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["error"]["code"], "invalid_request");
    assert_eq!(
        r.json()["error"]["message"],
        "没有叫 `nope` 的服务商；GET /v1/providers（或页面上的服务商列表）会列出它们",
        "{}",
        r.json()
    );
    let r = request(d.port, "PUT", "/v1/budget", &zh_json, Some(br#"{"daily": -1}"#));
    assert_eq!(r.json()["error"]["message"], "每日预算 -1 必须是一个金额，0 或以上", "{}", r.json());
    let (status, err) = get(&d, "/v1/deliveries/0190a0a0-0000-7000-8000-000000000000", ZH);
    assert_eq!((status, err["error"]["message"].as_str()), (404, Some("找不到这次交付")), "{err}");

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
        assert_no_english(
            &b,
            "an unknown job in Chinese",
            &["brass lamp, lost answer", "blue mug on oak", OPENAI_MODEL],
        )
        .await;
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
    // The main photo's first candidate chosen, the scene's not: the set's timeline has a
    // choice in it, and the set cannot be delivered yet.
    let s = d.call("GET", &format!("/v1/sets/{settled}"), None).json();
    let artifact = s["shots"][0]["candidates"][0]["artifact"]["id"].as_str().expect("an image").to_string();
    let r = d.call("PUT", &format!("/v1/sets/{settled}/shots/0/choice"), Some(&json!({ "artifact_id": artifact })));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));

    // The API in Chinese: the set's own timeline, why it cannot be delivered (with a profile
    // too), and the 409 of a delivery asked for anyway.
    let (_, zh_set) = get(&d, &format!("/v1/sets/{settled}"), ZH);
    let timeline: Vec<&str> =
        zh_set["timeline"].as_array().into_iter().flatten().filter_map(|e| e["message"].as_str()).collect();
    assert_eq!(timeline.first(), Some(&"图片组已创建：2 个镜头，要生成 4 张图片"), "{timeline:#?}");
    assert!(
        timeline.iter().any(|l| l.starts_with("镜头 1（主图）选定了图片 ") && l.contains("（候选图 1，任务 ")),
        "{timeline:#?}"
    );
    assert!(timeline.iter().all(|l| chinese(l)), "{timeline:#?}");
    assert_eq!(zh_set["delivery"]["blocking"], json!(["1 个镜头还没有选定图片：场景图"]), "{zh_set}");
    let (_, en_set) = get(&d, &format!("/v1/sets/{settled}"), &[]);
    assert_eq!(en_set["delivery"]["blocking"], json!(["1 shot has no chosen image: Lifestyle scene"]));
    assert_eq!(en_set["timeline"][0]["message"], "set created with 2 shot(s), 4 image(s) to generate");
    let (_, with_profile) = get(&d, &format!("/v1/sets/{settled}?profile=amazon"), ZH);
    let reasons: Vec<&str> =
        with_profile["delivery"]["blocking"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert!(!reasons.is_empty() && reasons.iter().all(|r| chinese(r) && !r.contains("chosen image")), "{reasons:?}");
    let auth = format!("Bearer {}", d.token());
    let r = request(
        d.port,
        "POST",
        &format!("/v1/sets/{settled}/deliveries"),
        &[("Authorization", auth.as_str()), ("Accept-Language", "zh-CN"), ("Content-Type", "application/json")],
        Some(br#"{"profile": "original", "target": "exports"}"#),
    );
    assert_eq!(r.status, 409);
    let refused = r.json();
    assert_eq!(refused["error"]["code"], "not_ready");
    assert_eq!(refused["error"]["message"], "这个图片组还不能交付：1 个镜头还没有选定图片：场景图", "{refused}");
    assert_eq!(refused["blocking"], json!(["1 个镜头还没有选定图片：场景图"]));

    // The CLI with `ui.language = "zh-CN"` (its own config; it asks the daemon in Chinese).
    let config = std::fs::read_to_string(&d.config).expect("config");
    std::fs::write(&d.config, format!("[ui]\nlanguage = \"zh-CN\"\n\n{config}")).expect("config");
    let out = d.cli(&["set", "status", &settled]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&format!("图片组 {settled}  已完成  （blue mug）\n")), "{text}");
    assert!(text.contains(&format!("  #0  主图{}2 张候选图，已选定：图片 ", " ".repeat(10))), "{text}");
    assert!(text.contains(&format!("  #1  场景图{}2 张候选图，还没有选定\n", " ".repeat(8))), "{text}");
    assert!(text.contains("      已完成    ") && text.contains("（已选定）"), "{text}");
    assert!(text.contains("  还不能交付：1 个镜头还没有选定图片：场景图\n"), "{text}");
    assert!(!text.contains("candidates") && !text.contains("chosen") && !text.contains("deliver"), "{text}");
    let out = d.cli(&["set", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.contains(&settled) && l.contains("blue mug")), "{text}");

    let blocker = set("vase", "slow", 1)["shots"][0]["id"].as_str().expect("shot").to_string();
    d.wait_status(&blocker, &["running"]);
    let queued = set("teapot", "slow", 2)["id"].as_str().expect("id").to_string();

    let url = printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;
        b.sign_in(&url).await;
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
        assert_eq!(uses, json!(["用这张", "用这张", "用这张"]), "the chosen image has no button");
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
        // Its own history and why it cannot be delivered, in Chinese; no English sentence left.
        let history = b.js("[...document.querySelectorAll('#set-timeline li span')].map(e => e.textContent)").await;
        let history: Vec<&str> = history.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        assert_eq!(history.first(), Some(&"图片组已创建：2 个镜头，要生成 4 张图片"), "{history:?}");
        assert!(history.len() >= 2 && history.iter().all(|l| chinese(l)), "{history:?}");
        assert_eq!(b.js(&text("set-timeline-title")).await, json!("这个图片组的记录"));
        // The built-in profiles by the names she knows, the API's name beside.
        let options = b.js("[...document.querySelectorAll('#deliver-profile option')].map(o => o.textContent)").await;
        let options: Vec<&str> = options.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        assert!(options.iter().any(|o| o.starts_with("淘宝主图 (taobao)")), "{options:?}");
        let blocking = b.js("[...document.querySelectorAll('#deliver-blocking li')].map(e => e.textContent)").await;
        let blocking: Vec<&str> = blocking.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        assert!(blocking.contains(&"1 个镜头还没有选定图片：场景图"), "{blocking:?}");
        assert!(blocking.iter().all(|l| chinese(l)), "{blocking:?}");
        assert_no_english(&b, "a set with candidates in Chinese", &["blue mug", "on white", "on a desk"]).await;
        b.assert_accessible("a set with candidates in Chinese").await;

        // Duplicate asks first, in Chinese, and says the copy sends nothing until it is started.
        b.click("#duplicate-set").await;
        b.until("the confirmation", 10, "document.getElementById('confirm-dialog').open").await;
        assert_eq!(b.js(&text("confirm-title")).await, json!("复制这个图片组？"));
        let body = b.js(&text("confirm-text")).await;
        assert_eq!(
            body,
            json!(
                "会新建一个副本，商品、照片和 2 个镜头（4 张图片）都一样，你可以先修改。点“开始生成”之前什么都不会发送，也不会收费。"
            )
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
        assert_eq!(roles, json!(["主图", "卖点图", "场景图", "细节图", "尺寸图"]));
        let page = b.js("document.querySelector('article.detail').innerText").await;
        let page = page.as_str().unwrap_or("");
        assert!(page.contains("这个镜头还没有发送，所以文字还可以改。"), "{page}");
        assert!(english_in(page).is_empty(), "English left in the set: {:?}\n{page}", english_in(page));
        assert_no_english(&b, "a queued set in Chinese", &["teapot", "on white", "on a desk"]).await;
        b.assert_accessible("editing a queued shot in Chinese").await;

        // Signed out (the session's cookie gone): the signed-out page, in the language the
        // switch chose, says how to sign in, in Chinese, axe-core clean.
        b.c().delete_all_cookies().await.expect("cookies");
        b.c().goto(&format!("http://127.0.0.1:{}/", d.port)).await.expect("open");
        b.js("(document.cookie = 'tally_lang=zh-CN; Path=/; SameSite=Strict', location.reload(), true)").await;
        b.until(
            "the signed-out page in Chinese",
            15,
            "document.documentElement.lang === 'zh-CN' && document.querySelector('main.signed-out') !== null",
        )
        .await;
        assert_eq!(b.js("document.title").await, json!("登录 · tally"));
        let body = b.js("document.getElementById('main').innerText").await;
        let body = body.as_str().unwrap_or("");
        assert!(body.contains("要登录，请打开 tally serve 启动时打印的登录链接"), "{body}");
        assert!(body.contains("/login?code=…，只能用一次）"), "{body}");
        assert_no_english(&b, "the signed-out page in Chinese", &[]).await;
        b.assert_accessible("the signed-out page in Chinese").await;
        b.close().await;
    });
}
