//! The mock provider's run-time behaviour: latency, failures, rejections, rate limits and
//! dropped answers, and the few places where the real APIs differ by model or by version
//! (unknown model inputs, retired models). Set by flags at start and changed by
//! `PUT /_mock/behavior`.
//!
//! The defaults are the real APIs' documented behaviour, not the convenient one: the
//! `Idempotency-Key` header is ignored (none of the image APIs tally speaks honours one),
//! unknown model inputs are stripped (current Cog), and the retired DALL·E models are refused. One
//! exception, on purpose: `gpt-image-1` (shut down 2026-10-23 per the pinned SDK) is refused
//! only when `retired_models` lists it, because black-box checks written before the shutdown
//! still configure it; tally's own docs and tests name current models, and the SDK contract
//! test runs with the SDK's full list.

use serde::Serialize;
use serde_json::{Map, Value};

/// Which API requests a `drop_response` applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A request that starts a paid generation.
    Create,
    /// A status or result request for one job (and a cancel).
    Poll,
    /// A listing of recent jobs.
    List,
    /// Model metadata (a model's and a version's GETs): never dropped.
    Meta,
}

impl Scope {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "create" => Scope::Create,
            "poll" => Scope::Poll,
            "list" => Scope::List,
            _ => return None,
        })
    }
}

/// The models the pinned official OpenAI SDK (openai 3.57.0, `types/image_model.py`) marks as
/// shut down or retired: `gpt-image-1` (shut down 2026-10-23), `dall-e-2` and `dall-e-3`
/// (retired 2026-05-12).
pub const RETIRED_OPENAI_MODELS: &[&str] = &["gpt-image-1", "dall-e-2", "dall-e-3"];

/// The models the mock refuses by default: [`RETIRED_OPENAI_MODELS`] without `gpt-image-1`
/// (see the module doc for why).
pub const DEFAULT_RETIRED_MODELS: &[&str] = &["dall-e-2", "dall-e-3"];

