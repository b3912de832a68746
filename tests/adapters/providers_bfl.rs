//! The `bfl` adapter against the in-process mock's BFL style: `{id, polling_url}` kept as the
//! job's handle and the URL given polled (only on `base_url`'s origin), the sample downloaded
//! at once, moderation refused and not charged, too many active tasks "not now", out of
//! credits a configuration problem, references only where the model takes them.

use serde_json::json;
use tally_base::providers::{self, CallError, JobHandle, JobState, ProviderConfig, ProviderKind, Submitted};

use crate::harness::{Harness, accepted, assert_png, poll_until_settled, reference, request};

#[tokio::test]
async fn bfl_polls_the_polling_url_it_gave_and_downloads_the_sample() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Bfl);
    assert_eq!((p.capabilities().lookup, p.finds_lost_creates()), (true, false), "polled by id, never listed");
    let job = accepted(p.submit(&request("red chair")).await.unwrap());
    let url =
        job.data.as_ref().and_then(|d| d["polling_url"].as_str()).expect("polling_url kept with the id").to_string();
    assert!(url.starts_with(&h.mock.bfl_url()) && url.ends_with(&job.id), "{url}");
    match poll_until_settled(p.as_ref(), &job).await {
        JobState::Done(img) => assert_png(&img),
        other => panic!("{other:?}"),
    }
    let ledger = h.ledger();
    assert_eq!(ledger[0]["endpoint"], "POST /bfl/v1/{model}");
    assert_eq!(ledger[0]["api"], "bfl");
    assert_eq!(ledger.last().unwrap()["endpoint"], "GET /bfl/v1/get_result");
    assert_eq!(h.charged(), 1);
    // A polling_url on another origin never gets the key: the id is polled on base_url.
    let hostile =
        JobHandle { id: job.id.clone(), data: Some(json!({"polling_url": "http://127.0.0.1:9/v1/get_result"})) };
    assert!(matches!(poll_until_settled(p.as_ref(), &hostile).await, JobState::Done(_)));
}

#[tokio::test]
async fn moderated_requests_are_refused_and_not_charged() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Bfl);
    for (how, words) in [("prompt", "before generating"), ("output", "generated image")] {
        h.behave(json!({"moderation": how})).await;
        let job = accepted(p.submit(&request(&format!("moderated {how}"))).await.unwrap());
        match poll_until_settled(p.as_ref(), &job).await {
            JobState::Refused(why) => assert!(why.contains("moderation") && why.contains(words), "{why}"),
            other => panic!("{how}: {other:?}"),
        }
    }
    assert_eq!(h.charged(), 0, "BFL charges only Ready generations");
}

#[tokio::test]
async fn a_bfl_error_is_failed() {
    let h = Harness::start_with(|a| a.job_error = Some("GPU fell over".into())).await;
    let p = h.provider(ProviderKind::Bfl);
    let job = accepted(p.submit(&request("error")).await.unwrap());
    match poll_until_settled(p.as_ref(), &job).await {
        JobState::Failed(why) => assert!(why.contains("GPU fell over"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn references_go_only_to_models_that_take_them() {
    let h = Harness::start().await;
    let mut shot = request("with photo");
    shot.references.push(reference());
    let pro = h.provider(ProviderKind::Bfl);
    match pro.preflight(&shot).await {
        Err(CallError::Rejected { message, config: true }) => {
            assert!(message.contains("takes no input image"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(h.ledger().is_empty());
    let kontext =
        providers::build(&ProviderConfig { model: Some("flux-kontext-pro".into()), ..h.config(ProviderKind::Bfl) })
            .unwrap();
    kontext.preflight(&shot).await.unwrap();
    let job = accepted(kontext.submit(&shot).await.unwrap());
    assert!(matches!(poll_until_settled(kontext.as_ref(), &job).await, JobState::Done(_)));
    assert_eq!(h.ledger()[0]["reference_images"], 1, "sent as input_image");
}

#[tokio::test]
async fn out_of_credits_is_a_configuration_problem_and_too_many_tasks_is_not_now() {
    let h = Harness::start_with(|a| a.job_duration_ms = 60_000).await;
    let p = h.provider(ProviderKind::Bfl);
    h.behave(json!({"out_of_credit": true})).await;
    match p.submit(&request("no credits")).await {
        Err(CallError::Rejected { message, config: true }) => {
            assert!(
                message.contains("out of credit") && message.contains("nothing was generated or charged"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    h.behave(json!({"out_of_credit": null})).await;
    for i in 0..24 {
        assert!(matches!(p.submit(&request(&format!("active {i}"))).await, Ok(Submitted::Accepted(_))));
    }
    match p.submit(&request("one too many")).await {
        Err(CallError::RetryAfter { message, .. }) => assert!(message.contains("active tasks"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.charged(), 24);
}

#[tokio::test]
async fn a_lost_bfl_create_cannot_be_found() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Bfl);
    h.behave(json!({"drop_response": true, "drop_on": "create"})).await;
    let req = request("lost flux");
    assert!(matches!(p.submit(&req).await, Err(CallError::Ambiguous(_))));
    assert!(p.find(&req).await.unwrap().is_none());
    assert_eq!(h.charged(), 1);
}

/// The sample URL is downloaded at once; a download that fails inside its 10 minutes is a
/// result not fetched *yet* (tried again on the next poll), never "expired".
#[tokio::test]
async fn a_sample_that_fails_to_download_is_tried_again_not_called_expired() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Bfl);
    let job = accepted(p.submit(&request("blip")).await.unwrap());
    h.behave(json!({"result_fetch_failures": 2, "result_fetch_status": 404})).await;
    let mut unavailable = 0;
    let img = loop {
        match p.poll(&job).await.unwrap() {
            JobState::Running => tokio::time::sleep(p.poll_interval()).await,
            JobState::ResultUnavailable(why) => {
                assert!(why.contains("10 minutes"), "{why}");
                unavailable += 1;
            }
            JobState::Done(img) => break img,
            other => panic!("{other:?}"),
        }
    };
    assert_png(&img);
    assert_eq!(unavailable, 2, "each failed download said so, and the next poll tried again");
    assert_eq!(h.charged(), 1);
}
