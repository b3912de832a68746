//! Each provider kind through the real daemon against a real, strict `tally mock-provider`
//! process (the README's example models: `gpt-image-2.5-flare`, a FLUX model on Replicate,
//! `fal-ai/flux/dev`), counted in the mock's ledger: success, refusal, rate limit, connection
//! refused, lost answers (create and poll), the idempotency header, expired results, and
//! shots the model cannot take refused before any paid call. (A daemon killed
//! while a job is `accepted` is the crash matrix's `after_accepted_*` cases.)

use std::time::Duration;

use crate::common::{Daemon, Mock, free_port, providers, submit, wait_for};

const SETTLED: &[&str] = &["succeeded", "failed", "unknown", "canceled"];

struct World {
    mock: Mock,
    daemon: Daemon,
}

fn world(mock_args: &[&str], extra_providers: &str) -> World {
    let mock = Mock::start(mock_args);
    let engine = "dispatch_grace_secs = 1\nmax_attempts = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 300\n";
    let mut daemon = Daemon::configure_with(engine, &format!("{}\n{extra_providers}", providers(&mock)));
    daemon.env.push(("TALLY_TEST_KEY".into(), "sk-test-providers".into()));
    daemon.spawn();
    World { mock, daemon }
}

fn tag(what: &str) -> String {
    format!("{what} {}", uuid::Uuid::new_v4().simple())
}

impl World {
    fn run(&self, provider: &str, prompt: &str) -> serde_json::Value {
        let (code, id) = submit(&self.daemon, provider, prompt, &uuid::Uuid::new_v4().to_string()).expect("submit");
        assert_eq!(code, 201);
        self.daemon.wait_status(&id, SETTLED)
    }

    fn start(&self, provider: &str, prompt: &str) -> String {
        submit(&self.daemon, provider, prompt, &uuid::Uuid::new_v4().to_string()).expect("submit").1
    }

    /// Wait until the ledger holds at least `n` lines for `prompt`.
    fn wait_lines(&self, prompt: &str, n: usize) {
        let ok = wait_for(Duration::from_secs(20), || (self.mock.count(prompt).0 >= n).then_some(()));
        assert!(ok.is_some(), "the mock never saw {n} requests for {prompt:?}");
    }

