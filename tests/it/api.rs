//! The HTTP API: idempotent submit, a demo task end to end, the safe local defaults (token,
//! Host, body limits, content type), errors in one JSON shape, cancel, and — in process, with
//! a scripted fake provider — the retry of an `unknown` task and an operator's resolve.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tally::api::{AppState, app};
use tally::config::{Config, Durability};
use tally::domain::TaskStatus;
use tally::engine::{Engine, EngineParts, ProviderEntry};
use tally::providers::Capabilities;
use tally::providers::fake::{Fake, Step};
use tally::store::Store;
use tower::ServiceExt;

use crate::common::{Daemon, FAST_DEMO, TempDir, request, sha256_hex};

#[test]
fn idempotent_submit_gives_201_then_200_then_409() {
    let d = Daemon::start(FAST_DEMO);
    let key = uuid::Uuid::new_v4().to_string();
    let first = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "red sneaker", "idempotency_key": key})));
    assert_eq!(first.status, 201, "{:?}", first.json());
    let again = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "red sneaker", "idempotency_key": key})));
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["id"], first.json()["id"]);
    let other = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "blue sneaker", "idempotency_key": key})));
    assert_eq!(other.status, 409);
    assert_eq!(other.error_code(), "idempotency_conflict");

    // The header works like the field; header and field that differ are refused.
    let auth = format!("Bearer {}", d.token());
    let body = br#"{"prompt": "red sneaker"}"#;
    let hdrs =
        [("Authorization", auth.as_str()), ("Content-Type", "application/json"), ("Idempotency-Key", key.as_str())];
    let via_header = request(d.port, "POST", "/v1/tasks", &hdrs, Some(body));
    assert_eq!(via_header.status, 200);
    let both = br#"{"prompt": "red sneaker", "idempotency_key": "other"}"#;
    assert_eq!(request(d.port, "POST", "/v1/tasks", &hdrs, Some(both)).status, 400);
}

/// `GET /v1/tasks?q=` searches every job, not a page of them, and `tally list --search` with it;
/// an empty `q` lists everything and an overlong one is refused.
#[test]
fn search_finds_jobs_by_prompt_through_the_api_and_the_cli() {
    let d = Daemon::start(FAST_DEMO);
    for p in ["red sneaker on white", "blue mug", "Red SNEAKER at dusk", "green hat"] {
        assert_eq!(d.call("POST", "/v1/tasks", Some(&json!({ "prompt": p }))).status, 201);
    }
    let prompts = |path: &str| -> Vec<String> {
        let r = d.call("GET", path, None);
        assert_eq!(r.status, 200, "{path}: {:?}", r.json());
        r.json()["tasks"].as_array().expect("tasks").iter().map(|t| t["prompt"].as_str().unwrap_or("").into()).collect()
    };
    assert_eq!(prompts("/v1/tasks?q=sneaker"), ["Red SNEAKER at dusk", "red sneaker on white"]);
    assert_eq!(prompts("/v1/tasks?q=sneaker&limit=1").len(), 1);
    assert_eq!(prompts("/v1/tasks?q=").len(), 4, "an empty search is no search");
    let long = "x".repeat(201);
    assert_eq!(d.call("GET", &format!("/v1/tasks?q={long}"), None).status, 400);
    let out = d.cli(&["list", "--search", "MUG"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("blue mug") && !text.contains("sneaker"), "{text}");
}

#[test]
fn demo_task_succeeds_with_a_verified_png() {
    let d = Daemon::start(FAST_DEMO);
    let t = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "a white mug"}))).json();
    let done = d.wait_status(t["id"].as_str().unwrap(), &["succeeded", "failed", "unknown"]);
    assert_eq!(done["status"], "succeeded", "{done}");
    for k in ["id", "status", "message", "attempts", "provider", "prompt", "params", "created_at", "updated_at"] {
        assert!(done.get(k).is_some(), "task JSON lacks {k}");
    }
    assert_eq!(done["retry"]["allowed"], false);
    let art = &done["artifacts"][0];
    let url = art["url"].as_str().unwrap();
    assert!(url.starts_with("/v1/artifacts/"));
    let img = d.call("GET", url, None);
    assert_eq!(img.status, 200);
    assert_eq!(img.header("content-type"), Some("image/png"));
    assert!(img.body.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_eq!(sha256_hex(&img.body), art["sha256"].as_str().unwrap());
    assert_eq!(img.body.len() as u64, art["bytes"].as_u64().unwrap());
    // Streamed from the database with its recorded size, and a name a person recognises.
    assert_eq!(img.header("content-length"), Some(img.body.len().to_string().as_str()));
    let cd = img.header("content-disposition").unwrap_or_default();
    let short = &art["id"].as_str().unwrap().replace('-', "")[24..];
    assert!(cd.starts_with(&format!("inline; filename=\"a-white-mug_{short}.png\"")), "{cd}");

    let events = d.call("GET", &format!("/v1/tasks/{}/events", done["id"].as_str().unwrap()), None).json();
    let events = events["events"].as_array().unwrap();
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| e["at"].is_string() && e["actor"].is_string() && e["message"].is_string()));

    let list = d.call("GET", "/v1/tasks?status=succeeded&limit=10", None).json();
    assert_eq!(list["tasks"][0]["id"], done["id"]);
    assert!(list["next"].is_null());

    let metrics = request(d.port, "GET", "/metrics", &[], None);
    assert_eq!(metrics.status, 200);
    assert!(String::from_utf8_lossy(&metrics.body).contains("# TYPE tally_tasks"));
    assert_eq!(request(d.port, "GET", "/healthz", &[], None).status, 200);
}

