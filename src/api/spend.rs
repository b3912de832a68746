//! `GET /v1/spend` (what was spent, grouped by day, month or provider, with the budgets'
//! use) and `GET /v1/spend/requests` (every paid request, as JSON or CSV for the shop's
//! accounting). Both read the executions themselves: the same evidence the task JSON's
//! `charge` comes from.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::openapi::StoreFailure;
use super::{AppState, json_response};
use crate::clock::rfc3339;
use crate::domain::zone::{self, parse_day};
use crate::domain::{Charge, Millis, from_micros};
use crate::store::spend::{Group, PaidRequest, SpendRow};
use jiff::tz::TimeZone;

/// The query of `GET /v1/spend`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SpendQuery {
    /// Start: a date in the shop's zone (`2026-12-01`, from its local midnight) or an RFC
    /// 3339 time; default: the beginning.
    #[param(schema_with = super::openapi::date_or_time)]
    pub from: Option<String>,
    /// End: a date in the shop's zone (that whole local day is included) or an RFC 3339 time
    /// (excluded); default: now.
    #[param(schema_with = super::openapi::date_or_time)]
    pub to: Option<String>,
    /// `day` (default; also when empty), `month` or `provider`.
    #[param(schema_with = super::openapi::or_empty::<Group>)]
    pub group: Option<String>,
}

/// The query of `GET /v1/spend/requests`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RequestsQuery {
    /// Start: a date in the shop's zone (`2026-12-01`, from its local midnight) or an RFC
    /// 3339 time; default: the beginning.
    #[param(schema_with = super::openapi::date_or_time)]
    pub from: Option<String>,
    /// End: a date in the shop's zone (that whole local day is included) or an RFC 3339 time
    /// (excluded); default: now.
    #[param(schema_with = super::openapi::date_or_time)]
    pub to: Option<String>,
    /// `json` (default) or `csv`.
    #[param(schema_with = request_format)]
    pub format: Option<String>,
}

/// The schema of `format`: `json` or `csv`.
fn request_format() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(["json", "csv"]))
        .build()
}

/// `GET /v1/spend` answer.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct SpendJson {
    /// The start of the range (RFC 3339).
    pub from: String,
    /// The end of the range, excluded (RFC 3339).
    pub to: String,
    pub group: Group,
    /// The shop's zone (`[ui] time_zone`): the rows' days and months are its local dates.
    pub time_zone: String,
    /// The currency of the amounts when there is one (`null`: no price is configured, or the
    /// range has several currencies: see each row's `currency` and `totals_by_currency`).
    pub currency: Option<String>,
    /// Every currency with a priced request in the range.
    pub currencies: Vec<String>,
    /// One row per day, month or provider that had a request, and per currency (amounts are
    /// never added across currencies and never converted).
    pub rows: Vec<SpendRow>,
    /// The whole range (`key` is `total`): every count; amounts only when the range has one
    /// currency.
    pub totals: SpendRow,
    /// The whole range per currency (`key` is `total`).
    pub totals_by_currency: Vec<SpendRow>,
    /// How much of each configured budget its current period has used.
    pub budgets: Vec<BudgetJson>,
}

/// One budget and how much of it the current period has used.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct BudgetJson {
    /// `daily` or `monthly`.
    pub period: String,
    /// `null` for the whole daemon, else the provider the limit is for.
    pub provider: Option<String>,
    pub limit: f64,
    /// Possibly charged and charged requests in the current period (what the check counts).
    pub spent: f64,
    pub currency: String,
    /// When the current period ends (RFC 3339).
    pub resets_at: String,
}

/// One paid request (possibly charged or charged) of `GET /v1/spend/requests`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(missing_docs)]
pub struct PaidRequestJson {
    /// When it was about to be sent (RFC 3339).
    pub time: String,
    pub task_id: String,
    pub provider: String,
    pub model: Option<String>,
    /// `possible` or `charged`.
    pub state: Charge,
    /// Its configured price (`null`: none).
    pub estimated_cost: Option<f64>,
    pub currency: Option<String>,
    /// The owner recorded its charge by hand (resolving an unknown): `state` is their record
    /// (`charged`, or `none` for "the dashboard shows no charge").
    pub recorded_by_hand: bool,
}

