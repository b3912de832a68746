//! The HTTP plumbing shared by every HTTP adapter: one reqwest client per provider, the API
//! key (read from its environment variable at call time, never printed), bounded body reads,
//! and the error classification of DESIGN §4.
//!
//! Invariants enforced here:
//! - the API key is attached only to requests whose origin (scheme, host, port) is
//!   `base_url`'s origin ([`HttpClient::request`] refuses others, [`HttpClient::download`]
//!   sends them without it);
//! - a provider answer that quotes the key has it replaced by `<redacted>` before any
//!   message leaves this module ([`HttpClient::redact`]);
//! - a 2xx answer that is too large or not an image is [`CallError::Unusable`] (accepted,
//!   probably charged), never a refusal.
//!
//! Nothing here retries, except [`HttpClient::download_retrying`] (a paid result's free GET,
//! tried again within a budget the caller gives): each other method sends at most one request
//! and says what its outcome proves.
//!
//! Shared helpers for every adapter (use these rather than reading headers by hand):
//! - "not now": [`HttpClient::rate_limit_hold`] (a used-up quota any answer reported; an
//!   adapter returns it from `Provider::rate_limit_hold`), [`retry_after_at`] (`Retry-After` as seconds, fractional seconds or an HTTP
//!   date, and `retry-after-ms`), [`rate_limit_reset`] (used-up `x-ratelimit-*` /
//!   `ratelimit-*` quotas), [`not_now_wait`] (both), [`jittered`];
//! - answers that mean more than their status: [`is_out_of_credit`] / [`out_of_credit`]
//!   (402, `insufficient_quota`, fal's exhausted balance: a configuration problem, nothing
//!   charged), [`marked_not_retryable`] (fal's `X-Fal-Retryable: false`);
//! - paid results: [`Retention`] (how long a provider keeps a result) and
//!   [`HttpClient::download_retrying`] ([`ResultFetch`]: never says "expired" itself);
//! - [`HttpClient::send_unchecked`] / [`HttpClient::error_of`] / [`HttpClient::json_of`] for an
//!   adapter that must look at an error answer's headers before classifying it, and
//!   [`classify_answer`], the classification every error answer goes through.
//!
//! Longer than 600 lines on purpose: it is the one place where an HTTP answer becomes a
//! classified outcome, so every adapter's reading of errors, waits and retained results is
//! the same code.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use crate::providers::ProviderConfig;
use crate::providers::{CallError, Image, sniff_image};

// The shared helpers live in their own files (`notnow`, `results`) and are re-exported here,
// so every adapter reaches them as `client::…`.
pub use super::notnow::{
    OUT_OF_CREDIT_CODES, is_out_of_credit, jittered, marked_not_retryable, not_now_wait, out_of_credit,
    parse_http_date, rate_limit_reset, retry_after, retry_after_at,
};
pub use super::results::{ResultFetch, Retention, now_ms, rand_unit};

/// How long to wait after a 429 that carries no `Retry-After` hint.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The most bytes of an error body read to find its message.
const ERROR_BODY_LIMIT: usize = 16 * 1024;

/// How the API key is presented in the `Authorization` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthScheme {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// `Authorization: Key <key>`.
    Key,
    /// The bare key in a header of its own (`x-goog-api-key`, `x-key`, `x-api-key`).
    Header(&'static str),
}