/// How the mock answers. Serialised as the body of `GET /_mock/behavior`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Behavior {
    /// Delay before every API answer (the work and the ledger line happen first).
    pub latency_ms: u64,
    /// Answer creates with this 5xx (not charged).
    pub fail_status: Option<u16>,
    /// Answer creates with this 4xx and an error body in the API style's shape (not charged).
    pub reject_status: Option<u16>,
    /// Answer creates with 429 and `Retry-After: <n>` (not charged).
    pub retry_after_s: Option<u64>,
    /// Do the work, charge, write the ledger, then close the connection without answering.
    pub drop_response: bool,
    /// Narrow `drop_response` to `"create"`, `"poll"` or `"list"` requests.
    pub drop_on: Option<String>,
    /// How long an asynchronous job runs (its first third queued, then in progress).
    pub job_duration_ms: u64,
    /// How long a finished job's result stays available (the prediction-style API then
    /// removes `output` and `input` and sets `data_removed`; result files answer 410).
    pub result_ttl_s: u64,
    /// Replay the answer of an earlier create that carried the same `Idempotency-Key`
    /// (not charged). Off by default: no real target API honours the header; on models a
    /// gateway that does.
    pub honor_idempotency_key: bool,
    /// What a prediction-style create does with an input the model does not declare: `"strip"`
    /// (current Cog: dropped, not stored) or `"reject"` (Cog 0.17.x: 422).
    pub unknown_inputs: String,
    /// OpenAI models refused with 404 `model_not_found`.
    pub retired_models: Vec<String>,
    /// Asynchronous jobs finish failed with this error (each style's documented failed
    /// shape: a failed status, or completed with `error`/`error_type` and a 500 on its result).
    pub job_error: Option<String>,
    /// Refusals (`reject_status`) quote the request's `Authorization` header in their
    /// message, as some providers echo a bad key.
    pub error_echoes_key: bool,
    /// OpenAI-style answers carry `data[0].url` instead of `b64_json`, as many
    /// OpenAI-compatible gateways answer.
    pub openai_url_answers: bool,
    /// Moderation, where an API has it: `"prompt"` blocks the prompt, `"output"` the image.
    pub moderation: Option<String>,
    /// Drafting calls (the Responses API, the chat completions) answer this text instead of a
    /// plan: a billed answer outside tally's schema.
    pub draft_answer: Option<String>,
    /// Answer creates with 429 and this wait in milliseconds (not charged), in the form
    /// `retry_after_form` gives; takes precedence over `retry_after_s`.
    pub retry_after_ms: Option<u64>,
    /// How a 429's wait is written: `"seconds"` (`Retry-After: 2`, whole seconds rounded up),
    /// `"fractional"` (`Retry-After: 1.5`), `"http_date"` (`Retry-After` as an HTTP date),
    /// `"retry_after_ms"` (only `retry-after-ms`), or `"reset"` (no `Retry-After`; only the
    /// used-up `x-ratelimit-*-requests` headers).
    pub retry_after_form: String,
    /// A 429 also carries OpenAI's rate-limit headers: `x-ratelimit-limit-requests`,
    /// `x-ratelimit-remaining-requests: 0` and `x-ratelimit-reset-requests` (the wait).
    pub ratelimit_headers: bool,
    /// Only this many more creates are answered 429 (then they go through); `None`: every
    /// create while a wait is set. Counts down.
    pub rate_limit_times: Option<u64>,
    /// The 429s (with `rate_limit_times`) answer the model and version reads (the
    /// schema tally reads before a create) instead of creates.
    pub rate_limit_meta: bool,
    /// Creates are refused because the account is out of credit, as each API documents it:
    /// Creates answer each style's documented out-of-credit error (a 429
    /// `insufficient_quota`, a 402, a 403 "Exhausted balance"; not charged).
    pub out_of_credit: bool,
    /// This many more result downloads (`/files/…`) fail with `result_fetch_status` before
    /// they work again (a CDN blip). Counts down.
    pub result_fetch_failures: u64,
    /// The status of a failing result download: 404 (the default) or a 5xx.
    pub result_fetch_status: u16,
    /// fal: the result of a `COMPLETED` request answers 500 with `X-Fal-Retryable: false`
    /// (a final server error, which fal does not bill).
    pub fal_result_not_retryable: bool,
    /// Prediction-style asynchronous jobs are canceled at the provider before they finish
    /// (`status: canceled`), as a cancel from the account or a passed deadline does.
    pub job_canceled: bool,
    /// Prediction-style asynchronous jobs fail with `error: null` and these `logs`.
    pub job_failure_logs: Option<String>,
    /// The error code `reject_status` answers carry (e.g. `Arrearage` or
    /// `DataInspectionFailed`); by default each style's generic refusal code.
    pub error_code: Option<String>,
    /// Successful creates carry `x-ratelimit-remaining-requests: 0` with a reset of this many
    /// milliseconds (the quota is used up: the next create within it would be a 429).
    pub ratelimit_exhausted_ms: Option<u64>,
    /// OpenAI-style images come back this many pixels a side: one colour, so a PNG of a few
    /// hundred KB that decodes to gigabytes (what a hostile or broken provider can answer).
    pub giant_image_side: Option<u32>,
}

impl Default for Behavior {
    fn default() -> Self {
        Behavior {
            latency_ms: 0,
            fail_status: None,
            reject_status: None,
            retry_after_s: None,
            drop_response: false,
            drop_on: None,
            job_duration_ms: 300,
            result_ttl_s: 3600,
            honor_idempotency_key: false,
            unknown_inputs: "strip".into(),
            retired_models: DEFAULT_RETIRED_MODELS.iter().map(|s| s.to_string()).collect(),
            job_error: None,
            error_echoes_key: false,
            openai_url_answers: false,
            moderation: None,
            draft_answer: None,
            retry_after_ms: None,
            retry_after_form: "seconds".into(),
            ratelimit_headers: false,
            rate_limit_times: None,
            rate_limit_meta: false,
            out_of_credit: false,
            result_fetch_failures: 0,
            result_fetch_status: 404,
            fal_result_not_retryable: false,
            job_canceled: false,
            job_failure_logs: None,
            error_code: None,
            ratelimit_exhausted_ms: None,
            giant_image_side: None,
        }
    }
}

