//! The OpenAPI document of the `/v1` API, served at `GET /v1/openapi.json`. It is generated
//! from the code, so it cannot drift from it:
//!
//! - every `/v1` route is registered in [`super::v1_routes`] through `utoipa_axum::routes!`,
//!   which adds the handler to the router and its `#[utoipa::path]` annotation (method, path,
//!   parameters, request body, responses) to the document in one call; a test fails if a route
//!   there is registered any other way (`tests/it/openapi.rs`);
//! - response and request bodies are the Rust types the handlers serialize and deserialize
//!   (`TaskJson`, `SetJson`, `ErrorBody`, …, all `#[derive(ToSchema)]`);
//! - what the middleware in front of every `/v1` route can answer (401, 403, 413, 415, 421 and
//!   a bad `Content-Length`'s 400) and which credentials it accepts are added here, by
//!   [`Layers`], to every operation, because the same layers wrap every route;
//! - error answers a handler can give are named in its annotation with the types below
//!   ([`NotFound`], [`StoreFailure`], [`ImageDamaged`], [`JsonRejected`]), which all describe
//!   [`ErrorBody`].
//!
//! schemathesis checks the running daemon against the document (`tests/it/openapi.rs`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::path::{HttpMethod, Operation};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{self, ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder};
use utoipa::{IntoResponses, Modify, PartialSchema, ToSchema};
use utoipa_axum::router::OpenApiRouter;

use super::auth::{CSRF_HEADER, SESSION_COOKIE};
use super::error::ErrorBody;

/// The security scheme of `Authorization: Bearer <API token>`.
pub const BEARER: &str = "bearer";
/// The security scheme of the web page's session cookie.
pub const SESSION: &str = "session";
/// The security scheme of the session's CSRF token (state-changing requests with the cookie).
pub const CSRF: &str = "csrf";

/// An error answer with `description`, its body an [`ErrorBody`].
fn error_response(description: &str) -> RefOr<openapi::Response> {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name(ErrorBody::name()))).build();
    ResponseBuilder::new().description(description).content("application/json", content).build().into()
}

/// A set of error answers to name in a handler's `responses(...)`.
macro_rules! error_set {
    ($(#[$doc:meta])* $name:ident { $($status:literal => $description:literal),+ $(,)? }) => {
        $(#[$doc])*
        pub struct $name;

        impl IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<openapi::Response>> {
                BTreeMap::from([$(($status.to_string(), error_response($description))),+])
            }
        }
    };
}

error_set! {
    /// 404: what the path names does not exist (`not_found`).
    NotFound { "404" => "Not found (`not_found`): no task, set, artifact or upload has this id." }
}

error_set! {
    /// 503: the store failed (`unavailable`); the detail is in the daemon's log.
    StoreFailure {
        "503" => "tally could not read or write its database (`unavailable`); try again, and see the daemon's log."
    }
}

error_set! {
    /// 500: a stored image is damaged (`image_damaged`): its bytes no longer match their
    /// recorded size or sha256; asking again gives the same answer.
    ImageDamaged {
        "500" => "The stored image is damaged (`image_damaged`): its bytes do not match their recorded size or \
                  sha256, so tally does not send it. Not a passing problem: `tally check` lists every damaged \
                  image. A download larger than 4 MiB that has already started ends instead with a transfer \
                  shorter than its `Content-Length`."
    }
}

error_set! {
    /// What [`super::JsonBody`] (and a non-empty [`super::OptionalJsonBody`]) refuses.
    JsonRejected {
        "400" => "The body is not valid JSON (`malformed_json`), or a header is malformed (`bad_request`).",
        "413" => "The body is larger than `server.max_body_bytes` (`body_too_large`).",
        "415" => "The body is not declared as JSON (`unsupported_media_type`).",
        "422" => "The JSON does not have the expected shape, or a value is not acceptable (`invalid_request`).",
    }
}

/// The root of the document: title, version, description and the security schemes.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "tally",
        description = "tally's local HTTP API: paid image-generation jobs (tasks), image sets, their images, \
                       and what each provider can prove after a lost answer. Every answer that is not a \
                       success is `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "see the project")
    ),
    components(schemas(ErrorBody))
)]
struct Root;

/// What the layers in front of every `/v1` route add to every operation: the credentials
/// (`auth::require_token`), and the answers of the Host, body and credential checks
/// (`auth::check_host`, `auth::check_body`, `auth::require_token`).
pub struct Layers;

