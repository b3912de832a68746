//! The harness every provider adapter test shares: the in-process mock provider (with its
//! ledger), a provider of any kind configured against it from the kind's descriptor, and small
//! helpers for requests and answers. Compiled into both adapter binaries: `tests/adapters`
//! (package `tally-base`) and `tests/providers` (package `tally`, the tests through the daemon).

use std::path::PathBuf;
use std::sync::{Arc, Once};
use std::time::Duration;

use serde_json::{Value, json};
use tally_base::mock::{self, MockArgs, MockServer};
use tally_base::providers::{
    self, CallRequest, Image, JobHandle, JobState, Provider, ProviderConfig, ProviderKind, Submitted,
};

pub const KEY_ENV: &str = "TALLY_TEST_PROVIDER_KEY";
pub const KEY_VALUE: &str = "sk-test-very-secret-value";

/// Install the TLS crypto provider once. The API key variable comes from
/// `.cargo/config.toml` (`[env]`), so no test writes the environment at run time.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        assert_eq!(std::env::var(KEY_ENV).as_deref(), Ok(KEY_VALUE), "run the tests through cargo");
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

pub struct Harness {
    pub mock: MockServer,
    pub ledger: PathBuf,
    pub http: reqwest::Client,
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut MockArgs)) -> Self {
        init();
        let ledger = std::env::temp_dir().join(format!("tally-mock-ledger-{}.jsonl", uuid::Uuid::new_v4()));
        let mut args = MockArgs::loopback(ledger.clone());
        args.job_duration_ms = 50;
        tweak(&mut args);
        let mock = mock::spawn(args).await.unwrap();
        Harness { mock, ledger, http: reqwest::Client::new() }
    }

    pub fn config(&self, kind: ProviderKind) -> ProviderConfig {
        // Where the mock serves the kind and a model it serves: from the kind's descriptor.
        let spec = kind.spec();
        let base_url = format!("{}{}", self.mock.base_url(), spec.mock_path);
        ProviderConfig {
            name: kind.as_str().into(),
            kind,
            operations: spec.default_operations.to_vec(),
            base_url: Some(base_url),
            api_key_env: Some(KEY_ENV.into()),
            model: spec.mock_model.map(str::to_string),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            // DashScope allows 20 task queries a second (the mock enforces it).
            poll_interval: Duration::from_millis(if kind == ProviderKind::Dashscope { 100 } else { 20 }),
            ..ProviderConfig::demo()
        }
    }

    pub fn provider(&self, kind: ProviderKind) -> Arc<dyn Provider> {
        providers::build(&self.config(kind)).unwrap()
    }

    /// The ledger as written to the file.
    pub fn ledger(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.ledger).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    pub fn charged(&self) -> usize {
        self.ledger().iter().filter(|l| l["charged"] == true).count()
    }

    /// A GET of a mock API path with a key, to see what the mock stored.
    pub async fn api_get(&self, path: &str) -> Value {
        let url = format!("{}{path}", self.mock.base_url());
        self.http.get(url).header("Authorization", "Bearer inspect").send().await.unwrap().json().await.unwrap()
    }

    pub async fn behave(&self, patch: Value) -> reqwest::Response {
        let url = format!("{}/_mock/behavior", self.mock.base_url());
        self.http.put(url).json(&patch).send().await.unwrap()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ledger);
    }
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A request as the engine makes it: calling now, a fresh execution key.
pub fn request(prompt: &str) -> CallRequest {
    CallRequest {
        task_id: "task-1".into(),
        prompt: prompt.into(),
        params: json!({}),
        idempotency_key: format!("exec-{}", uuid::Uuid::new_v4()),
        references: Vec::new(),
        calling_at_ms: now_ms(),
        candidate: 0,
        // Result downloads inside `submit` are retried until here (a blip is not final).
        deadline_ms: now_ms() + 20_000,
        operation: Default::default(),
    }
}

pub fn reference() -> Image {
    Image { bytes: tally_base::render::placeholder_png("reference", 8), media_type: "image/png".into() }
}

pub fn accepted(s: Submitted) -> JobHandle {
    match s {
        Submitted::Accepted(job) => job,
        Submitted::Done(_) => panic!("expected an accepted job"),
    }
}

/// Poll until the job leaves `Running` (bounded).
pub async fn poll_until_settled(p: &dyn Provider, job: &JobHandle) -> JobState {
    let id = &job.id;
    for _ in 0..200 {
        match p.poll(job).await.unwrap() {
            JobState::Running => tokio::time::sleep(p.poll_interval()).await,
            other => return other,
        }
    }
    panic!("job {id} still running");
}

pub fn assert_png(img: &Image) {
    assert_eq!(img.media_type, "image/png");
    assert!(img.bytes.starts_with(b"\x89PNG"));
}
