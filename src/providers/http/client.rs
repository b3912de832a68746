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

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use crate::config::ProviderConfig;
use crate::providers::{CallError, Image, sniff_image};

/// How long to wait after a 429 that carries no `Retry-After` hint.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The most bytes of an error body read to find its message.
const ERROR_BODY_LIMIT: usize = 16 * 1024;

/// How the API key is presented in the `Authorization` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthScheme {
    /// `Authorization: Bearer <key>` (OpenAI, Replicate).
    Bearer,
    /// `Authorization: Key <key>` (fal).
    Key,
    /// The bare key in a header of its own: `x-goog-api-key` (Gemini), `x-key` (BFL).
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
    /// (`api.replicate.com.evil.example`) have another origin.
    pub fn same_origin(&self, url: &str) -> bool {
        same_origin(url, &self.base_url)
    }

    /// Replace every occurrence of the API key in `text` by `<redacted>`: for messages built
    /// from provider answers, which may quote the key.
    pub fn redact(&self, text: &str) -> String {
        match self.api_key_env.as_deref().and_then(|v| std::env::var(v).ok()) {
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
        let Some(var) = &self.api_key_env else { return Ok(None) };
        let key = match std::env::var(var) {
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

/// The human message from an error body: OpenAI's `error.message`, Replicate's `detail`,
/// fal's `detail`, or the start of the text.
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

// ---------------------------------------------------------------------------------------
// "Not now": Retry-After in every documented form, and the rate-limit headers.
// ---------------------------------------------------------------------------------------

/// The wait a "not now" answer asks for, read from `Retry-After` in every form the HTTP spec
/// and the providers document, at `now` (for the HTTP-date form):
/// - `retry-after-ms: 1500` (milliseconds, possibly fractional; OpenAI's SDKs read it first);
/// - `Retry-After: 2` (whole seconds) or `Retry-After: 1.5` (fractional seconds, as some
///   gateways send);
/// - `Retry-After: Wed, 21 Oct 2026 07:28:00 GMT` (an HTTP date; a date in the past is no wait).
///
/// Garbage and negative values count as no hint (`None`).
pub fn retry_after_at(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = text("retry-after-ms").and_then(|t| t.parse::<f64>().ok()).filter(|m| m.is_finite() && *m >= 0.0)
    {
        return Some(Duration::from_secs_f64(ms.min(1e12) / 1000.0));
    }
    let value = text(RETRY_AFTER.as_str())?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e9)));
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// [`retry_after_at`] at the current time.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, SystemTime::now())
}

/// An HTTP date (RFC 9110 §5.6.7: `Sun, 06 Nov 1994 08:49:37 GMT`, the only form senders may
/// generate; the obsolete RFC 850 and asctime forms are not read).
pub fn parse_http_date(text: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else { return None };
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let month = MONTHS.iter().position(|m| m == month)? + 1;
    let (day, year): (u32, u32) = (day.parse().ok()?, year.parse().ok()?);
    humantime::parse_rfc3339(&format!("{year:04}-{month:02}-{day:02}T{time}Z")).ok()
}

/// How long until the provider's rate-limit window resets, when its headers say the quota is
/// used up (a remaining count of 0); `None` while requests remain or without such headers.
/// Read, per quota (`requests`, `tokens`, `images`, …):
/// - OpenAI's `x-ratelimit-remaining-<q>` with `x-ratelimit-reset-<q>` as a Go-style
///   duration (`1s`, `6m0s`, `1h2m3.5s`, `120ms`) or plain seconds;
/// - the IETF draft's `ratelimit-remaining` with `ratelimit-reset` (seconds);
/// - `x-ratelimit-remaining` with `x-ratelimit-reset` (seconds, or a Unix time in seconds).
///
/// With several exhausted quotas, the longest reset wins.
pub fn rate_limit_reset(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let mut longest: Option<Duration> = None;
    for (name, value) in headers {
        let name = name.as_str();
        let Some(quota) =
            name.strip_prefix("x-ratelimit-remaining").or_else(|| name.strip_prefix("ratelimit-remaining"))
        else {
            continue;
        };
        if value.to_str().ok().map(str::trim).and_then(|v| v.parse::<f64>().ok()) != Some(0.0) {
            continue;
        }
        let reset_name = if name.starts_with("x-") {
            format!("x-ratelimit-reset{quota}")
        } else {
            format!("ratelimit-reset{quota}")
        };
        let Some(reset) = headers.get(reset_name.as_str()).and_then(|v| v.to_str().ok()) else { continue };
        if let Some(d) = parse_reset(reset.trim(), now) {
            longest = Some(longest.map_or(d, |l| l.max(d)));
        }
    }
    longest
}

