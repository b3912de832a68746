//! Test helpers: a temporary directory, a real `tally serve` on a free loopback port, a raw
//! HTTP/1.1 client (so tests control Host and Content-Length exactly), bounded waits, and a
//! real `tally mock-provider` ([`Mock`]) with the provider config that points at it.
//! Past 600 lines because both test binaries (`it` and `providers`) share it as one module:
//! splitting it would only move the same helpers into two files that always go together.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};

use std::time::{Duration, Instant};

/// The tally binary under test.
pub const EXE: &str = env!("CARGO_BIN_EXE_tally");

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let p = std::env::temp_dir().join(format!("tally-it-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// Poll `f` every 20 ms until it returns `Some`, for at most `limit`.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `tally serve` with its own data dir and config.
pub struct Daemon {
    pub dir: TempDir,
    pub port: u16,
    pub data: PathBuf,
    pub config: PathBuf,
    pub child: Option<Child>,
    /// Extra environment for the daemon process (API keys, FAILPOINTS).
    pub env: Vec<(String, String)>,
}

/// The default providers section of test daemons: a fast demo provider making 256 px images
/// (the delivery tests measure their profiles against that size).
pub const FAST_DEMO: &str =
    "[[providers]]\nname = \"demo\"\nkind = \"demo\"\nmax_concurrency = 2\ndelay_ms = 20\nsize = \"256x256\"\n";

impl Daemon {
    /// Write a config (loopback on a free port, data dir in a temp dir, short engine timings,
    /// `extra` appended) without starting anything.
    pub fn configure(extra: &str) -> Daemon {
        Daemon::configure_with("", extra)
    }

    /// Like [`Daemon::configure`], with more `[engine]` keys.
    pub fn configure_with(engine: &str, extra: &str) -> Daemon {
        let dir = TempDir::new();
        let port = free_port();
        let data = dir.path().join("data");
        let config = dir.path().join("tally.toml");
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[storage]\ndata_dir = \"{}\"\n\n[engine]\nworkers = 4\n\
             lease_secs = 3\nheartbeat_secs = 1\nshutdown_deadline_secs = 1\n{engine}\n{extra}",
            data.display()
        );
        std::fs::write(&config, text).expect("write config");
        Daemon { dir, port, data, config, child: None, env: Vec::new() }
    }

    /// Start a daemon with `providers` (TOML) and wait until it listens.
    pub fn start(providers: &str) -> Daemon {
        let mut d = Daemon::configure(providers);
        d.spawn();
        d
    }

    /// Start the configured daemon and wait until it listens — this daemon, not another
    /// test's: its port was free when it was configured, but tests run in parallel and another
    /// daemon may have taken it since. So the wait is for this run's address file
    /// (`serve.addr`, written once it listens) naming the port; a daemon that could not listen
    /// there is started again on a port free now (the config is rewritten), and one that ended
    /// otherwise fails the test with its stderr.
    pub fn spawn(&mut self) {
        for _ in 0..5 {
            let address = self.data.join("serve.addr");
            let _ = std::fs::remove_file(&address);
            self.spawn_process();
            let port = self.port;
            let mut child = self.child.take();
            let up = wait_for(Duration::from_secs(30), || {
                if let Some(Ok(Some(_))) = child.as_mut().map(Child::try_wait) {
                    return Some(false);
                }
                let ours = std::fs::read_to_string(&address).is_ok_and(|a| a.trim() == format!("127.0.0.1:{port}"));
                (ours && TcpStream::connect(("127.0.0.1", port)).is_ok()).then_some(true)
            });
            self.child = child;
            match up {
                Some(true) => return,
                Some(false) if self.stderr().contains("cannot listen on") => self.move_to_a_free_port(),
                _ => panic!("daemon did not listen on {port}; stderr:\n{}", self.stderr()),
            }
        }
        panic!("daemon found no free port in five tries; stderr:\n{}", self.stderr());
    }

    /// Listen on a port free now (the config's `listen` rewritten).
    fn move_to_a_free_port(&mut self) {
        let new = free_port();
        let text = std::fs::read_to_string(&self.config).expect("config");
        let text =
            text.replace(&format!("listen = \"127.0.0.1:{}\"", self.port), &format!("listen = \"127.0.0.1:{new}\""));
        std::fs::write(&self.config, text).expect("config");
        self.port = new;
    }

    /// Start the configured daemon without waiting for it (it may be meant to crash at once).
    pub fn spawn_process(&mut self) {
        let out = std::fs::File::create(self.dir.path().join("serve.out")).expect("log file");
        let err = std::fs::File::create(self.dir.path().join("serve.err")).expect("log file");
        let child = Command::new(EXE)
            .args(["serve", "--config"])
            .arg(&self.config)
            .env_remove("TALLY_DATA_DIR")
            .env_remove("TALLY_CONFIG")
            .env_remove("FAILPOINTS")
            // The shop's clock defaults to the computer's zone: the tests' days and months are
            // UTC's whatever the machine says (a test of zones names `[ui] time_zone`).
            .env("TZ", "UTC")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn tally serve");
        self.child = Some(child);
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.err")).unwrap_or_default()
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.out")).unwrap_or_default()
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data.join("api-token")).expect("token file").trim().to_string()
    }

    /// A request with the token and a loopback Host.
    pub fn call(&self, method: &str, path: &str, body: Option<&serde_json::Value>) -> Reply {
        let auth = format!("Bearer {}", self.token());
        let body = body.map(|b| b.to_string());
        let mut headers = vec![("Authorization", auth.as_str())];
        if body.is_some() {
            headers.push(("Content-Type", "application/json"));
        }
        request(self.port, method, path, &headers, body.as_deref().map(str::as_bytes))
    }

    /// Run a CLI subcommand against this daemon's config.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(EXE)
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env_remove("TALLY_DATA_DIR")
            .env_remove("TALLY_CONFIG")
            .stdin(Stdio::null())
            .output()
            .inspect(|out| {
                let what = format!("`tally {}`", args.join(" "));
                assert_rendered(&String::from_utf8_lossy(&out.stdout), &what);
                assert_rendered(&String::from_utf8_lossy(&out.stderr), &what);
            })
            .expect("run tally")
    }

    /// Send SIGTERM and wait (bounded) for the exit status.
    pub fn term(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
        assert!(status.success());
        let done = wait_for(Duration::from_secs(30), || child.try_wait().ok().flatten());
        match done {
            Some(s) => s,
            None => {
                let _ = child.kill();
                panic!("daemon did not stop after SIGTERM");
            }
        }
    }

    /// SIGKILL the daemon (no clean stop) and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Poll a task until its status is one of `want`.
    pub fn wait_status(&self, id: &str, want: &[&str]) -> serde_json::Value {
        let path = format!("/v1/tasks/{id}");
        let mut last = serde_json::Value::Null;
        let got = wait_for(Duration::from_secs(30), || {
            let r = self.call("GET", &path, None);
            last = r.json();
            want.contains(&last["status"].as_str().unwrap_or("")).then(|| last.clone())
        });
        got.unwrap_or_else(|| panic!("task {id} never reached {want:?}; last: {last}"))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The error code of a `{"error": {"code", "message"}}` answer.
    pub fn error_code(&self) -> String {
        self.json()["error"]["code"].as_str().unwrap_or("").to_string()
    }
}

