//! Setting up without a terminal (issue #40): a provider added over the API with its key,
//! tested with a free call (the mock's ledger shows nothing charged), used at once without a
//! restart, repriced, and removed; still there after a restart; the key in no answer, log,
//! database file, backup or `/metrics`, only in the data directory's `secrets` file (mode
//! 0600, refused at start when others may read it); a gateway's console (`dashboard_url`) in
//! an unknown job's help and never OpenAI's page; the per-user service's unit file checked by
//! `systemd-analyze verify`, and `tally service install` saying so where no user instance
//! answers.

use std::process::Command;

use serde_json::{Value, json};

use crate::common::{Daemon, EXE, Mock, OPENAI_MODEL};

const KEY: &str = "sk-setup-test-0123456789abcdef";
const SETTLED: &[&str] = &["succeeded", "failed", "unknown", "canceled"];

fn provider_body(mock: &Mock) -> Value {
    json!({"name": "oa", "kind": "openai_images", "model": OPENAI_MODEL, "base_url": mock.base(),
           "price_per_image": 0.04, "currency": "USD", "max_concurrency": 2, "request_timeout_ms": 3000,
           "dashboard_url": "https://gateway.example/console", "api_key": KEY})
}

fn listed(d: &Daemon, name: &str) -> Option<Value> {
    d.call("GET", "/v1/providers", None).json()["providers"].as_array()?.iter().find(|p| p["name"] == name).cloned()
}

/// Every file under `dir` whose bytes contain `needle`, with its mode.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(&p).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
                out.push((p.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default(), mode));
            }
        }
    }
    out
}

#[test]
fn a_provider_added_over_the_api_is_tested_free_used_at_once_repriced_and_removed() {
    let mock = Mock::start(&[]);
    let mut d = Daemon::start(crate::common::FAST_DEMO);
    let r = d.call("POST", "/v1/providers", Some(&provider_body(&mock)));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let oa = listed(&d, "oa").expect("listed");
    assert_eq!((oa["defined_in"].as_str(), oa["api_key_hint"].as_str()), (Some("page"), Some("cdef")));
    assert_eq!(listed(&d, "demo").expect("demo")["defined_in"], "config");

    // Test: a free call the mock answers, nothing charged.
    let r = d.call("POST", "/v1/providers/oa/test", Some(&json!({})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        mock.lines().iter().any(|l| l["endpoint"] == "GET /v1/models" && l["charged"] == false),
        "{:?}",
        mock.lines()
    );
    assert!(mock.lines().iter().all(|l| l["charged"] == false), "testing charged something");

    // Used at once, without a restart; the new price applies to the next job's estimate.
    let t = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "a mug from the page", "provider": "oa"}))).json();
    let t = d.wait_status(t["id"].as_str().expect("id"), SETTLED);
    assert_eq!(t["status"], "succeeded", "{t}");
    let r = d.call("PATCH", "/v1/providers/oa", Some(&json!({"price_per_image": 0.05})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(listed(&d, "oa").expect("oa")["price_per_image"], 0.05);
    assert_eq!(listed(&d, "oa").expect("oa")["api_key_hint"], "cdef", "the key is kept when not sent");

    // A lost answer: the gateway's console, never OpenAI's page.
    mock.behave(json!({"drop_response": true}));
    let t = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "a mug, answer lost", "provider": "oa"}))).json();
    let t = d.wait_status(t["id"].as_str().expect("id"), SETTLED);
    mock.behave(json!({"drop_response": false}));
    assert_eq!(t["status"], "unknown", "{t}");
    assert_eq!(t["where_to_look"]["url"], "https://gateway.example/console", "{t}");
    assert!(!t.to_string().contains("platform.openai.com"));

    // The key: only in the secrets file, mode 0600; in no answer, database, backup or log.
    let mut everything = String::new();
    for path in ["/v1/providers", "/metrics", "/v1/tasks", "/v1/openapi.json"] {
        everything.push_str(&String::from_utf8_lossy(&d.call("GET", path, None).body));
    }
    assert!(!everything.contains(KEY), "the key is in an answer");
    let backup = d.dir.path().join("backup.db");
    let out = d.cli(&["backup", &backup.to_string_lossy()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!std::fs::read(&backup).unwrap_or_default().windows(KEY.len()).any(|w| w == KEY.as_bytes()));
    let holding = files_holding(&d.data, KEY.as_bytes());
    assert_eq!(holding, [("secrets".to_string(), 0o600)], "where the key is stored");

    // Refusals: a bad field, a taken name, a config provider; nothing saved.
    let r =
        d.call("POST", "/v1/providers", Some(&json!({"name": "bad", "kind": "openai_images", "base_url": "ftp://x"})));
    assert_eq!(r.status, 422);
    assert!(String::from_utf8_lossy(&r.body).contains("base_url"));
    let r = d.call(
        "POST",
        "/v1/providers",
        Some(&json!({"name": "neg", "kind": "openai_images", "base_url": "http://x", "price_per_image": -1})),
    );
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    let r = d.call(
        "POST",
        "/v1/providers",
        Some(&json!({"name": "cur", "kind": "openai_images", "base_url": "http://x", "currency": "dollars"})),
    );
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(d.call("POST", "/v1/providers", Some(&provider_body(&mock))).status, 409, "the name is taken");
    assert_eq!(d.call("DELETE", "/v1/providers/demo", None).status, 409, "defined in tally.toml");
    assert!(listed(&d, "bad").is_none() && listed(&d, "neg").is_none());

    // After a restart it is still there, with its key.
    d.term();
    d.spawn();
    assert_eq!(listed(&d, "oa").expect("after a restart")["api_key_hint"], "cdef");
    let t = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "after a restart", "provider": "oa"}))).json();
    assert_eq!(d.wait_status(t["id"].as_str().expect("id"), SETTLED)["status"], "succeeded");
    assert!(!d.stderr().contains(KEY), "the key is in the log");

    // Removed: gone from the list, its key gone from the secrets file.
    let r = d.call("DELETE", "/v1/providers/oa", None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(listed(&d, "oa").is_none());
    assert!(files_holding(&d.data, KEY.as_bytes()).is_empty());
    d.term();
}

