//! The budget in force and where it comes from. The config's `[budget]` and each provider's
//! `budget_daily` / `budget_monthly` are the default; a budget set at run time (the page,
//! `tally budget set`, `PUT /v1/budget`) is stored in the database (`budget_setting`) and
//! replaces them until it is removed, across restarts. Applying either goes through
//! [`Engine::set_limits`], so a raised limit releases held tasks at once.
//!
//! On PostgreSQL the stored budget is shared; a node reads it at start-up, when it sets one
//! itself, and on SIGHUP.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Engine, EngineError};
use crate::domain::words::{say, say_with};
use crate::domain::{Micros, from_micros, to_micros};
use crate::store::spend::{Limit, Period};

/// Where the limits in force come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetSource {
    /// The configuration file (the default).
    Config,
    /// Set at run time and stored in the database.
    Set,
}

/// The stored form of one limit.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredLimit {
    period: String,
    provider: Option<String>,
    micros: Micros,
    currency: String,
}

/// The stored budget: every limit in force.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredBudget {
    limits: Vec<StoredLimit>,
}

/// Limits as the stored JSON.
pub(crate) fn encode(limits: &[Limit]) -> String {
    let doc = StoredBudget {
        limits: limits
            .iter()
            .map(|l| StoredLimit {
                period: l.period.adjective().into(),
                provider: l.provider.clone(),
                micros: l.micros,
                currency: l.currency.clone(),
            })
            .collect(),
    };
    serde_json::to_string(&doc).unwrap_or_else(|_| "{\"limits\":[]}".into())
}

/// The stored JSON as limits counted in `zone`; an error names what is wrong with it.
pub(crate) fn decode(json: &str, zone: &jiff::tz::TimeZone) -> Result<Vec<Limit>, String> {
    let doc: StoredBudget =
        serde_json::from_str(json).map_err(|e| format!("the stored budget is not readable: {e}"))?;
    doc.limits
        .into_iter()
        .map(|l| {
            let period = match l.period.as_str() {
                "daily" => Period::Day,
                "monthly" => Period::Month,
                other => return Err(format!("the stored budget has a period `{other}`")),
            };
            Ok(Limit { period, provider: l.provider, micros: l.micros, currency: l.currency, zone: zone.clone() })
        })
        .collect()
}

/// A change to one limit: absent (leave it), `null` (remove it) or an amount.
pub type Change = Option<Option<f64>>;

/// What `PUT /v1/budget` asks for: the whole daemon's limits, and per provider.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct BudgetChange {
    pub daily: Change,
    pub monthly: Change,
    pub providers: BTreeMap<String, (Change, Change)>,
}

/// One budget line of `GET /v1/budget`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct ProviderBudget {
    /// The provider's daily limit (`null`: none).
    pub daily: Option<f64>,
    pub monthly: Option<f64>,
    /// Charged and possibly charged at this provider today / this month (the shop's zone,
    /// `[ui] time_zone`).
    pub spent_today: f64,
    pub spent_this_month: f64,
    /// The provider's currency (its limits and spend are in it).
    pub currency: String,
}

/// `GET /v1/budget`: the limits in force, where they come from and what is used.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct BudgetView {
    /// The whole daemon's daily limit (`null`: none).
    pub daily: Option<f64>,
    pub monthly: Option<f64>,
    /// Every paid provider, with its own limits (`null`: none) and its spend.
    pub providers: BTreeMap<String, ProviderBudget>,
    /// The whole daemon's limits' currency (that of the one in force, else the priced
    /// providers' one currency; with several and none in force, the first of them).
    pub currency: String,
    /// Charged and possibly charged today / this month (the shop's zone), all providers
    /// priced in `currency`: what the budget check counts.
    pub spent_today: f64,
    pub spent_this_month: f64,
    /// `config` (the configuration file's `[budget]`) or `set` (stored in the database).
    pub source: BudgetSource,
    /// The shop's zone (`[ui] time_zone`): days and months begin at its local midnight.
    pub time_zone: String,
}

fn find(limits: &[Limit], period: Period, provider: Option<&str>) -> Option<Micros> {
    limits.iter().find(|l| l.period == period && l.provider.as_deref() == provider).map(|l| l.micros)
}

/// Check an amount from a request: 0 or more, finite.
fn amount(what: &str, v: f64) -> Result<Micros, EngineError> {
    if v.is_finite() && (0.0..1e12).contains(&v) {
        Ok(to_micros(v))
    } else {
        Err(EngineError::Invalid(say_with("say.budget_amount", &[("what", what), ("amount", &v.to_string())])))
    }
}

