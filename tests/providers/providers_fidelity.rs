//! Issue 25's defects, each against a real `tally mock-provider` in the provider's documented
//! behaviour, through the real daemon and counted in the mock's ledger:
//! 1. a result download that fails first (404 or 5xx from the file host) is retried within
//!    the provider's retention, and a result that never downloads is not called "expired";
//! 2. fal: a `COMPLETED` request whose result answers a 5xx marked `X-Fal-Retryable: false`
//!    fails at once, not charged (fal does not bill server errors);
//! 3. `params.n = 2` is refused at submit, before anything is sent;
//! 4. a 429 is not an attempt, `Retry-After` is read in every form, rate-limited jobs come
//!    back paced and spread;
//! 5. an account out of credit fails at once as a configuration problem, nothing charged;
//! 6. wording: fal's 422 list as sentences, a Replicate prediction canceled at Replicate, the
//!    logs of a prediction that failed without an error.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::common::{Daemon, Mock, providers, submit};

const SETTLED: &[&str] = &["succeeded", "failed", "unknown", "canceled"];

struct World {
    mock: Mock,
    daemon: Daemon,
}

/// A mock and a daemon with the four standard providers; `engine` adds engine settings.
fn world(engine: &str) -> World {
    let mock = Mock::start(&["--job-duration-ms", "50"]);
    let engine =
        format!("dispatch_grace_secs = 1\nmax_attempts = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 300\n{engine}");
    let mut daemon = Daemon::configure_with(&engine, &providers(&mock));
    daemon.env.push(("TALLY_TEST_KEY".into(), "sk-test-fidelity".into()));
    daemon.spawn();
    World { mock, daemon }
}

fn tag(what: &str) -> String {
    format!("{what} {}", uuid::Uuid::new_v4().simple())
}

impl World {
    fn start(&self, provider: &str, prompt: &str) -> String {
        let (code, id) = submit(&self.daemon, provider, prompt, &uuid::Uuid::new_v4().to_string()).expect("submit");
        assert_eq!(code, 201);
        id
    }

    fn run(&self, provider: &str, prompt: &str) -> Value {
        let id = self.start(provider, prompt);
        self.daemon.wait_status(&id, SETTLED)
    }

    /// The ledger lines whose prompt is `prompt`, in order.
    fn lines(&self, prompt: &str) -> Vec<Value> {
        self.mock.lines().into_iter().filter(|l| l["prompt"].as_str() == Some(prompt)).collect()
    }
}

fn ts(line: &Value) -> SystemTime {
    humantime::parse_rfc3339(line["ts"].as_str().expect("ts")).expect("RFC 3339 time")
}

fn message(t: &Value) -> String {
    format!("{} {}", t["message"].as_str().unwrap_or(""), t["reason"].as_str().unwrap_or(""))
}

/// Defect 1: the result's file host answers 404, then 503, before it serves the image: every
/// kind that downloads a result (Replicate outputs, fal media, OpenAI URL answers) retries
/// and succeeds, charged once, instead of writing the paid image off as "expired".
#[test]
fn a_result_download_that_fails_first_is_retried_for_every_kind() {
    let w = world("");
    w.mock.behave(json!({"openai_url_answers": true}));
    for (kind, status) in [("replicate", 404), ("fal", 404), ("openai", 404), ("replicate", 503), ("fal", 502)] {
        w.mock.behave(json!({"result_fetch_failures": 2, "result_fetch_status": status}));
        let prompt = tag(&format!("blip {kind} {status}"));
        let t = w.run(kind, &prompt);
        assert_eq!(t["status"], "succeeded", "{kind} after two {status}s: {t}");
        assert_eq!(t["artifacts"].as_array().map(Vec::len), Some(1), "{t}");
        assert_eq!(w.mock.count(&prompt), (1, 1), "{kind}: one create, charged once");
        let left = w.mock.behavior()["result_fetch_failures"].as_u64();
        assert_eq!(left, Some(0), "{kind}: both failing downloads were asked for");
    }
}

