//! Money in the store: budget limits checked inside the transaction that records `calling`,
//! and the spend report read from the executions themselves, written once over [`Tx`] for
//! both backends.
//!
//! **Budget invariant.** A request whose configured price would take the spend of a period
//! (requests `possible` or `charged` whose `calling` falls in it) over a limit is never
//! recorded as `calling`, so it is never sent. The check ([`budget_check`]) and the `calling`
//! record are one operation (`record_calling`). On SQLite operations run one after another on
//! the writer thread, so two workers cannot both see room for the last slot. On PostgreSQL
//! several nodes record calls at once, so the check takes the **budget lock** first
//! ([`budget_lock`], a hook that does nothing where [`Tx::locking`] is false): a
//! transaction-level advisory lock (class `store::locks::LOCK_CLASS`, key `store::locks::BUDGET_KEY`). A
//! call checked against limits takes it exclusively, so two nodes' checks run one after the
//! other and each sees the other's committed call; a priced call checked against no limit (a
//! node configured without them, or a provider no limit covers) takes it shared, so it can
//! never commit between another node's check and that node's record. The lock is released at
//! commit. Requests of a provider without a price cost nothing here (nothing to add up);
//! configuration warns.
//!
//! Periods are calendar days and months of the shop's zone (`[ui] time_zone`, carried by each
//! [`Limit`]; `domain::zone`). A limit for the whole daemon is in one currency and counts only
//! requests priced in it; a provider's limit is in its provider's currency. Nothing is ever
//! added across currencies: the spend report has rows and totals per currency.

use jiff::tz::TimeZone;
use serde::Serialize;

use super::StoreError;
use super::tx::{Row, Tx};
use crate::domain::words::{say, say_with};
use crate::domain::{Charge, Micros, Millis, money, zone};

/// A budget period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum Period {
    Day,
    Month,
}

impl Period {
    /// `daily` / `monthly`, as configured and shown.
    pub fn adjective(self) -> &'static str {
        match self {
            Period::Day => "daily",
            Period::Month => "monthly",
        }
    }

    /// The period containing `now` in `zone` (local midnight to local midnight): `[start, end)`.
    pub fn bounds(self, now: Millis, zone: &TimeZone) -> (Millis, Millis) {
        match self {
            Period::Day => zone::day_bounds(now, zone),
            Period::Month => zone::month_bounds(now, zone),
        }
    }

    /// When the next period begins, in words naming `zone`.
    fn when_next(self, zone: &TimeZone) -> String {
        match self {
            Period::Day => say_with("say.period_tomorrow_in", &[("zone", &zone::name(zone))]),
            Period::Month => say_with("say.period_next_month_in", &[("zone", &zone::name(zone))]),
        }
    }

    /// "today's" / "this month's", as the held task's words say it.
    fn this(self) -> String {
        say(match self {
            Period::Day => "say.period_todays",
            Period::Month => "say.period_this_months",
        })
    }

    /// "today" / "this month".
    fn now_words(self) -> String {
        say(match self {
            Period::Day => "say.period_today",
            Period::Month => "say.period_this_month",
        })
    }
}

/// One spending limit: for the whole daemon (`provider: None`) or one provider.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Limit {
    pub period: Period,
    pub provider: Option<String>,
    pub micros: Micros,
    /// The limit's currency: a provider's limit is in its provider's; one for the whole
    /// daemon counts only requests priced in it.
    pub currency: String,
    /// The zone whose calendar days and months the period follows (`[ui] time_zone`).
    pub zone: TimeZone,
}

impl Limit {
    /// The limit's period containing `now`: `[start, end)` in its zone.
    pub fn bounds(&self, now: Millis) -> (Millis, Millis) {
        self.period.bounds(now, &self.zone)
    }
}

