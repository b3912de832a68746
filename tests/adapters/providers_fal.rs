//! The `fal_queue` adapter against the in-process strict mock, which (like fal) answers
//! status and result only without the model's subpath, and reports failed requests as
//! `COMPLETED` with `error`/`error_type`.

use serde_json::json;
use tally_base::providers::{self, CallError, JobHandle, JobState, ProviderConfig, ProviderKind};

use crate::harness::{Harness, accepted, assert_png, poll_until_settled, reference, request};

/// F1: README's `fal-ai/flux/dev` is polled at `fal-ai/flux/requests/{id}` (the mock, like
/// fal's docs, answers 404 under the subpath), and ends with the image, charged once.
#[tokio::test]
async fn fal_polls_without_the_model_subpath() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::FalQueue);
    let req = request("green lamp");
    let job = accepted(p.submit(&req).await.unwrap());
    match poll_until_settled(p.as_ref(), &job).await {
        JobState::Done(img) => assert_png(&img),
        other => panic!("{other:?}"),
    }
    let ledger = h.ledger();
    assert_eq!(ledger[0]["endpoint"], "POST /fal/{model}");
    assert_eq!(ledger[0]["job_id"], job.id.as_str());
    assert_eq!(ledger.last().unwrap()["endpoint"], "GET /fal/{app}/requests/{id}");
    assert_eq!(h.charged(), 1);
}

/// F2: the `status_url`/`response_url` fal returned are kept with the id and polled as given;
/// with only an id the adapter builds them as the official clients do.
#[tokio::test]
async fn fal_polls_the_urls_fal_returned() {
    let h = Harness::start().await;
    let job = accepted(h.provider(ProviderKind::FalQueue).submit(&request("kept urls")).await.unwrap());
    let data = job.data.clone().expect("the submit answer's URLs are kept");
    assert!(data["status_url"].as_str().is_some_and(|u| u.contains("/fal/fal-ai/flux/requests/")), "{data}");
    // An adapter configured for another app cannot build this job's URLs, but polls fine
    // with the ones fal returned.
    let other = ProviderConfig { model: Some("fal-ai/other-model/v2".into()), ..h.config(ProviderKind::FalQueue) };
    let other = providers::build(&other).unwrap();
    assert!(matches!(poll_until_settled(other.as_ref(), &job).await, JobState::Done(_)));
    // Only the id: built without the subpath.
    let bare = JobHandle::id(job.id.clone());
    assert!(matches!(poll_until_settled(h.provider(ProviderKind::FalQueue).as_ref(), &bare).await, JobState::Done(_)));
    // A returned URL on another origin is not used (the key is not sent there): the built one is.
    let hostile = JobHandle {
        id: job.id.clone(),
        data: Some(json!({"status_url": "http://127.0.0.1:9/steal", "response_url": "http://127.0.0.1:9/steal"})),
    };
    assert!(matches!(
        poll_until_settled(h.provider(ProviderKind::FalQueue).as_ref(), &hostile).await,
        JobState::Done(_)
    ));
}

/// F5: a request fal reports as failed (`COMPLETED` + `error`; its result answers 500) is
/// failed at once, not polled until the recovery deadline.
#[tokio::test]
async fn a_failed_fal_request_is_failed_not_polled_forever() {
    let h = Harness::start_with(|a| a.job_error = Some("model crashed".into())).await;
    let p = h.provider(ProviderKind::FalQueue);
    let job = accepted(p.submit(&request("doomed")).await.unwrap());
    match poll_until_settled(p.as_ref(), &job).await {
        JobState::Failed(why) => assert!(why.contains("model crashed"), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// F3/F4: fal accepted jobs are polled by id, but a lost create cannot be searched for, and
/// the adapter says so instead of pretending to look.
#[tokio::test]
async fn fal_declares_it_cannot_find_lost_creates() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::FalQueue);
    assert!(p.capabilities().lookup, "accepted jobs are polled by id after a crash");
    assert!(!p.finds_lost_creates());
    assert_eq!(p.find(&request("anything")).await.unwrap(), None);
}

#[tokio::test]
async fn fal_reference_photos_need_a_named_input() {
    let h = Harness::start().await;
    let mut req = request("photos");
    req.references = vec![reference()];
    let err = h.provider(ProviderKind::FalQueue).preflight(&req).await.unwrap_err();
    assert!(
        matches!(&err, CallError::Rejected { message, config: true } if message.contains("reference_input")),
        "{err:?}"
    );
    let cfg = ProviderConfig { reference_input: Some("image_url".into()), ..h.config(ProviderKind::FalQueue) };
    let p = providers::build(&cfg).unwrap();
    p.preflight(&req).await.unwrap();
    p.submit(&req).await.unwrap();
    let line = h.ledger().into_iter().find(|l| l["prompt"] == "photos").unwrap();
    assert_eq!((line["reference_images"].as_u64(), line["charged"].as_bool()), (Some(1), Some(true)));
}

/// Issue 25, defect 1: a result that answers 404 is "expired" only once fal's documented
/// media retention (at least 7 days from the accepted create) has passed; before that it is a
/// blip to poll again (`ResultUnavailable`), never a paid image written off.
#[tokio::test]
async fn a_missing_fal_result_is_expired_only_after_fals_retention() {
    let h = Harness::start_with(|a| a.result_ttl_s = 0).await;
    let p = h.provider(ProviderKind::FalQueue);
    let job = accepted(p.submit(&request("gone soon")).await.unwrap());
    let state = poll_until_settled(p.as_ref(), &job).await;
    match &state {
        JobState::ResultUnavailable(why) => assert!(why.contains("at least 7 days"), "{why}"),
        other => panic!("a fresh result answering 404 is not expired: {other:?}"),
    }
    let mut old = job.clone();
    let eight_days = 8 * 24 * 3600 * 1000;
    old.data.as_mut().expect("handle")["accepted_at_ms"] =
        json!(tally_base::providers::http::client::now_ms() - eight_days);
    let state = poll_until_settled(p.as_ref(), &old).await;
    assert!(matches!(state, JobState::Expired), "past fal's retention: {state:?}");
}
