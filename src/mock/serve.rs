//! The one path every mock API request takes: check credentials and the configured failures,
//! replay an idempotent create (only when told to), do the work, write the ledger line, wait
//! the configured latency, then answer (or drop the connection). Also result downloads.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::ledger::Entry;
use super::{Answer, Api, Behavior, Job, Jobs, Mock, Scope, error, lock};
use crate::render::placeholder_png;

/// Side of the square PNG the mock renders.
pub(super) const IMAGE_SIZE: u32 = 64;

/// What the shared path needs to know about one API request.
pub(super) struct ApiRequest {
    pub api: Api,
    pub endpoint: &'static str,
    pub scope: Scope,
    /// Creates only.
    pub prompt: Option<String>,
    pub idempotency_key: Option<String>,
    /// The job a poll asks about.
    pub job_id: Option<String>,
    pub reference_images: usize,
    /// The `Authorization` header, if any (only ever echoed when `error_echoes_key`).
    authorization: Option<String>,
    /// `http://<Host>`, to build URLs in answers.
    pub base: String,
}

impl ApiRequest {
    pub fn new(api: Api, endpoint: &'static str, scope: Scope, headers: &HeaderMap) -> Self {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        ApiRequest {
            api,
            endpoint,
            scope,
            prompt: None,
            idempotency_key: text("idempotency-key"),
            job_id: None,
            reference_images: 0,
            // Some APIs take the bare key in a header of their own.
            authorization: text("authorization")
                .or_else(|| text("x-goog-api-key"))
                .or_else(|| text("x-key"))
                .or_else(|| text("x-api-key"))
                .filter(|a| !a.trim().is_empty()),
            base: format!("http://{}", text("host").unwrap_or_else(|| "127.0.0.1".into())),
        }
    }
}

/// The work of one request once credentials and failures are checked: may create jobs.
pub(super) type Work = Box<dyn FnOnce(&mut Jobs, &Behavior, &str) -> Answer + Send>;

/// Answer one API request (see the module doc for the order of steps).
pub(super) async fn serve(mock: Arc<Mock>, req: ApiRequest, work: Work) -> Response {
    let behavior = mock.behavior();
    let scope = req.scope;
    // The work and the ledger line run in their own task, so a client that gives up does
    // not stop a generation that has started — as with a real provider.
    let task = {
        let (mock, behavior) = (mock.clone(), behavior.clone());
        tokio::spawn(async move {
            let answer = decide(&mock, &req, &behavior, work);
            let entry = Entry {
                ts: Entry::now(),
                api: req.api.as_str(),
                endpoint: req.endpoint,
                prompt: req.prompt.as_deref().filter(|_| req.scope == Scope::Create),
                idempotency_key: req.idempotency_key.as_deref(),
                job_id: answer.job_id.as_deref().or(req.job_id.as_deref()),
                charged: answer.charged,
                reference_images: req.reference_images,
            };
            if let Err(e) = mock.ledger.append(&entry).await {
                tracing::error!(error = %e, "mock provider cannot write its ledger");
                return Answer::error(StatusCode::INTERNAL_SERVER_ERROR, "ledger write failed", "ledger");
            }
            answer
        })
    };
    let answer = task
        .await
        .unwrap_or_else(|_| Answer::error(StatusCode::INTERNAL_SERVER_ERROR, "mock handler failed", "internal"));
    if behavior.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(behavior.latency_ms)).await;
    }
    if behavior.drops(scope) {
        // Close the connection without an answer: unwinding ends this connection's task
        // (hyper drops the socket) without running the panic hook, so nothing is printed.
        std::panic::resume_unwind(Box::new(()));
    }
    answer.into_response()
}

