//! The OpenAPI document of `/v1` (`GET /v1/openapi.json`) against the code that serves it and
//! against the running daemon:
//!
//! - the document and the router come from one list (`api::v1_routes`): every documented
//!   operation reaches its handler, every route in that list is registered through
//!   `routes!` (so it carries its annotation), and every annotated handler is in the document;
//! - every operation names its path parameters, the error answers of the layers in front of
//!   it, and the credentials it takes;
//! - schemathesis (pinned, from PyPI: `scripts/install-schemathesis.sh`) runs against a real
//!   `tally serve` with the demo provider and a provider backed by a real `tally
//!   mock-provider`, seeded with a finished task, an `unknown` one, a set, an upload and an
//!   image, and finds no 5xx and no answer whose status, content type, headers or body the
//!   document does not describe.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};
use tally::api::{AppState, app};
use tally::config::{Config, Durability};
use tally::engine::{Engine, EngineParts, ProviderEntry};
use tally::providers::demo::Demo;
use tally::store::Store;
use tower::ServiceExt;

use crate::common::{Daemon, Mock, OPENAI_MODEL, TempDir, request};

const METHODS: &[&str] = &["get", "post", "put", "delete", "patch", "head", "options"];

fn doc() -> Value {
    serde_json::to_value(tally::api::openapi::document()).expect("the document serializes")
}

/// Every documented (method, path), e.g. `("post", "/v1/tasks/{id}/retry")`.
fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if item.get(*m).is_some() {
                out.push((m.to_string(), path.clone()));
            }
        }
    }
    out
}

fn source(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let p = entry.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The router, in process, over an engine with the demo provider.
async fn router() -> (TempDir, axum::Router, String) {
    let dir = TempDir::new();
    let cfg = Config::defaults();
    let store = Store::open(&dir.path().join("tally.db"), Durability::Normal).expect("open store");
    let engine = Engine::start(EngineParts {
        store,
        config: cfg.engine.clone(),
        clock: Arc::new(tally::clock::SystemClock),
        providers: vec![ProviderEntry::new("demo", Arc::new(Demo::new(Duration::ZERO, 8)), 2)],
        data_dir: dir.path().to_path_buf(),
        metrics: Arc::new(tally::metrics::Metrics::new()),
        limits: Vec::new(),
    })
    .await
    .expect("start engine");
    let token = "t".repeat(64);
    let router = app(AppState::new(Arc::new(engine), token.clone(), &cfg.server, "demo".into()), tally::web::routes());
    (dir, router, token)
}

/// Each documented operation, called with the API token and ids that name nothing, is
/// answered by a handler: neither by the `/v1` fallback (404 "route not found") nor by the
/// method fallback (405). So nothing in the document is missing from the router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_reaches_its_handler() {
    let (_dir, router, token) = router().await;
    let doc = doc();
    let ops = operations(&doc);
    assert!(ops.len() >= 22, "only {} operations documented", ops.len());
    for (method, path) in ops {
        let uri = path
            .replace("{id}", "no-such-id")
            .replace("{index}", "0")
            .replace("{position}", "0")
            .replace("{name}", "no-such-provider");
        assert!(!uri.contains('{'), "{path}: a path parameter this test does not fill");
        let req = Request::builder()
            .method(method.to_uppercase().as_str())
            .uri(&uri)
            .header("host", "127.0.0.1:7700")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .expect("request");
        let resp = router.clone().oneshot(req).await.expect("answer");
        let status = resp.status().as_u16();
        if resp.headers().get("content-type").is_some_and(|v| v == "text/event-stream") {
            assert_eq!(status, 200, "{method} {path}");
            continue; // the stream never ends; its head is enough
        }
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("body");
        let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert_ne!(status, 405, "{method} {path}: the router has no such method here");
        assert!(
            !(status == 404 && json["error"]["message"] == "route not found"),
            "{method} {path}: documented but not routed"
        );
    }
}