#[test]
fn token_host_and_body_rules() {
    let d = Daemon::start(FAST_DEMO);
    let auth = format!("Bearer {}", d.token());
    let with_token = [("Authorization", auth.as_str())];

    let no_token = request(d.port, "GET", "/v1/tasks", &[], None);
    assert_eq!(no_token.status, 401);
    assert_eq!(no_token.error_code(), "unauthorized");
    assert_eq!(request(d.port, "GET", "/v1/tasks", &[("Authorization", "Bearer wrong")], None).status, 401);
    assert_eq!(request(d.port, "GET", "/v1/tasks", &with_token, None).status, 200);

    for host in ["evil.example", "127.0.0.1.evil.example", "127.0.0.1.evil.example:80", "localhost.evil"] {
        let hdrs = [("Authorization", auth.as_str()), ("Host", host)];
        let r = request(d.port, "GET", "/v1/tasks", &hdrs, None);
        assert_eq!(r.status, 421, "Host {host}");
        assert_eq!(r.error_code(), "host_not_allowed");
        assert_eq!(request(d.port, "GET", "/healthz", &[("Host", host)], None).status, 421, "Host {host}");
    }
    for host in ["localhost", "127.0.0.1", "[::1]:9"] {
        let hdrs = [("Authorization", auth.as_str()), ("Host", host)];
        assert_eq!(request(d.port, "GET", "/v1/tasks", &hdrs, None).status, 200, "Host {host}");
    }

    // A declared 20 MiB body gets 413 at once, though only 64 KiB are sent.
    let big = [("Authorization", auth.as_str()), ("Content-Type", "application/json"), ("Content-Length", "20971520")];
    let mut partial = b"{\"prompt\": \"".to_vec();
    partial.extend(std::iter::repeat_n(b'x', 65536));
    let r = request(d.port, "POST", "/v1/tasks", &big, Some(&partial));
    assert_eq!(r.status, 413);
    assert_eq!(r.error_code(), "body_too_large");

    let json_hdrs = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
    let malformed = request(d.port, "POST", "/v1/tasks", &json_hdrs, Some(b"{\"prompt\": "));
    assert_eq!(malformed.status, 400);
    assert_eq!(malformed.error_code(), "malformed_json");
    let wrong_shape = request(d.port, "POST", "/v1/tasks", &json_hdrs, Some(br#"{"prompt": 5}"#));
    assert_eq!(wrong_shape.status, 422);
    let unknown_field =
        request(d.port, "POST", "/v1/tasks", &json_hdrs, Some(br#"{"prompt": "x", "idempotencykey": "k"}"#));
    assert_eq!(unknown_field.status, 422);
    let empty_prompt = request(d.port, "POST", "/v1/tasks", &json_hdrs, Some(br#"{"prompt": "  "}"#));
    assert_eq!(empty_prompt.status, 422);
    let bad_provider =
        request(d.port, "POST", "/v1/tasks", &json_hdrs, Some(br#"{"prompt": "x", "provider": "nope"}"#));
    assert_eq!(bad_provider.status, 422);

    let text = [("Authorization", auth.as_str()), ("Content-Type", "text/plain")];
    let r = request(d.port, "POST", "/v1/tasks", &text, Some(br#"{"prompt": "x"}"#));
    assert_eq!(r.status, 415);
    assert_eq!(r.error_code(), "unsupported_media_type");
    assert_eq!(request(d.port, "POST", "/v1/tasks", &with_token, Some(br#"{"prompt": "x"}"#)).status, 415);
    let cancel_text = request(d.port, "POST", "/v1/tasks/x/cancel", &text, Some(b"please"));
    assert_eq!(cancel_text.status, 415);

    let missing = d.call("GET", &format!("/v1/tasks/{}", uuid::Uuid::new_v4()), None);
    assert_eq!(missing.status, 404);
    assert_eq!(missing.error_code(), "not_found");
    assert_eq!(d.call("GET", "/v1/artifacts/nope", None).status, 404);
    assert_eq!(d.call("POST", "/v1/tasks/nope/cancel", None).status, 404);
    assert_eq!(d.call("GET", "/v1/tasks?status=bogus", None).status, 400);
    assert_eq!(d.call("GET", "/v1/tasks?limit=abc", None).status, 400);
    let wrong_method = d.call("DELETE", "/v1/tasks", None);
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.error_code(), "method_not_allowed");
    // No CORS headers, ever.
    assert!(missing.header("access-control-allow-origin").is_none());
}

#[test]
fn cancel_of_a_queued_task() {
    let d = Daemon::start("[[providers]]\nname = \"slow\"\nkind = \"demo\"\nmax_concurrency = 1\ndelay_ms = 600000\n");
    let first = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "occupies the only slot"}))).json();
    d.wait_status(first["id"].as_str().unwrap(), &["running"]);
    let second = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "stays queued"}))).json();
    let id = second["id"].as_str().unwrap();
    assert!(["queued", "waiting"].contains(&second["status"].as_str().unwrap()));
    let r = d.call("POST", &format!("/v1/tasks/{id}/cancel"), None);
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(r.json()["status"], "canceled");
    assert_eq!(r.json()["retry"]["allowed"], true);
    assert_eq!(r.json()["retry"]["requires_cost_acknowledgement"], false);
    // Cancelling again: already settled.
    assert_eq!(d.call("POST", &format!("/v1/tasks/{id}/cancel"), None).status, 409);
    // A running task: cancel requested, the provider's result will be kept.
    let running = d.call("POST", &format!("/v1/tasks/{}/cancel", first["id"].as_str().unwrap()), None);
    assert_eq!(running.status, 202);
    assert_eq!(running.json()["cancel_requested"], true);
}

/// An in-process API over an engine whose only provider is a scripted fake.
struct InProcess {
    _dir: TempDir,
    engine: Arc<Engine>,
    router: axum::Router,
    token: String,
}

impl InProcess {
    async fn start(fake: Fake) -> InProcess {
        let dir = TempDir::new();
        let cfg = Config::defaults();
        let store = Store::open(&dir.path().join("tally.db"), Durability::Normal).expect("open store");
        let engine = Engine::start(EngineParts {
            store,
            config: cfg.engine.clone(),
            clock: Arc::new(tally::clock::SystemClock),
            providers: vec![ProviderEntry::new("fake", Arc::new(fake), 2)],
            data_dir: dir.path().to_path_buf(),
            metrics: Arc::new(tally::metrics::Metrics::new()),
            limits: Vec::new(),
        })
        .await
        .expect("start engine");
        let engine = Arc::new(engine);
        let token = "t".repeat(64);
        let router =
            app(AppState::new(engine.clone(), token.clone(), &cfg.server, "fake".into()), tally::web::routes());
        InProcess { _dir: dir, engine, router, token }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1:7700")
            .header("authorization", format!("Bearer {}", self.token));
        let body = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Body::from(b.to_string())
            }
            None => Body::empty(),
        };
        let resp = self.router.clone().oneshot(req.body(body).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() })
    }

    /// Submit a task and wait (on the engine's change feed) until it is `unknown`.
    async fn unknown_task(&self, prompt: &str) -> String {
        let mut changes = self.engine.subscribe();
        let (st, t) = self.call("POST", "/v1/tasks", Some(json!({ "prompt": prompt }))).await;
        assert_eq!(st, StatusCode::CREATED);
        let id = t["id"].as_str().unwrap().to_string();
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match changes.recv().await {
                    Ok(c) if c.task_id == id && c.status == TaskStatus::Unknown => break,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(e) => panic!("change feed closed: {e}"),
                }
            }
        })
        .await
        .expect("task became unknown");
        id
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_of_unknown_needs_cost_acknowledgement() {
    let fake = Fake::new(Capabilities::default());
    fake.script([Step::AcceptAndLose]);
    let api = InProcess::start(fake).await;
    let id = api.unknown_task("lost answer").await;

    let (st, t) = api.call("GET", &format!("/v1/tasks/{id}"), None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(t["status"], "unknown");
    assert!(t["message"].as_str().unwrap().contains("cannot be confirmed"), "{t}");
    assert_eq!(t["retry"]["allowed"], true);
    assert_eq!(t["retry"]["requires_cost_acknowledgement"], true);
    assert!(t["retry"]["note"].as_str().unwrap().contains("charged again"));
    assert!(t["billing_note"].is_string());

    let (st, e) = api.call("POST", &format!("/v1/tasks/{id}/retry"), None).await;
    assert_eq!(st, StatusCode::CONFLICT);
    assert_eq!(e["error"]["code"], "cost_acknowledgement_required");
    assert!(e["error"]["message"].as_str().unwrap().contains("new operation that may be charged again"));
    let (st, _) =
        api.call("POST", &format!("/v1/tasks/{id}/retry"), Some(json!({"acknowledge_possible_charge": false}))).await;
    assert_eq!(st, StatusCode::CONFLICT);

    let (st, new) =
        api.call("POST", &format!("/v1/tasks/{id}/retry"), Some(json!({"acknowledge_possible_charge": true}))).await;
    assert_eq!(st, StatusCode::CREATED, "{new}");
    assert_eq!(new["retry_of"], id.as_str());
    assert_ne!(new["id"], id.as_str());

    // A succeeded-or-running task cannot be retried; an unknown id is 404.
    let (st, _) = api.call("POST", &format!("/v1/tasks/{}/retry", uuid::Uuid::new_v4()), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    api.engine.shutdown().await;
    let _ = api.engine.store().close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_resolves_unknown_tasks() {
    let fake = Fake::new(Capabilities::default());
    fake.script([Step::AcceptAndLose, Step::AcceptAndLose]);
    let api = InProcess::start(fake).await;
    let a = api.unknown_task("first").await;
    let b = api.unknown_task("second").await;

    let (st, _) = api.call("POST", &format!("/v1/tasks/{a}/resolve"), Some(json!({"outcome": "succeeded"}))).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    let (st, _) = api.call("POST", &format!("/v1/tasks/{a}/resolve"), Some(json!({"outcome": "maybe"}))).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    let not_image = json!({"outcome": "succeeded", "image_base64": "aGVsbG8="});
    assert_eq!(
        api.call("POST", &format!("/v1/tasks/{a}/resolve"), Some(not_image)).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    let (st, t) = api
        .call(
            "POST",
            &format!("/v1/tasks/{a}/resolve"),
            Some(json!({"outcome": "failed", "note": "checked the dashboard"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{t}");
    assert_eq!(t["status"], "failed");
    let (st, _) = api.call("POST", &format!("/v1/tasks/{a}/resolve"), Some(json!({"outcome": "failed"}))).await;
    assert_eq!(st, StatusCode::CONFLICT);

    use base64::Engine as _;
    let png = tally::render::placeholder_png("found it", 8);
    let body = json!({"outcome": "succeeded", "image_base64": base64::prelude::BASE64_STANDARD.encode(&png)});
    let (st, t) = api.call("POST", &format!("/v1/tasks/{b}/resolve"), Some(body)).await;
    assert_eq!(st, StatusCode::OK, "{t}");
    assert_eq!(t["status"], "succeeded");
    assert_eq!(t["artifacts"][0]["sha256"], sha256_hex(&png).as_str());
    let (_, ev) = api.call("GET", &format!("/v1/tasks/{b}/events"), None).await;
    assert!(ev["events"].as_array().unwrap().iter().any(|e| e["actor"] == "operator"));
    api.engine.shutdown().await;
    let _ = api.engine.store().close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_with_a_cursor() {
    let fake = Fake::new(Capabilities::default());
    let api = InProcess::start(fake).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let (st, t) = api.call("POST", "/v1/tasks", Some(json!({ "prompt": format!("p{i}") }))).await;
        assert_eq!(st, StatusCode::CREATED);
        ids.push(t["id"].as_str().unwrap().to_string());
    }
    ids.reverse();
    let (_, p1) = api.call("GET", "/v1/tasks?limit=2", None).await;
    let got: Vec<&str> = p1["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(got, [ids[0].as_str(), ids[1].as_str()]);
    let next = p1["next"].as_str().unwrap();
    let (_, p2) = api.call("GET", &format!("/v1/tasks?limit=2&before={next}"), None).await;
    assert_eq!(p2["tasks"][0]["id"], ids[2].as_str());
    let (_, p3) = api.call("GET", &format!("/v1/tasks?limit=2&before={}", p2["next"].as_str().unwrap()), None).await;
    assert_eq!(p3["tasks"].as_array().unwrap().len(), 1);
    assert!(p3["next"].is_null());
    api.engine.shutdown().await;
    let _ = api.engine.store().close();
}

/// A failed fsync (simulated: the same poisoning the flusher does) makes `/healthz` answer 503
/// `failing` with the reason, refuses writes with 503, and tells the daemon to stop.
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn healthz_reports_a_failed_fsync_and_writes_are_refused() {
    let api = InProcess::start(Fake::new(Capabilities::default())).await;
    let (st, body) = api.call("GET", "/healthz", None).await;
    assert_eq!((st, body["status"].as_str()), (StatusCode::OK, Some("ok")));
    api.engine.store().sqlite().expect("sqlite").poison_for_tests();
    let (st, body) = api.call("GET", "/healthz", None).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "failing");
    let reason = body["reason"].as_str().unwrap_or("");
    assert!(reason.contains("the disk failed to save data: fsync of"), "{body}");
    let (st, body) = api.call("POST", "/v1/tasks", Some(json!({ "prompt": "after the failure" }))).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let why = tokio::time::timeout(Duration::from_secs(10), api.engine.failure()).await.expect("the daemon is told");
    assert_eq!(why, reason);
}

/// Providers and keys change only from the computer that runs tally: a request whose
/// connection came over the network is refused (403), whatever its credential; nothing saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_settings_are_refused_over_the_network() {
    let d = InProcess::start(Fake::new(Capabilities::default())).await;
    for (peer, want) in [("10.0.0.7:5555", StatusCode::FORBIDDEN), ("127.0.0.1:5555", StatusCode::CREATED)] {
        let body = json!({"name": format!("p{}", want.as_u16()), "kind": "demo"});
        let mut req = Request::builder()
            .method("POST")
            .uri("/v1/providers")
            .header("host", "127.0.0.1:7700")
            .header("authorization", format!("Bearer {}", d.token))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let addr: std::net::SocketAddr = peer.parse().unwrap();
        req.extensions_mut().insert(tally::server::Peer(addr));
        let resp = d.router.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), want, "from {peer}");
    }
    let (_, list) = d.call("GET", "/v1/providers", None).await;
    let names: Vec<&str> = list["providers"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(names.contains(&"p201") && !names.contains(&"p403"), "{names:?}");
}
