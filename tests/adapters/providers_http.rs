//! The OpenAI-style and cross-kind adapter tests against the in-process mock provider: each
//! asserts both what the adapter returned and what the mock's ledger recorded.

use std::time::Duration;

use serde_json::{Value, json};
use tally_base::providers::{self, CallError, ProviderConfig, ProviderKind, Submitted};

use crate::harness::*;

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
async fn base_url_ending_in_v1_works_as_the_sdks_take_it() {
    let h = Harness::start().await;
    for kind in [ProviderKind::OpenaiImages, ProviderKind::Replicate] {
        let cfg = ProviderConfig { base_url: Some(format!("{}/v1", h.mock.base_url())), ..h.config(kind) };
        providers::build(&cfg).unwrap().submit(&request("with v1")).await.unwrap();
    }
    let creates: Vec<_> = h.ledger().into_iter().filter(|l| l["charged"] == true).collect();
    assert_eq!(creates.len(), 2, "no /v1/v1 path: both creates reached the mock");
}

#[tokio::test]
async fn a_retired_openai_model_is_refused_without_charge() {
    let retired = tally_base::mock::behavior::RETIRED_OPENAI_MODELS.iter().map(|m| m.to_string()).collect();
    let h = Harness::start_with(|a| a.retired_models = Some(retired)).await;
    for model in ["gpt-image-1", "dall-e-3"] {
        let cfg = ProviderConfig { model: Some(model.into()), ..h.config(ProviderKind::OpenaiImages) };
        let err = providers::build(&cfg).unwrap().submit(&request("old model")).await.unwrap_err();
        assert!(matches!(&err, CallError::Rejected { message, .. } if message.contains("shut down")), "{err:?}");
    }
    assert_eq!(h.charged(), 0);
}

#[tokio::test]
async fn openai_result_given_as_url_is_downloaded() {
    let h = Harness::start_with(|a| a.openai_url_answers = true).await;
    match h.provider(ProviderKind::OpenaiImages).submit(&request("by url")).await.unwrap() {
        Submitted::Done(img) => assert_png(&img),
        Submitted::Accepted(_) => panic!("openai is synchronous"),
    }
    assert_eq!(h.ledger().len(), 1, "downloads are not in the ledger");
}