/// An API key. Its `Debug` never shows the value.
#[derive(Clone)]
struct ApiKey(String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// One provider's HTTP client: base URL, credentials source, limits.
#[derive(Debug, Clone)]
pub struct HttpClient {
    /// For API calls: no redirects (a redirected POST could be a resend).
    api: reqwest::Client,
    /// For result downloads: follows a few redirects (CDNs), sends no credentials off-origin.
    download: reqwest::Client,
    base_url: String,
    scheme: AuthScheme,
    api_key_env: Option<String>,
    /// The key itself (a provider added in the page); wins over `api_key_env`.
    api_key: Option<crate::providers::settings::Secret>,
    idempotency_header: Option<HeaderName>,
    max_response_bytes: usize,
    /// Until when the provider's rate-limit headers (on any answer, a success too) said a
    /// quota is used up: see [`HttpClient::rate_limit_hold`].
    paced_until: Arc<Mutex<Option<SystemTime>>>,
}

/// What a download of a result URL found.
#[derive(Debug)]
pub enum Download {
    /// The bytes, checked to be an image.
    Image(Image),
    /// The URL answered 404 or 410: the result is no longer kept.
    Gone,
}

impl HttpClient {
    /// Build the client for `cfg`. Fails only on an unusable configuration (no `base_url`,
    /// a bad header name, a TLS setup failure).
    pub fn new(cfg: &ProviderConfig, scheme: AuthScheme) -> Result<Self, String> {
        // reqwest is built without a default crypto provider; install ring once per process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base_url = cfg
            .base_url
            .as_deref()
            .ok_or_else(|| format!("provider `{}`: base_url is required for kind {}", cfg.name, cfg.kind.as_str()))?
            .trim_end_matches('/')
            .to_string();
        let idempotency_header = match &cfg.idempotency_header {
            None => None,
            Some(h) => Some(
                HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| format!("provider `{}`: `{h}` is not a valid header name", cfg.name))?,
            ),
        };
        let builder = || {
            reqwest::Client::builder()
                .connect_timeout(cfg.connect_timeout)
                .timeout(cfg.request_timeout)
                .retry(reqwest::retry::never())
                .user_agent(concat!("tally/", env!("CARGO_PKG_VERSION")))
        };
        let tls_err = |e: reqwest::Error| format!("provider `{}`: cannot build HTTP client: {e}", cfg.name);
        let api = builder().redirect(reqwest::redirect::Policy::none()).build().map_err(tls_err)?;
        let download = builder().redirect(reqwest::redirect::Policy::limited(5)).build().map_err(tls_err)?;
        Ok(HttpClient {
            api,
            download,
            base_url,
            scheme,
            api_key_env: cfg.api_key_env.clone(),
            api_key: cfg.api_key.clone(),
            idempotency_header,
            max_response_bytes: cfg.max_response_bytes,
            paced_until: Arc::new(Mutex::new(None)),
        })
    }

    /// How long the provider asked, through its rate-limit headers on the latest answers
    /// (`x-ratelimit-remaining-*: 0` with its reset, see [`rate_limit_reset`]), that no new
    /// request be sent; `None` when a quota remains. Read by the engine after a call to hold
    /// the provider's dispatch until the reset, so the next request is not a certain 429.
    pub fn rate_limit_hold(&self) -> Option<Duration> {
        let until = (*self.paced_until.lock().unwrap_or_else(|e| e.into_inner()))?;
        until.duration_since(SystemTime::now()).ok().filter(|d| !d.is_zero())
    }

    /// Remember a used-up quota an API answer's headers report.
    fn note_rate_limits(&self, resp: &Response) {
        let now = SystemTime::now();
        if let Some(reset) = rate_limit_reset(resp.headers(), now) {
            let mut until = self.paced_until.lock().unwrap_or_else(|e| e.into_inner());
            let at = now + reset;
            if until.is_none_or(|u| u < at) {
                *until = Some(at);
            }
        }
    }

    /// The base URL without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Whether an idempotency header is configured.
    pub fn sends_idempotency_key(&self) -> bool {
        self.idempotency_header.is_some()
    }

    /// Whether `url` has `base_url`'s origin (scheme, host and port), the only origin the API
    /// key is sent to. Userinfo tricks (`http://host:P@evil:Q/`) and look-alike hosts
    /// (`api.example.com.evil.example`) have another origin.
    pub fn same_origin(&self, url: &str) -> bool {
        same_origin(url, &self.base_url)
    }

    /// Replace every occurrence of the API key in `text` by `<redacted>`: for messages built
    /// from provider answers, which may quote the key.
    pub fn redact(&self, text: &str) -> String {
        let key = match &self.api_key {
            Some(k) => Some(k.expose().to_string()),
            None => self.api_key_env.as_deref().and_then(|v| std::env::var(v).ok()),
        };
        match key {
            Some(key) if key.trim().len() >= 4 => text.replace(key.trim(), "<redacted>"),
            _ => text.to_string(),
        }
    }

    /// Check, before anything is sent, that the API key can be read (its environment variable
    /// is set and usable in a header): a missing key is a configuration problem found before
    /// the paid call, so nothing is sent and nothing can be charged.
    pub fn check_key(&self) -> Result<(), CallError> {
        self.auth_header().map(|_| ())
    }

    /// Start a request to `url` with credentials and, when `idempotency_key` is given and a
    /// header is configured, the idempotency header. Fails before sending when the key's
    /// environment variable is missing, or when `url` is not on `base_url`'s origin (the key
    /// is never sent elsewhere).
    pub fn request(
        &self,
        method: Method,
        url: &str,
        idempotency_key: Option<&str>,
    ) -> Result<RequestBuilder, CallError> {
        if !self.same_origin(url) {
            return Err(CallError::NotSent(format!(
                "refusing to send the API key to {}, which is not the origin of base_url",
                origin_text(url)
            )));
        }
        let mut headers = HeaderMap::new();
        if let Some(auth) = self.auth_header()? {
            headers.insert(self.auth_header_name(), auth);
        }
        if let (Some(name), Some(key)) = (&self.idempotency_header, idempotency_key) {
            let value = HeaderValue::from_str(key)
                .map_err(|_| CallError::NotSent("idempotency key is not a valid header value".into()))?;
            headers.insert(name.clone(), value);
        }
        Ok(self.api.request(method, url).headers(headers))
    }

    fn auth_header(&self) -> Result<Option<HeaderValue>, CallError> {
        let (var, key) = match (&self.api_key, &self.api_key_env) {
            (Some(k), _) => ("the key saved in the page", Ok(k.expose().to_string())),
            (None, Some(var)) => (var.as_str(), std::env::var(var)),
            (None, None) => return Ok(None),
        };
        let key = match key {
            Ok(k) if !k.trim().is_empty() => ApiKey(k.trim().to_string()),
            _ => {
                return Err(CallError::Rejected {
                    message: format!("the API key environment variable {var} is not set (api_key_env)"),
                    config: true,
                });
            }
        };
        let text = match self.scheme {
            AuthScheme::Bearer => format!("Bearer {}", key.0),
            AuthScheme::Key => format!("Key {}", key.0),
            AuthScheme::Header(_) => key.0.clone(),
        };
        let mut value = HeaderValue::from_str(&text).map_err(|_| CallError::Rejected {
            message: format!("the API key in {var} contains characters not allowed in a header"),
            config: true,
        })?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    /// The header the key goes in: `Authorization`, or the provider's own header.
    fn auth_header_name(&self) -> HeaderName {
        match self.scheme {
            AuthScheme::Header(name) => HeaderName::from_static(name),
            _ => reqwest::header::AUTHORIZATION,
        }
    }

    /// Send one request and classify the outcome; only a 2xx answer comes back as `Ok`.
    pub async fn send(&self, rb: RequestBuilder) -> Result<Response, CallError> {
        let resp = rb.send().await.map_err(|e| self.transport(e))?;
        self.note_rate_limits(&resp);
        self.check_status(resp).await
    }

    /// Send one request and decode its 2xx JSON answer. An undecodable answer is `Ambiguous`
    /// (the provider may have acted on it); one over `max_response_bytes` is `Unusable`.
    pub async fn send_json<T: DeserializeOwned>(&self, rb: RequestBuilder) -> Result<T, CallError> {
        let resp = self.send(rb).await?;
        let body = self.read_limited(resp, self.max_response_bytes, false).await?;
        serde_json::from_slice(&body)
            .map_err(|e| CallError::Ambiguous(format!("undecodable answer from provider: {e}")))
    }

    /// Send one request and read its 2xx answer's body as bytes (a synchronous API that
    /// answers with the image itself). One over `max_response_bytes` is `Unusable`.
    pub async fn send_bytes(&self, rb: RequestBuilder) -> Result<Vec<u8>, CallError> {
        let resp = self.send(rb).await?;
        self.read_limited(resp, self.max_response_bytes, false).await
    }

    /// Like [`HttpClient::send_json`], but a 404 or 410 answer is `Ok(None)`: the thing
    /// asked for is gone (an expired result), which is a definite answer.
    pub async fn send_json_or_gone<T: DeserializeOwned>(&self, rb: RequestBuilder) -> Result<Option<T>, CallError> {
        let resp = rb.send().await.map_err(|e| self.transport(e))?;
        self.note_rate_limits(&resp);
        if matches!(resp.status(), StatusCode::NOT_FOUND | StatusCode::GONE) {
            return Ok(None);
        }
        let resp = self.check_status(resp).await?;
        let body = self.read_limited(resp, self.max_response_bytes, false).await?;
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| CallError::Ambiguous(format!("undecodable answer from provider: {e}")))
    }

    /// Download a result URL. Credentials are sent only to the provider's own origin.
    pub async fn download(&self, url: &str) -> Result<Download, CallError> {
        let mut rb = self.download.get(url);
        if self.same_origin(url)
            && let Some(auth) = self.auth_header()?
        {
            rb = rb.header(self.auth_header_name(), auth);
        }
        let resp = rb.send().await.map_err(|e| self.transport(e))?;
        if matches!(resp.status(), StatusCode::NOT_FOUND | StatusCode::GONE) {
            return Ok(Download::Gone);
        }
        let resp = self.check_status(resp).await?;
        let bytes = self.read_limited(resp, self.max_response_bytes, false).await?;
        Ok(Download::Image(image_from_bytes(bytes)?))
    }

    fn transport(&self, e: reqwest::Error) -> CallError {
        match classify_transport(e) {
            CallError::NotSent(m) => CallError::NotSent(self.redact(&m)),
            CallError::Ambiguous(m) => CallError::Ambiguous(self.redact(&m)),
            other => other,
        }
    }

    /// Pass a 2xx answer through; turn any other status into its classified error, with the
    /// key redacted from the provider's message.
    async fn check_status(&self, resp: Response) -> Result<Response, CallError> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(self.error_of(resp).await)
    }

    /// Send one request and return its answer whatever its status (a transport failure is
    /// still classified): for an adapter that reads an error answer's headers itself before
    /// classifying it with [`HttpClient::error_of`].
    pub async fn send_unchecked(&self, rb: RequestBuilder) -> Result<Response, CallError> {
        let resp = rb.send().await.map_err(|e| self.transport(e))?;
        self.note_rate_limits(&resp);
        Ok(resp)
    }

    /// Classify a non-2xx answer ([`classify_answer`]), its message read from a bounded body
    /// with the key redacted.
    pub async fn error_of(&self, resp: Response) -> CallError {
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = self.read_limited(resp, ERROR_BODY_LIMIT, true).await.unwrap_or_default();
        let message = self.redact(&error_message(&body));
        classify_answer(status, &headers, &body, &message, SystemTime::now())
    }

    /// Decode a 2xx JSON answer (as [`HttpClient::send_json`] does after sending).
    pub async fn json_of<T: DeserializeOwned>(&self, resp: Response) -> Result<T, CallError> {
        let resp = self.check_status(resp).await?;
        let body = self.read_limited(resp, self.max_response_bytes, false).await?;
        serde_json::from_slice(&body)
            .map_err(|e| CallError::Ambiguous(format!("undecodable answer from provider: {e}")))
    }

    /// Read a body in chunks, stopping at `limit` bytes. With `truncate`, a longer body is
    /// cut short (for error messages); otherwise it is `Unusable` (the provider answered 2xx:
    /// it accepted the request), never an unbounded allocation.
    async fn read_limited(&self, mut resp: Response, limit: usize, truncate: bool) -> Result<Vec<u8>, CallError> {
        if !truncate && resp.content_length().is_some_and(|len| len > limit as u64) {
            return Err(too_large(limit));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.transport(e))? {
            if body.len() + chunk.len() > limit {
                if truncate {
                    body.extend_from_slice(&chunk[..limit - body.len()]);
                    return Ok(body);
                }
                return Err(too_large(limit));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// `scheme://host:port` of a URL, for messages (never its path, query or userinfo).
fn origin_text(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => u.origin().ascii_serialization(),
        Err(_) => "an unparsable URL".into(),
    }
}

/// Check that bytes the provider returned as its result are an image; anything else is
/// `Unusable` (the provider answered, and probably charged).
pub fn image_from_bytes(bytes: Vec<u8>) -> Result<Image, CallError> {
    match sniff_image(&bytes) {
        Some(media_type) => Ok(Image { bytes, media_type: media_type.into() }),
        None => Err(CallError::Unusable(format!(
            "the provider's result is not a PNG, JPEG or WebP image ({} bytes)",
            bytes.len()
        ))),
    }
}

fn same_origin(url: &str, base: &str) -> bool {
    match (reqwest::Url::parse(url), reqwest::Url::parse(base)) {
        (Ok(a), Ok(b)) => a.origin() == b.origin(),
        _ => false,
    }
}

fn too_large(limit: usize) -> CallError {
    CallError::Unusable(format!("the provider's answer is larger than max_response_bytes ({limit} bytes)"))
}

/// Classify a transport error: a failed connect proves nothing was sent; anything after
/// connecting (timeout, reset, broken body) leaves the outcome unknown.
pub fn classify_transport(e: reqwest::Error) -> CallError {
    // reqwest's Display never includes headers, so the key cannot leak through it; the URL
    // is ours and carries no secret.
    let detail = error_chain(&e);
    if e.is_connect() || e.is_builder() {
        CallError::NotSent(detail)
    } else if e.is_timeout() {
        CallError::Ambiguous(format!("timed out after sending: {detail}"))
    } else {
        CallError::Ambiguous(detail)
    }
}

fn error_chain(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Classify a non-2xx status per DESIGN §4. Messages start with `HTTP <code>`.
pub fn classify_status(status: StatusCode, retry_after: Option<Duration>, message: &str) -> CallError {
    let code = status.as_u16();
    let message = if message.is_empty() { format!("HTTP {code}") } else { format!("HTTP {code}: {message}") };
    match code {
        401 | 403 => CallError::Rejected {
            message: format!("{message} (the provider refused tally's credentials: check api_key_env and the key)"),
            config: true,
        },
        // "Not now": rate limited, request timeout, conflict/lock timeout (the official SDKs
        // retry 408 and 409 too). Retried after the hint, counted as an attempt.
        408 | 409 | 429 => CallError::RetryAfter { after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER), message },
        503 => match retry_after {
            Some(after) => CallError::RetryAfter { after, message },
            None => CallError::Ambiguous(message),
        },
        300..=399 => {
            CallError::Rejected { message: format!("{message} (unexpected redirect: check base_url)"), config: true }
        }
        400..=499 => CallError::Rejected { message, config: false },
        _ => CallError::Ambiguous(message),
    }
}

/// Classify a non-2xx answer from its status, headers and body; `message` is the provider's
/// message (already redacted). An account out of credit ([`is_out_of_credit`]) is a
/// configuration refusal whatever its status; a 5xx the provider marks as final
/// ([`marked_not_retryable`]) is a definite failure (`Rejected`, not retried); otherwise
/// [`classify_status`] with the whole "not now" wait ([`not_now_wait`]).
pub fn classify_answer(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    message: &str,
    now: SystemTime,
) -> CallError {
    let code = status.as_u16();
    let text = if message.is_empty() { format!("HTTP {code}") } else { format!("HTTP {code}: {message}") };
    if is_out_of_credit(status, body) {
        return out_of_credit(&text);
    }
    if status.is_server_error() && marked_not_retryable(headers) {
        return CallError::Rejected {
            message: format!("{text} (the provider marked this server error as final: X-Fal-Retryable: false)"),
            config: false,
        };
    }
    classify_status(status, not_now_wait(headers, now), message)
}

/// The human message from an error body: `error.message`, `detail`, a top-level
/// `code: message`, or the start of the text.
fn error_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let found = v.pointer("/error/message").or_else(|| v.get("detail")).or_else(|| v.get("error"));
        match found {
            Some(serde_json::Value::String(m)) => return m.chars().take(500).collect(),
            // fal's (FastAPI's) validation errors: `detail` is a list of {loc, msg, type}.
            Some(serde_json::Value::Array(items)) => return validation_sentences(items).chars().take(500).collect(),
            Some(other @ serde_json::Value::Object(_)) => return other.to_string().chars().take(500).collect(),
            _ => {}
        }
        // A top-level `code` (e.g. `Arrearage`) and `message`.
        if let (Some(serde_json::Value::String(c)), Some(serde_json::Value::String(m))) =
            (v.get("code"), v.get("message"))
        {
            return format!("{c}: {m}").chars().take(500).collect();
        }
    }
    String::from_utf8_lossy(body).chars().take(200).collect::<String>().trim().to_string()
}