/// A raw HTTP/1.1 request to 127.0.0.1:`port`. A `Host` header in `headers` replaces the
/// default one; `Content-Length` is added for a body unless given.
pub fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Reply {
    try_request(port, method, path, headers, body).expect("a complete HTTP answer")
}

/// Like [`request`], but `None` when the server is gone or closes without a full answer
/// (a daemon killed mid-request).
pub fn try_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Option<Reply> {
    try_request_at("127.0.0.1", port, method, path, headers, body)
}

/// Like [`try_request`], to the daemon at `ip` (its address on a network, with `--lan`); the
/// Host header names `ip` unless `headers` name one.
pub fn try_request_at(
    ip: &str,
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Option<Reply> {
    let mut s = TcpStream::connect((ip, port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {ip}:{port}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body
        && !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        head.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).ok()?;
    if let Some(b) = body {
        // The server may answer (and close) before reading a body it refuses.
        let _ = s.write_all(b);
    }
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse(&raw)
}

fn parse(raw: &[u8]) -> Option<Reply> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok())?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))).collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16).unwrap_or(0);
            if size == 0 {
                break;
            }
            out.extend_from_slice(rest.get(eol + 2..eol + 2 + size)?);
            rest = rest.get(eol + 2 + size + 2..)?;
        }
        body = out;
    }
    let textual = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("content-type") && ["json", "text/", "csv", "event-stream"].iter().any(|t| v.contains(t))
    });
    if textual {
        assert_rendered(&String::from_utf8_lossy(&body), &format!("the answer {status}"));
    }
    Some(Reply { status, headers, body })
}