/// The `/v1` router is built only in `api::v1_routes`, and only from `routes!` calls, each of
/// which registers a handler together with its `#[utoipa::path]` annotation. A route added
/// any other way (`.route`, `.nest`, `.merge`, a service) would be served but undocumented,
/// so it fails here.
#[test]
fn every_v1_route_is_registered_with_its_annotation() {
    let text = source("src/api/mod.rs");
    let start = text.find("pub fn v1_routes()").expect("api::v1_routes");
    let body = &text[start..start + text[start..].find("\n}\n").expect("end of v1_routes")];
    let calls: Vec<&str> = body.lines().map(str::trim).filter(|l| l.starts_with('.')).collect();
    assert!(calls.len() >= 20, "{calls:?}");
    for call in &calls {
        assert!(call.starts_with(".routes(routes!("), "v1_routes registers a route without its annotation: {call}");
    }
    // The app serves `/v1` from that list alone.
    let app_fn = &text[text.find("pub fn app(").expect("api::app")..];
    assert!(app_fn.contains("v1_routes().split_for_parts()"), "api::app no longer builds /v1 from v1_routes");
    assert_eq!(app_fn.matches(".nest(").count(), 1, "a second router nested into the app");
}

/// Every handler annotated with `#[utoipa::path]` is in the document (an annotated handler
/// left out of `v1_routes` would be documented nowhere and served nowhere), and each handler
/// named in `v1_routes` is an operation.
#[test]
fn every_annotated_handler_is_in_the_document() {
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    let annotated: usize =
        files.iter().map(|f| std::fs::read_to_string(f).unwrap_or_default().matches("#[utoipa::path(").count()).sum();
    let doc = doc();
    let documented = operations(&doc);
    assert_eq!(annotated, documented.len(), "annotated handlers vs documented operations: {documented:?}");
    let ids: BTreeSet<String> = documented
        .iter()
        .map(|(m, p)| doc["paths"][p][m]["operationId"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(ids.len(), documented.len(), "operation ids are not unique: {ids:?}");
}

/// What every operation must say: each `{param}` of its path, the answers of the layers in
/// front of every `/v1` route (401 without a credential, 421 for a foreign Host, 413, 415,
/// 400; 403 without the CSRF token for state-changing ones), each error as the one error
/// shape, and the credentials it takes. Every `$ref` names a schema in the document.
#[test]
fn every_operation_documents_its_parameters_errors_and_credentials() {
    let doc = doc();
    assert_eq!(doc["openapi"], "3.1.0");
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["scheme"], "bearer");
    assert_eq!(
        (schemes["session"]["in"].as_str(), schemes["session"]["name"].as_str()),
        (Some("cookie"), Some("tally_session"))
    );
    assert_eq!(
        (schemes["csrf"]["in"].as_str(), schemes["csrf"]["name"].as_str()),
        (Some("header"), Some("X-CSRF-Token"))
    );
    for (method, path) in operations(&doc) {
        let op = &doc["paths"][&path][&method];
        let params: BTreeSet<&str> = op["parameters"]
            .as_array()
            .map(|a| a.iter().filter(|p| p["in"] == "path").filter_map(|p| p["name"].as_str()).collect())
            .unwrap_or_default();
        let in_path: BTreeSet<&str> =
            path.split('/').filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}'))).collect();
        assert_eq!(params, in_path, "{method} {path}: path parameters");
        let mut must = vec!["400", "401", "413", "415", "421"];
        if method != "get" {
            must.push("403");
        }
        for status in must {
            let r = &op["responses"][status];
            assert_eq!(
                r["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody",
                "{method} {path}: {status}"
            );
        }
        assert!(op["responses"].as_object().is_some_and(|r| r.keys().any(|k| k.starts_with('2'))), "{method} {path}");
        let security = op["security"].as_array().unwrap_or_else(|| panic!("{method} {path}: no security"));
        assert!(security.iter().any(|s| s.get("bearer").is_some()), "{method} {path}: the API token");
        if path != "/v1/session/sign-in-url" {
            let cookie = security.iter().find(|s| s.get("session").is_some()).expect("the session cookie");
            assert_eq!(cookie.get("csrf").is_some(), method != "get", "{method} {path}: CSRF with the cookie");
        }
    }
    let text = doc.to_string();
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    for piece in text.split("\"#/components/schemas/").skip(1) {
        let name = &piece[..piece.find('"').expect("end of a $ref")];
        assert!(schemas.contains_key(name), "$ref to a missing schema {name}");
    }
}

/// `GET /v1/openapi.json` needs a credential like every `/v1` route and serves the very
/// document the code builds.
#[test]
fn the_document_is_served_to_a_credential_only() {
    let d = Daemon::start(crate::common::FAST_DEMO);
    assert_eq!(request(d.port, "GET", "/v1/openapi.json", &[], None).status, 401);
    let r = d.call("GET", "/v1/openapi.json", None);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    // The code's document, with the names this daemon takes where it refuses any other.
    let names = |path: &str, list: &str, key: &str| -> Vec<String> {
        let v = d.call("GET", path, None).json();
        v[list].as_array().expect("a list").iter().filter_map(|x| x[key].as_str().map(String::from)).collect()
    };
    let names = tally::api::openapi::Names {
        providers: names("/v1/providers", "providers", "name"),
        targets: names("/v1/delivery/targets", "targets", "name"),
        profiles: names("/v1/delivery/profiles", "profiles", "name"),
    };
    assert!(names.providers.iter().any(|p| p == "demo") && names.targets.iter().any(|t| t == "exports"), "{names:?}");
    let want: Value = serde_json::from_str(&tally::api::openapi::for_daemon(&names)).expect("JSON");
    let served = r.json();
    assert_eq!(served, want);
    let budget = &served["components"]["schemas"]["BudgetBody"]["properties"]["providers"];
    assert_eq!(budget["propertyNames"]["enum"], json!(names.providers), "{budget}");
    let task = &served["components"]["schemas"]["SubmitBody"]["properties"]["provider"];
    assert!(task["enum"].as_array().is_some_and(|e| e.contains(&json!("demo"))), "{task}");
    assert_eq!(served["paths"], {
        let mut code = doc();
        let mut paths = code["paths"].take();
        // Only the `profile` parameters' values differ.
        for item in paths.as_object_mut().expect("paths").values_mut() {
            for op in item.as_object_mut().expect("item").values_mut() {
                for p in op.get_mut("parameters").and_then(|p| p.as_array_mut()).into_iter().flatten() {
                    if p["name"] == "profile" {
                        let mut names = names.profiles.clone();
                        names.push(String::new());
                        p["schema"]["enum"] = json!(names);
                    }
                }
            }
        }
        paths
    });
}

/// The schemathesis executable of `target/schemathesis-venv`, or why there is none.
fn schemathesis() -> Result<PathBuf, String> {
    let exe = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/schemathesis-venv/bin/schemathesis");
    if exe.exists() {
        Ok(exe)
    } else {
        Err(format!("{} is missing: run scripts/install-schemathesis.sh (scripts/test.sh does)", exe.display()))
    }
}

/// Seed the daemon with something of each kind, so generated requests reach more than 404s:
/// (a succeeded task and its artifact, an `unknown` task, a set, an upload).
struct Seeds {
    tasks: Vec<String>,
    artifact: String,
    set: String,
    upload: String,
}

fn seed(d: &Daemon, mock: &Mock) -> Seeds {
    let done = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "seed: a white mug"}))).json();
    let done = d.wait_status(done["id"].as_str().expect("task id"), &["succeeded"]);
    let artifact = done["artifacts"][0]["id"].as_str().expect("artifact").to_string();
    mock.behave(json!({"drop_response": true, "drop_on": "create"}));
    let lost = d.call("POST", "/v1/tasks", Some(&json!({"prompt": "seed: lost answer", "provider": "mock"}))).json();
    let lost = d.wait_status(lost["id"].as_str().expect("task id"), &["unknown", "failed", "succeeded"]);
    assert_eq!(lost["status"], "unknown", "{lost}");
    mock.behave(json!({"drop_response": null}));
    let auth = format!("Bearer {}", d.token());
    let png = tally::render::placeholder_png("seed reference", 16);
    let up =
        request(d.port, "POST", "/v1/uploads", &[("Authorization", &auth), ("Content-Type", "image/png")], Some(&png));
    assert_eq!(up.status, 201);
    let upload = up.json()["id"].as_str().expect("upload id").to_string();
    let set = d
        .call(
            "POST",
            "/v1/sets",
            Some(&json!({"product": "seed sneaker", "references": [upload], "shots": [{"role": "main", "prompt": "on white"}]})),
        )
        .json();
    let set = set["id"].as_str().unwrap_or_else(|| panic!("set: {set}")).to_string();
    let tasks = vec![done["id"].as_str().expect("id").to_string(), lost["id"].as_str().expect("id").to_string()];
    Seeds { tasks, artifact, set, upload }
}

