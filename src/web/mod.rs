//! The web page a shop owner uses instead of curl: a small static bundle (HTML, JS, CSS)
//! embedded with `include_str!` and served by the daemon, the one-time sign-in URL
//! (`/login?code=…` → session cookie). The session routes under `/v1`, the sessions' store
//! and the live event stream are the API's (`api::session`, `api::sessions`, `api::stream`):
//! the page uses them like any other client, and changes state only through the `/v1` API.
//!
//! Sign-in works like other local daemons: `tally serve` (or `tally sign-in`) prints a URL
//! with a one-time code; opening it creates an in-memory session and sets
//! `tally_session=<id>; HttpOnly; SameSite=Strict; Path=/`. The page then sends the
//! session's CSRF token (embedded in the HTML) in `X-CSRF-Token` on every state-changing
//! request.

pub mod i18n;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::api::AppState;
use crate::api::auth::session_cookie;
use crate::api::error::ApiError;
use crate::api::session::{login_url, session_cookie_header};
use crate::api::sessions::ShortRedeemed;

const INDEX_HTML: &str = include_str!("assets/index.html");
const SIGNED_OUT_HTML: &str = include_str!("assets/signed-out.html");
/// The page's static files: name, content type, body (served under `/assets/`).
const ASSETS: &[(&str, &str, &str)] = &[
    ("core.js", "text/javascript; charset=utf-8", include_str!("assets/core.js")),
    ("jobs.js", "text/javascript; charset=utf-8", include_str!("assets/jobs.js")),
    ("job.js", "text/javascript; charset=utf-8", include_str!("assets/job.js")),
    ("sets.js", "text/javascript; charset=utf-8", include_str!("assets/sets.js")),
    ("set_edit.js", "text/javascript; charset=utf-8", include_str!("assets/set_edit.js")),
    ("drafts.js", "text/javascript; charset=utf-8", include_str!("assets/drafts.js")),
    ("compare.js", "text/javascript; charset=utf-8", include_str!("assets/compare.js")),
    ("ops.js", "text/javascript; charset=utf-8", include_str!("assets/ops.js")),
    ("settings.js", "text/javascript; charset=utf-8", include_str!("assets/settings.js")),
    ("deliver.js", "text/javascript; charset=utf-8", include_str!("assets/deliver.js")),
    ("budget.js", "text/javascript; charset=utf-8", include_str!("assets/budget.js")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("assets/app.js")),
    ("app.css", "text/css; charset=utf-8", include_str!("assets/app.css")),
    ("favicon.svg", "image/svg+xml", include_str!("assets/favicon.svg")),
];

/// The placeholder in `index.html` replaced by the session's CSRF token.
const CSRF_PLACEHOLDER: &str = "{{CSRF_TOKEN}}";
/// The placeholder in `index.html` replaced by the shop's IANA zone (empty when the computer's
/// zone has no name: the page then shows the device's), in which the page shows every time.
const ZONE_PLACEHOLDER: &str = "{{TIME_ZONE}}";

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
        Some(s) => {
            let zone = crate::domain::zone::name(&state.engine().time_zone());
            let zone = if zone == "local" { String::new() } else { escape_html(&zone) };
            let page = INDEX_HTML.replace(CSRF_PLACEHOLDER, &s.csrf_token).replace(ZONE_PLACEHOLDER, &zone);
            html(StatusCode::OK, i18n::render(&page, lang))
        }
        None => html(
            StatusCode::OK,
            i18n::render(
                &SIGNED_OUT_HTML
                    .replace(ADDRESS_PLACEHOLDER, &escape_html(&page_base(&headers)))
                    .replace(PAIR_FORM_PLACEHOLDER, PAIR_FORM),
                lang,
            ),
        ),
    };
    r.headers_mut().insert(header::VARY, HeaderValue::from_static("Accept-Language, Cookie"));
    r
}

/// The placeholder in `signed-out.html` replaced by the address this page was opened at.
const ADDRESS_PLACEHOLDER: &str = "{{ADDRESS}}";
/// The placeholder in `signed-out.html` replaced by [`PAIR_FORM`].
const PAIR_FORM_PLACEHOLDER: &str = "{{PAIR_FORM}}";

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
    /// A pairing's short code, as typed on the signed-out page.
    pair: Option<String>,
}

