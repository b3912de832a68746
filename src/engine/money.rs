//! Money in the engine: whether a provider bills, what one request costs, the local checks
//! that must all pass before `calling` is recorded, and the budget limits handed to the
//! store (which checks them in the same operation that records `calling`).
//!
//! **Local checks first.** A request is recorded as `calling` — the point from which it may
//! cost money — only after the API key is present, the reference images are readable and the
//! parameters are usable. A failed local check ends the execution before `calling`, so its
//! charge is `none` and no line anywhere says it may have been charged.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{Config, Pricing, ProviderConfig, ProviderKind};
use crate::domain::words::say_with;
use crate::domain::{Micros, from_micros};
use crate::store::CallingFacts;
use crate::store::spend::{Limit, Period};

/// A provider's money facts, from its configuration.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct ProviderMoney {
    /// False for a provider that never bills (`demo`).
    pub billable: bool,
    /// The environment variable holding the API key, if the provider needs one.
    pub api_key_env: Option<String>,
    pub pricing: Pricing,
    pub model: Option<String>,
    /// The image size asked for when a task names none.
    pub size: String,
    /// Whether the task's `params.size` must be a `WIDTHxHEIGHT` size (HTTP kinds send it).
    pub checks_size: bool,
}

impl Default for ProviderMoney {
    /// A provider tally knows nothing about (tests' scriptable ones): billed, no price.
    fn default() -> Self {
        ProviderMoney {
            billable: true,
            api_key_env: None,
            pricing: Pricing { currency: crate::config::DEFAULT_CURRENCY.into(), ..Pricing::default() },
            model: None,
            size: "1024x1024".into(),
            checks_size: false,
        }
    }
}

impl ProviderMoney {
    /// The money facts of a configured provider.
    pub fn of(cfg: &ProviderConfig) -> Self {
        ProviderMoney {
            billable: cfg.kind != ProviderKind::Demo,
            api_key_env: cfg.api_key_env.clone(),
            pricing: cfg.pricing.clone(),
            model: cfg.model.clone(),
            size: cfg.size.clone(),
            checks_size: cfg.kind != ProviderKind::Demo,
        }
    }

    /// The size a request with `params` asks for.
    fn size_of<'a>(&'a self, params: &'a serde_json::Value) -> &'a str {
        params.get("size").and_then(|s| s.as_str()).unwrap_or(&self.size)
    }

    /// The estimated cost of one request with `params`, if a price is configured (never for
    /// a provider that does not bill). A drafting call (`params.max_output_tokens` and
    /// `params.input_tokens`, set by the engine) is priced by tokens, its answer counted at the
    /// ceiling `max_output_tokens`.
    pub fn price(&self, params: &serde_json::Value) -> Option<Micros> {
        if !self.billable {
            return None;
        }
        let tokens = |k: &str| params.get(k).and_then(serde_json::Value::as_u64);
        if let (Some(input), Some(output)) = (tokens("input_tokens"), tokens("max_output_tokens")) {
            return self.pricing.price_tokens(input, output);
        }
        self.pricing.price(self.size_of(params))
    }

    /// The checks that need nothing from the provider. `Err` says, in plain words, what is
    /// wrong and that nothing was sent.
    pub fn preflight(&self, provider: &str, params: &serde_json::Value) -> Result<(), String> {
        if let Some(var) = &self.api_key_env {
            match std::env::var(var) {
                Ok(k) if k.trim().is_empty() => return Err(missing_key(provider, var)),
                Ok(k) if !k.trim().bytes().all(|b| (0x21..0x7f).contains(&b)) => {
                    return Err(say_with("say.api_key_bad_chars", &[("var", var), ("provider", provider)]));
                }
                Ok(_) => {}
                Err(_) => return Err(missing_key(provider, var)),
            }
        }
        if self.checks_size
            && let Some(size) = params.get("size")
        {
            let ok = size.as_str().and_then(crate::providers::http::parse_size).is_some();
            if !ok {
                return Err(say_with("say.size_not_a_size", &[("size", &size.to_string())]));
            }
        }
        Ok(())
    }

    /// What `record_calling` records with the call, and the limits it must fit in: a limit
    /// for the whole daemon only when it is in this provider's currency (it counts no other).
    pub fn facts(&self, params: &serde_json::Value, limits: Vec<Limit>) -> CallingFacts {
        let currency = self.pricing.is_priced().then(|| self.pricing.currency.clone());
        let limits = if self.billable {
            limits.into_iter().filter(|l| l.provider.is_some() || Some(&l.currency) == currency.as_ref()).collect()
        } else {
            Vec::new()
        };
        CallingFacts {
            billable: self.billable,
            cost_micros: self.price(params),
            currency,
            model: self.model.clone(),
            limits,
        }
    }

    /// Prices as `GET /v1/providers` shows them.
    pub fn info(&self) -> PriceInfo {
        PriceInfo {
            billable: self.billable,
            price_per_image: self.pricing.per_image.map(from_micros),
            price_per_size: self.pricing.per_size.iter().map(|(k, v)| (k.clone(), from_micros(*v))).collect(),
            price_per_million_input_tokens: self.pricing.per_million_input.map(from_micros),
            price_per_million_output_tokens: self.pricing.per_million_output.map(from_micros),
            currency: self.pricing.currency.clone(),
        }
    }
}

fn missing_key(provider: &str, var: &str) -> String {
    say_with("say.api_key_missing", &[("var", var), ("provider", provider)])
}

