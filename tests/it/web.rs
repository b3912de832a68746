//! The web page: plain HTTP checks of the one-time sign-in, the session cookie, CSRF, the
//! Host check and the event stream; then Debian's Chromium, headless, driven through
//! chromedriver (WebDriver) with fantoccini, signing in and using the page as a shop owner
//! would. A missing browser fails the browser test with a message naming
//! `scripts/install-browser.sh`; it is never skipped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use fantoccini::Locator;
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::common::{Daemon, FAST_DEMO, Mock, Reply, request, wait_for};

/// The one-time sign-in URL `tally serve` printed on stdout.
pub fn printed_sign_in_url(d: &Daemon) -> String {
    let found = wait_for(Duration::from_secs(10), || {
        d.stdout().split_whitespace().find(|w| w.contains("/login?code=")).map(str::to_string)
    });
    found.unwrap_or_else(|| panic!("tally serve printed no sign-in URL; stdout:\n{}", d.stdout()))
}

/// The path and query of a URL on the daemon (`http://127.0.0.1:PORT/login?code=…`).
fn path_of(d: &Daemon, url: &str) -> String {
    let base = format!("http://127.0.0.1:{}", d.port);
    url.strip_prefix(&base).unwrap_or_else(|| panic!("{url} is not under {base}")).to_string()
}

/// Sign in with a URL: the `name=value` of the session cookie.
fn sign_in(d: &Daemon, url: &str) -> String {
    let r = request(d.port, "GET", &path_of(d, url), &[], None);
    assert_eq!(r.status, 303, "sign-in answer: {}", String::from_utf8_lossy(&r.body));
    let cookie = r.header("set-cookie").expect("a session cookie");
    cookie.split(';').next().expect("name=value").trim().to_string()
}

