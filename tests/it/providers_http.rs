//! End-to-end tests of the HTTP provider adapters against the in-process mock provider:
//! each asserts both what the adapter returned and what the mock's ledger recorded.

use std::path::PathBuf;
use std::sync::{Arc, Once};
use std::time::Duration;

use serde_json::{Value, json};
use tally::config::{ProviderConfig, ProviderKind};
use tally::mock::{self, MockArgs, MockServer};
use tally::providers::{self, CallError, CallRequest, Image, JobState, Provider, Submitted};

const KEY_ENV: &str = "TALLY_TEST_PROVIDER_KEY";
const KEY_VALUE: &str = "sk-test-very-secret-value";

/// Install the TLS crypto provider once. The API key variable comes from
/// `.cargo/config.toml` (`[env]`), so no test writes the environment at run time.
fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        assert_eq!(std::env::var(KEY_ENV).as_deref(), Ok(KEY_VALUE), "run the tests through cargo");
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

struct Harness {
    mock: MockServer,
    ledger: PathBuf,
    http: reqwest::Client,
}

impl Harness {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    async fn start_with(tweak: impl FnOnce(&mut MockArgs)) -> Self {
        init();
        let ledger = std::env::temp_dir().join(format!("tally-mock-ledger-{}.jsonl", uuid::Uuid::new_v4()));
        let mut args = MockArgs::loopback(ledger.clone());
        args.job_duration_ms = 50;
        tweak(&mut args);
        let mock = mock::spawn(args).await.unwrap();
        Harness { mock, ledger, http: reqwest::Client::new() }
    }

    fn config(&self, kind: ProviderKind) -> ProviderConfig {
        let (base_url, model) = match kind {
            ProviderKind::FalQueue => (self.mock.fal_url(), "fal-ai/flux/dev"),
            ProviderKind::Replicate => (self.mock.base_url(), "black-forest-labs/flux-schnell"),
            _ => (self.mock.base_url(), "gpt-image-1"),
        };
        ProviderConfig {
            name: kind.as_str().into(),
            kind,
            base_url: Some(base_url),
            api_key_env: Some(KEY_ENV.into()),
            model: Some(model.into()),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(20),
            ..ProviderConfig::demo()
        }
    }

    fn provider(&self, kind: ProviderKind) -> Arc<dyn Provider> {
        providers::build(&self.config(kind)).unwrap()
    }

    /// The ledger as written to the file.
    fn ledger(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.ledger).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn charged(&self) -> usize {
        self.ledger().iter().filter(|l| l["charged"] == true).count()
    }

    async fn behave(&self, patch: Value) -> reqwest::Response {
        let url = format!("{}/_mock/behavior", self.mock.base_url());
        self.http.put(url).json(&patch).send().await.unwrap()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ledger);
    }
}

fn request(prompt: &str) -> CallRequest {
    CallRequest {
        task_id: "task-1".into(),
        prompt: prompt.into(),
        params: json!({}),
        idempotency_key: format!("exec-{}", uuid::Uuid::new_v4()),
        references: Vec::new(),
        calling_at_ms: 0,
    }
}

fn reference() -> Image {
    Image { bytes: tally::render::placeholder_png("reference", 8), media_type: "image/png".into() }
}

fn accepted(s: Submitted) -> String {
    match s {
        Submitted::Accepted(id) => id,
        Submitted::Done(_) => panic!("expected an accepted job"),
    }
}

/// Poll until the job leaves `Running` (bounded).
async fn poll_until_settled(p: &dyn Provider, id: &str) -> JobState {
    for _ in 0..200 {
        match p.poll(id).await.unwrap() {
            JobState::Running => tokio::time::sleep(p.poll_interval()).await,
            other => return other,
        }
    }
    panic!("job {id} still running");
}

fn assert_png(img: &Image) {
    assert_eq!(img.media_type, "image/png");
    assert!(img.bytes.starts_with(b"\x89PNG"));
}