/// Defect 1: a result whose file host keeps failing within the provider's retention ends at
/// the recovery deadline as "could not be downloaded", charged — never "expired".
#[test]
fn a_result_that_never_downloads_is_not_called_expired() {
    let w = world("recovery_deadline_secs = 3\n");
    w.mock.behave(json!({"result_fetch_failures": 100_000, "result_fetch_status": 404}));
    for kind in ["replicate", "fal"] {
        let prompt = tag(&format!("never {kind}"));
        let t = w.run(kind, &prompt);
        let words = message(&t);
        assert_eq!((t["status"].as_str(), t["failure_kind"].as_str()), (Some("failed"), Some("invalid_result")), "{t}");
        assert!(words.contains("could not be downloaded"), "{kind}: {words}");
        assert!(!words.contains("expired at the provider"), "{kind}: a blip is not an expiry: {words}");
        assert_eq!(t["charge"]["state"], "charged", "{t}");
        assert_eq!(w.mock.count(&prompt), (1, 1));
    }
}

/// Defect 2: fal answers a `COMPLETED` request's result with a 500 marked
/// `X-Fal-Retryable: false`; fal documents that server errors are not billed. The task fails
/// at once (not at the hour-long recovery deadline), and says nothing was charged.
#[test]
fn a_final_fal_server_error_fails_at_once_and_uncharged() {
    let w = world("recovery_deadline_secs = 600\n");
    w.mock.behave(json!({"fal_result_not_retryable": true}));
    let prompt = tag("fal final 500");
    let started = std::time::Instant::now();
    let t = w.run("fal", &prompt);
    assert!(started.elapsed() < Duration::from_secs(20), "settled after {:?}", started.elapsed());
    assert_eq!((t["status"].as_str(), t["failure_kind"].as_str()), (Some("failed"), Some("rejected")), "{t}");
    assert_eq!(t["charge"]["state"], "refused", "fal does not bill a server error: {t}");
    assert!(message(&t).contains("does not charge"), "{t}");
    assert!(!message(&t).contains("possibly charged"), "{t}");
}

/// Defect 3: asking for several images per task is refused at submit, with the reason, and
/// nothing reaches the provider.
#[test]
fn several_images_per_task_are_refused_before_anything_is_sent() {
    let w = world("");
    for (provider, params) in
        [("openai", json!({"n": 2})), ("replicate", json!({"num_outputs": 4})), ("fal", json!({"num_images": 2}))]
    {
        let prompt = tag("two images");
        let body = json!({"prompt": prompt, "provider": provider, "params": params});
        let r = w.daemon.call("POST", "/v1/tasks", Some(&body));
        assert_eq!(r.status, 422, "{provider}: {}", String::from_utf8_lossy(&r.body));
        let text = String::from_utf8_lossy(&r.body).to_string();
        assert!(text.contains("exactly one image"), "{text}");
        assert_eq!(w.mock.count(&prompt), (0, 0), "nothing sent");
    }
    let ok = json!({"prompt": tag("one image"), "provider": "openai", "params": {"n": 1}});
    assert_eq!(w.daemon.call("POST", "/v1/tasks", Some(&ok)).status, 201, "n = 1 is what tally does anyway");
}

