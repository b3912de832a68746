//! Provider servers that misbehave on purpose (small axum servers on loopback, written
//! here): a listing whose `next` link points at another origin, a gateway that answers a
//! create with an unreachable image URL, a 2xx that is not an image or never ends. Each
//! test is a regression test for an item of issue 15 and fails on the code before its fix.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use serde_json::{Value, json};
use tally::config::{ProviderConfig, ProviderKind};
use tally::providers::{self, CallError};

use crate::common::{Daemon, free_port};
use crate::harness::{KEY_ENV, KEY_VALUE, init, request};

/// What a hostile server saw: one entry per request, with its `Authorization` header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

fn record(seen: &Seen, what: &str, headers: &HeaderMap) {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
    seen.lock().unwrap_or_else(|e| e.into_inner()).push((what.to_string(), auth));
}

/// Serve `router` on a free loopback port; the server stops with the test's runtime.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await.ok() });
    format!("http://{addr}")
}

fn config(kind: ProviderKind, base: &str, model: &str) -> ProviderConfig {
    ProviderConfig {
        name: "hostile".into(),
        kind,
        base_url: Some(base.into()),
        api_key_env: Some(KEY_ENV.into()),
        model: Some(model.into()),
        max_response_bytes: 4096,
        ..ProviderConfig::demo()
    }
}

/// Issue 15 item 4: the Replicate listing's `next` link is followed (with the API key) only
/// when its origin is base_url's; `http://host:P@evil:Q/…` has the evil origin.
#[tokio::test]
async fn listing_next_link_to_another_origin_gets_no_key() {
    init();
    let evil_seen: Seen = Arc::default();
    let evil = serve(
        Router::new()
            .fallback(|State(seen): State<Seen>, h: HeaderMap| async move {
                record(&seen, "evil", &h);
                axum::Json(json!({"results": [], "next": null}))
            })
            .with_state(evil_seen.clone()),
    )
    .await;
    let next: Arc<Mutex<String>> = Arc::default();
    let schema = json!({"latest_version": {"id": "v1", "openapi_schema": {"components": {"schemas": {
        "Input": {"properties": {"prompt": {"type": "string"}}}}}}}});
    let replicate = serve(
        Router::new()
            .route("/v1/models/{owner}/{name}", get(move || async move { axum::Json(schema.clone()) }))
            .route(
                "/v1/predictions",
                get(|State(next): State<Arc<Mutex<String>>>| async move {
                    let next = next.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    axum::Json(json!({"results": [], "next": next}))
                }),
            )
            .with_state(next.clone()),
    )
    .await;
    let host_port = replicate.trim_start_matches("http://");
    let evil_host_port = evil.trim_start_matches("http://");
    *next.lock().unwrap() = format!("http://{host_port}@{evil_host_port}/v1/predictions?cursor=100");
    let p = providers::build(&config(ProviderKind::Replicate, &replicate, "acme/flux")).expect("adapter");
    assert_eq!(p.find(&request("lost")).await.expect("the listing answers"), None);
    let seen = evil_seen.lock().unwrap().clone();
    assert!(seen.iter().all(|(_, auth)| auth.is_none()), "the API key went to another origin: {seen:?}");
    assert!(seen.is_empty(), "the off-origin next link was followed: {seen:?}");
}

/// A gateway that answers creates with `body` and counts them.
async fn gateway(body: Value) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let base = serve(
        Router::new()
            .route(
                "/v1/images/generations",
                post(move |State(seen): State<Seen>, h: HeaderMap| async move {
                    record(&seen, "create", &h);
                    axum::Json(body.clone())
                }),
            )
            .route(
                "/v1/images/edits",
                post(|State(seen): State<Seen>, h: HeaderMap| async move {
                    record(&seen, "endless", &h);
                    let chunk = axum::body::Bytes::from(vec![b'x'; 1024]);
                    let endless = futures_util::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
                    axum::body::Body::from_stream(endless)
                }),
            )
            .with_state(seen.clone()),
    )
    .await;
    (base, seen)
}