#[tokio::test]
async fn openai_success_is_one_charged_line() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::OpenaiImages);
    assert_eq!(p.capabilities(), providers::Capabilities::default());
    match p.submit(&request("red sneaker")).await.unwrap() {
        Submitted::Done(img) => assert_png(&img),
        Submitted::Accepted(_) => panic!("openai is synchronous"),
    }
    let ledger = h.ledger();
    assert_eq!(ledger.len(), 1);
    let line = &ledger[0];
    assert_eq!(line["api"], "openai_images");
    assert_eq!(line["endpoint"], "POST /v1/images/generations");
    assert_eq!(line["prompt"], "red sneaker");
    assert_eq!(line["charged"], true);
    assert_eq!(line["reference_images"], 0);
    assert!(line["ts"].as_str().unwrap().ends_with('Z'));
    // GET /_mock/ledger serves the same lines.
    let served: Value =
        h.http.get(format!("{}/_mock/ledger", h.mock.base_url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(served, Value::Array(ledger));
}

#[tokio::test]
async fn openai_result_given_as_url_is_downloaded() {
    let h = Harness::start().await;
    let mut req = request("by url");
    req.params = json!({"response_format": "url"});
    match h.provider(ProviderKind::OpenaiImages).submit(&req).await.unwrap() {
        Submitted::Done(img) => assert_png(&img),
        Submitted::Accepted(_) => panic!("openai is synchronous"),
    }
    assert_eq!(h.ledger().len(), 1, "downloads are not in the ledger");
}

#[tokio::test]
async fn reject_400_is_rejected_and_not_charged() {
    let h = Harness::start().await;
    assert!(h.behave(json!({"reject_status": 400})).await.status().is_success());
    let err = h.provider(ProviderKind::OpenaiImages).submit(&request("x")).await.unwrap_err();
    assert!(matches!(err, CallError::Rejected { config: false, .. }), "{err:?}");
    let ledger = h.ledger();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["charged"], false);
}

#[tokio::test]
async fn rate_limit_gives_retry_after_hint() {
    let h = Harness::start().await;
    h.behave(json!({"retry_after_s": 2})).await;
    let err = h.provider(ProviderKind::Replicate).submit(&request("x")).await.unwrap_err();
    assert!(matches!(err, CallError::RetryAfter { after, .. } if after == Duration::from_secs(2)), "{err:?}");
    assert_eq!(h.ledger().len(), 1);
    assert_eq!(h.charged(), 0);
}

#[tokio::test]
async fn fail_500_is_ambiguous() {
    let h = Harness::start().await;
    h.behave(json!({"fail_status": 500})).await;
    let err = h.provider(ProviderKind::FalQueue).submit(&request("x")).await.unwrap_err();
    assert!(matches!(err, CallError::Ambiguous(_)), "{err:?}");
    assert_eq!(h.ledger().len(), 1);
    assert_eq!(h.charged(), 0);
}

#[tokio::test]
async fn dropped_openai_answer_is_ambiguous_but_charged_once() {
    let h = Harness::start().await;
    h.behave(json!({"drop_response": true})).await;
    let err = h.provider(ProviderKind::OpenaiImages).submit(&request("lost")).await.unwrap_err();
    assert!(matches!(err, CallError::Ambiguous(_)), "{err:?}");
    let ledger = h.ledger();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["charged"], true);
    assert_eq!(ledger[0]["prompt"], "lost");
}

#[tokio::test]
async fn replicate_submit_then_poll_to_done() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    assert!(p.capabilities().lookup);
    let id = accepted(p.submit(&request("blue chair")).await.unwrap());
    match poll_until_settled(p.as_ref(), &id).await {
        JobState::Done(img) => assert_png(&img),
        other => panic!("{other:?}"),
    }
    let ledger = h.ledger();
    assert_eq!(ledger[0]["api"], "replicate");
    assert_eq!(ledger[0]["job_id"], id.as_str());
    assert_eq!(ledger[0]["prompt"], "blue chair");
    assert!(ledger[1..].iter().all(|l| l["endpoint"] == "GET /v1/predictions/{id}" && l["prompt"].is_null()));
    assert_eq!(h.charged(), 1);
}

#[tokio::test]
async fn replicate_lost_create_is_found_by_listing() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    // Other jobs first, so the marker has to be matched, not just the newest taken.
    for i in 0..3 {
        p.submit(&request(&format!("other {i}"))).await.unwrap();
    }
    h.behave(json!({"drop_response": true, "drop_on": "create"})).await;
    let req = request("lost answer");
    let err = p.submit(&req).await.unwrap_err();
    assert!(matches!(err, CallError::Ambiguous(_)), "{err:?}");
    // Listing is not a create, so it is answered even while creates are dropped.
    let found = p.find(&req).await.unwrap().expect("the lost job is listed");
    let lost = h.ledger().into_iter().find(|l| l["prompt"] == "lost answer").unwrap();
    assert_eq!(lost["job_id"], found.as_str());
    assert_eq!(lost["charged"], true);
    assert_eq!(h.charged(), 4, "three other jobs and the lost one, each charged once");
    assert!(matches!(poll_until_settled(p.as_ref(), &found).await, JobState::Done(_)));
    // A marker nobody sent finds nothing.
    assert_eq!(p.find(&request("never sent")).await.unwrap(), None);
}

#[tokio::test]
async fn replicate_find_follows_pages() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    let first = request("oldest");
    let id = accepted(p.submit(&first).await.unwrap());
    for i in 0..12 {
        p.submit(&request(&format!("newer {i}"))).await.unwrap();
    }
    assert_eq!(p.find(&first).await.unwrap(), Some(id));
}