/// Defect 4: four jobs told `Retry-After: 3` with `x-ratelimit-remaining-requests: 0` wait the
/// whole hint, come back spread out (jitter, and the provider held until the reset), each as
/// its first attempt, and all succeed.
#[test]
fn rate_limited_jobs_wait_paced_and_spread() {
    let w = world("");
    w.mock.behave(json!({"retry_after_s": 3, "ratelimit_headers": true, "rate_limit_times": 4}));
    let prompts: Vec<String> = (0..4).map(|i| tag(&format!("paced {i}"))).collect();
    let ids: Vec<String> = prompts.iter().map(|p| w.start("openai", p)).collect();
    let done: Vec<Value> = ids.iter().map(|id| w.daemon.wait_status(id, SETTLED)).collect();
    let mut resent = Vec::new();
    let first_429 = prompts.iter().map(|p| ts(&w.lines(p)[0])).min().expect("four");
    for ((t, prompt), _) in done.iter().zip(&prompts).zip(&ids) {
        assert_eq!(t["status"], "succeeded", "{t}");
        assert_eq!(t["attempts"], 1, "a 429 is not an attempt: {t}");
        let lines = w.lines(prompt);
        assert_eq!(lines.len(), 2, "one 429, one success: {lines:?}");
        assert_eq!((lines[0]["charged"].as_bool(), lines[1]["charged"].as_bool()), (Some(false), Some(true)));
        let again = ts(&lines[1]);
        let gap = again.duration_since(ts(&lines[0])).expect("ordered");
        assert!(gap >= Duration::from_secs(3), "resent after {gap:?}, before the 3 s hint");
        assert_eq!(lines[0]["idempotency_key"], lines[1]["idempotency_key"], "the refused request's key is reused");
        resent.push(again.duration_since(first_429).expect("after"));
    }
    resent.sort();
    let spread = resent[3] - resent[0];
    assert!(spread >= Duration::from_millis(100), "all four came back within {spread:?}: {resent:?}");
}

/// Defect 4: a lasting rate limit does not use up `max_attempts` (3 here): six 429s in a row,
/// then the job goes through as its first attempt.
#[test]
fn a_lasting_rate_limit_waits_instead_of_failing() {
    let w = world("");
    w.mock.behave(json!({"retry_after_ms": 150, "retry_after_form": "retry_after_ms", "rate_limit_times": 6}));
    let prompt = tag("lasting 429");
    let t = w.run("openai", &prompt);
    assert_eq!((t["status"].as_str(), t["attempts"].as_i64()), (Some("succeeded"), Some(1)), "{t}");
    assert_eq!(w.mock.count(&prompt), (7, 1), "six refusals, one charged success");
}

/// Defect 4: a success whose headers say the request quota is used up
/// (`x-ratelimit-remaining-requests: 0`, reset 1.5 s) holds the provider: the next task's
/// create waits for the reset instead of being sent into a certain 429.
#[test]
fn a_used_up_quota_holds_the_provider_until_its_reset() {
    let w = world("");
    w.mock.behave(json!({"ratelimit_exhausted_ms": 1500}));
    let first = tag("quota first");
    assert_eq!(w.run("openai", &first)["status"], "succeeded");
    let second = tag("quota second");
    let t = w.run("openai", &second);
    assert_eq!((t["status"].as_str(), t["attempts"].as_i64()), (Some("succeeded"), Some(1)), "{t}");
    assert_eq!(w.mock.count(&second), (1, 1), "no 429: the create waited for the reset");
    let gap = ts(&w.lines(&second)[0]).duration_since(ts(&w.lines(&first)[0])).expect("ordered");
    assert!(gap >= Duration::from_millis(1500), "sent {gap:?} after the used-up quota, before its reset");
}

/// Defect 4: a "not now" on the free schema read Replicate needs before a create hands the
/// claim back (nothing sent, no attempt, due after the wait) instead of failing the task as
/// "not sent" after three quick tries.
#[test]
fn a_rate_limited_schema_read_waits_instead_of_failing() {
    let w = world("");
    w.mock.behave(json!({"retry_after_ms": 400, "rate_limit_meta": true, "rate_limit_times": 3}));
    let prompt = tag("schema 429");
    let t = w.run("replicate", &prompt);
    assert_eq!((t["status"].as_str(), t["attempts"].as_i64()), (Some("succeeded"), Some(1)), "{t}");
    assert_eq!(w.mock.count(&prompt), (1, 1), "one create, charged once");
    assert_eq!(w.mock.behavior()["rate_limit_times"], 0, "the three 429s were given");
}

