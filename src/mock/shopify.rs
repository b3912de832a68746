//! The mock's stand-in for Shopify's Admin GraphQL API (issue #38), under `/admin`: a
//! `shopify` delivery target's `base_url` is the mock's own URL. Written from Shopify's
//! documentation of the Admin GraphQL API (2024-07 and later) and held to the excerpt of its
//! schema in `tests/fixtures/shopify-admin-excerpt.json`:
//!
//! - `POST /admin/api/{version}/graphql.json` needs `X-Shopify-Access-Token` (else 401
//!   `{"errors": "[API] Invalid API key or access token …"}`) and a JSON body
//!   `{query, variables}`; one store with one product, `gid://shopify/Product/1`, handle
//!   `demo-product`.
//! - Queries: `product(id:) { media(first:) { nodes { id status } } }`,
//!   `productByIdentifier(identifier: {handle})`, `files(first:, query: "filename:…")`.
//! - Mutations: `stagedUploadsCreate(input: [StagedUploadInput!]!)` (a `PUT` target on this
//!   server, `/admin/_staged/{key}`), `fileCreate(files: [FileCreateInput!]!)` (with
//!   `duplicateResolutionMode: RAISE_ERROR` a taken file name is a `userErrors` entry),
//!   `fileUpdate(files: [FileUpdateInput!]!)` with `referencesToAdd`/`referencesToRemove`
//!   (product ids; a file must be `READY`). Unknown fields or arguments are GraphQL errors;
//!   documented failures are `userErrors` with `field`, `message` and `code`.
//! - A cost bucket: 1000 points, restored at 50 a second; a query costs 1 + 1 per root field,
//!   a mutation 10. Each answer carries `extensions.cost.throttleStatus`; a request that does
//!   not fit answers `{"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED"}}]}`.
//! - Knobs (`PUT /admin/_mock`, JSON): `lose` (root field names whose next answer is lost after
//!   it took effect: a 502 with no body), `available` (the bucket's points now), `processing`
//!   (how many lookups a new file stays `UPLOADED` before `READY`).
//!   `GET /admin/_mock` shows the store's state (files, the product's media).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use serde_json::{Map, Value, json};

use super::shopify_gql::{Field, parse, project};

/// The product the store starts with.
const PRODUCT: &str = "gid://shopify/Product/1";
const HANDLE: &str = "demo-product";
const BUCKET_MAX: f64 = 1000.0;
const RESTORE_RATE: f64 = 50.0;

/// The root fields and arguments the stand-in accepts (checked against Shopify's schema
/// excerpt by a test).
pub const ACCEPTED: &[(&str, &[&str])] = &[
    ("product", &["id"]),
    ("productByIdentifier", &["identifier"]),
    ("files", &["first", "query"]),
    ("stagedUploadsCreate", &["input"]),
    ("fileCreate", &["files"]),
    ("fileUpdate", &["files"]),
];

/// Input object fields the stand-in accepts (checked against the schema excerpt).
pub const INPUT_FIELDS: &[(&str, &[&str])] = &[
    ("StagedUploadInput", &["filename", "mimeType", "resource", "httpMethod", "fileSize"]),
    ("FileCreateInput", &["originalSource", "filename", "contentType", "alt", "duplicateResolutionMode"]),
    ("FileUpdateInput", &["id", "alt", "filename", "originalSource", "referencesToAdd", "referencesToRemove"]),
];

#[derive(Debug, Clone)]
struct File {
    id: String,
    filename: String,
    bytes: usize,
    /// The sha256 (hex) of the uploaded bytes, shown by `GET /admin/_mock` for tests.
    sha256: String,
    /// Lookups left before it is `READY`.
    processing: u32,
}