/// A reset value: a Go-style duration (`6m0s`, `1.5s`, `20ms`), plain seconds, or (above
/// 10^9) a Unix time in seconds.
fn parse_reset(text: &str, now: SystemTime) -> Option<Duration> {
    if let Ok(n) = text.parse::<f64>() {
        if !n.is_finite() || n < 0.0 {
            return None;
        }
        if n > 1e9 {
            let at = std::time::UNIX_EPOCH + Duration::from_secs_f64(n);
            return Some(at.duration_since(now).unwrap_or(Duration::ZERO));
        }
        return Some(Duration::from_secs_f64(n));
    }
    // Go's time.Duration format: numbers each followed by h, m, s, ms, us/µs or ns.
    let mut total = 0.0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, scale) =
            [("ms", 1e-3), ("us", 1e-6), ("µs", 1e-6), ("ns", 1e-9), ("h", 3600.0), ("m", 60.0), ("s", 1.0)]
                .into_iter()
                .find(|(u, _)| rest.starts_with(u))?;
        total += n * scale;
        rest = &rest[unit.len()..];
    }
    (total.is_finite() && total <= 1e9).then(|| Duration::from_secs_f64(total))
}

/// The whole wait a "not now" answer asks for: the longer of its `Retry-After` (any form)
/// and the reset of a used-up rate-limit quota; `None` when the answer gives neither.
pub fn not_now_wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    match (retry_after_at(headers, now), rate_limit_reset(headers, now)) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Add jitter to a wait: up to half of it again, and at least up to 250 ms, so that jobs
/// told the same `Retry-After` do not all come back at the same instant. `unit` is a random
/// value in [0, 1).
pub fn jittered(wait: Duration, unit: f64) -> Duration {
    let spread = (wait / 2).max(Duration::from_millis(250));
    wait + spread.mul_f64(unit.clamp(0.0, 1.0))
}

// ---------------------------------------------------------------------------------------
// Answers that say more than their status: out of credit, final server errors.
// ---------------------------------------------------------------------------------------

/// Error codes (OpenAI `error.code`/`type`, DashScope `code`, others' `error_type`) that say
/// the account has no credit left or reached its billing limit: nothing will succeed until a
/// person adds credit, so they are configuration problems, never "try later".
pub const OUT_OF_CREDIT_CODES: &[&str] =
    &["insufficient_quota", "billing_hard_limit_reached", "insufficient_credits", "Arrearage", "insufficient_balance"];

/// Whether an error answer says the provider account is out of credit: HTTP 402 (Payment
/// Required: Replicate, Black Forest Labs), an [`OUT_OF_CREDIT_CODES`] code in the body, or
/// fal's "Exhausted balance" lock (a 403).
pub fn is_out_of_credit(status: StatusCode, body: &[u8]) -> bool {
    if status == StatusCode::PAYMENT_REQUIRED {
        return true;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else { return false };
    let codes = ["/error/code", "/error/type", "/code", "/error_type", "/type", "/error/status"];
    if codes.iter().filter_map(|p| v.pointer(p).and_then(|c| c.as_str())).any(|c| OUT_OF_CREDIT_CODES.contains(&c)) {
        return true;
    }
    let text = v.get("detail").and_then(|d| d.as_str()).unwrap_or_default().to_ascii_lowercase();
    text.contains("exhausted balance")
}

/// The plain-words refusal for an account out of credit (see [`is_out_of_credit`]).
pub fn out_of_credit(message: &str) -> CallError {
    CallError::Rejected {
        message: format!(
            "{message} (the provider says the account is out of credit or over its billing limit, so nothing was \
             generated or charged; add credit or raise the limit with the provider, then retry)"
        ),
        config: true,
    }
}

/// Whether an answer carries fal's `X-Fal-Retryable: false`: the provider marks this error as
/// final (retrying cannot help). fal documents that requests failing with a server error
/// (5xx) are not billed.
pub fn marked_not_retryable(headers: &HeaderMap) -> bool {
    headers
        .get("x-fal-retryable")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "false" | "0" | "no"))
}

// ---------------------------------------------------------------------------------------
// Paid results: how long a provider keeps them, and downloads retried within that time.
// ---------------------------------------------------------------------------------------

/// How long a provider documents that it keeps a finished result (its file, or its output),
/// counted from when the result was made; with the words to show a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How long the result is kept at least.
    pub keep: Duration,
    /// Who keeps what, for messages ("fal keeps generated media for at least 7 days").
    pub words: &'static str,
}

impl Retention {
    /// Whether the retention has passed at `now_ms` for a result made at `made_ms` (ms since the
    /// epoch). Only then may a missing result be called expired.
    pub fn passed(&self, made_ms: i64, now_ms: i64) -> bool {
        now_ms.saturating_sub(made_ms) > self.keep.as_millis() as i64
    }
}

/// The current time in ms since the epoch (for retention checks in adapters).
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// What [`HttpClient::download_retrying`] found.
#[derive(Debug)]
pub enum ResultFetch {
    /// The bytes, checked to be an image.
    Image(Image),
    /// Every try failed in a way a later try may fix (404/410 from the file host, a 5xx, a
    /// 429, a connection problem): the result may still be there. `tries` were made; the
    /// message says what the last one found. Never proof that the result expired.
    NotYet { tries: u32, last: String, gone: bool },
    /// A try failed in a way trying again cannot fix (a refusal other than 404/410, or an
    /// answer that is not an image or is too large).
    Failed(CallError),
}