#[test]
fn a_provider_with_jobs_in_flight_is_not_removed_and_a_loose_secrets_file_stops_the_start() {
    let mock = Mock::start(&["--job-duration-ms", "60000"]);
    let mut d = Daemon::start(crate::common::FAST_DEMO);
    let body = json!({"name": "rep", "kind": "replicate", "model": "black-forest-labs/flux-schnell",
                      "base_url": mock.base(), "api_key": KEY});
    assert_eq!(d.call("POST", "/v1/providers", Some(&body)).status, 201);
    let t = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "a slow one", "provider": "rep"}))).json();
    let r = d.call("DELETE", "/v1/providers/rep", None);
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        String::from_utf8_lossy(&r.body).contains("in flight")
            || String::from_utf8_lossy(&r.body).contains("queued, waiting or running")
    );
    assert!(listed(&d, "rep").is_some());
    d.call("POST", &format!("/v1/tasks/{}/cancel", t["id"].as_str().unwrap_or_default()), Some(&json!({})));
    d.kill();
    use std::os::unix::fs::PermissionsExt;
    let secrets = d.data.join("secrets");
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = Command::new(EXE).args(["serve", "--no-browser", "--config"]).arg(&d.config).output().expect("serve");
    assert!(!out.status.success(), "a secrets file others may read must stop the start");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("chmod 600"), "{said}");
}