    fn events(&self, id: &str) -> Vec<String> {
        let e = self.daemon.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
        e["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str().map(String::from)).collect()
    }
}

#[test]
fn every_kind_succeeds_with_exactly_one_charge() {
    let w = world(&["--job-duration-ms", "50"], "");
    for kind in ["openai", "replicate", "fal", "idem", "dashscope"] {
        let prompt = tag(kind);
        let t = w.run(kind, &prompt);
        assert_eq!(t["status"], "succeeded", "{kind}: {t}");
        assert_eq!(w.mock.count(&prompt).1, 1, "{kind}: charged lines");
    }
}

#[test]
fn a_refusal_fails_without_a_retry() {
    let w = world(&["--reject-status", "400"], "");
    let prompt = tag("refused");
    let t = w.run("openai", &prompt);
    assert_eq!((t["status"].as_str(), t["failure_kind"].as_str()), (Some("failed"), Some("rejected")));
    assert_eq!(w.mock.count(&prompt), (1, 0), "sent once, not charged, not retried");
}

#[test]
fn a_rate_limit_is_retried_no_earlier_than_the_hint() {
    let w = world(&[], "");
    w.mock.behave(serde_json::json!({"retry_after_s": 1}));
    let prompt = tag("rate limited");
    let id = w.start("openai", &prompt);
    w.wait_lines(&prompt, 1);
    w.mock.behave(serde_json::json!({"retry_after_s": null}));
    let t = w.daemon.wait_status(&id, SETTLED);
    assert_eq!(t["status"], "succeeded");
    let lines: Vec<_> = w.mock.lines().into_iter().filter(|l| l["prompt"].as_str() == Some(prompt.as_str())).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!((lines[0]["charged"].as_bool(), lines[1]["charged"].as_bool()), (Some(false), Some(true)));
    let at = |l: &serde_json::Value| humantime::parse_rfc3339(l["ts"].as_str().expect("ts")).expect("RFC 3339 time");
    let gap = at(&lines[1]).duration_since(at(&lines[0])).expect("ordered");
    assert!(gap >= Duration::from_millis(1000), "retried after {gap:?}, before the 1 s hint");
}

#[test]
fn connection_refused_is_retried_and_never_reaches_the_ledger() {
    let dead = free_port();
    let gone = format!(
        "[[providers]]\nname = \"gone\"\nkind = \"openai_images\"\nbase_url = \"http://127.0.0.1:{dead}\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nmodel = \"m\"\nmax_concurrency = 1\nconnect_timeout_ms = 500\n"
    );
    let w = world(&[], &gone);
    let prompt = tag("nobody home");
    let t = w.run("gone", &prompt);
    assert_eq!((t["status"].as_str(), t["failure_kind"].as_str()), (Some("failed"), Some("not_sent")), "{t}");
    assert_eq!(t["attempts"], 3);
    assert_eq!(w.mock.count(&prompt), (0, 0));
}

#[test]
fn a_lost_answer_from_openai_images_is_unknown_with_one_charge() {
    let w = world(&["--drop-response"], "");
    let prompt = tag("lost sync");
    let t = w.run("openai", &prompt);
    assert_eq!(t["status"], "unknown");
    assert!(t["message"].as_str().unwrap_or("").contains("may be charged again"), "{t}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(w.mock.count(&prompt), (1, 1));
}

#[test]
fn a_lost_poll_answer_is_recovered_by_polling_again() {
    for kind in ["replicate", "fal", "dashscope"] {
        let w = world(&["--job-duration-ms", "50"], "");
        w.mock.behave(serde_json::json!({"drop_response": true, "drop_on": "poll"}));
        let prompt = tag(kind);
        let id = w.start(kind, &prompt);
        // Let at least one poll be dropped, then answer again.
        let dropped = wait_for(Duration::from_secs(20), || {
            let job = w.mock.lines().into_iter().find(|l| l["prompt"].as_str() == Some(prompt.as_str()))?;
            let job = job["job_id"].as_str()?.to_string();
            w.mock.lines().iter().any(|l| l["job_id"].as_str() == Some(&job) && l["prompt"].is_null()).then_some(())
        });
        assert!(dropped.is_some(), "{kind}: no poll reached the mock");
        w.mock.behave(serde_json::json!({"drop_response": null}));
        let t = w.daemon.wait_status(&id, SETTLED);
        assert_eq!(t["status"], "succeeded", "{kind}: {t}");
        assert_eq!(w.mock.count(&prompt), (1, 1), "{kind}: created once");
    }
}

#[test]
fn a_lost_create_answer_is_found_by_listing_or_honestly_unknown() {
    for (kind, want) in [("replicate", "succeeded"), ("fal", "unknown"), ("dashscope", "succeeded")] {
        let w = world(&["--job-duration-ms", "50"], "");
        w.mock.behave(serde_json::json!({"drop_response": true, "drop_on": "create"}));
        let prompt = tag(kind);
        let id = w.start(kind, &prompt);
        w.wait_lines(&prompt, 1);
        w.mock.behave(serde_json::json!({"drop_response": null}));
        let t = w.daemon.wait_status(&id, SETTLED);
        assert_eq!(t["status"], want, "{kind}: {t}");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(w.mock.count(&prompt).1, 1, "{kind}: never a second charge");
        if want == "succeeded" {
            assert!(w.events(&id).contains(&"accepted".to_string()));
        } else {
            // fal: the timeline says why nothing could be searched, not that a search failed.
            assert!(
                t["status_reason"].to_string().contains("no listing") || t.to_string().contains("no listing"),
                "{t}"
            );
        }
    }
}

#[test]
fn the_idempotency_header_replays_without_a_second_charge() {
    // `idem` models a gateway that honours the key; the mock ignores it unless told.
    let w = world(&["--honor-idempotency-key"], "");
    w.mock.behave(serde_json::json!({"drop_response": true, "drop_on": "create"}));
    let prompt = tag("idempotent");
    let id = w.start("idem", &prompt);
    w.wait_lines(&prompt, 1);
    w.mock.behave(serde_json::json!({"drop_response": null}));
    let t = w.daemon.wait_status(&id, SETTLED);
    assert_eq!(t["status"], "succeeded", "{t}");
    let lines: Vec<_> = w.mock.lines().into_iter().filter(|l| l["prompt"].as_str() == Some(prompt.as_str())).collect();
    assert!(lines.len() >= 2, "the replay reached the mock");
    assert_eq!(lines.iter().filter(|l| l["charged"] == true).count(), 1);
    let keys: std::collections::HashSet<_> = lines.iter().map(|l| l["idempotency_key"].to_string()).collect();
    assert_eq!(keys.len(), 1, "every replay carried the same key");
}

#[test]
fn an_expired_result_says_so() {
    let w = world(&["--job-duration-ms", "50", "--result-ttl-s", "0"], "");
    let prompt = tag("expired");
    let t = w.run("replicate", &prompt);
    assert_eq!((t["status"].as_str(), t["failure_kind"].as_str()), (Some("failed"), Some("expired")), "{t}");
    assert!(
        t["message"].as_str().unwrap_or("").contains("generated and charged, but the image expired at the provider"),
        "{t}"
    );
    assert_eq!(t["charge"]["state"], "charged", "{t}");
    assert_eq!(w.mock.count(&prompt), (1, 1));
}

/// `(start, end)` of the charged create requests whose prompt contains `tag`, from the
/// mock's ledger (`ts` is when the request arrived; the mock answers `latency_ms` later).
fn intervals(mock: &Mock, tag: &str, latency: Duration) -> Vec<(std::time::SystemTime, std::time::SystemTime)> {
    let mut v: Vec<_> = mock
        .lines()
        .into_iter()
        .filter(|l| l["charged"] == true && l["prompt"].as_str().is_some_and(|p| p.contains(tag)))
        .map(|l| {
            let t = humantime::parse_rfc3339(l["ts"].as_str().expect("ts")).expect("RFC 3339 time");
            (t, t + latency)
        })
        .collect();
    v.sort();
    v
}

fn create_set(d: &Daemon, tag: &str, shots: usize, provider: &str) -> String {
    let shots: Vec<_> = (0..shots)
        .map(
            |i| serde_json::json!({"role": if i == 0 { "main" } else { "scene" }, "prompt": format!("shot {i} {tag}")}),
        )
        .collect();
    let body = serde_json::json!({"product": "mug", "shots": shots, "provider": provider});
    let r = d.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    r.json()["id"].as_str().expect("set id").to_string()
}

fn wait_set(d: &Daemon, id: &str) -> serde_json::Value {
    wait_for(Duration::from_secs(60), || {
        let s = d.call("GET", &format!("/v1/sets/{id}"), None).json();
        (s["status"] != "running").then_some(s)
    })
    .unwrap_or_else(|| panic!("set {id} never settled"))
}

#[test]
fn sets_and_single_tasks_interleave_one_shot_at_a_time_per_set() {
    let latency = Duration::from_millis(150);
    let w = world(&["--latency-ms", "150"], "");
    let (ta, tb) = (tag("set-a"), tag("set-b"));
    let a = create_set(&w.daemon, &ta, 4, "openai");
    let b = create_set(&w.daemon, &tb, 4, "openai");
    let single = tag("single");
    let id = w.start("openai", &single);
    assert_eq!(wait_set(&w.daemon, &a)["status"], "done");
    assert_eq!(wait_set(&w.daemon, &b)["status"], "done");
    assert_eq!(w.daemon.wait_status(&id, SETTLED)["status"], "succeeded");
    let (ia, ib) = (intervals(&w.mock, &ta, latency), intervals(&w.mock, &tb, latency));
    assert_eq!((ia.len(), ib.len()), (4, 4), "each shot charged exactly once");
    for iv in [&ia, &ib] {
        for pair in iv.windows(2) {
            assert!(pair[1].0 >= pair[0].1, "two shots of one set overlapped at the provider");
        }
    }
    assert!(ib[0].0 < ia[3].0 && ia[0].0 < ib[3].0, "one set ran all its shots before the other started");
    assert_eq!(w.mock.count(&single).1, 1);
}

#[test]
fn an_unknown_shot_does_not_stop_the_next_and_cancel_sends_nothing_more() {
    let w = world(&["--latency-ms", "300"], "");
    // Shot 1 ends unknown (its answer is dropped); the rest of the set still runs.
    let t1 = tag("set-unknown");
    w.mock.behave(serde_json::json!({"drop_response": true}));
    let s1 = create_set(&w.daemon, &t1, 3, "openai");
    w.wait_lines(&t1, 1);
    w.mock.behave(serde_json::json!({"drop_response": null}));
    let done = wait_set(&w.daemon, &s1);
    assert_eq!(done["status"], "done_with_problems");
    assert_eq!(done["progress"], "2 of 3 done, 1 unknown");
    assert_eq!(w.mock.count(&t1).1, 3, "every shot charged once");

    // Cancel while the first shot is at the provider: it finishes, no later shot is sent.
    let t2 = tag("set-cancel");
    let s2 = create_set(&w.daemon, &t2, 4, "openai");
    w.wait_lines(&t2, 1);
    let r = w.daemon.call("POST", &format!("/v1/sets/{s2}/cancel"), Some(&serde_json::json!({})));
    assert_eq!(r.status, 200);
    let done = wait_set(&w.daemon, &s2);
    assert_eq!(
        (done["status"].as_str(), done["progress"].as_str()),
        (Some("canceled"), Some("1 of 4 done, 3 canceled"))
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(w.mock.count(&t2), (1, 1), "no later shot was ever sent");
}

#[test]
fn a_shot_with_photos_on_a_model_without_image_input_is_refused_before_any_paid_call() {
    let w = world(&[], "");
    let tag = tag("photos on flux-schnell");
    let auth = format!("Bearer {}", w.daemon.token());
    let up = crate::common::request(
        w.daemon.port,
        "POST",
        "/v1/uploads",
        &[("Authorization", auth.as_str()), ("Content-Type", "image/png")],
        Some(&tally::render::placeholder_png("front", 16)),
    );
    assert!(up.status < 300, "upload: {}", String::from_utf8_lossy(&up.body));
    let upload = up.json()["id"].as_str().expect("upload id").to_string();
    let body = serde_json::json!({"product": "mug", "references": [upload], "provider": "replicate",
        "shots": [{"role": "main", "prompt": format!("main {tag}")}]});
    let r = w.daemon.call("POST", "/v1/sets", Some(&body));
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let set = wait_set(&w.daemon, r.json()["id"].as_str().expect("set id"));
    let task = &set["shots"][0];
    assert_eq!(task["status"], "failed", "{set}");
    assert!(task.to_string().contains("takes no reference images"), "{task}");
    assert_eq!(task["attempts"], 0, "nothing was sent, so no attempt was counted: {task}");
    assert_eq!(w.mock.count(&tag), (0, 0), "no create reached the provider");
}

#[test]
fn providers_say_which_can_find_a_lost_create() {
    let w = world(&[], "");
    let list = w.daemon.call("GET", "/v1/providers", None).json();
    let caps = |name: &str| {
        list["providers"].as_array().expect("providers").iter().find(|p| p["name"] == name).expect(name)["capabilities"]
            .clone()
    };
    assert_eq!(caps("replicate")["finds_lost_creates"], true);
    assert_eq!(
        (caps("fal")["lookup"].as_bool(), caps("fal")["finds_lost_creates"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(caps("openai")["finds_lost_creates"], false);
    assert_eq!(
        (caps("dashscope")["lookup"].as_bool(), caps("dashscope")["finds_lost_creates"].as_bool()),
        (Some(true), Some(true))
    );
    let ds = list["providers"].as_array().expect("providers").iter().find(|p| p["name"] == "dashscope").cloned();
    let ds = ds.expect("dashscope");
    assert_eq!(ds["kind"], "dashscope");
    assert!(ds["billing_note"].as_str().unwrap_or("").contains("only images that were generated successfully"), "{ds}");
    assert_eq!(caps("gemini")["finds_lost_creates"], false);
    assert_eq!(caps("gembatch")["finds_lost_creates"], true);
    assert_eq!(
        (caps("bfl")["lookup"].as_bool(), caps("bfl")["finds_lost_creates"].as_bool()),
        (Some(true), Some(false))
    );
}

/// DashScope bills successful images only: a task it reports FAILED ends `failed` and is
/// recorded as not charged; an account out of credit (`Arrearage`) fails at once as a
/// configuration problem, not retried.
#[test]
fn dashscope_failures_say_what_they_cost() {
    let w = world(&["--job-duration-ms", "50"], "");
    w.mock.behave(
        serde_json::json!({"job_error": "DataInspectionFailed: Output data may contain inappropriate content."}),
    );
    let prompt = tag("dashscope failed");
    let t = w.run("dashscope", &prompt);
    assert_eq!((t["status"].as_str(), t["failure_kind"].as_str()), (Some("failed"), Some("rejected")), "{t}");
    assert!(t.to_string().contains("DataInspectionFailed"), "{t}");
    assert_ne!(t["charge"]["state"], "possible", "a failed DashScope task is not billed: {t}");
    assert_ne!(t["charge"]["state"], "charged", "{t}");
    assert_eq!(w.mock.count(&prompt), (1, 0), "sent once, not charged");

    w.mock.behave(serde_json::json!({"job_error": null, "reject_status": 400, "error_code": "Arrearage"}));
    let prompt = tag("dashscope arrears");
    let t = w.run("dashscope", &prompt);
    assert_eq!((t["status"].as_str(), t["failure_kind"].as_str()), (Some("failed"), Some("configuration")), "{t}");
    assert!(t.to_string().contains("out of credit"), "{t}");
    assert_eq!(w.mock.count(&prompt), (1, 0), "not retried: it cannot succeed until credit is added");
}

/// The Gemini and BFL kinds (`gemini`, `gembatch` = Gemini's Batch API, `bfl`): one image and
/// one charge each, through the real daemon.
#[test]
fn gemini_and_bfl_succeed_with_exactly_one_charge() {
    let w = world(&["--job-duration-ms", "50"], "");
    for kind in ["gemini", "gembatch", "bfl"] {
        let prompt = tag(kind);
        let t = w.run(kind, &prompt);
        assert_eq!(t["status"], "succeeded", "{kind}: {t}");
        assert_eq!(t["artifacts"].as_array().map(Vec::len), Some(1), "{kind}: {t}");
        assert_eq!(w.mock.count(&prompt).1, 1, "{kind}: charged lines");
        if kind != "gemini" {
            assert!(w.events(t["id"].as_str().unwrap_or("")).contains(&"accepted".to_string()), "{kind}");
        }
    }
}

/// A lost create answer: a Gemini batch is found by listing batches by its display name and
/// finishes; a lost `generateContent` answer and a lost BFL create cannot be found, so they end
/// `unknown` — each with exactly one charge and no resend.
#[test]
fn a_lost_gemini_or_bfl_create_is_found_by_listing_batches_or_unknown_without_a_resend() {
    for (kind, want) in [("gembatch", "succeeded"), ("gemini", "unknown"), ("bfl", "unknown")] {
        let w = world(&["--job-duration-ms", "50"], "");
        w.mock.behave(serde_json::json!({"drop_response": true, "drop_on": "create"}));
        let prompt = tag(kind);
        let id = w.start(kind, &prompt);
        w.wait_lines(&prompt, 1);
        w.mock.behave(serde_json::json!({"drop_response": null, "drop_on": null}));
        let t = w.daemon.wait_status(&id, SETTLED);
        assert_eq!(t["status"], want, "{kind}: {t}");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(w.mock.count(&prompt), (1, 1), "{kind}: sent once, charged once, never resent");
        let lines = w.mock.lines();
        let listed = lines.iter().filter(|l| l["endpoint"] == "GET /gemini/{version}/batches").count();
        if kind == "gembatch" {
            assert!(listed >= 1, "found by listing batches");
            assert!(w.events(&id).contains(&"accepted".to_string()));
        } else {
            assert_eq!(listed, 0, "{kind}: nothing to list");
            assert!(t["message"].as_str().unwrap_or("").contains("may be charged again"), "{kind}: {t}");
        }
    }
}

/// Refusals in plain words, with honest charge evidence: Gemini's blocked prompt was answered
/// (its prompt tokens may be billed); BFL documents that it does not charge moderated requests.
#[test]
fn blocked_and_moderated_prompts_are_refusals_with_honest_charges() {
    let w = world(&["--job-duration-ms", "50", "--moderation", "prompt"], "");
    for (kind, charge, words) in [
        ("gemini", "possible", "Gemini blocked the prompt"),
        ("gembatch", "possible", "Gemini blocked the prompt"),
        ("bfl", "refused", "moderation"),
    ] {
        let prompt = tag(kind);
        let t = w.run(kind, &prompt);
        assert_eq!(
            (t["status"].as_str(), t["failure_kind"].as_str()),
            (Some("failed"), Some("rejected")),
            "{kind}: {t}"
        );
        assert_eq!(t["charge"]["state"], charge, "{kind}: {t}");
        assert!(t.to_string().contains(words), "{kind}: {t}");
        assert_eq!(t["attempts"], 1, "{kind}: not retried: {t}");
    }
}

/// A BFL job accepted before a crash is polled after the restart (its id and polling_url
/// were persisted at `accepted`) and its image fetched within the 10 minutes the sample URL is
/// signed for: succeeded, one charge.
#[test]
fn a_bfl_result_is_fetched_after_a_restart() {
    let mut w = world(&["--job-duration-ms", "3000"], "");
    let prompt = tag("bfl restart");
    let id = w.start("bfl", &prompt);
    let accepted = wait_for(Duration::from_secs(20), || w.events(&id).contains(&"accepted".to_string()).then_some(()));
    assert!(accepted.is_some(), "the job was never accepted");
    w.daemon.kill();
    // The job finishes at BFL while tally is down.
    std::thread::sleep(Duration::from_millis(3200));
    w.daemon.spawn();
    let t = w.daemon.wait_status(&id, SETTLED);
    assert_eq!(t["status"], "succeeded", "{t}");
    assert_eq!(w.mock.count(&prompt), (1, 1), "created once");
    let job = w.mock.lines().into_iter().find(|l| l["prompt"].as_str() == Some(prompt.as_str())).expect("create line");
    let polls_after = w
        .mock
        .lines()
        .iter()
        .filter(|l| l["job_id"] == job["job_id"] && l["endpoint"] == "GET /bfl/v1/get_result")
        .count();
    assert!(polls_after >= 1, "polled by the persisted handle");
    assert!(w.events(&id).iter().any(|e| e == "resumed"), "{:?}", w.events(&id));
}
