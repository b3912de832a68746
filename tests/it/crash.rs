//! The crash matrix (DESIGN §9): for each crash point × each provider kind, run the real
//! binary against a real `tally mock-provider`, let the crash point abort the daemon, restart
//! it without crash points, and assert the outside world: the final status, the mock's
//! ledger of charged requests, `tally check`, and the recovery in the timeline.
//!
//! Needs a binary built with `--features failpoints` (the README's test command does that).

use std::process::Command;
use std::time::Duration;

use crate::common::{Daemon, EXE, Mock, providers, try_request, wait_for};

/// Submit with an idempotency key; `None` if the daemon died before answering.
pub fn submit(d: &Daemon, provider: &str, prompt: &str, key: &str) -> Option<(u16, String)> {
    let body = serde_json::json!({"prompt": prompt, "provider": provider, "idempotency_key": key}).to_string();
    let auth = format!("Bearer {}", d.token());
    let r = try_request(
        d.port,
        "POST",
        "/v1/tasks",
        &[("Authorization", auth.as_str()), ("Content-Type", "application/json")],
        Some(body.as_bytes()),
    )?;
    let id = r.json()["id"].as_str()?.to_string();
    Some((r.status, id))
}

/// What a crash at `point` must end in for a provider `kind`, and how many charged ledger
/// lines are allowed (DESIGN §6).
fn expected(point: &str, kind: &str) -> (&'static str, usize, Option<&'static str>) {
    let sync = kind == "openai";
    match point {
        "after-submit" => ("succeeded", 1, None),
        "after-sent" => ("succeeded", 1, Some("requeued")),
        "after-claim" => ("succeeded", 1, Some("abandoned")),
        // `calling` committed, nothing sent: only a replay with the same key may send it;
        // a listing that shows nothing proves nothing, so lookup kinds end unknown too.
        "after-calling" if kind == "idem" => ("succeeded", 1, Some("resumed")),
        "after-calling" => ("unknown", 0, Some("unknown")),
        "after-accepted" => ("succeeded", 1, Some("resumed")),
        "after-answer" if sync => ("unknown", 1, Some("unknown")),
        "after-answer" => ("succeeded", 1, Some("resumed")),
        "after-artifact" => ("succeeded", 1, Some("recovered")),
        other => panic!("no expectation for {other}"),
    }
}

fn engine_section() -> &'static str {
    "dispatch_grace_secs = 1\nmax_attempts = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 500\n"
}

/// One cell of the matrix.
pub fn crash_case(point: &str, kind: &str) {
    let mock = Mock::start(&["--job-duration-ms", "50"]);
    let mut d = Daemon::configure_with(engine_section(), &providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-crash".into()));
    d.env.push(("FAILPOINTS".into(), format!("{point}=return")));
    d.spawn();
    let prompt = format!("crash {point} {kind} {}", uuid::Uuid::new_v4());
    let key = uuid::Uuid::new_v4().to_string();
    let first = submit(&d, kind, &prompt, &key);
    let exited = wait_for(Duration::from_secs(30), || d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()));
    let status =
        exited.unwrap_or_else(|| panic!("{point}/{kind}: the crash point never fired; stderr:\n{}", d.stderr()));
    assert!(!status.success(), "{point}/{kind}: the daemon exited cleanly instead of crashing");
    d.child = None;

    d.env.retain(|(k, _)| k != "FAILPOINTS");
    d.spawn();
    // The client retries a submit whose answer it may have lost, with the same key.
    let (code, id) = submit(&d, kind, &prompt, &key).expect("the restarted daemon answers");
    assert_eq!(code, 200, "{point}/{kind}: resubmitting with the same key must return the existing task");
    if let Some((_, first_id)) = first {
        assert_eq!(first_id, id, "{point}/{kind}: the same key named another task");
    }

    let (want, charged_allowed, recovery) = expected(point, kind);
    let task = d.wait_status(&id, &["succeeded", "failed", "unknown", "canceled"]);
    assert_eq!(task["status"], want, "{point}/{kind}: final status; task: {task}");
    // Give any (wrong) resend a moment to reach the ledger before counting.
    std::thread::sleep(Duration::from_millis(300));
    let (lines, charged) = mock.count(&prompt);
    assert_eq!(charged, charged_allowed, "{point}/{kind}: charged requests ({lines} ledger lines)");
    if want == "succeeded" {
        let art = &task["artifacts"][0];
        let url = art["url"].as_str().expect("artifact url");
        let body = d.call("GET", url, None).body;
        assert_eq!(crate::common::sha256_hex(&body), art["sha256"].as_str().unwrap_or(""), "{point}/{kind}");
    }
    let events = d.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
    let kinds: Vec<&str> =
        events["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str()).collect();
    if let Some(r) = recovery {
        assert!(kinds.contains(&r), "{point}/{kind}: the timeline does not show `{r}`: {kinds:?}");
    }
    let status = d.term();
    assert!(status.success(), "{point}/{kind}: clean stop failed");
    let check = Command::new(EXE).args(["check", "--config"]).arg(&d.config).output().expect("check runs");
    assert!(check.status.success(), "{point}/{kind}: tally check failed:\n{}", String::from_utf8_lossy(&check.stdout));
}

macro_rules! matrix {
    ($($name:ident: $point:literal, $kind:literal;)*) => {
        $(#[test] fn $name() { crash_case($point, $kind); })*
    };
}

matrix! {
    after_submit_openai: "after-submit", "openai";
    after_submit_replicate: "after-submit", "replicate";
    after_submit_fal: "after-submit", "fal";
    after_submit_idem: "after-submit", "idem";
    after_sent_openai: "after-sent", "openai";
    after_sent_replicate: "after-sent", "replicate";
    after_sent_fal: "after-sent", "fal";
    after_sent_idem: "after-sent", "idem";
    after_claim_openai: "after-claim", "openai";
    after_claim_replicate: "after-claim", "replicate";
    after_claim_fal: "after-claim", "fal";
    after_claim_idem: "after-claim", "idem";
    after_calling_openai: "after-calling", "openai";
    after_calling_replicate: "after-calling", "replicate";
    after_calling_fal: "after-calling", "fal";
    after_calling_idem: "after-calling", "idem";
    after_accepted_replicate: "after-accepted", "replicate";
    after_accepted_fal: "after-accepted", "fal";
    after_answer_openai: "after-answer", "openai";
    after_answer_replicate: "after-answer", "replicate";
    after_answer_fal: "after-answer", "fal";
    after_answer_idem: "after-answer", "idem";
    after_artifact_openai: "after-artifact", "openai";
    after_artifact_replicate: "after-artifact", "replicate";
    after_artifact_fal: "after-artifact", "fal";
    after_artifact_idem: "after-artifact", "idem";
}