/// A schemathesis configuration that offers the seeded ids for half of the generated path
/// parameters (the other half stay random, so 404s are exercised too).
fn config(seeds: &Seeds) -> String {
    let list = |v: &[String]| v.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ");
    let mut text = String::new();
    for (name, values) in [
        ("task", list(&seeds.tasks)),
        ("artifact", list(std::slice::from_ref(&seeds.artifact))),
        ("set", list(std::slice::from_ref(&seeds.set))),
        ("upload", list(std::slice::from_ref(&seeds.upload))),
    ] {
        text.push_str(&format!("[dictionaries.{name}]\nvalues = [{values}]\n\n"));
    }
    for (regex, name) in
        [("^/v1/tasks/", "task"), ("^/v1/artifacts/", "artifact"), ("^/v1/sets/", "set"), ("^/v1/uploads/", "upload")]
    {
        text.push_str(&format!(
            "[[operations]]\ninclude-path-regex = \"{regex}\"\nparameters = {{ \"path.id\" = {{ dictionary = \"{name}\", probability = 0.5 }} }}\n\n"
        ));
    }
    // A schema-valid request is accepted (`positive_data_acceptance`) but where a rule spans
    // two fields, or needs what the daemon holds, which JSON Schema as generated here does not
    // state; each operation's extra refusal is documented on it, and named here with its rule.
    let accepted = |extra: &[&str]| {
        let mut all = vec!["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"];
        all.extend_from_slice(extra);
        all.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ")
    };
    for (method, path, extra) in [
        // The Idempotency-Key header and the body's `idempotency_key` must agree (400); a
        // generation needs a prompt, an edit or cutout an image (422).
        ("POST", "/v1/tasks", &["400", "422"][..]),
        ("POST", "/v1/sets", &["400"][..]),
        ("POST", "/v1/sets/{id}/duplicate", &["400"][..]),
        ("POST", "/v1/sets/{id}/start", &["400"][..]),
        ("POST", "/v1/tasks/{id}/retry", &["400"][..]),
        // `succeeded` needs `image_base64`.
        ("POST", "/v1/tasks/{id}/resolve", &["422"][..]),
        // The body must be the bytes of a PNG, JPEG or WebP image.
        ("POST", "/v1/uploads", &["400", "422"][..]),
        // An edit or cutout needs an image of the shot's, and a provider that offers it.
        ("POST", "/v1/sets/{id}/shots/{index}/candidates", &["422"][..]),
        // A provider's settings are checked against its kind (model, base URL, key).
        ("POST", "/v1/providers", &["422"][..]),
        // With the API token (no session of its own) only `{"all": true}` means something.
        ("POST", "/v1/session/sign-out", &["422"][..]),
        // A draft's photos must be uploads the daemon holds, and readable; a revision is checked
        // like a model's answer, against the draft (its language, the facts its copy names).
        ("POST", "/v1/drafts", &["422"][..]),
        ("PATCH", "/v1/drafts/{id}", &["422"][..]),
        // `to` must be later than `from`.
        ("GET", "/v1/spend", &["400"][..]),
        ("GET", "/v1/spend/requests", &["400"][..]),
    ] {
        text.push_str(&format!(
            "[[operations]]\ninclude-path = \"{path}\"\ninclude-method = \"{method}\"\n\
             checks.positive_data_acceptance.expected-statuses = [{}]\n\n",
            accepted(extra)
        ));
    }
    text
}