/// `GET /v1/spend/requests` answer (JSON).
#[derive(Debug, Serialize, ToSchema)]
pub struct PaidRequestList {
    /// Oldest first.
    pub requests: Vec<PaidRequestJson>,
}

/// `from`/`to` as milliseconds: `[from, to)`, dates taken in `zone`.
fn range(from: Option<&str>, to: Option<&str>, now: Millis, zone: &TimeZone) -> Result<(Millis, Millis), ApiError> {
    let from = match from.filter(|s| !s.is_empty()) {
        None => 0,
        Some(s) => instant(s, false, zone).ok_or_else(|| bad_time("from", s))?,
    };
    let to = match to.filter(|s| !s.is_empty()) {
        None => now + 1,
        Some(s) => instant(s, true, zone).ok_or_else(|| bad_time("to", s))?,
    };
    if to <= from {
        return Err(ApiError::bad_request(crate::domain::words::say("say.error_to_from")));
    }
    Ok((from, to))
}

/// A date in `zone` (its local start, or with `end_of_day` the start of the next local day)
/// or an RFC 3339 time.
fn instant(s: &str, end_of_day: bool, zone: &TimeZone) -> Option<Millis> {
    if let Some(day) = parse_day(s, zone) {
        return Some(if end_of_day { zone::day_bounds(day, zone).1 } else { day });
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
#[utoipa::path(
    get,
    path = "/spend",
    operation_id = "spend",
    tag = "money",
    params(SpendQuery),
    responses(
        (status = 200, description = "What was spent in the range, grouped.", body = SpendJson),
        (status = 400, description = "A bad `from`, `to` or `group`, or `to` not after `from` (`bad_request`).",
            body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn spend(
    State(state): State<AppState>,
    query: Result<Query<SpendQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let engine = state.engine();
    let now = engine.now();
    let zone = engine.time_zone();
    let (from, to) = range(q.from.as_deref(), q.to.as_deref(), now, &zone)?;
    let group = match q.group.as_deref().filter(|s| !s.is_empty()) {
        None => Group::Day,
        Some(g) => Group::parse(g)
            .ok_or_else(|| ApiError::bad_request(format!("`group` = `{g}` must be day, month or provider")))?,
    };
    let report = engine.store().spend(from, to, group, zone.clone()).await?;
    let budgets: Vec<BudgetJson> = engine
        .store()
        .budget_use(engine.limits(), now)
        .await?
        .into_iter()
        .map(|b| BudgetJson {
            period: b.period.to_string(),
            provider: b.provider,
            limit: b.limit,
            spent: b.spent,
            currency: b.currency,
            resets_at: rfc3339(b.resets_at_ms),
        })
        .collect();
    let currency = match report.currencies.len() {
        0 => engine.limits().first().map(|l| l.currency.clone()),
        _ => report.currency.clone(),
    };
    Ok(json_response(
        StatusCode::OK,
        &SpendJson {
            from: rfc3339(from),
            to: rfc3339(to),
            group,
            time_zone: zone::name(&zone),
            currency,
            currencies: report.currencies,
            rows: report.rows,
            totals: report.totals,
            totals_by_currency: report.totals_by_currency,
            budgets,
        },
    ))
}

/// `GET /v1/spend/requests?from=&to=&format=json|csv`: every paid request (possibly charged
/// or charged, and any whose charge the owner recorded by hand), oldest first: time, task,
/// provider, model, state, estimated cost, currency, recorded (`by hand` or empty).
#[utoipa::path(
    get,
    path = "/spend/requests",
    operation_id = "spend_requests",
    tag = "money",
    params(RequestsQuery),
    responses(
        (status = 200, description = "Every paid request in the range, oldest first: JSON, or with \
            `format=csv` as CSV (`time,task,provider,model,state,estimated_cost,currency,recorded`; \
            `recorded` is `by hand` when the owner recorded the charge).",
            content((PaidRequestList = "application/json"), (String = "text/csv"))),
        (status = 400, description = "A bad `from`, `to` or `format`, or `to` not after `from` (`bad_request`).",
            body = ErrorBody),
        StoreFailure,
    )
)]
pub async fn requests(
    State(state): State<AppState>,
    query: Result<Query<RequestsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let engine = state.engine();
    let (from, to) = range(q.from.as_deref(), q.to.as_deref(), engine.now(), &engine.time_zone())?;
    let paid: Vec<PaidRequest> = engine
        .store()
        .paid_requests(from, to)
        .await?
        .into_iter()
        .filter(|r| r.charge.may_cost() || r.by_hand)
        .collect();
    match q.format.as_deref().unwrap_or("json") {
        "json" => {
            let requests: Vec<PaidRequestJson> = paid.iter().map(request_json).collect();
            Ok(json_response(StatusCode::OK, &PaidRequestList { requests }))
        }
        "csv" => Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], csv(&paid)).into_response()),
        other => Err(ApiError::bad_request(format!("`format` = `{other}` must be json or csv"))),
    }
}