impl Engine {
    /// The currency of the whole daemon's budget: that of one in force, else the priced
    /// providers' one currency, else the default. `Err` with the currencies when the priced
    /// providers use several and no such budget names one.
    fn global_currency(&self) -> Result<String, Vec<String>> {
        if let Some(l) = self.limits().into_iter().find(|l| l.provider.is_none()) {
            return Ok(l.currency);
        }
        let all = self.shared.providers.values();
        let mut priced: Vec<String> =
            all.iter().filter(|p| p.money.pricing.is_priced()).map(|p| p.money.pricing.currency.clone()).collect();
        priced.sort();
        priced.dedup();
        match priced.as_slice() {
            [] => Ok(crate::config::DEFAULT_CURRENCY.to_string()),
            [one] => Ok(one.clone()),
            _ => Err(priced),
        }
    }

    /// The currency the whole daemon's budget is shown in: [`Engine::global_currency`], or the
    /// first of several.
    pub fn budget_currency(&self) -> String {
        self.global_currency().unwrap_or_else(|several| several.into_iter().next().unwrap_or_default())
    }

    /// Where the limits in force come from.
    pub fn budget_source(&self) -> BudgetSource {
        *self.shared.budget_source.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The stored budget, if one is set and readable (start-up and SIGHUP). An unreadable one
    /// is reported and the config's applies.
    pub(super) async fn stored_limits(
        store: &crate::store::Store,
        zone: &jiff::tz::TimeZone,
    ) -> Result<Option<Vec<Limit>>, EngineError> {
        Ok(match store.budget_setting().await? {
            None => None,
            Some(json) => match decode(&json, zone) {
                Ok(l) => Some(l),
                Err(e) => {
                    tracing::error!("{e}; the configuration's budget applies until one is set again");
                    None
                }
            },
        })
    }

    /// The config's limits changed (SIGHUP): keep them as the default, and apply the stored
    /// budget if one is set (re-read: another node may have set it), else them.
    /// The zone is re-read too (one set in the page, on this node or another); a change of
    /// `[ui] time_zone` in the file itself needs a restart, like other settings.
    pub async fn reload_config_limits(&self, config: Vec<Limit>) -> Result<usize, EngineError> {
        let _one_at_a_time = self.shared.budget_lock.lock().await;
        self.reload_zone().await?;
        let zone = self.time_zone();
        let config: Vec<Limit> = config.into_iter().map(|l| Limit { zone: zone.clone(), ..l }).collect();
        *self.shared.config_limits.write().unwrap_or_else(|e| e.into_inner()) = config.clone();
        let stored = Engine::stored_limits(&self.shared.store, &zone).await?;
        let source = if stored.is_some() { BudgetSource::Set } else { BudgetSource::Config };
        *self.shared.budget_source.write().unwrap_or_else(|e| e.into_inner()) = source;
        self.set_limits(stored.unwrap_or(config)).await
    }

    /// Apply a change to the limits in force and store the result, so it survives a restart
    /// and replaces the config's budget. Checks every name and amount first.
    pub async fn change_budget(&self, change: BudgetChange) -> Result<BudgetSource, EngineError> {
        let _one_at_a_time = self.shared.budget_lock.lock().await;
        let currency = match self.global_currency() {
            Ok(c) => c,
            Err(several) if matches!(change.daily, Some(Some(_))) || matches!(change.monthly, Some(Some(_))) => {
                return Err(EngineError::Invalid(format!(
                    "the priced providers use several currencies ({}) and tally does not convert between them: set \
                     a budget per provider, or name the whole daemon's currency with `currency` under [budget] in \
                     the configuration",
                    several.join(", ")
                )));
            }
            Err(several) => several.into_iter().next().unwrap_or_default(),
        };
        let zone = self.time_zone();
        let mut limits = self.limits();
        let mut apply =
            |period: Period, provider: Option<&str>, c: &Change, currency: &str| -> Result<(), EngineError> {
                let Some(c) = c else { return Ok(()) };
                limits.retain(|l| !(l.period == period && l.provider.as_deref() == provider));
                if let Some(v) = c {
                    let what = match (period, provider) {
                        (Period::Day, None) => say("say.budget_daily"),
                        (Period::Month, None) => say("say.budget_monthly"),
                        (Period::Day, Some(p)) => say_with("say.budget_daily_provider", &[("provider", p)]),
                        (Period::Month, Some(p)) => say_with("say.budget_monthly_provider", &[("provider", p)]),
                    };
                    let micros = amount(&what, *v)?;
                    limits.push(Limit {
                        period,
                        provider: provider.map(str::to_string),
                        micros,
                        currency: currency.into(),
                        zone: zone.clone(),
                    });
                }
                Ok(())
            };
        apply(Period::Day, None, &change.daily, &currency)?;
        apply(Period::Month, None, &change.monthly, &currency)?;
        for (name, (daily, monthly)) in &change.providers {
            let Some(p) = self.shared.providers.get(name) else {
                return Err(EngineError::Invalid(say_with("say.budget_no_provider", &[("name", name)])));
            };
            let cur = p.money.pricing.currency.clone();
            apply(Period::Day, Some(name), daily, &cur)?;
            apply(Period::Month, Some(name), monthly, &cur)?;
        }
        let any_priced = self.shared.providers.values().iter().any(|p| p.money.pricing.is_priced());
        if !limits.is_empty() && !any_priced {
            return Err(EngineError::Invalid(crate::domain::words::say("say.budget_needs_prices")));
        }
        limits.sort_by(|a, b| (&a.provider, a.period.adjective()).cmp(&(&b.provider, b.period.adjective())));
        self.shared.store.set_budget_setting(Some(encode(&limits)), self.now()).await?;
        *self.shared.budget_source.write().unwrap_or_else(|e| e.into_inner()) = BudgetSource::Set;
        self.set_limits(limits).await?;
        Ok(BudgetSource::Set)
    }

    /// Remove the budget set at run time: the config's applies again.
    pub async fn reset_budget(&self) -> Result<(), EngineError> {
        let _one_at_a_time = self.shared.budget_lock.lock().await;
        self.shared.store.set_budget_setting(None, self.now()).await?;
        *self.shared.budget_source.write().unwrap_or_else(|e| e.into_inner()) = BudgetSource::Config;
        let config = self.shared.config_limits.read().unwrap_or_else(|e| e.into_inner()).clone();
        self.set_limits(config).await?;
        Ok(())
    }

    /// The budget as `GET /v1/budget` shows it.
    pub async fn budget(&self) -> Result<BudgetView, EngineError> {
        let limits = self.limits();
        let currency = self.budget_currency();
        let zone = self.time_zone();
        let all = self.shared.providers.values();
        let mut names: Vec<&str> = all.iter().filter(|p| p.money.billable).map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        // One probe limit per period and scope: budget_use sums what each would count.
        let mut probes = Vec::new();
        for provider in std::iter::once(None).chain(names.iter().map(|n| Some(n.to_string()))) {
            for period in [Period::Day, Period::Month] {
                probes.push(Limit {
                    period,
                    provider: provider.clone(),
                    micros: 0,
                    currency: currency.clone(),
                    zone: zone.clone(),
                });
            }
        }
        let used = self.shared.store.budget_use(probes.clone(), self.now()).await?;
        let spent = |period: Period, provider: Option<&str>| {
            probes
                .iter()
                .zip(&used)
                .find(|(l, _)| l.period == period && l.provider.as_deref() == provider)
                .map_or(0.0, |(_, u)| u.spent)
        };
        let providers = names
            .iter()
            .map(|n| {
                let cur = self.shared.providers.get(n).map_or(currency.clone(), |p| p.money.pricing.currency.clone());
                (
                    n.to_string(),
                    ProviderBudget {
                        daily: find(&limits, Period::Day, Some(n)).map(from_micros),
                        monthly: find(&limits, Period::Month, Some(n)).map(from_micros),
                        spent_today: spent(Period::Day, Some(n)),
                        spent_this_month: spent(Period::Month, Some(n)),
                        currency: cur,
                    },
                )
            })
            .collect();
        Ok(BudgetView {
            daily: find(&limits, Period::Day, None).map(from_micros),
            monthly: find(&limits, Period::Month, None).map(from_micros),
            providers,
            currency,
            spent_today: spent(Period::Day, None),
            spent_this_month: spent(Period::Month, None),
            source: self.budget_source(),
            time_zone: crate::domain::zone::name(&zone),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_limits_round_trip_and_bad_ones_are_refused() {
        let zone = jiff::tz::TimeZone::get("Asia/Shanghai").expect("a zone");
        let limit = |period, provider: Option<&str>, micros, currency: &str| Limit {
            period,
            provider: provider.map(str::to_string),
            micros,
            currency: currency.into(),
            zone: zone.clone(),
        };
        let limits =
            vec![limit(Period::Day, None, 220_000, "USD"), limit(Period::Month, Some("oa"), 20_000_000, "CNY")];
        assert_eq!(decode(&encode(&limits), &zone).expect("decodes"), limits);
        assert!(
            decode("{\"limits\":[{\"period\":\"weekly\",\"provider\":null,\"micros\":1,\"currency\":\"USD\"}]}", &zone)
                .is_err()
        );
        assert!(decode("not json", &zone).is_err());
    }
}
