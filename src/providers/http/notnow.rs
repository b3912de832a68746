//! "Not now" and "never, until someone pays": reading a provider's wait in every documented
//! form (`Retry-After` as whole or fractional seconds or an HTTP date, `retry-after-ms`, the
//! used-up quotas of `x-ratelimit-*` / `ratelimit-*`), jitter for coming back, and the answers
//! that say more than their status (an account out of credit; fal's `X-Fal-Retryable: false`).
//! Pure functions over headers and bodies, re-exported by [`super::client`]; no I/O.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

use crate::providers::CallError;

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

/// Error codes (`error.code`/`type`, a top-level `code`, `error_type`) that say
/// the account has no credit left or reached its billing limit: nothing will succeed until a
/// person adds credit, so they are configuration problems, never "try later".
pub const OUT_OF_CREDIT_CODES: &[&str] =
    &["insufficient_quota", "billing_hard_limit_reached", "insufficient_credits", "Arrearage", "insufficient_balance"];

/// Whether an error answer says the provider account is out of credit: HTTP 402 (Payment
/// Required), an [`OUT_OF_CREDIT_CODES`] code in the body, or
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

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

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
    fn out_of_credit_codes_are_recognised_and_rate_limits_are_not() {
        let s = |c: u16| StatusCode::from_u16(c).unwrap();
        let fal = br#"{"detail":"User is locked. Reason: Exhausted balance. Top up your balance at fal.ai/dashboard/billing."}"#;
        assert!(is_out_of_credit(s(403), fal));
        assert!(is_out_of_credit(s(402), b""));
        assert!(is_out_of_credit(s(400), br#"{"code":"Arrearage","message":"Access denied"}"#));
        let rate = br#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        assert!(!is_out_of_credit(s(429), rate));
        assert!(marked_not_retryable(&headers(&[("x-fal-retryable", "false")])));
        assert!(!marked_not_retryable(&headers(&[("x-fal-retryable", "true")])));
    }
}