#[derive(Debug, Default)]
struct Store {
    files: Vec<File>,
    /// The product's media, in order (file ids: a `MediaImage` is both).
    media: Vec<String>,
    staged: HashMap<String, Option<Vec<u8>>>,
    next: u64,
    available: f64,
    at: Option<Instant>,
    lose: Vec<String>,
    processing: u32,
    /// `http://{Host}` of the request being answered (staged upload URLs are absolute).
    origin: String,
}

/// The stand-in's state.
#[derive(Debug, Default)]
pub(super) struct Shop(Mutex<Store>);

/// The routes under `/admin`, with their own state.
pub(super) fn routes() -> Router {
    let shop = Arc::new(Shop(Mutex::new(Store { available: BUCKET_MAX, ..Default::default() })));
    Router::new()
        .route("/api/{version}/graphql.json", post(graphql))
        .route("/_staged/{key}", put(staged))
        .route("/_mock", put(knobs).get(show))
        .with_state(shop)
}

fn gql_error(status: StatusCode, message: &str, code: Option<&str>) -> Response {
    let mut e = json!({ "message": message });
    if let Some(c) = code {
        e["extensions"] = json!({ "code": c });
    }
    (status, axum::Json(json!({ "errors": [e] }))).into_response()
}

async fn knobs(State(shop): State<Arc<Shop>>, body: axum::body::Bytes) -> Response {
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "a JSON object").into_response();
    };
    let mut s = shop.0.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = v.get("lose").and_then(Value::as_array) {
        s.lose = l.iter().filter_map(|x| x.as_str().map(String::from)).collect();
    }
    if let Some(a) = v.get("available").and_then(Value::as_f64) {
        s.available = a.clamp(0.0, BUCKET_MAX);
        s.at = Some(Instant::now());
    }
    if let Some(p) = v.get("processing").and_then(Value::as_u64) {
        s.processing = p as u32;
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn show(State(shop): State<Arc<Shop>>) -> Response {
    let s = shop.0.lock().unwrap_or_else(|e| e.into_inner());
    let files: Vec<Value> = s
        .files
        .iter()
        .map(|f| json!({"id": f.id, "filename": f.filename, "bytes": f.bytes, "sha256": f.sha256}))
        .collect();
    axum::Json(json!({ "files": files, "media": s.media })).into_response()
}

async fn staged(State(shop): State<Arc<Shop>>, Path(key): Path<String>, body: axum::body::Bytes) -> Response {
    let mut s = shop.0.lock().unwrap_or_else(|e| e.into_inner());
    match s.staged.get_mut(&key) {
        Some(slot) => {
            *slot = Some(body.to_vec());
            StatusCode::OK.into_response()
        }
        None => (StatusCode::FORBIDDEN, "<Error><Code>AccessDenied</Code></Error>").into_response(),
    }
}

async fn graphql(
    State(shop): State<Arc<Shop>>,
    Path(_version): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let token = headers.get("x-shopify-access-token").and_then(|v| v.to_str().ok()).unwrap_or("");
    if token.trim().is_empty() {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(
                json!({"errors": "[API] Invalid API key or access token (unrecognized login or wrong password)"}),
            ),
        )
            .into_response();
    }
    let Ok(req) = serde_json::from_slice::<Value>(&body) else {
        return gql_error(StatusCode::BAD_REQUEST, "Invalid JSON in request body", None);
    };
    let Some(query) = req.get("query").and_then(Value::as_str) else {
        return gql_error(StatusCode::BAD_REQUEST, "Parameter Missing or Invalid", None);
    };
    let vars = req.get("variables").and_then(Value::as_object).cloned().unwrap_or_default();
    let (mutation, fields) = match parse(query, &vars) {
        Ok(p) => p,
        Err(why) => return gql_error(StatusCode::OK, &why, None),
    };
    for f in &fields {
        let Some((_, args)) = ACCEPTED.iter().find(|(n, _)| *n == f.name) else {
            let on = if mutation { "Mutation" } else { "QueryRoot" };
            return gql_error(StatusCode::OK, &format!("Field '{}' doesn't exist on type '{on}'", f.name), None);
        };
        if let Some(a) = f.args.keys().find(|a| !args.contains(&a.as_str())) {
            return gql_error(StatusCode::OK, &format!("Field '{}' doesn't accept argument '{a}'", f.name), None);
        }
    }
    let mut s = shop.0.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    let elapsed = s.at.map(|t| now.duration_since(t).as_secs_f64()).unwrap_or(0.0);
    s.available = (s.available + elapsed * RESTORE_RATE).min(BUCKET_MAX);
    s.at = Some(now);
    let cost = if mutation { 10.0 } else { 1.0 + fields.len() as f64 };
    let status = |s: &Store| {
        json!({"cost": {"requestedQueryCost": cost, "actualQueryCost": cost, "throttleStatus": {
            "maximumAvailable": BUCKET_MAX, "currentlyAvailable": s.available.floor(), "restoreRate": RESTORE_RATE}}})
    };
    if s.available < cost {
        let mut out = json!({"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED",
            "documentation": "https://shopify.dev/api/usage/rate-limits"}}]});
        out["extensions"] = status(&s);
        out["extensions"]["cost"]["actualQueryCost"] = Value::Null;
        return axum::Json(out).into_response();
    }
    s.available -= cost;
    s.origin = format!("http://{}", headers.get("host").and_then(|v| v.to_str().ok()).unwrap_or("127.0.0.1"));
    let mut data = Map::new();
    let mut lost = false;
    for f in &fields {
        let full = match resolve(&mut s, f) {
            Ok(v) => v,
            Err(why) => return gql_error(StatusCode::OK, &why, None),
        };
        if let Some(i) = s.lose.iter().position(|l| *l == f.name) {
            s.lose.remove(i);
            lost = true;
        }
        data.insert(f.key.clone(), project(&full, &f.fields));
    }
    if lost {
        return StatusCode::BAD_GATEWAY.into_response();
    }
    axum::Json(json!({ "data": data, "extensions": status(&s) })).into_response()
}