/// Sum of the `possible` and `charged` requests in `[start, end)` that count toward `l` (those
/// priced in its currency, or its provider's).
fn spent(tx: &mut dyn Tx, l: &Limit, start: Millis, end: Millis) -> Result<Micros, StoreError> {
    let row = match &l.provider {
        None => tx.one(
            "SELECT CAST(coalesce(sum(cost_micros), 0) AS BIGINT) FROM executions
             WHERE charge IN ('possible', 'charged') AND calling_at >= ?1 AND calling_at < ?2
               AND currency = ?3",
            &[&start, &end, &l.currency],
        )?,
        Some(p) => tx.one(
            "SELECT CAST(coalesce(sum(x.cost_micros), 0) AS BIGINT) FROM executions x JOIN tasks t ON t.id = x.task_id
             WHERE x.charge IN ('possible', 'charged') AND x.calling_at >= ?1 AND x.calling_at < ?2
               AND t.provider = ?3",
            &[&start, &end, p],
        )?,
    };
    row.get(0)
}

/// The budget lock (module docs), where transactions run side by side: exclusive for a call
/// checked against limits, shared for a priced call no limit covers. Nothing on SQLite.
fn budget_lock(tx: &mut dyn Tx, exclusive: bool) -> Result<(), StoreError> {
    if tx.locking() {
        use crate::store::locks::{BUDGET_KEY, LOCK_CLASS};
        let sql = if exclusive {
            "SELECT pg_advisory_xact_lock(?1, ?2)"
        } else {
            "SELECT pg_advisory_xact_lock_shared(?1, ?2)"
        };
        tx.exec(sql, &[&LOCK_CLASS, &BUDGET_KEY])?;
    }
    Ok(())
}

/// Whether a request of `provider` costing `cost` fits every limit at `now`, under the budget
/// lock. `None` when it does; otherwise when it can next fit (the end of the latest full
/// period) and the plain words for the owner. Counts `possible` and `charged` requests: a
/// possibly charged request may have cost money.
pub(in crate::store) fn budget_check(
    tx: &mut dyn Tx,
    provider: &str,
    cost: Micros,
    limits: &[Limit],
    now: Millis,
) -> Result<Option<(Millis, String)>, StoreError> {
    let applies = limits.iter().any(|l| l.provider.as_deref().is_none_or(|p| p == provider));
    budget_lock(tx, applies)?;
    if !applies {
        return Ok(None);
    }
    first_limit_hit(provider, cost, limits, now, |l, start, end| spent(tx, l, start, end))
}

/// The decision of [`budget_check`]: `spent(limit, start, end)` sums the
/// period's `possible` and `charged` requests that count toward `limit` (all, or its
/// provider's). Returns when the call can next fit and the words for the owner, or `None`.
pub(in crate::store) fn first_limit_hit(
    provider: &str,
    cost: Micros,
    limits: &[Limit],
    now: Millis,
    mut spent: impl FnMut(&Limit, Millis, Millis) -> Result<Micros, StoreError>,
) -> Result<Option<(Millis, String)>, StoreError> {
    let mut held: Option<(Millis, String)> = None;
    for l in limits {
        if l.provider.as_deref().is_some_and(|p| p != provider) {
            continue;
        }
        let (start, end) = l.bounds(now);
        let spent: Micros = spent(l, start, end)?;
        if spent + cost <= l.micros {
            continue;
        }
        if held.as_ref().is_some_and(|(due, _)| *due >= end) {
            continue;
        }
        let (this, limit, when) = (l.period.this(), money(l.micros, &l.currency), l.period.when_next(&l.zone));
        let (spent, now_words, cost) = (money(spent, &l.currency), l.period.now_words(), money(cost, &l.currency));
        let mut params = vec![
            ("this", this.as_str()),
            ("limit", limit.as_str()),
            ("when", when.as_str()),
            ("spent", spent.as_str()),
            ("now", now_words.as_str()),
            ("cost", cost.as_str()),
        ];
        let reason = match &l.provider {
            None => say_with("say.budget_held", &params),
            Some(p) => {
                params.push(("provider", p.as_str()));
                say_with("say.budget_held_provider", &params)
            }
        };
        held = Some((end, reason));
    }
    Ok(held)
}

