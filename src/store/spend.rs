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
//! Periods are calendar days and months in UTC.

use serde::Serialize;

use super::StoreError;
use super::tx::{Row, Tx};
use crate::domain::{Charge, Micros, Millis, money};

/// Milliseconds in a day.
const DAY_MS: Millis = 86_400_000;

/// A budget period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
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

    /// The period containing `now`: `[start, end)`.
    pub fn bounds(self, now: Millis) -> (Millis, Millis) {
        let day = now.div_euclid(DAY_MS);
        match self {
            Period::Day => (day * DAY_MS, (day + 1) * DAY_MS),
            Period::Month => {
                let (y, m, _) = civil_from_days(day);
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (days_from_civil(y, m, 1) * DAY_MS, days_from_civil(ny, nm, 1) * DAY_MS)
            }
        }
    }

    fn when_next(self) -> &'static str {
        match self {
            Period::Day => "tomorrow (00:00 UTC)",
            Period::Month => "next month (the 1st, 00:00 UTC)",
        }
    }

    /// "today's" / "this month's", as the held task's words say it.
    fn this(self) -> &'static str {
        match self {
            Period::Day => "today's",
            Period::Month => "this month's",
        }
    }

    /// "today" / "this month".
    fn now_words(self) -> &'static str {
        match self {
            Period::Day => "today",
            Period::Month => "this month",
        }
    }
}

/// One spending limit: for the whole daemon (`provider: None`) or one provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub period: Period,
    pub provider: Option<String>,
    pub micros: Micros,
    pub currency: String,
}

/// Sum of the `possible` and `charged` requests in `[start, end)` that count toward `l` (all
/// of them, or its provider's).
fn spent(tx: &mut dyn Tx, l: &Limit, start: Millis, end: Millis) -> Result<Micros, StoreError> {
    let row = match &l.provider {
        None => tx.one(
            "SELECT CAST(coalesce(sum(cost_micros), 0) AS BIGINT) FROM executions
             WHERE charge IN ('possible', 'charged') AND calling_at >= ?1 AND calling_at < ?2",
            &[&start, &end],
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
        let (start, end) = l.period.bounds(now);
        let spent: Micros = spent(l, start, end)?;
        if spent + cost <= l.micros {
            continue;
        }
        if held.as_ref().is_some_and(|(due, _)| *due >= end) {
            continue;
        }
        let whose = match &l.provider {
            None => String::new(),
            Some(p) => format!(" for provider `{p}`"),
        };
        let reason = format!(
            "Held: {} budget{whose} of {} is spent — raise it or wait until {}. {} is spent or possibly spent {} \
             and this request would cost about {}; nothing was sent.",
            l.period.this(),
            money(l.micros, &l.currency),
            l.period.when_next(),
            money(spent, &l.currency),
            l.period.now_words(),
            money(cost, &l.currency),
        );
        held = Some((end, reason));
    }
    Ok(held)
}

/// How `GET /v1/spend` groups its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
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
    /// The day (`2026-12-01`), month (`2026-12`) or provider name; `total` for the totals.
    pub key: String,
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
    pub rows: Vec<SpendRow>,
    pub totals: SpendRow,
    /// The currency of the amounts (`None` when no request had a price).
    pub currency: Option<String>,
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

/// The spend report over `[from, to)`, grouped.
pub(in crate::store) fn report(
    tx: &mut dyn Tx,
    from: Millis,
    to: Millis,
    group: Group,
) -> Result<SpendReport, StoreError> {
    Ok(group_requests(requests(tx, from, to)?, group))
}

/// The spend report of `requests` (oldest first), grouped: the same on either backend.
fn group_requests(requests: Vec<PaidRequest>, group: Group) -> SpendReport {
    let mut out = SpendReport { totals: SpendRow { key: "total".into(), ..SpendRow::default() }, ..Default::default() };
    for r in requests {
        let key = match group {
            Group::Day => day_key(r.at),
            Group::Month => day_key(r.at)[..7].to_string(),
            Group::Provider => r.provider.clone(),
        };
        let row = match out.rows.iter_mut().position(|row| row.key == key) {
            Some(i) => &mut out.rows[i],
            None => {
                out.rows.push(SpendRow { key, ..SpendRow::default() });
                out.rows.last_mut().unwrap_or_else(|| unreachable!("just pushed"))
            }
        };
        row.add(r.charge, r.cost_micros);
        out.totals.add(r.charge, r.cost_micros);
        if r.by_hand {
            row.recorded_by_hand += 1;
            out.totals.recorded_by_hand += 1;
        }
        if out.currency.is_none() {
            out.currency = r.currency.clone();
        }
    }
    out.rows.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// The UTC date of a time: `2026-12-01`.
pub fn day_key(at: Millis) -> String {
    let (y, m, d) = civil_from_days(at.div_euclid(DAY_MS));
    format!("{y:04}-{m:02}-{d:02}")
}

/// The start of a UTC date `YYYY-MM-DD`, if it is one.
pub fn parse_day(s: &str) -> Option<Millis> {
    let mut parts = s.splitn(3, '-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let d: i64 = parts.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || !(1970..=9999).contains(&y) {
        return None;
    }
    let days = days_from_civil(y, m, d);
    // Reject dates like 2026-02-31 that roll over into the next month.
    (civil_from_days(days) == (y, m, d)).then_some(days * DAY_MS)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day number (the inverse of [`days_from_civil`]).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// One limit and how much of it the current period has used.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
        let (start, end) = l.period.bounds(now);
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

    #[test]
    fn dates_round_trip_and_periods_are_utc_calendar_ones() {
        let t = parse_day("2026-12-01").expect("a date");
        assert_eq!(day_key(t), "2026-12-01");
        assert_eq!(day_key(t + DAY_MS - 1), "2026-12-01");
        assert_eq!(parse_day("2026-02-31"), None);
        assert_eq!(parse_day("soon"), None);
        let noon = t + DAY_MS / 2;
        assert_eq!(Period::Day.bounds(noon), (t, t + DAY_MS));
        let (start, end) = Period::Month.bounds(noon);
        assert_eq!((day_key(start), day_key(end)), ("2026-12-01".into(), "2027-01-01".into()));
        let feb = parse_day("2028-02-29").expect("leap day");
        assert_eq!(day_key(Period::Month.bounds(feb).1), "2028-03-01");
    }
}
