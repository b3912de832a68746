//! The browser session routes under `/v1` (`/v1/session`, `/v1/session/sign-in-url`,
//! `/v1/session/sign-out`) and the session cookie: how a browser holding a one-time sign-in
//! code becomes a session the API accepts (the sessions themselves are `api::sessions`).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::{Credential, SESSION_COOKIE};
use super::error::{ApiError, ErrorBody};
use super::sessions::{self, CODE_LIFETIME, PAIR_LIFETIME};
use crate::domain::words::say;

/// The sign-in URL for a one-time code, under the daemon's base URL.
pub fn login_url(base: &str, code: &str) -> String {
    format!("{base}/login?code={code}")
}

/// The `Set-Cookie` value for a session: HttpOnly, SameSite=Strict, Path=/, and `Secure`
/// only when the page is served over HTTPS.
pub fn session_cookie_header(id: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    let max_age = sessions::IDLE_LIFETIME.as_secs();
    format!("{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}")
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
    ApiError::new(StatusCode::NOT_FOUND, "no_session", say("say.error_no_session"))
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

/// `POST /v1/session/pair` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct PairJson {
    /// `http://<address>/login?code=…`: opening it once, within 10 minutes, signs that device
    /// in. It names the computer's address on the shop's network when the daemon runs with
    /// `--lan`, else the address this request used.
    pub url: String,
    /// The short code to type instead (on the signed-out page: "Pair this device"), `ABCD-EFGH`.
    /// The link and the code work once in all.
    pub code: String,
    /// A QR code of `url`, as an SVG document, for a phone's camera.
    pub svg: String,
    /// When the link and the code stop working (RFC 3339, UTC).
    pub expires_at: String,
    /// Whether `url` names the computer's address on the shop's network (`--lan`); if false a
    /// phone cannot reach it, and the answer's `hint` says how to change that.
    pub lan: bool,
    /// What to do next, in plain words.
    pub hint: String,
}

/// `POST /v1/session/pair`: a one-time link, a short code and its QR code for signing another
/// device in (a phone on the shop's Wi-Fi), valid 10 minutes and once. For a signed-in browser
/// or the API token; the token itself is never in the link.
#[utoipa::path(
    post,
    path = "/session/pair",
    operation_id = "pair_device",
    tag = "session",
    responses(
        (status = 200, description = "A pairing link, its short code and its QR code.", body = PairJson),
    )
)]
pub async fn pair(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let (base, lan) = match state.lan_base() {
        Some(b) => (b.to_string(), true),
        None => {
            // The Host check already accepted this header, so it names this server.
            let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("127.0.0.1");
            (format!("http://{host}"), false)
        }
    };
    let pairing = state.sessions().new_pairing();
    let url = login_url(&base, &pairing.code);
    let svg = qr_svg(&url).map_err(|e| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("could not draw the QR code: {e}"))
    })?;
    let expires = crate::clock::Clock::now(&crate::clock::SystemClock) + PAIR_LIFETIME.as_millis() as i64;
    let key = if lan { "say.pair_hint_lan" } else { "say.pair_hint_loopback" };
    let hint = crate::domain::words::t(super::lang::request_lang(), key);
    Ok(Json(PairJson { url, code: pairing.short, svg, expires_at: crate::clock::rfc3339(expires), lan, hint })
        .into_response())
}

/// `text` as a QR code in an SVG document (medium error correction, a quiet zone, at least
/// 240 px).
pub fn qr_svg(text: &str) -> Result<String, qrcode::types::QrError> {
    let code = qrcode::QrCode::with_error_correction_level(text.as_bytes(), qrcode::EcLevel::M)?;
    Ok(code
        .render::<qrcode::render::svg::Color<'_>>()
        .min_dimensions(240, 240)
        .dark_color(qrcode::render::svg::Color("#000000"))
        .light_color(qrcode::render::svg::Color("#ffffff"))
        .build())
}

/// `text` as a QR code drawn in a terminal with half blocks (two rows a line), dark on light
/// whatever the terminal's colours, with its quiet zone.
pub fn qr_terminal(text: &str) -> Result<String, qrcode::types::QrError> {
    let code = qrcode::QrCode::with_error_correction_level(text.as_bytes(), qrcode::EcLevel::M)?;
    Ok(code
        .render::<qrcode::render::unicode::Dense1x2>()
        .dark_color(qrcode::render::unicode::Dense1x2::Light)
        .light_color(qrcode::render::unicode::Dense1x2::Dark)
        .build())
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
