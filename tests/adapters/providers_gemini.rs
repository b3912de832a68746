//! The `gemini` adapter against the in-process mock's Gemini style: `generateContent` with the
//! image inline, blocked prompts as refusals in plain words, and the Batch API — a named batch
//! before any work, polled to its inline result, and a create whose answer was lost found by
//! listing batches (over several pages) by the display name tally gave it.

use serde_json::json;
use tally_base::providers::{self, CallError, JobState, Provider, ProviderConfig, ProviderKind, Submitted};

use crate::harness::{Harness, accepted, assert_png, now_ms, poll_until_settled, reference, request};

fn batch_provider(h: &Harness) -> std::sync::Arc<dyn Provider> {
    providers::build(&ProviderConfig { batch: true, ..h.config(ProviderKind::Gemini) }).unwrap()
}

#[tokio::test]
async fn generate_content_answers_the_image_inline_with_one_charge() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Gemini);
    assert_eq!((p.capabilities().lookup, p.finds_lost_creates()), (false, false), "nothing to find a lost answer by");
    let mut req = request("blue teapot");
    req.references.push(reference());
    match p.submit(&req).await.unwrap() {
        Submitted::Done(img) => assert_png(&img),
        Submitted::Accepted(_) => panic!("generateContent is synchronous"),
    }
    let ledger = h.ledger();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["endpoint"], "POST /gemini/{version}/models/{model}:generateContent");
    assert_eq!(ledger[0]["api"], "gemini");
    assert_eq!(ledger[0]["prompt"], "blue teapot");
    assert_eq!(ledger[0]["reference_images"], 1, "the reference photo went as an inlineData part");
    assert_eq!(h.charged(), 1);
}