/// How `GET /v1/spend` groups its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum Group {
    Day,
    Month,
    Provider,
}

impl Group {
    /// Parse `day`, `month` or `provider`.
    pub fn parse(s: &str) -> Option<Group> {
        match s {
            "day" => Some(Group::Day),
            "month" => Some(Group::Month),
            "provider" => Some(Group::Provider),
            _ => None,
        }
    }
}

/// A count of requests and what they are estimated to have cost: the sum of the configured
/// prices of those requests (requests without a price add 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct Amount {
    pub count: i64,
    pub amount: f64,
    #[serde(skip)]
    micros: Micros,
}

impl Amount {
    fn add(&mut self, cost: Option<Micros>) {
        self.count += 1;
        self.micros += cost.unwrap_or(0);
        self.amount = crate::domain::from_micros(self.micros);
    }
}

/// One row of the spend report, or its totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SpendRow {
    /// The day (`2026-12-01`) or month (`2026-12`) in the shop's zone, or the provider name;
    /// `total` for the totals. A day with requests in two currencies has two rows.
    pub key: String,
    /// The currency of this row's amounts (`null`: no request in it had a price, or, for
    /// `totals`, the range has several currencies and only counts are added up).
    pub currency: Option<String>,
    /// Requests that delivered a result.
    pub charged: Amount,
    /// Requests whose outcome cannot be proven.
    pub possibly_charged: Amount,
    /// Definite refusals (a count), which providers do not charge for.
    pub refused: i64,
    /// Charged or possibly charged requests of providers without a configured price.
    pub unpriced: i64,
    /// Requests whose charge the owner recorded by hand (resolving an unknown with what the
    /// provider's dashboard showed): counted as they recorded, not as the evidence left them.
    pub recorded_by_hand: i64,
}

impl SpendRow {
    fn add(&mut self, charge: Charge, cost: Option<Micros>) {
        match charge {
            Charge::Charged => self.charged.add(cost),
            Charge::Possible => self.possibly_charged.add(cost),
            Charge::Refused => self.refused += 1,
            Charge::None => return,
        }
        if cost.is_none() && charge.may_cost() {
            self.unpriced += 1;
        }
    }
}

/// One request that reached the provider, for the CSV.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[allow(missing_docs)]
pub struct PaidRequest {
    /// When its `calling` was recorded (ms since the epoch).
    pub at: Millis,
    pub task_id: String,
    pub provider: String,
    pub model: Option<String>,
    pub charge: Charge,
    pub cost_micros: Option<Micros>,
    pub currency: Option<String>,
    /// The owner recorded its charge by hand (resolving an unknown).
    pub by_hand: bool,
}

/// The spend report over `[from, to)`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SpendReport {
    /// One row per key and currency, by key.
    pub rows: Vec<SpendRow>,
    /// Every request's counts; its amounts only when the range has one currency (amounts are
    /// never added across currencies).
    pub totals: SpendRow,
    /// The totals of each currency (key `total`), by currency.
    pub totals_by_currency: Vec<SpendRow>,
    /// The currency of the amounts when there is one (`None` when no request had a price, or
    /// when there are several: see each row's).
    pub currency: Option<String>,
    /// Every currency with a priced request in the range, sorted.
    pub currencies: Vec<String>,
}

