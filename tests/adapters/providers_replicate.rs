//! The `replicate` adapter against the in-process strict mock: schema-driven inputs, version
//! creates, expiry, and finding a lost create by what was sent rather than by an echoed
//! marker. Each test asserts what the adapter returned and what the mock's ledger holds.

use serde_json::{Value, json};
use tally_base::providers::{self, CallError, JobState, ProviderConfig, ProviderKind};

use crate::harness::{Harness, accepted, assert_png, now_ms, poll_until_settled, reference, request};

/// Creates (lines with a prompt) in the ledger.
fn creates(h: &Harness) -> Vec<Value> {
    h.ledger().into_iter().filter(|l| l["prompt"].is_string()).collect()
}

#[tokio::test]
async fn replicate_submit_then_poll_to_done() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    assert!(p.capabilities().lookup && p.finds_lost_creates());
    let job = accepted(p.submit(&request("blue chair")).await.unwrap());
    match poll_until_settled(p.as_ref(), &job).await {
        JobState::Done(img) => assert_png(&img),
        other => panic!("{other:?}"),
    }
    let c = creates(&h);
    assert_eq!((c.len(), c[0]["job_id"].as_str()), (1, Some(job.id.as_str())));
    assert_eq!(c[0]["endpoint"], "POST /v1/models/{owner}/{name}/predictions");
    assert_eq!(h.charged(), 1);
}

/// F9: flux-schnell takes `aspect_ratio`, not `width`/`height`; the adapter reads the schema.
#[tokio::test]
async fn size_becomes_the_models_aspect_ratio() {
    let h = Harness::start().await;
    let cfg = ProviderConfig { size: "1536x1024".into(), ..h.config(ProviderKind::Replicate) };
    let job = accepted(providers::build(&cfg).unwrap().submit(&request("wide")).await.unwrap());
    let stored = h.api_get(&format!("/v1/predictions/{}", job.id)).await;
    assert_eq!(stored["input"]["aspect_ratio"], "3:2", "{stored}");
    assert!(stored["input"].get("width").is_none() && stored["input"].get("tally_marker").is_none(), "{stored}");
}

/// F6 (Cog 0.17.x refused unknown inputs with 422): only declared inputs are sent, so a model
/// that refuses unknown inputs still runs the job.
#[tokio::test]
async fn a_model_that_refuses_unknown_inputs_still_gets_a_valid_create() {
    let h = Harness::start_with(|a| a.unknown_inputs = "reject".into()).await;
    let p = h.provider(ProviderKind::Replicate);
    let req = request("strict model");
    p.preflight(&req).await.unwrap();
    accepted(p.submit(&req).await.unwrap());
    assert_eq!(h.charged(), 1);
    // An unknown task parameter is refused before the call, not sent for a 422.
    let mut bad = request("typo");
    bad.params = json!({"guidence": 3});
    let err = p.preflight(&bad).await.unwrap_err();
    assert!(matches!(&err, CallError::Rejected { message, .. } if message.contains("guidence")), "{err:?}");
    assert_eq!(h.charged(), 1);
}

/// F10: reference photos on a model without an image input are refused before any paid call.
#[tokio::test]
async fn reference_photos_on_a_model_without_image_input_are_refused_before_any_call() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    let mut req = request("with photos");
    req.references = vec![reference(), reference()];
    let err = p.preflight(&req).await.unwrap_err();
    assert!(
        matches!(&err, CallError::Rejected { message, .. } if message.contains("takes no reference images")),
        "{err:?}"
    );
    assert!(creates(&h).is_empty(), "nothing paid was sent: {:?}", h.ledger());
    // flux-kontext-pro takes one `input_image`: one photo goes there, two are refused.
    let kontext = ProviderConfig {
        model: Some("black-forest-labs/flux-kontext-pro".into()),
        ..h.config(ProviderKind::Replicate)
    };
    let p = providers::build(&kontext).unwrap();
    assert!(matches!(p.preflight(&req).await, Err(CallError::Rejected { .. })));
    req.references.truncate(1);
    p.preflight(&req).await.unwrap();
    let job = accepted(p.submit(&req).await.unwrap());
    assert!(matches!(poll_until_settled(p.as_ref(), &job).await, JobState::Done(_)), "a single-URL output downloads");
    assert_eq!(creates(&h)[0]["reference_images"], 1);
}

/// F11: `owner/name:version` creates with `POST /v1/predictions` and `version`.
#[tokio::test]
async fn a_versioned_model_creates_with_post_predictions() {
    let h = Harness::start().await;
    let model = h.api_get("/v1/models/black-forest-labs/flux-dev").await;
    let version = model["latest_version"]["id"].as_str().expect("version id").to_string();
    let cfg = ProviderConfig {
        model: Some(format!("black-forest-labs/flux-dev:{version}")),
        ..h.config(ProviderKind::Replicate)
    };
    let p = providers::build(&cfg).unwrap();
    let mut req = request("by version");
    req.references = vec![reference()];
    p.preflight(&req).await.unwrap();
    let job = accepted(p.submit(&req).await.unwrap());
    assert!(matches!(poll_until_settled(p.as_ref(), &job).await, JobState::Done(_)));
    let c = creates(&h);
    assert_eq!(c[0]["endpoint"], "POST /v1/predictions");
    assert_eq!(c[0]["reference_images"], 1, "flux-dev's one `image` input took the photo");
    let stored = h.api_get(&format!("/v1/predictions/{}", job.id)).await;
    assert_eq!(stored["version"], version.as_str());
}

