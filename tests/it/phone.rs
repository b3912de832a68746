//! A phone on the shop's network: `tally serve --lan` (`server.lan`) inside a network
//! namespace this test makes (10.77.0.1 and a default route leaving from it), pairing by link, by short code and by the QR code drawn in the terminal (decoded with
//! `rqrr`, a QR reader nobody here wrote), the Host check on the new address, and `--lan`
//! with no network at all. The namespace needs root (CI runs as root); without it the test
//! fails with that reason, it is never skipped.

use std::process::Command;

use serde_json::Value;

use crate::common::{Daemon, FAST_DEMO, Reply, try_request_at};

/// The computer's address on the test's network.
const LAN_IP: &str = "10.77.0.1";

/// Run `body` on a thread in a new network namespace (only this thread and the processes it
/// starts are in it): loopback up, and with `lan` the address [`LAN_IP`] that the default
/// route leaves from.
fn in_namespace(lan: bool, body: impl FnOnce() + Send + 'static) {
    let t = std::thread::spawn(move || {
        // SAFETY: unshare(2) with CLONE_NEWNET only moves this thread into a new network
        // namespace; it touches no memory of ours.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "this test makes a network namespace (unshare CLONE_NEWNET), which needs root: {}",
            std::io::Error::last_os_error()
        );
        let mut steps = vec![vec!["link", "set", "lo", "up"]];
        if lan {
            // On `lo` (a kernel without the dummy or veth modules still has it): the address is
            // not a loopback address, and the default route leaves from it.
            steps.extend([
                vec!["addr", "add", "10.77.0.1/24", "dev", "lo"],
                vec!["route", "add", "default", "dev", "lo", "src", LAN_IP],
            ]);
        }
        for args in steps {
            let out = Command::new("ip").args(&args).output().expect("run ip (iproute2)");
            assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        body();
    });
    if let Err(panic) = t.join() {
        std::panic::resume_unwind(panic);
    }
}

/// A daemon with `server.lan = true` (the demo provider), started.
fn lan_daemon() -> Daemon {
    lan_daemon_with("")
}

/// [`lan_daemon`] with more configuration (`[ui]`, …) before the providers.
fn lan_daemon_with(extra: &str) -> Daemon {
    let mut d = Daemon::configure(&format!("{extra}{FAST_DEMO}"));
    let text = std::fs::read_to_string(&d.config).expect("config").replacen("[server]\n", "[server]\nlan = true\n", 1);
    std::fs::write(&d.config, text).expect("config");
    d.spawn();
    d
}

fn at(d: &Daemon, ip: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    try_request_at(ip, d.port, method, path, headers, None).unwrap_or_else(|| panic!("no answer from {ip}"))
}

/// The path and query of a link on the daemon at `ip`.
fn path_on(d: &Daemon, ip: &str, url: &str) -> String {
    let base = format!("http://{ip}:{}", d.port);
    url.strip_prefix(&base).unwrap_or_else(|| panic!("{url} is not under {base}")).to_string()
}

/// A terminal QR code (half blocks: a full block, upper half, lower half or space per two
/// rows; lit = light module) as a greyscale bitmap, 4 px a module, decoded with rqrr.
fn decode_terminal_qr(text: &str) -> String {
    let rows: Vec<Vec<char>> = text
        .lines()
        .filter(|l| l.chars().any(|c| "█▀▄".contains(c)))
        .map(|l| l.chars().filter(|c| "█▀▄ ".contains(*c)).collect())
        .collect();
    assert!(!rows.is_empty(), "no QR code drawn:\n{text}");
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let height = rows.len() * 2;
    let lit = |x: usize, y: usize| -> bool {
        let c = rows.get(y / 2).and_then(|r| r.get(x)).copied().unwrap_or(' ');
        matches!((c, y % 2), ('█', _) | ('▀', 0) | ('▄', 1))
    };
    const SCALE: usize = 4;
    let mut img = rqrr::PreparedImage::prepare_from_greyscale(width * SCALE, height * SCALE, |x, y| {
        if lit(x / SCALE, y / SCALE) { 255 } else { 0 }
    });
    let grids = img.detect_grids();
    assert_eq!(grids.len(), 1, "one QR code in the drawing:\n{text}");
    let (_, content) = grids[0].decode().expect("the QR code decodes");
    content
}