/// schemathesis against the real daemon: no 5xx, and every answer's status, content type,
/// headers and body as the document says. Bounded: a few examples per operation and a time
/// budget (a request may take 30 s: a download with a profile renders every image, slow in a
/// debug build on a loaded machine). `GET /v1/stream` is left out: its answer never ends, so a generated request could
/// only time out (the stream is tested by the web tests).
#[test]
fn schemathesis_finds_no_server_error_and_no_answer_outside_the_document() {
    let exe = match schemathesis() {
        Ok(exe) => exe,
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{why}"),
        Err(why) => panic!("{why} (this test never skips; outside CI too, install it first)"),
    };
    let mock = Mock::start(&[]);
    let providers = format!(
        "{}\n[[providers]]\nname = \"mock\"\nkind = \"openai_images\"\nbase_url = \"{}\"\nmodel = \"{OPENAI_MODEL}\"\n\
         api_key_env = \"TALLY_TEST_KEY\"\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 1000\n\
         price_per_image = 0.04\ncurrency = \"USD\"\n",
        crate::common::FAST_DEMO,
        mock.base()
    );
    let mut d = Daemon::configure(&providers);
    d.env.push(("TALLY_TEST_KEY".into(), "sk-test-openapi".into()));
    d.spawn();
    let seeds = seed(&d, &mock);
    let cfg = d.dir.path().join("schemathesis.toml");
    std::fs::write(&cfg, config(&seeds)).expect("write schemathesis.toml");
    // The document as the daemon serves it, from a file: loaded from its URL, schemathesis
    // leaves out the operation that served it (`GET /v1/openapi.json`).
    let served = d.call("GET", "/v1/openapi.json", None);
    assert_eq!(served.status, 200);
    let file = d.dir.path().join("openapi.json");
    std::fs::write(&file, &served.body).expect("write openapi.json");
    let base = format!("http://127.0.0.1:{}", d.port);
    let started = Instant::now();
    let out = Command::new(&exe)
        .current_dir(d.dir.path())
        .arg("--config-file")
        .arg(&cfg)
        .arg("run")
        .arg(&file)
        .args(["--url", &base])
        .args(["--header", &format!("Authorization: Bearer {}", d.token())])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,\
             response_schema_conformance,negative_data_rejection,positive_data_acceptance,unsupported_method,ignored_auth",
        ])
        .args(["--exclude-path", "/v1/stream"])
        .args(["--max-examples", "25", "--max-time", "50", "--request-timeout", "30", "--workers", "1"])
        .args(["--seed", "15", "--no-color", "--generation-database", "none"])
        .output()
        .expect("run schemathesis");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("schemathesis took {:.1} s", started.elapsed().as_secs_f64());
    assert!(out.status.success(), "schemathesis found problems:\n{text}\n--- daemon stderr:\n{}", d.stderr());
    // It really tested every operation but the stream (a run that tested nothing also exits 0).
    let total = operations(&doc()).len();
    assert!(text.contains(&format!("Tested: {}", total - 1)), "{text}");
    assert!(!d.stderr().contains("panicked"), "{}", d.stderr());
}

