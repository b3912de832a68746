//! The `dashscope` adapter against the in-process strict mock (DashScope style under
//! `/dashscope`): asynchronous tasks created with `X-DashScope-Async: enable`, polled by
//! task id, a lost create found through the batch task query, only successful images
//! charged, the documented error codes, reference photos where the model takes them.

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tally::config::{ProviderConfig, ProviderKind};

use tally::providers::{self, CallError, CallRequest, JobState, LostLookup, Provider, Submitted};

use crate::common::{Daemon, Mock, submit, wait_for};
use crate::harness::{Harness, accepted, assert_png, poll_until_settled, reference, request};

fn dashscope(h: &Harness, model: &str) -> std::sync::Arc<dyn Provider> {
    providers::build(&ProviderConfig { model: Some(model.into()), ..h.config(ProviderKind::Dashscope) }).unwrap()
}

#[tokio::test]
async fn a_task_is_created_polled_and_charged_once() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Dashscope);
    assert!(p.capabilities().lookup && !p.capabilities().idempotent_create);
    assert!(p.finds_lost_creates(), "the batch task query can find a lost create");

    let job = accepted(p.submit(&request("blue kettle")).await.unwrap());
    match poll_until_settled(p.as_ref(), &job).await {
        JobState::Done(img) => assert_png(&img),
        other => panic!("{other:?}"),
    }
    let ledger = h.ledger();
    assert_eq!(ledger[0]["api"], "dashscope");
    assert_eq!(ledger[0]["endpoint"], "POST /dashscope/api/v1/services/aigc/{task}/image-synthesis");
    assert_eq!(ledger[0]["prompt"], "blue kettle");
    assert_eq!(ledger[0]["job_id"], job.id.as_str());
    assert_eq!(ledger.last().unwrap()["endpoint"], "GET /dashscope/api/v1/tasks/{task_id}");
    assert_eq!(h.charged(), 1);
    // What the mock stored: the size in DashScope's `W*H`, n = 1, the prompt in the results.
    let task = h.api_get(&format!("/dashscope/api/v1/tasks/{}", job.id)).await;
    assert_eq!(task["output"]["task_status"], "SUCCEEDED", "{task}");
    assert_eq!(task["output"]["results"][0]["orig_prompt"], "blue kettle");
    assert_eq!(task["usage"]["image_count"], 1);
    // The official SDK's base URL (ending in /api/v1) works too.
    let cfg = ProviderConfig {
        base_url: Some(format!("{}/api/v1", h.mock.dashscope_url())),
        ..h.config(ProviderKind::Dashscope)
    };
    accepted(providers::build(&cfg).unwrap().submit(&request("sdk base url")).await.unwrap());
    assert_eq!(h.charged(), 2);
}

#[tokio::test]
async fn a_create_without_the_async_header_is_refused_and_not_charged() {
    let h = Harness::start().await;
    let url = format!("{}/api/v1/services/aigc/text2image/image-synthesis", h.mock.dashscope_url());
    let body = json!({"model": "wan2.2-t2i-flash", "input": {"prompt": "sync please"}});
    let r = h.http.post(url).bearer_auth("sk-x").json(&body).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "AccessDenied", "{v}");
    assert_eq!(h.charged(), 0);
}

