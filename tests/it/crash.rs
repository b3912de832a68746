//! The crash matrix (DESIGN §9): for each crash point × each provider kind, run the real
//! binary against a real `tally mock-provider`, let the crash point abort the daemon, restart
//! it without crash points, and assert the outside world: the final status, the mock's
//! ledger of charged requests, `tally check`, and the recovery in the timeline.
//!
//! Needs a binary built with `--features failpoints` (the README's test command does that).

use std::process::Command;
use std::time::Duration;

use crate::common::{Daemon, EXE, Mock, providers, submit, wait_for};

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
    let mock = Mock::start(&["--job-duration-ms", "50", "--honor-idempotency-key"]);
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

/// Ledger lines of a tag that started a paid generation, oldest first.
fn charged_lines(mock: &Mock, tag: &str) -> Vec<serde_json::Value> {
    mock.lines()
        .into_iter()
        .filter(|l| l["charged"] == true && l["prompt"].as_str().is_some_and(|p| p.contains(tag)))
        .collect()
}

#[test]
fn a_set_made_with_the_cli_survives_a_kill_mid_set() {
    let mock = Mock::start(&["--latency-ms", "800"]);
    let mut d = Daemon::configure_with(engine_section(), &providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-sets".into()));
    d.spawn();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut args: Vec<String> = vec!["set".into(), "create".into(), "--product".into(), "red sneaker".into()];
    for (i, colour) in ["red", "white"].iter().enumerate() {
        let path = d.dir.path().join(format!("ref{i}.png"));
        std::fs::write(&path, tally::render::placeholder_png(colour, 16)).expect("write ref");
        args.extend(["--ref".into(), path.display().to_string()]);
    }
    for role in ["main", "selling_point", "scene", "scene"] {
        args.extend(["--shot".into(), format!("{role}:{role} shot {tag}")]);
    }
    args.extend(["--provider".into(), "openai".into(), "--json".into()]);
    let out = d.cli(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "set create failed: {}", String::from_utf8_lossy(&out.stderr));
    let set: serde_json::Value = serde_json::from_slice(&out.stdout).expect("set JSON");
    let id = set["id"].as_str().expect("set id").to_string();

    // Kill the daemon while the second shot is at the provider.
    let second = wait_for(Duration::from_secs(30), || (charged_lines(&mock, &tag).len() >= 2).then_some(()));
    assert!(second.is_some(), "the second shot never reached the provider");
    let mut child = d.child.take().expect("running");
    child.kill().expect("kill");
    child.wait().expect("reap");
    d.spawn();

    let done = wait_for(Duration::from_secs(60), || {
        let s = d.call("GET", &format!("/v1/sets/{id}"), None).json();
        (s["status"] != "running").then_some(s)
    })
    .expect("the set settles after the restart");
    // The shot in flight at the kill ends unknown (openai_images cannot prove what happened);
    // the others succeed, and no shot is ever charged twice.
    let statuses: Vec<&str> =
        done["shots"].as_array().expect("shots").iter().filter_map(|s| s["status"].as_str()).collect();
    assert_eq!(statuses, ["succeeded", "unknown", "succeeded", "succeeded"], "{done}");
    assert_eq!(done["status"], "done_with_problems");
    let charged = charged_lines(&mock, &tag);
    for role_shot in ["main shot", "selling_point shot"] {
        assert_eq!(charged.iter().filter(|l| l["prompt"].as_str().unwrap_or("").starts_with(role_shot)).count(), 1);
    }
    assert_eq!(charged.len(), 4, "each shot charged exactly once");
    assert!(charged.iter().all(|l| l["reference_images"] == 2), "every shot carried both references");
    let out = d.cli(&["set", "status", &id]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 of 4 done, 1 unknown"));
}

/// Run the configured daemon until the crash point `point` aborts it.
fn crash_at(d: &mut Daemon, point: &str, what: &str) {
    d.env.retain(|(k, _)| k != "FAILPOINTS");
    d.env.push(("FAILPOINTS".into(), format!("{point}=return")));
    d.spawn_process();
    let exited = wait_for(Duration::from_secs(30), || d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()));
    let status = exited.unwrap_or_else(|| panic!("{what}: crash point {point} never fired; stderr:\n{}", d.stderr()));
    assert!(!status.success(), "{what}: the daemon exited cleanly instead of crashing at {point}");
    d.child = None;
    d.env.retain(|(k, _)| k != "FAILPOINTS");
}

/// A crash during a resumable call, then a second crash between the resumed execution's
/// hand-off and its claim, leaves a `sent` envelope with no lease whose execution is past
/// `claimed`. With `max_sends = 2` that hand-off is the last one allowed: it used to be
/// counted as undelivered and the task failed "could not be delivered" although the provider
/// had accepted (and charged) it, with the execution left `running` so `tally check` failed.
/// Now it is resumed from its phase: one charge, the image, a clean check.
fn resumed_hand_off_case(kind: &str, first_point: &str) {
    let what = format!("resumed hand-off {kind}");
    let mock = Mock::start(&["--job-duration-ms", "50", "--honor-idempotency-key"]);
    let engine = format!("{}max_sends = 2\n", engine_section());
    let mut d = Daemon::configure_with(&engine, &providers(&mock));
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-crash".into()));
    d.env.push(("FAILPOINTS".into(), format!("{first_point}=return")));
    d.spawn();
    let prompt = format!("resumed hand-off {kind} {}", uuid::Uuid::new_v4());
    let key = uuid::Uuid::new_v4().to_string();
    let _ = submit(&d, kind, &prompt, &key);
    let exited = wait_for(Duration::from_secs(30), || d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()));
    assert!(exited.is_some_and(|s| !s.success()), "{what}: {first_point} never fired; stderr:\n{}", d.stderr());
    d.child = None;
    // Start-up recovery resumes the execution and hands it off; the process dies before the claim.
    crash_at(&mut d, "after-sent", &what);

    d.spawn();
    let (code, id) = submit(&d, kind, &prompt, &key).expect("the restarted daemon answers");
    assert_eq!(code, 200, "{what}: the same key must name the existing task");
    let task = d.wait_status(&id, &["succeeded", "failed", "unknown", "canceled"]);
    assert_eq!(task["status"], "succeeded", "{what}: {task}");
    std::thread::sleep(Duration::from_millis(300));
    let (lines, charged) = mock.count(&prompt);
    assert_eq!(charged, 1, "{what}: charged requests ({lines} ledger lines)");
    let art = &task["artifacts"][0];
    let body = d.call("GET", art["url"].as_str().expect("artifact url"), None).body;
    assert_eq!(crate::common::sha256_hex(&body), art["sha256"].as_str().unwrap_or(""), "{what}");
    let events = d.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
    let messages: Vec<String> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| format!("{}: {}", e["kind"].as_str().unwrap_or(""), e["message"].as_str().unwrap_or("")))
        .collect();
    assert!(!messages.iter().any(|m| m.contains("nothing was sent")), "{what}: a false timeline: {messages:#?}");
    assert!(!messages.iter().any(|m| m.starts_with("requeued")), "{what}: counted as undelivered: {messages:#?}");
    assert!(d.term().success(), "{what}: clean stop failed");
    let check = Command::new(EXE).args(["check", "--config"]).arg(&d.config).output().expect("check runs");
    assert!(check.status.success(), "{what}: tally check failed:\n{}", String::from_utf8_lossy(&check.stdout));
}

#[test]
fn resumed_hand_off_lost_before_its_claim_failed_a_charged_task_replicate() {
    resumed_hand_off_case("replicate", "after-accepted");
}

#[test]
fn resumed_hand_off_lost_before_its_claim_failed_a_charged_task_idem() {
    resumed_hand_off_case("idem", "after-answer");
}
