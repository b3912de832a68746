//! The browser harness of the web page tests: chromedriver and a headless Chromium session
//! driven with fantoccini, JavaScript evaluation and waiting on page conditions, screenshots,
//! and axe-core (from `scripts/install-axe.sh`) injected into a view to list accessibility
//! violations. A missing browser or axe-core fails the test naming the script that installs
//! it; it is never skipped.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::common::{TempDir, free_port, wait_for};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// chromedriver and a headless Chromium session; both end when dropped.
pub struct Browser {
    client: Option<Client>,
    driver: Child,
    _profile: TempDir,
}

impl Browser {
    pub async fn start() -> Browser {
        Browser::start_with(&[]).await
    }

    /// A session with more Chromium switches (`--force-dark-mode` makes the page's
    /// `prefers-color-scheme: dark` apply).
    pub async fn start_with(extra: &[&str]) -> Browser {
        Browser::start_emulating(extra, None).await
    }

    /// A phone: Chromium's mobile emulation at 390×844 CSS px (an iPhone 12 to 15's screen),
    /// 3 device pixels each, with touch (`pointer: coarse`, touch events) and a phone's
    /// viewport handling.
    pub async fn phone() -> Browser {
        let metrics = json!({ "deviceMetrics": { "width": 390, "height": 844, "pixelRatio": 3.0, "touch": true, "mobile": true } });
        let b = Browser::start_emulating(&[], Some(metrics)).await;
        // (The layout is the screen's width on a page asking for `width=device-width`.)
        let seen = b
            .js("[screen.width, screen.height, matchMedia('(pointer: coarse)').matches, navigator.maxTouchPoints > 0]")
            .await;
        assert_eq!(seen, json!([390, 844, true, true]), "a 390×844 touch screen");
        b
    }

    /// A session with more Chromium switches and, with `mobile`, chromedriver's
    /// `mobileEmulation` capability.
    async fn start_emulating(extra: &[&str], mobile: Option<Value>) -> Browser {
        for exe in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(exe).exists(),
                "{exe} is missing: the browser tests need Debian's chromium and chromium-driver; \
                 run scripts/install-browser.sh (scripts/test.sh does)"
            );
        }
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let up = wait_for(Duration::from_secs(20), || TcpStream::connect(("127.0.0.1", port)).ok());
        assert!(up.is_some(), "chromedriver did not listen on {port}");
        let profile = TempDir::new();
        let mut args: Vec<String> = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-proxy-server",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        args.push("--window-size=1280,900".into());
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut caps = serde_json::Map::new();
        let mut chrome = json!({ "binary": CHROMIUM, "args": args });
        if let Some(m) = mobile {
            chrome["mobileEmulation"] = m;
        }
        caps.insert("goog:chromeOptions".into(), chrome);
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| panic!("cannot start a Chromium session through chromedriver: {e}"));
        Browser { client: Some(client), driver, _profile: profile }
    }

    pub fn c(&self) -> &Client {
        self.client.as_ref().expect("browser session")
    }

    /// Evaluate `expr` in the page (as `return (expr)`).
    pub async fn js(&self, expr: &str) -> Value {
        self.c().execute(&format!("return ({expr});"), vec![]).await.unwrap_or_else(|e| panic!("{expr}: {e}"))
    }

    /// Open the daemon's one-time sign-in link and wait for the jobs page it leads to.
    pub async fn sign_in(&self, url: &str) {
        self.c().goto(url).await.expect("sign in");
        self.until("the jobs page", 15, "document.getElementById('new-task') !== null").await;
    }

    /// Click `button` and wait for the page's confirmation question; its text.
    pub async fn ask(&self, button: &str) -> String {
        self.click(button).await;
        self.until("the confirmation", 5, "document.getElementById('confirm-dialog').open").await;
        self.js("document.getElementById('confirm-dialog').innerText").await.as_str().unwrap_or("").to_string()
    }

    /// Answer the open confirmation question "no" and wait for it to close.
    pub async fn say_no(&self) {
        self.click("#confirm-no").await;
        self.until("the dialog closed", 5, "!document.getElementById('confirm-dialog').open").await;
    }

    /// Evaluate `expr` until it is neither null nor false (at most `secs`).
    pub async fn until(&self, what: &str, secs: u64, expr: &str) -> Value {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.js(expr).await;
            if !(v.is_null() || v == Value::Bool(false)) {
                return v;
            }
            if Instant::now() > end {
                let body = self.js("document.body.innerText").await;
                panic!("timed out waiting for {what} ({expr}); the page shows:\n{}", body.as_str().unwrap_or(""));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Click `css` as a person would. When a live update drew the view again between finding
    /// the element and clicking it (a stale element), find it again and click the new one.
    pub async fn click(&self, css: &str) {
        for _ in 0..5 {
            let el = self.c().find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
            match el.click().await {
                Ok(()) => return,
                Err(fantoccini::error::CmdError::Standard(e))
                    if e.error == fantoccini::error::ErrorStatus::StaleElementReference => {}
                Err(e) => panic!("click {css}: {e}"),
            }
        }
        panic!("{css} was drawn again five times in a row");
    }

    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
        std::fs::create_dir_all(&dir).expect("create target/screenshots");
        let png = self.c().screenshot().await.expect("screenshot");
        let path = dir.join(name);
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    /// Run axe-core on the page as it is now: one line per violation (rule, what it means,
    /// where), empty when the view is clean.
    pub async fn axe(&self) -> Vec<String> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/axe/node_modules/axe-core/axe.min.js");
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{} is missing ({e}): run scripts/install-axe.sh (scripts/test.sh does)", path.display())
        });
        if self.js("typeof window.axe").await != "object" {
            self.c().execute(&format!("{source}\nreturn true;"), vec![]).await.expect("inject axe-core");
        }
        let found = self
            .c()
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 axe.run(document, { resultTypes: ['violations'] })
                   .then(r => done(r.violations.map(v => v.id + ' (' + v.impact + '): ' + v.help + ' at ' +
                     v.nodes.map(n => n.target.join(' ')).join(', '))))
                   .catch(e => done(['axe failed: ' + e]));",
                vec![],
            )
            .await
            .expect("run axe-core");
        found.as_array().map(|a| a.iter().map(|v| v.as_str().unwrap_or("").to_string()).collect()).unwrap_or_default()
    }

    /// Assert that axe-core finds nothing on the page as it is now (`view` names it).
    pub async fn assert_accessible(&self, view: &str) {
        let v = self.axe().await;
        assert!(v.is_empty(), "axe-core on {view}:\n{}", v.join("\n"));
    }

    /// A screenshot into `dir` (created if needed).
    pub async fn screenshot_into(&self, dir: &Path, name: &str) -> PathBuf {
        std::fs::create_dir_all(dir).expect("create the screenshot directory");
        let png = self.c().screenshot().await.expect("screenshot");
        let path = dir.join(name);
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    pub async fn close(mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.close().await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