/// Fails the test when `text` (an answer's body, a command's output) shows a said line as
/// stored (`domain::words::say`: STX … ETX, raw or as a JSON escape) instead of its words:
/// every surface renders what the daemon said in the reader's language.
pub fn assert_rendered(text: &str, what: &str) {
    for mark in ["\u{2}", "\u{3}", "\\u0002", "\\u0003"] {
        if let Some(at) = text.find(mark) {
            let around: String = text[at..].chars().take(160).collect();
            let before: String = text[..at].chars().rev().take(80).collect::<Vec<_>>().into_iter().rev().collect();
            panic!("{what} shows a said line unrendered ({mark:?}): …{before}{around}…");
        }
    }
}

/// SHA-256 of bytes as lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    tally::domain::hex(&sha2::Sha256::digest(bytes))
}

/// A running `tally mock-provider` with its ledger.
pub struct Mock {
    pub port: u16,
    pub ledger: std::path::PathBuf,
    child: Child,
    _dir: TempDir,
}

impl Mock {
    pub fn start(args: &[&str]) -> Mock {
        let dir = TempDir::new();
        let port = free_port();
        let ledger = dir.path().join("ledger.jsonl");
        let child = Command::new(EXE)
            .args(["mock-provider", "--listen", &format!("127.0.0.1:{port}"), "--ledger"])
            .arg(&ledger)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mock");
        let up = wait_for(Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", port)).ok());
        assert!(up.is_some(), "mock provider did not listen");
        Mock { port, ledger, child, _dir: dir }
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every ledger line.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.ledger)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("ledger lines are JSON"))
            .collect()
    }

    /// Ledger lines whose prompt contains `tag`: (all, charged).
    pub fn count(&self, tag: &str) -> (usize, usize) {
        let lines: Vec<_> =
            self.lines().into_iter().filter(|l| l["prompt"].as_str().is_some_and(|p| p.contains(tag))).collect();
        let charged = lines.iter().filter(|l| l["charged"] == true).count();
        (lines.len(), charged)
    }

    /// (all lines, charged lines) of requests to an endpoint containing `part`.
    pub fn count_endpoint(&self, part: &str) -> (usize, usize) {
        let lines: Vec<_> =
            self.lines().into_iter().filter(|l| l["endpoint"].as_str().is_some_and(|e| e.contains(part))).collect();
        let charged = lines.iter().filter(|l| l["charged"] == true).count();
        (lines.len(), charged)
    }

    /// Change the mock's behaviour at run time.
    pub fn behave(&self, body: serde_json::Value) {
        let r = try_request(
            self.port,
            "PUT",
            "/_mock/behavior",
            &[("Content-Type", "application/json")],
            Some(body.to_string().as_bytes()),
        )
        .expect("mock answers");
        assert!(r.status < 300, "mock refused behaviour: {}", String::from_utf8_lossy(&r.body));
    }

    /// The mock's behaviour now (`GET /_mock/behavior`: knobs that count down show what is left).
    pub fn behavior(&self) -> serde_json::Value {
        try_request(self.port, "GET", "/_mock/behavior", &[], None).expect("mock answers").json()
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The current OpenAI image model the tests name (`gpt-image-1` is shut down, and the mock
/// refuses it as the real API does).
pub const OPENAI_MODEL: &str = "gpt-image-2.5-flare";

/// The provider kinds against one mock, named after their kind: the provider guide's example
/// models (a FLUX model on Replicate, `fal-ai/flux/dev`, `gemini-2.5-flash-image` directly and
/// through the Batch API as `gembatch`, BFL's `flux-pro-1.1`, `wan2.2-t2i-flash` on DashScope). `idem` models a gateway that honours
/// `Idempotency-Key`, so its mock must be started with `--honor-idempotency-key`.
pub fn providers(mock: &Mock) -> String {
    providers_at(&mock.base())
}

/// [`providers`] for a mock at `base`.
pub fn providers_at(base: &str) -> String {
    let common = "api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 4\npoll_interval_ms = 50\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n";
    // DashScope allows 20 task queries a second per account (the mock enforces it).
    let dashscope = common.replace("poll_interval_ms = 50", "poll_interval_ms = 100");
    format!(
        "[[providers]]\nname = \"openai\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\nmodel = \"{OPENAI_MODEL}\"\n{common}\n\
         [[providers]]\nname = \"replicate\"\nkind = \"replicate\"\nbase_url = \"{base}\"\nmodel = \"black-forest-labs/flux-schnell\"\n{common}\n\
         [[providers]]\nname = \"fal\"\nkind = \"fal_queue\"\nbase_url = \"{base}/fal\"\nmodel = \"fal-ai/flux/dev\"\n{common}\n\
         [[providers]]\nname = \"idem\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\nmodel = \"{OPENAI_MODEL}\"\nidempotency_header = \"Idempotency-Key\"\n{common}\n\
         [[providers]]\nname = \"dashscope\"\nkind = \"dashscope\"\nbase_url = \"{base}/dashscope\"\nmodel = \"wan2.2-t2i-flash\"\n{dashscope}\n\
         [[providers]]\nname = \"gemini\"\nkind = \"gemini\"\nbase_url = \"{base}/gemini\"\nmodel = \"gemini-2.5-flash-image\"\n{common}\n\
         [[providers]]\nname = \"gembatch\"\nkind = \"gemini\"\nbase_url = \"{base}/gemini\"\nmodel = \"gemini-2.5-flash-image\"\nbatch = true\n{common}\n\
         [[providers]]\nname = \"bfl\"\nkind = \"bfl\"\nbase_url = \"{base}/bfl\"\nmodel = \"flux-pro-1.1\"\n{common}\n\
         [[providers]]\nname = \"kontext\"\nkind = \"replicate\"\nbase_url = \"{base}\"\nmodel = \"black-forest-labs/flux-kontext-pro\"\n{common}\n\
         [[providers]]\nname = \"photoroom\"\nkind = \"photoroom\"\nbase_url = \"{base}\"\n{common}\n\
         [[providers]]\nname = \"faledit\"\nkind = \"fal_queue\"\nbase_url = \"{base}/fal\"\nmodel = \"fal-ai/flux/dev/image-to-image\"\nreference_input = \"image_url\"\n{common}\n\
         [[providers]]\nname = \"dsedit\"\nkind = \"dashscope\"\nbase_url = \"{base}/dashscope\"\nmodel = \"wan2.5-i2i-preview\"\n{dashscope}\n\
         [[providers]]\nname = \"bfledit\"\nkind = \"bfl\"\nbase_url = \"{base}/bfl\"\nmodel = \"flux-kontext-pro\"\n{common}\n"
    )
}

/// The three kinds that draft (issue #36) at the mock `base`, for the crash matrix and the soak:
/// `oadraft` (`openai_responses`: background, fetched by id), `dsdraft` (`dashscope_chat`) and
/// `gmdraft` (`gemini` with `operations = ["draft"]`), both synchronous.
pub fn draft_providers_at(base: &str) -> String {
    let common = "api_key_env = \"TALLY_TEST_KEY\"\nmax_concurrency = 4\npoll_interval_ms = 50\nrequest_timeout_ms = 5000\n\
                  connect_timeout_ms = 1000\nmax_output_tokens = 2000\nprice_per_million_input_tokens = 0.25\n\
                  price_per_million_output_tokens = 2.0\n";
    format!(
        "[[providers]]\nname = \"oadraft\"\nkind = \"openai_responses\"\nbase_url = \"{base}\"\nmodel = \"gpt-5-mini\"\n{common}\n\
         [[providers]]\nname = \"dsdraft\"\nkind = \"dashscope_chat\"\nbase_url = \"{base}/dashscope/compatible-mode/v1\"\nmodel = \"qwen-vl-max\"\n{common}\n\
         [[providers]]\nname = \"gmdraft\"\nkind = \"gemini\"\nbase_url = \"{base}/gemini\"\nmodel = \"gemini-2.5-flash\"\noperations = [\"draft\"]\n{common}\n"
    )
}

/// [`providers`] and [`draft_providers_at`] together.
pub fn providers_with_drafts(mock: &Mock) -> String {
    format!("{}{}", providers(mock), draft_providers_at(&mock.base()))
}

/// Submit with an idempotency key; `None` if the daemon died before answering. `provider` may
/// name an operation after a colon (`openai:edit`, `photoroom:cutout`): the task then works on
/// the upload `TEST_SOURCE` put in the daemon (see [`upload_source`]). `oadraft:draft` (any
/// provider with `:draft`) creates a draft instead (`POST /v1/drafts`: the product named
/// `prompt`, one photo drawn from it) and answers its drafting call's task id, with `202` for a
/// new draft and `200` for the key's existing one.
pub fn submit(d: &Daemon, provider: &str, prompt: &str, key: &str) -> Option<(u16, String)> {
    if let Some((provider, "draft")) = provider.split_once(':') {
        let photo = upload_source(d, prompt)?;
        let body = serde_json::json!({"product": prompt, "photos": [photo], "language": "en",
                                      "provider": provider, "idempotency_key": key})
        .to_string();
        let auth = format!("Bearer {}", d.token());
        let r = try_request(
            d.port,
            "POST",
            "/v1/drafts",
            &[("Authorization", auth.as_str()), ("Content-Type", "application/json")],
            Some(body.as_bytes()),
        )?;
        let id = r.json()["task_id"].as_str().map(str::to_string);
        if id.is_none() {
            eprintln!("draft answered {} without a task id: {}", r.status, String::from_utf8_lossy(&r.body));
        }
        return Some((r.status, id?));
    }
    let body = match provider.split_once(':') {
        None => serde_json::json!({"prompt": prompt, "provider": provider, "idempotency_key": key}),
        Some((provider, op)) => {
            let source = upload_source(d, prompt)?;
            let mut b = serde_json::json!({"provider": provider, "idempotency_key": key, "operation": op,
                                           "image": {"upload": source}});
            if op == "edit" {
                b["prompt"] = serde_json::json!(prompt);
            }
            b
        }
    }
    .to_string();
    let auth = format!("Bearer {}", d.token());
    let r = try_request(
        d.port,
        "POST",
        "/v1/tasks",
        &[("Authorization", auth.as_str()), ("Content-Type", "application/json")],
        Some(body.as_bytes()),
    )?;
    let id = r.json()["id"].as_str().map(str::to_string);
    if id.is_none() {
        eprintln!("submit answered {} without a task id: {}", r.status, String::from_utf8_lossy(&r.body));
    }
    Some((r.status, id?))
}

/// What the mock's ledger calls a task's request: its prompt, or for a cutout (which has
/// none) `image <sha256>` of the source photo [`upload_source`] made for it.
pub fn ledger_prompt(kind: &str, prompt: &str) -> String {
    if kind.ends_with(":cutout") {
        format!("image {}", sha256_hex(&tally::render::product_png(prompt, 64)))
    } else {
        prompt.to_string()
    }
}

/// Upload a source photo drawn from `tag` (a product on a plain background; the same tag gives
/// the same bytes, so the same upload id); its id, or `None` if the daemon did not answer.
pub fn upload_source(d: &Daemon, tag: &str) -> Option<String> {
    let png = tally::render::product_png(tag, 64);
    let auth = format!("Bearer {}", d.token());
    let r = try_request(
        d.port,
        "POST",
        "/v1/uploads",
        &[("Authorization", auth.as_str()), ("Content-Type", "image/png")],
        Some(&png),
    )?;
    r.json()["id"].as_str().map(str::to_string)
}

/// A fresh database on the test PostgreSQL server (`TALLY_TEST_PG_URL`); its URL.
pub fn pg_database(url: &str) -> String {
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let (admin, n) = (url.to_string(), name.clone());
    // The sync client runs a runtime of its own: off any async thread.
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&admin, postgres::NoTls).expect("connect");
        c.batch_execute(&format!("CREATE DATABASE {n}")).expect("create database");
    })
    .join()
    .expect("create database thread");
    match url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("odd URL {url}"),
    }
}