/// Every request that reached a provider (charge other than `none`, or one whose charge the
/// owner recorded by hand) in `[from, to)`, oldest first.
pub(in crate::store) fn requests(tx: &mut dyn Tx, from: Millis, to: Millis) -> Result<Vec<PaidRequest>, StoreError> {
    tx.rows(
        "SELECT x.calling_at, x.task_id, t.provider, x.model, x.charge, x.cost_micros, x.currency,
                x.charge_recorded_at IS NOT NULL, x.token
         FROM executions x JOIN tasks t ON t.id = x.task_id
         WHERE x.charge <> 'none' AND x.calling_at >= ?1 AND x.calling_at < ?2
         UNION ALL
         SELECT x.calling_at, x.task_id, t.provider, x.model, x.charge, x.cost_micros, x.currency, true, x.token
         FROM executions x JOIN tasks t ON t.id = x.task_id
         WHERE x.charge = 'none' AND x.charge_recorded_at IS NOT NULL AND x.calling_at >= ?1 AND x.calling_at < ?2
         ORDER BY 1, 9",
        &[&from, &to],
    )?
    .iter()
    .map(|r| {
        Ok(PaidRequest {
            at: r.get(0)?,
            task_id: r.get(1)?,
            provider: r.get(2)?,
            model: r.get(3)?,
            charge: charge_at(r, 4)?,
            cost_micros: r.get(5)?,
            currency: r.get(6)?,
            by_hand: r.get(7)?,
        })
    })
    .collect()
}

/// Column `i` as a [`Charge`] (an unreadable one counts as `possible`: it may have cost money).
fn charge_at(r: &Row, i: usize) -> Result<Charge, StoreError> {
    Ok(Charge::parse(&r.get::<String>(i)?).unwrap_or(Charge::Possible))
}

/// The spend report over `[from, to)`, grouped by the days and months of `zone`.
pub(in crate::store) fn report(
    tx: &mut dyn Tx,
    from: Millis,
    to: Millis,
    group: Group,
    zone: &TimeZone,
) -> Result<SpendReport, StoreError> {
    Ok(group_requests(requests(tx, from, to)?, group, zone))
}

/// The row of `rows` for `key` in `currency`, made if missing. An unpriced request (no
/// currency) joins any row of its key; a priced one a row of its currency, or the key's row
/// that so far had no price.
fn row_for<'a>(rows: &'a mut Vec<SpendRow>, key: &str, currency: Option<&String>) -> &'a mut SpendRow {
    let found = match currency {
        None => rows.iter().position(|r| r.key == key),
        Some(c) => rows
            .iter()
            .position(|r| r.key == key && r.currency.as_ref() == Some(c))
            .or_else(|| rows.iter().position(|r| r.key == key && r.currency.is_none())),
    };
    let i = found.unwrap_or_else(|| {
        rows.push(SpendRow { key: key.to_string(), ..SpendRow::default() });
        rows.len() - 1
    });
    let row = &mut rows[i];
    if row.currency.is_none() {
        row.currency = currency.cloned();
    }
    row
}

/// The spend report of `requests` (oldest first), grouped in `zone`: the same on either
/// backend.
fn group_requests(requests: Vec<PaidRequest>, group: Group, zone: &TimeZone) -> SpendReport {
    let mut out = SpendReport::default();
    let mut totals = SpendRow { key: "total".into(), ..SpendRow::default() };
    for r in requests {
        let key = match group {
            Group::Day => zone::day_key(r.at, zone),
            Group::Month => zone::day_key(r.at, zone)[..7].to_string(),
            Group::Provider => r.provider.clone(),
        };
        let currency = r.currency.as_ref().filter(|_| r.cost_micros.is_some());
        for row in [row_for(&mut out.rows, &key, currency), row_for(&mut out.totals_by_currency, "total", currency)] {
            row.add(r.charge, r.cost_micros);
            row.recorded_by_hand += i64::from(r.by_hand);
        }
        totals.add(r.charge, r.cost_micros);
        totals.recorded_by_hand += i64::from(r.by_hand);
        if let Some(c) = currency
            && !out.currencies.contains(c)
        {
            out.currencies.push(c.clone());
        }
    }
    out.currencies.sort();
    out.rows.sort_by(|a, b| (&a.key, &a.currency).cmp(&(&b.key, &b.currency)));
    out.totals_by_currency.sort_by(|a, b| a.currency.cmp(&b.currency));
    if let [one] = out.currencies.as_slice() {
        out.currency = Some(one.clone());
        totals.currency = Some(one.clone());
    } else if out.currencies.len() > 1 {
        // Counts add up across currencies; amounts do not.
        for a in [&mut totals.charged, &mut totals.possibly_charged] {
            *a = Amount { count: a.count, ..Amount::default() };
        }
    }
    out.totals = totals;
    out
}