/// Credentials, configured failures, idempotent replays (only when honoured), then the work.
fn decide(mock: &Mock, req: &ApiRequest, b: &Behavior, work: Work) -> Answer {
    let Some(auth) = &req.authorization else {
        return req.api.error(StatusCode::UNAUTHORIZED, "missing Authorization header", "invalid_api_key");
    };
    let create = req.scope == Scope::Create;
    if req.scope == Scope::Meta
        && b.rate_limit_meta
        && let Some(wait_ms) = b.rate_limit_wait_ms()
        && take_rate_limit(mock)
    {
        return rate_limited(req.api, wait_ms, b);
    }
    if create {
        if let Some(s) = b.reject_status {
            let status = StatusCode::from_u16(s).unwrap_or(StatusCode::BAD_REQUEST);
            let message = if b.error_echoes_key {
                format!("the mock rejects this request (reject_status); you sent `Authorization: {auth}`")
            } else {
                "the mock rejects this request (reject_status)".to_string()
            };
            return req.api.error(status, &message, b.error_code.as_deref().unwrap_or("rejected"));
        }
        if b.out_of_credit {
            return req.api.out_of_credit();
        }
        if let Some(wait_ms) = b.rate_limit_wait_ms().filter(|_| !b.rate_limit_meta)
            && take_rate_limit(mock)
        {
            return rate_limited(req.api, wait_ms, b);
        }
        if let Some(s) = b.fail_status {
            let status = StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return req.api.error(status, "the mock failed (fail_status)", "server_error");
        }
    }
    let mut jobs = lock(&mock.jobs);
    let replay_key =
        req.idempotency_key.clone().filter(|_| create && b.honor_idempotency_key).map(|k| (req.api.as_str(), k));
    if let Some(original) = replay_key.as_ref().and_then(|key| jobs.replays.get(key)) {
        return Answer { charged: false, ..original.clone() };
    }
    let mut answer = work(&mut jobs, b, &req.base);
    if let Some(ms) = b.ratelimit_exhausted_ms.filter(|_| create && answer.charged) {
        answer.headers.push(("x-ratelimit-limit-requests", "60".into()));
        answer.headers.push(("x-ratelimit-remaining-requests", "0".into()));
        answer.headers.push(("x-ratelimit-reset-requests", format!("{}s", ms as f64 / 1000.0)));
    }
    if let Some(key) = replay_key.filter(|_| answer.charged) {
        jobs.replays.insert(key, answer.clone());
    }
    answer
}

/// Whether this create is still rate limited (`rate_limit_times` counts down; `None` is
/// every create).
fn take_rate_limit(mock: &Mock) -> bool {
    let mut b = lock(&mock.behavior);
    match b.rate_limit_times {
        None => true,
        Some(0) => false,
        Some(n) => {
            b.rate_limit_times = Some(n - 1);
            true
        }
    }
}

/// A 429 "not now" with the wait written in the configured form (see
/// `Behavior::retry_after_form`), and OpenAI's rate-limit headers when asked for.
fn rate_limited(api: Api, wait_ms: u64, b: &Behavior) -> Answer {
    let mut a = api.error(StatusCode::TOO_MANY_REQUESTS, "rate limited by the mock", "rate_limit_exceeded");
    let secs = wait_ms as f64 / 1000.0;
    match b.retry_after_form.as_str() {
        "fractional" => a.headers.push(("retry-after", format!("{secs}"))),
        "http_date" => {
            // An HTTP date has whole seconds: the next whole second after the wait.
            let at = SystemTime::now() + Duration::from_millis(wait_ms) + Duration::from_secs(1);
            a.headers.push(("retry-after", http_date(at)));
        }
        "retry_after_ms" => a.headers.push(("retry-after-ms", wait_ms.to_string())),
        "reset" => {}
        _ => a.retry_after = Some(wait_ms.div_ceil(1000)),
    }
    if b.ratelimit_headers || b.retry_after_form == "reset" {
        a.headers.push(("x-ratelimit-limit-requests", "60".into()));
        a.headers.push(("x-ratelimit-remaining-requests", "0".into()));
        a.headers.push(("x-ratelimit-reset-requests", format!("{secs}s")));
    }
    a
}

