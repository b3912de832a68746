//! The safe local defaults every request passes through: the Host check (DNS-rebinding
//! defence), the declared body size check, the `/v1` credential check (the bearer token, or
//! a web session cookie plus its CSRF token on state-changing requests), and the API token
//! file.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::{ApiError, too_large, unsupported_media_type};
use crate::domain::words::say;

/// Host names always accepted (with any port or none): the loopback names.
const LOOPBACK_HOSTS: &[&str] = &["localhost", "127.0.0.1", "[::1]"];

/// Split a Host header value into its host part, refusing anything that is not
/// `host` or `host:port` with a numeric port.
fn host_part(value: &str) -> Option<&str> {
    let (host, port) = if value.starts_with('[') {
        let end = value.find(']')?;
        let (h, rest) = value.split_at(end + 1);
        (h, if rest.is_empty() { None } else { Some(rest.strip_prefix(':')?) })
    } else {
        match value.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (value, None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    (!host.is_empty()).then_some(host)
}

/// Whether a Host header value names this server: exactly a loopback name or an entry of
/// `allowed_hosts` (case-insensitive, any port). Never a prefix or suffix match.
pub fn host_allowed(value: &str, allowed_hosts: &[String]) -> bool {
    let Some(host) = host_part(value.trim()) else { return false };
    LOOPBACK_HOSTS.iter().any(|h| h.eq_ignore_ascii_case(host))
        || allowed_hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
}

/// Middleware on every route: answer 421 unless the Host header names this server.
pub async fn check_host(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    match host {
        Some(h) if host_allowed(&h, &state.inner.allowed_hosts) => next.run(req).await,
        _ => ApiError::new(StatusCode::MISDIRECTED_REQUEST, "host_not_allowed", say("say.error_host")).into_response(),
    }
}

/// Middleware on every route: answer 413 as soon as a too-large `Content-Length` is declared,
/// before reading any of the body (bodies without a length are limited while they are read),
/// and 415 for a non-empty body that is not declared as JSON.
pub async fn check_body(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let declared = match req.headers().get(header::CONTENT_LENGTH) {
        None => None,
        Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(n) if n > state.inner.max_body_bytes => return too_large().into_response(),
            Some(n) => Some(n),
            None => return ApiError::bad_request("the Content-Length header is not a number").into_response(),
        },
    };
    let has_body = declared.map_or_else(|| req.headers().contains_key(header::TRANSFER_ENCODING), |n| n > 0);
    if has_body && !super::is_json(req.headers()) && !is_image_upload(&req) {
        return unsupported_media_type().into_response();
    }
    next.run(req).await
}

/// `POST /v1/uploads` takes raw image bytes instead of JSON.
fn is_image_upload(req: &Request) -> bool {
    let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    req.uri().path() == "/v1/uploads" && super::sets::UPLOAD_TYPES.contains(&essence.as_str())
}

/// How a `/v1` request proved who sent it; handlers read it from the request extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// `Authorization: Bearer <API token>`.
    Bearer,
    /// The web page's session cookie (`tally_session`), with this session id.
    Session(String),
}

/// The name of the web session cookie.
pub const SESSION_COOKIE: &str = "tally_session";

/// The header a cookie-authenticated state-changing request must carry.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// Middleware on `/v1`: pass a request carrying the bearer token, or a valid session cookie
/// (state-changing methods must then also carry `X-CSRF-Token`, else 403
/// `csrf_token_required`); answer 401 otherwise.
pub async fn require_token(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if bearer_matches(req.headers(), &state.inner.token) {
        req.extensions_mut().insert(Credential::Bearer);
        return next.run(req).await;
    }
    let session = match session_cookie(req.headers()) {
        Some(id) => state.sessions().get(&id).await,
        None => None,
    };
    if let Some(session) = session {
        let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
        let csrf_ok = req
            .headers()
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| constant_time_eq(t.trim().as_bytes(), session.csrf_token.as_bytes()));
        if !safe && !csrf_ok {
            return ApiError::new(StatusCode::FORBIDDEN, "csrf_token_required", say("say.error_csrf")).into_response();
        }
        req.extensions_mut().insert(Credential::Session(session.id));
        return next.run(req).await;
    }
    let mut r = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "send the API token as `Authorization: Bearer <token>` (`tally token` prints it), or sign in to the web \
         page with the URL `tally sign-in` prints",
    )
    .into_response();
    r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    r
}

/// The value of the `tally_session` cookie, if the request carries one.
pub fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.trim().to_string())
}

fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    let Some(value) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else { return false };
    let Some((scheme, given)) = value.trim().split_once(' ') else { return false };
    scheme.eq_ignore_ascii_case("bearer") && constant_time_eq(given.trim().as_bytes(), token.as_bytes())
}

/// Compare two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

/// A new random token: 244 bits from the OS random source, as 64 hex digits.
pub(crate) fn new_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Read the API token at `path`, creating it (mode 0600) if it does not exist yet.
pub fn load_or_create_token(path: &Path) -> std::io::Result<String> {
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(mut f) => {
            let token = new_token();
            f.write_all(token.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            Ok(token)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_token(path),
        Err(e) => Err(e),
    }
}

/// Read the API token at `path`.
pub fn read_token(path: &Path) -> std::io::Result<String> {
    let mut s = String::new();
    std::fs::File::open(path)?.read_to_string(&mut s)?;
    let token = s.trim().to_string();
    if token.len() < 32 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} does not hold a token; delete it and start tally serve to make a new one", path.display()),
        ));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_check_is_exact() {
        let none: Vec<String> = vec![];
        for ok in ["127.0.0.1", "127.0.0.1:7700", "localhost", "LOCALHOST:80", "[::1]", "[::1]:7700"] {
            assert!(host_allowed(ok, &none), "{ok}");
        }
        for bad in [
            "127.0.0.1.evil.example",
            "127.0.0.1.evil.example:7700",
            "evil.example",
            "localhost.evil",
            "127.0.0.1:",
            "127.0.0.1:x",
            "[::1]x",
            "[::1]:80:80",
            "",
            "127.0.0.1@evil",
        ] {
            assert!(!host_allowed(bad, &none), "{bad}");
        }
        let allowed = vec!["tally.lan".to_string()];
        assert!(host_allowed("tally.lan:7700", &allowed));
        assert!(!host_allowed("tally.lan.evil:7700", &allowed));
        assert!(!host_allowed("x.tally.lan", &allowed));
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn token_file_is_private_and_stable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tally-token-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("api-token");
        let a = load_or_create_token(&p).unwrap();
        let b = load_or_create_token(&p).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