/// One limit and how much of it the current period has used.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[allow(missing_docs)]
pub struct BudgetUse {
    /// `daily` or `monthly`.
    pub period: &'static str,
    /// `null` for the whole daemon, else the provider the limit is for.
    pub provider: Option<String>,
    pub limit: f64,
    /// Possibly charged and charged requests in the current period (what the check counts).
    pub spent: f64,
    pub currency: String,
    /// When the current period ends (ms since the epoch).
    #[serde(skip)]
    pub resets_at_ms: Millis,
}

/// How much of each limit the period containing `now` has used.
pub(in crate::store) fn budget_use(
    tx: &mut dyn Tx,
    limits: &[Limit],
    now: Millis,
) -> Result<Vec<BudgetUse>, StoreError> {
    budget_use_with(limits, now, |l, start, end| spent(tx, l, start, end))
}

/// [`budget_use`], with `spent` as in [`first_limit_hit`].
fn budget_use_with(
    limits: &[Limit],
    now: Millis,
    mut spent: impl FnMut(&Limit, Millis, Millis) -> Result<Micros, StoreError>,
) -> Result<Vec<BudgetUse>, StoreError> {
    let mut out = Vec::new();
    for l in limits {
        let (start, end) = l.bounds(now);
        let spent: Micros = spent(l, start, end)?;
        out.push(BudgetUse {
            period: l.period.adjective(),
            provider: l.provider.clone(),
            limit: crate::domain::from_micros(l.micros),
            spent: crate::domain::from_micros(spent),
            currency: l.currency.clone(),
            resets_at_ms: end,
        });
    }
    Ok(out)
}

