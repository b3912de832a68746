//! `GET /v1/spend` (what was spent, grouped by day, month or provider, with the budgets'
//! use) and `GET /v1/spend/requests` (every paid request, as JSON or CSV for the shop's
//! accounting). Both read the executions themselves: the same evidence the task JSON's
//! `charge` comes from.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::{AppState, json_response};
use crate::clock::rfc3339;
use crate::domain::{Charge, Millis, from_micros};
use crate::store::spend::{Group, PaidRequest, parse_day};

/// Milliseconds in a day.
const DAY_MS: Millis = 86_400_000;

/// The query of both routes.
#[derive(Debug, Deserialize)]
pub struct SpendQuery {
    /// Start: a UTC date (`2026-12-01`) or an RFC 3339 time; default: the beginning.
    pub from: Option<String>,
    /// End: a UTC date (that whole day is included) or an RFC 3339 time (excluded);
    /// default: now.
    pub to: Option<String>,
    /// `day` (default), `month` or `provider`.
    pub group: Option<String>,
    /// `/v1/spend/requests` only: `json` (default) or `csv`.
    pub format: Option<String>,
}

/// `from`/`to` as milliseconds: `[from, to)`.
fn range(q: &SpendQuery, now: Millis) -> Result<(Millis, Millis), ApiError> {
    let from = match q.from.as_deref().filter(|s| !s.is_empty()) {
        None => 0,
        Some(s) => instant(s, false).ok_or_else(|| bad_time("from", s))?,
    };
    let to = match q.to.as_deref().filter(|s| !s.is_empty()) {
        None => now + 1,
        Some(s) => instant(s, true).ok_or_else(|| bad_time("to", s))?,
    };
    if to <= from {
        return Err(ApiError::bad_request("`to` must be later than `from`"));
    }
    Ok((from, to))
}

/// A date (its start, or with `end_of_day` the start of the next day) or an RFC 3339 time.
fn instant(s: &str, end_of_day: bool) -> Option<Millis> {
    if let Some(day) = parse_day(s) {
        return Some(if end_of_day { day + DAY_MS } else { day });
    }
    let t = humantime::parse_rfc3339_weak(s).ok()?;
    t.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_millis() as Millis)
}

fn bad_time(key: &str, s: &str) -> ApiError {
    ApiError::bad_request(format!("`{key}` = `{s}` is not a date like 2026-12-01 or a time like 2026-12-01T09:30:00Z"))
}

/// `GET /v1/spend?from=&to=&group=day|month|provider`: per row the charged count and
/// amount, the possibly charged count and amount and the refused count; totals; currency;
/// and how much of each budget the current period has used.
pub async fn spend(
    State(state): State<AppState>,
    query: Result<Query<SpendQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let engine = state.engine();
    let now = engine.now();
    let (from, to) = range(&q, now)?;
    let group = match q.group.as_deref().filter(|s| !s.is_empty()) {
        None => Group::Day,
        Some(g) => Group::parse(g)
            .ok_or_else(|| ApiError::bad_request(format!("`group` = `{g}` must be day, month or provider")))?,
    };
    let report = engine.store().spend(from, to, group).await?;
    let budgets: Vec<serde_json::Value> = engine
        .store()
        .budget_use(engine.limits(), now)
        .await?
        .into_iter()
        .map(|b| {
            let resets_at = rfc3339(b.resets_at_ms);
            let mut v = serde_json::to_value(&b).unwrap_or_default();
            v["resets_at"] = json!(resets_at);
            v
        })
        .collect();
    let currency = report.currency.clone().or_else(|| engine.limits().first().map(|l| l.currency.clone()));
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "from": rfc3339(from),
            "to": rfc3339(to),
            "group": group,
            "currency": currency,
            "rows": report.rows,
            "totals": report.totals,
            "budgets": budgets,
        }),
    ))
}

/// `GET /v1/spend/requests?from=&to=&format=json|csv`: every paid request (possibly charged
/// or charged), oldest first: time, task, provider, model, state, estimated cost, currency.
pub async fn requests(
    State(state): State<AppState>,
    query: Result<Query<SpendQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let engine = state.engine();
    let (from, to) = range(&q, engine.now())?;
    let paid: Vec<PaidRequest> =
        engine.store().paid_requests(from, to).await?.into_iter().filter(|r| r.charge.may_cost()).collect();
    match q.format.as_deref().unwrap_or("json") {
        "json" => {
            let rows: Vec<serde_json::Value> = paid.iter().map(request_json).collect();
            Ok(json_response(StatusCode::OK, &json!({ "requests": rows })))
        }
        "csv" => Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], csv(&paid)).into_response()),
        other => Err(ApiError::bad_request(format!("`format` = `{other}` must be json or csv"))),
    }
}

fn request_json(r: &PaidRequest) -> serde_json::Value {
    json!({
        "time": rfc3339(r.at),
        "task_id": r.task_id,
        "provider": r.provider,
        "model": r.model,
        "state": r.charge,
        "estimated_cost": r.cost_micros.map(from_micros),
        "currency": r.currency,
    })
}

/// The requests as CSV (RFC 4180: fields with commas, quotes or line breaks are quoted).
pub fn csv(rows: &[PaidRequest]) -> String {
    let mut out = String::from("time,task,provider,model,state,estimated_cost,currency\r\n");
    for r in rows {
        let cost = r.cost_micros.map(|m| format!("{}", from_micros(m))).unwrap_or_default();
        let state = match r.charge {
            Charge::Charged => "charged",
            Charge::Possible => "possible",
            Charge::Refused => "refused",
            Charge::None => "none",
        };
        let fields = [
            rfc3339(r.at),
            r.task_id.clone(),
            r.provider.clone(),
            r.model.clone().unwrap_or_default(),
            state.to_string(),
            cost,
            r.currency.clone().unwrap_or_default(),
        ];
        let line: Vec<String> = fields.iter().map(|f| field(f)).collect();
        out.push_str(&line.join(","));
        out.push_str("\r\n");
    }
    out
}

fn field(f: &str) -> String {
    if f.contains([',', '"', '\n', '\r']) { format!("\"{}\"", f.replace('"', "\"\"")) } else { f.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_what_needs_quoting() {
        let r = PaidRequest {
            at: 0,
            task_id: "t".into(),
            provider: "p".into(),
            model: Some("a,\"b\"".into()),
            charge: Charge::Possible,
            cost_micros: Some(40_000),
            currency: Some("USD".into()),
        };
        let text = csv(&[r]);
        assert_eq!(text.lines().nth(1), Some("1970-01-01T00:00:00.000Z,t,p,\"a,\"\"b\"\"\",possible,0.04,USD"));
    }

    #[test]
    fn a_date_to_includes_its_whole_day() {
        let start = instant("2026-12-01", false).unwrap();
        assert_eq!(instant("2026-12-01", true), Some(start + DAY_MS));
        assert_eq!(instant("2026-12-01T00:00:00Z", true), Some(start));
        assert_eq!(instant("yesterday", false), None);
    }
}