#[tokio::test]
async fn fal_submit_then_poll_to_done_and_find_proves_nothing() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::FalQueue);
    let req = request("green lamp");
    let id = accepted(p.submit(&req).await.unwrap());
    match poll_until_settled(p.as_ref(), &id).await {
        JobState::Done(img) => assert_png(&img),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.find(&req).await.unwrap(), None);
    let ledger = h.ledger();
    assert_eq!(ledger[0]["api"], "fal_queue");
    assert_eq!(ledger[0]["endpoint"], "POST /fal/{model}");
    assert_eq!(ledger[0]["job_id"], id.as_str());
    assert_eq!(ledger.last().unwrap()["endpoint"], "GET /fal/{model}/requests/{id}");
    assert_eq!(h.charged(), 1);
}

#[tokio::test]
async fn idempotency_header_replays_without_charging() {
    let h = Harness::start().await;
    let cfg =
        ProviderConfig { idempotency_header: Some("Idempotency-Key".into()), ..h.config(ProviderKind::OpenaiImages) };
    let p = providers::build(&cfg).unwrap();
    assert!(p.capabilities().idempotent_create);
    let req = request("same thing");
    let (Submitted::Done(a), Submitted::Done(b)) = (p.submit(&req).await.unwrap(), p.submit(&req).await.unwrap())
    else {
        panic!("openai is synchronous");
    };
    assert_eq!(a, b);
    let ledger = h.ledger();
    assert_eq!(ledger.len(), 2);
    assert_eq!(ledger[0]["charged"], true);
    assert_eq!(ledger[1]["charged"], false);
    assert_eq!(ledger[1]["idempotency_key"], req.idempotency_key.as_str());
    assert_eq!(ledger[0]["job_id"], ledger[1]["job_id"]);
}

#[tokio::test]
async fn expired_results_are_reported_as_expired() {
    let h = Harness::start_with(|a| a.result_ttl_s = 0).await;
    for kind in [ProviderKind::Replicate, ProviderKind::FalQueue] {
        let p = h.provider(kind);
        let id = accepted(p.submit(&request("gone soon")).await.unwrap());
        let state = poll_until_settled(p.as_ref(), &id).await;
        assert!(matches!(state, JobState::Expired), "{kind:?}: {state:?}");
    }
}

#[tokio::test]
async fn connect_refused_is_not_sent() {
    let h = Harness::start().await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg =
        ProviderConfig { base_url: Some(format!("http://127.0.0.1:{port}")), ..h.config(ProviderKind::Replicate) };
    let err = providers::build(&cfg).unwrap().submit(&request("x")).await.unwrap_err();
    assert!(matches!(err, CallError::NotSent(_)), "{err:?}");
}

#[tokio::test]
async fn reference_images_are_sent_and_counted() {
    let h = Harness::start().await;
    for (kind, n) in [(ProviderKind::OpenaiImages, 2), (ProviderKind::Replicate, 1), (ProviderKind::FalQueue, 3)] {
        let mut req = request(&format!("with {n} references"));
        req.references = vec![reference(); n];
        h.provider(kind).submit(&req).await.unwrap();
    }
    let ledger = h.ledger();
    assert_eq!(ledger[0]["endpoint"], "POST /v1/images/edits");
    let counts: Vec<_> =
        ledger.iter().map(|l| (l["reference_images"].as_u64().unwrap(), l["charged"] == true)).collect();
    assert_eq!(counts, vec![(2, true), (1, true), (3, true)]);
    assert_eq!(ledger[0]["prompt"], "with 2 references");
}