/// Defect 4: `Retry-After` in each documented form — fractional seconds, an HTTP date,
/// `retry-after-ms`, and only the used-up rate-limit headers — is waited out in full.
#[test]
fn every_form_of_retry_after_is_waited_out() {
    let w = world("");
    for form in ["fractional", "http_date", "retry_after_ms", "reset"] {
        w.mock.behave(json!({"retry_after_ms": 1500, "retry_after_form": form, "rate_limit_times": 1}));
        let prompt = tag(&format!("form {form}"));
        let t = w.run("openai", &prompt);
        assert_eq!(t["status"], "succeeded", "{form}: {t}");
        let lines = w.lines(&prompt);
        assert_eq!(lines.len(), 2, "{form}: {lines:?}");
        let gap = ts(&lines[1]).duration_since(ts(&lines[0])).expect("ordered");
        assert!(gap >= Duration::from_millis(1500), "{form}: resent after {gap:?}, before the 1.5 s it was told");
    }
}

/// Defect 5: an account out of credit (OpenAI 429 `insufficient_quota`, Replicate 402, fal's
/// exhausted balance) fails at once as a configuration problem, in plain words, not charged,
/// and is never retried.
#[test]
fn an_account_out_of_credit_fails_at_once() {
    let w = world("");
    w.mock.behave(json!({"out_of_credit": true}));
    for kind in ["openai", "replicate", "fal"] {
        let prompt = tag(&format!("broke {kind}"));
        let t = w.run(kind, &prompt);
        assert_eq!(
            (t["status"].as_str(), t["failure_kind"].as_str()),
            (Some("failed"), Some("configuration")),
            "{kind}: {t}"
        );
        assert!(message(&t).contains("out of credit"), "{kind}: {t}");
        assert_eq!(t["attempts"], 1, "{kind}: not retried: {t}");
        assert_eq!(t["charge"]["state"], "refused", "{kind}: {t}");
        assert_eq!(w.mock.count(&prompt), (1, 0), "{kind}: sent once, not charged");
    }
}

/// Defect 6: fal's validation list is shown as sentences, not JSON.
#[test]
fn a_fal_validation_list_reads_as_sentences() {
    let w = world("");
    let prompt = tag("fal 422");
    let body = json!({"prompt": prompt, "provider": "fal", "params": {"num_inference_steps": 0}});
    let r = w.daemon.call("POST", "/v1/tasks", Some(&body));
    assert_eq!(r.status, 201);
    let id = r.json()["id"].as_str().expect("id").to_string();
    let t = w.daemon.wait_status(&id, SETTLED);
    let words = message(&t);
    assert_eq!(t["failure_kind"], "rejected", "{t}");
    assert!(words.contains("`num_inference_steps`: Input should be"), "{words}");
    assert!(!words.contains("[{") && !words.contains("\"loc\""), "raw JSON shown: {words}");
}

/// Defect 6: a prediction canceled at Replicate (not by tally) says so in plain words, with
/// what Replicate bills; a prediction that failed with `error: null` shows its last log lines.
#[test]
fn replicate_cancels_and_silent_failures_are_explained() {
    let w = world("");
    w.mock.behave(json!({"job_canceled": true, "job_duration_ms": 400}));
    let prompt = tag("canceled there");
    let t = w.run("replicate", &prompt);
    let words = message(&t);
    assert_eq!(t["status"], "failed", "canceled at the provider is not a tally cancel: {t}");
    assert!(words.contains("canceled at Replicate") && words.contains("not by tally"), "{words}");
    assert!(!words.contains("failed: prediction canceled"), "{words}");
    assert_eq!(t["charge"]["state"], "possible", "Replicate bills the time it ran: {t}");

    w.mock.behave(json!({"job_canceled": null, "job_failure_logs": "loading weights\nCUDA error: out of memory"}));
    let prompt = tag("silent failure");
    let t = w.run("replicate", &prompt);
    let words = message(&t);
    assert_eq!(t["status"], "failed", "{t}");
    assert!(words.contains("CUDA error: out of memory"), "the logs are shown: {words}");
}