fn request_json(r: &PaidRequest) -> PaidRequestJson {
    PaidRequestJson {
        time: rfc3339(r.at),
        task_id: r.task_id.clone(),
        provider: r.provider.clone(),
        model: r.model.clone(),
        state: r.charge,
        estimated_cost: r.cost_micros.map(from_micros),
        currency: r.currency.clone(),
        recorded_by_hand: r.by_hand,
    }
}

/// The requests as CSV (`domain::csv`: RFC 4180, a cell a spreadsheet would run as a formula
/// kept as text).
pub fn csv(rows: &[PaidRequest]) -> String {
    let mut out = String::from("time,task,provider,model,state,estimated_cost,currency,recorded\r\n");
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
            if r.by_hand { "by hand".to_string() } else { String::new() },
        ];
        out.push_str(&crate::domain::csv::line(&fields));
    }
    out
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
            by_hand: false,
        };
        let text = csv(&[r.clone(), PaidRequest { charge: Charge::None, by_hand: true, ..r }]);
        assert_eq!(text.lines().nth(1), Some("1970-01-01T00:00:00.000Z,t,p,\"a,\"\"b\"\"\",possible,0.04,USD,"));
        assert_eq!(text.lines().nth(2), Some("1970-01-01T00:00:00.000Z,t,p,\"a,\"\"b\"\"\",none,0.04,USD,by hand"));
        // A provider or model named like a formula stays text in a spreadsheet.
        let evil = PaidRequest {
            provider: "@SUM(1)".into(),
            model: Some("=HYPERLINK(\"http://x\")".into()),
            charge: Charge::None,
            ..r_base()
        };
        let text = csv(&[evil]);
        assert!(
            text.lines().nth(1).is_some_and(|l| l.contains(",\"'@SUM(1)\",\"'=HYPERLINK(\"\"http://x\"\")\",")),
            "{text}"
        );
    }

    fn r_base() -> PaidRequest {
        PaidRequest {
            at: 0,
            task_id: "t".into(),
            provider: "p".into(),
            model: None,
            charge: Charge::Possible,
            cost_micros: None,
            currency: None,
            by_hand: false,
        }
    }

    #[test]
    fn a_date_to_includes_its_whole_local_day() {
        let utc = TimeZone::UTC;
        let start = instant("2026-12-01", false, &utc).unwrap();
        assert_eq!(instant("2026-12-01", true, &utc), Some(start + 86_400_000));
        assert_eq!(instant("2026-12-01T00:00:00Z", true, &utc), Some(start));
        assert_eq!(instant("yesterday", false, &utc), None);
        // In Beijing the 1st runs from 16:00 UTC on November 30th.
        let sh = jiff::tz::TimeZone::get("Asia/Shanghai").unwrap();
        assert_eq!(instant("2026-12-01", false, &sh), Some(start - 8 * 3_600_000));
        assert_eq!(instant("2026-12-01", true, &sh), Some(start + 16 * 3_600_000));
    }
}