#[test]
fn a_phone_pairs_over_the_shops_network_once_by_link_code_or_qr() {
    in_namespace(true, || {
        let d = lan_daemon();
        let lan = format!("http://{LAN_IP}:{}", d.port);
        let said = crate::common::wait_for(std::time::Duration::from_secs(10), || {
            d.stdout().contains("on the shop's network").then_some(())
        });
        assert!(said.is_some(), "serve --lan names the address at start:\n{}", d.stdout());
        assert!(d.stdout().contains(&lan), "{}", d.stdout());

        // The API token pairs; the link names the LAN address, the token is nowhere in it.
        let r = d.call("POST", "/v1/session/pair", Some(&serde_json::json!({})));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let p: Value = r.json();
        let url = p["url"].as_str().expect("url").to_string();
        assert!(url.starts_with(&format!("{lan}/login?code=")), "{url}");
        assert_eq!(p["lan"], true);
        assert!(p["svg"].as_str().is_some_and(|s| s.contains("<svg")), "{p}");
        assert!(!r.body.windows(d.token().len()).any(|w| w == d.token().as_bytes()), "the API token is in the answer");

        // The phone opens the link at the LAN address: a session there, once.
        let path = path_on(&d, LAN_IP, &url);
        let first = at(&d, LAN_IP, "GET", &path, &[]);
        assert_eq!(first.status, 303, "{}", String::from_utf8_lossy(&first.body));
        let cookie = first.header("set-cookie").expect("cookie").split(';').next().unwrap_or("").to_string();
        let session = at(&d, LAN_IP, "GET", "/v1/session", &[("Cookie", &cookie)]);
        assert_eq!(session.status, 200, "the phone's session works over the LAN address");
        assert_eq!(at(&d, LAN_IP, "GET", &path, &[]).status, 403, "a pairing link works once");

        // A Host naming any other address is refused, on either listener.
        let other = format!("10.77.0.9:{}", d.port);
        assert_eq!(at(&d, LAN_IP, "GET", "/", &[("Host", &other)]).status, 421);
        assert_eq!(at(&d, "127.0.0.1", "GET", "/", &[("Host", &other)]).status, 421);

        // The short code, typed as a person would; then never again, nor its link.
        let p: Value = d.call("POST", "/v1/session/pair", Some(&serde_json::json!({}))).json();
        let code = p["code"].as_str().expect("code").to_lowercase().replace('-', " ");
        let typed = format!("/login?pair={}", code.replace(' ', "+"));
        assert_eq!(at(&d, LAN_IP, "GET", &typed, &[]).status, 303);
        assert_eq!(at(&d, LAN_IP, "GET", &typed, &[]).status, 403);
        let link = path_on(&d, LAN_IP, p["url"].as_str().expect("url"));
        assert_eq!(at(&d, LAN_IP, "GET", &link, &[]).status, 403, "the link after its code");

        // `tally sign-in --qr`: the QR code drawn in the terminal is the printed link, and it
        // signs the phone in.
        let out = d.cli(&["sign-in", "--qr"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let decoded = decode_terminal_qr(&text);
        assert!(text.lines().any(|l| l.trim() == decoded), "the QR code is the printed link {decoded}:\n{text}");
        assert!(decoded.starts_with(&format!("{lan}/login?code=")), "{decoded}");
        assert_eq!(at(&d, LAN_IP, "GET", &path_on(&d, LAN_IP, &decoded), &[]).status, 303);

        // A signed-in browser pairs too (with its CSRF token); the signed-out page offers it.
        let csrf: Value = session.json();
        let csrf = csrf["csrf_token"].as_str().expect("csrf").to_string();
        let from_phone = try_request_at(
            LAN_IP,
            d.port,
            "POST",
            "/v1/session/pair",
            &[("Cookie", &cookie), ("X-CSRF-Token", &csrf), ("Content-Type", "application/json")],
            Some(b"{}"),
        )
        .expect("answer");
        assert_eq!(from_phone.status, 200, "{}", String::from_utf8_lossy(&from_phone.body));

        // Providers and keys change only on the computer: a signed-in phone at the LAN address
        // is refused adding, changing or removing one, and nothing changes.
        let names = |v: Value| -> Vec<String> {
            v["providers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str().map(str::to_string))
                .collect()
        };
        let before = names(d.call("GET", "/v1/providers", None).json());
        let phone =
            [("Cookie", cookie.as_str()), ("X-CSRF-Token", csrf.as_str()), ("Content-Type", "application/json")];
        let add = br#"{"name": "elsewhere", "kind": "openai_images", "model": "gpt-image-1", "base_url": "http://10.77.0.9:1/v1", "api_key": "sk-stolen"}"#;
        for (method, path, body) in [
            ("POST", "/v1/providers".to_string(), Some(&add[..])),
            ("PATCH", format!("/v1/providers/{}", before[0]), Some(&add[..])),
            ("DELETE", format!("/v1/providers/{}", before[0]), None),
        ] {
            let r = try_request_at(LAN_IP, d.port, method, &path, &phone, body).expect("answer");
            assert_eq!((r.status, r.error_code()), (403, "settings_local_only".to_string()), "{method} {path}");
        }
        assert_eq!(names(d.call("GET", "/v1/providers", None).json()), before, "nothing changed");
        let out_page = at(&d, LAN_IP, "GET", "/", &[]);
        assert!(String::from_utf8_lossy(&out_page.body).contains("name=\"pair\""), "the signed-out page's form");
    });
}

#[test]
fn lan_without_a_network_says_why_and_stays_on_loopback() {
    in_namespace(false, || {
        let d = lan_daemon();
        let said = crate::common::wait_for(std::time::Duration::from_secs(10), || {
            d.stdout().lines().find(|l| l.starts_with("--lan:")).map(str::to_string)
        });
        let said = said.unwrap_or_else(|| panic!("no word about --lan:\n{}", d.stdout()));
        assert!(said.contains("stays on loopback"), "{said}");
        assert_eq!(at(&d, "127.0.0.1", "GET", "/healthz", &[]).status, 200);
        let p: Value = d.call("POST", "/v1/session/pair", Some(&serde_json::json!({}))).json();
        assert_eq!(p["lan"], false, "{p}");
        assert!(p["hint"].as_str().is_some_and(|h| h.contains("--lan")), "{p}");
    });
}

/// In real browsers: the computer's page makes a pairing ("Use it on your phone", its QR code
/// an SVG image), and a second browser profile at phone size opens its link over the LAN
/// address and is signed in; the phone's signed-out page offers the code form first. Both
/// pages axe-clean; in English and in Chinese (`ui.language`).
#[test]
fn the_page_pairs_a_phone_in_a_second_browser_over_the_lan_address() {
    pairs_in("en", "Use it on your phone", "Pair this device");
}

#[test]
fn the_page_pairs_a_phone_in_a_second_browser_over_the_lan_address_in_chinese() {
    pairs_in("zh-CN", "在手机上使用", "配对这台设备");
}

fn pairs_in(language: &'static str, card_title: &'static str, form_title: &'static str) {
    use fantoccini::Locator;
    in_namespace(true, move || {
        let ui = if language == "en" { String::new() } else { format!("[ui]\nlanguage = \"{language}\"\n\n") };
        let d = lan_daemon_with(&ui);
        let url = crate::web::printed_sign_in_url(&d);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let computer = crate::browser::Browser::start().await;
            computer.sign_in(&url).await;
            computer.click("#nav-settings").await;
            computer.until("the phone card", 10, "document.getElementById('pair-make') !== null").await;
            assert_eq!(computer.js("document.getElementById('phone-title').textContent").await, card_title);
            computer.click("#pair-make").await;
            let code = computer.until("a code", 10, "document.getElementById('pair-code-shown')?.textContent").await;
            assert!(code.as_str().is_some_and(|c| c.len() == 9 && c.as_bytes()[4] == b'-'), "{code}");
            let link = computer.js("document.getElementById('pair-link').textContent").await;
            let link = link.as_str().unwrap_or("").to_string();
            assert!(link.starts_with(&format!("http://{LAN_IP}:{}/login?code=", d.port)), "{link}");
            let img = computer.js("document.getElementById('pair-qr').src").await;
            assert!(img.as_str().is_some_and(|s| s.starts_with("data:image/svg+xml")), "{img}");
            let shown = computer.js("document.getElementById('pair-qr').naturalWidth").await;
            assert!(shown.as_u64().is_some_and(|w| w >= 200), "the QR image draws: {shown}");
            computer.assert_accessible("the settings with a pairing code").await;

            let phone = crate::browser::Browser::phone().await;
            phone.c().goto(&format!("http://{LAN_IP}:{}/", d.port)).await.expect("open tally on the phone");
            phone.until("the pairing form", 10, "document.querySelector('input[name=pair]') !== null").await;
            assert_eq!(phone.js("document.querySelector('.pair-form h2').textContent").await, form_title);
            assert_eq!(phone.js("document.documentElement.lang").await, language);
            phone.assert_accessible("the phone's signed-out page").await;
            let tall = phone.js("document.querySelector('.pair-form button').getBoundingClientRect().height").await;
            assert!(tall.as_f64().is_some_and(|h| h >= 44.0), "the form's button is a tap target: {tall}");
            // The short code typed on the phone signs it in.
            let typed = code.as_str().unwrap_or("").to_lowercase();
            phone
                .c()
                .find(Locator::Css("input[name=pair]"))
                .await
                .expect("input")
                .send_keys(&typed)
                .await
                .expect("type");
            phone.click(".pair-form button").await;
            phone.until("the jobs page on the phone", 15, "document.getElementById('new-task') !== null").await;
            assert_eq!(phone.js("location.host").await, Value::String(format!("{LAN_IP}:{}", d.port)));
            // At phone width every visible button, button link and select is a 44 px tap target.
            let small = phone
                .js("[...document.querySelectorAll('button, .button, select')].filter(e => e.offsetParent !== null \
                     && e.getBoundingClientRect().height < 44).map(e => e.id || e.textContent.trim())")
                .await;
            assert_eq!(small, serde_json::json!([]), "controls under 44 px on the phone");
            phone.assert_accessible("the jobs page on the phone").await;
            // The link of that pairing is spent now.
            let again = at(&d, LAN_IP, "GET", &path_on(&d, LAN_IP, &link), &[]);
            assert_eq!(again.status, 403, "the link after its code was typed");

            // The computer lists the phone among the signed-in devices and signs it out.
            computer.click("#nav-jobs").await;
            computer.click("#nav-settings").await;
            computer.until("two devices", 10, "document.querySelectorAll('#devices .device').length === 2").await;
            let listed: Value = d.call("GET", "/v1/sessions", None).json();
            let sessions = listed["sessions"].as_array().cloned().unwrap_or_default();
            assert_eq!(sessions.len(), 2, "{listed}");
            assert!(sessions.iter().all(|s| s["device"].as_str().is_some_and(|n| n.contains("Chromium"))), "{listed}");
            // Most recently used first: the phone just signed in.
            let phone_id = sessions[0]["id"].as_str().expect("id").to_string();
            computer.assert_accessible("the signed-in devices").await;
            let end = format!("#devices button[data-session='{phone_id}']");
            computer.click(&end).await;
            computer.until("one device left", 10, "document.querySelectorAll('#devices .device').length === 1").await;
            // The phone's page hears it at once (its stream ends) and says it is signed out; its
            // cookie opens nothing any more.
            phone.until("the phone signed out", 15, "document.body.innerText.includes('tally sign-in')").await;
            let cookie = phone.c().get_named_cookie("tally_session").await.expect("the phone keeps its old cookie");
            let r = at(&d, LAN_IP, "GET", "/v1/tasks", &[("Cookie", &format!("tally_session={}", cookie.value()))]);
            assert_eq!(r.status, 401, "a revoked phone's cookie");
            phone.close().await;
            computer.close().await;
        });
    });
}

/// Seven tabs of the page in one browser all load and stay live: the browser holds one event
/// stream for all of them (a browser keeps at most six connections to one address, and each
/// tab holding its own stream left the seventh waiting forever). A job's change reaches every
/// tab, and when the tab holding the stream closes another takes it over.
#[test]
fn seven_tabs_share_one_stream_and_all_load() {
    let d = Daemon::start(FAST_DEMO);
    let url = crate::web::printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = crate::browser::Browser::start().await;
        b.sign_in(&url).await;
        b.until("live", 10, "document.getElementById('live').classList.contains('on')").await;
        let page = format!("http://127.0.0.1:{}/", d.port);
        let mut tabs = vec![b.c().window().await.expect("first tab")];
        for n in 2..=7 {
            let tab = b.c().new_window(true).await.expect("new tab").handle;
            b.c().switch_to_window(tab.clone()).await.expect("switch");
            let loaded = tokio::time::timeout(std::time::Duration::from_secs(20), b.c().goto(&page)).await;
            assert!(loaded.is_ok(), "tab {n} did not load in 20 s: the browser's connections are all taken");
            b.until(&format!("tab {n}'s jobs page"), 15, "document.getElementById('new-task') !== null").await;
            b.until(&format!("tab {n} live"), 15, "document.getElementById('live').classList.contains('on')").await;
            tabs.push(tab);
        }
        let mut holders = 0;
        for tab in &tabs {
            b.c().switch_to_window(tab.clone()).await.expect("switch");
            if b.js("document.documentElement.dataset.stream").await == "this-tab" {
                holders += 1;
            }
        }
        assert_eq!(holders, 1, "one tab holds the browser's stream");
        // A hold's time in a sentence is shown as a local date and time, not RFC 3339.
        let shown = b.js("window.tally.localTimes('held until 2026-12-03T23:34:24.000Z.')").await;
        let shown = shown.as_str().unwrap_or("").to_string();
        assert!(!shown.contains("T23:34") && shown.contains(":34:24") && shown.ends_with('.'), "{shown}");

        // A new job shows up in every tab (from the one stream).
        let t = d.call("POST", "/v1/tasks", Some(&serde_json::json!({"prompt": "seven tabs, one cup"}))).json();
        let id = t["id"].as_str().expect("id").to_string();
        let shown = format!("document.querySelector('[data-task-id=\"{id}\"]') !== null");
        for (n, tab) in tabs.iter().enumerate() {
            b.c().switch_to_window(tab.clone()).await.expect("switch");
            b.until(&format!("the new job in tab {}", n + 1), 15, &shown).await;
        }

        // The tab holding the stream closes: another takes it, and news still arrive.
        let mut holder = None;
        for tab in &tabs {
            b.c().switch_to_window(tab.clone()).await.expect("switch");
            if b.js("document.documentElement.dataset.stream").await == "this-tab" {
                holder = Some(tab.clone());
            }
        }
        let holder = holder.expect("a holder");
        b.c().switch_to_window(holder.clone()).await.expect("switch");
        b.c().close_window().await.expect("close the holder");
        let rest: Vec<_> = tabs.into_iter().filter(|t| *t != holder).collect();
        b.c().switch_to_window(rest[0].clone()).await.expect("switch");
        let t = d.call("POST", "/v1/tasks", Some(&serde_json::json!({"prompt": "after the holder closed"}))).json();
        let id = t["id"].as_str().expect("id").to_string();
        let shown = format!("document.querySelector('[data-task-id=\"{id}\"]') !== null");
        for (n, tab) in rest.iter().enumerate() {
            b.c().switch_to_window(tab.clone()).await.expect("switch");
            b.until(&format!("the second job in remaining tab {}", n + 1), 15, &shown).await;
        }
        b.close().await;
    });
}