#[tokio::test]
async fn missing_api_key_is_a_config_rejection_naming_the_variable() {
    let h = Harness::start().await;
    let cfg =
        ProviderConfig { api_key_env: Some("TALLY_TEST_NO_SUCH_KEY".into()), ..h.config(ProviderKind::OpenaiImages) };
    let err = providers::build(&cfg).unwrap().submit(&request("x")).await.unwrap_err();
    match &err {
        CallError::Rejected { message, config: true } => assert!(message.contains("TALLY_TEST_NO_SUCH_KEY")),
        other => panic!("{other:?}"),
    }
    assert!(h.ledger().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn api_key_never_shows_in_debug_or_errors() {
    let h = Harness::start().await;
    h.behave(json!({"reject_status": 403})).await;
    for kind in [ProviderKind::OpenaiImages, ProviderKind::Replicate, ProviderKind::FalQueue] {
        let p = providers::build(&h.config(kind)).unwrap();
        let err = p.submit(&request("x")).await.unwrap_err();
        assert!(matches!(err, CallError::Rejected { config: true, .. }), "{err:?}");
        assert!(!format!("{err:?} {err}").contains(KEY_VALUE));
    }
    let adapter = providers::http::openai_images::OpenaiImages::new(&h.config(ProviderKind::OpenaiImages));
    let debug = format!("{adapter:?}");
    assert!(!debug.contains(KEY_VALUE), "{debug}");
    assert!(!std::fs::read_to_string(&h.ledger).unwrap().contains(KEY_VALUE));
}

#[tokio::test]
async fn no_authorization_header_is_refused_by_the_mock() {
    let h = Harness::start().await;
    let cfg = ProviderConfig { api_key_env: None, ..h.config(ProviderKind::OpenaiImages) };
    let err = providers::build(&cfg).unwrap().submit(&request("x")).await.unwrap_err();
    assert!(matches!(err, CallError::Rejected { config: true, .. }), "{err:?}");
    assert_eq!(h.charged(), 0);
}

#[tokio::test]
async fn oversize_answer_is_an_error() {
    let h = Harness::start().await;
    let cfg = ProviderConfig { max_response_bytes: 200, ..h.config(ProviderKind::OpenaiImages) };
    let err = providers::build(&cfg).unwrap().submit(&request("big")).await.unwrap_err();
    match err {
        CallError::Rejected { message, .. } => assert!(message.contains("max_response_bytes"), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn dropped_poll_is_ambiguous_and_polling_recovers() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    let id = accepted(p.submit(&request("x")).await.unwrap());
    h.behave(json!({"drop_response": true, "drop_on": "poll"})).await;
    assert!(matches!(p.poll(&id).await, Err(CallError::Ambiguous(_))));
    h.behave(json!({"drop_response": null, "drop_on": null})).await;
    assert!(matches!(poll_until_settled(p.as_ref(), &id).await, JobState::Done(_)));
    assert_eq!(h.charged(), 1);
}

#[tokio::test]
async fn timeout_after_sending_is_ambiguous_and_still_charged() {
    let h = Harness::start_with(|a| a.latency_ms = 1_000).await;
    let cfg = ProviderConfig { request_timeout: Duration::from_millis(200), ..h.config(ProviderKind::OpenaiImages) };
    let err = providers::build(&cfg).unwrap().submit(&request("slow")).await.unwrap_err();
    assert!(matches!(err, CallError::Ambiguous(_)), "{err:?}");
    // The mock writes its ledger line before the latency starts; allow a slow fsync.
    for _ in 0..100 {
        if h.charged() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(h.charged(), 1, "the mock charged before its answer was late");
}

#[tokio::test]
async fn behavior_control_route() {
    let h = Harness::start().await;
    let resp = h.behave(json!({"no_such_field": 1})).await;
    assert_eq!(resp.status(), 400);
    let resp = h.behave(json!({"latency_ms": 5, "fail_status": 502})).await;
    assert_eq!(resp.status(), 200);
    let got: Value =
        h.http.get(format!("{}/_mock/behavior", h.mock.base_url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(got["latency_ms"], 5);
    assert_eq!(got["fail_status"], 502);
    let got: Value = h.behave(json!({"fail_status": null})).await.json().await.unwrap();
    assert_eq!(got["fail_status"], Value::Null);
    assert_eq!(got["job_duration_ms"], 50, "null restores the value given at start");
    assert!(h.ledger().is_empty(), "control routes are not in the ledger");
}

#[tokio::test]
async fn build_checks_configuration_and_keeps_billing_note() {
    init();
    let demo = ProviderConfig { billing_note: Some("Billed per image by Acme.".into()), ..ProviderConfig::demo() };
    let p = providers::build(&demo).unwrap();
    assert_eq!(p.billing_note(), "Billed per image by Acme.");
    assert!(matches!(p.submit(&request("x")).await.unwrap(), Submitted::Done(_)));
    let no_url = ProviderConfig { kind: ProviderKind::Replicate, model: Some("a/b".into()), ..ProviderConfig::demo() };
    assert!(providers::build(&no_url).is_err());
    let bad_model = ProviderConfig {
        kind: ProviderKind::Replicate,
        base_url: Some("http://127.0.0.1:1".into()),
        model: Some("flux".into()),
        ..ProviderConfig::demo()
    };
    assert!(providers::build(&bad_model).err().unwrap().contains("owner/name"));
}

#[tokio::test]
async fn find_ignores_jobs_created_before_the_call() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    let mut req = request("early");
    p.submit(&req).await.unwrap();
    // The same marker, but the execution says it started calling an hour from now.
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    req.calling_at_ms = now_ms + 3_600_000;
    assert_eq!(p.find(&req).await.unwrap(), None);
    req.calling_at_ms = now_ms - 1_000;
    assert!(p.find(&req).await.unwrap().is_some());
}