/// `t` as an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub(super) fn http_date(t: SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let stamp = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(secs)).to_string();
    // 1970-01-01 was a Thursday.
    let day = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][((secs / 86_400) % 7) as usize];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (date, time) = stamp.trim_end_matches('Z').split_once('T').unwrap_or(("1970-01-01", "00:00:00"));
    let mut parts = date.split('-');
    let (y, m, d) = (parts.next().unwrap_or("1970"), parts.next().unwrap_or("01"), parts.next().unwrap_or("01"));
    let month = m.parse::<usize>().ok().and_then(|m| MONTHS.get(m.wrapping_sub(1))).unwrap_or(&"Jan");
    format!("{day}, {d} {month} {y} {time} GMT")
}

/// What a new charged generation is.
pub(super) struct NewJob<'a> {
    pub api: Api,
    pub model: &'a str,
    pub version: Option<String>,
    pub prompt: &'a str,
    pub input: Value,
}

/// Record a new charged generation; its duration, retention and failure come from `b`.
pub(super) fn new_job(jobs: &mut Jobs, new: NewJob<'_>, b: &Behavior) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let asynchronous = !new.api.synchronous();
    let job = Job {
        id: id.clone(),
        api: new.api,
        model: new.model.to_string(),
        version: new.version,
        prompt: new.prompt.to_string(),
        input: new.input,
        created: SystemTime::now(),
        started: Instant::now(),
        duration: if asynchronous { Duration::from_millis(b.job_duration_ms) } else { Duration::ZERO },
        ttl: Duration::from_secs(b.result_ttl_s),
        error: b.job_error.clone().filter(|_| asynchronous),
        // Canceled at the provider halfway (`job_canceled`): from the start, it reads canceled.
        canceled: (asynchronous && b.job_canceled).then(|| Duration::from_millis(b.job_duration_ms) / 2),
        failure_logs: b.job_failure_logs.clone().filter(|_| asynchronous),
    };
    jobs.by_id.insert(id.clone(), job);
    jobs.order.push(id.clone());
    id
}

pub(super) fn missing_prompt() -> Answer {
    Answer::error(StatusCode::BAD_REQUEST, "`prompt` is required", "invalid_prompt")
}

pub(super) fn not_found(what: &str) -> Answer {
    Answer::error(StatusCode::NOT_FOUND, &format!("{what} not found"), "not_found")
}

pub(super) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

/// `GET /files/{id}.png`: 404 until the job finishes (or when it failed), 410 once its
/// result expired; the next `result_fetch_failures` downloads answer `result_fetch_status`.
pub(super) async fn download(State(mock): State<Arc<Mock>>, Path(file): Path<String>) -> Response {
    let id = file.strip_suffix(".png").unwrap_or(&file);
    let blip = {
        let mut b = lock(&mock.behavior);
        (b.result_fetch_failures > 0).then(|| {
            b.result_fetch_failures -= 1;
            b.result_fetch_status
        })
    };
    if let Some(status) = blip {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND);
        return error(status, "the file host could not serve this file right now", "blip");
    }
    let prompt = {
        let jobs = lock(&mock.jobs);
        match jobs.by_id.get(id) {
            Some(job) if job.finished() && job.expired() => {
                return error(StatusCode::GONE, "this result has expired", "expired");
            }
            Some(job) if job.has_result() => job.prompt.clone(),
            _ => return error(StatusCode::NOT_FOUND, "no such file", "not_found"),
        }
    };
    ([(header::CONTENT_TYPE, "image/png")], placeholder_png(&prompt, IMAGE_SIZE)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mock's HTTP dates are what RFC 9110 senders write, and read back to the second.
    #[test]
    fn http_dates_round_trip() {
        let t = humantime::parse_rfc3339("2026-10-21T07:28:00Z").unwrap();
        assert_eq!(http_date(t), "Wed, 21 Oct 2026 07:28:00 GMT");
        let now = SystemTime::now();
        let back = crate::providers::http::client::parse_http_date(&http_date(now)).unwrap();
        assert!(now.duration_since(back).unwrap() < Duration::from_secs(1));
    }
}