#[tokio::test]
async fn an_output_format_tally_cannot_store_is_refused_before_the_call() {
    let h = Harness::start().await;
    for kind in [ProviderKind::OpenaiImages, ProviderKind::Replicate, ProviderKind::FalQueue] {
        let mut req = request("a gif");
        req.params = json!({"output_format": "gif"});
        let err = h.provider(kind).preflight(&req).await.unwrap_err();
        assert!(matches!(err, CallError::Rejected { config: false, .. }), "{kind:?}: {err:?}");
    }
    assert_eq!(h.charged(), 0, "nothing paid was sent");
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
async fn idempotency_header_replays_without_charging_only_where_honoured() {
    let cfg = |h: &Harness| ProviderConfig {
        idempotency_header: Some("Idempotency-Key".into()),
        ..h.config(ProviderKind::OpenaiImages)
    };
    // A gateway that honours the key: the replay is free.
    let h = Harness::start_with(|a| a.honor_idempotency_key = true).await;
    let p = providers::build(&cfg(&h)).unwrap();
    assert!(p.capabilities().idempotent_create);
    let req = request("same thing");
    let (Submitted::Done(a), Submitted::Done(b)) = (p.submit(&req).await.unwrap(), p.submit(&req).await.unwrap())
    else {
        panic!("openai is synchronous");
    };
    assert_eq!(a, b);
    let ledger = h.ledger();
    assert_eq!((ledger[0]["charged"].as_bool(), ledger[1]["charged"].as_bool()), (Some(true), Some(false)));
    assert_eq!(ledger[1]["idempotency_key"], req.idempotency_key.as_str());
    assert_eq!(ledger[0]["job_id"], ledger[1]["job_id"]);
    // The mock's default, like OpenAI, Replicate and fal: the header is ignored, and a
    // "replay" is a second charge. That is why the header is the user's assertion, and is
    // refused at start-up for the hosts documented not to honour one.
    let h = Harness::start().await;
    let p = providers::build(&cfg(&h)).unwrap();
    p.submit(&req).await.unwrap();
    p.submit(&req).await.unwrap();
    assert_eq!(h.charged(), 2);
}

#[tokio::test]
async fn connect_refused_is_not_sent() {
    let h = Harness::start().await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg =
        ProviderConfig { base_url: Some(format!("http://127.0.0.1:{port}")), ..h.config(ProviderKind::OpenaiImages) };
    let err = providers::build(&cfg).unwrap().submit(&request("x")).await.unwrap_err();
    assert!(matches!(err, CallError::NotSent(_)), "{err:?}");
}

#[tokio::test]
async fn reference_images_are_sent_and_counted() {
    let h = Harness::start().await;
    let replicate = ProviderConfig { model: Some("acme/flux".into()), ..h.config(ProviderKind::Replicate) };
    let fal = ProviderConfig { reference_input: Some("image_urls".into()), ..h.config(ProviderKind::FalQueue) };
    for (cfg, n) in [(h.config(ProviderKind::OpenaiImages), 2), (replicate, 1), (fal, 3)] {
        let mut req = request(&format!("with {n} references"));
        req.references = vec![reference(); n];
        let p = providers::build(&cfg).unwrap();
        p.preflight(&req).await.unwrap();
        p.submit(&req).await.unwrap();
    }
    let creates: Vec<_> = h.ledger().into_iter().filter(|l| l["prompt"].is_string()).collect();
    assert_eq!(creates[0]["endpoint"], "POST /v1/images/edits");
    let counts: Vec<_> =
        creates.iter().map(|l| (l["reference_images"].as_u64().unwrap(), l["charged"] == true)).collect();
    assert_eq!(counts, vec![(2, true), (1, true), (3, true)]);
    assert_eq!(creates[0]["prompt"], "with 2 references");
}

#[tokio::test]
async fn missing_api_key_is_a_config_rejection_naming_the_variable() {
    let h = Harness::start().await;
    let cfg =
        ProviderConfig { api_key_env: Some("TALLY_TEST_NO_SUCH_KEY".into()), ..h.config(ProviderKind::OpenaiImages) };
    let p = providers::build(&cfg).unwrap();
    // Found by the preflight, before the engine records `calling`: nothing can be charged.
    let early = p.preflight(&request("x")).await.unwrap_err();
    assert!(
        matches!(&early, CallError::Rejected { message, config: true } if message.contains("TALLY_TEST_NO_SUCH_KEY")),
        "{early:?}"
    );
    let err = p.submit(&request("x")).await.unwrap_err();
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
    let adapter = providers::kinds::openai_images::OpenaiImages::new(&h.config(ProviderKind::OpenaiImages));
    let debug = format!("{adapter:?}");
    assert!(!debug.contains(KEY_VALUE), "{debug}");
    assert!(!std::fs::read_to_string(&h.ledger).unwrap().contains(KEY_VALUE));
}

/// Issue 15 item 8: a provider that quotes the key in an error gets it redacted before the
/// message goes anywhere (the task's reason, the timeline, logs).
#[tokio::test]
async fn a_provider_error_echoing_the_api_key_is_redacted() {
    let h = Harness::start().await;
    h.behave(json!({"reject_status": 401, "error_echoes_key": true})).await;
    for kind in [ProviderKind::OpenaiImages, ProviderKind::Replicate, ProviderKind::FalQueue] {
        let err = h.provider(kind).submit(&request("echo")).await.unwrap_err();
        let text = format!("{err:?} {err}");
        assert!(!text.contains(KEY_VALUE), "{kind:?}: the key leaked: {text}");
        assert!(text.contains("<redacted>"), "{kind:?}: the echo was not even seen: {text}");
    }
}

#[tokio::test]
async fn no_authorization_header_is_refused_by_the_mock() {
    let h = Harness::start().await;
    let cfg = ProviderConfig { api_key_env: None, ..h.config(ProviderKind::OpenaiImages) };
    let err = providers::build(&cfg).unwrap().submit(&request("x")).await.unwrap_err();
    assert!(matches!(err, CallError::Rejected { config: true, .. }), "{err:?}");
    assert_eq!(h.charged(), 0);
}

/// Issue 15 item 8: a 2xx answer that is too large is not "the provider rejected the request":
/// it was accepted and probably charged.
#[tokio::test]
async fn a_2xx_too_large_is_unusable_not_rejected() {
    let h = Harness::start().await;
    let cfg = ProviderConfig { max_response_bytes: 200, ..h.config(ProviderKind::OpenaiImages) };
    let err = providers::build(&cfg).unwrap().submit(&request("big")).await.unwrap_err();
    match err {
        CallError::Unusable(message) => assert!(message.contains("max_response_bytes"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.charged(), 1, "the provider did the work");
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
    assert_eq!(got["honor_idempotency_key"], false, "ignored unless told, as the real APIs do");
    let got: Value = h.behave(json!({"fail_status": null, "honour_idempotency_key": true})).await.json().await.unwrap();
    assert_eq!(got["fail_status"], Value::Null);
    assert_eq!(got["honor_idempotency_key"], true, "the British spelling is an alias");
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