/// Make every envelope held back by a budget due now, so each checks the limits in force
/// again (a raised limit lets it go; an unchanged one holds it again). Returns how many.
/// An ordered commit is enough: if a power loss erases it, the holds are released again at
/// the next start.
pub(in crate::store) fn release_budget_holds(tx: &mut dyn Tx, now: Millis) -> Result<usize, StoreError> {
    let n = tx.exec(
        "UPDATE envelopes SET due_at = ?1, budget_hold = false WHERE status = 'pending' AND budget_hold",
        &[&now],
    )?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// Settled requests that reached a provider, grouped for the metrics.
pub(in crate::store) fn charge_totals(tx: &mut dyn Tx) -> Result<Vec<crate::metrics::ChargeTotal>, StoreError> {
    tx.rows(
        "SELECT t.provider, x.charge, x.currency, count(*), CAST(coalesce(sum(x.cost_micros), 0) AS BIGINT)
         FROM executions x JOIN tasks t ON t.id = x.task_id
         WHERE x.charge <> 'none' AND x.status <> 'running'
         GROUP BY t.provider, x.charge, x.currency",
        &[],
    )?
    .iter()
    .map(|r| Ok((r.get(0)?, charge_at(r, 1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> Millis {
        rfc3339.parse::<jiff::Timestamp>().expect("a time").as_millisecond()
    }

    fn shanghai() -> TimeZone {
        jiff::tz::TimeZone::get("Asia/Shanghai").expect("a zone")
    }

    #[test]
    fn periods_are_the_zones_calendar_days_and_months() {
        let utc = TimeZone::UTC;
        let noon = at("2026-12-01T12:00:00Z");
        assert_eq!(Period::Day.bounds(noon, &utc), (at("2026-12-01T00:00:00Z"), at("2026-12-02T00:00:00Z")));
        assert_eq!(Period::Month.bounds(noon, &utc), (at("2026-12-01T00:00:00Z"), at("2027-01-01T00:00:00Z")));
        assert_eq!(Period::Month.bounds(at("2028-02-29T10:00:00Z"), &utc).1, at("2028-03-01T00:00:00Z"));
        // Beijing: a request at 23:30 UTC on the 3rd counts in the local 4th, whose budget day
        // began at 16:00 UTC; December 1st began at 16:00 UTC on November 30th.
        let late = at("2026-12-03T23:30:00Z");
        assert_eq!(Period::Day.bounds(late, &shanghai()), (at("2026-12-03T16:00:00Z"), at("2026-12-04T16:00:00Z")));
        assert_eq!(Period::Month.bounds(late, &shanghai()).0, at("2026-11-30T16:00:00Z"));
        assert_eq!(Period::Month.bounds(at("2026-11-30T16:30:00Z"), &shanghai()).0, at("2026-11-30T16:00:00Z"));
        assert!(Period::Day.when_next(&shanghai()).contains("Asia/Shanghai"));
    }

    #[test]
    fn a_daily_limit_counts_the_local_day_and_its_currency() {
        let limit =
            Limit { period: Period::Day, provider: None, micros: 1_000_000, currency: "CNY".into(), zone: shanghai() };
        let mut asked = Vec::new();
        let held = first_limit_hit("oa", 300_000, &[limit], at("2026-12-03T23:30:00Z"), |l, start, end| {
            asked.push((l.currency.clone(), start, end));
            Ok(900_000)
        })
        .expect("checked");
        assert_eq!(asked, vec![("CNY".to_string(), at("2026-12-03T16:00:00Z"), at("2026-12-04T16:00:00Z"))]);
        let (due, reason) = held.expect("held");
        assert_eq!(due, at("2026-12-04T16:00:00Z"));
        let reason = crate::domain::words::english(&reason);
        assert!(reason.contains("00:00 Asia/Shanghai"), "{reason}");
    }

    fn paid(at: Millis, provider: &str, cost: Micros, currency: &str) -> PaidRequest {
        PaidRequest {
            at,
            task_id: format!("t{at}"),
            provider: provider.into(),
            model: None,
            charge: Charge::Charged,
            cost_micros: Some(cost),
            currency: Some(currency.into()),
            by_hand: false,
        }
    }

    #[test]
    fn the_report_groups_by_local_day_and_never_adds_currencies() {
        let reqs = vec![
            paid(at("2026-12-03T10:00:00Z"), "oa", 300_000, "CNY"),
            paid(at("2026-12-03T23:30:00Z"), "oa", 300_000, "CNY"),
            paid(at("2026-12-03T23:40:00Z"), "rep", 40_000, "USD"),
        ];
        let r = group_requests(reqs.clone(), Group::Day, &shanghai());
        let keys: Vec<(&str, Option<&str>)> = r.rows.iter().map(|r| (r.key.as_str(), r.currency.as_deref())).collect();
        assert_eq!(keys, vec![("2026-12-03", Some("CNY")), ("2026-12-04", Some("CNY")), ("2026-12-04", Some("USD"))]);
        assert_eq!(r.currencies, vec!["CNY".to_string(), "USD".to_string()]);
        assert_eq!(r.currency, None);
        assert_eq!((r.totals.charged.count, r.totals.charged.amount, r.totals.currency.as_deref()), (3, 0.0, None));
        let by: Vec<(Option<&str>, i64, f64)> =
            r.totals_by_currency.iter().map(|t| (t.currency.as_deref(), t.charged.count, t.charged.amount)).collect();
        assert_eq!(by, vec![(Some("CNY"), 2, 0.6), (Some("USD"), 1, 0.04)]);
        // In UTC the same requests fall on one day.
        let utc = group_requests(reqs[..2].to_vec(), Group::Month, &TimeZone::UTC);
        assert_eq!((utc.rows.len(), utc.currency.as_deref(), utc.totals.charged.amount), (1, Some("CNY"), 0.6));
    }
}