impl Daemon {
    /// Keep this (configured, not yet started) daemon's data in a fresh PostgreSQL database
    /// instead of its SQLite file, as node `node`. `None` when the PostgreSQL tests are skipped.
    pub fn on_postgres(&mut self, node: &str) -> Option<()> {
        let url = pg_url()?;
        let db = pg_database(&url);
        let text = std::fs::read_to_string(&self.config).expect("read config");
        let storage = format!("[storage]\nbackend = \"postgres\"\npostgres_url = \"{db}\"\n");
        let text = format!("{}\n[node]\nname = \"{node}\"\n", text.replacen("[storage]\n", &storage, 1));
        std::fs::write(&self.config, text).expect("write config");
        Some(())
    }
}

/// The test server's URL, or why there is none (a failure unless skipping is allowed).
pub fn pg_url() -> Option<String> {
    if let Ok(url) = std::env::var("TALLY_TEST_PG_URL") {
        return Some(url);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let skip = std::env::var("TALLY_SKIP_PG").is_ok_and(|v| v == "1");
    if skip && !ci {
        eprintln!("SKIPPED: TALLY_TEST_PG_URL is not set and TALLY_SKIP_PG=1: this PostgreSQL test did not run");
        return None;
    }
    panic!(
        "TALLY_TEST_PG_URL is not set: run the PostgreSQL tests through `scripts/with-postgres.sh cargo test …` \
         (scripts/test.sh does), or set TALLY_SKIP_PG=1 to skip them outside CI"
    );
}

/// What the store keeps as said lines (`domain::words::say`), read in English as the tests
/// check them (the API and the CLI render them themselves).
pub trait En {
    /// The text in English (empty for `None`).
    fn en(&self) -> String;
}

impl En for str {
    fn en(&self) -> String {
        tally::domain::words::english(self)
    }
}

impl En for String {
    fn en(&self) -> String {
        tally::domain::words::english(self)
    }
}

impl En for Option<String> {
    fn en(&self) -> String {
        self.as_deref().map(tally::domain::words::english).unwrap_or_default()
    }
}

/// An optional said line in English, kept optional.
pub fn en_opt(text: Option<&str>) -> Option<String> {
    text.map(tally::domain::words::english)
}