#[test]
fn the_cli_adds_a_provider_with_its_key_from_stdin() {
    let mock = Mock::start(&[]);
    let mut d = Daemon::start(crate::common::FAST_DEMO);
    let mut child = Command::new(EXE)
        .args(["--config"])
        .arg(&d.config)
        .args(["provider", "add", "gw", "--kind", "openai_images", "--base-url", &mock.base(), "--price", "0.02"])
        .args(["--api-key-stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("provider add");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        writeln!(stdin, "{KEY}").expect("key");
    }
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("key …cdef"), "{}", String::from_utf8_lossy(&out.stdout));
    let out = d.cli(&["provider", "test", "gw"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("the key works"));
    let out = d.cli(&["provider", "remove", "gw"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    d.term();
}

#[test]
fn the_service_unit_is_valid_and_install_says_when_no_user_manager_answers() {
    let d = Daemon::configure(crate::common::FAST_DEMO);
    let xdg = d.dir.path().join("xdg");
    let cli = |args: &[&str]| {
        Command::new(EXE)
            .args(args)
            .arg("--config")
            .arg(&d.config)
            .env("XDG_CONFIG_HOME", &xdg)
            .output()
            .expect("tally")
    };
    let out = cli(&["service", "install", "--print"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let unit = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(unit.contains("serve --no-browser") && unit.contains("Restart=on-failure"), "{unit}");
    let file = d.dir.path().join("tally.service");
    std::fs::write(&file, &unit).expect("unit");
    // systemd's own check of the unit (the ExecStart binary, every key and value).
    let v = Command::new("systemd-analyze").arg("verify").arg(&file).output();
    match v {
        Ok(v) => {
            let said = String::from_utf8_lossy(&v.stderr).to_string() + &String::from_utf8_lossy(&v.stdout);
            assert!(v.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}\n{unit}");
        }
        Err(e) if std::env::var("CI").is_ok_and(|c| c == "true") => panic!("systemd-analyze is needed: {e}"),
        Err(e) => panic!("systemd-analyze is needed (Debian's systemd package): {e}"),
    }
    // Where the user's systemd instance answers, install enables it; where none answers (CI,
    // containers) it says so, exits non-zero and writes nothing.
    let user_manager =
        Command::new("systemctl").args(["--user", "show-environment"]).output().is_ok_and(|o| o.status.success());
    if !user_manager {
        let out = cli(&["service", "install"]);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no per-user service manager"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!d.dir.path().join("xdg/systemd/user/tally.service").exists(), "nothing written");
        let out = cli(&["service", "status"]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("not installed"));
    }
}

/// The Settings view at phone width, in English and in Chinese: add a provider backed by the
/// mock with its key, test it (nothing charged), see it offered for a new job, use it, change
/// its price and see the new price, remove it; the key never in the page; axe-clean.
fn settings_in_the_page(language: &str) {
    use fantoccini::Locator;
    let mock = Mock::start(&[]);
    let ui = if language == "zh-CN" { "[ui]\nlanguage = \"zh-CN\"\n\n" } else { "" };
    let mut d = Daemon::configure(&format!("{ui}{}", crate::common::FAST_DEMO));
    d.spawn();
    let url = crate::web::printed_sign_in_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let b = crate::browser::Browser::start().await;
        b.c().set_window_size(390, 844).await.expect("resize");
        b.sign_in(&url).await;
        b.click("#nav-settings").await;
        b.until("the settings", 10, "document.getElementById('add-provider') !== null").await;
        // The demo of the config file: read-only.
        let defined = b.js("document.getElementById('provider-defined-demo').textContent").await;
        assert!(defined.as_str().unwrap_or("").contains("tally.toml"), "{defined}");
        assert_eq!(b.js("document.getElementById('provider-remove-demo')").await, Value::Null);
        b.assert_accessible("the settings").await;
        for (css, text) in [
            ("#new-provider-name", "gw".to_string()),
            ("#new-provider-model", OPENAI_MODEL.to_string()),
            ("#new-provider-base-url", mock.base()),
            ("#new-provider-price", "0.04".to_string()),
            ("#new-provider-key", KEY.to_string()),
        ] {
            b.c().find(Locator::Css(css)).await.expect(css).send_keys(&text).await.expect("type");
        }
        b.c()
            .find(Locator::Css("#new-provider-kind"))
            .await
            .expect("kind")
            .select_by_value("openai_images")
            .await
            .expect("pick");
        b.click("#add-provider").await;
        let hint = b.until("the new provider", 10, "document.getElementById('provider-key-gw')?.textContent").await;
        assert!(hint.as_str().unwrap_or("").contains("cdef"), "{hint}");
        b.click("#provider-test-button-gw").await;
        b.until("the test's result", 10, "document.getElementById('provider-test-gw').textContent.length > 0").await;
        assert!(mock.lines().iter().all(|l| l["charged"] == false), "the test charged something");
        b.assert_accessible("a provider added in the page").await;

        // Offered for a new job at once; a job on it succeeds without a restart.
        b.click("#nav-jobs").await;
        b.until("gw offered", 10, "[...document.querySelectorAll('#provider option')].some(o => o.value === 'gw')")
            .await;
        let t =
            d.call("POST", "/v1/tasks", Some(&json!({"prompt": "a mug, set up in the page", "provider": "gw"}))).json();
        assert_eq!(d.wait_status(t["id"].as_str().expect("id"), SETTLED)["status"], "succeeded");
        assert_eq!(mock.lines().iter().filter(|l| l["charged"] == true).count(), 1);

        // A new price, seen before the next click.
        b.click("#nav-settings").await;
        b.until("the settings again", 10, "document.getElementById('provider-new-price-gw') !== null").await;
        b.js("(document.getElementById('provider-new-price-gw').value = '0.07')").await;
        b.click("#provider-save-gw").await;
        b.until("the new price", 10, "document.getElementById('provider-price-gw')?.textContent.includes('0.07')")
            .await;
        b.click("#nav-jobs").await;
        let select = b.until("the jobs page", 10, "document.getElementById('provider')").await;
        let _ = select;
        b.c().find(Locator::Css("#provider")).await.expect("provider").select_by_value("gw").await.expect("pick");
        let price = b.js("document.getElementById('generate-price').textContent").await;
        assert!(price.as_str().unwrap_or("").contains("0.07"), "the price beside Generate: {price}");

        // Removed; the key never showed in the page.
        b.click("#nav-settings").await;
        b.until("the settings again", 10, "document.getElementById('provider-remove-gw') !== null").await;
        b.ask("#provider-remove-gw").await;
        b.click("#confirm-yes").await;
        b.until("gw gone", 10, "document.getElementById('provider-gw') === null").await;
        let page = b.js("document.documentElement.outerHTML").await;
        assert!(!page.as_str().unwrap_or("").contains(KEY), "the key is in the page");
        b.close().await;
    });
    assert!(!d.stderr().contains(KEY));
    d.term();
}

#[test]
fn settings_add_test_use_reprice_and_remove_a_provider_on_a_phone() {
    settings_in_the_page("en");
}

#[test]
fn settings_add_test_use_reprice_and_remove_a_provider_on_a_phone_in_chinese() {
    settings_in_the_page("zh-CN");
}