/// A fresh sign-in URL from the API (bearer token).
fn new_sign_in_url(d: &Daemon) -> String {
    let r = d.call("POST", "/v1/session/sign-in-url", Some(&json!({})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["url"].as_str().expect("url").to_string()
}

fn with_cookie(d: &Daemon, method: &str, path: &str, cookie: &str, csrf: Option<&str>, body: Option<&Value>) -> Reply {
    let body = body.map(Value::to_string);
    let mut headers = vec![("Cookie", cookie)];
    if let Some(t) = csrf {
        headers.push(("X-CSRF-Token", t));
    }
    if body.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    request(d.port, method, path, &headers, body.as_deref().map(str::as_bytes))
}

#[test]
fn sign_in_sets_a_strict_http_only_cookie_and_a_code_works_once() {
    let d = Daemon::start(FAST_DEMO);
    let url = printed_sign_in_url(&d);
    assert!(url.starts_with(&format!("http://127.0.0.1:{}/login?code=", d.port)), "{url}");
    let code = url.split("code=").nth(1).unwrap_or("");
    assert!(code.len() >= 32 && code.bytes().all(|b| b.is_ascii_hexdigit()), "the code carries >= 128 bits: {code}");

    let path = path_of(&d, &url);
    let first = request(d.port, "GET", &path, &[], None);
    assert_eq!(first.status, 303);
    assert_eq!(first.header("location"), Some("/"));
    let cookie = first.header("set-cookie").expect("Set-Cookie").to_string();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.split(';').any(|p| p.trim() == flag), "{flag} missing: {cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain http: no Secure flag: {cookie}");
    assert!(cookie.starts_with("tally_session="), "{cookie}");
    let session = cookie.split(';').next().unwrap_or("").to_string();

    // The same code again, an unknown code and no code: a plain 403 page.
    for p in [path.as_str(), "/login?code=0123456789abcdef0123456789abcdef", "/login"] {
        let r = request(d.port, "GET", p, &[], None);
        assert_eq!(r.status, 403, "{p}");
        assert!(r.header("content-type").unwrap_or("").starts_with("text/html"), "{p}");
        assert!(r.header("set-cookie").is_none(), "{p}");
    }

    // Signed in: the page, with its CSRF token; signed out: how to sign in.
    let page = request(d.port, "GET", "/", &[("Cookie", &session), ("Accept", "text/html")], None);
    let html = String::from_utf8_lossy(&page.body).to_string();
    assert_eq!(page.status, 200);
    assert!(html.contains("<html") && html.contains("/assets/app.js") && !html.contains("{{CSRF_TOKEN}}"), "{html}");
    let out = request(d.port, "GET", "/", &[], None);
    let out_html = String::from_utf8_lossy(&out.body).to_string();
    assert_eq!(out.status, 200);
    assert!(out_html.contains("<html") && out_html.contains("tally sign-in"), "{out_html}");
    let stale = request(d.port, "GET", "/", &[("Cookie", "tally_session=not-a-session")], None);
    assert!(String::from_utf8_lossy(&stale.body).contains("tally sign-in"));
    assert_eq!(with_cookie(&d, "GET", "/v1/tasks", "tally_session=not-a-session", None, None).status, 401);

    // More URLs: from the API with the bearer token (not with a cookie), and from the CLI.
    let again = new_sign_in_url(&d);
    assert_ne!(again, url);
    let second = sign_in(&d, &again);
    assert_ne!(second, session, "every sign-in is a new session");
    assert_eq!(request(d.port, "GET", &path_of(&d, &again), &[], None).status, 403);
    let csrf = with_cookie(&d, "GET", "/v1/session", &session, None, None).json()["csrf_token"]
        .as_str()
        .expect("csrf token")
        .to_string();
    let minted = with_cookie(&d, "POST", "/v1/session/sign-in-url", &session, Some(&csrf), Some(&json!({})));
    assert_eq!(minted.status, 403, "a browser session cannot mint sign-in URLs");
    let cli = d.cli(&["sign-in"]);
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    let cli_url = String::from_utf8_lossy(&cli.stdout).trim().to_string();
    sign_in(&d, &cli_url);
}

/// Regression (issue 24, finding 8): a link preview that sends `HEAD /login?code=…` burned the
/// one-time sign-in link. HEAD (and any other method but GET) answers without consuming the
/// code or starting a session; the GET after it still signs in, once.
#[test]
fn head_on_the_sign_in_link_does_not_consume_the_code() {
    let d = Daemon::start(FAST_DEMO);
    let url = new_sign_in_url(&d);
    let path = path_of(&d, &url);
    for _ in 0..2 {
        let head = request(d.port, "HEAD", &path, &[], None);
        assert_ne!(head.status, 303, "HEAD signed in");
        assert!(head.header("set-cookie").is_none(), "HEAD started a session");
    }
    let post = request(d.port, "POST", &path, &[], None);
    assert!(post.header("set-cookie").is_none(), "POST started a session: {}", post.status);
    let first = request(d.port, "GET", &path, &[], None);
    assert_eq!(first.status, 303, "the GET after a HEAD: {}", String::from_utf8_lossy(&first.body));
    assert!(first.header("set-cookie").is_some_and(|c| c.starts_with("tally_session=")));
    assert_eq!(request(d.port, "GET", &path, &[], None).status, 403, "the code still works only once");
}

#[test]
fn the_cookie_needs_the_csrf_token_for_changes() {
    let d = Daemon::start(FAST_DEMO);
    let cookie = sign_in(&d, &printed_sign_in_url(&d));
    let session = with_cookie(&d, "GET", "/v1/session", &cookie, None, None);
    assert_eq!(session.status, 200);
    let csrf = session.json()["csrf_token"].as_str().expect("csrf_token").to_string();
    assert!(csrf.len() >= 32);
    assert_eq!(d.call("GET", "/v1/session", None).error_code(), "no_session");

    let body = json!({ "prompt": "csrf check" });
    let without = with_cookie(&d, "POST", "/v1/tasks", &cookie, None, Some(&body));
    assert_eq!(without.status, 403);
    assert_eq!(without.error_code(), "csrf_token_required");
    let wrong = with_cookie(&d, "POST", "/v1/tasks", &cookie, Some("0000"), Some(&body));
    assert_eq!(wrong.status, 403);
    let with = with_cookie(&d, "POST", "/v1/tasks", &cookie, Some(&csrf), Some(&body));
    assert_eq!(with.status, 201, "{}", String::from_utf8_lossy(&with.body));
    let id = with.json()["id"].as_str().expect("id").to_string();
    // Reads need no token; the bearer token needs no CSRF token.
    assert_eq!(with_cookie(&d, "GET", "/v1/tasks", &cookie, None, None).status, 200);
    assert_eq!(d.call("POST", "/v1/tasks", Some(&json!({ "prompt": "bearer" }))).status, 201);
    let cancel = with_cookie(&d, "POST", &format!("/v1/tasks/{id}/cancel"), &cookie, None, None);
    assert_eq!(cancel.error_code(), "csrf_token_required");

    // Artifacts load with the cookie alone (the page's <img>).
    let task = d.wait_status(&id, &["succeeded"]);
    let url = task["artifacts"][0]["url"].as_str().expect("artifact url");
    let art = with_cookie(&d, "GET", url, &cookie, None, None);
    assert_eq!(art.status, 200);
    assert_eq!(art.header("content-type"), Some("image/png"));

    let providers = with_cookie(&d, "GET", "/v1/providers", &cookie, None, None).json();
    let demo = &providers["providers"][0];
    assert_eq!(demo["name"], "demo");
    assert_eq!(demo["kind"], "demo");
    assert!(demo["capabilities"]["idempotent_create"].is_boolean() && demo["capabilities"]["lookup"].is_boolean());
    assert!(demo["billing_note"].as_str().is_some_and(|n| !n.is_empty()));
}

#[test]
fn the_page_and_login_refuse_a_foreign_host() {
    let d = Daemon::start(FAST_DEMO);
    for path in ["/", "/login?code=abc", "/assets/app.js"] {
        let r = request(d.port, "GET", path, &[("Host", "evil.example")], None);
        assert_eq!(r.status, 421, "{path}");
        let r = request(d.port, "GET", path, &[("Host", &format!("127.0.0.1.evil.example:{}", d.port))], None);
        assert_eq!(r.status, 421, "{path}");
    }
    // The printed code still works afterwards: a refused request did not consume it.
    sign_in(&d, &printed_sign_in_url(&d));
}

#[test]
fn the_stream_sends_an_event_when_a_task_changes() {
    let d = Daemon::start(FAST_DEMO);
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    let head = format!(
        "GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
        d.port,
        d.token()
    );
    s.write_all(head.as_bytes()).expect("send");
    let mut seen = String::new();
    assert!(
        read_until(&mut s, &mut seen, &|t| t.contains("event: resync"), Duration::from_secs(10)),
        "no hello: {seen}"
    );
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(seen.to_ascii_lowercase().contains("content-type: text/event-stream"), "{seen}");
    let r = d.call("POST", "/v1/tasks", Some(&json!({ "prompt": "streamed" })));
    let id = r.json()["id"].as_str().expect("id").to_string();
    let done = format!(r#"data: {{"id":"{id}","status":"succeeded"}}"#);
    let ok =
        read_until(&mut s, &mut seen, &|t| t.contains(&done) && t.contains("event: task"), Duration::from_secs(20));
    assert!(ok, "the stream never said {done}; got:\n{seen}");
}

/// Read from a stream into `seen` until `what(seen)` holds or `limit` passes.
pub(crate) fn read_until(s: &mut TcpStream, seen: &mut String, what: &dyn Fn(&str) -> bool, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        if what(seen) {
            return true;
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(_) => {}
        }
    }
    what(seen)
}

// ------------------------------------------------------------------------ the browser

/// The JS expression for the list item of the job whose prompt contains `tag`.
fn item(tag: &str) -> String {
    format!("Array.from(document.querySelectorAll('#task-list li')).find(li => li.textContent.includes({tag:?}))")
}

#[test]
fn the_page_in_a_real_browser() {
    let mock = Mock::start(&["--job-duration-ms", "50"]);
    let base = mock.base();
    let providers = format!(
        "[[providers]]\nname = \"demo\"\nkind = \"demo\"\nmax_concurrency = 2\ndelay_ms = 800\n\n\
         [[providers]]\nname = \"slow\"\nkind = \"demo\"\nmax_concurrency = 1\ndelay_ms = 600000\n\n\
         [[providers]]\nname = \"openai\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\nmodel = \"gpt-image-2.5-flare\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 2\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n"
    );
    let mut d = Daemon::configure(&providers);
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-web".into()));
    d.spawn();
    let url = printed_sign_in_url(&d);
    let site = format!("http://127.0.0.1:{}", d.port);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = Browser::start().await;

        // Sign in through the one-time URL: the page, with an HttpOnly, SameSite=Strict cookie.
        b.c().goto(&url).await.expect("open the sign-in URL");
        b.until("the jobs page", 15, "document.getElementById('new-task') !== null").await;
        assert_eq!(b.c().current_url().await.expect("url").path(), "/");
        let cookie = b.c().get_named_cookie("tally_session").await.expect("session cookie");
        assert_eq!(cookie.http_only(), Some(true));
        assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");
        // The same URL a second time is refused, and this browser stays signed in.
        b.c().goto(&url).await.expect("open the used URL");
        let text = b.js("document.body.innerText").await;
        assert!(text.as_str().unwrap_or("").contains("not valid"), "{text}");
        b.c().goto(&format!("{site}/")).await.expect("open the page");
        b.until("the jobs page", 15, "document.getElementById('new-task') !== null").await;

        // Submit a job through the page and watch it succeed without a reload (SSE).
        b.until("the live stream", 15, "document.getElementById('live').textContent === 'live'").await;
        b.js("(window.__sameDocument = true)").await;
        let prompt = format!("red sneaker on white {}", uuid::Uuid::new_v4());
        b.c().find(Locator::Css("#prompt")).await.expect("prompt").send_keys(&prompt).await.expect("type");
        b.c().find(Locator::Css("#provider")).await.expect("provider").select_by_value("demo").await.expect("pick");
        b.click("#submit-task").await;
        let statuses = b.until("the new job in the list", 10, &format!("{}?.dataset.status", item(&prompt))).await;
        assert_ne!(statuses, "succeeded", "the job should be seen before it finishes");
        b.until("the job to succeed", 30, &format!("{}?.dataset.status === 'succeeded'", item(&prompt))).await;
        assert_eq!(b.js("window.__sameDocument === true").await, true, "the page reloaded");
        let done_text = b.js(&format!("{}.textContent", item(&prompt))).await;
        assert!(done_text.as_str().unwrap_or("").contains("Done: the image is ready."), "{done_text}");

        // Its detail shows the image (loaded with the cookie) with a text alternative.
        let id = b.js(&format!("{}.dataset.taskId", item(&prompt))).await.as_str().expect("id").to_string();
        b.click(&format!("li[data-task-id='{id}'] a")).await;
        let width = b
            .until(
                "the image",
                15,
                "(() => { const i = document.getElementById('task-image'); \
                  return i && i.complete && i.naturalWidth > 0 ? i.naturalWidth : null; })()",
            )
            .await;
        assert!(width.as_u64().unwrap_or(0) > 0);
        let alt = b.js("document.getElementById('task-image').alt").await;
        assert!(alt.as_str().unwrap_or("").contains(&prompt), "alt text: {alt}");
        // The history is sentences, without tally's internal words.
        let timeline = b.js("document.getElementById('timeline').innerText").await;
        let timeline = timeline.as_str().unwrap_or("");
        assert!(timeline.contains("You asked for this image.") && timeline.contains("The image arrived"), "{timeline}");
        for word in ["worker", "claimed", "calling", "envelope", "execution", "api "] {
            assert!(!timeline.to_lowercase().contains(word), "`{word}` in the history: {timeline}");
        }
        let outside = b.js("(() => { const m = document.querySelector('main').cloneNode(true); \
                              m.querySelector('#technical')?.remove(); return m.innerText; })()").await;
        for word in ["worker", "claimed", "envelope", "execution"] {
            assert!(!outside.as_str().unwrap_or("").contains(word), "`{word}` outside the technical details");
        }

        // Force an `unknown`: the mock charges, then drops the answer; no idempotency header.
        mock.behave(json!({ "drop_response": true }));
        b.js("(location.hash = '#/')").await;
        b.until("the jobs page", 10, "document.getElementById('new-task') !== null").await;
        let lost = format!("blue mug, answer lost {}", uuid::Uuid::new_v4());
        b.c().find(Locator::Css("#prompt")).await.expect("prompt").send_keys(&lost).await.expect("type");
        b.c().find(Locator::Css("#provider")).await.expect("provider").select_by_value("openai").await.expect("pick");
        b.click("#submit-task").await;
        b.until("the job to become unknown", 30, &format!("{}?.dataset.status === 'unknown'", item(&lost))).await;
        mock.behave(json!({ "drop_response": false }));
        let badge = b.js(&format!("{}.querySelector('.badge').textContent", item(&lost))).await;
        assert!(badge.as_str().unwrap_or("").contains('?'), "unknown badge: {badge}");
        let colour = b.js(&format!("getComputedStyle({}.querySelector('.badge')).backgroundColor", item(&lost))).await;
        assert_eq!(colour, "rgb(255, 243, 209)", "unknown is amber, not failure red");

        // Its detail says what unknown means and how the provider bills.
        let unknown_id = b.js(&format!("{}.dataset.taskId", item(&lost))).await.as_str().expect("id").to_string();
        b.click(&format!("li[data-task-id='{unknown_id}'] a")).await;
        let text = b.until("the explainer", 10, "document.getElementById('unknown-explainer')?.innerText").await;
        let text = text.as_str().unwrap_or("");
        for words in ["cannot be confirmed", "Automatic retries have stopped", "may be charged again"] {
            assert!(text.contains(words), "`{words}` missing from: {text}");
        }
        let note = b.js("document.getElementById('billing-note')?.innerText").await;
        assert!(note.as_str().is_some_and(|n| n.contains("bills")), "billing note: {note}");
        b.screenshot("unknown-detail.png").await;
        let fits = b.js("document.documentElement.scrollWidth <= window.innerWidth").await;
        assert_eq!(fits, true, "the detail is wider than the window");

        // Retry demands the cost confirmation: confirm stays disabled until the box is ticked.
        b.click("#retry-task").await;
        b.until("the retry dialog", 5, "document.getElementById('retry-dialog').open").await;
        b.assert_accessible("the retry dialog").await;
        let confirm = b.c().find(Locator::Css("#retry-confirm")).await.expect("confirm");
        assert!(!confirm.is_enabled().await.expect("enabled?"), "confirm must start disabled");
        let dialog = b.js("document.getElementById('retry-dialog').innerText").await;
        assert!(dialog.as_str().unwrap_or("").contains("may be charged again"), "{dialog}");
        b.click("#retry-ack").await;
        assert!(confirm.is_enabled().await.expect("enabled?"), "ticking the box enables confirm");
        confirm.click().await.expect("confirm");
        let hash = b
            .until(
                "the new job",
                10,
                &format!("location.hash.startsWith('#/tasks/') && !location.hash.endsWith('{unknown_id}') && location.hash"),
            )
            .await;
        let new_id = hash.as_str().unwrap_or("").trim_start_matches("#/tasks/").to_string();
        let new_task = d.call("GET", &format!("/v1/tasks/{new_id}"), None).json();
        assert_eq!(new_task["retry_of"], unknown_id.as_str(), "{new_task}");

        // Money words follow the evidence on the page too: a definite refusal (HTTP 400) says
        // nothing of a possible charge anywhere, and an HTTP 500 is worded as an error answer,
        // not as a lost one.
        let maybe = "/may\\s+(be|have\\s+been|already\\s+have\\s+been)\\s+charged/i.test(document.querySelector('main').innerText)";
        mock.behave(json!({ "reject_status": 400 }));
        let refused = d.call("POST", "/v1/tasks", Some(&json!({ "prompt": "refused mug", "provider": "openai" }))).json();
        let refused_id = refused["id"].as_str().expect("id").to_string();
        d.wait_status(&refused_id, &["failed"]);
        mock.behave(json!({ "reject_status": null, "fail_status": 500 }));
        let erred = d.call("POST", "/v1/tasks", Some(&json!({ "prompt": "erred mug", "provider": "openai" }))).json();
        let erred_id = erred["id"].as_str().expect("id").to_string();
        d.wait_status(&erred_id, &["unknown"]);
        mock.behave(json!({ "fail_status": null }));
        b.js(&format!("(location.hash = '#/tasks/{refused_id}')")).await;
        b.until("the refused job", 10, "document.querySelector('article.detail')?.dataset.status === 'failed'").await;
        b.until("its history", 10, "document.getElementById('timeline')?.innerText.includes('Sent to')").await;
        assert_eq!(b.js(maybe).await, false, "a refused job's page speaks of a possible charge");
        b.js(&format!("(location.hash = '#/tasks/{erred_id}')")).await;
        let text = b.until("the explainer", 10, "document.getElementById('unknown-explainer')?.innerText").await;
        let text = text.as_str().unwrap_or("");
        assert!(text.contains("answered with an error") && !text.contains("answer was lost"), "{text}");

        // Cancel a queued job: the slow provider has one slot, so the second job waits.
        let running = d.call("POST", "/v1/tasks", Some(&json!({ "prompt": "slow first", "provider": "slow" }))).json();
        let running_id = running["id"].as_str().expect("id").to_string();
        d.wait_status(&running_id, &["running"]);
        let queued = d.call("POST", "/v1/tasks", Some(&json!({ "prompt": "slow second", "provider": "slow" }))).json();
        let queued_id = queued["id"].as_str().expect("id").to_string();
        b.js(&format!("(location.hash = '#/tasks/{queued_id}')")).await;
        b.until("the cancel button", 10, "document.getElementById('cancel-task') !== null").await;
        b.click("#cancel-task").await;
        b.until("canceled", 10, "document.querySelector('article.detail')?.dataset.status === 'canceled'").await;
        assert_eq!(d.call("GET", &format!("/v1/tasks/{queued_id}"), None).json()["status"], "canceled");

        // The list, for people (and the README), with every kind of status on it.
        b.js("(location.hash = '#/')").await;
        let canceled_item =
            format!("document.querySelector(\"li[data-task-id='{queued_id}']\")?.dataset.status === 'canceled'");
        b.until("the list", 10, &canceled_item).await;
        b.screenshot("list.png").await;

        // An operator resolves the unknown one: confirmed failed, with a note.
        b.js(&format!("(location.hash = '#/tasks/{unknown_id}')")).await;
        b.until("the resolve form", 10, "document.getElementById('resolve-form') !== null").await;
        b.click("#resolve-failed").await;
        b.c().find(Locator::Css("#resolve-note")).await.expect("note").send_keys("not in the dashboard").await.expect("type");
        b.click("#resolve-submit").await;
        b.until("resolved as failed", 10, "document.querySelector('article.detail')?.dataset.status === 'failed'").await;
        let timeline = b.js("document.getElementById('timeline').innerText").await;
        assert!(timeline.as_str().unwrap_or("").contains("not in the dashboard"), "{timeline}");

        // The cookie alone cannot change anything; with the page's CSRF token it can.
        let statuses = b
            .c()
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 const token = document.querySelector('meta[name=\"csrf-token\"]').content;
                 const post = (headers) => fetch('/v1/tasks', { method: 'POST', credentials: 'same-origin',
                   headers: Object.assign({ 'Content-Type': 'application/json' }, headers),
                   body: JSON.stringify({ prompt: 'csrf from the browser', provider: 'demo' }) }).then(r => r.status);
                 post({}).then(a => post({ 'X-CSRF-Token': token }).then(b => done([a, b])));",
                vec![],
            )
            .await
            .expect("fetch from the page");
        assert_eq!(statuses, json!([403, 201]));

        // Image sets: the list and a set's view with per-shot status.
        let set = d
            .call(
                "POST",
                "/v1/sets",
                Some(&json!({ "product": "Canvas tote", "provider": "demo", "shots": [
                    { "role": "main", "prompt": "tote on white" }, { "role": "scene", "prompt": "tote at a market" } ] })),
            )
            .json();
        let set_id = set["id"].as_str().expect("set id").to_string();
        b.js("(location.hash = '#/sets')").await;
        b.until("the set in the list", 10, &format!("document.querySelector(\"li[data-set-id='{set_id}']\") !== null")).await;
        b.click(&format!("li[data-set-id='{set_id}'] a")).await;
        b.until("the set to finish", 30, "document.querySelector('article.detail')?.dataset.status === 'done'").await;
        let progress = b.js("document.getElementById('set-progress').innerText").await;
        assert!(progress.as_str().unwrap_or("").contains('2'), "progress: {progress}");
        b.until("the shot images", 15, "Array.from(document.querySelectorAll('.shot img')).filter(i => i.naturalWidth > 0 && i.alt).length === 2").await;

        b.js("(location.hash = '#/')").await;
        b.until("the list", 10, "document.getElementById('task-list') !== null").await;

        // A phone's width: nothing wider than the screen; every control is a real button or link.
        b.c().set_window_size(390, 844).await.expect("resize");
        b.until("a narrow layout", 5, "document.documentElement.scrollWidth <= window.innerWidth").await;
        b.screenshot("list-phone.png").await;
        b.js(&format!("(location.hash = '#/tasks/{unknown_id}')")).await;
        b.until("the detail at a phone's width", 10, "document.querySelector('article.detail') !== null").await;
        b.until("a narrow detail", 5, "document.documentElement.scrollWidth <= window.innerWidth").await;
        let fake = b.js("document.querySelectorAll('[onclick], div[tabindex], span[tabindex]').length").await;
        assert_eq!(fake, 0, "controls must be real buttons or links");
        b.close().await;
    });
}