fn user_error(field: &[&str], message: &str, code: &str) -> Value {
    json!({ "field": field, "message": message, "code": code })
}

/// Check that every object in `list` (an input list) names only `allowed` fields.
fn check_inputs(list: &Value, ty: &str) -> Result<Vec<Map<String, Value>>, String> {
    let allowed = INPUT_FIELDS.iter().find(|(n, _)| *n == ty).map(|(_, f)| *f).unwrap_or(&[]);
    let items = match list {
        Value::Array(a) => a.clone(),
        Value::Object(_) => vec![list.clone()],
        _ => return Err(format!("Variable of type [{ty}!]! was provided invalid value")),
    };
    let mut out = Vec::new();
    for it in items {
        let Value::Object(m) = it else { return Err(format!("Expected value to be an object of type {ty}")) };
        if let Some(k) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(format!("InputObject '{ty}' doesn't accept argument '{k}'"));
        }
        out.push(m);
    }
    Ok(out)
}

fn file_json(f: &File) -> Value {
    let status = if f.processing == 0 { "READY" } else { "UPLOADED" };
    json!({"__typename": "MediaImage", "id": f.id, "fileStatus": status, "status": status, "alt": "",
           "image": {"url": format!("https://cdn.shopify.com/s/files/{}", f.filename)},
           "originalSource": {"fileSize": f.bytes}})
}