/// The same over the shop's network, where the page is plain http and the browser offers no
/// Web Locks: seven tabs at the LAN address all load (a tab out of view holds no stream).
#[test]
fn seven_tabs_over_the_lan_address_all_load() {
    in_namespace(true, || {
        let d = lan_daemon();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let b = crate::browser::Browser::start().await;
            let p: Value = d.call("POST", "/v1/session/pair", Some(&serde_json::json!({}))).json();
            b.c().goto(p["url"].as_str().expect("url")).await.expect("pair");
            b.until("the jobs page", 15, "document.getElementById('new-task') !== null").await;
            assert_eq!(b.js("window.isSecureContext").await, Value::Bool(false), "plain http on the LAN address");
            let page = format!("http://{LAN_IP}:{}/", d.port);
            for n in 2..=7 {
                let tab = b.c().new_window(true).await.expect("new tab").handle;
                b.c().switch_to_window(tab).await.expect("switch");
                let loaded = tokio::time::timeout(std::time::Duration::from_secs(20), b.c().goto(&page)).await;
                assert!(loaded.is_ok(), "tab {n} did not load in 20 s: the browser's connections are all taken");
                b.until(&format!("tab {n}'s jobs page"), 15, "document.getElementById('new-task') !== null").await;
                b.until(&format!("tab {n} live"), 15, "document.getElementById('live').classList.contains('on')").await;
            }
            b.close().await;
        });
    });
}