impl Modify for Layers {
    fn modify(&self, doc: &mut OpenApi) {
        let components = doc.components.get_or_insert_with(openapi::Components::new);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The API token: `<data_dir>/api-token`, printed by `tally token`."))
                    .build(),
            ),
        );
        components.add_security_scheme(
            SESSION,
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                SESSION_COOKIE,
                "The web page's session cookie, set by opening a one-time sign-in URL (`tally sign-in`).",
            ))),
        );
        components.add_security_scheme(
            CSRF,
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-CSRF-Token",
                "The session's CSRF token (`GET /v1/session`); required with the cookie on every \
                 state-changing request.",
            ))),
        );
        debug_assert!(CSRF_HEADER.eq_ignore_ascii_case("X-CSRF-Token"));
        for item in doc.paths.paths.values_mut() {
            let operations = [
                (HttpMethod::Get, &mut item.get),
                (HttpMethod::Post, &mut item.post),
                (HttpMethod::Put, &mut item.put),
                (HttpMethod::Delete, &mut item.delete),
                (HttpMethod::Patch, &mut item.patch),
            ];
            for (method, op) in operations {
                if let Some(op) = op {
                    add_layer_answers(method, op);
                }
            }
        }
    }
}

/// Whether requests with this method change state (the cookie then needs the CSRF token).
fn state_changing(method: &HttpMethod) -> bool {
    !matches!(method, HttpMethod::Get | HttpMethod::Head | HttpMethod::Options)
}

fn add_layer_answers(method: HttpMethod, op: &mut Operation) {
    let changes = state_changing(&method);
    if op.security.is_none() {
        let cookie = if changes { vec![SESSION, CSRF] } else { vec![SESSION] };
        let mut with_cookie = SecurityRequirement::default();
        for scheme in cookie {
            with_cookie = with_cookie.add::<_, [&str; 0], &str>(scheme, []);
        }
        op.security = Some(vec![SecurityRequirement::new::<_, [&str; 0], &str>(BEARER, []), with_cookie]);
    }
    let mut answers = vec![
        ("400", "A malformed request: the `Content-Length` header is not a number (`bad_request`)."),
        ("401", "No valid credential: send the API token or the session cookie (`unauthorized`)."),
        ("413", "The declared body is larger than `server.max_body_bytes` (`body_too_large`)."),
        ("415", "A body that is not declared as JSON (`unsupported_media_type`)."),
        ("421", "The Host header does not name this server (`host_not_allowed`)."),
    ];
    if changes {
        answers.push((
            "403",
            "Signed in with the session cookie but without its CSRF token in `X-CSRF-Token` \
             (`csrf_token_required`).",
        ));
    }
    for (status, description) in answers {
        op.responses.responses.entry(status.to_string()).or_insert_with(|| error_response(description));
    }
}

/// The schema of a query value that is one of `T`'s names or empty: the list handlers read
/// `?status=` or `?group=` as absent.
pub fn or_empty<T: PartialSchema>() -> RefOr<openapi::schema::Schema> {
    let mut schema = T::schema();
    if let RefOr::T(openapi::schema::Schema::Object(o)) = &mut schema
        && let Some(values) = o.enum_values.as_mut()
    {
        values.push("".into());
    }
    schema
}

/// A string schema that is one of `values`.
fn one_of<I: IntoIterator<Item = S>, S: Into<serde_json::Value>>(values: I) -> openapi::schema::Object {
    openapi::schema::ObjectBuilder::new()
        .schema_type(openapi::schema::Type::String)
        .enum_values(Some(values.into_iter().map(Into::into).collect::<Vec<serde_json::Value>>()))
        .build()
}

/// The schema of `?profile=`: the built-in names, or empty (read as absent); the served
/// document adds the configured ones ([`for_daemon`]).
pub fn profile_names() -> openapi::schema::Object {
    one_of(crate::delivery::profile::builtins().into_iter().map(|p| p.name).chain([String::new()]))
}

/// The schema of `?which=`: `chosen` or `all`, or empty (read as absent).
pub fn which_names() -> openapi::schema::Object {
    one_of(["chosen", "all", ""])
}

/// The schema of a `from`/`to`: empty (absent), a date of `[ui] time_zone`, or an RFC 3339 time. The
/// pattern leaves out days past the 28th, which the server takes too, so that every string it
/// allows names a real day.
pub fn date_or_time() -> openapi::schema::Object {
    const DAY: &str = "(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])";
    const TIME: &str = "T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,3})?Z";
    openapi::schema::ObjectBuilder::new()
        .schema_type(openapi::schema::Type::String)
        .pattern(Some(format!("^({DAY}({TIME})?)?$")))
        .build()
}

/// The names this daemon takes where the server refuses any other: configured providers,
/// delivery targets and delivery profiles (built-ins included).
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct Names {
    pub providers: Vec<String>,
    pub targets: Vec<String>,
    pub profiles: Vec<String>,
}

/// The IANA zone names this build knows (the bundled database), sorted.
fn zone_names() -> Vec<String> {
    let mut all: Vec<String> = jiff::tz::db().available().map(|n| n.as_str().to_string()).collect();
    all.sort_unstable();
    all
}