#[tokio::test]
async fn blocked_prompts_and_images_are_refusals_in_plain_words() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Gemini);
    h.behave(json!({"moderation": "prompt"})).await;
    match p.submit(&request("blocked one")).await {
        Err(CallError::Blocked(why)) => {
            assert!(why.contains("Gemini blocked the prompt") && why.contains("SAFETY"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    h.behave(json!({"moderation": "output"})).await;
    match p.submit(&request("unsafe image")).await {
        Err(CallError::Blocked(why)) => assert!(why.contains("safety filter") && why.contains("IMAGE_SAFETY"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Answered with a 200: Gemini may bill the prompt's tokens, and the ledger says so.
    assert_eq!(h.charged(), 2);
}

#[tokio::test]
async fn what_gemini_cannot_do_is_refused_before_sending() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Gemini);
    let mut two = request("two please");
    two.params = json!({"n": 2});
    assert!(
        matches!(p.preflight(&two).await, Err(CallError::Rejected { message, .. }) if message.contains("params.n"))
    );
    let odd = providers::build(&ProviderConfig { size: "1000x700".into(), ..h.config(ProviderKind::Gemini) }).unwrap();
    assert!(matches!(odd.preflight(&request("odd")).await, Err(CallError::Rejected { config: true, .. })));
    let mut ratio = request("wide");
    ratio.params = json!({"aspect_ratio": "16:9"});
    assert!(odd.preflight(&ratio).await.is_ok(), "an aspect ratio in params stands in for the size");
    let mut unknown = request("unknown param");
    unknown.params = json!({"output_format": "png"});
    assert!(
        matches!(p.preflight(&unknown).await, Err(CallError::Rejected { message, .. }) if message.contains("params.output_format"))
    );
    assert!(h.ledger().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn a_batch_is_named_before_any_work_and_polled_to_its_inline_result() {
    let h = Harness::start().await;
    let p = batch_provider(&h);
    assert_eq!((p.capabilities().lookup, p.finds_lost_creates()), (true, true));
    assert!(p.job_deadline().is_some_and(|d| d.as_secs() >= 24 * 3600), "a batch may take a day");
    let req = request("batch vase");
    let job = accepted(p.submit(&req).await.unwrap());
    assert!(job.id.starts_with("batches/"), "{job:?}");
    match poll_until_settled(p.as_ref(), &job).await {
        JobState::Done(img) => assert_png(&img),
        other => panic!("{other:?}"),
    }
    let ledger = h.ledger();
    assert_eq!(ledger[0]["endpoint"], "POST /gemini/{version}/models/{model}:batchGenerateContent");
    assert_eq!(ledger.last().unwrap()["endpoint"], "GET /gemini/{version}/batches/{id}");
    assert_eq!(h.charged(), 1);
    // The display name is the execution's key, so a listing can find it.
    let listed = h
        .http
        .get(format!("{}/v1beta/batches", h.mock.gemini_url()))
        .header("x-goog-api-key", "k")
        .send()
        .await
        .unwrap();
    let listed: serde_json::Value = listed.json().await.unwrap();
    assert_eq!(listed["operations"][0]["metadata"]["displayName"], req.idempotency_key.as_str(), "{listed}");
}

#[tokio::test]
async fn a_lost_batch_create_is_found_by_listing_batches_across_pages() {
    let h = Harness::start().await;
    let p = batch_provider(&h);
    let lost = request("lost batch");
    h.behave(json!({"drop_response": true, "drop_on": "create"})).await;
    assert!(matches!(p.submit(&lost).await, Err(CallError::Ambiguous(_))));
    h.behave(json!({"drop_response": null, "drop_on": null})).await;
    // 120 newer batches push it to the listing's second page (100 a page).
    for i in 0..120 {
        accepted(p.submit(&request(&format!("newer {i}"))).await.unwrap());
    }
    let found = p.find(&lost).await.unwrap().expect("found by its display name");
    match poll_until_settled(p.as_ref(), &found).await {
        JobState::Done(img) => assert_png(&img),
        other => panic!("{other:?}"),
    }
    let lines = h.ledger();
    assert_eq!(lines.iter().filter(|l| l["prompt"] == "lost batch" && l["charged"] == true).count(), 1, "never resent");
    assert!(
        lines.iter().filter(|l| l["endpoint"] == "GET /gemini/{version}/batches").count() >= 2,
        "read a second page"
    );
    // A display name nobody used proves nothing.
    assert!(p.find(&request("never sent")).await.unwrap().is_none());
}

#[tokio::test]
async fn a_failed_batch_request_is_failed() {
    let h = Harness::start_with(|a| a.job_error = Some("model overloaded".into())).await;
    let p = batch_provider(&h);
    let job = accepted(p.submit(&request("doomed batch")).await.unwrap());
    match poll_until_settled(p.as_ref(), &job).await {
        JobState::Failed(why) => assert!(why.contains("model overloaded"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_blocked_batch_request_is_a_refusal() {
    let h = Harness::start().await;
    let p = batch_provider(&h);
    h.behave(json!({"moderation": "prompt"})).await;
    let job = accepted(p.submit(&request("blocked batch")).await.unwrap());
    let mut last = None;
    for _ in 0..200 {
        match p.poll(&job).await {
            Ok(JobState::Running) => tokio::time::sleep(p.poll_interval()).await,
            other => {
                last = Some(other);
                break;
            }
        }
    }
    assert!(matches!(last, Some(Err(CallError::Blocked(ref w))) if w.contains("blocked the prompt")), "{last:?}");
}

/// A held job (issue #24) on the Batch API: the batch named by a later attempt's key is found
/// in the listing; a job with no such batch is absent; a look sends nothing paid.
#[tokio::test]
async fn a_held_job_is_found_by_the_batch_named_for_a_later_attempt() {
    let h = Harness::start().await;
    let p = batch_provider(&h);
    let mut sent = request("held batch");
    sent.task_id = "held-task".into();
    sent.idempotency_key = tally_base::providers::provider_key("held-task", 1);
    let job = accepted(p.submit(&sent).await.unwrap());
    p.submit(&request("held batch")).await.unwrap();
    let keys: Vec<String> = (1..=4).map(|k| tally_base::providers::provider_key("held-task", k)).collect();
    let q = providers::HeldQuery { request: sent.clone(), keys, since_ms: now_ms() - 5_000 };
    let found = p.find_held(&q).await.unwrap();
    assert_eq!(found, providers::HeldLookup::Found { job, key: tally_base::providers::provider_key("held-task", 1) });
    let keys: Vec<String> = (1..=4).map(|k| tally_base::providers::provider_key("never-sent", k)).collect();
    let q = providers::HeldQuery { keys, ..q };
    assert!(matches!(p.find_held(&q).await.unwrap(), providers::HeldLookup::Absent(_)));
    let charged = h.ledger().into_iter().filter(|l| l["charged"] == true).count();
    assert_eq!(charged, 2, "looks are free listings");
    // Without the Batch API there is nothing to list.
    let direct = h.provider(ProviderKind::Gemini);
    assert!(matches!(direct.find_held(&q).await.unwrap(), providers::HeldLookup::Unsure(_)));
}