fn resolve(s: &mut Store, f: &Field) -> Result<Value, String> {
    let str_arg = |k: &str| f.args.get(k).and_then(Value::as_str).map(String::from);
    match f.name.as_str() {
        "product" => {
            if str_arg("id").as_deref() != Some(PRODUCT) {
                return Ok(Value::Null);
            }
            let nodes: Vec<Value> = s
                .media
                .iter()
                .filter_map(|id| s.files.iter().find(|x| &x.id == id))
                .map(|x| {
                    json!({"id": x.id, "status": if x.processing == 0 { "READY" } else { "UPLOADED" },
                                "mediaContentType": "IMAGE"})
                })
                .collect();
            Ok(json!({"id": PRODUCT, "handle": HANDLE, "media": {"nodes": nodes}}))
        }
        "productByIdentifier" => {
            let h = f.args.get("identifier").and_then(|i| i.get("handle")).and_then(Value::as_str);
            let id = f.args.get("identifier").and_then(|i| i.get("id")).and_then(Value::as_str);
            Ok(if h == Some(HANDLE) || id == Some(PRODUCT) {
                json!({"id": PRODUCT, "handle": HANDLE})
            } else {
                Value::Null
            })
        }
        "files" => {
            let q = str_arg("query").unwrap_or_default();
            let want = q.strip_prefix("filename:").map(|n| n.trim_matches(['"', '\'', ' ']).to_string());
            let mut nodes = Vec::new();
            for x in s.files.iter_mut() {
                if want.as_ref().is_none_or(|w| *w == x.filename) {
                    x.processing = x.processing.saturating_sub(1);
                    nodes.push(file_json(x));
                }
            }
            Ok(json!({"nodes": nodes}))
        }
        "stagedUploadsCreate" => {
            let inputs = check_inputs(f.args.get("input").unwrap_or(&Value::Null), "StagedUploadInput")?;
            let mut targets = Vec::new();
            for i in inputs {
                if i.get("resource").and_then(Value::as_str) != Some("IMAGE") {
                    return Ok(
                        json!({"stagedTargets": [], "userErrors": [user_error(&["input", "0", "resource"], "Resource must be IMAGE for an image", "INVALID")]}),
                    );
                }
                s.next += 1;
                let key = format!("u{}", s.next);
                s.staged.insert(key.clone(), None);
                targets.push(json!({"url": format!("{}/admin/_staged/{key}", s.origin),
                    "resourceUrl": format!("shopify-staged://{key}"),
                    "parameters": [{"name": "content_type", "value": i.get("mimeType").cloned().unwrap_or(Value::Null)},
                                   {"name": "acl", "value": "private"}]}));
            }
            Ok(json!({"stagedTargets": targets, "userErrors": []}))
        }
        "fileCreate" => {
            let inputs = check_inputs(f.args.get("files").unwrap_or(&Value::Null), "FileCreateInput")?;
            let mut files = Vec::new();
            let mut errors = Vec::new();
            for (n, i) in inputs.iter().enumerate() {
                let src = i.get("originalSource").and_then(Value::as_str).unwrap_or("");
                let bytes = src.strip_prefix("shopify-staged://").and_then(|k| s.staged.get(k).cloned().flatten());
                let Some(bytes) = bytes else {
                    errors.push(user_error(
                        &["files", &n.to_string(), "originalSource"],
                        "Image URL is invalid",
                        "INVALID",
                    ));
                    continue;
                };
                let filename = i.get("filename").and_then(Value::as_str).unwrap_or("image.png").to_string();
                let mode = i.get("duplicateResolutionMode").and_then(Value::as_str).unwrap_or("APPEND_UUID");
                if s.files.iter().any(|x| x.filename == filename) {
                    if mode == "RAISE_ERROR" {
                        errors.push(user_error(
                            &["files", &n.to_string(), "filename"],
                            &format!("A file with the name '{filename}' already exists."),
                            "DUPLICATE_FILENAME_ERROR",
                        ));
                        continue;
                    }
                    return Err("the stand-in only takes duplicateResolutionMode: RAISE_ERROR for a taken name".into());
                }
                s.next += 1;
                let sha256: String = {
                    use sha2::Digest;
                    sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
                };
                let id = format!("gid://shopify/MediaImage/{}", s.next);
                let file = File { id, filename, bytes: bytes.len(), sha256, processing: s.processing };
                files.push(file_json(&file));
                s.files.push(file);
            }
            Ok(json!({"files": files, "userErrors": errors}))
        }
        "fileUpdate" => {
            let inputs = check_inputs(f.args.get("files").unwrap_or(&Value::Null), "FileUpdateInput")?;
            let mut files = Vec::new();
            let mut errors = Vec::new();
            for (n, i) in inputs.iter().enumerate() {
                let id = i.get("id").and_then(Value::as_str).unwrap_or("");
                let Some(file) = s.files.iter().find(|x| x.id == id).cloned() else {
                    errors.push(user_error(
                        &["files", &n.to_string(), "id"],
                        &format!("File id {id} does not exist."),
                        "FILE_DOES_NOT_EXIST",
                    ));
                    continue;
                };
                if file.processing > 0 {
                    errors.push(user_error(
                        &["files", &n.to_string(), "id"],
                        "Non-ready files cannot be updated.",
                        "NON_READY_STATE",
                    ));
                    continue;
                }
                let ids = |k: &str| -> Vec<String> {
                    i.get(k)
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
                        .unwrap_or_default()
                };
                let (add, remove) = (ids("referencesToAdd"), ids("referencesToRemove"));
                if let Some(bad) = add.iter().chain(remove.iter()).find(|p| *p != PRODUCT) {
                    errors.push(user_error(
                        &["files", &n.to_string(), "referencesToAdd"],
                        &format!("Product id {bad} does not exist."),
                        "PRODUCT_DOES_NOT_EXIST",
                    ));
                    continue;
                }
                if !add.is_empty() && !s.media.contains(&file.id) {
                    s.media.push(file.id.clone());
                }
                if !remove.is_empty() {
                    s.media.retain(|m| *m != file.id);
                }
                files.push(file_json(&file));
            }
            Ok(json!({"files": files, "userErrors": errors}))
        }
        other => Err(format!("Field '{other}' doesn't exist")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stand-in accepts only names Shopify's schema has (the checked-in excerpt), and the
    /// `shopify` target's requests parse and pass the stand-in's checks.
    #[test]
    fn accepted_names_are_in_shopify_s_schema_excerpt() {
        let excerpt: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/shopify-admin-excerpt.json")).expect("excerpt");
        for (field, args) in ACCEPTED {
            let known = excerpt["query"].get(*field).or_else(|| excerpt["mutation"].get(*field));
            let known = known.and_then(Value::as_array).unwrap_or_else(|| panic!("{field} is not in the excerpt"));
            for a in *args {
                assert!(known.iter().any(|k| k == a), "{field}({a}:) is not in the excerpt");
            }
        }
        for (ty, fields) in INPUT_FIELDS {
            let known =
                excerpt["input_objects"][*ty].as_array().unwrap_or_else(|| panic!("{ty} is not in the excerpt"));
            for f in *fields {
                assert!(known.iter().any(|k| k == f), "{ty}.{f} is not in the excerpt");
            }
        }
        let modes = excerpt["enums"]["FileCreateInputDuplicateResolutionMode"].as_array().expect("enum");
        assert!(modes.iter().any(|m| m == "RAISE_ERROR"), "the target's duplicateResolutionMode is Shopify's");
    }

    #[test]
    fn an_unknown_argument_is_refused() {
        let (_, fields) =
            parse("mutation { fileCreate(files: [], bogus: 1) { files { id } } }", &Map::new()).expect("parses");
        let args = ACCEPTED.iter().find(|(n, _)| *n == "fileCreate").map(|(_, a)| *a).unwrap_or(&[]);
        assert!(fields[0].args.keys().any(|a| !args.contains(&a.as_str())));
        let err = check_inputs(&json!([{"originalSource": "x", "bogus": 1}]), "FileCreateInput").expect_err("refused");
        assert!(err.contains("bogus"), "{err}");
    }
}