/// F6: the mock strips unknown inputs from what it stores (as current Cog does), so no marker
/// is echoed; the lost create is still found, by its inputs and the time window.
#[tokio::test]
async fn a_lost_create_is_found_by_what_was_sent_not_by_an_echoed_marker() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    // Other jobs first (one with the same prompt), so a match is needed, not the newest.
    for i in 0..3 {
        p.submit(&request(&format!("other {i}"))).await.unwrap();
    }
    p.submit(&request("lost answer")).await.unwrap();
    h.behave(json!({"drop_response": true, "drop_on": "create"})).await;
    let req = request("lost answer");
    let err = p.submit(&req).await.unwrap_err();
    assert!(matches!(err, CallError::Ambiguous(_)), "{err:?}");
    // Listing is not a create, so it is answered even while creates are dropped.
    let found = p.find(&req).await.unwrap().expect("the lost job is listed");
    let lost = h.ledger().into_iter().rfind(|l| l["prompt"] == "lost answer").unwrap();
    assert_eq!(lost["job_id"], found.id.as_str());
    assert_eq!(h.charged(), 5);
    assert!(matches!(poll_until_settled(p.as_ref(), &found).await, JobState::Done(_)));
    // A request nobody sent finds nothing.
    assert_eq!(p.find(&request("never sent")).await.unwrap(), None);
}

/// Two predictions that match what was sent prove nothing: the outcome stays unknown.
#[tokio::test]
async fn two_matching_predictions_prove_nothing() {
    let h = Harness::start_with(|a| a.drop_response = true).await;
    h.behave(json!({"drop_on": "create"})).await;
    let p = h.provider(ProviderKind::Replicate);
    let req = request("twice");
    assert!(p.submit(&req).await.is_err());
    assert!(p.submit(&req).await.is_err());
    assert_eq!(h.charged(), 2);
    assert_eq!(p.find(&req).await.unwrap(), None);
}

#[tokio::test]
async fn find_reads_every_page_of_the_window() {
    let h = Harness::start_with(|a| a.job_duration_ms = 0).await;
    let p = h.provider(ProviderKind::Replicate);
    let first = request("oldest");
    let id = accepted(p.submit(&first).await.unwrap());
    for i in 0..105 {
        p.submit(&request(&format!("newer {i}"))).await.unwrap();
    }
    assert_eq!(p.find(&first).await.unwrap(), Some(id), "found on the second page of 100");
}

#[tokio::test]
async fn find_ignores_jobs_created_outside_the_call_window() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    let mut req = request("early");
    p.submit(&req).await.unwrap();
    // The same inputs, but the execution says it started calling an hour from now.
    req.calling_at_ms = now_ms() + 3_600_000;
    assert_eq!(p.find(&req).await.unwrap(), None);
    req.calling_at_ms = now_ms() - 1_000;
    assert!(p.find(&req).await.unwrap().is_some());
}

/// F8: after Replicate's retention, `output: null` / `data_removed` is expired, not unknown.
#[tokio::test]
async fn an_expired_prediction_is_expired() {
    let h = Harness::start_with(|a| a.result_ttl_s = 0).await;
    let p = h.provider(ProviderKind::Replicate);
    let job = accepted(p.submit(&request("gone soon")).await.unwrap());
    let state = poll_until_settled(p.as_ref(), &job).await;
    assert!(matches!(state, JobState::Expired), "{state:?}");
    let stored = h.api_get(&format!("/v1/predictions/{}", job.id)).await;
    assert_eq!((stored["output"].clone(), stored["data_removed"].clone()), (Value::Null, json!(true)));
}