impl Behavior {
    /// Check every value; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(s) = self.fail_status.filter(|s| !(500..=599).contains(s)) {
            return Err(format!("fail_status {s} must be a 5xx status"));
        }
        if let Some(s) = self.reject_status.filter(|s| !(400..=499).contains(s)) {
            return Err(format!("reject_status {s} must be a 4xx status"));
        }
        if let Some(d) = self.drop_on.as_deref().filter(|d| Scope::parse(d).is_none()) {
            return Err(format!("drop_on `{d}` must be \"create\", \"poll\" or \"list\""));
        }
        if self.latency_ms > 600_000 || self.job_duration_ms > 3_600_000 {
            return Err("latency_ms and job_duration_ms must be at most 600000 and 3600000".into());
        }
        if let Some(c) = self.error_code.as_deref().filter(|c| {
            c.is_empty() || c.len() > 100 || !c.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        }) {
            return Err(format!("error_code `{c}` must be 1 to 100 letters, digits, '.', '_' or '-'"));
        }
        if let Some(m) = self.moderation.as_deref().filter(|m| !matches!(*m, "prompt" | "output")) {
            return Err(format!("moderation `{m}` must be \"prompt\" or \"output\""));
        }
        if !matches!(
            self.retry_after_form.as_str(),
            "seconds" | "fractional" | "http_date" | "retry_after_ms" | "reset"
        ) {
            return Err(format!(
                "retry_after_form `{}` must be \"seconds\", \"fractional\", \"http_date\", \"retry_after_ms\" or \"reset\"",
                self.retry_after_form
            ));
        }
        if self.result_fetch_status != 404 && !(500..=599).contains(&self.result_fetch_status) {
            return Err(format!("result_fetch_status {} must be 404 or a 5xx status", self.result_fetch_status));
        }
        if !matches!(self.unknown_inputs.as_str(), "strip" | "reject") {
            return Err(format!("unknown_inputs `{}` must be \"strip\" or \"reject\"", self.unknown_inputs));
        }
        Ok(())
    }

    /// The wait a create is told with a 429 now, in milliseconds, if it is rate limited.
    pub fn rate_limit_wait_ms(&self) -> Option<u64> {
        self.retry_after_ms.or(self.retry_after_s.map(|s| s.saturating_mul(1000)))
    }

    /// Whether a request of this scope is answered by closing the connection.
    pub fn drops(&self, scope: Scope) -> bool {
        scope != Scope::Meta
            && self.drop_response
            && self.drop_on.as_deref().and_then(Scope::parse).is_none_or(|only| only == scope)
    }

    /// Apply a `PUT /_mock/behavior` patch: absent fields stay, `null` restores the value the
    /// mock was started with, unknown fields are refused. `honour_idempotency_key` is
    /// accepted as the British spelling of `honor_idempotency_key`.
    pub fn patch(&mut self, patch: &Map<String, Value>, start: &Behavior) -> Result<(), String> {
        let mut next = self.clone();
        for (key, value) in patch {
            let null = value.is_null();
            let num = || value.as_u64().ok_or_else(|| format!("{key} must be a non-negative integer or null"));
            let flag = || value.as_bool().ok_or_else(|| format!("{key} must be true, false or null"));
            let text = || value.as_str().map(str::to_string).ok_or_else(|| format!("{key} must be a string or null"));
            let status = || {
                value
                    .as_u64()
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or_else(|| format!("{key} must be a status or null"))
            };
            match key.as_str() {
                "latency_ms" => next.latency_ms = if null { start.latency_ms } else { num()? },
                "job_duration_ms" => next.job_duration_ms = if null { start.job_duration_ms } else { num()? },
                "result_ttl_s" => next.result_ttl_s = if null { start.result_ttl_s } else { num()? },
                "fail_status" => next.fail_status = if null { start.fail_status } else { Some(status()?) },
                "reject_status" => next.reject_status = if null { start.reject_status } else { Some(status()?) },
                "retry_after_s" => next.retry_after_s = if null { start.retry_after_s } else { Some(num()?) },
                "drop_response" => next.drop_response = if null { start.drop_response } else { flag()? },
                "drop_on" => next.drop_on = if null { start.drop_on.clone() } else { Some(text()?) },
                "honor_idempotency_key" | "honour_idempotency_key" => {
                    next.honor_idempotency_key = if null { start.honor_idempotency_key } else { flag()? }
                }
                "unknown_inputs" => next.unknown_inputs = if null { start.unknown_inputs.clone() } else { text()? },
                "retired_models" => {
                    next.retired_models = if null {
                        start.retired_models.clone()
                    } else {
                        let items = value.as_array().ok_or("retired_models must be a list of model names or null")?;
                        items
                            .iter()
                            .map(|m| m.as_str().map(str::to_string).ok_or("retired_models must list strings"))
                            .collect::<Result<_, _>>()?
                    }
                }
                "job_error" => next.job_error = if null { start.job_error.clone() } else { Some(text()?) },
                "error_echoes_key" => next.error_echoes_key = if null { start.error_echoes_key } else { flag()? },
                "openai_url_answers" => next.openai_url_answers = if null { start.openai_url_answers } else { flag()? },
                "moderation" => next.moderation = if null { start.moderation.clone() } else { Some(text()?) },
                "draft_answer" => next.draft_answer = if null { start.draft_answer.clone() } else { Some(text()?) },
                "retry_after_ms" => next.retry_after_ms = if null { start.retry_after_ms } else { Some(num()?) },
                "retry_after_form" => {
                    next.retry_after_form = if null { start.retry_after_form.clone() } else { text()? }
                }
                "ratelimit_headers" => next.ratelimit_headers = if null { start.ratelimit_headers } else { flag()? },
                "rate_limit_times" => next.rate_limit_times = if null { start.rate_limit_times } else { Some(num()?) },
                "rate_limit_meta" => next.rate_limit_meta = if null { start.rate_limit_meta } else { flag()? },
                "out_of_credit" => next.out_of_credit = if null { start.out_of_credit } else { flag()? },
                "result_fetch_failures" => {
                    next.result_fetch_failures = if null { start.result_fetch_failures } else { num()? }
                }
                "result_fetch_status" => {
                    next.result_fetch_status = if null { start.result_fetch_status } else { status()? }
                }
                "fal_result_not_retryable" => {
                    next.fal_result_not_retryable = if null { start.fal_result_not_retryable } else { flag()? }
                }
                "job_canceled" => next.job_canceled = if null { start.job_canceled } else { flag()? },
                "ratelimit_exhausted_ms" => {
                    next.ratelimit_exhausted_ms = if null { start.ratelimit_exhausted_ms } else { Some(num()?) }
                }
                "job_failure_logs" => {
                    next.job_failure_logs = if null { start.job_failure_logs.clone() } else { Some(text()?) }
                }
                "error_code" => next.error_code = if null { start.error_code.clone() } else { Some(text()?) },
                "giant_image_side" => {
                    next.giant_image_side = if null {
                        start.giant_image_side
                    } else {
                        Some(
                            u32::try_from(num()?)
                                .ok()
                                .filter(|n| (1..=65_535).contains(n))
                                .ok_or("giant_image_side must be 1 to 65535")?,
                        )
                    }
                }
                other => return Err(format!("unknown field `{other}`")),
            }
        }
        next.validate()?;
        *self = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn patch_sets_clears_and_refuses() {
        let start = Behavior::default();
        let mut b = start.clone();
        b.patch(&map(json!({"fail_status": 500, "latency_ms": 20})), &start).unwrap();
        assert_eq!((b.fail_status, b.latency_ms), (Some(500), 20));
        b.patch(&map(json!({"fail_status": null})), &start).unwrap();
        assert_eq!((b.fail_status, b.latency_ms), (None, 20));
        assert!(b.patch(&map(json!({"nope": 1})), &start).is_err());
        assert!(b.patch(&map(json!({"fail_status": 404})), &start).is_err());
        assert_eq!(b.fail_status, None, "a refused patch changes nothing");
        assert!(b.patch(&map(json!({"unknown_inputs": "ignore"})), &start).is_err());
    }

    #[test]
    fn idempotency_is_honoured_only_when_told_in_either_spelling() {
        let start = Behavior::default();
        assert!(!start.honor_idempotency_key, "no real target API honours the header");
        let mut b = start.clone();
        b.patch(&map(json!({"honour_idempotency_key": true})), &start).unwrap();
        assert!(b.honor_idempotency_key);
        b.patch(&map(json!({"honor_idempotency_key": null})), &start).unwrap();
        assert!(!b.honor_idempotency_key);
    }

    #[test]
    fn drop_scope() {
        let mut b = Behavior { drop_response: true, ..Behavior::default() };
        assert!(b.drops(Scope::Create) && b.drops(Scope::Poll) && b.drops(Scope::List));
        assert!(!b.drops(Scope::Meta), "model metadata is never dropped");
        b.drop_on = Some("create".into());
        assert!(b.drops(Scope::Create) && !b.drops(Scope::Poll));
    }
}
