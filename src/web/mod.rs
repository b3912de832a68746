//! The web page a shop owner uses instead of curl: a small static bundle (HTML, JS, CSS)
//! embedded with `include_str!` and served by the daemon, the one-time sign-in URL
//! (`/login?code=…` → session cookie), the session routes under `/v1`, and the live event
//! stream ([`stream`]). It changes state only through the `/v1` API, like any other client.
//!
//! Sign-in works like other local daemons: `tally serve` (or `tally sign-in`) prints a URL
//! with a one-time code; opening it creates an in-memory session and sets
//! `tally_session=<id>; HttpOnly; SameSite=Strict; Path=/`. The page then sends the
//! session's CSRF token (embedded in the HTML) in `X-CSRF-Token` on every state-changing
//! request.

pub mod i18n;
pub mod sessions;
pub mod stream;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::AppState;
use crate::api::auth::{Credential, SESSION_COOKIE, session_cookie};
use crate::api::error::{ApiError, ErrorBody};
use sessions::CODE_LIFETIME;

const INDEX_HTML: &str = include_str!("assets/index.html");
const SIGNED_OUT_HTML: &str = include_str!("assets/signed-out.html");
/// The page's static files: name, content type, body (served under `/assets/`).
const ASSETS: &[(&str, &str, &str)] = &[
    ("core.js", "text/javascript; charset=utf-8", include_str!("assets/core.js")),
    ("jobs.js", "text/javascript; charset=utf-8", include_str!("assets/jobs.js")),
    ("job.js", "text/javascript; charset=utf-8", include_str!("assets/job.js")),
    ("sets.js", "text/javascript; charset=utf-8", include_str!("assets/sets.js")),
    ("budget.js", "text/javascript; charset=utf-8", include_str!("assets/budget.js")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("assets/app.js")),
    ("app.css", "text/css; charset=utf-8", include_str!("assets/app.css")),
    ("favicon.svg", "image/svg+xml", include_str!("assets/favicon.svg")),
];

/// The placeholder in `index.html` replaced by the session's CSRF token.
const CSRF_PLACEHOLDER: &str = "{{CSRF_TOKEN}}";

/// The page's Content-Security-Policy: only its own script, style, images and API.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; \
                   connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The page's routes outside `/v1` (they pass the Host check like every route).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/login", get(login))
        .route("/assets/{name}", get(asset))
        .route("/favicon.ico", get(|| async { asset(axum::extract::Path("favicon.svg".to_string())).await }))
}

/// The sign-in URL for a one-time code, under the daemon's base URL.
pub fn login_url(base: &str, code: &str) -> String {
    format!("{base}/login?code={code}")
}

/// The line `tally serve` prints at start-up: a one-time sign-in URL with no deadline.
pub fn sign_in_line(base: &str, state: &AppState) -> String {
    let code = state.sessions().new_code(None);
    format!(
        "sign in to the web page (the link works once; `tally sign-in` prints a new one): {}",
        login_url(base, &code)
    )
}

/// `GET /assets/{name}`: one of the embedded files, else 404.
async fn asset(axum::extract::Path(name): axum::extract::Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => {
            ([(header::CONTENT_TYPE, *content_type), (header::CACHE_CONTROL, "no-cache")], *body).into_response()
        }
        None => ApiError::not_found("asset").into_response(),
    }
}

/// An HTML answer with the page's security headers.
fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    r
}

/// `GET /`: the page for a signed-in browser (with its CSRF token embedded), else a short
/// page saying how to sign in.
async fn index(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let session = match session_cookie(&headers) {
        Some(id) => state.sessions().get(&id).await,
        None => None,
    };
    // The page's language (the switch's cookie, `ui.language`, Accept-Language), and a Vary
    // so that a cache never serves one language for another.
    let lang = i18n::choose(&headers, state.ui_language());
    let mut r = match session {
        Some(s) => html(StatusCode::OK, i18n::render(&INDEX_HTML.replace(CSRF_PLACEHOLDER, &s.csrf_token), lang)),
        None => html(
            StatusCode::OK,
            i18n::render(&SIGNED_OUT_HTML.replace(ADDRESS_PLACEHOLDER, &escape_html(&page_base(&headers))), lang),
        ),
    };
    r.headers_mut().insert(header::VARY, HeaderValue::from_static("Accept-Language, Cookie"));
    r
}