impl HttpClient {
    /// Download a paid result, trying again with backoff (0.5 s, 1 s, 2 s, … at most 30 s, with
    /// jitter) while the file host answers 404/410 (a CDN that has not got the file yet, or a
    /// blip), a 5xx or 429, or the connection fails, for at most `budget` in all. A provider
    /// that made the result keeps it for its documented [`Retention`]; the caller decides,
    /// from that retention and the provider's own word (Replicate's `data_removed`), whether a
    /// result that is still missing has expired: this function never says so.
    pub async fn download_retrying(&self, url: &str, budget: Duration) -> ResultFetch {
        let start = std::time::Instant::now();
        let mut tries = 0u32;
        loop {
            tries += 1;
            let (last, gone) = match self.download(url).await {
                Ok(Download::Image(image)) => return ResultFetch::Image(image),
                Ok(Download::Gone) => ("the result's file host answered 404/410".to_string(), true),
                Err(e @ (CallError::NotSent(_) | CallError::Ambiguous(_) | CallError::RetryAfter { .. })) => {
                    (e.to_string(), false)
                }
                Err(e) => return ResultFetch::Failed(e),
            };
            let wait =
                jittered(Duration::from_millis(250u64 << tries.min(7)).min(Duration::from_secs(30)), rand_unit());
            if start.elapsed() + wait > budget {
                return ResultFetch::NotYet { tries, last, gone };
            }
            tracing::info!(tries, retry_in = ?wait, "downloading a paid result failed; trying again: {last}");
            tokio::time::sleep(wait).await;
        }
    }
}

/// A random value in [0, 1) from the OS random source (jitter).
pub fn rand_unit() -> f64 {
    (uuid::Uuid::new_v4().as_u128() as u64 >> 11) as f64 / (1u64 << 53) as f64
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
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_is_read_in_every_documented_form() {
        let now = humantime::parse_rfc3339("2026-10-21T07:28:00Z").unwrap();
        let at = |pairs: &[(&str, &str)]| retry_after_at(&headers(pairs), now);
        assert_eq!(at(&[("retry-after", "2")]), Some(Duration::from_secs(2)));
        assert_eq!(at(&[("retry-after", "1.5")]), Some(Duration::from_millis(1500)));
        assert_eq!(at(&[("retry-after", "Wed, 21 Oct 2026 07:28:03 GMT")]), Some(Duration::from_secs(3)));
        assert_eq!(at(&[("retry-after", "Wed, 21 Oct 2026 07:27:00 GMT")]), Some(Duration::ZERO), "a past date");
        assert_eq!(at(&[("retry-after-ms", "250.5"), ("retry-after", "9")]), Some(Duration::from_micros(250_500)));
        assert_eq!(at(&[("retry-after", "soon")]), None);
        assert_eq!(at(&[("retry-after", "-1")]), None);
        assert_eq!(at(&[]), None);
    }

    #[test]
    fn used_up_rate_limits_give_their_reset() {
        let now = SystemTime::now();
        let reset = |pairs: &[(&str, &str)]| rate_limit_reset(&headers(pairs), now);
        let openai = [("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "6m0s")];
        assert_eq!(reset(&openai), Some(Duration::from_secs(360)));
        let tokens = [
            ("x-ratelimit-remaining-requests", "3"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "1m2.5s"),
        ];
        assert_eq!(reset(&tokens), Some(Duration::from_millis(62_500)), "only the used-up quota counts");
        assert_eq!(
            reset(&[("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "120ms")]),
            Some(Duration::from_millis(120))
        );
        assert_eq!(reset(&[("ratelimit-remaining", "0"), ("ratelimit-reset", "7")]), Some(Duration::from_secs(7)));
        assert_eq!(reset(&[("x-ratelimit-remaining-requests", "5"), ("x-ratelimit-reset-requests", "9s")]), None);
        let epoch =
            (now + Duration::from_secs(30)).duration_since(std::time::UNIX_EPOCH).unwrap().as_secs().to_string();
        let unix = reset(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", &epoch)]).unwrap();
        assert!(unix <= Duration::from_secs(30) && unix >= Duration::from_secs(28), "{unix:?}");
        let both = headers(&[("retry-after", "2"), openai[0], openai[1]]);
        assert_eq!(not_now_wait(&both, now), Some(Duration::from_secs(360)), "the longer wait wins");
    }

    #[test]
    fn jitter_spreads_but_never_shortens() {
        let w = Duration::from_secs(2);
        assert_eq!(jittered(w, 0.0), w);
        assert_eq!(jittered(w, 0.999_999).as_millis(), 2999);
        assert_eq!(jittered(Duration::ZERO, 0.5), Duration::from_millis(125));
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
