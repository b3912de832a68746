//! The mock provider's run-time behaviour: latency, failures, rejections, rate limits and
//! dropped answers, set by flags at start and changed by `PUT /_mock/behavior`.

use serde::Serialize;
use serde_json::{Map, Value};

/// Which API requests a `drop_response` applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A request that starts a paid generation.
    Create,
    /// A status or result request for one job.
    Poll,
    /// A listing of recent jobs.
    List,
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

/// How the mock answers. Serialised as the body of `GET /_mock/behavior`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Behavior {
    /// Delay before every API answer (the work and the ledger line happen first).
    pub latency_ms: u64,
    /// Answer creates with this 5xx (not charged).
    pub fail_status: Option<u16>,
    /// Answer creates with this 4xx and an OpenAI-style error body (not charged).
    pub reject_status: Option<u16>,
    /// Answer creates with 429 and `Retry-After: <n>` (not charged).
    pub retry_after_s: Option<u64>,
    /// Do the work, charge, write the ledger, then close the connection without answering.
    pub drop_response: bool,
    /// Narrow `drop_response` to `"create"`, `"poll"` or `"list"` requests.
    pub drop_on: Option<String>,
    /// How long an asynchronous job runs.
    pub job_duration_ms: u64,
    /// How long a finished job's result stays downloadable.
    pub result_ttl_s: u64,
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
        Ok(())
    }

    /// Whether a request of this scope is answered by closing the connection.
    pub fn drops(&self, scope: Scope) -> bool {
        self.drop_response && self.drop_on.as_deref().and_then(Scope::parse).is_none_or(|only| only == scope)
    }

    /// Apply a `PUT /_mock/behavior` patch: absent fields stay, `null` restores the value the
    /// mock was started with, unknown fields are refused.
    pub fn patch(&mut self, patch: &Map<String, Value>, start: &Behavior) -> Result<(), String> {
        let mut next = self.clone();
        for (key, value) in patch {
            let null = value.is_null();
            let num = || value.as_u64().ok_or_else(|| format!("{key} must be a non-negative integer or null"));
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
                "drop_response" => {
                    next.drop_response = if null {
                        start.drop_response
                    } else {
                        value.as_bool().ok_or("drop_response must be true, false or null")?
                    }
                }
                "drop_on" => {
                    next.drop_on = if null {
                        start.drop_on.clone()
                    } else {
                        Some(value.as_str().ok_or("drop_on must be a string or null")?.to_string())
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
    }

    #[test]
    fn drop_scope() {
        let mut b = Behavior { drop_response: true, ..Behavior::default() };
        assert!(b.drops(Scope::Create) && b.drops(Scope::Poll) && b.drops(Scope::List));
        b.drop_on = Some("create".into());
        assert!(b.drops(Scope::Create) && !b.drops(Scope::Poll));
    }
}