/// The placeholder in `signed-out.html` replaced by the address this page was opened at.
const ADDRESS_PLACEHOLDER: &str = "{{ADDRESS}}";

/// `http://<Host>` of a request (the Host check already accepted it, so it names this
/// daemon as the browser reached it).
fn page_base(headers: &HeaderMap) -> String {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("127.0.0.1");
    format!("http://{host}")
}

/// Text for HTML: `&`, `<`, `>`, `"` and `'` escaped.
fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// `GET /login` query.
#[derive(Debug, Deserialize)]
struct LoginQuery {
    code: Option<String>,
}

/// `GET /login?code=…`: consume the one-time code, start a session, and send the browser to
/// `/` with the session cookie; a plain 403 page for an unknown, used or expired code.
///
/// Only a GET consumes the code. axum answers HEAD with the GET handler, and link previews
/// (chat apps, mail scanners) send HEAD to a link before anyone opens it: a HEAD (or any other
/// method that reaches here) gets a plain 200 page with no cookie and leaves the code unused.
async fn login(
    method: Method,
    State(state): State<AppState>,
    query: Result<Query<LoginQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if method != Method::GET {
        return html(StatusCode::OK, sign_in_link_page());
    }
    let code = query.ok().and_then(|Query(q)| q.code).unwrap_or_default();
    let redeemed = if code.is_empty() { Ok(None) } else { state.sessions().redeem(&code).await };
    let session = match redeemed {
        Ok(Some(s)) => s,
        Ok(None) => return html(StatusCode::FORBIDDEN, forbidden_page()),
        Err(e) => {
            tracing::error!(error = %e, "could not store a web session");
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                "tally could not store the sign-in; try `tally sign-in` again".into(),
            );
        }
    };
    // tally itself only serves plain HTTP, so the cookie cannot be `Secure` here; the flag
    // goes on as soon as the daemon answers over HTTPS.
    let cookie = session_cookie_header(&session.id, false);
    let mut r = html(StatusCode::SEE_OTHER, String::new());
    let h = r.headers_mut();
    h.insert(header::LOCATION, HeaderValue::from_static("/"));
    match HeaderValue::from_str(&cookie) {
        Ok(v) => {
            h.insert(header::SET_COOKIE, v);
        }
        Err(_) => return html(StatusCode::INTERNAL_SERVER_ERROR, "could not set the session cookie".into()),
    }
    r
}

/// The `Set-Cookie` value for a session: HttpOnly, SameSite=Strict, Path=/, and `Secure`
/// only when the page is served over HTTPS.
pub fn session_cookie_header(id: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    let max_age = sessions::IDLE_LIFETIME.as_secs();
    format!("{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}")
}

/// What a HEAD of the sign-in link gets (the body is never sent for HEAD; for any other
/// method it says what to do).
fn sign_in_link_page() -> String {
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign in · tally</title></head>\
     <body><main><h1>Open this sign-in link in a browser to sign in</h1></main></body></html>\n"
        .to_string()
}

fn forbidden_page() -> String {
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
     <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
     <meta name=\"color-scheme\" content=\"light dark\"><title>Sign-in link not valid · tally</title>\
     <link rel=\"icon\" href=\"/assets/favicon.svg\" type=\"image/svg+xml\">\
     <link rel=\"stylesheet\" href=\"/assets/app.css\"></head><body>\
     <main id=\"main\" class=\"message-page\"><h1>This sign-in link is not valid</h1>\
     <p>A sign-in link works only once, and links made by <code>tally sign-in</code> expire after 15 minutes. \
     If this browser signed in with it before, <a href=\"/\">open tally</a>.</p>\
     <p>Otherwise run this on the computer where tally runs, and open the link it prints:</p>\
     <pre><code>tally sign-in</code></pre></main></body></html>\n"
        .to_string()
}