#[tokio::test]
async fn a_failed_task_is_failed_and_not_charged() {
    let h = Harness::start_with(|a| {
        a.job_error = Some("DataInspectionFailed: Output data may contain inappropriate content.".into())
    })
    .await;
    let p = h.provider(ProviderKind::Dashscope);
    let job = accepted(p.submit(&request("doomed")).await.unwrap());
    match poll_until_settled(p.as_ref(), &job).await {
        JobState::FailedNotCharged(why) => {
            assert!(why.contains("DataInspectionFailed") && why.contains("bills only successful"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    let line = h.ledger().into_iter().find(|l| l["prompt"] == "doomed").unwrap();
    assert_eq!(line["charged"], false, "only successful images are billed: {line}");
}

/// A create whose answer was lost is found in the batch task query: by model and time, and
/// among several candidates by the prompt its results show.
#[tokio::test]
async fn a_lost_create_is_found_by_listing_when_exactly_one_task_matches() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Dashscope);
    // Another task of the same model in the same window, finished: told apart by its prompt.
    let other = accepted(p.submit(&request("someone else's lamp")).await.unwrap());
    poll_until_settled(p.as_ref(), &other).await;
    h.behave(json!({"drop_response": true, "drop_on": "create"})).await;
    let req = request("the lost lamp");
    let err = p.submit(&req).await.unwrap_err();
    assert!(matches!(err, CallError::Ambiguous(_)), "{err:?}");
    h.behave(json!({"drop_response": null})).await;
    let lost = h.ledger().into_iter().find(|l| l["prompt"] == "the lost lamp").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let found = p.find(&req).await.unwrap().expect("exactly one task matches");
    assert_eq!(found.id, lost["job_id"].as_str().unwrap());
    assert!(matches!(poll_until_settled(p.as_ref(), &found).await, JobState::Done(_)));
    assert_eq!(h.charged(), 2, "found, never resent");
    // The listing was asked with the documented filters.
    let listed = h.ledger().into_iter().filter(|l| l["endpoint"] == "GET /dashscope/api/v1/tasks").count();
    assert!(listed >= 1);
}

/// Lose the creates of `reqs` (their answers dropped, the tasks made and charged).
async fn lose_creates(h: &Harness, p: &dyn Provider, reqs: &[&CallRequest]) {
    h.behave(json!({"drop_response": true, "drop_on": "create"})).await;
    for req in reqs {
        let err = p.submit(req).await.unwrap_err();
        assert!(matches!(err, CallError::Ambiguous(_)), "{err:?}");
    }
    h.behave(json!({"drop_response": null})).await;
}

/// Look for `req` until the answer is no longer "look again later" (bounded).
async fn look_until_decided(p: &dyn Provider, req: &CallRequest) -> LostLookup {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match p.find_lost(req).await {
            Ok(LostLookup::LookAgain { .. }) | Err(CallError::RetryAfter { .. }) => {}
            Ok(decided) => return decided,
            Err(e) => panic!("{e:?}"),
        }
        assert!(Instant::now() < end, "still undecided after 30 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Two creates lost in one window: while the tasks run neither shows its prompt, so a look
/// cannot tell them apart and says "look again later" (within the 24-hour retention), never
/// "nothing proven"; once they succeed, each is found by its prompt, and nothing was resent.
#[tokio::test]
async fn two_lost_creates_in_one_window_are_told_apart_once_their_prompts_show() {
    let h = Harness::start_with(|a| a.job_duration_ms = 3000).await;
    let p = h.provider(ProviderKind::Dashscope);
    let (a, b) = (request("the lost kettle"), request("the lost teapot"));
    lose_creates(&h, p.as_ref(), &[&a, &b]).await;
    match p.find_lost(&a).await.unwrap() {
        LostLookup::LookAgain { why, until_ms } => {
            assert!(why.contains("2 DashScope task(s)") && why.contains("not shown their prompt"), "{why}");
            assert_eq!(until_ms, a.calling_at_ms + 24 * 3600 * 1000, "bounded by the retention");
        }
        other => panic!("both tasks still run, so a later look may tell them apart: {other:?}"),
    }
    assert_eq!(p.find(&a).await.unwrap(), None, "`find` alone proves nothing yet");
    let job_of = |prompt: &str| {
        let line = h.ledger().into_iter().find(|l| l["prompt"] == prompt).unwrap();
        line["job_id"].as_str().unwrap().to_string()
    };
    for req in [&a, &b] {
        match look_until_decided(p.as_ref(), req).await {
            LostLookup::Found(job) => assert_eq!(job.id, job_of(&req.prompt), "{}", req.prompt),
            other => panic!("{}: {other:?}", req.prompt),
        }
    }
    assert_eq!(h.charged(), 2, "found, never resent");
}

/// Two lost creates with the same prompt: once both show it, nothing tells them apart, for
/// good.
#[tokio::test]
async fn two_lost_creates_with_the_same_prompt_stay_unproven_after_a_second_look() {
    let h = Harness::start_with(|a| a.job_duration_ms = 1500).await;
    let p = h.provider(ProviderKind::Dashscope);
    let (a, b) = (request("the same vase"), request("the same vase"));
    lose_creates(&h, p.as_ref(), &[&a, &b]).await;
    assert!(matches!(p.find_lost(&a).await.unwrap(), LostLookup::LookAgain { .. }));
    match look_until_decided(p.as_ref(), &a).await {
        LostLookup::Unproven(why) => {
            assert!(why.contains("2 DashScope tasks") && why.contains("show this prompt"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.charged(), 2);
}

/// Through the engine: two creates lost in one window, their prompts shown only after the
/// worker's first looks. Each execution waits for a later look (its task `waiting`, nothing
/// sent again) and is adopted once the prompts show: both succeed, one charge each. Two
/// with the same prompt end `unknown`, still one charge each.
#[test]
fn the_engine_looks_again_for_lost_creates_until_their_prompts_tell_them_apart() {
    // The jobs show their prompts only when they succeed, 20 s after they start. The engine's
    // first four looks (each a listing and two task reads, for each of two workers) come a
    // second or two apart — below DashScope's 20 queries a second, so none is throttled (a
    // throttled look waits 5 s) — and so all before the prompts can tell the jobs apart.
    let mock = Mock::start(&["--job-duration-ms", "20000"]);
    let engine = "dispatch_grace_secs = 1\nmax_attempts = 3\nbackoff_base_ms = 1000\nbackoff_max_ms = 2000\n";
    let mut daemon = Daemon::configure_with(engine, &crate::common::providers(&mock));
    daemon.env.push(("TALLY_TEST_KEY".into(), "sk-test-providers".into()));
    daemon.spawn();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let prompts = [format!("lost kettle {tag}"), format!("lost teapot {tag}"), format!("same vase {tag}")];
    let start = |prompt: &str| {
        let (code, id) = submit(&daemon, "dashscope", prompt, &uuid::Uuid::new_v4().to_string()).expect("submit");
        assert_eq!(code, 201);
        id
    };
    let settled = &["succeeded", "failed", "unknown", "canceled"];
    for (want, pair) in [("succeeded", [&prompts[0], &prompts[1]]), ("unknown", [&prompts[2], &prompts[2]])] {
        mock.behave(json!({"drop_response": true, "drop_on": "create"}));
        let ids = pair.map(|p| start(p));
        let sent = wait_for(Duration::from_secs(20), || {
            let ours = |l: &Value| pair.iter().any(|p| l["prompt"].as_str() == Some(p.as_str()));
            (mock.lines().iter().filter(|l| ours(l)).count() >= 2).then_some(())
        });
        assert!(sent.is_some(), "both creates reached the mock");
        mock.behave(json!({"drop_response": null}));
        for id in &ids {
            // Settled by a later look, once the jobs showed their prompts (20 s and more).
            let t = wait_for(Duration::from_secs(120), || {
                let t = daemon.call("GET", &format!("/v1/tasks/{id}"), None).json();
                settled.contains(&t["status"].as_str().unwrap_or("")).then_some(t)
            })
            .unwrap_or_else(|| panic!("task {id} never settled"));
            assert_eq!(t["status"], want, "{t}");
            let events = daemon.call("GET", &format!("/v1/tasks/{id}/events"), None).json();
            let looked_again =
                events["events"].as_array().expect("events").iter().any(|e| {
                    e["kind"] == "recovering" && e["message"].as_str().is_some_and(|m| m.contains("looks again"))
                });
            assert!(looked_again, "a look found the tasks still running and waited for a later one: {events}");
        }
        if want == "unknown" {
            let t = daemon.call("GET", &format!("/v1/tasks/{}", ids[0]), None).json();
            assert!(t.to_string().contains("show this prompt"), "unknown only once both showed it: {t}");
        }
    }
    // One charge per create, nothing resent.
    assert_eq!(mock.count(&prompts[0]), (1, 1));
    assert_eq!(mock.count(&prompts[1]), (1, 1));
    assert_eq!(mock.count(&prompts[2]), (2, 2));
}

#[tokio::test]
async fn several_tasks_with_the_same_prompt_prove_nothing() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Dashscope);
    let req = request("twice the same");
    for _ in 0..2 {
        accepted(p.submit(&req).await.unwrap());
    }
    assert_eq!(p.find(&req).await.unwrap(), None);
    // Another model's tasks never match; nor does a window with no task.
    let qwen = dashscope(&h, "qwen-image");
    assert_eq!(qwen.find(&req).await.unwrap(), None);
    let mut later = request("nothing sent");
    later.calling_at_ms += 3_600_000;
    assert_eq!(p.find(&later).await.unwrap(), None);
}

#[tokio::test]
async fn documented_error_codes_are_classified() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Dashscope);
    type Want = fn(&CallError) -> bool;
    let cases: [(Value, Want); 5] = [
        (
            json!({"reject_status": 400, "error_code": "Arrearage"}),
            |e| matches!(e, CallError::Rejected { config: true, message } if message.contains("out of credit")),
        ),
        (
            json!({"reject_status": 400, "error_code": "DataInspectionFailed"}),
            |e| matches!(e, CallError::Rejected { config: false, message } if message.contains("content inspection")),
        ),
        (
            json!({"reject_status": 401, "error_code": null}),
            |e| matches!(e, CallError::Rejected { config: true, message } if message.contains("InvalidApiKey")),
        ),
        (json!({"reject_status": null, "retry_after_s": 2}), |e| matches!(e, CallError::RetryAfter { .. })),
        (json!({"retry_after_s": null, "fail_status": 500}), |e| matches!(e, CallError::Ambiguous(_))),
    ];
    for (patch, want) in cases {
        assert!(h.behave(patch.clone()).await.status().is_success());
        let err = p.submit(&request("refused")).await.unwrap_err();
        assert!(want(&err), "{patch}: {err:?}");
    }
    assert_eq!(h.charged(), 0);
}

#[tokio::test]
async fn reference_photos_go_where_the_model_takes_them() {
    let h = Harness::start().await;
    let mut req = request("two photos");
    req.references = vec![reference(), reference()];
    // A text-to-image model takes none: refused before anything is sent, in plain words.
    let err = h.provider(ProviderKind::Dashscope).preflight(&req).await.unwrap_err();
    assert!(
        matches!(&err, CallError::Rejected { message, .. } if message.contains("text-to-image") && message.contains("nothing was sent")),
        "{err:?}"
    );
    // wan2.5-i2i-preview: `input.images` on the image2image service.
    let i2i = dashscope(&h, "wan2.5-i2i-preview");
    i2i.preflight(&req).await.unwrap();
    let job = accepted(i2i.submit(&req).await.unwrap());
    assert!(matches!(poll_until_settled(i2i.as_ref(), &job).await, JobState::Done(_)));
    let line = h.ledger().into_iter().find(|l| l["prompt"] == "two photos").unwrap();
    assert_eq!((line["reference_images"].as_u64(), line["charged"].as_bool()), (Some(2), Some(true)));
    // wanx2.1-imageedit: one photo and a function.
    let edit = dashscope(&h, "wanx2.1-imageedit");
    assert!(edit.preflight(&req).await.is_err(), "two photos for a one-photo model");
    req.references.truncate(1);
    assert!(edit.preflight(&req).await.is_err(), "no function");
    req.params = json!({"function": "description_edit"});
    edit.preflight(&req).await.unwrap();
    accepted(edit.submit(&req).await.unwrap());
    // An editing model without photos is refused too.
    assert!(i2i.preflight(&request("no photos")).await.is_err());
}

#[tokio::test]
async fn n_other_than_one_is_refused_before_sending() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Dashscope);
    let mut req = request("two images");
    req.params = json!({"n": 2});
    let err = p.preflight(&req).await.unwrap_err();
    assert!(matches!(&err, CallError::Rejected { message, .. } if message.contains("n must be 1")), "{err:?}");
    req.params = json!({"n": 1, "size": "1280x720", "prompt_extend": false});
    p.preflight(&req).await.unwrap();
    let job = accepted(p.submit(&req).await.unwrap());
    let task = h.api_get(&format!("/dashscope/api/v1/tasks/{}", job.id)).await;
    assert_eq!(task["output"]["task_id"], job.id.as_str(), "{task}");
    assert_eq!(h.ledger().len(), 2, "nothing was sent for the refused n");
}

/// After the retention the task's data is gone: the service answers UNKNOWN, which proves
/// nothing about the result (the engine ends such a task `unknown`).
#[tokio::test]
async fn a_task_past_its_retention_is_unknown_to_the_service() {
    let h = Harness::start_with(|a| a.result_ttl_s = 0).await;
    let p = h.provider(ProviderKind::Dashscope);
    let job = accepted(p.submit(&request("gone soon")).await.unwrap());
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    let err = p.poll(&job).await.unwrap_err();
    assert!(matches!(&err, CallError::Rejected { message, .. } if message.contains("UNKNOWN")), "{err:?}");
    let listed = h.api_get("/dashscope/api/v1/tasks").await;
    assert_eq!(listed["total"], 0, "deleted tasks are not listed: {listed}");
}

#[tokio::test]
async fn the_task_query_is_rate_limited_and_paged() {
    let h = Harness::start_with(|a| a.job_duration_ms = 0).await;
    let p = h.provider(ProviderKind::Dashscope);
    let mut ids = Vec::new();
    for i in 0..3 {
        match p.submit(&request(&format!("paged {i}"))).await.unwrap() {
            Submitted::Accepted(j) => ids.push(j.id),
            Submitted::Done(_) => panic!("asynchronous"),
        }
    }
    let page = h.api_get("/dashscope/api/v1/tasks?model_name=wan2.2-t2i-flash&status=SUCCEEDED&page_size=2").await;
    assert_eq!((page["total"].as_u64(), page["total_page"].as_u64()), (Some(3), Some(2)), "{page}");
    assert_eq!(page["data"][0]["task_id"], ids[2].as_str(), "newest first");
    assert!(page["data"][0]["gmt_create"].is_i64());
    let bad = h.api_get("/dashscope/api/v1/tasks?start_time=2026-12-01").await;
    assert_eq!(bad["code"], "InvalidParameter");
    // 20 task queries a second at most: a burst meets 429 Throttling, classified "not now".
    let job = tally::providers::JobHandle::id(ids[0].clone());
    let mut throttled = 0;
    for _ in 0..30 {
        if let Err(CallError::RetryAfter { message, .. }) = p.poll(&job).await {
            assert!(message.contains("Throttling"), "{message}");
            throttled += 1;
        }
    }
    assert!(throttled > 0, "no query was throttled");
}

/// Defect 1 for DashScope: a result download that fails (404 from the file host) within the
/// 24-hour retention is tried again, and never called "expired".
#[tokio::test]
async fn a_missing_result_within_the_retention_is_not_expired() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Dashscope);
    let job = accepted(p.submit(&request("slow cdn")).await.unwrap());
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    // Two failing downloads: retried within one poll, then the image.
    h.behave(json!({"result_fetch_failures": 2, "result_fetch_status": 404})).await;
    assert!(matches!(poll_until_settled(p.as_ref(), &job).await, JobState::Done(_)));
    // Many: the poll reports the result unavailable (try later), not expired.
    h.behave(json!({"result_fetch_failures": 1000, "result_fetch_status": 503})).await;
    match p.poll(&job).await.unwrap() {
        JobState::ResultUnavailable(why) => assert!(why.contains("24 hours"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_account_out_of_credit_is_a_configuration_refusal() {
    let h = Harness::start().await;
    h.behave(json!({"out_of_credit": true})).await;
    let err = h.provider(ProviderKind::Dashscope).submit(&request("no credit")).await.unwrap_err();
    assert!(matches!(&err, CallError::Rejected { config: true, message } if message.contains("Arrearage")), "{err:?}");
    assert_eq!(h.charged(), 0);
}