/// The document as this daemon serves it: [`document_json`] with [`Names`] as the only values
/// of the request bodies' `provider`, `target` and `profile`, the zones this build knows as
/// those of `time_zone` (and of `PUT /v1/budget`'s
/// `providers` keys) and of the `profile` query parameters, so that a client that follows the
/// document never sends a name the server refuses.
pub fn for_daemon(names: &Names) -> String {
    let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(document_json()) else {
        return document_json().to_string();
    };
    let zones = zone_names();
    let list = |key: &str| match key {
        "provider" => Some(&names.providers),
        "target" => Some(&names.targets),
        "profile" => Some(&names.profiles),
        "time_zone" => Some(&zones),
        _ => None,
    };
    if let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(|v| v.as_object_mut()) {
        for (name, schema) in schemas.iter_mut().filter(|(n, _)| n.ends_with("Body")) {
            let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) else { continue };
            for (key, prop) in props.iter_mut() {
                if let Some(values) = list(key) {
                    restrict(prop, values);
                }
            }
            if name == "BudgetBody"
                && let Some(p) = props.get_mut("providers").and_then(|p| p.as_object_mut())
            {
                p.insert("propertyNames".into(), serde_json::json!({"type": "string", "enum": names.providers}));
            }
        }
    }
    if let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        for params in paths.values_mut().filter_map(|i| i.as_object_mut()).flat_map(|i| i.values_mut()) {
            for p in params.get_mut("parameters").and_then(|p| p.as_array_mut()).into_iter().flatten() {
                if p["in"] == "query"
                    && p["name"] == "profile"
                    && let Some(schema) = p.get_mut("schema")
                {
                    // Empty is read as absent.
                    let empty = names.profiles.iter().cloned().chain([String::new()]);
                    restrict(schema, &empty.collect::<Vec<_>>());
                }
            }
        }
    }
    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| document_json().to_string())
}

/// Make a string property one of `values` (`null` stays allowed where it was).
fn restrict(prop: &mut serde_json::Value, values: &[String]) {
    let nullable = match &prop["type"] {
        serde_json::Value::Array(t) => t.iter().any(|t| t == "null"),
        serde_json::Value::String(t) => t == "null",
        _ => false,
    };
    let takes_string = match &prop["type"] {
        serde_json::Value::Array(t) => t.iter().any(|t| t == "string"),
        serde_json::Value::String(t) => t == "string",
        _ => false,
    };
    if !takes_string {
        return;
    }
    let mut allowed: Vec<serde_json::Value> = values.iter().map(|v| v.as_str().into()).collect();
    if nullable {
        allowed.push(serde_json::Value::Null);
    }
    if let Some(o) = prop.as_object_mut() {
        o.insert("enum".into(), allowed.into());
    }
}

/// The whole `/v1` document, built from the same route list the server uses.
pub fn document() -> OpenApi {
    use utoipa::OpenApi as _;
    let mut doc =
        OpenApiRouter::<super::AppState>::with_openapi(Root::openapi()).nest("/v1", super::v1_routes()).into_openapi();
    Layers.modify(&mut doc);
    doc
}

/// The document as JSON text, made once per process.
pub fn document_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        document()
            .to_pretty_json()
            .unwrap_or_else(|e| format!("{{\"error\": \"the document did not serialize: {e}\"}}"))
    })
}

/// The document itself, as an opaque JSON object.
struct Document;

impl PartialSchema for Document {
    fn schema() -> RefOr<openapi::schema::Schema> {
        openapi::schema::Object::builder()
            .schema_type(openapi::schema::Type::Object)
            .description(Some("An OpenAPI 3.1 document."))
            .build()
            .into()
    }
}

impl ToSchema for Document {}

/// `GET /v1/openapi.json`: this document. It needs a credential like every `/v1` route: it
/// tells nothing secret, but one rule for all of `/v1` is simpler to trust.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "get_openapi",
    tag = "meta",
    responses((status = 200, description = "The OpenAPI document of `/v1`.", body = inline(Document)))
)]
pub async fn openapi_json(axum::extract::State(state): axum::extract::State<super::AppState>) -> Response {
    let text = state.openapi_text(|| {
        let engine = state.engine();
        let mut targets: Vec<String> = engine.delivery_targets().into_iter().map(|t| t.name).collect();
        if !targets.iter().any(|t| t == "exports") {
            targets.push("exports".into());
        }
        for_daemon(&Names {
            providers: engine.provider_names(),
            targets,
            profiles: state.delivery_profiles().into_iter().map(|p| p.name).collect(),
            // (The same list `GET /v1/delivery/profiles` shows.)
        })
    });
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], text.to_string()).into_response()
}