/// `GET /v1/session` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionJson {
    /// Send it in `X-CSRF-Token` with every state-changing request.
    pub csrf_token: String,
}

/// `GET /v1/session`: the CSRF token of the calling browser session (cookie only).
#[utoipa::path(
    get,
    path = "/session",
    operation_id = "get_session",
    tag = "session",
    responses(
        (status = 200, description = "The calling browser session's CSRF token.", body = SessionJson),
        (status = 404, description = "The request was not made with a session cookie (`no_session`).",
            body = ErrorBody),
    )
)]
pub async fn session(State(state): State<AppState>, credential: Option<Extension<Credential>>) -> Response {
    match credential.map(|Extension(c)| c) {
        Some(Credential::Session(id)) => match state.sessions().get(&id).await {
            Some(s) => Json(SessionJson { csrf_token: s.csrf_token }).into_response(),
            None => no_session().into_response(),
        },
        _ => no_session().into_response(),
    }
}

fn no_session() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_session",
        "this request was not made with a web session cookie; open a sign-in URL first",
    )
}

/// `POST /v1/session/sign-in-url`: a fresh one-time sign-in URL (bearer token only: a
/// browser session cannot mint more sessions). The URL names the host the request used.
#[utoipa::path(
    post,
    path = "/session/sign-in-url",
    operation_id = "create_sign_in_url",
    tag = "session",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A one-time sign-in URL, valid for 15 minutes.", body = SignInUrlJson),
        (status = 403, description = "Only a request with the API token can make a sign-in URL \
            (`bearer_token_required`).", body = ErrorBody),
    )
)]
pub async fn sign_in_url(
    State(state): State<AppState>,
    credential: Option<Extension<Credential>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if !matches!(credential.map(|Extension(c)| c), Some(Credential::Bearer)) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "bearer_token_required",
            "only a request with the API token can make a sign-in URL",
        ));
    }
    // The Host check already accepted this header, so it names this server.
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("127.0.0.1");
    let code = state.sessions().new_code(Some(CODE_LIFETIME));
    Ok(Json(SignInUrlJson { url: login_url(&format!("http://{host}"), &code) }).into_response())
}

/// `POST /v1/session/sign-in-url` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct SignInUrlJson {
    /// `http://<host>/login?code=…`; opening it once signs a browser in.
    pub url: String,
}

/// `POST /v1/session/sign-out` body.
#[derive(Debug, Default, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignOutBody {
    /// End every browser session (`tally sign-out --all`), not only the calling one. A request
    /// with the API token must say `true`: it has no session of its own.
    #[serde(default)]
    pub all: bool,
}

/// `POST /v1/session/sign-out` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct SignOutJson {
    /// How many sessions ended.
    pub ended: usize,
}

/// `POST /v1/session/sign-out`: end the calling browser's session, or with `"all": true`
/// every session (each browser then needs a new sign-in link).
#[utoipa::path(
    post,
    path = "/session/sign-out",
    operation_id = "sign_out",
    tag = "session",
    request_body(content = Option<SignOutBody>, description = "Optional; `{\"all\": true}` ends every session."),
    responses(
        (status = 200, description = "The sessions ended.", body = SignOutJson),
        (status = 422, description = "With the API token, only `{\"all\": true}` makes sense (`invalid_request`), \
            or the body has the wrong shape.", body = ErrorBody),
        crate::api::openapi::JsonRejected,
        crate::api::openapi::StoreFailure,
    )
)]
pub async fn sign_out(
    State(state): State<AppState>,
    credential: Option<Extension<Credential>>,
    crate::api::OptionalJsonBody(body): crate::api::OptionalJsonBody<SignOutBody>,
) -> Result<Response, ApiError> {
    let ended = match (credential.map(|Extension(c)| c), body.all) {
        (_, true) => state.sessions().end(None).await?,
        (Some(Credential::Session(id)), false) => state.sessions().end(Some(&id)).await?,
        _ => {
            return Err(ApiError::invalid(
                "a request with the API token has no session of its own: send {\"all\": true} to end every session",
            ));
        }
    };
    Ok(Json(SignOutJson { ended }).into_response())
}