/// Issue 43's item 7, one by one: where the document was looser than the server, it now says
/// what the server takes, and where the server refused what the document allows, it takes it.
#[test]
fn the_served_document_is_as_strict_as_the_server() {
    let d = Daemon::start(crate::common::FAST_DEMO);
    let doc = d.call("GET", "/v1/openapi.json", None).json();
    let schema = |name: &str, prop: &str| doc["components"]["schemas"][name]["properties"][prop].clone();
    // Prune's age: one number and a unit; the server refuses any other string.
    let pattern = schema("PruneBody", "older_than")["pattern"].as_str().expect("a pattern").to_string();
    assert_eq!(pattern, "^[0-9]{1,5}(s|m|h|d|w)$");
    assert_eq!(d.call("POST", "/v1/prune", Some(&json!({"older_than": "#", "dry_run": true}))).status, 422);
    assert_eq!(d.call("POST", "/v1/prune", Some(&json!({"older_than": "99999w", "dry_run": true}))).status, 200);
    // `which` and `profile` are enums of what the server takes.
    let params = &doc["paths"]["/v1/sets/{id}/download"]["get"]["parameters"];
    let param = |name: &str| params.as_array().expect("params").iter().find(|p| p["name"] == name).cloned();
    // (Empty is read as absent.)
    assert_eq!(param("which").expect("which")["schema"]["enum"], json!(["chosen", "all", ""]));
    let profiles = param("profile").expect("profile")["schema"]["enum"].clone();
    assert!(profiles.as_array().is_some_and(|p| p.contains(&json!("amazon")) && p.contains(&json!(""))));
    // A budget's providers are the configured ones: an empty name is outside the document,
    // and the server refuses it.
    let names = &schema("BudgetBody", "providers")["propertyNames"]["enum"];
    assert_eq!(names, &json!(["demo"]));
    let r = d.call("PUT", "/v1/budget", Some(&json!({"providers": {"": {"daily": 1.0}}})));
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    // Budget amounts: below 10^12, as the server checks, read exactly (no rounding up to 10^12).
    assert_eq!(schema("BudgetBody", "monthly")["exclusiveMaximum"].as_f64(), Some(1e12));
    // Held release: `all` releases all, named ones among them; neither releases nothing.
    for body in [json!({"all": true, "ids": ["x"]}), json!({"all": false, "ids": []})] {
        let r = d.call("POST", "/v1/held/release", Some(&body));
        assert_eq!(r.status, 200, "{body}: {}", String::from_utf8_lossy(&r.body));
    }
    // A page size past 500 is 500, whatever its digits (up to int64); a shot's position may be
    // written `1.0`.
    assert_eq!(d.call("GET", "/v1/tasks?limit=6503987309096092041", None).status, 200);
    assert_eq!(d.call("GET", "/v1/held?limit=9223372036854775808", None).status, 400);
    let role = schema("ShotEditBody", "role");
    assert!(role.to_string().contains("selling_point"), "{role}");
}