/// `GET /login?code=…`: consume the one-time code, start a session, and send the browser to
/// `/` with the session cookie; a plain 403 page for an unknown, used or expired code.
///
/// Only a GET consumes the code. axum answers HEAD with the GET handler, and link previews
/// (chat apps, mail scanners) send HEAD to a link before anyone opens it: a HEAD (or any other
/// method that reaches here) gets a plain 200 page with no cookie and leaves the code unused.
async fn login(
    method: Method,
    headers: HeaderMap,
    State(state): State<AppState>,
    query: Result<Query<LoginQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if method != Method::GET {
        return html(StatusCode::OK, sign_in_link_page());
    }
    let lang = i18n::choose(&headers, state.ui_language());
    let (code, pair) = query.ok().map(|Query(q)| (q.code, q.pair)).unwrap_or_default();
    let user_agent = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let device = Some(crate::api::sessions::device_name(user_agent));
    let redeemed = match (code.filter(|c| !c.is_empty()), pair.filter(|p| !p.trim().is_empty())) {
        (Some(code), _) => state.sessions().redeem(&code, device).await,
        (None, Some(typed)) => match state.sessions().redeem_short(&typed, device).await {
            Ok(ShortRedeemed::Session(s)) => Ok(Some(s)),
            Ok(ShortRedeemed::Unknown) => {
                return html(StatusCode::FORBIDDEN, wrong_code_page(lang, false));
            }
            Ok(ShortRedeemed::TooManyMisses) => {
                return html(StatusCode::FORBIDDEN, wrong_code_page(lang, true));
            }
            Err(e) => Err(e),
        },
        (None, None) => Ok(None),
    };
    let session = match redeemed {
        Ok(Some(s)) => s,
        Ok(None) => return html(StatusCode::FORBIDDEN, forbidden_page(lang)),
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

/// What a HEAD of the sign-in link gets (the body is never sent for HEAD; for any other
/// method it says what to do).
fn sign_in_link_page() -> String {
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign in · tally</title></head>\
     <body><main><h1>Open this sign-in link in a browser to sign in</h1></main></body></html>\n"
        .to_string()
}

/// The page for a short code that matched no pairing (`too_many`: guessing cancelled every
/// code), in `lang`, with the form to type one again.
fn wrong_code_page(lang: i18n::Lang, too_many: bool) -> String {
    let heading = if too_many { "{{t:signed_out.pair_too_many}}" } else { "{{t:signed_out.pair_wrong}}" };
    let page = "<!doctype html>\n<html lang=\"{{LANG}}\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"color-scheme\" content=\"light dark\"><title>{{t:signed_out.page_title}}</title>\
         <link rel=\"icon\" href=\"/assets/favicon.svg\" type=\"image/svg+xml\">\
         <link rel=\"stylesheet\" href=\"/assets/app.css\"></head><body>\
         <main id=\"main\" class=\"message-page\"><h1>HEADING</h1>PAIR_FORM</main></body></html>\n";
    i18n::render(&page.replace("HEADING", heading).replace("PAIR_FORM", PAIR_FORM), lang)
}

/// The signed-out pages' form for a pairing's short code (`GET /login?pair=…`).
const PAIR_FORM: &str = "<form class=\"pair-form\" method=\"get\" action=\"/login\">\
    <h2>{{t:signed_out.pair_title}}</h2><p>{{t:signed_out.pair_how}}</p>\
    <label for=\"pair-code\">{{t:signed_out.pair_label}}</label>\
    <input id=\"pair-code\" name=\"pair\" autocomplete=\"one-time-code\" autocapitalize=\"characters\" \
    spellcheck=\"false\" inputmode=\"text\" maxlength=\"16\" required placeholder=\"ABCD-EFGH\">\
    <button type=\"submit\">{{t:signed_out.pair_button}}</button></form>";

/// The page for a used, unknown or expired sign-in link, in `lang`.
fn forbidden_page(lang: i18n::Lang) -> String {
    i18n::render(
        "<!doctype html>\n<html lang=\"{{LANG}}\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"color-scheme\" content=\"light dark\"><title>{{t:link.invalid_title}}</title>\
         <link rel=\"icon\" href=\"/assets/favicon.svg\" type=\"image/svg+xml\">\
         <link rel=\"stylesheet\" href=\"/assets/app.css\"></head><body>\
         <main id=\"main\" class=\"message-page\"><h1>{{t:link.invalid}}</h1>\
         <p>{{t:link.once_before}}<code>tally sign-in</code>{{t:link.once_middle}}\
         <a href=\"/\">{{t:link.open_tally}}</a>{{t:link.once_after}}</p>\
         <p>{{t:link.otherwise}}</p>\
         <pre><code>tally sign-in</code></pre></main></body></html>\n",
        lang,
    )
}