/// A validation error list (`[{"loc": ["body", "prompt"], "msg": "field required"}, …]`) as
/// sentences: "`prompt`: field required; `image_size.width`: …". Items of another shape are
/// shown as their JSON.
fn validation_sentences(items: &[serde_json::Value]) -> String {
    let one = |item: &serde_json::Value| {
        let msg = item.get("msg").or_else(|| item.get("message")).and_then(|m| m.as_str());
        let loc: Vec<String> = item
            .get("loc")
            .and_then(|l| l.as_array())
            .map(|l| {
                l.iter()
                    .filter(|p| p.as_str() != Some("body"))
                    .map(|p| p.as_str().map(str::to_string).unwrap_or_else(|| p.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        match (msg, loc.is_empty()) {
            (Some(m), false) => format!("`{}`: {m}", loc.join(".")),
            (Some(m), true) => m.to_string(),
            (None, _) => item.to_string(),
        }
    };
    let text: Vec<String> = items.iter().map(one).collect();
    if text.is_empty() { "the provider found the input invalid".into() } else { text.join("; ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified_per_design() {
        let s = |c: u16| StatusCode::from_u16(c).unwrap();
        assert!(matches!(classify_status(s(400), None, "x"), CallError::Rejected { config: false, .. }));
        assert!(matches!(classify_status(s(422), None, ""), CallError::Rejected { config: false, .. }));
        assert!(matches!(classify_status(s(401), None, ""), CallError::Rejected { config: true, .. }));
        assert!(matches!(classify_status(s(403), None, ""), CallError::Rejected { config: true, .. }));
        assert!(matches!(classify_status(s(404), None, ""), CallError::Rejected { config: false, .. }));
        for c in [408, 409] {
            assert!(matches!(classify_status(s(c), None, ""), CallError::RetryAfter { .. }), "{c} is not now");
        }
        let hint = Some(Duration::from_secs(7));
        assert!(
            matches!(classify_status(s(429), hint, ""), CallError::RetryAfter { after, .. } if after.as_secs() == 7)
        );
        assert!(
            matches!(classify_status(s(429), None, ""), CallError::RetryAfter { after, .. } if after == DEFAULT_RETRY_AFTER)
        );
        assert!(matches!(classify_status(s(503), hint, ""), CallError::RetryAfter { .. }));
        assert!(matches!(classify_status(s(503), None, ""), CallError::Ambiguous(_)));
        for c in [500, 502, 504] {
            assert!(matches!(classify_status(s(c), None, ""), CallError::Ambiguous(_)));
        }
    }

    #[test]
    fn error_messages_are_extracted() {
        assert_eq!(error_message(br#"{"error":{"message":"bad prompt","type":"x","code":"y"}}"#), "bad prompt");
        assert_eq!(error_message(br#"{"detail":"nope"}"#), "nope");
        assert_eq!(error_message(b"plain text"), "plain text");
        assert_eq!(
            error_message(br#"{"request_id":"r","code":"Arrearage","message":"Access denied."}"#),
            "Arrearage: Access denied."
        );
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn an_account_out_of_credit_is_a_configuration_refusal() {
        let s = |c: u16| StatusCode::from_u16(c).unwrap();
        let quota = br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        let e = classify_answer(s(429), &HeaderMap::new(), quota, "You exceeded your current quota", SystemTime::now());
        assert!(
            matches!(&e, CallError::Rejected { config: true, message } if message.contains("out of credit") && message.contains("nothing was")),
            "{e:?}"
        );
        let e = classify_answer(s(402), &HeaderMap::new(), b"{}", "", SystemTime::now());
        assert!(matches!(e, CallError::Rejected { config: true, .. }), "{e:?}");
        let fal = br#"{"detail":"User is locked. Reason: Exhausted balance. Top up your balance at fal.ai/dashboard/billing."}"#;
        assert!(is_out_of_credit(s(403), fal));
        let rate = br#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        assert!(!is_out_of_credit(s(429), rate));
        let h = headers(&[("retry-after", "1.5")]);
        let e = classify_answer(s(429), &h, rate, "Rate limit reached", SystemTime::now());
        assert!(matches!(e, CallError::RetryAfter { after, .. } if after == Duration::from_millis(1500)), "{e:?}");
    }

    #[test]
    fn a_server_error_marked_final_is_a_definite_failure() {
        let s = StatusCode::INTERNAL_SERVER_ERROR;
        let h = headers(&[("x-fal-retryable", "false")]);
        assert!(matches!(
            classify_answer(s, &h, b"", "boom", SystemTime::now()),
            CallError::Rejected { config: false, .. }
        ));
        let h = headers(&[("x-fal-retryable", "true")]);
        assert!(matches!(classify_answer(s, &h, b"", "boom", SystemTime::now()), CallError::Ambiguous(_)));
    }

    #[test]
    fn validation_lists_read_as_sentences() {
        let body = br#"{"detail":[{"loc":["body","prompt"],"msg":"field required","type":"value_error.missing"},{"loc":["body","image_size","width"],"msg":"ensure this value is less than or equal to 14142","type":"x"}]}"#;
        assert_eq!(
            error_message(body),
            "`prompt`: field required; `image_size.width`: ensure this value is less than or equal to 14142"
        );
    }

    #[test]
    fn api_key_debug_is_redacted() {
        assert_eq!(format!("{:?}", ApiKey("sk-secret".into())), "ApiKey(<redacted>)");
    }
}