#[tokio::test]
async fn a_failed_prediction_is_failed_with_its_error() {
    let h = Harness::start_with(|a| a.job_error = Some("NSFW content detected".into())).await;
    let p = h.provider(ProviderKind::Replicate);
    let job = accepted(p.submit(&request("refused later")).await.unwrap());
    match poll_until_settled(p.as_ref(), &job).await {
        JobState::Failed(why) => assert!(why.contains("NSFW"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn dropped_poll_is_ambiguous_and_polling_recovers() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    let job = accepted(p.submit(&request("x")).await.unwrap());
    h.behave(json!({"drop_response": true, "drop_on": "poll"})).await;
    assert!(matches!(p.poll(&job).await, Err(CallError::Ambiguous(_))));
    h.behave(json!({"drop_response": null, "drop_on": null})).await;
    assert!(matches!(poll_until_settled(p.as_ref(), &job).await, JobState::Done(_)));
    assert_eq!(h.charged(), 1);
}

/// A held job's query as `engine::lookup` makes it: the copy recorded `attempts` attempts of
/// task `task`, so a request sent since carries the key of a later one.
fn held_query(task: &str, prompt: &str, attempts: i64) -> providers::HeldQuery {
    let keys: Vec<String> =
        (attempts + 1..=attempts + 4).map(|k| tally_base::providers::provider_key(task, k)).collect();
    let mut req = request(prompt);
    req.task_id = task.into();
    req.idempotency_key = keys[0].clone();
    providers::HeldQuery { request: req, keys, since_ms: now_ms() - 5_000 }
}

/// What the daemon that made the copy sent: attempt `attempt` of `task`.
fn sent_by_the_original(task: &str, prompt: &str, attempt: i64) -> providers::CallRequest {
    let mut req = request(prompt);
    req.task_id = task.into();
    req.idempotency_key = tally_base::providers::provider_key(task, attempt);
    req
}

/// A held job (issue #24) is found by the seed derived from its next attempts' keys, among
/// predictions with the same prompt from other jobs; looking sends nothing paid.
#[tokio::test]
async fn a_held_job_is_found_by_the_seed_of_a_later_attempt() {
    let h = Harness::start().await;
    let p = h.provider(ProviderKind::Replicate);
    p.submit(&sent_by_the_original("other-task", "held chair", 1)).await.unwrap();
    p.submit(&request("held chair")).await.unwrap();
    let job = accepted(p.submit(&sent_by_the_original("held-task", "held chair", 2)).await.unwrap());
    assert_eq!(h.charged(), 3);
    let found = p.find_held(&held_query("held-task", "held chair", 1)).await.unwrap();
    let key = tally_base::providers::provider_key("held-task", 2);
    assert_eq!(found, providers::HeldLookup::Found { job: job.clone(), key });
    assert_eq!(h.charged(), 3, "a look is a free listing");
    // The copy recorded attempt 2 already: a request of attempt 2 is not one sent since.
    let later = p.find_held(&held_query("held-task", "held chair", 2)).await.unwrap();
    assert!(matches!(&later, providers::HeldLookup::Unsure(w) if w.contains("without its mark")), "{later:?}");
}

/// None with the job's prompt, in a listing read to its end, proves the job did not reach
/// this account; predictions with its prompt but not its mark, or two with its mark, prove
/// nothing.
#[tokio::test]
async fn a_held_job_is_absent_only_when_no_prediction_could_be_it() {
    let h = Harness::start_with(|a| a.job_duration_ms = 0).await;
    let p = h.provider(ProviderKind::Replicate);
    for i in 0..105 {
        p.submit(&request(&format!("unrelated {i}"))).await.unwrap();
    }
    let absent = p.find_held(&held_query("t-absent", "never sent", 0)).await.unwrap();
    assert!(matches!(&absent, providers::HeldLookup::Absent(w) if w.contains("read to its end")), "{absent:?}");
    p.submit(&request("same prompt")).await.unwrap();
    let unsure = p.find_held(&held_query("t-same", "same prompt", 0)).await.unwrap();
    assert!(matches!(&unsure, providers::HeldLookup::Unsure(w) if w.contains("without its mark")), "{unsure:?}");
    p.submit(&sent_by_the_original("t-twice", "twice", 1)).await.unwrap();
    p.submit(&sent_by_the_original("t-twice", "twice", 2)).await.unwrap();
    let two = p.find_held(&held_query("t-twice", "twice", 0)).await.unwrap();
    assert!(matches!(&two, providers::HeldLookup::Unsure(w) if w.contains("2 predictions")), "{two:?}");
}

/// Replicate removes inputs after its retention: a prediction that no longer shows them may
/// be the job's, so nothing is proven; a job that sets its own seed carries no mark.
#[tokio::test]
async fn a_held_job_stays_unsure_when_inputs_are_gone_or_it_sets_its_seed() {
    let h = Harness::start_with(|a| a.result_ttl_s = 0).await;
    let p = h.provider(ProviderKind::Replicate);
    let job = accepted(p.submit(&sent_by_the_original("t-gone", "gone", 1)).await.unwrap());
    assert!(matches!(poll_until_settled(p.as_ref(), &job).await, JobState::Expired));
    let gone = p.find_held(&held_query("t-gone", "gone", 0)).await.unwrap();
    assert!(matches!(&gone, providers::HeldLookup::Unsure(w) if w.contains("no longer show their inputs")), "{gone:?}");
    let mut own = held_query("t-seed", "own seed", 0);
    own.request.params = json!({"seed": 7});
    let seeded = p.find_held(&own).await.unwrap();
    assert!(matches!(&seeded, providers::HeldLookup::Unsure(w) if w.contains("sets its own `seed`")), "{seeded:?}");
}