/// A provider's prices as surfaces show them.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct PriceInfo {
    /// False for a provider that never charges (`demo`).
    pub billable: bool,
    /// The configured price of one image (`null`: no price configured).
    pub price_per_image: Option<f64>,
    /// Prices by requested size, which take precedence over `price_per_image`.
    pub price_per_size: BTreeMap<String, f64>,
    /// The price of a million input tokens of a drafting call (`null`: none configured).
    pub price_per_million_input_tokens: Option<f64>,
    /// The price of a million output tokens of a drafting call (`null`: none configured).
    pub price_per_million_output_tokens: Option<f64>,
    pub currency: String,
}

/// Every budget limit of a configuration: `[budget]` for the whole daemon, and each
/// provider's `budget_daily` / `budget_monthly`.
pub fn limits(cfg: &Config) -> Vec<Limit> {
    let mut out = Vec::new();
    let global = cfg.budget.currency.clone().unwrap_or_else(|| crate::config::DEFAULT_CURRENCY.into());
    let zone = &cfg.engine.time_zone;
    for (period, micros) in [(Period::Day, cfg.budget.daily), (Period::Month, cfg.budget.monthly)] {
        if let Some(micros) = micros {
            out.push(Limit { period, provider: None, micros, currency: global.clone(), zone: zone.clone() });
        }
    }
    for p in &cfg.providers {
        for (period, micros) in [(Period::Day, p.budget_daily), (Period::Month, p.budget_monthly)] {
            if let Some(micros) = micros {
                out.push(Limit {
                    period,
                    provider: Some(p.name.clone()),
                    micros,
                    currency: p.pricing.currency.clone(),
                    zone: zone.clone(),
                });
            }
        }
    }
    out
}

/// Start-up warnings about money: providers whose API key variable is unset (every task
/// would fail before sending), and paid providers without a price when a budget is set
/// (their requests cannot count against it).
pub fn warnings(cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let budget = cfg.budget.daily.is_some() || cfg.budget.monthly.is_some();
    for p in &cfg.providers {
        if let Some(var) = &p.api_key_env
            && std::env::var(var).map(|v| v.trim().is_empty()).unwrap_or(true)
        {
            out.push(format!(
                "provider `{}`: the API key environment variable {var} is not set; its tasks will fail without \
                 sending anything until you set it and restart",
                p.name
            ));
        }
        if budget && p.kind != ProviderKind::Demo && !p.pricing.is_priced() {
            out.push(format!(
                "provider `{}` has no price_per_image, so its requests do not count against the budget",
                p.name
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_key_or_a_bad_size_fails_before_anything_is_sent() {
        let m = ProviderMoney {
            api_key_env: Some("TALLY_UNIT_TEST_SURELY_UNSET_KEY".into()),
            checks_size: true,
            ..ProviderMoney::default()
        };
        let e = crate::domain::words::english(&m.preflight("p", &serde_json::json!({})).unwrap_err());
        assert!(e.contains("TALLY_UNIT_TEST_SURELY_UNSET_KEY") && e.contains("nothing was"), "{e}");
        let m = ProviderMoney { checks_size: true, ..ProviderMoney::default() };
        assert!(m.preflight("p", &serde_json::json!({"size": "1024x1024"})).is_ok());
        assert!(m.preflight("p", &serde_json::json!({"size": "huge"})).is_err());
        assert!(m.preflight("p", &serde_json::json!({"size": 3})).is_err());
    }

    #[test]
    fn a_free_provider_has_no_price_and_no_limits() {
        let demo = ProviderMoney::of(&ProviderConfig::demo());
        assert!(!demo.billable);
        let limit = Limit {
            period: Period::Day,
            provider: None,
            micros: 1,
            currency: "USD".into(),
            zone: jiff::tz::TimeZone::UTC,
        };
        let f = demo.facts(&serde_json::json!({}), vec![limit]);
        assert!(!f.billable && f.cost_micros.is_none() && f.limits.is_empty());
    }

    #[test]
    fn a_budget_for_the_whole_daemon_binds_only_requests_in_its_currency() {
        let kind = crate::config::ProviderKind::OpenaiImages.as_str();
        let toml = format!(
            "[budget]\ndaily = 1\ncurrency = \"USD\"\n\
             [[providers]]\nname = \"cn\"\nkind = \"{kind}\"\nbase_url = \"http://x\"\nprice_per_image = 0.3\ncurrency = \"CNY\"\nbudget_daily = 2\n\
             [[providers]]\nname = \"us\"\nkind = \"{kind}\"\nbase_url = \"http://y\"\nprice_per_image = 0.04\n"
        );
        let cfg = crate::config::Config::from_toml(&toml, "t").expect("config");
        let all = limits(&cfg);
        let facts = |i: usize| ProviderMoney::of(&cfg.providers[i]).facts(&serde_json::json!({}), all.clone());
        let scopes = |f: CallingFacts| -> Vec<(Option<String>, String)> {
            f.limits.into_iter().map(|l| (l.provider, l.currency)).collect()
        };
        assert_eq!(scopes(facts(0)), vec![(Some("cn".to_string()), "CNY".to_string())]);
        // (Another provider's limit is passed along; the store's check skips it.)
        assert_eq!(scopes(facts(1)), vec![(None, "USD".to_string()), (Some("cn".to_string()), "CNY".to_string())]);
    }
}