/// Issue 15 item 3: once the create has answered, nothing can be "not sent": an image URL
/// that cannot be fetched (here: a closed port) is an unusable answer to a paid request,
/// never `NotSent` (which the engine would send again).
#[tokio::test]
async fn a_download_after_the_create_answer_is_never_not_sent() {
    init();
    let dead = free_port();
    let (base, seen) =
        gateway(json!({"created": 1, "data": [{"url": format!("http://127.0.0.1:{dead}/image.png")}]})).await;
    let p = providers::build(&config(ProviderKind::OpenaiImages, &base, "gpt-image-2.5-flare")).expect("adapter");
    // The download is retried (a blip is not final) until the engine's deadline for the call.
    let req = tally::providers::CallRequest {
        deadline_ms: crate::harness::now_ms() + 1500,
        operation: Default::default(),
        ..request("download fails")
    };
    let err = p.submit(&req).await.unwrap_err();
    assert!(matches!(err, CallError::Unusable(_)), "{err:?}");
    assert_eq!(seen.lock().unwrap().len(), 1, "one create, never sent again");
}

/// Issue 15 item 8: a 2xx that is not an image, or that never ends, is not "the provider
/// rejected the request": it was accepted (and probably charged) and is unusable.
#[tokio::test]
async fn a_2xx_that_is_not_an_image_or_never_ends_is_unusable_not_rejected() {
    init();
    let (base, _) = gateway(json!({"created": 1, "data": [{"b64_json": "aGVsbG8gd29ybGQ="}]})).await;
    let p = providers::build(&config(ProviderKind::OpenaiImages, &base, "gpt-image-2.5-flare")).expect("adapter");
    let err = p.submit(&request("not an image")).await.unwrap_err();
    assert!(matches!(&err, CallError::Unusable(m) if m.contains("not a PNG")), "{err:?}");
    let mut edit = request("endless");
    edit.references = vec![crate::harness::reference()];
    let err = p.submit(&edit).await.unwrap_err();
    assert!(matches!(&err, CallError::Unusable(m) if m.contains("max_response_bytes")), "{err:?}");
}

/// Issue 15 item 3 through the real daemon: the task ends failed (invalid result, probably
/// charged) after exactly one create; it is never retried as "not sent".
#[test]
fn a_paid_create_whose_image_cannot_be_downloaded_is_never_sent_again() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let dead = free_port();
    let (base, seen) =
        rt.block_on(gateway(json!({"created": 1, "data": [{"url": format!("http://127.0.0.1:{dead}/x.png")}]})));
    let providers = format!(
        "[[providers]]\nname = \"gw\"\nkind = \"openai_images\"\nbase_url = \"{base}\"\napi_key_env = \"TALLY_TEST_KEY\"\n\
         model = \"gpt-image-2.5-flare\"\nconnect_timeout_ms = 500\n"
    );
    // The download is retried until the recovery deadline (a blip is not final): keep it short.
    let engine = "max_attempts = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 100\nrecovery_deadline_secs = 2\n";
    let mut d = Daemon::configure_with(engine, &providers);
    d.env.push(("TALLY_TEST_KEY".into(), KEY_VALUE.into()));
    d.spawn();
    let (code, id) = crate::common::submit(&d, "gw", "unreachable image", "k-1").expect("submit");
    assert_eq!(code, 201);
    let t = d.wait_status(&id, &["succeeded", "failed", "unknown"]);
    assert_eq!((t["status"].as_str(), t["failure_kind"].as_str()), (Some("failed"), Some("invalid_result")), "{t}");
    assert!(
        t["message"].as_str().unwrap_or("").contains("probably charged") || t.to_string().contains("probably charged"),
        "{t}"
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(seen.lock().unwrap().len(), 1, "the paid create was sent once: {t}");
    drop(rt);
}