#[test]
fn a_session_survives_a_restart_until_sign_out_all() {
    let mut d = Daemon::start(FAST_DEMO);
    let cookie = sign_in(&d, &printed_sign_in_url(&d));
    let r = with_cookie(&d, "GET", "/v1/session", &cookie, None, None);
    assert_eq!(r.status, 200);
    let csrf = r.json()["csrf_token"].as_str().expect("csrf").to_string();
    d.term();
    d.spawn();
    let r = with_cookie(&d, "GET", "/v1/session", &cookie, None, None);
    assert_eq!(r.status, 200, "the session outlives the restart: {}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["csrf_token"], csrf.as_str(), "with the same CSRF token");
    let page = with_cookie(&d, "GET", "/", &cookie, None, None);
    assert!(String::from_utf8_lossy(&page.body).contains(&csrf), "the page is served signed in");
    // The cookie lasts as long as the session may (30 days without use), not one browser run.
    let set = request(d.port, "GET", &path_of(&d, &new_sign_in_url(&d)), &[], None);
    assert!(set.header("set-cookie").is_some_and(|c| c.contains("Max-Age=2592000")), "{:?}", set.header("set-cookie"));

    // A browser session ends only its own without "all"; the token must say "all".
    let r = d.call("POST", "/v1/session/sign-out", Some(&json!({})));
    assert_eq!(r.status, 422);
    let out = d.cli(&["sign-out", "--all"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = with_cookie(&d, "GET", "/v1/tasks", &cookie, None, None);
    assert_eq!(r.status, 401, "signed out everywhere");
    d.term();
    d.spawn();
    assert_eq!(with_cookie(&d, "GET", "/v1/tasks", &cookie, None, None).status, 401, "and it stays so");
}
