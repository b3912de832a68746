//! `[[providers]]`: provider kinds, prices, timeouts and the checks on each entry.

use std::time::Duration;

use super::{ConfigError, DEFAULT_CURRENCY, RawProvider};
use crate::domain::operation::Operation;
use crate::providers::kinds;
pub use crate::providers::{Pricing, ProviderConfig, ProviderKind, parse_size};

/// The documented host `base_url` points at, if a provider kind lists it as taking no
/// idempotency header (`providers::kinds`).
pub(super) fn documented_without_idempotency(base_url: &str) -> Option<&'static str> {
    let rest = base_url.split_once("://").map_or(base_url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let host = authority.rsplit('@').next().unwrap_or(authority);
    let host = host.split(':').next().unwrap_or(host).trim_end_matches('.').to_ascii_lowercase();
    kinds::hosts_without_idempotency().find(|h| host == *h)
}

/// The default total request timeout of a kind (its descriptor's).
pub fn default_request_timeout(kind: ProviderKind) -> Duration {
    kind.spec().request_timeout
}

pub(super) fn resolve_provider(p: RawProvider, i: usize, origin: &str) -> Result<ProviderConfig, ConfigError> {
    let key = |k: &str| format!("providers[{i}].{k}");
    let bad = |k: &str, reason: String| ConfigError::Invalid { path: origin.into(), key: key(k), reason };
    let name = p.name.ok_or_else(|| bad("name", "is required".into()))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(bad("name", format!("`{name}` must be letters, digits, '-' or '_'")));
    }
    let kind_text = p.kind.ok_or_else(|| bad("kind", "is required".into()))?;
    let kind = ProviderKind::parse(&kind_text)
        .ok_or_else(|| bad("kind", format!("`{kind_text}` is not one of {}", kinds::names().join(", "))))?;
    let spec = kind.spec();
    let demo = ProviderConfig::demo();
    let ms = |k: &str, v: Option<i64>, default: Duration| -> Result<Duration, ConfigError> {
        match v {
            None => Ok(default),
            Some(n) if (1..=86_400_000).contains(&n) => Ok(Duration::from_millis(n as u64)),
            Some(n) => Err(bad(k, format!("{n} must be between 1 and 86400000"))),
        }
    };
    let max_concurrency = match p.max_concurrency {
        None => 4,
        Some(n) if (1..=1024).contains(&n) => n as usize,
        Some(n) => return Err(bad("max_concurrency", format!("{n} must be between 1 and 1024"))),
    };
    let reserve = match p.reserve {
        None => 1,
        Some(n) if (0..=1024).contains(&n) => n as usize,
        Some(n) => return Err(bad("reserve", format!("{n} must be between 0 and 1024"))),
    };
    // A kind whose endpoint is known has it as the default.
    let base_url = p.base_url.or_else(|| spec.default_base_url.map(str::to_string));
    if spec.needs_base_url {
        let url = base_url.as_deref().ok_or_else(|| bad("base_url", format!("is required for kind {kind_text}")))?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(bad("base_url", format!("`{url}` must start with http:// or https://")));
        }
    }
    if spec.needs_model && p.model.is_none() {
        return Err(bad("model", format!("is required for kind {kind_text}")));
    }
    let operations = match p.operations {
        None => spec.default_operations.to_vec(),
        Some(names) if names.is_empty() => return Err(bad("operations", "must name at least one operation".into())),
        Some(names) => {
            let mut ops = Vec::new();
            for n in names {
                let op = Operation::parse(&n).ok_or_else(|| {
                    bad("operations", format!("`{n}` is not one of {}", Operation::names().join(", ")))
                })?;
                if !spec.operations.contains(&op) {
                    let can: Vec<&str> = spec.operations.iter().map(|o| o.as_str()).collect();
                    return Err(bad(
                        "operations",
                        format!("kind {kind_text} offers no `{n}` (it can: {})", can.join(", ")),
                    ));
                }
                if !ops.contains(&op) {
                    ops.push(op);
                }
            }
            ops
        }
    };
    if let Some(url) = &p.dashboard_url
        && !(url.starts_with("https://") || url.starts_with("http://"))
    {
        return Err(bad("dashboard_url", format!("`{url}` must start with https:// or http://")));
    }
    if let Some(env) = &p.api_key_env
        && (env.is_empty() || env.contains('='))
    {
        return Err(bad("api_key_env", "must name an environment variable".into()));
    }
    if let Some(h) = &p.idempotency_header
        && (h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return Err(bad("idempotency_header", format!("`{h}` is not a valid header name")));
    }
    if p.idempotency_header.is_some()
        && let Some(host) = base_url.as_deref().and_then(documented_without_idempotency)
    {
        return Err(bad(
            "idempotency_header",
            format!(
                "{host} documents no idempotency header, so it would not deduplicate anything: tally would \
                 treat a resend as free and could be charged twice. Remove idempotency_header for this provider \
                 (it is only for gateways that honour one)"
            ),
        ));
    }
    if let Some(r) = &p.reference_input
        && (r.is_empty() || !r.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(bad("reference_input", format!("`{r}` is not an input name (letters, digits, '_')")));
    }
    if p.batch == Some(true) && !spec.own_keys.contains(&"batch") {
        let with: Vec<&str> = kinds::KINDS.iter().filter(|k| k.own_keys.contains(&"batch")).map(|k| k.name).collect();
        return Err(bad("batch", format!("kind {kind_text} has no batch API tally uses (only {})", with.join(", "))));
    }
    let max_response_bytes = match p.max_response_bytes {
        None => demo.max_response_bytes,
        Some(n) if (1024..=1 << 30).contains(&n) => n as usize,
        Some(n) => return Err(bad("max_response_bytes", format!("{n} must be between 1024 and 1073741824"))),
    };
    let money = |k: &str, v: f64| -> Result<crate::domain::Micros, ConfigError> {
        if v.is_finite() && (0.0..1e9).contains(&v) {
            Ok(crate::domain::to_micros(v))
        } else {
            Err(bad(k, format!("{v} must be an amount of money, 0 or more")))
        }
    };
    let per_image = p.price_per_image.map(|v| money("price_per_image", v)).transpose()?;
    let mut per_size = std::collections::BTreeMap::new();
    for (size, v) in p.price_per_size.unwrap_or_default() {
        if parse_size(&size).is_none() {
            return Err(bad("price_per_size", format!("`{size}` is not a size like 1024x1024")));
        }
        per_size.insert(size, money("price_per_size", v)?);
    }
    let currency = p.currency.unwrap_or_else(|| DEFAULT_CURRENCY.into());
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(bad("currency", format!("`{currency}` must be a three-letter code such as USD or EUR")));
    }
    let per_million_input =
        p.price_per_million_input_tokens.map(|v| money("price_per_million_input_tokens", v)).transpose()?;
    let per_million_output =
        p.price_per_million_output_tokens.map(|v| money("price_per_million_output_tokens", v)).transpose()?;
    if per_million_input.is_some() != per_million_output.is_some() {
        return Err(bad(
            "price_per_million_input_tokens",
            "a drafting call is priced by both input and output tokens: set price_per_million_input_tokens and \
             price_per_million_output_tokens together"
                .into(),
        ));
    }
    let max_output_tokens = match p.max_output_tokens {
        None => crate::providers::settings::DEFAULT_MAX_OUTPUT_TOKENS,
        Some(n) if (256..=65_536).contains(&n) => n as u32,
        Some(n) => return Err(bad("max_output_tokens", format!("{n} must be between 256 and 65536"))),
    };
    let pricing = Pricing { per_image, per_size, per_million_input, per_million_output, currency };
    if !spec.bills && pricing.is_priced() {
        return Err(bad("price_per_image", "the demo provider never charges, so it takes no price".into()));
    }
    let budget_daily = p.budget_daily.map(|v| money("budget_daily", v)).transpose()?;
    let budget_monthly = p.budget_monthly.map(|v| money("budget_monthly", v)).transpose()?;
    if (budget_daily.is_some() || budget_monthly.is_some()) && !pricing.is_priced() {
        return Err(bad(
            if budget_daily.is_some() { "budget_daily" } else { "budget_monthly" },
            "a budget needs a price to count: set price_per_image (or price_per_size)".into(),
        ));
    }
    Ok(ProviderConfig {
        pricing,
        budget_daily,
        budget_monthly,
        api_key: None,
        dashboard_url: p.dashboard_url,
        defined_in: crate::providers::settings::DefinedIn::Config,
        name,
        kind,
        operations,
        max_concurrency,
        reserve,
        base_url: base_url.map(|u| u.trim_end_matches('/').to_string()),
        // A kind whose key has a documented variable (its official SDK reads it too).
        api_key_env: p.api_key_env.or_else(|| spec.default_key_env.map(str::to_string)),
        model: p.model,
        size: p.size.unwrap_or(demo.size),
        connect_timeout: ms("connect_timeout_ms", p.connect_timeout_ms, demo.connect_timeout)?,
        request_timeout: ms("request_timeout_ms", p.request_timeout_ms, default_request_timeout(kind))?,
        poll_interval: ms("poll_interval_ms", p.poll_interval_ms, demo.poll_interval)?,
        idempotency_header: p.idempotency_header,
        reference_input: p.reference_input,
        batch: p.batch.unwrap_or(false),
        max_response_bytes,
        max_output_tokens,
        billing_note: p.billing_note,
        delay: match p.delay_ms {
            None => demo.delay,
            Some(n) if (0..=600_000).contains(&n) => Duration::from_millis(n as u64),
            Some(n) => return Err(bad("delay_ms", format!("{n} must be between 0 and 600000"))),
        },
    })
}
